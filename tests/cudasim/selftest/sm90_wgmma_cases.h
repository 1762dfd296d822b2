// Cases for wgmma.mma_async and stmatrix, in the style of primitive_cases.h: each runs a
// one-warpgroup kernel on integer-valued inputs and returns what it wrote beside a scalar
// reference built here from the PTX ISA's descriptions (shared-memory layouts drawn as the ISA
// draws them: core matrices, swizzle atoms of 8 rows whose 16-byte chunks are permuted by the
// row; register fragments by groupID and threadID_in_group), independently of the shim's code.
// One case kernel and driver serve every element type (f16, bf16 here; e4m3 in
// sm90_fp8_cases.h): the layouts are the same in bytes, K per instruction is 32 bytes' worth.
// The shim self-test (wgmma_test.cpp) and the GPU layout check (selftest/sm90_cases.h) run the
// same cases with the same inputs; all outputs are exact, so hardware must agree bit for bit.
// Compiles under nvcc (-gencode arch=compute_90a,code=sm_90a) and under the shim.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/tensor_map.h"
#include "primitive_cases.h"

namespace primitives {

constexpr int kWarpgroup = 128;

// The element types wgmma takes here. One instruction consumes 32 bytes of each row of A and B:
// K = 16 for the 16-bit types, 32 for e4m3.
enum class WgmmaElem { F16, Bf16, E4m3 };
constexpr int elem_bytes(WgmmaElem e) { return e == WgmmaElem::E4m3 ? 1 : 2; }
constexpr int k_per_mma(WgmmaElem e) { return 32 / elem_bytes(e); }
inline const char* elem_name(WgmmaElem e) {
  return e == WgmmaElem::E4m3 ? "e4m3" : e == WgmmaElem::Bf16 ? "bf16" : "f16";
}

// e4m3 bits from cuda_fp8.h's host conversion (round to nearest even, saturating).
inline uint8_t e4m3_bits(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// x in the element type, as the low elem_bytes bytes.
inline uint32_t elem_bits(WgmmaElem e, float x) {
  if (e == WgmmaElem::E4m3) return e4m3_bits(x);
  return e == WgmmaElem::Bf16 ? bits16(__float2bfloat16_rn(x)) : bits16(__float2half_rn(x));
}

// Where a case's A and B tiles live and how their descriptors describe them (bytes).
struct WgmmaCaseParams {
  uint32_t a_offset, b_offset;  // from the 1024-byte aligned tile base
  uint32_t a_lbo, a_sbo, b_lbo, b_sbo;
  uint32_t a_swizzle, b_swizzle;  // flashattn::ptx::WgmmaSwizzle values
  uint32_t a_step, b_step;        // descriptor advance for the second K step
  uint32_t image_bytes;           // a multiple of 16
  int scale_d;                    // 0: the first MMA ignores the accumulators' old value
  int k_steps;                    // 1 or 2 chained MMAs
};

// One warpgroup: copies the shared-memory image to a 1024-byte aligned tile (plain stores, then
// fence.proxy.async, as a kernel staging operands itself must), loads its accumulators (and A
// fragments) from cd (a_regs), runs k_steps wgmmas into them as one commit group, waits, and
// writes the accumulators back. cd: [128 threads][N / 2]; a_regs: [k_steps][128][4].
// e4m3 operands are K-major only (kMajorA = kMajorB = 0).
template <int N, WgmmaElem kElem, bool kARegs, int kMajorA, int kMajorB>
__global__ void wgmma_case_kernel(WgmmaCaseParams p, const uint4* image, const uint32_t* a_regs,
                                  float* cd) {
  using namespace flashattn::ptx;
  constexpr WgmmaMajor kA = static_cast<WgmmaMajor>(kMajorA), kB = static_cast<WgmmaMajor>(kMajorB);
  static_assert(kElem != WgmmaElem::E4m3 || (kMajorA == 0 && kMajorB == 0), "e4m3 is K-major only");
  // (nvcc: extern __shared__ arrays of one name must share a type in a translation unit.)
  FLASHATTN_DYNAMIC_SMEM(unsigned char, wgmma_smem);
  const int tid = threadIdx.x;
  unsigned char* tile = wgmma_smem + (1024 - smem_u32addr(wgmma_smem) % 1024) % 1024;
  uint4* tile16 = reinterpret_cast<uint4*>(tile);
  for (uint32_t i = tid; i < p.image_bytes / 16; i += kWarpgroup) FLASHATTN_SMEM(tile16)[i] = image[i];
  fence_proxy_async_shared_cta();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = cd[tid * (N / 2) + i];
  uint32_t a[2][4] = {};
  if (kARegs) {
    for (int s = 0; s < p.k_steps; ++s)
      for (int j = 0; j < 4; ++j) a[s][j] = a_regs[(s * kWarpgroup + tid) * 4 + j];
  }
  const uint64_t desc_a = wgmma_descriptor(smem_u32addr(tile + p.a_offset), p.a_lbo, p.a_sbo,
                                           static_cast<WgmmaSwizzle>(p.a_swizzle));
  const uint64_t desc_b = wgmma_descriptor(smem_u32addr(tile + p.b_offset), p.b_lbo, p.b_sbo,
                                           static_cast<WgmmaSwizzle>(p.b_swizzle));
  wgmma_fence_operand(d);
  wgmma_fence();
  for (int s = 0; s < p.k_steps; ++s) {
    const uint64_t da = wgmma_descriptor_advance(desc_a, s * p.a_step);
    const uint64_t db = wgmma_descriptor_advance(desc_b, s * p.b_step);
    const int scale_d = s == 0 ? p.scale_d : 1;
    if constexpr (kElem == WgmmaElem::E4m3) {
      if constexpr (kARegs) wgmma_e4m3_rs<N>(d, a[s], db, scale_d);
      if constexpr (!kARegs) wgmma_e4m3_ss<N>(d, da, db, scale_d);
    } else if constexpr (kElem == WgmmaElem::Bf16) {
      if constexpr (kARegs) wgmma_bf16_rs<N, kB>(d, a[s], db, scale_d);
      if constexpr (!kARegs) wgmma_bf16_ss<N, kA, kB>(d, da, db, scale_d);
    } else {
      if constexpr (kARegs) wgmma_f16_rs<N, kB>(d, a[s], db, scale_d);
      if constexpr (!kARegs) wgmma_f16_ss<N, kA, kB>(d, da, db, scale_d);
    }
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(d);
  for (int i = 0; i < N / 2; ++i) cd[tid * (N / 2) + i] = d[i];
}

// ---- The reference: shared-memory layouts as the ISA draws them ("Shared Memory Matrix
// Layout", "Strides", "Matrix Descriptor Format"), in bytes, for elements of E bytes. ----
struct OperandLayout {
  bool mn_major;      // imm-trans 1: M- or N-major (16-bit elements only)
  int swizzle_bytes;  // 0, 32, 64, 128
  uint32_t lbo, sbo;  // the descriptor's byte offsets
  uint32_t k_column;  // K-major, swizzled: where the next S bytes of a row's k live
  int elem_bytes;     // E: 2 (f16, bf16) or 1 (e4m3)
};

inline uint32_t swizzle_code(int bytes) { return bytes == 128 ? 1 : bytes == 64 ? 2 : bytes == 32 ? 3 : 0; }

// Byte offset of element (r, k) (r in M or N, k in K) from the operand's start.
// No swizzle: "core matrices" of 8 rows x 16 bytes, stored as 128 contiguous bytes. K-major: a
//   core row is 16 / E consecutive k of one r; the next core along K is LBO away, along M/N SBO.
//   MN-major: a core row is 16 / E consecutive r of one k; the next core along K is LBO away,
//   along M/N SBO.
// Swizzled (S bytes): "swizzle atoms" of 8 rows of S bytes, 8 * S bytes in all, whose 16-byte
//   chunks are permuted: in atom row j, chunk c is stored at chunk c ^ ((j * S / 128) % (S / 16))
//   (for 128 B: c ^ j; 64 B: c ^ (j / 2); 32 B: c ^ (j / 4) -- the figures' repeating pattern).
//   K-major: atom row j holds S / E consecutive k of r = 8 * atom + j; atoms along M/N are SBO
//   apart (LBO unused), K beyond S bytes continues in the next column of atoms (k_column).
//   MN-major: atom row j holds S / E consecutive r of k = 8 * group + j; atoms along M/N are
//   LBO apart, k-groups SBO apart.
inline uint32_t layout_offset(const OperandLayout& L, int r, int k) {
  const uint32_t ur = static_cast<uint32_t>(r), uk = static_cast<uint32_t>(k);
  const uint32_t E = static_cast<uint32_t>(L.elem_bytes), per_core_row = 16 / E;
  if (L.swizzle_bytes == 0) {
    return L.mn_major ? ur / per_core_row * L.sbo + uk / 8 * L.lbo + uk % 8 * 16 + ur % per_core_row * E
                      : ur / 8 * L.sbo + uk / per_core_row * L.lbo + ur % 8 * 16 + uk % per_core_row * E;
  }
  const uint32_t S = static_cast<uint32_t>(L.swizzle_bytes), per_row = S / E;
  uint32_t atom, row, byte;
  if (L.mn_major) {
    atom = ur / per_row * L.lbo + uk / 8 * L.sbo;
    row = uk % 8;
    byte = ur % per_row * E;
  } else {
    atom = ur / 8 * L.sbo + uk / per_row * L.k_column;
    row = ur % 8;
    byte = uk % per_row * E;
  }
  const uint32_t chunk = byte / 16, stored_chunk = chunk ^ (row * S / 128 % (S / 16));
  return atom + row * S + stored_chunk * 16 + byte % 16;
}

// A layout of `rows` x `k_total` elements of E bytes with every descriptor field in use, and
// the descriptor advance to the second K step (one MMA's 32 bytes of K further).
inline OperandLayout make_layout(int elem_bytes, bool mn_major, int swizzle_bytes, int rows, int k_total,
                                 bool padded, uint32_t& step, uint32_t& bytes) {
  OperandLayout L{mn_major, swizzle_bytes, 0, 0, 0, elem_bytes};
  const uint32_t pad = padded ? 256 : 0;  // strides larger than the data: a gap between tiles
  const uint32_t per_core_row = 16 / static_cast<uint32_t>(elem_bytes);
  const uint32_t row_cores = static_cast<uint32_t>((rows + 7) / 8);
  const uint32_t k_bytes = static_cast<uint32_t>(k_total * elem_bytes);
  if (swizzle_bytes == 0) {
    if (!mn_major) {  // k-cores adjacent, then the next 8 rows
      L.lbo = 128;
      L.sbo = 128 * (k_bytes / 16) + pad;
      bytes = row_cores * L.sbo;
    } else {  // r-cores adjacent, then the next 8 k
      L.sbo = 128;
      L.lbo = 128 * ((static_cast<uint32_t>(rows) + per_core_row - 1) / per_core_row) + pad;
      bytes = static_cast<uint32_t>(k_total / 8) * L.lbo;
    }
    step = 2 * L.lbo;  // 32 bytes of K: two core matrices
    return L;
  }
  const uint32_t S = static_cast<uint32_t>(swizzle_bytes), atom = 8 * S;
  const uint32_t gap = padded ? atom : 0;  // swizzled strides stay multiples of the atom
  if (!mn_major) {
    L.lbo = 16;  // unused: "assumed 1"
    L.sbo = atom + gap;
    L.k_column = row_cores * L.sbo;
    bytes = (k_bytes + S - 1) / S * L.k_column;
    step = S >= 64 ? 32 : L.k_column;  // 32 bytes further along the row
  } else {
    const uint32_t per_row = S / static_cast<uint32_t>(elem_bytes);
    const uint32_t mn_atoms = (static_cast<uint32_t>(rows) + per_row - 1) / per_row;
    L.sbo = atom;
    L.lbo = static_cast<uint32_t>(k_total / 8) * atom + gap;
    bytes = mn_atoms * L.lbo;
    step = 2 * L.sbo;
  }
  return L;
}

// The wgmma fragments: with w = warp of the warpgroup, g = laneid / 4, q = laneid % 4,
// D element i (0 <= i < N/2) is D[16w + g + 8 * ((i % 4) / 2)][8 * (i / 4) + 2q + i % 2].
// A register element e (P = 4 / E elements per .b32, lowest first; 4P in all) is
// A[16w + g + 8 * ((e / P) % 2)][P * q + e % P + 4P * (e / 2P)]: for 16-bit elements
// A[.. + 8 * ((e / 2) % 2)][2q + e % 2 + 8 * (e / 4)], for e4m3 A[.. + 8 * ((e / 4) % 2)]
// [4q + e % 4 + 16 * (e / 8)].
inline int wgmma_d_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i % 4) / 2); }
inline int wgmma_d_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }
inline int wgmma_a_row(int per_reg, int t, int e) {
  return 16 * (t / 32) + (t % 32) / 4 + 8 * ((e / per_reg) % 2);
}
inline int wgmma_a_col(int per_reg, int t, int e) {
  return per_reg * (t % 4) + e % per_reg + 4 * per_reg * (e / (2 * per_reg));
}

// A case beyond its compile-time shape (N, element type, A from registers, majors).
struct WgmmaCaseSpec {
  int a_swizzle, b_swizzle;  // 0, 32, 64, 128 bytes
  int k_steps;               // 1 or 2 chained MMAs
  int scale_d;
  bool padded;               // strides larger than the data
  bool fractions;            // inputs in quarters (-2 to 2) instead of integers (-4 to 4)
};

// D[64 x N] = (scale_d ? C : 0) + A[64 x K] * B[K x N] on small values whose every partial sum
// is exact in f32 (so the comparison is bitwise; hardware's e4m3 accumulation is not IEEE f32
// summation in general), A and B laid out by the reference above.
template <int N, WgmmaElem kElem, bool kARegs, int kMajorA = 0, int kMajorB = 0>
CaseResult run_wgmma_case(const WgmmaCaseSpec& spec, Rng& rng) {
  constexpr int E = elem_bytes(kElem), kStepK = k_per_mma(kElem), kPerReg = 4 / E;
  const int K = kStepK * spec.k_steps;
  auto draw = [&]() {
    return spec.fractions ? static_cast<float>(rng.below(17) - 8) * 0.25f
                          : static_cast<float>(rng.below(9) - 4);
  };
  std::vector<float> A(64 * K), B(static_cast<size_t>(N) * K), C(64 * N);  // A[m][k], B[n][k]
  for (float& x : A) x = draw();
  for (float& x : B) x = draw();
  for (float& x : C) x = static_cast<float>(rng.below(65) - 32);
  uint32_t a_step = 0, b_step = 0, a_bytes = 0, b_bytes = 0;
  const OperandLayout la = make_layout(E, kMajorA, spec.a_swizzle, 64, K, spec.padded, a_step, a_bytes);
  const OperandLayout lb = make_layout(E, kMajorB, spec.b_swizzle, N, K, spec.padded, b_step, b_bytes);
  WgmmaCaseParams p{};
  p.a_offset = 0;
  p.b_offset = kARegs ? 0 : (a_bytes + 1023) / 1024 * 1024;
  p.a_lbo = la.lbo, p.a_sbo = la.sbo, p.b_lbo = lb.lbo, p.b_sbo = lb.sbo;
  p.a_swizzle = swizzle_code(spec.a_swizzle), p.b_swizzle = swizzle_code(spec.b_swizzle);
  p.a_step = a_step, p.b_step = b_step;
  p.image_bytes = (p.b_offset + b_bytes + 15) / 16 * 16;
  p.scale_d = spec.scale_d;
  p.k_steps = spec.k_steps;
  std::vector<unsigned char> image(p.image_bytes, 0);
  auto store = [&](uint32_t offset, float x) {
    const uint32_t bits = elem_bits(kElem, x);
    for (int b = 0; b < E; ++b) image[offset + b] = static_cast<unsigned char>(bits >> (8 * b));
  };
  for (int r = 0; r < 64 && !kARegs; ++r)
    for (int k = 0; k < K; ++k) store(p.a_offset + layout_offset(la, r, k), A[r * K + k]);
  for (int r = 0; r < N; ++r)
    for (int k = 0; k < K; ++k) store(p.b_offset + layout_offset(lb, r, k), B[r * K + k]);
  std::vector<uint32_t> a_regs(static_cast<size_t>(spec.k_steps) * kWarpgroup * 4, 0);
  for (int s = 0; s < spec.k_steps; ++s)
    for (int t = 0; t < kWarpgroup; ++t)
      for (int e = 0; e < 4 * kPerReg; ++e) {
        const float x = A[wgmma_a_row(kPerReg, t, e) * K + kStepK * s + wgmma_a_col(kPerReg, t, e)];
        a_regs[(s * kWarpgroup + t) * 4 + e / kPerReg] |= elem_bits(kElem, x) << (8 * E * (e % kPerReg));
      }
  std::vector<float> cd(kWarpgroup * (N / 2)), expected(cd.size());
  for (int t = 0; t < kWarpgroup; ++t) {
    for (int i = 0; i < N / 2; ++i) {
      const int row = wgmma_d_row(t, i), col = wgmma_d_col(t, i);
      cd[t * (N / 2) + i] = C[row * N + col];
      double sum = spec.scale_d ? C[row * N + col] : 0.0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(A[row * K + k]) * B[col * K + k];
      expected[t * (N / 2) + i] = static_cast<float>(sum);
    }
  }
  std::vector<uint4> image16(p.image_bytes / 16);
  std::memcpy(image16.data(), image.data(), p.image_bytes);
  DeviceArray<uint4> image_d(image16);
  DeviceArray<uint32_t> a_d(a_regs);
  DeviceArray<float> cd_d(cd);
  auto kernel = wgmma_case_kernel<N, kElem, kARegs, kMajorA, kMajorB>;
  launch_one_block(kernel, kWarpgroup, p.image_bytes + 1024, p,
                   static_cast<const uint4*>(image_d.get()), static_cast<const uint32_t*>(a_d.get()),
                   cd_d.get());
  auto layout_name = [](int mn, int swizzle) {
    return std::string(mn ? "MN" : "K") + (swizzle ? "sw" + std::to_string(swizzle) : "");
  };
  const std::string name = "wgmma_m64n" + std::to_string(N) + "k" + std::to_string(kStepK) + "_" +
                           elem_name(kElem) +
                           (kARegs ? "_rs_Areg" : "_ss_A" + layout_name(kMajorA, spec.a_swizzle)) +
                           "_B" + layout_name(kMajorB, spec.b_swizzle) +
                           (spec.k_steps == 2 ? "_k" + std::to_string(2 * kStepK) : "") +
                           (spec.scale_d ? "" : "_overwrite") + (spec.padded ? "_padded" : "") +
                           (spec.fractions ? "_quarters" : "");
  const auto actual = bytes_of(cd_d.read());
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// The case from shared memory with A and B M/N-major (true) or K-major (false).
template <int N, WgmmaElem kElem>
CaseResult run_wgmma_ss_case(bool a_mn, bool b_mn, const WgmmaCaseSpec& spec, Rng& rng) {
  if (a_mn && b_mn) return run_wgmma_case<N, kElem, false, 1, 1>(spec, rng);
  if (a_mn) return run_wgmma_case<N, kElem, false, 1, 0>(spec, rng);
  if (b_mn) return run_wgmma_case<N, kElem, false, 0, 1>(spec, rng);
  return run_wgmma_case<N, kElem, false, 0, 0>(spec, rng);
}

// ---- stmatrix: "the inverse of ldmatrix": register m of lane l holds row l / 4, columns
// 2 * (l % 4) and +1 of matrix m (low half first); .trans stores the transposed matrix. ----
template <int kNum, bool kTrans>
__global__ void stmatrix_kernel(const uint32_t* regs, const int* row_slot, uint4* out) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(uint4, stmatrix_smem);
  const int lane = threadIdx.x;
  for (int i = lane; i < kSmemSlots; i += kLanes) FLASHATTN_SMEM(stmatrix_smem)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  uint32_t r[4] = {};
  for (int m = 0; m < kNum; ++m) r[m] = regs[lane * kNum + m];
  void* row = &stmatrix_smem[row_slot[lane]];
  if (kNum == 1 && !kTrans) stmatrix_x1(row, r[0]);
  if (kNum == 2 && !kTrans) stmatrix_x2(row, r[0], r[1]);
  if (kNum == 4 && !kTrans) stmatrix_x4(row, r[0], r[1], r[2], r[3]);
  if (kNum == 1 && kTrans) stmatrix_x1_trans(row, r[0]);
  if (kNum == 2 && kTrans) stmatrix_x2_trans(row, r[0], r[1]);
  if (kNum == 4 && kTrans) stmatrix_x4_trans(row, r[0], r[1], r[2], r[3]);
  __syncthreads();
  for (int i = lane; i < kSmemSlots; i += kLanes) out[i] = FLASHATTN_SMEM(stmatrix_smem)[i];
}

inline CaseResult stmatrix_case(int num, bool trans, Rng& rng) {
  std::vector<uint32_t> regs(kLanes * num);
  for (uint32_t& r : regs) r = static_cast<uint32_t>(rng.next());
  // Distinct rows for the lanes that give addresses; the others point anywhere (ignored).
  std::vector<int> slots(kSmemSlots);
  for (int i = 0; i < kSmemSlots; ++i) slots[i] = i;
  for (int i = kSmemSlots - 1; i > 0; --i) std::swap(slots[i], slots[rng.below(i + 1)]);
  std::vector<int> row_slot(kLanes);
  for (int lane = 0; lane < kLanes; ++lane) row_slot[lane] = lane < 8 * num ? slots[lane] : rng.below(kSmemSlots);
  std::vector<uint16_t> expected(kSmemSlots * 8, 0);
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group_id = lane / 4, thread_in_group = lane % 4;
    for (int m = 0; m < num; ++m) {
      for (int i = 0; i < 2; ++i) {
        const auto value = static_cast<uint16_t>(regs[lane * num + m] >> (16 * i));
        // Element (row, col) of matrix m; .trans stores it at (col, row).
        const int row = group_id, col = thread_in_group * 2 + i;
        const int stored_row = trans ? col : row, stored_col = trans ? row : col;
        expected[row_slot[m * 8 + stored_row] * 8 + stored_col] = value;
      }
    }
  }
  DeviceArray<uint32_t> regs_d(regs);
  DeviceArray<int> slot_d(row_slot);
  DeviceArray<uint4> out_d{std::vector<uint4>(kSmemSlots)};
  using Kernel = void (*)(const uint32_t*, const int*, uint4*);
  Kernel kernels[2][3] = {{stmatrix_kernel<1, false>, stmatrix_kernel<2, false>, stmatrix_kernel<4, false>},
                          {stmatrix_kernel<1, true>, stmatrix_kernel<2, true>, stmatrix_kernel<4, true>}};
  launch_one_block(kernels[trans][num == 1 ? 0 : num == 2 ? 1 : 2], kLanes, kSmemSlots * kRowBytes,
                   static_cast<const uint32_t*>(regs_d.get()), static_cast<const int*>(slot_d.get()),
                   out_d.get());
  const std::string name = "stmatrix_x" + std::to_string(num) + (trans ? "_trans" : "");
  const auto actual = bytes_of(out_d.read());
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// ---- TMA into wgmma, as FA3's main loop pairs them: 64 x 64 bf16 tiles loaded by tensor copies
// with the 128-byte swizzle (box rows of 128 bytes), read by wgmma through K-major 128B
// descriptors (SBO 1024: 8 rows of 128 bytes; K steps of 16 advance the start by 32 bytes) or,
// for B stored K x N (V in P * V), an N-major one (k-groups of 8 rows at SBO 1024; K steps
// advance by 2048 bytes). D[64 x 64] = C + A * B over K = 64 in four chained MMAs. ----
template <bool kBNMajor>
__global__ void tma_wgmma_kernel(const __grid_constant__ flashattn::TensorMap map_a,
                                 const __grid_constant__ flashattn::TensorMap map_b, float* cd) {
  using namespace flashattn::ptx;
  constexpr WgmmaMajor kMajorB = kBNMajor ? WgmmaMajor::MN : WgmmaMajor::K;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, tma_wgmma_smem);
  const int tid = threadIdx.x;
  unsigned char* a_tile = tma_wgmma_smem + (1024 - smem_u32addr(tma_wgmma_smem) % 1024) % 1024;
  unsigned char* b_tile = a_tile + 8192;
  uint64_t* bar = reinterpret_cast<uint64_t*>(a_tile + 16384);
  if (tid == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    mbarrier_arrive_expect_tx(bar, 16384);
    tma_load_2d(a_tile, &map_a, bar, 0, 0);
    tma_load_2d(b_tile, &map_b, bar, 0, 0);
  }
  mbarrier_wait_parity(bar, 0);
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = cd[tid * 32 + i];
  const uint64_t desc_a = wgmma_descriptor(smem_u32addr(a_tile), 16, 1024, WgmmaSwizzle::B128);
  const uint64_t desc_b = wgmma_descriptor(smem_u32addr(b_tile), kBNMajor ? 8192 : 16, 1024,
                                           WgmmaSwizzle::B128);
  wgmma_fence_operand(d);
  wgmma_fence();
  for (int s = 0; s < 4; ++s) {
    wgmma_bf16_ss<64, WgmmaMajor::K, kMajorB>(d, wgmma_descriptor_advance(desc_a, 32 * s),
                                              wgmma_descriptor_advance(desc_b, (kBNMajor ? 2048 : 32) * s), 1);
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(d);
  for (int i = 0; i < 32; ++i) cd[tid * 32 + i] = d[i];
}

inline flashattn::TensorMap bf16_tile_map(const void* global) {
  flashattn::TensorMapSpec spec;
  spec.dtype = flashattn::TensorMapDtype::BFloat16;
  spec.rank = 2;
  spec.global = global;
  spec.dims[0] = 64, spec.dims[1] = 64;  // 64 rows of 64 elements (128 bytes)
  spec.strides[0] = 128;
  spec.box[0] = 64, spec.box[1] = 64;
  spec.swizzle = flashattn::TensorMapSwizzle::B128;
  flashattn::TensorMap map;
  const std::string error = flashattn::encode_tensor_map(&map, spec);
  if (!error.empty()) {
    std::fprintf(stderr, "tma_wgmma case: %s\n", error.c_str());
    std::exit(2);
  }
  return map;
}

inline CaseResult tma_wgmma_case(bool b_n_major, Rng& rng) {
  std::vector<float> A(64 * 64), B(64 * 64), C(64 * 64);  // A[m][k], B[n][k], C[m][n]
  for (float& x : A) x = static_cast<float>(rng.below(9) - 4);
  for (float& x : B) x = static_cast<float>(rng.below(9) - 4);
  for (float& x : C) x = static_cast<float>(rng.below(65) - 32);
  // Global memory, row-major: A as M x K; B as N x K, or K x N when N-major.
  std::vector<uint16_t> a_global(64 * 64), b_global(64 * 64);
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 64; ++k) a_global[m * 64 + k] = bits16(__float2bfloat16_rn(A[m * 64 + k]));
  for (int n = 0; n < 64; ++n)
    for (int k = 0; k < 64; ++k)
      b_global[b_n_major ? k * 64 + n : n * 64 + k] = bits16(__float2bfloat16_rn(B[n * 64 + k]));
  std::vector<float> cd(kWarpgroup * 32), expected(cd.size());
  for (int t = 0; t < kWarpgroup; ++t) {
    for (int i = 0; i < 32; ++i) {
      const int row = wgmma_d_row(t, i), col = wgmma_d_col(t, i);
      double sum = C[row * 64 + col];
      for (int k = 0; k < 64; ++k) sum += static_cast<double>(A[row * 64 + k]) * B[col * 64 + k];
      cd[t * 32 + i] = C[row * 64 + col];
      expected[t * 32 + i] = static_cast<float>(sum);
    }
  }
  DeviceArray<uint16_t> a_d(a_global), b_d(b_global);
  DeviceArray<float> cd_d(cd);
  const flashattn::TensorMap map_a = bf16_tile_map(a_d.get()), map_b = bf16_tile_map(b_d.get());
  launch_one_block(b_n_major ? tma_wgmma_kernel<true> : tma_wgmma_kernel<false>, kWarpgroup,
                   16384 + 1024 + 64, map_a, map_b, cd_d.get());
  const auto actual = bytes_of(cd_d.read());
  return {std::string("tma_wgmma_m64n64k64_bf16_sw128_B") + (b_n_major ? "MN" : "K"),
          GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// Every wgmma and stmatrix case, in a fixed order. MN = M- or N-major; swizzle 0/32/64/128.
inline void run_wgmma_cases(uint64_t seed, std::vector<CaseResult>& results) {
  Rng rng(seed ^ 0x5a90ull);
  for (bool trans : {false, true}) {
    for (int num : {1, 2, 4}) results.push_back(stmatrix_case(num, trans, rng));
  }
  const int swizzles[4] = {0, 32, 64, 128};
  // Every A layout against every B layout: bf16, N = 64, K = 32 in two chained MMAs (the
  // descriptor advance of each layout), strides padded on odd combinations.
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      const WgmmaCaseSpec s{swizzles[a % 4], swizzles[b % 4], 2, 1, (a + b) % 2 == 1, false};
      results.push_back(run_wgmma_ss_case<64, WgmmaElem::Bf16>(a >= 4, b >= 4, s, rng));
    }
  }
  // f16, one K step, the accumulate and overwrite forms.
  for (int a = 0; a < 8; ++a) {
    const int b = 7 - a;
    const WgmmaCaseSpec s{swizzles[a % 4], swizzles[b % 4], 1, a % 3 != 0, false, false};
    results.push_back(run_wgmma_ss_case<64, WgmmaElem::F16>(a >= 4, b >= 4, s, rng));
  }
  // Other N: the accumulator fragment repeated over N / 8 column blocks.
  results.push_back(run_wgmma_case<8, WgmmaElem::Bf16, false, 0, 0>({0, 0, 1, 1, false, false}, rng));
  results.push_back(run_wgmma_case<8, WgmmaElem::F16, false, 0, 1>({128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<16, WgmmaElem::Bf16, false, 1, 0>({32, 64, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<24, WgmmaElem::Bf16, false, 0, 0>({128, 0, 1, 1, true, false}, rng));
  results.push_back(run_wgmma_case<128, WgmmaElem::Bf16, false, 0, 1>({128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<128, WgmmaElem::F16, false, 0, 0>({64, 32, 1, 1, false, false}, rng));
  results.push_back(run_wgmma_case<256, WgmmaElem::Bf16, false, 0, 0>({128, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<256, WgmmaElem::F16, false, 1, 1>({64, 128, 1, 0, false, false}, rng));
  // A from registers.
  results.push_back(run_wgmma_case<8, WgmmaElem::Bf16, true, 0, 0>({0, 32, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<64, WgmmaElem::Bf16, true, 0, 0>({0, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<64, WgmmaElem::Bf16, true, 0, 1>({0, 64, 2, 1, true, false}, rng));
  results.push_back(run_wgmma_case<64, WgmmaElem::F16, true, 0, 1>({0, 0, 1, 0, false, false}, rng));
  results.push_back(run_wgmma_case<256, WgmmaElem::Bf16, true, 0, 1>({0, 128, 2, 1, false, false}, rng));
  results.push_back(run_wgmma_case<256, WgmmaElem::F16, true, 0, 0>({0, 32, 1, 1, false, false}, rng));
  // TMA-loaded tiles, as FA3 reads them.
  results.push_back(tma_wgmma_case(false, rng));
  results.push_back(tma_wgmma_case(true, rng));
}

}  // namespace primitives
