// cp.async.cg.shared.global (16 bytes) with commit groups. The source is read when the copy
// is issued; shared memory is written only when a wait retires the copy's group, so a kernel
// that reads its tile without waiting sees the 0xFF poison (or a stale tile). The write is a
// generic-proxy store of the waiting thread (async_proxy.h), as on hardware: a wgmma or TMA
// store reading the tile needs that thread's fence.proxy.async after the wait.
#include <cstdio>
#include <cstring>

#include "block.h"
#include "warpgroup.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace cudasim::detail {
namespace {

constexpr int kCopyBytes = 16;

void retire(const SimThread& self, std::vector<PendingCopy>& copies) {
  const unsigned thread = thread_index(self);
  for (const PendingCopy& copy : copies) {
    std::memcpy(copy.dst, copy.bytes, kCopyBytes);
    note_generic_smem_store_by(thread, copy.dst, kCopyBytes, copy.site.file, copy.site.line);
  }
  copies.clear();
}

}  // namespace

void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes, const char* file, int line) {
  const Site site{file, line};
  const SimBlock& block = active_block("cp_async_16");
  SimThread& self = current_thread("cp_async_16");
  if (src_bytes < 0 || src_bytes > kCopyBytes) {
    fail(site, "cp.async: src_bytes = " + std::to_string(src_bytes) + " is outside [0, 16]");
  }
  if (reinterpret_cast<uintptr_t>(smem_dst) % kCopyBytes != 0 ||
      !in_smem(block, smem_dst, kCopyBytes)) {
    fail(site, "cp.async: destination " + format_address(smem_dst) +
                   " is not a 16-byte aligned 16-byte slot inside dynamic shared memory [" +
                   format_address(block.smem) + ", +" + std::to_string(block.smem_bytes) + ")");
  }
  PendingCopy copy{static_cast<unsigned char*>(smem_dst), {}, site};
  if (src_bytes > 0) {
    if (reinterpret_cast<uintptr_t>(gmem_src) % kCopyBytes != 0) {
      fail(site, "cp.async: source " + format_address(gmem_src) + " is not 16-byte aligned");
    }
    if (overlaps_smem(block, gmem_src, static_cast<size_t>(src_bytes))) {
      fail(site, "cp.async: source " + format_address(gmem_src) + " lies in shared memory, not global");
    }
    // Only src_bytes are read (an overrun here is the kernel's, and ASan reports it); the rest
    // of the 16 bytes is zero-filled, as cp.async's src-size operand specifies.
#if defined(__SANITIZE_ADDRESS__)
    // ASan's report names this file; say first which kernel line issued the copy.
    if (__asan_region_is_poisoned(const_cast<void*>(gmem_src), static_cast<size_t>(src_bytes))) {
      std::fprintf(stderr, "cudasim: %s: cp.async reads %d bytes at %p, which ASan reports below\n",
                   describe(site).c_str(), src_bytes, gmem_src);
    }
#endif
    std::memcpy(copy.bytes, gmem_src, static_cast<size_t>(src_bytes));
  }
  self.uncommitted_copies.push_back(copy);
  if (block.counters != nullptr) count_cp_async(self, smem_dst, gmem_src, src_bytes, file, line);
}

void cp_async_commit(const char* file, int line) {
  (void)file, (void)line;
  SimThread& self = current_thread("cp_async_commit");
  // An empty commit still forms a group, which wait_group counts.
  self.copy_groups.push_back(std::move(self.uncommitted_copies));
  self.uncommitted_copies.clear();
}

void cp_async_wait_group(int pending_groups_allowed, const char* file, int line) {
  SimThread& self = current_thread("cp_async_wait");
  if (pending_groups_allowed < 0) {
    fail(Site{file, line}, "cp.async.wait_group " + std::to_string(pending_groups_allowed) +
                               ": N must be >= 0");
  }
  while (self.copy_groups.size() > static_cast<size_t>(pending_groups_allowed)) {
    retire(self, self.copy_groups.front());
    self.copy_groups.pop_front();
  }
}

void cp_async_wait_all(const char* file, int line) {
  // PTX: cp.async.wait_all is cp.async.commit_group followed by cp.async.wait_group 0.
  cp_async_commit(file, line);
  cp_async_wait_group(0, file, line);
}

}  // namespace cudasim::detail
