// The rendezvous behind warpgroup collectives (wgmma): the 4 warps of a warpgroup (warps 4g to
// 4g+3, 128 threads) must all reach the same call. Each thread posts a pointer to its operands
// and blocks; the last to arrive computes every thread's results. Internal to the shim.
#pragma once
#include "block.h"

namespace cudasim::detail {

struct WarpgroupCall {
  const char* op;  // e.g. "wgmma.mma_async", for messages
  Site site;       // an .aligned instruction: every thread calls it from this one site
};

// Blocks until all 128 threads of the caller's warpgroup have arrived at `call`. Returns true
// in the last to arrive, with `threads` holding the warpgroup's threads in order: it must fill
// in every thread's results and then call warpgroup_release(). Returns false in the others,
// once their results are in place.
bool warpgroup_arrive(const WarpgroupCall& call, SimThread* (&threads)[kWarpgroupThreads]);
// Wakes the warpgroup and blocks the last thread with it: all 128 resume once the running warp
// has blocked, so a warpgroup collective is a scheduling point like a barrier.
void warpgroup_release(const WarpgroupCall& call);

// compute(threads) runs once, in the last thread to arrive; each thread's `operands` pointer
// is in threads[i]->mailbox.operands. A template, not std::function: threads abandoned by an
// error never return, so nothing they hold may own heap memory (see collective.h).
template <class Compute>
void warpgroup_rendezvous(const WarpgroupCall& call, void* operands, Compute&& compute) {
  current_thread(call.op).mailbox.operands = operands;
  SimThread* threads[kWarpgroupThreads] = {};
  if (warpgroup_arrive(call, threads)) {
    compute(static_cast<SimThread* const*>(threads));
    warpgroup_release(call);
  }
}

// "warpgroup 1: 96 of 128 threads arrived", for the deadlock report.
std::string describe_warpgroup(const SimBlock& block, unsigned group);

}  // namespace cudasim::detail
