"""Context parallelism (flashattn.distributed) in real process groups of 1, 2 and 4 gloo ranks
on the CPU. The cases and the worker are in distributed_cases.py; they run in one spawn, and
each is reported here as a test of its own."""
import pytest
import torch

from conftest import SESSION_SEED
from distributed_cases import CASES, run_all

from flashattn.distributed.merge import merge_


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    # Only the cases pytest selected (-k): the spawn runs them all in one go.
    selected = [item.callspec.params["name"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_context_parallel"]
    return run_all(tmp_path_factory.mktemp("context_parallel"), SESSION_SEED % 2**30,
                   names=[name for name in CASES if name in selected])


@pytest.mark.parametrize("name", list(CASES))
def test_context_parallel(results, name):
    outcomes = results.get(name)
    driver = results.get("__driver__")
    if not outcomes:
        pytest.fail(f"{name} did not run" + (f": {driver[0][1]}" if driver else ""))
    failures = [f"rank {rank}:\n{outcome}" for rank, outcome in outcomes if outcome != "ok"]
    assert not failures, "\n".join(failures)


def test_merge_is_nan_safe_where_no_block_sees_a_key():
    out_acc = torch.zeros(1, 3, 2, 4)
    lse_acc = torch.full((1, 2, 3), float("-inf"))
    out = torch.randn(1, 3, 2, 4)
    lse = torch.tensor([[[0.5, float("-inf"), 1.0], [float("-inf"), float("-inf"), 2.0]]])
    out[0, 1] = 0
    out[0, 0, 1] = 0
    merge_(out_acc, lse_acc, out, lse)
    merge_(out_acc, lse_acc, torch.zeros_like(out), torch.full_like(lse, float("-inf")))
    assert not torch.isnan(out_acc).any() and not torch.isnan(lse_acc).any()
    assert torch.equal(lse_acc, lse)
    assert torch.equal(out_acc[0, 1], torch.zeros(2, 4))
    torch.testing.assert_close(out_acc[0, 2], out[0, 2])


def test_merge_of_two_halves_is_the_softmax_over_all_keys():
    scores = torch.randn(2, 6, dtype=torch.float64)
    values = torch.randn(6, 3, dtype=torch.float64)
    out_acc = torch.zeros(1, 2, 1, 3, dtype=torch.float64)
    lse_acc = torch.full((1, 1, 2), float("-inf"), dtype=torch.float64)
    for keys in (slice(0, 2), slice(2, 6)):
        s = scores[:, keys]
        part = torch.softmax(s, -1) @ values[keys]
        merge_(out_acc, lse_acc, part.view(1, 2, 1, 3), torch.logsumexp(s, -1).view(1, 1, 2))
    torch.testing.assert_close(out_acc.view(2, 3), torch.softmax(scores, -1) @ values)
    torch.testing.assert_close(lse_acc.view(2), torch.logsumexp(scores, -1))
