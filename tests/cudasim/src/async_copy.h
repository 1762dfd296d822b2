// The asynchronous copy engine: bulk copies (TMA) land in shared memory some time after they
// are issued and then deliver their bytes to an mbarrier with complete_tx. When they land is
// the launch's CopyCompletion: lazy (only when no thread can run), eager (at issue) or at
// random scheduling points. Internal to the shim.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>

#include "cudasim.h"
#include "site.h"

namespace cudasim::detail {

struct SimBlock;

struct AsyncCopy {
  Site site;                       // the kernel line that issued it
  unsigned issuer = 0;             // the issuing thread, by index in the block
  const void* mbarrier = nullptr;  // receives complete_tx(tx_bytes) once the copy has landed
  uint32_t tx_bytes = 0;
  std::function<void()> land;      // writes the destination; runs when the copy completes
};

struct AsyncEngine {
  CopyCompletion completion = CopyCompletion::Lazy;
  std::deque<AsyncCopy> in_flight;  // oldest first
};

// Queues a copy; under eager completion it completes before this returns.
void issue_async_copy(SimBlock& block, AsyncCopy copy);
// Lands in_flight[index] and delivers its bytes to its mbarrier (which may wake waiters).
void complete_async_copy(SimBlock& block, size_t index);
// Throws SimError naming the oldest copy still in flight, if any: called when every thread of
// the block has returned, as the block's shared memory is gone then.
void check_no_copy_in_flight(const SimBlock& block);

}  // namespace cudasim::detail
