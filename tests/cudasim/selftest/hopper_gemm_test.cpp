// The warp-specialized TMA -> mbarrier -> wgmma GEMM (hopper_gemm_kernel.cuh) on the shim:
// integer-valued inputs (bf16, f16, e4m3) against an exact reference, ragged edges included,
// and the planted bugs the shim must report in it.
//   hopper_gemm_test CASE
// Exit status: 0 = exact results, 1 = wrong results (printed), 3 = SimError (printed).
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hopper_gemm_kernel.cuh"
#include "named_cases.h"

namespace {

using hopper_gemm::Bug;

// x (exact in every input type here) as an element of Elem.
template <typename Elem>
Elem element_of(float x);
template <>
__nv_bfloat16 element_of<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__half element_of<__half>(float x) { return __float2half_rn(x); }
template <>
__nv_fp8_e4m3 element_of<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 e;
  e.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return e;
}

// Small integers: every product and sum is exact in f32 for the shapes below.
int a_value(int m, int k) { return (3 * m + 7 * k) % 9 - 4; }
int b_value(int n, int k) { return (5 * n + 3 * k + 1) % 7 - 3; }

constexpr float kSentinel = -12345.f;
constexpr int kGuard = 256;  // floats after C that the TMA store must not touch

template <typename Elem, bool kBNMajor, int kConsumers, int kStages, Bug kBug = Bug::None>
int run(int m, int n, int k) {
  using Cfg = hopper_gemm::Config<kConsumers, kStages>;
  std::vector<Elem> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(n) * k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < k; ++j) a[static_cast<size_t>(i) * k + j] = element_of<Elem>(static_cast<float>(a_value(i, j)));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j) {
      const size_t at = kBNMajor ? static_cast<size_t>(j) * n + i : static_cast<size_t>(i) * k + j;
      b[at] = element_of<Elem>(static_cast<float>(b_value(i, j)));
    }
  std::vector<float> c(static_cast<size_t>(m) * n + kGuard, kSentinel);
  hopper_gemm::Maps maps;
  const std::string error =
      hopper_gemm::make_maps<Elem>(maps, a.data(), b.data(), c.data(), m, n, k, kBNMajor, Cfg::kBlockM);
  if (!error.empty()) {
    std::printf("tensor maps: %s\n", error.c_str());
    return 2;
  }
  const int k_tiles = (k + hopper_gemm::kBlockK<Elem> - 1) / hopper_gemm::kBlockK<Elem>;
  const dim3 grid((n + hopper_gemm::kBlockN - 1) / hopper_gemm::kBlockN, (m + Cfg::kBlockM - 1) / Cfg::kBlockM);
  auto kernel = hopper_gemm::gemm_kernel<Elem, kBNMajor, kConsumers, kStages, kBug>;
  cudasim::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  cudasim::launch(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, maps.a, maps.b, maps.c, k_tiles);
  int wrong = 0, shown = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      long long want = 0;
      for (int q = 0; q < k; ++q) want += a_value(i, q) * b_value(j, q);
      const float got = c[static_cast<size_t>(i) * n + j];
      if (got != static_cast<float>(want)) {
        if (shown++ < 4) std::printf("C[%d][%d] = %g, want %lld\n", i, j, got, want);
        ++wrong;
      }
    }
  }
  int guard = 0;
  for (int i = 0; i < kGuard; ++i) guard += c[static_cast<size_t>(m) * n + i] != kSentinel;
  if (wrong != 0 || guard != 0) {
    std::printf("wrong: %d of %d outputs differ; %d floats past C written\n", wrong, m * n, guard);
    return 1;
  }
  std::printf("ok: %d x %d x %d, %d x %d CTAs, %d K steps\n", m, n, k, grid.x, grid.y, k_tiles);
  return 0;
}

// CASE -> run. Shapes are small (the shim costs ~0.3 ms per m64n128k16) but take the ring
// around several times (K steps > stages) and cut M, N and K off mid-tile.
const selftest::NamedCases kCases = {
    {"bf16_k_2c", [] { return run<__nv_bfloat16, false, 2, 2>(128, 128, 128); }},
    {"bf16_k_2c_ragged", [] { return run<__nv_bfloat16, false, 2, 2>(200, 196, 328); }},
    {"f16_k_1c_ragged", [] { return run<__half, false, 1, 3>(72, 136, 136); }},
    {"bf16_mn_2c_ragged", [] { return run<__nv_bfloat16, true, 2, 2>(136, 200, 200); }},
    {"f16_mn_1c", [] { return run<__half, true, 1, 2>(64, 128, 192); }},
    {"e4m3_k_2c", [] { return run<__nv_fp8_e4m3, false, 2, 2>(128, 128, 512); }},
    {"e4m3_k_2c_ragged", [] { return run<__nv_fp8_e4m3, false, 2, 2>(200, 196, 400); }},
    {"e4m3_k_1c_ragged", [] { return run<__nv_fp8_e4m3, false, 1, 3>(72, 136, 272); }},
    {"early_release", [] { return run<__nv_bfloat16, false, 2, 2, Bug::EarlyRelease>(128, 128, 256); }},
    {"no_expect_tx", [] { return run<__nv_bfloat16, false, 2, 2, Bug::NoExpectTx>(128, 128, 256); }},
    {"no_proxy_fence", [] { return run<__nv_bfloat16, false, 2, 2, Bug::NoProxyFence>(128, 128, 256); }},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
