// TORCH_LIBRARY_IMPL(flashattn, CPU): the CPU executor behind the shared op glue (op_glue.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../op_glue.h"
#include "../sdpa_impl.h"
#include "executor.h"

namespace flashattn {

TORCH_LIBRARY_IMPL(flashattn, CPU, m) { register_attention_ops<cpu::CpuExecutor>(m); }

static const SdpaImplInstaller cpu_sdpa_impl(c10::DispatchKey::CPU,
                                             &register_cpu_sdpa_impl<cpu::CpuExecutor>);

}  // namespace flashattn
