"""The decode bench's MLA row (`flashattn-mla`): DeepSeek-V3's absorbed decoding step, beside the
dense GQA step of the same case (B, Sq, Sk).

Multi-head Latent Attention decodes with one latent kv head that serves every query head: q has
--mla-heads heads (128 in DeepSeek-V3) of head_dim 576, the cache holds one 576-wide row per
token (512 latent columns and 64 rotary ones), and V is the first 512 columns of each K row:
`v_cache = k_cache[..., :512]`, a view read in place through its own strides. So the step reads
B·Sk·576·itemsize bytes, each key row once, and those are the bytes its GB/s counts (the KV_MB
column of its row). The cache is paged in 64-row pages, as FlashMLA's, each sequence's pages at
random places in the pool (a fixed-seed permutation), the last page's rows past Sk poisoned.

Each output is checked against the float64 reference on the first and the last sequence."""
import torch

from .._kvcache import flash_attn_with_kvcache
from .._reference import attention_reference

MLA = "flashattn-mla"
HEAD_DIM = 576     # q and k: 512 latent + 64 rotary columns
HEAD_DIM_V = 512   # v: the latent columns, a view of k's
PAGE = 64
LAYOUT = f"latent paged {PAGE}, {HEAD_DIM}/{HEAD_DIM_V}, v=k[..., :{HEAD_DIM_V}]"


def kv_bytes(batch, kv_len, dtype):
    """The latent rows one step reads: B·Sk·576·itemsize (V is inside them)."""
    return batch * kv_len * HEAD_DIM * torch.empty((), dtype=dtype).element_size()


class Inputs:
    """One case's MLA query and its paged latent cache."""

    def __init__(self, case, heads, device, generator, poison):
        b, sk, dtype = case.batch, case.kv_len, case.dtype

        def randn(*shape):
            return torch.randn(shape, generator=generator, dtype=torch.float32,
                               device=device).to(dtype)
        self.q = randn(b, case.q_len, heads, HEAD_DIM)
        self.latent = randn(b, sk, 1, HEAD_DIM)
        self.cache_seqlens = torch.full((b,), sk, dtype=torch.int32, device=device)
        pages = -(-sk // PAGE)
        order = torch.randperm(b * pages, generator=generator, device=device)
        self.block_table = order.view(b, pages).to(torch.int32)
        padded = torch.full((b, pages * PAGE, 1, HEAD_DIM), poison, dtype=dtype, device=device)
        padded[:, :sk] = self.latent
        self.k_pages = torch.empty((b * pages, PAGE, 1, HEAD_DIM), dtype=dtype, device=device)
        self.k_pages[order] = padded.view(b * pages, PAGE, 1, HEAD_DIM)
        self.v_pages = self.k_pages[..., :HEAD_DIM_V]  # a view: no copy

    def attend(self, num_splits):
        return flash_attn_with_kvcache(self.q, self.k_pages, self.v_pages,
                                       cache_seqlens=self.cache_seqlens,
                                       block_table=self.block_table, num_splits=num_splits)


def references(inputs, sequences):
    """{sequence: float64 reference output (Sq, H, 512)}: the query heads' rows stacked as the
    rows of the one latent head (non-causal, so rows are independent)."""
    refs = {}
    for b in sequences:
        q = inputs.q[b].double()                                        # (Sq, H, 576)
        rows = q.reshape(1, -1, 1, HEAD_DIM)
        k = inputs.latent[b:b + 1].double()
        out, _ = attention_reference(rows, k, k[..., :HEAD_DIM_V])
        refs[b] = out.view(*q.shape[:2], HEAD_DIM_V)
    return refs
