// The sm_90a backward's own arguments (issue 31, stage 5): a small struct, not AttnParams (the
// kernels read a few of its fields and the row-stat workspace). Tensors are AttnParams' own
// TensorViews: Q, O, dO, dQ [B, Sq, Hq, D], K, V, dK, dV [B, Sk, Hkv, D], each seen through
// element strides with a contiguous last dimension; the forward's LSE [B, Hq, Sq] (fp32, natural
// log, -inf for a row that sees no key). A variable-length batch (cu_seqlens_q/_k) packs the
// sequences' rows, [total, H, D] with batch stride 0 and the LSE [Hq, total_q], as AttnParams.
//
// Three kernels run in order (bwd_sm90_launch.h):
//   1. rows (bwd_sm90_rows.cuh): LSE * log2(e) and D = rowsum(dO * O) into row-stat buffers
//      [B, Hq, Sq padded to kBlockM] (TMA's bulk copies need whole 16-byte-aligned blocks, so
//      padded rows hold +inf and 0: P = 0 there), and zeroes the fp32 dQ accumulator.
//   2. the main kernel (bwd_sm90_kernel.cuh): dK, dV, and dQ added into the accumulator.
//   3. convert (bwd_sm90_rows.cuh): dQ = scale * accumulator, rounded to the 16-bit type.
// Q, K, V and dO reach the main kernel as TMA tensor maps, 4D boxes of (64 columns, rows, 1
// head, 1 batch) with the 128-byte swizzle; their strides must be multiples of 8 elements.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/hopper/bwd_sm90_config.h"
#include "cuda/hopper/bshd_map.h"
#include "cuda/tensor_map.h"
#include "mask.h"  // clamped_range, used_length: a sequence's rows, as every executor
#include "params.h"

namespace flashattn::hopper {

// Where one [B, S, H, D] tensor lives (element strides), for the maps and the plain accesses.
using BwdSm90Tensor = BshdTensor;

struct BwdSm90Params {
  // Dense: B sequences of seqlen_q queries and seqlen_k keys. Varlen: seqlen_q / seqlen_k bound
  // the sequences' lengths (the grids cover them).
  int batch = 0, seqlen_q = 0, seqlen_k = 0;
  int heads_q = 0, head_group = 1;  // query head h reads kv head h / head_group
  // Varlen (AttnParams' cu_seqlens_*, int32 [B + 1], both or neither): sequence b is rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed Q, O, dO, dQ, LSE (total_q rows) and
  // [cu_seqlens_k[b], ...) of K, V, dK, dV (total_k rows); the maps span the packed rows as one
  // batch. seqused_q / seqused_k (int32 [B], dense or varlen): only the first seqused[b] queries
  // / keys of sequence b take part. Null: all of them.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;
  const int* seqused_q = nullptr;
  const int* seqused_k = nullptr;
  float scale = 0.f;                // the softmax scale
  float scale_log2 = 0.f;           // scale * log2(e)
  // Causal kernels: row i sees key j iff j <= i + (align_bottom_right ? Sk - Sq : 0).
  bool align_bottom_right = true;
  // The kLocal kernels: row i sees key j iff (window_left < 0 || j >= i + diag_offset -
  // window_left) && (window_right < 0 || j <= i + diag_offset + window_right), diag_offset as
  // for causal (AttnParams' window). Every other kernel takes -1, -1 (launch_bwd_sm90 checks).
  int window_left = -1, window_right = -1;
  // The kAlibi kernels: the logit is scale * s - slope * |i + diag_offset - j| (mask.h
  // alibi_bias, diag_offset as for causal), slope alibi_slopes[b * alibi_batch_stride + h *
  // alibi_head_stride] (fp32; batch stride 0 for [Hq] slopes; b the sequence, h the query head).
  // The bias is additive, so it changes the recomputed P only: dS's chain factor stays scale.
  // Every other kernel takes nullptr (launch_bwd_sm90 checks).
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0, alibi_head_stride = 1;
  // The kSoftcap kernels: the logit is softcap * tanh(scale * s / softcap) (logit.cuh's
  // LogitRules), so dS picks up 1 - tanh^2; scale stays dK's and dQ's. set_bwd_sm90_softcap
  // writes the four; every other kernel takes softcap 0 (launch_bwd_sm90 checks).
  float softcap = 0.f;
  float scale_over_softcap = 0.f;  // scale / softcap
  float softcap_log2 = 0.f;        // softcap * log2(e): exp2's factor on tanh
  float inv_softcap_log2 = 0.f;    // its inverse: tanh recovered from log2 of P
  // Row stats [B, Hq, seqlen_q padded] (rows contiguous), written by the rows kernel.
  float* lse_log2 = nullptr;
  float* dpsum = nullptr;
  // The fp32 dQ accumulator (DqAccumLayout); deterministic: one slice per key block.
  float* dq_accum = nullptr;
  bool deterministic = false;
  // dK, dV [B, Sk, Hkv, D] (written from registers; rows past a sequence's keys are not written).
  TensorView dk, dv;
  // (Last, so that the fields above keep their offsets: the other kernels' code is unchanged.)
  // The kAttnMask kernels: attn_mask (AttnParams' view, score_bias.h mask_bias) added to the
  // logit scale * s before the recomputed P, as the forward added it. Additive, so dS's chain
  // factor stays scale; its gradient (AttnBwdParams::dmask) is not computed here (the plan keeps
  // such calls on sm_80). Every other kernel takes a null mask (launch_bwd_sm90 checks).
  AttnMask attn_mask;
  // The kDropout kernels: the forward's dropout (AttnParams' view: the [seed, offset] on the
  // device, the threshold and 1 / (1 - p)), its keep mask recomputed at the sequence's
  // (b, h, row, key).
  Dropout dropout;

  __host__ __device__ bool varlen() const { return cu_seqlens_q != nullptr; }
};

// Softcap's fields of p from softcap (> 0: the kSoftcap kernels; 0: none) and p.scale.
inline void set_bwd_sm90_softcap(BwdSm90Params& p, float softcap) {
  p.softcap = softcap;
  p.scale_over_softcap = softcap > 0.f ? p.scale / softcap : 0.f;
  p.softcap_log2 = softcap > 0.f ? softcap * 1.4426950408889634f : 0.f;
  p.inv_softcap_log2 = softcap > 0.f ? 1.f / p.softcap_log2 : 0.f;
}

// Where sequence b's rows are: in the tensors (packed rows of a varlen batch), in the maps, and in
// the row-stat buffers and the dQ accumulator, which hold each sequence's queries padded to whole
// kBlockM blocks. Dense: batch b, row 0 of each. Varlen: batch 0; sequence b's rows start at
// stat_row0 = floor((q_row0 + b kBlockM) / kBlockM) kBlockM (FA3's padded varlen offsets), past
// sequence b - 1's padded rows (those end at most at q_row0 + b kBlockM), so bwd_sm90_dq_layout
// needs total_q + B kBlockM rows.
struct BwdSm90Seq {
  int64_t q_row0 = 0, k_row0 = 0;  // the sequence's first row of Q, O, dO, dQ, LSE / K, V, dK, dV
  int64_t stat_row0 = 0;           // its first row in the row stats and the accumulator
  int map_batch = 0;               // its batch in the maps, the row stats and the accumulator
  int seqlen_q = 0, seqlen_k = 0;  // the queries and keys that take part (mask.h's rules)
};

template <int kBlockM>
__host__ __device__ BwdSm90Seq bwd_sm90_seq(const BwdSm90Params& p, int b) {
  BwdSm90Seq s;
  int length_q = p.seqlen_q, length_k = p.seqlen_k;
  if (p.varlen()) {
    clamped_range(p.cu_seqlens_q, b, p.total_q, p.seqlen_q, s.q_row0, length_q);
    clamped_range(p.cu_seqlens_k, b, p.total_k, p.seqlen_k, s.k_row0, length_k);
    s.stat_row0 = (s.q_row0 + static_cast<int64_t>(b) * kBlockM) / kBlockM * kBlockM;
  } else {
    s.map_batch = b;
  }
  s.seqlen_q = used_length(p.seqused_q, b, length_q);
  s.seqlen_k = used_length(p.seqused_k, b, length_k);
  return s;
}

struct BwdSm90Maps {
  TensorMap q, k, v, dout;
};

// Q and dO in boxes of kBlockM rows, K and V of kBlockN.
template <int kHeadDim>
std::string make_bwd_sm90_maps(BwdSm90Maps& maps, TensorMapDtype dtype, int batch, const BwdSm90Tensor& q,
                               const BwdSm90Tensor& k, const BwdSm90Tensor& v, const BwdSm90Tensor& dout) {
  using Cfg = BwdSm90Config<kHeadDim>;
  const struct {
    TensorMap* map;
    const BwdSm90Tensor* t;
    int rows;
    const char* name;
  } all[4] = {{&maps.q, &q, Cfg::kBlockM, "Q"}, {&maps.k, &k, Cfg::kBlockN, "K"},
              {&maps.v, &v, Cfg::kBlockN, "V"}, {&maps.dout, &dout, Cfg::kBlockM, "dO"}};
  for (const auto& m : all) {
    const std::string error = encode_bshd_map(m.map, dtype, kHeadDim, batch, *m.t, m.rows);
    if (!error.empty()) return std::string(m.name) + ": " + error;
  }
  return "";
}

// The row kernels (bwd_sm90_rows.cuh) run one thread per query row, in blocks of this many.
constexpr int kRowThreads = 128;

// Dense: [B, Hq, Sq padded] rows; varlen: [1, Hq, total_q + B kBlockM padded] (bwd_sm90_seq).
template <int kHeadDim>
DqAccumLayout<kHeadDim> bwd_sm90_dq_layout(const BwdSm90Params& p) {
  using Cfg = BwdSm90Config<kHeadDim>;
  const int key_blocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int slices = p.deterministic ? key_blocks : 1;
  if (p.varlen()) {
    const int64_t rows = p.total_q + static_cast<int64_t>(p.batch) * Cfg::kBlockM;
    return DqAccumLayout<kHeadDim>(1, p.heads_q, static_cast<int>(rows), slices);
  }
  return DqAccumLayout<kHeadDim>(p.batch, p.heads_q, p.seqlen_q, slices);
}

// Row stats (2 x [B, Hq, Sq padded]) + the dQ accumulator. Deterministic dQ keeps one
// accumulator slice per key block: ceil(Sk / 128) times the memory.
template <int kHeadDim>
int64_t bwd_sm90_workspace_floats(const BwdSm90Params& p) {
  const DqAccumLayout<kHeadDim> dq = bwd_sm90_dq_layout<kHeadDim>(p);
  return 2 * dq.stat_floats() + dq.floats();
}

template <int kHeadDim>
void bwd_sm90_bind_workspace(BwdSm90Params& p, float* workspace) {
  const DqAccumLayout<kHeadDim> dq = bwd_sm90_dq_layout<kHeadDim>(p);
  const int64_t stats = dq.stat_floats();
  p.lse_log2 = workspace;
  p.dpsum = workspace + stats;
  p.dq_accum = workspace + 2 * stats;  // stats is a multiple of kBlockM floats: 16-byte aligned
}

// The three kernels' grids (x, y, z), written once for the launch (bwd_sm90_launch.h) and the
// library's plan (plan_bwd_sm90.h): the rows kernel over the padded query rows, the main kernel
// per (key block, kv head, batch), the convert kernel over the query rows. Blocks: kRowThreads,
// BwdSm90Config::kThreads, kRowThreads.
struct BwdSm90Grid {
  unsigned x, y, z;
};
struct BwdSm90Grids {
  BwdSm90Grid rows, main, convert;
};

template <int kHeadDim>
BwdSm90Grids bwd_sm90_grids(const BwdSm90Params& p) {
  const int padded = DqAccumLayout<kHeadDim>::padded(p.seqlen_q);
  const auto blocks = [](int64_t n, int64_t per) {
    return static_cast<unsigned>((n + per - 1) / per);
  };
  const unsigned heads = static_cast<unsigned>(p.heads_q), batch = static_cast<unsigned>(p.batch);
  const unsigned heads_kv = static_cast<unsigned>(p.heads_q / p.head_group);
  return {{blocks(padded, kRowThreads), heads, batch},
          {blocks(p.seqlen_k, BwdSm90Config<kHeadDim>::kBlockN), heads_kv, batch},
          {blocks(p.seqlen_q, kRowThreads), heads, batch}};
}

// The query blocks key block n_block visits, [begin, end), and which of them need the mask. Row
// i sees key j iff j <= i + offset + right (right >= 0: causal is right = 0) and j >= i + offset -
// left (left >= 0, local windows only), j < Sk, offset = causal_diag_offset (fwd_sm90_mask.cuh's
// KeyWindow, whose key_window<kCausal, kLocal> gives the three). So the rows that see some key of
// [n0, n_last] are [n0 - offset - right, n_last - offset + left]: the query blocks outside them
// are skipped (their dK, dV terms and dQ parts are zero); empty when no row sees the block
// (top-left causal with Sk > Sq, a window past the queries). Host and device (the plan's tests
// count the visits: hopper_bwd_test query_blocks).
template <bool kCausal, bool kLocal, int kBlockM, int kBlockN>
struct QueryBlocks {
  int begin, end;
  int n0, n_last_real, seqlen_q, seqlen_k, offset, left, right;

  __host__ __device__ QueryBlocks(int n_block, int seqlen_q_, int seqlen_k_, int offset_, int left_, int right_)
      : seqlen_q(seqlen_q_), seqlen_k(seqlen_k_), offset(offset_), left(kLocal ? left_ : -1),
        right(kCausal || kLocal ? right_ : -1) {
    n0 = n_block * kBlockN;
    n_last_real = (n0 + kBlockN < seqlen_k ? n0 + kBlockN : seqlen_k) - 1;  // the block's last key
    end = (seqlen_q + kBlockM - 1) / kBlockM;
    begin = 0;
    if (right >= 0) {
      // A first row past the queries (a right edge ending before this block) leaves none.
      const int first_row = n0 - offset - right;
      begin = first_row <= 0 ? 0 : (first_row < seqlen_q ? first_row / kBlockM : end);
    }
    if (left >= 0) {
      // Windows are clipped to Sq + Sk (attn_args.cpp clip_window): no int overflow here.
      const int last_row = n_last_real - offset + left;
      const int last_end = last_row < 0 ? 0 : last_row / kBlockM + 1;
      if (last_end < end) end = last_end;
    }
    if (begin > end) begin = end;
  }
  // Whether some (row, key) pair of (m_block, this key block) is masked: the ragged last key
  // block, a query block crossing the right edge (the causal diagonal) or the window's left edge.
  __host__ __device__ bool needs_mask(int m_block) const {
    if (n0 + kBlockN > seqlen_k) return true;
    const int m0 = m_block * kBlockM;
    const int row_last = (m0 + kBlockM < seqlen_q ? m0 + kBlockM : seqlen_q) - 1;
    if (right >= 0 && n0 + kBlockN - 1 > m0 + offset + right) return true;  // key > row + offset + right
    return left >= 0 && n0 < row_last + offset - left;                    // key < row + offset - left
  }
};

}  // namespace flashattn::hopper
