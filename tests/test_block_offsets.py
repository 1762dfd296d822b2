"""Block offsets (block_offsets, csrc/params.h): a call that is one block of a larger attention,
told where its query rows, keys and heads sit in the whole one, computes what the whole call
computes there: causal, window and ALiBi by global distances, dropout at global (sequence,
head, row, key). flashattn.distributed's ring and Ulysses are built on it.

Checked on the CPU kernels and on the sm_80 CUDA kernels on the shim (few, small cases):
  - a block of rows (and of heads) gives bit for bit the whole call's out, LSE and dQ there
    (on the CPU where both take the same kernel: a block of at most 16 rows per kv head takes
    the decode kernel, whose row products round and sum otherwise than the tile products; on
    avx512-dot they agree, test_cpu_16bit_products.py checks that);
  - a block of keys gives the float64 reference of those keys alone, with global positions,
    within the tolerance rule, and its dropout keeps exactly the whole call's entries there
    (seen through a one-hot V: out[i, j] != 0 iff key j is kept);
  - the blocks of keys, merged by their LSE, give the whole call's out and LSE, and their
    backward (with the whole call's out and LSE, as the ring runs it) its dK and dV;
  - bad block_offsets are errors naming them.
"""
import pytest
import torch

from executors import make_executor
from flashattn._reference import attention_reference, visible_keys
from flashattn.distributed.merge import merge_
from tolerance import assert_within_torch_error

# Mask and score features, each as the op's arguments.
FEATURES = {
    "causal": dict(causal=True),
    "window": dict(window=(9, 4)),
    "causal-window-alibi": dict(causal=True, window=(13, -1), alibi=True),
    "alibi-softcap": dict(alibi=True, softcap=3.0),
    "dropout-causal": dict(causal=True, dropout_p=0.3),
    "dropout-window-alibi": dict(window=(20, 6), alibi=True, dropout_p=0.2),
}


def _inputs(seed, batch, seqlen_q, seqlen_k, heads, heads_kv, dim, dtype, dim_v=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, dim, generator=g).to(dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, dim, generator=g).to(dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, dim_v or dim, generator=g).to(dtype)
    return q, k, v


def _arguments(feature, heads, seed):
    kw = dict(FEATURES[feature])
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(heads, generator=torch.Generator().manual_seed(seed)) + 0.1
    if kw.get("dropout_p"):
        kw["rng_state"] = torch.tensor([1234 + seed, 8 * seed], dtype=torch.int64)
    return kw


def _offsets(batch, row, key, head, diagonal):
    return torch.tensor([[row, key, head, diagonal, b] for b in range(batch)], dtype=torch.int32)


def _keep_mask(kw, batch, heads, seqlen_q, seqlen_k):
    return torch.ops.flashattn.dropout_keep_mask(kw["rng_state"], kw["dropout_p"], batch, heads,
                                                 seqlen_q, seqlen_k)


# Sizes: Sq != Sk both ways, blocks that start off the kernels' tiles, at odd keys (dropout's
# groups of four keys) and at 1-row / 1-key edges. Rows [100, 140) of 200 straddle the CPU
# forward's 128-row tiles: the whole call sees key block 0 partly from rows 100-127 and wholly
# from 128-139, the block partly from all its rows (a tile with and without row steps).
ROW_BLOCKS = [(65, 47, 7, 33), (63, 129, 1, 61), (7, 7, 6, 1),   # (Sq, Sk, first row, rows)
              (200, 200, 100, 40)]
KEY_BLOCKS = [(47, 65, 13, 33), (65, 63, 1, 61), (7, 7, 0, 7)]   # (Sq, Sk, first key, keys)


def _cases(sizes):
    """Every size on the CPU, the first on the shim (each CUDA thread is a fiber there)."""
    return [(name, s) for name in ("cpu", "sim") for s in (sizes if name == "cpu" else sizes[:1])]


def _size_id(label):
    return lambda s: "Sq{}-Sk{}-{}{}+{}".format(s[0], s[1], label, s[2], s[3])


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("executor,sizes", _cases(ROW_BLOCKS),
                         ids=[f"{n}-" + _size_id("rows")(s) for n, s in _cases(ROW_BLOCKS)])
def test_a_block_of_rows_is_the_whole_calls_rows_bit_for_bit(executor, sizes, feature):
    ex = make_executor(executor)
    seqlen_q, seqlen_k, first, rows = sizes
    dtype = torch.bfloat16
    q, k, v = _inputs(1, 2, seqlen_q, seqlen_k, 4, 2, 32, dtype)
    dout = torch.randn(2, seqlen_q, 4, 32, generator=torch.Generator().manual_seed(2)).to(dtype)
    kw = _arguments(feature, 4, 3)
    out, lse = ex.fwd(q, k, v, None, **kw)
    dq, dk, dv = ex.bwd(dout, q, k, v, out, lse, None, None, **kw)
    cut = slice(first, first + rows)
    offsets = _offsets(2, first, 0, 0, seqlen_k - seqlen_q)
    # The ring's bottom-right alignment is the whole call's: align_bottom_right is unused.
    block_out, block_lse = ex.fwd(q[:, cut], k, v, None, block_offsets=offsets,
                                  align_bottom_right=False, **kw)
    assert torch.equal(block_out, out[:, cut])
    assert torch.equal(block_lse, lse[:, :, cut])
    block_dq, _, _ = ex.bwd(dout[:, cut], q[:, cut], k, v, out[:, cut], lse[:, :, cut], None, None,
                            block_offsets=offsets, **kw)
    assert torch.equal(block_dq, dq[:, cut])


@pytest.mark.parametrize("feature", ["dropout-causal", "causal-window-alibi"])
@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_a_block_of_heads_is_the_whole_calls_heads_bit_for_bit(executor, feature):
    """Ulysses' head offset: query heads 4..7 of 8 (kv heads 2..3 of 4)."""
    ex = make_executor(executor)
    q, k, v = _inputs(4, 1, 33, 47, 8, 4, 16, torch.float16)
    kw = _arguments(feature, 8, 5)
    out, lse = ex.fwd(q, k, v, None, **kw)
    block_kw = dict(kw)
    if "alibi_slopes" in kw:
        block_kw["alibi_slopes"] = kw["alibi_slopes"][4:]
    block_out, block_lse = ex.fwd(q[:, :, 4:], k[:, :, 2:], v[:, :, 2:], None,
                                  block_offsets=_offsets(1, 0, 0, 4, 47 - 33), **block_kw)
    assert torch.equal(block_out, out[:, :, 4:])
    assert torch.equal(block_lse, lse[:, 4:])


def _key_block_reference(q, k, v, kw, first, keys, keep):
    """Attention of every query to keys [first, first + keys) alone, at global positions, in
    q's dtype (float64 for the reference)."""
    mask = torch.zeros(q.shape[1], k.shape[1], dtype=torch.bool)
    mask[:, first:first + keys] = True
    slopes = kw.get("alibi_slopes")
    out, lse = attention_reference(
        q, k, v, softmax_scale=kw.get("softmax_scale"), causal=kw.get("causal", False),
        window_size=kw.get("window", (-1, -1)),
        softcap=kw.get("softcap", 0.0), alibi_slopes=None if slopes is None else slopes.to(q.dtype),
        attn_mask=mask, dropout_mask=keep, dropout_p=kw.get("dropout_p", 0.0))
    return out, lse


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("executor,sizes", _cases(KEY_BLOCKS),
                         ids=[f"{n}-" + _size_id("keys")(s) for n, s in _cases(KEY_BLOCKS)])
def test_a_block_of_keys_is_those_keys_at_global_positions(executor, sizes, feature):
    ex = make_executor(executor)
    seqlen_q, seqlen_k, first, keys = sizes
    dtype = torch.float16
    q, k, v = _inputs(6, 2, seqlen_q, seqlen_k, 4, 2, 32, dtype)
    kw = _arguments(feature, 4, 7)
    keep = _keep_mask(kw, 2, 4, seqlen_q, seqlen_k) if kw.get("dropout_p") else None
    cut = slice(first, first + keys)
    out, lse = ex.fwd(q, k[:, cut], v[:, cut], None,
                      block_offsets=_offsets(2, 0, first, 0, seqlen_k - seqlen_q), **kw)
    ref = _key_block_reference(q.double(), k.double(), v.double(), kw, first, keys, keep)
    low = _key_block_reference(q, k, v, kw, first, keys, keep)
    assert_within_torch_error("out", out, ref[0], low[0])
    assert_within_torch_error("lse", lse, ref[1], low[1].float())


DROP_CASES = [("cpu", first) for first in (0, 1, 2, 3, 6)] + [("sim", 1), ("sim", 6)]


@pytest.mark.parametrize("feature", ["dropout-causal", "dropout-window-alibi"])
@pytest.mark.parametrize("executor,first", DROP_CASES,
                         ids=[f"{n}-first{f}" for n, f in DROP_CASES])
def test_a_block_of_keys_drops_the_whole_calls_entries(executor, first, feature):
    """A one-hot V makes out[i, j] the dropped probability of key j: nonzero iff kept (and
    visible). Blocks start at every position in a group of four keys."""
    ex = make_executor(executor)
    seqlen_q, seqlen_k, keys = 37, 45, 24
    q, k, _ = _inputs(8, 2, seqlen_q, seqlen_k, 4, 2, keys, torch.float32)
    kw = _arguments(feature, 4, 9)
    v = torch.eye(keys)[None, :, None, :].expand(2, keys, 2, keys).contiguous()
    out, _ = ex.fwd(q, k[:, first:first + keys], v, None,
                    block_offsets=_offsets(2, 0, first, 0, seqlen_k - seqlen_q), **kw)
    keep = _keep_mask(kw, 2, 4, seqlen_q, seqlen_k)[..., first:first + keys]
    visible = visible_keys(seqlen_q, seqlen_k, kw.get("causal", False),
                           kw.get("window", (-1, -1)))
    visible = visible[:, first:first + keys]
    got = out.permute(0, 2, 1, 3) != 0                    # (B, H, Sq, keys)
    assert torch.equal(got, keep & visible)
    assert 0 < int(keep.sum()) < keep.numel()


@pytest.mark.parametrize("feature", ["causal-window-alibi", "dropout-window-alibi"])
@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_blocks_of_keys_merge_into_the_whole_call_forward_and_backward(executor, feature):
    """The ring's arithmetic on one process: key blocks [0, 29) and [29, 65) (an odd split),
    merged in float32; each block's backward with the whole call's out and LSE."""
    ex = make_executor(executor)
    seqlen_q, seqlen_k, split = 65, 65, 29
    q, k, v = _inputs(10, 1, seqlen_q, seqlen_k, 2, 1, 32, torch.float32)
    g = torch.Generator().manual_seed(11)
    dout = torch.randn(1, seqlen_q, 2, 32, generator=g)
    dlse = torch.randn(1, 2, seqlen_q, generator=g)
    kw = _arguments(feature, 2, 12)
    out, lse = ex.fwd(q, k, v, None, **kw)
    dq, dk, dv = ex.bwd(dout, q, k, v, out, lse, dlse, None, **kw)
    out_acc = torch.zeros_like(out)
    lse_acc = torch.full_like(lse, float("-inf"))
    dq_acc = torch.zeros_like(dq)
    dk_parts, dv_parts = [], []
    for first, keys in ((0, split), (split, seqlen_k - split)):
        cut = slice(first, first + keys)
        offsets = _offsets(1, 0, first, 0, 0)
        part_out, part_lse = ex.fwd(q, k[:, cut], v[:, cut], None, block_offsets=offsets, **kw)
        merge_(out_acc, lse_acc, part_out, part_lse)
        bdq, bdk, bdv = ex.bwd(dout, q, k[:, cut], v[:, cut], out, lse, dlse, None,
                               block_offsets=offsets, **kw)
        dq_acc += bdq
        dk_parts.append(bdk)
        dv_parts.append(bdv)
    torch.testing.assert_close(out_acc, out, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(lse_acc, lse, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(dq_acc, dq, rtol=1e-5, atol=1e-5)
    # Each key's dK / dV sums over every query: the block's are the whole call's exactly.
    assert torch.equal(torch.cat(dk_parts, 1), dk)
    assert torch.equal(torch.cat(dv_parts, 1), dv)


def test_bad_block_offsets_are_errors_naming_them():
    ex = make_executor("cpu")
    q, k, v = _inputs(13, 2, 8, 8, 2, 2, 16, torch.float32)
    good = _offsets(2, 0, 0, 0, 0)
    cases = [
        (good.long(), "block_offsets must be int32, got Long"),
        (good[:1], r"block_offsets must have shape \[batch, 5\] = \[2, 5\]"),
        (good[:, :4], r"block_offsets must have shape \[batch, 5\]"),
        (torch.zeros(2, 10, dtype=torch.int32)[:, ::2], "block_offsets must be contiguous"),
        (_offsets(2, -1, 0, 0, 0), r"block_offsets\[0, 0\] \(row_offset\) = -1 must be in"),
        (_offsets(2, 0, 1 << 29, 0, 0), r"block_offsets\[0, 1\] \(key_offset\) = 536870912"),
        (_offsets(2, 0, 0, 0, -(1 << 29)), r"\(diagonal\) = -536870912 must be in"),
    ]
    for offsets, message in cases:
        with pytest.raises(RuntimeError, match=message):
            ex.fwd(q, k, v, None, block_offsets=offsets)
        with pytest.raises(RuntimeError, match=message):
            ex.bwd(q, q, k, v, q, torch.zeros(2, 2, 8), None, None, block_offsets=offsets)


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def test_calls_with_block_offsets_stay_off_the_hopper_kernels(sim):
    """The sm_90a kernels take no block offsets: on a cc 9.0 device opted in, a call the Hopper
    forward and backward would take gets exactly the sm_80 plan once it has them."""
    from test_cudasim_plan import SM90, plan_bwd, plan_fwd, qkv
    hopper = dict(SM90, hopper_fwd=True)
    q, k, v = qkv(2, 130, 130, 2, 2, 128)
    assert plan_fwd(sim, q, k, v, causal=True, device=hopper)["arch"] == "sm90"
    assert plan_bwd(sim, q, k, v, causal=True, device=hopper)["arch"] == "sm90"
    offsets = _offsets(2, 130, 260, 0, 0)
    for plan in (plan_fwd, plan_bwd):
        got = plan(sim, q, k, v, causal=True, block_offsets=offsets, device=hopper)
        assert got["device_arch"] == "sm90" and got["arch"] == "sm80"
        assert got == plan(sim, q, k, v, causal=True, block_offsets=offsets, device=SM90)
