// Decoding with GQA on the GPU: the query heads of one kv head become the query rows of one
// tile, so each K/V byte is read once per kv head, not once per query head.
//
// A decoding step has one query token per sequence. Run as it comes, every query head is its
// own CTA, reading its kv head's whole cache for a tile with one live row: with g query heads
// per kv head the cache crosses from memory g times (4 for Llama-3-8B's 32 / 8 heads), and
// decoding is bound by exactly those bytes. FA2 swaps the group into the sequence dimension
// for this case (seqlenq_ngroups_swapped); here it is a change of views, with no copy:
//   q[b, 0, kvh * g + i, :]  is row i of "head" kvh, i < g,
// and so for out and lse. Query head h = kvh * g + i sits at h * head_stride, which is
// kvh * (g * head_stride) + i * head_stride: the new head stride is g times the old one and
// the new row stride is the old head stride. heads_q becomes heads_kv and the group 1.
//
// It applies only where every row of the group would see the same keys with the same logits:
//   - one query per sequence of a dense batch (no cu_seqlens_q, no seqused_q: their row
//     indices count tokens, which the packed rows no longer are);
//   - no sliding window on the left, and on the right none or one that is bottom-right aligned
//     (it then ends at the last key, which the single query sees anyway): a window depends on
//     the row's position, and packed rows 0..g-1 would take g different ones;
//   - no ALiBi (a slope per query head, while LogitRules keeps one per CTA), no attn_mask
//     (indexed by query head and row), no dropout (its random stream is keyed by head and row).
// Softcap, KV caches (paged, cache_batch_idx, leftpad) and split-KV are per key or per CTA and
// go through unchanged; the split heuristic then sees heads_kv x g rows and splits for them.
// The CPU executor needs none of this: its planner puts a GQA group into one tile itself
// (cpu/fwd.cpp, plan_forward).
#pragma once
#include "../params.h"

namespace flashattn::cuda {

inline bool can_pack_gqa_decode(const AttnParams& p) {
  return p.seqlen_q == 1 && p.head_group > 1 && p.cu_seqlens_q == nullptr &&
         p.seqused_q == nullptr && p.window_left < 0 &&
         (p.window_right < 0 || p.align_bottom_right) && p.alibi.ptr == nullptr &&
         p.mask.ptr == nullptr && !p.dropout.on();
}

// The group's heads as rows of one view; see above.
inline TensorView heads_as_rows(TensorView view, int group) {
  view.row_stride = view.head_stride;
  view.head_stride *= group;
  return view;
}

// p with each GQA group's query heads as the rows of one kv head, when can_pack_gqa_decode(p);
// else p as it is. Either computes the same outputs.
inline AttnParams pack_gqa_decode(const AttnParams& p) {
  if (!can_pack_gqa_decode(p)) return p;
  AttnParams packed = p;
  const int group = p.head_group;
  packed.q = heads_as_rows(p.q, group);
  packed.o = heads_as_rows(p.o, group);
  packed.lse = heads_as_rows(p.lse, group);
  packed.seqlen_q = group;
  packed.total_q = static_cast<int64_t>(p.batch) * group;
  packed.heads_q = p.heads_kv;
  packed.head_group = 1;
  packed.window_right = -1;  // bottom-right: it ends at the last key, which every row sees
  return packed;
}

}  // namespace flashattn::cuda
