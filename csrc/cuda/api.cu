// TORCH_LIBRARY_IMPL(flashattn, CUDA): until the CUDA kernels land, every call validates its
// inputs with the shared checks and then raises a clear error. It never returns made-up numbers.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../attn_args.h"

namespace flashattn {
namespace {

const ExecutorLimits kCudaLimits{"CUDA", {at::kHalf, at::kBFloat16, at::kFloat}, 256};

[[noreturn]] void not_built_yet(const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "flashattn.", op,
                              ": the CUDA kernels are not built yet in this version; "
                              "move the tensors to the CPU (q.cpu()) to use the CPU kernels");
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, double softmax_scale,
                                            bool causal, int64_t window_left,
                                            int64_t window_right, double softcap,
                                            const std::optional<at::Tensor>& alibi_slopes,
                                            bool align_bottom_right, bool /*deterministic*/) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  check_and_alloc_fwd(q, k, v, mask, kCudaLimits);
  not_built_yet("fwd");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, bool align_bottom_right,
    bool /*deterministic*/) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  check_and_alloc_bwd(dout, q, k, v, out, lse, dlse, mask, kCudaLimits);
  not_built_yet("bwd");
}

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("bwd", &bwd_cuda);
}

}  // namespace flashattn
