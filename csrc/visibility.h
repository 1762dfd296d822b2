// Which keys a query row sees (window, causal band, the sequence's keys), the same on every
// executor. The tile ranges built on them are csrc/cuda/mask_range.cuh (CUDA) and the CPU's
// tiling.
#pragma once
#include "sequence.h"

namespace flashattn {

// First key index row i may see (clipped at 0).
FLASHATTN_HOST_DEVICE int first_visible_key(const Sequence& s, int row) {
  if (s.window_left < 0) return 0;
  int first = row + s.diag_offset - s.window_left;
  return first > 0 ? first : 0;
}

// One past the last key index row i may see (clipped at seqlen_k). May be <= first_visible_key
// when the row sees nothing (e.g. causal top rows when Sq > Sk).
FLASHATTN_HOST_DEVICE int visible_key_end(const Sequence& s, int row) {
  if (s.window_right < 0) return s.seqlen_k;
  int end = row + s.diag_offset + s.window_right + 1;
  return end < s.seqlen_k ? end : s.seqlen_k;
}

FLASHATTN_HOST_DEVICE bool key_visible(const Sequence& s, int row, int key) {
  return key >= first_visible_key(s, row) && key < visible_key_end(s, row);
}

}  // namespace flashattn
