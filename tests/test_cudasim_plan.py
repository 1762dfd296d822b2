"""The CUDA executor's launch plans (csrc/cuda/plan_fwd.h, plan_bwd.h): every launch decision of a
call in one place, pinned here for representative shapes, and checked against what the launch
code then runs.

torch.ops.flashattn_sim.plan_fwd / plan_bwd take fwd's arguments and a device (compute
capability, SM count, opt-in shared memory) and return the plan the executor would make, as JSON
(tests/sim_ext/sim_ops.cpp). The numbers below are today's choices: a change to any of them is a
change of kernel selection and must be deliberate. Shared memory, by traits.h:
  FwdTraits<d>   (rows + 2 x keys) x (d + 8) x 2 bytes: rows 128 (two m-tiles) or 64 (one), keys
                 64 up to d = 128, else 32;
  FwdPairTraits<192, 128> (64 + 64) x 200 x 2 + 64 x 136 x 2 = 68608 (64 rows, 64 keys);
  SimtTraits<d>  80 x (d + 1) x 4 bytes (8 query rows and 32 keys, each of q/k or k/v);
  BwdTraits<128> 141824, BwdDqTraits<128> 104448, SimtTraits<64> dK/dV 21056;
  BwdPairTraits<192, 128> (64 + 64) x (200 + 136) x 2 + 2 x 64 x 72 x 2 + 2 x 64 x 4 = 104960,
  BwdDqPairTraits<192, 128> (64 + 2 x 32) x (200 + 136) x 2 = 86016;
  FwdPairTraits<128, 64> (64 + 64) x 136 x 2 + 64 x 72 x 2 + the row table 2048 = 46080 (one
  m-tile, its only kernel), BwdPairTraits<128, 64> (128 + 64) x (136 + 72) x 2 + 2 x 128 x 72 x 2
  + 2 x 64 x 4 = 117248, BwdDqPairTraits<128, 64> (64 + 2 x 64) x (136 + 72) x 2 = 79872.
"""
import json

import pytest
import torch

from executors import make_executor

SM80 = dict(cc_major=8, cc_minor=0, sm_count=108, smem_optin_bytes=163 * 1024)  # A100
SM90 = dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin_bytes=227 * 1024)  # H100
SM80_SMEM = 163 * 1024


@pytest.fixture(scope="module")
def sim():
    # Module scope: a missing toolkit or a failed build is reported once.
    return make_executor("sim")


def qkv(b, sq, sk, hq, hkv, d, dtype=torch.bfloat16):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype),
            torch.randn(b, sk, hkv, d, dtype=dtype))


def plan_fwd(sim, q, k, v, device=SM80, **kwargs):
    return json.loads(sim.ops.plan_fwd(q, k, v, **kwargs, **device))


def plan_bwd(sim, q, k, v, device=SM80, **kwargs):
    return json.loads(sim.ops.plan_bwd(q, k, v, **kwargs, **device))


def fwd_smem(d, one_m_tile):
    rows = 64 if one_m_tile else 128
    keys = 64 if d <= 128 else 32
    return (rows + 2 * keys) * (d + 8) * 2


# ---- the forward ----

# head dim -> (tile, one m-tile): the smallest compiled tile that holds it (kernel_list.py), and
# two m-tiles per warp up to tile 128 (the larger tiles have only the one-m-tile kernel).
HEAD_DIMS_16BIT = {32: (32, False), 40: (64, False), 64: (64, False), 80: (96, False),
                   96: (96, False), 128: (128, False), 160: (192, True), 192: (192, True),
                   200: (256, True), 256: (256, True)}


@pytest.mark.parametrize("d", sorted(HEAD_DIMS_16BIT))
def test_fwd_tile_per_head_dim(sim, d):
    tile, one_m_tile = HEAD_DIMS_16BIT[d]
    plan = plan_fwd(sim, *qkv(1, 200, 200, 2, 2, d))
    rows = 64 if one_m_tile else 128
    assert plan["family"] == "tensor_core" and plan["arch"] == "sm80"
    assert plan["head_dim_tile"] == tile and plan["one_m_tile"] == one_m_tile
    assert plan["block_rows"] == rows
    assert plan["grid"] == [-(-200 // rows), 2, 1] and plan["block"] == [128, 1, 1]
    assert plan["smem_bytes"] == fwd_smem(tile, one_m_tile)
    assert plan["num_splits"] == 1 and not plan["merges"] and plan["packed_heads"] == 1


# fp32 head dim -> SIMT tile (64, 128, 256).
HEAD_DIMS_SIMT = {32: 64, 64: 64, 96: 128, 128: 128, 200: 256, 256: 256}


# The one-m-tile kernel's table of paged rows up to d = 128 (traits.h kPagedRowTableBytes: 2 tiles
# x 64 keys x K, V x 8 bytes).
ROW_TABLE = 2 * 64 * 2 * 8
# (head_dim, head_dim_v) -> the 16-bit forward's (tile, v tile), one m-tile, shared memory and the
# backward's (tile, v tile): a pair the (192, 128) or (128, 64) tile covers takes it in both
# directions (kernel_list.py HEAD_DIM_PAIRS_16BIT_FWD and _BWD), any other the equal tile of its
# wider dim.
PAIRS_16BIT = {(192, 128): ((192, 128), True, 68608, (192, 128)),
               (160, 100): ((192, 128), True, 68608, (192, 128)),
               (192, 129): ((192, 192), True, fwd_smem(192, True), (192, 192)),
               (100, 192): ((192, 192), True, fwd_smem(192, True), (192, 192)),
               (128, 64): ((128, 64), True, 46080, (128, 64)),
               (100, 33): ((128, 64), True, 46080, (128, 64)),
               (128, 65): ((128, 128), True, fwd_smem(128, True) + ROW_TABLE, (128, 128)),
               (64, 128): ((128, 128), True, fwd_smem(128, True) + ROW_TABLE, (128, 128)),
               (256, 128): ((256, 256), True, fwd_smem(256, True), (256, 256))}


@pytest.mark.parametrize("dims", sorted(PAIRS_16BIT), ids=str)
def test_fwd_tile_per_head_dim_pair(sim, dims):
    tile, one_m_tile, smem, bwd_tile = PAIRS_16BIT[dims]
    head_dim, head_dim_v = dims
    q, k, _ = qkv(1, 200, 200, 2, 2, head_dim)
    v = torch.randn(1, 200, 2, head_dim_v, dtype=q.dtype)
    plan = plan_fwd(sim, q, k, v)
    assert plan["family"] == "tensor_core" and plan["arch"] == "sm80"
    assert (plan["head_dim_tile"], plan["head_dim_v_tile"]) == tile
    assert plan["one_m_tile"] == one_m_tile and plan["block_rows"] == 64
    assert plan["grid"] == [4, 2, 1] and plan["block"] == [128, 1, 1]
    assert plan["smem_bytes"] == smem
    bwd = plan_bwd(sim, q, k, v)
    assert (bwd["head_dim_tile"], bwd["head_dim_v_tile"]) == bwd_tile


@pytest.mark.parametrize("d", sorted(HEAD_DIMS_SIMT))
def test_fwd_simt_fp32(sim, d):
    tile = HEAD_DIMS_SIMT[d]
    plan = plan_fwd(sim, *qkv(2, 100, 100, 3, 3, d, torch.float32))
    assert plan["family"] == "simt" and plan["head_dim_tile"] == tile
    # One warp per query row, 8 warps.
    assert plan["block_rows"] == 8 and plan["block"] == [256, 1, 1]
    assert plan["grid"] == [13, 6, 1]
    assert plan["smem_bytes"] == 80 * (tile + 1) * 4


def test_fwd_few_rows_take_the_one_m_tile_kernel(sim):
    # Up to kFwdFewRows = 16 query rows (decoding), the one-m-tile kernel; from 17, two.
    few = plan_fwd(sim, *qkv(1, 16, 100, 2, 2, 64))
    # 27648 of tiles and 2048 of the paged row table (paged_row_table.cuh), taken paged or not.
    assert few["one_m_tile"] and few["block_rows"] == 64 and few["smem_bytes"] == 27648 + 2048
    more = plan_fwd(sim, *qkv(1, 17, 100, 2, 2, 64))
    assert not more["one_m_tile"] and more["block_rows"] == 128 and more["smem_bytes"] == 36864


def test_fwd_dropout_takes_the_one_m_tile_kernel(sim):
    rng = torch.tensor([7, 0], dtype=torch.int64)
    plan = plan_fwd(sim, *qkv(2, 128, 128, 4, 4, 128), dropout_p=0.1, rng_state=rng)
    assert plan["one_m_tile"] and plan["block_rows"] == 64
    assert plan["grid"] == [2, 8, 1] and plan["smem_bytes"] == 52224 + 2048  # + row table
    plain = plan_fwd(sim, *qkv(2, 128, 128, 4, 4, 128))
    assert not plain["one_m_tile"] and plain["grid"] == [1, 8, 1] and plain["smem_bytes"] == 69632


def test_fwd_gqa_decode_is_packed_and_split(sim):
    # One token, 8 query heads on 2 kv heads: each kv head's 4 query heads are the rows of one
    # tile (packed_heads 4), B x Hkv = 4 CTAs. At 512 keys (8 tiles) a split's merge would cost
    # more than it saves (choose_num_splits' model; tests/test_cudasim_decode_splits.py pins
    # its choices): packed, not split.
    q, k, v = qkv(2, 1, 512, 8, 2, 128)
    plan = plan_fwd(sim, q, k, v, num_splits=0)
    assert plan["packed_heads"] == 4 and plan["seqlen_q"] == 4 and plan["heads_q"] == 2
    assert plan["one_m_tile"] and plan["block_rows"] == 64
    assert plan["num_splits"] == 1 and not plan["merges"] and plan["grid"] == [1, 4, 1]
    # At 16k keys (256 tiles) on 108 SMs: 16 splits (the merge's warp per row makes a split
    # cheap, and 4 CTAs leave the SMs idle).
    q, k, v = qkv(2, 1, 16384, 8, 2, 128)
    plan = plan_fwd(sim, q, k, v, num_splits=0)
    assert plan["packed_heads"] == 4
    assert plan["num_splits"] == 16 and plan["merges"] and not plan["fill_split_scratch"]
    assert plan["grid"] == [16, 4, 1]
    # 16 parts of out (B x Sq x Hq x d = 2 x 1 x 8 x 128) and of lse (2 x 1 x 8).
    assert plan["split_scratch_floats"] == 16 * (2 * 8 * 128 + 2 * 8)
    # On 8 SMs (the shim's device) the cache's bytes over 8 SMs bound the step sooner: two.
    small = plan_fwd(sim, q, k, v, num_splits=0, device=dict(SM80, sm_count=8))
    assert small["num_splits"] == 2 and small["grid"] == [2, 4, 1]
    # fwd's own num_splits = 1: packed, not split.
    assert plan_fwd(sim, q, k, v)["num_splits"] == 1
    # ALiBi (a slope per query head) is not packed.
    alibi = plan_fwd(sim, q, k, v, alibi_slopes=torch.rand(2, 8, dtype=torch.float32))
    assert alibi["packed_heads"] == 1 and alibi["heads_q"] == 8


def test_fwd_split_varlen_fills_its_scratch(sim):
    q, k, v = (torch.randn(24, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    plan = plan_fwd(sim, q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=14,
                    max_seqlen_k=14, num_splits=2)
    assert plan["num_splits"] == 2 and plan["fill_split_scratch"]
    assert plan["grid"] == [2, 4, 1]
    assert plan["split_scratch_floats"] == 2 * (24 * 2 * 64 + 24 * 2)


def test_fwd_empty(sim):
    plan = plan_fwd(sim, *qkv(0, 16, 16, 2, 2, 64))
    assert plan["empty"]


# ---- the backward ----

def step(kernel, family, grid, block, smem):
    return dict(kernel=kernel, family=family, grid=grid, block=[block, 1, 1], smem_bytes=smem)


def test_bwd_16bit(sim):
    q, k, v = qkv(2, 128, 128, 4, 4, 128)
    rows = step("dot_do_o", "rows", [32, 8, 1], 128, 0)
    plan = plan_bwd(sim, q, k, v)
    assert plan["family"] == "tensor_core" and plan["head_dim_tile"] == 128
    assert plan["dq_accum"]
    assert plan["steps"] == [rows, step("dkdv", "tensor_core", [1, 8, 1], 256, 141824),
                             dict(rows, kernel="convert_dq")]
    # D_i (Hq x total_q), aligned to 2, then the dQ accumulator (Hq x total_q x tile).
    assert plan["workspace_floats"] == 4 * 256 + 4 * 256 * 128
    # The check covers every kernel the backward may run: dK/dV's 141824 and dQ's 104448.
    assert plan["smem_bytes"] == 141824
    det = plan_bwd(sim, q, k, v, deterministic=True)
    assert not det["dq_accum"] and det["workspace_floats"] == 4 * 256
    assert det["steps"][2] == step("dq", "tensor_core", [2, 8, 1], 128, 104448)


def test_bwd_16bit_pair_tile(sim):
    # MLA's (192, 128): BwdPairTraits<192, 128>, 64 keys per CTA and 64 queries per step as the
    # 192 tile, V and dO 128 wide in shared memory (header).
    q, k, _ = qkv(2, 128, 128, 4, 4, 192)
    v = torch.randn(2, 128, 4, 128, dtype=q.dtype)
    rows = step("dot_do_o", "rows", [32, 8, 1], 128, 0)
    plan = plan_bwd(sim, q, k, v)
    assert (plan["head_dim_tile"], plan["head_dim_v_tile"]) == (192, 128)
    assert plan["steps"] == [rows, step("dkdv", "tensor_core", [2, 8, 1], 256, 104960),
                             dict(rows, kernel="convert_dq")]
    # The dQ accumulator is dQ's (q's) width.
    assert plan["workspace_floats"] == 4 * 256 + 4 * 256 * 192
    assert plan["smem_bytes"] == 104960
    det = plan_bwd(sim, q, k, v, deterministic=True)
    assert det["steps"][2] == step("dq", "tensor_core", [2, 8, 1], 128, 86016)


def test_bwd_16bit_pair_tile_128_64(sim):
    # (128, 64): BwdPairTraits<128, 64>, 128 keys per CTA and 64 queries per step as the 128
    # tile, V and dO 64 wide in shared memory (header).
    q, k, _ = qkv(2, 128, 128, 4, 4, 128)
    v = torch.randn(2, 128, 4, 64, dtype=q.dtype)
    plan = plan_bwd(sim, q, k, v)
    assert (plan["head_dim_tile"], plan["head_dim_v_tile"]) == (128, 64)
    assert plan["steps"][1] == step("dkdv", "tensor_core", [1, 8, 1], 256, 117248)
    assert plan["smem_bytes"] == 117248
    det = plan_bwd(sim, q, k, v, deterministic=True)
    assert det["steps"][2] == step("dq", "tensor_core", [2, 8, 1], 128, 79872)


def test_bwd_gqa_runs_dkdv_per_kv_head(sim):
    plan = plan_bwd(sim, *qkv(2, 128, 128, 8, 2, 64))
    dkdv = plan["steps"][1]
    # BwdTraits<64>: 128 keys per CTA, one CTA row per (batch, kv head).
    assert dkdv["kernel"] == "dkdv" and dkdv["grid"] == [1, 4, 1]


def test_bwd_simt_fp32(sim):
    plan = plan_bwd(sim, *qkv(2, 128, 128, 4, 4, 64, torch.float32))
    assert plan["family"] == "simt" and not plan["dq_accum"]
    assert plan["steps"] == [step("dot_do_o", "rows", [32, 8, 1], 128, 0),
                             step("dkdv", "simt", [16, 8, 1], 256, 21056),
                             step("dq", "simt", [16, 8, 1], 256, 20800)]
    assert plan["workspace_floats"] == 4 * 256 and plan["smem_bytes"] == 21056


def test_bwd_empty(sim):
    # No query head (a valid GQA shape with kv heads): dk and dv are zeros, nothing launches.
    plan = plan_bwd(sim, *qkv(2, 16, 16, 0, 2, 64))
    assert plan["empty"] and plan["steps"] == []


# ---- architectures ----

# Given num_splits, the SM count does not change the plan either.
ARCH_CASES = {
    "prefill": (lambda: qkv(2, 128, 128, 4, 4, 128), {}),
    "decode_gqa_split": (lambda: qkv(2, 1, 512, 8, 2, 128), dict(num_splits=3)),
    "few_rows": (lambda: qkv(1, 16, 100, 2, 2, 64), {}),
    "fp32": (lambda: qkv(2, 100, 100, 3, 3, 96, torch.float32), {}),
    "d256": (lambda: qkv(1, 64, 64, 2, 2, 256), {}),
}
DEVICE_FIELDS = {"device_arch", "smem_limit_bytes"}


@pytest.mark.parametrize("case", sorted(ARCH_CASES))
def test_sm90_plans_the_sm80_kernels(sim, case):
    """An sm_90 device is recognized as one (device_arch), but no Hopper kernel exists yet, so
    its plan runs the Sm80 kernels with the same decisions, within sm_80's shared memory."""
    make, kwargs = ARCH_CASES[case]
    q, k, v = make()
    for plan_of in (plan_fwd, plan_bwd):
        kw = kwargs if plan_of is plan_fwd else {}
        on80, on90 = plan_of(sim, q, k, v, **kw), plan_of(sim, q, k, v, SM90, **kw)
        assert on80["device_arch"] == "sm80" and on90["device_arch"] == "sm90"
        assert on80["arch"] == on90["arch"] == "sm80"
        assert on90["arch_smem_bytes"] == on80["arch_smem_bytes"] == SM80_SMEM
        assert on90["smem_limit_bytes"] == 227 * 1024
        strip = lambda p: {key: val for key, val in p.items() if key not in DEVICE_FIELDS}
        assert strip(on80) == strip(on90)


def test_a_device_without_the_shared_memory_is_refused_by_the_plan(sim):
    # The executor refuses a plan whose kernel needs more than the device's opt-in limit
    # (executor.h); the plan carries both numbers. sm_86 allows 99 KB.
    sm86 = dict(SM80, cc_minor=6, smem_optin_bytes=99 * 1024)
    plan = plan_bwd(sim, *qkv(1, 64, 64, 2, 2, 256), sm86)
    assert plan["smem_bytes"] > plan["smem_limit_bytes"] == 99 * 1024


# ---- the launch runs the plan ----

SHIM = dict(cc_major=8, cc_minor=0, sm_count=8, smem_optin_bytes=227 * 1024)  # sim_ops.cpp


def fwd_cases():
    rng = torch.tensor([3, 0], dtype=torch.int64)
    return {
        "two_m_tiles": (qkv(1, 32, 32, 2, 2, 64), {}),
        "dropout": (qkv(1, 32, 32, 2, 2, 64), dict(dropout_p=0.2, rng_state=rng)),
        "decode_gqa": (qkv(1, 1, 64, 4, 2, 64), {}),
        "d192": (qkv(1, 20, 20, 1, 1, 192), {}),
        "d192_v128": (qkv(1, 20, 20, 1, 1, 192)[:2]
                      + (torch.randn(1, 20, 1, 128, dtype=torch.bfloat16),), {}),
        "fp32": (qkv(1, 9, 20, 2, 2, 64, torch.float32), {}),
    }


@pytest.mark.parametrize("case", ["two_m_tiles", "dropout", "decode_gqa", "d192", "d192_v128",
                                  "fp32"])
def test_fwd_launch_is_the_plan(sim, case):
    (q, k, v), kwargs = fwd_cases()[case]
    plan = plan_fwd(sim, q, k, v, SHIM, **kwargs)
    _, [launch] = sim.launches(lambda: sim.ops.fwd(q, k, v, **kwargs))
    assert launch["grid"] == plan["grid"] and launch["block"] == plan["block"]
    assert launch["smem_bytes"] == plan["smem_bytes"]
    if plan["family"] == "simt":
        assert "simt_fwd_kernel" in launch["kernel"]
    else:
        one_m_tile = str(plan['one_m_tile']).lower()
        # The tiles named by q's width alone keep their traits' name (traits.h, FwdTraits).
        tile, tile_v = plan["head_dim_tile"], plan["head_dim_v_tile"]
        traits = (f"FwdTraits<{tile}, {one_m_tile}>" if tile_v == tile
                  else f"FwdPairTraits<{tile}, {tile_v}, {one_m_tile}>")
        assert "fwd_kernel_16bit" in launch["kernel"] and traits in launch["kernel"]


def test_split_fwd_launch_is_the_plan(sim):
    # 1024 keys (16 tiles) of 2 kv heads: four splits on the shim's 8 SMs.
    q, k, v = qkv(1, 1, 1024, 4, 2, 64)
    plan = plan_fwd(sim, q, k, v, SHIM, num_splits=0)
    assert plan["num_splits"] == 4 and plan["packed_heads"] == 2
    _, (fwd, merge) = sim.launches(
        lambda: sim.ops.fwd_kvcache(q, k.clone(), v.clone(), num_splits=0))
    assert "fwd_kernel_16bit" in fwd["kernel"] and "split_merge_kernel" in merge["kernel"]
    assert fwd["grid"] == plan["grid"] and fwd["smem_bytes"] == plan["smem_bytes"]


BWD_KERNELS = {("dot_do_o", "rows"): "bwd_dot_do_o_kernel",
               ("dkdv", "tensor_core"): "bwd_dkdv_kernel_16bit",
               ("dq", "tensor_core"): "bwd_dq_kernel_16bit",
               ("convert_dq", "rows"): "bwd_convert_dq_kernel",
               ("dkdv", "simt"): "simt_dkdv_kernel", ("dq", "simt"): "simt_dq_kernel"}


@pytest.mark.parametrize("dtype,deterministic,dims", [
    (torch.float16, False, (64, 64)), (torch.float16, True, (64, 64)),
    (torch.float32, False, (64, 64)), (torch.bfloat16, False, (192, 128)),
    (torch.bfloat16, True, (192, 128)), (torch.float16, True, (128, 64))], ids=str)
def test_bwd_launches_are_the_plan(sim, dtype, deterministic, dims):
    q, k, _ = qkv(1, 24, 40, 4, 2, dims[0], dtype)
    v = torch.randn(1, 40, 2, dims[1], dtype=dtype)
    out, lse = sim.ops.fwd(q, k, v, causal=True)
    plan = plan_bwd(sim, q, k, v, SHIM, causal=True, deterministic=deterministic)
    _, launches = sim.launches(lambda: sim.ops.bwd(torch.randn_like(out), out, lse, None, q, k, v,
                                                   causal=True, deterministic=deterministic))
    assert len(launches) == len(plan["steps"]) == 3
    for launch, s in zip(launches, plan["steps"]):
        assert BWD_KERNELS[(s["kernel"], s["family"])] in launch["kernel"]
        if dims[0] != dims[1] and s["family"] == "tensor_core":  # the pair's own traits
            assert f"PairTraits<{dims[0]}, {dims[1]}>" in launch["kernel"], launch["kernel"]
        assert (launch["grid"], launch["block"], launch["smem_bytes"]) == \
            (s["grid"], s["block"], s["smem_bytes"])
