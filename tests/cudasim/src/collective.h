// The rendezvous behind every warp collective: each lane posts its operands in its mailbox
// and blocks; the last lane of the mask to arrive computes every lane's result. Internal.
#pragma once
#include <functional>

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

// Returns once all lanes of call.mask have arrived and `compute` (run in the last one) has
// filled every lane's mailbox result. compute receives the warp's threads, indexed by lane.
void rendezvous(const CollectiveCall& call,
                const std::function<void(SimThread* const* lanes, uint32_t mask)>& compute);

}  // namespace cudasim::detail
