"""Dropout on the sm_90a kernels (hopper/sm90_dropout.cuh) as the library runs them: the shim's
device as an H100 with FLASHATTN_CUDA_HOPPER=1, torch.ops.flashattn_sim's fwd and bwd (the same
op glue, plans and launch code as on a GPU).

- The keep decisions, bit for bit: the forward's read off its output (q = 0 makes every visible
  key's probability equal; V one-hot on a window of d keys puts key off + c's kept-or-dropped
  probability in column c), the backward's off dV (dO one-hot on a window of d queries puts
  query off + c's dropped P in column c of dV), each equal to the keep mask the CPU reports
  (torch.ops.flashattn.dropout_keep_mask, the sm_80 kernels' too: test_dropout.py).
- Values and gradients on random inputs against the float64 reference given that mask, within
  2x (3x for gradients) PyTorch's own error in the dtype.
- Which kernels ran: the Hopper forward's and backward's kDropout main loops (the last template
  argument); at d = 256, and with a local window at d = 64, the Hopper forward with sm_80's
  backward (hopper/bwd_sm90_config.h, bwd_sm90_builds_dropout), which must agree on the mask.

Outputs are poisoned before the kernels write them (conftest.py). Every case runs under forward,
reverse and random warp orders with lazy, eager and random copy completion.

- selftest/hopper_dropout_test.cpp: the same two readings (q = 0, V or dO one-hot) with the
  kernels launched directly, no torch, exact against dropout.h's host mask, values included
  (dV's 1 / (1 - p)). Planted bugs in copies of the kernels' source (the forward drawing the
  previous key tile's decisions, the backward's dV without 1 / (1 - p)) must each fail it.
"""
import os
import re
import shutil
import sys

import pytest
import torch

from checks import reference_grads, to64
from flashattn._reference import attention_reference
from hopper_sim import ELEMENTS, SCHEDULES, launched, schedule_fixture
from tolerance import assert_within_torch_error

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import build  # noqa: E402
from fixtures import WRONG, assert_every_line_ok, planted_header, program, run  # noqa: E402

P = 0.17
schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:31", "random")])


def mask_kwargs(mask):
    """The op's and the reference's arguments of a mask name."""
    return {"none": dict(window=(-1, -1)), "causal": dict(causal=True, window=(-1, -1)),
            "causal_top_left": dict(causal=True, window=(-1, -1), align_bottom_right=False),
            "window": dict(window=(20, 5))}[mask]


def visible(sq, sk, mask):
    """[Sq, Sk] bool: which keys each query sees (bottom-right unless top_left)."""
    kw = mask_kwargs(mask)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    offset = 0 if kw.get("align_bottom_right", True) is False else sk - sq
    left, right = kw["window"]
    if kw.get("causal"):
        right = 0
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        seen &= j <= i + offset + right
    if left >= 0:
        seen &= j >= i + offset - left
    return seen


def run_fwd(ex, q, k, v, mask, rng_state, p=P):
    kw = mask_kwargs(mask)
    return ex.fwd(q, k, v, q.shape[-1] ** -0.5, dropout_p=p, rng_state=rng_state, **kw)


def keep_mask(rng_state, b, h, sq, sk, p=P):
    return torch.ops.flashattn.dropout_keep_mask(rng_state.cpu(), p, b, h, sq, sk)


def fwd_kernel(dtype, d, mask):
    causal = mask.startswith("causal")
    flags = ", ".join(str(x).lower() for x in (causal, False, mask == "window", False, False, False, True))
    return f"fwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {flags}>"


def bwd_kernel(dtype, d, mask):
    causal = mask.startswith("causal")
    flags = ", ".join(str(x).lower() for x in (causal, mask == "window", False, False, False, True))
    return f"bwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {flags}>"


# ---- the kernels launched directly (selftest/hopper_dropout_test.cpp) ----

SELFTEST = os.path.join(build.SHIM_DIR, "selftest", "hopper_dropout_test.cpp")
SELFTEST_CASES = ["fwd_none", "fwd_causal", "bwd_none", "bwd_causal"]


@pytest.mark.parametrize("warps, completion", SCHEDULES, ids=lambda s: s)
@pytest.mark.parametrize("case", SELFTEST_CASES)
def test_selftest_drops_exactly_the_keep_mask(case, warps, completion):
    out = run(program("hopper_dropout_test"), case, schedule=warps, completion=completion,
              timeout=300)
    assert_every_line_ok(out)


# (what the bug is, file under csrc, its (text, replacement) pairs, the cases that must fail)
PLANTED = {
    "keep_bits_of_the_previous_key_tile": (
        "cuda/hopper/fwd_sm90_kernel.cuh",
        [("keep_bits_query_rows<kBlockN / 2>(p.dropout, batch, head, row0, (tiles.n_end - 1 - it) * kBlockN",
          "keep_bits_query_rows<kBlockN / 2>(p.dropout, batch, head, row0, (tiles.n_end - it) * kBlockN")],
        ["fwd_none", "fwd_causal"]),
    "dv_without_one_over_one_minus_p": (
        "cuda/hopper/bwd_sm90_kernel.cuh",
        [("keep_factor(keep, 2 * i, p.dropout.keep_scale)", "keep_factor(keep, 2 * i, 1.f)"),
         ("keep_factor(keep, 2 * i + 1, p.dropout.keep_scale)", "keep_factor(keep, 2 * i + 1, 1.f)")],
        ["bwd_none", "bwd_causal"]),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path):
    """The self-test built against a copy of one kernel header with the bug planted (found first
    through -iquote): every case of the kernel it is in must report wrong results."""
    path, edits, cases = PLANTED[bug]
    flags = planted_header(tmp_path, path, edits)
    if shutil.which(build.CXX) is None or build.cuda_include_dir() is None:
        pytest.skip("no compiler or CUDA headers for the shim")
    exe = build.build_program([SELFTEST], f"hopper_dropout_test_{bug}", build.DEFAULT_BUILD_DIR,
                              extra_flags=flags)
    for case in cases:
        out = run(exe, case, timeout=300)
        assert out.returncode == WRONG and re.search(r"^WRONG: ", out.stdout, re.M), (
            f"planted bug {bug} went unnoticed by {case}: {out.stdout}{out.stderr}")


# ---- the keep decisions, bit for bit ----

# (dtype, d, mask, B, Sq, Sk, Hq, Hkv): every head dim (128-key tiles, 64 at d = 256), masks,
# awkward lengths, Sq != Sk both ways, GQA.
MASK_CASES = [
    (torch.bfloat16, 64, "none", 2, 65, 257, 2, 1),
    (torch.float16, 128, "causal", 1, 129, 63, 2, 2),
    (torch.bfloat16, 256, "window", 1, 7, 257, 1, 1),
    (torch.float16, 64, "causal_top_left", 1, 127, 129, 3, 1),
    (torch.bfloat16, 128, "none", 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("dtype, d, mask, b, sq, sk, hq, hkv", MASK_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_forward_drops_exactly_the_keep_mask(schedule, hopper, dtype, d, mask, b, sq, sk, hq, hkv):
    rng_state = torch.ops.flashattn.dropout_rng_state(torch.empty(0))
    q = torch.zeros(b, sq, hq, d, dtype=dtype)
    k = torch.randn(b, sk, hkv, d, dtype=dtype)
    want = keep_mask(rng_state, b, hq, sq, sk) & visible(sq, sk, mask)
    for off in range(0, sk, d):
        n = min(d, sk - off)
        v = torch.zeros(b, sk, hkv, d, dtype=dtype)
        v[:, off:off + n, :, :n] = torch.eye(n, dtype=dtype)[None, :, None, :]
        (out, _), counters = hopper.counted(lambda: run_fwd(hopper, q, k, v, mask, rng_state))
        kernels = launched(counters)
        assert len(kernels) == 1 and fwd_kernel(dtype, d, mask) in kernels[0], kernels
        # out [B, Sq, Hq, d] -> [B, Hq, Sq, n]: nonzero exactly where kept and visible.
        got = (out[..., :n] != 0).transpose(1, 2)
        assert torch.equal(got, want[..., off:off + n]), f"keys {off}..{off + n}"
        assert (out[..., n:] == 0).all()


@pytest.mark.parametrize("dtype, d, mask, b, sq, sk, hq, hkv",
                         [c for c in MASK_CASES if c[1] in (64, 128)] + [
                             (torch.bfloat16, 128, "window", 2, 257, 65, 2, 1),
                             (torch.float16, 128, "causal_top_left", 1, 127, 129, 3, 1),
                             (torch.float16, 64, "causal", 1, 129, 63, 2, 1)],
                         ids=lambda x: str(x).replace("torch.", ""))
def test_backward_drops_exactly_the_keep_mask(schedule, hopper, dtype, d, mask, b, sq, sk, hq, hkv):
    # dV[j, c] = sum_i P_dropped[i, j] dO[i, c]: with dO one-hot on queries off..off + d, column c
    # of dV is query off + c's dropped P (q = 0: every visible P equal, never 0).
    rng_state = torch.ops.flashattn.dropout_rng_state(torch.empty(0))
    q = torch.zeros(b, sq, hq, d, dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, dtype=dtype) for _ in range(2))
    want = keep_mask(rng_state, b, hq, sq, sk) & visible(sq, sk, mask)  # [B, Hq, Sq, Sk]
    out, lse = run_fwd(hopper, q, k, v, mask, rng_state)
    group = hq // hkv
    for off in range(0, sq, d):
        n = min(d, sq - off)
        # One query head at a time, so the group's sum of dV does not mix heads.
        for h in range(hq):
            dout = torch.zeros(b, sq, hq, d, dtype=dtype)
            dout[:, off:off + n, h, :n] = torch.eye(n, dtype=dtype)
            (dq, dk, dv), counters = hopper.counted(lambda: hopper.bwd(
                dout, q, k, v, out, lse, None, d ** -0.5, dropout_p=P, rng_state=rng_state,
                **mask_kwargs(mask)))
            kernels = launched(counters)
            assert any(bwd_kernel(dtype, d, mask) in name for name in kernels), kernels
            got = (dv[:, :, h // group, :n] != 0).transpose(1, 2)  # [B, n, Sk]
            assert torch.equal(got, want[:, h, off:off + n, :]), f"head {h}, queries {off}.."


# ---- values and gradients ----

# (dtype, d, mask, B, Sq, Sk, Hq, Hkv)
VALUE_CASES = [
    (torch.bfloat16, 64, "causal", 2, 129, 63, 2, 1),
    (torch.float16, 128, "none", 1, 63, 257, 2, 2),
    (torch.bfloat16, 128, "window", 1, 257, 129, 2, 1),
    (torch.float16, 64, "causal_top_left", 1, 65, 127, 1, 1),
    # (Not Sk = 1: there dQ is 0 in exact arithmetic, and every executor's D = rowsum(dO * O)
    # from the rounded O leaves a residue of O's rounding, the sm_80 kernels' too.)
    (torch.bfloat16, 64, "none", 1, 1, 7, 1, 1),
    (torch.float16, 256, "causal", 1, 65, 129, 2, 1),  # the backward on sm_80 (and at d = 64)
    (torch.bfloat16, 128, "causal_top_left", 1, 129, 65, 2, 1),
    (torch.float16, 64, "none", 2, 127, 257, 4, 2),
    (torch.bfloat16, 64, "window", 1, 65, 129, 2, 1),  # the backward on sm_80
]


@pytest.mark.parametrize("dtype, d, mask, b, sq, sk, hq, hkv", VALUE_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_values_and_gradients(schedule, hopper, dtype, d, mask, b, sq, sk, hq, hkv):
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, dtype=dtype) for _ in range(2))
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    keep = keep_mask(rng_state, b, hq, sq, sk)
    kw = mask_kwargs(mask)
    window = kw.pop("window")
    ref_kwargs = dict(kw, softmax_scale=d ** -0.5, window_size=window, dropout_mask=keep,
                      dropout_p=P)
    dout = torch.randn(b, sq, hq, d, dtype=dtype)

    def step():
        out, lse = run_fwd(hopper, q, k, v, mask, rng_state)
        grads = hopper.bwd(dout, q, k, v, out, lse, None, d ** -0.5, dropout_p=P,
                           rng_state=rng_state, **mask_kwargs(mask))
        return out, lse, grads

    (out, lse, grads), counters = hopper.counted(step)
    kernels = launched(counters)
    assert fwd_kernel(dtype, d, mask) in kernels[0], kernels
    hopper_backward = d == 128 or (d == 64 and mask != "window")
    assert any(bwd_kernel(dtype, d, mask) in name for name in kernels) == hopper_backward, kernels
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, low_lse = attention_reference(q, k, v, **ref_kwargs)
    assert_within_torch_error("out", out, ref_out, low_out)
    assert_within_torch_error("lse", lse, ref_lse, low_lse.float())
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(), None, ref_kwargs)
    low = reference_grads(q, k, v, dout, None, ref_kwargs)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert got.isfinite().all(), name
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)


def test_varlen(hopper):
    # Packed sequences draw at their own (b, h, local row, local key), as every executor does:
    # each sequence against the dense mask of batch b.
    lens_q, lens_k = [65, 1, 130], [129, 7, 64]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    d, hq, dtype = 128, 2, torch.bfloat16
    q = torch.randn(int(cu_q[-1]), hq, d, dtype=dtype)
    k, v = (torch.randn(int(cu_k[-1]), 1, d, dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    keep = keep_mask(rng_state, len(lens_q), hq, max(lens_q), max(lens_k))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
              max_seqlen_k=max(lens_k), causal=True, dropout_p=P, rng_state=rng_state)

    def step():
        out, lse = hopper.fwd(q, k, v, d ** -0.5, **kw)
        return out, lse, hopper.bwd(dout, q, k, v, out, lse, None, d ** -0.5, **kw)

    (out, lse, grads), counters = hopper.counted(step)
    kernels = launched(counters)
    assert fwd_kernel(dtype, d, "causal") in kernels[0], kernels
    assert any(bwd_kernel(dtype, d, "causal") in name for name in kernels), kernels
    for s in range(len(lens_q)):
        qa, qb, ka, kb = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        ref_kwargs = dict(softmax_scale=d ** -0.5, causal=True, dropout_p=P,
                          dropout_mask=keep[s:s + 1, :, :qb - qa, :kb - ka])
        qs, ks, vs, dos = q[None, qa:qb], k[None, ka:kb], v[None, ka:kb], dout[None, qa:qb]
        ref_out, _ = attention_reference(to64(qs), to64(ks), to64(vs), **ref_kwargs)
        low_out, _ = attention_reference(qs, ks, vs, **ref_kwargs)
        assert_within_torch_error(f"out {s}", out[None, qa:qb], ref_out, low_out)
        ref = reference_grads(to64(qs), to64(ks), to64(vs), dos.double(), None, ref_kwargs)
        low = reference_grads(qs, ks, vs, dos, None, ref_kwargs)
        got = (grads[0][None, qa:qb], grads[1][None, ka:kb], grads[2][None, ka:kb])
        for name, g, want, yardstick in zip(("dq", "dk", "dv"), got, ref, low):
            assert_within_torch_error(f"{name} {s}", g, want, yardstick, factor=3.0)
