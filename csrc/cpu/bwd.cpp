// Backward attention on CPU: FlashAttention-2's algorithm, recomputing each probability tile
// P_ij from the saved log-sum-exp instead of storing P.
//
// Tiles are held transposed (keys x queries): with Qiᵀ, dOiᵀ and Kjᵀ packed once up front,
// every product below is a plain row-major GEMM and P_ijᵀ/dS_ijᵀ feed dVj/dKj directly:
//   S_ijᵀ  = Kj (scale·Qi)ᵀ         P_ijᵀ = exp(S_ijᵀ - lse_i)
//   dVj   += P_ijᵀ dOi              dP_ijᵀ = Vj dOiᵀ
//   dS_ijᵀ = P_ijᵀ ∘ (dP_ijᵀ - D_i)   (then through the softcap)
//   dKj   += dS_ijᵀ Qi              dQiᵀ  += Kjᵀ dS_ijᵀ   (dKj, dQi times scale at the end)
//
// Parallel and deterministic: a task owns (sequence, kv head, chunk of key blocks). It alone
// writes its key blocks' dK/dV (summed over the GQA group and the query blocks in a fixed
// order) and its chunk's own partial dQ of the group's query heads. The last of the (sequence,
// kv head)'s tasks to finish sums the chunks' partial dQ in chunk order. A sequence's chunk
// count depends only on its own shape, as if it were alone in the batch, so results are
// bitwise identical for any thread count and schedule, and a varlen sequence's gradients equal
// the dense op's on that sequence alone.
//
// Operands: as in fwd.cpp, either in the compute type (kCompute: the transposes packed, Qiᵀ
// with the softmax scale folded in; rows read in place when the input is in the compute type
// already, else packed), or, for bf16/fp16 on CPUs with native 16-bit products, kept in 16 bits
// (kNative16, panels16.h): P_ijᵀ and dS_ijᵀ are rounded to 16 bits for the products they feed,
// the scale is applied to S_ijᵀ and to dKj at the end, and every product runs over whole
// zero-padded panels (queries in blocks of one panel, kPanelWidth).
//
// Memory: the operands and the partial dQ of a (sequence, kv head) are packed and allocated
// when its first task starts, and passed on to the next (sequence, kv head) after its last
// (head_operands.h), the tasks queued head by head: about as many heads are held as there are
// threads. Packing every head up front, with a whole-batch partial dQ per chunk, held twice
// SDPA-CPU's transient memory (docs/lab/2026-12-03-cpu-comment-ledgers.md).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "dtype_dispatch.h"
#include "head_operands.h"
#include "kernels.h"
#include "packing.h"
#include "panels16.h"
#include "row_products.h"
#include "score_rows.h"
#include "scratch_buffer.h"
#include "softmax_vec.h"
#include "task_queue.h"
#include "tile_gemm.h"
#include "tiling.h"

namespace flashattn::cpu {
namespace {

#ifdef FLASHATTN_TEST_COUNTERS
// The most (sequence, kv head)s whose operands the last backward held at once:
// bwd_packed_heads_peak() (kernels.h).
std::atomic<int64_t> last_bwd_heads_peak{0};
#endif

// Keys (rows) of a transposed tile; its queries (columns) are query_block_, below. Every
// product has its sizes in {32, 64, 128, head_dim}, sizes at which fp32 brgemm runs well.
constexpr int kKeyBlock = 128;
// Key blocks of one (sequence, kv head) are split into chunks until the sequence alone has about
// this many tasks, enough to balance 16 threads; a fixed number, never the thread count, so the
// dQ summation order does not depend on the machine. Each chunk holds an fp32 copy of the
// group's dQ while its head is worked on, so more chunks cost peak memory (32 held a fifth more
// than 16; docs/lab/2026-12-03-cpu-comment-ledgers.md).
constexpr int64_t kTargetTasks = 16;
// ... and a (sequence, kv head)'s chunks' partial dQ may use at most this much (at least one
// chunk), which bounds that memory for long sequences.
constexpr int64_t kMaxGroupPartialDqBytes = int64_t(16) << 20;
// Partial dQ tiles of fewer query rows than this are zeroed by plain stores: std::fill_n on
// each row of the tile compiles to a libc memset call per row, dearer than a few stores.
constexpr int kShortFillRows = 8;

template <typename In, OperandPath kPath>
class BackwardKernel {
  using T = compute_t<In>;
  static constexpr bool kNative16 = kPath == OperandPath::kNative16;
  // Inputs already in the compute type need no copies of their rows (only of transposes).
  static constexpr bool kRowsInPlace = !kNative16 && std::is_same_v<In, T>;
  // The kCompute path of fp32 compute types recomputes the forward's row-product scores
  // (takes_row_dots).
  static constexpr bool kRowDots = !kNative16 && std::is_same_v<T, float>;

 public:
  BackwardKernel(const AttnBwdParams& p, bool vnni)
      : p_(p),
        qk_dim_(p.head_dim),
        v_dim_(p.head_dim_v),
        gemm_dim_(kNative16 ? round_up(p.head_dim, 2) : p.head_dim),
        gemm_dim_v_(kNative16 ? round_up(p.head_dim_v, 2) : p.head_dim_v),
        dk_stride_(kNative16 ? round_up(p.head_dim, kPanelWidth) : p.head_dim),
        dv_stride_(kNative16 ? round_up(p.head_dim_v, kPanelWidth) : p.head_dim_v),
        vnni_(vnni),
        query_block_(choose_query_block(std::max(p.head_dim, p.head_dim_v))),
        seqs_(host_sequences(p)),
        work_(plan_sequences()),
        // Five products (S, dP, dV, dK, dQ) against the forward's two.
        threads_(threads_for_work(attention_work(p, seqs_) * 5 / 2)),
        key_rows_(tile_key_rows()),
        products_in_place_(takes_products_in_place()),
        row_lanes_(kRowDots ? row_lanes() : RowLanes::k8) {
    // The 16-bit products take a query block as one panel.
    TORCH_INTERNAL_ASSERT(!kNative16 || query_block_ == kPanelWidth);
  }

  void run() {
    if (int64_t(p_.batch) * p_.heads_q == 0) return;
    make_room_for_row_terms();
    if (threads_ == 1)
      run_heads_inline();
    else
      run_heads_queued();
  }

 private:
  // One (sequence, kv head)'s operands, packed as the products take them (fields of the
  // operand path taken; the others stay empty), Q and dO of its group's query heads (head g of
  // the group is head g of the packing, of batch entry 0) and K and V of the kv head; and the
  // partial dQ of each chunk, [chunk][group_dq_elements].
  struct GroupOperands {
    PackedHeads<T> q_rows, q_panels, do_rows, do_panels, k_rows, k_panels, v_rows;
    // kNative16: B panels of Qiᵀ, Qi, dOiᵀ, dOi; A tiles of Kj, Kjᵀ, Vj.
    Panels16<In> q_t16, q_rows16, do_t16, do_rows16, k_rows16, k_t16, v_rows16;
    at::Tensor dq_partial_storage;
    T* dq_partial = nullptr;
  };

  // One worker's tiles, reused across its tasks: key_rows keys (rows) of query_block queries.
  struct Scratch {
    Scratch(int key_rows, int query_block, int qk_dim, int dk_stride, int dv_stride, bool softcap,
            bool dropout)
        : probs_t(size_t(key_rows) * query_block),
          dropped_t(dropout ? size_t(key_rows) * query_block : 0),
          keep_t(dropout ? size_t(key_rows) * query_block : 0),
          grad_t(size_t(key_rows) * query_block),
          tanh_t(softcap ? size_t(key_rows) * query_block : 0),
          dk_acc(size_t(key_rows) * dk_stride),
          dv_acc(size_t(key_rows) * dv_stride),
          probs16_t(kNative16 ? size_t(kKeyBlock) * query_block : 0),
          grad16_t(kNative16 ? size_t(kKeyBlock) * query_block : 0),
          grad16_vnni(kNative16 ? size_t(kKeyBlock) * query_block : 0),
          dot_q(kRowDots ? size_t(kRowProductMaxRows) * qk_dim : 0),
          dot_scores(kRowDots ? size_t(kRowProductMaxRows) * key_rows : 0),
          dot_keys(kRowDots ? key_rows : 0) {}
    ScratchBuffer<T> probs_t;  // S_ijᵀ, then P_ijᵀ; row stride query_block_
    ScratchBuffer<T> dropped_t;     // with dropout: P_ijᵀ with dropped entries 0, kept ones scaled
    ScratchBuffer<uint8_t> keep_t;  // with dropout: the tile's keep decisions
    ScratchBuffer<T> grad_t;   // dP_ijᵀ, then dS_ijᵀ
    ScratchBuffer<T> tanh_t;   // tanh of the soft-capped scores, for the chain rule
    ScratchBuffer<T> dk_acc;   // dKj in the compute type, row stride dk_stride_
    ScratchBuffer<T> dv_acc;   // dVj, row stride dv_stride_
    // kNative16, whole key blocks: P_ijᵀ and dS_ijᵀ rounded to 16 bits, zero outside the tile's
    // keys x queries (round_tile_to_16bit writes every element), and dS_ijᵀ VNNI-packed as the
    // B operand of dQ.
    ScratchBuffer<In> probs16_t, grad16_t, grad16_vnni;
    // kRowDots, a sequence the forward took the row products for: its scaled query rows, the
    // key rows and S_ij as dot_key_rows (row_products.h) takes and gives them.
    ScratchBuffer<T> dot_q, dot_scores;
    std::vector<const T*> dot_keys;
    // The operands of the task's (sequence, kv head).
    const GroupOperands* ops = nullptr;
  };

  struct Task {
    int b, kv_head, chunk;
  };

  // One sequence's share of the work: its query and key blocks and its dQ chunk count.
  struct SequenceWork {
    int query_blocks = 0;
    int key_blocks = 0;
    int chunks = 1;
    // One copy of a GQA group's dQ, in T: [group head][query block][D][query_block_].
    int64_t group_dq_elements = 0;
  };

  // Queries per tile: one 64-wide panel for the 16-bit products; 32 on the kCompute path from
  // head_dim 128 up (the larger of q's and v's), where a 128-key tile's resident operands (Kj,
  // Vj, Kjᵀ, dKj, dVj) and 64 queries' streamed ones overflow a 512 KB L2; below d = 128, 32
  // queries measured no faster (docs/lab/2026-12-03-cpu-comment-ledgers.md).
  static int choose_query_block(int head_dim) {
    return !kNative16 && head_dim >= 128 ? 32 : kPanelWidth;
  }

  // The most keys of a tile: a key block, or the longest sequence's keys if fewer (a short
  // call's tiles are small). The 16-bit dQ product runs over whole key blocks.
  int tile_key_rows() const {
    int longest = 1;
    for (const Sequence& s : seqs_) longest = std::max(longest, s.seqlen_k);
    return kNative16 ? kKeyBlock : std::min(kKeyBlock, longest);
  }

  // Whether every product of the call is small enough for tile_gemm's loops and every operand
  // is read in place (fp32 rows): then the products that take transposes read them in place
  // too (loop_gemm_strided, the same bits as the loops on packed copies), and nothing is
  // packed. Packing a call of a few queries and keys cost more than its products.
  bool takes_products_in_place() const {
    if (!kRowsInPlace) return false;
    for (auto [view, dim] : {std::pair{&p_.q, qk_dim_}, std::pair{&p_.dout, v_dim_},
                             std::pair{&p_.k, qk_dim_}, std::pair{&p_.v, v_dim_}})
      if (!rows_in_place(view->row_stride, dim)) return false;
    int longest_q = 0;
    for (const Sequence& s : seqs_) longest_q = std::max(longest_q, s.seqlen_q);
    return int64_t(key_rows_) * std::min(longest_q, query_block_) * std::max(qk_dim_, v_dim_) <=
           kLoopProductMacs;
  }

  // Each sequence's blocks and dQ chunks, chosen from its own shape only.
  std::vector<SequenceWork> plan_sequences() const {
    std::vector<SequenceWork> work(seqs_.size());
    const int64_t kv_heads = std::max(p_.heads_kv, 1);
    for (size_t b = 0; b < seqs_.size(); ++b) {
      SequenceWork& w = work[b];
      w.query_blocks = num_blocks(seqs_[b].seqlen_q, query_block_);
      w.key_blocks = num_blocks(seqs_[b].seqlen_k, kKeyBlock);
      w.group_dq_elements = int64_t(p_.head_group) * w.query_blocks * query_block_ * qk_dim_;
      const int64_t copy_bytes = std::max<int64_t>(w.group_dq_elements * int64_t(sizeof(T)), 1);
      const int64_t chunks = std::min<int64_t>({(kTargetTasks + kv_heads - 1) / kv_heads,
                                                w.key_blocks,
                                                kMaxGroupPartialDqBytes / copy_bytes});
      w.chunks = static_cast<int>(std::max<int64_t>(chunks, 1));
    }
    return work;
  }

  int64_t group_index(int b, int kv_head) const { return int64_t(b) * p_.heads_kv + kv_head; }

  int rows_of(int b, int query_block) const {
    return std::min(query_block_, seqs_[b].seqlen_q - query_block * query_block_);
  }
  int cols_of(int b, int key_block) const {
    return std::min(kKeyBlock, seqs_[b].seqlen_k - key_block * kKeyBlock);
  }
  TileVisibility visibility(int b, int query_block, int key_block) const {
    const int row_begin = query_block * query_block_, key_begin = key_block * kKeyBlock;
    return tile_visibility(seqs_[b], row_begin, row_begin + rows_of(b, query_block), key_begin,
                           key_begin + cols_of(b, key_block));
  }

  int64_t count_visible_tiles(const Task& task) const {
    const SequenceWork& w = work_[task.b];
    int64_t tiles = 0;
    for (int kb = task.chunk; kb < w.key_blocks; kb += w.chunks)
      for (int qb = 0; qb < w.query_blocks; ++qb)
        tiles += visibility(task.b, qb, kb) != TileVisibility::kNone;
    return tiles;
  }

  Scratch make_scratch() const {
    return Scratch(key_rows_, query_block_, qk_dim_, dk_stride_, dv_stride_, p_.softcap > 0,
                   p_.dropout.on());
  }

  // One thread: the (sequence, kv head)s one after another, each packed into the same
  // operands, with none of the queue's bookkeeping (run_heads_queued). The chunks and their dQ
  // summation order are the queued path's, so the bits are too. At (1, 1, 8, 64) fp32 the
  // slots, once_flags and task list cost about as much as the products.
  void run_heads_inline() {
    Scratch scratch = make_scratch();
    GroupOperands ops;
    for (int b = 0; b < p_.batch; ++b)
      for (int kv_head = 0; kv_head < p_.heads_kv; ++kv_head) {
        for (int piece = 0; piece < kPackPieces; ++piece) pack_group(b, kv_head, piece, ops);
        for (int chunk = 0; chunk < work_[b].chunks; ++chunk)
          run_key_chunk({b, kv_head, chunk}, ops, scratch);
        reduce_dq(b, kv_head, ops);
      }
    release_tile_gemm(vnni_);
#ifdef FLASHATTN_TEST_COUNTERS
    last_bwd_heads_peak.store(1);
#endif
  }

  // Threads claim (sequence, kv head, chunk) tasks; a head's operands are packed by the first
  // of its tasks and passed on after the last (head_operands.h).
  void run_heads_queued() {
    HeadOperands<GroupOperands> groups(p_.batch, p_.heads_kv);
    std::vector<Task> tasks;
    for (int b = 0; b < p_.batch; ++b)
      for (int kv_head = 0; kv_head < p_.heads_kv; ++kv_head)
        for (int chunk = 0; chunk < work_[b].chunks; ++chunk) {
          tasks.push_back({b, kv_head, chunk});
          groups.expect_task(b, kv_head);
        }
    auto cost = [&](int64_t task) { return count_visible_tiles(tasks[task]); };
    // Head by head (the heaviest first): a head's chunks cost about the same (their key blocks
    // interleave), so the threads finish a head together and about as many heads as threads
    // hold operands at once. (The forward queues as many heads as threads together: its tasks
    // of one head differ in cost.)
    auto head_of = [&](int64_t task) { return group_index(tasks[task].b, tasks[task].kv_head); };
    run_task_queue(threads_, int64_t(tasks.size()), cost, int64_t(p_.batch) * p_.heads_kv,
                   head_of,
                   [&](const auto& claim) {
                     Scratch scratch = make_scratch();
                     for (int64_t next = claim(); next >= 0; next = claim()) {
                       const Task& task = tasks[next];
                       auto ops = groups.take(task.b, task.kv_head, kPackPieces,
                                              [&](GroupOperands& packed, int piece) {
                                                pack_group(task.b, task.kv_head, piece, packed);
                                              });
                       run_key_chunk(task, *ops, scratch);
                       // The last chunk of the head to finish sums them all.
                       ops.release(
                           [&](GroupOperands& done) { reduce_dq(task.b, task.kv_head, done); });
                     }
                     release_tile_gemm(vnni_);
                   });
#ifdef FLASHATTN_TEST_COUNTERS
    last_bwd_heads_peak.store(groups.peak());
#endif
  }

  // (sequence b, kv head)'s operands are packed in kPackPieces parts, one operand each (the
  // first also makes room for the partial dQ), which the tasks that reach the head together
  // share (head_operands.h).
  static constexpr int kPackPieces = 8;
  // The last piece is no packing: the row terms of the group's query heads (compute_row_terms),
  // which only this head's tasks read. Computed here, by the head's first tasks, they need no
  // parallel region of their own: a second region per call cost a second wake-up and barrier.
  static constexpr int kRowTermsPiece = kPackPieces - 1;

  // Packs part `piece` of (sequence b, kv head)'s operands into `ops`, reusing the memory of a
  // finished head's.
  void pack_group(int b, int kv_head, int piece, GroupOperands& ops) const {
    if (piece == kRowTermsPiece) {
      compute_row_terms(b, kv_head);
      return;
    }
    if (piece == 0)
      ops.dq_partial =
          alloc_workspace<T>(ops.dq_partial_storage, work_[b].chunks * work_[b].group_dq_elements);
    if (products_in_place_) return;
    const Sequence& seq = seqs_[b];
    // One sequence each, on the stack: a vector of one here cost 112 heap allocations per
    // (1, 16, 8, 64) backward (two per piece and head).
    const SequenceRows queries{seq.q_row0, seq.seqlen_q}, keys{seq.k_row0, seq.seqlen_k};
    // Q, K (and dQ, dK) have q's head dim Dqk; V, dO (and dV) v's, Dv.
    const int group = p_.head_group, Dqk = qk_dim_, Dv = v_dim_;
    const TensorView q = heads_from<In>(p_.q, b, kv_head * group);
    const TensorView dout = heads_from<In>(p_.dout, b, kv_head * group);
    const TensorView k = heads_from<In>(p_.k, b, kv_head), v = heads_from<In>(p_.v, b, kv_head);
    if constexpr (kNative16) {
      switch (piece) {
        case 0:
          pack_key_panels<In>(ops.q_t16, q, queries, group, Dqk, query_block_, vnni_);
          break;
        case 1:
          pack_value_panels<In>(ops.q_rows16, q, queries, group, Dqk, query_block_, vnni_);
          break;
        case 2:
          pack_key_panels<In>(ops.do_t16, dout, queries, group, Dv, query_block_, vnni_);
          break;
        case 3:
          pack_value_panels<In>(ops.do_rows16, dout, queries, group, Dv, query_block_, vnni_);
          break;
        case 4:
          pack_row_tiles<In>(ops.k_rows16, k, keys, 1, Dqk, kKeyBlock);
          break;
        case 5:
          pack_transposed_tiles<In>(ops.k_t16, k, keys, 1, Dqk, kKeyBlock);
          break;
        case 6:
          pack_row_tiles<In>(ops.v_rows16, v, keys, 1, Dv, kKeyBlock);
          break;
      }
      return;
    }
    const T scale = softmax_scale<T>(p_);
    constexpr PackLayout kPanels = PackLayout::kTransposedPanels, kRows = PackLayout::kRows;
    // Row-major operands are read in place where rows_in_place() allows.
    switch (piece) {
      case 0:  // only the S product reads them, which row dots take instead (takes_row_dots)
        if (!takes_row_dots(seq))
          pack_heads<T, In>(ops.q_panels, q, queries, group, Dqk, kPanels, query_block_, scale);
        break;
      case 1:
        pack_heads<T, In>(ops.do_panels, dout, queries, group, Dv, kPanels, query_block_, T(1));
        break;
      case 2:
        pack_heads<T, In>(ops.k_panels, k, keys, 1, Dqk, kPanels, kKeyBlock, T(1));
        break;
      case 3:
        if (!rows_in_place(q.row_stride, Dqk))
          pack_heads<T, In>(ops.q_rows, q, queries, group, Dqk, kRows, query_block_, T(1));
        break;
      case 4:
        if (!rows_in_place(dout.row_stride, Dv))
          pack_heads<T, In>(ops.do_rows, dout, queries, group, Dv, kRows, query_block_, T(1));
        break;
      case 5:
        if (!rows_in_place(k.row_stride, Dqk))
          pack_heads<T, In>(ops.k_rows, k, keys, 1, Dqk, kRows, kKeyBlock, T(1));
        break;
      case 6:
        if (!rows_in_place(v.row_stride, Dv))
          pack_heads<T, In>(ops.v_rows, v, keys, 1, Dv, kRows, kKeyBlock, T(1));
        break;
    }
  }

  // An input already in the compute type, with rows that do not overlap (row stride >= its head
  // dim, the leading dimension brgemm accepts; an expanded tensor has stride 0), needs no copy.
  bool rows_in_place(int64_t row_stride, int dim) const {
    return kRowsInPlace && row_stride >= dim;
  }

  // Rows [first_row, ...) of head `head` of sequence b of a row-major operand whose sequence
  // starts at row row0 of `input`: the input itself where rows_in_place(), else its packed
  // copy, where it is head `packed_head`; rows of `dim` elements. Returns the pointer; *ld gets
  // the row stride.
  const T* operand_rows(const PackedHeads<T>& packed, int packed_head, const TensorView& input,
                        int dim, int64_t row0, int b, int head, int first_row,
                        int64_t* ld) const {
    if (rows_in_place(input.row_stride, dim)) {
      *ld = input.row_stride;
      return input.row<const T>(b, head, row0 + first_row);
    }
    *ld = dim;
    return packed.head(0, packed_head) + int64_t(first_row) * dim;
  }

  // Per query row, at query_row_index (mask.h): D_i = rowsum(dO_i ∘ O_i) - dlse_i, and the
  // shift that recomputes P_ij from S_ij. A row that saw no key has lse = -inf; shifting by +inf
  // instead makes its P row 0. Rows of no sequence are never read.
  void make_room_for_row_terms() {
    const int64_t rows_total = int64_t(p_.heads_q) * p_.total_q;
    d_terms_ = alloc_workspace<T>(d_terms_storage_, rows_total);
    lse_shift_ = alloc_workspace<T>(lse_shift_storage_, rows_total);
  }

  // The row terms of sequence b's query heads that share kv head kv_head.
  void compute_row_terms(int b, int kv_head) const {
    const Sequence& seq = seqs_[b];
    for (int h = kv_head * p_.head_group; h < (kv_head + 1) * p_.head_group; ++h)
      for (int i0 = 0; i0 < seq.seqlen_q; i0 += kDotRows) {
        const int rows = std::min(kDotRows, seq.seqlen_q - i0);
        T dots[kDotRows];
        const In* o_rows = p_.o.row<const In>(b, h, seq.q_row0 + i0);
        const In* do_rows = p_.dout.row<const In>(b, h, seq.q_row0 + i0);
        if constexpr (std::is_same_v<In, T>) {
          product_dots(rows, do_rows, p_.dout.row_stride, o_rows, p_.o.row_stride, v_dim_, dots);
        } else {
          for (int r = 0; r < rows; ++r) {
            const In* o_row = o_rows + r * p_.o.row_stride;
            const In* do_row = do_rows + r * p_.dout.row_stride;
            T dot = 0;
            for (int d = 0; d < v_dim_; ++d)
              dot += static_cast<T>(do_row[d]) * static_cast<T>(o_row[d]);
            dots[r] = dot;
          }
        }
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          const int64_t row = seq.q_row0 + i, idx = query_row_index(p_, seq, h, i);
          const T dlse =
              p_.dlse.ptr ? static_cast<T>(*p_.dlse.row<const float>(b, h, row)) : T(0);
          d_terms_[idx] = dots[r] - dlse;
          const float lse = *p_.lse.row<const float>(b, h, row);
          lse_shift_[idx] = lse == -std::numeric_limits<float>::infinity()
                                ? std::numeric_limits<T>::infinity()
                                : static_cast<T>(lse);
        }
      }
  }

  // The partial dQᵀ of (chunk, query head g of the group, query block) of sequence b.
  T* dq_partial(const GroupOperands& ops, int b, int chunk, int g, int query_block) const {
    const SequenceWork& w = work_[b];
    return ops.dq_partial + chunk * w.group_dq_elements +
           (int64_t(g) * w.query_blocks + query_block) * qk_dim_ * query_block_;
  }

  // Task's key blocks, with (sequence, kv head)'s operands `ops`: dK/dV stored, dQ into the
  // chunk's partial buffer.
  void run_key_chunk(const Task& task, const GroupOperands& ops, Scratch& s) {
    const SequenceWork& w = work_[task.b];
    s.ops = &ops;
    zero_dq_partial(ops, task.b, task.chunk);
    const int first_head = task.kv_head * p_.head_group;
    for (int kb = task.chunk; kb < w.key_blocks; kb += w.chunks) {
      const size_t cols = cols_of(task.b, kb);
      std::fill_n(s.dk_acc.data(), cols * dk_stride_, T(0));
      std::fill_n(s.dv_acc.data(), cols * dv_stride_, T(0));
      for (int g = 0; g < p_.head_group; ++g)
        for (int qb = 0; qb < w.query_blocks; ++qb)
          accumulate_tile(task, first_head + g, qb, kb, s);
      store_dk_dv(task, kb, s);
    }
    s.ops = nullptr;
  }

  // The score rules (score_rows.h) of sequence b: the 16-bit products leave S_ijᵀ unscaled.
  ScoreRows<T> score_rows(int b) const {
    return ScoreRows<T>(p_, seqs_[b], b, /*scores_scaled=*/!kNative16);
  }

  void accumulate_tile(const Task& task, int h, int qb, int kb, Scratch& s) {
    const int row_begin = qb * query_block_, key_begin = kb * kKeyBlock;
    const ScoreTile tile{visibility(task.b, qb, kb),
                         mask_tile(p_.mask, task.b, h, row_begin, row_begin + rows_of(task.b, qb),
                                   key_begin, key_begin + cols_of(task.b, kb))};
    if (tile.hidden()) return;
    if constexpr (kNative16)
      accumulate_tile_16bit(task, h, qb, kb, tile, s);
    else
      accumulate_tile_compute(task, h, qb, kb, tile, s);
  }

  // S_ijᵀ (in probs, row stride query_block_) -> P_ijᵀ in place: the score rules' steps 1-5 on
  // each key's line across the queries, then the exp.
  void scores_to_probs(const Task& task, int h, int qb, int kb, const ScoreTile& tile, T* probs,
                       Scratch& s) const {
    const int row_begin = qb * query_block_, rows = rows_of(task.b, qb);
    const int key_begin = kb * kKeyBlock, cols = cols_of(task.b, kb);
    const ScoreRows<T> rules = score_rows(task.b);
    if (kNative16 || rules.has_row_steps(tile))
      for (int c = 0; c < cols; ++c) {
        const size_t at = size_t(c) * query_block_;
        T* tanh_out = p_.softcap > 0 ? s.tanh_t.data() + at : nullptr;
        rules.logits(probs + at, ScoreLine::of_key(h, key_begin + c, row_begin, rows), tile,
                     tanh_out);
      }
    rules.to_probs(probs, cols, rows, query_block_,
                   lse_shift_ + query_row_index(p_, seqs_[task.b], h, row_begin));
  }

  // The P_ijᵀ that dVj += P_ijᵀ dOi multiplies: `probs` itself, or with dropout its dropped
  // copy (the tile's keep decisions go to s.keep_t for dP_ijᵀ).
  const T* probs_for_dv(const Task& task, int h, int qb, int kb, const T* probs, Scratch& s) const {
    if (!p_.dropout.on()) return probs;
    const int rows = rows_of(task.b, qb), cols = cols_of(task.b, kb);
    const ScoreRows<T> rules = score_rows(task.b);
    rules.keeps(s.keep_t.data(), query_block_, h, qb * query_block_, rows, kb * kKeyBlock, cols);
    std::copy_n(probs, size_t(cols) * query_block_, s.dropped_t.data());
    rules.drop(s.keep_t.data(), s.dropped_t.data(), cols, rows, query_block_);
    return s.dropped_t.data();
  }

  // dP_ijᵀ (in grads) -> dS_ijᵀ in place: through the dropout (the decisions probs_for_dv
  // made), the softmax and the softcap (score_rows.h).
  void probs_grad_to_scores_grad(const Task& task, int h, int qb, int kb, const T* probs,
                                 T* grads, const Scratch& s) const {
    const int rows = rows_of(task.b, qb), cols = cols_of(task.b, kb);
    const int64_t row_terms = query_row_index(p_, seqs_[task.b], h, qb * query_block_);
    const ScoreRows<T> rules = score_rows(task.b);
    rules.dlogits(grads, probs, s.keep_t.data(), cols, rows, query_block_, d_terms_ + row_terms);
    if (p_.dmask != nullptr) store_mask_grad(task.b, h, qb, kb, grads);
    rules.dscores(grads, s.tanh_t.data(), cols, rows, query_block_);
  }

  // dL/dlogit of the tile (dS_ijᵀ before the softcap's chain rule) into p_.dmask [B, Hq, Sq, Sk]:
  // the gradient of attn_mask, which is added to the logit.
  void store_mask_grad(int b, int h, int qb, int kb, const T* grads) const {
    const int rows = rows_of(b, qb), cols = cols_of(b, kb);
    const int64_t row_begin = qb * query_block_, key_begin = kb * kKeyBlock;
    float* head = p_.dmask + (int64_t(b) * p_.heads_q + h) * p_.seqlen_q * p_.seqlen_k;
    for (int c = 0; c < cols; ++c)
      for (int r = 0; r < rows; ++r)
        head[(row_begin + r) * p_.seqlen_k + key_begin + c] =
            static_cast<float>(grads[size_t(c) * query_block_ + r]);
  }

  // Rounds the tile's cols x rows corner of `tile` to 16 bits; the rest of `tile16` stays 0.
  void round_tile_to_16bit(const T* tile, int rows, int cols, ScratchBuffer<In>& tile16) const {
    if constexpr (kNative16) {
      for (int c = 0; c < kKeyBlock; ++c) {
        In* row16 = tile16.data() + size_t(c) * query_block_;
        const int valid = c < cols ? rows : 0;
        round_to_16bit(tile + size_t(c) * query_block_, row16, valid);
        std::fill(row16 + valid, row16 + query_block_, In(0.f));
      }
    }
  }

  // acc (cols x whole panels, row stride acc_stride) += a (cols x query_block_, 16-bit) times
  // the panels of query block qb of the group's head g, one 64-column panel at a time.
  void accumulate_panel_products(int cols, const In* a, const Panels16<In>& panels, int g, int qb,
                                 T* acc, int acc_stride) const {
    for (int panel = 0; panel < panels.panels_per_block; ++panel)
      tile_gemm(cols, kPanelWidth, query_block_, a, query_block_, panels.panel(0, g, qb, panel),
                kPanelWidth, acc + panel * kPanelWidth, acc_stride, /*accumulate=*/true, vnni_);
  }

  void accumulate_tile_16bit(const Task& task, int h, int qb, int kb, const ScoreTile& tile,
                             Scratch& s) {
    if constexpr (kNative16) {
      const int b = task.b, rows = rows_of(b, qb), cols = cols_of(b, kb);
      const int g = h - task.kv_head * p_.head_group;
      const GroupOperands& ops = *s.ops;
      T* probs = s.probs_t.data();
      T* grads = s.grad_t.data();

      // S_ijᵀ = Kj Qiᵀ (unscaled), then P_ijᵀ.
      tile_gemm(cols, query_block_, gemm_dim_, ops.k_rows16.panel(0, 0, kb, 0), gemm_dim_,
                ops.q_t16.panel(0, g, qb, 0), kPanelWidth, probs, query_block_, false, vnni_);
      scores_to_probs(task, h, qb, kb, tile, probs, s);
      round_tile_to_16bit(probs_for_dv(task, h, qb, kb, probs, s), rows, cols, s.probs16_t);
      // dVj += P_ijᵀ dOi
      accumulate_panel_products(cols, s.probs16_t.data(), ops.do_rows16, g, qb, s.dv_acc.data(),
                                dv_stride_);
      // dP_ijᵀ = Vj dOiᵀ, then dS_ijᵀ.
      tile_gemm(cols, query_block_, gemm_dim_v_, ops.v_rows16.panel(0, 0, kb, 0), gemm_dim_v_,
                ops.do_t16.panel(0, g, qb, 0), kPanelWidth, grads, query_block_, false, vnni_);
      probs_grad_to_scores_grad(task, h, qb, kb, probs, grads, s);
      round_tile_to_16bit(grads, rows, cols, s.grad16_t);
      // dKj += dS_ijᵀ Qi (the scale is applied when dKj is stored)
      accumulate_panel_products(cols, s.grad16_t.data(), ops.q_rows16, g, qb, s.dk_acc.data(),
                                dk_stride_);
      // dQiᵀ += Kjᵀ dS_ijᵀ over the whole key block (dS_ijᵀ is 0 past the last key).
      const In* grads_b = s.grad16_t.data();
      if (vnni_) {
        pack_vnni_panel(grads_b, s.grad16_vnni.data(), kKeyBlock);
        grads_b = s.grad16_vnni.data();
      }
      tile_gemm(qk_dim_, query_block_, kKeyBlock, ops.k_t16.panel(0, 0, kb, 0), kKeyBlock, grads_b,
                kPanelWidth, dq_partial(ops, b, task.chunk, g, qb), query_block_, true, vnni_);
    }
  }

  // Whether the forward took the sequence's scores from dot_key_rows (row_products.h). The
  // backward then takes them from the same dots, on the same scaled rows, and so gets the
  // forward's S bit for bit: S - lse is then exact at a row's maximum, where a rounding apart
  // moves the P of a nearly one-hot row (fp32 dV at S = 8 was 3.8-8x PyTorch's error).
  bool takes_row_dots(const Sequence& seq) const {
    return kRowDots && sequence_takes_row_products(seq.seqlen_q, p_.head_group);
  }

  // S_ijᵀ of `rows` queries (at most kRowProductMaxRows) and `cols` keys into probs, as the
  // forward's row products computed S_ij.
  void row_dot_scores(int cols, int rows, const T* k_rows, int64_t ld_k, const T* q_rows,
                      int64_t ld_q, T* probs, Scratch& s) const {
    if constexpr (kRowDots) {
      scale_rows_into(q_rows, ld_q, rows, qk_dim_, softmax_scale<T>(p_), s.dot_q.data(),
                      qk_dim_);
      for (int c = 0; c < cols; ++c) s.dot_keys[c] = k_rows + c * ld_k;
      const RowStream<float> keys{s.dot_keys.data(), cols};
      dot_key_rows(row_lanes_, s.dot_q.data(), rows, qk_dim_, keys, qk_dim_, s.dot_scores.data(),
                   cols);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          probs[size_t(c) * query_block_ + r] = s.dot_scores[size_t(r) * cols + c];
    }
  }

  void accumulate_tile_compute(const Task& task, int h, int qb, int kb, const ScoreTile& tile,
                               Scratch& s) {
    // Q, K, dQ, dK: Dqk columns; V, dO, dV: Dv.
    const int b = task.b, Dqk = qk_dim_, Dv = v_dim_;
    const Sequence& seq = seqs_[b];
    const GroupOperands& ops = *s.ops;
    const int g = h - task.kv_head * p_.head_group;
    const int row_begin = qb * query_block_, rows = rows_of(b, qb);
    const int key_begin = kb * kKeyBlock, cols = cols_of(b, kb);
    int64_t ld_k, ld_v, ld_q, ld_do;
    const T* k_rows =
        operand_rows(ops.k_rows, 0, p_.k, Dqk, seq.k_row0, b, task.kv_head, key_begin, &ld_k);
    const T* v_rows =
        operand_rows(ops.v_rows, 0, p_.v, Dv, seq.k_row0, b, task.kv_head, key_begin, &ld_v);
    const T* q_rows =
        operand_rows(ops.q_rows, g, p_.q, Dqk, seq.q_row0, b, h, row_begin, &ld_q);
    const T* do_rows =
        operand_rows(ops.do_rows, g, p_.dout, Dv, seq.q_row0, b, h, row_begin, &ld_do);
    T* probs = s.probs_t.data();
    T* grads = s.grad_t.data();

    T* dq = dq_partial(ops, b, task.chunk, g, qb);

    // S_ijᵀ = Kj (scale·Qi)ᵀ, then P_ijᵀ row by row (a row is one key, across the queries).
    if (takes_row_dots(seq))
      row_dot_scores(cols, rows, k_rows, ld_k, q_rows, ld_q, probs, s);
    else if (products_in_place_)
      loop_gemm_strided(cols, rows, Dqk, k_rows, ld_k, 1, q_rows, 1, ld_q, softmax_scale<T>(p_),
                        probs, query_block_, /*accumulate=*/false);
    else
      tile_gemm(cols, rows, Dqk, k_rows, ld_k,
                ops.q_panels.head(0, g) + int64_t(qb) * Dqk * query_block_, query_block_, probs,
                query_block_, /*accumulate=*/false);
    scores_to_probs(task, h, qb, kb, tile, probs, s);
    // dVj += P_ijᵀ dOi (dropped)
    tile_gemm(cols, Dv, rows, probs_for_dv(task, h, qb, kb, probs, s), query_block_, do_rows,
              ld_do, s.dv_acc.data(), Dv, true);
    // dP_ijᵀ = Vj dOiᵀ, then dS_ijᵀ in place.
    if (products_in_place_)
      loop_gemm_strided(cols, rows, Dv, v_rows, ld_v, 1, do_rows, 1, ld_do, T(1), grads,
                        query_block_, /*accumulate=*/false);
    else
      tile_gemm(cols, rows, Dv, v_rows, ld_v,
                ops.do_panels.head(0, g) + int64_t(qb) * Dv * query_block_, query_block_, grads,
                query_block_, /*accumulate=*/false);
    probs_grad_to_scores_grad(task, h, qb, kb, probs, grads, s);
    // dKj += dS_ijᵀ Qi (the scale is applied when dKj is stored)
    tile_gemm(cols, Dqk, rows, grads, query_block_, q_rows, ld_q, s.dk_acc.data(), Dqk, true);
    // dQiᵀ += Kjᵀ dS_ijᵀ, into this chunk's partial buffer.
    if (products_in_place_)
      loop_gemm_strided(Dqk, rows, cols, k_rows, 1, ld_k, grads, query_block_, 1, T(1), dq,
                        query_block_, /*accumulate=*/true);
    else
      tile_gemm(Dqk, rows, cols, ops.k_panels.head(0, 0) + int64_t(kb) * Dqk * kKeyBlock,
                kKeyBlock,
                grads, query_block_, dq, query_block_, /*accumulate=*/true);
  }

  void store_dk_dv(const Task& task, int kb, const Scratch& s) const {
    // dK = scale · Σ dS_ijᵀ Qi: Qi enters that product unscaled on both paths.
    const T dk_scale = softmax_scale<T>(p_);
    const int64_t row0 = seqs_[task.b].k_row0 + kb * kKeyBlock;
    const int cols = cols_of(task.b, kb);
    if (stores_grads_in_compute_type()) {
      // Whole rows at a time, in vectors: the per-element loop below was a fixed cost of
      // every head at short sequences. The same products, so the same bits.
      scale_rows_into(s.dk_acc.data(), dk_stride_, cols, qk_dim_, dk_scale,
                      p_.dk.row<T>(task.b, task.kv_head, row0), p_.dk.row_stride);
      for (int c = 0; c < cols; ++c)
        std::copy_n(s.dv_acc.data() + size_t(c) * dv_stride_, v_dim_,
                    p_.dv.row<T>(task.b, task.kv_head, row0 + c));
      return;
    }
    for (int c = 0; c < cols; ++c) {
      const T* dk_acc = s.dk_acc.data() + size_t(c) * dk_stride_;
      const T* dv_acc = s.dv_acc.data() + size_t(c) * dv_stride_;
      store_grad_row(p_.dk, task.b, task.kv_head, row0 + c, qk_dim_,
                     [&](int d) { return dk_scale * dk_acc[d]; });
      store_grad_row(p_.dv, task.b, task.kv_head, row0 + c, v_dim_,
                     [&](int d) { return dv_acc[d]; });
    }
  }

  // Whether the gradients are stored in the compute type T, so need no conversion.
  bool stores_grads_in_compute_type() const {
    return p_.grads_fp32 ? std::is_same_v<T, float> : std::is_same_v<In, T>;
  }

  // Row `row` of head h in batch b of the gradient `grad` (dq, dk or dv): value(d) for its `dim`
  // columns, rounded once to the gradient's type: In, or float32 when p_.grads_fp32 (16-bit
  // inputs; params.h), which for float32 inputs is In.
  template <typename Value>
  void store_grad_row(const TensorView& grad, int b, int h, int64_t row, int dim,
                      Value value) const {
    if (p_.grads_fp32) {
      float* out = grad.row<float>(b, h, row);
      for (int d = 0; d < dim; ++d) out[d] = static_cast<float>(value(d));
    } else {
      In* out = grad.row<In>(b, h, row);
      for (int d = 0; d < dim; ++d) out[d] = static_cast<In>(value(d));
    }
  }

  // Zeroes a chunk's partial dQᵀ tiles where the products accumulate: the first rows_of()
  // columns of each tile (a short sequence's tiles are mostly columns it has no query for);
  // the 16-bit products accumulate whole panels.
  void zero_dq_partial(const GroupOperands& ops, int b, int chunk) const {
    for (int g = 0; g < p_.head_group; ++g)
      for (int qb = 0; qb < work_[b].query_blocks; ++qb) {
        T* tile = dq_partial(ops, b, chunk, g, qb);
        const int rows = kNative16 ? query_block_ : rows_of(b, qb);
        if (rows < kShortFillRows) {
          // A few columns: stores down the columns, not one libc memset call per dQ row.
          for (int r = 0; r < rows; ++r)
            for (int d = 0; d < qk_dim_; ++d) tile[size_t(d) * query_block_ + r] = T(0);
        } else {
          for (int d = 0; d < qk_dim_; ++d)
            std::fill_n(tile + size_t(d) * query_block_, rows, T(0));
        }
      }
  }

  // dQ_i = scale · (sum over chunks, in chunk order, of the partial dQiᵀ)ᵀ, for the query
  // heads of (sequence b, kv head). One chunk is read where it is.
  void reduce_dq(int b, int kv_head, const GroupOperands& ops) const {
    const int chunks = work_[b].chunks;
    const T scale = softmax_scale<T>(p_);
    ScratchBuffer<T> sum(chunks > 1 ? size_t(qk_dim_) * query_block_ : 0);
    for (int g = 0; g < p_.head_group; ++g)
      for (int qb = 0; qb < work_[b].query_blocks; ++qb) {
        const int rows = rows_of(b, qb);
        const T* total = dq_partial(ops, b, 0, g, qb);
        if (chunks > 1) {
          for (int d = 0; d < qk_dim_; ++d)
            std::copy_n(total + size_t(d) * query_block_, rows,
                        sum.data() + size_t(d) * query_block_);
          for (int chunk = 1; chunk < chunks; ++chunk) {
            const T* part = dq_partial(ops, b, chunk, g, qb);
            for (int d = 0; d < qk_dim_; ++d)
              for (int r = 0; r < rows; ++r)
                sum[size_t(d) * query_block_ + r] += part[size_t(d) * query_block_ + r];
          }
          total = sum.data();
        }
        const int64_t row0 = seqs_[b].q_row0 + qb * query_block_;
        const int head = kv_head * p_.head_group + g;
        int r = 0;
        if constexpr (std::is_same_v<In, T>)
          r = untranspose_row_quads(total, query_block_, rows, qk_dim_, scale,
                                    [&](int row) { return p_.dq.row<In>(b, head, row0 + row); });
        for (; r < rows; ++r)
          store_grad_row(p_.dq, b, head, row0 + r, qk_dim_,
                         [&](int d) { return scale * total[size_t(d) * query_block_ + r]; });
      }
  }

  const AttnBwdParams& p_;
  const int qk_dim_;       // of q, k (and dq, dk)
  const int v_dim_;        // of v, out, dout (and dv); MLA: may differ from qk_dim_
  const int gemm_dim_;     // K of the products over q's head dim: qk_dim_, or rounded up to even
  const int gemm_dim_v_;   // K of dP_ijᵀ = Vj dOiᵀ: v_dim_, or rounded up to even
  const int dk_stride_;    // row stride of dKj: qk_dim_, or rounded up to whole panels
  const int dv_stride_;    // row stride of dVj: v_dim_, or rounded up to whole panels
  const bool vnni_;       // kNative16: B panels are VNNI-packed
  const int query_block_;
  const std::vector<Sequence> seqs_;
  std::vector<SequenceWork> work_;  // per sequence
  const int threads_;  // the threads the call is worth (threads_for_work)
  const int key_rows_;  // the most keys a tile holds (tile_key_rows)
  const bool products_in_place_;  // takes_products_in_place()
  const RowLanes row_lanes_;      // the forward's (row_lanes(), simd.h), for takes_row_dots
  at::Tensor d_terms_storage_, lse_shift_storage_;
  T* d_terms_ = nullptr;
  T* lse_shift_ = nullptr;
};

}  // namespace

void run_bwd(const AttnBwdParams& p, c10::ScalarType dtype) {
  run_on_operand_path<BackwardKernel>(p, dtype);
}

#ifdef FLASHATTN_TEST_COUNTERS
int64_t bwd_packed_heads_peak() { return last_bwd_heads_peak.load(); }
#endif

}  // namespace flashattn::cpu
