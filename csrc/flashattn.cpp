// Registers the op schemas (schema.h): the single definition of torch.ops.flashattn.*.
//
// Implementations register per dispatch key next to their kernels (cpu/api.cpp, cuda/api.cu);
// fake (meta) kernels and autograd are registered once, in Python (flashattn/ops.py).
#include <torch/library.h>

#include <memory>

#include "schema.h"
#include "sdpa_impl.h"

namespace flashattn {
namespace {

// Installs (active) or removes flashattn's kernels as ATen's own flash-attention ops
// (sdpa_impl.h). flashattn/sdpa_impl.py calls it through torch.nn.attention's
// activate_flash_attention_impl / restore_flash_attention_impl.
void activate_sdpa_impl(bool active) {
  static std::unique_ptr<torch::Library> aten_cpu;
  if (!active) {
    aten_cpu.reset();  // the library's destructor deregisters the kernels
  } else if (aten_cpu == nullptr) {
    aten_cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                c10::DispatchKey::CPU, __FILE__, __LINE__);
    register_cpu_sdpa_impl(*aten_cpu);
  }
}

}  // namespace
}  // namespace flashattn

TORCH_LIBRARY(flashattn, m) {
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
  m.def(flashattn::kDropoutRngStateSchema, {at::Tag::nondeterministic_seeded});
  m.def(flashattn::kDropoutKeepMaskSchema);
  m.def("_activate_sdpa_impl(bool active) -> ()", &flashattn::activate_sdpa_impl);
}
