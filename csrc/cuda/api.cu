// TORCH_LIBRARY_IMPL(flashattn, CUDA): the CUDA executor on a real GPU. The op glue is shared
// with every executor (op_glue.h), the rest with the CPU shim's build (executor.h); what is
// left here is what only a GPU has: device guard, current stream, the device's properties for
// the plan and the launch error check.
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

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

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

  // What the plan needs of the device (plan_fwd.h). Kernels above 48 KB of shared memory opt
  // in with cudaFuncSetAttribute (launch_*.cuh), up to the opt-in limit. (ATen's cached
  // cudaDeviceProp would need ATen/cuda/CUDAContext.h, which needs the cuSPARSE headers.)
  static DeviceProps props(const at::Tensor& q) {
    const int device = q.get_device();
    DeviceProps props;
    const std::pair<int*, cudaDeviceAttr> attributes[] = {
        {&props.cc_major, cudaDevAttrComputeCapabilityMajor},
        {&props.cc_minor, cudaDevAttrComputeCapabilityMinor},
        {&props.sm_count, cudaDevAttrMultiProcessorCount},
        {&props.smem_optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin}};
    for (const auto& [value, attribute] : attributes) {
      C10_CUDA_CHECK(cudaDeviceGetAttribute(value, attribute, device));
    }
    props.hopper_fwd = hopper_opt_in();
    return props;
  }

  // FLASHATTN_CUDA_HOPPER (plan_fwd_sm90.h), read once per process. A bad value is an error on
  // every call, never read as on or off.
  static bool hopper_opt_in() {
    static const char* const raw = std::getenv(kHopperOptInVariable);
    static const std::string value = raw ? raw : "";  // getenv's pointer may not last
    static const std::optional<bool> opted_in = parse_hopper_opt_in(value.c_str());
    TORCH_CHECK_VALUE(opted_in.has_value(), hopper_opt_in_error(value.c_str()));
    return *opted_in;
  }

  static void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) { register_attention_ops<CudaExecutor<Gpu>>(m); }

static const SdpaImplInstaller cuda_sdpa_impl(c10::DispatchKey::CUDA,
                                              &register_cuda_sdpa_impl<CudaExecutor<Gpu>>);

}  // namespace flashattn::cuda

#endif  // !defined(__CUDA_ARCH__)
