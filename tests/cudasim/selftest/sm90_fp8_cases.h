// FP8 (e4m3) cases in the style of sm90_wgmma_cases.h: wgmma.mma_async m64nNk32.f32.e4m3.e4m3
// (A from shared memory or registers, B from shared memory, K-major with each swizzle) and the
// conversions cvt.rn.satfinite.e4m3x2.f32 / cvt.rn.f16x2.e4m3x2. Each runs a small kernel and
// returns what it wrote beside a reference built here: the wgmma one from the PTX ISA's layouts
// (independently of the shim's code) on small integer-valued inputs, whose every partial sum is
// exact in f32 (hardware's e4m3 accumulation is not IEEE f32 summation in general, so only
// exact sums make bit equality a fair test); the conversions' from cuda_fp8.h's host reference
// conversion. The shim self-test (fp8_test.cpp) and the GPU layout check (sm90_cases.h) run the
// same cases with the same inputs; hardware must agree bit for bit.
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

// One warpgroup: as wgmma_case_kernel, with e4m3 operands: copies the image to a 1024-byte
// aligned tile, loads the accumulators (and A fragments), runs p.k_steps chained m64nNk32
// wgmmas as one commit group, waits and writes the accumulators back.
template <int N, bool kARegs>
__global__ void wgmma_e4m3_case_kernel(WgmmaCaseParams p, const uint4* image, const uint32_t* a_regs,
                                       float* cd) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, wgmma_smem);
  const int tid = threadIdx.x;
  unsigned char* tile = wgmma_smem + (1024 - smem_u32addr(wgmma_smem) % 1024) % 1024;
  uint4* tile16 = reinterpret_cast<uint4*>(tile);
  for (uint32_t i = tid; i < p.image_bytes / 16; i += kWarpgroup) FLASHATTN_SMEM(tile16)[i] = image[i];
  fence_proxy_async_shared_cta();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = cd[tid * (N / 2) + i];
  uint32_t a[2][4] = {};
  if (kARegs) {
    for (int s = 0; s < p.k_steps; ++s)
      for (int j = 0; j < 4; ++j) a[s][j] = a_regs[(s * kWarpgroup + tid) * 4 + j];
  }
  const uint64_t desc_a = wgmma_descriptor(smem_u32addr(tile + p.a_offset), p.a_lbo, p.a_sbo,
                                           static_cast<WgmmaSwizzle>(p.a_swizzle));
  const uint64_t desc_b = wgmma_descriptor(smem_u32addr(tile + p.b_offset), p.b_lbo, p.b_sbo,
                                           static_cast<WgmmaSwizzle>(p.b_swizzle));
  wgmma_fence_operand(d);
  wgmma_fence();
  for (int s = 0; s < p.k_steps; ++s) {
    const uint64_t db = wgmma_descriptor_advance(desc_b, s * p.b_step);
    const int scale_d = s == 0 ? p.scale_d : 1;
    if constexpr (kARegs) {
      wgmma_e4m3_rs<N>(d, a[s], db, scale_d);
    } else {
      wgmma_e4m3_ss<N>(d, wgmma_descriptor_advance(desc_a, s * p.a_step), db, scale_d);
    }
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(d);
  for (int i = 0; i < N / 2; ++i) cd[tid * (N / 2) + i] = d[i];
}

// ---- The reference: K-major layouts of 8-bit elements as the ISA draws them. A core matrix
// is 8 rows of 16 bytes, here 16 consecutive k of one row r. No swizzle: the next core along K
// is LBO away, along M/N SBO. Swizzled (S bytes): atom row j = r % 8 holds S consecutive k,
// its 16-byte chunk c stored at chunk c ^ ((j * S / 128) % (S / 16)); atoms along M/N are SBO
// apart; K beyond S bytes continues in the next column of atoms (k_column). ----
inline uint32_t e4m3_layout_offset(const OperandLayout& L, int r, int k) {
  const uint32_t ur = static_cast<uint32_t>(r), uk = static_cast<uint32_t>(k);
  if (L.swizzle_bytes == 0) return ur / 8 * L.sbo + uk / 16 * L.lbo + ur % 8 * 16 + uk % 16;
  const uint32_t S = static_cast<uint32_t>(L.swizzle_bytes);
  const uint32_t atom = ur / 8 * L.sbo + uk / S * L.k_column, row = ur % 8, byte = uk % S;
  const uint32_t stored_chunk = byte / 16 ^ (row * S / 128 % (S / 16));
  return atom + row * S + stored_chunk * 16 + byte % 16;
}

// A K-major layout of `rows` x `k_total` e4m3, and the descriptor advance for one K step of 32.
inline OperandLayout make_e4m3_layout(int swizzle_bytes, int rows, int k_total, bool padded,
                                      uint32_t& step, uint32_t& bytes) {
  OperandLayout L{false, swizzle_bytes, 0, 0, 0};
  const uint32_t row_cores = static_cast<uint32_t>((rows + 7) / 8);
  const uint32_t k_bytes = static_cast<uint32_t>(k_total);
  if (swizzle_bytes == 0) {
    L.lbo = 128;  // k-cores adjacent, then the next 8 rows
    L.sbo = 128 * (k_bytes / 16) + (padded ? 256 : 0);
    bytes = row_cores * L.sbo;
    step = 2 * L.lbo;  // 32 k = two core matrices
    return L;
  }
  const uint32_t S = static_cast<uint32_t>(swizzle_bytes), atom = 8 * S;
  L.lbo = 16;  // unused: "assumed 1"
  L.sbo = atom + (padded ? atom : 0);
  L.k_column = row_cores * L.sbo;
  bytes = (k_bytes + S - 1) / S * L.k_column;
  step = S >= 64 ? 32 : L.k_column;  // 32 k = 32 bytes further along the row
  return L;
}

// The e4m3 register A fragment: element e (0..15, four per .b32, lowest byte first) of thread t
// (w = warp, g = laneid / 4, q = laneid % 4) is A[16w + g + 8 * ((e / 4) % 2)][4q + e % 4 +
// 16 * (e / 8)].
inline int wgmma_e4m3_a_row(int t, int e) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((e / 4) % 2); }
inline int wgmma_e4m3_a_col(int t, int e) { return 4 * (t % 4) + e % 4 + 16 * (e / 8); }

// e4m3 bits from cuda_fp8.h's host conversion (round to nearest even, saturating).
inline uint8_t e4m3_bits(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

struct WgmmaE4m3CaseSpec {
  int n;
  bool a_regs;
  int a_swizzle, b_swizzle;
  int k_steps;  // 1 or 2 chained MMAs (K = 32 or 64)
  int scale_d;
  bool padded;
  bool fractions;  // inputs in quarters (-2 to 2) instead of integers (-4 to 4)
};

template <int N, bool kARegs>
CaseResult run_wgmma_e4m3_case(const WgmmaE4m3CaseSpec& spec, Rng& rng) {
  const int K = 32 * spec.k_steps;
  auto draw = [&]() {
    return spec.fractions ? static_cast<float>(rng.below(17) - 8) * 0.25f
                          : static_cast<float>(rng.below(9) - 4);
  };
  std::vector<float> A(64 * K), B(static_cast<size_t>(N) * K), C(64 * N);  // A[m][k], B[n][k]
  for (float& x : A) x = draw();
  for (float& x : B) x = draw();
  for (float& x : C) x = static_cast<float>(rng.below(65) - 32);
  uint32_t a_step = 0, b_step = 0, a_bytes = 0, b_bytes = 0;
  const OperandLayout la = make_e4m3_layout(spec.a_swizzle, 64, K, spec.padded, a_step, a_bytes);
  const OperandLayout lb = make_e4m3_layout(spec.b_swizzle, N, K, spec.padded, b_step, b_bytes);
  WgmmaCaseParams p{};
  p.a_offset = 0;
  p.b_offset = spec.a_regs ? 0 : (a_bytes + 1023) / 1024 * 1024;
  p.a_lbo = la.lbo, p.a_sbo = la.sbo, p.b_lbo = lb.lbo, p.b_sbo = lb.sbo;
  p.a_swizzle = swizzle_code(spec.a_swizzle), p.b_swizzle = swizzle_code(spec.b_swizzle);
  p.a_step = a_step, p.b_step = b_step;
  p.image_bytes = (p.b_offset + b_bytes + 15) / 16 * 16;
  p.scale_d = spec.scale_d;
  p.k_steps = spec.k_steps;
  std::vector<uint8_t> image(p.image_bytes, 0);
  for (int r = 0; r < 64 && !spec.a_regs; ++r)
    for (int k = 0; k < K; ++k) image[p.a_offset + e4m3_layout_offset(la, r, k)] = e4m3_bits(A[r * K + k]);
  for (int r = 0; r < N; ++r)
    for (int k = 0; k < K; ++k) image[p.b_offset + e4m3_layout_offset(lb, r, k)] = e4m3_bits(B[r * K + k]);
  std::vector<uint32_t> a_regs(static_cast<size_t>(spec.k_steps) * kWarpgroup * 4, 0);
  for (int s = 0; s < spec.k_steps; ++s)
    for (int t = 0; t < kWarpgroup; ++t)
      for (int e = 0; e < 16; ++e)
        a_regs[(s * kWarpgroup + t) * 4 + e / 4] |=
            static_cast<uint32_t>(e4m3_bits(A[wgmma_e4m3_a_row(t, e) * K + 32 * s + wgmma_e4m3_a_col(t, e)]))
            << (8 * (e % 4));
  std::vector<float> cd(kWarpgroup * (N / 2)), expected(cd.size());
  for (int t = 0; t < kWarpgroup; ++t) {
    for (int i = 0; i < N / 2; ++i) {
      const int row = wgmma_d_row(t, i), col = wgmma_d_col(t, i);
      cd[t * (N / 2) + i] = C[row * N + col];
      double sum = spec.scale_d ? C[row * N + col] : 0.0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(A[row * K + k]) * B[col * K + k];
      expected[t * (N / 2) + i] = static_cast<float>(sum);
    }
  }
  std::vector<uint4> image16(p.image_bytes / 16);
  std::memcpy(image16.data(), image.data(), p.image_bytes);
  DeviceArray<uint4> image_d(image16);
  DeviceArray<uint32_t> a_d(a_regs);
  DeviceArray<float> cd_d(cd);
  launch_one_block(wgmma_e4m3_case_kernel<N, kARegs>, kWarpgroup, p.image_bytes + 1024, p,
                   static_cast<const uint4*>(image_d.get()), static_cast<const uint32_t*>(a_d.get()),
                   cd_d.get());
  auto layout_name = [](int swizzle) { return std::string("K") + (swizzle ? "sw" + std::to_string(swizzle) : ""); };
  const std::string name = "wgmma_m64n" + std::to_string(N) + "k32_e4m3" +
                           (spec.a_regs ? "_rs_Areg" : "_ss_A" + layout_name(spec.a_swizzle)) + "_B" +
                           layout_name(spec.b_swizzle) + (spec.k_steps == 2 ? "_k64" : "") +
                           (spec.scale_d ? "" : "_overwrite") + (spec.padded ? "_padded" : "") +
                           (spec.fractions ? "_quarters" : "");
  const auto actual = bytes_of(cd_d.read());
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

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
  OperandLayout lb{false, 0, 128, 256, 0};
  std::vector<uint8_t> image(64 * 32);
  for (int n = 0; n < 64; ++n)
    for (int k = 0; k < 32; ++k) image[e4m3_layout_offset(lb, n, k)] = e4m3_bits(V[p_fragment_key(k) * 64 + n]);
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
      results.push_back(run_wgmma_e4m3_case<64, false>(
          {64, false, swizzles[a], swizzles[b], 2, 1, (a + b) % 2 == 1, false}, rng));
    }
  }
  // Other N (the accumulator fragment over N / 8 column blocks), the overwrite form, quarters.
  results.push_back(run_wgmma_e4m3_case<8, false>({8, false, 0, 0, 1, 1, false, false}, rng));
  results.push_back(run_wgmma_e4m3_case<16, false>({16, false, 32, 64, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_e4m3_case<24, false>({24, false, 128, 0, 1, 0, true, false}, rng));
  results.push_back(run_wgmma_e4m3_case<128, false>({128, false, 128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_e4m3_case<256, false>({256, false, 128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_e4m3_case<64, false>({64, false, 128, 128, 1, 1, false, true}, rng));
  // A from registers (P in P * V).
  results.push_back(run_wgmma_e4m3_case<8, true>({8, true, 0, 32, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_e4m3_case<64, true>({64, true, 0, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_e4m3_case<64, true>({64, true, 0, 64, 1, 0, true, false}, rng));
  results.push_back(run_wgmma_e4m3_case<128, true>({128, true, 0, 0, 2, 1, false, true}, rng));
  results.push_back(run_wgmma_e4m3_case<256, true>({256, true, 0, 128, 2, 1, false, false}, rng));
  // P * V from the accumulator layout, the FP8 forward's plan.
  results.push_back(p_times_v_case(rng));
}

}  // namespace primitives
