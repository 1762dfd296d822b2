// Forward attention on CPU: FlashAttention-2's algorithm. Each task takes one block of query
// rows Qi of one head of one sequence and streams the visible key/value tiles Kj, Vj of that
// sequence past it, keeping only one score tile S_ij = Qi Kjᵀ, the running row maximum m_i and
// row sum l_i, and the unnormalized output accumulator O_i. Memory is O(S·D): nothing of size
// Sq x Sk is ever allocated. Blocks start at each sequence's first row, so in a varlen batch a
// sequence's result is bit for bit the dense op's on that sequence alone; the task queue runs
// the blocks of all sequences, heaviest first, so one long sequence among short ones still
// keeps every thread busy.
//
// This file plans a call (plan_forward) and dispatches its tasks to two kernels, each run with
// the product engine the call chose once (ForwardCall) from the dtype and the CPU:
//   the tile kernel (fwd_tile_kernel.h)     GEMMs on packed or streamed K and V tiles
//                                           (engines: fwd_tile_products.h);
//   the decode kernel (fwd_decode_kernel.h) few query rows per kv head: products that read the
//                                           key and value rows where they are
//                                           (engines: fwd_row_products.h).
// Both fold each key block into the same online softmax (fwd_online_softmax.h) and store or
// merge their rows the same way (fwd_split_merge.h).
//
// Decoding (few query rows, a long KV cache) changes three things, all chosen per call by
// plan_forward(): with GQA the query heads of one kv head share a tile, so each key is read once
// per kv head; when each kv head's keys are read by one task only they are converted tile by
// tile as they stream past rather than packed first (a second copy of the cache); and a
// sequence's keys may be split into num_splits parts, computed as separate tasks and merged by
// their LSEs, so one long sequence keeps every thread busy. When each kv head has only a few
// query rows (one token of each head of a GQA group), the decode kernel takes the sequence, and
// a tile takes the groups of several kv heads, so that it reads the cache key by key through
// the heads, in memory order.
#include <algorithm>
#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

#include "dtype_dispatch.h"
#include "fwd_decode_kernel.h"
#include "fwd_online_softmax.h"
#include "fwd_plan.h"
#include "fwd_row_products.h"
#include "fwd_split_merge.h"
#include "fwd_tile_kernel.h"
#include "fwd_tile_products.h"
#include "kernels.h"
#include "packing.h"
#include "panels16.h"
#include "row_products.h"
#include "simd.h"
#include "task_queue.h"
#include "tile_gemm.h"
#include "tiling.h"

namespace flashattn::cpu {
namespace {

#ifdef FLASHATTN_TEST_COUNTERS
// fwd_packed_heads_peak() (kernels.h).
std::atomic<int64_t> last_packed_heads_peak{0};
#endif

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

// The tasks of a call: query blocks of each sequence and head group, each split's keys apart.
std::vector<ForwardTask> forward_tasks(const AttnParams& p, const std::vector<Sequence>& seqs,
                                       const ForwardPlan& plan) {
  std::vector<ForwardTask> tasks;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; h += plan.heads_per_tile)
      for (int row = 0; row < seqs[b].seqlen_q; row += plan.query_block)
        for (int split = 0; split < plan.splits; ++split)
          tasks.push_back({b, h, row, std::min(plan.query_block, seqs[b].seqlen_q - row), split});
  return tasks;
}

// Stands for the decode kernel's engine where there is none (fp64: gradcheck's tiles only).
struct NoRowProducts {};
template <typename RowProducts>
struct DecodeKernelOf {
  using Kernel = DecodeKernel<RowProducts>;
  using Scratch = typename Kernel::Scratch;
};
template <>
struct DecodeKernelOf<NoRowProducts> {
  using Kernel = NoRowProducts;
  using Scratch = NoRowProducts;
};

// Runs the call's tasks on the tile kernel with engine `tiles` and, for the sequences that
// take the row products, the decode kernel with engine `rows`; the online softmax on `lanes`.
template <typename TileProducts, typename RowProducts>
void run_forward(const AttnParams& p, const ForwardPlan& plan, RowLanes lanes,
                 const TileProducts& tiles, const RowProducts& rows) {
  using In = typename TileProducts::In;
  constexpr bool kDecodes = !std::is_same_v<RowProducts, NoRowProducts>;
  const std::vector<Sequence> seqs = host_sequences(p);
  const std::vector<ForwardTask> tasks = forward_tasks(p, seqs, plan);
  if (tasks.empty()) return;
  const ForwardOutput<In> output(p, seqs, plan.splits);
  const ForwardCallState<In> call{p, seqs, plan, lanes, output};
  TileKernel<TileProducts> tile_kernel(call, tiles);
  using Decode = DecodeKernelOf<RowProducts>;
  std::optional<typename Decode::Kernel> decode_kernel;
  if constexpr (kDecodes) decode_kernel.emplace(call, rows);
  // Whether a task's sequence takes the row products: when each of its tiles holds at most
  // kRowProductMaxRows query rows, however the call groups them (GQA heads, query blocks).
  // Decided by the sequence alone, so a sequence of a varlen batch still gets the bits it gets
  // alone.
  auto decodes = [&](const ForwardTask& t) {
    return kDecodes && sequence_takes_row_products(seqs[t.b].seqlen_q, p.head_group);
  };
  for (const ForwardTask& t : tasks)
    if (!decodes(t)) tile_kernel.expect(t);

  auto cost = [&](int64_t task) {
    const BlockRange keys = task_key_blocks(seqs[tasks[task].b], tasks[task], plan.splits);
    return int64_t(keys.last - keys.first);
  };
  // The tasks of as many (sequence, kv head)s as there are threads queue together: the K and
  // V packed for a head live while its tasks run, so a few heads are packed at any moment,
  // not all. One head at a time put every thread on the same head and made a causal forward
  // slower than heavy-first over all tasks, which as many heads as threads did not.
  const int64_t heads_together = plan.threads;
  auto heads_of = [&](int64_t task) {
    const ForwardTask& t = tasks[task];
    return (int64_t(t.b) * p.heads_kv + t.head0 / p.head_group) / heads_together;
  };
  const int64_t groups = (int64_t(p.batch) * p.heads_kv + heads_together - 1) / heads_together;
  run_task_queue(plan.threads, int64_t(tasks.size()), cost, groups, heads_of,
                 [&](const auto& claim) {
                   TileRows<In> tile(plan.tile_rows, tiles.out_stride,
                                     TileProducts::kForm == ScoreForm::kUnscaled16);
                   // Each kernel's scratch, made when the worker's first task of it comes.
                   std::optional<typename TileKernel<TileProducts>::Scratch> tile_scratch;
                   std::optional<typename Decode::Scratch> decode_scratch;
                   for (int64_t task = claim(); task >= 0; task = claim()) {
                     const ForwardTask& t = tasks[task];
                     if constexpr (kDecodes) {
                       if (decodes(t)) {
                         if (!decode_scratch) decode_scratch.emplace(plan, rows);
                         decode_kernel->run(t, tile, *decode_scratch);
                         continue;
                       }
                     }
                     if (!tile_scratch) tile_scratch.emplace(plan, tiles);
                     tile_kernel.run(t, tile, *tile_scratch);
                   }
                   release_tile_gemm(tiles.vnni);
                 });
  output.merge(plan.threads);
#ifdef FLASHATTN_TEST_COUNTERS
  if (tile_kernel.packed_heads_peak() > 0)
    last_packed_heads_peak.store(tile_kernel.packed_heads_peak());
#endif
}

// The call's engines, chosen once from the dtype and the CPU: the operand path's tile
// products, and for fp32 compute the row products on vdpbf16ps where the tile products run
// there too (bf16), else in fp32.
template <typename In, OperandPath kPath>
class ForwardCall {
 public:
  ForwardCall(const AttnParams& p, bool vnni, const ForwardPlan& plan)
      : p_(p), vnni_(vnni), plan_(plan) {}

  void run() const {
    // The fp32 vector width of the row products and the online softmax, asked once per call
    // (fp64 takes none).
    const RowLanes lanes = std::is_same_v<compute_t<In>, float> ? row_lanes() : RowLanes::k8;
    if constexpr (kPath == OperandPath::kNative16) {
      const Native16TileProducts<In> tiles(p_, vnni_);
      if constexpr (std::is_same_v<In, c10::BFloat16>)
        if (vnni_ && packed_gemm16_kernel_of<In>().load() == Gemm16Kernel::kAvx512Dot)
          return run_forward(p_, plan_, lanes, tiles, Bf16DotRowProducts(p_));
      run_forward(p_, plan_, lanes, tiles, Fp32RowProducts<In>(p_, lanes));
    } else if constexpr (std::is_same_v<compute_t<In>, float>) {
      run_forward(p_, plan_, lanes, ComputeTileProducts<In>(p_), Fp32RowProducts<In>(p_, lanes));
    } else {
      run_forward(p_, plan_, lanes, ComputeTileProducts<In>(p_), NoRowProducts{});
    }
  }

 private:
  const AttnParams& p_;
  const bool vnni_;
  const ForwardPlan plan_;
};

}  // namespace

#ifdef FLASHATTN_TEST_COUNTERS
int64_t fwd_packed_heads_peak() { return last_packed_heads_peak.load(); }
#endif

void run_fwd(const AttnParams& p, c10::ScalarType dtype) {
  run_on_operand_path<ForwardCall>(p, dtype,
                                   plan_forward(p, host_sequences(p), dtype != at::kDouble));
}

}  // namespace flashattn::cpu
