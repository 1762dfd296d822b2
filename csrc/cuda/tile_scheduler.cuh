// The tile scheduler: which work a CTA of an attention grid (grid.h, attention_grid) does.
//
// Every sm_80-family and SIMT kernel opens the same way: its folded (batch, head) from
// blockIdx.y/z, its block of query rows (or keys) from blockIdx.x (with num_splits CTAs per block
// under split-KV), the sequence that batch entry is (sequence.h), and an early exit for a CTA
// past the grid's (batch, head)s or past its own sequence's end (the grid covers the longest).
// Those steps are written once here, and a kernel opens with
//   if (!in_grid<TileAxis::kQueries>(p)) return;
//   const auto work = work_tile<TileAxis::kQueries, kBlockM>(p);
//   if (work.past_end()) return;
// Each exit is the kernel's own `return`, in the order the steps run: a WorkTile that carried a
// `valid` flag out through one exit left its fields joined from two paths, and the d = 128
// forward, at 255 registers, spilled (docs/lab/2026-12-03-kernels-of-parts.md).
#pragma once
#include <cstdint>

#include "../params.h"
#include "../sequence.h"
#include "grid.h"

namespace flashattn::cuda {

// What a grid's blocks run along: query rows (forward, dQ, the row kernels; one CTA per query
// head) or keys (dK/dV; one CTA per kv head, walking its group's query heads).
enum class TileAxis { kQueries, kKeys };

// One CTA's work: a block of rows (or keys) of one batch entry and one head.
template <TileAxis kAxis>
struct WorkTile {
  int batch;    // its batch entry
  int head;     // its query head; along keys, the first query head of the kv head's group
  int head_kv;  // its kv head
  int start;    // its first query row (or key) within the sequence
  int splits;   // CTAs per block along blockIdx.x (split-KV), 1 without
  Sequence seq;  // the batch entry's sequence (sequence.h)

  // Whether the block starts past the end of its sequence: the grid covers the longest
  // sequence, and such a CTA has nothing to do.
  __device__ __forceinline__ bool past_end() const {
    return start >= (kAxis == TileAxis::kQueries ? seq.seqlen_q : seq.seqlen_k);
  }
  // Which of the block's `splits` parts of its key tiles this CTA takes. Recomputed from
  // blockIdx.x where it is read rather than kept: a value kept across the main loop is a
  // register the two-m-tile kernels do not have.
  __device__ __forceinline__ int split() const { return static_cast<int>(blockIdx.x % splits); }
};

template <TileAxis kAxis, typename Params>
__device__ __forceinline__ int grid_heads(const Params& p) {
  return kAxis == TileAxis::kQueries ? p.heads_q : p.heads_kv;
}

// Whether this CTA's (batch, head) is one of the input's: grid.y x grid.z may hold more.
template <TileAxis kAxis, typename Params>
__device__ __forceinline__ bool in_grid(const Params& p) {
  return folded_batch_head() < static_cast<int64_t>(p.batch) * grid_heads<kAxis>(p);
}

// This CTA's work (in_grid only; it reads the batch entry's cu_seqlens) in a grid of kBlock rows
// (or keys) per block along blockIdx.x, (batch, head)s folded into y and z; with kSplitKv,
// p.num_splits CTAs per block (grid.h, split_attention_grid), each taking a part of the block's
// key tiles. `offset` rows past the block's first: the row kernels' warps, a row each.
// num_splits is read after the heads, as the kernels read it before the scheduler was theirs:
// read first, it changed the d = 128 forward's register allocation.
template <TileAxis kAxis, int kBlock, bool kSplitKv = false, typename Params>
__device__ __forceinline__ WorkTile<kAxis> work_tile(const Params& p, unsigned offset = 0) {
  const int64_t batch_head = folded_batch_head();
  const int heads = grid_heads<kAxis>(p);
  WorkTile<kAxis> w;
  w.batch = static_cast<int>(batch_head / heads);
  if constexpr (kAxis == TileAxis::kQueries) {
    w.head = static_cast<int>(batch_head % heads);
    w.head_kv = w.head / p.head_group;
  } else {
    w.head_kv = static_cast<int>(batch_head % heads);
    w.head = w.head_kv * p.head_group;
  }
  w.splits = kSplitKv && p.num_splits > 1 ? p.num_splits : 1;
  // Unsigned without splits: the product's sign known, the kernels' later divisions of row
  // and key indices by tile sizes are shifts.
  if constexpr (kSplitKv)
    w.start = static_cast<int>(blockIdx.x / w.splits) * kBlock + static_cast<int>(offset);
  else
    w.start = static_cast<int>(blockIdx.x * kBlock + offset);
  w.seq = sequence_of(p, w.batch);
  return w;
}

}  // namespace flashattn::cuda
