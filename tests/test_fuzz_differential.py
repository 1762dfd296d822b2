"""Differential fuzzing (issue 34, first stage, CPU executor): Hypothesis draws calls from the
argument space of the public functions -- flash_attn_func, the packed functions,
scaled_dot_product_attention, flash_attn_varlen_func (plain, packed, paged) and
flash_attn_with_kvcache (dense and paged) -- and each result, forward and backward, is compared
with the float64 reference by the project's tolerance rule (tolerance.py).

Drawn: shapes including 0 and 1 and lengths around the CPU tiles' edges (128 rows / keys
forward, 64 queries / 128 keys backward), Sq != Sk both ways, GQA ratios, views with arbitrary
strides on every dim but the last (padding, and any order of the other dims in memory), every
CPU dtype, and every feature combination the support table allows (causal, window, softcap,
ALiBi, dropout checked against the kernels' own keep mask, scale, attn_mask, seqused,
zero-length sequences, deterministic, num_splits, cache_batch_idx, cache_leftpad).

CI runs a fixed, derandomized budget. A long campaign (fresh random examples):

    FLASHATTN_FUZZ_EXAMPLES=100000 python -m pytest tests/test_fuzz_differential.py -p no:cacheprovider

KV-cache appends are drawn with rotary embeddings too (interleaved or not, any rotary_dim): the
reference rotates q and the new keys in float64, the yardstick in the inputs' dtype.

The same draws (smaller sizes, the CUDA kernels' dtypes) run on the shim:
test_cudasim_fuzz_differential.py.
"""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashattn
from flashattn._reference import attention_reference, attention_scores
from tolerance import assert_within_torch_error, max_abs_error

_EXAMPLES = os.environ.get("FLASHATTN_FUZZ_EXAMPLES")
settings.register_profile(
    "flashattn-ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=list(HealthCheck))
settings.register_profile(
    "flashattn-campaign", max_examples=int(_EXAMPLES or 1000), derandomize=False, deadline=None,
    database=None, print_blob=True, suppress_health_check=list(HealthCheck))
PROFILE = "flashattn-campaign" if _EXAMPLES else "flashattn-ci"


def budget(ci_examples):
    """Examples per test: ci_examples in CI (fits ~90 s in all on 2 cores), else the campaign's."""
    return settings(settings.get_profile(PROFILE),
                    max_examples=int(_EXAMPLES) if _EXAMPLES else ci_examples)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Tile edges of the CPU kernels: 128 rows / keys forward, 64 queries / 128 keys backward.
LENGTHS = [0, 1, 2, 3, 7, 63, 64, 65, 127, 128, 129]
SHORT_LENGTHS = [0, 1, 2, 5, 17, 63, 64, 65]
HEAD_DIMS = [1, 2, 8, 16, 24, 32, 40, 64, 72, 128]


def to64(t):
    return t.detach().double()


@st.composite
def strided(draw, shape, dtype, generator):
    """A tensor of `shape` whose strides are arbitrary on every dim but the last (which stays
    contiguous): a slice of a padded buffer whose leading dims lie in memory in a drawn order."""
    lead = list(range(len(shape) - 1))
    order = draw(st.permutations(lead)) if lead else []
    pad = [draw(st.sampled_from([0, 0, 1, 3])) for _ in shape]
    padded = [n + p for n, p in zip(shape, pad)]
    buffer = torch.randn([padded[d] for d in order] + [padded[-1]], generator=generator,
                         dtype=torch.float64).to(dtype)
    inverse = [order.index(d) for d in lead] + [len(shape) - 1]
    view = buffer.permute(inverse)
    return view[tuple(slice(0, n) for n in shape)]


def scale_draw(draw, head_dim):
    """A softmax scale that keeps the logits O(1) (std <= 2): with larger ones the gradients,
    recomputed from the float32 LSE (|LSE| * 2^-24 in the exponent), exceed the tolerance rule's
    3x PyTorch's error (reported, issue 34)."""
    return draw(st.sampled_from([-1.0, 0.0, 0.3, 1.0, 2.0])) / math.sqrt(head_dim)


def features(draw, head_dim, allow_dropout=True):
    """Mask features FA2's functions take, as keyword arguments of flash_attn_func."""
    kwargs = {}
    if draw(st.booleans()):
        kwargs["causal"] = True
    if draw(st.booleans()):
        kwargs["window_size"] = (draw(st.sampled_from([-1, 0, 1, 5, 64])),
                                 draw(st.sampled_from([-1, 0, 1, 5, 64])))
    if draw(st.booleans()):
        kwargs["softcap"] = draw(st.sampled_from([0.5, 5.0, 30.0]))
    if draw(st.booleans()):
        kwargs["softmax_scale"] = scale_draw(draw, head_dim)
    if allow_dropout and draw(st.integers(0, 3)) == 0:
        kwargs["dropout_p"] = draw(st.sampled_from([0.1, 0.5, 1.0]))
    return kwargs


def alibi(draw, batch, heads, generator):
    kind = draw(st.sampled_from([None, None, "heads", "batch_heads"]))
    if kind is None:
        return None
    shape = (heads,) if kind == "heads" else (batch, heads)
    # Small slopes keep |LSE| small: at |LSE| ~ 100+ the gradients, recomputed from the float32
    # LSE, exceed the tolerance rule (reported, issue 34).
    return draw(strided(shape + (1,), torch.float32, generator))[..., 0].abs() * 0.05


def reference_kwargs(kwargs, alibi_slopes, align_bottom_right=True):
    return dict(softmax_scale=kwargs.get("softmax_scale"), causal=kwargs.get("causal", False),
                window_size=kwargs.get("window_size", (-1, -1)), softcap=kwargs.get("softcap", 0.0),
                alibi_slopes=None if alibi_slopes is None else alibi_slopes.double(),
                align_bottom_right=align_bottom_right)


def keep_mask_of_next_call(q, p, batch, heads, seqlen_q, seqlen_k, seed):
    """The keep decisions the next call with dropout p will make: its rng_state is drawn from
    the default generator (seeded by the example, so that it replays), which is rewound after
    drawing it here."""
    torch.manual_seed(seed)
    state = torch.get_rng_state()
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    torch.set_rng_state(state)
    return torch.ops.flashattn.dropout_keep_mask(rng_state, p, batch, heads, seqlen_q, seqlen_k)


def reference_and_yardstick(q, k, v, dout, backward, **kwargs):
    """(out, lse, grads) of the float64 reference, and of the same in the inputs' dtype."""
    results = []
    for cast in (to64, lambda t: t.detach()):  # the reference, then the yardstick
        leaves = [cast(t).clone().requires_grad_(backward) for t in (q, k, v)]
        rk = dict(kwargs)
        if rk.get("attn_mask") is not None and rk["attn_mask"].is_floating_point():
            rk["attn_mask"] = rk["attn_mask"].to(leaves[0].dtype)
        if rk.get("alibi_slopes") is not None:
            rk["alibi_slopes"] = rk["alibi_slopes"].to(leaves[0].dtype)
        out, lse = attention_reference(*leaves, **rk)
        grads = None
        if backward:
            grads = torch.autograd.grad(out, leaves, dout.to(out.dtype), allow_unused=True)
            grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]
        results.append((out.detach(), lse.detach(), grads))
    return results


# attention_scores' arguments: what decides which keys a row sees.
SCORE_ARGUMENTS = {"softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
                   "align_bottom_right", "attn_mask"}


def one_visible_key_slack(q, k, v, dout, dropout_p=0.0, **ref_kwargs):
    """The rounding allowance for dQ and dK from rows that see exactly one key. Such a row's
    softmax is the constant 1, so its dS = P (dP - D) is 0 exactly and PyTorch gets 0 for it by
    structure: the tolerance rule's yardstick allows nothing there. The kernels (FA2's too)
    compute D = rowsum(dO * O) from O rounded to the output's dtype, and with dropout O = V / (1 - p)
    is not exact there, so dS is rounding noise: two dot products of dO_i with v, each within
    u * sum_d |dO_id v_d|, times q (for dK) or k (for dQ) and the scale, summed over those rows.
    ref_kwargs: attention_scores' mask arguments (softmax_scale, causal, window_size, softcap,
    alibi_slopes, align_bottom_right, attn_mask)."""
    if not (q.numel() and k.numel() and v.numel()):
        return 0.0
    scores = attention_scores(to64(q), to64(k), **{key: value for key, value in ref_kwargs.items()
                                                  if key in SCORE_ARGUMENTS})
    one_key = torch.isfinite(scores).sum(-1) == 1                   # (B, Hq, Sq)
    if not one_key.any():
        return 0.0
    dout_rows = dout.double().abs().sum(-1).transpose(1, 2)        # (B, Hq, Sq)
    scale = ref_kwargs.get("softmax_scale") or 1 / math.sqrt(q.shape[-1])
    keep_scale = 1.0 / (1.0 - dropout_p) if dropout_p < 1 else 1.0
    u = torch.finfo(q.dtype).eps
    operand = max(q.double().abs().max().item(), k.double().abs().max().item())
    return (4 * q.shape[-1] * u * keep_scale * abs(scale) * operand
            * v.double().abs().max().item() * dout_rows[one_key].sum().item())


def output_rounding_slack(q, k, out, ref_out, dout, **ref_kwargs):
    """(dQ's, dK's) allowance for the backward's D_i = rowsum(dO_i * O_i) taken from O as the
    forward returned it, rounded to its dtype (FlashAttention's design: FA2 and FA3 do the same).
    PyTorch's autograd gets D from the exact probabilities instead, and where its own rounding
    of a tiny result lands right by luck (one element, d = 1) the 3x rule allows less than that
    one rounding of O costs. The cost, exactly: D_i moves by delta_i = rowsum(dO_i * (O_i - O64_i)),
    so dS_ij = P_ij (dP_ij - D_i) moves by -P_ij delta_i, dQ_i by -scale delta_i sum_j P_ij K_j and
    dK_j by -scale sum_i P_ij delta_i Q_i (P before dropout; softcap's factor, at most 1, left
    out). ref_kwargs: attention_scores' mask arguments, as for one_visible_key_slack."""
    if not (q.numel() and k.numel() and out.numel()):
        return 0.0, 0.0
    q64, k64 = to64(q), to64(k)
    scores = attention_scores(q64, k64, **{key: value for key, value in ref_kwargs.items()
                                          if key in SCORE_ARGUMENTS})     # (B, Hq, Sq, Sk)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    delta = (dout.double() * (out.detach().double() - ref_out.double())).sum(-1)  # (B, Sq, Hq)
    weighted = probs * delta.transpose(1, 2)[..., None]
    scale = ref_kwargs.get("softmax_scale") or 1 / math.sqrt(q.shape[-1])
    heads, heads_kv = q.shape[2], k.shape[2]
    group = heads // heads_kv if heads_kv else 1
    d_dq = abs(scale) * weighted @ k64.transpose(1, 2).repeat_interleave(group, dim=1)
    d_dk = abs(scale) * weighted.transpose(-1, -2) @ q64.transpose(1, 2)   # (B, Hq, Sk, D)
    d_dk = d_dk.unflatten(1, (heads_kv, group)).sum(2)                    # (B, Hkv, Sk, D)
    return d_dq.abs().max().item(), d_dk.abs().max().item()


def worse(ref, a, b):
    """Of two yardsticks, the one farther from the reference."""
    return a if max_abs_error(a, ref) >= max_abs_error(b, ref) else b


def compare(name, got, ref, low, factor=2.0, slack=0.0):
    assert_within_torch_error(name, got.detach(), ref, low.to(got.dtype) if
                              low.dtype != got.dtype else low, factor=factor, slack=slack)


# ---- dense: flash_attn_func, the packed functions, scaled_dot_product_attention ----

@st.composite
def dense_calls(draw, dtypes=DTYPES, lengths=LENGTHS, head_dims=HEAD_DIMS):
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    fn = draw(st.sampled_from(["func", "kvpacked", "qkvpacked", "sdpa"]))
    dtype = draw(st.sampled_from(dtypes))
    batch = draw(st.sampled_from([0, 1, 1, 2, 3]))
    heads_kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from(head_dims))
    seqlen_q = draw(st.sampled_from(lengths))
    seqlen_k = seqlen_q if fn == "qkvpacked" else draw(st.sampled_from(lengths))
    if fn == "qkvpacked":
        group = 1
    heads = heads_kv * group
    # float64 gradients are recomputed from the float32 LSE (README, Limitations), which the
    # float64 yardstick cannot allow for: left out, as in test_backward.py.
    backward = dtype != torch.float64 and draw(st.booleans())
    if fn == "sdpa":
        kwargs = {}
        if draw(st.booleans()):
            kwargs["softmax_scale"] = scale_draw(draw, head_dim)
        if draw(st.integers(0, 3)) == 0:
            kwargs["dropout_p"] = draw(st.sampled_from([0.1, 0.5]))
        mask = draw(st.sampled_from([None, "causal", "bool", "float"]))
    else:
        kwargs = features(draw, head_dim)
        mask = None
        kwargs["deterministic"] = draw(st.booleans())
    slopes = None if fn == "sdpa" else alibi(draw, batch, heads, gen)
    # q (B, Sq, H, D); k, v (B, Sk, Hkv, D): views of arbitrary strides, packed ones read in place.
    if fn == "qkvpacked":
        qkv = draw(strided((batch, seqlen_q, 3, heads, head_dim), dtype, gen))
        tensors = [qkv]
        q, k, v = qkv.unbind(2)
    elif fn == "kvpacked":
        q = draw(strided((batch, seqlen_q, heads, head_dim), dtype, gen))
        kv = draw(strided((batch, seqlen_k, 2, heads_kv, head_dim), dtype, gen))
        tensors = [q, kv]
        k, v = kv.unbind(2)
    elif fn == "sdpa":
        qs = draw(strided((batch, heads, seqlen_q, head_dim), dtype, gen))
        ks = draw(strided((batch, heads_kv, seqlen_k, head_dim), dtype, gen))
        vs = draw(strided((batch, heads_kv, seqlen_k, head_dim), dtype, gen))
        tensors = [qs, ks, vs]
        q, k, v = (t.transpose(1, 2) for t in tensors)
    else:
        q = draw(strided((batch, seqlen_q, heads, head_dim), dtype, gen))
        k = draw(strided((batch, seqlen_k, heads_kv, head_dim), dtype, gen))
        v = draw(strided((batch, seqlen_k, heads_kv, head_dim), dtype, gen))
        tensors = [q, k, v]
    attn_mask = None
    if mask in ("bool", "float"):
        shape = [n if draw(st.booleans()) else 1 for n in (batch, heads, seqlen_q, seqlen_k)]
        if mask == "bool":
            attn_mask = torch.rand(shape, generator=gen) < draw(st.sampled_from([0.1, 0.5, 0.9]))
        else:
            mdtype = draw(st.sampled_from([dtype, torch.float32]))
            attn_mask = torch.randn(shape, generator=gen, dtype=torch.float64)
            attn_mask = attn_mask.masked_fill(torch.rand(shape, generator=gen) < 0.2, -math.inf)
            attn_mask = attn_mask.to(mdtype)
    return dict(fn=fn, dtype=dtype, kwargs=kwargs, mask=mask, attn_mask=attn_mask, slopes=slopes,
                tensors=tensors, qkv=(q, k, v), backward=backward, seed=seed,
                return_lse=fn != "sdpa" and draw(st.booleans()))


def run_dense(call, api=flashattn):
    fn, kwargs, tensors = call["fn"], dict(call["kwargs"]), call["tensors"]
    leaves = [t.detach().requires_grad_(call["backward"]) for t in tensors]
    if fn == "qkvpacked":
        q, k, v = leaves[0].unbind(2)
    elif fn == "kvpacked":
        q = leaves[0]
        k, v = leaves[1].unbind(2)
    elif fn == "sdpa":
        q, k, v = (t.transpose(1, 2) for t in leaves)
    else:
        q, k, v = leaves
    batch, seqlen_q, heads = q.shape[:3]
    seqlen_k = k.shape[1]
    p = kwargs.get("dropout_p", 0.0)
    keep = keep_mask_of_next_call(q, p, batch, heads, seqlen_q, seqlen_k, call["seed"]) if p else None
    lse = None
    if fn == "sdpa":
        out = api.scaled_dot_product_attention(
            *leaves, attn_mask=call["attn_mask"], dropout_p=p, is_causal=call["mask"] == "causal",
            scale=kwargs.get("softmax_scale"), enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)
    else:
        f = {"func": api.flash_attn_func, "kvpacked": api.flash_attn_kvpacked_func,
             "qkvpacked": api.flash_attn_qkvpacked_func}[fn]
        result = f(*leaves, alibi_slopes=call["slopes"], return_attn_probs=call["return_lse"],
                   **kwargs)
        out, lse = (result[0], result[1]) if call["return_lse"] else (result, None)
    return leaves, (q, k, v), out, lse, keep


@budget(250)
@given(dense_calls())
def test_dense_functions_match_the_float64_reference(call):
    check_dense(call)


def check_dense(call, api=flashattn):
    """The checks of one dense call; api: the module of the public functions (flashattn), or
    a stand-in with the same functions (the shim's, test_cudasim_fuzz_differential.py)."""
    leaves, (q, k, v), out, lse, keep = run_dense(call, api)
    kwargs = call["kwargs"]
    if call["fn"] == "sdpa":
        ref_kwargs = dict(softmax_scale=kwargs.get("softmax_scale"), causal=call["mask"] == "causal",
                          align_bottom_right=False, attn_mask=call["attn_mask"])
    else:
        ref_kwargs = reference_kwargs(kwargs, call["slopes"])
    if keep is not None:
        ref_kwargs.update(dropout_mask=keep, dropout_p=kwargs["dropout_p"])
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(call["seed"]),
                       dtype=torch.float64).to(out.dtype)
    (ref_out, ref_lse, ref_grads), (low_out, low_lse, low_grads) = reference_and_yardstick(
        q, k, v, dout, call["backward"], **ref_kwargs)
    compare("out", out, ref_out, low_out)
    if lse is not None:
        compare("lse", lse, ref_lse, low_lse.float())
    if call["backward"]:
        # The gradients of the tensors the caller passed (a packed one's, unbound).
        grads = torch.autograd.grad(out, leaves, dout)
        if call["fn"] == "qkvpacked":
            grads = grads[0].unbind(2)
        elif call["fn"] == "kvpacked":
            grads = (grads[0], *grads[1].unbind(2))
        elif call["fn"] == "sdpa":
            grads = [g.transpose(1, 2) for g in grads]
        one_key = one_visible_key_slack(q, k, v, dout, **ref_kwargs)
        dq_o, dk_o = output_rounding_slack(q, k, out, ref_out, dout, **ref_kwargs)
        slacks = {"dq": one_key + dq_o, "dk": one_key + dk_o, "dv": 0.0}
        for name, got, want, low in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
            compare(name, got, want, low, factor=3.0, slack=slacks[name])


# ---- varlen: flash_attn_varlen_func (plain, paged), the varlen packed functions ----

@st.composite
def varlen_calls(draw, dtypes=DTYPES, lengths=LENGTHS, head_dims=HEAD_DIMS):
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    fn = draw(st.sampled_from(["varlen", "varlen", "kvpacked", "qkvpacked", "paged"]))
    dtype = draw(st.sampled_from(dtypes))
    nseq = draw(st.integers(1, 4))
    heads_kv = draw(st.integers(1, 3))
    group = 1 if fn == "qkvpacked" else draw(st.integers(1, 3))
    heads = heads_kv * group
    head_dim = draw(st.sampled_from(head_dims))
    lengths_q = [draw(st.sampled_from(lengths)) for _ in range(nseq)]
    lengths_k = lengths_q if fn == "qkvpacked" else [draw(st.sampled_from(lengths))
                                                       for _ in range(nseq)]
    extra_q = 0 if fn == "qkvpacked" else draw(st.sampled_from([0, 0, 1, 3]))
    extra_k = 0 if fn in ("qkvpacked", "paged") else draw(st.sampled_from([0, 0, 1, 3]))
    used_q = used_k = None
    seqused = fn in ("varlen", "paged") and draw(st.booleans())
    if seqused:
        used_q = [draw(st.integers(0, n)) for n in lengths_q]
        used_k = [draw(st.integers(0, n)) for n in lengths_k]
    kwargs = features(draw, head_dim, allow_dropout=fn != "paged")
    kwargs["deterministic"] = draw(st.booleans())
    slopes = alibi(draw, nseq, heads, gen)
    total_q, total_k = sum(lengths_q) + extra_q, sum(lengths_k) + extra_k
    cu_q = torch.tensor([0] + lengths_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + lengths_k, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    call = dict(fn=fn, dtype=dtype, kwargs=kwargs, slopes=slopes, seed=seed, lengths_q=lengths_q,
                lengths_k=lengths_k, used_q=used_q, used_k=used_k, cu_q=cu_q, cu_k=cu_k,
                max_q=max(lengths_q) + draw(st.sampled_from([0, 0, 5])),
                max_k=max(lengths_k) + draw(st.sampled_from([0, 0, 5])),
                backward=fn != "paged" and dtype != torch.float64 and draw(st.booleans()),
                block_table=None)
    if fn == "qkvpacked":
        call["tensors"] = [draw(strided((total_q, 3, heads, head_dim), dtype, gen))]
    elif fn == "kvpacked":
        call["tensors"] = [draw(strided((total_q, heads, head_dim), dtype, gen)),
                           draw(strided((total_k, 2, heads_kv, head_dim), dtype, gen))]
    elif fn == "paged":
        page = draw(st.sampled_from([1, 3, 16, 64, 128]))
        blocks_per_seq = max(1, max(-(-n // page) for n in lengths_k))
        num_blocks = nseq * blocks_per_seq + draw(st.integers(0, 3))
        table = torch.randperm(num_blocks, generator=gen)[:nseq * blocks_per_seq]
        call["block_table"] = table.view(nseq, blocks_per_seq).to(torch.int32)
        call["page"] = page
        call["tensors"] = [draw(strided((total_q, heads, head_dim), dtype, gen)),
                           draw(strided((num_blocks, page, heads_kv, head_dim), dtype, gen)),
                           draw(strided((num_blocks, page, heads_kv, head_dim), dtype, gen))]
    else:
        call["tensors"] = [draw(strided((total_q, heads, head_dim), dtype, gen)),
                           draw(strided((total_k, heads_kv, head_dim), dtype, gen)),
                           draw(strided((total_k, heads_kv, head_dim), dtype, gen))]
    return call


def sequence_keys(call, k, v, b):
    """Keys and values (1, lk, Hkv, D) that take part in sequence b."""
    lk = call["lengths_k"][b] if call["used_k"] is None else call["used_k"][b]
    if call["fn"] == "paged":
        page = call["page"]
        rows = torch.arange(lk)
        blocks = call["block_table"][b].long()[rows // page]
        return k[blocks, rows % page][None], v[blocks, rows % page][None]
    k0 = int(call["cu_k"][b])
    return k[k0:k0 + lk][None], v[k0:k0 + lk][None]


@budget(120)
@given(varlen_calls())
def test_varlen_functions_match_the_float64_reference(call):
    check_varlen(call)


def check_varlen(call, api=flashattn):
    fn, kwargs = call["fn"], dict(call["kwargs"])
    leaves = [t.detach().requires_grad_(call["backward"]) for t in call["tensors"]]
    if fn == "qkvpacked":
        q, k, v = leaves[0].unbind(1)
    elif fn == "kvpacked":
        q = leaves[0]
        k, v = leaves[1].unbind(1)
    else:
        q, k, v = leaves
    nseq, heads = len(call["lengths_q"]), q.shape[1]
    p = kwargs.get("dropout_p", 0.0)
    keep = (keep_mask_of_next_call(q, p, nseq, heads, call["max_q"], call["max_k"], call["seed"])
            if p else None)
    common = dict(alibi_slopes=call["slopes"], return_attn_probs=True, **kwargs)
    if fn == "qkvpacked":
        out, lse, _ = api.flash_attn_varlen_qkvpacked_func(
            leaves[0], call["cu_q"], call["max_q"], **common)
    elif fn == "kvpacked":
        out, lse, _ = api.flash_attn_varlen_kvpacked_func(
            leaves[0], leaves[1], call["cu_q"], call["cu_k"], call["max_q"], call["max_k"], **common)
    else:
        seqused = {}
        if call["used_q"] is not None:
            seqused = dict(seqused_q=torch.tensor(call["used_q"], dtype=torch.int32),
                           seqused_k=torch.tensor(call["used_k"], dtype=torch.int32))
        out, lse, _ = api.flash_attn_varlen_func(
            q, k, v, call["cu_q"], call["cu_k"], call["max_q"], call["max_k"],
            block_table=call["block_table"], **seqused, **common)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(call["seed"]),
                       dtype=torch.float64).to(out.dtype)
    grads = None
    if call["backward"]:
        grads = torch.autograd.grad(out, leaves, dout)
        if fn == "qkvpacked":
            grads = grads[0].unbind(1)
        elif fn == "kvpacked":
            grads = (grads[0], *grads[1].unbind(1))
    # Rows of q (and keys) that take part in no sequence: out 0, LSE -inf, zero gradients.
    rows_q = torch.zeros(q.shape[0], dtype=torch.bool)
    rows_k = torch.zeros(k.shape[0], dtype=torch.bool)
    for b in range(nseq):
        q0 = int(call["cu_q"][b])
        lq = call["lengths_q"][b] if call["used_q"] is None else call["used_q"][b]
        rows_q[q0:q0 + lq] = True
        ks, vs = sequence_keys(call, k, v, b)
        ref_kwargs = reference_kwargs(kwargs, None if call["slopes"] is None else
                                      call["slopes"] if call["slopes"].dim() == 1 else
                                      call["slopes"][b:b + 1])
        if keep is not None:
            ref_kwargs.update(dropout_mask=keep[b:b + 1, :, :lq, :ks.shape[1]], dropout_p=p)
        (ref_out, ref_lse, ref_grads), (low_out, low_lse, low_grads) = reference_and_yardstick(
            q[q0:q0 + lq][None], ks, vs, dout[q0:q0 + lq][None], call["backward"], **ref_kwargs)
        compare(f"out[seq {b}]", out[q0:q0 + lq], ref_out[0], low_out[0])
        compare(f"lse[seq {b}]", lse[:, q0:q0 + lq], ref_lse[0], low_lse[0].float())
        if call["backward"]:
            k0 = int(call["cu_k"][b])
            lk = ks.shape[1]
            rows_k[k0:k0 + lk] = True
            seq_q, seq_dout = q[q0:q0 + lq][None], dout[q0:q0 + lq][None]
            one_key = one_visible_key_slack(seq_q, ks, vs, seq_dout, **ref_kwargs)
            dq_o, dk_o = output_rounding_slack(seq_q, ks, out[q0:q0 + lq][None], ref_out,
                                               seq_dout, **ref_kwargs)
            compare(f"dq[seq {b}]", grads[0][q0:q0 + lq], ref_grads[0][0], low_grads[0][0], 3.0,
                    one_key + dq_o)
            compare(f"dk[seq {b}]", grads[1][k0:k0 + lk], ref_grads[1][0], low_grads[1][0], 3.0,
                    one_key + dk_o)
            compare(f"dv[seq {b}]", grads[2][k0:k0 + lk], ref_grads[2][0], low_grads[2][0], 3.0)
    assert torch.all(out[~rows_q] == 0), "rows of no sequence: out must be 0"
    assert torch.all(lse[:, ~rows_q] == -math.inf), "rows of no sequence: lse must be -inf"
    if call["backward"]:
        assert torch.all(grads[0][~rows_q] == 0), "rows of no sequence: dq must be 0"
        assert torch.all(grads[1][~rows_k] == 0) and torch.all(grads[2][~rows_k] == 0), \
            "keys of no sequence: dk, dv must be 0"


# ---- flash_attn_with_kvcache, dense and paged ----

@st.composite
def kvcache_calls(draw, dtypes=DTYPES, lengths=LENGTHS, head_dims=HEAD_DIMS,
                  seqlens_q=(1, 1, 2, 5, 63, 65)):
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    paged = draw(st.booleans())
    dtype = draw(st.sampled_from(dtypes))
    batch = draw(st.integers(1, 3))
    heads_kv = draw(st.integers(1, 3))
    heads = heads_kv * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from(head_dims))
    seqlen_q = draw(st.sampled_from(seqlens_q))
    new = draw(st.sampled_from([0, 0, 1, 2, 5]))
    capacity = draw(st.sampled_from(lengths)) + new
    cache_seqlens = [draw(st.integers(0, capacity - new)) for _ in range(batch)]
    kwargs = features(draw, head_dim, allow_dropout=False)
    kwargs["num_splits"] = draw(st.sampled_from([0, 1, 2, 3]))
    call = dict(paged=paged, dtype=dtype, kwargs=kwargs, seed=seed, new=new,
                cache_seqlens=cache_seqlens, leftpad=None, batch_idx=None, block_table=None,
                slopes=alibi(draw, batch, heads, gen),
                q=draw(strided((batch, seqlen_q, heads, head_dim), dtype, gen)))
    if paged:
        page = draw(st.sampled_from([1, 3, 16, 64, 128]))
        blocks_per_seq = max(1, -(-capacity // page))
        num_blocks = batch * blocks_per_seq + draw(st.integers(0, 3))
        table = torch.randperm(num_blocks, generator=gen)[:batch * blocks_per_seq]
        call["block_table"] = table.view(batch, blocks_per_seq).to(torch.int32)
        call["page"] = page
        cache_shape = (num_blocks, page, heads_kv, head_dim)
    else:
        batch_cache = batch
        if draw(st.booleans()):  # a cache with more entries than the batch needs an index
            batch_cache += draw(st.integers(0, 2))
            call["batch_idx"] = torch.randperm(batch_cache, generator=gen)[:batch].to(torch.int32)
        if draw(st.booleans()):
            call["leftpad"] = [draw(st.integers(0, n)) for n in cache_seqlens]
        cache_shape = (batch_cache, capacity, heads_kv, head_dim)
    call["k_cache"] = draw(strided(cache_shape, dtype, gen))
    call["v_cache"] = draw(strided(cache_shape, dtype, gen))
    if new:
        call["k"] = draw(strided((batch, new, heads_kv, head_dim), dtype, gen))
        call["v"] = draw(strided((batch, new, heads_kv, head_dim), dtype, gen))
        if head_dim >= 2 and draw(st.integers(0, 2)) == 0:
            rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
            rows = capacity + seqlen_q + draw(st.integers(0, 2))
            angles = torch.rand(rows, rotary_dim // 2, generator=gen, dtype=torch.float64)
            angles = angles * draw(st.sampled_from([0.1, 1.0, 1000.0]))
            call["rotary"] = dict(rotary_cos=angles.cos().to(dtype),
                                  rotary_sin=angles.sin().to(dtype),
                                  rotary_interleaved=draw(st.booleans()))
    return call


def rotate(x, cos, sin, positions, interleaved):
    """x [..., n, heads, d] rotated, row i at positions[i], in x's dtype's arithmetic (float64
    for the reference, the inputs' dtype for the yardstick); cos, sin [rows, rotary_dim / 2]."""
    c, s = cos[positions].to(x.dtype)[:, None], sin[positions].to(x.dtype)[:, None]
    half = cos.shape[1]
    i = torch.arange(half)
    a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
    out = x.clone()
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def cache_rows(call, b, positions):
    """(index tuple into the cache) of sequence b's key positions."""
    positions = torch.as_tensor(positions, dtype=torch.long)
    if call["paged"]:
        page = call["page"]
        return call["block_table"][b].long()[positions // page], positions % page
    entry = b if call["batch_idx"] is None else int(call["batch_idx"][b])
    return torch.full_like(positions, entry), positions


@budget(180)
@given(kvcache_calls())
def test_kvcache_matches_the_float64_reference_and_appends_exactly(call):
    check_kvcache(call)


def check_kvcache(call, api=flashattn):
    kwargs = call["kwargs"]
    k_cache, v_cache = call["k_cache"], call["v_cache"]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    new = call["new"]
    for b, n in enumerate(call["cache_seqlens"]):
        if new:
            idx = cache_rows(call, b, range(n, n + new))
            expected_k[idx] = call["k"][b]
            expected_v[idx] = call["v"][b]
    extra = {}
    if call["leftpad"] is not None:
        extra["cache_leftpad"] = torch.tensor(call["leftpad"], dtype=torch.int32)
    rotary = call.get("rotary")
    out, lse = api.flash_attn_with_kvcache(
        call["q"], k_cache, v_cache, k=call.get("k"), v=call.get("v"),
        cache_seqlens=torch.tensor(call["cache_seqlens"], dtype=torch.int32),
        cache_batch_idx=call["batch_idx"], block_table=call["block_table"],
        alibi_slopes=call["slopes"], return_softmax_lse=True, **extra, **kwargs,
        **(rotary or {}))
    seqlen_q = call["q"].shape[1]
    # With rotary: query i at cache_seqlens[b] + i when causal or local, else at
    # cache_seqlens[b]; new key t at cache_seqlens[b] + t (flash_attn_with_kvcache's doc).
    per_token = kwargs.get("causal", False) or any(w >= 0 for w in kwargs.get("window_size",
                                                                              (-1, -1)))
    if rotary:
        # The appended keys' rotary dims: within rounding of the float64 rotation (one rounding
        # to the dtype, plus the float32 arithmetic's); then compared bitwise as the rest.
        rotary_dim = 2 * rotary["rotary_cos"].shape[1]
        eps = torch.finfo(call["dtype"]).eps
        compute_eps = torch.finfo(torch.float64 if call["dtype"] == torch.float64
                                  else torch.float32).eps
        for b, n in enumerate(call["cache_seqlens"]):
            idx = cache_rows(call, b, range(n, n + new))
            positions = torch.arange(n, n + new)
            ref = rotate(to64(call["k"][b]), rotary["rotary_cos"].double(),
                         rotary["rotary_sin"].double(), positions, rotary["rotary_interleaved"])
            # |x_a cos| + |x_b sin| for both elements of each rotated pair.
            x = to64(call["k"][b]).abs()
            half = rotary_dim // 2
            pair = torch.arange(half)
            a, c = ((2 * pair, 2 * pair + 1) if rotary["rotary_interleaved"]
                    else (pair, pair + half))
            co = rotary["rotary_cos"].double()[positions].abs()[:, None]
            si = rotary["rotary_sin"].double()[positions].abs()[:, None]
            magnitude = torch.zeros_like(x)
            magnitude[..., a] = x[..., a] * co + x[..., c] * si
            magnitude[..., c] = x[..., c] * co + x[..., a] * si
            got = k_cache[idx].double()
            bound = (eps * ref.abs() + 2 * compute_eps * magnitude
                     + torch.finfo(call["dtype"]).tiny)[..., :rotary_dim]
            err = (got - ref)[..., :rotary_dim].abs()
            assert bool((err <= bound).all()), (
                f"rotated keys of sequence {b}: error {float(err.max()):.3e} beyond rounding")
            expected_k[idx] = torch.cat([k_cache[idx][..., :rotary_dim],
                                         expected_k[idx][..., rotary_dim:]], -1)
    # Every cache entry: the appended rows hold the new keys, all others are unchanged, bitwise.
    assert torch.equal(k_cache, expected_k), "k_cache: wrong rows written or lost"
    assert torch.equal(v_cache, expected_v), "v_cache: wrong rows written or lost"
    ref_kw = {name: kwargs[name] for name in kwargs if name != "num_splits"}
    for b, n in enumerate(call["cache_seqlens"]):
        start = 0 if call["leftpad"] is None else call["leftpad"][b]
        idx = cache_rows(call, b, range(start, n + new))
        ks, vs = expected_k[idx][None], expected_v[idx][None]
        slopes = call["slopes"]
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b:b + 1]
        rk = reference_kwargs(ref_kw, slopes)
        q = call["q"][b:b + 1]
        if not rotary:
            (ref_out, ref_lse, _), (low_out, low_lse, _) = reference_and_yardstick(
                q, ks, vs, None, False, **rk)
        else:
            # The reference rotates q and the new keys in float64, the yardstick in the dtype.
            q_positions = n + (torch.arange(seqlen_q) if per_token else torch.zeros(
                seqlen_q, dtype=torch.long))
            k_positions = torch.arange(start, n + new)
            appended = k_positions >= n
            results = []
            # The yardstick rotates in float32 and rounds once to the dtype, as PyTorch code
            # does (FA2's apply_rotary_emb); the reference in float64.
            rot_dtype = torch.float64 if call["dtype"] == torch.float64 else torch.float32
            for cast, rot in ((to64, to64), (lambda t: t.detach(), lambda t: t.to(rot_dtype))):
                cos, sin = (rot(rotary[name]) for name in ("rotary_cos", "rotary_sin"))
                k_in = cast(ks).clone()
                if new:
                    k_new = rot(call["k"][b:b + 1])
                    k_in[:, appended] = rotate(k_new[0], cos, sin, k_positions[appended],
                                               rotary["rotary_interleaved"])[None].to(k_in.dtype)
                q_in = rotate(rot(q)[0], cos, sin, q_positions,
                              rotary["rotary_interleaved"])[None].to(k_in.dtype)
                results.append(reference_and_yardstick(q_in, k_in, cast(vs), None, False, **rk))
            (ref_out, ref_lse, _), (low_out, low_lse, _) = results[0][0], results[1][1]
            # The API rounds the rotated q and keys to the dtype (the cache stores them so):
            # exact attention over those rounded inputs is as far from the float64 reference
            # as that rounding makes it, and PyTorch's own computation can land nearer by
            # luck (one key: its rounded logit cancelled the inputs' rounding). The yardstick
            # is the worse of the two (test_fuzz_regressions.py).
            rounded_out, rounded_lse, _ = results[1][0]
            low_out = worse(ref_out, low_out, rounded_out.to(low_out.dtype))
            low_lse = worse(ref_lse, low_lse.float(), rounded_lse.float())  # LSE: float32
        compare(f"out[{b}]", out[b], ref_out[0], low_out[0])
        compare(f"lse[{b}]", lse[b], ref_lse[0], low_lse[0].float())
