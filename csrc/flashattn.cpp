// Registers the op schemas (schema.h): the single definition of torch.ops.flashattn.*.
//
// Implementations register per dispatch key next to their kernels (cpu/api.cpp, cuda/api.cu);
// autograd once for every device (autograd.cpp); fake (meta) kernels in Python (flashattn/_ops.py).
#include <torch/library.h>

#include <memory>
#include <vector>

#include "schema.h"
#include "sdpa_impl.h"

namespace flashattn {
namespace {

std::vector<SdpaImplInstaller>& sdpa_impl_installers() {
  static std::vector<SdpaImplInstaller> installers;
  return installers;
}

// Installs (active) or removes flashattn's kernels as ATen's own flash-attention ops
// (sdpa_impl.h), for every executor this build has. flashattn/_sdpa_impl.py calls it through
// torch.nn.attention's activate_flash_attention_impl / restore_flash_attention_impl.
void activate_sdpa_impl(bool active) {
  static std::vector<std::unique_ptr<torch::Library>> aten_impls;
  if (!active) {
    aten_impls.clear();  // each library's destructor deregisters its kernels
  } else if (aten_impls.empty()) {
    for (const SdpaImplInstaller& installer : sdpa_impl_installers()) {
      aten_impls.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                            installer.key, __FILE__, __LINE__));
      installer.register_fn(*aten_impls.back());
    }
  }
}

}  // namespace

SdpaImplInstaller::SdpaImplInstaller(c10::DispatchKey key, SdpaImplRegisterFn register_fn)
    : key(key), register_fn(register_fn) {
  sdpa_impl_installers().push_back(*this);
}

}  // namespace flashattn

TORCH_LIBRARY(flashattn, m) {
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
  m.def(flashattn::kFwdKvcacheSchema);
  m.def(flashattn::kDropoutRngStateSchema, {at::Tag::nondeterministic_seeded});
  m.def(flashattn::kDropoutKeepMaskSchema);
  m.def("_activate_sdpa_impl(bool active) -> ()", &flashattn::activate_sdpa_impl);
}
