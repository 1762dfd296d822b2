"""Bad input never crashes (issue 34): a fixed-seed fuzzer of malformed calls of every public
function -- wrong dtypes, devices (meta tensors), ranks, shapes and strides (a non-contiguous
last dim included), negative / NaN / infinite / huge scalars, malformed cu_seqlens, block tables,
seqused, cache indices out of range, tensors aliasing each other (one cache as k_cache and
v_cache, overlapping or transposed views of one buffer, q / k / v / rotary tables inside a cache,
two sequences appending into one cache row, an append into a row another sequence reads) -- run in a subprocess, so that a segfault or an
abort is a test failure rather than a dead pytest. scaled_dot_product_attention's errors must
use SDPA's argument names only (never q, k, v, softmax_scale, flashattn's op).

The subprocess (this file run as a script) prints one JSON line per call: the call's function,
its mutation, and either "raised <type>: message" or "returned". The test asserts that the
subprocess exited normally, that every exception is a ValueError / TypeError / RuntimeError /
IndexError whose message names the offending argument, and that every call that returned is
one of DEFINED_BEHAVIOUR below.

    python tests/test_fuzz_malformed.py 5000 1     # a longer run by hand: calls, seed
"""
import json
import math
import os
import random
import re
import subprocess
import sys

CALLS = int(os.environ.get("FLASHATTN_FUZZ_MALFORMED_CALLS", 5000))
SEED = 34

ALLOWED_EXCEPTIONS = {"ValueError", "TypeError", "RuntimeError", "IndexError"}

# Mutations that return, and why that is defined behaviour.
DEFINED_BEHAVIOUR = {
    "q_is_k_is_v": "the same tensor as q, k and v: read-only inputs may alias (self-attention)",
    "scale_nan": "softmax_scale NaN multiplies the scores, as F.sdpa's scale: NaN out",
    "scale_inf": "softmax_scale +-inf multiplies the scores (IEEE), as F.sdpa's scale does",
    "scale_huge": "any finite softmax_scale is a scale (F.sdpa takes it too)",
    "softcap_negative": "softcap <= 0 means no softcap (FA2's convention)",
    "window_huge": "a window wider than the sequence is the unbounded window",
    "window_below_minus_one": "any negative window side is unbounded (FA2 clamps it the same way)",
    "max_seqlen_larger": "max_seqlen is an upper bound (FA2)",
    "num_splits_huge": "num_splits is clamped to the keys' tiles",
    "cache_seqlens_int": "cache_seqlens as a Python int is FA2's",
    "block_table_entries_unread": "only the entries a sequence reads are checked: the others "
                                  "are padding, as in FA2 (here every sequence is empty)",
    "scale_negative": "a negative scale is a scale",
    "softcap_huge": "a softcap far above the scores changes nothing measurable",
    "flags_strings": "causal and deterministic are truth values, as in FA2 (Python's truthiness)",
    "attn_mask_strided_last_dim": "the mask is read through its strides, any of them",
    "qkv_all_meta": "all inputs on the meta device: shapes only, as every torch op on meta",
    "kv_cache_packed": "k_cache, v_cache = kv[:, :, 0], kv[:, :, 1] of one packed cache: views "
                       "of one storage that share no element (FA2's MHA passes them so)",
    "k_cache_is_v_cache_no_append": "one tensor as k_cache and v_cache without an append: both "
                                    "are only read",
}


# ---------------------------------------------------------------------------- the subprocess

def _worker(calls, seed):
    import torch

    import flashattn

    rng = random.Random(seed)
    torch.manual_seed(seed)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, dtype=dtype)

    def noncontig_last(x):
        return torch.randn(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)[..., ::2]

    def dense():
        b, sq, sk, h, hk, d = 2, rng.choice([1, 5, 65]), rng.choice([1, 7, 129]), 4, 2, 16
        return dict(q=t(b, sq, h, d), k=t(b, sk, hk, d), v=t(b, sk, hk, d))

    def bad_tensor(x, kind):
        """x mutated by kind, the mutation's name."""
        if kind == "dtype_int":
            return x.to(torch.int32)
        if kind == "dtype_complex":
            return x.to(torch.complex64)
        if kind == "dtype_bool":
            return x > 0
        if kind == "meta":
            return x.to("meta")
        if kind == "rank_up":
            return x.unsqueeze(0)
        if kind == "rank_down":
            return x[0]
        if kind == "noncontig_last":
            return noncontig_last(x)
        if kind == "head_dim":
            return torch.randn(*x.shape[:-1], x.shape[-1] + 1)
        if kind == "heads":
            return torch.randn(*x.shape[:-2], x.shape[-2] + 1, x.shape[-1])
        if kind == "seqlen":
            return torch.randn(x.shape[0], x.shape[1] + 1, *x.shape[2:])
        if kind == "batch":
            return torch.randn(x.shape[0] + 1, *x.shape[1:])
        if kind == "other_float":
            return x.to(torch.float16 if x.dtype != torch.float16 else torch.float32)
        if kind == "not_tensor":
            return x.tolist() if x.numel() < 64 else 3.0
        raise AssertionError(kind)

    TENSOR_KINDS = ["dtype_int", "dtype_complex", "dtype_bool", "meta", "rank_up", "rank_down",
                    "noncontig_last", "head_dim", "heads", "seqlen", "batch", "other_float",
                    "not_tensor"]
    SCALARS = {"nan": math.nan, "inf": math.inf, "neg_inf": -math.inf, "huge": 1e308,
               "negative": -0.5, "string": "0.5", "tensor2": torch.tensor([1.0, 2.0]),
               "none_like": [], "complex": 1j}

    def scalar_case(fn_name, arg, caller_arg, call):
        kind = rng.choice(list(SCALARS))
        value = SCALARS[kind]
        return call, {arg: value}, f"{caller_arg}_{kind}", [caller_arg]

    # Each generator returns (function, args, kwargs, mutation, names the error may cite).
    def gen_func():
        fn = flashattn.flash_attn_func
        a = dense()
        choice = rng.randrange(6)
        if choice == 0:
            name = rng.choice("qkv")
            # v's head dim may differ from q's and k's (MLA): not a malformed call.
            kind = rng.choice([k for k in TENSOR_KINDS if not (name == "q" and k == "seqlen")
                               and not (name == "v" and k == "head_dim")])
            a[name] = bad_tensor(a[name], kind)
            names = [name] + ({"heads": ["q", "k", "v", "key/value heads"], "seqlen": ["k", "v"],
                               "batch": ["q", "k", "v"], "head_dim": ["q", "k", "v"],
                               "other_float": ["q", "k", "v"]}.get(kind, []))
            return fn, [a["q"], a["k"], a["v"]], {}, f"{name}_{kind}", names
        if choice == 1:
            arg = rng.choice(["softmax_scale", "softcap", "dropout_p"])
            kind = rng.choice(list(SCALARS))
            mutation = {("softmax_scale", "nan"): "scale_nan", ("softmax_scale", "inf"): "scale_inf",
                        ("softmax_scale", "neg_inf"): "scale_inf",
                        ("softmax_scale", "huge"): "scale_huge",
                        ("softmax_scale", "negative"): "scale_negative",
                        ("softcap", "negative"): "softcap_negative"}.get((arg, kind),
                                                                          f"{arg}_{kind}")
            return fn, [a["q"], a["k"], a["v"]], {arg: SCALARS[kind]}, mutation, [arg]
        if choice == 2:
            window, mutation = rng.choice([((1, 2, 3), "window_len3"), ((0.5, 1), "window_float"),
                                           ("ab", "window_str"), ((2**40, 0), "window_huge"),
                                           ((-2, 0), "window_below_minus_one"),
                                           (torch.tensor([1.0, 2.0]), "window_float_tensor"),
                                           (5, "window_int"), (None, "window_none")])
            return fn, [a["q"], a["k"], a["v"]], {"window_size": window}, mutation, ["window_size"]
        if choice == 3:
            slopes, mutation = rng.choice([
                (torch.rand(4, dtype=torch.float16), "alibi_fp16"),
                (torch.rand(4, dtype=torch.float64), "alibi_fp64"),
                (torch.rand(5), "alibi_wrong_heads"), (torch.rand(3, 4), "alibi_wrong_batch"),
                (torch.rand(2, 4, 1), "alibi_rank3"), (torch.rand(4, device="meta"), "alibi_meta"),
                (torch.arange(4), "alibi_int")])
            return fn, [a["q"], a["k"], a["v"]], {"alibi_slopes": slopes}, mutation, ["alibi_slopes"]
        if choice == 4:
            return fn, [a["q"], a["q"], a["q"]], {}, "q_is_k_is_v", []
        return fn, [a["q"], a["k"], a["v"]], {"deterministic": "yes", "causal": "no"}, \
            "flags_strings", ["deterministic", "causal"]

    def gen_packed():
        if rng.random() < 0.5:
            fn, good = flashattn.flash_attn_qkvpacked_func, t(2, 9, 3, 2, 16)
            bad, mutation = rng.choice([
                (t(2, 9, 2, 2, 16), "qkv_wrong_count"), (t(9, 3, 2, 16), "qkv_rank4"),
                (good.to(torch.int32), "qkv_int"), (good.to("meta"), "qkv_all_meta"),
                (noncontig_last(good), "qkv_noncontig_last"), ("qkv", "qkv_string")])
            return fn, [bad], {}, mutation, ["qkv", "q", "k", "v"]
        fn = flashattn.flash_attn_kvpacked_func
        q, good = t(2, 9, 4, 16), t(2, 9, 2, 2, 16)
        bad = rng.choice([t(2, 9, 3, 2, 16), t(9, 2, 2, 16), good.to("meta"), noncontig_last(good),
                          t(2, 9, 2, 3, 16), t(2, 9, 2, 2, 8)])
        return fn, [q, bad], {}, "kv_malformed", ["kv", "k", "v", "q", "key/value heads"]

    def varlen_base():
        lengths = [rng.choice([0, 1, 5, 65]) for _ in range(3)]
        total = sum(lengths)
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return dict(q=t(total, 4, 16), k=t(total, 2, 16), v=t(total, 2, 16), cu=cu,
                    max_s=max(lengths), total=total)

    def gen_varlen():
        fn = flashattn.flash_attn_varlen_func
        a = varlen_base()
        args = [a["q"], a["k"], a["v"], a["cu"], a["cu"].clone(), a["max_s"], a["max_s"]]
        kwargs = {}
        choice = rng.randrange(5)
        which = rng.choice([3, 4])
        cu_name = "cu_seqlens_q" if which == 3 else "cu_seqlens_k"
        if choice == 0:
            cu = a["cu"]
            bad, mutation = rng.choice([
                # (all sequences empty: cu is all 0 and its flip is cu itself)
                (cu.flip(0) if a["total"] else torch.tensor([0, 2, 1, 1], dtype=torch.int32),
                 "cu_decreasing"), (cu.long(), "cu_int64"), (cu.float(), "cu_float"),
                (cu + 1, "cu_not_from_zero"), (torch.cat([cu[:-1], cu[-1:] + 1000]), "cu_out_of_range"),
                (cu[None], "cu_rank2"), (cu.to("meta"), "cu_meta"), (cu[:-1], "cu_wrong_batch"),
                (torch.tensor([0, -5, 3, 3], dtype=torch.int32), "cu_negative"),
                (torch.tensor([0, 2**31 - 1, 2**31 - 1, 2**31 - 1], dtype=torch.int32), "cu_huge"),
                (cu.tolist(), "cu_list")])
            args[which] = bad
            return fn, args, kwargs, mutation, [cu_name, "cu_seqlens"]
        if choice == 1:
            idx = rng.choice([5, 6])
            name = "max_seqlen_q" if idx == 5 else "max_seqlen_k"
            value, mutation = rng.choice([(-1, "max_seqlen_negative"), (1.5, "max_seqlen_float"),
                                          (None, "max_seqlen_none"), ("7", "max_seqlen_str"),
                                          (a["max_s"] + 100, "max_seqlen_larger"),
                                          (2**40, "max_seqlen_huge")])
            args[idx] = value
            return fn, args, kwargs, mutation, [name]
        if choice == 2:
            name = rng.choice(["seqused_q", "seqused_k"])
            value, mutation = rng.choice([
                (torch.tensor([1, 1, 1], dtype=torch.int64), "seqused_int64"),
                (torch.tensor([1, 1], dtype=torch.int32), "seqused_wrong_batch"),
                (torch.tensor([-1, 0, 0], dtype=torch.int32), "seqused_negative"),
                (torch.tensor([1000, 0, 0], dtype=torch.int32), "seqused_too_long"),
                (torch.zeros(3, 1, dtype=torch.int32), "seqused_rank2"),
                (torch.zeros(3, dtype=torch.int32, device="meta"), "seqused_meta")])
            kwargs[name] = value
            return fn, args, kwargs, mutation, [name]
        if choice == 3:
            name = rng.choice("qkv")
            kind = rng.choice(["dtype_int", "meta", "rank_up", "noncontig_last", "other_float"]
                              + (["head_dim"] if name != "v" else []))  # v's may differ (MLA)
            i = "qkv".index(name)
            args[i] = bad_tensor(args[i], kind)
            return fn, args, kwargs, f"varlen_{name}_{kind}", [name, "q", "k", "v"]
        # paged
        page = rng.choice([1, 4, 16])
        blocks = -(-max(a["max_s"], 1) // page)
        k_cache, v_cache = t(3 * blocks + 1, page, 2, 16), t(3 * blocks + 1, page, 2, 16)
        table = torch.randperm(3 * blocks)[:3 * blocks].view(3, blocks).to(torch.int32)
        bad, mutation = rng.choice([
            (table + 1000, "block_table_out_of_range"), (table - 1000, "block_table_negative"),
            (table.long(), "block_table_int64"), (table[:2], "block_table_wrong_batch"),
            (table[0], "block_table_rank1"), (table.to("meta"), "block_table_meta"),
            (table[:, :0], "block_table_too_few_blocks")])
        if a["max_s"] == 0 and mutation in ("block_table_out_of_range", "block_table_negative",
                                            "block_table_too_few_blocks"):
            mutation = "block_table_entries_unread"  # every sequence is empty
        args = [a["q"], k_cache, v_cache, a["cu"], a["cu"].clone(), a["max_s"], a["max_s"]]
        kwargs["block_table"] = bad
        return fn, args, kwargs, mutation, ["block_table"]

    def gen_kvcache():
        fn = flashattn.flash_attn_with_kvcache
        b, cap, new = 2, 16, rng.choice([0, 1, 3])
        q = t(b, 1, 4, 16)
        k_cache, v_cache = t(b, cap, 2, 16), t(b, cap, 2, 16)
        kwargs = dict(cache_seqlens=torch.tensor([3, 5], dtype=torch.int32))
        if new:
            kwargs.update(k=t(b, new, 2, 16), v=t(b, new, 2, 16))
        choice = rng.randrange(6)
        if choice == 0:
            value, mutation = rng.choice([
                (torch.tensor([3, cap + 1], dtype=torch.int32), "cache_seqlens_beyond_capacity"),
                (torch.tensor([-1, 2], dtype=torch.int32), "cache_seqlens_negative"),
                (torch.tensor([3, 5], dtype=torch.int64), "cache_seqlens_int64"),
                (torch.tensor([3], dtype=torch.int32), "cache_seqlens_wrong_batch"),
                (torch.tensor([3.0, 5.0]), "cache_seqlens_float"),
                (4, "cache_seqlens_int"), (cap + 5, "cache_seqlens_int_too_big"),
                (torch.tensor([3, 5], dtype=torch.int32, device="meta"), "cache_seqlens_meta")])
            if mutation == "cache_seqlens_beyond_capacity" and not new:
                value = torch.tensor([3, cap + 1], dtype=torch.int32)
            kwargs["cache_seqlens"] = value
            return fn, [q, k_cache, v_cache], kwargs, mutation, ["cache_seqlens"]
        if choice == 1:
            value, mutation = rng.choice([
                (torch.tensor([0, 2], dtype=torch.int32), "cache_batch_idx_out_of_range"),
                (torch.tensor([0, -1], dtype=torch.int32), "cache_batch_idx_negative"),
                (torch.tensor([0, 1], dtype=torch.int64), "cache_batch_idx_int64"),
                (torch.tensor([0], dtype=torch.int32), "cache_batch_idx_wrong_batch")])
            kwargs["cache_batch_idx"] = value
            return fn, [q, k_cache, v_cache], kwargs, mutation, ["cache_batch_idx"]
        if choice == 2:
            value, mutation = rng.choice([
                (torch.tensor([10, 0], dtype=torch.int32), "cache_leftpad_beyond_seqlens"),
                (torch.tensor([-1, 0], dtype=torch.int32), "cache_leftpad_negative"),
                (torch.tensor([0, 0], dtype=torch.int64), "cache_leftpad_int64"),
                (torch.tensor([0], dtype=torch.int32), "cache_leftpad_wrong_batch")])
            kwargs["cache_leftpad"] = value
            return fn, [q, k_cache, v_cache], kwargs, mutation, ["cache_leftpad", "cache_seqlens"]
        if choice == 3:
            page = 4
            kc, vc = t(9, page, 2, 16), t(9, page, 2, 16)
            table = torch.randperm(8)[:8].view(2, 4).to(torch.int32)
            value, mutation = rng.choice([
                (table + 100, "kv_block_table_out_of_range"), (table - 100, "kv_block_table_negative"),
                (table.long(), "kv_block_table_int64"), (table[:1], "kv_block_table_wrong_batch"),
                (table[:, :1], "kv_block_table_too_short")])
            kwargs["block_table"] = value
            names = ["block_table"] + (["cache_seqlens"] if mutation == "kv_block_table_too_short"
                                       else [])
            return fn, [q, kc, vc], kwargs, mutation, names
        if choice == 4:
            mutation = rng.choice(["kvcache_k_meta", "kvcache_rotary_cos_meta",
                                   "kvcache_alibi_slopes_meta", "kvcache_cache_batch_idx_meta",
                                   "kvcache_cache_leftpad_meta", "k_cache_is_v_cache", "alias_views",
                                   "alias_views", "k_without_v", "k_new_wrong_heads",
                                   "k_new_aliases_cache", "rotary_without_k",
                                   "rotary_wrong_shape", "num_splits_negative",
                                   "num_splits_float", "num_splits_huge"])
            if mutation.endswith("_meta"):
                name = mutation[len("kvcache_"):-len("_meta")]
                kwargs.update(k=t(b, 1, 2, 16), v=t(b, 1, 2, 16))
                kwargs[name] = {"k": kwargs["k"], "rotary_cos": t(cap, 4),
                                "alibi_slopes": torch.rand(4),
                                "cache_batch_idx": torch.tensor([1, 0], dtype=torch.int32),
                                "cache_leftpad": torch.tensor([0, 1], dtype=torch.int32)}[name]
                if name == "rotary_cos":
                    kwargs["rotary_sin"] = t(cap, 4)
                kwargs[name] = kwargs[name].to("meta")
                return fn, [q, k_cache, v_cache], kwargs, mutation, [name]
            if mutation == "k_cache_is_v_cache":
                kwargs.update(k=t(b, 1, 2, 16), v=t(b, 1, 2, 16))
                return fn, [q, k_cache, k_cache], kwargs, mutation, ["k_cache", "v_cache"]
            if mutation == "alias_views":
                # Tensors the append reads or writes sharing memory with a cache, through views.
                buf = t(b, 2 * cap, 2, 16)
                kwargs.update(k=t(b, 1, 2, 16), v=t(b, 1, 2, 16))
                kind = rng.choice(["caches_overlap", "v_cache_slice_of_k_cache", "q_in_k_cache",
                                   "v_new_in_k_cache", "k_new_in_v_cache", "rotary_in_cache",
                                   "caches_transposed_overlap", "duplicate_batch_idx",
                                   "duplicate_block", "batch_idx_into_read_rows",
                                   "block_into_read_rows", "kv_cache_packed",
                                   "k_cache_is_v_cache_no_append"])
                names = {"caches_overlap": ["k_cache", "v_cache"],
                         "caches_transposed_overlap": ["k_cache", "v_cache"],
                         "v_cache_slice_of_k_cache": ["k_cache", "v_cache"],
                         "q_in_k_cache": ["q", "k_cache"], "v_new_in_k_cache": ["v", "k_cache"],
                         "k_new_in_v_cache": ["k", "v_cache"],
                         "rotary_in_cache": ["rotary_cos", "rotary_sin", "k_cache"],
                         "duplicate_batch_idx": ["cache_batch_idx"],
                         "duplicate_block": ["block_table"],
                         "batch_idx_into_read_rows": ["cache_batch_idx"],
                         "block_into_read_rows": ["block_table"]}.get(kind, [])
                kc, vc, qq = k_cache, v_cache, q
                if kind == "caches_overlap":
                    kc, vc = buf[:, :cap], buf[:, cap // 2:cap // 2 + cap]
                elif kind == "caches_transposed_overlap":
                    square = t(b, cap, cap, 16)
                    kc, vc = square[:, :, :2], square[:, :2].transpose(1, 2)
                elif kind == "v_cache_slice_of_k_cache":
                    kc, vc = buf[:, :cap], buf[:, :cap, :, :16]
                elif kind == "q_in_k_cache":
                    kc = t(b, cap, 4, 16)
                    qq, kc = kc[:, 10:11], kc[:, :, :2]
                elif kind == "v_new_in_k_cache":
                    kwargs["v"] = k_cache[:, 14:15]
                elif kind == "k_new_in_v_cache":
                    kwargs["k"] = v_cache[:, 3:4]
                elif kind == "rotary_in_cache":
                    flat = t(b * cap * 2 * 16)
                    kc = flat.view(b, cap, 2, 16)
                    kwargs.update(rotary_cos=flat[:64].view(cap, 4), rotary_sin=t(cap, 4))
                elif kind == "duplicate_batch_idx":
                    kwargs["cache_batch_idx"] = torch.tensor([1, 1], dtype=torch.int32)
                    kwargs["cache_seqlens"] = torch.tensor([3, 3], dtype=torch.int32)
                elif kind == "duplicate_block":
                    kc, vc = t(8, 4, 2, 16), t(8, 4, 2, 16)
                    kwargs["block_table"] = torch.tensor([[0, 1, 2, 3], [4, 1, 5, 6]],
                                                         dtype=torch.int32)
                    kwargs["cache_seqlens"] = torch.tensor([5, 5], dtype=torch.int32)
                elif kind == "batch_idx_into_read_rows":
                    # Sequence 0 appends at row 3 of entry 1, which holds sequence 1's key 3.
                    kwargs["cache_batch_idx"] = torch.tensor([1, 1], dtype=torch.int32)
                    kwargs["cache_seqlens"] = torch.tensor([3, 5], dtype=torch.int32)
                elif kind == "block_into_read_rows":
                    # Sequence 0 appends at row 1 of block 1, which holds sequence 1's key 5.
                    kc, vc = t(8, 4, 2, 16), t(8, 4, 2, 16)
                    kwargs["block_table"] = torch.tensor([[0, 1, 2, 3], [4, 1, 5, 6]],
                                                         dtype=torch.int32)
                    kwargs["cache_seqlens"] = torch.tensor([5, 7], dtype=torch.int32)
                elif kind == "kv_cache_packed":
                    kv = t(b, cap, 2, 2, 16)
                    kc, vc = kv[:, :, 0], kv[:, :, 1]
                else:  # k_cache_is_v_cache_no_append
                    kwargs.pop("k"), kwargs.pop("v")
                    vc = kc
                return fn, [qq, kc, vc], kwargs, kind, names
            if mutation == "k_without_v":
                kwargs.update(k=t(b, 1, 2, 16), v=None)
                return fn, [q, k_cache, v_cache], kwargs, mutation, ["k", "v"]
            if mutation == "k_new_wrong_heads":
                kwargs.update(k=t(b, 1, 3, 16), v=t(b, 1, 3, 16))
                return fn, [q, k_cache, v_cache], kwargs, mutation, ["k", "v", "k_cache"]
            if mutation == "k_new_aliases_cache":
                kwargs.update(k=k_cache[:, 4:5], v=v_cache[:, 4:5])
                return fn, [q, k_cache, v_cache], kwargs, mutation, ["k", "k_cache"]
            if mutation == "rotary_without_k":
                kwargs.pop("k", None), kwargs.pop("v", None)
                kwargs.update(rotary_cos=t(cap, 4), rotary_sin=t(cap, 4))
                return fn, [q, k_cache, v_cache], kwargs, mutation, ["rotary_cos", "rotary_sin", "k"]
            if mutation == "rotary_wrong_shape":
                kwargs.update(k=t(b, 1, 2, 16), v=t(b, 1, 2, 16), rotary_cos=t(cap, 20),
                              rotary_sin=t(cap, 20))
                return fn, [q, k_cache, v_cache], kwargs, mutation, ["rotary_cos", "rotary_sin"]
            kwargs["num_splits"] = {"num_splits_negative": -3, "num_splits_float": 1.5,
                                    "num_splits_huge": 2**31 - 1}[mutation]
            return fn, [q, k_cache, v_cache], kwargs, mutation, ["num_splits"]
        name = rng.choice(["q", "k_cache", "v_cache"])
        kind = rng.choice(["dtype_int", "meta", "rank_up", "rank_down", "noncontig_last", "heads",
                           "other_float", "batch"]
                          + (["head_dim"] if name != "v_cache" else []))  # v's may differ (MLA)
        args = [q, k_cache, v_cache]
        i = ["q", "k_cache", "v_cache"].index(name)
        args[i] = bad_tensor(args[i], kind)
        return fn, args, kwargs, f"kvcache_{name}_{kind}", [name, "q", "k_cache", "v_cache", "k", "v",
                                                            "key/value heads", "cache_seqlens"]

    def gen_sdpa():
        fn = flashattn.scaled_dot_product_attention
        q, k, v = t(2, 4, 5, 16), t(2, 4, 7, 16), t(2, 4, 7, 16)
        choice = rng.randrange(4)
        if choice == 0:
            mask, mutation = rng.choice([
                (torch.ones(2, 4, 5, 8, dtype=torch.bool), "attn_mask_wrong_shape"),
                (torch.ones(5, 7, dtype=torch.int32), "attn_mask_int"),
                (torch.ones(1, 1, 1, 1, 5, 7, dtype=torch.bool), "attn_mask_rank6"),
                (torch.ones(2, 4, 5, 7, dtype=torch.bool, device="meta"), "attn_mask_meta"),
                (torch.ones(2, 4, 5, 7, dtype=torch.float16), "attn_mask_other_float"),
                (noncontig_last(torch.ones(2, 4, 5, 7)), "attn_mask_strided_last_dim")])
            return fn, [q, k, v], {"attn_mask": mask}, mutation, ["attn_mask"]
        if choice == 1:
            arg = rng.choice(["scale", "dropout_p"])
            kind = rng.choice(list(SCALARS))
            mutation = {("scale", "nan"): "scale_nan", ("scale", "inf"): "scale_inf",
                        ("scale", "neg_inf"): "scale_inf", ("scale", "huge"): "scale_huge",
                        ("scale", "negative"): "scale_negative"}.get((arg, kind), f"sdpa_{arg}_{kind}")
            return fn, [q, k, v], {arg: SCALARS[kind]}, mutation, [arg]
        if choice == 2:
            bads = [("sdpa_mask_and_causal", [q, k, v], dict(attn_mask=torch.ones(5, 7, dtype=torch.bool), is_causal=True), ["attn_mask", "is_causal"]),
                    ("sdpa_gqa_without_flag", [q, k[:, :2], v[:, :2]], {}, ["enable_gqa", "key", "query"]),
                    ("sdpa_query_rank3", [q[0], k, v], {}, ["query"]),
                    ("sdpa_mask_wrong_heads", [q, k, v], dict(attn_mask=torch.ones(3, 5, 7) > 0), ["attn_mask"]),
                    ("sdpa_value_rank5", [q, k, v[None]], {}, ["value"])]
            mutation, args, kwargs, names = rng.choice(bads)
            return fn, args, kwargs, mutation, names
        name = rng.choice(["query", "key", "value"])
        kind = rng.choice(["dtype_int", "dtype_complex", "meta", "noncontig_last", "other_float",
                           "batch"] + (["heads", "seqlen"] if name != "query" else [])
                          + (["head_dim"] if name != "value" else []))  # value's may differ (MLA)
        args = [q, k, v]
        i = ["query", "key", "value"].index(name)
        # bad_tensor's dims are FA2's (B, S, H, D); SDPA's are (B, H, S, D).
        x = args[i].transpose(1, 2) if kind in ("heads", "seqlen") else args[i]
        x = bad_tensor(x, kind)
        args[i] = x.transpose(1, 2) if kind in ("heads", "seqlen") else x
        names = [name] + {"batch": ["query"], "head_dim": ["query"], "other_float": ["query"],
                          "heads": ["key", "value", "query"], "seqlen": ["key", "value"]
                          }.get(kind, [])
        return fn, args, {}, f"sdpa_{name}_{kind}", names

    generators = [gen_func, gen_packed, gen_varlen, gen_kvcache, gen_sdpa]
    for i in range(calls):
        fn, args, kwargs, mutation, names = rng.choice(generators)()
        record = dict(i=i, fn=fn.__name__, mutation=mutation, names=names)
        print(json.dumps(dict(record, outcome="calling")), flush=True)
        try:
            fn(*args, **kwargs)
            record["outcome"] = "returned"
        except Exception as e:  # noqa: BLE001 - the point is to record what it raised
            record.update(outcome="raised", type=type(e).__name__,
                          message=str(e).splitlines()[0][:400] if str(e) else "")
        print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------- the test

# scaled_dot_product_attention's errors name its own arguments (query, key, value, attn_mask,
# dropout_p, is_causal, scale, enable_gqa), never the op's or FA2's.
FA2_NAMES = re.compile(r"(?<![A-Za-z0-9_'.])(q|k|v|softmax_scale|window_size|flashattn)"
                       r"(?![A-Za-z0-9_(])|(?<![A-Za-z0-9_])causal\s*=")

def names_argument(message, names):
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message)
               for n in names)


def run_fuzzer(calls, seed):
    env = dict(os.environ, FLASHATTN_POISON_OUTPUTS="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(calls), str(seed)],
                          capture_output=True, text=True, timeout=600, env=env)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, records


def test_malformed_calls_raise_clear_python_errors_and_never_crash():
    proc, records = run_fuzzer(CALLS, SEED)
    last = records[-1] if records else None
    assert proc.returncode == 0, (
        f"the fuzzer's process died (exit {proc.returncode}"
        f"{', signal ' + str(-proc.returncode) if proc.returncode < 0 else ''}) during "
        f"{last}\nstderr: {proc.stderr[-3000:]}")
    finished = [r for r in records if r["outcome"] != "calling"]
    assert len(finished) == CALLS, f"{len(finished)} of {CALLS} calls reported"
    problems = []
    for r in finished:
        if r["outcome"] == "returned":
            if r["mutation"] not in DEFINED_BEHAVIOUR:
                problems.append(("returned without error", r))
        elif r["type"] not in ALLOWED_EXCEPTIONS:
            problems.append(("not a ValueError/TypeError/RuntimeError/IndexError", r))
        elif not names_argument(r["message"], r["names"]):
            problems.append((f"message names none of {r['names']}", r))
        elif r["fn"] == "scaled_dot_product_attention" and FA2_NAMES.search(r["message"]):
            problems.append(("an SDPA error in FA2's names", r))
    # One line per distinct problem (the call's index aside).
    unique = sorted({f"{what}: " + json.dumps({k: v for k, v in r.items() if k != "i"})
                     for what, r in problems})
    assert not unique, f"{len(problems)} of {CALLS} malformed calls misbehaved:\n" + "\n".join(unique)

if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]))
