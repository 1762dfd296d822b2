// Tile sizes, warp roles, register split, shared-memory layout and the dQ accumulator's layout of
// the sm_90a backward (issue 31, stage 5).
//
// One CTA owns kBlockN = 128 keys of one (batch, kv head): warpgroup 0 is the producer (warp 0
// issues TMA loads, warp 1 the dQ bulk reduce-adds), warpgroups 1 and 2 are consumers owning 64
// keys each (the m64 of wgmma), so every product is computed transposed, keys as rows:
//   S^T = K Q^T, dP^T = V dO^T (m64 n{kBlockM}), dV += P^T dO, dK += dS^T Q (m64 n{d}, A = P^T /
//   dS^T straight from the S^T / dP^T accumulators), and dQ = dS K (m64 n64, A = dS from shared
//   memory, MN-major).
// Query blocks of kBlockM rows stream through a ring of kStages stages (Q, dO, and the rows'
// LSE * log2(e) and D = rowsum(dO * O)).
//
// kBlockM: 128 at d = 64, 64 at d = 128 (FA3's hopper/tile_size.h for the backward makes the
// same choice): per consumer thread, dK and dV hold d/2 + d/2 fp32 registers, S^T and dP^T
// kBlockM/2 each, their 16-bit fragments kBlockM/4 each, the dQ part 32. At d = 128 with
// kBlockM = 128 that is 128 + 128 + 64 + 32 = 352 > 240, so d = 128 halves kBlockM.
// Either way each consumer's dQ part is a 64 x 64 block of the kBlockM x d tile: rows 64c at
// d = 64 (kBlockM = 128), columns 64c at d = 128 (kBlockM = 64).
//
// Shared memory, from a 1024-byte aligned base (128-byte swizzle atoms); every tile holds
// "chunks" of [rows x 128 bytes], 64 16-bit columns per chunk, 128-byte swizzled, as TMA
// brings them:
//   K, V       kHeadDim / 64 chunks of [kBlockN rows]                  (loaded once)
//   Q[s], dO[s] kHeadDim / 64 chunks of [kBlockM rows]                  (per query block)
//   dS[2]      kBlockM / 64 chunks of [kBlockN key rows] (dS^T rows = keys, 64 queries per
//              128-byte row: the MN-major A operand of dQ = dS K); double-buffered so one
//              named barrier per query block orders both consumers' reads and writes
//   dQ[2]      one 64 x 64 fp32 part per consumer (row-major, the bulk reduce's source)
//   lse[s], dpsum[s] kBlockM floats each
//   barriers   kv_full, q_full[s], q_empty[s], dq_full[2], dq_empty[2], tail_loaded
//   + 1024 bytes of slack to round the base up (nvcc promises 128-byte alignment only).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/hopper/fwd_sm90_config.h"  // kSwizzleRowBytes, kSwizzleAtomBytes

namespace flashattn::hopper {

// Whether the dropout main loop with this mask (local: a local window) is built at this head
// dim. At d = 64 (kBlockM = 128) the dropout loops issue dP^T after P^T (bwd_sm90_kernel.cuh,
// kDpAfterP); there the local window's loop still spills, so dropout with a local window at
// d = 64 stays on the sm_80 kernels (plan_bwd_sm90.h, README's support table).
constexpr bool bwd_sm90_builds_dropout(int head_dim, bool local) { return head_dim == 128 || !local; }

// Whether the ALiBi main loops take softcap (at run time) at this head dim. At d = 64 that
// softcap pass spilled 20-24 bytes in each of them, so there ALiBi with softcap has loops of its
// own (kAlibi and kSoftcap), which issue dP^T after P^T (bwd_sm90_kernel.cuh, kDpAfterP).
constexpr bool bwd_sm90_alibi_takes_softcap(int head_dim) { return head_dim == 128; }

// Where the attn_mask main loops with softcap (kAttnMask and kSoftcap) are built: in the
// (head dim, dtype) file beside the others at d = 64; at d = 128 in files of their own
// (inst/bwd_mask_softcap_hdim128_*_sm90.cu, launch_bwd_sm90_mask_softcap.cuh). Beside the d = 128
// fp16 file's other loops, ptxas spilled 8 bytes in the causal and local ones and changed the
// SASS of the other loops (their PTX unchanged); alone they spill nothing
// (docs/lab/2026-12-04-hopper-feature-combinations-3.md, -4.md).
constexpr bool bwd_sm90_attn_mask_softcap_apart(int head_dim) { return head_dim == 128; }

template <int kHeadDim_>
struct BwdSm90Config {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the sm_90a backward takes d = 64 or 128");
  static constexpr int kBlockN = 128;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;
  static constexpr int kStages = 2;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kChunks = kHeadDim / 64;
  // Each consumer's part of the dQ tile: 64 x 64 fp32, at rows 64c (kDqPartRows) or columns 64c.
  static constexpr bool kDqPartRows = kBlockM == 128;
  static constexpr int kDqPartFloats = 64 * 64;

  static constexpr uint32_t kKvChunkBytes = kBlockN * kSwizzleRowBytes;
  static constexpr uint32_t kKvBytes = kChunks * kKvChunkBytes;
  static constexpr uint32_t kQChunkBytes = kBlockM * kSwizzleRowBytes;
  static constexpr uint32_t kQBytes = kChunks * kQChunkBytes;  // Q or dO of one query block
  static constexpr uint32_t kDsChunkBytes = kBlockN * kSwizzleRowBytes;
  static constexpr uint32_t kDsBytes = (kBlockM / 64) * kDsChunkBytes;
  static constexpr uint32_t kDqPartBytes = kDqPartFloats * 4;
  static constexpr uint32_t kRowStatBytes = kBlockM * 4;

  static constexpr uint32_t kKOffset = 0;
  static constexpr uint32_t kVOffset = kKOffset + kKvBytes;
  static constexpr uint32_t kQOffset = kVOffset + kKvBytes;
  static constexpr uint32_t kDoOffset = kQOffset + kStages * kQBytes;
  static constexpr uint32_t kDsOffset = kDoOffset + kStages * kQBytes;
  static constexpr uint32_t kDqOffset = kDsOffset + 2 * kDsBytes;
  static constexpr uint32_t kLseOffset = kDqOffset + kConsumers * kDqPartBytes;
  static constexpr uint32_t kDpsumOffset = kLseOffset + kStages * kRowStatBytes;
  static constexpr uint32_t kBarrierOffset = kDpsumOffset + kStages * kRowStatBytes;
  // kv_full, q_full[s], q_empty[s], dq_full[c], dq_empty[c], tail_loaded (the producer's own: a
  // tile whose rows past the sequence it zeroes before handing it over, bwd_sm90_kernel.cuh).
  static constexpr int kBarriers = 1 + 2 * kStages + 2 * kConsumers + 1;
  static constexpr size_t kSmemBytes = kBarrierOffset + kBarriers * 8 + kSwizzleAtomBytes;
  static_assert(kSmemBytes <= 227 * 1024, "dynamic shared memory above the 227 KB opt-in limit");
  static_assert(kDsOffset % kSwizzleAtomBytes == 0 && kQOffset % kSwizzleAtomBytes == 0,
                "swizzled tiles start on a 1024-byte atom");

  // FA3's split for two consumer warpgroups: 128 * (24 + 2 * 240) = 64512 <= 65536.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536,
                "setmaxnreg counts must fit the register file");
};

// The fp32 dQ accumulator: [slices][B][Hq][Sq padded to kBlockM][d] in tiles of kBlockM rows;
// inside a tile, the two consumers' 64 x 64 parts one after the other, each one contiguous bulk
// reduce-add, in the m64n64 accumulator's order (FA3 permutes its dQ accumulator likewise): the
// i-th accumulator element of warpgroup thread t at i * 128 + t, so the consumers' stores into
// the reduce's source buffer are conflict-free; the convert kernel reads it through element().
// One slice normally (every key block adds into it); with deterministic dQ one slice per key
// block, summed in key-block order afterwards.
template <int kHeadDim>
struct DqAccumLayout {
  using Cfg = BwdSm90Config<kHeadDim>;
  int64_t head_stride = 0, batch_stride = 0, slice_stride = 0;  // floats
  int batch = 0, heads = 0, seqlen_q_padded = 0, slices = 1;

  __host__ __device__ static int padded(int seqlen_q) {
    return (seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM * Cfg::kBlockM;
  }
  __host__ __device__ DqAccumLayout() {}
  __host__ __device__ DqAccumLayout(int batch_, int heads_q, int seqlen_q, int slices_)
      : batch(batch_), heads(heads_q), seqlen_q_padded(padded(seqlen_q)), slices(slices_) {
    head_stride = static_cast<int64_t>(seqlen_q_padded) * kHeadDim;
    batch_stride = head_stride * heads_q;
    slice_stride = batch_stride * batch;
  }
  __host__ __device__ int64_t floats() const { return slice_stride * slices; }
  // The row-stat buffers (LSE * log2 e, D) have the same rows, one float each: [B][Hq][rows].
  __host__ __device__ int64_t stat_floats() const {
    return static_cast<int64_t>(batch) * heads * seqlen_q_padded;
  }
  __host__ __device__ int64_t stat(int b, int h, int64_t row) const {
    return (static_cast<int64_t>(b) * heads + h) * seqlen_q_padded + row;
  }
  // The part `consumer` of query tile m_block.
  // The part `consumer` of query tile m_block (rows m_block * kBlockM on).
  __host__ __device__ int64_t part(int slice, int b, int h, int64_t m_block, int consumer) const {
    return slice * slice_stride + b * batch_stride + h * head_stride + m_block * Cfg::kBlockM * kHeadDim +
           consumer * Cfg::kDqPartFloats;
  }
  // Element (row i, column col) of head (b, h). Within a part, (row, c) is accumulator element
  // 4 (c / 8) + 2 ((row % 16) / 8) + c % 2 of thread 32 (row / 16) + 4 (row % 8) + (c % 8) / 2
  // (ptx_sm90_mma.cuh's m64nN layout).
  __host__ __device__ int64_t element(int slice, int b, int h, int64_t i, int col) const {
    const int r = static_cast<int>(i % Cfg::kBlockM);
    const int consumer = Cfg::kDqPartRows ? r / 64 : col / 64;
    const int row = Cfg::kDqPartRows ? r % 64 : r, c = col % 64;
    const int thread = 32 * (row / 16) + 4 * (row % 8) + (c % 8) / 2;
    const int elem = 4 * (c / 8) + 2 * ((row % 16) / 8) + c % 2;
    return part(slice, b, h, i / Cfg::kBlockM, consumer) + elem * 128 + thread;
  }
};

}  // namespace flashattn::hopper
