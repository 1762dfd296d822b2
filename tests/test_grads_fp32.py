"""grads_fp32 (csrc/schema.h; internal, for flashattn.distributed's ring): bwd returns dq, dk, dv
in float32 for 16-bit inputs, the float32 sums before they are rounded to 16 bits, so that the
gradients of a ring's blocks add up in float32 and are rounded once.

On the CPU kernels and on the sm_80 CUDA kernels on the shim (the dK/dV kernel's and the
deterministic dQ kernel's epilogues and the dQ accumulator's conversion store float32):
  - dq, dk, dv are float32; rounded to the inputs' dtype they are bit for bit the usual
    gradients (the same computation, rounded later);
  - they keep the bits the rounding drops: closer to the float64 reference on average than the
    16-bit gradients, and not all of them representable in 16 bits;
  - float32 inputs give their usual gradients; float64 inputs are refused by name;
  - the CUDA plan is the usual one (no launch, scratch or kernel added).
"""
import pytest
import torch

from checks import (fp32_result_params, reference_grads, seeded_qkv, to64,
                    varlen_with_rows_past_the_sequences, with_dropout_rng_state)
from executors import make_executor
from tolerance import assert_within_torch_error

# (batch, Sq, Sk, heads, kv heads, head dim, op arguments, with a dLSE): Sq != Sk both ways, GQA,
# a window, softcap, dropout, deterministic.
CASES = {
    "Sq65-Sk47-causal-gqa": (2, 65, 47, 4, 2, 32, dict(causal=True), False),
    "Sq63-Sk129-window-dlse": (1, 63, 129, 2, 2, 64, dict(window=(20, 7)), True),
    "Sq129-Sk7-softcap-deterministic": (1, 129, 7, 2, 1, 32,
                                        dict(softcap=2.0, deterministic=True), False),
    "Sq7-Sk127-dropout": (2, 7, 127, 2, 1, 32, dict(dropout_p=0.25), False),
}
# Each CUDA thread is a fiber on the shim: two cases, the dQ accumulator's conversion and the
# deterministic dQ kernel.
SIM_CASES = ["Sq65-Sk47-causal-gqa", "Sq129-Sk7-softcap-deterministic"]
PARAMS, PARAM_IDS = fp32_result_params(CASES, SIM_CASES)


def _mean_abs_error(actual, expected):
    return (actual.double() - expected).abs().mean().item()


def _op_arguments(kw, seed):
    """The op's arguments (window stays the executors' shorthand) and the reference's."""
    ref = dict(causal=kw.get("causal", False), window_size=kw.get("window", (-1, -1)),
               softcap=kw.get("softcap", 0.0))
    return with_dropout_rng_state(kw, seed), ref


@pytest.mark.parametrize("executor,case,dtype", PARAMS, ids=PARAM_IDS)
def test_grads_fp32_are_the_gradients_before_rounding(executor, case, dtype):
    ex = make_executor(executor)
    batch, seqlen_q, seqlen_k, heads, heads_kv, dim, kw, with_dlse = CASES[case]
    seed = len(case)
    q, k, v = seeded_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, dim, dtype, seed=seed)
    kw, ref_kw = _op_arguments(kw, seed)
    out, lse = ex.fwd(q, k, v, None, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(out.shape, generator=g).to(dtype)
    dlse = torch.randn(lse.shape, generator=g) if with_dlse else None
    grads = ex.bwd(dout, q, k, v, out, lse, dlse, None, **kw)
    grads32 = ex.bwd(dout, q, k, v, out, lse, dlse, None, grads_fp32=True, **kw)
    if kw.get("dropout_p"):
        ref_kw.update(dropout_p=kw["dropout_p"], dropout_mask=torch.ops.flashattn.dropout_keep_mask(
            kw["rng_state"], kw["dropout_p"], batch, heads, seqlen_q, seqlen_k))
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(),
                          None if dlse is None else dlse.double(), ref_kw)
    low = reference_grads(q, k, v, dout, dlse, ref_kw)
    for name, grad, grad32, want, yardstick, x in zip(("dq", "dk", "dv"), grads, grads32, ref,
                                                      low, (q, k, v)):
        assert grad.dtype == dtype and grad32.dtype == torch.float32, name
        assert grad32.shape == x.shape, name
        assert torch.equal(grad32.to(dtype), grad), name
        # Not rounded to 16 bits: some entries lie between two 16-bit values.
        assert not torch.equal(grad32.to(dtype).float(), grad32), name
        assert_within_torch_error(f"{name} grads_fp32", grad32, want, yardstick, factor=3.0)
        # Rounding adds an error of its own to each entry: the mean error grows with it (the
        # largest one need not: the rounding may happen to land nearer the reference there).
        assert _mean_abs_error(grad32, want) < _mean_abs_error(grad, want), name


@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_grads_fp32_of_float32_inputs_are_their_gradients(executor):
    ex = make_executor(executor)
    q, k, v = seeded_qkv(2, 33, 65, 2, 1, 32, torch.float32, seed=5)
    out, lse = ex.fwd(q, k, v, None, causal=True)
    dout = torch.randn_like(out)
    grads = ex.bwd(dout, q, k, v, out, lse, None, None, causal=True)
    grads32 = ex.bwd(dout, q, k, v, out, lse, None, None, causal=True, grads_fp32=True)
    for name, grad, grad32 in zip(("dq", "dk", "dv"), grads, grads32):
        assert torch.equal(grad32, grad), name


def test_grads_fp32_varlen_keeps_rows_outside_the_sequences_zero():
    """Rows past cu_seqlens[-1] belong to no sequence: zero gradients, in float32."""
    ex = make_executor("cpu")
    q, k, v, kw = varlen_with_rows_past_the_sequences()
    out, lse = ex.fwd(q, k, v, None, **kw)
    dout = torch.randn_like(out)
    grads = ex.bwd(dout, q, k, v, out, lse, None, None, **kw)
    grads32 = ex.bwd(dout, q, k, v, out, lse, None, None, grads_fp32=True, **kw)
    for name, grad, grad32 in zip(("dq", "dk", "dv"), grads, grads32):
        assert grad32.dtype == torch.float32 and torch.equal(grad32.to(grad.dtype), grad), name
        assert torch.equal(grad32[31:], torch.zeros_like(grad32[31:])), name


def test_grads_fp32_refuses_float64():
    ex = make_executor("cpu")
    q, k, v = seeded_qkv(1, 8, 8, 2, 2, 16, torch.float64, seed=7)
    out, lse = ex.fwd(q, k, v, None)
    with pytest.raises(RuntimeError, match="grads_fp32 asks for float32 dq, dk, dv of float16, "
                                           "bfloat16 or float32 inputs; q is float64"):
        ex.bwd(out, q, k, v, out, lse, None, None, grads_fp32=True)


def test_grads_fp32_fake_kernel_gives_float32():
    q, k, v = (t.to("meta") for t in seeded_qkv(1, 8, 8, 2, 2, 16, torch.bfloat16))
    out, lse = torch.ops.flashattn.fwd(q, k, v)
    grads = torch.ops.flashattn.bwd(out, out, lse, None, q, k, v, grads_fp32=True)[:3]
    assert all(g.dtype == torch.float32 for g in grads)
    grads = torch.ops.flashattn.bwd(out, out, lse, None, q, k, v)[:3]
    assert all(g.dtype == torch.bfloat16 for g in grads)


def test_grads_fp32_plans_the_usual_backward(sim):
    """The CUDA plan of a 16-bit backward with grads_fp32 is the usual sm_80 one: the kernels
    store float32 in their epilogues (the sm_90a routing: test_cudasim_plan_hopper.py)."""
    from test_cudasim_plan import plan_bwd, qkv
    q, k, v = qkv(2, 130, 70, 4, 2, 128)
    for deterministic in (False, True):
        plain = plan_bwd(sim, q, k, v, causal=True, deterministic=deterministic)
        assert plan_bwd(sim, q, k, v, causal=True, deterministic=deterministic,
                        grads_fp32=True) == plain
