// The forward's decode kernel: FlashAttention-2 on a tile of a few query rows per kv head (one
// token of each query head of a GQA group, for one or several kv heads), whose products read
// the key and value rows where they are (row_products.h) instead of converting them into GEMM
// operands first: with so few rows a packed GEMM spends its time packing. The tile takes the
// rows of plan.kv_heads_per_tile kv heads, so that it reads the cache key by key through the
// heads, in memory order (row_stream.h). Its engine (fwd_row_products.h) multiplies.
#pragma once
#include <algorithm>
#include <vector>

#include "../kv_rows.h"
#include "../params.h"
#include "fwd_call_state.h"
#include "fwd_online_softmax.h"
#include "fwd_plan.h"
#include "fwd_split_merge.h"
#include "row_stream.h"

namespace flashattn::cpu {

template <typename Products>
class DecodeKernel {
  using In = typename Products::In;

 public:
  DecodeKernel(const ForwardCallState<In>& call, const Products& products)
      : call_(call), products_(products) {}

  // One worker's rows, reused across its tasks.
  struct Scratch {
    Scratch(const ForwardPlan& plan, const Products& products) : q(plan.tile_rows, products) {}
    typename Products::Query q;
    // The key and value rows of the tile where they are, and the next key block's key rows
    // (requested from memory while the values are read).
    std::vector<const In*> key_rows = std::vector<const In*>(kKeyBlock);
    std::vector<const In*> value_rows = std::vector<const In*>(kKeyBlock);
    std::vector<const In*> next_key_rows = std::vector<const In*>(kKeyBlock);
    int key_rows_block = -1;  // the key block of the task that key_rows point at, or -1
  };

  void run(const ForwardTask& task, TileRows<In>& t, Scratch& s) const {
    const AttnParams& p = call_.p;
    const int b = task.b;
    const Sequence& seq = call_.seqs[b];
    const int heads = call_.plan.heads_per_tile, tile_rows = task.rows * heads;
    const int kv_heads = call_.plan.kv_heads_per_tile, rows_per_head = tile_rows / kv_heads;
    const int kv_head = task.head0 / p.head_group;  // the tile's first
    for (int r = 0; r < tile_rows; ++r)
      products_.load_query_row(p.q.row<const In>(b, task.head0 + r / task.rows,
                                                  seq.q_row0 + task.row_begin + r % task.rows),
                               r, s.q);
    products_.finish_query(rows_per_head, kv_heads, s.q);
    t.reset(tile_rows);

    const BlockRange key_blocks = task_key_blocks(seq, task, call_.plan.splits);
    s.key_rows_block = -1;
    for (int kb = key_blocks.first; kb < key_blocks.last; ++kb) {
      const KeyBlockView view = key_block_view(p, seq, task, heads, kb);
      if (nothing_seen(view)) continue;
      const int cols = view.cols;
      // S_ij
      if (s.key_rows_block != kb) point_at_rows(p.k, b, kv_head, kb, cols, s.key_rows);
      point_at_rows(p.v, b, kv_head, kb, cols, s.value_rows);
      const RowStream<In> keys{s.key_rows.data(), cols, s.value_rows.data(), cols, kv_heads,
                               p.k.head_stride};
      products_.multiply_q_kt(s.q, rows_per_head, keys, t.scores.data());
      online_softmax_step<Products::kForm>(p, seq, task, heads, view, p.head_dim_v, call_.lanes,
                                           t);
      // O_i += P_ij Vj, requesting the key rows of the task's next key block from memory.
      const int next_kb = kb + 1 < key_blocks.last ? kb + 1 : -1;
      const int next_cols =
          next_kb < 0 ? 0 : std::min(kKeyBlock, seq.seqlen_k - next_kb * kKeyBlock);
      point_at_rows(p.k, b, kv_head, next_kb, next_cols, s.next_key_rows);
      const RowStream<In> values{s.value_rows.data(), cols, s.next_key_rows.data(), next_cols,
                                 kv_heads, p.v.head_stride};
      products_.multiply_p_v(rows_per_head, values, t);
      std::swap(s.key_rows, s.next_key_rows);
      s.key_rows_block = next_kb;
    }
    call_.output.store(task, heads, t);
  }

 private:
  // rows = the first `cols` rows of key block kb of kv head kv_head in view (k or v).
  void point_at_rows(const TensorView& view, int b, int kv_head, int kb, int cols,
                     std::vector<const In*>& rows) const {
    for (int c = 0; c < cols; ++c)
      rows[c] =
          key_row<const In>(view, call_.p.kv_cache, call_.seqs[b], kv_head, kb * kKeyBlock + c);
  }

  const ForwardCallState<In> call_;
  const Products products_;
};

}  // namespace flashattn::cpu
