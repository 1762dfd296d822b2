"""flashattn behind F.scaled_dot_product_attention (flashattn/_sdpa_impl.py): registered on
import, active only between activate_flash_attention_impl("flashattn") and
restore_flash_attention_impl(); while active, F.sdpa on CPU runs flashattn's kernels (the
profiler shows flashattn::fwd / flashattn::bwd), with ATen's strides, inside real modules and
under torch.compile."""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn import attention

import flashattn  # noqa: F401  registers the implementation
from executors import make_executor
from tolerance import assert_within_torch_error

ACTIVE_TOLERANCE = dict(rtol=0, atol=2e-5)  # float32: two exact kernels, different orders


@contextlib.contextmanager
def flashattn_active():
    attention.activate_flash_attention_impl("flashattn")
    try:
        yield
    finally:
        attention.restore_flash_attention_impl()


def ran_flashattn(fn):
    """(fn's result, the set of flashattn:: events the profiler saw while it ran)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, {e.name for e in prof.events() if e.name.startswith("flashattn::")}


def test_registered_on_import_but_not_active():
    assert "flashattn" in attention.list_flash_attention_impls()
    assert attention.current_flash_attention_impl() is None
    q = torch.randn(1, 2, 8, 16)
    _, events = ran_flashattn(lambda: F.scaled_dot_product_attention(q, q, q))
    assert not events


@pytest.mark.parametrize("case", ["none", "causal", "bool_mask", "float_mask", "scale"])
def test_active_sdpa_runs_flashattn_and_matches(case):
    q, k, v = (torch.randn(2, 4, 37, 32, requires_grad=True) for _ in range(3))
    mask = None
    if case == "bool_mask":
        mask = torch.rand(2, 1, 37, 37) > 0.3
    elif case == "float_mask":
        mask = torch.randn(37, 37).masked_fill(torch.rand(37, 37) > 0.7, float("-inf"))
    kwargs = dict(attn_mask=mask, is_causal=case == "causal", scale=0.2 if case == "scale" else None)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        return out, torch.autograd.grad(out.square().sum(), (q, k, v))

    expected, events = ran_flashattn(step)
    assert not events
    with flashattn_active():
        assert attention.current_flash_attention_impl() == "flashattn"
        got, events = ran_flashattn(step)
    assert {"flashattn::fwd", "flashattn::bwd"} <= events
    assert attention.current_flash_attention_impl() is None
    for a, b in zip((got[0], *got[1]), (expected[0], *expected[1])):
        torch.testing.assert_close(a, b, **ACTIVE_TOLERANCE)
    # restore_flash_attention_impl() undid it: PyTorch's kernel again.
    _, events = ran_flashattn(step)
    assert not events


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_opcheck_on_the_replaced_aten_ops(layout, dtype):
    """Outputs and gradients with ATen's strides and dtypes (its meta functions), whatever the
    input layout."""
    def make(seqlen):
        if layout == "bshd":
            return torch.randn(2, seqlen, 3, 16, dtype=dtype).transpose(1, 2).requires_grad_()
        return torch.randn(2, 3, seqlen, 16, dtype=dtype, requires_grad=True)

    q, k, v = make(9), make(13), make(13)
    mask = torch.randn(9, 13, dtype=dtype)
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    cases = [((0.0, True), {}), ((0.0, False), dict(attn_mask=mask, scale=0.3))]
    # ATen's backward op has no derivative of its own, so opcheck cannot trace through it.
    bwd_checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    with flashattn_active():
        ours = []
        for args, kwargs in cases:
            torch.library.opcheck(fwd, (q, k, v, *args), kwargs)
            out, lse = fwd(q, k, v, *args, **kwargs)
            grad_args = (torch.randn_like(out), q, k, v, out, lse, *args)
            torch.library.opcheck(bwd, grad_args, kwargs, test_utils=bwd_checks)
            ours.append((out, lse, *bwd(*grad_args, **kwargs)))
    for (args, kwargs), results in zip(cases, ours):
        out, lse = fwd(q, k, v, *args, **kwargs)
        theirs = (out, lse, *bwd(torch.randn_like(out), q, k, v, out, lse, *args, **kwargs))
        for a, b in zip(results, theirs):
            assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)


def test_unsupported_input_is_an_error_not_a_fallback():
    q = torch.randn(1, 2, 8, 16)
    v = torch.randn(1, 2, 8, 32)
    with flashattn_active():
        with pytest.raises(RuntimeError, match=r"flashattn \(the activated torch.nn.attention "
                                               r"flash-attention implementation\): dropout_p > 0"):
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.1)
        with pytest.raises(RuntimeError, match=r"value's head dim \(32\) must equal query's"):
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, v)


def test_compile_while_active():
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 4, 40, 16, requires_grad=True) for _ in range(3))
    mask = torch.rand(40, 40) > 0.2

    def step(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).square().sum()

    eager = step(q, k, v)
    eager_grads = torch.autograd.grad(eager, (q, k, v))
    with flashattn_active():
        compiled = torch.compile(step, fullgraph=True)
        (loss, grads), events = ran_flashattn(
            lambda: (lambda l: (l, torch.autograd.grad(l, (q, k, v))))(compiled(q, k, v)))
    assert {"flashattn::fwd", "flashattn::bwd"} <= events
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, **ACTIVE_TOLERANCE)


# ---- real modules ----

def make_encoder_layer():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                            dropout=0.0, batch_first=True)


@pytest.fixture
def no_mha_fast_path():
    """PyTorch's inference fast path for nn.TransformerEncoderLayer / nn.MultiheadAttention
    (torch._transformer_encoder_layer_fwd) computes attention itself, without F.sdpa, so no
    SDPA implementation reaches it; switched off, eval runs through F.sdpa like training."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("masks", ["none", "causal", "key_padding"])
def test_transformer_encoder_layer(no_mha_fast_path, mode, masks):
    layer = make_encoder_layer().train(mode == "train")
    x = torch.randn(3, 30, 64)
    kwargs = {}
    if masks == "causal":
        kwargs = dict(src_mask=torch.nn.Transformer.generate_square_subsequent_mask(30),
                      is_causal=True)
    elif masks == "key_padding":
        kwargs = dict(src_key_padding_mask=torch.arange(30)[None, :] >= torch.tensor([[30], [20],
                                                                                     [5]]))

    def step():
        with torch.set_grad_enabled(mode == "train"):
            out = layer(x, **kwargs)
            grads = (torch.autograd.grad(out.square().sum(), list(layer.parameters()))
                     if mode == "train" else ())
        return out, grads

    expected, _ = ran_flashattn(step)
    with flashattn_active():
        got, events = ran_flashattn(step)
    assert "flashattn::fwd" in events, events
    if mode == "train":
        assert "flashattn::bwd" in events
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
    for a, b in zip(got[1], expected[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_mha_fast_path_still_matches():
    """With the fast path on (the default), eval results are PyTorch's own either way."""
    layer = make_encoder_layer().eval()
    x = torch.randn(2, 20, 64)
    with torch.no_grad():
        expected = layer(x)
        with flashattn_active():
            got = layer(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_multihead_attention(no_mha_fast_path, mode):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).train(mode == "train")
    x = torch.randn(2, 25, 64, requires_grad=True)
    mask = torch.rand(25, 25) > 0.8

    def step():
        out, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
        return out, torch.autograd.grad(out.sum(), x)

    expected, _ = ran_flashattn(step)
    with flashattn_active():
        got, events = ran_flashattn(step)
    assert "flashattn::fwd" in events, events
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-4)


# ---- CUDA: ATen's flash ops on flashattn (their values and layouts are also checked on the
# CPU shim, test_sdpa_impl_cuda_ops.py) ----

def cuda_device():
    make_executor("cuda")  # skips without a GPU
    return torch.device("cuda")


@pytest.mark.parametrize("case", ["none", "causal", "scale"])
def test_active_sdpa_on_cuda_runs_flashattn_within_torchs_error(case):
    device = cuda_device()
    q, k, v = (torch.randn(2, 4, 129, 64, device=device, dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    kwargs = dict(is_causal=case == "causal", scale=0.2 if case == "scale" else None)
    dout = torch.randn_like(q)

    def step(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    with attention.sdpa_kernel(attention.SDPBackend.MATH):
        reference = step(*leaves64)
    with attention.sdpa_kernel(attention.SDPBackend.FLASH_ATTENTION):
        torchs, events = ran_flashattn(lambda: step(q, k, v))
        assert not events
        with flashattn_active():
            ours, events = ran_flashattn(lambda: step(q, k, v))
    assert {"flashattn::fwd", "flashattn::bwd"} <= events
    for name, got, want, yardstick in zip(("out", "dq", "dk", "dv"), ours, reference, torchs):
        assert_within_torch_error(name, got, want.detach(), yardstick,
                                  factor=2.0 if name == "out" else 3.0)


def test_active_varlen_attn_on_cuda_runs_flashattn():
    device = cuda_device()
    varlen_attn = pytest.importorskip("torch.nn.attention.varlen").varlen_attn
    lengths = [100, 7, 64]
    cu = torch.tensor([0, 100, 107, 171], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(171, 4, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    expected = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), window_size=(-1, 0))
    with flashattn_active():
        got, events = ran_flashattn(lambda: varlen_attn(q, k, v, cu, cu, max(lengths),
                                                        max(lengths), window_size=(-1, 0)))
        got.sum().backward()
    assert "flashattn::fwd" in events
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
