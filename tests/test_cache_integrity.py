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
import math
import os
import random
import sys

import torch

import flashattn

SCENARIOS = int(os.environ.get("FLASHATTN_CACHE_SCENARIOS", 300))
SEED = int(os.environ.get("FLASHATTN_CACHE_SEED", 34))

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
PAGE_SIZES = [1, 2, 3, 5, 7, 16, 17, 64, 100, 256]
HEAD_DIMS = [2, 4, 8, 16, 24, 40, 64]
GUARD = 7  # elements before and after each buffer


def nonzero_random(n, dtype, gen):
    x = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    return torch.where(x == 0, torch.ones((), dtype=dtype), x)


class Buffer:
    """A flat buffer of random non-zero values, with views laid out in it by shape, a drawn
    order of the leading dims in memory, and padding; `view(flat)` rebuilds the same views on
    a clone of the buffer."""

    def __init__(self, rng, gen, shape, dtype, packed):
        self.shape, self.packed = list(shape), packed
        lead = list(range(len(shape) - 1))
        self.order = lead[:]
        rng.shuffle(self.order)
        self.pad = [rng.choice([0, 0, 1, 3]) for _ in shape]
        self.pad[-1] = rng.choice([0, 0, 2])  # padding after the contiguous last dim
        padded = [n + p for n, p in zip(shape, self.pad)]
        self.stored = [padded[d] for d in self.order] + [padded[-1]]
        if packed:  # k and v interleaved: [..., 2, last] with the pair just above the last dim
            self.stored = self.stored[:-1] + [2] + self.stored[-1:]
        numel = math.prod(self.stored)
        self.flat = nonzero_random(numel + 2 * GUARD, dtype, gen)

    def views(self, flat):
        body = flat[GUARD:flat.numel() - GUARD].view(self.stored)
        parts = body.unbind(-2) if self.packed else [body]
        inverse = [self.order.index(d) for d in range(len(self.shape) - 1)] + [len(self.shape) - 1]
        index = tuple(slice(0, n) for n in self.shape)
        return [p.permute(inverse)[index] for p in parts]


def rotary_reference(x, cos, sin, position, rotary_dim, interleaved):
    """x (heads, head_dim) rotated at `position`, in float64: (value, bound on |x| terms)."""
    x64, out = x.double(), x.double().clone()
    c, s = cos[position].double(), sin[position].double()
    half = rotary_dim // 2
    i = torch.arange(half)
    a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
    xa, xb = x64[:, a], x64[:, b]
    out[:, a], out[:, b] = xa * c - xb * s, xb * c + xa * s
    magnitude = torch.zeros_like(out)
    magnitude[:, a] = (xa * c).abs() + (xb * s).abs()
    magnitude[:, b] = (xb * c).abs() + (xa * s).abs()
    return out, magnitude


def draw_scenario(rng, seed):
    gen = torch.Generator().manual_seed(seed)
    s = dict(seed=seed)
    s["dtype"] = dtype = rng.choice(DTYPES)
    s["paged"] = paged = rng.random() < 0.5
    batch = s["batch"] = rng.randint(1, 4)
    heads_kv = rng.randint(1, 3)
    heads = heads_kv * rng.randint(1, 3)
    head_dim = rng.choice(HEAD_DIMS)
    seqlen_q = rng.choice([1, 1, 2, 4])
    new = s["new"] = rng.choice([0, 1, 1, 2, 3, 5])
    capacity = rng.choice([1, 2, 5, 16, 17, 64, 129, 300]) + new
    lengths = s["lengths"] = [rng.randint(0, capacity - new) for _ in range(batch)]
    kwargs = s["kwargs"] = dict(causal=rng.random() < 0.5, num_splits=rng.choice([0, 1, 2, 3]))
    packed = s["packed"] = rng.random() < 0.25
    if paged:
        page = s["page"] = rng.choice(PAGE_SIZES)
        blocks_per_seq = max(1, -(-capacity // page))
        num_blocks = batch * blocks_per_seq + rng.randint(0, 4)
        table = torch.randperm(num_blocks, generator=gen)[:batch * blocks_per_seq]
        table = table.view(batch, blocks_per_seq).clone()
        if batch > 1 and rng.random() < 0.3:
            # Prefix sharing: sequence b reads sequence 0's full pages below both lengths; the
            # appends all land at or above their own length, so never in a shared page.
            for b in range(1, batch):
                shared = min(lengths[0], lengths[b]) // page
                table[b, :shared] = table[0, :shared]
        s["block_table"] = table.to(torch.int32)
        cache_shape = (num_blocks, page, heads_kv, head_dim)
    else:
        batch_cache = batch
        if rng.random() < 0.5:
            batch_cache += rng.randint(0, 3)
            s["cache_batch_idx"] = torch.randperm(batch_cache, generator=gen)[:batch].to(torch.int32)
        if rng.random() < 0.5:
            s["cache_leftpad"] = torch.tensor([rng.randint(0, n) for n in lengths],
                                              dtype=torch.int32)
        cache_shape = (batch_cache, capacity, heads_kv, head_dim)
    if packed:
        s["buffers"] = [Buffer(rng, gen, cache_shape, dtype, packed=True)]
    else:
        s["buffers"] = [Buffer(rng, gen, cache_shape, dtype, packed=False) for _ in range(2)]
    s["q"] = nonzero_random(batch * seqlen_q * heads * head_dim, dtype, gen).view(
        batch, seqlen_q, heads, head_dim)
    if new:
        s["k"] = nonzero_random(batch * new * heads_kv * head_dim, dtype, gen).view(
            batch, new, heads_kv, head_dim)
        s["v"] = nonzero_random(batch * new * heads_kv * head_dim, dtype, gen).view(
            batch, new, heads_kv, head_dim)
        if rng.random() < 0.5:
            rotary_dim = 2 * rng.randint(1, head_dim // 2)
            rows = capacity + seqlen_q + rng.randint(0, 3)
            angles = torch.rand(rows, rotary_dim // 2, generator=gen, dtype=torch.float64) * 1e3
            s["rotary_cos"], s["rotary_sin"] = angles.cos().to(dtype), angles.sin().to(dtype)
            s["rotary_dim"] = rotary_dim
            s["kwargs"]["rotary_interleaved"] = rng.random() < 0.5
    return s


def describe(s):
    keys = ["seed", "dtype", "paged", "page", "packed", "batch", "new", "lengths", "rotary_dim",
            "kwargs"]
    return {k: s[k] for k in keys if k in s}


def caches(s, flats):
    if s["packed"]:
        return s["buffers"][0].views(flats[0])
    return [s["buffers"][0].views(flats[0])[0], s["buffers"][1].views(flats[1])[0]]


def target(s, b, position):
    """(entry, row) of the cache that sequence b's key at `position` lives in."""
    if s["paged"]:
        page = s["page"]
        return int(s["block_table"][b, position // page]), position % page
    idx = s.get("cache_batch_idx")
    return (b if idx is None else int(idx[b])), position


def run_scenario(s):
    """Calls flash_attn_with_kvcache on scenario s and checks every byte of its caches'
    buffers; raises AssertionError with the scenario on a difference."""
    dtype = s["dtype"]
    flats = [buf.flat for buf in s["buffers"]]
    before = [f.clone() for f in flats]
    k_cache, v_cache = caches(s, flats)
    flashattn.flash_attn_with_kvcache(
        s["q"], k_cache, v_cache, k=s.get("k"), v=s.get("v"),
        rotary_cos=s.get("rotary_cos"), rotary_sin=s.get("rotary_sin"),
        cache_seqlens=torch.tensor(s["lengths"], dtype=torch.int32),
        cache_batch_idx=s.get("cache_batch_idx"), cache_leftpad=s.get("cache_leftpad"),
        block_table=s.get("block_table"), **s["kwargs"])
    # The expected buffers: the originals with the appended rows written.
    expected = [f.clone() for f in before]
    exp_k, exp_v = caches(s, expected)
    rotary_dim = s.get("rotary_dim", 0)
    eps = torch.finfo(dtype).eps
    compute_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    tiny = torch.finfo(dtype).tiny
    for b, length in enumerate(s["lengths"]):
        for t in range(s["new"]):
            entry, row = target(s, b, length + t)
            exp_v[entry, row] = s["v"][b, t]
            key = s["k"][b, t]
            exp_k[entry, row] = key
            if rotary_dim:
                ref, magnitude = rotary_reference(key, s["rotary_cos"], s["rotary_sin"],
                                                  length + t, rotary_dim,
                                                  s["kwargs"]["rotary_interleaved"])
                got = k_cache[entry, row].double()
                bound = (eps * ref.abs() + 2 * compute_eps * magnitude + tiny)[:, :rotary_dim]
                err = (got[:, :rotary_dim] - ref[:, :rotary_dim]).abs()
                assert bool((err <= bound).all()), (
                    f"rotated key {t} of sequence {b}: error {float(err.max()):.3g} beyond "
                    f"rounding {float(bound[err > bound].min()):.3g}; scenario {describe(s)}")
                # Within rounding: take the kernel's rotated dims, compare all the rest bitwise.
                exp_k[entry, row, :, :rotary_dim] = k_cache[entry, row, :, :rotary_dim]
    for name, got, want in zip(["k/v buffer" if s["packed"] else "k_cache buffer",
                                "v_cache buffer"], flats, expected):
        same = got.view(torch.uint8) == want.view(torch.uint8)
        if not bool(same.all()):
            bad = (~same).nonzero().flatten()
            first = int(bad[0]) // got.element_size()
            raise AssertionError(
                f"{name}: {bad.numel()} bytes differ (first at element {first} of the buffer, "
                f"{GUARD} guard elements first): a row outside the append written, or an "
                f"appended row wrong; scenario {describe(s)}")


def features_of(s):
    seen = {k for k in ("block_table", "cache_batch_idx", "cache_leftpad", "rotary_dim") if k in s}
    seen |= {f"page{s['page']}"} if s["paged"] else set()
    seen |= {"packed"} if s["packed"] else set()
    seen |= {f"new{s['new']}", str(s["dtype"])}
    if s["paged"] and s["lengths"][0] >= s["page"] and any(
            int(s["block_table"][b, 0]) == int(s["block_table"][0, 0]) for b in range(1, s["batch"])):
        seen.add("shared_prefix")
    return seen


def run_campaign(scenarios, seed):
    """Runs the scenarios; returns the features they drew."""
    rng = random.Random(seed)
    seen = set()
    for i in range(scenarios):
        s = draw_scenario(rng, rng.randrange(2**31))
        run_scenario(s)
        seen |= features_of(s)
    return seen


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
