// The score pipeline (csrc/score_rules.h: its steps, scale -> softcap -> ALiBi -> attn_mask ->
// visibility -> dropout, and their per-entry rules) in the form of every CUDA kernel (sm_80
// tensor-core and SIMT, forward and backward): how a raw score s = q_i . k_j becomes what the
// softmax takes, and the factor the backward's chain rule applies to dS.
// A new mask rule is a step here (and, if it hides keys, a range in mask_range.cuh).
// The accumulator-fragment forms (apply) walk a lane's entries through AccFragment; the SIMT
// kernels call the one-entry forms.
#pragma once
#include <cstdint>

#include "../params.h"
#include "../score_rules.h"
#include "acc_fragment.cuh"
#include "dropout_bits.cuh"
#include "logit.cuh"
#include "ptx.cuh"

namespace flashattn::cuda {

// What one key tile of one query tile needs beyond steps 1-3: attn_mask's class of the tile
// (mask.h mask_tile: kMaskRead reads it per entry) and whether any entry may be hidden (step 5).
struct ScoreTile {
  uint8_t mask_class;
  bool needs_mask;
};

// The backward's recomputation of one entry: P_ij, dL/dlogit_ij = P (dP Z / (1 - p) - D_i)
// (what the dmask output holds) and d logit / d s (the chain rule's last factor).
struct ScoreGrad {
  float prob;
  float dlogit;
  float dlogit_ds;
};

// Plain attention keeps raw scores in the forward's accumulator and folds log2(e) * scale into
// the exp2 FMA (FA2's trick); softcap, ALiBi, attn_mask or a non-positive scale first turn the
// accumulator into natural-log logits, since max() does not commute with those.
struct ScoreRules {
  bool keep_raw;      // steps 1-4 are the identity up to to_log2
  float scale;        // softmax scale
  float softcap;      // > 0: logit = softcap * tanh(scale * s / softcap)
  float scale_over_cap;
  float alibi_slope;  // 0 without ALiBi
  float to_log2;      // accumulator units -> log2 units
  int batch, head;    // of attn_mask and of the dropout draws
  // A copy, not a pointer: through a pointer to the kernel's Sequence, its fields were reloaded
  // after each mma (the inline asm's memory clobber) and the d = 128 forward spilled.
  Sequence seq;
  const AttnMask* mask;
  const Dropout* dropout;

  // The rules of (batch, head) of seq. p outlives the rules (a kernel parameter).
  __device__ __forceinline__ static ScoreRules make(const AttnParams& p, const Sequence& seq,
                                                    int batch, int head) {
    ScoreRules r;
    r.alibi_slope = ::flashattn::alibi_slope(p, batch, head);
    r.keep_raw =
        p.softcap <= 0.f && p.alibi.ptr == nullptr && p.mask.ptr == nullptr && p.scale > 0.f;
    r.scale = p.scale;
    r.softcap = p.softcap;
    r.scale_over_cap = p.softcap > 0.f ? p.scale / p.softcap : 0.f;
    r.to_log2 = r.keep_raw ? p.scale * kLog2e : kLog2e;
    r.batch = batch;
    r.head = head;
    r.seq = seq;
    r.mask = &p.mask;
    r.dropout = &p.dropout;
    return r;
  }

  // ---- steps 1-3: the logit ----

  // Raw score -> natural-log logit (only called when !keep_raw).
  __device__ __forceinline__ float logit(float s, int row, int key) const {
    const float x = softcap > 0.f ? softcap * tanh_accurate(s * scale_over_cap) : s * scale;
    return x + alibi_bias(alibi_slope, seq.diag_offset, row, key);
  }

  // Like logit(), and also d logit / d s.
  __device__ __forceinline__ float logit(float s, int row, int key, float& dlogit_ds) const {
    if (softcap > 0.f) {
      const float t = tanh_accurate(s * scale_over_cap);
      dlogit_ds = scale * (1.f - t * t);
      return softcap * t + alibi_bias(alibi_slope, seq.diag_offset, row, key);
    }
    dlogit_ds = scale;
    return s * scale + alibi_bias(alibi_slope, seq.diag_offset, row, key);
  }

  // The logit in log2 units, and d logit / d s (natural units).
  __device__ __forceinline__ float log2_logit(float s, int row, int key, float& dlogit_ds) const {
    if (keep_raw) {
      dlogit_ds = scale;
      return s * to_log2;
    }
    return logit(s, row, key, dlogit_ds) * kLog2e;
  }

  // ---- step 4: attn_mask ----

  // Whether (row, key) lies in the sequence: attn_mask is read only there.
  __device__ __forceinline__ bool in_sequence(int row, int key) const {
    return row < seq.seqlen_q && key < seq.seqlen_k;
  }
  __device__ __forceinline__ bool reads_mask(const ScoreTile& tile, int row, int key) const {
    return tile.mask_class == kMaskRead && in_sequence(row, key);
  }
  __device__ __forceinline__ float mask_bias_at(int row, int key) const {
    return mask_bias(*mask, batch, head, row, key);
  }

  // ---- step 5: visibility ----

  // Whether row (a query token) sees key: the key lies in its window and in the sequence. Tiles
  // that need no mask skip the test. Rows past the sequence are left to the caller: the
  // forward never stores them, and the extra test per entry cost the d = 128 forward spills.
  __device__ __forceinline__ bool sees(const ScoreTile& tile, int row, int key) const {
    return !tile.needs_mask || key_visible(seq, row, key);
  }
  // Whether row sees key and is one of the sequence's rows: what a sum over rows (dK, dV)
  // needs, and what the backward takes everywhere.
  __device__ __forceinline__ bool visible(const ScoreTile& tile, int row, int key) const {
    return !tile.needs_mask || (row < seq.seqlen_q && key_visible(seq, row, key));
  }

  // ---- step 6: dropout ----

  __device__ __forceinline__ bool dropout_on() const { return dropout->on(); }
  // The keep bits of an accumulator tile whose rows are queries (dropout_bits.cuh).
  template <int kNTiles>
  __device__ __forceinline__ uint32_t keep_bits_by_query_rows(const int (&rows)[2], int n_start,
                                                              int lane_col) const {
    return ::flashattn::cuda::keep_bits_by_query_rows<kNTiles>(*dropout, seq, head, rows,
                                                               n_start, lane_col);
  }
  // ... whose rows are keys (dK/dV's transposed tile).
  template <int kNTiles>
  __device__ __forceinline__ uint32_t keep_bits_by_key_rows(const int (&keys)[2], int m_start,
                                                            int lane_col) const {
    return ::flashattn::cuda::keep_bits_by_key_rows<kNTiles>(*dropout, seq, head, keys, m_start,
                                                             lane_col);
  }
  // What entry `bit` of a tile's keep bits multiplies its probability by: 1 / (1 - p) or 0,
  // 1 without dropout.
  __device__ __forceinline__ float kept(uint32_t bits, int bit) const {
    return dropout->on() ? kept_factor(*dropout, bits, bit) : 1.f;
  }
  // The same for one entry, drawn on the spot (the SIMT kernels).
  __device__ __forceinline__ float kept(const DropoutSeed& seed, int row, int key) const {
    return dropout_factor_of(*dropout, seed, seq, head, row, key);
  }

  // ---- the pipeline ----

  // The forward's steps 1-5 for one entry, in place: accumulator units (to_log2 takes them to log2), -inf
  // where hidden. token_of(row) is the row's query token (rows of packed GQA heads share one),
  // called only where the tile needs the mask: eager, its division per entry made the d = 128
  // forward spill. The row is a position for ALiBi and attn_mask alone, which never come with
  // packed heads.
  template <typename TokenOf>
  __device__ __forceinline__ void forward(float& x, int row, int key, const ScoreTile& tile,
                                          const TokenOf& token_of) const {
    if (!keep_raw) {
      x = logit(x, row, key);
      if (reads_mask(tile, row, key)) x += mask_bias_at(row, key);
    }
    if (tile.needs_mask && !key_visible(seq, token_of(row), key)) x = -INFINITY;
  }

  // The forward's steps 1-5 over m-tile m of S_ij, in place.
  template <int kNTiles, typename TokenOf>
  __device__ __forceinline__ void apply(const AccFragment& frag, int m, float (&s_m)[kNTiles][4],
                                        const ScoreTile& tile, const TokenOf& token_of) const {
    frag.for_each(m, s_m,
                  [&](int row, int key, float& x, int) { forward(x, row, key, tile, token_of); });
  }

  // Step 6 of the forward over m-tile m of P_ij, after the softmax's row sums took the whole P.
  template <int kNTiles>
  __device__ __forceinline__ void drop(const AccFragment& frag, int m, float (&p_m)[kNTiles][4],
                                       uint32_t keep_bits) const {
    frag.for_each(m, p_m, [&](int, int, float& x, int bit) {
      x *= kept_factor(*dropout, keep_bits, bit);
    });
  }

  // The SIMT forward's steps 1-5 for one entry, in log2 units, -inf where hidden.
  __device__ __forceinline__ float forward_log2(float s, int row, int token, int key,
                                                const ScoreTile& tile) const {
    float dlogit_ds;  // unused: the compiler drops it
    float x = log2_logit(s, token, key, dlogit_ds);
    if (reads_mask(tile, row, key)) x += mask_bias_at(row, key) * kLog2e;
    return sees(tile, token, key) ? x : -INFINITY;
  }

  // The backward's steps 1-6 for one entry, given dP_ij, this row's LSE (lse_shift_log2) and
  // D_i, and dropout's factor. kApproxExp2: ex2.approx (the tensor-core kernels), else exp2f.
  // kSumsRows: the kernel sums over rows (dK, dV), so rows past the sequence must be hidden
  // too; dQ's such rows are never stored, and the test cost its main loop 90 instructions.
  template <bool kApproxExp2, bool kSumsRows>
  __device__ __forceinline__ ScoreGrad backward(float s, float dp, int row, int key,
                                                const ScoreTile& tile, float lse_log2,
                                                float dsum, float kept_factor) const {
    ScoreGrad g;
    float x = log2_logit(s, row, key, g.dlogit_ds);
    if (reads_mask(tile, row, key)) x += mask_bias_at(row, key) * kLog2e;
    const float shifted = x - lse_log2;
    const bool shown = kSumsRows ? visible(tile, row, key) : sees(tile, row, key);
    g.prob = shown ? (kApproxExp2 ? ptx::exp2_approx(shifted) : exp2f(shifted)) : 0.f;
    g.dlogit = g.prob * (dp * kept_factor - dsum);
    return g;
  }
};

}  // namespace flashattn::cuda
