// Mask and score rules shared by every executor, so CPU and CUDA agree to the bit on which
// keys a query sees and how a raw score becomes a logit.
#pragma once
#include <cmath>

#include "params.h"

namespace flashattn {

// First key index row i may see (clipped at 0).
FLASHATTN_HOST_DEVICE int first_visible_key(const AttnParams& p, int row) {
  if (p.window_left < 0) return 0;
  int first = row + p.diag_offset - p.window_left;
  return first > 0 ? first : 0;
}

// One past the last key index row i may see (clipped at seqlen_k). May be <= first_visible_key
// when the row sees nothing (e.g. causal top rows when Sq > Sk).
FLASHATTN_HOST_DEVICE int visible_key_end(const AttnParams& p, int row) {
  if (p.window_right < 0) return p.seqlen_k;
  int end = row + p.diag_offset + p.window_right + 1;
  return end < p.seqlen_k ? end : p.seqlen_k;
}

FLASHATTN_HOST_DEVICE bool key_visible(const AttnParams& p, int row, int key) {
  return key >= first_visible_key(p, row) && key < visible_key_end(p, row);
}

// The ALiBi slope of query head h in batch b; 0 when there is no ALiBi.
FLASHATTN_HOST_DEVICE float alibi_slope(const AttnParams& p, int b, int h) {
  return p.alibi.ptr != nullptr ? *p.alibi.row<const float>(b, h, 0) : 0.f;
}

// -slope * |i + diag_offset - j|; slope 0 when there is no ALiBi.
FLASHATTN_HOST_DEVICE float alibi_bias(float slope, int diag_offset, int row, int key) {
  int dist = row + diag_offset - key;
  return -slope * static_cast<float>(dist < 0 ? -dist : dist);
}

}  // namespace flashattn
