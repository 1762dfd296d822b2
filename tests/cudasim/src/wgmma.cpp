// wgmma.mma_async m64nNk16 (f16/bf16 into f32) and m64nNk32 (e4m3 into f32) and its fence /
// commit_group / wait_group, and setmaxnreg: warpgroup collectives on the rendezvous of
// warpgroup.h. Layouts are the PTX ISA's ("Register Fragments" and "Shared Memory Matrix
// Layout" for wgmma; see the comment at the top of csrc/cuda/ptx_sm90_mma.cuh for them in the
// ISA's terms).
//
// The model of asynchrony (README.md, "wgmma"): an MMA issued by wgmma.mma_async runs when the
// wgmma.wait_group that retires its commit group says so, and not before. At issue the shim
// validates the descriptors, records the operand bytes and which shared memory they came
// from, captures the accumulators' old values and overwrites them with a NaN: a kernel that
// reads D too early reads NaN. At retirement it checks that the shared-memory operands still
// hold what they held at issue (else a stage was released early: an error naming both lines),
// computes D from them like mma.sync (exact products, summed in double with C, rounded once to
// f32; hardware's e4m3 accumulation is not IEEE f32 summation in general, so only exact sums
// compare bit for bit) and writes D into the thread's accumulator array, which is alive
// because the thread is blocked in wait_group.
#include "wgmma.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>
#include <vector>

#include "async_proxy.h"
#include "block.h"
#include "fp_bits.h"
#include "swizzle.h"
#include "warpgroup.h"

namespace cudasim::detail {
namespace {

constexpr int kWgmmaM = 64;
constexpr int kMaxAccumulators = 128;  // N / 2 for N = 256
// What an accumulator holds while its MMA is in flight: a quiet NaN, so reads show up.
constexpr uint32_t kInFlightBits = 0x7fc0deadu;
constexpr int kRegisterFile = 64 * 1024;  // 32-bit registers per SM, all of one CTA here

struct WgmmaDescriptor {
  uint32_t start = 0, lbo = 0, sbo = 0;  // bytes
  uint32_t base_offset = 0;
  int swizzle_bytes = 0;  // 0, 32, 64, 128
};

WgmmaDescriptor decode_descriptor(uint64_t desc) {
  WgmmaDescriptor d;
  d.start = static_cast<uint32_t>(desc & 0x3fffu) << 4;
  d.lbo = static_cast<uint32_t>(desc >> 16 & 0x3fffu) << 4;
  d.sbo = static_cast<uint32_t>(desc >> 32 & 0x3fffu) << 4;
  d.base_offset = static_cast<uint32_t>(desc >> 49 & 0x7u);
  static const int kSwizzle[4] = {0, 128, 64, 32};  // layout type 0 none, 1 128B, 2 64B, 3 32B
  d.swizzle_bytes = kSwizzle[desc >> 62 & 0x3u];
  return d;
}

std::string wgmma_hex(uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

std::string wgmma_place(uint32_t offset) {
  std::ostringstream out;
  out << "smem+0x" << std::hex << offset;
  return out.str();
}

int wgmma_k(WgmmaInput input) { return input == WgmmaInput::E4M3 ? 32 : 16; }
uint32_t element_bytes(WgmmaInput input) { return input == WgmmaInput::E4M3 ? 1 : 2; }

// Byte offset, from the start of dynamic shared memory, of element (r, k) of a shared-memory
// operand of `eb`-byte elements: r its row in M (A) or N (B), k in 0..K-1. The canonical layouts
// of the ISA ("Shared Memory Matrix Layout"; CUTLASS's GMMA::Layout_*_Atom spell the same): a
// K-major operand keeps each row's K elements contiguous (a core matrix row is 16 bytes: 8
// 16-bit or 16 8-bit elements), an MN-major one (16-bit only) each k's rows contiguous. The
// swizzle applies to the address as a whole, as the hardware's does.
uint32_t element_offset(const WgmmaDescriptor& d, bool mn_major, uint32_t eb, int r, int k) {
  const uint32_t S = static_cast<uint32_t>(d.swizzle_bytes);
  const uint32_t ur = static_cast<uint32_t>(r), uk = static_cast<uint32_t>(k);
  const uint32_t per_core_row = 16 / eb;
  uint32_t address;
  if (!mn_major) {
    address = S == 0 ? d.start + ur / 8 * d.sbo + uk / per_core_row * d.lbo + ur % 8 * 16 +
                           uk % per_core_row * eb
                     : d.start + ur / 8 * d.sbo + ur % 8 * S + uk * eb;
  } else if (S == 0) {
    address = d.start + ur / 8 * d.sbo + uk / 8 * d.lbo + uk % 8 * 16 + ur % 8 * 2;
  } else {
    const uint32_t per_row = S / 2;  // elements of M or N per swizzled row
    address = d.start + ur / per_row * d.lbo + uk / 8 * d.sbo + uk % 8 * S + ur % per_row * 2;
  }
  return swizzle_offset(address, static_cast<int>(S));
}

// What each thread posts to the rendezvous.
struct WgmmaOperands {
  WgmmaShape shape;
  float* d;
  const uint32_t* a_regs;
  uint64_t desc_a, desc_b;
  int scale_d;
};

struct WgmmaThread {
  float* d = nullptr;
  bool chained = false;  // D's old value is the result of an MMA still in flight
  float c[kMaxAccumulators] = {};
};

// One MMA in flight.
struct InFlightMma {
  WgmmaShape shape{};
  Site site;
  bool a_from_registers = false;
  int scale_d = 1;
  // Operand elements as read at issue (f16/bf16 bits or e4m3 codes), and where in shared memory
  // they live (A only when it came from shared memory): A[64][K], B[n][K] (row r of N, column k).
  std::vector<uint16_t> a_bits, b_bits;
  std::vector<uint32_t> a_offsets, b_offsets;
  std::vector<WgmmaThread> threads;  // 128, in warpgroup order
};

// An accumulator array some MMA in flight will write.
struct PendingAccumulators {
  int values = 0;     // n / 2
  int in_flight = 0;  // MMAs issued into it and not retired
  float shadow[kMaxAccumulators] = {};  // its value once the retired ones are applied
  Site site;          // the latest MMA issued into it
  // The shared memory the latest e4m3 MMA into it read (A, then B): a chained one that reads
  // any of the same bytes again stepped K by too little.
  std::vector<uint32_t> last_a_offsets, last_b_offsets;
};

struct WarpgroupMmaState {
  std::vector<InFlightMma> uncommitted;
  std::deque<std::vector<InFlightMma>> groups;  // committed, oldest first
  std::map<float*, PendingAccumulators> pending;
  bool fenced[kWarpgroupThreads] = {};  // wgmma.fence since the thread's last wait_group
  int maxnreg = 0;                      // setmaxnreg's count, 0 before any
  Site maxnreg_site;
};

struct MmaState {
  std::vector<WarpgroupMmaState> groups;
  int initial_registers = 0;  // per thread at launch: what the block's size allows
};
thread_local MmaState wg;

WarpgroupMmaState& wg_group(const SimThread& thread) {
  return wg.groups[thread.warp / kWarpgroupWarps];
}

// One operand element, f16/bf16 bits or an e4m3 code.
uint16_t wgmma_read_element(const SimBlock& block, uint32_t offset, uint32_t eb) {
  if (eb == 1) return block.smem[offset];
  uint16_t bits;
  std::memcpy(&bits, block.smem + offset, sizeof bits);
  return bits;
}

// Gathers a shared-memory operand of `rows` rows through its descriptor, checking that it lies
// in dynamic shared memory and that the async proxy may read it.
void gather_operand(const SimBlock& block, const Site& site, const char* which, uint64_t desc,
            WgmmaInput input, bool mn_major, int rows, std::vector<uint16_t>& bits,
            std::vector<uint32_t>& offsets) {
  const int K = wgmma_k(input);
  const uint32_t eb = element_bytes(input);
  const WgmmaDescriptor d = decode_descriptor(desc);
  const std::string name = std::string("wgmma.mma_async: the descriptor of ") + which + " (" +
                           wgmma_hex(desc) + ")";
  if (d.base_offset != 0) {
    fail(site, name + " has base offset " + std::to_string(d.base_offset) +
                   ": the shim models only base offset 0 (a swizzled tile starting on its "
                   "pattern's 256/512/1024-byte boundary)");
  }
  bits.resize(static_cast<size_t>(rows) * K);
  offsets.resize(bits.size());
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < K; ++k) {
      const uint32_t offset = element_offset(d, mn_major, eb, r, k);
      if (static_cast<size_t>(offset) + eb > block.smem_bytes) {
        fail(site, name + " reaches " + wgmma_place(offset) + " for element (" + std::to_string(r) +
                       ", " + std::to_string(k) + "), outside the " +
                       std::to_string(block.smem_bytes) + " bytes of dynamic shared memory");
      }
      offsets[static_cast<size_t>(r) * K + k] = offset;
      bits[static_cast<size_t>(r) * K + k] = wgmma_read_element(block, offset, eb);
    }
  }
  for (uint32_t offset : offsets) {
    check_async_proxy_read(block.smem + offset, eb, "wgmma.mma_async", site.file, site.line);
  }
}

// The shared memory an MMA read at issue must be unchanged when it retires.
void check_operand_unchanged(const SimBlock& block, const InFlightMma& mma, const Site& wait_site,
                     const char* which, const std::vector<uint16_t>& bits,
                     const std::vector<uint32_t>& offsets) {
  const uint32_t eb = element_bytes(mma.shape.input);
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (wgmma_read_element(block, offsets[i], eb) == bits[i]) continue;
    const std::string writer = describe_last_smem_write(block.smem + offsets[i]);
    fail(mma.site, std::string("wgmma.mma_async issued here reads operand ") + which + " at " +
                       wgmma_place(offsets[i]) + ", which changed" +
                       (writer.empty() ? std::string() : " (last written at " + writer + ")") +
                       " before the wgmma.wait_group at " + describe(wait_site) +
                       " retired it: its shared memory was released or overwritten too early");
  }
}

// An operand element's exact value (e4m3: NaN for S.1111.111, which makes its sums NaN).
float wgmma_value(WgmmaInput input, uint16_t bits) {
  switch (input) {
    case WgmmaInput::BF16: return bf16_to_float(bits);
    case WgmmaInput::E4M3: return e4m3_to_float(static_cast<uint8_t>(bits));
    default: return f16_to_float(bits);
  }
}

// D = A * B (+ C) of one retired MMA, into the shadow of each thread's accumulators.
// Thread t of the warpgroup (warp w = t / 32) owns, with g = laneid / 4 and q = laneid % 4,
// d[i] = D[16w + g + 8 * ((i % 4) / 2)][8 * (i / 4) + 2q + i % 2].
void compute_mma(const SimBlock& block, WarpgroupMmaState& group, const InFlightMma& mma, const Site& wait_site) {
  if (!mma.a_from_registers) check_operand_unchanged(block, mma, wait_site, "A", mma.a_bits, mma.a_offsets);
  check_operand_unchanged(block, mma, wait_site, "B", mma.b_bits, mma.b_offsets);
  const int n = mma.shape.n, K = wgmma_k(mma.shape.input);
  std::vector<double> A(kWgmmaM * K), B(static_cast<size_t>(n) * K);  // A[m][k], B[col][k]
  for (size_t i = 0; i < A.size(); ++i) A[i] = wgmma_value(mma.shape.input, mma.a_bits[i]);
  for (size_t i = 0; i < B.size(); ++i) B[i] = wgmma_value(mma.shape.input, mma.b_bits[i]);
  for (unsigned t = 0; t < kWarpgroupThreads; ++t) {
    const WgmmaThread& slot = mma.threads[t];
    PendingAccumulators& pending = group.pending.at(slot.d);
    const unsigned warp = t / kWarpSize, lane = t % kWarpSize;
    const unsigned g = lane / 4, q = lane % 4;
    for (int i = 0; i < n / 2; ++i) {
      const unsigned row = 16 * warp + g + 8 * ((i % 4) / 2);
      const unsigned col = 8 * (i / 4) + 2 * q + i % 2;
      double sum = mma.scale_d == 0 ? 0.0 : slot.chained ? pending.shadow[i] : slot.c[i];
      for (int k = 0; k < K; ++k) sum += A[row * K + k] * B[col * K + k];
      pending.shadow[i] = static_cast<float>(sum);
    }
    pending.in_flight -= 1;
  }
}

// The register A fragment of thread t (warp w = t / 32, g = laneid / 4, q = laneid % 4), one
// per warp, lowest bits first. 16-bit (mma.m16n8k16's A fragment): a[0] = A[16w+g][2q..2q+1],
// a[1] = A[16w+g+8][2q..], a[2] = A[16w+g][2q+8..], a[3] = A[16w+g+8][2q+8..]. e4m3
// (mma.m16n8k32's 8-bit one): a[0] = A[16w+g][4q..4q+3], a[1] = A[16w+g+8][4q..],
// a[2] = A[16w+g][4q+16..4q+19], a[3] = A[16w+g+8][4q+16..].
void gather_registers(SimThread* const* threads, WgmmaInput input, std::vector<uint16_t>& bits) {
  const unsigned K = static_cast<unsigned>(wgmma_k(input)), eb = element_bytes(input);
  const unsigned per_reg = 4 / eb, bits_each = 8 * eb;
  bits.assign(kWgmmaM * K, 0);
  for (unsigned t = 0; t < kWarpgroupThreads; ++t) {
    const auto& in = *static_cast<const WgmmaOperands*>(threads[t]->mailbox.operands);
    const unsigned warp = t / kWarpSize, lane = t % kWarpSize;
    const unsigned g = lane / 4, q = lane % 4;
    for (unsigned reg = 0; reg < 4; ++reg) {
      const unsigned row = 16 * warp + g + 8 * (reg % 2), col = per_reg * q + K / 2 * (reg / 2);
      for (unsigned e = 0; e < per_reg; ++e) {
        bits[row * K + col + e] =
            static_cast<uint16_t>(in.a_regs[reg] >> (bits_each * e) & ((1u << bits_each) - 1));
      }
    }
  }
}

const char* wgmma_name(const WgmmaShape& shape) {
  switch (shape.input) {
    case WgmmaInput::BF16: return "wgmma.mma_async.m64nNk16.f32.bf16.bf16";
    case WgmmaInput::E4M3: return "wgmma.mma_async.m64nNk32.f32.e4m3.e4m3";
    default: return "wgmma.mma_async.m64nNk16.f32.f16.f16";
  }
}

// The first byte two operand reads share, or false.
bool first_shared_byte(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, uint32_t& shared) {
  if (a.empty() || b.empty()) return false;
  std::vector<uint32_t> sorted(a);
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t offset : b) {
    if (std::binary_search(sorted.begin(), sorted.end(), offset)) {
      shared = offset;
      return true;
    }
  }
  return false;
}

// A chained e4m3 MMA (it accumulates onto one in flight) that reads bytes its predecessor into
// the same accumulators read stepped K by too little: K = 32 per instruction is 32 bytes of a
// K-major row, not the 16 elements (16 bytes) of the 16-bit types' step.
void check_k_step(const Site& site, const InFlightMma& mma, const PendingAccumulators& previous) {
  uint32_t shared = 0;
  const char* which = nullptr;
  if (!mma.a_from_registers && first_shared_byte(previous.last_a_offsets, mma.a_offsets, shared)) {
    which = "A";
  } else if (first_shared_byte(previous.last_b_offsets, mma.b_offsets, shared)) {
    which = "B";
  }
  if (which == nullptr) return;
  fail(site, std::string(wgmma_name(mma.shape)) + " accumulates onto the MMA issued at " +
                 describe(previous.site) + " and reads operand " + which + " at " +
                 wgmma_place(shared) + " again: its descriptor stepped K by too little (an e4m3 "
                 "wgmma consumes K = 32, 32 bytes of each K-major row, per instruction)");
}

// Writes back every accumulator array with no MMA left in flight.
void write_back_accumulators(WarpgroupMmaState& group, const Site& wait_site) {
  for (auto it = group.pending.begin(); it != group.pending.end();) {
    PendingAccumulators& pending = it->second;
    if (pending.in_flight > 0) {
      ++it;
      continue;
    }
    float* d = it->first;
    for (int i = 0; i < pending.values; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &d[i], sizeof bits);
      if (bits != kInFlightBits) {
        fail(wait_site, "wgmma.wait_group: accumulator " + std::to_string(i) +
                            " of the wgmma.mma_async issued at " + describe(pending.site) +
                            " was written while the MMA was in flight (the kernel may not touch "
                            "D between the wgmma and the wait_group that retires it)");
      }
    }
    std::memcpy(d, pending.shadow, sizeof(float) * static_cast<size_t>(pending.values));
    it = group.pending.erase(it);
  }
}

void check_uniform(const Site& site, const char* what, uint64_t mine, uint64_t first, unsigned t) {
  if (mine != first) {
    fail(site, std::string("wgmma.mma_async: ") + what + " must be the same in every thread of "
                   "the warpgroup: thread 0 passes " + wgmma_hex(first) + ", thread " +
                   std::to_string(t) + " " + wgmma_hex(mine));
  }
}

}  // namespace

void reset_warpgroup_async_state(const SimBlock& block) {
  wg.groups.assign(block.warpgroups.size(), WarpgroupMmaState{});
  // Registers per thread at launch: the most the block's size allows (the shim does not know
  // what the compiler chose), in steps of 8, at most 256.
  const size_t threads = block.threads.size();
  wg.initial_registers =
      threads == 0 ? 256 : std::min<int>(256, static_cast<int>(kRegisterFile / threads) / 8 * 8);
  reset_async_proxy(block);
}

void wgmma_mma_async(const WgmmaShape& shape, float* d, const uint32_t* a_regs, uint64_t desc_a,
                     uint64_t desc_b, int scale_d, const char* file, int line) {
  const Site site{file, line};
  const WarpgroupCall call{wgmma_name(shape), site};
  if (shape.n < 8 || shape.n > 256 || shape.n % 8 != 0) {
    fail(site, std::string(call.op) + ": N = " + std::to_string(shape.n) +
                   " is not a multiple of 8 from 8 to 256");
  }
  if (a_regs != nullptr && shape.trans_a != 0) {
    fail(site, std::string(call.op) + ": imm-trans-a must be 0 when A comes from registers");
  }
  if (shape.input == WgmmaInput::E4M3 && (shape.trans_a != 0 || shape.trans_b != 0)) {
    fail(site, std::string(call.op) + ": operand " + (shape.trans_a != 0 ? "A" : "B") +
                   " is M- or N-major, but 8-bit operands must be K-major (the ISA transposes "
                   "only f16 and bf16): transpose the tile in shared memory (V for P * V)");
  }
  WgmmaOperands mine{shape, d, a_regs, desc_a, desc_b, scale_d};
  warpgroup_rendezvous(call, &mine, [&](SimThread* const* threads) {
    SimBlock& block = active_block(call.op);
    WarpgroupMmaState& group = wg_group(*threads[0]);
    const auto& first = *static_cast<const WgmmaOperands*>(threads[0]->mailbox.operands);
    for (unsigned t = 0; t < kWarpgroupThreads; ++t) {
      const auto& in = *static_cast<const WgmmaOperands*>(threads[t]->mailbox.operands);
      if (!group.fenced[t]) {
        fail(site, std::string(call.op) + ": thread " + std::to_string(t) +
                       " of the warpgroup has executed no wgmma.fence since the kernel began or "
                       "since its last wgmma.wait_group (missing wgmma_fence before the first "
                       "wgmma of a batch: its accumulator and A registers are not ordered "
                       "with the MMA)",
             threads[t]);
      }
      if (in.a_regs == nullptr) check_uniform(site, "the descriptor of A", in.desc_a, first.desc_a, t);
      check_uniform(site, "the descriptor of B", in.desc_b, first.desc_b, t);
      check_uniform(site, "scale-d", in.scale_d != 0, first.scale_d != 0, t);
    }
    InFlightMma mma;
    mma.shape = shape;
    mma.site = site;
    mma.a_from_registers = a_regs != nullptr;
    mma.scale_d = scale_d;
    if (mma.a_from_registers) {
      gather_registers(threads, shape.input, mma.a_bits);
    } else {
      gather_operand(block, site, "A", desc_a, shape.input, shape.trans_a != 0, kWgmmaM, mma.a_bits,
                     mma.a_offsets);
    }
    gather_operand(block, site, "B", desc_b, shape.input, shape.trans_b != 0, shape.n, mma.b_bits,
                   mma.b_offsets);
    mma.threads.resize(kWarpgroupThreads);
    const int values = shape.n / 2;
    for (unsigned t = 0; t < kWarpgroupThreads; ++t) {
      float* acc = static_cast<const WgmmaOperands*>(threads[t]->mailbox.operands)->d;
      WgmmaThread& slot = mma.threads[t];
      slot.d = acc;
      auto [it, fresh] = group.pending.try_emplace(acc);
      PendingAccumulators& pending = it->second;
      if (!fresh && pending.values != values) {
        fail(site, std::string(call.op) + ": thread " + std::to_string(t) + "'s accumulators are "
                       "those of the MMA in flight from " + describe(pending.site) + " with " +
                       std::to_string(pending.values) + " values, not " + std::to_string(values),
             threads[t]);
      }
      slot.chained = !fresh;  // D's old value is the pending result
      if (t == 0 && shape.input == WgmmaInput::E4M3) {
        if (!fresh && scale_d != 0) check_k_step(site, mma, pending);
        pending.last_a_offsets = mma.a_offsets;
        pending.last_b_offsets = mma.b_offsets;
      }
      if (fresh) std::memcpy(slot.c, acc, sizeof(float) * static_cast<size_t>(values));
      pending.values = values;
      pending.in_flight += 1;
      pending.site = site;
      for (int i = 0; i < values; ++i) std::memcpy(&acc[i], &kInFlightBits, sizeof(float));
    }
    count_wgmma(block, shape.n, static_cast<int>(shape.input), wgmma_k(shape.input),
                mma.a_from_registers);
    group.uncommitted.push_back(std::move(mma));
  });
}

void wgmma_fence(const char* file, int line) {
  const WarpgroupCall call{"wgmma.fence", Site{file, line}};
  warpgroup_rendezvous(call, nullptr, [&](SimThread* const* threads) {
    WarpgroupMmaState& group = wg_group(*threads[0]);
    for (bool& fenced : group.fenced) fenced = true;
    count_wgmma_sync(active_block(call.op), WgmmaSync::Fence);
  });
}

void wgmma_commit_group(const char* file, int line) {
  const WarpgroupCall call{"wgmma.commit_group", Site{file, line}};
  warpgroup_rendezvous(call, nullptr, [&](SimThread* const* threads) {
    WarpgroupMmaState& group = wg_group(*threads[0]);
    group.groups.push_back(std::move(group.uncommitted));
    group.uncommitted.clear();
    count_wgmma_sync(active_block(call.op), WgmmaSync::Commit);
  });
}

void wgmma_wait_group(int pending_groups_allowed, const char* file, int line) {
  const Site site{file, line};
  const WarpgroupCall call{"wgmma.wait_group", site};
  if (pending_groups_allowed < 0 || pending_groups_allowed > 7) {
    fail(site, "wgmma.wait_group " + std::to_string(pending_groups_allowed) + ": not 0 to 7");
  }
  // This frame lies below every live frame of the kernel's thread: accumulators below it are
  // in a frame that has returned (the stack grows down on x86-64 and AArch64).
  void* frame = __builtin_frame_address(0);
  warpgroup_rendezvous(call, frame, [&](SimThread* const* threads) {
    SimBlock& block = active_block(call.op);
    WarpgroupMmaState& group = wg_group(*threads[0]);
    while (group.groups.size() > static_cast<size_t>(pending_groups_allowed)) {
      for (const InFlightMma& mma : group.groups.front()) {
        // An accumulator array in a frame that has returned would be written over whatever
        // lives there now: it must outlive the wait. (Best effort: a frame within 1 MB below.)
        for (unsigned t = 0; t < kWarpgroupThreads; ++t) {
          const auto marker = reinterpret_cast<uintptr_t>(threads[t]->mailbox.operands);
          const auto acc = reinterpret_cast<uintptr_t>(mma.threads[t].d);
          if (acc < marker && marker - acc < (size_t{1} << 20)) {
            fail(mma.site, std::string("the accumulators of the wgmma.mma_async issued here "
                                       "lived in a function that returned before the "
                                       "wgmma.wait_group at ") + describe(site) + " retired it",
                 threads[t]);
          }
        }
        compute_mma(block, group, mma, site);
      }
      group.groups.pop_front();
    }
    write_back_accumulators(group, site);
    for (bool& fenced : group.fenced) fenced = false;
    count_wgmma_sync(block, WgmmaSync::Wait);
  });
}

void setmaxnreg(bool increase, int count, const char* file, int line) {
  const Site site{file, line};
  const WarpgroupCall call{increase ? "setmaxnreg.inc" : "setmaxnreg.dec", site};
  if (count < 24 || count > 256 || count % 8 != 0) {
    fail(site, std::string(call.op) + " " + std::to_string(count) +
                   ": the count must be a multiple of 8 from 24 to 256");
  }
  warpgroup_rendezvous(call, &count, [&](SimThread* const* threads) {
    SimBlock& block = active_block(call.op);
    for (unsigned t = 1; t < kWarpgroupThreads; ++t) {
      const int other = *static_cast<const int*>(threads[t]->mailbox.operands);
      if (other != count) {
        fail(site, std::string(call.op) + ": the count must be the same in the whole warpgroup: "
                       "thread 0 asks for " + std::to_string(count) + ", thread " +
                       std::to_string(t) + " for " + std::to_string(other),
             threads[t]);
      }
    }
    WarpgroupMmaState& group = wg_group(*threads[0]);
    group.maxnreg = count;
    group.maxnreg_site = site;
    count_setmaxnreg(block, increase);
    // Once every warpgroup has asked, their counts must fit the register file together.
    long total = 0;
    for (const WarpgroupMmaState& g : wg.groups) {
      if (g.maxnreg == 0) return;
      total += long{g.maxnreg} * kWarpgroupThreads;
    }
    if (total > kRegisterFile) {
      std::string counts;
      for (size_t g = 0; g < wg.groups.size(); ++g) {
        counts += (g ? ", " : "") + std::to_string(wg.groups[g].maxnreg);
      }
      fail(site, std::string(call.op) + " " + std::to_string(count) + ": the warpgroups ask for " +
                     counts + " registers per thread, " + std::to_string(total) +
                     " in all, more than the " + std::to_string(kRegisterFile) +
                     "-register file (setmaxnreg.inc would wait for registers forever)");
    }
  });
}

void check_warpgroup_async_at_exit(const SimBlock& block, const SimThread& self) {
  const unsigned g = self.warp / kWarpgroupWarps;
  if (g >= wg.groups.size()) return;
  const WarpgroupMmaState& group = wg.groups[g];
  const InFlightMma* left = !group.groups.empty() && !group.groups.front().empty()
                        ? &group.groups.front().front()
                        : nullptr;
  for (const std::vector<InFlightMma>& committed : group.groups) {
    if (left == nullptr && !committed.empty()) left = &committed.front();
  }
  if (left == nullptr && !group.uncommitted.empty()) left = &group.uncommitted.front();
  if (left != nullptr) {
    fail(left->site, "wgmma.mma_async issued here is still in flight when the thread returns "
                     "(missing wgmma.commit_group / wgmma.wait_group)");
  }
  if (block.live_threads != 1) return;
  // The block's last thread: warpgroups that never asked keep their launch count.
  long total = 0;
  const WarpgroupMmaState* asked = nullptr;
  for (const WarpgroupMmaState& other : wg.groups) {
    total += long{other.maxnreg != 0 ? other.maxnreg : wg.initial_registers} * kWarpgroupThreads;
    if (other.maxnreg != 0) asked = &other;
  }
  if (asked != nullptr && total > kRegisterFile) {
    fail(asked->maxnreg_site,
         "setmaxnreg: the warpgroups' register counts (" + std::to_string(total) +
             " registers, counting " + std::to_string(wg.initial_registers) +
             " per thread for warpgroups that never executed setmaxnreg) exceed the " +
             std::to_string(kRegisterFile) + "-register file");
  }
}

}  // namespace cudasim::detail
