// Every backward kernel the dispatch (csrc/cuda/entry.h) can choose, compiled against the CPU
// shim: what csrc/cuda/inst/bwd_*.cu are for nvcc. A tile missing here fails the load of the
// extension with an undefined symbol.
#include "cuda/launch_bwd.cuh"
#include "cuda/launch_simt.cuh"

namespace flashattn::cuda {

#define FLASHATTN_SIM_BWD_16BIT(TILE)                                                        \
  template void run_bwd_16bit<__half, TILE>(const AttnBwdParams&, float*, cudaStream_t,      \
                                            LaunchCheck);                                    \
  template void run_bwd_16bit<__nv_bfloat16, TILE>(const AttnBwdParams&, float*, cudaStream_t, \
                                                   LaunchCheck);
FLASHATTN_SIM_BWD_16BIT(32)
FLASHATTN_SIM_BWD_16BIT(64)
FLASHATTN_SIM_BWD_16BIT(96)
FLASHATTN_SIM_BWD_16BIT(128)
FLASHATTN_SIM_BWD_16BIT(192)
FLASHATTN_SIM_BWD_16BIT(256)

template void run_bwd_simt<64>(const AttnBwdParams&, float*, cudaStream_t, LaunchCheck);
template void run_bwd_simt<128>(const AttnBwdParams&, float*, cudaStream_t, LaunchCheck);
template void run_bwd_simt<256>(const AttnBwdParams&, float*, cudaStream_t, LaunchCheck);

}  // namespace flashattn::cuda
