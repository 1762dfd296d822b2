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

// The head-dim tile the backward runs on for (type, head_dim); 0 when none is built.
inline int bwd_head_dim_tile(ElementType type, int head_dim) {
  int tile = 0;
  dispatch_16bit(type, [&](auto) {
    dispatch_head_dim(CompiledHeadDimTiles{}, head_dim,
                      [&](auto t) { tile = decltype(t)::value; });
  });
  return tile;
}

// Dynamic shared memory of the largest backward kernel on that tile.
inline int bwd_smem_bytes(int head_dim_tile) {
  int bytes = 0;
  dispatch_head_dim(CompiledHeadDimTiles{}, head_dim_tile, [&](auto t) {
    constexpr int kTile = decltype(t)::value;
    bytes = BwdTraits<kTile>::kSmemBytes > BwdDqTraits<kTile>::kSmemBytes
                ? BwdTraits<kTile>::kSmemBytes
                : BwdDqTraits<kTile>::kSmemBytes;
  });
  return bytes;
}

// fp32 scratch of the backward, in floats: D_i [B, Hq, Sq], then (unless deterministic) the
// dQ accumulator [B, Hq, Sq, head_dim_tile].
inline int64_t bwd_workspace_floats(const AttnBwdParams& p, int head_dim_tile) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
  return rows * (1 + (p.deterministic ? 0 : head_dim_tile));
}

// Launches the backward for p; returns false (and launches nothing) when no kernel is built
// for this element type / head dim. workspace: bwd_workspace_floats(p, tile) floats.
inline bool launch_bwd(const AttnBwdParams& p, ElementType type, float* workspace,
                       cudaStream_t stream, LaunchCheck after_launch) {
  bool launched = false;
  dispatch_16bit(type, [&](auto element) {
    using Element = decltype(element);
    launched = dispatch_head_dim(CompiledHeadDimTiles{}, p.head_dim, [&](auto tile) {
      run_bwd_16bit<Element, decltype(tile)::value>(p, workspace, stream, after_launch);
    });
  });
  return launched;
}

}  // namespace flashattn::cuda
