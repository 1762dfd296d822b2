"""Variable-length batches (flash_attn_varlen_func): every executor against the float64
reference run sequence by sequence, the CPU's bitwise equality with the dense op on each
sequence alone, seqused, the packed variants, bad input, opcheck and torch.compile."""
import inspect
import math

import pytest
import torch

import flashattn
from checks import MASKS, make_alibi
from executors import EXECUTORS, make_executor
from varlen_checks import VarlenBatch, check_varlen, shuffled_awkward_batch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# ---- every executor: the reference, sequence by sequence ----

@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", list(MASKS), ids=str)
def test_varlen_matrix(executor, dtype, mask):
    """Lengths 0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129 for queries and, in another order,
    for keys, in one batch, with GQA: forward and backward."""
    ex = make_executor(executor)
    vb = shuffled_awkward_batch(seed=len(mask))
    check_varlen(ex, vb, *vb.make_qkv(4, 2, 32, dtype, ex.device), MASKS[mask])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("head_dim", [8, 63, 128, 256])
def test_varlen_head_dims(executor, head_dim):
    ex = make_executor(executor)
    vb = VarlenBatch([70, 3, 129], [45, 130, 1])
    check_varlen(ex, vb, *vb.make_qkv(2, 1, head_dim, torch.bfloat16, ex.device),
                 MASKS["window"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_lse_gradient_and_gqa(executor, deterministic):
    ex = make_executor(executor)
    vb = VarlenBatch([33, 90, 0, 64], [47, 60, 5, 64])
    check_varlen(ex, vb, *vb.make_qkv(6, 2, 64, torch.float32, ex.device), MASKS["causal"],
                 with_dlse=True, deterministic=deterministic)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_varlen_strided_inputs(executor):
    """q, k, v as slices of one packed (total, 3, H, D) tensor."""
    ex = make_executor(executor)
    vb = VarlenBatch([20, 65, 7], [20, 65, 7])
    q, k, v = torch.randn(vb.total_q, 3, 4, 40, dtype=torch.bfloat16, device=ex.device).unbind(1)
    assert not q.is_contiguous()
    check_varlen(ex, vb, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_rows_of_no_sequence(executor, mask):
    """Tokens after the last sequence and past seqused take no part: out 0, lse -inf, zero
    gradients; seqused also shortens the keys a sequence sees (bottom-right per sequence)."""
    ex = make_executor(executor)
    vb = VarlenBatch([40, 70, 9], [50, 66, 12], used_q=[40, 31, 0], used_k=[17, 66, 5],
                     extra_q=6, extra_k=3)
    out, lse, (dq, dk, dv) = check_varlen(ex, vb, *vb.make_qkv(2, 2, 32, torch.float32,
                                                                ex.device), MASKS[mask])
    outside_q = torch.ones(vb.total_q, dtype=torch.bool)
    outside_k = torch.ones(vb.total_k, dtype=torch.bool)
    for b in range(vb.batch):
        q0, lq, k0, lk = vb.taking_part(b)
        outside_q[q0:q0 + lq] = False
        outside_k[k0:k0 + lk] = False
    assert torch.all(out.cpu()[outside_q] == 0) and torch.all(dq.cpu()[outside_q] == 0)
    assert torch.all(lse.cpu()[:, outside_q] == float("-inf"))
    assert torch.all(dk.cpu()[outside_k] == 0) and torch.all(dv.cpu()[outside_k] == 0)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_seqused_without_cu_seqlens(executor):
    """FA3's seqused on a dense batch: sequence b is its first seqused[b] rows."""
    ex = make_executor(executor)
    batch, seqlen_q, seqlen_k = 3, 50, 70
    used_q, used_k = [50, 13, 0], [70, 1, 30]
    q, k, v = (torch.randn(batch, s, 2, 32, device=ex.device) for s in (seqlen_q, seqlen_k, seqlen_k))
    int32 = dict(dtype=torch.int32, device=ex.device)
    out, lse = ex.fwd(q, k, v, 0.2, causal=True, seqused_q=torch.tensor(used_q, **int32),
                      seqused_k=torch.tensor(used_k, **int32))
    for b in range(batch):
        ref_out, ref_lse = ex.fwd(q[b:b + 1, :used_q[b]], k[b:b + 1, :used_k[b]],
                                  v[b:b + 1, :used_k[b]], 0.2, causal=True)
        torch.testing.assert_close(out[b:b + 1, :used_q[b]], ref_out, rtol=0, atol=1e-6)
        torch.testing.assert_close(lse[b:b + 1, :, :used_q[b]], ref_lse, rtol=0, atol=1e-6)
        assert torch.all(out[b, used_q[b]:] == 0)
        assert torch.all(lse[b, :, used_q[b]:] == float("-inf"))


# ---- the CPU: each sequence exactly as the dense op computes it alone ----

# (dtype, FLASHATTN_CPU_16BIT_PRODUCTS): every operand path of the CPU kernels.
OPERAND_PATHS = [(torch.float32, "0"), (torch.float64, "0"), (torch.bfloat16, "0"),
                 (torch.bfloat16, "1")]


@pytest.mark.parametrize("dtype,products_16bit", OPERAND_PATHS, ids=str)
@pytest.mark.parametrize("mask", ["none", "all", "alibi_batch_causal"])
def test_cpu_sequences_bitwise_equal_dense_alone(monkeypatch, dtype, products_16bit, mask):
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_PRODUCTS", products_16bit)
    lengths_q = [300, 1, 0, 129, 64, 200]
    lengths_k = [280, 5, 3, 129, 0, 257]
    vb = VarlenBatch(lengths_q, lengths_k)
    q, k, v = (t.requires_grad_() for t in vb.make_qkv(4, 2, 64, dtype, "cpu"))
    slopes = make_alibi("batch_heads", vb.batch, 4, "cpu")
    kwargs = dict(MASKS[mask], softmax_scale=0.11)
    window = kwargs.pop("window", (-1, -1))
    kwargs.pop("alibi", None)
    alibi = slopes if "alibi" in MASKS[mask] else None
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, k, v, *vb.op_arguments("cpu").values(), window_size=window, alibi_slopes=alibi,
        deterministic=True, return_attn_probs=True, **kwargs)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    for b in range(vb.batch):
        q0, lq, k0, lk = vb.taking_part(b)
        leaves = [x.detach()[r0:r0 + n][None].requires_grad_()
                  for x, r0, n in ((q, q0, lq), (k, k0, lk), (v, k0, lk))]
        out_b, lse_b, _ = flashattn.flash_attn_func(
            *leaves, window_size=window, alibi_slopes=None if alibi is None else alibi[b:b + 1],
            deterministic=True, return_attn_probs=True, **kwargs)
        grads_b = torch.autograd.grad((out_b, lse_b), leaves,
                                      (dout[q0:q0 + lq][None], dlse[:, q0:q0 + lq][None]))
        assert torch.equal(out[q0:q0 + lq], out_b[0]), b
        assert torch.equal(lse[:, q0:q0 + lq], lse_b[0]), b
        for got, want, r0, n in ((dq, grads_b[0], q0, lq), (dk, grads_b[1], k0, lk),
                                 (dv, grads_b[2], k0, lk)):
            assert torch.equal(got[r0:r0 + n], want[0]), b


def test_cpu_varlen_same_bits_for_any_thread_count():
    vb = VarlenBatch([700, 3, 90, 130], [650, 9, 90, 1])
    q, k, v = vb.make_qkv(4, 2, 64, torch.float32, "cpu")
    arguments = dict(vb.op_arguments("cpu"), causal=True)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (threads, 1):
            torch.set_num_threads(n)
            out, lse = torch.ops.flashattn.fwd(q, k, v, **arguments)
            dout = torch.ones_like(out)
            dq, dk, dv, _ = torch.ops.flashattn.bwd(dout=dout, out=out, lse=lse, dlse=None,
                                                    q=q, k=k, v=v, **arguments)
            results.append((out, lse, dq, dk, dv))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


# ---- the Python API ----

def test_varlen_signatures_match_fa2():
    tail = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)
    cases = [
        (flashattn.flash_attn_varlen_func,
         ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"],
         dict(tail, block_table=None)),
        (flashattn.flash_attn_varlen_kvpacked_func,
         ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"], tail),
        (flashattn.flash_attn_varlen_qkvpacked_func, ["qkv", "cu_seqlens", "max_seqlen"], tail),
    ]
    for fn, leading, defaults in cases:
        params = inspect.signature(fn).parameters
        positional = [n for n, p in params.items() if p.kind != p.KEYWORD_ONLY]
        assert positional == [*leading, *defaults], fn.__name__
        assert {name: params[name].default for name in defaults} == defaults
    keyword_only = inspect.signature(flashattn.flash_attn_varlen_func).parameters
    assert keyword_only["seqused_q"].kind == inspect.Parameter.KEYWORD_ONLY
    assert keyword_only["seqused_k"].default is None


def test_varlen_packed_variants_read_in_place():
    vb = VarlenBatch([30, 0, 77], [30, 0, 77])
    cu, max_len = vb.op_arguments("cpu")["cu_seqlens_q"], 77
    qkv = torch.randn(vb.total_q, 3, 4, 32, requires_grad=True)
    q, k, v = qkv.detach().unbind(1)
    expected, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len,
                                                        causal=True, return_attn_probs=True)
    out, lse_packed, _ = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max_len, causal=True,
                                                                    return_attn_probs=True)
    assert torch.equal(out, expected) and torch.equal(lse_packed, lse)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape
    kv = qkv.detach()[:, 1:]
    assert torch.equal(flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max_len, max_len,
                                                                 causal=True), expected)


def test_max_seqlen_is_an_upper_bound():
    """FA2's test_flash_attn_bwd_varlen_overflow passes 256 for much shorter sequences."""
    vb = VarlenBatch([5, 17], [9, 3])
    q, k, v = vb.make_qkv(2, 2, 16, torch.float32, "cpu")
    arguments = vb.op_arguments("cpu")
    tight = flashattn.flash_attn_varlen_func(q, k, v, *arguments.values(), causal=True)
    loose = flashattn.flash_attn_varlen_func(q, k, v, arguments["cu_seqlens_q"],
                                             arguments["cu_seqlens_k"], 256, 256, causal=True)
    assert torch.equal(tight, loose)


def vb_args(**overrides):
    """Inputs of a well-formed two-sequence batch, with some replaced."""
    vb = VarlenBatch([4, 6], [5, 5])
    q, k, v = vb.make_qkv(2, 2, 8, torch.float32, "cpu")
    arguments = dict(q=q, k=k, v=v, **vb.op_arguments("cpu"))
    arguments.update(overrides)
    return arguments


def int32(values):
    return torch.tensor(values, dtype=torch.int32)


BAD_VARLEN = {
    "cu_not_int32": (dict(cu_seqlens_q=torch.tensor([0, 4, 10])), r"cu_seqlens_q must be int32, got Long"),
    "cu_decreasing": (dict(cu_seqlens_k=int32([0, 6, 5]), max_seqlen_k=6),
                      r"cu_seqlens_k must be non-decreasing, got cu_seqlens_k\[1\] = 6 > cu_seqlens_k\[2\] = 5"),
    "cu_not_from_zero": (dict(cu_seqlens_q=int32([1, 4, 10])), r"cu_seqlens_q must start at 0, got 1"),
    "cu_past_tokens": (dict(cu_seqlens_q=int32([0, 4, 11]), max_seqlen_q=7),
                       r"last entry of cu_seqlens_q \(11\) must be at most the number of tokens, 10"),
    "cu_sizes_differ": (dict(cu_seqlens_k=int32([0, 10])),
                        r"cu_seqlens_k must have shape \[3\] \(batch \+ 1, batch from cu_seqlens_q\), got \[2\]"),
    "cu_2d": (dict(cu_seqlens_q=int32([[0, 4, 10]])), r"cu_seqlens_q must have shape \[batch \+ 1\]"),
    "max_too_small": (dict(max_seqlen_q=5),
                      r"max_seqlen_q = 5 must bound every sequence, but sequence 1 has 6"),
    "max_missing": (dict(max_seqlen_k=None), r"needs max_seqlen_q and max_seqlen_k"),
    "cu_k_missing": (dict(cu_seqlens_k=None), r"cu_seqlens_q is given but cu_seqlens_k is not"),
    "q_not_3d": (dict(q=torch.randn(1, 10, 2, 8)),
                 r"q must be a 3-D tensor \[total_tokens, heads, head_dim\] when cu_seqlens_q is given"),
    "seqused_too_long": (dict(seqused_k=int32([5, 6])),
                         r"seqused_k\[1\] = 6 must be in \[0, 5\], the length of sequence 1"),
    "seqused_negative": (dict(seqused_q=int32([-1, 0])), r"seqused_q\[0\] = -1 must be in \[0, 4\]"),
    "seqused_shape": (dict(seqused_q=int32([1, 2, 3])), r"seqused_q must have shape \[2\] \(batch\)"),
    "alibi_batch": (dict(alibi_slopes=torch.rand(3, 2)), r"alibi_slopes must have shape \[2\] or \[2, 2\]"),
}


@pytest.mark.parametrize("case", list(BAD_VARLEN))
def test_bad_varlen_input(case):
    overrides, message = BAD_VARLEN[case]
    with pytest.raises(RuntimeError, match=message):
        torch.ops.flashattn.fwd(**vb_args(**overrides))


def test_dense_with_max_seqlen_is_an_error():
    q = torch.randn(1, 5, 2, 8)
    with pytest.raises(RuntimeError, match=r"max_seqlen_q / max_seqlen_k only apply with cu_seqlens"):
        torch.ops.flashattn.fwd(q, q, q, max_seqlen_q=5, max_seqlen_k=5)


# ---- torch.library and torch.compile ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck_varlen(dtype):
    vb = VarlenBatch([9, 0, 21], [13, 4, 21], used_k=[13, 2, 21], extra_q=2)
    q, k, v = (t.requires_grad_() for t in vb.make_qkv(4, 2, 16, dtype, "cpu"))
    arguments = dict(vb.op_arguments("cpu"), causal=True, alibi_slopes=torch.rand(3, 4))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v), arguments)
    # bwd is not differentiable (test_ops.py, double backward): checked on plain tensors.
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.flashattn.fwd(q, k, v, **arguments)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (),
                          dict(arguments, dout=torch.randn_like(out), out=out, lse=lse,
                               dlse=torch.randn_like(lse), q=q, k=k, v=v))


def test_compile_does_not_recompile_for_new_lengths():
    """New cu_seqlens values (same token count and max_seqlen): one graph. A new max_seqlen
    recompiles once, after which it is dynamic (a SymInt in the op's schema)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def step(q, k, v, cu_q, cu_k, max_q, max_k):
        out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
        return out.square().sum()

    compiled = torch.compile(step, backend=counter, fullgraph=True)
    q, k, v = (t.requires_grad_() for t in VarlenBatch([64], [64]).make_qkv(2, 1, 16,
                                                                           torch.float32, "cpu"))
    for lengths, max_len in (([10, 40, 14], 40), ([40, 0, 24], 40), ([1, 23, 40], 40),
                             ([50, 7, 7], 50), ([64, 0, 0], 64), ([4, 30, 30], 30)):
        args = VarlenBatch(lengths, lengths).op_arguments("cpu")
        cu = args["cu_seqlens_q"]
        loss = compiled(q, k, v, cu, cu, max_len, max_len)
        grads = torch.autograd.grad(loss, (q, k, v))
        eager = step(q, k, v, cu, cu, max_len, max_len)
        torch.testing.assert_close(loss, eager)
        for got, want in zip(grads, torch.autograd.grad(eager, (q, k, v))):
            torch.testing.assert_close(got, want)
        if max_len == 40:
            assert counter.frame_count == 1, "new cu_seqlens values recompiled"
    assert counter.frame_count == 2, "a new max_seqlen should recompile once, then be dynamic"


# ---- the CUDA kernels on the CPU shim ----

@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


# One head dim per compiled 16-bit tile (32, 64, 96, 128, 192, 256); fp32 on the SIMT kernels.
SIM_TILES = [(torch.float16, 24), (torch.bfloat16, 64), (torch.float16, 80),
             (torch.bfloat16, 128), (torch.float16, 136), (torch.bfloat16, 256),
             (torch.float32, 24), (torch.float32, 100)]


# Every shim case runs every CTA of the grid as fibers, about 10 s for fwd + bwd of this batch:
# the mask features and the head-dim tiles are covered one axis at a time, not as a product.
@pytest.mark.parametrize("dtype,head_dim", SIM_TILES, ids=str)
def test_sim_varlen_every_tile(sim, dtype, head_dim):
    """Every dtype and head-dim tile, lengths 0 to 129 mixed in one batch, GQA."""
    vb = shuffled_awkward_batch(seed=head_dim)
    check_varlen(sim, vb, *vb.make_qkv(2, 1, head_dim, dtype, sim.device), MASKS["causal"],
                 deterministic=head_dim % 2 == 0)


@pytest.mark.parametrize("mask", list(MASKS), ids=str)
def test_sim_varlen_every_mask(sim, mask):
    """Every mask feature on the same mixed batch, alternating the tensor-core and SIMT kernels."""
    dtype = torch.float32 if len(mask) % 2 else torch.bfloat16
    vb = shuffled_awkward_batch(seed=len(mask))
    check_varlen(sim, vb, *vb.make_qkv(2, 1, 64, dtype, sim.device), MASKS[mask])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sim_rows_of_no_sequence(sim, dtype):
    vb = VarlenBatch([40, 70, 9], [50, 66, 12], used_q=[40, 31, 0], used_k=[17, 66, 5],
                     extra_q=6, extra_k=3)
    check_varlen(sim, vb, *vb.make_qkv(2, 1, 32, dtype, sim.device), MASKS["causal"],
                 with_dlse=True)


def test_sim_matches_the_cpu_to_rounding():
    """The same varlen batch on the CPU kernels and the CUDA kernels (shim), fp32."""
    vb = shuffled_awkward_batch(seed=3)
    q, k, v = vb.make_qkv(4, 2, 64, torch.float32, "cpu")
    arguments = dict(vb.op_arguments("cpu"), causal=True, softcap=5.0)
    cpu_out, cpu_lse = make_executor("cpu").fwd(q, k, v, 1 / math.sqrt(64), **arguments)
    sim_out, sim_lse = make_executor("sim").fwd(q, k, v, 1 / math.sqrt(64), **arguments)
    torch.testing.assert_close(sim_out, cpu_out, rtol=0, atol=1e-5)
    torch.testing.assert_close(sim_lse, cpu_lse, rtol=0, atol=1e-5)
