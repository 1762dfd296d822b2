"""The shim's H100 in the sm_90a call-path tests (test_cudasim_hopper_call_path.py,
test_cudasim_hopper_bwd_call_path.py, test_cudasim_hopper_attn_mask.py): the warp-schedule x
TMA-copy-completion pairs each case runs under, and what the shim's counters say ran."""
import pytest
import torch

# (warp order, copy completion): forward, reverse and random warps with lazy, eager and random
# completion of the TMA copies (tests/cudasim/README.md).
SCHEDULES = [("forward", "lazy"), ("forward", "eager"), ("reverse", "eager"),
             ("reverse", "lazy"), ("random:31", "random"), ("random:7", "eager")]

# The kernels' element types as their demangled signatures spell them.
ELEMENTS = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


def schedule_fixture(schedules=SCHEDULES):
    """A `schedule` fixture for a test module: each test runs under every pair of `schedules` on
    the `hopper` device (conftest.py), and the shim goes back to its defaults after."""

    @pytest.fixture(params=schedules, ids=lambda s: f"{s[0]}-{s[1]}")
    def schedule(request, hopper):
        warps, copies = request.param
        hopper.set_schedule(warps)
        hopper.ops.set_copy_completion(copies)
        yield request.param
        hopper.set_schedule("forward")
        hopper.ops.set_copy_completion("")

    return schedule


def launched(counters):
    """The kernels run, in order (their demangled signatures)."""
    return [launch["kernel"] for launch in counters["launches"]]


def wgmma_instructions(counters):
    return sum(launch["counters"]["wgmma"]["instructions"] for launch in counters["launches"])
