"""Dropout: the same keep decisions on every executor (a pure function of the call's seed and
of (batch, head, query, key)), exactly p, reproducible from torch.manual_seed, gradients that
drop the same entries, FA2's S_dmask, and every mask feature alongside."""
import math

import pytest
import torch

import flashattn
from checks import MASKS, make_qkv, mask_arguments, to64
from executors import EXECUTORS, make_executor
from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error
from varlen_checks import VarlenBatch

P = 0.17  # FA2's tests' rate


def keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, p=P):
    return torch.ops.flashattn.dropout_keep_mask(rng_state.cpu(), p, batch, heads, seqlen_q,
                                                 seqlen_k)


def observed_keeps(ex, batch, seqlen_q, seqlen_k, heads, dtype, rng_state, p=P, **kwargs):
    """The keep decisions the executor's forward applied, read off its output: softmax_scale 0
    makes every visible key's probability 1/seqlen_k, and v = the identity puts key j's
    dropped-or-kept probability in column j of the output."""
    head_dim = seqlen_k
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=ex.device)
    k = torch.randn(batch, seqlen_k, heads, head_dim, dtype=dtype, device=ex.device)
    v = torch.eye(seqlen_k, dtype=dtype, device=ex.device).expand(batch, heads, seqlen_k,
                                                                  seqlen_k).transpose(1, 2)
    out, _ = ex.fwd(q, k, v, 0.0, dropout_p=p, rng_state=rng_state, **kwargs)
    return (out != 0).transpose(1, 2).cpu()  # (batch, heads, seqlen_q, seqlen_k)


# ---- the same decisions everywhere ----

@pytest.mark.parametrize("executor", [*EXECUTORS, "sim"])
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (63, 129), (129, 63)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_kernels_drop_exactly_the_keep_mask(executor, seqlens):
    """Bit for bit, whatever the executor's tiles: the forward's decisions are the keep mask."""
    ex = make_executor(executor)
    batch, heads = 2, 3
    dtype = torch.float32 if executor == "cpu" else torch.float16
    rng_state = torch.ops.flashattn.dropout_rng_state(torch.empty(0, device=ex.device))
    observed = observed_keeps(ex, batch, *seqlens, heads, dtype, rng_state)
    assert torch.equal(observed, keep_mask(rng_state, batch, heads, *seqlens))


def test_cpu_and_sim_drop_the_same_entries_in_fp32():
    rng_state = torch.ops.flashattn.dropout_rng_state(torch.empty(0))
    cpu = observed_keeps(make_executor("cpu"), 2, 70, 100, 2, torch.float32, rng_state)
    sim = observed_keeps(make_executor("sim"), 2, 70, 100, 2, torch.float32, rng_state)
    assert torch.equal(cpu, sim)


def test_keep_rate_is_exactly_p():
    """32-bit draws: the keep rate is 1 - p, not FA2's (floor((1 - p) * 255) + 1) / 256."""
    rng_state = torch.ops.flashattn.dropout_rng_state(torch.empty(0))
    for p in (0.17, 0.5, 0.9):
        keep = keep_mask(rng_state, 4, 8, 256, 256, p)
        assert abs((~keep).float().mean().item() - p) < 0.01, p
    assert keep_mask(rng_state, 1, 1, 16, 16, 1.0).sum() == 0
    assert keep_mask(rng_state, 1, 1, 16, 16, 0.0).all()


# ---- values and gradients against the reference built from the mask ----

def check_dropout(ex, q, k, v, mask, p=P, deterministic=False, with_dlse=False):
    """Forward and backward with dropout against the float64 reference given the same keep
    mask (from the op that lists the kernels' decisions)."""
    scale, op_kwargs, ref_kwargs = mask_arguments(mask, q)
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    keep = keep_mask(rng_state, q.shape[0], q.shape[2], q.shape[1], k.shape[1], p)
    arguments = dict(op_kwargs, dropout_p=p, rng_state=rng_state)
    out, lse = ex.fwd(q, k, v, scale, **arguments)
    ref_kwargs = dict(ref_kwargs, dropout_mask=keep, dropout_p=p)
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, low_lse = attention_reference(q.cpu(), k.cpu(), v.cpu(), **ref_kwargs)
    assert_within_torch_error("out", out.cpu(), ref_out, low_out)
    assert_within_torch_error("lse", lse.cpu(), ref_lse, low_lse.float())
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    grads = ex.bwd(dout, q, k, v, out, lse, dlse, scale, deterministic=deterministic, **arguments)

    def reference_grads(q, k, v, dout, dlse):
        leaves = [t.detach().cpu().clone().requires_grad_() for t in (q, k, v)]
        o, l = attention_reference(*leaves, **ref_kwargs)
        loss = (o * dout.cpu().to(o.dtype)).sum()
        if dlse is not None:
            loss = loss + (torch.where(torch.isfinite(l), l, 0) * dlse.cpu().to(l.dtype)).sum()
        return torch.autograd.grad(loss, leaves)

    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(),
                          None if dlse is None else dlse.double())
    low = reference_grads(q, k, v, dout, dlse)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert_within_torch_error(name, got.cpu(), want, yardstick, factor=3.0)
    return out, grads


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "causal_top_left", "window", "softcap",
                                  "alibi_batch_causal", "all"])
def test_dropout_matrix(executor, dtype, mask):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 70, 129, 4, 2, 32, dtype, ex.device)
    check_dropout(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_dropout_lse_gradient_and_gqa(executor):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 33, 47, 6, 2, 16, torch.float32, ex.device)
    check_dropout(ex, q, k, v, MASKS["causal"], with_dlse=True, deterministic=True)


def test_gradcheck_with_dropout():
    """float64, one fixed [seed, offset]: the op is then a deterministic function of q, k, v.
    Only out: the LSE is float32 by contract."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 6, 9, 2, 1, 4, torch.float64, "cpu"))
    rng_state = torch.ops.flashattn.dropout_rng_state(q)

    def attend(q, k, v):
        return torch.ops.flashattn.fwd(q, k, v, causal=True, dropout_p=0.3,
                                       rng_state=rng_state)[0]

    assert torch.autograd.gradcheck(attend, (q, k, v))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("p", [0.5, 1.0])
def test_high_rates(executor, p):
    """p = 1 drops everything: out 0, gradients 0 (and no division by zero)."""
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 40, 40, 2, 2, 16, torch.float32, ex.device)
    out, (dq, dk, dv) = check_dropout(ex, q, k, v, MASKS["causal"], p=p)
    if p == 1.0:
        assert torch.all(out == 0) and torch.all(dv == 0) and torch.all(dq == 0)


def test_varlen_dropout_is_the_dense_ops_per_sequence_mask():
    """In a varlen batch sequence b's decisions are those of batch index b, rows and keys
    counted from the sequence's start."""
    vb = VarlenBatch([30, 0, 65], [40, 3, 65])
    q, k, v = vb.make_qkv(2, 2, 32, torch.float32, "cpu")
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    out, lse = torch.ops.flashattn.fwd(q, k, v, dropout_p=P, rng_state=rng_state,
                                       **vb.op_arguments("cpu"))
    keep = keep_mask(rng_state, vb.batch, 2, 65, 65)
    for b in range(vb.batch):
        q0, lq, k0, lk = vb.taking_part(b)
        ref, _ = attention_reference(to64(q[q0:q0 + lq][None]), to64(k[k0:k0 + lk][None]),
                                     to64(v[k0:k0 + lk][None]), dropout_mask=keep[b:b + 1, :, :lq, :lk],
                                     dropout_p=P)
        torch.testing.assert_close(out[q0:q0 + lq].double(), ref[0], rtol=0, atol=1e-5)


# ---- seeding, reproducibility, autograd ----

def test_manual_seed_reproduces_and_calls_differ():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 50, 60, 2, 2, 16, torch.float32, "cpu"))

    def run(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        out = flashattn.flash_attn_func(q, k, v, dropout_p=P, causal=True)
        return (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))

    first, again = run(123), run(123)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = run()
    assert not torch.equal(first[0], other[0])


def test_deterministic_backward_with_dropout_is_bitwise_stable():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 200, 180, 4, 2, 32, torch.float32, "cpu"))
    grads = []
    threads = torch.get_num_threads()
    try:
        for n in (threads, 1):
            torch.set_num_threads(n)
            torch.manual_seed(7)
            out = flashattn.flash_attn_func(q, k, v, dropout_p=P, deterministic=True)
            grads.append(torch.autograd.grad(out.sum(), (q, k, v)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_s_dmask_decodes_to_the_output():
    """FA2's S_dmask: exp(logit - row max), negated where dropped; normalised (FA2's
    normalize_flash_attn_S with one block) and masked, it reproduces the output."""
    q, k, v = make_qkv(2, 40, 56, 4, 2, 32, torch.float32, "cpu")
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, dropout_p=P, causal=True,
                                                  window_size=(30, 0), softcap=5.0,
                                                  return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 40, 56) and s_dmask.dtype == torch.float32
    unnormalized, kept = s_dmask.abs(), s_dmask >= 0
    scores_max = (lse - torch.log(unnormalized.sum(-1))).unsqueeze(-1)  # row max, in effect
    probs = unnormalized * torch.exp(scores_max - lse.unsqueeze(-1))
    vh = v.transpose(1, 2).repeat_interleave(2, dim=1)
    recomputed = torch.matmul(probs * kept / (1 - P), vh).transpose(1, 2)
    torch.testing.assert_close(recomputed, out, rtol=1e-5, atol=1e-5)
    visible = unnormalized > 0
    dropped = (~kept[visible]).float().mean().item()
    assert abs(dropped - P) < 0.03


def test_no_dropout_returns_no_s_dmask():
    q, k, v = make_qkv(1, 8, 8, 1, 1, 8, torch.float32, "cpu")
    assert flashattn.flash_attn_func(q, k, v, return_attn_probs=True)[2] is None


def test_sdpa_front_end_dropout():
    q, k, v = (torch.randn(2, 4, 30, 16, requires_grad=True) for _ in range(3))
    torch.manual_seed(3)
    out = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    torch.manual_seed(3)
    again = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    assert torch.equal(out, again)
    undropped = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.equal(out, undropped)
    torch.autograd.grad(out.sum(), (q, k, v))


def test_compile_with_dropout():
    """Compiled forward+backward drop what eager drops from the same generator state."""
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 37, 41, 4, 2, 16, torch.float32, "cpu"))

    def step(q, k, v):
        return flashattn.flash_attn_func(q, k, v, dropout_p=P, causal=True).square().sum()

    compiled = torch.compile(step, fullgraph=True)
    torch.manual_seed(11)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    torch.manual_seed(11)
    eager = step(q, k, v)
    eager_grads = torch.autograd.grad(eager, (q, k, v))
    torch.testing.assert_close(loss, eager)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want)


def test_bad_dropout_arguments():
    q, k, v = make_qkv(1, 8, 8, 1, 1, 8, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match=r"dropout_p must be in \[0, 1\], got 1.5"):
        flashattn.flash_attn_func(q, k, v, dropout_p=1.5)
    with pytest.raises(RuntimeError, match=r"dropout_p > 0 needs rng_state"):
        torch.ops.flashattn.fwd(q, k, v, dropout_p=0.1)
    with pytest.raises(RuntimeError, match=r"rng_state must be int64 of shape \[2\]"):
        torch.ops.flashattn.fwd(q, k, v, dropout_p=0.1, rng_state=torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"flash_attn_func: dropout_p must be a real number"):
        flashattn.flash_attn_func(q, k, v, dropout_p="0.1")


def test_opcheck_with_dropout():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 9, 13, 4, 2, 8, torch.float32, "cpu"))
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    arguments = dict(dropout_p=P, rng_state=rng_state, causal=True)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v), arguments)
    # bwd is not differentiable (test_ops.py, double backward): checked on plain tensors.
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.flashattn.fwd(q, k, v, **arguments)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (),
                          dict(arguments, dout=torch.randn_like(out), out=out, lse=lse, dlse=None,
                               q=q, k=k, v=v))


# ---- the CUDA kernels on the shim ----

@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 64), (torch.bfloat16, 128),
                                            (torch.float32, 64)], ids=str)
@pytest.mark.parametrize("mask", ["causal", "all"])
def test_sim_dropout(dtype, head_dim, mask):
    sim = make_executor("sim")
    q, k, v = make_qkv(2, 70, 129, 4, 2, head_dim, dtype, sim.device)
    for deterministic in (False, True):
        check_dropout(sim, q, k, v, MASKS[mask], deterministic=deterministic)


def test_sim_varlen_dropout_matches_the_cpu():
    vb = VarlenBatch([30, 0, 65, 17], [40, 3, 65, 100])
    q, k, v = vb.make_qkv(2, 1, 32, torch.float32, "cpu")
    arguments = dict(vb.op_arguments("cpu"), causal=True, dropout_p=P,
                     rng_state=torch.ops.flashattn.dropout_rng_state(q))
    cpu_out, _ = make_executor("cpu").fwd(q, k, v, 1 / math.sqrt(32), **arguments)
    sim_out, _ = make_executor("sim").fwd(q, k, v, 1 / math.sqrt(32), **arguments)
    torch.testing.assert_close(sim_out, cpu_out, rtol=0, atol=1e-5)
