// Which tile each CTA of the sm_90a forward computes, by its place in the launch order.
//
// The hardware starts a grid's CTAs in launch order, x fastest, then y, then z, each as an SM
// frees up. When the CTAs differ in work (causal: the last query blocks see the most keys), the
// grid ends when its heaviest late starters do: issued lightest first, as blockIdx.x = query
// block does, the heaviest CTAs start in the last wave and set its tail. So a causal forward (and
// a local window whose first and last blocks differ in work) issues the heaviest query blocks
// first, a list schedule of the longest work first: the light blocks fill the gaps at the end.
//
// Heaviest first across every (batch, head) would have each wave read the K and V of all of them:
// at N = 4096, d = 128, 64 heads, 128 MB that the 50 MB L2 cannot hold. So the (batch, head)s are
// cut into sections of consecutive pairs whose K and V fit kL2KvBudgetBytes, and the order is
// heaviest first within each section, one section after another (FA3's tile scheduler cuts its
// heads the same way). The non-causal forward, whose blocks are alike, keeps the grid's own order.
#pragma once
#include <cstdint>

#include "cuda/hopper/fwd_sm90_mask.cuh"
#include "cuda/hopper/fwd_sm90_params.h"

namespace flashattn::hopper {

// K and V bytes one section's CTAs may share in L2: most of the H100 / H200's 50 MB, leaving room
// for the Q and O tiles streaming through.
constexpr int64_t kL2KvBudgetBytes = int64_t(32) << 20;

// One CTA's work: query block m_block of head `head` of batch entry `batch`, split-KV part `split`.
struct FwdSm90Tile {
  int m_block, split, head, batch;
};

// The launch's shape and order. The grid is (m_blocks x splits, heads, batches) (FwdSm90Config's).
struct FwdSm90TileOrder {
  int m_blocks, splits, heads, batches;
  int section;    // (batch, head) pairs per section (the last may hold fewer)
  int direction;  // 0: the grid's own order; -1: within each section, query blocks from the
                  // last down (they see the most keys); +1: from the first up
};

// Query positions per CTA: kBlockM rows, or with packed GQA heads the tokens of two consumers'
// rows (fwd_sm90_consumer_tokens).
__host__ __device__ __forceinline__ int fwd_sm90_tile_tokens(const FwdSm90Params& p) {
  return 2 * p.consumer_tokens;
}

// Query-block direction of the heavy-first order: which end of the query blocks visits more key
// tiles (KeyTiles, the kernel's own count, at the launch's longest lengths), or 0 when the ends
// agree (non-causal, or a window whose work differs only in the middle; the grid's own order).
// Causal is decided at compile time: a later block never sees fewer keys.
template <bool kCausal, bool kLocal, int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ int fwd_sm90_heavy_direction(const FwdSm90Params& p) {
  if constexpr (kCausal) {
    return -1;
  } else if constexpr (kLocal) {
    const int tile = fwd_sm90_tile_tokens(p);
    const int m_blocks = (p.seqlen_q + tile - 1) / tile;
    if (m_blocks <= 1) return 0;
    const KeyWindow w = key_window<false, true>(causal_diag_offset(p.align_bottom_right, p.seqlen_q, p.seqlen_k),
                                                p.window_left, p.window_right);
    const int first = KeyTiles<false, true, kBlockM, kBlockN>(QueryRange{0, tile}, p.seqlen_k, w).n_blocks;
    const int last_m0 = (m_blocks - 1) * tile;
    const int last = KeyTiles<false, true, kBlockM, kBlockN>(QueryRange{last_m0, p.seqlen_q}, p.seqlen_k, w).n_blocks;
    return last > first ? -1 : (first > last ? 1 : 0);
  } else {
    (void)p;
    return 0;
  }
}

// The order of a launch of the forward with these parameters (its grid: FwdSm90Config::grid).
template <bool kCausal, bool kLocal, int kHeadDim, int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ FwdSm90TileOrder fwd_sm90_tile_order(const FwdSm90Params& p) {
  FwdSm90TileOrder o;
  o.m_blocks = (p.seqlen_q + fwd_sm90_tile_tokens(p) - 1) / fwd_sm90_tile_tokens(p);
  o.splits = p.num_splits > 1 ? p.num_splits : 1;
  o.heads = p.heads_q;
  o.batches = p.batch;
  o.direction = fwd_sm90_heavy_direction<kCausal, kLocal, kBlockM, kBlockN>(p);
  // 16-bit K and V of one kv head; consecutive query heads of a GQA group share it.
  const int64_t kv_head_bytes = static_cast<int64_t>(p.seqlen_k > 0 ? p.seqlen_k : 1) * kHeadDim * 2 * 2;
  const int64_t kv_heads = kv_head_bytes >= kL2KvBudgetBytes ? 1 : kL2KvBudgetBytes / kv_head_bytes;
  int64_t section = kv_heads * (p.head_group > 1 ? p.head_group : 1);
  const int64_t pairs = static_cast<int64_t>(o.heads) * o.batches;
  if (section > pairs) section = pairs;
  // A section's launch positions (section x grid.x) stay within 32 bits.
  const int64_t x_extent = static_cast<int64_t>(o.m_blocks) * o.splits;
  if (x_extent > 0 && section > INT32_MAX / x_extent) section = INT32_MAX / x_extent;
  o.section = section > 1 ? static_cast<int>(section) : 1;
  return o;
}

// The tile of the CTA at blockIdx (x, y, z), whose place in the launch order is
// x + grid.x * (y + heads * z). In the grid's own order that is query block x / splits, part
// x % splits, head y, batch z. In a heavy-first order, the places of a section's pairs go query
// block by query block from the heavy end; within a block, split-KV part by part from the last
// (split_part's last part is its largest, its first the smallest), each over the section's pairs
// in order.
__host__ __device__ __forceinline__ FwdSm90Tile fwd_sm90_tile(const FwdSm90TileOrder& o, unsigned x, unsigned y,
                                                              unsigned z) {
  const unsigned splits = static_cast<unsigned>(o.splits);
  if (o.direction == 0)
    return {static_cast<int>(x / splits), static_cast<int>(x % splits), static_cast<int>(y), static_cast<int>(z)};
  const unsigned heads = static_cast<unsigned>(o.heads), section = static_cast<unsigned>(o.section);
  const unsigned pairs = heads * static_cast<unsigned>(o.batches);
  const unsigned row = y + heads * z;  // (batch, head) pair in the grid's own order
  const unsigned first = row / section * section;
  const unsigned size = pairs - first < section ? pairs - first : section;
  const unsigned place = x + static_cast<unsigned>(o.m_blocks) * splits * (row - first);  // within the section
  const unsigned per_block = size * splits;  // places of one query block across the section
  const unsigned rank = place / per_block, rest = place % per_block;
  const unsigned pair = first + rest % size;
  FwdSm90Tile t;
  t.m_block = static_cast<int>(o.direction < 0 ? static_cast<unsigned>(o.m_blocks) - 1 - rank : rank);
  t.split = static_cast<int>(splits - 1 - rest / size);
  t.head = static_cast<int>(pair % heads);
  t.batch = static_cast<int>(pair / heads);
  return t;
}

// Places in the launch order: one per tile of the grid (query blocks x splits x heads x batches).
__host__ __device__ __forceinline__ unsigned fwd_sm90_tile_places(const FwdSm90TileOrder& o) {
  return static_cast<unsigned>(o.m_blocks) * static_cast<unsigned>(o.splits) * static_cast<unsigned>(o.heads) *
         static_cast<unsigned>(o.batches);
}

// The tile at `place` (< fwd_sm90_tile_places) of the launch order: the tile the CTA at that place
// of the full grid computes (x fastest, then y, then z, as the hardware starts them). A walk that
// hands out places in rising order (a CTA taking the next place from a counter) visits the tiles in
// the grid's heavy-first order, from this one source of the order.
__host__ __device__ __forceinline__ FwdSm90Tile fwd_sm90_tile_at(const FwdSm90TileOrder& o, unsigned place) {
  const unsigned x_extent = static_cast<unsigned>(o.m_blocks) * static_cast<unsigned>(o.splits);
  const unsigned row = place / x_extent;
  const unsigned heads = static_cast<unsigned>(o.heads);
  return fwd_sm90_tile(o, place % x_extent, row % heads, row / heads);
}

}  // namespace flashattn::hopper
