// mbarrier: init, arrive (with a count, with expect_tx), expect_tx, complete_tx, try_wait.parity
// and test_wait.parity. A phase completes when its pending arrivals and its transaction bytes
// both reach zero; the phase count then advances and the next phase starts with init's count.
#include <sstream>

#include "block.h"

namespace cudasim::detail {
namespace {

constexpr uint32_t kMaxCount = (1u << 20) - 1;  // PTX's limit on arrival and tx counts
constexpr size_t kMbarrierBytes = 8;

std::string named(const SimBlock& block, const void* bar) {
  return "mbarrier at " + smem_location(block, bar);
}

std::string used_before_init(const SimBlock& block, const void* bar, const char* op) {
  return std::string(op) + ": mbarrier used before init: " + smem_location(block, bar) +
         " holds no initialized mbarrier (mbarrier.init it first; after mbarrier.inval it is "
         "none either)";
}

Mbarrier& lookup(SimBlock& block, const void* bar, const char* op, const Site& site) {
  auto it = block.mbarriers.find(bar);
  if (it == block.mbarriers.end()) fail(site, used_before_init(block, bar, op));
  return it->second;
}

void complete_phase_if_done(SimBlock& block, Mbarrier& mb) {
  if (mb.pending != 0 || mb.tx_bytes != 0) return;
  mb.phase += 1;
  mb.pending = mb.expected;
  for (unsigned index : mb.waiters) wake_later(block, index);
  mb.waiters.clear();
}

void expect(SimBlock& block, Mbarrier& mb, const void* bar, uint32_t bytes, const char* op,
            const Site& site) {
  if (bytes > kMaxCount - mb.tx_bytes) {
    fail(site, std::string(op) + " of " + std::to_string(bytes) + " bytes on the " +
                   named(block, bar) + ", which already expects " + std::to_string(mb.tx_bytes) +
                   ": a phase's transaction count must stay below 2^20");
  }
  mb.tx_bytes += bytes;
}

void check_arrival(const SimBlock& block, const Mbarrier& mb, const void* bar, uint32_t count,
                   const char* op, const Site& site) {
  if (count == 0 || count > kMaxCount) {
    fail(site, std::string(op) + " with count " + std::to_string(count) +
                   ": the count must be 1 to 2^20 - 1");
  }
  if (count > mb.pending) {
    fail(site, "mbarrier: too many arrivals: " + std::string(op) + " (count " +
                   std::to_string(count) + ") on the " + named(block, bar) + " in phase " +
                   std::to_string(mb.phase) + ", which has " + std::to_string(mb.pending) +
                   " of its " + std::to_string(mb.expected) + " arrivals left" +
                   (mb.pending == 0 ? " (it waits only for " + std::to_string(mb.tx_bytes) +
                                          " tx bytes)"
                                    : ""));
  }
}

uint64_t arrive(SimBlock& block, Mbarrier& mb, const void* bar, uint32_t count, const char* op,
                const Site& site) {
  check_arrival(block, mb, bar, count, op, site);
  const uint64_t token = mb.phase;
  mb.pending -= count;
  complete_phase_if_done(block, mb);
  return token;
}

void complete_tx(SimBlock& block, Mbarrier& mb, const void* bar, uint32_t bytes,
                 const std::string& who, const Site& site, const SimThread* culprit) {
  if (bytes > mb.tx_bytes) {
    fail(site,
         "mbarrier: transaction-byte underflow: " + who + " " + std::to_string(bytes) +
             " bytes on the " + named(block, bar) + " in phase " + std::to_string(mb.phase) +
             ", which expects only " + std::to_string(mb.tx_bytes) +
             " (a missing or short expect_tx, or a phase that completed before its copy landed)",
         culprit);
  }
  mb.tx_bytes -= bytes;
  complete_phase_if_done(block, mb);
}

}  // namespace

std::string smem_location(const SimBlock& block, const void* ptr) {
  if (!in_smem(block, ptr, 1)) return format_address(ptr);
  std::ostringstream out;
  out << "smem+0x" << std::hex << (static_cast<const unsigned char*>(ptr) - block.smem);
  return out.str();
}

void check_mbarrier_initialized(const SimBlock& block, const void* bar, const char* op,
                                const Site& site) {
  if (block.mbarriers.count(bar) == 0) fail(site, used_before_init(block, bar, op));
}

void mbarrier_init(void* bar, uint32_t arrivals, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("mbarrier.init");
  current_thread("mbarrier.init");
  if (reinterpret_cast<uintptr_t>(bar) % kMbarrierBytes != 0 ||
      !in_smem(block, bar, kMbarrierBytes)) {
    fail(site, "mbarrier.init: " + format_address(bar) + " is not an 8-byte aligned object " +
                   "inside dynamic shared memory [" + format_address(block.smem) + ", +" +
                   std::to_string(block.smem_bytes) + ")");
  }
  if (arrivals == 0 || arrivals > kMaxCount) {
    fail(site, "mbarrier.init with count " + std::to_string(arrivals) +
                   ": the count must be 1 to 2^20 - 1");
  }
  if (block.mbarriers.count(bar) != 0) {
    fail(site, "mbarrier.init on the " + named(block, bar) +
                   ", which is initialized already (mbarrier.inval it first)");
  }
  Mbarrier& mb = block.mbarriers[bar];
  mb.expected = mb.pending = arrivals;
  count_sm90(block, kCountMbarrierInit, 0, file, line);
}

void mbarrier_inval(void* bar, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("mbarrier.inval");
  Mbarrier& mb = lookup(block, bar, "mbarrier.inval", site);
  if (!mb.waiters.empty()) {
    fail(site, "mbarrier.inval on the " + named(block, bar) + " while " +
                   std::to_string(mb.waiters.size()) + " threads wait on it");
  }
  block.mbarriers.erase(bar);
  count_sm90(block, kCountMbarrierInval, 0, file, line);
}

uint64_t mbarrier_arrive(void* bar, uint32_t count, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("mbarrier.arrive");
  count_sm90(block, kCountMbarrierArrive, 0, file, line);
  return arrive(block, lookup(block, bar, "mbarrier.arrive", site), bar, count, "mbarrier.arrive",
                site);
}

uint64_t mbarrier_arrive_expect_tx(void* bar, uint32_t tx_bytes, const char* file, int line) {
  const Site site{file, line};
  const char* op = "mbarrier.arrive.expect_tx";
  SimBlock& block = active_block(op);
  Mbarrier& mb = lookup(block, bar, op, site);
  count_sm90(block, kCountMbarrierArriveExpectTx, 0, file, line);
  // expect-tx first, then the arrival: the phase cannot complete in between. An arrival the
  // phase has no room for is reported before its bytes are counted.
  check_arrival(block, mb, bar, 1, op, site);
  expect(block, mb, bar, tx_bytes, op, site);
  return arrive(block, mb, bar, 1, op, site);
}

void mbarrier_expect_tx(void* bar, uint32_t tx_bytes, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("mbarrier.expect_tx");
  count_sm90(block, kCountMbarrierExpectTx, 0, file, line);
  expect(block, lookup(block, bar, "mbarrier.expect_tx", site), bar, tx_bytes,
         "mbarrier.expect_tx", site);
}

void mbarrier_complete_tx(void* bar, uint32_t tx_bytes, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("mbarrier.complete_tx");
  complete_tx(block, lookup(block, bar, "mbarrier.complete_tx", site), bar, tx_bytes,
              "mbarrier.complete_tx of", site, nullptr);
}

void mbarrier_complete_tx_for(SimBlock& block, const void* bar, uint32_t bytes, const Site& site,
                              const SimThread& issuer) {
  auto it = block.mbarriers.find(bar);
  if (it == block.mbarriers.end()) {
    fail(site, "cp.async.bulk issued here completes on " + smem_location(block, bar) +
                   ", which holds no initialized mbarrier any more (mbarrier.inval too early)",
         &issuer);
  }
  complete_tx(block, it->second, bar, bytes, "the copy issued here lands", site, &issuer);
}

bool mbarrier_test_wait_parity(void* bar, uint32_t parity, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("mbarrier.test_wait.parity");
  count_sm90(block, kCountMbarrierTestWait, 0, file, line);
  if (parity > 1) {
    fail(site, "mbarrier.test_wait.parity " + std::to_string(parity) + ": not 0 or 1");
  }
  // The phase of this parity has completed unless it is the current one.
  return (lookup(block, bar, "mbarrier.test_wait.parity", site).phase & 1) != parity;
}

bool mbarrier_try_wait_parity(void* bar, uint32_t parity, const char* file, int line) {
  const Site site{file, line};
  const char* op = "mbarrier.try_wait.parity";
  SimBlock& block = active_block(op);
  SimThread& self = current_thread(op);
  if (parity > 1) fail(site, std::string(op) + " " + std::to_string(parity) + ": not 0 or 1");
  Mbarrier& mb = lookup(block, bar, op, site);
  count_sm90(block, kCountMbarrierTryWait, 0, file, line);
  if ((mb.phase & 1) != parity) return true;
  // The shim's try_wait never times out: it blocks until the current phase completes.
  self.mbarrier = bar;
  self.mbarrier_phase = mb.phase;
  mb.waiters.push_back(thread_index(self));
  block_current_thread(ThreadStatus::AtMbarrier, op, site);
  const uint64_t now = block.mbarriers.at(bar).phase;
  if (now != self.mbarrier_phase + 1) {
    // On hardware the waiter polls the parity, and it is this phase's again: it would wait on.
    fail(site, "mbarrier phase overrun: " + std::string(op) + " " + std::to_string(parity) +
                   " on the " + named(block, bar) + " waited for phase " +
                   std::to_string(self.mbarrier_phase) + ", but phases up to " +
                   std::to_string(now - 1) + " completed before this thread ran again: on " +
                   "hardware it can miss its phase (more arrivals than the mbarrier counts, or a "
                   "producer that does not wait for its consumers)");
  }
  return true;
}

std::string describe_mbarrier(const SimBlock& block, const void* bar) {
  auto it = block.mbarriers.find(bar);
  if (it == block.mbarriers.end()) return "no initialized mbarrier";
  const Mbarrier& mb = it->second;
  return "phase " + std::to_string(mb.phase) + ", " + std::to_string(mb.expected - mb.pending) +
         " of " + std::to_string(mb.expected) + " arrivals, " + std::to_string(mb.tx_bytes) +
         " tx bytes pending";
}

}  // namespace cudasim::detail
