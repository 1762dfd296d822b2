// Forward attention on CPU: FlashAttention-2's algorithm. Each task takes one block of query
// rows Qi of one head of one sequence and streams the visible key/value tiles Kj, Vj of that
// sequence past it, keeping only one score tile S_ij = Qi Kjᵀ, the running row maximum m_i and
// row sum l_i, and the unnormalized output accumulator O_i. Memory is O(S·D): nothing of size
// Sq x Sk is ever allocated. Blocks start at each sequence's first row, so in a varlen batch a
// sequence's result is bit for bit the dense op's on that sequence alone; the task queue runs
// the blocks of all sequences, heaviest first, so one long sequence among short ones still
// keeps every thread busy. Kj and Vj are packed into the tile products' operand layout block
// by block as the first task of their head needs them, and a head's packed operands live only
// while its tasks run (head_operands.h), so that memory stays O(threads·S·D), not O(H·S·D).
//
// The tile products take their operands in one of two forms (OperandPath):
//   kCompute  the compute type (fp32, or fp64 for gradcheck): Kjᵀ packed once, V read in place
//             when it is in that type already, the softmax scale folded into Qi;
//   kNative16 bf16/fp16 inputs kept in 16 bits (panels16.h) and multiplied with fp32
//             accumulation, P_ij rounded to 16 bits for P·V, as FlashAttention does on GPUs. On
//             AMX this is several times the fp32 rate; the scale is applied to each fp32 S_ij.
//
// Decoding (few query rows, a long KV cache) changes three things, all chosen per call by
// plan_forward(): with GQA the query heads of one kv head share a tile, so each key is read once
// per kv head; when each kv head's keys are read by one task only they are converted tile by
// tile as they stream past rather than packed first (a second copy of the cache); and a
// sequence's keys may be split into num_splits parts, computed as separate tasks and merged by
// their LSEs, so one long sequence keeps every thread busy. When each kv head has only a few
// query rows (one token of each head of a GQA group), the products read the key and value rows
// where they are (row_products.h) instead of converting them into GEMM operands first, and a
// tile takes the groups of several kv heads, so that it reads the cache key by key through the
// heads, in memory order.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "dropout_tile.h"
#include "../kv_rows.h"
#include "dtype_dispatch.h"
#include "head_operands.h"
#include "kernels.h"
#include "packing.h"
#include "panels16.h"
#include "row_products.h"
#include "scratch_buffer.h"
#include "softmax_vec.h"
#include "spin_once.h"
#include "task_queue.h"
#include "tile_gemm.h"
#include "tiling.h"

namespace flashattn::cpu {
namespace {

// Query rows per task and keys per tile: each Kj, Vj tile loaded into cache serves 128 rows,
// and the tiles (scores, Qi, O_i) still fit L2; 128 x 128 beat 64 x 128, 256 x 128 and
// 128 x 256 (docs/lab/2026-12-03-cpu-comment-ledgers.md).
constexpr int kQueryBlock = 128;
constexpr int kKeyBlock = 128;

#ifdef FLASHATTN_TEST_COUNTERS
// fwd_packed_heads_peak() (kernels.h).
std::atomic<int64_t> last_packed_heads_peak{0};
#endif

// Beyond this many splits the merge costs more than the parallelism gains.
constexpr int kMaxSplits = 64;

// How a call is cut into tasks.
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

// row_products: whether the kernel has the row products (an fp32 compute type).
ForwardPlan plan_forward(const AttnParams& p, const std::vector<Sequence>& seqs,
                         bool row_products) {
  ForwardPlan plan;
  int max_q = 0, max_k = 0;
  for (const Sequence& s : seqs) {
    max_q = std::max(max_q, s.seqlen_q);
    max_k = std::max(max_k, s.seqlen_k);
  }
  const int group = p.head_group;
  plan.threads = threads_for_work(attention_work(p, seqs), kMinForwardWorkPerThread);
  // Tasks before any split, with `heads` query heads and `query_block` rows of each per tile.
  auto tasks_with = [&](int heads, int query_block) {
    int64_t tasks = 0;
    for (const Sequence& s : seqs)
      tasks += int64_t(p.heads_q / heads) * num_blocks(s.seqlen_q, query_block);
    return tasks;
  };
  const int64_t wanted = 2 * int64_t(plan.threads);
  // The most parts the keys of a sequence are split into.
  const int64_t most_splits = p.num_splits > 0
                                  ? std::min(p.num_splits, kMaxSplits)
                                  : std::min<int64_t>(num_blocks(max_k, kKeyBlock), kMaxSplits);
  if (group > 1 && int64_t(max_q) * group <= kQueryBlock) {
    plan.heads_per_tile = group;
    plan.query_block = kQueryBlock / group;
  }
  if (row_products && int64_t(max_q) * group <= kRowProductMaxRows) {
    // The most kv heads a tile can hold while the tasks, split as far as they may be, still
    // give every thread work (with all of them a sequence is one task before splitting, and
    // with num_splits = 1 one task in all).
    for (int kv_heads = p.heads_kv; kv_heads > 1; --kv_heads) {
      const int heads = group * kv_heads;
      if (p.heads_kv % kv_heads == 0 && int64_t(max_q) * heads <= kQueryBlock &&
          tasks_with(heads, kQueryBlock / heads) * most_splits >= wanted) {
        plan.kv_heads_per_tile = kv_heads;
        plan.heads_per_tile = heads;
        plan.query_block = kQueryBlock / heads;
        break;
      }
    }
  }
  plan.stream_kv = plan.heads_per_tile % group == 0 && max_q <= plan.query_block;
  if (p.num_splits > 0) {
    plan.splits = std::min(p.num_splits, kMaxSplits);
  } else {  // 0: enough tasks for twice the threads, if the keys go that far
    const int64_t tasks = tasks_with(plan.heads_per_tile, plan.query_block);
    if (tasks > 0 && tasks < wanted)
      plan.splits = static_cast<int>(std::min((wanted + tasks - 1) / tasks, most_splits));
  }
  plan.splits = std::max(plan.splits, 1);
  plan.tile_rows = std::max(std::min(plan.query_block, max_q), 1) * plan.heads_per_tile;
  return plan;
}

template <typename In, OperandPath kPath>
class ForwardKernel {
  using T = compute_t<In>;
  static constexpr bool kNative16 = kPath == OperandPath::kNative16;
  // The element type of the products' A and B operands.
  using Operand = std::conditional_t<kNative16, In, T>;
  // row_products.h takes fp32 products (not gradcheck's fp64), on either operand path: a
  // decoding tile's products take the rows where they are whatever multiplies the big tiles
  // (on a Zen 4 the 16-bit path's panels made a bf16 decode step 4x slower).
  static constexpr bool kRowProductsTaken = std::is_same_v<T, float>;

 public:
  ForwardKernel(const AttnParams& p, bool vnni, const ForwardPlan& plan)
      : p_(p),
        qk_dim_(p.head_dim),
        v_dim_(p.head_dim_v),
        // 16-bit products run over whole zero-padded panels: K even, O_i in 64-wide panels.
        gemm_dim_(kNative16 ? round_up(p.head_dim, 2) : p.head_dim),
        out_stride_(kNative16 ? round_up(p.head_dim_v, kPanelWidth) : p.head_dim_v),
        vnni_(vnni),
        seqs_(host_sequences(p)),
        plan_(plan),
        values_in_place_(!kNative16 && keys_in_place(p.kv_cache) && std::is_same_v<In, T> &&
                         p.v.row_stride >= p.head_dim_v),
        row_lanes_(kRowProductsTaken ? row_lanes() : RowLanes::k8),
        row_dot_(kNative16 && std::is_same_v<In, c10::BFloat16> && vnni &&
                 packed_gemm16_kernel_of<In>().load() == Gemm16Kernel::kAvx512Dot) {}

  void run() {
    const std::vector<QueryBlock> tasks = query_blocks();
    if (tasks.empty()) return;
    for (const QueryBlock& t : tasks)
      if (takes_packed_operands(t)) head_operands_.expect_task(t.b, kv_head_of(t));
    if (plan_.splits > 1) {
      const int64_t rows = int64_t(plan_.splits) * p_.heads_q * p_.total_q;
      split_lse_ = alloc_workspace<T>(split_lse_storage_, rows);
      split_out_ = alloc_workspace<T>(split_out_storage_, rows * v_dim_);
    }
    auto cost = [&](int64_t task) {
      const BlockRange keys = key_blocks_of(tasks[task]);
      return int64_t(keys.last - keys.first);
    };
    // The tasks of as many (sequence, kv head)s as there are threads queue together: the K and
    // V packed for a head live while its tasks run, so a few heads are packed at any moment,
    // not all. One head at a time put every thread on the same head and made a causal forward
    // slower than heavy-first over all tasks, which as many heads as threads did not.
    const int64_t heads_together = plan_.threads;
    auto heads_of = [&](int64_t task) {
      return (int64_t(tasks[task].b) * p_.heads_kv + kv_head_of(tasks[task])) / heads_together;
    };
    const int64_t groups = (int64_t(p_.batch) * p_.heads_kv + heads_together - 1) / heads_together;
    run_task_queue(plan_.threads, int64_t(tasks.size()), cost, groups, heads_of,
                   [&](const auto& claim) {
                     Scratch scratch(plan_.tile_rows, gemm_dim_, out_stride_, plan_.stream_kv);
                     for (int64_t task = claim(); task >= 0; task = claim())
                       run_query_block(tasks[task], scratch);
                     release_tile_gemm(vnni_);
                   });
    if (plan_.splits > 1) merge_splits();
#ifdef FLASHATTN_TEST_COUNTERS
    if (head_operands_.peak() > 0) last_packed_heads_peak.store(head_operands_.peak());
#endif
  }

 private:
  // A task: query rows [row_begin, row_begin + rows) of sequence b, query heads [head0,
  // head0 + heads_per_tile), keys of split `split`. The tile's row r is query row
  // row_begin + r % rows of head head0 + r / rows.
  struct QueryBlock {
    int b, head0, row_begin, rows, split;
  };

  std::vector<QueryBlock> query_blocks() const {
    std::vector<QueryBlock> tasks;
    for (int b = 0; b < p_.batch; ++b)
      for (int h = 0; h < p_.heads_q; h += plan_.heads_per_tile)
        for (int row = 0; row < seqs_[b].seqlen_q; row += plan_.query_block)
          for (int split = 0; split < plan_.splits; ++split)
            tasks.push_back(
                {b, h, row, std::min(plan_.query_block, seqs_[b].seqlen_q - row), split});
    return tasks;
  }

  // The key blocks of a task: its split's share of those its rows see.
  BlockRange key_blocks_of(const QueryBlock& t) const {
    BlockRange blocks =
        visible_key_blocks(seqs_[t.b], t.row_begin, t.row_begin + t.rows, kKeyBlock);
    split_part(blocks.first, blocks.last, t.split, plan_.splits);
    return blocks;
  }

  // K and V of one (sequence, kv head), key block by key block as load_kv_tile lays them out,
  // each block packed by the first task to need it (head_operands.h): the threads on one head
  // pack its blocks between them, none waits for a whole head.
  struct PackedKeysAndValues {
    at::Tensor keys;    // [blocks][key_block_elements()]
    at::Tensor values;  // [blocks][value_block_elements()], unless values_in_place_
    std::unique_ptr<SpinOnce[]> block_packed;
  };

  // One key block's K and V operands, where the tile products read them.
  struct KvTile {
    const Operand* keys;
    const Operand* values;  // unused where values_in_place_
  };

  // One worker thread's tiles, reused across its tasks, for tiles of up to tile_rows rows
  // (ForwardPlan::tile_rows: a decode step's tiles hold a row or a GQA group, not 128).
  struct Scratch {
    // stream: room for one key block's operands, in the layout packing would give them.
    Scratch(int tile_rows, int gemm_dim, int out_stride, bool stream)
        : q_tile(size_t(tile_rows) * gemm_dim, Operand(0.f)),
          q_rows32(kNative16 && kRowProductsTaken ? size_t(tile_rows) * gemm_dim : 0),
          scores(size_t(tile_rows) * kKeyBlock),
          probs16(kNative16 ? size_t(tile_rows) * kKeyBlock : 0),
          out_acc(size_t(tile_rows) * out_stride),
          row_max(tile_rows),
          row_sum(tile_rows),
          k_tile(stream ? size_t(kKeyBlock) * gemm_dim : 0),
          v_tile(stream ? size_t(kKeyBlock) * out_stride : 0),
          staging(kNative16 ? size_t(kKeyBlock) * std::max(gemm_dim, kPanelWidth) : 0) {}
    ScratchBuffer<Operand> q_tile;  // Qi; scaled by the softmax scale on the kCompute path
    // kNative16, takes_row_products(): Qi in fp32, scaled, as the kCompute path's q_tile.
    ScratchBuffer<T> q_rows32;
    ScratchBuffer<T> scores;        // S_ij, then P_ij, row stride kKeyBlock
    ScratchBuffer<In> probs16;      // kNative16: P_ij in 16 bits, zero past the tile's keys
    ScratchBuffer<T> out_acc;       // O_i before division by l_i, row stride out_stride_
    ScratchBuffer<T> row_max;       // m_i
    ScratchBuffer<T> row_sum;       // l_i
    // stream_kv: Kjᵀ [dim][kKeyBlock] and Vj [kKeyBlock][dim], or on kNative16 the key and
    // value panels of the block (panels16.h); and a row-major panel staged before VNNI packing.
    ScratchBuffer<Operand> k_tile;
    ScratchBuffer<Operand> v_tile;
    ScratchBuffer<Operand> staging;
    // takes_row_products(): the key and value rows of the tile where they are, and the next
    // key block's key rows (requested from memory while the values are read).
    std::vector<const In*> key_rows = std::vector<const In*>(kKeyBlock);
    std::vector<const In*> value_rows = std::vector<const In*>(kKeyBlock);
    std::vector<const In*> next_key_rows = std::vector<const In*>(kKeyBlock);
    int key_rows_block = -1;  // the key block of the task that key_rows point at, or -1
    // row_dot_ with enough rows per kv head: Qi laid out for the rows-in-lanes dots.
    std::vector<int32_t> q_lanes;
    // takes_packed_operands(): the task's kv head's packed K and V.
    PackedKeysAndValues* packed = nullptr;
  };

  // Whether a task's tiles multiply packed K and V (not streamed, not the rows in place).
  bool takes_packed_operands(const QueryBlock& t) const {
    return !plan_.stream_kv && !takes_row_products(seqs_[t.b]);
  }
  int kv_head_of(const QueryBlock& t) const { return t.head0 / p_.head_group; }

  // One key block's operands, as load_kv_tile lays them out.
  int64_t key_block_elements() const {
    return int64_t(kKeyBlock) * gemm_dim_;
  }
  int64_t value_block_elements() const { return int64_t(kKeyBlock) * out_stride_; }

  // Room for every key block of (sequence b, a kv head), in the memory `packed` holds (a
  // finished head's) when it is large enough; the blocks are packed as the tasks reach them.
  void make_room_for_keys_and_values(int b, PackedKeysAndValues& packed) const {
    const int blocks = num_blocks(seqs_[b].seqlen_k, kKeyBlock);
    alloc_workspace<Operand>(packed.keys, blocks * key_block_elements());
    if (!values_in_place_) alloc_workspace<Operand>(packed.values, blocks * value_block_elements());
    packed.block_packed.reset(new SpinOnce[blocks]);
  }

  // Key block kb's K and V for a task: streamed into the scratch tiles (stream_kv), or packed
  // once for all the tasks of the head.
  KvTile kv_tile(const Sequence& seq, int kv_head, int kb, Scratch& s) const {
    if (plan_.stream_kv) {
      load_kv_tile(seq, kv_head, kb, s.k_tile.data(), s.v_tile.data(), s);
      return {s.k_tile.data(), s.v_tile.data()};
    }
    Operand* keys = s.packed->keys.template data_ptr<Operand>() + kb * key_block_elements();
    Operand* values =
        values_in_place_
            ? nullptr
            : s.packed->values.template data_ptr<Operand>() + kb * value_block_elements();
    s.packed->block_packed[kb].call([&] { load_kv_tile(seq, kv_head, kb, keys, values, s); });
    return {keys, values};
  }

  // Key block kb of kv head kv_head into `keys` and `values` (key_block_elements() and
  // value_block_elements()): Kjᵀ and (unless read in place) Vj, or the block's key and value
  // panels.
  void load_kv_tile(const Sequence& seq, int kv_head, int kb, Operand* keys, Operand* values,
                    Scratch& s) const {
    auto key_of = [&](int j) { return key_row<const In>(p_.k, p_.kv_cache, seq, kv_head, j); };
    auto value_of = [&](int j) { return key_row<const In>(p_.v, p_.kv_cache, seq, kv_head, j); };
    if constexpr (kNative16) {
      const int key_panels = kKeyBlock / kPanelWidth, key_panel = gemm_dim_ * kPanelWidth;
      for (int index = 0; index < key_panels; ++index)
        stream_panel(s, keys + size_t(index) * key_panel, gemm_dim_, [&](In* panel) {
          fill_key_panel(key_of, seq.seqlen_k, qk_dim_, kKeyBlock, kb, index, panel);
        });
      const int value_panel = kKeyBlock * kPanelWidth;
      for (int index = 0; index < out_stride_ / kPanelWidth; ++index)
        stream_panel(s, values + size_t(index) * value_panel, kKeyBlock, [&](In* panel) {
          fill_value_panel(value_of, seq.seqlen_k, v_dim_, kKeyBlock, kb, index, panel);
        });
    } else {
      const int key_begin = kb * kKeyBlock, cols = std::min(kKeyBlock, seq.seqlen_k - key_begin);
      for (int c = 0; c < cols; ++c) {
        const In* key = key_of(key_begin + c);
        for (int d = 0; d < qk_dim_; ++d) keys[size_t(d) * kKeyBlock + c] = static_cast<T>(key[d]);
        if (values_in_place_) continue;
        const In* value = value_of(key_begin + c);
        T* v_out = values + size_t(c) * v_dim_;
        for (int d = 0; d < v_dim_; ++d) v_out[d] = static_cast<T>(value[d]);
      }
    }
  }

  // kNative16: one zeroed panel of `rows` x kPanelWidth filled by fill(), VNNI-packed into
  // `dst` where the products take it so, else filled in place (build_panels' steps).
  template <typename Fill>
  void stream_panel(Scratch& s, Operand* dst, int rows, const Fill& fill) const {
    Operand* staging = vnni_ ? s.staging.data() : dst;
    std::fill_n(staging, size_t(rows) * kPanelWidth, Operand(0.f));
    fill(staging);
    if constexpr (kNative16)
      if (vnni_) pack_vnni_panel(staging, dst, rows);
  }

  // The class of the tile's attn_mask blocks over all its heads.
  uint8_t tile_mask_class(int b, int head0, int row_begin, int row_end, int key_begin,
                          int key_end) const {
    uint8_t first = mask_tile(p_.mask, b, head0, row_begin, row_end, key_begin, key_end);
    for (int g = 1; g < plan_.heads_per_tile && first != kMaskRead; ++g)
      if (mask_tile(p_.mask, b, head0 + g, row_begin, row_end, key_begin, key_end) != first)
        first = kMaskRead;
    return first;
  }

  void run_query_block(const QueryBlock& task, Scratch& s) {
    const int b = task.b, head0 = task.head0, row_begin = task.row_begin, rows = task.rows;
    const int tile_rows = rows * plan_.heads_per_tile;
    const Sequence& seq = seqs_[b];
    const int kv_head = kv_head_of(task);  // the tile's first
    const bool rows_in_place = takes_row_products(seq);
    TORCH_INTERNAL_ASSERT(rows_in_place || plan_.kv_heads_per_tile == 1);
    // The head's packed K and V, for as long as this task runs.
    std::optional<typename HeadOperands<PackedKeysAndValues>::Hold> packed;
    if (takes_packed_operands(task))
      packed.emplace(head_operands_.take(
          b, kv_head, [&](PackedKeysAndValues& kv) { make_room_for_keys_and_values(b, kv); }));
    s.packed = packed ? &**packed : nullptr;

    for (int r = 0; r < tile_rows; ++r) {
      const In* q_row = p_.q.row<const In>(b, head0 + r / rows, seq.q_row0 + row_begin + r % rows);
      // 16-bit products: a column padding qk_dim_ to even stays 0.
      if (kNative16 && (!rows_in_place || row_dot_)) {
        std::copy_n(q_row, qk_dim_, s.q_tile.data() + size_t(r) * gemm_dim_);
        continue;
      }
      T* tile_row = row_products_q(s) + size_t(r) * qk_dim_;
      for (int d = 0; d < qk_dim_; ++d)
        tile_row[d] = static_cast<T>(q_row[d]) * softmax_scale<T>(p_);
    }
    if (rows_in_place && row_dot_) lay_query_in_lanes(s, tile_rows / plan_.kv_heads_per_tile);
    std::fill_n(s.out_acc.data(), size_t(tile_rows) * out_stride_, T(0));
    std::fill_n(s.row_max.data(), tile_rows, -std::numeric_limits<T>::infinity());
    std::fill_n(s.row_sum.data(), tile_rows, T(0));

    const BlockRange key_blocks = key_blocks_of(task);
    s.key_rows_block = -1;
    for (int kb = key_blocks.first; kb < key_blocks.last; ++kb) {
      const int key_begin = kb * kKeyBlock;
      const int cols = std::min(kKeyBlock, seq.seqlen_k - key_begin);
      const TileVisibility visibility =
          tile_visibility(seq, row_begin, row_begin + rows, key_begin, key_begin + cols);
      const uint8_t mask_class =
          tile_mask_class(b, head0, row_begin, row_begin + rows, key_begin, key_begin + cols);
      if (visibility == TileVisibility::kNone || mask_class == kMaskHidden) continue;
      const KvTile kv = rows_in_place ? KvTile{} : kv_tile(seq, kv_head, kb, s);
      // S_ij = scale · Qi Kjᵀ
      multiply_q_kt(b, kv_head, kb, tile_rows, cols, rows_in_place, kv, s);
      // The 16-bit products leave S_ij unscaled (the fp32 row products' Qi is scaled) and take
      // P_ij rounded to 16 bits.
      const bool products_16bit = kNative16 && (!rows_in_place || row_dot_);
      // Without dropout, which drops from the fp32 P_ij, the 16-bit products' scale and
      // rounding go into the softmax's own pass over the tile (one pass instead of three).
      const bool fused_16bit = products_16bit && !p_.dropout.on();
      const bool row_steps = p_.softcap > 0 || p_.alibi.ptr ||
                             visibility == TileVisibility::kPartial || mask_class == kMaskRead;
      if (row_steps || (products_16bit && !fused_16bit))
        for (int r = 0; r < tile_rows; ++r) {
          T* score_row = s.scores.data() + size_t(r) * kKeyBlock;
          const int row = row_begin + r % rows, h = head0 + r / rows;
          if (products_16bit) scale_by(score_row, cols, softmax_scale<T>(p_));
          if (p_.softcap > 0) apply_softcap(score_row, cols, softcap<T>(p_), nullptr);
          if (p_.alibi.ptr)
            add_alibi(score_row, cols, T(alibi_slope(p_, b, h)), row + seq.diag_offset - key_begin,
                      -1);
          if (mask_class == kMaskRead) add_attn_mask(p_.mask, b, h, row, key_begin, score_row, cols);
          if (visibility == TileVisibility::kPartial)
            mask_row(seq, score_row, cols, row, key_begin);
        }
      // Folds S_ij into m_i, l_i and O_i, and turns it into P_ij (unnormalized).
      if constexpr (kNative16) {
        if (fused_16bit) {
          // Scaled above already when there were row steps.
          const float scale = row_steps ? 1.f : softmax_scale<T>(p_);
          online_softmax_tile(row_lanes_, s.scores.data(), tile_rows, cols, kKeyBlock, scale,
                              s.row_max.data(), s.row_sum.data(), s.out_acc.data(), out_stride_,
                              v_dim_, s.probs16.data(), kKeyBlock, kKeyBlock);
        }
      }
      if (!fused_16bit) online_softmax_tile_of(s, tile_rows, cols);
      // Dropout drops from the product with V only: l_i above summed the whole P_ij.
      if (p_.dropout.on())
        for (int g = 0; g < plan_.heads_per_tile; ++g)
          dropout_rows(p_.dropout, dropout_seed(p_.dropout), seq.whole_batch,
                       seq.head_offset + head0 + g, seq.row_offset + row_begin, rows,
                       seq.key_offset + key_begin, cols,
                       s.scores.data() + size_t(g) * rows * kKeyBlock, kKeyBlock);
      if constexpr (kNative16)
        for (int r = 0; r < tile_rows && products_16bit && !fused_16bit; ++r) {
          In* probs_row = s.probs16.data() + size_t(r) * kKeyBlock;
          round_to_16bit(s.scores.data() + size_t(r) * kKeyBlock, probs_row, cols);
          std::fill(probs_row + cols, probs_row + kKeyBlock, In(0.f));
        }
      const int next_kb = kb + 1 < key_blocks.last ? kb + 1 : -1;
      // O_i += P_ij Vj
      multiply_p_v(b, kv_head, kb, next_kb, tile_rows, cols, rows_in_place, kv, s);
    }
    for (int g = 0; g < plan_.heads_per_tile; ++g)
      store_output(task, head0 + g, g * rows, s);
  }

  // online_softmax_tile on s.scores in place, in the compute type.
  void online_softmax_tile_of(Scratch& s, int tile_rows, int cols) const {
    if constexpr (std::is_same_v<T, float>) {
      online_softmax_tile(row_lanes_, s.scores.data(), tile_rows, cols, kKeyBlock,
                          s.row_max.data(), s.row_sum.data(), s.out_acc.data(), out_stride_,
                          v_dim_);
    } else {
      online_softmax_tile(s.scores.data(), tile_rows, cols, kKeyBlock, s.row_max.data(),
                          s.row_sum.data(), s.out_acc.data(), out_stride_, v_dim_);
    }
  }

  // S_ij = scale · Qi Kjᵀ into s.scores (the 16-bit products leave the scale for later).
  void multiply_q_kt(int b, int kv_head, int kb, int rows, int cols, bool rows_in_place,
                     const KvTile& kv, Scratch& s) const {
    if (rows_in_place) {
      if constexpr (kRowProductsTaken) {
        if (s.key_rows_block != kb) point_at_rows(p_.k, b, kv_head, kb, cols, s.key_rows);
        point_at_rows(p_.v, b, kv_head, kb, cols, s.value_rows);
        const RowStream<In> keys{s.key_rows.data(), cols, s.value_rows.data(), cols,
                                 plan_.kv_heads_per_tile, p_.k.head_stride};
        const int rows_per_head = rows / plan_.kv_heads_per_tile;
        if (row_dot_)
          dot_rows_on_vdpbf16ps(s, rows_per_head, keys);
        else
          dot_key_rows(row_lanes_, row_products_q(s), rows_per_head, qk_dim_, keys, qk_dim_,
                       s.scores.data(), kKeyBlock);
      }
    } else if constexpr (kNative16) {
      for (int panel = 0; panel * kPanelWidth < cols; ++panel)
        tile_gemm(rows, kPanelWidth, gemm_dim_, s.q_tile.data(), gemm_dim_,
                  kv.keys + size_t(panel) * gemm_dim_ * kPanelWidth, kPanelWidth,
                  s.scores.data() + panel * kPanelWidth, kKeyBlock, /*accumulate=*/false, vnni_);
    } else {
      tile_gemm(rows, cols, qk_dim_, s.q_tile.data(), qk_dim_, kv.keys, kKeyBlock, s.scores.data(),
                kKeyBlock, /*accumulate=*/false);
    }
  }

  // O_i += P_ij Vj. The 16-bit product runs over the whole key block: P_ij and Vj are zero
  // past the last key. The row products take P_ij in fp32, and point at the key rows of the
  // task's next key block next_kb (-1: none), which they request from memory.
  void multiply_p_v(int b, int kv_head, int kb, int next_kb, int rows, int cols,
                    bool rows_in_place, const KvTile& kv, Scratch& s) const {
    if (rows_in_place) {
      if constexpr (kRowProductsTaken) {
        const int next_cols =
            next_kb < 0 ? 0 : std::min(kKeyBlock, seqs_[b].seqlen_k - next_kb * kKeyBlock);
        point_at_rows(p_.k, b, kv_head, next_kb, next_cols, s.next_key_rows);
        const RowStream<In> values{s.value_rows.data(), cols, s.next_key_rows.data(),
                                   next_cols, plan_.kv_heads_per_tile, p_.v.head_stride};
        const int rows_per_head = rows / plan_.kv_heads_per_tile;
        if (row_dot_)
          add_rows_on_vdpbf16ps(s, rows_per_head, values);
        else
          add_value_rows(row_lanes_, s.scores.data(), rows_per_head, kKeyBlock, values, v_dim_,
                         s.out_acc.data(), out_stride_);
        std::swap(s.key_rows, s.next_key_rows);
        s.key_rows_block = next_kb;
      }
    } else if constexpr (kNative16) {
      for (int panel = 0; panel < out_stride_ / kPanelWidth; ++panel)
        tile_gemm(rows, kPanelWidth, kKeyBlock, s.probs16.data(), kKeyBlock,
                  kv.values + size_t(panel) * kKeyBlock * kPanelWidth, kPanelWidth,
                  s.out_acc.data() + panel * kPanelWidth, out_stride_, /*accumulate=*/true,
                  vnni_);
    } else if (values_in_place_) {
      tile_gemm(rows, v_dim_, cols, s.scores.data(), kKeyBlock,
                p_.v.row<const T>(b, kv_head, seqs_[b].k_row0 + kb * kKeyBlock),
                p_.v.row_stride, s.out_acc.data(), v_dim_, /*accumulate=*/true);
    } else {
      tile_gemm(rows, v_dim_, cols, s.scores.data(), kKeyBlock,
                kv.values,
                v_dim_, s.out_acc.data(), v_dim_, /*accumulate=*/true);
    }
  }

  // Whether the tiles of a sequence take their products from the key and value rows in place
  // (row_products.h): when each holds at most kRowProductMaxRows query rows, however the call
  // groups them (GQA heads, query blocks). Decided by the sequence alone, so a sequence of a
  // varlen batch still gets the bits it gets alone.
  bool takes_row_products(const Sequence& seq) const {
    return kRowProductsTaken && sequence_takes_row_products(seq.seqlen_q, p_.head_group);
  }

  // row_dot_: the two row products on vdpbf16ps, from Qi and P_ij in bf16 (row_products.h).
  // Qi as the score product on vdpbf16ps takes it: with enough rows per kv head, also laid
  // out in the lanes of a vector, once per tile.
  void lay_query_in_lanes(Scratch& s, int rows_per_head) const {
    if constexpr (std::is_same_v<In, c10::BFloat16> && kNative16) {
      if (!takes_query_lanes(rows_per_head)) return;
      s.q_lanes.resize(query_lanes_size(plan_.kv_heads_per_tile, qk_dim_));
      lay_query_lanes_bf16(s.q_tile.data(), rows_per_head, plan_.kv_heads_per_tile, gemm_dim_,
                           qk_dim_, s.q_lanes.data());
    }
  }
  void dot_rows_on_vdpbf16ps(Scratch& s, int rows_per_head, const RowStream<In>& keys) const {
    if constexpr (std::is_same_v<In, c10::BFloat16> && kNative16)
      dot_key_rows_bf16({s.q_tile.data(), rows_per_head, gemm_dim_,
                         takes_query_lanes(rows_per_head) ? s.q_lanes.data() : nullptr},
                        keys, qk_dim_, s.scores.data(), kKeyBlock);
    else
      TORCH_INTERNAL_ASSERT(false, "flashattn: vdpbf16ps multiplies bf16 only");
  }
  void add_rows_on_vdpbf16ps(Scratch& s, int rows_per_head, const RowStream<In>& values) const {
    if constexpr (std::is_same_v<In, c10::BFloat16> && kNative16)
      add_value_rows_bf16(s.probs16.data(), rows_per_head, kKeyBlock, values, v_dim_,
                          s.out_acc.data(), out_stride_);
    else
      TORCH_INTERNAL_ASSERT(false, "flashattn: vdpbf16ps multiplies bf16 only");
  }

  // The fp32 row products' Qi: scaled fp32 rows of stride qk_dim_.
  T* row_products_q(Scratch& s) const {
    if constexpr (kNative16)
      return s.q_rows32.data();
    else
      return s.q_tile.data();
  }

  // rows = the first `cols` rows of key block kb of kv head kv_head in view (k or v).
  void point_at_rows(const TensorView& view, int b, int kv_head, int kb, int cols,
                     std::vector<const In*>& rows) const {
    for (int c = 0; c < cols; ++c)
      rows[c] = key_row<const In>(view, p_.kv_cache, seqs_[b], kv_head, kb * kKeyBlock + c);
  }

  // Keys of the tile that `row` may not see become -inf.
  static void mask_row(const Sequence& seq, T* score_row, int cols, int row, int key_begin) {
    const int visible_begin = std::clamp(first_visible_key(seq, row) - key_begin, 0, cols);
    const int visible_end =
        std::clamp(visible_key_end(seq, row) - key_begin, visible_begin, cols);
    std::fill(score_row, score_row + visible_begin, -std::numeric_limits<T>::infinity());
    std::fill(score_row + visible_end, score_row + cols, -std::numeric_limits<T>::infinity());
  }

  // out_i = O_i / l_i and lse_i = m_i + log(l_i) for the task's rows of head h, tile rows
  // [tile_row0, + task.rows); a row that saw no key gets 0 and -inf. With splits, into the
  // split's partial results, which merge_splits() combines.
  void store_output(const QueryBlock& task, int h, int tile_row0, const Scratch& s) const {
    const Sequence& seq = seqs_[task.b];
    for (int r = 0; r < task.rows; ++r) {
      const int row = task.row_begin + r;
      const T sum = s.row_sum[tile_row0 + r];
      // sum is 0 only for a row that saw no key; a NaN sum (NaN inputs) goes on into out, lse.
      const bool saw_keys = !(sum == T(0));
      const T inv_sum = saw_keys ? T(1) / sum : T(0);
      const T lse = saw_keys ? s.row_max[tile_row0 + r] + std::log(sum)
                             : -std::numeric_limits<T>::infinity();
      const T* acc = s.out_acc.data() + size_t(tile_row0 + r) * out_stride_;
      if (plan_.splits > 1) {
        const int64_t at = split_row(task.split, seq, h, row);
        split_lse_[at] = lse;
        for (int d = 0; d < v_dim_; ++d) split_out_[at * v_dim_ + d] = acc[d] * inv_sum;
        continue;
      }
      store_out_row(task.b, h, seq.q_row0 + row, acc, inv_sum);
      *p_.lse.row<float>(task.b, h, seq.q_row0 + row) = static_cast<float>(lse);
    }
  }

  // Output row `row` (of o's rows) of head h in batch b = values * inv_sum, rounded once to
  // out's type: In, or float32 when p_.out_fp32 (16-bit inputs; params.h).
  void store_out_row(int b, int h, int64_t row, const T* values, T inv_sum) const {
    if (p_.out_fp32) {
      float* out_row = p_.o.row<float>(b, h, row);
      for (int d = 0; d < v_dim_; ++d) out_row[d] = static_cast<float>(values[d] * inv_sum);
    } else {
      In* out_row = p_.o.row<In>(b, h, row);
      for (int d = 0; d < v_dim_; ++d) out_row[d] = static_cast<In>(values[d] * inv_sum);
    }
  }

  // Where split `split`'s partial result for query `row` of head h of a sequence is.
  int64_t split_row(int split, const Sequence& seq, int h, int row) const {
    return int64_t(split) * p_.heads_q * p_.total_q + query_row_index(p_, seq, h, row);
  }

  // out = sum_s w_s out_s / sum_s w_s with w_s = exp(lse_s - max lse), lse = max lse + log of
  // the weights' sum: the softmax over all keys, from the splits' softmaxes over theirs. An
  // empty split (lse -inf) weighs 0; a NaN anywhere makes the row NaN.
  void merge_splits() const {
    parallel_for_threads(int64_t(p_.batch) * p_.heads_q, plan_.threads,
                         [&](int64_t begin, int64_t end) {
      std::vector<T> merged(v_dim_);
      for (int64_t bh = begin; bh < end; ++bh) {
        const int b = static_cast<int>(bh / p_.heads_q), h = static_cast<int>(bh % p_.heads_q);
        const Sequence& seq = seqs_[b];
        for (int row = 0; row < seq.seqlen_q; ++row) {
          T max_lse = -std::numeric_limits<T>::infinity();
          bool nan = false;
          for (int split = 0; split < plan_.splits; ++split) {
            const T lse = split_lse_[split_row(split, seq, h, row)];
            nan |= std::isnan(lse);
            max_lse = std::max(max_lse, lse);
          }
          T weight_sum = 0;
          std::fill(merged.begin(), merged.end(), T(0));
          if (max_lse != -std::numeric_limits<T>::infinity())
            for (int split = 0; split < plan_.splits; ++split) {
              const int64_t at = split_row(split, seq, h, row);
              const T weight = std::exp(split_lse_[at] - max_lse);
              if (weight == T(0)) continue;
              weight_sum += weight;
              for (int d = 0; d < v_dim_; ++d) merged[d] += weight * split_out_[at * v_dim_ + d];
            }
          const bool saw_keys = weight_sum > T(0);
          const T inv_sum = nan ? std::numeric_limits<T>::quiet_NaN()
                                : (saw_keys ? T(1) / weight_sum : T(0));
          store_out_row(b, h, seq.q_row0 + row, merged.data(), inv_sum);
          const T lse = nan ? std::numeric_limits<T>::quiet_NaN()
                            : (saw_keys ? max_lse + std::log(weight_sum)
                                        : -std::numeric_limits<T>::infinity());
          *p_.lse.row<float>(b, h, seq.q_row0 + row) = static_cast<float>(lse);
        }
      }
    });
  }

  const AttnParams& p_;
  const int qk_dim_;      // of q and k
  const int v_dim_;       // of v and out (MLA: may differ from qk_dim_)
  const int gemm_dim_;    // the K of the score product: qk_dim_, or qk_dim_ rounded up to even
  const int out_stride_;  // row stride of O_i: v_dim_, or v_dim_ rounded up to whole panels
  const bool vnni_;       // kNative16: B panels are VNNI-packed
  const std::vector<Sequence> seqs_;
  const ForwardPlan plan_;
  // V in the compute type with rows that do not overlap (row stride >= head_dim_v, the leading
  // dimension brgemm accepts; an expanded V has stride 0) is read in place.
  const bool values_in_place_;
  // The row products' and the online softmax's vector width, asked once per op.
  const RowLanes row_lanes_;
  // The tile products run on vdpbf16ps (bf16), and so do the row products: Qi in bf16 and
  // unscaled, P rounded to bf16, as in the tile products (row_products.h).
  const bool row_dot_;
  HeadOperands<PackedKeysAndValues> head_operands_{p_.batch, p_.heads_kv};
  // Split-KV partial results: lse [splits][heads_q * total_q], out [...][dim].
  at::Tensor split_lse_storage_, split_out_storage_;
  T* split_lse_ = nullptr;
  T* split_out_ = nullptr;
};

}  // namespace

#ifdef FLASHATTN_TEST_COUNTERS
int64_t fwd_packed_heads_peak() { return last_packed_heads_peak.load(); }
#endif

void run_fwd(const AttnParams& p, c10::ScalarType dtype) {
  run_on_operand_path<ForwardKernel>(p, dtype,
                                     plan_forward(p, host_sequences(p), dtype != at::kDouble));
}

}  // namespace flashattn::cpu
