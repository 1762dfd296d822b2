"""The FP8 (e4m3) forward as the library runs it: flashattn.flash_attn_func and
flash_attn_varlen_func with float8_e4m3fn q, k, v and q_descale / k_descale / v_descale, over
torch.ops.flashattn_sim.fwd (the same op glue, checks (csrc/fp8_args.cpp), plan
(cuda/plan_fwd_fp8.h) and launch code (launch_plan.h -> launch_fwd_sm90.cuh run_fwd_sm90_fp8) as
torch.ops.flashattn on a GPU), on the shim's H100 opted in (conftest.py `hopper`).

The front ends reach torch.ops.flashattn, whose CPU tensors run the CPU executor (which has no FP8
kernels, test_fp8_args.py); here `sim_front_ends` points them at the sim's op of the same schema,
so their own argument handling is what runs. Outputs are poisoned before the kernel writes them
(FLASHATTN_POISON_OUTPUTS, conftest.py).

The reference is float64 attention on the dequantized inputs with P rounded to e4m3 as the kernel
rounds it (relative to the running max of the 128-key tiles visited so far, last tile first; l
the sum of the unrounded P), the same model tests/test_cudasim_hopper_fp8_fwd.py checks the kernel
against: out within 2x the error bf16 rounding makes on that reference (plus, for the rare P
that lie on an e4m3 rounding tie, the step the kernel's fp32 P may take the other way), and
within the bound e4m3 rounding of P allows of the unrounded attention; the LSE (of the descaled
logits) within 1e-4. Windows and softcap (the six loops) as well: the reference applies the
window (params.h's rule) and softcap with the descales inside its tanh."""
import math

import pytest
import torch

import flashattn
from flashattn import _interface
from fp8_reference import BLOCK_N, FP8, reference  # noqa: F401 (BLOCK_N: the other FP8 suites)
from hopper_sim import launched, schedule_fixture

D = 128
KERNEL = "fwd_sm90_kernel<__nv_fp8_e4m3, 128, {causal}, false, false, false, false, false, false>"
# The loop of a call: causal, softcap, local (a sliding window), the rest false.
LOOP = ("fwd_sm90_kernel<__nv_fp8_e4m3, 128, {causal}, {softcap}, {local}, false, false, false, "
        "false>")

schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:31", "random")])


@pytest.fixture
def sim_front_ends(hopper, monkeypatch):
    """flashattn's front ends calling torch.ops.flashattn_sim.fwd (the same schema) instead of
    torch.ops.flashattn.fwd, on the shim's H100 opted in."""
    monkeypatch.setattr(_interface, "_FWD", hopper.ops.fwd.default)
    return hopper


def fp8(*shape):
    """Random e4m3 values of either sign, magnitudes about 0.05 to 3 (never zeros only)."""
    return (torch.randn(*shape) * 0.8).to(FP8)


def descales(b, hkv, strided):
    """fp32 (B, Hkv) descales far from 1, different per (batch, kv head) and per tensor; strided:
    a transposed one and a column slice, to show any strides are read."""
    if not strided:
        return [torch.rand(b, hkv) + 0.5 for _ in range(3)]
    return [torch.rand(hkv, b).t() + 0.5, torch.rand(b, 2 * hkv)[:, ::2] + 0.5,
            torch.rand(b, hkv) * 1.5 + 0.25]


def dense_inputs(b, sq, sk, hq, hkv, kv_bhsd, scales):
    """q [b, sq, hq, D], k and v [b, sk, hkv, D] (kv_bhsd: stored [b, hkv, sk, D] and viewed
    so), and the three descales (None without `scales`; "strided": descales(strided=True))."""
    q = fp8(b, sq, hq, D)
    if kv_bhsd:
        k, v = (fp8(b, hkv, sk, D).transpose(1, 2) for _ in range(2))
    else:
        k, v = fp8(b, sk, hkv, D), fp8(b, sk, hkv, D)
    qd, kd, vd = descales(b, hkv, scales == "strided") if scales else (None, None, None)
    return q, k, v, qd, kd, vd


def varlen_inputs(lens_q, lens_k, hq, hkv):
    """A varlen batch of these lengths: cu_seqlens_q and _k, q (three rows past the last
    sequence, which no sequence uses: out 0, lse -inf), k, v, and strided descales."""
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = fp8(int(cu_q[-1]) + 3, hq, D)
    k, v = fp8(int(cu_k[-1]), hkv, D), fp8(int(cu_k[-1]), hkv, D)
    return (cu_q, cu_k, q, k, v, *descales(len(lens_q), hkv, strided=True))


NO_MASK, CAUSAL = (-1, -1), (-1, 0)  # (window_left, window_right); -1 unbounded


def check_sequence(out, lse, want):
    """out [Sq, Hq, D] (bf16), lse [Hq, Sq] of one sequence against reference()'s `want`."""
    out_rounded, out_exact, bound, want_lse, tie_bound = want
    assert not out.isnan().any(), "unwritten (poisoned) rows in out"
    got = out.double()
    rounding = (out_rounded.to(torch.bfloat16).double() - out_rounded).abs().max().item() \
        if got.numel() else 0.0
    # Each element within 2x the largest bf16 rounding, plus the P it holds that lie on an
    # e4m3 rounding tie (reference()'s tie_bound: 0 for almost every element).
    excess = (got - out_rounded).abs() - (2 * rounding + 1e-5 + tie_bound)
    assert (excess <= 0).all(), \
        f"out vs P-rounded reference: past by {excess.max().item()} (bf16 rounding {rounding})"
    excess = (got - out_exact).abs() - (bound + 2 ** -8 * out_exact.abs() + 1e-6)
    assert (excess <= 0).all(), f"out vs exact attention past e4m3's bound by {excess.max().item()}"
    finite = want_lse.isfinite()
    assert (lse[~finite] == float("-inf")).all()
    assert ((lse.double() - want_lse).abs()[finite] <= 1e-4).all(), \
        (lse.double() - want_lse).abs()[finite].max()


def run_counted(sim, fn):
    result, counters = sim.counted(fn)
    return result, launched(counters)


# (mask, B, Sq, Sk, Hq, Hkv, K/V stored [B, H, S, D], descales: None / "plain" / "strided")
DENSE = [
    ("none", 1, 65, 129, 2, 1, True, "plain"),
    ("none", 2, 127, 63, 1, 1, False, None),
    ("causal", 1, 257, 65, 2, 2, False, "strided"),
    ("causal", 1, 7, 257, 4, 2, True, "plain"),
    ("causal", 1, 1, 1, 1, 1, False, "strided"),
    ("causal_top_left", 1, 129, 257, 2, 1, False, "plain"),
    ("causal_top_left", 2, 63, 7, 1, 1, True, None),
]


@pytest.mark.parametrize("mask, b, sq, sk, hq, hkv, kv_bhsd, scales", DENSE,
                         ids=lambda x: str(x))
def test_fp8_forward_through_flash_attn_func(schedule, sim_front_ends, mask, b, sq, sk, hq, hkv,
                                             kv_bhsd, scales):
    sim = sim_front_ends
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, kv_bhsd, scales)
    causal = mask != "none"
    bottom_right = mask != "causal_top_left"
    scale = 1.0 / math.sqrt(D)
    if bottom_right:
        (out, lse, _), kernels = run_counted(sim, lambda: flashattn.flash_attn_func(
            q, k, v, causal=causal, return_attn_probs=True, q_descale=qd, k_descale=kd,
            v_descale=vd))
    else:  # top-left: the op's align_bottom_right (flash_attn_func is FA2's, bottom-right)
        (out, lse), kernels = run_counted(sim, lambda: sim.ops.fwd(
            q, k, v, causal=True, align_bottom_right=False, q_descale=qd, k_descale=kd,
            v_descale=vd))
    assert kernels == [KERNEL.format(causal=str(causal).lower())] or \
        (len(kernels) == 1 and KERNEL.format(causal=str(causal).lower()) in kernels[0]), kernels
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    assert lse.dtype == torch.float32 and lse.shape == (b, hq, sq)
    for i in range(b):
        per = (lambda x: 1.0 if x is None else x[i])  # noqa: E731
        want = reference(q[i], k[i], v[i], CAUSAL if causal else NO_MASK, bottom_right, scale,
                         per(qd), per(kd), per(vd))
        check_sequence(out[i], lse[i], want)
    if causal and bottom_right and sq > sk:
        assert (out[:, : sq - sk] == 0).all() and (lse[:, :, : sq - sk] == float("-inf")).all()


# (causal, lengths of q, lengths of k, Hq, Hkv)
VARLEN = [
    (False, [65, 1, 130], [129, 7, 200], 2, 1),
    (True, [129, 7, 40], [60, 257, 40], 1, 1),
    (True, [0, 33], [5, 0], 2, 2),
]


@pytest.mark.parametrize("causal, lens_q, lens_k, hq, hkv", VARLEN, ids=lambda x: str(x))
def test_fp8_forward_through_flash_attn_varlen_func(schedule, sim_front_ends, causal, lens_q,
                                                    lens_k, hq, hkv):
    sim = sim_front_ends
    b = len(lens_q)
    cu_q, cu_k, q, k, v, qd, kd, vd = varlen_inputs(lens_q, lens_k, hq, hkv)
    (out, lse, _), kernels = run_counted(sim, lambda: flashattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, return_attn_probs=True,
        q_descale=qd, k_descale=kd, v_descale=vd))
    assert len(kernels) == 1 and KERNEL.format(causal=str(causal).lower()) in kernels[0], kernels
    assert out.dtype == torch.bfloat16 and lse.shape == (hq, q.shape[0])
    for i in range(b):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        want = reference(q[rq], k[rk], v[rk], CAUSAL if causal else NO_MASK, True, 1 / math.sqrt(D),
                         qd[i], kd[i], vd[i])
        check_sequence(out[rq], lse[:, rq], want)
    assert (out[int(cu_q[-1]):] == 0).all() and (lse[:, int(cu_q[-1]):] == float("-inf")).all()


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_with_seqused(schedule, sim_front_ends, causal):
    """seqused_q / seqused_k (FA3's, through the op): only the first seqused[b] queries / keys of
    batch b take part; the rest of out is 0, of the LSE -inf."""
    sim = sim_front_ends
    b, sq, sk, hq, hkv = 3, 130, 200, 2, 1
    q, k, v = fp8(b, sq, hq, D), fp8(b, sk, hkv, D), fp8(b, sk, hkv, D)
    used_q = torch.tensor([130, 65, 0], dtype=torch.int32)
    used_k = torch.tensor([129, 200, 7], dtype=torch.int32)
    qd, kd, vd = descales(b, hkv, strided=False)
    (out, lse), kernels = run_counted(sim, lambda: sim.ops.fwd(
        q, k, v, causal=causal, seqused_q=used_q, seqused_k=used_k, q_descale=qd, k_descale=kd,
        v_descale=vd))
    assert len(kernels) == 1 and KERNEL.format(causal=str(causal).lower()) in kernels[0], kernels
    for i in range(b):
        nq, nk = int(used_q[i]), int(used_k[i])
        want = reference(q[i, :nq], k[i, :nk], v[i, :nk], CAUSAL if causal else NO_MASK, True,
                         1 / math.sqrt(D), qd[i], kd[i], vd[i])
        check_sequence(out[i, :nq], lse[i, :, :nq], want)
        assert (out[i, nq:] == 0).all() and (lse[i, :, nq:] == float("-inf")).all()


# Sliding windows and softcap (the loops local, softcap, causal + softcap, local + softcap):
# (window (left, right), bottom-right?, softcap, B, Sq, Sk, Hq, Hkv, K/V [B, H, S, D], descales).
# The windows: (0, 0) (the diagonal alone), narrow ones crossing key-tile edges, one side
# unbounded, rows that see no key (0 / -inf: (-1, 5) bottom-right with Sq > Sk, (3, 7) top-left
# with Sq > Sk + 10), and wider than the keys. softcap 0.7 and 2 bend logits of about +-2
# (the tanh matters), with descales far from 1 (they act inside the tanh).
WINDOW_SOFTCAP = [
    ((0, 0), True, 0.0, 1, 65, 129, 2, 1, True, "plain"),
    ((0, 0), False, 0.0, 2, 7, 7, 1, 1, False, None),
    ((3, 7), False, 0.0, 1, 129, 65, 2, 2, False, "strided"),
    ((-1, 5), True, 0.0, 1, 127, 63, 4, 2, True, "plain"),
    ((130, 0), True, 0.0, 1, 7, 257, 2, 1, False, "strided"),
    ((200, -1), False, 0.0, 1, 257, 129, 1, 1, False, "plain"),
    ((64, 1), True, 0.0, 1, 1, 1, 1, 1, False, "strided"),
    ((20, 129), True, 0.0, 1, 257, 257, 2, 1, True, "plain"),
    (NO_MASK, True, 0.7, 1, 65, 129, 2, 1, True, "strided"),
    (NO_MASK, True, 2.0, 2, 127, 63, 1, 1, False, None),
    (CAUSAL, True, 0.7, 1, 129, 65, 2, 2, False, "plain"),
    (CAUSAL, False, 2.0, 1, 63, 257, 4, 2, True, "strided"),
    ((10, 3), True, 0.7, 1, 129, 257, 2, 1, False, "plain"),
    ((0, 40), False, 2.0, 1, 257, 65, 2, 2, True, "strided"),
]


@pytest.mark.parametrize("window, bottom_right, softcap, b, sq, sk, hq, hkv, kv_bhsd, scales",
                         WINDOW_SOFTCAP, ids=lambda x: str(x))
def test_fp8_forward_with_window_and_softcap(schedule, sim_front_ends, window, bottom_right,
                                             softcap, b, sq, sk, hq, hkv, kv_bhsd, scales):
    sim = sim_front_ends
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, kv_bhsd, scales)
    scale = 1.0 / math.sqrt(D)
    if bottom_right:  # flash_attn_func: causal=True, or window_size
        causal = window == CAUSAL
        (out, lse, _), kernels = run_counted(sim, lambda: flashattn.flash_attn_func(
            q, k, v, causal=causal, window_size=NO_MASK if causal else window, softcap=softcap,
            return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd))
    else:  # top-left: the op's align_bottom_right
        (out, lse), kernels = run_counted(sim, lambda: sim.ops.fwd(
            q, k, v, window_left=window[0], window_right=window[1], softcap=softcap,
            align_bottom_right=False, q_descale=qd, k_descale=kd, v_descale=vd))
    loop = LOOP.format(causal=str(window == CAUSAL).lower(), softcap=str(softcap > 0).lower(),
                       local=str(window not in (CAUSAL, NO_MASK)).lower())
    assert len(kernels) == 1 and loop in kernels[0], kernels
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    for i in range(b):
        per = (lambda x: 1.0 if x is None else x[i])  # noqa: E731
        want = reference(q[i], k[i], v[i], window, bottom_right, scale, per(qd), per(kd), per(vd),
                         softcap)
        check_sequence(out[i], lse[i], want)
        if window in ((-1, 5), (3, 7)):  # these shapes leave rows that see no key
            assert (~want[3].isfinite()).any()


# Varlen with a window (and with softcap): (window, softcap, lengths of q, of k, Hq, Hkv).
VARLEN_WINDOW = [
    ((5, 2), 0.0, [65, 1, 130], [129, 7, 200], 2, 1),
    ((0, 0), 1.0, [129, 0, 40], [60, 33, 40], 2, 2),
    ((40, -1), 0.7, [7, 257], [257, 7], 1, 1),
]


@pytest.mark.parametrize("window, softcap, lens_q, lens_k, hq, hkv", VARLEN_WINDOW,
                         ids=lambda x: str(x))
def test_fp8_varlen_with_window_and_softcap(schedule, sim_front_ends, window, softcap, lens_q,
                                            lens_k, hq, hkv):
    sim = sim_front_ends
    b = len(lens_q)
    cu_q, cu_k, q, k, v, qd, kd, vd = varlen_inputs(lens_q, lens_k, hq, hkv)
    (out, lse, _), kernels = run_counted(sim, lambda: flashattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), window_size=window, softcap=softcap,
        return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd))
    loop = LOOP.format(causal="false", softcap=str(softcap > 0).lower(), local="true")
    assert len(kernels) == 1 and loop in kernels[0], kernels
    for i in range(b):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        want = reference(q[rq], k[rk], v[rk], window, True, 1 / math.sqrt(D), qd[i], kd[i],
                         vd[i], softcap)
        check_sequence(out[rq], lse[:, rq], want)
    assert (out[int(cu_q[-1]):] == 0).all() and (lse[:, int(cu_q[-1]):] == float("-inf")).all()
