// Split-KV: how a query block's key tiles are cut into parts, and where each part's partial
// output and LSE live in the scratch, on every executor.
#pragma once
#include <cstdint>

#include "params.h"

namespace flashattn {

// Part `part` of `parts` of the range [begin, end): contiguous, in order, as even as integers
// allow, possibly empty. How split-KV cuts a query block's key blocks, on every executor.
FLASHATTN_HOST_DEVICE void split_part(int& begin, int& end, int part, int parts) {
  const int64_t n = end - begin;
  const int first = begin;
  begin = first + static_cast<int>(n * part / parts);
  end = first + static_cast<int>(n * (part + 1) / parts);
}

// Split-KV's scratch on devices (params.h, num_splits): num_splits parts of o's elements (o is
// contiguous: rows x heads_q x head_dim_v, v's head dim), then num_splits parts of lse's
// (rows x heads_q), where the rows are batch x seqlen_q, or total_q for a varlen batch.
FLASHATTN_HOST_DEVICE int64_t output_rows(const AttnParams& p) {
  return p.cu_seqlens_q != nullptr ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
}
FLASHATTN_HOST_DEVICE int64_t split_out_elements(const AttnParams& p) {
  return output_rows(p) * p.heads_q * p.head_dim_v;
}
FLASHATTN_HOST_DEVICE int64_t split_lse_elements(const AttnParams& p) {
  return output_rows(p) * p.heads_q;
}

// Split s's part of output row (b, h, row), and of its LSE: o's and lse's element offsets
// from the part's base.
FLASHATTN_HOST_DEVICE float* split_out_row(const AttnParams& p, float* scratch, int s, int b,
                                           int h, int64_t row) {
  TensorView part = p.o;
  part.ptr = scratch + s * split_out_elements(p);
  return part.row<float>(b, h, row);
}
FLASHATTN_HOST_DEVICE float* split_lse_of(const AttnParams& p, float* scratch, int s, int b,
                                          int h, int64_t row) {
  TensorView part = p.lse;
  part.ptr = scratch + p.num_splits * split_out_elements(p) + s * split_lse_elements(p);
  return part.row<float>(b, h, row);
}

}  // namespace flashattn
