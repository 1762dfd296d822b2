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
  TileKernel(const AttnParams& p, const std::vector<Sequence>& seqs, const ForwardPlan& plan,
             const Products& products, RowLanes lanes, const ForwardOutput<In>& output)
      : p_(p), seqs_(seqs), plan_(plan), products_(products), lanes_(lanes), output_(output) {}

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
    if (!plan_.stream_kv) head_operands_.expect_task(task.b, kv_head_of(task));
  }

  // The most kv heads whose packed K and V were held at once.
  int64_t packed_heads_peak() const { return head_operands_.peak(); }

  void run(const ForwardTask& task, TileRows<In>& t, Scratch& s) {
    const Sequence& seq = seqs_[task.b];
    const int heads = plan_.heads_per_tile, tile_rows = task.rows * heads;
    const int kv_head = kv_head_of(task);
    TORCH_INTERNAL_ASSERT(plan_.kv_heads_per_tile == 1);
    // The head's packed K and V, for as long as this task runs.
    std::optional<typename HeadOperands<PackedKeysAndValues>::Hold> packed;
    if (!plan_.stream_kv)
      packed.emplace(head_operands_.take(task.b, kv_head, [&](PackedKeysAndValues& kv) {
        make_room_for_keys_and_values(task.b, kv);
      }));
    s.packed = packed ? &**packed : nullptr;

    for (int r = 0; r < tile_rows; ++r)
      products_.load_query_row(
          p_.q.row<const In>(task.b, task.head0 + r / task.rows,
                             seq.q_row0 + task.row_begin + r % task.rows),
          s.q_tile.data() + size_t(r) * products_.q_stride);
    t.reset(tile_rows);

    const BlockRange key_blocks = task_key_blocks(seq, task, plan_.splits);
    for (int kb = key_blocks.first; kb < key_blocks.last; ++kb) {
      const KeyBlockView view = key_block_view(p_, seq, task, heads, kb);
      if (nothing_seen(view)) continue;
      const KvTile<Operand> kv = kv_tile(task.b, kv_head, kb, s);
      products_.multiply_q_kt(tile_rows, view.cols, s.q_tile.data(), kv, t.scores.data());
      online_softmax_step<Products::kForm>(p_, seq, task, heads, view, products_.v_dim, lanes_,
                                           t);
      products_.multiply_p_v(tile_rows, view.cols, kv, t);
    }
    output_.store(task, heads, t);
  }

 private:
  int kv_head_of(const ForwardTask& t) const { return t.head0 / p_.head_group; }

  // Room for every key block of (sequence b, a kv head), in the memory `packed` holds (a
  // finished head's) when it is large enough; the blocks are packed as the tasks reach them.
  void make_room_for_keys_and_values(int b, PackedKeysAndValues& packed) const {
    const int blocks = num_blocks(seqs_[b].seqlen_k, kKeyBlock);
    alloc_workspace<Operand>(packed.keys, blocks * products_.key_block_elements());
    if (!products_.values_in_place)
      alloc_workspace<Operand>(packed.values, blocks * products_.value_block_elements());
    packed.block_packed.reset(new SpinOnce[blocks]);
  }

  // Key block kb's K and V for a task: streamed into the scratch tiles (stream_kv), or packed
  // once for all the tasks of the head; V where it is when values_in_place.
  KvTile<Operand> kv_tile(int b, int kv_head, int kb, Scratch& s) const {
    const Sequence& seq = seqs_[b];
    Operand* keys;
    Operand* values = nullptr;
    if (plan_.stream_kv) {
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
      return {keys, p_.v.row<const Operand>(b, kv_head, seq.k_row0 + kb * kKeyBlock),
              p_.v.row_stride};
    return {keys, values, products_.out_stride};
  }

  void load_kv_block(const Sequence& seq, int kv_head, int kb, Operand* keys, Operand* values,
                     Scratch& s) const {
    auto key_of = [&](int j) { return key_row<const In>(p_.k, p_.kv_cache, seq, kv_head, j); };
    auto value_of = [&](int j) { return key_row<const In>(p_.v, p_.kv_cache, seq, kv_head, j); };
    products_.load_kv_block(key_of, value_of, seq.seqlen_k, kb, keys, values, s.staging.data());
  }

  const AttnParams& p_;
  const std::vector<Sequence>& seqs_;
  const ForwardPlan& plan_;
  const Products products_;
  const RowLanes lanes_;  // the online softmax's vector width
  const ForwardOutput<In>& output_;
  HeadOperands<PackedKeysAndValues> head_operands_{p_.batch, p_.heads_kv};
};

}  // namespace flashattn::cpu
