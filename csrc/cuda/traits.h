// Compile-time tile shapes of the CUDA kernels, and the instantiation budget.
//
// Instantiation budget (what nvcc compiles, and why)
// --------------------------------------------------
// 16-bit forward: per (head-dim tile, dtype) a kernel that may apply dropout (one m-tile per
//   warp; it also runs decoding steps, grid.h kFwdFewRows), and for tiles <= 128 one without
//   dropout that gives each warp two m-tiles (FwdTraits::kMTiles):
//   head-dim tiles {32, 64, 96, 128, 192, 256} x {fp16, bf16} = 12 + 8 = 20 kernels, one .cu per
//   (tile, dtype) in inst/. Above 128 both geometries are one, so one kernel serves both.
//   A head dim d runs on the smallest tile >= d; the columns d..tile are zero-filled by cp.async
//   (no copy), so every d <= 256 works. Six tiles keep the padding waste <= 33% for d >= 48
//   (d = 65 on the 96 tile is the worst case) while the build stays within budget.
//   Masks (causal, window, softcap, ALiBi) are runtime branches that are uniform per CTA, not
//   template flags: a mask-free tile takes the same path as non-causal attention, and only the
//   boundary tiles pay for per-element masking, so a template flag would double the build for a
//   few percent.
// 16-bit backward: per (head-dim tile, dtype) the dK/dV kernel (two variants, dK+dQ and dV only,
//   for tiles > 128), the deterministic dQ kernel and two row kernels (D_i, dQ conversion):
//   every tile of the forward, so every d <= 256 has a backward.
// fp32: SIMT kernels (no tensor cores; fp32 inputs are for accuracy, not speed), forward, dK/dV
//   and dQ, on three head-dim tiles {64, 128, 256}: each lane owns d/32 columns, so a tile
//   costs registers and loop trips, not correctness. Two .cu files (fwd, bwd) hold all six.
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

// Forward kernel for fp16/bf16 (FA2 class, see fwd_kernel.cuh). kDropout: the kernel can
// apply dropout (a runtime choice, p.dropout); without it the dropout code is compiled out.
template <int kHeadDim_, bool kDropout_>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // tile width in elements (>= the real head dim)
  static constexpr bool kDropout = kDropout_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  // Query rows per warp, in m16 tiles. Up to d = 128 a warp owns 32 rows (two m-tiles), FA2's
  // geometry: every K or V fragment a warp loads from smem then feeds two mma, so ldmatrix.x4
  // per mma falls from 0.5625 to 0.3125 at d = 128 (bench/gpu_model.py; the forward is bound by
  // shared memory, not tensor cores). Above d = 128 the O accumulator (d/2 floats per m-tile
  // per thread) leaves no registers for a second m-tile. Nor does dropout: its keep bits and
  // Philox state on top of two m-tiles spilled 168 bytes at d = 128 on sm_80 (255 registers),
  // as FA2 also drops to a smaller tile with dropout.
  static constexpr int kMTiles = kHeadDim <= 128 && !kDropout ? 2 : 1;
  static constexpr int kBlockM = kNWarps * kMmaM * kMTiles;
  // Keys per K/V tile. The S tile (kBlockN/2 floats per m-tile per thread) shrinks above
  // d = 128 to stay under 255 registers without spilling.
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;

  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;  // elements per smem row
  static constexpr int kQSmemElems = kBlockM * kSmemStride;
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;
  // Qi, one K tile and one V tile. FA2's pipeline overlaps without a second stage: V_j is
  // copied while S = Qi Kj^T is computed, K_j+1 while O += P Vj. At d = 128 that is 68 KB,
  // two CTAs per SM on A100 (a K/V ring of two stages would take 102 KB: one).
  static constexpr int kSmemBytes = (kQSmemElems + 2 * kKVTileSmemElems) * kElemBytes16;

  // CTAs per SM that sm_80's shared memory holds (at most 3), given to __launch_bounds__: the
  // register budget is then what that many CTAs can share (170 registers at 3, 255 at 2).
  // Without it ptxas picks a budget of its own and spills to reach it; registers beyond what
  // the shared memory lets CTAs use would buy no occupancy. At 3, two m-tiles per warp (twice
  // the accumulators) cannot fit, and one m-tile spilled at d = 96 (sm_80), 128 and 192
  // (sm_90), so those ask for at most 2.
  static constexpr int kMaxBlocksPerSm = kMTiles == 2 || kHeadDim >= 96 ? 2 : 3;
  static constexpr int kMinBlocksPerSm =
      kMaxSmemBytesSm80 / kSmemBytes < 1 ? 1
      : (kMaxSmemBytesSm80 / kSmemBytes > kMaxBlocksPerSm ? kMaxBlocksPerSm
                                                          : kMaxSmemBytesSm80 / kSmemBytes);

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim <= kMaxHeadDim,
                "head-dim tile must be a multiple of the mma K (16) and at most 256");
  static_assert(kBlockN % (2 * kMmaN) == 0, "K tiles are loaded 16 keys per ldmatrix.x4");
  static_assert(kSmemBytes <= kMaxSmemBytesSm80, "forward tile exceeds sm_80 shared memory");
  static_assert((kSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1,
                "row pitch must be an odd number of 16-byte chunks (bank-conflict-free)");
};

// Backward dK/dV kernel for fp16/bf16 (bwd_dkdv_kernel.cuh). Each warp owns 16 keys of Kj/Vj
// and keeps their dK_j/dV_j rows in registers (d/2 floats each per thread), so the key tile is
// kNWarps x 16 = 64 keys and the query tile shrinks as d grows to bound the S/dP registers
// (64, 32, then 16 queries above d = 128, where 32 spilled on sm_90).
// Above d = 128, dK and dV together would need > 255 registers: that tile runs two passes,
// one for dK (with dQ) and one for dV, recomputing S_ij in the second.
template <int kHeadDim_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kBlockN = kNWarps * kMmaM;
  static constexpr int kBlockM = kHeadDim <= 64 ? 64 : (kHeadDim <= 128 ? 32 : 16);
  static constexpr bool kSplitDkDv = kHeadDim > 128;
  // (Qi, dOi, LSE_i, D_i) tiles in flight: block i+1 is copied while block i is used.
  static constexpr int kStages = 2;

  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;
  static constexpr int kQTileSmemElems = kBlockM * kSmemStride;
  // dS_ij (kBlockM x kBlockN), the A operand of dQ += dS_ij Kj, padded like the other tiles.
  static constexpr int kDsSmemStride = kBlockN + kSmemPadElems;
  static constexpr int kDsSmemElems = kBlockM * kDsSmemStride;
  // Warps split dQ's kBlockM x d tile as (kBlockM / 16 row groups) x (column parts).
  static constexpr int kDqRowGroups = kBlockM / kMmaM;
  static constexpr int kDqColParts = kNWarps / kDqRowGroups;
  static constexpr int kDqColsPerWarp = kHeadDim / kDqColParts;
  // K, V; kStages x (Qi, dOi); dS; kStages x (LSE_i, D_i) in fp32.
  static constexpr int kSmem16BitElems =
      2 * kKVTileSmemElems + 2 * kStages * kQTileSmemElems + kDsSmemElems;
  static constexpr int kSmemBytes =
      kSmem16BitElems * kElemBytes16 + 2 * kStages * kBlockM * static_cast<int>(sizeof(float));

  // For __launch_bounds__, as FwdTraits::kMinBlocksPerSm, at most 2: ptxas' own budget (168
  // registers) spilled at d = 32 on sm_90.
  static constexpr int kMinBlocksPerSm = kMaxSmemBytesSm80 / kSmemBytes >= 2 ? 2 : 1;

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim <= kMaxHeadDim, "bad head-dim tile");
  static_assert(kBlockM % (2 * kMmaN) == 0, "Q tiles are loaded 16 rows per ldmatrix.x4");
  static_assert(kNWarps % kDqRowGroups == 0 && kDqColsPerWarp % (2 * kMmaN) == 0,
                "dQ columns per warp must be whole 16-column ldmatrix.x4.trans loads");
  static_assert(kSmem16BitElems * kElemBytes16 % kChunkBytes == 0, "fp32 tail must stay aligned");
  static_assert(kSmemBytes <= kMaxSmemBytesSm80, "backward tile exceeds sm_80 shared memory");
  static_assert((kDsSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1,
                "dS row pitch must be an odd number of 16-byte chunks (bank-conflict-free)");
};

// Deterministic dQ kernel (bwd_dq_kernel.cuh): the forward's loop, with dQ_i in registers where
// the forward keeps O_i and dOi in smem next to Qi. It keeps S and dP live at once, so a warp
// owns 16 query rows (one m-tile) at every d, and a two-stage K/V ring hides the copies.
template <int kHeadDim_>
struct BwdDqTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kBlockM = kNWarps * kMmaM;
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = 2;  // K/V tiles in flight
  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;
  static constexpr int kQSmemElems = kBlockM * kSmemStride;
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;
  // Qi, dOi, then kStages x (K tile, V tile).
  static constexpr int kSmemBytes =
      (2 * kQSmemElems + 2 * kStages * kKVTileSmemElems) * kElemBytes16;
  // For __launch_bounds__, as FwdTraits: ptxas' own budget (168 registers) spilled at d = 64 on
  // sm_90.
  static constexpr int kMinBlocksPerSm = kMaxSmemBytesSm80 / kSmemBytes >= 2 ? 2 : 1;
  static_assert(kSmemBytes <= kMaxSmemBytesSm80, "dQ tile exceeds sm_80 shared memory");
  static_assert(kStages >= 2, "need at least double buffering");
};

// fp32 SIMT kernels (simt_kernels.cuh): one warp per query row (forward, dQ) or per key row
// (dK/dV); a tile of 32 keys / 32 queries, one per lane, is staged in smem with rows padded by
// one float so lane-strided reads hit 32 different banks.
template <int kHeadDim_>
struct SimtTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 8;  // rows of the CTA
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kTileRows = kWarpSize;  // streamed keys (or queries), one per lane
  static constexpr int kColsPerLane = kHeadDim / kWarpSize;
  static constexpr int kSmemStride = kHeadDim + 1;  // floats
  // Forward / dQ: the CTA's query rows (Q, dO) and one key tile (K, V).
  static constexpr int kRowSmemFloats = kNWarps * kSmemStride;
  static constexpr int kTileSmemFloats = kTileRows * kSmemStride;
  static constexpr int kSmemBytes =
      (2 * kRowSmemFloats + 2 * kTileSmemFloats) * static_cast<int>(sizeof(float));
  // dK/dV: the CTA's key rows (K, V), one query tile (Q, dO) and its LSE_i, D_i.
  static constexpr int kDkdvSmemBytes =
      (2 * kRowSmemFloats + 2 * kTileSmemFloats + 2 * kTileRows) * static_cast<int>(sizeof(float));

  static_assert(kHeadDim % kWarpSize == 0 && kHeadDim <= kMaxHeadDim, "bad fp32 head-dim tile");
  static_assert(kDkdvSmemBytes <= kMaxSmemBytesSm80, "fp32 tile exceeds sm_80 shared memory");
};

// The small SIMT kernels of the backward (D_i = rowsum(dO_i * O_i) - dLSE_i; dQ fp32 -> 16-bit):
// one warp per row.
constexpr int kRowKernelWarps = 4;
constexpr int kRowKernelThreads = kRowKernelWarps * kWarpSize;

}  // namespace flashattn::cuda
