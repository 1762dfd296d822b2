// Runs one block: a warp at a time between barriers, in the schedule's order, and checks
// that every barrier is met by all live threads at one call site.
#include <sstream>

#include "block.h"
#include "schedule.h"

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
  if (pending == nullptr && !self.uncommitted_copies.empty()) pending = &self.uncommitted_copies.front();
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
  self.fiber->finish();
}

void resume(SimBlock& block, SimThread& thread) {
  block.current = &thread;
  threadIdx = thread.idx;
  thread.fiber->resume();
  block.current = nullptr;
  if (block.error) std::rethrow_exception(block.error);
}

// Lanes run one after another until each has returned or blocks (barrier, or a collective
// that other lanes have yet to reach).
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

std::string block_name(const SimBlock& block) {
  std::ostringstream out;
  out << "kernel " << block.kernel_name << ", block (" << block.idx.x << "," << block.idx.y << ","
      << block.idx.z << ")";
  return out.str();
}

// "threads 0-31 wait in __syncthreads at k.cu:10; thread 32 ..." over the live threads.
std::string describe_waiters(const SimBlock& block) {
  std::ostringstream out;
  const size_t n = block.threads.size();
  for (size_t first = 0; first < n;) {
    const SimThread& head = block.threads[first];
    size_t last = first;
    while (last + 1 < n) {
      const SimThread& next = block.threads[last + 1];
      if (next.status != head.status || std::string(next.wait_op) != head.wait_op ||
          (head.status != ThreadStatus::Exited && !same_site(next.wait_site, head.wait_site))) {
        break;
      }
      ++last;
    }
    if (first > 0) out << "; ";
    out << (first == last ? "thread " : "threads ") << first;
    if (last > first) out << "-" << last;
    if (head.status == ThreadStatus::Exited) {
      out << " returned";
    } else {
      out << (first == last ? " waits in " : " wait in ") << head.wait_op << " at "
          << describe(head.wait_site);
    }
    first = last + 1;
  }
  for (size_t w = 0; w < block.warps.size(); ++w) {
    for (const OpenCollective& open : block.warps[w].open) {
      out << "; warp " << w << "'s " << open.op << " at " << describe(open.site) << " (mask "
          << hex(open.mask) << ") still misses lanes " << lane_list(open.mask & ~open.arrived);
    }
  }
  return out.str();
}

// Every thread has returned or is blocked. Release the barrier if every live thread waits at
// the same __syncthreads; anything else can never make progress.
void release_barrier(SimBlock& block) {
  const SimThread* first_waiter = nullptr;
  bool deadlock = false, divergent = false;
  for (const SimThread& thread : block.threads) {
    if (thread.status == ThreadStatus::Exited) continue;
    if (thread.status != ThreadStatus::AtBarrier) {
      deadlock = true;
    } else if (first_waiter == nullptr) {
      first_waiter = &thread;
    } else if (!same_site(first_waiter->wait_site, thread.wait_site)) {
      divergent = true;
    }
  }
  if (deadlock) {
    throw SimError("cudasim: deadlock in " + block_name(block) + ": " + describe_waiters(block));
  }
  if (divergent) {
    throw SimError("cudasim: divergent __syncthreads in " + block_name(block) +
                   " (every live thread must reach the same __syncthreads): " +
                   describe_waiters(block));
  }
  flush_accesses(block);
  count_barrier(block);
  for (SimThread& thread : block.threads) {
    if (thread.status == ThreadStatus::AtBarrier) thread.status = ThreadStatus::Ready;
  }
}

bool all_exited(const SimBlock& block) {
  for (const SimThread& thread : block.threads) {
    if (thread.status != ThreadStatus::Exited) return false;
  }
  return true;
}

}  // namespace

void run_block(SimBlock& block, Permuter& order) {
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
  for (;;) {
    for (unsigned w : order.permutation(static_cast<unsigned>(block.warps.size()))) {
      run_warp(block, block.warps[w], order);
    }
    if (all_exited(block)) {
      flush_accesses(block);
      return;
    }
    release_barrier(block);
  }
}

void syncthreads(const char* file, int line) {
  block_current_thread(ThreadStatus::AtBarrier, "__syncthreads", Site{file, line});
}

}  // namespace cudasim::detail
