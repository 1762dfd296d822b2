// FP8 (e4m3) on the shim: the layout cases of sm90_fp8_cases.h against their references, the
// conversions' table for tests/test_cudasim_fp8.py to compare with torch.float8_e4m3fn, and
// misuse the shim must name.
//   fp8_test CASE
// Exit status: 0 = correct results, 1 = wrong results (printed), 3 = SimError (printed).
// Lines marked "// SITE:name" are the call sites the tests expect messages to name.
#include <cmath>
#include <cstdio>
#include <string>

#include "named_cases.h"
#include "sm90_fp8_cases.h"

namespace {

using namespace flashattn::ptx;

int layouts() {
  std::vector<primitives::CaseResult> results;
  primitives::run_fp8_cases(20261204, results);
  return primitives::report_failed_cases(results);
}

// ---- The conversion table: "encode <f32 bits> <e4m3 code>" for the sweep (each value as the
// low element of a pair, beside 1.0 as the high one, whose code is checked too) and
// "decode <code> <f16 bits>" for every code. ----
__global__ void table_kernel(const float* values, uint16_t* pairs, uint32_t* halves, int count) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) pairs[i] = cvt_e4m3x2_f32(values[i], 1.f);
  for (int c = threadIdx.x; c < 256; c += blockDim.x) halves[c] = cvt_f16x2_e4m3x2(static_cast<uint16_t>(c));
}

int conversion_table() {
  primitives::Rng rng(20261204);
  std::vector<float> values = primitives::e4m3_sweep(rng);
  for (int i = 0; i < 4096; ++i) values.push_back(rng.uniform(-600.f, 600.f));
  for (int i = 0; i < 4096; ++i) values.push_back(std::ldexp(rng.uniform(-2.f, 2.f), rng.below(24) - 16));
  const int count = static_cast<int>(values.size());
  std::vector<uint16_t> pairs(count);
  std::vector<uint32_t> halves(256);
  cudasim::launch(table_kernel, dim3(1), dim3(128), 0, static_cast<const float*>(values.data()),
                  pairs.data(), halves.data(), count);
  int wrong_high = 0;
  for (int i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    std::printf("encode %08x %02x\n", bits, pairs[i] & 0xffu);
    wrong_high += (pairs[i] >> 8) != 0x38;  // 1.0 = 0.0111.000
  }
  for (int c = 0; c < 256; ++c) std::printf("decode %02x %04x\n", c, halves[c] & 0xffffu);
  if (wrong_high != 0) {
    std::printf("wrong: %d high elements are not 1.0 (0x38)\n", wrong_high);
    return 1;
  }
  return 0;
}

// ---- Misuse ----

// A in the 128-byte swizzled K-major layout, 64 rows of 128 e4m3 (K = 128, four K steps) and B
// likewise (64 rows): A[r][k] = 1, B[n][k] = (n + k) % 3, so D[r][n] = sum over k of B[n][k].
constexpr uint32_t kTileBytes = 64 * 128;
__device__ inline uint32_t sw128_e4m3(int r, int k) {
  return static_cast<uint32_t>(128 * r + 16 * ((k / 16) ^ (r % 8)) + k % 16);
}

// Chains four K steps whose descriptors advance by `step` bytes: 32 is right (K = 32 per
// instruction), 16 is the 16-bit types' 16 elements mistaken for the step.
template <int kStep>
__global__ void k_step_kernel(float* out) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * 128; i += 128) {
    const int r = i / 128, k = i % 128;
    FLASHATTN_SMEM(smem)[sw128_e4m3(r, k)] = 0x38;  // 1.0
    FLASHATTN_SMEM(smem)[kTileBytes + sw128_e4m3(r, k)] = primitives::e4m3_bits(static_cast<float>((r + k) % 3));
  }
  fence_proxy_async_shared_cta();
  __syncthreads();
  const uint64_t da = wgmma_descriptor(smem_u32addr(smem), 16, 1024, WgmmaSwizzle::B128);
  const uint64_t db = wgmma_descriptor(smem_u32addr(smem + kTileBytes), 16, 1024, WgmmaSwizzle::B128);
  float d[32];
  wgmma_fence();
  for (int s = 0; s < 4; ++s) {
    const uint64_t da_s = wgmma_descriptor_advance(da, kStep * s), db_s = wgmma_descriptor_advance(db, kStep * s);
    wgmma_e4m3_ss<64>(d, da_s, db_s, s == 0 ? 0 : 1);  // SITE:k_step_wgmma
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  for (int i = 0; i < 32; ++i) out[primitives::wgmma_d_row(tid, i) * 64 + primitives::wgmma_d_col(tid, i)] = d[i];
}

template <int kStep>
int k_step() {
  std::vector<float> out(64 * 64, -1.f);
  cudasim::launch(k_step_kernel<kStep>, dim3(1), dim3(128), 2 * kTileBytes, out.data());
  int wrong = 0;
  for (int r = 0; r < 64; ++r) {
    for (int n = 0; n < 64; ++n) {
      float want = 0.f;
      for (int k = 0; k < 128; ++k) want += static_cast<float>((n + k) % 3);
      wrong += out[r * 64 + n] != want;
    }
  }
  if (wrong != 0) {
    std::printf("wrong: %d of %d outputs differ\n", wrong, 64 * 64);
    return 1;
  }
  return 0;
}

// An N-major B (V as stored, for P * V) passed to the e4m3 wgmma: the PTX has no imm-trans for
// 8-bit types, so only a call of the shim's entry point can say it (a wrapper cannot).
__global__ void mn_major_kernel() {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  for (int i = threadIdx.x; i < 4096; i += 128) FLASHATTN_SMEM(smem)[i] = 0;
  fence_proxy_async_shared_cta();
  __syncthreads();
  const uint64_t desc = wgmma_descriptor(smem_u32addr(smem), 128, 256, WgmmaSwizzle::None);
  float d[4] = {};
  wgmma_fence();
  cudasim::detail::wgmma_mma_async({8, cudasim::detail::WgmmaInput::E4M3, 0, 1}, d, nullptr, desc, desc, 0,
                                   __FILE__, __LINE__);  // SITE:mn_major_wgmma
  wgmma_commit_group();
  wgmma_wait_group<0>();
}

// Reads the accumulators of an e4m3 MMA before the wait: NaN, as for the 16-bit types.
__global__ void read_before_wait_kernel(int* nan_count) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  for (int i = threadIdx.x; i < 4096; i += 128) FLASHATTN_SMEM(smem)[i] = 0x38;
  fence_proxy_async_shared_cta();
  __syncthreads();
  const uint64_t desc = wgmma_descriptor(smem_u32addr(smem), 128, 256, WgmmaSwizzle::None);
  float d[4] = {};
  wgmma_fence();
  wgmma_e4m3_ss<8>(d, desc, desc, 0);
  wgmma_commit_group();
  int nans = 0;
  for (float x : d) nans += std::isnan(x) ? 1 : 0;
  wgmma_wait_group<0>();
  for (float x : d) nans += x == 32.f ? 0 : 1000;  // after the wait: 32 products of 1 * 1
  atomicAdd(nan_count, nans);
}

int read_before_wait() {
  int nans = 0;
  cudasim::launch(read_before_wait_kernel, dim3(1), dim3(128), 4096, &nans);
  std::printf("%d accumulators read NaN before the wait\n", nans);
  return nans == 128 * 4 ? 0 : 1;
}

// One e4m3 wgmma from shared memory and one from registers, and the two conversions.
__global__ void counters_kernel(float* out) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  for (int i = threadIdx.x; i < 4096; i += 128) FLASHATTN_SMEM(smem)[i] = 0;
  fence_proxy_async_shared_cta();
  __syncthreads();
  const uint64_t desc = wgmma_descriptor(smem_u32addr(smem), 128, 256, WgmmaSwizzle::None);
  float d64[32] = {}, d8[4] = {};
  const uint32_t a[4] = {cvt_e4m3x2_f32(1.f, 2.f), 0u, 0u, 0u};
  wgmma_fence();
  wgmma_e4m3_ss<64>(d64, desc, desc, 0);
  wgmma_e4m3_rs<8>(d8, a, desc, 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  out[threadIdx.x] = d64[0] + d8[0] + static_cast<float>(cvt_f16x2_e4m3x2(0) & 1u);
}

int counters() {
  std::vector<float> out(128);
  const cudasim::Counters c = selftest::counted_launch(counters_kernel, 128, 4096, out.data());
  const bool ok = c.wgmma[2][7] == 1 && c.wgmma[2][0] == 1 && c.wgmma_instructions() == 2 &&
                  c.wgmma_a_from_registers == 1 && c.wgmma_macs == 64 * 64 * 32 + 64 * 8 * 32 &&
                  c.cvt_e4m3x2_f32 == 128 && c.cvt_f16x2_e4m3x2 == 128;
  return ok ? 0 : 1;
}

const selftest::NamedCases kCases = {
    {"layouts", layouts},
    {"conversion_table", conversion_table},
    {"k_step_32", k_step<32>},
    {"k_step_16", k_step<16>},
    {"mn_major_operand", [] {
       cudasim::launch(mn_major_kernel, dim3(1), dim3(128), 4096);
       return 0;
     }},
    {"read_before_wait", read_before_wait},
    {"counters", counters},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
