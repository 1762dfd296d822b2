// The active block, error reporting and small formatting helpers shared by the shim.
#include <cstdio>
#include <cstring>
#include <sstream>

#include "block.h"

namespace cudasim::detail {
namespace {

thread_local SimBlock* active = nullptr;

std::string coords(const uint3& v) {
  std::ostringstream out;
  out << "(" << v.x << "," << v.y << "," << v.z << ")";
  return out.str();
}

}  // namespace

bool same_site(const Site& a, const Site& b) {
  // Compare names, not pointers: inline functions may carry one copy of a string per object.
  return a.line == b.line && std::strcmp(a.file, b.file) == 0;
}

std::string describe(const Site& site) {
  return std::string(site.file) + ":" + std::to_string(site.line);
}

SimBlock& active_block(const char* what) {
  if (active == nullptr) {
    throw SimError(std::string("cudasim: ") + what +
                   " called outside a kernel launched through cudasim::launch");
  }
  return *active;
}

SimThread& current_thread(const char* what) {
  SimBlock& block = active_block(what);
  if (block.current == nullptr) {
    throw SimError(std::string("cudasim: ") + what + " called by the host, not by a CUDA thread");
  }
  return *block.current;
}

void check_not_in_kernel(const std::string& kernel_name) {
  if (active != nullptr) {
    throw SimError("cudasim: kernel " + kernel_name + " launched from inside kernel " +
                   active->kernel_name + " (dynamic parallelism is not simulated)");
  }
}

ActiveBlockGuard::ActiveBlockGuard(SimBlock& block) { active = &block; }

ActiveBlockGuard::~ActiveBlockGuard() { active = nullptr; }

void fail(const Site& site, const std::string& message, const SimThread* culprit) {
  const SimBlock& block = active_block("fail");
  if (culprit == nullptr) culprit = block.current;
  std::ostringstream out;
  if (site.line != 0) out << describe(site) << ": ";
  out << message << " [kernel " << block.kernel_name << ", block "
      << coords(block.idx);
  if (culprit != nullptr) {
    out << ", thread " << coords(culprit->idx) << " = warp " << culprit->warp << " lane "
        << culprit->lane;
  }
  out << "]";
  throw SimError(out.str());
}

void block_current_thread(ThreadStatus status, const char* op, const Site& site) {
  SimThread& self = current_thread(op);
  self.status = status;
  self.wait_op = op;
  self.wait_site = site;
  self.fiber->suspend();
}

std::string block_name(const SimBlock& block) {
  return "kernel " + block.kernel_name + ", block " + coords(block.idx);
}

bool in_smem(const SimBlock& block, const void* ptr, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  return p >= block.smem && bytes <= block.smem_bytes && p <= block.smem + block.smem_bytes - bytes;
}

bool overlaps_smem(const SimBlock& block, const void* ptr, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  return p < block.smem + block.smem_bytes && p + bytes > block.smem;
}

std::string format_address(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

std::string hex(uint32_t mask) {
  std::ostringstream out;
  out << "0x" << std::hex << mask;
  return out.str();
}

std::string lane_list(uint32_t lanes) {
  std::string out;
  for (unsigned lo = 0; lo < kWarpSize; ++lo) {
    if (!(lanes >> lo & 1u)) continue;
    unsigned hi = lo;
    while (hi + 1 < kWarpSize && (lanes >> (hi + 1) & 1u)) ++hi;
    if (!out.empty()) out += ",";
    out += std::to_string(lo);
    if (hi > lo) out += "-" + std::to_string(hi);
    lo = hi;
  }
  return out.empty() ? "none" : out;
}

}  // namespace cudasim::detail
