// Registers the op schemas (schema.h): the single definition of torch.ops.flashattn.*.
//
// Implementations register per dispatch key next to their kernels (cpu/api.cpp, cuda/api.cu);
// fake (meta) kernels and autograd are registered once, in Python (flashattn/ops.py).
#include <torch/library.h>

#include "schema.h"

TORCH_LIBRARY(flashattn, m) {
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
}
