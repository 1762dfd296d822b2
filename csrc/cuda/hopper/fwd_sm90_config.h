// Tile sizes, warp roles, register split and shared-memory layout of the sm_90a forward.
//
// One CTA computes kBlockM = 128 query rows of one (batch, head): warpgroup 0 is the producer
// (one thread issues TMA loads), warpgroups 1 and 2 are consumers owning 64 rows each (the
// m64 of wgmma). Keys go by kBlockN (fwd_sm90_key_tile: 128 up to d = 128, 64 at d = 256)
// through a ring of kStages = 2 stages of K and V (3 for a gathered KV cache up to d = 128).
// FA3 (hopper/tile_size.h) uses 128 x 128 (d = 128) with two stages too; why these sizes here is
// in docs/lab/2026-12-02-hopper-forward.md and docs/lab/2026-12-02-hopper-forward-d256.md.
//
// Shared memory, from a 1024-byte aligned base (the 128-byte swizzle's atom is 8 rows of 128
// bytes; every tile below starts on a multiple of 1024):
//   Q        kChunks chunks of [kBlockM rows x 128 bytes] (64 columns of d per chunk, 128 with
//            e4m3, as the TMA box brings them, 128-byte swizzled); O's staging in the epilogue
//            of a kernel that does not walk (kHeadDim / 64 chunks of 16-bit O: twice Q's bytes
//            with e4m3 inputs).
//   K[s]     kStages x kChunks chunks of [kBlockN x 128 bytes]
//   V[s]     the same
//   V^T[s]   e4m3 only: kStages x [kHeadDim rows x kBlockN keys], 128-byte swizzled
//   barriers q_full, k_full[s], v_full[s], kv_empty[s], v_tail_ready, vt_full[s] (e4m3 only),
//            q_empty and the tile slot (a walking kernel's: fwd_sm90_walk.h)
//   O        a walking kernel's only: kOChunks chunks of [kBlockM x 128 bytes], O's staging
//            (fwd_sm90_walk.h: Q's rows take the next tile's Q while the store reads O)
//   + 1024 bytes of slack: nvcc promises 128-byte alignment of dynamic smem only, so the
//   kernel rounds its base up.
#pragma once
#include <cstddef>
#include <cstdint>

#include "host_device.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn::hopper {

// Whether the sm_90a forward's kernel of these features walks tiles (fwd_sm90_walk.h says which
// and why): a constant of the kernel's template arguments there, and the plan's question at run
// time (plan_fwd_sm90.h sm90_fwd_walks: only a walking call may get a tile counter), so one rule.
FLASHATTN_HOST_DEVICE constexpr bool fwd_sm90_walks(int head_dim, bool local, bool softcap, bool alibi,
                                                    bool attn_mask, bool gather_kv, bool dropout,
                                                    bool fp8) {
  const bool dense = !(softcap || alibi || attn_mask || gather_kv || dropout || fp8);
  return dense && (head_dim == 64 || (head_dim == 128 && !local));
}

// A walking launch of `places` tiles runs one CTA per SM, at most one per place (sms > 0: the
// launch refuses an unknown SM count).
FLASHATTN_HOST_DEVICE constexpr unsigned fwd_sm90_walk_ctas(unsigned places, int sms) {
  return places < static_cast<unsigned>(sms) ? places : static_cast<unsigned>(sms);
}

// Whether that launch reads the call's tile counter: each CTA's first tile is its own place
// (blockIdx.x), so only places beyond the grid come from the counter (fwd_sm90_walk.h). A call whose
// grid covers every place needs none: no allocation, no memset. The executor (plan_fwd.h
// fwd_plan_takes_tile_counter) and the launch (fwd_sm90_launch.h) both ask this, on the same SM
// count (fwd_sm90_sms.h), so that they agree.
FLASHATTN_HOST_DEVICE constexpr bool fwd_sm90_walk_counts(unsigned places, int sms) {
  return places > fwd_sm90_walk_ctas(places, sms);
}

constexpr uint32_t kSwizzleRowBytes = 128;  // one 128-byte swizzle row: 64 16-bit elements
constexpr uint32_t kSwizzleAtomBytes = 1024;

// A launch grid as three counts, so that this header needs no CUDA type (dim3).
struct FwdSm90GridDims {
  unsigned x, y, z;
};

// Keys per tile. Up to d = 128, 128 (S 64 + P 32 + O d / 2 registers per consumer thread).
// At d = 256 O alone is 128 fp32 registers per thread, and S_j, P_{j-1} and O are live together
// in the overlapped step: 64 keys keep that at 32 + 16 + 128 = 176 of setmaxnreg's 240 (128 keys
// would need 224 registers and 320 KB of shared memory). FA3's 80 (40 + 20 + 128 = 188) left
// ptxas too little for the local window's main loop (a 4-byte spill), so 64 at d = 256
// (docs/lab/2026-12-02-hopper-forward-d256.md).
constexpr int fwd_sm90_key_tile(int head_dim) { return head_dim <= 128 ? 128 : 64; }

// Ring stages of a gathered KV cache (kGatherKv). Its producer leaves the newest tile's cp.async
// copies in flight while it waits for the next empty stage, and the consumers hold two stages
// (S_j with K_j while P_{j-1} V_{j-1} runs), so two loads overlap only with three stages: the
// producer may keep at most kStages - 2 tiles unannounced, or it waits for a release that waits
// on its own arrival. Three fit the 227 KB up to d = 128; d = 256 keeps two (one load at a time).
constexpr int fwd_sm90_gather_stages(int head_dim) { return head_dim <= 128 ? 3 : 2; }

// Query tokens in one consumer warpgroup's 64 rows: 64, or with packed GQA heads (gqa_decode.h:
// the g query heads of one kv head as rows, token-major) floor(64 / g) tokens of g rows each, the
// 64 - g floor(64 / g) rows after them idle. A CTA takes twice that; a group above 64 heads is
// not packed here (plan_fwd_sm90.h).
FLASHATTN_HOST_DEVICE constexpr int fwd_sm90_consumer_tokens(int packed_heads) {
  return 64 / (packed_heads > 1 ? packed_heads : 1);
}

// kElemBytes_: the bytes of one Q, K or V element, 2 (f16, bf16) or 1 (e4m3, the FP8 forward,
// whose O is bf16). A 128-byte swizzle row holds 64 or 128 elements; an MMA step (k16 or k32)
// takes 32 bytes of a row either way. e4m3 wgmma has no MN-major operand, so the FP8 forward
// keeps a second copy of each V tile, transposed by the producer (fwd_sm90_transpose_v.cuh).
template <int kHeadDim_, bool kGatherKv_ = false, int kElemBytes_ = 2>
struct FwdSm90Config {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "the sm_90a forward takes d = 64, 128 or 256");
  static constexpr int kElemBytes = kElemBytes_;
  // (A gathered e4m3 cache: 3 stages of K, V and V^T, 176 KB with Q's region.)
  static_assert(kElemBytes == 2 || (kElemBytes == 1 && kHeadDim == 128),
                "the FP8 forward is built at d = 128");
  static constexpr bool kTransposeV = kElemBytes == 1;
  static constexpr int kRowElems = static_cast<int>(kSwizzleRowBytes) / kElemBytes;  // per swizzle row
  static constexpr int kMmaK = 32 / kElemBytes;  // keys (P V) or head dims (Q K^T) per wgmma
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = fwd_sm90_key_tile(kHeadDim);
  static_assert(kBlockN % 16 == 0, "P V runs in k16 steps over the keys of a tile");
  static constexpr int kStages = kGatherKv_ ? fwd_sm90_gather_stages(kHeadDim) : 2;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kChunks = kHeadDim / kRowElems;  // 128-byte swizzle rows per Q/K/V row
  static constexpr int kOChunks = kHeadDim / 64;         // and per O row (always 16-bit)

  static_assert(kBlockM == 64 * kConsumers, "each consumer warpgroup owns 64 query rows");

  // The grid: (query tiles x num_splits, Hq, B), one CTA per kBlockM query rows of one (batch,
  // head) and split-KV part (x = query tile * num_splits + part); with packed GQA heads, one CTA
  // per 2 fwd_sm90_consumer_tokens(g) query tokens of one kv head (heads_q is then Hkv). The
  // launch (fwd_sm90_launch.h) and the plan (plan_fwd.h) both take it from here.
  static constexpr FwdSm90GridDims grid(int seqlen_q, int heads_q, int batch, int num_splits,
                                        int packed_heads = 1) {
    const int64_t splits = num_splits > 1 ? num_splits : 1;
    const int64_t tile_tokens = kConsumers * fwd_sm90_consumer_tokens(packed_heads);
    return {static_cast<unsigned>((static_cast<int64_t>(seqlen_q) + tile_tokens - 1) / tile_tokens * splits),
            static_cast<unsigned>(heads_q), static_cast<unsigned>(batch)};
  }

  static constexpr uint32_t kQChunkBytes = kBlockM * kSwizzleRowBytes;
  static constexpr uint32_t kKvChunkBytes = kBlockN * kSwizzleRowBytes;
  static constexpr uint32_t kQBytes = kChunks * kQChunkBytes;
  static constexpr uint32_t kKvBytes = kChunks * kKvChunkBytes;  // one K (or V) tile
  // The epilogue stages O (16-bit) in Q's place: with e4m3 inputs O takes twice Q's bytes.
  static constexpr uint32_t kQRegionBytes =
      kQBytes > kOChunks * kQChunkBytes ? kQBytes : kOChunks * kQChunkBytes;
  // V^T of one tile (kTransposeV): kHeadDim rows of kBlockN keys, one 128-byte swizzle row each.
  static_assert(!kTransposeV || kBlockN * kElemBytes == static_cast<int>(kSwizzleRowBytes),
                "V^T's rows are one 128-byte swizzle row of keys");
  static constexpr uint32_t kVtBytes = kTransposeV ? kHeadDim * kSwizzleRowBytes : 0;

  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKOffset = kQOffset + kQRegionBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKvBytes;
  static constexpr uint32_t kVtOffset = kVOffset + kStages * kKvBytes;
  static constexpr uint32_t kBarrierOffset = kVtOffset + kStages * kVtBytes;
  // + v_tail_ready: the first V tile once the producer has zeroed its keys past seqused_k;
  // + vt_full[s] (kTransposeV): V^T of stage s written by the whole producer warpgroup;
  // + q_empty and the tile slot (16 bytes): a walking kernel's hand-out (fwd_sm90_walk.h).
  static constexpr int kBarriers = 1 + 3 * kStages + 1 + (kTransposeV ? kStages : 0) + 3;
  static constexpr size_t kSmemBytes = kBarrierOffset + kBarriers * 8 + kSwizzleAtomBytes;
  static_assert(kSmemBytes <= 227 * 1024, "dynamic shared memory above the 227 KB opt-in limit");
  // A walking kernel's O staging (fwd_sm90_walk.h): a buffer of its own after the barriers, on
  // a 1024-byte boundary, so that the next tile's Q may land in Q's rows while the TMA store
  // still reads the last tile's O. The walking configs only (d = 64: 16 KB, 100 352 bytes in all;
  // d = 128: 32 KB, 198 656 bytes); the kernel's walking branch asserts the 227 KB.
  static constexpr uint32_t kOBytes = kOChunks * kQChunkBytes;
  static constexpr uint32_t kOOffset =
      (kBarrierOffset + kBarriers * 8 + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr size_t kWalkSmemBytes = kOOffset + kOBytes + kSwizzleAtomBytes;
  // The dynamic shared memory of a kernel that walks (`walks`: fwd_sm90_walks) or not.
  static constexpr size_t smem_bytes(bool walks) { return walks ? kWalkSmemBytes : kSmemBytes; }

  // setmaxnreg: the producer keeps 24 registers, each consumer thread gets 240 (FA3's split for
  // two consumer warpgroups): 128 * (24 + 2 * 240) = 64512 <= 65536.
  // The FP8 producer transposes V with all its threads (fwd_sm90_transpose_v.cuh): 32.
  static constexpr int kProducerRegisters = kTransposeV ? 32 : 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536,
                "setmaxnreg counts must fit the register file");
};

}  // namespace flashattn::hopper
