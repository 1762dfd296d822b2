"""A value head dim of its own (MLA) on the CUDA kernels, run on the CPU shim: the 16-bit forward
and backward run (192, 128) and (128, 64) on tiles of their own (V, O, dO and dV 128 or 64 wide:
kernel_list.py HEAD_DIM_PAIRS_16BIT_FWD and _BWD), every other pair, and the fp32 kernels every
pair, on the head-dim tile of the wider dim
(csrc/cuda/plan_fwd.h, tile_head_dim), with V, O, dO and dV read and written over their own
head_dim_v columns. Every result is checked against the float64
reference with PyTorch's own error in the dtype as the yardstick; outputs are poisoned before
the kernels write them (conftest.py, FLASHATTN_POISON_OUTPUTS).

The shim runs every CUDA thread as a fiber, so the sizes are small and the axes are covered one
at a time: the three pairs on every kernel family (16-bit tensor cores, fp32 SIMT), GQA and
causal everywhere, then varlen, the deterministic dQ kernel, the KV cache's decode (paged, V as
a view of K's cache, split-KV and its merge) and the pairs the kernels refuse.
"""
import json

import pytest
import torch

from checks import MASKS, check_forward, to64
from executors import make_executor
from flashattn._reference import attention_reference
from test_kvcache import Case
from test_mla import check_forward_and_backward, make_qkv
from tolerance import assert_within_torch_error
from varlen_checks import VarlenBatch, check_varlen

# (head_dim, head_dim_v): MLA's training / prefill pair, a halved v, a wider v.
PAIRS = [(192, 128), (128, 64), (64, 128)]
ALL_TYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture(scope="module")
def sim():
    # Module scope: a missing toolkit or a failed build is reported once, not once per test.
    return make_executor("sim")


@pytest.mark.parametrize("dims", PAIRS, ids=str)
@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
def test_pairs_match_the_reference(sim, dims, dtype):
    """Forward and backward (dQ by atomics), GQA 6 on 2, causal, Sq != Sk both ways at sizes
    that leave partial tiles."""
    for seqlen_q, seqlen_k in ((65, 129), (127, 63)):
        q, k, v = make_qkv(2, seqlen_q, seqlen_k, 6, 2, dims, dtype)
        check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim)


@pytest.mark.parametrize("mask", ["none", "window", "softcap_causal", "alibi"])
def test_mask_features(sim, mask):
    q, k, v = make_qkv(1, 65, 129, 4, 2, (192, 128), torch.bfloat16)
    check_forward_and_backward(q, k, v, MASKS[mask], ex=sim)


@pytest.mark.parametrize("dims,dtype", [((100, 36), torch.float16), ((40, 72), torch.bfloat16),
                                        ((7, 65), torch.float32), ((63, 1), torch.float16)],
                         ids=str)
def test_ragged_head_dims(sim, dims, dtype):
    """Head dims that are not whole 16-byte chunks (the kernels' element-wise copies), one per
    side, and a v of one column."""
    q, k, v = make_qkv(1, 33, 47, 2, 1, dims, dtype)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim)


@pytest.mark.parametrize("dims", PAIRS, ids=str)
def test_deterministic_dq_kernel(sim, dims):
    q, k, v = make_qkv(1, 65, 63, 4, 1, dims, torch.float16)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim, bwd_arguments=dict(
        deterministic=True))


@pytest.mark.parametrize("dims,dtype", [((192, 128), torch.bfloat16), ((64, 128), torch.float32)],
                         ids=str)
def test_varlen(sim, dims, dtype):
    """Lengths 0 to 129 in one batch, rows of no sequence at the end, GQA 4 on 2."""
    head_dim, head_dim_v = dims
    vb = VarlenBatch([0, 1, 65, 17, 129], [7, 63, 1, 129, 40], extra_q=3, extra_k=2)
    q = torch.randn(vb.total_q, 4, head_dim, dtype=dtype)
    k = torch.randn(vb.total_k, 2, head_dim, dtype=dtype)
    v = torch.randn(vb.total_k, 2, head_dim_v, dtype=dtype)
    out, _, grads = check_varlen(sim, vb, q, k, v, MASKS["causal"])
    assert out.shape == (vb.total_q, 4, head_dim_v) and grads[2].shape == v.shape


@pytest.mark.parametrize("dims", PAIRS, ids=str)
@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_kvcache_decode(sim, dims, layout, dtype):
    """One token, 8 query heads on one kv head (packed GQA), an append of k and v with rotary
    on k, split-KV at the planner's count."""
    head_dim, head_dim_v = dims
    Case(head_dim=head_dim, head_dim_v=head_dim_v, heads=8, heads_kv=1, seqlen_cache=300,
         page_size=64 if layout == "paged" else None, rotary_dim=16, dtype=dtype).check(sim.ops)


@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache_values_inside_the_keys(sim, layout, dtype, num_splits):
    """v_cache = k_cache[..., :128] (MLA's latent cache): V read in place through its own
    strides, an append of k alone, the decode unsplit and split into 3 parts (the merge)."""
    case = Case(head_dim=192, head_dim_v=128, heads=16, heads_kv=1, seqlen_q=1, seqlen_new=1,
                seqlen_cache=400, page_size=64 if layout == "paged" else None, rotary_dim=0,
                num_splits=num_splits, dtype=dtype, values_in_keys=True)
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    assert case.v_cache.stride() == case.k_cache.stride()
    case.check(sim.ops)


def test_the_tile_is_the_pairs_or_the_wider_dims(sim):
    """The 16-bit forward's and backward's plans pick the (192, 128) or (128, 64) tile for the
    pairs they cover, else the tile of max(head_dim, head_dim_v), as fp32 always does; the split
    scratch holds out's head_dim_v columns per row."""
    for dims, fwd16, tile32 in (((192, 128), (192, 128), 256),
                                ((180, 120), (192, 128), 256),
                                ((64, 128), (128, 128), 128),
                                ((128, 64), (128, 64), 128),
                                ((100, 33), (128, 64), 128),
                                ((128, 65), (128, 128), 128),
                                ((72, 40), (96, 96), 128)):
        for dtype, fwd_tile in ((torch.bfloat16, fwd16), (torch.float32, (tile32, tile32))):
            q, k, v = make_qkv(2, 1, 700, 8, 1, dims, dtype)
            fwd = json.loads(sim.ops.plan_fwd(q, k, v, num_splits=4))
            bwd = json.loads(sim.ops.plan_bwd(q, k, v))
            assert (fwd["head_dim_tile"], fwd["head_dim_v_tile"]) == fwd_tile, (dims, dtype)
            assert (bwd["head_dim_tile"], bwd["head_dim_v_tile"]) == fwd_tile, (dims, dtype)
            # num_splits x (out's elements + lse's): B x Sq x Hq x Dv + B x Sq x Hq.
            assert fwd["split_scratch_floats"] == 4 * (2 * 8 * dims[1] + 2 * 8)


def test_unequal_pairs_run_on_the_one_m_tile_kernel(sim):
    """Up to d = 128 a prefill runs on the two-m-tile forward, which assumes equal head dims
    (fwd_kernel.cuh, v_cols): an unequal pair of that tile takes the one-m-tile kernel."""
    for dims, one_m_tile in (((128, 128), False), ((128, 64), True), ((64, 128), True),
                             ((96, 96), False), ((96, 80), True)):
        q, k, v = make_qkv(1, 129, 129, 2, 2, dims, torch.float16)
        assert json.loads(sim.ops.plan_fwd(q, k, v))["one_m_tile"] == one_m_tile, dims


# ---- MLA's (192, 128) tile: Q and K 192 wide, V and O 128, 64 keys per tile; its backward's
# dK/dV kernel (dK 192 wide, dV and dO 128) and deterministic dQ kernel ----


def assert_pair_tiles(sim, q, k, v, tile=(192, 128)):
    fwd = json.loads(sim.ops.plan_fwd(q, k, v))
    assert (fwd["head_dim_tile"], fwd["head_dim_v_tile"]) == tile
    bwd = json.loads(sim.ops.plan_bwd(q, k, v))
    assert (bwd["head_dim_tile"], bwd["head_dim_v_tile"]) == tile

@pytest.mark.parametrize("seqlens", [(1, 257), (7, 63), (63, 7), (65, 129), (129, 65), (127, 1),
                                     (257, 127)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_pair_tile_awkward_sizes(sim, seqlens, dtype):
    """The (192, 128) tile's forward and backward at partial query and key tiles, Sq != Sk both
    ways, GQA 2 on 1, causal."""
    q, k, v = make_qkv(1, *seqlens, 2, 1, (192, 128), dtype)
    assert_pair_tiles(sim, q, k, v)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim)


@pytest.mark.parametrize("seqlens", [(1, 257), (63, 7), (129, 65), (257, 127)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_pair_tile_deterministic_awkward_sizes(sim, seqlens, dtype):
    """The (192, 128) tile's deterministic dQ kernel (32 keys per tile, a two-stage K/V ring of
    192- and 128-wide tiles), Sq != Sk both ways, GQA 2 on 1, causal."""
    q, k, v = make_qkv(1, *seqlens, 2, 1, (192, 128), dtype)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim,
                               bwd_arguments=dict(deterministic=True))


@pytest.mark.parametrize("deterministic", [False, True])
def test_pair_tile_backward_under_every_schedule(sim, schedule, deterministic):
    """The warps' order between barriers (conftest.py, schedule): P^T and dS^T through shared
    memory, dO 128 wide beside Qi, the next tile's copy overlapping dQ; the dQ kernel's ring."""
    q, k, v = make_qkv(1, 65, 129, 2, 1, (192, 128), torch.bfloat16)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim,
                               bwd_arguments=dict(deterministic=deterministic))


def test_pair_tile_under_every_schedule(sim, schedule):
    """The warps' order between barriers (conftest.py, schedule): the 64-key V tile is copied
    while S is computed, and O is staged in Qi's rows at the end."""
    q, k, v = make_qkv(2, 65, 129, 2, 2, (192, 128), torch.bfloat16)
    check_forward(sim, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("dims,dtype", [((190, 120), torch.float16), ((129, 7), torch.bfloat16),
                                        ((192, 1), torch.float16)], ids=str)
def test_pair_tile_ragged_dims(sim, dims, dtype):
    """Pairs the (192, 128) tile covers that are not whole 16-byte chunks (the element-wise
    copies), down to a v of one column; forward and backward."""
    q, k, v = make_qkv(1, 33, 47, 2, 1, dims, dtype)
    assert_pair_tiles(sim, q, k, v)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim)


def test_pair_tile_dropout(sim):
    """Dropout on the (192, 128) tile's kernel (it is the one-m-tile kernel, which applies it):
    against the reference with the keep mask of the same random state."""
    check_forward_with_dropout(sim, (192, 128))


# ---- (128, 64): Q and K 128 wide, V and O 64; one m-tile (its only forward kernel), 64 keys per
# tile; the backward's dK/dV 128 keys per CTA (dV 64 wide), dQ 64 x 64 ----

@pytest.mark.parametrize("seqlens", [(1, 257), (7, 63), (63, 7), (65, 129), (129, 65), (127, 1),
                                     (257, 127)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_pair_128_64_awkward_sizes(sim, seqlens, dtype):
    """Forward and backward at partial query and key tiles, Sq != Sk both ways, GQA 2 on 1,
    causal."""
    q, k, v = make_qkv(1, *seqlens, 2, 1, (128, 64), dtype)
    assert_pair_tiles(sim, q, k, v, (128, 64))
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim)


@pytest.mark.parametrize("seqlens", [(1, 257), (129, 65)], ids=str)
def test_pair_128_64_deterministic(sim, seqlens):
    q, k, v = make_qkv(1, *seqlens, 2, 1, (128, 64), torch.bfloat16)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim,
                               bwd_arguments=dict(deterministic=True))


@pytest.mark.parametrize("deterministic", [False, True])
def test_pair_128_64_under_every_schedule(sim, schedule, deterministic):
    q, k, v = make_qkv(1, 65, 129, 2, 1, (128, 64), torch.float16)
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim,
                               bwd_arguments=dict(deterministic=deterministic))


@pytest.mark.parametrize("dims,dtype", [((100, 36), torch.float16), ((121, 7), torch.bfloat16),
                                        ((128, 1), torch.float16)], ids=str)
def test_pair_128_64_ragged_dims(sim, dims, dtype):
    """Pairs the (128, 64) tile covers that are not whole 16-byte chunks, down to a v of one
    column."""
    q, k, v = make_qkv(1, 33, 47, 2, 1, dims, dtype)
    assert_pair_tiles(sim, q, k, v, (128, 64))
    check_forward_and_backward(q, k, v, MASKS["causal"], ex=sim)


def test_pair_128_64_dropout(sim):
    check_forward_with_dropout(sim, (128, 64))


# ---- head dims above 256: MLA's 576 tile (q, k 576 wide, v 512), forward only ----

WIDE_PAIRS = [(512, 512), (576, 512)]


@pytest.mark.parametrize("dims", WIDE_PAIRS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wide_heads_forward(sim, dims, dtype):
    """The 576 tile (two warps per m-tile, each half of O's columns): GQA 4 on 2, causal,
    Sq != Sk both ways at partial tiles."""
    for seqlen_q, seqlen_k in ((65, 129), (127, 63)):
        q, k, v = make_qkv(1, seqlen_q, seqlen_k, 4, 2, dims, dtype)
        check_forward(sim, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("seqlens", [(1, 257), (7, 63), (63, 7), (65, 129), (129, 65), (127, 1),
                                     (257, 127)], ids=str)
def test_wide_heads_awkward_sizes(sim, seqlens):
    q, k, v = make_qkv(1, *seqlens, 2, 1, (576, 512), torch.bfloat16)
    check_forward(sim, q, k, v, MASKS["none"])


@pytest.mark.parametrize("mask", ["window", "softcap_causal", "alibi"])
def test_wide_heads_mask_features(sim, mask):
    q, k, v = make_qkv(1, 65, 129, 2, 1, (576, 512), torch.float16)
    check_forward(sim, q, k, v, MASKS[mask])


def test_wide_heads_under_every_schedule(sim, schedule):
    """The warps' order between barriers (conftest.py, schedule): the two warps of an m-tile
    write one row of O's staging tile each, after the loop's last barrier."""
    q, k, v = make_qkv(2, 65, 129, 2, 2, (576, 512), torch.bfloat16)
    check_forward(sim, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("dims,dtype", [((513, 264), torch.float16), ((300, 500), torch.bfloat16),
                                        ((576, 1), torch.float16), ((260, 7), torch.bfloat16)],
                         ids=str)
def test_wide_heads_ragged_dims(sim, dims, dtype):
    """Head dims that are not whole 16-byte chunks (element-wise copies) on the 576 tile."""
    q, k, v = make_qkv(1, 33, 47, 2, 1, dims, dtype)
    check_forward(sim, q, k, v, MASKS["causal"])


def test_wide_heads_dropout(sim):
    """Dropout on the 576 tile, whose two warps per m-tile must drop the same entries: against
    the reference with the keep mask of the same random state."""
    check_forward_with_dropout(sim, (576, 512))


def check_forward_with_dropout(sim, dims):
    q, k, v = make_qkv(1, 33, 65, 2, 1, dims, torch.bfloat16)
    p = 0.17
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    keep = torch.ops.flashattn.dropout_keep_mask(rng_state, p, 1, 2, 33, 65)
    out, _ = sim.fwd(q, k, v, q.shape[-1] ** -0.5, causal=True, dropout_p=p, rng_state=rng_state)
    ref_kwargs = dict(causal=True, dropout_mask=keep, dropout_p=p)
    ref_out, _ = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, _ = attention_reference(q, k, v, **ref_kwargs)
    assert_within_torch_error("out", out, ref_out, low_out)


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_mla_absorbed_decode(sim, heads, dtype, num_splits):
    """DeepSeek-V3's absorbed decode step (128 query heads; 16 for a smaller model's): one latent
    kv head, 576 / 512, V the first 512 columns of K's rows (read in place through V's own
    strides), a paged cache of 64-row pages, an append of k alone; unsplit and split in 3 (the
    merge of 512 columns)."""
    case = Case(batch=2, seqlen_q=1, heads=heads, heads_kv=1, head_dim=576, head_dim_v=512,
                seqlen_cache=300, seqlen_new=1, page_size=64, rotary_dim=0, dtype=dtype,
                num_splits=num_splits, values_in_keys=True)
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    # The plan of such a step (on a dense cache of the same shape): the 576 tile, the query heads
    # packed as the rows of the latent head's tile.
    k = torch.randn(2, 300, 1, 576, dtype=dtype)
    plan = json.loads(sim.ops.plan_fwd(case.q, k, k[..., :512], num_splits=num_splits))
    assert (plan["head_dim_tile"], plan["packed_heads"]) == (576, heads)
    case.check(sim.ops)


def test_mla_decode_tile_and_shape(sim):
    """The 576 tile: 64 query rows (the packed heads), 32 keys, 8 warps, Qi, K and V tiles in
    142 KB of shared memory (sm_80's 163 KB); every head dim from 257 to 512 takes it too."""
    for dims in ((576, 512), (512, 512), (257, 257), (300, 100), (64, 512)):
        q, k, v = make_qkv(1, 1, 700, 128, 1, dims, torch.bfloat16)
        plan = json.loads(sim.ops.plan_fwd(q, k, v, num_splits=1))
        assert plan["head_dim_tile"] == 576, dims
        assert plan["block"] == [256, 1, 1], dims
        assert plan["smem_bytes"] == ((64 + 32) * (576 + 8) + 32 * (512 + 8)) * 2, dims
        # 128 query heads packed as the rows of one kv head: two 64-row CTAs.
        assert plan["packed_heads"] == 128 and plan["grid"] == [2, 1, 1], dims


@pytest.mark.parametrize("dims,message", [
    ((576, 576), r"the CUDA kernels support head_dim_v <= 512, got head_dim_v = 576 "
                 r"\(head_dim = 576\)"),
    ((520, 528), r"the CUDA kernels support head_dim_v <= 512, got head_dim_v = 528 "
                 r"\(head_dim = 520\)"),
    ((640, 512), r"the CUDA \(cudasim\) kernels support head dims <= 576, got head_dim = 640 "
                 r"\(q, k\) and head_dim_v = 512 \(v\); a wider pair runs on the CPU only"),
    ((640, 640), r"the CUDA \(cudasim\) kernels support head_dim <= 576, got 640"),
], ids=str)
def test_pairs_beyond_the_576_tile_are_refused(sim, dims, message):
    q, k, v = make_qkv(1, 1, 8, 2, 1, dims, torch.bfloat16)
    with pytest.raises(RuntimeError, match=message):
        sim.fwd(q, k, v, None)
    with pytest.raises(RuntimeError, match=message):
        sim.ops.fwd_kvcache(q, k, v)


def test_wide_heads_in_float32_are_refused(sim):
    """The fp32 SIMT kernels stop at 256 (traits.h kMaxHeadDimSimt)."""
    q, k, v = make_qkv(1, 1, 8, 2, 1, (576, 512), torch.float32)
    with pytest.raises(RuntimeError, match=r"the CUDA float32 kernels support head dims <= 256, "
                                           r"got head_dim = 576 and head_dim_v = 512"):
        sim.fwd(q, k, v, None)


@pytest.mark.parametrize("dims", [(512, 512), (576, 512), (300, 128)], ids=str)
def test_wide_heads_backward_is_refused(sim, dims):
    """The backward stops at 256 (traits.h kMaxHeadDimBwd: a dK/dV tile at 512 passes the
    registers and shared memory): a clear error naming both head dims, after a forward that
    runs."""
    q, k, v = make_qkv(1, 9, 17, 2, 1, dims, torch.bfloat16)
    out, lse = sim.fwd(q, k, v, None)
    message = (rf"the CUDA backward supports head dims <= 256, got head_dim = {dims[0]} and "
               rf"head_dim_v = {dims[1]}; the forward runs up to 576 / 512")
    with pytest.raises(RuntimeError, match=message):
        sim.bwd(torch.randn_like(out), q, k, v, out, lse, None, None)
