// TORCH_LIBRARY_IMPL(flashattn, CUDA): the torch glue around the CUDA kernels. Validation and
// parameter setup are shared with every executor (attn_args.h); the choice of kernel, grid and
// launch are in headers the CPU shim compiles too (dispatch.h, launch_*.cuh). What is left
// here: device guard, current stream, launch error checks, and refusing what is not built.
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

#include "../attn_args.h"
#include "entry.h"
#include "traits.h"

namespace flashattn::cuda {
namespace {

const ExecutorLimits kCudaLimits{"CUDA", {at::kHalf, at::kBFloat16, at::kFloat}, kMaxHeadDim};

ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return ElementType::kHalf;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    case at::kFloat:
      return ElementType::kFloat;
    default:
      TORCH_CHECK(false, "flashattn: no CUDA kernels for dtype ", t);
  }
}

void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

// NotImplementedError, never a made-up result, for the kernels that are not written yet.
[[noreturn]] void not_built_yet(const char* op, at::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "flashattn.", op, ": the CUDA kernel for ", dtype,
                              " is not built yet in this version; move the tensors to the CPU "
                              "(q.cpu()) to use the CPU kernels");
}

void check_smem_fits(int64_t needed_bytes, int device) {
  int optin_bytes = 0;
  C10_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TORCH_CHECK(needed_bytes <= optin_bytes, "flashattn: this head dim needs ", needed_bytes,
              " bytes of shared memory per block, but the GPU allows ", optin_bytes);
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, double softmax_scale,
                                            bool causal, int64_t window_left,
                                            int64_t window_right, double softcap,
                                            const std::optional<at::Tensor>& alibi_slopes,
                                            bool align_bottom_right, bool /*deterministic*/) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [out, lse] = check_and_alloc_fwd(q, k, v, mask, kCudaLimits);
  const c10::cuda::CUDAGuard guard(q.device());
  const AttnParams p = make_fwd_params(q, k, v, out, lse, mask);
  const KernelChoice choice = choose_kernels(element_type(q.scalar_type()), p.head_dim);
  if (choice.head_dim_tile == 0) not_built_yet("fwd", q.scalar_type());
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) return {out, lse};
  check_smem_fits(fwd_smem_bytes(choice), q.get_device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  launch_fwd(p, choice, stream, &check_launch);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, bool align_bottom_right, bool deterministic) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [dq, dk, dv] = check_and_alloc_bwd(dout, q, k, v, out, lse, dlse, mask, kCudaLimits);
  const c10::cuda::CUDAGuard guard(q.device());
  const AttnBwdParams p =
      make_bwd_params(dout, q, k, v, out, lse, dlse, dq, dk, dv, mask, deterministic);
  const KernelChoice choice = choose_kernels(element_type(q.scalar_type()), p.head_dim);
  if (choice.head_dim_tile == 0) not_built_yet("bwd", q.scalar_type());
  if (p.batch == 0 || p.heads_q == 0) {
    // No query head reads k and v (heads_q = 0 with heads_kv > 0 is a valid GQA shape).
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  check_smem_fits(bwd_smem_bytes(choice), q.get_device());
  const at::Tensor workspace =
      at::empty({bwd_workspace_floats(p, choice)}, q.options().dtype(at::kFloat));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  launch_bwd(p, choice, workspace.data_ptr<float>(), stream, &check_launch);
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("bwd", &bwd_cuda);
}

}  // namespace flashattn::cuda

#endif  // !defined(__CUDA_ARCH__)
