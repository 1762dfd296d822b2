// End-to-end kernel for the shim's self-tests, written like an FA2 inner loop:
//   S = A * Bt^T   (Q K^T: cp.async -> ldmatrix -> mma, two k-steps through one reused buffer)
//   row_max = max over each row of S   (quad shuffle reduction, as in online softmax)
//   D = f16(S) * W (P V: S's accumulators reused as the A operand, W through ldmatrix .trans)
// Two warps own 16 rows each. Each PlantedBug breaks one thing the shim must catch.
#pragma once
#include <cuda_fp16.h>

#include "cuda/ptx.cuh"

namespace tile_gemm {

constexpr int kRows = 32;      // rows of A, S, D (2 warps x 16)
constexpr int kCols = 16;      // columns of S (rows of Bt) and of D
constexpr int kDepth = 32;     // k of the first product: 2 steps of 16
constexpr int kStep = 16;
constexpr int kThreads = 64;
constexpr int kChunk = 8;      // halves per 16-byte cp.async

enum class PlantedBug {
  None,
  MissingSyncBeforeReuse,  // sB is refilled while the other warp may still read it
  MissingSyncBeforeStore,  // sC/sD read back before every warp wrote its part
  MissingWait,             // k-step 0 reads smem before its cp.async group landed
  WrongShuffleXor,         // row max reduces over xor 4 instead of xor 2: mixes rows
  MissingTrans,            // W loaded without .trans
  TailOverread,            // rows past valid_rows read with src_bytes 16 instead of 0
};

struct Smem {
  __half a[kRows * kDepth];
  __half b[kCols * kStep];
  __half w[kCols * kCols];
  float c[kRows * kCols];
  float d[kRows * kCols];
};
constexpr size_t kSmemBytes = sizeof(Smem);

inline uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// A [valid_rows, 32], Bt [16, 32], W [16, 16]: f16 row-major. C, D [valid_rows, 16] and
// row_max [valid_rows]: f32.
template <PlantedBug kBug>
__global__ void __launch_bounds__(kThreads)
    tile_gemm_kernel(const __half* A, const __half* Bt, const __half* W, float* C, float* D,
                     float* row_max, int valid_rows) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem_raw);
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  using namespace flashattn::ptx;

  for (int c = tid; c < kRows * kDepth / kChunk; c += kThreads) {
    const int row = c / (kDepth / kChunk), col = c % (kDepth / kChunk) * kChunk;
    const bool valid = row < valid_rows;
    const int bytes = (valid || kBug == PlantedBug::TailOverread) ? 16 : 0;
    cp_async_16(&s.a[row * kDepth + col], A + row * kDepth + col, bytes);
  }
  for (int c = tid; c < kCols * kCols / kChunk; c += kThreads) {
    const int row = c / (kCols / kChunk), col = c % (kCols / kChunk) * kChunk;
    cp_async_16(&s.w[row * kCols + col], W + row * kCols + col, 16);
  }
  cp_async_commit();

  float acc_s[2][4] = {};  // two n-tiles of 8 columns
  for (int step = 0; step < kDepth / kStep; ++step) {
    for (int c = tid; c < kCols * kStep / kChunk; c += kThreads) {
      const int row = c / (kStep / kChunk), col = c % (kStep / kChunk) * kChunk;
      cp_async_16(&s.b[row * kStep + col], Bt + row * kDepth + step * kStep + col, 16);
    }
    cp_async_commit();
    if (kBug != PlantedBug::MissingWait || step > 0) cp_async_wait<0>();
    __syncthreads();

    uint32_t a[4];
    ldmatrix_x4(a[0], a[1], a[2], a[3],
                &s.a[(warp * 16 + lane % 16) * kDepth + step * kStep + lane / 16 * 8]);
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t b[2];
      ldmatrix_x2(b[0], b[1], &s.b[(nt * 8 + lane % 8) * kStep + (lane / 8 % 2) * 8]);
      mma_m16n8k16_f16(acc_s[nt], a, b);
    }
    if (kBug != PlantedBug::MissingSyncBeforeReuse) __syncthreads();
  }

  // Lane holds rows g and g + 8 of its warp's 16, four columns each; the quad shares a row.
  const int g = lane / 4;
  float max_lo = fmaxf(fmaxf(acc_s[0][0], acc_s[0][1]), fmaxf(acc_s[1][0], acc_s[1][1]));
  float max_hi = fmaxf(fmaxf(acc_s[0][2], acc_s[0][3]), fmaxf(acc_s[1][2], acc_s[1][3]));
  const int second_xor = kBug == PlantedBug::WrongShuffleXor ? 4 : 2;
  for (int offset : {1, second_xor}) {
    max_lo = fmaxf(max_lo, __shfl_xor_sync(0xffffffffu, max_lo, offset));
    max_hi = fmaxf(max_hi, __shfl_xor_sync(0xffffffffu, max_hi, offset));
  }
  const int row_lo = warp * 16 + g, row_hi = row_lo + 8;
  if (lane % 4 == 0) {
    if (row_lo < valid_rows) row_max[row_lo] = max_lo;
    if (row_hi < valid_rows) row_max[row_hi] = max_hi;
  }

  // S's accumulator layout for two n-tiles is exactly the A-operand layout for k = 16.
  const uint32_t p[4] = {pack_half2(acc_s[0][0], acc_s[0][1]), pack_half2(acc_s[0][2], acc_s[0][3]),
                         pack_half2(acc_s[1][0], acc_s[1][1]), pack_half2(acc_s[1][2], acc_s[1][3])};
  uint32_t w[4];
  const __half* w_row = &s.w[(lane % 16) * kCols + lane / 16 * 8];
  if (kBug == PlantedBug::MissingTrans) {
    ldmatrix_x4(w[0], w[1], w[2], w[3], w_row);
  } else {
    ldmatrix_x4_trans(w[0], w[1], w[2], w[3], w_row);
  }
  float acc_d[2][4] = {};
  for (int nt = 0; nt < 2; ++nt) {
    const uint32_t b[2] = {w[2 * nt], w[2 * nt + 1]};
    mma_m16n8k16_f16(acc_d[nt], p, b);
  }

  for (int nt = 0; nt < 2; ++nt) {
    for (int i = 0; i < 4; ++i) {
      const int row = warp * 16 + g + 8 * (i / 2), col = nt * 8 + 2 * (lane % 4) + i % 2;
      s.c[row * kCols + col] = acc_s[nt][i];
      s.d[row * kCols + col] = acc_d[nt][i];
    }
  }
  if (kBug != PlantedBug::MissingSyncBeforeStore) __syncthreads();
  for (int e = tid; e < kRows * kCols; e += kThreads) {
    if (e / kCols < valid_rows) {
      C[e] = s.c[e];
      D[e] = s.d[e];
    }
  }
}

}  // namespace tile_gemm
