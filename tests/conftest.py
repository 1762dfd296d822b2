import os
import random
import zlib

# Outputs are prefilled with NaN before a kernel writes them, so any element a kernel forgets
# shows up as NaN. Must be set before the library is loaded.
os.environ.setdefault("FLASHATTN_POISON_OUTPUTS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import flashattn  # noqa: E402

# test_skip_policy.py runs pytest on small test files of its own to check the policy below.
pytest_plugins = ["pytester"]

# The only reasons a test may be skipped for. A test that cannot run is a defect, and a skip is
# easy to miss in a green run: any other skip, an xfail or an xpass makes the session fail, and
# the summary lists each such test with its reason (SkipPolicy below). Matched exactly; each
# must say why it is legitimate. Deselection (-m 'not slow') is not a skip and is not checked.
ALLOWED_SKIPS = {
    # tests/executors.py, make_executor("cuda"): the "cuda" executor runs on a CUDA device, and
    # CI's machines have none. The CUDA kernels' own source is still tested there, on the CPU,
    # by the "sim" executor (test_cuda_kernels_sim.py), which is therefore not allowed to skip:
    # CI has the CUDA toolkit it compiles against.
    "no CUDA GPU on this machine",
    # tests/test_api.py, test_cuda_inputs_give_a_clear_error_when_mixed_with_cpu: CUDA tensors
    # need a CUDA device, for the same reason.
    "needs a GPU",
}

SESSION_SEED = int(os.environ.get("FLASHATTN_TEST_SEED", random.randrange(2**31)))
# pytest-xdist's workers start after this (the controller imports conftest first) and inherit
# the environment: one seed for the whole run, the one the header prints.
os.environ["FLASHATTN_TEST_SEED"] = str(SESSION_SEED)


def pytest_report_header(config):
    return [f"flashattn from {os.path.dirname(flashattn.__file__)}",
            f"random seed: FLASHATTN_TEST_SEED={SESSION_SEED} (fresh inputs every run)"]


def pytest_configure(config):
    config.pluginmanager.register(SkipPolicy(), "flashattn_skip_policy")
    # CI installs the wheel into a fresh venv and must test that, not the source tree.
    if os.environ.get("FLASHATTN_TEST_INSTALLED") == "1":
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        source_package = os.path.join(repo, "flashattn")
        assert os.path.dirname(os.path.abspath(flashattn.__file__)) != source_package, (
            f"tests imported flashattn from the source tree ({flashattn.__file__}), "
            f"not the installed wheel")


def runs_on_the_shim(item):
    """Whether a test runs the CUDA kernels' source on the CPU shim: the sim executor as a
    fixture or a parameter, or a test file of the shim itself."""
    params = getattr(item, "callspec", None)
    return ("sim" in getattr(item, "fixturenames", ())
            or (params is not None
                and any(isinstance(v, str) and v == "sim" for v in params.params.values()))
            or item.path.name == "test_cuda_kernels_sim.py"
            or item.path.name.startswith("test_cudasim_"))


def pytest_collection_modifyitems(config, items):
    # `-m "not shim"` leaves them out where a GPU is tested (tools/gpu_check.sh): names like
    # test_cuda_kernels_on_the_shim match `-k cuda`, and eight pytest workers building the shim
    # extension at once crashed two of them on the H200.
    for item in items:
        if runs_on_the_shim(item):
            item.add_marker(pytest.mark.shim)
    # A test module may name parameter combinations this machine's hardware cannot run (a
    # function cannot_run_here(item) -> reason or None), e.g. a CPU kernel forced for a dtype the
    # CPU lacks it for. They are deselected, not skipped, and the module must test that forcing
    # them is a clear error.
    deselected = [item for item in items
                  if getattr(getattr(item, "module", None), "cannot_run_here", lambda i: None)(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture(scope="module")
def sim():
    """The sim executor (executors.py: the CUDA kernels' source on the CPU shim), once per
    module, so that a missing toolkit or a failed build is reported once, not per test. A
    module may define its own."""
    from executors import make_executor
    return make_executor("sim")


@pytest.fixture
def hopper(sim):
    """The shim's device as an H100 with FLASHATTN_CUDA_HOPPER=1 (the sm_90a plans take their
    calls), for one test; an A100 without it after."""
    sim.ops.set_device(9, 0, True)
    yield sim
    sim.ops.set_device(8, 0, False)


@pytest.fixture(params=["forward", "reverse", "random:20261202"])
def schedule(request, sim):
    """The order the shim runs warps in between barriers (a missing barrier changes results),
    for one test; back to "forward" after it."""
    sim.set_schedule(request.param)
    yield request.param
    sim.set_schedule("forward")


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Every test gets its own inputs, different in every run, reproducible from the header."""
    torch.manual_seed(SESSION_SEED ^ zlib.crc32(request.node.nodeid.encode()))


class SkipPolicy:
    """Records every skip (skipif/skip markers, pytest.skip in a test or a fixture, importorskip,
    a skipped module) whose reason is not in ALLOWED_SKIPS, and every xfail and xpass, and fails
    the session if there is any."""

    def __init__(self):
        self.offenders = []  # (node id, reason)

    @staticmethod
    def reason(report):
        """The message of a skip: longrepr is (path, line, "Skipped: <reason>")."""
        message = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return message.removeprefix("Skipped: ")

    def check(self, report):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
            self.offenders.append((report.nodeid, f"{outcome} ({report.wasxfail or 'no reason'})"))
        elif report.skipped and self.reason(report) not in ALLOWED_SKIPS:
            self.offenders.append((report.nodeid, self.reason(report)))

    def pytest_runtest_logreport(self, report):
        self.check(report)

    def pytest_collectreport(self, report):
        self.check(report)

    def pytest_sessionfinish(self, session):
        if self.offenders and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.offenders:
            return
        by_reason = {}
        for nodeid, reason in self.offenders:
            by_reason.setdefault(reason, []).append(nodeid)
        write = terminalreporter.write_line
        terminalreporter.section("skipped for a reason not in ALLOWED_SKIPS: the run fails",
                                 sep="=", red=True, bold=True)
        for reason, nodeids in by_reason.items():
            write(f"{len(nodeids)} test(s): {reason}", red=True, bold=True)
            for nodeid in nodeids:
                write(f"    {nodeid}")
        write("Make these tests run, or add the reason to ALLOWED_SKIPS in tests/conftest.py with "
              "why it is legitimate.", red=True)
