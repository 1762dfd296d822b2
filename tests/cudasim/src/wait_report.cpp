// What every thread of a block waits on, for the deadlock and divergent-barrier messages:
// "threads 0-31 (warp 0) wait in bar.sync at k.cu:50 (barrier 1: 64 of 128 threads arrived);
// threads 128-159 (warp 4) wait in mbarrier.try_wait.parity at k.cu:40 on the mbarrier at
// smem+0x100 for parity 1: phase 1, 1 of 2 arrivals, 128 tx bytes pending; ..."
#include <cstring>
#include <sstream>

#include "block.h"
#include "warpgroup.h"

namespace cudasim::detail {
namespace {

// Whether b continues a's group: same state, op, site and object waited on.
bool same_wait(const SimThread& a, const SimThread& b) {
  if (a.status != b.status) return false;
  if (a.status == ThreadStatus::Exited || a.status == ThreadStatus::Ready) return true;
  if (std::strcmp(a.wait_op, b.wait_op) != 0 || !same_site(a.wait_site, b.wait_site)) {
    return false;
  }
  switch (a.status) {
    case ThreadStatus::AtBarrier: return a.barrier_id == b.barrier_id;
    case ThreadStatus::AtMbarrier:
      return a.mbarrier == b.mbarrier && a.mbarrier_phase == b.mbarrier_phase;
    case ThreadStatus::InWarpgroupCollective: return a.warp / kWarpgroupWarps ==
                                                     b.warp / kWarpgroupWarps;
    default: return true;
  }
}

// The state of the object a blocked thread waits on.
std::string waited_object(const SimBlock& block, const SimThread& thread) {
  switch (thread.status) {
    case ThreadStatus::AtBarrier: return " (" + describe_barrier(block, thread.barrier_id) + ")";
    case ThreadStatus::AtMbarrier:
      return " on the mbarrier at " + smem_location(block, thread.mbarrier) + " for parity " +
             std::to_string(thread.mbarrier_phase & 1) + ": " +
             describe_mbarrier(block, thread.mbarrier);
    case ThreadStatus::InWarpgroupCollective:
      return " (" + describe_warpgroup(block, thread.warp / kWarpgroupWarps) + ")";
    default: return "";
  }
}

// " (warp 2)" or " (warps 0-3)" when [first, last] is made of whole warps, else "".
std::string whole_warps(const SimBlock& block, size_t first, size_t last) {
  const SimThread& head = block.threads[first];
  const SimThread& tail = block.threads[last];
  if (head.lane != 0 || tail.lane + 1 != block.warps[tail.warp].num_lanes) return "";
  if (head.warp == tail.warp) return " (warp " + std::to_string(head.warp) + ")";
  return " (warps " + std::to_string(head.warp) + "-" + std::to_string(tail.warp) + ")";
}

}  // namespace

std::string describe_waiters(const SimBlock& block) {
  std::ostringstream out;
  const size_t n = block.threads.size();
  for (size_t first = 0; first < n;) {
    const SimThread& head = block.threads[first];
    size_t last = first;
    while (last + 1 < n && same_wait(head, block.threads[last + 1])) ++last;
    if (first > 0) out << "; ";
    out << (first == last ? "thread " : "threads ") << first;
    if (last > first) out << "-" << last;
    out << whole_warps(block, first, last);
    if (head.status == ThreadStatus::Exited) {
      out << " returned";
    } else if (head.status == ThreadStatus::Ready) {
      out << (first == last ? " is" : " are") << " runnable";
    } else {
      out << (first == last ? " waits in " : " wait in ") << head.wait_op << " at "
          << describe(head.wait_site) << waited_object(block, head);
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

}  // namespace cudasim::detail
