"""FP8 (float8_e4m3fn) inputs and their descales: every call the FP8 forward cannot run is an error
that names what it lacks (csrc/fp8_args.cpp, cuda/plan_fwd_fp8.h), never another kernel, a copy
or a wrong answer. The CPU executor's errors on torch.ops.flashattn and the front ends; the CUDA
executor's through torch.ops.flashattn_sim (the same checks and plan, on the shim's device: an
H100 opted in unless a test says otherwise). test_cudasim_hopper_fp8_call_path.py runs the calls
that are accepted."""
import pytest
import torch

import flashattn

FP8 = torch.float8_e4m3fn


def fp8(*shape):
    return torch.randn(*shape).to(FP8)


def qkv(b=1, sq=9, sk=17, hq=2, hkv=1, d=128):
    return fp8(b, sq, hq, d), fp8(b, sk, hkv, d), fp8(b, sk, hkv, d)


def test_fake_kernel_gives_a_bfloat16_out():
    q, k, v = (t.to("meta") for t in qkv())
    out, lse = torch.ops.flashattn.fwd(q, k, v, q_descale=torch.ones(1, 1, device="meta"))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 9, 2, 128)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 9)


def test_front_ends_take_fa3s_keywords():
    import inspect
    for fn in (flashattn.flash_attn_func, flashattn.flash_attn_varlen_func):
        params = inspect.signature(fn).parameters
        for name in ("q_descale", "k_descale", "v_descale"):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
            assert params[name].default is None


def test_cpu_executor_refuses_fp8():
    with pytest.raises(RuntimeError, match=r"float8_e4m3fn \(FP8\) inputs run on CUDA only.*"
                                           r"FLASHATTN_CUDA_HOPPER=1; the CPU executor"):
        flashattn.flash_attn_func(*qkv())


@pytest.mark.parametrize("odd", ["q", "k", "v"])
def test_fp8_inputs_all_three_or_none(odd):
    tensors = dict(zip("qkv", qkv()))
    tensors[odd] = tensors[odd].to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"float8_e4m3fn all three, q, k and v; got q .*, k .*"):
        torch.ops.flashattn.fwd(tensors["q"], tensors["k"], tensors["v"])


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descales_only_with_fp8_inputs(name):
    q, k, v = (torch.randn(1, 9, 1, 64, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(RuntimeError, match="apply to float8_e4m3fn .* got q, k, v of dtype BFloat16"):
        flashattn.flash_attn_func(q, k, v, **{name: torch.ones(1, 1)})


def test_sdpa_front_end_refuses_fp8():
    q, k, v = (t.transpose(1, 2) for t in qkv(hkv=2))
    with pytest.raises(TypeError, match="scaled_dot_product_attention: float8_e4m3fn .* not "
                                        "supported here; flash_attn_func takes them"):
        flashattn.scaled_dot_product_attention(q, k, v)


def test_cpu_executor_refuses_an_fp8_kvcache_before_writing_it():
    """The CPU executor has no FP8 forward: flash_attn_with_kvcache refuses FP8 with fwd's
    message, before the append writes the caches."""
    q, k_cache, v_cache = qkv(sq=1)
    k_new, v_new = fp8(1, 1, 1, 128), fp8(1, 1, 1, 128)
    before = k_cache.view(torch.uint8).clone(), v_cache.view(torch.uint8).clone()
    with pytest.raises(RuntimeError, match=r"float8_e4m3fn \(FP8\) inputs run on CUDA only.*"
                                           r"the CPU executor has no FP8 kernels"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=3,
                                          q_descale=torch.ones(1, 1))
    assert torch.equal(k_cache.view(torch.uint8), before[0])
    assert torch.equal(v_cache.view(torch.uint8), before[1])


def test_kvcache_takes_fa3s_keywords():
    import inspect
    params = inspect.signature(flashattn.flash_attn_with_kvcache).parameters
    for name in ("q_descale", "k_descale", "v_descale"):
        assert params[name].default is None
    q, k, v = (t.to("meta") for t in qkv(sq=1))
    out, lse = torch.ops.flashattn.fwd_kvcache(q, k, v, q_descale=torch.ones(1, 1, device="meta"))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 1, 2, 128)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 1)


def test_backward_refuses_fp8():
    q, k, v = qkv()
    out = torch.zeros(1, 9, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 9)
    with pytest.raises(RuntimeError, match="backward of float8_e4m3fn .* inference only"):
        torch.ops.flashattn.bwd(out, out, lse, None, q, k, v)
    # Descales alone, with 16-bit inputs, are refused by the backward too.
    q16, k16, v16 = (t.to(torch.bfloat16) for t in (q, k, v))
    with pytest.raises(RuntimeError, match="backward of float8_e4m3fn .* with descales"):
        torch.ops.flashattn.bwd(out, out, lse, None, q16, k16, v16, q_descale=torch.ones(1, 1))


# The CUDA executor's checks, on the shim.
@pytest.fixture
def h100(sim):
    sim.ops.set_device(9, 0, True)
    yield sim.ops
    sim.ops.set_device(8, 0, False)


def test_cuda_backward_refuses_fp8(h100):
    q, k, v = qkv()
    out, lse = h100.fwd(q, k, v)
    with pytest.raises(RuntimeError, match="backward of float8_e4m3fn"):
        h100.bwd(out, out, lse, None, q, k, v)


# (argument, its value, what the error names), each with otherwise acceptable FP8 inputs.
# (softcap, sliding windows, ALiBi and attn_mask are built: test_fp8_takes_softcap_and_windows
# below.)
REFUSED = [
    ("dropout_p", 0.1, "dropout"),
    ("block_offsets", torch.zeros(1, 5, dtype=torch.int32), "block_offsets"),
    ("out_fp32", True, "out_fp32"),
]


@pytest.mark.parametrize("name, value, named", REFUSED, ids=[r[0] for r in REFUSED])
def test_fp8_refuses_what_its_kernel_lacks(h100, name, value, named):
    extra = {name: value}
    if name == "dropout_p":
        extra["rng_state"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=f"the FP8 .* forward does not support {named}.* yet"):
        h100.fwd(*qkv(), **extra)


@pytest.mark.parametrize("name, value", [("softcap", 5.0), ("alibi_slopes", torch.full((2,), 0.1))])
def test_fp8_refuses_softcap_and_alibi_with_a_paged_cache(h100, name, value):
    """A paged cache runs the gathered e4m3 loops, which take a mask alone."""
    q = fp8(5, 2, 128)
    k, v = fp8(4, 16, 1, 128), fp8(4, 16, 1, 128)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=f"FP8 .* does not support {name} with a paged or "
                                           "indexed KV cache"):
        flashattn_sim_varlen(h100, q, k, v, cu, torch.tensor([0, 20], dtype=torch.int32),
                             block_table=torch.tensor([[0, 1]], dtype=torch.int32), **{name: value})


def flashattn_sim_varlen(ops, q, k, v, cu_q, cu_k, **kwargs):
    return ops.fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=64,
                   max_seqlen_k=64, **kwargs)


# Split-KV (num_splits, fwd_kvcache's argument, which the plan reads; torch.ops.flashattn_sim
# .fwd_split runs it) and a GQA decode's packed heads are the FP8 plan's, as the 16-bit sm_90a
# plan's: test_cudasim_hopper_fp8_decode.py runs them against the reference.
def test_fp8_plans_split_kv(h100):
    import json
    plan = json.loads(h100.plan_fwd(*qkv(b=2, sq=130, sk=300), num_splits=3, cc_major=9,
                                    hopper_fwd=True))
    assert plan["fp8"] and plan["num_splits"] == 3 and plan["merges"]
    assert plan["grid"] == [2 * 3, 2, 2]  # query tiles x splits, heads, batches
    # The parts of out (B Sq Hq D floats) and of the LSE (B Sq Hq), each split's; dense: no fill.
    assert plan["split_scratch_floats"] == 3 * (2 * 130 * 2 * 128 + 2 * 130 * 2)
    assert not plan["fill_split_scratch"]
    # num_splits = 0: the split model's count, on a decode long enough to split (the shim's 8 SMs).
    chosen = json.loads(h100.plan_fwd(*qkv(sq=1, sk=4096, hq=8, hkv=1), num_splits=0,
                                      cc_major=9, hopper_fwd=True))
    assert chosen["num_splits"] > 1 and chosen["merges"]


@pytest.mark.parametrize("hq, hkv, sq, packed", [
    (8, 2, 1, 4), (8, 1, 7, 8), (6, 2, 5, 3),
    (8, 2, 65, 1),    # 4 tiles of 64 packed rows against 4 heads: not packed, as for 16 bits
    (130, 2, 1, 1),   # 65 heads a group: more than the e4m3 kernel's tile holds, unpacked
], ids=str)
def test_fp8_plans_packed_gqa_decode(h100, hq, hkv, sq, packed):
    import json
    plan = json.loads(h100.plan_fwd(*qkv(b=2, sq=sq, hq=hq, hkv=hkv), cc_major=9,
                                    hopper_fwd=True))
    assert plan["fp8"] and plan["packed_heads"] == packed and plan["num_splits"] == 1
    # ALiBi's slope is per query head: never packed (gqa_decode.h), for FP8 as for 16 bits.
    alibi = json.loads(h100.plan_fwd(*qkv(b=2, sq=sq, hq=hq, hkv=hkv), cc_major=9,
                                     hopper_fwd=True, alibi_slopes=torch.ones(hq)))
    assert alibi["fp8"] and alibi["packed_heads"] == 1
    tokens = 128 if packed == 1 else 2 * (64 // packed)
    assert plan["grid"] == [(sq + tokens - 1) // tokens, hkv if packed > 1 else hq, 2]


def test_fp8_attn_mask_is_bool_or_float32(h100):
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="FP8.* attn_mask must be bool or float32, got "
                                           "Float8_e4m3fn"):
        h100.fwd(q, k, v, attn_mask=torch.zeros(9, 17).to(FP8))


@pytest.mark.parametrize("d", [64, 256])
def test_fp8_head_dim_128_only(h100, d):
    with pytest.raises(RuntimeError, match=f"FP8 .* supports head dim 128 only, got head_dim = {d}"):
        h100.fwd(*qkv(d=d))


@pytest.mark.parametrize("bad, message", [
    (torch.ones(1, 1, dtype=torch.float64), "q_descale must be float32, got Double"),
    (torch.ones(2, 1), r"q_descale must have shape \(batch, num_kv_heads\) = \(1, 1\), got \[2, 1\]"),
    (torch.ones(1), r"q_descale must have shape \(batch, num_kv_heads\) = \(1, 1\), got \[1\]"),
    (torch.ones(1, 2), r"q_descale must have shape .* got \[1, 2\]"),
])
def test_descale_dtype_and_shape(h100, bad, message):
    with pytest.raises(RuntimeError, match=message):
        h100.fwd(*qkv(), q_descale=bad)


def test_varlen_descale_batch_is_the_sequences(h100):
    q, k, v = fp8(10, 2, 128), fp8(12, 1, 128), fp8(12, 1, 128)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"v_descale must have shape \(batch, num_kv_heads\) = "
                                           r"\(2, 1\)"):
        flashattn_sim_varlen(h100, q, k, v, cu, cu_k, v_descale=torch.ones(10, 1))


def test_descale_on_another_device():
    # A meta descale beside CPU inputs sends the call to the fake kernel, which checks it as the
    # kernels do (csrc/fp8_args.cpp check_descale: the same check_same_device as every argument).
    with pytest.raises(RuntimeError, match="k_descale must be on the same device as q"):
        torch.ops.flashattn.fwd(*qkv(), k_descale=torch.ones(1, 1, device="meta"))


@pytest.mark.parametrize("cc, opted_in, message", [
    ((8, 0), True, r"needs a compute capability 9.0 GPU \(H100, H200\); this one is 8.0"),
    ((8, 9), True, "this one is 8.9"),
    ((9, 0), False, "opt-in until confirmed on a GPU: set FLASHATTN_CUDA_HOPPER=1"),
])
def test_fp8_needs_an_opted_in_sm90(sim, cc, opted_in, message):
    sim.ops.set_device(*cc, opted_in)
    try:
        with pytest.raises(RuntimeError, match=message):
            sim.ops.fwd(*qkv())
        # An empty batch meets the same error: it does not hide what a full one would meet.
        with pytest.raises(RuntimeError, match=message):
            sim.ops.fwd(*qkv(b=0))
    finally:
        sim.ops.set_device(8, 0, False)


def test_fp8_refuses_a_layout_tma_cannot_read(h100):
    q, k, v = qkv()
    storage = torch.empty(q.numel() + 1, dtype=FP8)
    shifted = storage[1:].view(q.shape)  # one byte past a 16-byte boundary
    shifted.copy_(q)
    with pytest.raises(RuntimeError, match="TMA loads need q, k and v 16-byte aligned"):
        h100.fwd(shifted, k, v)


def test_fp8_plan(h100):
    import json
    plan = json.loads(h100.plan_fwd(*qkv(b=2, sq=300, hq=4, hkv=2), causal=True, cc_major=9,
                                    hopper_fwd=True))
    assert plan["fp8"] and plan["arch"] == "sm90" and plan["num_splits"] == 1
    assert plan["packed_heads"] == 1 and not plan["merges"]
    assert plan["grid"] == [3, 4, 2]  # 128-row query tiles, heads, batches


# Softcap and sliding windows (each with the other, causal or not) plan the FP8 loop of their
# features; test_cudasim_hopper_fp8_call_path.py runs them against the reference.
@pytest.mark.parametrize("extra, local", [
    ({"softcap": 5.0}, False),
    ({"softcap": 5.0, "causal": True}, False),
    ({"window_left": 4}, True),
    ({"window_right": 3}, True),
    ({"window_left": 0, "window_right": 0, "softcap": 2.0}, True),
    ({"window_left": 4, "align_bottom_right": False}, True),
    ({"alibi_slopes": torch.ones(2)}, False),
    ({"alibi_slopes": torch.ones(1, 2), "causal": True, "softcap": 2.0}, False),
    ({"alibi_slopes": torch.ones(2), "window_left": 3}, True),
    ({"attn_mask": torch.ones(1, 2, 9, 17, dtype=torch.bool)}, False),
    ({"attn_mask": torch.zeros(9, 17), "causal": True, "alibi_slopes": torch.ones(2)}, False),
], ids=str)
def test_fp8_takes_softcap_and_windows(h100, extra, local):
    import json
    plan = json.loads(h100.plan_fwd(*qkv(), cc_major=9, hopper_fwd=True, **extra))
    assert plan["fp8"] and plan["arch"] == "sm90"


# Softcap's and the window's own checks still apply to FP8 inputs (attn_args.cpp), not an FP8
# refusal.
@pytest.mark.parametrize("extra, message", [
    ({"softcap": -1.0}, "softcap must be >= 0"),
    ({"window_left": -2}, r"window_size\[0\] \(left\) must be -1"),
    ({"window_right": -3}, r"window_size\[1\] \(right\) must be -1"),
    ({"alibi_slopes": torch.ones(3)}, r"alibi_slopes must have shape \["),
    ({"alibi_slopes": torch.ones(2, dtype=torch.float64)}, "alibi_slopes must be float32"),
], ids=str)
def test_fp8_softcap_and_window_arguments_checked(h100, extra, message):
    with pytest.raises(RuntimeError, match=message):
        h100.fwd(*qkv(), **extra)


# flash_attn_with_kvcache with FP8 (fwd_kvcache, csrc/kvcache_args.cpp check_fp8_cache) on the
# shim's H100: what the e4m3 kernel cannot read is refused by name, before the caches are written.
def kvcache_fp8(b=2, s_cache=32, hq=2, hkv=1, d=128):
    return fp8(b, 1, hq, d), fp8(b, s_cache, hkv, d), fp8(b, s_cache, hkv, d)


@pytest.mark.parametrize("odd", ["q", "k_cache", "v_cache"])
def test_fp8_kvcache_all_three_or_none(h100, odd):
    tensors = dict(zip(("q", "k_cache", "v_cache"), kvcache_fp8()))
    tensors[odd] = tensors[odd].to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"needs q, k_cache and v_cache all float8_e4m3fn; got "
                                           r"q .*, k_cache .*, v_cache .*"):
        h100.fwd_kvcache(tensors["q"], tensors["k_cache"], tensors["v_cache"])


def rotary():
    return dict(rotary_cos=torch.ones(40, 64).to(FP8), rotary_sin=torch.zeros(40, 64).to(FP8))


# (arguments, what the error names), each with otherwise acceptable FP8 inputs and an append.
# (A paged, indexed or left-padded FP8 cache runs: tests/test_cudasim_hopper_fp8_paged.py.)
KVCACHE_REFUSED = [
    (rotary, "rotary_cos / rotary_sin"),
]


@pytest.mark.parametrize("extra, named", KVCACHE_REFUSED, ids=[r[1] for r in KVCACHE_REFUSED])
def test_fp8_kvcache_refuses_what_its_kernel_lacks(h100, extra, named):
    q, k_cache, v_cache = kvcache_fp8()
    before = k_cache.view(torch.uint8).clone()
    with pytest.raises(RuntimeError, match=f"flash_attn_with_kvcache with float8_e4m3fn .* does "
                                           f"not support {named}: "):
        h100.fwd_kvcache(q, k_cache, v_cache, fp8(2, 1, 1, 128), fp8(2, 1, 1, 128),
                         cache_seqlens=torch.tensor([3, 5], dtype=torch.int32), **extra())
    assert torch.equal(k_cache.view(torch.uint8), before)


@pytest.mark.parametrize("name", ["k", "v"])
def test_fp8_kvcache_appends_e4m3_only(h100, name):
    q, k_cache, v_cache = kvcache_fp8()
    new = dict(k=fp8(2, 1, 1, 128), v=fp8(2, 1, 1, 128))
    new[name] = new[name].to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=f"{name} must have q's dtype Float8_e4m3fn, got BFloat16"):
        h100.fwd_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([3, 5], dtype=torch.int32),
                         **new)


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_fp8_kvcache_checks_descale_shapes(h100, name):
    """(batch, num_kv_heads): q's batch, k_cache's kv heads."""
    with pytest.raises(RuntimeError, match=rf"{name} must have shape \(batch, num_kv_heads\) = "
                                           rf"\(2, 1\), got \[2, 2\]"):
        h100.fwd_kvcache(*kvcache_fp8(), **{name: torch.ones(2, 2)})


def test_fp8_kvcache_head_dim_128_only(h100):
    with pytest.raises(RuntimeError, match="FP8 .* supports head dim 128 only, got head_dim = 64"):
        h100.fwd_kvcache(*kvcache_fp8(d=64))


def test_kvcache_descales_only_with_fp8(h100):
    q, k, v = (t.to(torch.bfloat16) for t in kvcache_fp8())
    with pytest.raises(RuntimeError, match="apply to float8_e4m3fn .* got q, k, v of dtype BFloat16"):
        h100.fwd_kvcache(q, k, v, k_descale=torch.ones(2, 1))


def test_fp8_kvcache_off_hopper_is_refused(sim):
    """An A100 (the shim's default device): the FP8 plan's refusal, as for fwd."""
    with pytest.raises(RuntimeError, match="needs a compute capability 9.0 GPU"):
        sim.ops.fwd_kvcache(*kvcache_fp8())
