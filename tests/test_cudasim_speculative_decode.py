"""Speculative decoding's GQA packing (csrc/cuda/gqa_decode.h) on the CPU shim: a step that
verifies several draft tokens keeps each kv head's query heads packed as the rows of its tiles
while those tiles are fewer than the heads (16 tokens x 8 heads: 2 tiles of 64 rows, each
reading the cache once, against 8 query heads reading it once each). A tile's rows then span
several tokens, and with 3 heads per kv head a token's heads straddle two tiles. Each case is
planned (packed_heads, grid) and checked against the float64 reference, with its append,
causal or windowed, dense or paged, split or not, under every schedule."""
import json
import math

import pytest
import torch

from test_kvcache import Case

PACKED_TILE_ROWS = 64  # FwdTraits<*, true>::kBlockM


def planned(sim, case):
    """The plan for the case's shapes, its cache as a dense (B, capacity, Hkv, d) stand-in that
    takes no memory: packing and the grid depend on shapes only."""
    capacity = case.logical(case.k_cache, 0).shape[0]
    b, _, _, d = case.q.shape
    kv = torch.zeros(d, dtype=case.q.dtype).expand(b, capacity, case.k_cache.shape[2], d)
    return json.loads(sim.ops.plan_fwd(case.q, kv, kv, causal=case.causal,
                                       num_splits=case.num_splits))


# name -> (Case arguments, packed). Heads: 16 over 2 (g = 8), 6 over 2 (g = 3), 4 over 2.
CASES = {
    "16_tokens_x_8_heads_paged_16": (dict(heads=16, heads_kv=2, seqlen_q=16, seqlen_new=16,
                                          page_size=16, seqlen_cache=700, num_splits=3), True),
    "16_tokens_x_8_heads_dense_auto_splits": (dict(heads=16, heads_kv=2, seqlen_q=16,
                                                   seqlen_new=16, seqlen_cache=2100,
                                                   num_splits=0), True),
    "9_tokens_x_8_heads_window": (dict(heads=16, heads_kv=2, seqlen_q=9, seqlen_new=9,
                                       causal=False, window=(40, 3), seqlen_cache=500,
                                       num_splits=2), True),
    "30_tokens_x_3_heads_straddle": (dict(heads=6, heads_kv=2, seqlen_q=30, seqlen_new=30,
                                          page_size=1, seqlen_cache=200, num_splits=1), True),
    "56_tokens_x_8_heads_most": (dict(heads=16, heads_kv=2, seqlen_q=56, seqlen_new=56,
                                      seqlen_cache=400, rotary_dim=0, num_splits=1), True),
    "57_tokens_x_8_heads_unpacked": (dict(heads=16, heads_kv=2, seqlen_q=57, seqlen_new=57,
                                          seqlen_cache=400, rotary_dim=0, num_splits=1), False),
    "33_tokens_x_2_heads_unpacked": (dict(heads=4, heads_kv=2, seqlen_q=33, seqlen_new=33,
                                          seqlen_cache=300, num_splits=1), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_drafts_keep_the_packed_tiles(sim, schedule, name):
    config, packed = CASES[name]
    case = Case(batch=2, head_dim=64, seed=len(name), **config)
    plan = planned(sim, case)
    group = config["heads"] // config["heads_kv"]
    rows = config["seqlen_q"] * group
    assert (plan["packed_heads"] == group) == packed, plan
    if packed:
        assert plan["seqlen_q"] == rows and plan["heads_q"] == config["heads_kv"]
        tiles = math.ceil(rows / PACKED_TILE_ROWS)
        assert tiles < group and plan["grid"][0] == tiles * plan["num_splits"], plan
        assert plan["grid"][1] * plan["grid"][2] >= 2 * config["heads_kv"]
    case.check(sim.ops)
