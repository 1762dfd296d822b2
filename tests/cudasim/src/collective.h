// The rendezvous behind every warp collective: each lane posts its operands in its mailbox
// and blocks; the last lane of the mask to arrive computes every lane's result. Internal.
#pragma once
#include "block.h"

namespace cudasim::detail {

struct CollectiveCall {
  const char* op;   // e.g. "__shfl_xor_sync", "ldmatrix.x4.trans", for messages
  Site site;
  uint32_t mask;    // lanes that must all arrive
  // .sync.aligned instructions (ldmatrix, mma): the whole warp must execute the very same
  // instruction, so all 32 lanes must exist and arrive from one call site.
  bool aligned;
};

// Blocks until all lanes of call.mask have arrived. Returns true in the last lane to arrive,
// with `lanes` holding the warp's threads by lane: it must fill every lane's mailbox and then
// call release(). Returns false in the others, whose mailbox then holds their result.
bool arrive(const CollectiveCall& call, SimThread* (&lanes)[kWarpSize]);
void release(const CollectiveCall& call, SimThread* const* lanes);

// compute(lanes, mask) runs once, in the last lane, and fills every lane's mailbox. A template
// rather than std::function: lanes abandoned by an error never return, so nothing they hold may
// own heap memory (LeakSanitizer would report it).
template <class Compute>
void rendezvous(const CollectiveCall& call, Compute&& compute) {
  SimThread* lanes[kWarpSize] = {};
  if (arrive(call, lanes)) {
    compute(static_cast<SimThread* const*>(lanes), call.mask);
    release(call, lanes);
  }
}

}  // namespace cudasim::detail
