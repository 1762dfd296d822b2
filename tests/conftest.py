import os
import random
import zlib

# Outputs are prefilled with NaN before a kernel writes them, so any element a kernel forgets
# shows up as NaN. Must be set before the library is loaded.
os.environ.setdefault("FLASHATTN_POISON_OUTPUTS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import flashattn  # noqa: E402

SESSION_SEED = int(os.environ.get("FLASHATTN_TEST_SEED", random.randrange(2**31)))


def pytest_report_header(config):
    return [f"flashattn from {os.path.dirname(flashattn.__file__)}",
            f"random seed: FLASHATTN_TEST_SEED={SESSION_SEED} (fresh inputs every run)"]


def pytest_configure(config):
    # CI installs the wheel into a fresh venv and must test that, not the source tree.
    if os.environ.get("FLASHATTN_TEST_INSTALLED") == "1":
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        assert not os.path.abspath(flashattn.__file__).startswith(repo + os.sep), (
            f"tests imported flashattn from the source tree ({flashattn.__file__}), "
            f"not the installed wheel")


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Every test gets its own inputs, different in every run, reproducible from the header."""
    torch.manual_seed(SESSION_SEED ^ zlib.crc32(request.node.nodeid.encode()))
