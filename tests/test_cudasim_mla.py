"""A value head dim of its own (MLA) on the CUDA kernels, run on the CPU shim: a pair runs on the
head-dim tile of the wider dim (csrc/cuda/plan_fwd.h, tile_head_dim), with V, O, dO and dV read
and written over their own head_dim_v columns. Every result is checked against the float64
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

from checks import MASKS
from executors import make_executor
from test_kvcache import Case
from test_mla import check_forward_and_backward, make_qkv
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


def test_the_tile_is_the_wider_dims(sim):
    """The plan picks the tile of max(head_dim, head_dim_v), both directions; the split scratch
    holds out's head_dim_v columns per row."""
    for dims, tile16, tile32 in (((192, 128), 192, 256), ((64, 128), 128, 128),
                                 ((128, 64), 128, 128), ((72, 40), 96, 128)):
        for dtype, tile in ((torch.bfloat16, tile16), (torch.float32, tile32)):
            q, k, v = make_qkv(2, 1, 700, 8, 1, dims, dtype)
            fwd = json.loads(sim.ops.plan_fwd(q, k, v, num_splits=4))
            bwd = json.loads(sim.ops.plan_bwd(q, k, v))
            assert (fwd["head_dim_tile"], bwd["head_dim_tile"]) == (tile, tile), (dims, dtype)
            # num_splits x (out's elements + lse's): B x Sq x Hq x Dv + B x Sq x Hq.
            assert fwd["split_scratch_floats"] == 4 * (2 * 8 * dims[1] + 2 * 8)


def test_unequal_pairs_run_on_the_one_m_tile_kernel(sim):
    """Up to d = 128 a prefill runs on the two-m-tile forward, which assumes equal head dims
    (fwd_kernel.cuh, v_cols): an unequal pair of that tile takes the one-m-tile kernel."""
    for dims, one_m_tile in (((128, 128), False), ((128, 64), True), ((64, 128), True),
                             ((96, 96), False), ((96, 80), True)):
        q, k, v = make_qkv(1, 129, 129, 2, 2, dims, torch.float16)
        assert json.loads(sim.ops.plan_fwd(q, k, v))["one_m_tile"] == one_m_tile, dims


@pytest.mark.parametrize("dims", [(576, 512), (320, 128), (128, 320)], ids=str)
def test_pairs_beyond_the_largest_tile_are_refused(sim, dims):
    """Until a tile covers them (576 / 512: MLA's absorbed decode), with both dims named."""
    q, k, v = make_qkv(1, 1, 8, 2, 1, dims, torch.bfloat16)
    message = (rf"the CUDA \(cudasim\) kernels support head dims <= 256, got head_dim = "
               rf"{dims[0]} \(q, k\) and head_dim_v = {dims[1]} \(v\); a wider pair \(MLA's "
               r"absorbed decode, 576 / 512\) runs on the CPU only for now")
    with pytest.raises(RuntimeError, match=message):
        sim.fwd(q, k, v, None)
    with pytest.raises(RuntimeError, match=message):
        sim.ops.fwd_kvcache(q, k, v)
