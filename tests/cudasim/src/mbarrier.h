// mbarrier objects: arrival counts, transaction bytes and phases, as PTX defines them (PTX
// ISA, "Parallel Synchronization and Communication Instructions: mbarrier"). The state lives
// beside the block, keyed by the object's address in dynamic shared memory. Internal.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "site.h"

namespace cudasim::detail {

struct SimBlock;
struct SimThread;

struct Mbarrier {
  uint32_t expected = 0;  // arrivals per phase: mbarrier.init's count
  uint32_t pending = 0;   // arrivals the current phase still misses
  // Transaction bytes announced by expect_tx and not yet delivered by complete_tx in the
  // current phase. Hardware lets this go negative for a while; the shim requires expect_tx
  // first (see README.md), so a copy that lands on a phase expecting nothing is an error.
  uint32_t tx_bytes = 0;
  uint64_t phase = 0;     // phases completed so far; the current phase's parity is phase & 1
  std::vector<unsigned> waiters;  // threads blocked in try_wait.parity for the current phase
};
using MbarrierTable = std::map<const void*, Mbarrier>;

// complete_tx on behalf of an asynchronous copy that `issuer` issued at `site` (async_copy.cpp):
// the same checks and errors as mbarrier.complete_tx, naming the copy's call site.
void mbarrier_complete_tx_for(SimBlock& block, const void* bar, uint32_t bytes, const Site& site,
                              const SimThread& issuer);
// Throws SimError unless `bar` is an initialized mbarrier: issuing a copy that will complete on
// an mbarrier is a use of it.
void check_mbarrier_initialized(const SimBlock& block, const void* bar, const char* op,
                                const Site& site);
// "smem+0x100" for an address in dynamic shared memory, else the plain address.
std::string smem_location(const SimBlock& block, const void* ptr);
// "phase 0, 1 of 2 arrivals, 128 tx bytes pending", for the deadlock report.
std::string describe_mbarrier(const SimBlock& block, const void* bar);

}  // namespace cudasim::detail
