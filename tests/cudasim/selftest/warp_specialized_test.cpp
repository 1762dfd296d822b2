// Warp-specialized kernels on the shim: a producer warp feeding consumer warps through a ring of
// mbarriers and bulk copies, two warpgroups taking turns through named barriers, and warpgroup
// collectives; and planted bugs in each, which the shim must report.
//   warp_specialized_test CASE
// Exit status: 0 = correct results, 1 = wrong results (printed), 3 = SimError (printed).
// Lines marked "// SITE:name" are the call sites the tests expect messages to name.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda/ptx.cuh"
#include "src/warpgroup.h"
#include "named_cases.h"

namespace ring {

// A producer warp (warp 0, one elected lane) loads kTiles tiles with bulk copies into a ring of
// kStages stages; two consumer warps read each tile once its "full" mbarrier completes, then
// release the stage on its "empty" mbarrier. Tile t's element i holds t * 1000 + i, so a
// consumer that reads a stage before its copy landed sees the 0xFF poison or an older tile.
constexpr int kStages = 2, kTiles = 6, kTileFloats = 256;
constexpr uint32_t kTileBytes = kTileFloats * sizeof(float);
constexpr int kConsumerWarps = 2, kThreads = 32 * (1 + kConsumerWarps);
constexpr size_t kBarrierBytes = 128;  // full[2] and empty[2]; tiles start 128-byte aligned
constexpr size_t kSmemBytes = kBarrierBytes + kStages * kTileBytes;

enum class Bug {
  None,
  ProducerWrongParity,   // waits on phase 0 of the empty stages, which nobody completes
  ConsumerWrongParity,   // waits on the phase before the one that brings its tile
  MissingExpectTx,       // arrives on "full" without announcing the copy's bytes
  ProducerEveryLane,     // all 32 lanes of the producer arrive and copy, not one
  EmptyNotInitialized,   // forgets mbarrier.init on the second empty barrier
  ConsumerReadsEarly,    // reads the stage first and waits on "full" only then
};

__host__ __device__ inline float value(int tile, int i) { return tile * 1000.f + i; }

template <Bug kBug>
__global__ void pipeline(const float* src, float* out, int* stale) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kStages;
  float* tiles = reinterpret_cast<float*>(smem + kBarrierBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      if (!(kBug == Bug::EmptyNotInitialized && s == 1)) mbarrier_init(&empty[s], kConsumerWarps);
    }
  }
  __syncthreads();

  if (warp == 0) {
    if (lane != 0 && kBug != Bug::ProducerEveryLane) return;
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % kStages;
      const uint32_t phase = (t / kStages) & 1;
      // The first pass finds every stage free: parity 1 is that of the phase before phase 0.
      const uint32_t parity = kBug == Bug::ProducerWrongParity ? phase : phase ^ 1;
      mbarrier_wait_parity(&empty[s], parity);  // SITE:producer_wait
      if (kBug == Bug::MissingExpectTx) {
        mbarrier_arrive(&full[s]);  // SITE:producer_arrive_without_tx
      } else {
        mbarrier_arrive_expect_tx(&full[s], kTileBytes);  // SITE:producer_arrive
      }
      const float* tile = src + t * kTileFloats;
      bulk_copy_g2s(tiles + s * kTileFloats, tile, kTileBytes, &full[s]);  // SITE:producer_copy
    }
    return;
  }

  const int consumer = warp - 1;
  for (int t = 0; t < kTiles; ++t) {
    const int s = t % kStages;
    const uint32_t phase = (t / kStages) & 1;
    constexpr int kPerLane = kTileFloats / 32 / kConsumerWarps;
    const int first = consumer * (kTileFloats / kConsumerWarps) + lane;
    float v[kPerLane];
    if (kBug == Bug::ConsumerReadsEarly) {
      for (int j = 0; j < kPerLane; ++j) v[j] = tiles[s * kTileFloats + first + j * 32];
    }
    const uint32_t parity = kBug == Bug::ConsumerWrongParity ? phase ^ 1 : phase;
    mbarrier_wait_parity(&full[s], parity);  // SITE:consumer_wait
    for (int j = 0; j < kPerLane; ++j) {
      const int i = first + j * 32;
      if (kBug != Bug::ConsumerReadsEarly) v[j] = tiles[s * kTileFloats + i];
      if (!(v[j] == value(t, i))) atomicAdd(stale, 1);
      out[t * kTileFloats + i] = v[j];
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&empty[s]);  // SITE:consumer_release
  }
}

template <Bug kBug>
int run() {
  std::vector<float> src(kTiles * kTileFloats), out(src.size(), -1.f);
  for (int t = 0; t < kTiles; ++t) {
    for (int i = 0; i < kTileFloats; ++i) src[t * kTileFloats + i] = value(t, i);
  }
  int stale = 0;
  cudasim::launch(pipeline<kBug>, dim3(1), dim3(kThreads), kSmemBytes, src.data(), out.data(),
                  &stale);
  const bool wrong = stale != 0 || out != src;
  return selftest::verdict(wrong, "consumers read " + std::to_string(stale) + " stale values");
}

}  // namespace ring

namespace turns {

// Two warpgroups take turns through named barriers, as FA3's consumer warpgroups pingpong:
// barrier 1 + g is "warpgroup g's turn" (the other group's bar.arrive and g's bar.sync, 256
// threads), barrier 3 + g lets group g's 128 threads see the entry its thread 0 wrote. Each turn
// checks that the previous turn's entry is in place.
constexpr int kThreads = 256, kGroupThreads = 128, kTurns = 4;
constexpr size_t kSmemBytes = 2 * kTurns * sizeof(int);

enum class Bug {
  None,
  CountMismatch,  // warp 3 of each group counts its group barrier as 96 threads
  NoHandBack,     // warpgroup 1 never hands the turn back
};

__host__ __device__ inline int entry(int slot) { return 100 * slot + 7; }

template <Bug kBug>
__global__ void pingpong(int* log_out, int* errors) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(int, log);
  const int group = threadIdx.x / kGroupThreads, other = 1 - group;
  const int warp = threadIdx.x / 32;
  for (int k = 0; k < kTurns; ++k) {
    if (group == 1 || k > 0) named_barrier_sync(1 + group, kThreads);  // SITE:wait_turn
    const int slot = 2 * k + group;
    if (slot > 0 && log[slot - 1] != entry(slot - 1)) atomicAdd(errors, 1);
    if (threadIdx.x % kGroupThreads == 0) log[slot] = entry(slot);
    const bool miscount = kBug == Bug::CountMismatch && warp % 4 == 3;
    named_barrier_sync(3 + group, miscount ? 96 : kGroupThreads);  // SITE:group_sync
    if (log[slot] != entry(slot)) atomicAdd(errors, 1);
    const bool last_turn = group == 1 && k == kTurns - 1;
    if (!last_turn && !(kBug == Bug::NoHandBack && group == 1)) {
      named_barrier_arrive(1 + other, kThreads);  // SITE:hand_over
    }
  }
  __syncthreads();
  if (threadIdx.x < 2 * kTurns) log_out[threadIdx.x] = log[threadIdx.x];
}

template <Bug kBug>
int run() {
  std::vector<int> log(2 * kTurns, -1);
  int errors = 0;
  cudasim::launch(pingpong<kBug>, dim3(1), dim3(kThreads), kSmemBytes, log.data(), &errors);
  for (int slot = 0; slot < 2 * kTurns; ++slot) {
    if (log[slot] != entry(slot)) ++errors;
  }
  return selftest::verdict(errors != 0, std::to_string(errors) + " turns out of order");
}

}  // namespace turns

namespace handoff {

// Two warpgroups each write half of a shared array, meet their own warpgroup at a named barrier
// (as consumer warpgroups meet at every wgmma), then read the other half; only the 256-thread
// barrier between the write and the read makes that correct. Without it the shim's plain
// schedules still pass (each warpgroup's own barrier lets the other catch up: they stay in
// step), and CUDASIM_STALL_WARPGROUP=G, which holds warpgroup G back, exposes it.
constexpr int kThreads = 256, kGroupThreads = 128;
constexpr size_t kSmemBytes = kThreads * sizeof(float);

template <bool kBarrier>
__global__ void exchange(float* out) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(float, half);
  const int t = threadIdx.x, group = t / kGroupThreads;
  FLASHATTN_SMEM(half)[t] = t + 1.f;
  named_barrier_sync(1 + group, kGroupThreads);
  if (kBarrier) named_barrier_sync(3, kThreads);  // SITE:both_groups
  out[t] = FLASHATTN_SMEM(half)[(t + kGroupThreads) % kThreads];
}

template <bool kBarrier>
int run() {
  std::vector<float> out(kThreads, -1.f);
  cudasim::launch(exchange<kBarrier>, dim3(1), dim3(kThreads), kSmemBytes, out.data());
  int wrong = 0;
  for (int t = 0; t < kThreads; ++t) wrong += out[t] != (t + kGroupThreads) % kThreads + 1.f;
  return selftest::verdict(wrong != 0, std::to_string(wrong) +
                                           " threads read the other warpgroup's half before it was written");
}

}  // namespace handoff

namespace warpgroups {

// A warpgroup collective built on the shim's rendezvous the way wgmma will be: every thread
// posts its operands, the last of the 128 computes everyone's result.
struct SumOperands {
  int value;
  int* result;
};

__device__ int warpgroup_sum(int value, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  int result = 0;
  SumOperands mine{value, &result};
  warpgroup_rendezvous(WarpgroupCall{"warpgroup_sum", Site{file, line}}, &mine,
                       [](SimThread* const* threads) {
                         int sum = 0;
                         for (unsigned i = 0; i < kWarpgroupThreads; ++i) {
                           sum += static_cast<SumOperands*>(threads[i]->mailbox.operands)->value;
                         }
                         for (unsigned i = 0; i < kWarpgroupThreads; ++i) {
                           *static_cast<SumOperands*>(threads[i]->mailbox.operands)->result = sum;
                         }
                       });
  return result;
}

constexpr int kRounds = 3;

enum class Bug {
  None,
  PartialWarpgroup,  // a 96-thread block: warpgroup 0 lacks a warp
  DifferentSites,    // odd warps call the collective from another line
  WarpReturns,       // warp 3 returns before the collective
};

template <Bug kBug>
__global__ void sums(int* out, int* errors) {
  const int group = threadIdx.x / 128;
  int last = 0;
  for (int k = 1; k <= kRounds; ++k) {
    if (kBug == Bug::WarpReturns && threadIdx.x / 32 == 3) return;
    const int mine = static_cast<int>(threadIdx.x) * k;
    int sum;
    if (kBug == Bug::DifferentSites && threadIdx.x / 32 % 2 == 1) {
      sum = warpgroup_sum(mine);  // SITE:odd_warps
    } else {
      sum = warpgroup_sum(mine);  // SITE:even_warps
    }
    const int first = group * 128;
    if (sum != k * (128 * first + 128 * 127 / 2)) atomicAdd(errors, 1);
    // A warp collective between two warpgroup ones.
    if (__shfl_xor_sync(0xffffffffu, sum, 1) != sum) atomicAdd(errors, 1);
    last = sum;
  }
  out[threadIdx.x] = last;
}

template <Bug kBug>
int run(unsigned threads) {
  std::vector<int> out(threads, -1);
  int errors = 0;
  cudasim::launch(sums<kBug>, dim3(2), dim3(threads), 0, out.data(), &errors);
  for (unsigned t = 0; t < threads; ++t) {
    const int first = static_cast<int>(t / 128 * 128);
    if (out[t] != kRounds * (128 * first + 128 * 127 / 2)) ++errors;
  }
  return selftest::verdict(errors != 0, std::to_string(errors) + " wrong sums");
}

}  // namespace warpgroups

namespace mbarrier_misuse {

using namespace flashattn::ptx;

// One phase that expects 16 tx bytes; a second arrival finds none left to make.
__global__ void arrives_twice() {
  FLASHATTN_DYNAMIC_SMEM(uint64_t, bar);
  mbarrier_init(bar, 1);
  mbarrier_arrive_expect_tx(bar, 16);
  mbarrier_arrive(bar);  // SITE:second_arrival
}

// A copy issued to an mbarrier nobody waits on: the block ends with it in flight.
__global__ void copy_never_awaited(const float* src) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  mbarrier_init(bar, 1);
  mbarrier_arrive_expect_tx(bar, 64);
  bulk_copy_g2s(smem + 128, src, 64, bar);  // SITE:unawaited_copy
}

__global__ void parity_two() {
  FLASHATTN_DYNAMIC_SMEM(uint64_t, bar);
  mbarrier_init(bar, 1);
  mbarrier_wait_parity(bar, 2);  // SITE:parity_two
}

}  // namespace mbarrier_misuse

namespace {

using ring::Bug;

std::vector<float> floats(256);

const selftest::NamedCases kCases = {
    {"ring", ring::run<Bug::None>},
    {"ring_producer_wrong_parity", ring::run<Bug::ProducerWrongParity>},
    {"ring_consumer_wrong_parity", ring::run<Bug::ConsumerWrongParity>},
    {"ring_missing_expect_tx", ring::run<Bug::MissingExpectTx>},
    {"ring_producer_every_lane", ring::run<Bug::ProducerEveryLane>},
    {"ring_empty_not_initialized", ring::run<Bug::EmptyNotInitialized>},
    {"ring_consumer_reads_early", ring::run<Bug::ConsumerReadsEarly>},
    {"handoff", handoff::run<true>},
    {"handoff_no_barrier", handoff::run<false>},
    {"turns", turns::run<turns::Bug::None>},
    {"turns_count_mismatch", turns::run<turns::Bug::CountMismatch>},
    {"turns_no_hand_back", turns::run<turns::Bug::NoHandBack>},
    {"warpgroups", [] { return warpgroups::run<warpgroups::Bug::None>(256); }},
    {"warpgroup_partial", [] { return warpgroups::run<warpgroups::Bug::PartialWarpgroup>(96); }},
    {"warpgroup_different_sites",
     [] { return warpgroups::run<warpgroups::Bug::DifferentSites>(128); }},
    {"warpgroup_warp_returns", [] { return warpgroups::run<warpgroups::Bug::WarpReturns>(128); }},
    {"mbarrier_arrives_twice", [] {
       cudasim::launch(mbarrier_misuse::arrives_twice, dim3(1), dim3(1), 64);
       return 0;
     }},
    {"copy_in_flight_at_exit", [] {
       cudasim::launch(mbarrier_misuse::copy_never_awaited, dim3(1), dim3(1), 256, floats.data());
       return 0;
     }},
    {"mbarrier_parity_two", [] {
       cudasim::launch(mbarrier_misuse::parity_two, dim3(1), dim3(1), 64);
       return 0;
     }},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
