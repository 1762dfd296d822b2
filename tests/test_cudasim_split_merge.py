"""Split-KV's merge kernel (csrc/cuda/split_merge_kernel.cuh, a warp per output row) on the CPU
shim: out and lse within PyTorch's own error of the float64 reference for 2 to 64 splits (lanes
hold splits 0-31 and 32-63), head dims that fill a lane's columns partly (7) or wholly (256),
empty splits and rows with no key, under every schedule, with outputs and the split scratch
poisoned (conftest.py sets FLASHATTN_POISON_OUTPUTS); and the shim's counters: each split's part
of a row is read in whole 32-byte sectors, once, and each LSE once."""

import pytest
import torch

from test_kvcache import Case


# (splits, cache length): enough 64-key tiles that every split has keys (the last two cross a
# lane's second split register), and fewer (7 splits of 129 keys: 3 tiles, 4 splits empty).
SPLITS = [(2, 129), (3, 257), (7, 129), (32, 2100), (33, 2200), (64, 4200)]


@pytest.mark.parametrize("splits,seqlen_cache", SPLITS)
def test_splits_merge_to_the_reference(sim, schedule, splits, seqlen_cache):
    """Append (with rotary) and attend with `splits` splits; the case checks out, lse and the
    cache against the float64 reference (test_kvcache.Case.check)."""
    case = Case(batch=2, seqlen_q=2, seqlen_new=2, heads=8, heads_kv=2, head_dim=64,
                seqlen_cache=seqlen_cache, num_splits=splits, seed=splits)
    _, launches = sim.launches(lambda: case.check(sim.ops), "split_merge_kernel")
    assert len(launches) == 1, launches


@pytest.mark.parametrize("head_dim,dtype", [(7, torch.float16), (63, torch.bfloat16),
                                            (128, torch.bfloat16), (256, torch.float16),
                                            (65, torch.float32)])
def test_head_dims_and_dtypes(sim, head_dim, dtype):
    """A lane's columns: one partial (7, 63, 65), four (128), eight (256); fp32 through the SIMT
    forward; paged (page 16) and GQA-packed."""
    case = Case(batch=3, seqlen_q=1, heads=8, heads_kv=2, head_dim=head_dim, seqlen_cache=700,
                page_size=16, rotary_dim=0, num_splits=5, dtype=dtype, seed=head_dim)
    _, launches = sim.launches(lambda: case.check(sim.ops), "split_merge_kernel")
    assert len(launches) == 1


def test_rows_without_keys_merge_to_zero_and_minus_inf(sim):
    """Sequences whose cache is empty (no append): every split is empty, so the row is 0 with
    LSE -inf; a neighbour with keys is unaffected."""
    case = Case(batch=3, seqlen_q=1, heads=4, heads_kv=4, head_dim=32, seqlen_cache=600,
                seqlen_new=0, rotary_dim=0, num_splits=4, dtype=torch.float16, seed=3)
    case.cache_seqlens = torch.tensor([0, 513, 0], dtype=torch.int32)
    out, lse = case.check(sim.ops)
    assert torch.equal(out[[0, 2]], torch.zeros_like(out[[0, 2]]))
    assert torch.isneginf(lse[[0, 2]]).all() and torch.isfinite(lse[1]).all()


@pytest.mark.parametrize("head_dim", [64, 128])
def test_merge_reads_each_part_once_in_whole_sectors(sim, head_dim):
    """B = 1, one token, 8 query heads over 2 kv heads, 6 splits that all see keys: the merge
    loads each split's part of each row once (head_dim floats) and its LSE once, and the parts'
    loads cover whole 32-byte sectors, so sectors x 32 is the part bytes plus at most one
    sector per LSE load. (A thread per row read a 4-byte column of 32 rows 512 bytes apart:
    a sector per float.)"""
    splits, heads = 6, 8
    case = Case(batch=1, seqlen_q=1, heads=heads, heads_kv=2, head_dim=head_dim,
                seqlen_cache=6 * 64 * 2, seqlen_new=0, rotary_dim=0, num_splits=splits, seed=7)
    case.cache_seqlens = torch.tensor([6 * 64 * 2], dtype=torch.int32)
    _, launches = sim.launches(lambda: case.check(sim.ops), "split_merge_kernel")
    (merge,) = launches
    loads = merge["counters"]["gmem_load"]
    rows = heads
    part_bytes = rows * splits * head_dim * 4
    lse_bytes = rows * splits * 4
    assert loads["bytes"] == part_bytes + lse_bytes
    lse_loads = rows * splits
    assert part_bytes // 32 <= loads["sectors"] <= part_bytes // 32 + lse_loads, loads
