// TORCH_LIBRARY_IMPL(flashattn, CUDA): the CUDA executor on a real GPU. The op glue is shared
// with every executor (op_glue.h), the rest with the CPU shim's build (executor.h); what is
// left here is what only a GPU has: device guard, current stream, the shared-memory limit of
// the device and the launch error check.
//
// This file holds no device code: the kernels are compiled in inst/*.cu. Skipping it in
// nvcc's device passes (one per architecture) spares them from parsing ATen, which was most
// of the CUDA build time.
#if !defined(__CUDA_ARCH__)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_glue.h"
#include "../sdpa_impl.h"
#include "executor.h"

namespace flashattn::cuda {
namespace {

struct Gpu {
  static constexpr const char* kExecutorName = "CUDA";
  using Guard = c10::cuda::CUDAGuard;

  static cudaStream_t stream(const at::Tensor& q) {
    return c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  }

  // Kernels above 48 KB opt in with cudaFuncSetAttribute (launch_*.cuh); the opt-in limit
  // differs by GPU (e.g. 99 KB on sm_86/89, 227 KB on sm_90).
  static void check_smem_fits(int64_t needed_bytes, const at::Tensor& q) {
    int optin_bytes = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                          q.get_device()));
    TORCH_CHECK(needed_bytes <= optin_bytes, "flashattn: this head dim needs ", needed_bytes,
                " bytes of shared memory per block, but the GPU allows ", optin_bytes);
  }

  static void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

  // The split-KV heuristic fills the SMs (entry.h, choose_num_splits).
  static int sm_count(const at::Tensor& q) {
    int count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, q.get_device()));
    return count;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) { register_attention_ops<CudaExecutor<Gpu>>(m); }

static const SdpaImplInstaller cuda_sdpa_impl(c10::DispatchKey::CUDA,
                                              &register_cuda_sdpa_impl<CudaExecutor<Gpu>>);

}  // namespace flashattn::cuda

#endif  // !defined(__CUDA_ARCH__)
