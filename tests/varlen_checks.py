"""Variable-length batches for the tests: packed sequences, their float64 reference (the dense
reference run sequence by sequence), and the forward and backward checks every executor runs."""
import random
from dataclasses import dataclass

import torch

from checks import mask_arguments, to64
from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error

# Lengths around the tile edges (16-, 32-, 64- and 128-row tiles), mixed in one batch.
AWKWARD_LENGTHS = [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129]


@dataclass
class VarlenBatch:
    """B sequences packed without padding: sequence b is rows [cu_q[b], cu_q[b + 1]) of q and
    [cu_k[b], cu_k[b + 1]) of k, v. Only the first used_q[b] / used_k[b] take part (seqused).
    extra_q / extra_k rows after the last sequence belong to none."""
    lengths_q: list
    lengths_k: list
    used_q: list = None
    used_k: list = None
    extra_q: int = 0
    extra_k: int = 0

    def __post_init__(self):
        self.cu_q = [0]
        for n in self.lengths_q:
            self.cu_q.append(self.cu_q[-1] + n)
        self.cu_k = [0]
        for n in self.lengths_k:
            self.cu_k.append(self.cu_k[-1] + n)

    @property
    def batch(self):
        return len(self.lengths_q)

    @property
    def total_q(self):
        return self.cu_q[-1] + self.extra_q

    @property
    def total_k(self):
        return self.cu_k[-1] + self.extra_k

    def taking_part(self, b):
        """(first query row, queries, first key row, keys) of sequence b that take part."""
        used_q = self.lengths_q[b] if self.used_q is None else self.used_q[b]
        used_k = self.lengths_k[b] if self.used_k is None else self.used_k[b]
        return self.cu_q[b], used_q, self.cu_k[b], used_k

    def op_arguments(self, device):
        """The op's varlen arguments, by name."""
        int32 = dict(dtype=torch.int32, device=device)
        arguments = dict(cu_seqlens_q=torch.tensor(self.cu_q, **int32),
                         cu_seqlens_k=torch.tensor(self.cu_k, **int32),
                         max_seqlen_q=max(self.lengths_q, default=0),
                         max_seqlen_k=max(self.lengths_k, default=0))
        if self.used_q is not None:
            arguments["seqused_q"] = torch.tensor(self.used_q, **int32)
        if self.used_k is not None:
            arguments["seqused_k"] = torch.tensor(self.used_k, **int32)
        return arguments

    def make_qkv(self, heads, heads_kv, head_dim, dtype, device):
        q = torch.randn(self.total_q, heads, head_dim, dtype=dtype, device=device)
        k = torch.randn(self.total_k, heads_kv, head_dim, dtype=dtype, device=device)
        v = torch.randn(self.total_k, heads_kv, head_dim, dtype=dtype, device=device)
        return q, k, v


def shuffled_awkward_batch(seed, **kwargs):
    """Every awkward length once for the queries and once, in another order, for the keys."""
    rng = random.Random(seed)
    lengths_q, lengths_k = list(AWKWARD_LENGTHS), list(AWKWARD_LENGTHS)
    rng.shuffle(lengths_q)
    rng.shuffle(lengths_k)
    return VarlenBatch(lengths_q, lengths_k, **kwargs)


def varlen_reference(q, k, v, vb, ref_kwargs):
    """(out [total_q, H, Dv], lse [H, total_q]) in q's dtype: the dense reference on each
    sequence, 0 and -inf on rows of no sequence. Differentiable. Dv: v's head dim."""
    heads, head_dim = q.shape[1], v.shape[2]
    outs, lses, row = [], [], 0

    def rows_of_no_sequence(count):
        outs.append(q.new_zeros(count, heads, head_dim))
        lses.append(q.new_full((heads, count), float("-inf")))

    slopes = ref_kwargs.get("alibi_slopes")
    for b in range(vb.batch):
        q0, lq, k0, lk = vb.taking_part(b)
        kwargs = dict(ref_kwargs)
        if slopes is not None and slopes.dim() == 2:
            kwargs["alibi_slopes"] = slopes[b:b + 1]
        o, l = attention_reference(q[q0:q0 + lq][None], k[k0:k0 + lk][None], v[k0:k0 + lk][None],
                                   **kwargs)
        rows_of_no_sequence(q0 - row)
        outs.append(o[0])
        lses.append(l[0].to(q.dtype))
        row = q0 + lq
    rows_of_no_sequence(q.shape[0] - row)
    return torch.cat(outs), torch.cat(lses, dim=1)


def varlen_mask_arguments(mask, vb, q, scale=None):
    """checks.mask_arguments for a varlen batch: ALiBi slopes per (sequence, head)."""
    dense_like = q.new_empty(vb.batch, 0, q.shape[1], q.shape[2])  # (batch, -, heads, head_dim)
    return mask_arguments(mask, dense_like, scale)


def check_varlen(ex, vb, q, k, v, mask, backward=True, with_dlse=False, deterministic=False):
    """Runs executor ex on the varlen batch, forward (and backward), against the float64
    reference with PyTorch's own low-precision error as the yardstick. Returns out, lse and the
    gradients (None without backward)."""
    scale, op_kwargs, ref_kwargs = varlen_mask_arguments(mask, vb, q)
    arguments = dict(op_kwargs, **vb.op_arguments(q.device))
    out, lse = ex.fwd(q, k, v, scale, **arguments)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert lse.shape == (q.shape[1], q.shape[0])
    ref_out, ref_lse = varlen_reference(to64(q), to64(k), to64(v), vb, ref_kwargs)
    low_out, low_lse = varlen_reference(q.cpu(), k.cpu(), v.cpu(), vb, ref_kwargs)
    assert_within_torch_error("out", out.cpu(), ref_out, low_out)
    assert_within_torch_error("lse", lse.cpu(), ref_lse, low_lse.float())
    if not backward:
        return out, lse, None
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    grads = ex.bwd(dout, q, k, v, out, lse, dlse, scale, deterministic=deterministic, **arguments)

    def reference_grads(q, k, v, dout, dlse):
        leaves = [t.detach().cpu().clone().requires_grad_() for t in (q, k, v)]
        o, l = varlen_reference(*leaves, vb, ref_kwargs)
        loss = (o * dout.cpu().to(o.dtype)).sum()
        if dlse is not None:
            loss = loss + (torch.where(torch.isfinite(l), l, 0) * dlse.cpu().to(l.dtype)).sum()
        loss.backward()
        return [t.grad for t in leaves]

    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(),
                          None if dlse is None else dlse.double())
    low = reference_grads(q, k, v, dout, dlse)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert got.dtype == q.dtype
        assert_within_torch_error(name, got.cpu(), want, yardstick, factor=3.0)
    return out, lse, grads
