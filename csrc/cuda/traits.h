// Compile-time tile shapes of the CUDA kernels, and the instantiation budget.
//
// Which kernels are compiled is one list, csrc/cuda/kernel_list.py: a new head-dim tile is one
// number there (HEAD_DIMS_16BIT or HEAD_DIMS_SIMT), a tile shape here if the formulas below do
// not suit it, then `python csrc/cuda/generate_kernels.py`, which writes inst/*.cu, the shim's
// instantiations and kernel_list.h (dispatch.h's tiles). tests/test_kernel_list.py checks that
// this file, dispatch.h and tools/gpu_model.py agree with the list.
//
// Instantiation budget (what nvcc compiles, and why)
// --------------------------------------------------
// 16-bit forward: per (head-dim tile, dtype) a kernel that may apply dropout (one m-tile per
//   warp; it also runs decoding steps, plan_fwd.h kFwdFewRows), and for tiles <= 128 one without
//   dropout that gives each warp two m-tiles (FwdTraits::kMTiles):
//   head-dim tiles {32, 64, 96, 128, 192, 256} x {fp16, bf16} = 12 + 8 = 20 kernels, one .cu per
//   (tile, dtype) in inst/, generated from kernel_list.py. Above 128 both geometries are one,
//   so one kernel serves both.
//   A head dim d runs on the smallest tile >= d; the columns d..tile are zero-filled by cp.async
//   (no copy), so every d <= 256 works. Six tiles keep the padding waste <= 33% for d >= 48
//   (d = 65 on the 96 tile is the worst case) while the build stays within budget.
//   Above them, forward only, MLA's 576 tile (q, k 576; v 512: kHeadDimV), one m-tile, 8 warps
//   (two per m-tile, each half of O's columns), 32 keys per tile, one stage: 142 KB of shared
//   memory, 244 registers on sm_80 (253 on sm_90), no spills; it runs every head dim from 257
//   to 512 too (Q and K padded to 576: 12% more of S's products at d = 512), one file per dtype,
//   2 kernels, a few seconds of nvcc each (docs/lab/2026-12-02-cuda-head-dim-512.md).
//   Tiles are keyed by (q's and k's width, v's width) pairs (kernel_list.py): besides the equal
//   pairs and 576 / 512, MLA's (192, 128) of DeepSeek's prefill and training, one m-tile, 64 keys
//   per tile: on the (192, 192) tile a third of P V's products and of V's ldmatrix were padding.
//   One file per dtype, 2 kernels (docs/lab/2026-12-03-mla-pair-tiles.md). And (128, 64), one
//   m-tile (its only kernel), 64 keys per tile: on the (128, 128) tile's one-m-tile kernel a
//   quarter of the mma and a fifth of the ldmatrix were V's padding.
//   Masks (causal, window, softcap, ALiBi) are runtime branches that are uniform per CTA, not
//   template flags: a mask-free tile takes the same path as non-causal attention, and only the
//   boundary tiles pay for per-element masking, so a template flag would double the build for a
//   few percent.
// 16-bit backward: per (head-dim tile, dtype) the dK/dV kernel (which also adds dQ by atomics),
//   the deterministic dQ kernel and two row kernels (D_i, dQ conversion): every tile of the
//   forward up to 256, so every d <= 256 has a backward (above: kMaxHeadDimBwd).
// fp32: SIMT kernels (no tensor cores; fp32 inputs are for accuracy, not speed), forward, dK/dV
//   and dQ, on three head-dim tiles {64, 128, 256}: each lane owns d/32 columns, so a tile
//   costs registers and loop trips, not correctness. Two .cu files (fwd, bwd) hold all six.
// sm_90a (csrc/cuda/hopper/, kernel_list.py HEAD_DIMS_SM90 and HEAD_DIMS_SM90_FWD): one file
//   per (d, dtype), compiled for sm_90a alone (one device pass): the forward at d in
//   {64, 128, 256}, the backward at d in {64, 128}; each file holds one main loop per mask and
//   feature combination it builds (kernel_list.py lists them, .ci/cuda_gates.py
//   FWD_SM90_MAIN_LOOPS counts the forward's); at d = 128 the backward's three attn_mask loops
//   with softcap have a file of their own per dtype (beside the others ptxas spilled them). What
//   is not built runs on the kernels above (plan_fwd_sm90.h, plan_bwd_sm90.h).
#pragma once
#include <cstdint>
#include <type_traits>

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
// The GPU architectures a plan chooses kernels for (plan_fwd.h). kSm80: mma.sync, cp.async and
// ldmatrix, every kernel below, which runs as built on sm_90 too. kSm90: a compute capability
// 9.x device (its shared memory), and the Hopper kernels (wgmma, TMA) that a plan moves to
// behind FLASHATTN_CUDA_HOPPER=1 (plan_fwd_sm90.h, plan_bwd_sm90.h).
enum class Arch { kSm80, kSm90 };
// Opt-in dynamic shared memory per block: 163 KB on sm_80, 227 KB on sm_90. The kernels below
// are Sm80's, so they fit sm_80's and one binary runs on both.
constexpr int max_smem_bytes(Arch arch) { return arch == Arch::kSm90 ? 227 * 1024 : 163 * 1024; }
// Above this a launch must first raise cudaFuncAttributeMaxDynamicSharedMemorySize.
constexpr int kDefaultSmemBytes = 48 * 1024;

// The largest head dims the CUDA kernels accept. The 16-bit forward's widest tile is MLA's
// absorbed decode, q and k 576 wide, v 512 (FwdTraits, kHeadDimV), so it also serves every equal
// head dim up to 512. The backward and the fp32 SIMT kernels stop at 256: a dK/dV tile at 512
// would hold 256 fp32 accumulators per thread, past the 255 registers, and its K, V, Q, dO tiles
// alone 266 KB of shared memory (docs/lab/2026-12-02-cuda-head-dim-512.md).
constexpr int kMaxHeadDim = 576;
constexpr int kMaxHeadDimV = 512;
constexpr int kMaxHeadDimBwd = 256;
constexpr int kMaxHeadDimSimt = 256;

// V's width of a forward tile named by its q width alone, FwdTraits<kHeadDim, *> below: the
// tile's own, and 512 on MLA's 576 tile (q and k 576 wide, v 512), which also takes every equal
// head dim up to 512 (its last 64 columns of Q and K then zeros). kernel_list.py's
// named_head_dim_v says the same.
constexpr int named_head_dim_v(int head_dim) { return head_dim == 576 ? 512 : head_dim; }

// Forward kernel for fp16/bf16 (FA2 class, see fwd_kernel.cuh) on the head-dim tile (kHeadDim,
// kHeadDimV): Q and K kHeadDim wide, V and O kHeadDimV (MLA's pairs, kernel_list.py). kDropout:
// the kernel can apply dropout (a runtime choice, p.dropout); without it the dropout code is
// compiled out. Kernels take it as FwdTile below.
template <int kHeadDim_, int kHeadDimV_, bool kDropout_>
struct FwdPairTraits {
  static constexpr int kHeadDim = kHeadDim_;  // tile width in elements (>= the real head dim)
  static constexpr Arch kArch = Arch::kSm80;  // whose shared memory the tile must fit
  static constexpr int kMaxSmemBytes = max_smem_bytes(kArch);
  static constexpr bool kDropout = kDropout_;
  // V's and O's width (>= the real head_dim_v).
  static constexpr int kHeadDimV = kHeadDimV_;
  // Warps that share a 16-row m-tile, each owning kHeadDimV / kVColGroups of O's columns: above
  // d = 256 one warp's O accumulator (kHeadDimV / 2 floats per thread) would pass the 255
  // registers, so two warps split it, each computing the same S = Qi Kj^T (the same softmax
  // statistics, bit for bit) and multiplying P by its half of Vj.
  static constexpr int kVColGroups = kHeadDimV > 256 ? 2 : 1;
  static constexpr int kRowWarps = 4;  // warps along the query rows
  static constexpr int kNWarps = kRowWarps * kVColGroups;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kOCols = kHeadDimV / kVColGroups;  // O's columns per warp
  // Query rows per warp, in m16 tiles. Up to d = 128 a warp owns two (FA2's geometry), so each
  // K or V fragment it loads from smem feeds two mma: the forward is bound by shared memory,
  // not tensor cores. Above d = 128 the O accumulator leaves no registers for a second m-tile,
  // nor does dropout's state (it spilled; FA2 also shrinks its tile with dropout). The two-m-tile
  // kernel assumes equal head dims (fwd_kernel.cuh, v_cols), so an unequal pair's tile ((128, 64))
  // has one geometry, one m-tile, as above d = 128 (plan_fwd.h, with_fwd_traits).
  static constexpr int kMTiles = kHeadDim <= 128 && kHeadDimV == kHeadDim && !kDropout ? 2 : 1;
  static constexpr int kBlockM = kRowWarps * kMmaM * kMTiles;
  // Keys per K/V tile. The S tile (kBlockN/2 floats per m-tile per thread) shrinks above
  // d = 128 to stay under 255 registers without spilling, unless V is at most 128 wide: the
  // (192, 128) tile's O holds 64 floats per thread, not 96, and 64 keys per tile read Qi from
  // shared memory half as often as 32 (204 registers on sm_80 against 182 at 32 keys, no spills;
  // docs/lab/2026-12-03-mla-pair-tiles.md).
  static constexpr int kBlockN = kHeadDim <= 128 || kHeadDimV <= 128 ? 64 : 32;

  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;  // elements per Q or K row
  static constexpr int kVSmemStride = kHeadDimV + kSmemPadElems;  // elements per V row
  static constexpr int kQSmemElems = kBlockM * kSmemStride;
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;  // a K tile
  static constexpr int kVTileSmemElems = kBlockN * kVSmemStride;
  // Decoding reads its KV cache in the one-m-tile kernel (gqa_decode.h), whose cache copies
  // are unrolled (fwd_kernel.cuh) up to d = 128; a paged cache's rows then come from a table
  // of row addresses in shared memory (paged_row_table.cuh): 2 tiles x kBlockN rows x K, V.
  // It is taken whether or not the call is paged (2 KB), as the kernel serves both; it leaves
  // kMinBlocksPerSm as it was (static_assert below).
  static constexpr bool kUnrolledCacheCopies = kMTiles == 1 && kHeadDim <= 128;

  // The kernel's shared memory (its sizeof is the launch's dynamic shared memory): Qi (O_i's
  // staging in the epilogue), one K tile and one V tile. FA2's pipeline overlaps without a
  // second stage: V_j is copied while S = Qi Kj^T is computed, K_j+1 while O += P Vj; a second
  // stage would halve the CTAs per SM at d = 128.
  struct Tiles {
    uint16_t q[kQSmemElems];
    uint16_t k[kKVTileSmemElems];
    uint16_t v[kVTileSmemElems];
  };
  // Then, with unrolled cache copies, the row table: 2 tiles x kBlockN rows x K, V.
  struct TilesAndRowTable : Tiles {
    const uint16_t* row_table[2 * kBlockN * 2];
  };
  using SharedStorage = std::conditional_t<kUnrolledCacheCopies, TilesAndRowTable, Tiles>;
  static constexpr int kTilesSmemBytes = static_cast<int>(sizeof(Tiles));
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  static constexpr int kPagedRowTableBytes = kSmemBytes - kTilesSmemBytes;

  // CTAs per SM that sm_80's shared memory holds (at most 3), given to __launch_bounds__, so
  // that the register budget is what that many CTAs can share: left to itself ptxas picks a
  // tighter one and spills, and registers the shared memory cannot use buy no occupancy. Two
  // m-tiles, and one m-tile from d = 96, spilled at 3, so those ask for at most 2.
  static constexpr int kMaxBlocksPerSm = kMTiles == 2 || kHeadDim >= 96 ? 2 : 3;
  static constexpr int blocks_per_sm(int smem_bytes) {
    return kMaxSmemBytes / smem_bytes < 1 ? 1
           : (kMaxSmemBytes / smem_bytes > kMaxBlocksPerSm ? kMaxBlocksPerSm
                                                           : kMaxSmemBytes / smem_bytes);
  }
  static constexpr int kMinBlocksPerSm = blocks_per_sm(kSmemBytes);
  static_assert(kMinBlocksPerSm == blocks_per_sm(kTilesSmemBytes),
                "the paged row table must not cost a CTA per SM");
  static_assert(kTilesSmemBytes % 8 == 0, "the row table after the tiles must be 8-byte aligned");
  static_assert(kSmemBytes == (kQSmemElems + kKVTileSmemElems + kVTileSmemElems) * kElemBytes16 +
                                  (kUnrolledCacheCopies ? 2 * kBlockN * 2 * int{sizeof(void*)} : 0),
                "SharedStorage holds the tiles and the row table back to back, unpadded");

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim <= kMaxHeadDim && kHeadDimV <= kMaxHeadDimV,
                "head-dim tile must be a multiple of the mma K (16) and at most 576 / 512");
  static_assert(kOCols % (2 * kMmaN) == 0, "O's columns are loaded 16 per ldmatrix.x4.trans");
  static_assert(kHeadDimV <= kHeadDim, "the epilogue stages O in Qi's rows");
  static_assert(kBlockN % (2 * kMmaN) == 0, "K tiles are loaded 16 keys per ldmatrix.x4");
  static_assert(kSmemBytes <= kMaxSmemBytes, "forward tile exceeds sm_80 shared memory");
  static_assert((kSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1 &&
                    (kVSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1,
                "row pitch must be an odd number of 16-byte chunks (bank-conflict-free)");
};

// The tiles named by their q width alone: an equal pair, and MLA's 576 / 512. A type of its own,
// so that their kernels (fwd_kernel_16bit<FwdTraits<d, *>, Element>) kept the symbol names they
// had before tiles were pairs, by which .ci/sass_compare.py pairs the kernels of two trees.
template <int kHeadDim_, bool kDropout_>
struct FwdTraits : FwdPairTraits<kHeadDim_, named_head_dim_v(kHeadDim_), kDropout_> {};

// The forward's traits of the tile (kHeadDim, kHeadDimV): FwdTraits where v's width is the one
// kHeadDim names, else FwdPairTraits (the (192, 128) tile).
template <int kHeadDim, int kHeadDimV, bool kDropout>
using FwdTile = std::conditional_t<kHeadDimV == named_head_dim_v(kHeadDim),
                                   FwdTraits<kHeadDim, kDropout>,
                                   FwdPairTraits<kHeadDim, kHeadDimV, kDropout>>;

// Backward dK/dV kernel for fp16/bf16 (bwd_dkdv_kernel.cuh), FA2's sm80 geometry: 8 warps, a
// CTA of kBlockN keys walks query tiles of kBlockM, and each of its three products gives the
// warps its own grid, so that every warp tile is 32 rows deep (two m16 tiles) and each fragment
// loaded from shared memory feeds two or more mma:
//   S^T, dP^T (kBlockN x kBlockM): kSdpWarpsN warps along keys x the rest along queries;
//   dK, dV   (kBlockN x d):       kDkvWarpsN warps along keys x the rest along columns;
//   dQ       (kBlockM x d):       kDqWarpsM warps along queries x the rest along columns.
// P^T and dS^T go through shared memory between the first and the other two: a warp's dK/dV
// rows are its S tile's keys, so it keeps the P^T and dS^T of its own queries in registers and
// loads only the other warps' columns. dK and dV (kBlockN x d over 8 warps, 64 floats each per
// thread at d >= 128) stay in registers for the whole CTA.
// Tiles (keys x queries): 128 x 128 up to d = 64, 128 x 64 up to d = 128, 64 x 64 above, as
// FA2 (flash_bwd_launch_template.h, its non-double-buffered sm80 choices): fewer shared-memory
// loads per mma than a 4-warp tile (tools/gpu_model.py).
// Q_i and dO_i are one stage: the copy of tile i + 1 starts once every warp is done with
// dK/dV of tile i, and overlaps the dQ product (two stages at d = 128 exceed sm_80's shared
// memory).
// A value head dim of its own (MLA's (192, 128), kernel_list.py): K, Q, dK and dQ are kHeadDim
// wide, V, dO and dV kHeadDimV, so dP^T = Vj dOi^T takes kHeadDimV / 16 k-steps and dV's warp
// tile kDvCols columns (at (192, 128): 32 floats of dV per thread instead of 48).
template <int kHeadDim_, int kHeadDimV_>
struct BwdPairTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr Arch kArch = Arch::kSm80;
  static constexpr int kMaxSmemBytes = max_smem_bytes(kArch);
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;  // keys per CTA
  static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;   // queries per step

  // S^T / dP^T warp tile: 32 keys x kSdpQueries.
  static constexpr int kSdpWarpsN = kBlockN / 32;
  static constexpr int kSdpKeys = kBlockN / kSdpWarpsN;
  static constexpr int kSdpQueries = kBlockM / (kNWarps / kSdpWarpsN);
  // At d = 64 S^T and dP^T next to dK and dV spilled: the warp computes its S tile in two
  // slices of its queries, reloading its K and V fragments once more.
  static constexpr int kSdpPasses = kHeadDim == 64 ? 2 : 1;
  // dK / dV warp tiles: 32 keys x kDkCols of dK, x kDvCols of dV.
  static constexpr int kDkvWarpsN = kBlockN / 32;
  static constexpr int kDkvKeys = kBlockN / kDkvWarpsN;
  static constexpr int kDkCols = kHeadDim / (kNWarps / kDkvWarpsN);
  static constexpr int kDvCols = kHeadDimV / (kNWarps / kDkvWarpsN);
  // dQ warp tile: kDqRows queries x kDqCols. Two warps along the queries where that leaves
  // whole 16-column loads per warp (d = 96 would split its columns in 24s: four there).
  static constexpr int kDqWarpsM = kBlockM == 128 || kHeadDim % 64 != 0 ? 4 : 2;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqCols = kHeadDim / (kNWarps / kDqWarpsM);
  // At d = 256 the dQ tile next to dK and dV spilled, in one slice and in two: four slices
  // of 16 columns, each reloading the dS fragments.
  static constexpr int kDqPasses = kDqCols > 48 ? 4 : 1;

  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;    // K, Q rows
  static constexpr int kVSmemStride = kHeadDimV + kSmemPadElems;  // V, dO rows
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;  // the K tile
  static constexpr int kVTileSmemElems = kBlockN * kVSmemStride;
  static constexpr int kQTileSmemElems = kBlockM * kSmemStride;
  static constexpr int kDoTileSmemElems = kBlockM * kVSmemStride;
  // P^T and dS^T, [kBlockN keys][kBlockM queries], padded like the other tiles.
  static constexpr int kPSmemStride = kBlockM + kSmemPadElems;
  static constexpr int kPSmemElems = kBlockN * kPSmemStride;
  static constexpr int kSmem16BitElems = kKVTileSmemElems + kVTileSmemElems + kQTileSmemElems +
                                         kDoTileSmemElems + 2 * kPSmemElems;
  // The kernel's shared memory (its sizeof is the launch's): K, V, Q_i, dO_i, P^T, dS^T; then
  // LSE_i (log2 units) and D_i of the query tile, in fp32.
  struct SharedStorage {
    uint16_t k[kKVTileSmemElems];
    uint16_t v[kVTileSmemElems];
    uint16_t q[kQTileSmemElems];
    uint16_t dout[kDoTileSmemElems];
    uint16_t pt[kPSmemElems];
    uint16_t dst[kPSmemElems];
    float lse[kBlockM];
    float dsum[kBlockM];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  // One CTA of 8 warps per SM: 255 registers per thread.
  static constexpr int kMinBlocksPerSm = 1;

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim <= kMaxHeadDimBwd, "bad head-dim tile");
  static_assert(kHeadDimV % kMmaK == 0 && kHeadDimV <= kHeadDim, "bad v head-dim tile");
  static_assert(kSdpKeys % kMmaM == 0 && kSdpQueries % (2 * kMmaN * kSdpPasses) == 0 &&
                    kDkvKeys % kMmaM == 0 && kDkCols % (2 * kMmaN) == 0 &&
                    kDvCols % (2 * kMmaN) == 0 && kDqRows % kMmaM == 0 &&
                    kDqCols % (2 * kMmaN * kDqPasses) == 0,
                "warp tiles must be whole m16 tiles by whole 16-column ldmatrix.x4 loads");
  // A warp's dK/dV rows are its S tile's keys, so it multiplies the P^T and dS^T of its own
  // queries straight from its registers, right after computing them and before the barrier
  // (warp_tile.cuh, mma_regs_AB): at d = 128 half of those two products' A loads.
  static_assert(kDkvWarpsN == kSdpWarpsN && kDkvKeys == kSdpKeys,
                "dK/dV and S^T warp tiles must share their keys");
  static_assert(kSmem16BitElems * kElemBytes16 % kChunkBytes == 0, "fp32 tail must stay aligned");
  static_assert(kSmemBytes == kSmem16BitElems * kElemBytes16 + 2 * kBlockM * 4,
                "SharedStorage holds its tiles back to back, unpadded");
  static_assert((kKVTileSmemElems + kVTileSmemElems + kQTileSmemElems) * kElemBytes16 %
                        kChunkBytes == 0,
                "every tile must start 16-byte aligned (cp.async, ldmatrix)");
  static_assert(kSmemBytes <= kMaxSmemBytes, "backward tile exceeds sm_80 shared memory");
  static_assert((kPSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1 &&
                    (kVSmemStride * kElemBytes16 / kChunkBytes) % 2 == 1,
                "row pitch must be an odd number of 16-byte chunks (bank-conflict-free)");
};

// The equal pairs' tiles: a type of their own, as FwdTraits, so their kernels keep the symbol
// names by which .ci/sass_compare.py pairs the kernels of two trees.
template <int kHeadDim_>
struct BwdTraits : BwdPairTraits<kHeadDim_, kHeadDim_> {};

// Deterministic dQ kernel (bwd_dq_kernel.cuh): the forward's loop, with dQ_i in registers where
// the forward keeps O_i and dOi in smem next to Qi. It keeps S and dP live at once, so a warp
// owns 16 query rows (one m-tile) at every d, and a two-stage K/V ring hides the copies.
template <int kHeadDim_, int kHeadDimV_>
struct BwdDqPairTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;  // V's and dO's width (BwdPairTraits)
  static constexpr Arch kArch = Arch::kSm80;
  static constexpr int kMaxSmemBytes = max_smem_bytes(kArch);
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kBlockM = kNWarps * kMmaM;
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = 2;  // K/V tiles in flight
  static constexpr int kSmemStride = kHeadDim + kSmemPadElems;    // Q, K rows
  static constexpr int kVSmemStride = kHeadDimV + kSmemPadElems;  // dO, V rows
  static constexpr int kQSmemElems = kBlockM * kSmemStride;
  static constexpr int kDoSmemElems = kBlockM * kVSmemStride;
  static constexpr int kKVTileSmemElems = kBlockN * kSmemStride;  // a K tile
  static constexpr int kVTileSmemElems = kBlockN * kVSmemStride;
  // The kernel's shared memory (its sizeof is the launch's): Qi, dOi, then kStages x (K tile,
  // V tile).
  struct Stage {
    uint16_t k[kKVTileSmemElems];
    uint16_t v[kVTileSmemElems];
  };
  struct SharedStorage {
    uint16_t q[kQSmemElems];
    uint16_t dout[kDoSmemElems];
    Stage stages[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  // For __launch_bounds__, as FwdTraits: ptxas' own budget spilled.
  static constexpr int kMinBlocksPerSm = kMaxSmemBytes / kSmemBytes >= 2 ? 2 : 1;
  static_assert(kSmemBytes <= kMaxSmemBytes, "dQ tile exceeds sm_80 shared memory");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(kHeadDimV % kMmaK == 0 && kHeadDimV <= kHeadDim, "bad v head-dim tile");
  static_assert((kQSmemElems + kDoSmemElems + kKVTileSmemElems) * kElemBytes16 % kChunkBytes ==
                    0,
                "every tile must start 16-byte aligned (cp.async, ldmatrix)");
  static_assert(kSmemBytes == (kQSmemElems + kDoSmemElems +
                               kStages * (kKVTileSmemElems + kVTileSmemElems)) * kElemBytes16,
                "SharedStorage holds its tiles back to back, unpadded");
};

// The equal pairs' tiles, a type of their own (as BwdTraits).
template <int kHeadDim_>
struct BwdDqTraits : BwdDqPairTraits<kHeadDim_, kHeadDim_> {};

// The backward's traits of the tile (kHeadDim, kHeadDimV): BwdTraits, BwdDqTraits for an equal
// pair, else the pair's own.
template <int kHeadDim, int kHeadDimV>
using BwdTile = std::conditional_t<kHeadDimV == kHeadDim, BwdTraits<kHeadDim>,
                                   BwdPairTraits<kHeadDim, kHeadDimV>>;
template <int kHeadDim, int kHeadDimV>
using BwdDqTile = std::conditional_t<kHeadDimV == kHeadDim, BwdDqTraits<kHeadDim>,
                                     BwdDqPairTraits<kHeadDim, kHeadDimV>>;

// fp32 SIMT kernels (simt_kernels.cuh): one warp per query row (forward, dQ) or per key row
// (dK/dV); a tile of 32 keys / 32 queries, one per lane, is staged in smem with rows padded by
// one float so lane-strided reads hit 32 different banks.
template <int kHeadDim_>
struct SimtTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr Arch kArch = Arch::kSm80;
  static constexpr int kMaxSmemBytes = max_smem_bytes(kArch);
  static constexpr int kNWarps = 8;  // rows of the CTA
  static constexpr int kNThreads = kNWarps * kWarpSize;
  static constexpr int kTileRows = kWarpSize;  // streamed keys (or queries), one per lane
  static constexpr int kColsPerLane = kHeadDim / kWarpSize;
  static constexpr int kSmemStride = kHeadDim + 1;  // floats
  static constexpr int kRowSmemFloats = kNWarps * kSmemStride;
  static constexpr int kTileSmemFloats = kTileRows * kSmemStride;
  // Forward and dQ: the CTA's query rows (Q, dO: the forward leaves dO's unused) and one key
  // tile (K, V).
  struct QueryRowsStorage {
    float q[kRowSmemFloats];
    float dout[kRowSmemFloats];
    float k[kTileSmemFloats];
    float v[kTileSmemFloats];
  };
  // dK/dV: the CTA's key rows (K, V), one query tile (Q, dO) and its LSE_i (log2 units), D_i.
  struct KeyRowsStorage {
    float k[kRowSmemFloats];
    float v[kRowSmemFloats];
    float q[kTileSmemFloats];
    float dout[kTileSmemFloats];
    float lse[kTileRows];
    float dsum[kTileRows];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(QueryRowsStorage));
  static constexpr int kDkdvSmemBytes = static_cast<int>(sizeof(KeyRowsStorage));

  static_assert(kHeadDim % kWarpSize == 0 && kHeadDim <= kMaxHeadDimSimt, "bad fp32 head-dim tile");
  static_assert(kDkdvSmemBytes <= kMaxSmemBytes, "fp32 tile exceeds sm_80 shared memory");
  static_assert(kSmemBytes == (2 * kRowSmemFloats + 2 * kTileSmemFloats) * 4 &&
                    kDkdvSmemBytes == kSmemBytes + 2 * kTileRows * 4,
                "the storages hold their tiles back to back, unpadded");
};

// The small SIMT kernels of the backward (D_i = rowsum(dO_i * O_i) - dLSE_i; dQ fp32 -> 16-bit):
// one warp per row.
constexpr int kRowKernelWarps = 4;
constexpr int kRowKernelThreads = kRowKernelWarps * kWarpSize;

}  // namespace flashattn::cuda
