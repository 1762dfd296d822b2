// One instantiation per file so nvcc compiles them in parallel (budget: traits.h).
#include "../launch_bwd.cuh"

namespace flashattn::cuda {
template void run_bwd_16bit<__nv_bfloat16, 256>(const AttnBwdParams&, float*,
    cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda
