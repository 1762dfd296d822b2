"""Nothing lost, nothing corrupted in a KV cache, on the shim (issue 34): test_cache_integrity.py's
random scenarios (tests/cache_scenarios.py: dense and paged caches, page sizes 1 to 256, block
tables as permutations with shared read-only prefixes, cache_batch_idx, cache_leftpad, packed
k/v, appends of 0-5 keys with and without rotary, causal, num_splits 0-3) through the CUDA
kernels' own source, torch.ops.flashattn_sim.fwd_kvcache, in the CUDA dtypes (float16,
bfloat16, float32). Every byte of the caches' buffers outside the appended rows must be
unchanged, the appended rows exact (the rotated dims within the rounding of a float64
rotation).

CI runs a fixed-seed budget; a campaign:

    FLASHATTN_SIM_CACHE_SCENARIOS=2000 FLASHATTN_CACHE_SEED=$RANDOM \\
        python -m pytest tests/test_cudasim_cache_integrity.py -p no:cacheprovider -q
"""
import os

import pytest
import torch

from cache_scenarios import PAGE_SIZES, run_campaign
from executors import make_executor

SCENARIOS = int(os.environ.get("FLASHATTN_SIM_CACHE_SCENARIOS", 150))
SEED = int(os.environ.get("FLASHATTN_CACHE_SEED", 34))
SIM_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def sim_kvcache(ops):
    """flash_attn_with_kvcache's arguments (those the scenarios pass) on the sim op."""
    def call(q, k_cache, v_cache, causal=False, num_splits=0, rotary_interleaved=True, **kwargs):
        return ops.fwd_kvcache(q, k_cache, v_cache, causal=causal, num_splits=num_splits,
                               rotary_interleaved=rotary_interleaved, **kwargs)
    return call


def test_sim_random_caches_keep_every_entry_outside_the_append(sim):
    seen = run_campaign(SCENARIOS, SEED, SIM_DTYPES, sim_kvcache(sim.ops))
    if SCENARIOS >= 60:
        want = ({"block_table", "cache_batch_idx", "cache_leftpad", "rotary_dim", "packed"}
                | {str(d) for d in SIM_DTYPES})
        assert want <= seen, f"never drawn: {sorted(want - seen)}"
        assert any(f"page{p}" in seen for p in PAGE_SIZES), "no paged cache drawn"


if __name__ == "__main__":
    # python tests/test_cudasim_cache_integrity.py N SEED: the figure of a campaign.
    import sys
    import time

    from sim_ext import build

    build.load()
    n, seed = int(sys.argv[1]), int(sys.argv[2])
    start = time.time()
    run_campaign(n, seed, SIM_DTYPES, sim_kvcache(torch.ops.flashattn_sim))
    print(f"{n} shim cache scenarios (seed {seed}): 0 entries changed outside the appended "
          f"rows, every appended row exact; {time.time() - start:.1f} s")
