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

// ---- The warpgroup's asynchronous state: wgmma groups in flight, setmaxnreg, and the
// generic/async proxy records of shared memory (wgmma.cpp, async_proxy.cpp). ----
// Forgets the previous block's state; the scheduler calls it before each block runs.
void reset_warpgroup_async_state(const SimBlock& block);
void reset_async_proxy(const SimBlock& block);
// A thread returns: an MMA of its warpgroup still in flight is an error naming its line. The
// last thread of the block also checks setmaxnreg's register budget.
void check_warpgroup_async_at_exit(const SimBlock& block, const SimThread& self);
// note_generic_smem_store() on behalf of thread `thread` (stmatrix writes each row for the lane
// that gave its address).
void note_generic_smem_store_by(unsigned thread, const void* smem, size_t bytes, const char* file,
                                int line);

// Counters (counters.cpp), each a no-op unless the launch counts.
enum class WgmmaSync : uint8_t { Fence, Commit, Wait };
// input: 0 f16, 1 bf16, 2 e4m3 (Counters::wgmma's first index); k: 16 or 32.
void count_wgmma(SimBlock& block, int n, int input, int k, bool a_from_registers);
void count_wgmma_sync(SimBlock& block, WgmmaSync kind);
void count_setmaxnreg(SimBlock& block, bool increase);
void count_fence_proxy_async(SimBlock& block);
void count_stmatrix(SimBlock& block, int num_matrices, bool transpose, SimThread* const* lanes);

}  // namespace cudasim::detail
