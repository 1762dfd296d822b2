"""flashattn/bench/decode_plan.py restates the CUDA executor's plan for a 16-bit decode (GQA
packing, tiles, split-KV's count) so the decode bench can print it: its constants are
plan_fwd.h's, and its splits and CTAs are the C++ plan's (the shim's plan_fwd, which runs
plan_fwd.h) on an H200-like, an A100-like and the shim's own device, over batch sizes, query
tokens, group sizes, head dims and cache lengths, explicit split counts included."""
import json
import os
import re
import runpy

import pytest
import torch

from executors import make_executor
from flashattn.bench import decode_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = {"h200": dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin_bytes=227 * 1024),
           "a100": dict(cc_major=8, cc_minor=0, sm_count=108, smem_optin_bytes=163 * 1024),
           "shim": dict(cc_major=8, cc_minor=0, sm_count=8, smem_optin_bytes=227 * 1024)}


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def test_constants_are_plan_fwd_h_s():
    with open(os.path.join(REPO, "csrc", "cuda", "plan_fwd.h")) as f:
        header = f.read()
    found = dict(re.findall(r"constexpr int(?:64_t)? k(Split\w+|MaxSplits) = (\d+);", header))
    assert {name: int(value) for name, value in found.items()} == decode_plan.SPLIT_MODEL
    with open(os.path.join(REPO, "csrc", "cuda", "plan_fwd.h")) as f:
        assert "constexpr int kFwdFewRows = kMmaM;" in f.read()  # 16 (traits.h)


def test_tiles_are_the_kernel_list_s():
    """The 16-bit forward's (qk, v) tiles, in the dispatch's order (csrc/cuda/kernel_list.py)."""
    kl = runpy.run_path(os.path.join(REPO, "csrc", "cuda", "kernel_list.py"))
    assert list(decode_plan.HEAD_DIM_TILES) == kl["head_dim_pairs"]("fwd_16bit")


@pytest.mark.parametrize("device", sorted(DEVICES))
@pytest.mark.parametrize("head_dim", [64, 100, 128, 256])
def test_splits_and_ctas_are_the_cuda_plan_s(sim, device, head_dim):
    shapes = [(1, 1, 32, 8), (4, 1, 32, 8), (128, 1, 32, 8), (1, 4, 32, 8), (2, 16, 16, 2),
              (1, 16, 32, 4), (3, 30, 6, 2), (1, 57, 16, 2), (2, 20, 8, 8), (1, 1, 64, 1)]
    for batch, q_len, heads, heads_kv in shapes:
        for kv_len in (300, 4096, 32768, 131072):
            for requested in (0, 3):
                q = torch.zeros(batch, q_len, heads, head_dim, dtype=torch.bfloat16)
                kv = torch.zeros(head_dim, dtype=torch.bfloat16).expand(batch, kv_len, heads_kv,
                                                                       head_dim)
                plan = json.loads(sim.ops.plan_fwd(q, kv, kv, causal=True,
                                                   num_splits=requested, **DEVICES[device]))
                got = decode_plan.decode_launch(batch, q_len, heads, heads_kv, head_dim, kv_len,
                                                DEVICES[device]["sm_count"], requested)
                grid = plan["grid"]
                want = (plan["num_splits"], grid[0] * grid[1] * grid[2])
                assert got == want, (batch, q_len, heads, heads_kv, head_dim, kv_len, requested)


@pytest.mark.parametrize("device", sorted(DEVICES))
@pytest.mark.parametrize("dims", [(576, 512), (512, 512), (192, 128), (128, 64)], ids=str)
def test_mla_splits_and_ctas_are_the_cuda_plan_s(sim, device, dims):
    """A value head dim of its own (the decode bench's MLA row: 576 / 512, one latent kv head):
    the first tile that covers both dims ((192, 128) its own, 64 keys per tile), the split
    model's (head_dim + head_dim_v) bytes per key and its merge's head_dim_v columns."""
    head_dim, head_dim_v = dims
    for batch, q_len, heads in ((1, 1, 128), (4, 1, 128), (32, 1, 16), (2, 2, 64), (1, 4, 128)):
        for kv_len in (300, 4096, 65536):
            for requested in (0, 3):
                q = torch.zeros(batch, q_len, heads, head_dim, dtype=torch.bfloat16)
                k = torch.zeros(head_dim, dtype=torch.bfloat16).expand(batch, kv_len, 1, head_dim)
                v = k[..., :head_dim_v]
                plan = json.loads(sim.ops.plan_fwd(q, k, v, num_splits=requested,
                                                   **DEVICES[device]))
                got = decode_plan.decode_launch(batch, q_len, heads, 1, head_dim, kv_len,
                                                DEVICES[device]["sm_count"], requested,
                                                head_dim_v=head_dim_v)
                grid = plan["grid"]
                assert got == (plan["num_splits"], grid[0] * grid[1] * grid[2]), (
                    batch, q_len, heads, kv_len, requested)
