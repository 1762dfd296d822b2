// Split-KV's merge kernel, for each element type.
#include "../split_merge_kernel.cuh"

namespace flashattn::cuda {
template void run_split_merge<__half>(const AttnParams&, const float*, cudaStream_t, LaunchCheck);
template void run_split_merge<__nv_bfloat16>(const AttnParams&, const float*,
    cudaStream_t, LaunchCheck);
template void run_split_merge<float>(const AttnParams&, const float*, cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda
