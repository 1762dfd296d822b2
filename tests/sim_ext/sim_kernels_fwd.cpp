// Every forward kernel the dispatch (csrc/cuda/entry.h) can choose, compiled against the CPU
// shim: what csrc/cuda/inst/fwd_*.cu are for nvcc. A tile missing here fails the load of the
// extension with an undefined symbol.
#include "cuda/launch_fwd.cuh"
#include "cuda/kv_append_kernel.cuh"
#include "cuda/launch_simt.cuh"
#include "cuda/split_merge_kernel.cuh"

namespace flashattn::cuda {

#define FLASHATTN_SIM_FWD_16BIT(TILE)                                                      \
  template void run_fwd_16bit<__half, TILE>(const AttnParams&, float*, cudaStream_t, LaunchCheck); \
  template void run_fwd_16bit<__nv_bfloat16, TILE>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
FLASHATTN_SIM_FWD_16BIT(32)
FLASHATTN_SIM_FWD_16BIT(64)
FLASHATTN_SIM_FWD_16BIT(96)
FLASHATTN_SIM_FWD_16BIT(128)
FLASHATTN_SIM_FWD_16BIT(192)
FLASHATTN_SIM_FWD_16BIT(256)

template void run_fwd_simt<64>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
template void run_fwd_simt<128>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
template void run_fwd_simt<256>(const AttnParams&, float*, cudaStream_t, LaunchCheck);

template void run_split_merge<__half>(const AttnParams&, const float*, cudaStream_t, LaunchCheck);
template void run_split_merge<__nv_bfloat16>(const AttnParams&, const float*,
    cudaStream_t, LaunchCheck);
template void run_split_merge<float>(const AttnParams&, const float*, cudaStream_t, LaunchCheck);

template void run_kv_append<__half>(const KvAppendParams&, cudaStream_t, LaunchCheck);
template void run_kv_append<__nv_bfloat16>(const KvAppendParams&, cudaStream_t, LaunchCheck);
template void run_kv_append<float>(const KvAppendParams&, cudaStream_t, LaunchCheck);

}  // namespace flashattn::cuda
