"""Random KV-cache scenarios and their bytewise check (issue 34), shared by the CPU test
(test_cache_integrity.py) and the shim's (test_cudasim_cache_integrity.py): draw_scenario draws
a cache, its layout and an append; run_scenario calls a flash_attn_with_kvcache-like function
on it and checks every byte of the caches' buffers (see test_cache_integrity.py's docstring).

The function is flashattn.flash_attn_with_kvcache unless given (looked up at each call, so a
test can patch it); the shim passes a wrapper of torch.ops.flashattn_sim.fwd_kvcache. The draws
are the same for a given (seed, dtypes): the CPU's stream of scenarios is unchanged by the move.
"""
import math
import random

import torch

import flashattn

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


def draw_scenario(rng, seed, dtypes=DTYPES):
    gen = torch.Generator().manual_seed(seed)
    s = dict(seed=seed)
    s["dtype"] = dtype = rng.choice(dtypes)
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


def run_scenario(s, kvcache=None):
    """Calls kvcache (default: flashattn.flash_attn_with_kvcache) on scenario s and checks
    every byte of its caches' buffers; raises AssertionError with the scenario on a
    difference."""
    dtype = s["dtype"]
    flats = [buf.flat for buf in s["buffers"]]
    before = [f.clone() for f in flats]
    k_cache, v_cache = caches(s, flats)
    (kvcache or flashattn.flash_attn_with_kvcache)(
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


def run_campaign(scenarios, seed, dtypes=DTYPES, kvcache=None):
    """Runs the scenarios; returns the features they drew."""
    rng = random.Random(seed)
    seen = set()
    for i in range(scenarios):
        s = draw_scenario(rng, rng.randrange(2**31), dtypes)
        run_scenario(s, kvcache)
        seen |= features_of(s)
    return seen
