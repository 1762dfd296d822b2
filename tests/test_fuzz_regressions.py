"""Minimal cases the fuzzers (test_fuzz_differential.py, test_fuzz_malformed.py) found, kept
as regression tests."""
import re

import pytest
import torch

import flashattn


def test_s_dmask_with_dropout_and_no_keys():
    """return_attn_probs with dropout and seqlen_k = 0: S_dmask's row maximum reduced over an
    empty dim (IndexError from amax) instead of giving an empty (B, H, Sq, 0) S_dmask."""
    q = torch.randn(1, 3, 1, 8)
    kv = torch.randn(1, 0, 2, 1, 8)
    out, lse, s_dmask = flashattn.flash_attn_kvpacked_func(q, kv, dropout_p=0.1,
                                                            return_attn_probs=True)
    assert s_dmask.shape == (1, 1, 3, 0)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.all(lse == float("-inf"))


def test_sdpa_scale_error_names_scale():
    """flashattn.scaled_dot_product_attention(scale=<2-element tensor>) named FA2's
    softmax_scale instead of SDPA's scale."""
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention: scale must be a real"):
        flashattn.scaled_dot_product_attention(q, q, q, scale=torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan")])
def test_sdpa_non_finite_scale_error_names_scale(scale):
    """The op's own check said "softmax_scale must be finite", FA2's name, to an SDPA caller."""
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: scale must be finite"):
        flashattn.scaled_dot_product_attention(q, q, q, scale=scale)


# ---- issue 34: an append's caches and inputs sharing memory (the malformed-call fuzzer's
# k_cache_is_v_cache, accepted before: v overwrote k, and the attention read the values as keys)

def _append_args(b=2, cap=16, new=1):
    q = torch.randn(b, 1, 4, 16)
    k_cache, v_cache = torch.randn(b, cap, 2, 16), torch.randn(b, cap, 2, 16)
    k, v = torch.randn(b, new, 2, 16), torch.randn(b, new, 2, 16)
    return q, k_cache, v_cache, k, v, torch.tensor([3, 5], dtype=torch.int32)


def test_one_tensor_as_k_cache_and_v_cache_with_an_append_is_an_error():
    q, k_cache, _, k, v, seqlens = _append_args()
    before = k_cache.clone()
    # One tensor as both caches is also the MLA layout (V the first columns of K's rows, here
    # all of them): appending k writes the values too, so an append with its own v is refused.
    with pytest.raises(RuntimeError, match=r"v_cache is k_cache\[\.\.\., :16\].*pass v=None"):
        flashattn.flash_attn_with_kvcache(q, k_cache, k_cache, k, v, cache_seqlens=seqlens)
    assert torch.equal(k_cache, before), "the cache was written before the error"
    # Without an append both are only read: the same tensor is fine.
    flashattn.flash_attn_with_kvcache(q, k_cache, k_cache, cache_seqlens=seqlens)


@pytest.mark.parametrize("layout", ["overlapping_slices", "transposed", "narrower_view"])
def test_overlapping_cache_views_are_an_error(layout):
    q, _, _, k, v, seqlens = _append_args()
    if layout == "overlapping_slices":
        buf = torch.randn(2, 32, 2, 16)
        k_cache, v_cache = buf[:, :16], buf[:, 8:24]
    elif layout == "transposed":  # element (b, i, j) of one is (b, j, i) of the other
        square = torch.randn(2, 16, 16, 16)
        k_cache, v_cache = square[:, :, :2], square[:, :2].transpose(1, 2)
    else:
        buf = torch.randn(2, 16, 2, 32)
        k_cache, v_cache = buf[..., :16], buf[..., 8:24]
    with pytest.raises(RuntimeError, match=r"v_cache and k_cache (may )?share memory"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens)


def test_a_packed_cache_kv_0_and_kv_1_is_fine():
    """FA2's MHA passes kv_cache[:, :, 0] and kv_cache[:, :, 1]: one storage, no shared
    element."""
    q, _, _, k, v, seqlens = _append_args()
    kv = torch.randn(2, 16, 2, 2, 16)
    expected = kv.clone()
    for b, n in enumerate(seqlens.tolist()):
        expected[b, n, 0], expected[b, n, 1] = k[b, 0], v[b, 0]
    flashattn.flash_attn_with_kvcache(q, kv[:, :, 0], kv[:, :, 1], k, v, cache_seqlens=seqlens)
    assert torch.equal(kv, expected)


@pytest.mark.parametrize("which", ["q", "k", "v", "rotary_cos"])
def test_an_input_inside_a_cache_is_an_error(which):
    q, k_cache, v_cache, k, v, seqlens = _append_args()
    kwargs = dict(k=k, v=v, cache_seqlens=seqlens)
    cache_name = "k_cache"
    if which == "q":
        wide = torch.randn(2, 16, 4, 16)
        q, k_cache = wide[:, 10:11], wide[:, :, :2]
    elif which == "k":
        kwargs["k"], cache_name = v_cache[:, 3:4], "v_cache"
    elif which == "v":
        kwargs["v"] = k_cache[:, 14:15]  # a row the append does not write: still an error
    else:
        flat = torch.randn(2 * 16 * 2 * 16)
        k_cache = flat.view(2, 16, 2, 16)
        kwargs.update(rotary_cos=flat[:64].view(16, 4), rotary_sin=torch.randn(16, 4))
    with pytest.raises(RuntimeError, match=rf"{which} and {cache_name} share memory"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)


def test_an_append_into_a_row_another_sequence_owns_is_an_error():
    q, k_cache, v_cache, k, v, _ = _append_args()
    same = torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"cache_batch_idx maps both sequences there"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=same,
                                          cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32))
    pages_k, pages_v = torch.randn(8, 4, 2, 16), torch.randn(8, 4, 2, 16)
    table = torch.tensor([[0, 1, 2, 3], [4, 1, 5, 6]], dtype=torch.int32)  # block 1 twice
    before = pages_k.clone()
    with pytest.raises(RuntimeError, match=r"block_table maps both sequences there"):
        flashattn.flash_attn_with_kvcache(q, pages_k, pages_v, k, v,
                                          cache_seqlens=torch.tensor([5, 5], dtype=torch.int32),
                                          block_table=table)
    assert torch.equal(pages_k, before)
    # An append into a row that another sequence holds: sequence 0's new key 0 goes to row 1 of
    # block 1, which holds sequence 1's key 5.
    with pytest.raises(RuntimeError, match=r"row 1 of block 1, which holds key 5 of sequence 1"):
        flashattn.flash_attn_with_kvcache(q, pages_k, pages_v, k, v,
                                          cache_seqlens=torch.tensor([5, 7], dtype=torch.int32),
                                          block_table=table)
    assert torch.equal(pages_k, before)
    with pytest.raises(RuntimeError, match=r"row 3 of cache entry 1, which holds key 3 of "
                                           r"sequence 1 \(cache_batch_idx"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                          cache_seqlens=torch.tensor([3, 5], dtype=torch.int32),
                                          cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32))
    # Sharing a block that both only read (a common prefix) is fine.
    flashattn.flash_attn_with_kvcache(q, pages_k, pages_v, k, v,
                                      cache_seqlens=torch.tensor([9, 9], dtype=torch.int32),
                                      block_table=table)


def test_sdpa_errors_name_sdpa_arguments():
    """The op's errors named q, k, v (and its (B, S, H, D) layout) to SDPA callers."""
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 4, 7, 16)
    cases = [((q, k, k.int()), r"query, key and value must have the same dtype.*value"),
             ((q, k, torch.randn(2, 4, 8, 16)), r"key and value must have the same heads and seqlen"),
             ((q, k, k.to("meta")), r"value must be on query's device"),
             ((q, k, torch.randn(2, 4, 7, 32)[..., ::2]), r"value must be contiguous in its last"),
             ((q.int(), k.int(), k.int()), r"query has dtype Int")]
    for args, pattern in cases:
        with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: " + pattern) as e:
            flashattn.scaled_dot_product_attention(*args)
        assert not re.search(r"(?<![\w'.])(q|k|v|softmax_scale)(?![\w(])", str(e.value)), e.value
    with pytest.raises(RuntimeError, match=r"attn_mask must be bool, float32 or query's dtype"):
        flashattn.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(5, 7, dtype=torch.int32))


def test_the_overlap_check_agrees_with_brute_force_on_random_views():
    """k_cache and v_cache as random strided views (any strides, 0 included, any offsets) of one
    buffer: the append is refused exactly when the two share an element, by the element sets."""
    import random

    rng = random.Random(34)
    buf = torch.randn(2048)
    refused = accepted = 0
    for _ in range(300):
        d = rng.choice([1, 2, 4, 8])
        shape = [rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 3), d]

        def view():
            strides = [rng.choice([0, 1, 3, d, 2 * d, 17, 64, 96]) for _ in range(3)] + [1]
            span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
            offset = rng.randint(0, min(buf.numel() - span, 128))
            return torch.as_strided(buf, shape, strides, offset)

        def elements(t):
            idx = torch.as_strided(torch.arange(buf.numel()), t.shape, t.stride(),
                                   t.storage_offset())
            return set(idx.flatten().tolist())

        k_cache, v_cache = view(), view()
        overlap = bool(elements(k_cache) & elements(v_cache))
        b, h = shape[0], shape[2]
        q = torch.randn(b, 1, h, d)
        k, v = torch.randn(b, 1, h, d), torch.randn(b, 1, h, d)
        seqlens = torch.zeros(b, dtype=torch.int32)
        try:
            flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens)
        except RuntimeError as e:
            assert "share memory" in str(e) and overlap, (shape, k_cache.stride(),
                                                          v_cache.stride(), str(e))
            refused += 1
        else:
            assert not overlap, (shape, k_cache.stride(), k_cache.storage_offset(),
                                 v_cache.stride(), v_cache.storage_offset())
            accepted += 1
    print(f"refused {refused}, accepted {accepted}")
    assert refused > 20 and accepted > 20, (refused, accepted)


@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_one_key_with_alibi_and_dropout_is_held_to_the_rounding_rule(executor):
    """The shim's differential fuzzer (FLASHATTN_FUZZ_EXAMPLES=700, shrunk): varlen qkvpacked,
    one sequence of one token, d = 1, float16, dropout 0.1, ALiBi. With one key dQ and dK are 0
    in exact arithmetic (the softmax over one key is constant), and PyTorch gets 0 by structure,
    so the tolerance rule allowed no error at all; both kernels round D = rowsum(dO * O) with O
    in float16 (dq 5.5e-4 on the CPU, 1.1e-3 on the shim). The fuzzer held the one-key case to
    a rounding bound only without ALiBi; a constant bias on the only logit changes nothing, so
    it now does with ALiBi too (a fuzzer defect, not a kernel's): one_visible_key_slack."""
    import test_fuzz_differential as fuzz

    if executor == "sim":
        from executors import make_executor
        from test_cudasim_fuzz_differential import SimAPI
        api = SimAPI(make_executor("sim").ops)
    else:
        api = flashattn
    qkv = torch.tensor([-0.2935, -2.1797, 0.5684], dtype=torch.float16).view(1, 3, 1, 1)
    call = {"fn": "qkvpacked", "dtype": torch.float16,
            "kwargs": {"dropout_p": 0.1, "deterministic": False},
            "slopes": torch.tensor([0.0770]), "seed": 0, "lengths_q": [1], "lengths_k": [1],
            "used_q": None, "used_k": None, "cu_q": torch.tensor([0, 1], dtype=torch.int32),
            "cu_k": torch.tensor([0, 1], dtype=torch.int32), "max_q": 1, "max_k": 1,
            "backward": True, "block_table": None, "tensors": [qkv]}
    fuzz.check_varlen(call, api)
    # The same with ALiBi off took the rounding rule already; on the dense path too.
    fuzz.check_varlen(dict(call, slopes=None), api)


@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_one_key_with_rotary_is_held_to_the_rounding_of_the_rotated_inputs(executor):
    """The shim's differential fuzzer (FLASHATTN_FUZZ_EXAMPLES=700, shrunk): a dense KV cache,
    cache_seqlens 0 and one appended key (one key in all), d = 7, float16, rotary_dim 2 (not
    interleaved). The LSE is the one logit, from q and k rotated and rounded to float16 as the
    API specifies: 2.0e-4 from the float64 reference on both kernels, exactly the logit of the
    rounded inputs; PyTorch's float16 computation landed at 8.7e-5 by luck (its rounded logit
    cancelled part of the inputs' rounding), so 2x that failed. The yardstick is now the worse
    of PyTorch's and the exact attention over the rounded rotated inputs (a fuzzer defect)."""
    import test_fuzz_differential as fuzz

    if executor == "sim":
        from executors import make_executor
        from test_cudasim_fuzz_differential import SimAPI
        api = SimAPI(make_executor("sim").ops)
    else:
        api = flashattn
    h = torch.float16
    call = {"paged": False, "dtype": h, "kwargs": {"num_splits": 0}, "seed": 0, "new": 1,
            "cache_seqlens": [0], "leftpad": None, "batch_idx": None, "block_table": None,
            "slopes": None,
            "q": torch.tensor([1.5410, -0.2935, -2.1797, 0.5684, -1.0850, -1.3984, 0.4033],
                              dtype=h).view(1, 1, 1, 7),
            "k_cache": torch.tensor([0.8379, -0.7192, -0.4033, -0.5967, 0.1820, -0.8564, 1.1006],
                                    dtype=h).view(1, 1, 1, 7),
            "v_cache": torch.tensor([-1.0713, 0.1227, -0.5664, 0.3730, -0.8921, -1.5088, 0.3704],
                                    dtype=h).view(1, 1, 1, 7),
            "k": torch.tensor([1.4561, 0.9399, 0.7749, 0.1919, 1.2637, -1.2900, -0.7910],
                              dtype=h).view(1, 1, 1, 7),
            "v": torch.tensor([-0.0209, -0.7183, 0.5186, -1.3125, 0.1920, 0.5430, -2.2188],
                              dtype=h).view(1, 1, 1, 7),
            "rotary": {"rotary_cos": torch.tensor([[0.9985], [0.9990]], dtype=h),
                       "rotary_sin": torch.tensor([[0.0572], [0.0481]], dtype=h),
                       "rotary_interleaved": False}}
    fuzz.check_kvcache(call, api)


@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_one_visible_key_with_dropout_is_held_to_the_rounding_rule(executor):
    """The CPU differential fuzzer (2026-12-02, shrunk): scaled_dot_product_attention, float16,
    dropout 0.1, is_causal, Sq = 1, Sk = 2, d = 1. The only row sees key 0 alone, so dK is 0 in
    exact arithmetic and PyTorch gets 0 by structure; the kernels round D = rowsum(dO * O) with
    O = v / (1 - p) in float16 (dK 3.9e-4). The one-key rounding bound covered only calls with
    one key and no mask; it now covers every row that sees one key, whatever hides the others
    (one_visible_key_slack: a fuzzer defect, not a kernel's)."""
    import test_fuzz_differential as fuzz

    if executor == "sim":
        from executors import make_executor
        from test_cudasim_fuzz_differential import SimAPI
        api = SimAPI(make_executor("sim").ops)
    else:
        api = flashattn
    h = torch.float16
    q = torch.tensor([1.5410], dtype=h).view(1, 1, 1, 1)
    k = torch.tensor([-0.2935, -2.1797], dtype=h).view(1, 1, 2, 1)
    v = torch.tensor([0.5684, -1.0850], dtype=h).view(1, 1, 2, 1)
    call = {"fn": "sdpa", "dtype": h, "kwargs": {"dropout_p": 0.1}, "mask": "causal",
            "attn_mask": None, "slopes": None, "tensors": [q, k, v],
            "qkv": tuple(t.transpose(1, 2) for t in (q, k, v)), "backward": True, "seed": 0,
            "return_lse": False}
    fuzz.check_dense(call, api)


@pytest.mark.parametrize("executor", ["cpu", "sim"])
def test_the_output_rounding_in_d_is_allowed_for(executor):
    """The CPU differential fuzzer (2026-12-02, 7,000 varlen examples, shrunk): varlen kvpacked,
    bfloat16, window (1, -1), dropout 0.5, one sequence of 3 tokens, d = 1. PyTorch's dQ for the
    last row rounds to 0.2500 against the exact 0.2502 (1.6e-4, a lucky single rounding), so the
    3x rule allowed 1.5e-3; the kernels take D_i = rowsum(dO_i * O_i) from O rounded to bfloat16,
    as FA2 does, which alone moves that dQ by 3.1e-3 (ours: 3.7e-3). The fuzzer now adds that
    cost, computed exactly from the returned O (output_rounding_slack): a fuzzer defect."""
    import test_fuzz_differential as fuzz

    if executor == "sim":
        from executors import make_executor
        from test_cudasim_fuzz_differential import SimAPI
        api = SimAPI(make_executor("sim").ops)
    else:
        api = flashattn
    b = torch.bfloat16
    q = torch.tensor([-1.5859, 1.5703, 0.5430], dtype=b).view(3, 1, 1)
    kv = torch.tensor([[1.1328, 1.4219], [0.8555, 1.3203], [1.2578, -0.0854]],
                      dtype=b).view(3, 2, 1, 1)
    call = {"fn": "kvpacked", "dtype": b,
            "kwargs": {"window_size": (1, -1), "dropout_p": 0.5, "deterministic": False},
            "slopes": None, "seed": 276064, "lengths_q": [3], "lengths_k": [3],
            "used_q": None, "used_k": None, "cu_q": torch.tensor([0, 3], dtype=torch.int32),
            "cu_k": torch.tensor([0, 3], dtype=torch.int32), "max_q": 3, "max_k": 3,
            "backward": True, "block_table": None, "tensors": [q, kv]}
    fuzz.check_varlen(call, api)
