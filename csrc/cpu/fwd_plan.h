// How a forward call is cut into tasks (plan_forward in fwd.cpp decides it once per call), and
// the task itself: what the tile kernel (fwd_tile_kernel.h) and the decode kernel
// (fwd_decode_kernel.h) both take.
#pragma once
#include <algorithm>

#include "../mask.h"
#include "../split_kv.h"
#include "tiling.h"

namespace flashattn::cpu {

// Query rows per task and keys per tile: each Kj, Vj tile loaded into cache serves 128 rows,
// and the tiles (scores, Qi, O_i) still fit L2; 128 x 128 beat 64 x 128, 256 x 128 and
// 128 x 256 (docs/lab/2026-12-03-cpu-comment-ledgers.md).
constexpr int kQueryBlock = 128;
constexpr int kKeyBlock = 128;

// Beyond this many splits the merge costs more than the parallelism gains.
constexpr int kMaxSplits = 64;

struct ForwardPlan {
  // Query heads per tile: the whole GQA group when its rows fit one tile (decoding), the rows
  // head-major; else 1.
  int heads_per_tile = 1;
  // KV heads per tile: when every tile takes the row products (decoding), as many kv heads'
  // groups as fit a tile while every thread still gets a task, so that the products read the
  // cache key by key through the heads (row_stream.h: RowStream); else 1. heads_per_tile =
  // head_group * kv_heads_per_tile.
  int kv_heads_per_tile = 1;
  // Query rows of each head per task.
  int query_block = kQueryBlock;
  // Each kv head's keys are read by one task only: key and value tiles are converted into
  // the operand layout as they stream past, never packed whole first (a second copy of k, v).
  // Either way a tile's operands are the same, so is the result.
  bool stream_kv = false;
  int splits = 1;
  // The most rows a tile holds: query_block (or the longest query sequence, if shorter) rows
  // of each of heads_per_tile heads.
  int tile_rows = kQueryBlock;
  // Threads the call is worth (threads_for_work): a small one runs on the calling thread.
  int threads = 1;
};

// A task: query rows [row_begin, row_begin + rows) of sequence b, query heads [head0,
// head0 + heads_per_tile), keys of split `split`. The tile's row r is query row
// row_begin + r % rows of head head0 + r / rows.
struct ForwardTask {
  int b, head0, row_begin, rows, split;
};

// The key blocks of a task: its split's share of those its rows see.
inline BlockRange task_key_blocks(const Sequence& seq, const ForwardTask& t, int splits) {
  BlockRange blocks = visible_key_blocks(seq, t.row_begin, t.row_begin + t.rows, kKeyBlock);
  split_part(blocks.first, blocks.last, t.split, splits);
  return blocks;
}

}  // namespace flashattn::cpu
