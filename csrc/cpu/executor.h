// The CPU executor (op_glue.h): the CPU kernels behind the shared op glue. cpu/api.cpp registers
// it as torch.ops.flashattn's CPU kernels; the test-only extension (tests/cpu_test_ext) registers
// its own build of the kernels, with their counters, under another namespace.
#pragma once
#include <ATen/core/Tensor.h>

#include "../op_glue.h"
#include "kernels.h"

namespace flashattn::cpu {

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

}  // namespace flashattn::cpu
