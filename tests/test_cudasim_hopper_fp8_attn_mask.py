"""attn_mask on the FP8 (e4m3) forward as the library runs it, on the shim's H100 opted in: its
three e4m3 loops (no mask, causal or a local window; softcap and ALiBi at run time inside each),
the mask's bias (bool: 0 / -inf; float32: its value) added to the descaled logit, after softcap
and ALiBi, as on every executor. Through the op (fwd's attn_mask) and the shim's fwd_split,
against test_cudasim_hopper_fp8_call_path.py's reference with the bias added."""
import math

import pytest
import torch

from hopper_sim import schedule_fixture
from test_cudasim_hopper_fp8_call_path import (CAUSAL, D, NO_MASK, check_sequence, dense_inputs,
                                               reference, run_counted)
from test_cudasim_hopper_fp8_decode import MERGE, split_parts

schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:31", "random")])
MASK_LOOP = ("fwd_sm90_kernel<__nv_fp8_e4m3, 128, {causal}, false, {local}, false, true, false, "
             "false>")


def loop_of(window):
    return MASK_LOOP.format(causal=str(window == CAUSAL).lower(),
                            local=str(window not in (CAUSAL, NO_MASK)).lower())


def make_mask(kind, shape, hidden=0.3):
    """bool (True = take part) or float32 (values about +-1, -inf where hidden)."""
    keep = torch.rand(shape) >= hidden
    if kind == "bool":
        return keep
    return torch.randn(shape).masked_fill(~keep, float("-inf"))


def bias_of(mask, i, b, hq, sq, sk):
    """Batch entry i's bias [Hq, Sq, Sk] in float64 (the mask broadcast as the op broadcasts it)."""
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(b, hq, sq, sk)[i]
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, float("-inf"))
    return m.double()


# (kind, mask shape (None: [B, Hq, Sq, Sk]), window, bottom-right?, softcap, ALiBi?, B, Sq, Sk,
# Hq, Hkv): key padding, [Sq, Sk] with causal and softcap, per head with a window and ALiBi,
# top-left, a decode (Sq = 1, GQA 4/1: not packed, the mask is per query head), one key.
CASES = [
    ("bool", "keys", NO_MASK, True, 0.0, False, 2, 65, 129, 2, 1),
    ("float", "rows_keys", CAUSAL, True, 0.7, False, 1, 129, 257, 2, 2),
    ("float", None, (10, 3), True, 0.0, True, 1, 7, 257, 4, 2),
    ("bool", None, CAUSAL, False, 0.0, True, 2, 129, 65, 2, 1),
    ("float", "keys", NO_MASK, True, 2.0, True, 2, 1, 257, 4, 1),
    ("bool", None, NO_MASK, True, 0.0, False, 1, 1, 1, 1, 1),
]


def mask_shape(which, b, hq, sq, sk):
    return {"keys": (b, 1, 1, sk), "rows_keys": (sq, sk), None: (b, hq, sq, sk)}[which]


@pytest.mark.parametrize("kind, which, window, bottom_right, softcap, alibi, b, sq, sk, hq, hkv",
                         CASES, ids=lambda x: str(x))
def test_fp8_attn_mask(schedule, hopper, kind, which, window, bottom_right, softcap, alibi, b, sq,
                       sk, hq, hkv):
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, False, "strided")
    mask = make_mask(kind, mask_shape(which, b, hq, sq, sk))
    slopes = torch.rand(hq) * 0.1 + 0.005 if alibi else None
    (out, lse), kernels = run_counted(hopper, lambda: hopper.ops.fwd(
        q, k, v, window_left=window[0], window_right=window[1], softcap=softcap,
        alibi_slopes=slopes, attn_mask=mask, align_bottom_right=bottom_right, q_descale=qd,
        k_descale=kd, v_descale=vd))
    assert len(kernels) == 1 and loop_of(window) in kernels[0], kernels
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    for i in range(b):
        want = reference(q[i], k[i], v[i], window, bottom_right, 1 / math.sqrt(D), qd[i], kd[i],
                         vd[i], softcap, slopes=slopes, bias=bias_of(mask, i, b, hq, sq, sk))
        check_sequence(out[i], lse[i], want)


def test_fp8_attn_mask_split_kv(schedule, hopper):
    b, sq, sk, hq, hkv, splits = 2, 7, 257, 4, 1, 3
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, True, "plain")
    mask = make_mask("float", (b, 1, sq, sk))
    (out, lse), kernels = run_counted(hopper, lambda: hopper.ops.fwd_split(
        q, k, v, causal=True, attn_mask=mask, num_splits=splits, q_descale=qd, k_descale=kd,
        v_descale=vd))
    assert len(kernels) == 2 and loop_of(CAUSAL) in kernels[0] and MERGE in kernels[1], kernels
    for i in range(b):
        want = reference(q[i], k[i], v[i], CAUSAL, True, 1 / math.sqrt(D), qd[i], kd[i], vd[i],
                         tile_part=split_parts(sq, sk, CAUSAL, True, 128, splits),
                         bias=bias_of(mask, i, b, hq, sq, sk))
        check_sequence(out[i], lse[i], want)
