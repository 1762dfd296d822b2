// The block ranges of the CUDA kernels, built on visibility.h's per-row rules: which key tiles a
// query block visits and which of them need the per-entry mask (KeyTiles: the forward, dQ), and
// which query rows a key tile must visit (rows_seeing_keys: dK/dV). A rule that hides keys has
// its range here.
#pragma once
#include <cstdint>

#include "../sequence.h"
#include "../visibility.h"

namespace flashattn::cuda {

// The key tiles [tile_begin, tile_end) of kBlockN keys that rows [m_first, m_last] may see, and
// the key range every one of them sees (tiles inside it need no per-element mask).
// first_visible_key and visible_key_end never decrease with the row (visibility.h), so the union
// over the rows is [first(m_first), end(m_last)) and the intersection [first(m_last),
// end(m_first)).
template <int kBlockN>
struct KeyTiles {
  int begin, end;                    // tile indices
  int unmasked_from, unmasked_to;    // keys

  __device__ __forceinline__ static KeyTiles of(const Sequence& seq, int m_first, int m_last) {
    const int key_begin = first_visible_key(seq, m_first);
    const int key_end = visible_key_end(seq, m_last);
    const int begin = key_begin / kBlockN;
    return {begin, key_end > key_begin ? (key_end + kBlockN - 1) / kBlockN : begin,
            first_visible_key(seq, m_last), visible_key_end(seq, m_first)};
  }
  // Whether tile `tile` holds a key some row of the block must not see.
  __device__ __forceinline__ bool needs_mask(int tile) const {
    return tile * kBlockN < unmasked_from || (tile + 1) * kBlockN > unmasked_to;
  }
};

// Query rows [begin, end) that see at least one key of [key_start, key_last]: the rows i
// with visible_key_end(i) > key_start and first_visible_key(i) <= key_last (both are
// nondecreasing in i). 64-bit, since the window bounds may be near INT_MAX.
__device__ __forceinline__ void rows_seeing_keys(const Sequence& s, int key_start,
                                                 int key_last, int& begin, int& end) {
  int64_t lo = 0, hi = s.seqlen_q;
  if (s.window_right >= 0) {
    const int64_t first = static_cast<int64_t>(key_start) - s.diag_offset - s.window_right;
    lo = first > lo ? first : lo;
  }
  if (s.window_left >= 0) {
    const int64_t last = static_cast<int64_t>(key_last) - s.diag_offset + s.window_left;
    hi = last + 1 < hi ? last + 1 : hi;
  }
  begin = static_cast<int>(lo < s.seqlen_q ? lo : s.seqlen_q);
  end = static_cast<int>(hi > begin ? hi : begin);
}

}  // namespace flashattn::cuda
