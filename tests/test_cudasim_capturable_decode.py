"""A decoding step (flash_attn_with_kvcache with append, rotary, a paged cache and split-KV) is
capturable in a CUDA graph, checked on the CPU shim: the host never reads a device value, so
nothing syncs, and nothing the host does (the ops it calls, the sizes it allocates, the kernels
it launches and their grids) depends on one. A graph replays its first call's launches and
allocations with whatever cache_seqlens, block_table and tokens hold at replay; here two calls
that differ only in those values must look alike to the host.

How: torch.profiler records every ATen op the call dispatches, nested ones included, with their
concrete arguments (the sizes given to aten::empty), and the shim's counters record each launch's
kernel, grid, block and shared memory. A sync on a GPU is an op that returns a device value to
the host (aten::item, aten::_local_scalar_dense, aten::nonzero, ...): none may appear. What this
cannot see is a raw host read of a device pointer in C++ (data_ptr<int>()[i]); on a GPU that
reads garbage or faults, and tests/test_cuda_graphs.py replays a captured step against eager
calls there. The split scratch is allocated per call with a size from shapes only (executor.h),
which a graph's private memory pool replays at the same address.
"""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from executors import make_executor
from test_kvcache import Case

# ATen ops that hand a device value to the host (a sync), or whose output's size is a device
# value (nonzero, masked_select, unique): a CUDA graph cannot capture either.
SYNCING_OPS = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
               "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_consecutive",
               "aten::unique_dim", "aten::equal", "aten::is_nonzero", "aten::allclose",
               "aten::repeat_interleave", "aten::bincount", "aten::histc"}


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def argument_signature(value):
    """An op argument as the host sees it: tensors by shape, dtype and strides, not values."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    return value


def host_trace(sim, fn):
    """The ATen ops fn() dispatches (name and concrete arguments: sizes, dtypes, fill values)
    and the kernels it launches on the shim (name, grid, block, shared memory)."""
    ops = sim.ops
    ops.counters_enable(True)
    ops.counters_reset()
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn()
    finally:
        ops.counters_enable(False)
    launches = [(launch["kernel"], tuple(launch["grid"]), tuple(launch["block"]),
                 launch["smem_bytes"]) for launch in json.loads(ops.counters_json())["launches"]]
    ops.counters_reset()
    events = []
    for event in prof.events():
        if not event.name.startswith(("aten::", "flashattn")):
            continue
        concrete = getattr(event, "concrete_inputs", None) or []
        shapes = getattr(event, "input_shapes", None) or []
        events.append((event.name, repr(concrete), repr(shapes)))
    return events, launches


def decode_case(step, **overrides):
    """Step `step` of a paged decode with rotary embedding and 5 splits, appending one token.
    Every step has the same shapes; the cache lengths, the pages and the tokens differ."""
    config = dict(batch=3, seqlen_q=1, seqlen_new=1, heads=8, heads_kv=2, head_dim=64,
                  seqlen_cache=700, page_size=16, rotary_dim=32, num_splits=5, seed=step)
    config.update(overrides)
    return Case(**config)


CONFIGS = {
    "paged_rotary_splits": dict(),
    "dense_neox_auto_splits": dict(page_size=None, interleaved=False, num_splits=0,
                                   seqlen_cache=4096),
    "speculative_4_tokens": dict(seqlen_q=4, seqlen_new=4, num_splits=3),
    "page_1_no_rotary": dict(page_size=1, rotary_dim=0, seqlen_cache=300),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_host_does_the_same_whatever_the_device_values(sim, config):
    """Two steps with different cache_seqlens, block tables and tokens: the same ATen ops with
    the same arguments (so the same allocations), the same launches, and no syncing op; each
    step's results are right (Case.check, against the float64 reference)."""
    traces, lengths = [], []
    for step in (1, 2):
        case = decode_case(step, **CONFIGS[config])
        traces.append(host_trace(sim, lambda: case.call(sim.ops)))
        lengths.append(case.cache_seqlens)
        # The call appended in place: check that and the outputs on a fresh copy of the step.
        decode_case(step, **CONFIGS[config]).check(sim.ops)
    # A replay sees other lengths: the steps must differ in them for the test to mean it.
    assert not torch.equal(*lengths)
    (events_1, launches_1), (events_2, launches_2) = traces
    assert launches_1 == launches_2 and launches_1, (launches_1, launches_2)
    assert events_1 == events_2
    assert not {name for name, _, _ in events_1} & SYNCING_OPS, events_1


def test_the_python_entry_point_does_not_sync(sim, monkeypatch):
    """flash_attn_with_kvcache itself, routed to the shim's op: it adds no syncing op of its own
    around fwd_kvcache, and its ops do not depend on the cache lengths."""
    monkeypatch.setattr(torch.ops.flashattn, "fwd_kvcache", sim.ops.fwd_kvcache)
    traces = []
    for step in (1, 2):
        case = decode_case(step)
        traces.append(host_trace(sim, lambda: case.call()))
    assert traces[0] == traces[1]
    names = {name for name, _, _ in traces[0][0]}
    assert "flashattn_sim::fwd_kvcache" in names and not names & SYNCING_OPS, names


def test_a_syncing_op_would_be_seen(sim):
    """The trace sees what a host-side check on the lengths would do: a .item() (here through
    int()) among the call's ops, and an allocation sized by it that differs between steps."""
    def syncing_step(case):
        torch.empty(int(case.cache_seqlens.max()))
        return case.call(sim.ops)

    first, second = decode_case(1), decode_case(2)
    events_1, _ = host_trace(sim, lambda: syncing_step(first))
    events_2, _ = host_trace(sim, lambda: syncing_step(second))
    assert {name for name, _, _ in events_1} & SYNCING_OPS
    assert events_1 != events_2
