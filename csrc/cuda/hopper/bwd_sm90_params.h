// The sm_90a backward's own arguments (issue 31, stage 5): a small struct, not AttnParams, until
// the architecture-aware plan wires the kernels into the dispatch. Tensors have AttnParams'
// layouts: Q, O, dO, dQ [B, Sq, Hq, D], K, V, dK, dV [B, Sk, Hkv, D], each seen through element
// strides with a contiguous last dimension; the forward's LSE [B, Hq, Sq] (fp32, natural log,
// -inf for a row that sees no key).
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

namespace flashattn::hopper {

// Where one [B, S, H, D] tensor lives (element strides), for the maps and the plain accesses.
using BwdSm90Tensor = BshdTensor;

struct BwdSm90Params {
  int batch = 0, seqlen_q = 0, seqlen_k = 0;
  int heads_q = 0, head_group = 1;  // query head h reads kv head h / head_group
  float scale = 0.f;                // the softmax scale
  float scale_log2 = 0.f;           // scale * log2(e)
  // Causal kernels: row i sees key j iff j <= i + (align_bottom_right ? Sk - Sq : 0).
  bool align_bottom_right = true;
  // Row stats [B, Hq, seqlen_q padded] (rows contiguous), written by the rows kernel.
  float* lse_log2 = nullptr;
  float* dpsum = nullptr;
  // The fp32 dQ accumulator (DqAccumLayout); deterministic: one slice per key block.
  float* dq_accum = nullptr;
  bool deterministic = false;
  // dK, dV [B, Sk, Hkv, D] (written from registers; rows past Sk are not written).
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
};

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

template <int kHeadDim>
DqAccumLayout<kHeadDim> bwd_sm90_dq_layout(const BwdSm90Params& p) {
  constexpr int kBlockN = BwdSm90Config<kHeadDim>::kBlockN;
  const int key_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  return DqAccumLayout<kHeadDim>(p.batch, p.heads_q, p.seqlen_q, p.deterministic ? key_blocks : 1);
}

// Row stats (2 x [B, Hq, Sq padded]) + the dQ accumulator. Deterministic dQ keeps one
// accumulator slice per key block: ceil(Sk / 128) times the memory.
template <int kHeadDim>
int64_t bwd_sm90_workspace_floats(const BwdSm90Params& p) {
  const DqAccumLayout<kHeadDim> dq = bwd_sm90_dq_layout<kHeadDim>(p);
  return 2 * static_cast<int64_t>(p.batch) * p.heads_q * dq.seqlen_q_padded + dq.floats();
}

template <int kHeadDim>
void bwd_sm90_bind_workspace(BwdSm90Params& p, float* workspace) {
  const DqAccumLayout<kHeadDim> dq = bwd_sm90_dq_layout<kHeadDim>(p);
  const int64_t stats = static_cast<int64_t>(p.batch) * p.heads_q * dq.seqlen_q_padded;
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

// The query blocks key block n_block visits: [begin, end). Causal: row i sees key j iff
// j <= i + diag_offset, so the first row that sees the block's first key is n0 - diag_offset.
// Empty when no row sees any key of the block (top-left alignment with Sk > Sq): its dK and dV
// are zero.
template <bool kCausal, int kBlockM, int kBlockN>
struct QueryBlocks {
  int begin, end;
  __host__ __device__ QueryBlocks(int n_block, int seqlen_q, int diag_offset) {
    end = (seqlen_q + kBlockM - 1) / kBlockM;
    begin = 0;
    if (kCausal) {
      const int first_row = n_block * kBlockN - diag_offset;
      begin = first_row <= 0 ? 0 : first_row / kBlockM;
      if (begin > end) begin = end;
    }
  }
  // Whether some (row, key) pair of (m_block, this key block) is masked: the ragged last key
  // block, or a query block crossing the causal diagonal.
  __host__ __device__ static bool needs_mask(int m_block, int n_block, int seqlen_k, int diag_offset) {
    const int n_last = n_block * kBlockN + kBlockN - 1;
    if (n_last >= seqlen_k) return true;
    return kCausal && m_block * kBlockM + diag_offset < n_last;
  }
};

}  // namespace flashattn::hopper
