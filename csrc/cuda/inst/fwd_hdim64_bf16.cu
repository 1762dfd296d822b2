// One instantiation per file so nvcc compiles them in parallel (budget: traits.h).
#include "../launch_fwd.cuh"

namespace flashattn::cuda {
template void run_fwd_16bit<__nv_bfloat16, 64>(const AttnParams&, float*,
    cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda
