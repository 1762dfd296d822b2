"""The CPU kernels' 16-bit operand path (csrc/cpu/panels16.h): bf16/fp16 tiles multiplied in 16
bits with fp32 accumulation. It is the default only on CPUs with native 16-bit dot products
(AMX, AVX-512 BF16), where B panels are VNNI-packed; FLASHATTN_CPU_16BIT_PRODUCTS=1 forces it
with row-major panels on any CPU, so that everything but the VNNI packing is tested everywhere.
"""
import pytest
import torch

from checks import (MASKS, assert_bitwise_deterministic, check_backward, check_forward,
                    make_qkv, make_qkv_far_below_zero)
from executors import make_executor

FORCE = "FLASHATTN_CPU_16BIT_PRODUCTS"
DTYPES_16 = [torch.bfloat16, torch.float16]


@pytest.fixture
def cpu16(monkeypatch):
    monkeypatch.setenv(FORCE, "1")
    return make_executor("cpu")


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 7), (1, 129), (129, 1), (63, 65), (65, 63),
                                     (127, 257), (257, 127)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "causal_top_left", "window", "softcap_causal",
                                  "alibi_batch_causal", "all"])
def test_forward_16bit_products(cpu16, dtype, seqlens, mask):
    check_forward(cpu16, *make_qkv(2, *seqlens, 2, 2, 64, dtype, cpu16.device), MASKS[mask])


# Odd dims pad the score product's K to even; dims past 64 span several value panels.
@pytest.mark.parametrize("head_dim", [1, 7, 32, 63, 65, 128, 130, 256])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_head_dims_16bit_products(cpu16, head_dim, dtype):
    check_forward(cpu16, *make_qkv(1, 65, 200, 2, 1, head_dim, dtype, cpu16.device),
                  MASKS["causal"])


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (63, 129), (129, 63), (257, 257)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "window_causal", "softcap_causal",
                                  "alibi_batch_causal", "causal_top_left", "all"])
def test_backward_16bit_products(cpu16, dtype, seqlens, mask):
    check_backward(cpu16, *make_qkv(2, *seqlens, 2, 2, 32, dtype, cpu16.device), MASKS[mask])


@pytest.mark.parametrize("head_dim", [1, 7, 63, 65, 130, 256])
@pytest.mark.parametrize("heads,heads_kv", [(2, 2), (6, 2)])
def test_backward_head_dims_and_gqa_16bit_products(cpu16, head_dim, heads, heads_kv):
    q, k, v = make_qkv(1, 70, 150, heads, heads_kv, head_dim, torch.bfloat16, cpu16.device)
    check_backward(cpu16, q, k, v, MASKS["causal"], with_dlse=True)


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_logits_far_below_zero_16bit_products(cpu16, dtype):
    """Rows whose every logit is far below zero (checks.make_qkv_far_below_zero)."""
    q, k, v = make_qkv_far_below_zero(2, 97, 300, 2, 1, 64, dtype, cpu16.device)
    check_forward(cpu16, q, k, v, MASKS["causal"])
    check_backward(cpu16, q, k, v, MASKS["causal"])


def test_backward_16bit_products_deterministic(cpu16):
    assert_bitwise_deterministic(cpu16, torch.bfloat16, "all")


def test_strided_inputs_16bit_products(cpu16):
    q, k, v = torch.randn(2, 77, 3, 3, 40, dtype=torch.bfloat16).unbind(2)
    check_forward(cpu16, q, k, v, MASKS["causal"])
    check_backward(cpu16, q, k, v, MASKS["causal"])


def test_same_result_as_fp32_products_up_to_rounding_of_p(monkeypatch):
    """The 16-bit path differs from the fp32 one only by rounding P to 16 bits before P·V."""
    ex = make_executor("cpu")
    q, k, v = make_qkv(1, 100, 300, 2, 2, 64, torch.bfloat16, ex.device)
    monkeypatch.setenv(FORCE, "0")
    out32, lse32 = ex.fwd(q, k, v, 0.125, causal=True)
    monkeypatch.setenv(FORCE, "1")
    out16, lse16 = ex.fwd(q, k, v, 0.125, causal=True)
    assert not torch.equal(out16, out32), "the override did not switch the operand path"
    torch.testing.assert_close(lse16, lse32, rtol=0, atol=1e-5)
    torch.testing.assert_close(out16.float(), out32.float(), rtol=0, atol=2e-2)


def test_bad_override_is_named(monkeypatch):
    monkeypatch.setenv(FORCE, "yes")
    q, k, v = make_qkv(1, 8, 8, 1, 1, 16, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(RuntimeError, match=f"{FORCE} must be 0 or 1.*'yes'"):
        torch.ops.flashattn.fwd(q, k, v, 0.25, False, -1, -1, 0.0, None, True, False)
