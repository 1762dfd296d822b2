"""A paged KV cache read through the forward's per-tile row table (csrc/cuda/paged_row_table.cuh)
on the CPU shim: decoding steps (Sq 1 and 4, GQA-packed, split-KV, ragged cache_seqlens) for
page sizes 1, 16, 64, 256 and 48 (which does not divide the 64-key tile) against the float64
reference with outputs poisoned (conftest.py), under three schedules; the same keys in a dense
cache give the same bits (same tiles, same order, only the row addresses differ); and each
tile's rows are looked up once, by one thread per row, for the K and the V copy together."""

import math

import pytest
import torch

from test_kvcache import Case

FORWARD = "fwd_kernel_16bit"
BLOCK_N = 64  # FwdTraits<d <= 128>::kBlockN


def dense_twin(case):
    """The paged case's keys and values after its call (append included), in a dense cache of
    the same capacity: (k_cache, v_cache, cache_seqlens) for a call without an append."""
    keys = torch.stack([case.logical(case.k_cache, b) for b in range(case.batch)])
    values = torch.stack([case.logical(case.v_cache, b) for b in range(case.batch)])
    return keys, values, case.cache_seqlens + case.seqlen_new


def paged_then_dense(sim, case):
    """The paged call, checked against the reference, and the dense call of the same keys:
    (paged out, lse, launches), (dense out, lse, launches), forward launches only."""
    (out, lse), paged = sim.launches(lambda: case.check(sim.ops), FORWARD)
    keys, values, seqlens = dense_twin(case)
    (dense_out, dense_lse), dense = sim.launches(
        lambda: sim.ops.fwd_kvcache(case.q, keys, values, k=None, v=None, cache_seqlens=seqlens,
                                    block_table=None, causal=case.causal, window_left=-1,
                                    window_right=-1, num_splits=case.num_splits),
        FORWARD)
    return (out, lse, paged), (dense_out, dense_lse, dense)


def assert_same_bits(paged, dense):
    out, lse, paged_launches = paged
    dense_out, dense_lse, dense_launches = dense
    assert [launch["kernel"] for launch in paged_launches] == [
        launch["kernel"] for launch in dense_launches]
    assert torch.equal(out, dense_out), (out.float() - dense_out.float()).abs().max()
    assert torch.equal(lse, dense_lse)


@pytest.mark.parametrize("page_size", [1, 16, 48, 64, 256])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_pages_match_the_reference_and_the_dense_cache(sim, schedule, page_size, seqlen_q):
    """d = 128 (the unrolled copies), 8 query heads over 2 kv heads packed into one tile, 3
    splits, one or four new tokens appended; cache lengths drawn per sequence (ragged), up to
    about 700 keys so that a sequence spans several tiles and the last one is partial."""
    case = Case(batch=3, seqlen_q=seqlen_q, seqlen_new=seqlen_q, heads=8, heads_kv=2,
                head_dim=128, seqlen_cache=700, page_size=page_size, rotary_dim=0,
                num_splits=3, seed=page_size * 10 + seqlen_q)
    paged, dense = paged_then_dense(sim, case)
    assert_same_bits(paged, dense)


@pytest.mark.parametrize("head_dim,dtype", [(32, torch.float16), (64, torch.bfloat16),
                                            (65, torch.bfloat16), (96, torch.float16)])
def test_other_head_dims(sim, head_dim, dtype):
    """Every tile with the row table (d <= 128): 32, 64 and 96 with whole 16-byte chunks, and 65
    (96-wide tile, unaligned rows: the copies' plain loads read the same table)."""
    case = Case(batch=2, seqlen_q=4, seqlen_new=4, heads=6, heads_kv=3, head_dim=head_dim,
                seqlen_cache=300, page_size=16, rotary_dim=0, num_splits=2, dtype=dtype,
                seed=head_dim)
    paged, dense = paged_then_dense(sim, case)
    assert_same_bits(paged, dense)


def table_stores(seqlens, heads_kv):
    """Warp store instructions that write the row tables: per CTA (one per sequence and kv
    head: the query heads of a kv head are packed) and tile, one address for K and one for V by
    each thread of a row the sequence has (rows 0-31: warp 0, 32-63: warp 1)."""
    stores = 0
    for seqlen_k in seqlens:
        for start in range(0, seqlen_k, BLOCK_N):
            rows = min(BLOCK_N, seqlen_k - start)
            stores += 2 * math.ceil(rows / 32)
    return heads_kv * stores


@pytest.mark.parametrize("page_size,splits", [(1, 1), (16, 3), (48, 4)])
def test_each_row_is_looked_up_once_per_tile(sim, page_size, splits):
    """The shim's counters: the paged call makes exactly the dense call's cp.async copies (the
    same bytes), and its extra shared-memory stores are the tables' writes, one per row per
    tile for K and V together, whatever the split count."""
    case = Case(batch=3, seqlen_q=1, heads=8, heads_kv=2, head_dim=128, seqlen_cache=500,
                page_size=page_size, rotary_dim=0, num_splits=splits, seed=page_size)
    (_, _, paged), (_, _, dense) = paged_then_dense(sim, case)
    assert len(paged) == len(dense) == 1
    paged, dense = paged[0]["counters"], dense[0]["counters"]
    assert paged["cp_async"] == dense["cp_async"]
    seqlens = (case.cache_seqlens + case.seqlen_new).tolist()
    assert (paged["sts"]["instructions"] - dense["sts"]["instructions"] ==
            table_stores(seqlens, heads_kv=2))
