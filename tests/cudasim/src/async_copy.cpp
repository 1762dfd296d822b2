// cp.async.bulk from global to shared memory, completing on an mbarrier, and the engine that
// lands asynchronous copies. A copy reads its source and writes shared memory only when it
// lands, so a consumer that reads without waiting for the mbarrier sees the 0xFF poison or the
// previous tile, and a copy that lands on a phase that expects no bytes is a named error.
#include <cstdio>
#include <cstring>

#include "async_proxy.h"
#include "block.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace cudasim::detail {
namespace {

constexpr uint32_t kBulkGranule = 16;  // cp.async.bulk's size and address alignment

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kBulkGranule == 0; }

}  // namespace

void bulk_copy_global_to_shared(void* smem_dst, const void* gmem_src, uint32_t bytes, void* bar,
                                const char* file, int line) {
  const Site site{file, line};
  const char* op = "cp.async.bulk";
  SimBlock& block = active_block(op);
  const SimThread& self = current_thread(op);
  if (bytes == 0 || bytes % kBulkGranule != 0) {
    fail(site, std::string(op) + ": size " + std::to_string(bytes) +
                   " is not a positive multiple of 16 bytes");
  }
  if (!aligned(smem_dst) || !in_smem(block, smem_dst, bytes)) {
    fail(site, std::string(op) + ": destination " + format_address(smem_dst) + " + " +
                   std::to_string(bytes) + " bytes is not a 16-byte aligned range inside " +
                   "dynamic shared memory [" + format_address(block.smem) + ", +" +
                   std::to_string(block.smem_bytes) + ")");
  }
  if (!aligned(gmem_src)) {
    fail(site, std::string(op) + ": source " + format_address(gmem_src) +
                   " is not 16-byte aligned");
  }
  if (overlaps_smem(block, gmem_src, bytes)) {
    fail(site, std::string(op) + ": source " + format_address(gmem_src) +
                   " lies in shared memory, not global");
  }
  check_mbarrier_initialized(block, bar, op, site);
  count_sm90(block, kCountBulkLoad, bytes, file, line);
  auto* dst = static_cast<unsigned char*>(smem_dst);
  AsyncCopy copy{site, thread_index(self), bar, bytes, [dst, gmem_src, bytes, site] {
#if defined(__SANITIZE_ADDRESS__)
                   // ASan's report names this file; say first which kernel line issued it.
                   if (__asan_region_is_poisoned(const_cast<void*>(gmem_src), bytes)) {
                     std::fprintf(stderr,
                                  "cudasim: %s: cp.async.bulk reads %u bytes at %p, which ASan "
                                  "reports below\n",
                                  describe(site).c_str(), bytes, gmem_src);
                   }
#endif
                   std::memcpy(dst, gmem_src, bytes);
                   note_async_proxy_write(dst, bytes, site.file, site.line);
                 }};
  issue_async_copy(block, std::move(copy));
}

void issue_async_copy(SimBlock& block, AsyncCopy copy) {
  block.async.in_flight.push_back(std::move(copy));
  if (block.async.completion == CopyCompletion::Eager) {
    complete_async_copy(block, block.async.in_flight.size() - 1);
  }
}

void complete_async_copy(SimBlock& block, size_t index) {
  AsyncCopy copy = std::move(block.async.in_flight[index]);
  block.async.in_flight.erase(block.async.in_flight.begin() + static_cast<long>(index));
  copy.land();
  mbarrier_complete_tx_for(block, copy.mbarrier, copy.tx_bytes, copy.site,
                           block.threads[copy.issuer]);
}

void check_no_copy_in_flight(SimBlock& block) {
  if (!block.async.in_flight.empty()) {
    const AsyncCopy& oldest = block.async.in_flight.front();
    fail(oldest.site,
         std::string(oldest.op) +
             " issued here is still in flight when every thread of the block has returned (no "
             "thread waited on its mbarrier)",
         &block.threads[oldest.issuer]);
  }
  // A store must have finished reading shared memory (wait_group.read, or wait_group) before
  // its thread returns; its global writes then complete before the grid does.
  for (ThreadBulkGroups& groups : block.async.bulk) {
    const BulkStore* unread = nullptr;
    if (!groups.uncommitted.empty()) unread = &groups.uncommitted.front();
    for (const BulkGroup& group : groups.committed) {
      if (unread == nullptr && !group.read && !group.stores.empty()) unread = &group.stores.front();
    }
    if (unread != nullptr) {
      fail(unread->site,
           "bulk store issued here is still pending when every thread of the block has "
           "returned: its thread never retired it with cp.async.bulk.commit_group and "
           "cp.async.bulk.wait_group[.read] (its shared-memory source is gone now)",
           &block.threads[unread->issuer]);
    }
    for (BulkGroup& group : groups.committed) {
      for (BulkStore& store : group.stores) store.write(store.snapshot.data());
    }
  }
  block.async.bulk.clear();
}

}  // namespace cudasim::detail
