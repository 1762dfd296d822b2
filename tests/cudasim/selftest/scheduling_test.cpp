// Execution order, built-in variables, atomics and the half-precision conversions kernels use.
//   scheduling_test order       prints the order in which the threads of a 2-block, 2-warp
//                               grid first ran, as "block:thread" pairs (CUDASIM_SCHEDULE decides)
//   scheduling_test api_order   the same after cudasim::set_schedule(reverse), which must win
//                               over CUDASIM_SCHEDULE, then again after clear_schedule()
//   scheduling_test names       parse_schedule / to_string round trips, one per line
//   scheduling_test builtins    a 3-D grid of 2-D blocks: checks threadIdx/blockIdx/blockDim/
//                               gridDim, static __shared__, atomicAdd and conversions; prints OK
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "cuda/ptx.cuh"

namespace scheduling {

constexpr int kThreads = 64, kBlocks = 2;

__global__ void record_first_run(int* counter, int* first_run) {
  first_run[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

// Spelled as FA kernels spell things: __noinline__, #pragma unroll, CUDART_INF_F.
template <int kCount>
__device__ __noinline__ float max_of(const float* values) {
  float m = -CUDART_INF_F;
#pragma unroll
  for (int i = 0; i < kCount; ++i) m = fmaxf(m, values[i]);
  return m;
}

// Each block sums its thread ids through a static __shared__ array, adds the sum to *total with
// atomicAdd(float*), and checks the built-ins against each other. Also converts through every
// f16/bf16 intrinsic listed in the shim's contract, so their host versions stay usable.
__global__ void __launch_bounds__(256, 1) builtins(float* __restrict__ total, int* __restrict__ errors) {
  __shared__ __align__(16) float partial[256];
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  partial[linear] = static_cast<float>(linear);
  __syncthreads();
  if (linear == 0) {
    float sum = 0.f;
    for (unsigned i = 0; i < blockDim.x * blockDim.y * blockDim.z; ++i) sum += partial[i];
    atomicAdd(total, sum + static_cast<float>(block));
    if (max_of<4>(partial) != 3.f) atomicAdd(errors, 1);
  }
  if (threadIdx.x >= blockDim.x || threadIdx.y >= blockDim.y || blockIdx.z >= gridDim.z) atomicAdd(errors, 1);

  const float2 f2 = make_float2(1.5f, -2.25f);
  const __half2 h2 = __float22half2_rn(f2);
  const __nv_bfloat162 b2 = __floats2bfloat162_rn(3.f, 4.f);
  const float2 back = __half22float2(__floats2half2_rn(f2.x, f2.y));
  const float2 bback = __bfloat1622float2(b2);
  const float sum = __half2float(__float2half_rn(0.5f)) + __bfloat162float(__float2bfloat16_rn(0.25f)) +
                    __low2float(h2) + __high2float(h2) + back.x + bback.y;
  const float expected = 0.5f + 0.25f + 1.5f - 2.25f + 1.5f + 4.f;
  const float math = __expf(0.f) + __fdividef(1.f, 2.f) + max(1.f, 2.f) + static_cast<float>(min(3, 4)) +
                     exp2f(1.f) + tanhf(0.f) + fmaxf(-1.f, 0.f) + flashattn::ptx::exp2_approx(2.f);
  const uint4 u = make_uint4(1, 2, 3, 4);
  const int4 i4 = make_int4(1, 2, 3, 4);
  const float4 f4 = make_float4(1.f, 2.f, 3.f, 4.f);
  if (sum != expected || math != 1.f + 0.5f + 2.f + 3.f + 2.f + 0.f + 0.f + 4.f ||
      u.w + static_cast<unsigned>(i4.z) != 7u || f4.y != 2.f) {
    atomicAdd(errors, 1);
  }
}

}  // namespace scheduling

using namespace scheduling;

int print_order() {
  int counter = 0;
  std::vector<int> first_run(kBlocks * kThreads);
  cudasim::launch(record_first_run, dim3(kBlocks), dim3(kThreads), 0, &counter, first_run.data());
  std::vector<int> order(first_run.size());
  for (size_t i = 0; i < first_run.size(); ++i) order[first_run[i]] = static_cast<int>(i);
  for (int who : order) std::printf("%d:%d ", who / kThreads, who % kThreads);
  std::printf("\n");
  return 0;
}

int check_builtins() {
  const dim3 grid(3, 2, 2), block(8, 4, 2);
  float total = 0.f;
  int errors = 0;
  cudasim::launch(builtins, grid, block, 0, &total, &errors);
  const int threads = 8 * 4 * 2, blocks = 3 * 2 * 2;
  const float expected = blocks * (threads * (threads - 1) / 2.f) + blocks * (blocks - 1) / 2.f;
  if (errors != 0 || total != expected) {
    std::printf("FAIL: %d errors, total %g, expected %g\n", errors, total, expected);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  try {
    if (mode == "order") return print_order();
    if (mode == "api_order") {
      cudasim::set_schedule(cudasim::parse_schedule("reverse"));
      print_order();
      cudasim::clear_schedule();
      return print_order();
    }
    if (mode == "names") {
      for (const char* name : {"forward", "reverse", "random:0", "random:18446744073709551615"}) {
        std::printf("%s\n", cudasim::to_string(cudasim::parse_schedule(name)).c_str());
      }
      return 0;
    }
    if (mode == "builtins") return check_builtins();
    if (mode == "sm_count") {
      // The environment's count (or the default), set_sm_count's, then the environment's again.
      std::printf("%d ", cudasim::sm_count());
      cudasim::set_sm_count(5);
      std::printf("%d ", cudasim::sm_count());
      cudasim::clear_sm_count();
      std::printf("%d\n", cudasim::sm_count());
      cudasim::set_sm_count(0);  // refused: SimError
      return 0;
    }
  } catch (const cudasim::SimError& e) {
    std::printf("SimError: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "usage: %s order|api_order|names|builtins|sm_count\n", argv[0]);
  return 64;
}
