// bar.sync / bar.arrive on the 16 named barriers, and __syncthreads as bar.sync 0 for every live
// thread. A generation completes at its count-th arrival. Even the thread that completes it
// blocks, and the waiters resume only once the running warp has blocked: so __syncthreads keeps
// the order the shim always had (every warp runs up to the barrier, then a new round starts).
#include <cstring>

#include "block.h"

namespace cudasim::detail {
namespace {

unsigned threads_needed(const SimBlock& block, const NamedBarrier& barrier) {
  return barrier.count == kEveryLiveThread ? block.live_threads : barrier.count;
}

std::string count_text(unsigned count) {
  return count == kEveryLiveThread ? "every live thread" : std::to_string(count) + " threads";
}

// A barrier for every live thread is __syncthreads' contract: all of them at one call site.
// Threads meeting at different ones are an error, not a hang.
void check_one_site(const SimBlock& block, const NamedBarrier& barrier) {
  const SimThread& first = block.threads[barrier.waiters.front()];
  for (unsigned index : barrier.waiters) {
    const SimThread& other = block.threads[index];
    if (!same_site(other.wait_site, first.wait_site) || std::strcmp(other.wait_op, first.wait_op)) {
      throw SimError("cudasim: divergent " + std::string(first.wait_op) + " in " +
                     block_name(block) + " (every live thread must reach the same " +
                     first.wait_op + "): " + describe_waiters(block));
    }
  }
}

void complete_if_done(SimBlock& block, unsigned id) {
  NamedBarrier& barrier = block.barriers[id];
  if (barrier.arrived == 0 || barrier.arrived < threads_needed(block, barrier)) return;
  if (barrier.count == kEveryLiveThread) {
    if (!barrier.waiters.empty()) check_one_site(block, barrier);
    block.syncthreads_released = true;
  }
  for (unsigned index : barrier.waiters) wake_later(block, index);
  barrier.waiters.clear();
  barrier.arrived = 0;
}

// Counts the current thread into barrier `id`'s open generation (opening one if none is).
NamedBarrier& arrive(SimBlock& block, unsigned id, unsigned count, const char* op,
                     const Site& site) {
  // Messages are built only on failure: __syncthreads passes here once per thread.
  const auto what = [&] { return std::string(op) + " " + std::to_string(id); };
  if (id >= kNamedBarriers) {
    fail(site, what() + ": barrier ids are 0 to " + std::to_string(kNamedBarriers - 1));
  }
  if (count % kWarpSize != 0 || count > block.threads.size()) {
    fail(site, what() + ", " + std::to_string(count) + ": the thread count must be a multiple " +
                   "of 32 and at most the block's " + std::to_string(block.threads.size()));
  }
  NamedBarrier& barrier = block.barriers[id];
  if (barrier.arrived == 0) {
    barrier.count = count;
    barrier.first_op = op;
    barrier.first_site = site;
  } else if (barrier.count != count) {
    fail(site, "named barrier count mismatch: " + what() + " with " + count_text(count) +
                   ", but this generation of barrier " + std::to_string(id) + " was opened by " +
                   barrier.first_op + " at " + describe(barrier.first_site) + " with " +
                   count_text(barrier.count) + " (" + std::to_string(barrier.arrived) +
                   " arrived so far)");
  }
  barrier.arrived += 1;
  return barrier;
}

void sync(unsigned id, unsigned count, const char* op, const Site& site) {
  SimBlock& block = active_block(op);
  SimThread& self = current_thread(op);
  NamedBarrier& barrier = arrive(block, id, count, op, site);
  // Blocked first: a divergence found while completing describes this thread too.
  self.status = ThreadStatus::AtBarrier;
  self.wait_op = op;
  self.wait_site = site;
  self.barrier_id = id;
  barrier.waiters.push_back(thread_index(self));
  complete_if_done(block, id);
  self.fiber->suspend();
}

}  // namespace

void syncthreads(const char* file, int line) {
  sync(0, kEveryLiveThread, "__syncthreads", Site{file, line});
}

void barrier_sync(unsigned id, unsigned threads, const char* file, int line) {
  sync(id, threads, "bar.sync", Site{file, line});
}

void barrier_arrive(unsigned id, unsigned threads, const char* file, int line) {
  const Site site{file, line};
  if (threads == kEveryLiveThread) {
    fail(site, "bar.arrive " + std::to_string(id) + " needs a thread count (bar.arrive a, b)");
  }
  SimBlock& block = active_block("bar.arrive");
  current_thread("bar.arrive");
  arrive(block, id, threads, "bar.arrive", site);
  complete_if_done(block, id);
}

void barrier_thread_exited(SimBlock& block) {
  for (unsigned id = 0; id < kNamedBarriers; ++id) {
    if (block.barriers[id].count == kEveryLiveThread) complete_if_done(block, id);
  }
}

std::string describe_barrier(const SimBlock& block, unsigned id) {
  const NamedBarrier& barrier = block.barriers[id];
  const bool everyone = barrier.count == kEveryLiveThread;
  return "barrier " + std::to_string(id) + ": " + std::to_string(barrier.arrived) + " of " +
         std::to_string(threads_needed(block, barrier)) + (everyone ? " live" : "") +
         " threads arrived";
}

}  // namespace cudasim::detail
