// Which query rows a key tile must visit: the backward's counterpart of first_visible_key /
// visible_key_end (mask.h), which tell the forward which keys a query tile must visit.
#pragma once
#include <cstdint>

#include "../mask.h"

namespace flashattn::cuda {

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
