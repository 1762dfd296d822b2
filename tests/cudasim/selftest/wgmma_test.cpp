// wgmma, stmatrix, setmaxnreg and fence.proxy.async on the shim: the layout cases of
// sm90_wgmma_cases.h against their ISA reference, and planted bugs the shim must report.
//   wgmma_test CASE
// Exit status: 0 = correct results, 1 = wrong results (printed), 3 = SimError (printed).
// Lines marked "// SITE:name" are the call sites the tests expect messages to name.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "cuda/tensor_map.h"
#include "sm90_wgmma_cases.h"
#include "named_cases.h"

namespace bugs {

using namespace flashattn::ptx;

constexpr int kN = 64;         // m64n64k16, bf16, both operands K-major, 128-byte swizzle
constexpr uint32_t kB = 8192;  // B's offset: A takes 64 rows of 128 bytes

enum class Bug {
  None,
  ReadBeforeWait,       // reads the accumulators before wgmma.wait_group
  NoWait,               // never waits: the MMA is in flight when the thread returns
  EarlyRelease,         // releases the B stage (mbarrier arrive) before the wait retires it
  MissingProxyFence,    // stages the operands with plain stores and no fence.proxy.async
  StmatrixNoFence,      // stages B with stmatrix and no fence.proxy.async
  MissingWgmmaFence,    // no wgmma.fence before the first wgmma
  WritesAccumulator,    // zeroes an accumulator while its MMA is in flight
  DeadFrame,            // the accumulators live in a helper that returns before the wait
  CpAsyncFenced,        // stages B with cp.async, waits, then fence.proxy.async: correct
  CpAsyncNoFence,       // stages B with cp.async and waits, but fences only before the copies
};

// B (64 x 64 bf16, B[n][k] = (n + k) % 5) already in the 128-byte swizzled layout, the global
// source of the cp.async cases.
alignas(16) uint16_t g_b_swizzled[64 * 64];

// Element (r, k) of a K-major, 128-byte swizzled 64-row operand (PTX ISA, "Shared Memory
// Matrix Layout"): row r at 128 * r, chunk k / 8 XOR r % 8.
__device__ inline uint32_t sw128(int r, int k) {
  return static_cast<uint32_t>(128 * r + 16 * ((k / 8) ^ (r % 8)) + 2 * (k % 8));
}

__device__ inline uint16_t bf16_bits(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

// Issues an MMA into accumulators that die with this helper, two frames and a kilobyte below
// the kernel's, where the wait's own frames will not reach.
__device__ __noinline__ void issue_into_local(uint64_t da, uint64_t db) {
  float mine[kN / 2] = {};
  wgmma_bf16_ss<kN>(mine, da, db, 0);  // SITE:dead_frame_wgmma
  wgmma_commit_group();
}
__device__ __noinline__ void issue_deep(uint64_t da, uint64_t db) {
  volatile char depth[1024];
  depth[0] = 0;
  issue_into_local(da, db);
  depth[1] = depth[0];
}

// Warpgroup 0 computes D = A * B with A[r][k] = 1 and B[n][k] = (n + k) % 5 (so D[r][n] = the
// sum over k), and writes D to out (64 x 64 floats, row-major); warp 4, when present, is a
// producer that overwrites B once the consumers release it on an mbarrier.
template <Bug kBug>
__global__ void kernel(float* out, int* nan_count) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  uint16_t* a_tile = reinterpret_cast<uint16_t*>(smem);
  uint16_t* b_tile = reinterpret_cast<uint16_t*>(smem + kB);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + 2 * kB);
  const int tid = threadIdx.x;
  if (tid == 0) mbarrier_init(empty, 1);
  if (tid < 128) {
    for (int i = tid; i < 64 * 16; i += 128) {
      const int r = i / 16, k = i % 16;
      FLASHATTN_SMEM(a_tile)[sw128(r, k) / 2] = bf16_bits(1.f);  // SITE:stage_a
      if (kBug != Bug::StmatrixNoFence && kBug != Bug::CpAsyncFenced && kBug != Bug::CpAsyncNoFence) {
        FLASHATTN_SMEM(b_tile)[sw128(r, k) / 2] = bf16_bits(static_cast<float>((r + k) % 5));  // SITE:stage_b
      }
    }
    if (kBug == Bug::CpAsyncFenced || kBug == Bug::CpAsyncNoFence) {
      // cp.async writes go through the generic proxy when the wait retires them: the fence must
      // come after the wait (CpAsyncNoFence fences A's stores before the copies, and no more).
      if (kBug == Bug::CpAsyncNoFence) fence_proxy_async_shared_cta();
      for (int c = tid; c < 64 * 64 * 2 / 16; c += 128) {
        cp_async_16(smem + kB + 16 * c, g_b_swizzled + 8 * c, 16);  // SITE:cp_async_b
      }
      cp_async_wait_all();
    }
    if (kBug != Bug::MissingProxyFence && kBug != Bug::CpAsyncNoFence) fence_proxy_async_shared_cta();
    if (kBug == Bug::StmatrixNoFence && tid < 32) {
      // B rows 8m + (lane % 8) for m = 0..3 and rows 32.. likewise: each x4 writes four 8x8
      // matrices of 16-byte rows (k 0-7 or 8-15 of 8 rows).
      for (int block = 0; block < 4; ++block) {
        uint32_t regs[4];
        for (int m = 0; m < 4; ++m) {
          const int r0 = 16 * block + 8 * (m / 2), k0 = 8 * (m % 2);
          uint32_t reg = 0;
          for (int h = 0; h < 2; ++h) {
            const int r = r0 + tid / 4, k = k0 + 2 * (tid % 4) + h;
            reg |= static_cast<uint32_t>(bf16_bits(static_cast<float>((r + k) % 5))) << (16 * h);
          }
          regs[m] = reg;
        }
        const int m = tid / 8, r = 16 * block + 8 * (m / 2) + tid % 8, k = 8 * (m % 2);
        stmatrix_x4(smem + kB + sw128(r, k), regs[0], regs[1], regs[2], regs[3]);  // SITE:stmatrix_b
      }
    }
  }
  __syncthreads();
  if (tid >= 128) {  // the producer warp: the next tile replaces B once it is released
    mbarrier_wait_parity(empty, 0);
    for (int i = tid - 128; i < 64 * 16; i += 32) {
      FLASHATTN_SMEM(b_tile)[i] = bf16_bits(7.f);  // SITE:producer_overwrite
    }
    return;
  }
  const uint64_t da = wgmma_descriptor(smem_u32addr(a_tile), 16, 1024, WgmmaSwizzle::B128);
  const uint64_t db = wgmma_descriptor(smem_u32addr(b_tile), 16, 1024, WgmmaSwizzle::B128);
  float d[kN / 2];
  for (float& x : d) x = 0.f;
  if (kBug != Bug::MissingWgmmaFence) wgmma_fence();
  if (kBug == Bug::DeadFrame) {
    issue_deep(da, db);
  } else {
    wgmma_bf16_ss<kN>(d, da, db, 1);  // SITE:wgmma
    wgmma_commit_group();
  }
  if (kBug == Bug::WritesAccumulator) d[3] = 0.f;  // SITE:write_accumulator
  if (kBug == Bug::EarlyRelease && tid == 0) mbarrier_arrive(empty);
  named_barrier_sync(1, 128);  // the warpgroup syncs (softmax work) before it waits
  if (kBug == Bug::ReadBeforeWait) {
    for (int i = 0; i < kN / 2; ++i) out[primitives::wgmma_d_row(tid, i) * kN + primitives::wgmma_d_col(tid, i)] = d[i];
  }
  if (kBug != Bug::NoWait) wgmma_wait_group<0>();  // SITE:wait
  if (kBug == Bug::None || kBug == Bug::MissingProxyFence || kBug == Bug::CpAsyncFenced) {
    for (int i = 0; i < kN / 2; ++i) out[primitives::wgmma_d_row(tid, i) * kN + primitives::wgmma_d_col(tid, i)] = d[i];
  }
  if (kBug != Bug::EarlyRelease && tid == 0 && blockDim.x > 128) mbarrier_arrive(empty);
  int nans = 0;
  for (float x : d) nans += std::isnan(x) ? 1 : 0;
  atomicAdd(nan_count, nans);
}

template <Bug kBug>
int run(unsigned threads) {
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < 64; ++k) g_b_swizzled[sw128(r, k) / 2] = bf16_bits(static_cast<float>((r + k) % 5));
  std::vector<float> out(64 * kN, -1.f);
  int nans = 0;
  cudasim::launch(kernel<kBug>, dim3(1), dim3(threads), 2 * kB + 64, out.data(), &nans);
  int wrong = 0, nan_out = 0;
  for (int r = 0; r < 64; ++r) {
    for (int n = 0; n < kN; ++n) {
      float want = 0.f;
      for (int k = 0; k < 16; ++k) want += static_cast<float>((n + k) % 5);
      const float got = out[r * kN + n];
      if (std::isnan(got)) ++nan_out;
      if (got != want) ++wrong;
    }
  }
  if (wrong != 0 || nans != 0) {
    std::printf("wrong: %d of %d outputs differ, %d are NaN; %d accumulators NaN after the wait\n",
                wrong, 64 * kN, nan_out, nans);
    return 1;
  }
  return 0;
}

}  // namespace bugs

namespace regs {

// setmaxnreg in a block of `groups` warpgroups: warpgroup 0 gives registers back, the others
// take them (FA3's producer / consumers).
template <int kDec, int kInc, bool kSplitSites>
__global__ void kernel() {
  using namespace flashattn::ptx;
  const int group = threadIdx.x / 128;
  if (group == 0) {
    if (kSplitSites && threadIdx.x >= 64) {
      setmaxnreg_dec<kDec>();  // SITE:dec_other_half
    } else {
      setmaxnreg_dec<kDec>();  // SITE:dec
    }
  } else {
    setmaxnreg_inc<kInc>();  // SITE:inc
  }
}

__global__ void bad_count() {
  cudasim::detail::setmaxnreg(true, 20, __FILE__, __LINE__);  // SITE:bad_count
}

}  // namespace regs

namespace misuse {

__global__ void stmatrix_misaligned() {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  flashattn::ptx::stmatrix_x2(smem + 16 * (threadIdx.x % 16) + (threadIdx.x == 9 ? 4 : 0), 1u, 2u);  // SITE:stmatrix_misaligned
}

__global__ void descriptor_outside_smem(float* out) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  float d[4] = {};
  wgmma_fence();
  const uint64_t desc = wgmma_descriptor(smem_u32addr(smem), 16, 1024, WgmmaSwizzle::B128);
  wgmma_bf16_ss<8>(d, desc, desc, 0);  // SITE:outside
  wgmma_commit_group();
  wgmma_wait_group<0>();
  out[threadIdx.x] = d[0];
}

}  // namespace misuse

namespace ring {

// A TMA ring feeding wgmma, FA3's main loop in miniature: warp 4 (one lane) loads A (64 x 64
// bf16) once and kTiles tiles of B (64 x 64, K-major) through kStages stages with 128-byte
// swizzled tensor copies; warpgroup 0 waits on each stage's "full" mbarrier, accumulates
// D += A * B_t^T in four chained wgmmas (K = 64), waits, and releases the stage on "empty".
// With EarlyRelease it releases the stage before its wgmma.wait_group: once the producer's
// next copy lands in it before the wait retires the MMA (eager completion), that is the
// "changed before retirement" error.
constexpr int kStages = 2, kTiles = 4;
constexpr uint32_t kTileBytes = 64 * 64 * 2;

template <bool kEarlyRelease>
__global__ void kernel(const __grid_constant__ flashattn::TensorMap map_a,
                       const __grid_constant__ flashattn::TensorMap map_b, float* out) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  unsigned char* a_tile = smem;  // 1024-byte aligned under the shim
  unsigned char* stages = smem + kTileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kTileBytes);
  uint64_t* empty = full + kStages;
  uint64_t* a_full = empty + kStages;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 1);
    }
    mbarrier_init(a_full, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (tid >= 128) {
    if (tid != 128) return;
    mbarrier_arrive_expect_tx(a_full, kTileBytes);
    tma_load_2d(a_tile, &map_a, a_full, 0, 0);
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % kStages;
      mbarrier_wait_parity(&empty[s], ((t / kStages) & 1) ^ 1);
      mbarrier_arrive_expect_tx(&full[s], kTileBytes);
      tma_load_2d(stages + s * kTileBytes, &map_b, &full[s], 0, 64 * t);  // SITE:ring_load
    }
    return;
  }
  float d[32];
  for (float& x : d) x = 0.f;
  mbarrier_wait_parity(a_full, 0);
  const uint64_t desc_a = wgmma_descriptor(smem_u32addr(a_tile), 16, 1024, WgmmaSwizzle::B128);
  for (int t = 0; t < kTiles; ++t) {
    const int s = t % kStages;
    mbarrier_wait_parity(&full[s], (t / kStages) & 1);
    const uint64_t desc_b =
        wgmma_descriptor(smem_u32addr(stages + s * kTileBytes), 16, 1024, WgmmaSwizzle::B128);
    wgmma_fence();
    for (int k = 0; k < 4; ++k) {
      const uint64_t da = wgmma_descriptor_advance(desc_a, 32 * k);
      const uint64_t db = wgmma_descriptor_advance(desc_b, 32 * k);
      wgmma_bf16_ss<64>(d, da, db, 1);  // SITE:ring_wgmma
    }
    wgmma_commit_group();
    if (kEarlyRelease && tid == 0) mbarrier_arrive(&empty[s]);
    named_barrier_sync(1, 128);  // softmax-like work in which the producer gets to run
    wgmma_wait_group<0>();  // SITE:ring_wait
    if (!kEarlyRelease && tid == 0) mbarrier_arrive(&empty[s]);
  }
  for (int i = 0; i < 32; ++i) {
    out[primitives::wgmma_d_row(tid, i) * 64 + primitives::wgmma_d_col(tid, i)] = d[i];
  }
}

flashattn::TensorMap tile_map(const void* global, uint64_t rows) {
  flashattn::TensorMapSpec spec;
  spec.dtype = flashattn::TensorMapDtype::BFloat16;
  spec.rank = 2;
  spec.global = global;
  spec.dims[0] = 64, spec.dims[1] = rows;
  spec.strides[0] = 128;
  spec.box[0] = 64, spec.box[1] = 64;
  spec.swizzle = flashattn::TensorMapSwizzle::B128;
  flashattn::TensorMap map;
  const std::string error = flashattn::encode_tensor_map(&map, spec);
  if (!error.empty()) throw cudasim::SimError(error);
  return map;
}

template <bool kEarlyRelease>
int run() {
  // A[m][k] = (m + 2k) % 7 - 3, B_t[n][k] = (t + n + k) % 5 - 2: small integers, exact sums.
  std::vector<uint16_t> a(64 * 64), b(kTiles * 64 * 64);
  auto bf16 = [](float x) { return primitives::bits16(__float2bfloat16_rn(x)); };
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 64; ++k) a[m * 64 + k] = bf16(static_cast<float>((m + 2 * k) % 7 - 3));
  for (int t = 0; t < kTiles; ++t)
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 64; ++k) b[(t * 64 + n) * 64 + k] = bf16(static_cast<float>((t + n + k) % 5 - 2));
  const flashattn::TensorMap map_a = tile_map(a.data(), 64), map_b = tile_map(b.data(), kTiles * 64);
  std::vector<float> out(64 * 64, -1.f);
  const size_t smem = (1 + kStages) * kTileBytes + 64;
  cudasim::launch(kernel<kEarlyRelease>, dim3(1), dim3(160), smem, map_a, map_b, out.data());
  int wrong = 0;
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 64; ++n) {
      double want = 0;
      for (int t = 0; t < kTiles; ++t)
        for (int k = 0; k < 64; ++k) want += ((m + 2 * k) % 7 - 3) * ((t + n + k) % 5 - 2);
      if (out[m * 64 + n] != static_cast<float>(want)) ++wrong;
    }
  }
  if (wrong != 0) {
    std::printf("wrong: %d of %d outputs differ\n", wrong, 64 * 64);
    return 1;
  }
  return 0;
}

}  // namespace ring

namespace counters {

// One wgmma of each kind the counters tell apart, then checks the launch's counts.
__global__ void kernel(float* out) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  for (int i = threadIdx.x; i < 4096; i += 128) FLASHATTN_SMEM(smem)[i] = 0;
  fence_proxy_async_shared_cta();
  __syncthreads();
  const uint64_t desc = wgmma_descriptor(smem_u32addr(smem), 128, 256, WgmmaSwizzle::None);
  float d64[32] = {}, d8[4] = {};
  const uint32_t a[4] = {};
  setmaxnreg_inc<240>();
  wgmma_fence();
  wgmma_bf16_ss<64>(d64, desc, desc, 0);
  wgmma_f16_rs<8>(d8, a, desc, 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  if (threadIdx.x < 32) stmatrix_x4_trans(smem + 16 * threadIdx.x, 1u, 2u, 3u, 4u);
  out[threadIdx.x] = d64[0] + d8[0];
}

int run() {
  std::vector<float> out(128);
  const cudasim::Counters c = selftest::counted_launch(kernel, 128, 4096, out.data());
  const bool ok = c.wgmma[1][7] == 1 && c.wgmma[0][0] == 1 && c.wgmma_instructions() == 2 &&
                  c.wgmma_a_from_registers == 1 && c.wgmma_macs == 64 * 64 * 16 + 64 * 8 * 16 &&
                  c.wgmma_fence == 1 && c.wgmma_commit_group == 1 && c.wgmma_wait_group == 1 &&
                  c.setmaxnreg_inc == 1 && c.setmaxnreg_dec == 0 &&
                  c.fence_proxy_async_threads == 128 && c.stmatrix[1][2] == 1 &&
                  c.stmatrix_wavefronts == 4 && c.stmatrix_wavefronts_ideal == 4;
  return ok ? 0 : 1;
}

}  // namespace counters

namespace {

int layouts() {
  std::vector<primitives::CaseResult> results;
  primitives::run_wgmma_cases(20261202, results);
  return primitives::report_failed_cases(results);
}

template <class Kernel>
int launch(Kernel kernel, unsigned threads, size_t smem = 0) {
  cudasim::launch(kernel, dim3(1), dim3(threads), smem);
  return 0;
}

using bugs::Bug;
std::vector<float> sink(128);

const selftest::NamedCases kCases = {
    {"layouts", layouts},
    {"pipeline", [] { return bugs::run<Bug::None>(160); }},
    {"tma_ring", ring::run<false>},
    {"tma_ring_early_release", ring::run<true>},
    {"read_before_wait", [] { return bugs::run<Bug::ReadBeforeWait>(128); }},
    {"no_wait", [] { return bugs::run<Bug::NoWait>(128); }},
    {"early_release", [] { return bugs::run<Bug::EarlyRelease>(160); }},
    {"missing_proxy_fence", [] { return bugs::run<Bug::MissingProxyFence>(128); }},
    {"stmatrix_no_fence", [] { return bugs::run<Bug::StmatrixNoFence>(128); }},
    {"missing_wgmma_fence", [] { return bugs::run<Bug::MissingWgmmaFence>(128); }},
    {"writes_accumulator", [] { return bugs::run<Bug::WritesAccumulator>(128); }},
    {"dead_frame", [] { return bugs::run<Bug::DeadFrame>(128); }},
    {"cp_async_fenced", [] { return bugs::run<Bug::CpAsyncFenced>(128); }},
    {"cp_async_no_fence", [] { return bugs::run<Bug::CpAsyncNoFence>(128); }},
    {"setmaxnreg", [] { return launch(regs::kernel<40, 232, false>, 384); }},
    {"setmaxnreg_over_budget", [] { return launch(regs::kernel<40, 240, false>, 512); }},
    {"setmaxnreg_split_sites", [] { return launch(regs::kernel<40, 232, true>, 384); }},
    {"setmaxnreg_bad_count", [] { return launch(regs::bad_count, 128); }},
    {"stmatrix_misaligned", [] { return launch(misuse::stmatrix_misaligned, 32, 256); }},
    {"descriptor_outside_smem", [] {
       cudasim::launch(misuse::descriptor_outside_smem, dim3(1), dim3(128), 512, sink.data());
       return 0;
     }},
    {"counters", counters::run},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
