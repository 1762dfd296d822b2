// CUDA's dropout_rng_state (../dropout.h): a call's [seed, offset] from the CUDA generator's
// philox state, unpacked on the device by a one-thread kernel, so that a call captured into a
// CUDA graph reads the offset each replay advances instead of a value frozen at capture.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <mutex>
#include <tuple>

namespace flashattn::cuda {

// Philox offsets the generator is advanced by per call: dropout.h keys Philox with
// seed + offset, so any positive increment gives each call its own key; 4 is the generator's
// granularity.
constexpr uint64_t kOffsetIncrement = 4;

__global__ void unpack_rng_state(at::PhiloxCudaState state, int64_t* seed_offset) {
  const auto [seed, offset] = at::cuda::philox::unpack(state);
  seed_offset[0] = static_cast<int64_t>(seed);
  seed_offset[1] = static_cast<int64_t>(offset);
}

at::Tensor dropout_rng_state_cuda(const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  auto* generator = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(like.get_device()));
  at::PhiloxCudaState state;
  {
    std::lock_guard<std::mutex> lock(generator->mutex_);
    state = generator->philox_cuda_state(kOffsetIncrement);
  }
  at::Tensor seed_offset = at::empty({2}, like.options().dtype(at::kLong));
  unpack_rng_state<<<1, 1, 0, c10::cuda::getCurrentCUDAStream(like.get_device()).stream()>>>(
      state, seed_offset.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return seed_offset;
}

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) { m.impl("dropout_rng_state", &dropout_rng_state_cuda); }

}  // namespace flashattn::cuda
