"""ALiBi on the FP8 (e4m3) forward as the library runs it, on the shim's H100 opted in: its three
e4m3 loops (no mask, causal or a local window; softcap at run time inside each), the descales
scaling the scores before the bias (the logit is (q k^T) qd kd scale - slope |i + offset - j|,
with softcap softcap tanh((q k^T) qd kd scale / softcap) - slope |...|).

Against test_cudasim_hopper_fp8_call_path.py's reference (float64 attention of the dequantized
inputs, P rounded as the kernel rounds it) with the bias added, through flash_attn_func
(bottom-right), the op (top-left), flash_attn_varlen_func and the shim's fwd_split (split-KV)."""
import math

import pytest
import torch

import flashattn
from hopper_sim import schedule_fixture
from test_cudasim_hopper_fp8_call_path import (CAUSAL, D, NO_MASK, check_sequence, dense_inputs,
                                               reference, run_counted,
                                               sim_front_ends,  # noqa: F401
                                               varlen_inputs)
from test_cudasim_hopper_fp8_decode import MERGE, split_parts

schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:31", "random")])
ALIBI_LOOP = ("fwd_sm90_kernel<__nv_fp8_e4m3, 128, {causal}, false, {local}, true, false, false, "
              "false>")


def slopes_of(b, hq, per_batch):
    """ALiBi slopes small enough that far keys still count: [Hq], or [B, Hq] (a column slice, to
    show its strides are read)."""
    if per_batch:
        return (torch.rand(b, 2 * hq) * 0.1 + 0.005)[:, ::2]
    return torch.rand(hq) * 0.1 + 0.005


def loop_of(window):
    return ALIBI_LOOP.format(causal=str(window == CAUSAL).lower(),
                             local=str(window not in (CAUSAL, NO_MASK)).lower())


# (window, bottom-right?, softcap, B, Sq, Sk, Hq, Hkv, slopes per batch?, descales). Sq = 1 with
# GQA (not packed: a slope per query head), Sq != Sk both ways, softcap, windows crossing key
# tiles and rows that see no key.
CASES = [
    (NO_MASK, True, 0.0, 2, 1, 257, 4, 1, True, "strided"),
    (NO_MASK, True, 0.0, 1, 65, 129, 2, 1, False, "plain"),
    (CAUSAL, True, 0.0, 2, 7, 257, 4, 2, False, "strided"),
    (CAUSAL, False, 0.0, 1, 129, 65, 2, 2, True, "plain"),
    (CAUSAL, True, 0.7, 1, 257, 129, 2, 1, False, "strided"),
    ((10, 3), True, 0.0, 1, 129, 257, 2, 1, True, "plain"),
    ((-1, 5), True, 2.0, 1, 127, 63, 4, 2, False, "strided"),
    ((3, 7), False, 0.0, 2, 7, 7, 1, 1, False, None),
    (NO_MASK, True, 1.0, 1, 1, 1, 1, 1, True, "plain"),
]


@pytest.mark.parametrize("window, bottom_right, softcap, b, sq, sk, hq, hkv, per_batch, scales",
                         CASES, ids=lambda x: str(x))
def test_fp8_alibi(schedule, sim_front_ends, window, bottom_right, softcap, b, sq, sk, hq, hkv,
                   per_batch, scales):
    sim = sim_front_ends
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, False, scales)
    slopes = slopes_of(b, hq, per_batch)
    if bottom_right:
        causal = window == CAUSAL
        (out, lse, _), kernels = run_counted(sim, lambda: flashattn.flash_attn_func(
            q, k, v, causal=causal, window_size=NO_MASK if causal else window, softcap=softcap,
            alibi_slopes=slopes, return_attn_probs=True, q_descale=qd, k_descale=kd,
            v_descale=vd))
    else:
        (out, lse), kernels = run_counted(sim, lambda: sim.ops.fwd(
            q, k, v, window_left=window[0], window_right=window[1], softcap=softcap,
            alibi_slopes=slopes, align_bottom_right=False, q_descale=qd, k_descale=kd,
            v_descale=vd))
    assert kernels == [loop_of(window)] or (len(kernels) == 1 and loop_of(window) in kernels[0]), \
        kernels
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    for i in range(b):
        per = (lambda x: 1.0 if x is None else x[i])  # noqa: E731
        want = reference(q[i], k[i], v[i], window, bottom_right, 1 / math.sqrt(D), per(qd),
                         per(kd), per(vd), softcap, slopes=slopes[i] if per_batch else slopes)
        check_sequence(out[i], lse[i], want)


def test_fp8_alibi_varlen(schedule, sim_front_ends):
    lens_q, lens_k, hq, hkv = [65, 1, 130], [129, 7, 200], 2, 1
    b = len(lens_q)
    cu_q, cu_k, q, k, v, qd, kd, vd = varlen_inputs(lens_q, lens_k, hq, hkv)
    slopes = slopes_of(b, hq, True)
    (out, lse, _), kernels = run_counted(sim_front_ends, lambda: flashattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, alibi_slopes=slopes,
        return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd))
    assert len(kernels) == 1 and loop_of(CAUSAL) in kernels[0], kernels
    for i in range(b):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        want = reference(q[rq], k[rk], v[rk], CAUSAL, True, 1 / math.sqrt(D), qd[i], kd[i], vd[i],
                         slopes=slopes[i])
        check_sequence(out[rq], lse[:, rq], want)
    assert (out[int(cu_q[-1]):] == 0).all() and (lse[:, int(cu_q[-1]):] == float("-inf")).all()


@pytest.mark.parametrize("window, softcap, sq, sk, splits", [
    (NO_MASK, 0.0, 1, 257, 3), (CAUSAL, 0.7, 65, 257, 2), ((20, 0), 0.0, 7, 257, 2)], ids=str)
def test_fp8_alibi_split_kv(schedule, hopper, window, softcap, sq, sk, splits):
    b, hq, hkv = 2, 4, 2
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, True, "strided")
    slopes = slopes_of(b, hq, False)
    (out, lse), kernels = run_counted(hopper, lambda: hopper.ops.fwd_split(
        q, k, v, window_left=window[0], window_right=window[1], softcap=softcap,
        alibi_slopes=slopes, num_splits=splits, q_descale=qd, k_descale=kd, v_descale=vd))
    assert len(kernels) == 2 and loop_of(window) in kernels[0] and MERGE in kernels[1], kernels
    for i in range(b):
        parts = split_parts(sq, sk, window, True, 128, splits)
        want = reference(q[i], k[i], v[i], window, True, 1 / math.sqrt(D), qd[i], kd[i], vd[i],
                         softcap, tile_part=parts, slopes=slopes)
        check_sequence(out[i], lse[i], want)
