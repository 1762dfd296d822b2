// TORCH_LIBRARY_IMPL(flashattn, CPU): the CPU executor behind the shared op glue (op_glue.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../op_glue.h"
#include "../sdpa_impl.h"
#include "kernels.h"

namespace flashattn {
namespace {

struct CpuExecutor {
  static const ExecutorLimits& limits() {
    static const ExecutorLimits cpu_limits{
        "CPU", {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}, -1,
        /*reads_lengths_on_host=*/true};
    return cpu_limits;
  }
  static void run_fwd(const at::Tensor& q, const AttnParams& p) {
    cpu::run_fwd(p, q.scalar_type());
  }
  static void run_bwd(const at::Tensor& q, const AttnBwdParams& p, at::Tensor& /*dk*/,
                      at::Tensor& /*dv*/) {
    cpu::run_bwd(p, q.scalar_type());
  }
  static void run_kv_append(const at::Tensor& q, const KvAppendParams& p) {
    cpu::run_kv_append(p, q.scalar_type());
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CPU, m) { register_attention_ops<CpuExecutor>(m); }

static const SdpaImplInstaller cpu_sdpa_impl(c10::DispatchKey::CPU,
                                             &register_cpu_sdpa_impl<CpuExecutor>);

}  // namespace flashattn
