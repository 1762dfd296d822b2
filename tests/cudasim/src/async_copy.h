// The asynchronous copy engine: bulk copies (TMA) land in shared memory some time after they
// are issued and then deliver their bytes to an mbarrier with complete_tx. When they land is
// the launch's CopyCompletion: lazy (only when no thread can run), eager (at issue) or at
// random scheduling points. Bulk stores to global memory (tma.cpp) wait in their issuing
// thread's bulk groups instead. Internal to the shim.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

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
  const char* op = "cp.async.bulk";  // for messages: cp.async.bulk or cp.async.bulk.tensor
};

// A bulk store or reduction from shared to global memory (cp.async.bulk[.tensor] ...
// .bulk_group). It snapshots its shared-memory source at issue; the wait_group.read that retires
// its group checks that the source still holds those bytes (hardware may read it any time until
// then), and the wait_group that retires it, or the block's end after a wait_group.read, writes
// global memory from the snapshot.
struct BulkStore {
  Site site;
  unsigned issuer = 0;
  const unsigned char* smem = nullptr;  // the source range it reads
  std::vector<unsigned char> snapshot;  // the range's bytes at issue
  std::function<void(const unsigned char* source)> write;  // performs the global writes
};
struct BulkGroup {
  std::vector<BulkStore> stores;
  bool read = false;  // a wait_group.read retired it: its source may be reused
};
struct ThreadBulkGroups {
  std::vector<BulkStore> uncommitted;
  std::deque<BulkGroup> committed;  // oldest first
};

struct AsyncEngine {
  CopyCompletion completion = CopyCompletion::Lazy;
  std::deque<AsyncCopy> in_flight;  // oldest first
  std::vector<ThreadBulkGroups> bulk;  // by thread index; sized at the block's first bulk store
};

// Queues a copy; under eager completion it completes before this returns.
void issue_async_copy(SimBlock& block, AsyncCopy copy);
// Lands in_flight[index] and delivers its bytes to its mbarrier (which may wake waiters).
void complete_async_copy(SimBlock& block, size_t index);
// Throws SimError naming the oldest copy still in flight, or a bulk store no wait_group.read
// retired, if any: called when every thread of the block has returned, as the block's shared
// memory is gone then. Performs the stores that only a wait_group.read retired, and forgets the
// block's bulk groups.
void check_no_copy_in_flight(SimBlock& block);

// Counting hooks of the sm_90 operations (counters.cpp): each lane's operation is recorded like
// a memory access and grouped into its warp's instructions; bytes are added at issue.
enum Sm90Count : uint8_t {
  kCountMbarrierInit = 200, kCountMbarrierArrive, kCountMbarrierArriveExpectTx,
  kCountMbarrierExpectTx, kCountMbarrierTryWait, kCountMbarrierTestWait, kCountMbarrierInval,
  kCountMbarrierFenceInit, kCountBarSync, kCountBarArrive, kCountBulkLoad, kCountBulkStore,
  kCountBulkReduce, kCountBulkCommit, kCountBulkWait, kCountBulkWaitRead, kCountTmaLoad,
  kCountTmaStore, kCountTmaReduce, kCountTmaPrefetch,
};
void count_sm90(SimBlock& block, Sm90Count kind, uint64_t bytes, const char* file, int line);

}  // namespace cudasim::detail
