"""One small forward+backward per CUDA kernel family, and KV-cache decoding steps, for
compute-sanitizer (tools/gpu_check.sh).

Sizes are tails on purpose (not multiples of any tile) so out-of-bounds accesses show up."""
import os
import runpy

import torch

import flashattn

# Every compiled kernel gets a case: each dtype of the one list of instantiations,
# csrc/cuda/kernel_list.py, on each (head_dim, head_dim_v) tile of any family (a 16-bit tile that
# is no fp32 tile runs fp32 on the next larger one; the backward and fp32 stop at 256, traits.h).
# tests/test_kernel_list.py checks the coverage.
KERNEL_LIST = runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "csrc", "cuda", "kernel_list.py"))
FP8 = torch.float8_e4m3fn
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "e4m3": FP8}
DTYPES = tuple(TORCH_DTYPES[d] for d in KERNEL_LIST["ELEMENTS"])
# The FP8 forward's tiles (kernel_list.py HEAD_DIMS_SM90_FP8): forward only, sm_90 only.
FP8_HEAD_DIM_PAIRS = tuple((d, d) for d in KERNEL_LIST["HEAD_DIMS_SM90_FP8"])
HEAD_DIM_PAIRS = tuple(sorted({(k.head_dim, k.head_dim if k.head_dim_v is None else k.head_dim_v)
                               for k in KERNEL_LIST["KERNELS"] if k.head_dim is not None}))
MAX_HEAD_DIM_BWD = 256  # traits.h kMaxHeadDimBwd and kMaxHeadDimSimt


def runs(dims, dtype, backward=False):
    """Whether the CUDA kernels take the pair in the dtype (in the backward)."""
    if dtype == FP8:
        return not backward and dims in FP8_HEAD_DIM_PAIRS
    return (dtype != torch.float32 and not backward) or max(dims) <= MAX_HEAD_DIM_BWD


def decode_cases(dtype):
    """flash_attn_with_kvcache with GQA (8 / 2 heads): one and five query tokens (packed as the
    rows of one tile, cuda/gqa_decode.h), a paged cache of 16-token pages with an append, one
    and three splits, and ALiBi (a tile per query head); then a block table with indices outside
    the pool and lengths past it, which the kernels must clamp without a host check."""
    for head_dim in (64, 256):
        for seqlen_q in (1, 5):
            for num_splits, alibi in ((1, False), (3, False), (0, True)):
                q = torch.randn(3, seqlen_q, 8, head_dim, device="cuda", dtype=dtype)
                k_cache = torch.randn(20, 16, 2, head_dim, device="cuda", dtype=dtype)
                v_cache = torch.randn_like(k_cache)
                block_table = torch.randperm(20, device="cuda", dtype=torch.int32)[:18].view(3, 6)
                k_new = torch.randn(3, seqlen_q, 2, head_dim, device="cuda", dtype=dtype)
                v_new = torch.randn_like(k_new)
                seqlens = torch.tensor([0, 41, 90], device="cuda", dtype=torch.int32)
                slopes = torch.rand(8, device="cuda") if alibi else None
                flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                  cache_seqlens=seqlens, block_table=block_table,
                                                  causal=True, alibi_slopes=slopes,
                                                  num_splits=num_splits)
            bad_table = block_table.clone()
            bad_table[0, 1], bad_table[1, 0], bad_table[2, 5] = -1, 20, 2**31 - 1
            bad_lengths = torch.tensor([95, -4, 2**31 - 8], device="cuda", dtype=torch.int32)
            flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=bad_lengths,
                                              block_table=bad_table, causal=True, num_splits=3)


def fp8_cases():
    """The FP8 forward (csrc/fp8_args.h) with GQA, descales and ragged tails, each of its loops
    (no mask, causal, a sliding window, each with softcap or not, ALiBi or not), and a packed GQA
    decode (Sq = 1, 4 query heads per kv head), where it runs: an sm_90 GPU with
    FLASHATTN_CUDA_HOPPER=1. Elsewhere the call must be refused, saying what it needs."""
    runs_here = (torch.cuda.get_device_capability() == (9, 0)
                 and os.environ.get("FLASHATTN_CUDA_HOPPER") == "1")
    for head_dim, _ in FP8_HEAD_DIM_PAIRS:
        shapes = [(77, 4, causal, window, softcap, alibi)
                  for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (20, 5)))
                  for softcap in (0.0, 3.0) for alibi in (False, True)]
        for sq, hq, causal, window, softcap, alibi in shapes + [(1, 8, True, (-1, -1), 0.0, False)]:
            q = torch.randn(2, sq, hq, head_dim, device="cuda").to(FP8)
            k, v = (torch.randn(2, 93, 2, head_dim, device="cuda").to(FP8) for _ in range(2))
            descales = {name: torch.rand(2, 2, device="cuda") + 0.5
                        for name in ("q_descale", "k_descale", "v_descale")}
            slopes = torch.rand(hq, device="cuda") * 0.1 if alibi else None
            try:
                flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                          softcap=softcap, alibi_slopes=slopes, **descales)
            except RuntimeError as error:
                if runs_here or "FP8" not in str(error):
                    raise


def main():
    for dtype in DTYPES:
        if dtype == FP8:
            fp8_cases()
            continue
        for dims in HEAD_DIM_PAIRS:
            if not runs(dims, dtype):
                continue
            head_dim, head_dim_v = dims
            for causal, deterministic in ((False, False), (True, True)):
                q = torch.randn(1, 77, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                k = torch.randn(1, 93, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                v = torch.randn(1, 93, 2, head_dim_v, device="cuda", dtype=dtype,
                                requires_grad=True)
                out = flashattn.flash_attn_func(q, k, v, causal=causal, softcap=5.0,
                                                deterministic=deterministic)
                if runs(dims, dtype, backward=True):
                    out.sum().backward()
        decode_cases(dtype)
    torch.cuda.synchronize()
    print("sanitizer cases ran")


if __name__ == "__main__":
    main()
