"""The executors the correctness matrix runs on.

cpu   torch.ops.flashattn on CPU tensors (the CPU kernels)
cuda  torch.ops.flashattn on CUDA tensors; skipped without a GPU
"""
import pytest
import torch

EXECUTORS = ["cpu", "cuda"]


class Executor:
    def __init__(self, name, device, ops):
        self.name, self.device, self.ops = name, device, ops

    def fwd(self, q, k, v, softmax_scale, causal=False, window=(-1, -1), softcap=0.0,
            alibi_slopes=None, align_bottom_right=True):
        return self.ops.fwd(q, k, v, softmax_scale, causal, window[0], window[1], softcap,
                            alibi_slopes, align_bottom_right, False)

    def bwd(self, dout, q, k, v, out, lse, dlse, softmax_scale, causal=False, window=(-1, -1),
            softcap=0.0, alibi_slopes=None, align_bottom_right=True, deterministic=False):
        return self.ops.bwd(dout, q, k, v, out, lse, dlse, softmax_scale, causal, window[0],
                            window[1], softcap, alibi_slopes, align_bottom_right, deterministic)


def make_executor(name):
    if name == "cpu":
        return Executor("cpu", torch.device("cpu"), torch.ops.flashattn)
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU on this machine")
        return Executor("cuda", torch.device("cuda"), torch.ops.flashattn)
    raise ValueError(name)
