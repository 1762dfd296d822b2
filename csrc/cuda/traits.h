// Compile-time tile shapes of the CUDA kernels, and the instantiation budget.
//
// Instantiation budget (what nvcc compiles, and why)
// --------------------------------------------------
// 16-bit forward: one kernel per (head-dim tile, dtype):
//   head-dim tiles {32, 64, 96, 128, 192, 256} x {fp16, bf16} = 12 kernels, one .cu each in inst/.
//   A head dim d runs on the smallest tile >= d; the columns d..tile are zero-filled by cp.async
//   (no copy), so every d <= 256 works. Six tiles keep the padding waste <= 33% for d >= 48
//   (d = 65 on the 96 tile is the worst case) while the build stays within budget.
//   Masks (causal, window, softcap, ALiBi) are runtime branches that are uniform per CTA, not
//   template flags: a mask-free tile takes the same path as non-causal attention, and only the
//   boundary tiles pay for per-element masking, so a template flag would double the build for a
//   few percent.
//   The 16-bit backward and the fp32 kernels are not built yet (api.cu says so at run time).
#pragma once

namespace flashattn::cuda {

constexpr int kWarpSize = 32;
// mma.sync.m16n8k16: a warp multiplies a 16x16 A tile by a 16x8 B tile.
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
// One cp.async / one ldmatrix row moves 16 bytes = 8 16-bit elements.
constexpr int kChunkBytes = 16;
constexpr int kElemBytes16 = 2;
constexpr int kChunkElems = kChunkBytes / kElemBytes16;
// Shared-memory rows are padded by one 16-byte chunk. For every tile width below, the row
// pitch is then an odd multiple of 16 bytes modulo 128, so the 8 row addresses of one ldmatrix
// phase (8 rows x 16 bytes) hit 8 disjoint groups of 4 banks: conflict-free without a swizzle.
constexpr int kSmemPadElems = kChunkElems;
// Opt-in dynamic shared memory per block on sm_80 (163 KB) and sm_90 (227 KB); we stay under
// the smaller one so one binary runs on both.
constexpr int kMaxSmemBytesSm80 = 163 * 1024;
// Above this a launch must first raise cudaFuncAttributeMaxDynamicSharedMemorySize.
constexpr int kDefaultSmemBytes = 48 * 1024;

// The largest head dim any CUDA kernel accepts.
constexpr int kMaxHeadDim = 256;

// Forward kernel for fp16/bf16 (FA2 class, see fwd_kernel.cuh).
template <int kHeadDim_>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // tile width in elements (>= the real head dim)
  // Four warps, each owning 16 query rows: Q tile 64 x d, as FA2 uses for these head dims.
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kBlockM = kNWarps * kMmaM;
  // Keys per K/V tile. The O accumulator grows with d (d/2 floats per thread), so the S tile
  // shrinks for d > 128 to stay under 255 registers without spilling.
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  // K/V tiles in flight: tile j+1 is copied while tile j is multiplied.
  static constexpr int kStages = 2;

  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;  // elements per smem row
  static constexpr int kQSmemElems = kBlockM * kSmemStride;
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;
  // Q, then kStages x (K tile, V tile).
  static constexpr int kSmemBytes =
      (kQSmemElems + 2 * kStages * kKVTileSmemElems) * kElemBytes16;

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim <= kMaxHeadDim,
                "head-dim tile must be a multiple of the mma K (16) and at most 256");
  static_assert(kBlockN % (2 * kMmaN) == 0, "K tiles are loaded 16 keys per ldmatrix.x4");
  static_assert(kSmemBytes <= kMaxSmemBytesSm80, "forward tile exceeds sm_80 shared memory");
  static_assert((kSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1,
                "row pitch must be an odd number of 16-byte chunks (bank-conflict-free)");
  static_assert(kStages >= 2, "need at least double buffering");
};

}  // namespace flashattn::cuda
