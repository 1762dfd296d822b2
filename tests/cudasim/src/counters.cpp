// Counters of what kernels do: mma, ldmatrix, shared-memory wavefronts with bank conflicts,
// cp.async bytes, global sectors, atomics, barriers. Off by default (README.md, "Counters").
//
// Warp-wide instructions (ldmatrix, mma, shuffles) are counted where the shim computes them,
// once per warp. Per-lane accesses (ptx::smem_load/smem_store/gmem_store, cp.async, atomics)
// are recorded by each lane as it runs and grouped into warp instructions when the block
// reaches a barrier or ends: lane L's k-th access at a call site since the last barrier belongs
// to the warp's k-th execution of that site, as it does on hardware for code whose lanes take
// the same path through loops (a lane that skips an access is an inactive lane of it).
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "block.h"
#include "warpgroup.h"

namespace cudasim {

namespace detail {
std::atomic<bool> counting{false};
}

namespace {

using detail::kFullWarp;
using detail::kWarpSize;

std::mutex counted_mutex;
std::vector<LaunchCounters> counted;

constexpr unsigned kCounterBanks = 32;
constexpr unsigned kCounterBankBytes = 4;
constexpr unsigned kPhaseBytes = kCounterBanks * kCounterBankBytes;  // 128
constexpr uint64_t kSectorBytes = 32;

// Passes ("wavefronts") of one warp-wide shared-memory access of `width` bytes per lane, at byte
// offsets off[lane] for the lanes in `mask`. The warp is served in phases of 128 bytes' worth
// of lanes: all 32 lanes for accesses of up to 4 bytes, 16 lanes for 8 bytes, 8 lanes for 16
// bytes (ldmatrix: one 8x8 matrix, 8 rows of 16 bytes, per phase). In a phase each of the 32
// banks (4-byte words, bank = word % 32) serves one distinct word per pass, and lanes touching
// the same word share it (broadcast). A phase costs the most distinct words any one bank must
// serve; the ideal is one pass for each phase that has an active lane.
void smem_passes(const uint64_t* off, uint32_t mask, unsigned width, uint64_t& actual,
                 uint64_t& ideal) {
  const unsigned lanes_per_phase = width <= 4 ? 32 : width <= 8 ? 16 : 8;
  for (unsigned first = 0; first < kWarpSize; first += lanes_per_phase) {
    uint64_t words[kWarpSize * 4];
    unsigned n = 0;
    for (unsigned lane = first; lane < first + lanes_per_phase; ++lane) {
      if (!(mask >> lane & 1u)) continue;
      const uint64_t lo = off[lane] / kCounterBankBytes;
      const uint64_t hi = (off[lane] + std::max(width, 1u) - 1) / kCounterBankBytes;
      for (uint64_t w = lo; w <= hi && n < kWarpSize * 4; ++w) words[n++] = w;
    }
    if (n == 0) continue;
    std::sort(words, words + n);
    n = static_cast<unsigned>(std::unique(words, words + n) - words);
    unsigned per_bank[kCounterBanks] = {};
    unsigned passes = 0;
    for (unsigned i = 0; i < n; ++i) passes = std::max(passes, ++per_bank[words[i] % kCounterBanks]);
    actual += passes;
    ideal += 1;
  }
}

// Distinct 32-byte sectors touched by the lanes' byte ranges [addr, addr + bytes).
uint64_t sectors(const uint64_t* addr, const unsigned* bytes, uint32_t mask) {
  uint64_t ids[kWarpSize * 8];
  unsigned n = 0;
  for (unsigned lane = 0; lane < kWarpSize; ++lane) {
    if (!(mask >> lane & 1u) || bytes[lane] == 0) continue;
    for (uint64_t s = addr[lane] / kSectorBytes; s <= (addr[lane] + bytes[lane] - 1) / kSectorBytes &&
                                                  n < kWarpSize * 8;
         ++s) {
      ids[n++] = s;
    }
  }
  std::sort(ids, ids + n);
  return static_cast<uint64_t>(std::unique(ids, ids + n) - ids);
}

uint64_t smem_offset_of(const detail::SimBlock& block, const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  const auto base = reinterpret_cast<uintptr_t>(block.smem);
  // Dynamic shared memory is 1024-byte aligned, so offsets from its start give the banks. Any
  // other address (a static __shared__ array) is taken as it is.
  return p >= base && p < base + block.smem_bytes ? p - base : p;
}

struct SiteKey {
  const char* file;
  int line;
  uint8_t kind;
  uint32_t occurrence;
  bool operator==(const SiteKey& o) const {
    return file == o.file && line == o.line && kind == o.kind && occurrence == o.occurrence;
  }
};
struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.file) ^ (static_cast<size_t>(k.line) * 0x9e3779b97f4a7c15ull) ^
           (static_cast<size_t>(k.kind) << 48) ^ (static_cast<size_t>(k.occurrence) << 20);
  }
};

struct WarpAccess {
  uint32_t mask = 0;
  detail::AccessRecord lane[kWarpSize];
};

// The instruction counter of an sm_90 operation (detail::Sm90Count), else null.
uint64_t* sm90_instructions(Counters& c, uint8_t kind) {
  switch (kind) {
    case detail::kCountMbarrierInit: return &c.mbarrier_init;
    case detail::kCountMbarrierArrive: return &c.mbarrier_arrive;
    case detail::kCountMbarrierArriveExpectTx: return &c.mbarrier_arrive_expect_tx;
    case detail::kCountMbarrierExpectTx: return &c.mbarrier_expect_tx;
    case detail::kCountMbarrierTryWait: return &c.mbarrier_try_wait;
    case detail::kCountMbarrierTestWait: return &c.mbarrier_test_wait;
    case detail::kCountMbarrierInval: return &c.mbarrier_inval;
    case detail::kCountMbarrierFenceInit: return &c.mbarrier_fence_init;
    case detail::kCountBarSync: return &c.named_barrier_sync;
    case detail::kCountBarArrive: return &c.named_barrier_arrive;
    case detail::kCountBulkLoad: return &c.bulk_load_instructions;
    case detail::kCountBulkStore: return &c.bulk_store_instructions;
    case detail::kCountBulkReduce: return &c.bulk_reduce_instructions;
    case detail::kCountBulkCommit: return &c.bulk_commit_group;
    case detail::kCountBulkWait: return &c.bulk_wait_group;
    case detail::kCountBulkWaitRead: return &c.bulk_wait_group_read;
    case detail::kCountTmaLoad: return &c.tma_load_instructions;
    case detail::kCountTmaStore: return &c.tma_store_instructions;
    case detail::kCountTmaReduce: return &c.tma_reduce_instructions;
    case detail::kCountTmaPrefetch: return &c.tma_prefetch;
    default: return nullptr;
  }
}

void count_warp_access(const detail::SimBlock& block, uint8_t kind, const WarpAccess& access,
                       Counters& c) {
  uint64_t addr[kWarpSize] = {}, off[kWarpSize] = {};
  unsigned bytes[kWarpSize] = {};
  unsigned width = 0;
  for (unsigned lane = 0; lane < kWarpSize; ++lane) {
    if (!(access.mask >> lane & 1u)) continue;
    const detail::AccessRecord& r = access.lane[lane];
    width = std::max<unsigned>(width, r.bytes);
    off[lane] = smem_offset_of(block, r.ptr);
    addr[lane] = reinterpret_cast<uintptr_t>(kind == detail::kCpAsyncAccess ? r.ptr2 : r.ptr);
    bytes[lane] = kind == detail::kCpAsyncAccess ? r.bytes2 : r.bytes;
  }
  const unsigned active = static_cast<unsigned>(__builtin_popcount(access.mask));
  switch (kind) {
    case static_cast<uint8_t>(detail::Access::SmemLoad):
      ++c.lds_instructions;
      smem_passes(off, access.mask, width, c.lds_wavefronts, c.lds_wavefronts_ideal);
      break;
    case static_cast<uint8_t>(detail::Access::SmemStore):
      ++c.sts_instructions;
      smem_passes(off, access.mask, width, c.sts_wavefronts, c.sts_wavefronts_ideal);
      break;
    case detail::kCpAsyncAccess: {
      ++c.cp_async_instructions;
      c.cp_async_copies += active;
      for (unsigned lane = 0; lane < kWarpSize; ++lane) c.cp_async_bytes += bytes[lane];
      c.cp_async_sectors += sectors(addr, bytes, access.mask);
      smem_passes(off, access.mask, width, c.cp_async_smem_wavefronts,
                  c.cp_async_smem_wavefronts_ideal);
      break;
    }
    case static_cast<uint8_t>(detail::Access::GmemLoad):
      ++c.gmem_load_instructions;
      for (unsigned lane = 0; lane < kWarpSize; ++lane) c.gmem_load_bytes += bytes[lane];
      c.gmem_load_sectors += sectors(addr, bytes, access.mask);
      break;
    case static_cast<uint8_t>(detail::Access::GmemStore):
      ++c.gmem_store_instructions;
      for (unsigned lane = 0; lane < kWarpSize; ++lane) c.gmem_store_bytes += bytes[lane];
      c.gmem_store_sectors += sectors(addr, bytes, access.mask);
      break;
    case static_cast<uint8_t>(detail::Access::Atomic):
      ++c.atomic_instructions;
      c.atomic_ops += active;
      c.atomic_sectors += sectors(addr, bytes, access.mask);
      (width == 4 ? c.atomic_ops_4b : width == 8 ? c.atomic_ops_8b : c.atomic_ops_other) += active;
      break;
    default:
      if (uint64_t* instructions = sm90_instructions(c, kind)) ++*instructions;
      break;
  }
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string json_dim3(const dim3& d) {
  std::ostringstream out;
  out << "[" << d.x << ", " << d.y << ", " << d.z << "]";
  return out.str();
}

// ---- sm_90 warpgroup MMA counters (wgmma.cpp, stmatrix.cpp) ----

void add_wgmma_counters(Counters& c, const Counters& o) {
  for (int t = 0; t < 3; ++t)
    for (int n = 0; n < 32; ++n) c.wgmma[t][n] += o.wgmma[t][n];
  c.wgmma_a_from_registers += o.wgmma_a_from_registers;
  c.cvt_e4m3x2_f32 += o.cvt_e4m3x2_f32;
  c.cvt_f16x2_e4m3x2 += o.cvt_f16x2_e4m3x2;
  c.wgmma_macs += o.wgmma_macs;
  c.wgmma_fence += o.wgmma_fence;
  c.wgmma_commit_group += o.wgmma_commit_group;
  c.wgmma_wait_group += o.wgmma_wait_group;
  c.setmaxnreg_inc += o.setmaxnreg_inc;
  c.setmaxnreg_dec += o.setmaxnreg_dec;
  c.fence_proxy_async_threads += o.fence_proxy_async_threads;
  for (int t = 0; t < 2; ++t)
    for (int n = 0; n < 3; ++n) c.stmatrix[t][n] += o.stmatrix[t][n];
  c.stmatrix_wavefronts += o.stmatrix_wavefronts;
  c.stmatrix_wavefronts_ideal += o.stmatrix_wavefronts_ideal;
}

// ", \"wgmma\": {...}, ..." with the shapes that ran, by name ("m64n64k16.bf16",
// "m64n128k32.e4m3").
std::string wgmma_json(const Counters& c) {
  std::ostringstream out;
  out << ", \"wgmma\": {\"instructions\": " << c.wgmma_instructions() << ", \"by_shape\": {";
  bool first = true;
  const char* inputs[3] = {"k16.f16", "k16.bf16", "k32.e4m3"};
  for (int t = 0; t < 3; ++t) {
    for (int n = 0; n < 32; ++n) {
      if (c.wgmma[t][n] == 0) continue;
      out << (first ? "" : ", ") << "\"m64n" << 8 * (n + 1) << inputs[t] << "\": " << c.wgmma[t][n];
      first = false;
    }
  }
  out << "}, \"a_from_registers\": " << c.wgmma_a_from_registers << ", \"macs\": " << c.wgmma_macs
      << ", \"fence\": " << c.wgmma_fence << ", \"commit_group\": " << c.wgmma_commit_group
      << ", \"wait_group\": " << c.wgmma_wait_group << "}, \"setmaxnreg\": {\"inc\": "
      << c.setmaxnreg_inc << ", \"dec\": " << c.setmaxnreg_dec
      << "}, \"fence_proxy_async_threads\": " << c.fence_proxy_async_threads
      << ", \"stmatrix\": {";
  const char* sizes[3] = {"x1", "x2", "x4"};
  for (int t = 0; t < 2; ++t)
    for (int n = 0; n < 3; ++n)
      out << (t + n ? ", " : "") << "\"" << sizes[n] << (t ? ".trans" : "") << "\": " << c.stmatrix[t][n];
  out << "}, \"stmatrix_wavefronts\": " << c.stmatrix_wavefronts
      << ", \"stmatrix_wavefronts_ideal\": " << c.stmatrix_wavefronts_ideal
      << ", \"cvt_e4m3x2_f32\": " << c.cvt_e4m3x2_f32
      << ", \"cvt_f16x2_e4m3x2\": " << c.cvt_f16x2_e4m3x2;
  return out.str();
}

// ---- end of the sm_90 warpgroup MMA counters ----

}  // namespace

Counters& Counters::operator+=(const Counters& o) {
  blocks += o.blocks;
  barriers += o.barriers;
  shuffles += o.shuffles;
  mma_m16n8k16_f16 += o.mma_m16n8k16_f16;
  mma_m16n8k16_bf16 += o.mma_m16n8k16_bf16;
  for (int t = 0; t < 2; ++t)
    for (int n = 0; n < 3; ++n) ldmatrix[t][n] += o.ldmatrix[t][n];
  ldmatrix_wavefronts += o.ldmatrix_wavefronts;
  ldmatrix_wavefronts_ideal += o.ldmatrix_wavefronts_ideal;
  lds_instructions += o.lds_instructions;
  lds_wavefronts += o.lds_wavefronts;
  lds_wavefronts_ideal += o.lds_wavefronts_ideal;
  sts_instructions += o.sts_instructions;
  sts_wavefronts += o.sts_wavefronts;
  sts_wavefronts_ideal += o.sts_wavefronts_ideal;
  cp_async_instructions += o.cp_async_instructions;
  cp_async_copies += o.cp_async_copies;
  cp_async_bytes += o.cp_async_bytes;
  cp_async_sectors += o.cp_async_sectors;
  cp_async_smem_wavefronts += o.cp_async_smem_wavefronts;
  cp_async_smem_wavefronts_ideal += o.cp_async_smem_wavefronts_ideal;
  gmem_load_instructions += o.gmem_load_instructions;
  gmem_load_bytes += o.gmem_load_bytes;
  gmem_load_sectors += o.gmem_load_sectors;
  gmem_store_instructions += o.gmem_store_instructions;
  gmem_store_bytes += o.gmem_store_bytes;
  gmem_store_sectors += o.gmem_store_sectors;
  atomic_ops += o.atomic_ops;
  atomic_instructions += o.atomic_instructions;
  atomic_sectors += o.atomic_sectors;
  atomic_ops_4b += o.atomic_ops_4b;
  atomic_ops_8b += o.atomic_ops_8b;
  atomic_ops_other += o.atomic_ops_other;
  mbarrier_init += o.mbarrier_init;
  mbarrier_arrive += o.mbarrier_arrive;
  mbarrier_arrive_expect_tx += o.mbarrier_arrive_expect_tx;
  mbarrier_expect_tx += o.mbarrier_expect_tx;
  mbarrier_try_wait += o.mbarrier_try_wait;
  mbarrier_test_wait += o.mbarrier_test_wait;
  mbarrier_inval += o.mbarrier_inval;
  mbarrier_fence_init += o.mbarrier_fence_init;
  named_barrier_sync += o.named_barrier_sync;
  named_barrier_arrive += o.named_barrier_arrive;
  bulk_load_instructions += o.bulk_load_instructions;
  bulk_load_bytes += o.bulk_load_bytes;
  bulk_store_instructions += o.bulk_store_instructions;
  bulk_store_bytes += o.bulk_store_bytes;
  bulk_reduce_instructions += o.bulk_reduce_instructions;
  bulk_reduce_bytes += o.bulk_reduce_bytes;
  bulk_commit_group += o.bulk_commit_group;
  bulk_wait_group += o.bulk_wait_group;
  bulk_wait_group_read += o.bulk_wait_group_read;
  tma_load_instructions += o.tma_load_instructions;
  tma_load_bytes += o.tma_load_bytes;
  tma_store_instructions += o.tma_store_instructions;
  tma_store_bytes += o.tma_store_bytes;
  tma_reduce_instructions += o.tma_reduce_instructions;
  tma_reduce_bytes += o.tma_reduce_bytes;
  tma_prefetch += o.tma_prefetch;
  add_wgmma_counters(*this, o);
  return *this;
}

void enable_counters(bool on) { detail::counting.store(on, std::memory_order_relaxed); }

bool counters_enabled() { return detail::counting_on(); }

void reset_counters() {
  std::lock_guard<std::mutex> lock(counted_mutex);
  counted.clear();
}

std::vector<LaunchCounters> counted_launches() {
  std::lock_guard<std::mutex> lock(counted_mutex);
  return counted;
}

std::string to_json(const Counters& c) {
  std::ostringstream out;
  out << "{\"blocks\": " << c.blocks << ", \"barriers\": " << c.barriers
      << ", \"shuffles\": " << c.shuffles << ", \"mma\": {\"m16n8k16.f16\": " << c.mma_m16n8k16_f16
      << ", \"m16n8k16.bf16\": " << c.mma_m16n8k16_bf16 << "}, \"ldmatrix\": {";
  const char* sizes[3] = {"x1", "x2", "x4"};
  for (int t = 0; t < 2; ++t)
    for (int n = 0; n < 3; ++n)
      out << (t + n ? ", " : "") << "\"" << sizes[n] << (t ? ".trans" : "") << "\": " << c.ldmatrix[t][n];
  out << "}, \"ldmatrix_wavefronts\": " << c.ldmatrix_wavefronts
      << ", \"ldmatrix_wavefronts_ideal\": " << c.ldmatrix_wavefronts_ideal
      << ", \"lds\": {\"instructions\": " << c.lds_instructions << ", \"wavefronts\": " << c.lds_wavefronts
      << ", \"wavefronts_ideal\": " << c.lds_wavefronts_ideal << "}"
      << ", \"sts\": {\"instructions\": " << c.sts_instructions << ", \"wavefronts\": " << c.sts_wavefronts
      << ", \"wavefronts_ideal\": " << c.sts_wavefronts_ideal << "}"
      << ", \"cp_async\": {\"instructions\": " << c.cp_async_instructions
      << ", \"copies\": " << c.cp_async_copies << ", \"bytes\": " << c.cp_async_bytes
      << ", \"sectors\": " << c.cp_async_sectors << ", \"smem_wavefronts\": " << c.cp_async_smem_wavefronts
      << ", \"smem_wavefronts_ideal\": " << c.cp_async_smem_wavefronts_ideal << "}"
      << ", \"gmem_load\": {\"instructions\": " << c.gmem_load_instructions
      << ", \"bytes\": " << c.gmem_load_bytes << ", \"sectors\": " << c.gmem_load_sectors << "}"
      << ", \"gmem_store\": {\"instructions\": " << c.gmem_store_instructions
      << ", \"bytes\": " << c.gmem_store_bytes << ", \"sectors\": " << c.gmem_store_sectors << "}"
      << ", \"atomics\": {\"ops\": " << c.atomic_ops << ", \"instructions\": " << c.atomic_instructions
      << ", \"sectors\": " << c.atomic_sectors << ", \"by_width\": {\"4\": " << c.atomic_ops_4b
      << ", \"8\": " << c.atomic_ops_8b << ", \"other\": " << c.atomic_ops_other << "}}"
      << ", \"mbarrier\": {\"init\": " << c.mbarrier_init << ", \"arrive\": " << c.mbarrier_arrive
      << ", \"arrive_expect_tx\": " << c.mbarrier_arrive_expect_tx
      << ", \"expect_tx\": " << c.mbarrier_expect_tx << ", \"try_wait\": " << c.mbarrier_try_wait
      << ", \"test_wait\": " << c.mbarrier_test_wait << ", \"inval\": " << c.mbarrier_inval
      << ", \"fence_init\": " << c.mbarrier_fence_init << "}"
      << ", \"named_barriers\": {\"sync\": " << c.named_barrier_sync
      << ", \"arrive\": " << c.named_barrier_arrive << "}"
      << ", \"bulk_copy\": {\"load\": {\"instructions\": " << c.bulk_load_instructions
      << ", \"bytes\": " << c.bulk_load_bytes << "}, \"store\": {\"instructions\": "
      << c.bulk_store_instructions << ", \"bytes\": " << c.bulk_store_bytes
      << "}, \"reduce\": {\"instructions\": " << c.bulk_reduce_instructions
      << ", \"bytes\": " << c.bulk_reduce_bytes << "}, \"commit_group\": " << c.bulk_commit_group
      << ", \"wait_group\": " << c.bulk_wait_group << ", \"wait_group_read\": " << c.bulk_wait_group_read
      << "}, \"tma\": {\"load\": {\"instructions\": " << c.tma_load_instructions
      << ", \"bytes\": " << c.tma_load_bytes << "}, \"store\": {\"instructions\": "
      << c.tma_store_instructions << ", \"bytes\": " << c.tma_store_bytes
      << "}, \"reduce\": {\"instructions\": " << c.tma_reduce_instructions
      << ", \"bytes\": " << c.tma_reduce_bytes << "}, \"prefetch\": " << c.tma_prefetch << "}"
      << wgmma_json(c)
      << ", \"smem_wavefronts\": " << c.smem_wavefronts()
      << ", \"smem_wavefronts_ideal\": " << c.smem_wavefronts_ideal()
      << ", \"global_sectors\": " << c.global_sectors() << "}";
  return out.str();
}

std::string counters_json() {
  const std::vector<LaunchCounters> launches = counted_launches();
  std::ostringstream out;
  out << "{\"launches\": [";
  std::vector<std::string> order;
  std::unordered_map<std::string, std::pair<uint64_t, Counters>> by_kernel;
  for (size_t i = 0; i < launches.size(); ++i) {
    const LaunchCounters& l = launches[i];
    out << (i ? ", " : "") << "{\"kernel\": " << json_string(l.kernel)
        << ", \"grid\": " << json_dim3(l.grid) << ", \"block\": " << json_dim3(l.block)
        << ", \"smem_bytes\": " << l.smem_bytes << ", \"counters\": " << to_json(l.counters) << "}";
    auto [it, fresh] = by_kernel.try_emplace(l.kernel);
    if (fresh) order.push_back(l.kernel);
    it->second.first += 1;
    it->second.second += l.counters;
  }
  out << "], \"kernels\": {";
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [n, c] = by_kernel[order[i]];
    out << (i ? ", " : "") << json_string(order[i]) << ": {\"launches\": " << n
        << ", \"counters\": " << to_json(c) << "}";
  }
  out << "}}";
  return out.str();
}

namespace detail {

void count_access(Access kind, const void* ptr, unsigned bytes, const char* file, int line) {
  SimBlock& block = active_block("a counted memory access");
  if (block.counters == nullptr) return;  // counters were off when this launch started
  SimThread& self = current_thread("a counted memory access");
  self.accesses.push_back(AccessRecord{file, line, static_cast<uint8_t>(kind),
                                       static_cast<uint8_t>(std::min(bytes, 255u)), 0, ptr, nullptr});
}

void count_sm90(SimBlock& block, Sm90Count kind, uint64_t bytes, const char* file, int line) {
  if (block.counters == nullptr) return;
  SimThread& self = current_thread("an sm_90 operation");
  self.accesses.push_back(AccessRecord{file, line, static_cast<uint8_t>(kind), 0, 0, nullptr, nullptr});
  Counters& c = *block.counters;
  switch (kind) {
    case kCountBulkLoad: c.bulk_load_bytes += bytes; break;
    case kCountBulkStore: c.bulk_store_bytes += bytes; break;
    case kCountBulkReduce: c.bulk_reduce_bytes += bytes; break;
    case kCountTmaLoad: c.tma_load_bytes += bytes; break;
    case kCountTmaStore: c.tma_store_bytes += bytes; break;
    case kCountTmaReduce: c.tma_reduce_bytes += bytes; break;
    default: break;
  }
}

void count_cp_async(SimThread& self, const void* smem_dst, const void* gmem_src, int src_bytes,
                    const char* file, int line) {
  self.accesses.push_back(AccessRecord{file, line, kCpAsyncAccess, 16,
                                       static_cast<uint8_t>(src_bytes), smem_dst, gmem_src});
}

void count_ldmatrix(SimBlock& block, int num_matrices, bool transpose, SimThread* const* lanes) {
  if (block.counters == nullptr) return;
  Counters& c = *block.counters;
  c.ldmatrix[transpose ? 1 : 0][num_matrices == 1 ? 0 : num_matrices == 2 ? 1 : 2] += 1;
  // Lanes 8m..8m+7 give the 16-byte rows of matrix m: one phase of 8 rows per matrix.
  uint64_t off[kWarpSize] = {};
  const uint32_t mask = num_matrices == 4 ? kFullWarp : (1u << (8 * num_matrices)) - 1;
  for (unsigned lane = 0; lane < kWarpSize; ++lane) {
    if (mask >> lane & 1u) off[lane] = smem_offset_of(block, lanes[lane]->mailbox.row);
  }
  smem_passes(off, mask, 16, c.ldmatrix_wavefronts, c.ldmatrix_wavefronts_ideal);
}

void count_mma(SimBlock& block, MmaInput input) {
  if (block.counters == nullptr) return;
  (input == MmaInput::F16 ? block.counters->mma_m16n8k16_f16 : block.counters->mma_m16n8k16_bf16) += 1;
}

void count_shuffle(SimBlock& block) {
  if (block.counters != nullptr) block.counters->shuffles += 1;
}

void count_barrier(SimBlock& block) {
  if (block.counters != nullptr) block.counters->barriers += 1;
}

void flush_accesses(SimBlock& block) {
  if (block.counters == nullptr) return;
  std::unordered_map<SiteKey, WarpAccess, SiteKeyHash> groups;
  std::vector<SiteKey> order;  // first-seen order, so the counts never depend on hashing
  std::unordered_map<SiteKey, uint32_t, SiteKeyHash> seen;
  for (const SimWarp& warp : block.warps) {
    groups.clear();
    order.clear();
    for (unsigned lane = 0; lane < warp.num_lanes; ++lane) {
      SimThread& thread = block.threads[warp.first_thread + lane];
      seen.clear();
      for (const AccessRecord& r : thread.accesses) {
        const uint32_t k = seen[SiteKey{r.file, r.line, r.kind, 0}]++;
        const SiteKey key{r.file, r.line, r.kind, k};
        auto [it, fresh] = groups.try_emplace(key);
        if (fresh) order.push_back(key);
        it->second.mask |= 1u << lane;
        it->second.lane[lane] = r;
      }
      thread.accesses.clear();
    }
    for (const SiteKey& key : order) count_warp_access(block, key.kind, groups[key], *block.counters);
  }
}

void commit_launch(LaunchCounters&& launch) {
  std::lock_guard<std::mutex> lock(counted_mutex);
  counted.push_back(std::move(launch));
}

// ---- sm_90 warpgroup MMA counters (wgmma.cpp, stmatrix.cpp) ----

void count_wgmma(SimBlock& block, int n, int input, int k, bool a_from_registers) {
  if (block.counters == nullptr) return;
  Counters& c = *block.counters;
  c.wgmma[input][n / 8 - 1] += 1;
  if (a_from_registers) c.wgmma_a_from_registers += 1;
  c.wgmma_macs += uint64_t{64} * static_cast<uint64_t>(n) * static_cast<uint64_t>(k);
}

void count_wgmma_sync(SimBlock& block, WgmmaSync kind) {
  if (block.counters == nullptr) return;
  Counters& c = *block.counters;
  (kind == WgmmaSync::Fence ? c.wgmma_fence : kind == WgmmaSync::Commit ? c.wgmma_commit_group
                                                                        : c.wgmma_wait_group) += 1;
}

void count_setmaxnreg(SimBlock& block, bool increase) {
  if (block.counters == nullptr) return;
  (increase ? block.counters->setmaxnreg_inc : block.counters->setmaxnreg_dec) += 1;
}

void count_fence_proxy_async(SimBlock& block) {
  if (block.counters != nullptr) block.counters->fence_proxy_async_threads += 1;
}

// Like ldmatrix: lanes 8m..8m+7 give the 16-byte rows of matrix m, one phase per matrix.
void count_stmatrix(SimBlock& block, int num_matrices, bool transpose, SimThread* const* lanes) {
  if (block.counters == nullptr) return;
  Counters& c = *block.counters;
  c.stmatrix[transpose ? 1 : 0][num_matrices == 1 ? 0 : num_matrices == 2 ? 1 : 2] += 1;
  uint64_t off[kWarpSize] = {};
  const uint32_t mask = num_matrices == 4 ? kFullWarp : (1u << (8 * num_matrices)) - 1;
  for (unsigned lane = 0; lane < kWarpSize; ++lane) {
    if (mask >> lane & 1u) off[lane] = smem_offset_of(block, lanes[lane]->mailbox.row);
  }
  smem_passes(off, mask, 16, c.stmatrix_wavefronts, c.stmatrix_wavefronts_ideal);
}

// ---- end of the sm_90 warpgroup MMA counters ----

}  // namespace detail
}  // namespace cudasim
