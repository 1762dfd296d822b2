// A torch extension built on the shim, as the sim build of the CUDA kernels will be: the launch
// goes through FLASHATTN_LAUNCH_KERNEL, and a SimError must reach Python as a RuntimeError.
#include <torch/extension.h>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace torch_probe {

constexpr int kThreads = 64;

// y = 2 * x, through shared memory. diverge: the two warps meet different barriers.
__global__ void double_through_smem(const float* x, float* y, int n, bool diverge) {
  FLASHATTN_DYNAMIC_SMEM(float, tile);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? 2.f * x[i] : 0.f;
  if (diverge && threadIdx.x >= 32) {
    __syncthreads();  // SITE:probe_divergent
  } else {
    __syncthreads();
  }
  const unsigned neighbour = threadIdx.x ^ 1u;
  const float mine = __shfl_xor_sync(0xffffffffu, tile[neighbour], 1);
  if (i < n) y[i] = mine;
}

torch::Tensor double_it(const torch::Tensor& x, bool diverge) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat, "x: contiguous float32");
  auto y = torch::empty_like(x);
  const int n = static_cast<int>(x.numel());
  auto kernel = &double_through_smem;
  FLASHATTN_LAUNCH_KERNEL(kernel, dim3((n + kThreads - 1) / kThreads), dim3(kThreads),
                          kThreads * sizeof(float), cudaStream_t{}, x.data_ptr<float>(),
                          y.data_ptr<float>(), n, diverge);
  return y;
}

}  // namespace torch_probe

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("double_it", &torch_probe::double_it); }
