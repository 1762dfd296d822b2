// Decoding with GQA on the GPU: the query heads of one kv head become the query rows of one
// tile, so each K/V byte is read once per kv head, not once per query head.
//
// A decoding step has a few query tokens per sequence (1, or a handful when drafts are
// verified). Run as it comes, every query head is its own CTA, reading its kv head's whole cache
// for a tile of a few live rows: with g query heads per kv head the cache crosses from memory g
// times (4 for Llama-3-8B's 32 / 8 heads), and decoding is bound by exactly those bytes. FA2
// folds the group into the rows for one token (seqlenq_ngroups_swapped); here several tokens
// are folded, over one or more tiles (below), with no copy: the forward's CTAs for kv head h
// take row r as query token r / g of query head h * g + r % g (QueryRows below; params.h,
// packed_heads). The rows' positions, and so causal and sliding windows, follow their tokens.
//
// It applies where the rows of one tile differ only in their head and position:
//   - a dense batch of queries (no cu_seqlens_q, no seqused_q: their counts are of tokens);
//   - where the packed rows' tiles read the cache fewer times than the query heads would
//     unpacked: the packed rows (tokens x g, token-major) fill tiles of
//     FwdTraits<*, true>::kBlockM = 64 rows, in the one-m-tile kernel (plan_fwd.h,
//     fwd_one_m_tile, the only 16-bit kernel that maps rows), each reading its kv head's cache
//     once; unpacked, each of the g query heads reads it once (its up to 64 or 128 tokens in
//     one tile). So ceil(tokens x g / 64) < g: one tile up to 64 rows, and beyond it
//     speculative decoding's drafts, e.g. 16 tokens x 8 heads in 2 tiles against 8 (issue 33),
//     up to 56 tokens at g = 8, 32 at g = 2. A tile's rows then span several tokens, whose
//     positions the kernel masks by (QueryRows below);
//   - no ALiBi (a slope per query head, while LogitRules keeps one per CTA), no attn_mask
//     (indexed by query head), no dropout (its random stream is keyed by query head and row).
// Softcap, windows, KV caches (paged, cache_batch_idx, leftpad) and split-KV go through. The
// split heuristic then sees B x heads_kv CTAs and splits for them; the splits' merge runs on the
// unpacked parameters (the scratch holds the same rows either way, mask.h split_out_row).
// The CPU executor needs none of this: its planner puts a GQA group into one tile itself
// (cpu/fwd.cpp, plan_forward).
#pragma once
#include "../params.h"
#include "traits.h"

namespace flashattn::cuda {

// Rows of the one-m-tile 16-bit forward kernel's tile (the same at every head dim), which
// packed GQA rows fill.
constexpr int kPackedTileRows = FwdTraits<kMaxHeadDim, true>::kBlockM;

// The tiles p's rows take packed: ceil(seqlen_q x head_group / kPackedTileRows).
inline int64_t packed_row_tiles(const AttnParams& p) {
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * p.head_group;
  return (rows + kPackedTileRows - 1) / kPackedTileRows;
}

inline bool can_pack_gqa_decode(const AttnParams& p) {
  return p.head_group > 1 && p.seqlen_q >= 1 && packed_row_tiles(p) < p.head_group &&
         p.cu_seqlens_q == nullptr && p.seqused_q == nullptr && p.alibi.ptr == nullptr &&
         p.mask.ptr == nullptr && !p.dropout.on();
}

// p with each GQA group's query heads as the rows of one kv head's tile, when
// can_pack_gqa_decode(p); else p as it is. Either computes the same outputs.
inline AttnParams pack_gqa_decode(const AttnParams& p) {
  if (!can_pack_gqa_decode(p)) return p;
  AttnParams packed = p;
  packed.packed_heads = p.head_group;
  packed.seqlen_q = p.seqlen_q * p.head_group;
  packed.total_q = static_cast<int64_t>(p.batch) * packed.seqlen_q;
  packed.heads_q = p.heads_kv;
  packed.head_group = 1;
  return packed;
}

// Row r of a forward CTA's tile of (batch, head): query token r of query head `head`, or with
// packed heads (packed > 1, `head` a kv head) token r / packed of query head
// head * packed + r % packed. A kernel that never sees packed heads builds it with packed = 1
// known at compile time, and every mapping folds away.
// Where a row's query is: its query head and its token in the sequence.
struct QueryPlace {
  int q_head;
  int token;
};

struct QueryRows {
  int packed;
  int head;

  FLASHATTN_HOST_DEVICE QueryPlace at(int row) const { return {q_head(row), token(row)}; }

  FLASHATTN_HOST_DEVICE int token(int row) const { return packed == 1 ? row : row / packed; }
  FLASHATTN_HOST_DEVICE int q_head(int row) const {
    return packed == 1 ? head : head * packed + row % packed;
  }
};

}  // namespace flashattn::cuda
