// The CPU implementations of the dropout helper ops (../dropout.h): dropout_rng_state, which
// draws a call's [seed, offset] from the CPU generator, and dropout_keep_mask, which lists the
// decisions the kernels apply. CUDA's dropout_rng_state is in cuda/dropout_state.cu.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>

#include "../dropout.h"

namespace flashattn {
namespace {

// A 64-bit seed from the default CPU generator (advancing it, so torch.manual_seed reproduces
// the call), offset 0: each call has its own seed.
at::Tensor dropout_rng_state_cpu(const at::Tensor& /*like*/) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed = generator.get<at::CPUGeneratorImpl>()->random64();
  }
  at::Tensor state = at::empty({2}, at::kLong);
  state[0] = static_cast<int64_t>(seed);
  state[1] = 0;
  return state;
}

at::Tensor dropout_keep_mask_cpu(const at::Tensor& rng_state, double dropout_p, int64_t batch,
                                 int64_t heads, int64_t seqlen_q, int64_t seqlen_k) {
  TORCH_CHECK(rng_state.device().is_cpu() && rng_state.scalar_type() == at::kLong &&
                  rng_state.numel() == 2,
              "flashattn.dropout_keep_mask: rng_state must be a CPU int64 tensor of 2 elements, "
              "got ", rng_state.scalar_type(), " of shape ", rng_state.sizes(), " on ",
              rng_state.device());
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0,
              "flashattn.dropout_keep_mask: dropout_p must be in [0, 1], got ", dropout_p);
  Dropout d;
  const at::Tensor state = rng_state.contiguous();
  d.rng_state = state.data_ptr<int64_t>();
  d.threshold = static_cast<uint64_t>(std::llround(dropout_p * 4294967296.0));
  const DropoutSeed seed = dropout_seed(d);
  at::Tensor keep = at::empty({batch, heads, seqlen_q, seqlen_k}, at::kBool);
  bool* out = keep.data_ptr<bool>();
  at::parallel_for(0, batch * heads * seqlen_q, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row_index = begin; row_index < end; ++row_index) {
      const int b = static_cast<int>(row_index / (heads * seqlen_q));
      const int h = static_cast<int>(row_index / seqlen_q % heads);
      const int row = static_cast<int>(row_index % seqlen_q);
      for (int64_t key = 0; key < seqlen_k; ++key)
        out[row_index * seqlen_k + key] = dropout_keeps(d, seed, b, h, row, static_cast<int>(key));
    }
  });
  return keep;
}

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("dropout_rng_state", &dropout_rng_state_cpu);
  m.impl("dropout_keep_mask", &dropout_keep_mask_cpu);
}

}  // namespace flashattn
