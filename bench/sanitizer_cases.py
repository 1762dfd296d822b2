"""One small forward+backward per CUDA kernel family, for compute-sanitizer (bench/gpu_check.sh).

Sizes are tails on purpose (not multiples of any tile) so out-of-bounds accesses show up."""
import torch

import flashattn

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = (32, 64, 96, 128, 192, 256)


def main():
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for causal, deterministic in ((False, False), (True, True)):
                q = torch.randn(1, 77, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                k = torch.randn(1, 93, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                v = torch.randn(1, 93, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                out = flashattn.flash_attn_func(q, k, v, causal=causal, softcap=5.0,
                                                deterministic=deterministic)
                out.sum().backward()
    torch.cuda.synchronize()
    print("sanitizer cases ran")


if __name__ == "__main__":
    main()
