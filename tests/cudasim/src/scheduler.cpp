// Runs one block as an event loop. Every thread is runnable or blocked on an object (a named
// barrier, a warp or warpgroup collective, an mbarrier phase); an object whose state changes
// wakes its waiters. The loop visits the warps in rounds, in the schedule's order, and runs each
// runnable warp until all its lanes block or return. When no thread can run, an asynchronous
// copy in flight lands (the latest moment it may); when none is in flight either, the block is
// deadlocked.
#include "block.h"
#include "schedule.h"
#include "warpgroup.h"

thread_local uint3 threadIdx;

namespace cudasim::detail {
namespace {

// Checks a returning thread leaves nothing behind that its warp or shared memory awaits.
void check_thread_exit(SimBlock& block, SimThread& self) {
  const Site exit_site{"", 0};
  // The oldest copy still in flight. Committed groups may be empty (a commit with no copy
  // since the last one): they are legal to leave behind, and are skipped.
  const PendingCopy* pending = nullptr;
  for (const std::vector<PendingCopy>& group : self.copy_groups) {
    if (!group.empty()) {
      pending = &group.front();
      break;
    }
  }
  if (pending == nullptr && !self.uncommitted_copies.empty()) {
    pending = &self.uncommitted_copies.front();
  }
  if (pending != nullptr) {
    fail(pending->site,
         "cp.async issued here is still pending when the thread returns (missing "
         "cp_async_wait / cp_async_wait_all)");
  }
  const uint32_t bit = 1u << self.lane;
  for (const OpenCollective& open : block.warps[self.warp].open) {
    if (open.mask & bit) {
      fail(exit_site, std::string("thread returns while lanes ") + lane_list(open.arrived) +
                          " wait for it in " + open.op + " at " + describe(open.site) +
                          " (mask " + hex(open.mask) + ")");
    }
  }
  const unsigned group = self.warp / kWarpgroupWarps;
  if (group < block.warpgroups.size() && block.warpgroups[group].arrived != 0) {
    const OpenWarpgroupCollective& open = block.warpgroups[group];
    fail(exit_site, "thread returns while " + std::to_string(open.arrived) +
                        " threads of warpgroup " + std::to_string(group) + " wait for it in " +
                        open.op + " at " + describe(open.site));
  }
  check_warpgroup_async_at_exit(block, self);  // wgmma in flight, setmaxnreg's budget
}

void thread_body(void* arg) {
  SimThread& self = *static_cast<SimThread*>(arg);
  SimBlock& block = active_block("thread start");
  try {
    (*block.run_one_thread)();
    check_thread_exit(block, self);
  } catch (...) {
    if (!block.error) block.error = std::current_exception();
  }
  self.status = ThreadStatus::Exited;
  block.warps[self.warp].exited |= 1u << self.lane;
  block.live_threads -= 1;
  try {
    barrier_thread_exited(block);  // __syncthreads waits for one thread fewer
  } catch (...) {
    if (!block.error) block.error = std::current_exception();
  }
  self.fiber->finish();
}

void resume(SimBlock& block, SimThread& thread) {
  block.current = &thread;
  threadIdx = thread.idx;
  thread.fiber->resume();
  block.current = nullptr;
  if (block.error) std::rethrow_exception(block.error);
}

// Lanes run one after another until each has returned or blocks (a barrier, an mbarrier, or a
// collective that other lanes have yet to reach).
void run_warp(SimBlock& block, const SimWarp& warp, Permuter& order) {
  const std::vector<unsigned> lanes = order.permutation(warp.num_lanes);
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (unsigned lane : lanes) {
      SimThread& thread = block.threads[warp.first_thread + lane];
      if (thread.status == ThreadStatus::Ready) {
        resume(block, thread);
        progressed = true;
      }
    }
  }
}

// Makes the threads that state changes woke runnable; the running warp has blocked by now.
void apply_wakeups(SimBlock& block) {
  if (block.syncthreads_released) {
    // Every live thread is at the barrier: its lanes' accesses form complete warp instructions.
    block.syncthreads_released = false;
    flush_accesses(block);
    count_barrier(block);
  }
  for (unsigned index : block.woken) {
    SimThread& thread = block.threads[index];
    if (thread.status != ThreadStatus::Exited) thread.status = ThreadStatus::Ready;
  }
  block.woken.clear();
}

// Under random completion every copy in flight lands here with probability 1/2: copies land
// at reproducible but arbitrary points between warps.
void land_some_copies(SimBlock& block, Permuter& order) {
  for (size_t i = 0; i < block.async.in_flight.size();) {
    if (order.below(2) == 0) {
      complete_async_copy(block, i);
      apply_wakeups(block);
    } else {
      ++i;
    }
  }
}

bool any_ready(const SimBlock& block) {
  for (const SimThread& thread : block.threads) {
    if (thread.status == ThreadStatus::Ready) return true;
  }
  return false;
}

// Whether a thread outside warpgroup `group` can run (CUDASIM_STALL_WARPGROUP).
bool any_ready_outside(const SimBlock& block, unsigned group) {
  for (const SimThread& thread : block.threads) {
    if (thread.status == ThreadStatus::Ready && thread.warp / kWarpgroupWarps != group) return true;
  }
  return false;
}

void reset(SimBlock& block) {
  for (SimThread& thread : block.threads) {
    thread.status = ThreadStatus::Ready;
    thread.mailbox = LaneMailbox{};
    thread.uncommitted_copies.clear();
    thread.copy_groups.clear();
    thread.accesses.clear();
    thread.fiber->reset(&thread_body, &thread);
  }
  for (SimWarp& warp : block.warps) {
    warp.exited = 0;
    warp.open.clear();
  }
  for (OpenWarpgroupCollective& open : block.warpgroups) open = OpenWarpgroupCollective{};
  for (NamedBarrier& barrier : block.barriers) {
    barrier.arrived = 0;
    barrier.waiters.clear();  // keeps its capacity for the next block
  }
  block.live_threads = static_cast<unsigned>(block.threads.size());
  reset_warpgroup_async_state(block);  // wgmma groups, setmaxnreg, proxy records
  block.mbarriers.clear();
  block.async.in_flight.clear();
  block.woken.clear();
  block.syncthreads_released = false;
}

}  // namespace

void run_block(SimBlock& block, Permuter& order) {
  reset(block);
  const bool random_landing = block.async.completion == CopyCompletion::Random;
  const int stalled = stalled_warpgroup();
  for (;;) {
    // A round: every warp in the schedule's order (a kernel without asynchronous copies draws
    // exactly the permutations it always did, so its runs are unchanged). A stalled warpgroup's
    // warps are passed over while any other thread can run.
    for (unsigned w : order.permutation(static_cast<unsigned>(block.warps.size()))) {
      if (stalled >= 0 && w / kWarpgroupWarps == static_cast<unsigned>(stalled) &&
          any_ready_outside(block, static_cast<unsigned>(stalled))) {
        continue;
      }
      if (random_landing && !block.async.in_flight.empty()) land_some_copies(block, order);
      run_warp(block, block.warps[w], order);
      apply_wakeups(block);
    }
    while (!any_ready(block)) {
      if (block.live_threads == 0) {
        check_no_copy_in_flight(block);
        flush_accesses(block);
        return;
      }
      if (block.async.in_flight.empty()) {
        throw SimError("cudasim: deadlock in " + block_name(block) +
                       " (no thread can run and no copy is in flight): " +
                       describe_waiters(block));
      }
      // Lazily, the oldest copy lands only now; randomly, any of them.
      const size_t n = block.async.in_flight.size();
      complete_async_copy(block, random_landing ? order.below(static_cast<unsigned>(n)) : 0);
      apply_wakeups(block);
    }
  }
}

}  // namespace cudasim::detail
