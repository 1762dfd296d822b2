// FP8 (e4m3) cases in the style of sm90_wgmma_cases.h: wgmma.mma_async m64nNk32.f32.e4m3.e4m3
// (A from shared memory or registers, B from shared memory, K-major with each swizzle: the
// generic run_wgmma_case there, on 1-byte elements), the conversions
// cvt.rn.satfinite.e4m3x2.f32 / cvt.rn.f16x2.e4m3x2 against cuda_fp8.h's host reference
// conversion, and P * V from the accumulator layout. The shim self-test (fp8_test.cpp) and the
// GPU layout check (sm90_cases.h) run the same cases with the same inputs; hardware must agree
// bit for bit.
// Compiles under nvcc (-gencode arch=compute_90a,code=sm_90a) and under the shim.
#pragma once
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "sm90_wgmma_cases.h"

namespace primitives {

// ---- The conversions, one value (pair) per thread. ----
__global__ void cvt_e4m3x2_kernel(const float* lo, const float* hi, uint16_t* out, int count) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) out[i] = flashattn::ptx::cvt_e4m3x2_f32(lo[i], hi[i]);
}
__global__ void cvt_f16x2_kernel(const uint16_t* pairs, uint32_t* out, int count) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) out[i] = flashattn::ptx::cvt_f16x2_e4m3x2(pairs[i]);
}

// The f32 values whose e4m3 rounding the ISA's rules decide: every e4m3 value, the midpoints
// between neighbours (ties to even) and the f32 values either side of each, the saturation edge
// (448, 464, 480, beyond, infinity), the underflow edge (2^-10 and around it), f32 subnormals,
// signed zeros, NaN of both signs, and random magnitudes across the range.
inline std::vector<float> e4m3_sweep(Rng& rng) {
  std::vector<float> values;
  std::vector<float> grid;
  for (int code = 0; code < 0x7f; ++code) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    grid.push_back(__half2float(__half(h)));
  }
  for (size_t i = 0; i < grid.size(); ++i) {
    values.push_back(grid[i]);
    if (i + 1 < grid.size()) {
      const float mid = 0.5f * (grid[i] + grid[i + 1]);
      values.push_back(mid);
      values.push_back(std::nextafter(mid, 0.f));
      values.push_back(std::nextafter(mid, 1e9f));
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {448.f, 456.f, 464.f, std::nextafter(464.f, 0.f), std::nextafter(464.f, 1e9f), 479.f,
                  480.f, 500.f, 1e6f, 3.4e38f, inf, 0x1p-10f, std::nextafter(0x1p-10f, 0.f),
                  std::nextafter(0x1p-10f, 1.f), 0x1p-11f, 3 * 0x1p-11f, 5 * 0x1p-11f, 1e-40f,
                  std::numeric_limits<float>::denorm_min(), 0.f})
    values.push_back(v);
  for (int i = 0; i < 256; ++i) values.push_back(std::ldexp(rng.uniform(1.f, 2.f), rng.below(30) - 14));
  const size_t positive = values.size();
  for (size_t i = 0; i < positive; ++i) values.push_back(-values[i]);
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(-std::numeric_limits<float>::quiet_NaN());
  return values;
}

// f32 pairs to e4m3x2: each sweep value once as the low and once as the high element.
inline CaseResult cvt_e4m3x2_case(Rng& rng) {
  const std::vector<float> sweep = e4m3_sweep(rng);
  const int count = static_cast<int>(sweep.size());
  std::vector<float> lo(sweep), hi(sweep.rbegin(), sweep.rend());
  std::vector<uint16_t> expected(count);
  for (int i = 0; i < count; ++i) {
    expected[i] = static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo[i], hi[i]), __NV_SATFINITE,
                                                                 __NV_E4M3));
  }
  DeviceArray<float> lo_d(lo), hi_d(hi);
  DeviceArray<uint16_t> out_d{std::vector<uint16_t>(count, 0xdead)};
  launch_one_block(cvt_e4m3x2_kernel, kWarpgroup, 0, static_cast<const float*>(lo_d.get()),
                   static_cast<const float*>(hi_d.get()), out_d.get(), count);
  const auto actual = bytes_of(out_d.read());
  return {"cvt_rn_satfinite_e4m3x2_f32", GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// Every e4m3 code in the low byte, and in the high byte beside another code, to f16x2.
inline CaseResult cvt_f16x2_e4m3x2_case() {
  std::vector<uint16_t> pairs(256);
  for (int c = 0; c < 256; ++c) pairs[c] = static_cast<uint16_t>(c | (255 - c) << 8);
  std::vector<uint32_t> expected(256);
  for (int c = 0; c < 256; ++c) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[c], __NV_E4M3);
    expected[c] = static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
  }
  DeviceArray<uint16_t> pairs_d(pairs);
  DeviceArray<uint32_t> out_d{std::vector<uint32_t>(256, 0xdeadbeefu)};
  launch_one_block(cvt_f16x2_kernel, kWarpgroup, 0, static_cast<const uint16_t*>(pairs_d.get()),
                   out_d.get(), 256);
  const auto actual = bytes_of(out_d.read());
  return {"cvt_rn_f16x2_e4m3x2", GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// ---- P * V as the FP8 forward will issue it: P (64 x 32, f32) in the m64n32 accumulator layout
// that S = Q * K^T leaves it in, converted pairwise with cvt_e4m3x2_f32 into the 8-bit A fragment
// without moving a byte between threads, times V^T (64 x 32, K-major) whose key columns are
// permuted to match. Thread (g, q) holds P columns 8j + 2q and 8j + 2q + 1 (j = 0..3) of rows g
// and g + 8; the A fragment's byte e of a[0] / a[2] stands for key 4q + e / 16 + 4q + e, so key
// k of V^T must hold V's key perm(k), perm(4q + e) = 2q + e % 2 + 8 (e / 2) and perm(16 + 4q + e)
// = 16 + 2q + e % 2 + 8 (e / 2). ----
inline int p_fragment_key(int k) {
  const int half = k / 16, q = (k % 16) / 4, e = k % 4;
  return 16 * half + 2 * q + e % 2 + 8 * (e / 2);
}

__global__ void p_times_v_kernel(const float* p_acc, const uint4* image, float* out, uint32_t b_sbo) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, pv_smem);
  const int tid = threadIdx.x;
  unsigned char* tile = pv_smem + (1024 - smem_u32addr(pv_smem) % 1024) % 1024;
  for (int i = tid; i < 64 * 32 / 16; i += kWarpgroup) FLASHATTN_SMEM(reinterpret_cast<uint4*>(tile))[i] = image[i];
  fence_proxy_async_shared_cta();
  __syncthreads();
  float p[16];
  for (int i = 0; i < 16; ++i) p[i] = p_acc[tid * 16 + i];
  // d[4j], d[4j + 1]: row g, columns 8j + 2q, + 1; d[4j + 2], d[4j + 3]: row g + 8.
  uint32_t a[4];
  for (int r = 0; r < 2; ++r) {
    for (int h = 0; h < 2; ++h) {
      const int j0 = 2 * h, j1 = 2 * h + 1;
      a[2 * h + r] = static_cast<uint32_t>(cvt_e4m3x2_f32(p[4 * j0 + 2 * r], p[4 * j0 + 2 * r + 1])) |
                     static_cast<uint32_t>(cvt_e4m3x2_f32(p[4 * j1 + 2 * r], p[4 * j1 + 2 * r + 1])) << 16;
    }
  }
  float d[32];
  for (float& x : d) x = 0.f;
  const uint64_t desc_b = wgmma_descriptor(smem_u32addr(tile), 128, b_sbo, WgmmaSwizzle::None);
  wgmma_fence_operand(d);
  wgmma_fence();
  wgmma_e4m3_rs<64>(d, a, desc_b, 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(d);
  for (int i = 0; i < 32; ++i) out[tid * 32 + i] = d[i];
}

inline CaseResult p_times_v_case(Rng& rng) {
  std::vector<float> P(64 * 32), V(32 * 64);  // P[m][key], V[key][n]
  for (float& x : P) x = static_cast<float>(rng.below(9)) * 0.125f;  // 0 to 1, as softmax's P
  for (float& x : V) x = static_cast<float>(rng.below(9) - 4);
  std::vector<float> p_acc(kWarpgroup * 16);
  for (int t = 0; t < kWarpgroup; ++t)
    for (int i = 0; i < 16; ++i) p_acc[t * 16 + i] = P[wgmma_d_row(t, i) * 32 + wgmma_d_col(t, i)];
  // V^T as a no-swizzle K-major B (64 rows n, 32 keys): two 16-key core matrices per 8 rows.
  OperandLayout lb{false, 0, 128, 256, 0, 1};
  std::vector<uint8_t> image(64 * 32);
  for (int n = 0; n < 64; ++n)
    for (int k = 0; k < 32; ++k) image[layout_offset(lb, n, k)] = e4m3_bits(V[p_fragment_key(k) * 64 + n]);
  std::vector<float> expected(kWarpgroup * 32);
  for (int t = 0; t < kWarpgroup; ++t) {
    for (int i = 0; i < 32; ++i) {
      const int row = wgmma_d_row(t, i), col = wgmma_d_col(t, i);
      double sum = 0;
      for (int key = 0; key < 32; ++key) sum += static_cast<double>(P[row * 32 + key]) * V[key * 64 + col];
      expected[t * 32 + i] = static_cast<float>(sum);
    }
  }
  std::vector<uint4> image16(image.size() / 16);
  std::memcpy(image16.data(), image.data(), image.size());
  DeviceArray<float> p_d(p_acc);
  DeviceArray<uint4> image_d(image16);
  DeviceArray<float> out_d{std::vector<float>(kWarpgroup * 32, -1.f)};
  launch_one_block(p_times_v_kernel, kWarpgroup, image.size() + 1024, static_cast<const float*>(p_d.get()),
                   static_cast<const uint4*>(image_d.get()), out_d.get(), lb.sbo);
  const auto actual = bytes_of(out_d.read());
  return {"e4m3_p_fragment_times_key_permuted_vt_m64n64k32", GpuCompare::Bitwise, actual,
          bytes_of(expected), actual};
}

// Every FP8 case, in a fixed order.
inline void run_fp8_cases(uint64_t seed, std::vector<CaseResult>& results) {
  Rng rng(seed ^ 0xf8e4ull);
  results.push_back(cvt_e4m3x2_case(rng));
  results.push_back(cvt_f16x2_e4m3x2_case());
  const int swizzles[4] = {0, 32, 64, 128};
  // Every A swizzle against every B swizzle: N = 64, K = 64 in two chained MMAs (each layout's
  // descriptor advance), strides padded on odd combinations.
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      const WgmmaCaseSpec s{swizzles[a], swizzles[b], 2, 1, (a + b) % 2 == 1, false};
      results.push_back(run_wgmma_case<64, WgmmaElem::E4m3, false>(s, rng));
    }
  }
  // Other N (the accumulator fragment over N / 8 column blocks), the overwrite form, quarters.
  results.push_back(run_wgmma_case<8, WgmmaElem::E4m3, false>({0, 0, 1, 1, false, false}, rng));
  results.push_back(run_wgmma_case<16, WgmmaElem::E4m3, false>({32, 64, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<24, WgmmaElem::E4m3, false>({128, 0, 1, 0, true, false}, rng));
  results.push_back(run_wgmma_case<128, WgmmaElem::E4m3, false>({128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<256, WgmmaElem::E4m3, false>({128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<64, WgmmaElem::E4m3, false>({128, 128, 1, 1, false, true}, rng));
  // A from registers (P in P * V).
  results.push_back(run_wgmma_case<8, WgmmaElem::E4m3, true>({0, 32, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<64, WgmmaElem::E4m3, true>({0, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<64, WgmmaElem::E4m3, true>({0, 64, 1, 0, true, false}, rng));
  results.push_back(run_wgmma_case<128, WgmmaElem::E4m3, true>({0, 0, 2, 1, false, true}, rng));
  results.push_back(run_wgmma_case<256, WgmmaElem::E4m3, true>({0, 128, 2, 1, false, false}, rng));
  // P * V from the accumulator layout, the FP8 forward's plan.
  results.push_back(p_times_v_case(rng));
}

}  // namespace primitives
