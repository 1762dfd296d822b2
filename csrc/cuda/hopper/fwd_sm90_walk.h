// The sm_90a forward's dynamic tile walk (issue 31, stage 4): a walking kernel runs one CTA per SM
// (min(tiles, SMs), fwd_sm90_launch.h), and each CTA takes tile after tile: first its own place
// of the launch order, blockIdx.x, then gridDim.x + the next count of the call's counter
// (FwdSm90Params::tile_counter, zeroed before the launch), so that the tiles go out in the grid's
// heavy-first order (the first gridDim.x places, the heaviest, one to each CTA) to whichever CTA
// is free, as the hardware hands out a full grid's CTAs (a static walk balances causal work worse:
// docs/lab/2026-12-03-hopper-persistent.md, section 3). A call whose grid covers every place
// (tiles <= SMs, fwd_sm90_walk_counts) never reads the counter, so it gets none: no allocation
// and no memset, the small calls' cost as before the walk (docs/lab/2026-12-04-hopper-walk-part-2.md).
//
// The producer's thread 0 takes the places (one atomicAdd per tile past its first, and one that
// finds the places spent) and hands each busy tile to the consumers through tile_slot (16 bytes),
// guarded by q_full (written before q_full's arrival) and q_empty (every consumer thread arrives
// once the tile's S MMAs, the only readers of its Q rows, have retired: after its main loop, before
// its epilogue). A tile without key tiles still goes through q_full (an arrival without Q) so that
// the consumers write its zeros.
//
// O's staging: a walking kernel's epilogue stages O in a shared-memory buffer of its own
// (FwdSm90Config::kOOffset, after the barriers: 16 KB at d = 64, 32 KB at d = 128; 100 352 and
// 198 656 bytes in all), not in Q's rows as a lone tile does, so that the next tile's Q may land
// while the TMA store still reads the last tile's O. The store's issuer (each consumer's thread 0)
// waits for that read (bulk_wait_group_read) only at its next epilogue, before the warpgroup's
// named barrier that lets its threads stage O again, and once more when the walk ends, before the
// CTA's shared memory goes; so the read overlaps the next tile's main loop. Idle tiles (past their sequence's queries) are skipped by the
// producer and never handed out. The end is a tile of m_block -1 (end()), handed out like a tile.
//
// Across tiles: the K / V ring's stage and phase come from the running count of key tiles
// (kv_base + the tile's own index), which producer and consumers keep alike; v_tail_ready
// completes one phase per tile whose V tail is zeroed, its parity carried by the consumers. The
// consumers release a tile's last stage before its epilogue, so the producer issues the next
// tile's first K / V tiles (up to kStages, each after its kv_empty wait) while they still store
// the last tile's O; only then does it wait for q_empty (every consumer thread past the last
// tile's S MMAs) to hand the tile out and load its Q into Q's rows, also while the epilogue runs
// (docs/lab/2026-12-04-hopper-walk-part-3.md). A tile whose V tail is to be zeroed issues its
// early K / V tiles alike, but zeroes the tail of its first and makes its v_tail_ready arrival
// only after the hand-out: the next tile's first stage may have been released two key tiles
// back, before the consumers waited the last tile's v_tail_ready phase (a second arrival then
// would complete a phase not yet awaited); q_empty comes after that wait, in their main loop,
// so the hand-out orders it. The pingpong's named barriers balance
// within each tile (fwd_sm90_kernel.cuh), so nothing of them carries over.
//
// Which kernels walk is a compile-time property (fwd_sm90_walks): the dense 16-bit kernels
// without softcap, ALiBi, attn_mask, dropout or a gathered KV cache whose walk passes the strict
// gate (no spills): at d = 64 no mask, causal and local; at d = 128 no mask and causal. Their
// producer works each tile out with 40 registers (at 24 and 32 it spilled) and the consumers
// keep 232 (2 x 232 + 40 fills the register file); at d = 128 with a window and at d = 256 the
// consumers spilled at 232 (24-116 bytes), and at 240 the producer does. Every other kernel runs
// one tile per CTA, its code as before the walk (FwdSm90OneTile's constants fold away).
#pragma once
#include <cstdint>

#include "cuda/hopper/fwd_sm90_tile_order.h"
#include "cuda/ptx.cuh"
#include "host_device.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn::hopper {

// Registers of a walking kernel's producer and consumers (setmaxnreg; see above).
constexpr int kFwdSm90WalkProducerRegisters = 40;
constexpr int kFwdSm90WalkConsumerRegisters = 232;

// A kernel that does not walk: its one tile, with the ring and v_tail_ready from their first phase.
struct FwdSm90OneTile {
  static constexpr bool kOn = false;
  static constexpr int kv_base = 0;
  static constexpr uint32_t v_tail_parity = 0;
  __device__ __forceinline__ static int role(int group) { return group; }  // 0: the producer
};

#if defined(__CUDACC__) || defined(FLASHATTN_CUDASIM)
// A CTA's place after its first (blockIdx.x): the grid's places are taken, so the next one past
// them from the call's counter (zeroed by the launch), or `places` (the walk is over). A grid
// covering every place (fwd_sm90_walk_counts false) never reads the counter, which such a call
// does not have. Compared before the add, so that no sum wraps.
__device__ __forceinline__ unsigned fwd_sm90_next_place(unsigned* counter, unsigned places) {
  if (gridDim.x >= places) return places;
  const unsigned taken = atomicAdd(counter, 1u);  // SITE:next_place
  return taken < places - gridDim.x ? gridDim.x + taken : places;
}

// One role's state across the tiles of a walking CTA: the producer's thread 0 (kProducer) or a
// consumer thread.
template <bool kProducer>
struct FwdSm90Walk {
  static constexpr bool kOn = true;
  // Handed out after the last tile.
  __device__ __forceinline__ static FwdSm90Tile end() { return {-1, 0, 0, 0}; }
  int kv_base = 0;             // key tiles of the earlier tiles (the ring's running count)
  uint32_t v_tail_parity = 0;  // consumers: the parity of v_tail_ready's next phase
  int handed = 0;              // tiles handed out (producer) or taken (consumers), the end's too

  __device__ __forceinline__ static int role(int) { return kProducer ? 0 : 1; }

  // Producer: hands `tile` to the consumers once they are done with the last one; without a Q
  // load (loads_q false: a tile without key tiles, or the end) completes q_full by itself. The
  // tile itself, not its place, so that the consumers hold nothing of the order.
  __device__ __forceinline__ void hand_out(uint64_t* q_full, uint64_t* q_empty, FwdSm90Tile* slot,
                                           FwdSm90Tile tile, bool loads_q) {
    if (handed > 0) ptx::mbarrier_wait_parity(q_empty, static_cast<uint32_t>(handed - 1) & 1);  // SITE:q_empty_wait
    int* fields = reinterpret_cast<int*>(slot);  // 8-byte aligned (after the mbarriers)
    FLASHATTN_SMEM(fields)[0] = tile.m_block;
    FLASHATTN_SMEM(fields)[1] = tile.split;
    FLASHATTN_SMEM(fields)[2] = tile.head;
    FLASHATTN_SMEM(fields)[3] = tile.batch;
    ++handed;
    if (!loads_q) ptx::mbarrier_arrive(q_full);
  }
  // Consumers: the next tile (end()'s m_block < 0), once q_full says it (and its Q) is there.
  __device__ __forceinline__ FwdSm90Tile take(uint64_t* q_full, FwdSm90Tile* slot) {
    ptx::mbarrier_wait_parity(q_full, static_cast<uint32_t>(handed) & 1);
    ++handed;
    const int* fields = reinterpret_cast<const int*>(slot);
    return {FLASHATTN_SMEM(fields)[0], FLASHATTN_SMEM(fields)[1], FLASHATTN_SMEM(fields)[2], FLASHATTN_SMEM(fields)[3]};
  }
  // Consumers, after a tile's main loop.
  __device__ __forceinline__ void end_consumer_tile(int n_blocks, bool zero_v_tail) {
    kv_base += n_blocks;  // SITE:walk_kv_base
    v_tail_parity ^= zero_v_tail ? 1u : 0u;
  }
};
#endif

}  // namespace flashattn::hopper
