// The 16 named barriers of a block (bar.sync / bar.arrive id, count); __syncthreads is bar.sync
// 0 for every live thread. Internal to the shim.
#pragma once
#include <string>
#include <vector>

#include "site.h"

namespace cudasim::detail {

struct SimBlock;

constexpr unsigned kNamedBarriers = 16;
// The count of bar.sync without one (and of __syncthreads): every thread that has not returned.
constexpr unsigned kEveryLiveThread = 0;

// The open generation of one named barrier. Its first arrival sets the count that every later
// participant must repeat; it completes when `count` threads have arrived, which wakes the
// threads blocked in bar.sync and leaves the barrier ready for its next generation.
struct NamedBarrier {
  unsigned count = 0;    // threads, or kEveryLiveThread; meaningful while arrived > 0
  unsigned arrived = 0;  // threads arrived in this generation, by bar.sync or bar.arrive
  std::vector<unsigned> waiters;  // threads blocked in bar.sync, by index in the block
  const char* first_op = "";      // the generation's first arrival, for mismatch messages
  Site first_site;
};

// A thread returned: a barrier for every live thread now waits for one thread fewer, which
// may complete it.
void barrier_thread_exited(SimBlock& block);
// "64 of 128 threads arrived", for the deadlock report.
std::string describe_barrier(const SimBlock& block, unsigned id);

}  // namespace cudasim::detail
