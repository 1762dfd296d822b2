// cudasim.h: what CUDA kernel source sees when g++ compiles it against the CPU shim.
//
// Compile kernel source with
//   g++ -std=c++17 -DFLASHATTN_CUDASIM -include tests/cudasim/cudasim.h
//       -I tests/cudasim -I csrc -I /usr/local/cuda/include  <kernel + host files>  <shim sources>
// (tests/cudasim/build.py lists the shim sources and flags). One fiber runs per CUDA thread,
// blocks run one after another; see tests/cudasim/README.md for the execution model.
//
// Only the PTX wrappers in csrc/cuda/ptx.cuh call the tensor-core and cp.async entry points
// below; kernels call the wrappers, so one source compiles under nvcc and under this shim.
#pragma once

#ifndef FLASHATTN_CUDASIM
#define FLASHATTN_CUDASIM 1
#endif

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// In host mode the toolkit headers define __host__/__device__/__global__/__shared__ as nothing,
// __forceinline__ and __align__ as GNU attributes, and give host-usable dim3, uint4, float4 and
// the __half/__nv_bfloat16 types with their conversions.
#include <vector_types.h>
#include <vector_functions.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Blocks run one after another on one host thread, so a static (thread_local, in case two host
// threads launch at once) is exactly one block's shared array. It is neither poisoned nor reset
// between blocks or launches: kernels should declare shared memory with FLASHATTN_DYNAMIC_SMEM
// (csrc/cuda/ptx.cuh), which is, and which is the only memory ldmatrix and cp.async accept.
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
// An nvcc keyword. libstdc++ spells __attribute__((__noinline__)) in <memory>'s internals,
// which this macro would break: <memory> is included above, before it is defined.
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

// Host code under the shim needs no cuda_runtime.h; this typedef matches driver_types.h's.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace cudasim {

// Every failure the shim detects: a bad launch, a divergent barrier, a deadlock, a misaligned
// ldmatrix row, a pending cp.async at thread exit... The message names the kernel's call site
// and the CUDA thread. A torch extension built on the shim surfaces it as a RuntimeError.
class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Warp and block order between barriers. See README.md; the env var CUDASIM_SCHEDULE takes
// "forward", "reverse" or "random:SEED", and set_schedule() overrides it.
enum class Order { Forward, Reverse, Random };
struct Schedule {
  Order order = Order::Forward;
  uint64_t seed = 0;
};
Schedule parse_schedule(const std::string& text);  // throws SimError on a malformed string
std::string to_string(const Schedule& schedule);
void set_schedule(const Schedule& schedule);  // used by every later launch on any host thread
void clear_schedule();                        // back to CUDASIM_SCHEDULE, else forward
Schedule active_schedule();

// When asynchronous (bulk) copies land in shared memory and complete_tx their mbarrier:
// Lazy only when no thread can run (the latest legal moment, which exposes missing waits),
// Eager as they are issued, Random at random points between warps (from the schedule's seed).
// The env var CUDASIM_COPY_COMPLETION takes "lazy", "eager" or "random"; unset, a launch uses
// Random under random:SEED and Lazy otherwise. set_copy_completion() overrides both.
enum class CopyCompletion { Lazy, Eager, Random };
CopyCompletion parse_copy_completion(const std::string& text);  // throws SimError
std::string to_string(CopyCompletion completion);
void set_copy_completion(CopyCompletion completion);  // for every later launch
void clear_copy_completion();
CopyCompletion active_copy_completion(const Schedule& schedule);

// The device's SM count (cudaDevAttrMultiProcessorCount on hardware), which a persistent launch
// sizes its grid by. The env var CUDASIM_SM_COUNT (a positive integer), else 2: small, so that a
// persistent kernel's CTAs walk several tiles in any test with more than two. set_sm_count()
// overrides both for every later call; clear_sm_count() goes back to them.
int sm_count();  // throws SimError on a malformed CUDASIM_SM_COUNT
void set_sm_count(int count);  // throws SimError unless count > 0
void clear_sm_count();

// The launch, as kernel<<<grid, block, smem_bytes>>>(args...) would do it, run to completion on
// the calling host thread. Throws SimError. Messages name the kernel by its symbol when the
// dynamic symbol table has it, else by name_hint (may be null), else by address.
namespace detail {
void run_grid(const char* name_hint, const void* kernel_id, dim3 grid, dim3 block,
              size_t smem_bytes, const std::function<void()>& run_one_thread);
}
template <class... Params, class... Args>
void launch_named(const char* name_hint, void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t smem_bytes, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "wrong number of kernel arguments");
  // Converted once, like CUDA's parameter buffer; every thread gets its own by-value copy.
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  detail::run_grid(name_hint, reinterpret_cast<const void*>(kernel), grid, block, smem_bytes,
                   [&] { std::apply(kernel, params); });
}
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, Args&&... args) {
  launch_named(nullptr, kernel, grid, block, smem_bytes, std::forward<Args>(args)...);
}

// Largest dynamic shared memory a block may request on sm_90 (227 KB).
constexpr size_t kMaxDynamicSmemBytes = 227 * 1024;
// What a launch gets without opting in, as on hardware.
constexpr size_t kDefaultDynamicSmemBytes = 48 * 1024;
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void set_max_dynamic_smem(const void* kernel_id, size_t bytes);

// ---- Counters: what the kernels do, per launch and per kernel (README.md, "Counters"). ----
// Off by default; while off, the hooks below cost one relaxed atomic load and count nothing.
// Warp-level instructions are counted once per warp; "wavefronts" are shared-memory passes,
// computed from the 32 lanes' addresses as the hardware's 32 four-byte banks serve them.
struct Counters {
  uint64_t blocks = 0;    // CTAs run
  uint64_t barriers = 0;  // __syncthreads, once per CTA per barrier
  uint64_t shuffles = 0;  // __shfl*_sync, warp instructions
  uint64_t mma_m16n8k16_f16 = 0, mma_m16n8k16_bf16 = 0;  // mma.sync, warp instructions
  // ldmatrix warp instructions by [trans][x1, x2, x4].
  uint64_t ldmatrix[2][3] = {};
  uint64_t ldmatrix_wavefronts = 0, ldmatrix_wavefronts_ideal = 0;
  // ld.shared / st.shared through FLASHATTN_SMEM (csrc/cuda/ptx.cuh).
  uint64_t lds_instructions = 0, lds_wavefronts = 0, lds_wavefronts_ideal = 0;
  uint64_t sts_instructions = 0, sts_wavefronts = 0, sts_wavefronts_ideal = 0;
  // cp.async: warp instructions, 16-byte copies, bytes read from global (src_bytes), the
  // 32-byte global sectors they touch, and the shared-memory wavefronts of their 16-byte writes.
  uint64_t cp_async_instructions = 0, cp_async_copies = 0, cp_async_bytes = 0;
  uint64_t cp_async_sectors = 0;
  uint64_t cp_async_smem_wavefronts = 0, cp_async_smem_wavefronts_ideal = 0;
  // Global loads and stores through FLASHATTN_GMEM: warp instructions (requests), bytes, sectors.
  uint64_t gmem_load_instructions = 0, gmem_load_bytes = 0, gmem_load_sectors = 0;
  uint64_t gmem_store_instructions = 0, gmem_store_bytes = 0, gmem_store_sectors = 0;
  // atomicAdd/Sub/Max/Min/Exch/CAS: per-thread operations, warp instructions, sectors, and
  // operations by operand width (4 and 8 bytes; other widths in atomic_ops_other).
  uint64_t atomic_ops = 0, atomic_instructions = 0, atomic_sectors = 0;
  uint64_t atomic_ops_4b = 0, atomic_ops_8b = 0, atomic_ops_other = 0;
  // sm_90 synchronization and bulk copies: warp instructions (grouped from lanes like the
  // accesses above) and the bytes each kind of copy moves (a tensor copy's whole box).
  uint64_t mbarrier_init = 0, mbarrier_arrive = 0, mbarrier_arrive_expect_tx = 0;
  uint64_t mbarrier_expect_tx = 0, mbarrier_try_wait = 0, mbarrier_test_wait = 0;
  uint64_t mbarrier_inval = 0, mbarrier_fence_init = 0;
  uint64_t named_barrier_sync = 0, named_barrier_arrive = 0;  // the sm_90 wrappers' bar.sync/arrive
  uint64_t bulk_load_instructions = 0, bulk_load_bytes = 0;
  uint64_t bulk_store_instructions = 0, bulk_store_bytes = 0;
  uint64_t bulk_reduce_instructions = 0, bulk_reduce_bytes = 0;
  uint64_t bulk_commit_group = 0, bulk_wait_group = 0, bulk_wait_group_read = 0;
  uint64_t tma_load_instructions = 0, tma_load_bytes = 0;
  uint64_t tma_store_instructions = 0, tma_store_bytes = 0;
  uint64_t tma_reduce_instructions = 0, tma_reduce_bytes = 0, tma_prefetch = 0;
  // ---- sm_90 warpgroup MMA (wgmma.cpp, stmatrix.cpp) ----
  // wgmma.mma_async warpgroup instructions by [input][N / 8 - 1] (0 f16, 1 bf16: k16; 2 e4m3:
  // k32), how many took A from registers, and their multiply-adds (64 * N * K each);
  // the FP8 conversions cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2, executions by
  // threads; wgmma.fence / commit_group /
  // wait_group and setmaxnreg.inc / dec, warpgroup instructions; fence.proxy.async, executions
  // by threads; stmatrix warp instructions by [trans][x1, x2, x4] and their wavefronts.
  uint64_t wgmma[3][32] = {};
  uint64_t wgmma_a_from_registers = 0, wgmma_macs = 0;
  uint64_t cvt_e4m3x2_f32 = 0, cvt_f16x2_e4m3x2 = 0;
  uint64_t wgmma_fence = 0, wgmma_commit_group = 0, wgmma_wait_group = 0;
  uint64_t setmaxnreg_inc = 0, setmaxnreg_dec = 0;
  uint64_t fence_proxy_async_threads = 0;
  uint64_t stmatrix[2][3] = {};
  uint64_t stmatrix_wavefronts = 0, stmatrix_wavefronts_ideal = 0;

  uint64_t mma() const { return mma_m16n8k16_f16 + mma_m16n8k16_bf16; }
  uint64_t wgmma_instructions() const {
    uint64_t total = 0;
    for (const auto& by_n : wgmma)
      for (uint64_t n : by_n) total += n;
    return total;
  }
  uint64_t smem_wavefronts() const {
    return ldmatrix_wavefronts + lds_wavefronts + sts_wavefronts + cp_async_smem_wavefronts +
           stmatrix_wavefronts;
  }
  uint64_t smem_wavefronts_ideal() const {
    return ldmatrix_wavefronts_ideal + lds_wavefronts_ideal + sts_wavefronts_ideal +
           cp_async_smem_wavefronts_ideal + stmatrix_wavefronts_ideal;
  }
  uint64_t global_sectors() const {
    return cp_async_sectors + gmem_load_sectors + gmem_store_sectors + atomic_sectors;
  }
  Counters& operator+=(const Counters& other);
};

struct LaunchCounters {
  std::string kernel;
  dim3 grid, block;
  size_t smem_bytes = 0;
  Counters counters;
};

void enable_counters(bool on);  // for every later launch on any host thread
bool counters_enabled();
void reset_counters();                         // forget every counted launch
std::vector<LaunchCounters> counted_launches();  // in launch order
// {"launches": [{"kernel", "grid", "block", "smem_bytes", "counters": {...}}, ...],
//  "kernels": {name: {"launches": n, "counters": {...}}}}
std::string counters_json();
std::string to_json(const Counters& counters);

namespace detail {
extern std::atomic<bool> counting;
inline bool counting_on() { return counting.load(std::memory_order_relaxed); }
enum class Access : uint8_t { SmemLoad, SmemStore, GmemLoad, GmemStore, Atomic };
// One lane's access, grouped with its warp's by call site and occurrence (README.md).
void count_access(Access kind, const void* ptr, unsigned bytes, const char* file, int line);
}  // namespace detail

// ---- Device side: only valid while a kernel runs. ----
void* dynamic_smem();  // 1024-byte aligned, exact size, refilled with 0xFF before each block

namespace detail {
enum class ShuffleMode { Idx, Up, Down, Xor };
enum class VoteMode { Ballot, Any, All };
enum class MmaInput { F16, BF16 };
void syncthreads(const char* file, int line);
void syncwarp(unsigned mask, const char* file, int line);
uint64_t shuffle(ShuffleMode mode, unsigned mask, uint64_t bits, int lane_arg, int width,
                 const char* file, int line);
unsigned vote(VoteMode mode, unsigned mask, bool predicate, const char* file, int line);
void ldmatrix(int num_matrices, bool transpose, uint32_t* regs, const void* row_addr,
              const char* file, int line);
void mma_m16n8k16(MmaInput input, float* d, const uint32_t* a, const uint32_t* b,
                  const char* file, int line);
void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes, const char* file, int line);
void cp_async_commit(const char* file, int line);
void cp_async_wait_group(int pending_groups_allowed, const char* file, int line);
void cp_async_wait_all(const char* file, int line);

// ---- Warp-specialized synchronization (sm_90): what csrc/cuda/ptx.cuh's wrappers call. ----
// Named barriers: bar.sync / bar.arrive `id` (0-15) for `threads` threads, a multiple of 32.
// A generation completes when that many threads have arrived; bar.arrive does not block.
// barrier_sync with threads == 0 is bar.sync without a count: every live thread of the block,
// at one call site, like __syncthreads. Participants of one generation with different counts
// are an error.
void barrier_sync(unsigned id, unsigned threads, const char* file, int line);
void barrier_arrive(unsigned id, unsigned threads, const char* file, int line);
// mbarrier objects: 8 bytes of dynamic shared memory, 8-byte aligned. Arrival counts and
// transaction bytes are at most 2^20 - 1. arrive returns the phase it arrived in (the state
// token). try_wait.parity blocks until the phase of that parity (0 or 1) has completed, never
// timing out, and returns true; test_wait.parity only tests. Use before init, more arrivals
// than a phase expects and a transaction-byte underflow are errors.
void mbarrier_init(void* bar, uint32_t arrivals, const char* file, int line);
void mbarrier_inval(void* bar, const char* file, int line);
uint64_t mbarrier_arrive(void* bar, uint32_t count, const char* file, int line);
uint64_t mbarrier_arrive_expect_tx(void* bar, uint32_t tx_bytes, const char* file, int line);
void mbarrier_expect_tx(void* bar, uint32_t tx_bytes, const char* file, int line);
void mbarrier_complete_tx(void* bar, uint32_t tx_bytes, const char* file, int line);
bool mbarrier_try_wait_parity(void* bar, uint32_t parity, const char* file, int line);
bool mbarrier_test_wait_parity(void* bar, uint32_t parity, const char* file, int line);
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: copies `bytes` (a multiple
// of 16, both addresses 16-byte aligned) from global to shared memory when the copy lands (see
// CopyCompletion), then complete_tx(bytes) on the mbarrier.
void bulk_copy_global_to_shared(void* smem_dst, const void* gmem_src, uint32_t bytes, void* bar,
                                const char* file, int line);

// red.global.add.v2.f32: address[0] += a, address[1] += b as one 8-byte reduction (counted as
// one atomic operation of width 8). The address must be 8-byte aligned, as the hardware requires.
void red_add_f32x2(float* address, float a, float b, const char* file, int line);
uint32_t smem_offset(const void* ptr, const char* file, int line);

template <class T>
uint64_t to_bits(T value) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "warp shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
}  // namespace detail
}  // namespace cudasim

// Built-in variables. Blocks and threads run on fibers of one host thread, and the scheduler
// writes these before it resumes each CUDA thread.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

// Defaulted __builtin_FILE()/__builtin_LINE() arguments record the kernel's call site.
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cudasim::detail::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  cudasim::detail::syncwarp(mask, file, line);
}
// Nothing runs concurrently, so fences order nothing.
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return from_bits<T>(shuffle(ShuffleMode::Idx, mask, to_bits(var), src_lane, width, file, line));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return from_bits<T>(shuffle(ShuffleMode::Up, mask, to_bits(var), static_cast<int>(delta), width,
                              file, line));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return from_bits<T>(shuffle(ShuffleMode::Down, mask, to_bits(var), static_cast<int>(delta),
                              width, file, line));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return from_bits<T>(shuffle(ShuffleMode::Xor, mask, to_bits(var), lane_mask, width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return vote(VoteMode::Ballot, mask, predicate != 0, file, line);
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return static_cast<int>(vote(VoteMode::Any, mask, predicate != 0, file, line));
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  using namespace cudasim::detail;
  return static_cast<int>(vote(VoteMode::All, mask, predicate != 0, file, line));
}

// Atomics are plain read-modify-write: only one CUDA thread runs at any moment. The defaulted
// call site groups a warp's lanes into one instruction for the counters.
#define CUDASIM_ATOMIC_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()
#define CUDASIM_COUNT_ATOMIC()                                                               \
  if (cudasim::detail::counting_on())                                                        \
  cudasim::detail::count_access(cudasim::detail::Access::Atomic, address, sizeof(T), file, line)
template <class T>
T atomicAdd(T* address, T value, CUDASIM_ATOMIC_SITE) {
  static_assert(std::is_arithmetic_v<T>, "atomicAdd on a non-arithmetic type");
  CUDASIM_COUNT_ATOMIC();
  T old = *address;
  *address = old + value;
  return old;
}
template <class T>
T atomicSub(T* address, T value, CUDASIM_ATOMIC_SITE) {
  static_assert(std::is_arithmetic_v<T>, "atomicSub on a non-arithmetic type");
  CUDASIM_COUNT_ATOMIC();
  T old = *address;
  *address = old - value;
  return old;
}
template <class T>
T atomicMax(T* address, T value, CUDASIM_ATOMIC_SITE) {
  CUDASIM_COUNT_ATOMIC();
  T old = *address;
  *address = old < value ? value : old;
  return old;
}
template <class T>
T atomicMin(T* address, T value, CUDASIM_ATOMIC_SITE) {
  CUDASIM_COUNT_ATOMIC();
  T old = *address;
  *address = value < old ? value : old;
  return old;
}
template <class T>
T atomicExch(T* address, T value, CUDASIM_ATOMIC_SITE) {
  CUDASIM_COUNT_ATOMIC();
  T old = *address;
  *address = value;
  return old;
}
template <class T>
T atomicCAS(T* address, T compare, T value, CUDASIM_ATOMIC_SITE) {
  CUDASIM_COUNT_ATOMIC();
  T old = *address;
  if (old == compare) *address = value;
  return old;
}
#undef CUDASIM_COUNT_ATOMIC
#undef CUDASIM_ATOMIC_SITE

// Device-only math intrinsics, with their IEEE host counterparts (the fast-math error of the
// hardware versions is not modelled).
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline int __float_as_int(float x) { return cudasim::detail::from_bits<int>(cudasim::detail::to_bits(x)); }
inline unsigned __float_as_uint(float x) { return cudasim::detail::from_bits<unsigned>(cudasim::detail::to_bits(x)); }
inline float __int_as_float(int x) { return cudasim::detail::from_bits<float>(cudasim::detail::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return cudasim::detail::from_bits<float>(cudasim::detail::to_bits(x)); }
template <class T>
T __ldg(const T* address) {
  return *address;
}

// CUDA's global max/min overloads.
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a < b ? b : a; }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline int min(int a, int b) { return b < a ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return b < a ? b : a; }
inline long long min(long long a, long long b) { return b < a ? b : a; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return b < a ? b : a; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
