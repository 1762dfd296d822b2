"""What the CUDA executor launches for a 16-bit decoding step, so the decode bench can print
each case's split count and CTA count next to its bandwidth: GQA packing
(csrc/cuda/gqa_decode.h, can_pack_gqa_decode), the forward's query-row tile and key tile
(plan_fwd.h, fwd_one_m_tile; traits.h), and split-KV's count (plan_fwd.h, choose_num_splits:
the split count of least modeled step time on the device's SMs).

The extension does not expose its plan, and an installed wheel has no headers to read, so this
restates it; tests/test_bench_decode_plan.py checks the constants against plan_fwd.h and the
choices against the C++ plan (the shim's plan_fwd) on many shapes. Change both together."""
import math

# plan_fwd.h's split model (names without the k prefix).
SPLIT_MODEL = dict(MaxSplits=64, SplitMinTiles=4, SplitTileNs=1000, SplitCtaNs=2000,
                   SplitCtasPerSm=2, SplitSmBytesPerNs=32, SplitMergeLaunchNs=4000,
                   SplitMergeStepNs=200, SplitMergeWarpsPerSm=64)
PACKED_TILE_ROWS = 64  # gqa_decode.h kPackedTileRows: FwdTraits<*, true>::kBlockM
FEW_ROWS = 16          # plan_fwd.h kFwdFewRows: up to this many rows, the one-m-tile kernel
WARP = 32
# The compiled 16-bit forward tiles (csrc/cuda/kernel_list.py), (q's and k's width, v's), in the
# order the dispatch (dispatch.h, dispatch_head_dims) tries them.
HEAD_DIM_TILES = ((32, 32), (64, 64), (96, 96), (128, 64), (128, 128), (192, 128), (192, 192),
                  (256, 256), (576, 512))


def geometry(batch, q_len, heads, heads_kv, head_dim, head_dim_v=None):
    """The forward's launch for a 16-bit decode: packing, rows and CTAs per query block. The
    tile is the first that covers both head dims (plan_fwd.h, choose_kernels)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    group = heads // heads_kv
    packed = group > 1 and math.ceil(q_len * group / PACKED_TILE_ROWS) < group
    tile, tile_v = next(t for t in HEAD_DIM_TILES if t[0] >= head_dim and t[1] >= head_dim_v)
    rows = q_len * group if packed else q_len
    # One m-tile per warp (64 rows) for packed heads, few rows, unequal head dims or above
    # d = 128, else two (128).
    one_m_tile = packed or rows <= FEW_ROWS or head_dim != head_dim_v or tile > 128
    return dict(batch=batch, rows=rows, cta_heads=heads_kv if packed else heads,
                heads_kv=heads_kv, packed=group if packed else 1, head_dim=head_dim,
                head_dim_v=head_dim_v,
                block_rows=64 if one_m_tile else 128,
                key_tile=64 if tile <= 128 or tile_v <= 128 else 32)


def step_ns(g, kv_len, sm_count, splits, element_bytes=2):
    """plan_fwd.h, split_step_ns: the modeled step in ns, in integer arithmetic as there."""
    c = SPLIT_MODEL
    ctas = g["batch"] * g["cta_heads"] * -(-g["rows"] // g["block_rows"])
    tiles = -(-kv_len // g["key_tile"])
    sms = max(sm_count, 1)
    slots = sms * c["SplitCtasPerSm"]
    waves = -(-(ctas * splits) // slots)
    t = waves * (c["SplitCtaNs"] + -(-tiles // splits) * c["SplitTileNs"])
    kv_bytes = (g["batch"] * g["heads_kv"] * kv_len * (g["head_dim"] + g["head_dim_v"])
                * element_bytes)
    t = max(t, kv_bytes // (sms * c["SplitSmBytesPerNs"]))
    if splits > 1:
        warps = g["batch"] * (g["rows"] // g["packed"]) * g["cta_heads"] * g["packed"]
        merge_waves = -(-warps // (sms * c["SplitMergeWarpsPerSm"]))
        lane_columns = -(-g["head_dim_v"] // WARP)
        t += c["SplitMergeLaunchNs"] + merge_waves * lane_columns * splits * c["SplitMergeStepNs"]
    return t


def num_splits(g, kv_len, sm_count, requested=0):
    """plan_fwd.h, choose_num_splits."""
    c = SPLIT_MODEL
    if requested >= 1:
        return min(requested, c["MaxSplits"])
    ctas = g["batch"] * g["cta_heads"] * -(-g["rows"] // g["block_rows"])
    tiles = -(-kv_len // g["key_tile"])
    if ctas == 0 or tiles < 2 * c["SplitMinTiles"]:
        return 1
    most = min(tiles // c["SplitMinTiles"], c["MaxSplits"])
    best, best_ns = 1, step_ns(g, kv_len, sm_count, 1)
    for s in range(2, most + 1):
        ns = step_ns(g, kv_len, sm_count, s)
        if ns < best_ns:
            best, best_ns = s, ns
    return best


def decode_launch(batch, q_len, heads, heads_kv, head_dim, kv_len, sm_count, requested=0,
                  head_dim_v=None):
    """(splits, CTAs) of the forward kernel's grid for a 16-bit decode on sm_count SMs."""
    g = geometry(batch, q_len, heads, heads_kv, head_dim, head_dim_v)
    splits = num_splits(g, kv_len, sm_count, requested)
    ctas = splits * -(-g["rows"] // g["block_rows"]) * g["batch"] * g["cta_heads"]
    return splits, ctas
