"""Nothing lost, nothing corrupted in a KV cache (issue 34): random dense and paged caches and
appends through flash_attn_with_kvcache, each checked bit for bit.

Each scenario draws a cache (dense, or paged with a page size from 1 up, powers of 2 and not),
its layout (any order of the leading dims in memory, padding between them, k and v in separate
buffers or packed in one as kv[:, :, 0] / kv[:, :, 1]), a block table (a random permutation of a
random subset of the pages; some sequences share their prefix's full pages, which they only
read), cache_batch_idx (a permutation of a subset of a larger cache's entries), cache_leftpad,
cache_seqlens, an append of 0-5 new keys, with or without rotary embeddings (interleaved or
not, any rotary_dim), causal or not, num_splits, and the dtype.

The buffers the caches are views of, guard elements before and after included, are filled with
random values (never 0) and cloned. After the call:
  * every byte of the buffers outside the rows the append owns is bitwise unchanged;
  * the appended value rows hold exactly v; the appended key rows hold exactly k, except for
    the first rotary_dim dims of each, which hold k rotated at its position: within the
    rounding of the float64 rotation of the same k, cos and sin (one rounding to the dtype plus
    the compute type's error);
  * rows no sequence owns but that a sequence reads are unchanged (they are in the first
    point).

CI runs a fixed-seed budget; a campaign of fresh scenarios:

    FLASHATTN_CACHE_SCENARIOS=2000 FLASHATTN_CACHE_SEED=$RANDOM \\
        python -m pytest tests/test_cache_integrity.py -p no:cacheprovider -q

Run as a script, it prints the figure: python tests/test_cache_integrity.py 2000 <seed>
"""
import os
import random
import sys

import flashattn
from cache_scenarios import (DTYPES, PAGE_SIZES, describe, draw_scenario,  # noqa: F401
                             run_campaign, run_scenario)

SCENARIOS = int(os.environ.get("FLASHATTN_CACHE_SCENARIOS", 300))
SEED = int(os.environ.get("FLASHATTN_CACHE_SEED", 34))


def test_random_caches_keep_every_entry_outside_the_append_and_hold_exactly_the_new_rows():
    seen = run_campaign(SCENARIOS, SEED)
    # The drawing reached every feature it claims (guards against a generator that silently
    # stops drawing one).
    want = ({"block_table", "cache_batch_idx", "cache_leftpad", "rotary_dim", "packed",
             "shared_prefix"} | {f"page{p}" for p in PAGE_SIZES}
            | {f"new{n}" for n in (0, 1, 2, 3, 5)} | {str(d) for d in DTYPES})
    assert want <= seen, f"never drawn: {sorted(want - seen)}"


def test_a_write_one_row_too_far_is_detected(monkeypatch):
    """The checker itself: an append that also writes the row after the last new key (the bug
    the issue describes: another request's data overwritten) fails the scenario."""
    real = flashattn.flash_attn_with_kvcache

    def one_row_too_far(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, **kwargs):
        out = real(q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens, **kwargs)
        table = kwargs.get("block_table")
        position = int(cache_seqlens[0]) + k.shape[1]
        if table is not None:
            page = k_cache.shape[1]
            k_cache[int(table[0, position // page]), position % page] = k[0, -1]
        else:
            k_cache[0, position] = k[0, -1]
        return out

    monkeypatch.setattr(flashattn, "flash_attn_with_kvcache", one_row_too_far)
    rng, caught = random.Random(SEED), 0
    while caught < 20:
        s = draw_scenario(rng, rng.randrange(2**31))
        room = (s["block_table"].shape[1] * s["page"] if s["paged"]
                else s["buffers"][0].shape[1]) - s["lengths"][0] - s["new"]
        if (not s["new"] or room <= 0 or "cache_batch_idx" in s or "rotary_dim" in s):
            continue
        try:
            run_scenario(s)
        except AssertionError as e:
            assert "bytes differ" in str(e)
            caught += 1
        else:
            raise AssertionError(f"a write one row too far went unnoticed: {describe(s)}")


if __name__ == "__main__":
    import time
    n, seed = int(sys.argv[1]), int(sys.argv[2])
    start = time.time()
    run_campaign(n, seed)
    print(f"{n} cache scenarios (seed {seed}): 0 entries changed outside the appended rows, "
          f"every appended row exact; {time.time() - start:.1f} s")
