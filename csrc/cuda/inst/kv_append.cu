// flash_attn_with_kvcache's append and rotary kernel, for each element type.
#include "../kv_append_kernel.cuh"

namespace flashattn::cuda {
template void run_kv_append<__half>(const KvAppendParams&, cudaStream_t, LaunchCheck);
template void run_kv_append<__nv_bfloat16>(const KvAppendParams&, cudaStream_t, LaunchCheck);
template void run_kv_append<float>(const KvAppendParams&, cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda
