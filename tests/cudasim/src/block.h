// The state of the one block being simulated: its CUDA threads, warps and shared memory.
// Internal to the shim.
#pragma once
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "async_copy.h"
#include "cudasim.h"
#include "fiber.h"
#include "mbarrier.h"
#include "named_barrier.h"
#include "site.h"

namespace cudasim::detail {

constexpr unsigned kWarpSize = 32;
constexpr uint32_t kFullWarp = 0xffffffffu;

constexpr unsigned kWarpgroupWarps = 4;
constexpr unsigned kWarpgroupThreads = kWarpgroupWarps * kWarpSize;

// What a thread is doing. Every blocked state names the object it waits on (SimThread's wait
// fields), which wakes it when its state changes.
enum class ThreadStatus {
  Ready,         // may run
  AtBarrier,     // bar.sync / __syncthreads on named barrier `barrier_id`
  InCollective,  // a warp collective some lanes of its mask have yet to reach
  AtMbarrier,    // mbarrier.try_wait.parity on `mbarrier` until phase `mbarrier_phase` completes
  InWarpgroupCollective,  // a collective that threads of its warpgroup have yet to reach
  Exited,        // returned from the kernel
};

// What a lane posts to a warp collective and what it reads back.
struct LaneMailbox {
  uint64_t value = 0;       // shuffle operand
  int lane_arg = 0;         // shuffle source lane / delta / xor mask
  int width = 0;            // shuffle segment width
  bool predicate = false;   // vote operand
  const void* row = nullptr;  // ldmatrix row address
  uint32_t a[4] = {}, b[2] = {};  // mma operands
  float c[4] = {};
  uint64_t result = 0;      // shuffle / vote result
  void* operands = nullptr;  // a warpgroup collective's operands, on the posting thread's stack
  uint32_t regs[4] = {};    // ldmatrix result
  float d[4] = {};          // mma result
};

// One lane's access to memory, recorded for the counters (counters.cpp) while they are on.
// kind is a cudasim::detail::Access, or kCpAsyncAccess: then ptr is the shared destination,
// ptr2 the global source and bytes2 the bytes read from it.
constexpr uint8_t kCpAsyncAccess = 255;
struct AccessRecord {
  const char* file;
  int line;
  uint8_t kind;
  uint8_t bytes;
  uint8_t bytes2;
  const void* ptr;
  const void* ptr2;
};

// One 16-byte cp.async: the source was read at issue; dst is written when its group completes.
struct PendingCopy {
  unsigned char* dst;
  unsigned char bytes[16];
  Site site;
};

struct SimThread {
  uint3 idx{};
  unsigned warp = 0, lane = 0;
  Fiber* fiber = nullptr;  // borrowed from the host thread's pool (grid.cpp)
  ThreadStatus status = ThreadStatus::Ready;
  Site wait_site;                 // where it is blocked
  const char* wait_op = "";       // what it is blocked in
  unsigned barrier_id = 0;        // AtBarrier: the named barrier
  const void* mbarrier = nullptr;  // AtMbarrier: the mbarrier and the phase it waits to complete
  uint64_t mbarrier_phase = 0;
  LaneMailbox mailbox;
  std::vector<PendingCopy> uncommitted_copies;
  std::deque<std::vector<PendingCopy>> copy_groups;  // committed, oldest first
  std::vector<AccessRecord> accesses;  // since the last barrier, while counting
};

// A warp collective that some lanes of `mask` have reached and others not yet.
struct OpenCollective {
  const char* op;
  Site site;
  uint32_t mask;
  uint32_t arrived;
};

// A warpgroup collective (wgmma-style) that some of the warpgroup's 128 threads have reached.
struct OpenWarpgroupCollective {
  const char* op = "";
  Site site;
  unsigned arrived = 0;  // 0: none open
};

struct SimWarp {
  unsigned first_thread = 0;
  unsigned num_lanes = 0;      // fewer than 32 in a block's last, partial warp
  uint32_t exited = 0;         // lanes whose thread has returned
  std::vector<OpenCollective> open;
  uint32_t existing() const { return num_lanes == kWarpSize ? kFullWarp : (1u << num_lanes) - 1; }
};

struct SimBlock {
  std::string kernel_name;
  uint3 idx{};
  unsigned char* smem = nullptr;  // exact-size heap buffer, so ASan sees overruns
  size_t smem_bytes = 0;
  std::vector<SimThread> threads;
  std::vector<SimWarp> warps;
  std::vector<OpenWarpgroupCollective> warpgroups;  // by warpgroup (warp / 4)
  unsigned live_threads = 0;     // threads that have not returned
  NamedBarrier barriers[kNamedBarriers];
  MbarrierTable mbarriers;
  AsyncEngine async;
  // Threads made runnable by a state change (a barrier completing, an mbarrier phase, a copy
  // landing). The scheduler makes them Ready once the running warp has blocked, so that a warp
  // always runs until all its lanes block, as before these objects existed.
  std::vector<unsigned> woken;
  bool syncthreads_released = false;  // the scheduler then groups and counts accesses
  SimThread* current = nullptr;  // the thread whose fiber runs now
  std::exception_ptr error;      // thrown on a fiber, rethrown by the scheduler
  const std::function<void()>* run_one_thread = nullptr;
  Counters* counters = nullptr;  // this launch's, when counters were on at its start
};

// The block being run on this host thread; throws SimError outside a kernel.
SimBlock& active_block(const char* what);
SimThread& current_thread(const char* what);
// Throws SimError if a kernel is already running on this host thread (a launch from a kernel).
void check_not_in_kernel(const std::string& kernel_name);
// Makes `block` the active one for the lifetime of the guard.
class ActiveBlockGuard {
 public:
  explicit ActiveBlockGuard(SimBlock& block);
  ~ActiveBlockGuard();
};

// Throws SimError "file:line: message [kernel, block (..), thread (..)]" naming `culprit`, by
// default the current thread; a site with line 0 (the thread's return) is left out.
[[noreturn]] void fail(const Site& site, const std::string& message,
                       const SimThread* culprit = nullptr);
// Blocks the current thread in `op` at `site` until the scheduler resumes it. The caller sets
// the wait fields that belong to `status` first.
void block_current_thread(ThreadStatus status, const char* op, const Site& site);
// Makes thread `index` runnable once the running warp has blocked (SimBlock::woken).
inline void wake_later(SimBlock& block, unsigned index) { block.woken.push_back(index); }
inline unsigned thread_index(const SimThread& thread) {
  return thread.warp * kWarpSize + thread.lane;
}
std::string block_name(const SimBlock& block);  // "kernel K, block (x,y,z)"
// Every thread of the block, grouped into ranges: what each waits in, where, and the state of
// the object it waits on. For deadlock and divergence messages (wait_report.cpp).
std::string describe_waiters(const SimBlock& block);

// Host side: run every thread of `block` to completion (scheduler.cpp).
class Permuter;
void run_block(SimBlock& block, Permuter& order);

// True if [ptr, ptr + bytes) lies inside the block's dynamic shared memory.
bool in_smem(const SimBlock& block, const void* ptr, size_t bytes);
// True if [ptr, ptr + bytes) shares a byte with it.
bool overlaps_smem(const SimBlock& block, const void* ptr, size_t bytes);

// Counters (counters.cpp); each does nothing unless block.counters is set.
void count_ldmatrix(SimBlock& block, int num_matrices, bool transpose, SimThread* const* lanes);
void count_mma(SimBlock& block, MmaInput input);
void count_shuffle(SimBlock& block);
void count_cp_async(SimThread& self, const void* smem_dst, const void* gmem_src, int src_bytes,
                    const char* file, int line);
// Groups the accesses the block's threads recorded since the last flush into warp
// instructions and counts them; called when a barrier releases and when the block ends.
void flush_accesses(SimBlock& block);
void count_barrier(SimBlock& block);
void commit_launch(LaunchCounters&& launch);

std::string hex(uint32_t mask);
std::string format_address(const void* ptr);
std::string lane_list(uint32_t lanes);  // "0-3,7"

}  // namespace cudasim::detail
