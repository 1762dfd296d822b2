#include "warpgroup.h"

#include <cstring>

namespace cudasim::detail {
namespace {

unsigned group_of(const SimThread& thread) { return thread.warp / kWarpgroupWarps; }

void validate(const WarpgroupCall& call, const SimBlock& block, unsigned group) {
  const std::string name = "warpgroup " + std::to_string(group);
  const size_t first = size_t{group} * kWarpgroupThreads;
  if (first + kWarpgroupThreads > block.threads.size()) {
    fail(call.site, std::string(call.op) + " is a warpgroup collective, but " + name +
                        " has only " + std::to_string(block.threads.size() - first) +
                        " threads (it needs 4 full warps)");
  }
  for (unsigned w = group * kWarpgroupWarps; w < (group + 1) * kWarpgroupWarps; ++w) {
    if (block.warps[w].exited != 0) {
      fail(call.site, std::string(call.op) + ": lanes " + lane_list(block.warps[w].exited) +
                          " of warp " + std::to_string(w) + " in " + name +
                          " have already returned");
    }
  }
}

}  // namespace

bool warpgroup_arrive(const WarpgroupCall& call, SimThread* (&threads)[kWarpgroupThreads]) {
  SimBlock& block = active_block(call.op);
  SimThread& self = current_thread(call.op);
  const unsigned group = group_of(self);
  validate(call, block, group);
  OpenWarpgroupCollective& open = block.warpgroups[group];
  if (open.arrived == 0) {
    open.op = call.op;
    open.site = call.site;
  } else if (std::strcmp(open.op, call.op) != 0 || !same_site(open.site, call.site)) {
    fail(call.site, "threads of one warpgroup meet different collectives: this thread calls " +
                        std::string(call.op) + " while " + std::to_string(open.arrived) +
                        " threads of warpgroup " + std::to_string(group) + " wait in " +
                        open.op + " at " + describe(open.site));
  }
  open.arrived += 1;
  if (open.arrived < kWarpgroupThreads) {
    block_current_thread(ThreadStatus::InWarpgroupCollective, call.op, call.site);
    return false;  // the last thread has filled in our results
  }
  for (unsigned i = 0; i < kWarpgroupThreads; ++i) {
    threads[i] = &block.threads[group * kWarpgroupThreads + i];
  }
  return true;
}

void warpgroup_release(const WarpgroupCall& call) {
  SimBlock& block = active_block(call.op);
  const unsigned group = group_of(current_thread(call.op));
  block.warpgroups[group].arrived = 0;
  for (unsigned i = 0; i < kWarpgroupThreads; ++i) {
    wake_later(block, group * kWarpgroupThreads + i);
  }
  block_current_thread(ThreadStatus::InWarpgroupCollective, call.op, call.site);
}

std::string describe_warpgroup(const SimBlock& block, unsigned group) {
  return "warpgroup " + std::to_string(group) + ": " +
         std::to_string(block.warpgroups[group].arrived) + " of " +
         std::to_string(kWarpgroupThreads) + " threads arrived";
}

}  // namespace cudasim::detail
