// The GPU side of tests/cudasim/hopper_gemm.py: selftest/hopper_gemm_kernel.cuh built with
// -gencode arch=compute_90a,code=sm_90a into a shared library that the script loads with ctypes,
// so that it runs on torch's tensors and stream, and is timed with CUDA events beside torch.mm in
// the same process.
//
//   int hopper_gemm_run(int dtype, int b_n_major, int config, const void* a, const void* b,
//                       float* c, int m, int n, int k, void* stream, char* error, int error_len)
//
// dtype: 0 for bf16 inputs, 1 for f16, 2 for e4m3 (B N x K only). b_n_major: B is K x N (N
// contiguous), else N x K.
// config: 0 = two consumer warpgroups and 4 stages (the fast one), 1 = two consumers and 2
// stages, 2 = one consumer and 2 stages. Returns 0, or -1 with the reason in `error`.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "hopper_gemm_kernel.cuh"

namespace {

template <typename Elem, bool kBNMajor, int kConsumers, int kStages>
std::string launch(const void* a, const void* b, float* c, int m, int n, int k, cudaStream_t stream) {
  using Cfg = hopper_gemm::Config<kConsumers, kStages>;
  hopper_gemm::Maps maps;
  std::string error = hopper_gemm::make_maps<Elem>(maps, a, b, c, m, n, k, kBNMajor, Cfg::kBlockM);
  if (!error.empty()) return "tensor maps: " + error;
  auto kernel = hopper_gemm::gemm_kernel<Elem, kBNMajor, kConsumers, kStages>;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(Cfg::kSmemBytes));
  if (status != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(status);
  const int k_tiles = (k + hopper_gemm::kBlockK<Elem> - 1) / hopper_gemm::kBlockK<Elem>;
  const dim3 grid((n + hopper_gemm::kBlockN - 1) / hopper_gemm::kBlockN, (m + Cfg::kBlockM - 1) / Cfg::kBlockM);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps.a, maps.b, maps.c, k_tiles);
  status = cudaGetLastError();
  if (status != cudaSuccess) return std::string("launch: ") + cudaGetErrorString(status);
  return "";
}

template <typename Elem, bool kBNMajor>
std::string by_config(int config, const void* a, const void* b, float* c, int m, int n, int k,
                      cudaStream_t stream) {
  switch (config) {
    case 0: return launch<Elem, kBNMajor, 2, 4>(a, b, c, m, n, k, stream);
    case 1: return launch<Elem, kBNMajor, 2, 2>(a, b, c, m, n, k, stream);
    case 2: return launch<Elem, kBNMajor, 1, 2>(a, b, c, m, n, k, stream);
    default: return "config " + std::to_string(config) + " is not 0, 1 or 2";
  }
}

}  // namespace

extern "C" int hopper_gemm_run(int dtype, int b_n_major, int config, const void* a, const void* b,
                               float* c, int m, int n, int k, void* stream, char* error,
                               int error_len) {
  const auto s = static_cast<cudaStream_t>(stream);
  std::string why;
  if (k % 8 != 0 || n % 8 != 0) {
    why = "K and N must be multiples of 8 (16-byte tensor-map strides)";
  } else if (dtype == 2) {
    if (b_n_major) {
      why = "e4m3: B must be N x K (8-bit wgmma operands are K-major only)";
    } else if (k % 16 != 0) {
      why = "e4m3: K must be a multiple of 16 (16-byte tensor-map strides)";
    } else {
      why = by_config<__nv_fp8_e4m3, false>(config, a, b, c, m, n, k, s);
    }
  } else if (dtype == 1) {
    why = b_n_major ? by_config<__half, true>(config, a, b, c, m, n, k, s)
                    : by_config<__half, false>(config, a, b, c, m, n, k, s);
  } else {
    why = b_n_major ? by_config<__nv_bfloat16, true>(config, a, b, c, m, n, k, s)
                    : by_config<__nv_bfloat16, false>(config, a, b, c, m, n, k, s);
  }
  if (why.empty()) return 0;
  if (error != nullptr && error_len > 0) std::snprintf(error, static_cast<size_t>(error_len), "%s", why.c_str());
  return -1;
}
