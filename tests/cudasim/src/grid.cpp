// A launch: validate it as the driver would, then run every block in the schedule's order.
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "block.h"
#include "schedule.h"

thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace cudasim {
namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 2147483647u;
constexpr unsigned kMaxGridDimYZ = 65535;
// Dynamic shared memory starts 1024-byte aligned, as TMA and wgmma swizzle atoms need.
constexpr size_t kSmemAlignment = 1024;
// Fiber stack per CUDA thread; kernels keep their tiles in "registers", i.e. on this stack.
constexpr size_t kDefaultStackKiB = 256;

std::mutex smem_limit_mutex;
std::map<const void*, size_t> smem_limits;  // set_max_dynamic_smem, per kernel

size_t dynamic_smem_limit(const void* kernel_id) {
  std::lock_guard<std::mutex> lock(smem_limit_mutex);
  auto it = smem_limits.find(kernel_id);
  return it == smem_limits.end() ? kDefaultDynamicSmemBytes : it->second;
}

size_t fiber_stack_bytes() {
  const char* env = std::getenv("CUDASIM_STACK_KB");
  if (env == nullptr || *env == '\0') return kDefaultStackKiB * 1024;
  char* end = nullptr;
  const unsigned long kib = std::strtoul(env, &end, 10);
  if (*end != '\0' || kib < 16) {
    throw SimError(std::string("cudasim: CUDASIM_STACK_KB must be an integer >= 16, got '") + env + "'");
  }
  return kib * 1024;
}

// The kernel's name for messages: its demangled symbol where the dynamic symbol table has it
// (shared objects, executables linked with -rdynamic), else the caller's hint, else its address.
std::string kernel_name(const void* kernel_id, const char* name_hint) {
  Dl_info info{};
  // dladdr reports the nearest symbol below the address: only an exact match is the kernel.
  if (dladdr(kernel_id, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == kernel_id) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 ? demangled : info.dli_sname;
    std::free(demangled);
    return name;
  }
  if (name_hint != nullptr) return name_hint;
  char text[48];
  std::snprintf(text, sizeof text, "<kernel at %p>", kernel_id);
  return text;
}

std::string dims(const dim3& d) {
  std::ostringstream out;
  out << "(" << d.x << "," << d.y << "," << d.z << ")";
  return out.str();
}

void validate_launch(const std::string& name, const void* kernel_id, dim3 grid, dim3 block, size_t smem) {
  const std::string where = "cudasim: launch of " + name + " with grid " + dims(grid) +
                            ", block " + dims(block) + ": ";
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.z > kMaxBlockDimZ) {
    throw SimError(where + "a block must have 1 to 1024 threads and blockDim.z <= 64");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridDimX ||
      grid.y > kMaxGridDimYZ || grid.z > kMaxGridDimYZ) {
    throw SimError(where + "grid dims must be >= 1, gridDim.x <= 2^31-1, gridDim.y/z <= 65535");
  }
  if (1ull * grid.x * grid.y * grid.z > UINT32_MAX) {
    throw SimError(where + "more than 2^32 blocks is more than the shim can run");
  }
  const size_t limit = dynamic_smem_limit(kernel_id);
  if (smem > limit) {
    throw SimError(where + std::to_string(smem) + " bytes of dynamic shared memory exceed this "
                   "kernel's limit of " + std::to_string(limit) +
                   " bytes (above 48 KB, call flashattn::set_max_dynamic_smem first)");
  }
}

// Fibers outlive launches: mapping and first touching 128 fresh stacks cost ~6 ms per launch,
// which dominated tests that launch many small grids. One pool per host thread, since each
// host thread runs its own launches.
thread_local std::vector<std::unique_ptr<detail::Fiber>> fiber_pool;
thread_local size_t fiber_pool_stack_bytes = 0;

void fill_fiber_pool(size_t count, size_t stack_bytes) {
  if (stack_bytes != fiber_pool_stack_bytes) {
    fiber_pool.clear();
    fiber_pool_stack_bytes = stack_bytes;
  }
  while (fiber_pool.size() < count) fiber_pool.push_back(std::make_unique<detail::Fiber>(stack_bytes));
}

struct SmemBuffer {
  explicit SmemBuffer(size_t bytes) {
    // Exactly `bytes` long (at least 1, so the pointer is distinct), so ASan flags overruns.
    if (posix_memalign(&ptr, kSmemAlignment, bytes == 0 ? 1 : bytes) != 0) {
      throw SimError("cudasim: cannot allocate " + std::to_string(bytes) + " bytes of shared memory");
    }
  }
  ~SmemBuffer() { std::free(ptr); }
  void* ptr = nullptr;
};

}  // namespace

void set_max_dynamic_smem(const void* kernel_id, size_t bytes) {
  if (bytes > kMaxDynamicSmemBytes) {
    throw SimError("cudasim: set_max_dynamic_smem(" + std::to_string(bytes) +
                   ") exceeds the 227 KB (232448-byte) per-block maximum of sm_90");
  }
  std::lock_guard<std::mutex> lock(smem_limit_mutex);
  smem_limits[kernel_id] = bytes;
}

void* dynamic_smem() { return detail::active_block("dynamic_smem()").smem; }

namespace detail {

void run_grid(const char* name_hint, const void* kernel_id, dim3 grid, dim3 block_dim,
              size_t smem_bytes, const std::function<void()>& run_one_thread) {
  const std::string name = kernel_name(kernel_id, name_hint);
  check_not_in_kernel(name);  // before the fiber pool, which the running kernel is using
  validate_launch(name, kernel_id, grid, block_dim, smem_bytes);
  const Schedule schedule = active_schedule();
  const unsigned num_threads = block_dim.x * block_dim.y * block_dim.z;
  fill_fiber_pool(num_threads, fiber_stack_bytes());
  SmemBuffer smem(smem_bytes);

  SimBlock block;
  // Counted launches are committed only when they complete: a launch that throws adds nothing.
  LaunchCounters counted_launch;
  if (counting_on()) {
    counted_launch = LaunchCounters{name, grid, block_dim, smem_bytes, Counters{}};
    block.counters = &counted_launch.counters;
  }
  block.kernel_name = name;
  block.smem = static_cast<unsigned char*>(smem.ptr);
  block.smem_bytes = smem_bytes;
  block.run_one_thread = &run_one_thread;
  block.threads.resize(num_threads);
  for (unsigned t = 0; t < num_threads; ++t) {
    SimThread& thread = block.threads[t];
    thread.idx = uint3{t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y)};
    thread.warp = t / kWarpSize;
    thread.lane = t % kWarpSize;
    thread.fiber = fiber_pool[t].get();
  }
  for (unsigned first = 0; first < num_threads; first += kWarpSize) {
    SimWarp warp;
    warp.first_thread = first;
    warp.num_lanes = std::min<unsigned>(kWarpSize, num_threads - first);
    block.warps.push_back(warp);
  }
  block.warpgroups.resize((block.warps.size() + kWarpgroupWarps - 1) / kWarpgroupWarps);
  block.async.completion = active_copy_completion(schedule);

  ActiveBlockGuard guard(block);
  gridDim = grid;
  blockDim = block_dim;
  const unsigned long long num_blocks = 1ull * grid.x * grid.y * grid.z;
  Permuter block_order(schedule, /*stream=*/0);
  const std::vector<unsigned> order = block_order.permutation(static_cast<unsigned>(num_blocks));
  for (unsigned linear : order) {
    block.idx = uint3{linear % grid.x, linear / grid.x % grid.y, linear / (grid.x * grid.y)};
    blockIdx = block.idx;
    // 0xFF bytes are NaN as f16, bf16 and f32: a read of smem nobody wrote shows up.
    std::memset(block.smem, 0xFF, smem_bytes);
    Permuter thread_order(schedule, /*stream=*/1ull + linear);
    run_block(block, thread_order);
    if (block.counters != nullptr) block.counters->blocks += 1;
  }
  if (block.counters != nullptr) commit_launch(std::move(counted_launch));
}

}  // namespace detail
}  // namespace cudasim
