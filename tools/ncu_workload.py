"""The workload that tools/gpu_check.sh profiles with Nsight Compute, to calibrate
tools/gpu_model.py: one forward and two backwards (dQ by atomics, then the deterministic dQ
kernel) at the model's shape, bf16, d = 128, N = 4096, batch 4, 16 heads (16k tokens, hidden
2048), not causal. gpu_model.json's records for that shape count the same launches on the shim,
so ncu's instruction and shared-memory counters can be set beside the shim's counts.

    ncu --clock-control none -k regex:'fwd_kernel_16bit|bwd_dkdv|bwd_dq_kernel' \\
        python tools/ncu_workload.py
"""
import torch

import flashattn

BATCH, SEQLEN, HEADS, HEAD_DIM = 4, 4096, 16, 128


def main():
    torch.manual_seed(0)
    shape = (BATCH, SEQLEN, HEADS, HEAD_DIM)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for deterministic in (False, True):
        out = flashattn.flash_attn_func(q, k, v, deterministic=deterministic)
        out.backward(dout)
    torch.cuda.synchronize()
    print("ncu_workload: done", flush=True)


if __name__ == "__main__":
    main()
