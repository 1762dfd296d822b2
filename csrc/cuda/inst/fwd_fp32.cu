// The fp32 SIMT forward on every fp32 head-dim tile (SimtHeadDimTiles in dispatch.h); small
// kernels, so one file holds all three (budget: traits.h).
#include "../launch_simt.cuh"

namespace flashattn::cuda {
template void run_fwd_simt<64>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
template void run_fwd_simt<128>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
template void run_fwd_simt<256>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda
