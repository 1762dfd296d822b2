// torch.ops.flashattn_sim: the CUDA kernels' own source, compiled by g++ against the CPU shim
// (tests/cudasim), behind the same schemas, input checks, parameter setup, dispatch, grid and
// launch code as torch.ops.flashattn on CUDA. Tensors are CPU tensors and the kernels' "device"
// pointers are host pointers. Test-only; see build.py. The kernels themselves are instantiated
// in sim_kernels_fwd.cpp / sim_kernels_bwd.cpp, as inst/*.cu are for nvcc.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "attn_args.h"
#include "schema.h"
#include "cuda/entry.h"
#include "cudasim.h"

namespace flashattn::cuda {
namespace {

// The same limits as the CUDA executor (api.cu), under a name that says where it ran.
const ExecutorLimits kSimLimits{"CUDA (cudasim)", {at::kHalf, at::kBFloat16, at::kFloat},
                                kMaxHeadDim};

ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return ElementType::kHalf;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    case at::kFloat:
      return ElementType::kFloat;
    default:
      TORCH_CHECK(false, "flashattn_sim: no kernels for dtype ", t);
  }
}

// The shim throws cudasim::SimError on any launch error; there is nothing left to check.
void no_launch_check() {}

[[noreturn]] void not_built_yet(const char* op, at::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "flashattn_sim.", op, ": the CUDA kernel for ", dtype,
                              " is not built yet");
}

std::tuple<at::Tensor, at::Tensor> fwd_sim(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double softmax_scale, bool causal,
                                           int64_t window_left, int64_t window_right,
                                           double softcap,
                                           const std::optional<at::Tensor>& alibi_slopes,
                                           bool align_bottom_right, bool /*deterministic*/) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [out, lse] = check_and_alloc_fwd(q, k, v, mask, kSimLimits);
  const AttnParams p = make_fwd_params(q, k, v, out, lse, mask);
  const KernelChoice choice = choose_kernels(element_type(q.scalar_type()), p.head_dim);
  if (choice.head_dim_tile == 0) not_built_yet("fwd", q.scalar_type());
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) return {out, lse};
  launch_fwd(p, choice, /*stream=*/nullptr, &no_launch_check);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_sim(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, bool align_bottom_right, bool deterministic) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [dq, dk, dv] = check_and_alloc_bwd(dout, q, k, v, out, lse, dlse, mask, kSimLimits);
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
  at::Tensor workspace =
      at::empty({bwd_workspace_floats(p, choice)}, q.options().dtype(at::kFloat));
  // The kernels must not depend on the scratch's initial contents: poison it too.
  poison_if_debugging(workspace);
  launch_bwd(p, choice, workspace.data_ptr<float>(), /*stream=*/nullptr, &no_launch_check);
  return {dq, dk, dv};
}

// "forward", "reverse" or "random:SEED": the order warps run in between barriers.
void set_schedule(const std::string& schedule) {
  ::cudasim::set_schedule(::cudasim::parse_schedule(schedule));
}

}  // namespace
}  // namespace flashattn::cuda

// The same schema strings as torch.ops.flashattn (csrc/schema.h), plus the shim's schedule
// switch.
TORCH_LIBRARY(flashattn_sim, m) {
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
  m.def("set_schedule(str schedule) -> ()", &flashattn::cuda::set_schedule);
}

TORCH_LIBRARY_IMPL(flashattn_sim, CPU, m) {
  m.impl("fwd", &flashattn::cuda::fwd_sim);
  m.impl("bwd", &flashattn::cuda::bwd_sim);
}
