// The forward's epilogue, shared by the 16-bit (fwd_kernel.cuh) and the fp32 SIMT
// (simt_kernels.cuh) forwards: where row r of a CTA's tile sends its output and its LSE.
//   normal  row r's row of o and entry of lse, through QueryRows (gqa_decode.h): with packed GQA
//           heads, a tile's rows are several query heads' tokens;
//   split   this split's fp32 part of the scratch split_merge_kernel merges (split_kv.h), at the
//           same row: with split-KV, and (one split) for a float32 out of 16-bit inputs
//           (params.h, out_fp32).
// How O / l and the LSE are finished is softmax.cuh's finish_row. Each kernel keeps its own
// stores (the 16-bit one stages O in shared memory for 16-byte stores); this part gives it the
// rows to store to.
#pragma once
#include <cstdint>

#include "../params.h"
#include "../split_kv.h"
#include "gqa_decode.h"

namespace flashattn::cuda {

// Where a forward CTA's rows end: built once, after the main loop, from what the kernel holds.
struct FwdRowOutputs {
  const AttnParams& p;  // a kernel parameter, outliving this
  float* part;          // the split scratch (split_kv.h)
  bool to_part;         // rows go to this split's part, not to o and lse
  int split, batch;
  int64_t q_row0;       // the sequence's first query row (Sequence::q_row0)
  QueryRows rows;

  // to_part: the kernel's own test (a flag it holds anyway), so that the choice folds into it.
  __device__ __forceinline__ static FwdRowOutputs make(const AttnParams& p, float* part,
                                                       bool to_part, int split, int batch,
                                                       const Sequence& seq,
                                                       const QueryRows& rows) {
    return {p, part, to_part, split, batch, seq.q_row0, rows};
  }

  __device__ __forceinline__ bool writes_part() const { return to_part; }

  // Row r of o itself, of o's element type T. Each function also takes the row's place
  // (QueryRows::at) where the kernel holds it already: recomputed, a packed row's division by
  // the group size costs a few dozen instructions.
  template <typename T>
  __device__ __forceinline__ T* out_row(const QueryPlace& at) const {
    return p.o.row<T>(batch, at.q_head, q_row0 + at.token);
  }
  // Row r of this split's fp32 part (writes_part()).
  __device__ __forceinline__ float* part_row(const QueryPlace& at) const {
    return split_out_row(p, part, split, batch, at.q_head, q_row0 + at.token);
  }
  // Row r's fp32 output row: its part when writes_part(), else o's row (an fp32 o).
  __device__ __forceinline__ float* f32_row(const QueryPlace& at) const {
    return writes_part() ? part_row(at) : out_row<float>(at);
  }
  // Row r's LSE: in the part when writes_part(), else in lse.
  __device__ __forceinline__ float* lse_of(const QueryPlace& at) const {
    return writes_part() ? split_lse_of(p, part, split, batch, at.q_head, q_row0 + at.token)
                         : p.lse.row<float>(batch, at.q_head, q_row0 + at.token);
  }
  template <typename T>
  __device__ __forceinline__ T* out_row(int row) const {
    return out_row<T>(rows.at(row));
  }
  __device__ __forceinline__ float* part_row(int row) const { return part_row(rows.at(row)); }
  __device__ __forceinline__ float* lse_of(int row) const { return lse_of(rows.at(row)); }
};

}  // namespace flashattn::cuda
