// Which kernel runs for an input, written once for api.cu and for the CPU-shim test
// extension.
#pragma once
#include "../params.h"
#include "dispatch.h"
#include "grid.h"
#include "kernels.h"
#include "traits.h"

namespace flashattn::cuda {

// Dynamic shared memory the forward kernel for (type, head_dim) needs; 0 when none is built.
inline int fwd_smem_bytes(ElementType type, int head_dim) {
  int bytes = 0;
  dispatch_16bit(type, [&](auto) {
    dispatch_head_dim(CompiledHeadDimTiles{}, head_dim, [&](auto tile) {
      bytes = FwdTraits<decltype(tile)::value>::kSmemBytes;
    });
  });
  return bytes;
}

// Launches the forward kernel for p on `stream`; returns false (and launches nothing) when no
// kernel is built for this element type / head dim. p must have batch, heads and seqlen_q > 0.
inline bool launch_fwd(const AttnParams& p, ElementType type, cudaStream_t stream,
                       LaunchCheck after_launch) {
  bool launched = false;
  dispatch_16bit(type, [&](auto element) {
    using Element = decltype(element);
    launched = dispatch_head_dim(CompiledHeadDimTiles{}, p.head_dim, [&](auto tile) {
      run_fwd_16bit<Element, decltype(tile)::value>(p, stream, after_launch);
    });
  });
  return launched;
}

}  // namespace flashattn::cuda
