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
  // No FP8 forward here (fp8_forward is false: check_fp8_fwd refuses float8_e4m3fn inputs and
  // descales before this runs), so the descales are always empty.
  static void run_fwd(const at::Tensor& q, const AttnParams& p, const Fp8Descales& /*fp8*/) {
    cpu::run_fwd(p, q.scalar_type());
  }
  // Nothing of its own to refuse: every call that passed the shared checks runs here.
  static void check_fwd_runs(const at::Tensor& /*q*/, const AttnParams& /*p*/) {}
  static void run_bwd(const at::Tensor& q, const AttnBwdParams& p, at::Tensor& /*dk*/,
                      at::Tensor& /*dv*/) {
    cpu::run_bwd(p, q.scalar_type());
  }
  static void run_kv_append(const at::Tensor& q, const KvAppendParams& p) {
    cpu::run_kv_append(p, q.scalar_type());
  }
};

}  // namespace flashattn::cpu
