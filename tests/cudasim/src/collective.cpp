#include "collective.h"

#include <cstring>

namespace cudasim::detail {
namespace {

bool same_collective(const OpenCollective& open, const CollectiveCall& call) {
  return open.mask == call.mask && std::strcmp(open.op, call.op) == 0 &&
         (!call.aligned || same_site(open.site, call.site));
}

void validate_mask(const CollectiveCall& call, const SimWarp& warp, const SimThread& self) {
  if (call.aligned && warp.num_lanes != kWarpSize) {
    fail(call.site, std::string(call.op) + " is a warp-wide .aligned instruction, but this warp has only " +
                        std::to_string(warp.num_lanes) + " threads");
  }
  if (!(call.mask >> self.lane & 1u)) {
    fail(call.site, std::string(call.op) + " with mask " + hex(call.mask) +
                        ", which does not include the calling lane " + std::to_string(self.lane));
  }
  if (const uint32_t missing = call.mask & ~warp.existing()) {
    fail(call.site, std::string(call.op) + " with mask " + hex(call.mask) + " names lanes " +
                        lane_list(missing) + ", which do not exist in this warp");
  }
  if (const uint32_t gone = call.mask & warp.exited) {
    fail(call.site, std::string(call.op) + " with mask " + hex(call.mask) + " names lanes " +
                        lane_list(gone) + ", which have already returned");
  }
}

}  // namespace

bool arrive(const CollectiveCall& call, SimThread* (&lanes)[kWarpSize]) {
  SimBlock& block = active_block(call.op);
  SimThread& self = current_thread(call.op);
  SimWarp& warp = block.warps[self.warp];
  validate_mask(call, warp, self);

  size_t slot = warp.open.size();
  for (size_t i = 0; i < warp.open.size(); ++i) {
    if (warp.open[i].mask & call.mask) slot = i;
  }
  if (slot == warp.open.size()) {
    warp.open.push_back(OpenCollective{call.op, call.site, call.mask, 0});
  } else if (!same_collective(warp.open[slot], call)) {
    const OpenCollective& open = warp.open[slot];
    fail(call.site, "lanes of one warp meet different collectives: this lane calls " +
                        std::string(call.op) + " (mask " + hex(call.mask) + ") while lanes " +
                        lane_list(open.arrived) + " wait in " + open.op + " (mask " + hex(open.mask) +
                        ") at " + describe(open.site));
  }
  warp.open[slot].arrived |= 1u << self.lane;
  if (warp.open[slot].arrived != call.mask) {
    block_current_thread(ThreadStatus::InCollective, call.op, call.site);
    return false;  // the last lane has filled our mailbox
  }
  warp.open.erase(warp.open.begin() + static_cast<long>(slot));
  for (unsigned lane = 0; lane < warp.num_lanes; ++lane) {
    lanes[lane] = &block.threads[warp.first_thread + lane];
  }
  return true;
}

void release(const CollectiveCall& call, SimThread* const* lanes) {
  const unsigned self = current_thread(call.op).lane;
  for (unsigned lane = 0; lane < kWarpSize; ++lane) {
    if ((call.mask >> lane & 1u) && lane != self) lanes[lane]->status = ThreadStatus::Ready;
  }
}

}  // namespace cudasim::detail
