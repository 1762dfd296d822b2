"""out_fp32 (csrc/schema.h; internal, for flashattn.distributed's ring): fwd returns out in float32
for 16-bit inputs, the normalized O_i before it is rounded to 16 bits, so that partial outputs
merge in float32 and are rounded once.

On the CPU kernels and on the sm_80 CUDA kernels on the shim (which run such a call as the
split-KV path with one split: the kernel's float32 part, then the merge's float32 instantiation):
  - out is float32; rounded to the inputs' dtype it is bit for bit the usual out, and the LSE is
    the usual LSE (the same computation, rounded later);
  - it keeps the bits the rounding drops: closer to the float64 reference than the 16-bit out,
    and not all of it representable in 16 bits;
  - float32 inputs give their usual out; float64 inputs and the backward refuse it by name.
"""
import pytest
import torch

from checks import (fp32_result_params, seeded_qkv, varlen_with_rows_past_the_sequences,
                    with_dropout_rng_state)
from executors import make_executor
from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error, max_abs_error

# (name, batch, Sq, Sk, heads, kv heads, head dim, op arguments): Sq != Sk both ways, a decode
# step with GQA (packed heads on CUDA, split keys on the CPU), dropout.
CASES = {
    "Sq65-Sk47-causal": (2, 65, 47, 4, 2, 32, dict(causal=True)),
    "Sq63-Sk129-window": (1, 63, 129, 2, 2, 64, dict(window=(20, 7))),
    "Sq1-Sk257-gqa-decode": (1, 1, 257, 8, 2, 64, {}),
    "Sq7-Sk127-dropout": (2, 7, 127, 2, 1, 32, dict(dropout_p=0.25)),
}
SIM_CASES = ["Sq65-Sk47-causal", "Sq1-Sk257-gqa-decode"]
PARAMS, PARAM_IDS = fp32_result_params(CASES, SIM_CASES)


def _reference(q, k, v, kw, keep):
    return attention_reference(q, k, v, causal=kw.get("causal", False),
                               window_size=kw.get("window", (-1, -1)),
                               dropout_mask=keep, dropout_p=kw.get("dropout_p", 0.0))


@pytest.mark.parametrize("executor,case,dtype", PARAMS, ids=PARAM_IDS)
def test_out_fp32_is_the_out_before_rounding(executor, case, dtype):
    ex = make_executor(executor)
    batch, seqlen_q, seqlen_k, heads, heads_kv, dim, kw = CASES[case]
    q, k, v = seeded_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, dim, dtype, seed=len(case))
    kw = with_dropout_rng_state(kw, len(case))
    out, lse = ex.fwd(q, k, v, None, **kw)
    out32, lse32 = ex.fwd(q, k, v, None, out_fp32=True, **kw)
    assert out32.dtype == torch.float32 and out32.shape == out.shape
    assert torch.equal(out32.to(dtype), out)
    assert torch.equal(lse32, lse)
    # Not rounded to 16 bits: some entries lie between two 16-bit values.
    assert not torch.equal(out32.to(dtype).float(), out32)
    keep = None
    if kw.get("dropout_p"):
        keep = torch.ops.flashattn.dropout_keep_mask(kw["rng_state"], kw["dropout_p"], batch,
                                                     heads, seqlen_q, seqlen_k)
    ref, _ = _reference(q.double(), k.double(), v.double(), kw, keep)
    low, _ = _reference(q, k, v, kw, keep)
    assert_within_torch_error("out_fp32", out32, ref, low)
    assert max_abs_error(out32, ref) < max_abs_error(out, ref)


@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_out_fp32_of_float32_inputs_is_their_out(executor):
    ex = make_executor(executor)
    q, k, v = seeded_qkv(2, 33, 65, 2, 1, 32, torch.float32, seed=5)
    out, lse = ex.fwd(q, k, v, None, causal=True)
    out32, lse32 = ex.fwd(q, k, v, None, causal=True, out_fp32=True)
    assert torch.equal(out32, out) and torch.equal(lse32, lse)


def test_out_fp32_varlen_keeps_rows_outside_the_sequences_zero():
    """Rows past cu_seqlens_q[-1] belong to no sequence: out 0 (in float32), LSE -inf."""
    ex = make_executor("cpu")
    q, k, v, kw = varlen_with_rows_past_the_sequences()
    out, lse = ex.fwd(q, k, v, None, **kw)
    out32, lse32 = ex.fwd(q, k, v, None, out_fp32=True, **kw)
    assert out32.dtype == torch.float32
    assert torch.equal(out32.to(torch.bfloat16), out) and torch.equal(lse32, lse)
    assert torch.equal(out32[31:], torch.zeros_like(out32[31:]))


def test_out_fp32_refuses_float64_and_the_backward():
    ex = make_executor("cpu")
    q, k, v = seeded_qkv(1, 8, 8, 2, 2, 16, torch.float64, seed=7)
    with pytest.raises(RuntimeError, match="out_fp32 asks for a float32 out of float16, "
                                           "bfloat16 or float32 inputs; q is float64"):
        ex.fwd(q, k, v, None, out_fp32=True)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    out, lse = ex.fwd(q, k, v, None)
    with pytest.raises(RuntimeError, match="out_fp32 is forward only"):
        ex.bwd(out, q, k, v, out, lse, None, None, out_fp32=True)


def test_out_fp32_fake_kernel_gives_float32():
    q, k, v = (t.to("meta") for t in seeded_qkv(1, 8, 8, 2, 2, 16, torch.bfloat16))
    out, lse = torch.ops.flashattn.fwd(q, k, v, out_fp32=True)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert torch.ops.flashattn.fwd(q, k, v)[0].dtype == torch.bfloat16


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def test_out_fp32_plans_one_split_and_its_merge(sim):
    """The CUDA plan of a 16-bit call with out_fp32: the sm_80 kernel in one split, writing its
    float32 part, then the merge (the sm_90a routing: test_cudasim_plan_hopper.py)."""
    from test_cudasim_plan import plan_fwd, qkv
    q, k, v = qkv(2, 130, 130, 2, 2, 128)
    plain = plan_fwd(sim, q, k, v, causal=True)
    assert plain["num_splits"] == 1 and not plain["merges"]
    got = plan_fwd(sim, q, k, v, causal=True, out_fp32=True)
    assert got["num_splits"] == 1 and got["merges"]
    assert got["split_scratch_floats"] == 2 * 130 * 2 * (128 + 1)
    assert got["grid"] == plain["grid"]
    # float32 inputs' out is float32 already: no merge is added.
    q, k, v = qkv(2, 130, 130, 2, 2, 64, torch.float32)
    assert not plan_fwd(sim, q, k, v, out_fp32=True)["merges"]
