"""Packed-GQA decodes on the sm_90a forward (csrc/cuda/gqa_decode.h, hopper/fwd_sm90_kernel.cuh): a
decode whose query heads the plan packs (the sm_80 plan's one decision, can_pack_gqa_decode) runs
the Hopper kernel with the g query heads of one kv head as the rows of one CTA, token-major,
floor(64 / g) tokens per consumer warpgroup (hopper::fwd_sm90_consumer_tokens).

The library path, on the shim's H100 opted in (conftest.py `hopper`): flash_attn_func's op
(torch.ops.flashattn_sim.fwd) on dense K/V and flash_attn_with_kvcache's (fwd_kvcache) on paged
(page sizes 1, 16, 256), indexed and dense caches with cache_seqlens; g = 2, 4, 5, 6, 8 (5 and 6
leave idle rows in each consumer's 64), Sq 1, 2, 7 and enough tokens for two query tiles, Sk 1,
63, 65, 257 and caches of a few hundred keys, causal / a local window / none, split-KV 1 and more.
Outputs are poisoned before the kernel writes them (conftest.py); out and lse are compared with
the float64 reference within 2x PyTorch's own error (checks.check_forward, test_kvcache.Case).
Each case runs under the forward, reverse and a random warp schedule (with lazy, eager and
random TMA completion). The shim's counters show that the Hopper kernel ran, on a grid of kv heads
(or, for the kernels that walk tiles, one CTA per SM: hopper/fwd_sm90_walk.h), and that each (batch, kv head) read its K/V tiles once: the TMA (dense) or cp.async (gathered)
bytes are exactly the key tiles of the kv heads' CTAs (key_tile_loads below), not g times them.
"""
import pytest
import torch

from checks import MASKS, check_forward
from hopper_sim import ELEMENTS, SCHEDULES, launched, schedule_fixture
from test_kvcache import Case

schedule = schedule_fixture([SCHEDULES[0], SCHEDULES[2], SCHEDULES[4]])

ROW_BYTES = 128  # a 128-byte swizzle row: 64 16-bit elements


def key_tile(d):
    return 128 if d <= 128 else 64


def consumer_tokens(g):
    return 64 // g


def q_box(g):
    """(boxes, tokens per box) of one CTA's Q load (hopper/fwd_sm90_params.h fwd_sm90_q_box_tokens)."""
    tokens = 128 // g if 64 % g == 0 else 64 // g
    return (1 if g * tokens == 128 else 2), tokens


def key_range(t0, t1, sq, sk, window, n):
    """The key tiles [lo, hi) a query tile of tokens [t0, t1) visits (fwd_sm90_mask.cuh KeyTiles,
    bottom-right aligned)."""
    left, right = window
    every = -(-sk // n)
    lo, hi = 0, every
    offset = sk - sq
    if right >= 0:
        last = t1 + offset + right
        hi = min(max(-(-last // n) if last > 0 else 0, 0), every)
    if left >= 0:
        first = t0 + offset - left
        lo = first // n if first > 0 else 0
    return min(lo, hi), hi


def key_tile_loads(g, d, sq, seqlens_k, heads_kv, window, splits):
    """(Q bytes, K/V tile count, K/V keys read) over the kernel's CTAs: one per (batch, kv head,
    query tile, split part) with keys to visit. K/V tiles are counted once per kv head."""
    q_bytes = tiles = keys = 0
    boxes, box_tokens = q_box(g)
    step = 2 * consumer_tokens(g)
    n = key_tile(d)
    for sk in seqlens_k:
        for t0 in range(0, sq, step):
            lo, hi = key_range(t0, min(t0 + step, sq), sq, sk, window, n)
            for part in range(splits):
                a, b = lo + (hi - lo) * part // splits, lo + (hi - lo) * (part + 1) // splits
                if b <= a:
                    continue
                q_bytes += heads_kv * (d // 64) * boxes * g * box_tokens * ROW_BYTES
                tiles += heads_kv * (b - a)
                keys += heads_kv * sum(min(n, sk - j * n) for j in range(a, b))
    return q_bytes, tiles, keys


def the_forward(counters, dtype, d, mask, gathered):
    """The one forward launch, which must be the Hopper kernel's main loop for the mask."""
    kernels = launched(counters)
    forward = [launch for launch in counters["launches"]
               if "fwd_sm90_kernel" in launch["kernel"] or "fwd_kernel" in launch["kernel"]]
    assert len(forward) == 1, kernels
    causal, local = mask == "causal", mask == "local"
    name = (f"fwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {str(causal).lower()}, false, "
            f"{str(local).lower()}, false, false, {str(gathered).lower()}, false>")
    assert name in forward[0]["kernel"], kernels
    return forward[0]


# The shim's SM count (cudasim::sm_count's default): a walking launch's CTAs.
SHIM_SMS = 2


def walks(d, mask, gathered):
    """Whether the kernel walks tiles (hopper/fwd_sm90_walk.h fwd_sm90_walks): the dense ones at
    d = 64, and at d = 128 without a window."""
    return not gathered and (d == 64 or (d == 128 and mask != "local"))


def check_loads(launch, g, d, sq, seqlens_k, batch, heads_kv, window, gathered, walk_splits=None):
    """The grid is (query tiles x splits, Hkv, B), or for a kernel that walks tiles (walk_splits:
    the call's split count) min(those tiles, the shim's SMs) CTAs, and the bytes loaded are
    exactly Q once per tile and each kv head's key tiles once. Returns the split count."""
    tiles_q = -(-sq // (2 * consumer_tokens(g)))
    c = launch["counters"]

    def loads_match(splits):
        q_bytes, tiles, keys = key_tile_loads(g, d, sq, seqlens_k, heads_kv, window, splits)
        assert tiles > 0
        if gathered:  # K and V by cp.async (rows past the sequence are zero-filled: 0 bytes read)
            return c["tma"]["load"]["bytes"] == q_bytes and c["cp_async"]["bytes"] == 2 * keys * d * 2
        # K and V by TMA: whole tiles
        return (c["tma"]["load"]["bytes"] == q_bytes + 2 * tiles * key_tile(d) * (d // 64) * ROW_BYTES
                and c["cp_async"]["bytes"] == 0)

    if walk_splits is not None:
        assert launch["grid"] == [min(tiles_q * walk_splits * heads_kv * batch, SHIM_SMS), 1, 1], launch["grid"]
        assert loads_match(walk_splits), c
        return walk_splits
    x, y, z = launch["grid"]
    assert y == heads_kv and z == batch and x % tiles_q == 0, launch["grid"]
    splits = x // tiles_q
    assert loads_match(splits), c
    return splits


WINDOWS = {"none": (-1, -1), "causal": (-1, 0), "local": (20, 3)}
FUNC_MASKS = {"none": MASKS["none"], "causal": MASKS["causal"], "local": dict(window=(20, 3))}

# flash_attn_func decodes on dense K/V (its op never splits): (dtype, d, mask, B, Sq, Sk, Hq, Hkv)
FUNC_CASES = [
    (torch.bfloat16, 128, "causal", 2, 1, 257, 4, 2),     # g = 2
    (torch.float16, 64, "none", 1, 2, 63, 8, 2),          # g = 4
    (torch.bfloat16, 128, "local", 1, 7, 65, 8, 1),       # g = 8 (MQA)
    (torch.float16, 64, "causal", 2, 7, 257, 10, 2),      # g = 5
    (torch.bfloat16, 256, "causal", 1, 2, 1, 12, 2),      # g = 6, one key: the first token sees none
    (torch.float16, 256, "none", 1, 7, 257, 8, 1),        # g = 8, d = 256
    (torch.bfloat16, 64, "causal", 1, 30, 65, 10, 2),     # g = 5: two query tiles of 24 tokens
    (torch.float16, 128, "local", 1, 40, 257, 8, 2),      # g = 4: two query tiles of 32 tokens
]


@pytest.mark.parametrize("dtype, d, mask, b, sq, sk, hq, hkv", FUNC_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_packed_decode_dense(schedule, hopper, dtype, d, mask, b, sq, sk, hq, hkv):
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, dtype=dtype) for _ in range(2))
    _, counters = hopper.counted(lambda: check_forward(hopper, q, k, v, FUNC_MASKS[mask]))
    launch = the_forward(counters, dtype, d, mask, gathered=False)
    splits = check_loads(launch, hq // hkv, d, sq, [sk] * b, b, hkv, WINDOWS[mask], gathered=False,
                         walk_splits=1 if walks(d, mask, False) else None)  # the op never splits
    assert splits == 1


# flash_attn_with_kvcache decodes: (name, Case arguments, mask, gathered)
KVCACHE_CASES = [
    ("page1_g4", dict(page_size=1, seqlen_cache=40, heads=8, heads_kv=2), "causal", True),
    ("page16_g8_split3", dict(page_size=16, seqlen_q=2, seqlen_new=2, heads=8, heads_kv=1,
                              head_dim=128, num_splits=3), "causal", True),
    ("page256_g5_none", dict(page_size=256, seqlen_cache=600, seqlen_q=7, seqlen_new=7, heads=10,
                             heads_kv=2, causal=False), "none", True),
    ("dense_cache_g6_d256", dict(seqlen_cache=257, heads=12, heads_kv=2, head_dim=256,
                                 dtype=torch.float16), "causal", False),
    ("dense_cache_g5_split3", dict(seqlen_cache=700, seqlen_q=7, seqlen_new=7, heads=10,
                                   heads_kv=2, num_splits=3), "causal", False),
    ("dense_cache_g8_d256_split2_none", dict(seqlen_cache=300, heads=8, heads_kv=1, head_dim=256,
                                             num_splits=2, causal=False), "none", False),
    ("batch_idx_g2_local", dict(batch_idx=True, seqlen_q=2, seqlen_new=2, heads=4, heads_kv=2,
                                window=(20, 0), causal=False), "local", True),
    ("leftpad_g4_split2", dict(leftpad=True, heads=8, heads_kv=2, head_dim=128, num_splits=2),
     "causal", True),
]


@pytest.mark.parametrize("name, arguments, mask, gathered", KVCACHE_CASES,
                         ids=[c[0] for c in KVCACHE_CASES])
def test_packed_decode_kvcache(schedule, hopper, name, arguments, mask, gathered):
    case = Case(seed=len(name), **arguments)
    _, counters = hopper.counted(lambda: case.check(hopper.ops))
    d = case.q.shape[-1]
    launch = the_forward(counters, case.q.dtype, d, mask, gathered)
    sq, hq, hkv = case.q.shape[1], case.q.shape[2], case.k_cache.shape[2]
    seqlens_k = [int(n) + case.seqlen_new for n in case.cache_seqlens]
    if case.cache_leftpad is not None:
        seqlens_k = [n - int(pad) for n, pad in zip(seqlens_k, case.cache_leftpad)]
    window = arguments["window"] if mask == "local" else WINDOWS[mask]
    splits = check_loads(launch, hq // hkv, d, sq, seqlens_k, case.batch, hkv, window, gathered,
                         walk_splits=arguments.get("num_splits", 1) if walks(d, mask, gathered) else None)
    if arguments.get("num_splits", 0) > 1:
        assert splits == arguments["num_splits"] and any("split_merge" in k for k in launched(counters))


def test_a_group_above_64_heads_stays_on_sm80(hopper):
    """g = 128 (MQA with 128 query heads) is packed by the sm_80 plan but holds more rows than a
    consumer warpgroup: the sm_80 kernels run it, and are right."""
    q = torch.randn(1, 1, 128, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 65, 1, 64, dtype=torch.bfloat16) for _ in range(2))
    _, counters = hopper.counted(lambda: check_forward(hopper, q, k, v, MASKS["causal"]))
    kernels = launched(counters)
    assert any("fwd_kernel_16bit" in k for k in kernels), kernels
    assert not any("fwd_sm90_kernel" in k for k in kernels), kernels
