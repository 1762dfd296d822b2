// The forward's tile kernel: FlashAttention-2 on a block of up to kQueryBlock query rows (of
// one head, or of a GQA group's heads when their rows fit one tile), key block by key block,
// each product a GEMM on operands laid out by the call's engine (fwd_tile_products.h). Key and
// value blocks are packed by the first task of their head to need them and shared by the head's
// tasks while they run (head_operands.h), or, when each kv head's keys are read by one task
// only (ForwardPlan::stream_kv), converted into this worker's scratch as they stream past.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <vector>

#include "../kv_rows.h"
#include "../params.h"
#include "fwd_call_state.h"
#include "fwd_online_softmax.h"
#include "fwd_plan.h"
#include "fwd_split_merge.h"
#include "fwd_tile_products.h"
#include "head_operands.h"
#include "packing.h"
#include "scratch_buffer.h"
#include "spin_once.h"

namespace flashattn::cpu {

template <typename Products>
class TileKernel {
  using In = typename Products::In;
  using T = typename Products::T;
  using Operand = typename Products::Operand;

  // K and V of one (sequence, kv head), key block by key block as Products::load_kv_block lays
  // them out, each block packed by the first task to need it (head_operands.h): the threads on
  // one head pack its blocks between them, none waits for a whole head.
  struct PackedKeysAndValues {
    at::Tensor keys;    // [blocks][key_block_elements()]
    at::Tensor values;  // [blocks][value_block_elements()], unless values_in_place
    std::unique_ptr<SpinOnce[]> block_packed;
  };

 public:
  TileKernel(const ForwardCallState<In>& call, const Products& products)
      : call_(call), products_(products) {}

  // One worker's tiles, reused across its tasks.
  struct Scratch {
    Scratch(const ForwardPlan& plan, const Products& products)
        : q_tile(size_t(plan.tile_rows) * products.q_stride, Operand(0.f)),
          k_tile(plan.stream_kv ? products.key_block_elements() : 0),
          v_tile(plan.stream_kv ? products.value_block_elements() : 0),
          staging(products.staging_elements()) {}
    ScratchBuffer<Operand> q_tile;  // Qi, as Products::load_query_row lays it out
    // stream_kv: one key block's operands, as packing would lay them out.
    ScratchBuffer<Operand> k_tile, v_tile;
    ScratchBuffer<Operand> staging;  // Products::load_kv_block's
    // Unless stream_kv: the task's kv head's packed K and V.
    PackedKeysAndValues* packed = nullptr;
  };

  // Before the run, for each task this kernel will run.
  void expect(const ForwardTask& task) {
    if (!call_.plan.stream_kv) head_operands_.expect_task(task.b, kv_head_of(task));
  }

  // The most kv heads whose packed K and V were held at once.
  int64_t packed_heads_peak() const { return head_operands_.peak(); }

  void run(const ForwardTask& task, TileRows<In>& t, Scratch& s) {
    const AttnParams& p = call_.p;
    const Sequence& seq = call_.seqs[task.b];
    const int heads = call_.plan.heads_per_tile, tile_rows = task.rows * heads;
    const int kv_head = kv_head_of(task);
    TORCH_INTERNAL_ASSERT(call_.plan.kv_heads_per_tile == 1);
    // The head's packed K and V, for as long as this task runs.
    std::optional<typename HeadOperands<PackedKeysAndValues>::Hold> packed;
    if (!call_.plan.stream_kv)
      packed.emplace(head_operands_.take(task.b, kv_head, [&](PackedKeysAndValues& kv) {
        make_room_for_keys_and_values(task.b, kv);
      }));
    s.packed = packed ? &**packed : nullptr;

    for (int r = 0; r < tile_rows; ++r)
      products_.load_query_row(
          p.q.row<const In>(task.b, task.head0 + r / task.rows,
                            seq.q_row0 + task.row_begin + r % task.rows),
          s.q_tile.data() + size_t(r) * products_.q_stride);
    t.reset(tile_rows);

    const BlockRange key_blocks = task_key_blocks(seq, task, call_.plan.splits);
    for (int kb = key_blocks.first; kb < key_blocks.last; ++kb) {
      const KeyBlockView view = key_block_view(p, seq, task, heads, kb);
      if (nothing_seen(view)) continue;
      const KvTile<Operand> kv = kv_tile(task.b, kv_head, kb, s);
      products_.multiply_q_kt(tile_rows, view.cols, s.q_tile.data(), kv, t.scores.data());
      online_softmax_step<Products::kForm>(p, seq, task, heads, view, products_.v_dim, call_.lanes,
                                           t);
      products_.multiply_p_v(tile_rows, view.cols, kv, t);
    }
    call_.output.store(task, heads, t);
  }

 private:
  int kv_head_of(const ForwardTask& t) const { return t.head0 / call_.p.head_group; }

  // Room for every key block of (sequence b, a kv head), in the memory `packed` holds (a
  // finished head's) when it is large enough; the blocks are packed as the tasks reach them.
  void make_room_for_keys_and_values(int b, PackedKeysAndValues& packed) const {
    const int blocks = num_blocks(call_.seqs[b].seqlen_k, kKeyBlock);
    alloc_workspace<Operand>(packed.keys, blocks * products_.key_block_elements());
    if (!products_.values_in_place)
      alloc_workspace<Operand>(packed.values, blocks * products_.value_block_elements());
    packed.block_packed.reset(new SpinOnce[blocks]);
  }

  // Key block kb's K and V for a task: streamed into the scratch tiles (stream_kv), or packed
  // once for all the tasks of the head; V where it is when values_in_place.
  KvTile<Operand> kv_tile(int b, int kv_head, int kb, Scratch& s) const {
    const AttnParams& p = call_.p;
    const Sequence& seq = call_.seqs[b];
    Operand* keys;
    Operand* values = nullptr;
    if (call_.plan.stream_kv) {
      keys = s.k_tile.data();
      values = s.v_tile.data();
      load_kv_block(seq, kv_head, kb, keys, values, s);
    } else {
      PackedKeysAndValues& packed = *s.packed;
      keys = packed.keys.template data_ptr<Operand>() + kb * products_.key_block_elements();
      if (!products_.values_in_place)
        values = packed.values.template data_ptr<Operand>() +
                 kb * products_.value_block_elements();
      packed.block_packed[kb].call([&] { load_kv_block(seq, kv_head, kb, keys, values, s); });
    }
    if (products_.values_in_place)
      return {keys, p.v.row<const Operand>(b, kv_head, seq.k_row0 + kb * kKeyBlock),
              p.v.row_stride};
    return {keys, values, products_.out_stride};
  }

  void load_kv_block(const Sequence& seq, int kv_head, int kb, Operand* keys, Operand* values,
                     Scratch& s) const {
    const AttnParams& p = call_.p;
    auto key_of = [&](int j) { return key_row<const In>(p.k, p.kv_cache, seq, kv_head, j); };
    auto value_of = [&](int j) { return key_row<const In>(p.v, p.kv_cache, seq, kv_head, j); };
    products_.load_kv_block(key_of, value_of, seq.seqlen_k, kb, keys, values, s.staging.data());
  }

  const ForwardCallState<In> call_;
  const Products products_;
  HeadOperands<PackedKeysAndValues> head_operands_{call_.p.batch, call_.p.heads_kv};
};

}  // namespace flashattn::cpu
