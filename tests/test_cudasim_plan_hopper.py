"""The plans' choice of the sm_90a kernels (csrc/cuda/plan_fwd_sm90.h, plan_bwd_sm90.h), without a
GPU. The forward:
torch.ops.flashattn_sim.plan_fwd on a compute capability 9.0 device, opted in (hopper_fwd, what
FLASHATTN_CUDA_HOPPER=1 sets) or not. The Hopper forward takes 16-bit calls of head dim 64, 128 or 256,
causal (either alignment) or not, dense or varlen, with seqused or without, attn_mask (any
layout, with softcap, ALiBi or both, at every head dim), that the sm_80 plan
would run as one unsplit launch with TMA-readable layouts (a packed GQA decode too, with up to 64
query heads per kv head); every other call stays on the
sm_80 kernels, each such feature listed in README's support table. Geometry, by hopper/fwd_sm90_config.h: 128 query rows per CTA, 384
threads, grid (ceil(Sq / 128), Hq, B), dynamic shared memory Q + 2 stages of K and V (128 keys a
tile, 64 at d = 256; 3 stages for a gathered KV cache up to d = 128) + 8 mbarriers (11 with 3
stages) + 1024 bytes of alignment slack.

The backward (torch.ops.flashattn_sim.plan_bwd, the same opt-in) takes 16-bit calls of head dim
64 or 128, dense or varlen, with seqused or without, causal (either alignment) or not, local
windows, softcap, ALiBi (with softcap), attn_mask (with ALiBi and with softcap; not its
gradient), GQA,
deterministic or not, whose q, k, v and dout TMA can read; everything else keeps the sm_80
backward. Its three launches, by
hopper/bwd_sm90_params.h (bwd_sm90_grids): the rows kernel over Sq padded to kBlockM (128 at d = 64,
64 at d = 128) in blocks of 128 threads, the main kernel per (128 keys, kv head, batch) with 384
threads, the dQ convert kernel over Sq; its workspace the two row-stat buffers [B, Hq, Sq padded]
and the fp32 dQ accumulator (one slice per key block when deterministic); varlen, [1, Hq, total_q +
B kBlockM padded] rows (each sequence padded to whole query blocks).
"""
import math

import pytest
import torch

from executors import make_executor
from repo_tools import load_tool
from test_cudasim_plan import SM80, SM90, plan_bwd, plan_fwd, qkv

HOPPER = dict(SM90, hopper_fwd=True)
SPLIT_SEQLENS_K = (512, 8192, 32768, 131072)
# (128 query rows + 2 x 2 x kBlockN keys) x d x 2 bytes + 8 mbarriers x 8 + 24 (the walk's
# q_empty and tile slot, hopper/fwd_sm90_walk.h) + 1024; kBlockN = 128, and 64 at d = 256.
HOPPER_SMEM = {64: 83032, 128: 164952, 256: 197720}
# A gathered KV cache's ring: 3 stages up to d = 128 (hopper/fwd_sm90_config.h
# fwd_sm90_gather_stages), so 11 mbarriers; 2 at d = 256, as dense.
HOPPER_GATHER_SMEM = {64: 115824, 128: 230512, 256: 197720}


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


@pytest.mark.parametrize("sm_count, counter", [(25, False), (24, False), (23, True), (1, True)])
@pytest.mark.parametrize("d, kwargs, walks", [(64, dict(causal=True), True), (128, {}, True),
                                              (128, dict(window_left=37, window_right=5), False),
                                              (256, dict(causal=True), False), (64, dict(softcap=2.0), False)])
def test_hopper_tile_counter_only_past_the_grid(sim, d, kwargs, walks, sm_count, counter):
    """The executor's rule (plan_fwd.h fwd_plan_takes_tile_counter, as executor.h asks it): a call
    gets its own tile counter only where its kernel walks (hopper/fwd_sm90_walk.h) and its 24
    tiles (grid (2, 4, 3)) outnumber the SMs: at 24 or more SMs every CTA runs its own one."""
    plan = plan_fwd(sim, *qkv(3, 200, 300, 4, 2, d), **kwargs, device=dict(HOPPER, sm_count=sm_count))
    assert plan["arch"] == "sm90" and plan["grid"] == [2, 4, 3] and plan["num_splits"] == 1
    assert plan["tile_counter"] == (walks and counter)
    # The sm_80 plan of the same call never has one.
    assert not plan_fwd(sim, *qkv(3, 200, 300, 4, 2, d), **kwargs, device=dict(SM90, sm_count=sm_count))["tile_counter"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_takes_its_calls(sim, dtype, d, causal):
    plan = plan_fwd(sim, *qkv(3, 200, 300, 4, 2, d, dtype), causal=causal, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["device_arch"] == "sm90"
    assert plan["family"] == "tensor_core" and plan["head_dim_tile"] == d
    assert plan["block_rows"] == 128 and plan["block"] == [384, 1, 1]
    assert plan["grid"] == [2, 4, 3]
    assert plan["smem_bytes"] == HOPPER_SMEM[d] and plan["arch_smem_bytes"] == 227 * 1024
    assert plan["num_splits"] == 1 and not plan["merges"] and plan["packed_heads"] == 1


def test_hopper_takes_top_left_causal_and_one_row(sim):
    plan = plan_fwd(sim, *qkv(1, 65, 7, 2, 2, 64), causal=True, align_bottom_right=False,
                    device=HOPPER)
    assert plan["arch"] == "sm90" and plan["grid"] == [1, 2, 1]
    # One query, no GQA: nothing to pack, so the Hopper kernel takes it too.
    plan = plan_fwd(sim, *qkv(1, 1, 1, 1, 1, 128), device=HOPPER)
    assert plan["arch"] == "sm90" and plan["grid"] == [1, 1, 1]


def test_hopper_takes_the_packed_gqa_decode(sim):
    """A GQA decode the sm_80 plan packs (gqa_decode.h: the same decision, made once) runs on the
    Hopper kernel packed: heads_q is Hkv, seqlen_q the packed rows, and the grid one CTA per
    2 floor(64 / g) tokens of each (kv head, batch)."""
    q, k, v = qkv(2, 1, 512, 8, 2, 128)
    sm80 = plan_fwd(sim, q, k, v, device=SM90)
    plan = plan_fwd(sim, q, k, v, device=HOPPER)
    assert sm80["packed_heads"] == 4 and sm80["arch"] == "sm80"
    assert plan["arch"] == "sm90" and plan["packed_heads"] == 4
    assert plan["heads_q"] == 2 and plan["seqlen_q"] == 4 and plan["grid"] == [1, 2, 2]
    assert plan["block_rows"] == 128 and plan["smem_bytes"] == HOPPER_SMEM[128]
    # g = 5 (10 / 2): 12 tokens per consumer, 24 per CTA: 30 tokens take two CTAs (the sm_80
    # plan's 150 rows take three 64-row tiles < 5: packed).
    plan = plan_fwd(sim, *qkv(1, 30, 65, 10, 2, 64), causal=True, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["packed_heads"] == 5 and plan["grid"] == [2, 2, 1]
    # 64 query heads per kv head: one token per consumer.
    plan = plan_fwd(sim, *qkv(1, 3, 65, 64, 1, 64), device=HOPPER)
    assert plan["arch"] == "sm90" and plan["packed_heads"] == 64 and plan["grid"] == [2, 1, 1]
    # Unpacked (too many tokens for the group: 33 x 2 rows take two tiles, not fewer than 2).
    plan = plan_fwd(sim, *qkv(1, 33, 65, 2, 1, 64), device=HOPPER)
    assert plan["arch"] == "sm90" and plan["packed_heads"] == 1 and plan["grid"] == [1, 2, 1]


def test_hopper_splits_the_packed_decode_by_its_own_ctas(sim):
    """The split model sees B x Hkv CTAs of the packed rows: at 16k keys on 132 SMs a few kv
    heads' CTAs split, as the sm_80 plan splits its packed CTAs; a count given is kept."""
    q, k, v = qkv(2, 1, 16384, 8, 2, 128)
    plan = plan_fwd(sim, q, k, v, num_splits=0, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["packed_heads"] == 4 and plan["num_splits"] > 1
    assert plan["grid"] == [plan["num_splits"], 2, 2] and plan["merges"]
    # The scratch holds out's and lse's rows unpacked: B x Sq x Hq (x d).
    assert plan["split_scratch_floats"] == plan["num_splits"] * (2 * 8 * 128 + 2 * 8)
    plan = plan_fwd(sim, q, k, v, num_splits=3, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["num_splits"] == 3 and plan["grid"] == [3, 2, 2]


# Dropout (hopper/sm90_dropout.cuh): no mask, causal or a local window, at every head dim of the
# forward; the backward at d = 64 and 128, at d = 64 without the local window (its loop spills:
# hopper/bwd_sm90_config.h).
DROPOUT_CASES = [(d, kw) for d in (64, 128, 256)
                 for kw in (dict(), dict(causal=True), dict(window_left=40, window_right=3))]


@pytest.mark.parametrize("d, kwargs", DROPOUT_CASES, ids=lambda x: str(x))
def test_hopper_takes_dropout(sim, d, kwargs):
    args = qkv(2, 130, 200, 4, 2, d)
    drop = dict(kwargs, dropout_p=0.1, rng_state=torch.tensor([7, 0]))
    plan = plan_fwd(sim, *args, device=HOPPER, **drop)
    assert plan["arch"] == "sm90" and plan["grid"] == [2, 4, 2]
    # The same geometry as without dropout: the keep bits live in registers.
    assert plan == plan_fwd(sim, *args, device=HOPPER, **kwargs)
    backward = plan_bwd(sim, *args, device=HOPPER, **drop)
    if d == 128 or (d == 64 and "window_left" not in kwargs):
        assert backward["arch"] == "sm90"
        assert backward == plan_bwd(sim, *args, device=HOPPER, **kwargs)
    else:  # exactly the sm_80 plan of the call without the opt-in
        assert backward["arch"] == "sm80"
        assert backward == plan_bwd(sim, *args, device=SM90, **drop)


def test_hopper_only_when_opted_in_on_cc_9_0(sim):
    args = qkv(1, 128, 128, 2, 2, 128)
    assert plan_fwd(sim, *args, device=SM90)["arch"] == "sm80"  # not opted in
    on_sm80 = plan_fwd(sim, *args, device=dict(SM80, hopper_fwd=True))
    assert on_sm80["arch"] == "sm80" and on_sm80["device_arch"] == "sm80"
    # sm_90a code runs on 9.0 only.
    assert plan_fwd(sim, *args, device=dict(HOPPER, cc_minor=1))["arch"] == "sm80"


def _unaligned_rows(b, s, h, d):
    # Rows 68 elements apart (136 bytes, not a multiple of 16): TMA cannot step them.
    return torch.randn(b, s, h, d + 4, dtype=torch.bfloat16)[..., :d]


def _unaligned_pointer(b, s, h, d):
    # Starts 2 bytes into its storage.
    return torch.randn(b * s * h * d + 1, dtype=torch.bfloat16)[1:].view(b, s, h, d)


def _dropout_with_other_logits(q, k, v):
    """Dropout with softcap, ALiBi or attn_mask: neither the forward's nor the backward's dropout
    main loops have them (launch_fwd_sm90.cuh, launch_bwd_sm90.cuh)."""
    drop = dict(dropout_p=0.1, rng_state=torch.tensor([7, 0]))
    return [
        ("dropout with softcap", (q, k, v), dict(drop, softcap=2.0)),
        ("dropout with ALiBi", (q, k, v),
         dict(drop, alibi_slopes=torch.rand(2, dtype=torch.float32))),
        ("dropout with attn_mask", (q, k, v),
         dict(drop, attn_mask=torch.ones(130, 130, dtype=torch.bool))),
    ]


# Calls the Hopper forward does not take yet: (name, qkv, fwd's keyword arguments).
def _stays_on_sm80():
    q, k, v = qkv(2, 130, 130, 2, 2, 128)
    return [
        ("fp32", qkv(2, 130, 130, 2, 2, 128, torch.float32), {}),
        ("head dim 96", qkv(2, 130, 130, 2, 2, 96), {}),
        ("head dim 40 (padded to 64 on sm_80)", qkv(2, 130, 130, 2, 2, 40), {}),
        ("head dim 192", qkv(2, 130, 130, 2, 2, 192), {}),
        ("head dim 200 (padded to 256 on sm_80)", qkv(2, 130, 130, 2, 2, 200), {}),
        ("negative scale", (q, k, v), dict(softmax_scale=-0.2)),
        ("zero scale", (q, k, v), dict(softmax_scale=0.0)),
        *_dropout_with_other_logits(q, k, v),
        # flashattn.distributed's partial outputs: sm_80's split path with one split.
        ("out_fp32", (q, k, v), dict(out_fp32=True)),
        # A consumer warpgroup's 64 rows hold no whole token's group (fwd_sm90_consumer_tokens).
        ("GQA decode packed, 128 query heads per kv head", qkv(1, 1, 512, 128, 1, 64), {}),
        ("unaligned rows", (_unaligned_rows(2, 130, 1, 64), *qkv(2, 130, 130, 1, 1, 64)[1:]), {}),
        ("unaligned pointer", (q, _unaligned_pointer(2, 130, 2, 128), v), {}),
        ("kv heads broadcast by stride 0",
         (q, *(t[:, :, :1].expand(2, 130, 2, 128) for t in (k, v))), {}),
    ]


@pytest.mark.parametrize("name, args, kwargs", _stays_on_sm80(), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_what_hopper_lacks_stays_on_sm80(sim, name, args, kwargs):
    plan = plan_fwd(sim, *args, device=HOPPER, **kwargs)
    assert plan["device_arch"] == "sm90" and plan["arch"] == "sm80", name
    # Exactly the sm_80 plan of the same call without the opt-in.
    assert plan == plan_fwd(sim, *args, device=SM90, **kwargs), name


# attn_mask (hopper/fwd_sm90_mask.cuh apply_attn_mask, read per entry through its strides): bool,
# fp32 and the inputs' 16-bit type, broadcast shapes down to one element and a non-contiguous
# view, alone, causal and with a local window, with softcap, ALiBi ([Hq] or [B, Hq]) or both (at
# run time inside the mask's loops): the Hopper plan, with the same geometry as without the mask
# (the bias is read in the consumers' score step), forward and backward.
def _attn_masks():
    full = torch.zeros(3, 4, 300, 200, dtype=torch.float16).transpose(-1, -2)  # strided keys
    return {
        "bool_2d": (dict(attn_mask=torch.ones(200, 300, dtype=torch.bool)), {}),
        "float32_key_padding_causal": (dict(attn_mask=torch.zeros(3, 1, 1, 300)), dict(causal=True)),
        "fp16_full_transposed_window": (dict(attn_mask=full), dict(window_left=30, window_right=4)),
        "bool_one_element": (dict(attn_mask=torch.ones(1, dtype=torch.bool)), dict(causal=True)),
        "bool_2d_softcap": (dict(attn_mask=torch.ones(200, 300, dtype=torch.bool), softcap=2.0), {}),
        "float32_key_padding_alibi_causal": (
            dict(attn_mask=torch.zeros(3, 1, 1, 300), alibi_slopes=torch.rand(3, 4)), dict(causal=True)),
        "fp16_full_window_softcap_alibi": (
            dict(attn_mask=full, softcap=1.5, alibi_slopes=torch.rand(4)), dict(window_left=30, window_right=4)),
        "fp16_full_window_alibi": (dict(attn_mask=full, alibi_slopes=torch.rand(3, 4)),
                                   dict(window_left=30, window_right=4)),
    }


# At d = 256 the forward's mask loops are built too, and the backward has no Hopper kernel at
# d = 256 ("head dim 256" below).
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", list(_attn_masks()))
def test_hopper_takes_attn_mask(sim, d, name):
    mask, kwargs = _attn_masks()[name]
    args = qkv(3, 200, 300, 4, 2, d, torch.float16)
    plan = plan_fwd(sim, *args, device=HOPPER, **mask, **kwargs)
    assert plan["arch"] == "sm90" and plan["smem_bytes"] == HOPPER_SMEM[d]
    plain = plan_fwd(sim, *args, device=HOPPER, **kwargs)
    assert plan["grid"] == plain["grid"] and plan["block"] == plain["block"]
    if d == 256:
        # Exactly the sm_80 backward of the same call without the opt-in.
        assert plan_bwd(sim, *args, device=HOPPER, **mask, **kwargs) == \
            plan_bwd(sim, *args, device=SM90, **mask, **kwargs)
        return
    plan = plan_bwd(sim, *args, device=HOPPER, **mask, **kwargs)
    assert plan["arch"] == "sm90" and plan["smem_bytes"] == HOPPER_BWD_SMEM[d]
    assert plan["steps"] == plan_bwd(sim, *args, device=HOPPER, **kwargs)["steps"]


def test_hopper_takes_seqused_and_varlen(sim):
    q, k, v = qkv(2, 130, 130, 2, 2, 128)
    used = torch.tensor([100, 130], dtype=torch.int32)
    for causal in (False, True):
        for seqused in (dict(seqused_k=used), dict(seqused_q=used), dict(seqused_q=used,
                                                                        seqused_k=used)):
            plan = plan_fwd(sim, q, k, v, causal=causal, device=HOPPER, **seqused)
            assert plan["arch"] == "sm90" and plan["grid"] == [2, 2, 2]
    # Varlen: the grid covers the longest sequence (160 rows: 2 tiles) for each of 2 sequences.
    cu = torch.tensor([0, 100, 260], dtype=torch.int32)
    flat = [t.reshape(260, 2, 128) for t in (q, k, v)]
    plan = plan_fwd(sim, *flat, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=160,
                    max_seqlen_k=160, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["grid"] == [2, 2, 2]


def test_k_v_in_b_h_s_d_and_broadcast_heads_take_hopper(sim):
    q = torch.randn(2, 130, 4, 64, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 130, 64, dtype=torch.float16).transpose(1, 2) for _ in range(2))
    assert plan_fwd(sim, q, k, v, device=HOPPER)["arch"] == "sm90"
    # One kv head whose head stride is 0: an extent of 1 never steps it.
    k1, v1 = (torch.randn(2 * 130 * 64, dtype=torch.float16).as_strided(
        (2, 130, 1, 64), (130 * 64, 64, 0, 1)) for _ in range(2))
    assert plan_fwd(sim, q, k1, v1, device=HOPPER)["arch"] == "sm90"


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True)])
def test_opt_in_variable(sim, value, on):
    assert sim.ops.parse_hopper_opt_in(value) is on


@pytest.mark.parametrize("value", ["2", "yes", "true", " 1", "1 "])
def test_opt_in_variable_refuses_other_values(sim, value):
    with pytest.raises(ValueError, match=f"FLASHATTN_CUDA_HOPPER must be 0 or 1 .*got '{value}'"):
        sim.ops.parse_hopper_opt_in(value)


# ---- the backward ----

# K + V + 2 stages of Q and dO + 2 dS buffers + 2 fp32 dQ parts + 2 stages of row stats + 10
# mbarriers + 1024 (hopper/bwd_sm90_config.h).
HOPPER_BWD_SMEM = {64: 199760, 128: 198736}
HOPPER_BWD_BLOCK_M = {64: 128, 128: 64}


def hopper_bwd_workspace(b, sq, sk, hq, d, deterministic=False, total_q=None):
    """Two row-stat buffers and the dQ accumulator, each over [B, Hq, Sq padded] rows; varlen
    (total_q given): [1, Hq, total_q + B kBlockM padded], every sequence padded to whole
    query blocks (hopper/bwd_sm90_params.h, bwd_sm90_seq)."""
    block_m = HOPPER_BWD_BLOCK_M[d]
    if total_q is not None:
        b, sq = 1, total_q + b * block_m
    padded = math.ceil(sq / block_m) * block_m
    slices = math.ceil(sk / 128) if deterministic else 1
    return 2 * b * hq * padded + slices * b * hq * padded * d


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_hopper_backward_takes_its_calls(sim, dtype, d, causal, deterministic):
    plan = plan_bwd(sim, *qkv(3, 200, 300, 4, 2, d, dtype), causal=causal,
                    deterministic=deterministic, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["device_arch"] == "sm90"
    assert plan["family"] == "tensor_core" and plan["head_dim_tile"] == d
    assert plan["smem_bytes"] == HOPPER_BWD_SMEM[d] and plan["arch_smem_bytes"] == 227 * 1024
    assert plan["dq_accum"]
    assert plan["workspace_floats"] == hopper_bwd_workspace(3, 200, 300, 4, d, deterministic)
    padded_blocks = math.ceil(math.ceil(200 / HOPPER_BWD_BLOCK_M[d]) * HOPPER_BWD_BLOCK_M[d] / 128)
    assert plan["steps"] == [
        {"kernel": "dot_do_o", "family": "rows", "grid": [padded_blocks, 4, 3],
         "block": [128, 1, 1], "smem_bytes": 0},
        {"kernel": "dkdv", "family": "tensor_core", "grid": [3, 2, 3], "block": [384, 1, 1],
         "smem_bytes": HOPPER_BWD_SMEM[d]},
        {"kernel": "convert_dq", "family": "rows", "grid": [2, 4, 3], "block": [128, 1, 1],
         "smem_bytes": 0}]


def test_hopper_backward_takes_top_left_causal_one_row_and_kv_layouts(sim):
    plan = plan_bwd(sim, *qkv(1, 65, 7, 2, 2, 64), causal=True, align_bottom_right=False,
                    device=HOPPER)
    assert plan["arch"] == "sm90" and plan["steps"][1]["grid"] == [1, 2, 1]
    plan = plan_bwd(sim, *qkv(1, 1, 1, 1, 1, 128), device=HOPPER)
    assert plan["arch"] == "sm90" and [s["grid"] for s in plan["steps"]] == [[1, 1, 1]] * 3
    q = torch.randn(2, 130, 4, 64, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 130, 64, dtype=torch.float16).transpose(1, 2) for _ in range(2))
    assert plan_bwd(sim, q, k, v, device=HOPPER)["arch"] == "sm90"


def test_hopper_backward_only_when_opted_in_on_cc_9_0(sim):
    args = qkv(1, 128, 128, 2, 2, 128)
    assert plan_bwd(sim, *args, device=SM90)["arch"] == "sm80"
    assert plan_bwd(sim, *args, device=dict(SM80, hopper_fwd=True))["arch"] == "sm80"
    assert plan_bwd(sim, *args, device=dict(HOPPER, cc_minor=1))["arch"] == "sm80"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("deterministic", [False, True])
def test_hopper_backward_takes_seqused_and_varlen(sim, d, deterministic):
    q, k, v = qkv(2, 130, 300, 4, 2, d)
    used = torch.tensor([100, 130], dtype=torch.int32)
    dense_grids = [[math.ceil(math.ceil(130 / HOPPER_BWD_BLOCK_M[d]) * HOPPER_BWD_BLOCK_M[d] / 128),
                    4, 2], [3, 2, 2], [2, 4, 2]]
    for causal in (False, True):
        for seqused in (dict(seqused_k=used), dict(seqused_q=used),
                        dict(seqused_q=used, seqused_k=used)):
            plan = plan_bwd(sim, q, k, v, causal=causal, deterministic=deterministic,
                            device=HOPPER, **seqused)
            assert plan["arch"] == "sm90", seqused
            assert [s["grid"] for s in plan["steps"]] == dense_grids
            assert plan["workspace_floats"] == hopper_bwd_workspace(2, 130, 300, 4, d,
                                                                    deterministic)
    # Varlen: the grids cover the longest sequence (160 queries, 200 keys) for each of the 2
    # sequences; the workspace the packed rows with each sequence padded to whole query blocks.
    cu_q = torch.tensor([0, 100, 260], dtype=torch.int32)
    cu_k = torch.tensor([0, 200, 300], dtype=torch.int32)
    flat_q = q.reshape(260, 4, d)
    flat_k, flat_v = (t[:, :150].reshape(300, 2, d) for t in (k, v))
    plan = plan_bwd(sim, flat_q, flat_k, flat_v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=160, max_seqlen_k=200, deterministic=deterministic,
                    device=HOPPER)
    assert plan["arch"] == "sm90"
    rows_blocks = math.ceil(math.ceil(160 / HOPPER_BWD_BLOCK_M[d]) * HOPPER_BWD_BLOCK_M[d] / 128)
    assert [s["grid"] for s in plan["steps"]] == [[rows_blocks, 4, 2], [2, 2, 2], [2, 4, 2]]
    assert plan["workspace_floats"] == hopper_bwd_workspace(2, 160, 200, 4, d, deterministic,
                                                            total_q=260)


# Local windows: (w, 0) (a sliding causal window, also as causal=True with a left edge), one edge
# either way, both, (0, 0), and wider than both sequences (clipped to no window: the no-mask
# loop), in both alignments; the same three launches and workspace as without a window (a key
# block's skipped query blocks are skipped inside the main kernel: hopper_bwd_test query_blocks).
BACKWARD_WINDOWS = [
    dict(window_left=16, window_right=0),
    dict(window_left=16, causal=True),
    dict(window_left=-1, window_right=8),
    dict(window_left=16, window_right=-1),
    dict(window_left=5, window_right=37, align_bottom_right=False),
    dict(window_left=0, window_right=0),
    dict(window_left=1000, window_right=1000),
]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("kwargs", BACKWARD_WINDOWS,
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_hopper_backward_takes_local_windows(sim, d, kwargs):
    args = qkv(3, 200, 300, 4, 2, d)
    plan = plan_bwd(sim, *args, device=HOPPER, **kwargs)
    assert plan["arch"] == "sm90" and plan["smem_bytes"] == HOPPER_BWD_SMEM[d]
    assert plan["workspace_floats"] == hopper_bwd_workspace(3, 200, 300, 4, d)
    assert [s["grid"] for s in plan["steps"]] == [s["grid"] for s in plan_bwd(sim, *args, device=HOPPER)["steps"]]


# ALiBi, slopes [Hq] or [B, Hq], causal (either alignment) or not, deterministic or not; softcap
# with each mask: the same three launches and workspace as without them (the bias and the
# softcap are recomputed in the main loop).
BACKWARD_LOGITS = {
    "alibi_heads": dict(alibi_slopes=torch.rand(4)),
    "alibi_batch_heads_causal": dict(alibi_slopes=torch.rand(3, 4), causal=True),
    "alibi_heads_causal_top_left": dict(alibi_slopes=torch.rand(4), causal=True, align_bottom_right=False),
    "alibi_batch_heads_top_left_deterministic": dict(alibi_slopes=torch.rand(3, 4), align_bottom_right=False,
                                                     deterministic=True),
    "softcap": dict(softcap=2.0),
    "softcap_causal_deterministic": dict(softcap=2.0, causal=True, deterministic=True),
    "softcap_window": dict(softcap=2.0, window_left=16, window_right=0),
}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", BACKWARD_LOGITS)
def test_hopper_backward_takes_alibi_and_softcap(sim, d, name):
    kwargs = BACKWARD_LOGITS[name]
    args = qkv(3, 200, 300, 4, 2, d)
    plan = plan_bwd(sim, *args, device=HOPPER, **kwargs)
    assert plan["arch"] == "sm90" and plan["smem_bytes"] == HOPPER_BWD_SMEM[d]
    deterministic = kwargs.get("deterministic", False)
    assert plan["workspace_floats"] == hopper_bwd_workspace(3, 200, 300, 4, d, deterministic)
    plain = plan_bwd(sim, *args, device=HOPPER, deterministic=deterministic)
    assert plan["steps"] == plain["steps"]


# ALiBi with a local window (causal with a left edge is one) or with
# softcap (a run-time choice inside the ALiBi loops: every head dim of the forward, d = 128 in the
# backward; loops of its own in the backward at d = 64): the Hopper plans, with the geometry of the
# same call without them.
ALIBI_COMBINED = {
    "window": dict(window_left=16, window_right=3),
    "window_causal_top_left": dict(window_left=40, causal=True, align_bottom_right=False),
    "softcap": dict(softcap=2.0),
    "softcap_causal": dict(softcap=1.5, causal=True),
    "softcap_window": dict(softcap=2.5, window_left=33, window_right=0),
}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", ALIBI_COMBINED)
@pytest.mark.parametrize("slopes", [(4,), (3, 4)], ids=["heads", "batch_heads"])
def test_hopper_takes_alibi_with_windows_and_softcap(sim, d, name, slopes):
    kwargs = ALIBI_COMBINED[name]
    args = qkv(3, 200, 300, 4, 2, d)
    alibi = dict(kwargs, alibi_slopes=torch.rand(*slopes))
    forward = plan_fwd(sim, *args, device=HOPPER, **alibi)
    assert forward["arch"] == "sm90" and forward == plan_fwd(sim, *args, device=HOPPER, **kwargs)
    if d == 256:
        return
    backward = plan_bwd(sim, *args, device=HOPPER, **alibi)
    assert backward["arch"] == "sm90" and backward == plan_bwd(sim, *args, device=HOPPER, **kwargs)


# Calls the Hopper backward does not take: (name, qkv, the op's keyword arguments).
def _backward_stays_on_sm80():
    q, k, v = qkv(2, 130, 130, 2, 2, 128)
    return [
        ("fp32", qkv(2, 130, 130, 2, 2, 128, torch.float32), {}),
        ("head dim 96", qkv(2, 130, 130, 2, 2, 96), {}),
        ("head dim 40 (padded to 64 on sm_80)", qkv(2, 130, 130, 2, 2, 40), {}),
        ("head dim 256", qkv(2, 130, 130, 2, 2, 256), {}),
        ("no keys", qkv(2, 130, 0, 2, 2, 64), {}),
        ("no queries", qkv(2, 0, 130, 2, 2, 64), {}),
        *_dropout_with_other_logits(q, k, v),
        ("dropout with a local window at head dim 64", qkv(2, 130, 130, 2, 2, 64),
         dict(dropout_p=0.1, rng_state=torch.tensor([7, 0]), window_left=40, window_right=3)),
        ("dropout with a one-sided window at head dim 64", qkv(2, 130, 130, 2, 2, 64),
         dict(dropout_p=0.1, rng_state=torch.tensor([7, 0]), window_left=-1, window_right=5)),
        # (The float mask's gradient, which plan_bwd does not take, stays on sm_80 too:
        # test_cudasim_hopper_attn_mask.py runs it.)
        ("unaligned rows", (_unaligned_rows(2, 130, 1, 64), *qkv(2, 130, 130, 1, 1, 64)[1:]), {}),
        ("unaligned pointer", (q, _unaligned_pointer(2, 130, 2, 128), v), {}),
        # flashattn.distributed's partial gradients: sm_80 stores them in float32.
        ("grads_fp32", (q, k, v), dict(grads_fp32=True)),
    ]


@pytest.mark.parametrize("name, args, kwargs", _backward_stays_on_sm80(), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_what_hopper_backward_lacks_stays_on_sm80(sim, name, args, kwargs):
    plan = plan_bwd(sim, *args, device=HOPPER, **kwargs)
    assert plan["device_arch"] == "sm90" and plan["arch"] == "sm80", name
    # Exactly the sm_80 plan of the same call without the opt-in.
    assert plan == plan_bwd(sim, *args, device=SM90, **kwargs), name


# ---- the forward's split-KV ----

def test_hopper_takes_split_kv(sim):
    # The caller's count: num_splits CTAs per query tile along x, the fp32 parts in mask.h's
    # scratch layout (num_splits x (out's B x Sq x Hq x d + lse's B x Hq x Sq) floats), merged
    # by split_merge_kernel.cuh. Every split writes every row of its sequences, so no fill.
    for d, splits in [(64, 2), (128, 3), (256, 2)]:
        plan = plan_fwd(sim, *qkv(2, 130, 300, 4, 2, d), causal=True, num_splits=splits,
                        device=HOPPER)
        assert plan["arch"] == "sm90" and plan["num_splits"] == splits and plan["merges"]
        assert plan["grid"] == [2 * splits, 4, 2] and plan["block"] == [384, 1, 1]
        assert plan["split_scratch_floats"] == splits * (2 * 130 * 4 * d + 2 * 4 * 130)
        assert not plan["fill_split_scratch"]
    # Varlen and seqused_q leave rows no CTA writes: the scratch is filled (0, -inf) first.
    q, k, v = qkv(2, 130, 130, 2, 2, 128)
    cu = torch.tensor([0, 100, 260], dtype=torch.int32)
    flat = [t.reshape(260, 2, 128) for t in (q, k, v)]
    plan = plan_fwd(sim, *flat, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=160,
                    max_seqlen_k=160, num_splits=2, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["grid"] == [4, 2, 2] and plan["fill_split_scratch"]
    assert plan["split_scratch_floats"] == 2 * (260 * 2 * 128 + 2 * 260)
    plan = plan_fwd(sim, q, k, v, seqused_q=torch.tensor([5, 130], dtype=torch.int32),
                    num_splits=2, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["fill_split_scratch"]
    # More parts than key tiles, and the count capped at kMaxSplits (64): empty parts write 0 and
    # -inf, which the merge weighs as nothing.
    plan = plan_fwd(sim, *qkv(1, 1, 100, 1, 1, 64), num_splits=100, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["num_splits"] == 64 and plan["grid"] == [64, 1, 1]
    # One split is none.
    plan = plan_fwd(sim, *qkv(1, 1, 100, 1, 1, 64), num_splits=1, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["num_splits"] == 1 and not plan["merges"]


# num_splits=0 on the H200 (132 SMs), d 128, bf16, causal, Hq = Hkv (nothing to pack): the
# Hopper plan's own count (plan_fwd.h use_sm90_fwd: the split model on 128 query rows and 128
# keys per tile) at Sk = 512, 8k, 32k, 128k, beside the count the sm_80 plan gives the same call
# without the opt-in (64 x 64 tiles, or 16 x 64 for a decode's few rows). Pinned: a change to
# the model or its constants shows here.
HOPPER_SPLITS = {
    # (B, Sq, H): (Hopper's counts, sm_80's counts)
    (1, 1, 8): ((1, 8, 9, 9), (1, 13, 18, 17)),       # one decoding sequence: 8 CTAs
    (8, 1, 8): ((1, 1, 1, 2), (1, 3, 3, 3)),          # 64 CTAs
    (2, 4, 16): ((1, 3, 3, 3), (1, 5, 5, 5)),         # 4 draft tokens, 32 CTAs
    (1, 512, 16): ((1, 4, 4, 4), (1, 4, 4, 4)),       # a prefill chunk: 64 CTAs on both
    (32, 1, 32): ((1, 1, 1, 1), (1, 1, 1, 1)),        # 1024 CTAs fill the SMs: no split
}


@pytest.mark.parametrize("b, sq, h", sorted(HOPPER_SPLITS))
def test_hopper_split_choice_is_its_own(sim, b, sq, h):
    model = load_tool("gpu_model")
    c = model.split_constants()
    hopper_want, sm80_want = HOPPER_SPLITS[b, sq, h]
    hopper_got, sm80_got = [], []
    for sk in SPLIT_SEQLENS_K:
        q = torch.randn(b, sq, h, 128, dtype=torch.bfloat16)
        # Little memory: rows and heads 16 bytes apart (overlapping), which TMA can step; the
        # plan reads shapes and strides only.
        kv = torch.zeros((b + sk + h) * 8 + 128, dtype=torch.bfloat16).as_strided(
            (b, sk, h, 128), (8, 8, 8, 1))
        plan = plan_fwd(sim, q, kv, kv, causal=True, num_splits=0, device=HOPPER)
        assert plan["arch"] == "sm90"
        hopper_got.append(plan["num_splits"])
        sm80_got.append(plan_fwd(sim, q, kv, kv, causal=True, num_splits=0,
                                 device=SM90)["num_splits"])
        # tools/gpu_model.py's mirror of the model chooses the same on the Hopper geometry.
        geometry = dict(batch=b, seqlen_q=sq, heads=h, heads_kv=h, packed=1, head_dim=128,
                        block_rows=128, key_tile=128, element_bytes=2)
        assert plan["num_splits"] == model.best_splits(c, geometry, sk, SM90["sm_count"]), sk
        assert plan["grid"] == [-(-sq // 128) * plan["num_splits"], h, b]
    assert (tuple(hopper_got), tuple(sm80_got)) == (hopper_want, sm80_want)


# Softcap and windows (both alignments), alone, together and with causal, and ALiBi ([Hq] or
# [B, Hq] slopes) without them or causal: the main loops built for them (launch_fwd_sm90.cuh,
# kernel_list.py), with the same geometry.
FEATURES = [
    dict(softcap=2.0),
    dict(softcap=2.0, causal=True),
    dict(window_left=16, window_right=0),
    dict(window_left=-1, window_right=8),
    dict(window_left=16, window_right=-1),
    dict(window_left=5, window_right=5, align_bottom_right=False),
    dict(window_left=40, window_right=3, softcap=1.5),
    dict(window_left=7, causal=True),
    dict(alibi_slopes=torch.rand(4)),
    dict(alibi_slopes=torch.rand(2, 4), causal=True, align_bottom_right=False),
]


def feature_id(kwargs):
    """A test id that names a tensor argument by its shape: its values are drawn at import, and
    an id that changes between collections breaks test selection (test_gpu_selection.py)."""
    return ",".join(f"{k}={list(v.shape) if isinstance(v, torch.Tensor) else v}"
                    for k, v in kwargs.items())


# Every feature at d = 256 too (softcap's local window there with lean S descriptors:
# hopper/fwd_sm90_kernel.cuh kLeanDescriptors).
@pytest.mark.parametrize("d, kwargs", [(64, f) for f in FEATURES] + [(256, f) for f in FEATURES],
                         ids=lambda x: feature_id(x) if isinstance(x, dict) else f"d{x}")
def test_hopper_takes_softcap_and_windows(sim, d, kwargs):
    plan = plan_fwd(sim, *qkv(2, 200, 300, 4, 2, d), device=HOPPER, **kwargs)
    assert plan["arch"] == "sm90" and plan["grid"] == [2, 4, 2]
    assert plan["smem_bytes"] == HOPPER_SMEM[d] and plan["num_splits"] == 1


# ---- a paged KV cache (hopper/fwd_sm90_gather.cuh: the producer gathers K and V rows) ----

def _paged(page_size, d=128, b=2, sq=1, hq=2, hkv=2, pages_per_seq=5, pad=0):
    """q, a paged k and v [2 b pages_per_seq, page_size, hkv, d] (rows pad elements apart beyond
    d, when pad > 0) and a shuffled block table [b, pages_per_seq] of half the pool."""
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16)
    pages = 2 * b * pages_per_seq
    k, v = (torch.randn(pages, page_size, hkv, d + pad, dtype=torch.bfloat16)[..., :d]
            for _ in range(2))
    table = torch.randperm(pages, dtype=torch.int32)[:b * pages_per_seq].view(b, pages_per_seq)
    return q, k, v, table


@pytest.mark.parametrize("page_size", [1, 16, 48, 256])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window_left=30, window_right=0)],
                         ids=["none", "causal", "local"])
def test_hopper_takes_paged_kv(sim, page_size, mask):
    q, k, v, table = _paged(page_size)
    plan = plan_fwd(sim, q, k, v, block_table=table, device=HOPPER, **mask)
    assert plan["arch"] == "sm90" and plan["block"] == [384, 1, 1]
    assert plan["block_rows"] == 128 and plan["smem_bytes"] == HOPPER_GATHER_SMEM[128]
    # One query tile per (head, batch), the keys' split count the Hopper plan's own.
    assert plan["grid"] == [plan["num_splits"], 2, 2]


@pytest.mark.parametrize("d", [64, 256])
def test_paged_kv_ring_at_each_head_dim(sim, d):
    # Three stages at d = 64, two at d = 256 (three would not fit 227 KB).
    q, k, v, table = _paged(16, d=d)
    plan = plan_fwd(sim, q, k, v, block_table=table, device=HOPPER)
    assert plan["arch"] == "sm90" and plan["smem_bytes"] == HOPPER_GATHER_SMEM[d]


@pytest.mark.parametrize("name, kwargs, pad", [
    ("softcap", dict(softcap=2.0), 0),
    ("ALiBi", dict(alibi_slopes=torch.rand(1, dtype=torch.float32)), 0),
    ("softcap, causal", dict(softcap=2.0, causal=True), 0),
    # The dropout main loops have no gathering producer (launch_fwd_sm90.cuh).
    ("dropout", dict(dropout_p=0.1, rng_state=torch.tensor([7, 0])), 0),
    # Rows 68 elements apart: a 16-byte cp.async cannot read them.
    ("rows not 16-byte aligned", dict(), 4),
])
def test_paged_kv_hopper_lacks_stays_on_sm80(sim, name, kwargs, pad):
    q, k, v, table = _paged(16, d=64, hkv=1, hq=1, pad=pad)
    plan = plan_fwd(sim, q, k, v, block_table=table, device=HOPPER, **kwargs)
    assert plan["device_arch"] == "sm90" and plan["arch"] == "sm80", name
    assert plan == plan_fwd(sim, q, k, v, block_table=table, device=SM90, **kwargs), name
