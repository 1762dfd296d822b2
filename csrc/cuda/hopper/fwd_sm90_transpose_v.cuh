// The FP8 forward's V^T: e4m3 wgmma reads B K-major only, so P V needs V^T (head dims x keys,
// keys contiguous) in shared memory, and TMA brings V as keys x head dims. The producer
// warpgroup transposes each V tile after its TMA load (fwd_sm90_kernel.cuh), through registers:
// 4 keys x 4 head dims per unit, four 32-bit loads, a byte transpose, four 32-bit stores, the
// units laid on the lanes so that neither the loads nor the stores conflict on banks.
//
// The transpose also permutes the keys of each 32-key MMA step so that P's accumulator
// registers, converted pairwise by cvt_e4m3x2_f32, are the 8-bit A fragment as they stand
// (convert_p_e4m3): thread (g, q) holds P's keys 2q, 2q + 1, 2q + 8, 2q + 9 (+ 16) of a step,
// which the A fragment reads as keys 4q .. 4q + 3 (+ 16). The sum over keys does not care
// about their order as long as P and V^T agree on it (the layout case
// e4m3_p_fragment_times_key_permuted_vt_m64n64k32 in tests/cudasim/selftest/sm90_fp8_cases.h).
#pragma once
#include <cstdint>

#include "cuda/ptx.cuh"
#include "host_device.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn::hopper {

// The key of V that column `col` of V^T holds: within each 32-key step, column 4q + e (and
// 16 + 4q + e) holds key 2q + e % 2 + 8 (e / 2) (and 16 + that).
FLASHATTN_HOST_DEVICE constexpr int vt_column_key(int col) {
  const int step = col / 32, half = (col % 32) / 16, q = (col % 16) / 4, e = col % 4;
  return 32 * step + 16 * half + 2 * q + e % 2 + 8 * (e / 2);
}

// Byte offset of byte `col` of row `row` in a tile of 128-byte rows with the 128-byte swizzle
// (the 16-byte chunk index xor the row's index within its 8-row atom).
FLASHATTN_HOST_DEVICE constexpr uint32_t swizzled_byte(int row, int col) {
  return static_cast<uint32_t>(row * 128 + (((col / 16) ^ (row % 8)) * 16) + col % 16);
}

// Byte i of each of w0..w3, as one word (w0's byte lowest).
__device__ __forceinline__ uint32_t byte_column(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int i) {
  const int shift = 8 * i;
  return ((w0 >> shift) & 0xffu) | ((w1 >> shift) & 0xffu) << 8 | ((w2 >> shift) & 0xffu) << 16 |
         ((w3 >> shift) & 0xffu) << 24;
}

// vt := the key-permuted transpose of v, both [128 rows x 128 bytes] 128-byte swizzled tiles
// (v: kBlockN keys x kHeadDim e4m3; vt: kHeadDim rows x kBlockN keys). Keys from key_limit on
// are written as zeros (a tail tile's rows past seqused_k hold whatever memory holds there,
// and P = 0 times NaN is NaN). t: this thread's index in the producer warpgroup. The caller
// fences (fence.proxy.async) and arrives once every thread's stores are done.
template <int kBlockN, int kHeadDim>
__device__ __forceinline__ void transpose_v_tile(const unsigned char* v, unsigned char* vt, int key_limit, int t) {
  static_assert(kBlockN == 128 && kHeadDim == 128, "one 128-byte swizzle row per key and per head dim");
  // Units of 4 keys x 4 head dims (a V^T word of 4 columns, from 4 V words of 4 dims): 32 x 32
  // of them, 8 rounds of the 4 warps. Lane (w, c, b) = (lane % 4, lane / 4 % 4, lane / 16) takes
  // head dims 4 (4 (dim_base + b) + w) and columns 4 (4 chunk + c), chunk = col_base + (w / 2 +
  // 2 b + turn) % 4: then a warp's 32 loads (for each of the 4 keys) and its 32 stores (for each
  // of the 4 rows) each hit 32 different banks through the 128-byte swizzle's xor, and the 32
  // (turn, col_base, dim_base) rounds cover every unit once.
  const int warp = t / 32, lane = t % 32;
  const int w = lane % 4, c = lane / 4 % 4, b = lane / 16;
#pragma unroll 1
  for (int round = 0; round < kBlockN / 4 * kHeadDim / 4 / 128; ++round) {
    const int g = warp + 4 * round, turn = g % 4, col_base = 4 * (g / 4 % 2), dim_base = 2 * (g / 8);
    const int dim0 = 4 * (4 * (dim_base + b) + w);
    const int col0 = 4 * (4 * (col_base + (w / 2 + 2 * b + turn) % 4) + c);
    const int key0 = vt_column_key(col0);  // col0 + e holds key0 + e % 2 + 8 (e / 2)
    uint32_t word[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + e % 2 + 8 * (e / 2);
      word[e] = key < key_limit
                    ? FLASHATTN_SMEM(reinterpret_cast<const uint32_t*>(v + swizzled_byte(key, dim0)))[0]
                    : 0u;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
      FLASHATTN_SMEM(reinterpret_cast<uint32_t*>(vt + swizzled_byte(dim0 + i, col0)))[0] =
          byte_column(word[0], word[1], word[2], word[3], i);  // SITE:store_vt
  }
}

}  // namespace flashattn::hopper
