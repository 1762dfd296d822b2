"""The CUDA kernels' own source, run on the CPU shim (the "sim" executor), through the same
correctness checks as every executor: check_forward and check_backward against the float64
reference.

The sizes are the sim's own, not the shared matrices': every CUDA thread is a fiber. What only
the sim can test lives here: every compiled head-dim tile, the fp32 SIMT kernels, warp
schedules. The first run builds the extension (tests/sim_ext/build.py, a few minutes on 2
cores); later runs reuse torch's build cache.
"""
import math

import pytest
import torch

from checks import (MASKS, NAN_CASES, check_backward, check_forward, check_nan_propagation,
                    make_qkv, make_qkv_far_below_zero)
from executors import make_executor


@pytest.fixture(scope="module")
def sim():
    # Module scope: a missing toolkit or a failed build is reported once, not once per test.
    return make_executor("sim")


@pytest.fixture(params=["forward", "reverse", "random:20261129"])
def schedule(request, sim):
    """The order the shim runs warps in between barriers; a missing barrier changes results."""
    sim.set_schedule(request.param)
    yield request.param
    sim.set_schedule("forward")


HALF_TYPES = [torch.float16, torch.bfloat16]
# Every dtype the CUDA kernels take: the 16-bit ones run on the tensor-core kernels, fp32 on the
# SIMT kernels.
ALL_TYPES = HALF_TYPES + [torch.float32]
# One head dim per compiled tile (32, 64, 96, 128, 192, 256), most of them padded.
HEAD_DIM_PER_TILE = [24, 64, 80, 128, 136, 256]
# fp32 runs on the SIMT kernels: one head dim per fp32 tile (64, 128, 256).
FP32_HEAD_DIMS = [24, 100, 256]
FP32_MASKS = ["none", "causal", "window", "softcap_causal", "alibi_batch_causal",
              "window_alibi_top_left"]
MASK_SEQLENS = [(7, 65), (65, 7), (129, 129)]


def stacked(*marks):
    """One decorator of several parametrize marks, so that forward and backward run one grid."""
    def apply(test):
        for mark in reversed(marks):
            test = mark(test)
        return test
    return apply


every_mask_feature = stacked(pytest.mark.parametrize("mask", MASKS, ids=str),
                             pytest.mark.parametrize("seqlens", MASK_SEQLENS, ids=str))
# Every pair of awkward lengths: a single row, less than a tile, one past a tile, both ways.
every_tail = stacked(pytest.mark.parametrize("causal", [False, True]),
                     pytest.mark.parametrize("seqlen_q", [1, 7, 65, 129]),
                     pytest.mark.parametrize("seqlen_k", [1, 7, 65, 129]))


def mask_dtype(mask):
    """Both 16-bit types across the mask features: bfloat16 where alibi adds its slopes."""
    return torch.bfloat16 if "alibi" in MASKS[mask] else torch.float16


# ---- forward ----

@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIM_PER_TILE)
def test_fwd_every_head_dim_tile(sim, dtype, head_dim):
    check_forward(sim, *make_qkv(2, 65, 129, 2, 1, head_dim, dtype, sim.device), MASKS["none"])


@every_mask_feature
def test_fwd_mask_features(sim, mask, seqlens):
    q, k, v = make_qkv(2, *seqlens, 3, 3, 64, mask_dtype(mask), sim.device)
    check_forward(sim, q, k, v, MASKS[mask])


@every_tail
def test_fwd_tails(sim, seqlen_q, seqlen_k, causal):
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 2, 1, 32, torch.bfloat16, sim.device)
    check_forward(sim, q, k, v, dict(causal=causal))


# Query blocks whose key tiles are of both kinds: tiles that hide no key, which with raw scores
# skip the score steps (fwd_kernel.cuh), beside tiles that need the per-entry mask; Sq != Sk both
# ways, Sk not a multiple of the key tile. softcap_causal runs the steps on every tile.
WIDE_WINDOW = dict(window=(150, 90))


@pytest.mark.parametrize("mask", ["causal", "wide_window", "softcap_causal"])
@pytest.mark.parametrize("seqlens", [(257, 200), (200, 257)], ids=str)
@pytest.mark.parametrize("head_dim", [128, 256])
def test_fwd_unmasked_beside_masked_tiles(sim, schedule, mask, seqlens, head_dim):
    q, k, v = make_qkv(1, *seqlens, 2, 1, head_dim, torch.bfloat16, sim.device)
    check_forward(sim, q, k, v, WIDE_WINDOW if mask == "wide_window" else MASKS[mask])


@pytest.mark.parametrize("heads_kv", [1, 2, 3, 6])
def test_fwd_gqa(sim, heads_kv):
    q, k, v = make_qkv(2, 33, 47, 6, heads_kv, 64, torch.float16, sim.device)
    check_forward(sim, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "bhsd_slice"])
@pytest.mark.parametrize("seqlen_q", [1, 5, 21, 22])
def test_fwd_gqa_decode(sim, mask, dtype, layout, seqlen_q):
    """A few queries per sequence with GQA (3 query heads per kv head): up to 64 rows (21
    queries) each group's query heads run as the rows of one tile (cuda/gqa_decode.h), each
    row's position its token's, unless ALiBi is on; 22 queries, 66 rows, run as they come. Both
    must match, in every mask and in a layout whose heads are not adjacent in memory."""
    q, k, v = make_qkv(2, seqlen_q, 129, 6, 2, 64, dtype, sim.device)
    if layout == "bhsd_slice":  # heads not adjacent in memory, rows wider than the head dim
        wide = torch.randn(2, 6, seqlen_q, 80, dtype=dtype, device=sim.device)
        q = wide.transpose(1, 2)[..., :64]
    check_forward(sim, q, k, v, MASKS[mask])


@pytest.mark.parametrize("head_dim", HEAD_DIM_PER_TILE)
def test_fwd_gqa_decode_every_head_dim_tile(sim, head_dim):
    """Packed GQA heads (4 per kv head, 3 query tokens, causal) on every 16-bit head-dim tile:
    above d = 128 the kernel rebuilds the row mapping inside its loop (fwd_kernel.cuh)."""
    q, k, v = make_qkv(2, 3, 129, 8, 2, head_dim, torch.bfloat16, sim.device)
    check_forward(sim, q, k, v, MASKS["window_causal"])


@pytest.mark.parametrize("head_dim", [7, 13, 100])
def test_fwd_unaligned_head_dim(sim, head_dim):
    """Head dims that are not whole 16-byte chunks take the non-cp.async load path."""
    q, k, v = make_qkv(1, 40, 70, 2, 1, head_dim, torch.float16, sim.device)
    check_forward(sim, q, k, v, dict(window=(20, 5)))


def test_fwd_strided_layouts(sim):
    # A slice of packed QKV (B, S, 3, H, D).
    q, k, v = torch.randn(2, 37, 3, 4, 64, dtype=torch.float16).unbind(2)
    check_forward(sim, q, k, v, MASKS["causal"])
    # SDPA's (B, H, S, D) seen as (B, S, H, D).
    q, k, v = (torch.randn(2, 4, s, 64, dtype=torch.bfloat16).transpose(1, 2) for s in (37, 50, 50))
    check_forward(sim, q, k, v, MASKS["none"])
    # A base pointer 2 bytes past a 16-byte boundary: rows are not cp.async-aligned.
    q, k, v = (torch.randn(1, s, 2, 65, dtype=torch.float16)[..., 1:] for s in (30, 45, 45))
    check_forward(sim, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_fwd_same_bits_under_every_schedule(sim, schedule, dtype):
    """Warp order between barriers must not matter: a missing __syncthreads or cp.async wait
    lets one warp see another's stale tile, and the result changes with the schedule."""
    torch.manual_seed(7)
    mask = dict(causal=True, window=(40, -1))
    q, k, v = make_qkv(1, 130, 150, 2, 1, 128, dtype, sim.device)
    out, lse = check_forward(sim, q, k, v, mask)
    sim.set_schedule("forward")
    out_forward, lse_forward = sim.fwd(q, k, v, 1 / math.sqrt(128), **mask)
    assert torch.equal(out, out_forward) and torch.equal(lse, lse_forward), schedule


def test_fwd_rows_that_see_nothing(sim):
    # Causal, aligned bottom-right, with Sq > Sk: the first Sq - Sk rows see no key.
    q, k, v = make_qkv(1, 70, 10, 2, 2, 64, torch.float16, sim.device)
    out, lse = check_forward(sim, q, k, v, MASKS["causal"])
    assert torch.all(out[:, :60] == 0) and torch.all(lse[:, :, :60] == float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("where,mask", NAN_CASES)
def test_fwd_nan_inputs_propagate(sim, dtype, where, mask):
    check_nan_propagation(sim, *make_qkv(1, 40, 35, 2, 2, 32, dtype, sim.device), where, mask)


@pytest.mark.parametrize("shape", [(0, 5, 3), (2, 0, 3), (2, 5, 0)], ids=str)
def test_fwd_empty(sim, shape):
    batch, seqlen_q, seqlen_k = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 2, 2, 32, torch.float16, sim.device)
    out, lse = sim.fwd(q, k, v, 0.5)
    assert out.shape == q.shape and lse.shape == (batch, 2, seqlen_q)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("head_dim", FP32_HEAD_DIMS)
@pytest.mark.parametrize("mask", FP32_MASKS)
def test_fwd_fp32(sim, head_dim, mask):
    q, k, v = make_qkv(1, 40, 70, 2, 1, head_dim, torch.float32, sim.device)
    check_forward(sim, q, k, v, MASKS[mask])


@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_fwd_logits_far_below_zero(sim, dtype, mask):
    """Rows whose every logit is far below zero, so that exp2 of each underflows
    (checks.make_qkv_far_below_zero), next to ordinary rows in the same tiles: only a running
    max that starts at -inf keeps them. Several key tiles, so the max is carried across them."""
    q, k, v = make_qkv_far_below_zero(1, 70, 150, 2, 1, 64, dtype, sim.device)
    check_forward(sim, q, k, v, MASKS[mask])


def test_schemas_match_flashattn(sim):
    for name in ("fwd", "bwd"):
        ours = str(getattr(sim.ops, name).default._schema).replace("flashattn_sim::", "")
        theirs = str(getattr(torch.ops.flashattn, name).default._schema).replace("flashattn::", "")
        assert ours == theirs


# ---- backward ----

@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIM_PER_TILE)
def test_bwd_every_head_dim_tile(sim, dtype, head_dim):
    q, k, v = make_qkv(2, 65, 129, 2, 1, head_dim, dtype, sim.device)
    check_backward(sim, q, k, v, MASKS["causal"])


@every_mask_feature
def test_bwd_mask_features(sim, mask, seqlens):
    q, k, v = make_qkv(2, *seqlens, 2, 2, 64, mask_dtype(mask), sim.device)
    check_backward(sim, q, k, v, MASKS[mask])


@every_tail
def test_bwd_tails(sim, seqlen_q, seqlen_k, causal):
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 2, 1, 32, torch.float16, sim.device)
    check_backward(sim, q, k, v, dict(causal=causal))


def test_bwd_odd_d_rows_keep_dq_pairs_aligned(sim):
    """heads_q x total_q odd (1 x 7): the dQ accumulator that follows D_i's rows in the
    workspace must still start 8-byte aligned for the paired reductions (plan_bwd.h
    dq_accum_offset); every other shape here has an even count."""
    q, k, v = make_qkv(1, 7, 9, 1, 1, 64, torch.bfloat16, sim.device)
    check_backward(sim, q, k, v, dict(causal=False))


@pytest.mark.parametrize("heads_kv", [1, 2, 3, 6])
@pytest.mark.parametrize("deterministic", [False, True])
def test_bwd_gqa_and_dlse(sim, heads_kv, deterministic):
    q, k, v = make_qkv(2, 33, 47, 6, heads_kv, 64, torch.bfloat16, sim.device)
    check_backward(sim, q, k, v, MASKS["causal"], deterministic=deterministic, with_dlse=True)


@pytest.mark.parametrize("head_dim", [7, 100, 200])
def test_bwd_unaligned_head_dim(sim, head_dim):
    q, k, v = make_qkv(1, 40, 70, 2, 1, head_dim, torch.float16, sim.device)
    check_backward(sim, q, k, v, dict(window=(20, 5), softcap=5.0))


def test_bwd_strided_layouts(sim):
    q, k, v = torch.randn(2, 37, 3, 4, 64, dtype=torch.float16).unbind(2)
    check_backward(sim, q, k, v, MASKS["causal"])
    q, k, v = (torch.randn(1, s, 2, 65, dtype=torch.bfloat16)[..., 1:] for s in (30, 45, 45))
    check_backward(sim, q, k, v, MASKS["causal"], deterministic=True)


@pytest.mark.parametrize("head_dim", [64, 192])
def test_bwd_deterministic_same_bits_under_every_schedule(sim, schedule, head_dim):
    """deterministic=True must give the same bits every run and under any warp order; the
    default (atomic dQ) must be correct under any warp order."""
    torch.manual_seed(11)
    q, k, v = make_qkv(1, 97, 80, 4, 2, head_dim, torch.bfloat16, sim.device)
    for deterministic in (True, False):
        check_backward(sim, q, k, v, MASKS["causal"], deterministic=deterministic,
                       with_dlse=True)
    # The same inputs twice, the second time in forward order: the bits must not change.
    scale = 1 / math.sqrt(head_dim)
    out, lse = sim.fwd(q, k, v, scale, causal=True)
    inputs = (torch.randn_like(out), q, k, v, out, lse, torch.randn_like(lse), scale)
    grads = sim.bwd(*inputs, causal=True, deterministic=True)
    sim.set_schedule("forward")
    again = sim.bwd(*inputs, causal=True, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, again)), schedule


def test_bwd_deterministic_query_tile_that_sees_nothing(sim):
    """Rows 0-119 see no key: the dQ kernel's first CTA (64 rows) skips its key loop and exits
    right after its Q/dO copies, which its final cp_async_wait_all() must retire."""
    q, k, v = make_qkv(1, 130, 10, 2, 1, 64, torch.bfloat16, sim.device)
    dq, _, _ = check_backward(sim, q, k, v, MASKS["causal"], deterministic=True)
    assert torch.all(dq[:, :120] == 0)


def test_bwd_rows_that_see_nothing(sim):
    q, k, v = make_qkv(1, 70, 10, 2, 2, 64, torch.float16, sim.device)
    dq, _, _ = check_backward(sim, q, k, v, MASKS["causal"], with_dlse=True)
    assert torch.all(dq[:, :60] == 0)


@pytest.mark.parametrize("shape", [(0, 5, 3, 2), (2, 0, 3, 2), (2, 5, 0, 2), (2, 5, 3, 0)],
                         ids=str)
@pytest.mark.parametrize("deterministic", [False, True])
def test_bwd_empty(sim, shape, deterministic):
    batch, seqlen_q, seqlen_k, heads_q = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, 2, 32, torch.float16, sim.device)
    out, lse = sim.fwd(q, k, v, 0.5)
    grads = sim.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.5,
                    deterministic=deterministic)
    for grad, like in zip(grads, (q, k, v)):
        assert grad.shape == like.shape and torch.all(grad == 0)


@pytest.mark.parametrize("head_dim", FP32_HEAD_DIMS)
@pytest.mark.parametrize("mask", FP32_MASKS)
def test_bwd_fp32(sim, head_dim, mask):
    q, k, v = make_qkv(1, 40, 70, 2, 1, head_dim, torch.float32, sim.device)
    check_backward(sim, q, k, v, MASKS[mask], with_dlse=True)


@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_bwd_logits_far_below_zero(sim, dtype, mask):
    """P recomputed from the LSE, exp2(S - LSE), for rows whose every logit is far below zero."""
    q, k, v = make_qkv_far_below_zero(1, 70, 150, 2, 1, 64, dtype, sim.device)
    check_backward(sim, q, k, v, MASKS[mask])


@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (0, 5), (5, 0)], ids=str)
def test_fp32_tails_and_strides(sim, seqlens):
    q, k, v = (torch.randn(1, s, 3, 2, 33, dtype=torch.float32)[:, :, 1]
               for s in (seqlens[0], seqlens[1], seqlens[1]))
    if 0 in seqlens:
        out, lse = sim.fwd(q, k, v, 0.3, causal=True)
        grads = sim.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.3, causal=True)
        assert torch.all(out == 0) and all(torch.all(g == 0) for g in grads)
        return
    check_forward(sim, q, k, v, MASKS["causal"])
    check_backward(sim, q, k, v, MASKS["causal"])
