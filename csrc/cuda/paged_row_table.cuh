// A paged KV cache's rows for the forward's K and V copies, looked up once per row and tile.
//
// A key tile's rows may lie on as many pages as it has rows (page size 1). Looked up inside the
// copy, each 16-byte chunk paid for the block-table load, the division by the page size and
// two 64-bit address products: ~38-44 SASS instructions per cp.async at d = 128 on sm_90,
// against ~14 for strided rows (.ci/sass_copy_loops.py counts both), and paged decoding read
// at a third of the dense speed on the H200 (issue 33). Here, when a tile is next, kBlockN of
// the CTA's threads find one row each and write its K and V row addresses into shared memory;
// every chunk of that row, in the K copy and in the V copy, then reads its address from there.
//
// Two buffers, by tile parity, so that no barrier is added to the main loop: the table of tile
// j + 1 is written between the loop's two barriers of tile j (fwd_kernel.cuh), while tile j's
// V copy may still be reading buffer j % 2. Buffer (j + 1) % 2 was last read by the copies of
// tile j - 1, which every thread finished before the first barrier of tile j; the second
// barrier orders the writes before K j+1's copy. The first tile's table needs one barrier of
// its own, before the first K copy.
#pragma once
#include <cstdint>

#include "../kv_rows.h"
#include "../params.h"
#include "ptx.cuh"

namespace flashattn::cuda {

template <int kBlockN, int kNThreads>
struct PagedRowTable {
  // [2 buffers][kBlockN rows][K, V] row addresses.
  static constexpr int kEntries = 2 * kBlockN * 2;
  static constexpr int kBytes = kEntries * static_cast<int>(sizeof(const uint16_t*));
  static_assert(kBlockN <= kNThreads, "one thread per row of a tile");
  // Which cache a row address is in.
  static constexpr int kKeys = 0, kValues = 1;

  const uint16_t** entries;  // shared memory, kBytes, 8-byte aligned

  __device__ __forceinline__ static int index(int tile, int row, int view) {
    return ((tile & 1) * kBlockN + row) * 2 + view;
  }

  // Writes tile `tile`'s rows that exist (row < seq.seqlen_k - tile * kBlockN); the others are
  // never read, as the copies do not form an address for a row past the sequence. Called by
  // every thread of the CTA; the caller's barrier makes the rows visible.
  __device__ __forceinline__ void write(const AttnParams& p, const Sequence& seq, int head_kv,
                                        int tile) const {
    const int row = threadIdx.x;
    const int key = tile * kBlockN + row;
    if (row >= kBlockN || key >= seq.seqlen_k) return;
    const PageRow at = page_row_of(p.kv_cache, seq, key);
    FLASHATTN_SMEM(entries)[index(tile, row, kKeys)] =
        p.k.row<const uint16_t>(at.page, head_kv, at.row);
    FLASHATTN_SMEM(entries)[index(tile, row, kValues)] =
        p.v.row<const uint16_t>(at.page, head_kv, at.row);
  }

  // Row `row` of tile `tile` in the K (kKeys) or V (kValues) cache: one shared-memory load.
  __device__ __forceinline__ const uint16_t* row_of(int tile, int row, int view) const {
    return FLASHATTN_SMEM(entries)[index(tile, row, view)];
  }
};

}  // namespace flashattn::cuda
