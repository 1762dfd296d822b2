"""A decoding step captured in a CUDA graph (issue 33): flash_attn_with_kvcache with append,
rotary, a dense or paged cache and split-KV, captured once with torch.cuda.graph and replayed
with new tokens and new cache_seqlens written into the captured buffers, gives the eager
step's outputs and caches bit for bit (the same kernels on the same values), step after step.
The eager step runs under torch.cuda.set_sync_debug_mode("error"): it must not sync.

Needs a CUDA device; the CPU shim's side of this (nothing on the host depends on a device value)
is tests/test_cudasim_capturable_decode.py."""
import math

import pytest
import torch

import flashattn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU on this machine")

BATCH, HEADS, HEADS_KV, HEAD_DIM, ROTARY_DIM = 3, 32, 8, 128, 64
STEPS = 4


class DecodeState:
    """The static buffers a server captures: the step's tokens (q, k, v), cache_seqlens, the
    caches, the block table and the rotary tables. `clone_caches` gives another set of caches
    with the same contents, for the eager run beside the graph."""

    def __init__(self, seqlen_q, page_size, capacity, dtype, interleaved, num_splits):
        g = torch.Generator(device="cuda").manual_seed(seqlen_q * 1000 + (page_size or 0))
        rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda").to(dtype)  # noqa
        self.seqlen_q, self.interleaved, self.num_splits = seqlen_q, interleaved, num_splits
        self.generator, self.dtype = g, dtype
        self.q = rand(BATCH, seqlen_q, HEADS, HEAD_DIM)
        self.k = rand(BATCH, seqlen_q, HEADS_KV, HEAD_DIM)
        self.v = rand(BATCH, seqlen_q, HEADS_KV, HEAD_DIM)
        if page_size is None:
            self.block_table = None
            cache_shape = (BATCH, capacity, HEADS_KV, HEAD_DIM)
        else:
            blocks = math.ceil(capacity / page_size)
            pool = 2 * BATCH * blocks  # unused blocks in the pool, the table shuffled
            self.block_table = torch.randperm(pool, generator=g, device="cuda")[
                :BATCH * blocks].view(BATCH, blocks).to(torch.int32)
            cache_shape = (pool, page_size, HEADS_KV, HEAD_DIM)
        self.k_cache, self.v_cache = rand(*cache_shape), rand(*cache_shape)
        # Lengths that leave room for STEPS appends: different per sequence, one short.
        self.cache_seqlens = torch.tensor([3, capacity // 2, capacity - STEPS * seqlen_q - 1],
                                          dtype=torch.int32, device="cuda")
        angle = torch.rand(capacity + seqlen_q, ROTARY_DIM // 2, generator=g,
                           device="cuda") * 2 * math.pi
        self.cos, self.sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def clone_caches(self):
        return self.k_cache.clone(), self.v_cache.clone()

    def step(self, k_cache, v_cache):
        return flashattn.flash_attn_with_kvcache(
            self.q, k_cache, v_cache, k=self.k, v=self.v, rotary_cos=self.cos,
            rotary_sin=self.sin, cache_seqlens=self.cache_seqlens, block_table=self.block_table,
            causal=True, rotary_interleaved=self.interleaved, num_splits=self.num_splits,
            return_softmax_lse=True)

    def next_tokens(self):
        """New tokens written into the captured buffers, and lengths advanced past the last
        step's append, all on the device (no host values)."""
        for buffer in (self.q, self.k, self.v):
            buffer.copy_(torch.randn(buffer.shape, generator=self.generator, device="cuda"))
        self.cache_seqlens.add_(self.seqlen_q)


CASES = {
    "dense_auto_splits": dict(seqlen_q=1, page_size=None, capacity=8192, interleaved=True,
                              num_splits=0),
    "dense_neox_5_splits": dict(seqlen_q=1, page_size=None, capacity=1000, interleaved=False,
                                num_splits=5),
    "paged_16_auto_splits": dict(seqlen_q=1, page_size=16, capacity=8192, interleaved=True,
                                 num_splits=0),
    "paged_1_speculative_4": dict(seqlen_q=4, page_size=1, capacity=700, interleaved=True,
                                  num_splits=3),
    "paged_64_speculative_16": dict(seqlen_q=16, page_size=64, capacity=4096, interleaved=False,
                                    num_splits=0),
    "no_split": dict(seqlen_q=1, page_size=16, capacity=2048, interleaved=True, num_splits=1),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_captured_decode_replays_as_eager(case, dtype):
    state = DecodeState(**CASES[case], dtype=dtype)
    graph_caches, eager_caches = state.clone_caches(), state.clone_caches()
    lengths_at_capture = state.cache_seqlens.clone()

    # Warm up on a side stream (torch.cuda.graphs' rule), on throwaway caches.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        state.step(*state.clone_caches())
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, graph_lse = state.step(*graph_caches)
    torch.cuda.synchronize()
    # Capturing ran nothing: the graph's caches are as they were.
    assert torch.equal(graph_caches[0], state.k_cache) and torch.equal(graph_caches[1],
                                                                      state.v_cache)
    assert torch.equal(state.cache_seqlens, lengths_at_capture)

    for step in range(STEPS):
        if step:
            state.next_tokens()
        graph.replay()
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager_out, eager_lse = state.step(*eager_caches)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert not torch.isnan(eager_out).any(), step
        assert torch.equal(graph_out, eager_out), step
        assert torch.equal(graph_lse, eager_lse), step
        assert torch.equal(graph_caches[0], eager_caches[0]), step
        assert torch.equal(graph_caches[1], eager_caches[1]), step
    # The lengths moved, so the replays really attended over new keys.
    assert not torch.equal(state.cache_seqlens, lengths_at_capture)
