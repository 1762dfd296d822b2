// Each case runs one primitive kernel on random inputs and returns what it wrote next to a
// scalar reference built from the PTX ISA's fragment descriptions (written here in the ISA's
// own terms, independently of the shim's code). Shared by the shim self-test and the GPU
// layout check, which must see identical inputs: all randomness comes from a fixed splitmix64.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "one_warp_launch.h"
#include "primitive_kernels.cuh"

namespace primitives {

enum class GpuCompare { Bitwise, CloseF32 };

struct CaseResult {
  std::string name;
  GpuCompare gpu_compare;
  std::vector<unsigned char> actual;    // everything the kernel wrote
  std::vector<unsigned char> expected;  // reference for `actual`
  std::vector<unsigned char> portable;  // the part of `actual` hardware determines too
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <class T>
uint16_t bits16(T half) {
  uint16_t b;
  std::memcpy(&b, &half, sizeof b);
  return b;
}

// ---- ldmatrix: "each thread receives, per matrix, row groupID = laneid/4 and elements
// threadID_in_group*2 + {0,1}"; with .trans the matrix is read in column-major order. ----
inline CaseResult ldmatrix_case(int num, bool trans, Rng& rng, bool hardware_safe) {
  std::vector<uint4> image(kSmemSlots);
  for (uint4& row : image) {
    row = make_uint4(static_cast<uint32_t>(rng.next()), static_cast<uint32_t>(rng.next()),
                     static_cast<uint32_t>(rng.next()), static_cast<uint32_t>(rng.next()));
  }
  std::vector<int> row_slot(kLanes);
  for (int lane = 0; lane < kLanes; ++lane) {
    const bool used = lane < 8 * num;
    row_slot[lane] = used || hardware_safe ? rng.below(kSmemSlots) : kUnusedLane;
  }
  DeviceArray<uint4> image_d(image);
  DeviceArray<int> slot_d(row_slot);
  DeviceArray<uint32_t> out_d{std::vector<uint32_t>(kLanes * num, 0)};
  using Kernel = void (*)(const uint4*, const int*, uint32_t*);
  Kernel kernels[2][3] = {{ldmatrix_kernel<1, false>, ldmatrix_kernel<2, false>, ldmatrix_kernel<4, false>},
                          {ldmatrix_kernel<1, true>, ldmatrix_kernel<2, true>, ldmatrix_kernel<4, true>}};
  launch_one_block(kernels[trans][num == 1 ? 0 : num == 2 ? 1 : 2], kLanes, kSmemSlots * kRowBytes,
                   static_cast<const uint4*>(image_d.get()), static_cast<const int*>(slot_d.get()),
                   out_d.get());

  auto element = [&](int matrix, int row, int col) {  // b16 element of the matrix as stored
    uint16_t e[8];
    std::memcpy(e, &image[row_slot[matrix * 8 + row]], sizeof e);
    return e[col];
  };
  std::vector<uint32_t> expected(kLanes * num);
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group_id = lane / 4, thread_in_group = lane % 4;
    for (int m = 0; m < num; ++m) {
      uint32_t reg = 0;
      for (int i = 0; i < 2; ++i) {
        const int row = group_id, col = thread_in_group * 2 + i;
        const uint16_t value = trans ? element(m, col, row) : element(m, row, col);
        reg |= static_cast<uint32_t>(value) << (16 * i);
      }
      expected[lane * num + m] = reg;
    }
  }
  const std::string name = "ldmatrix_x" + std::to_string(num) + (trans ? "_trans" : "");
  const auto actual = bytes_of(out_d.read());
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// ---- mma.m16n8k16 (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type"). ----
inline int mma_a_row(int lane, int i) { return lane / 4 + ((i < 2 || (i >= 4 && i < 6)) ? 0 : 8); }
inline int mma_a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
inline int mma_b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
inline int mma_b_col(int lane) { return lane / 4; }
inline int mma_c_row(int lane, int i) { return lane / 4 + (i >= 2 ? 8 : 0); }
inline int mma_c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

// integer_valued: small integers, so every product and sum is exact and hardware must agree
// bit for bit; otherwise uniform reals, where only the f32 accumulation order may differ.
inline CaseResult mma_case(bool bf16, bool integer_valued, Rng& rng) {
  float A[16][16], B[16][8], C[16][8];
  uint16_t A_bits[16][16], B_bits[16][8];
  auto make = [&](float& value, uint16_t& bits) {
    const float x = integer_valued ? static_cast<float>(rng.below(9) - 4) : rng.uniform(-2.f, 2.f);
    if (bf16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(x);
      value = __bfloat162float(h), bits = bits16(h);
    } else {
      const __half h = __float2half_rn(x);
      value = __half2float(h), bits = bits16(h);
    }
  };
  for (int r = 0; r < 16; ++r) for (int c = 0; c < 16; ++c) make(A[r][c], A_bits[r][c]);
  for (int r = 0; r < 16; ++r) for (int c = 0; c < 8; ++c) make(B[r][c], B_bits[r][c]);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      C[r][c] = integer_valued ? static_cast<float>(rng.below(65) - 32) : rng.uniform(-4.f, 4.f);
    }
  }
  std::vector<uint32_t> a(kLanes * 4, 0), b(kLanes * 2, 0);
  std::vector<float> cd(kLanes * 4), expected(kLanes * 4);
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < 8; ++i) {  // a0..a7, two per register, low half first
      a[lane * 4 + i / 2] |= static_cast<uint32_t>(A_bits[mma_a_row(lane, i)][mma_a_col(lane, i)]) << (16 * (i % 2));
    }
    for (int i = 0; i < 4; ++i) {
      b[lane * 2 + i / 2] |= static_cast<uint32_t>(B_bits[mma_b_row(lane, i)][mma_b_col(lane)]) << (16 * (i % 2));
    }
    for (int i = 0; i < 4; ++i) {
      const int row = mma_c_row(lane, i), col = mma_c_col(lane, i);
      cd[lane * 4 + i] = C[row][col];
      double sum = C[row][col];
      for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
      expected[lane * 4 + i] = static_cast<float>(sum);
    }
  }
  DeviceArray<uint32_t> a_d(a), b_d(b);
  DeviceArray<float> cd_d(cd);
  launch_one_block(bf16 ? mma_kernel<true> : mma_kernel<false>, kLanes, 0,
                   static_cast<const uint32_t*>(a_d.get()), static_cast<const uint32_t*>(b_d.get()),
                   cd_d.get());
  const std::string name = std::string("mma_m16n8k16_") + (bf16 ? "bf16" : "f16") +
                           (integer_valued ? "_integers" : "_reals");
  const auto actual = bytes_of(cd_d.read());
  return {name, integer_valued ? GpuCompare::Bitwise : GpuCompare::CloseF32, actual,
          bytes_of(expected), actual};
}

// ---- Shuffles, as the CUDA C++ Programming Guide describes them for a given width. ----
inline int shuffle_source(ShuffleOp op, int lane, int arg, int width) {
  const int segment_start = lane / width * width;
  switch (op) {
    case ShuffleOp::Idx: return segment_start + (arg % width);
    case ShuffleOp::Up: return lane % width - arg < 0 ? lane : lane - arg;
    case ShuffleOp::Down: return lane % width + arg >= width ? lane : lane + arg;
    case ShuffleOp::Xor: {
      const int target = lane ^ arg;
      return target >= segment_start + width ? lane : target;  // later segments are off limits
    }
  }
  return lane;
}

template <class T>
inline CaseResult shuffle_case(ShuffleOp op, const char* op_name, const char* type_name, Rng& rng) {
  const int n = kShuffleWidths * kLanes;
  std::vector<T> in(n), expected(n);
  std::vector<int> arg(n);
  for (int i = 0; i < n; ++i) {
    in[i] = static_cast<T>(rng.uniform(-1000.f, 1000.f));
    arg[i] = op == ShuffleOp::Idx ? rng.below(64) : rng.below(32);
  }
  for (int k = 0; k < kShuffleWidths; ++k) {
    for (int lane = 0; lane < kLanes; ++lane) {
      const int i = k * kLanes + lane;
      expected[i] = in[k * kLanes + shuffle_source(op, lane, arg[i], 1 << k)];
    }
  }
  DeviceArray<T> in_d(in), out_d{std::vector<T>(n)};
  DeviceArray<int> arg_d(arg);
  launch_one_block(shuffle_kernel<T>, kLanes, 0, op, static_cast<const T*>(in_d.get()),
                   static_cast<const int*>(arg_d.get()), out_d.get());
  const auto actual = bytes_of(out_d.read());
  return {std::string(op_name) + "_" + type_name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

inline CaseResult partial_mask_shuffle_case(unsigned mask, Rng& rng) {
  std::vector<float> in(kLanes), expected(kLanes, 0.f);
  for (float& x : in) x = rng.uniform(-10.f, 10.f);
  std::vector<float> v = in;
  for (int offset = 8; offset > 0; offset /= 2) {  // the butterfly, step by step
    std::vector<float> next = v;
    for (int lane = 0; lane < kLanes; ++lane) next[lane] = v[lane] + v[lane ^ offset];
    v = next;
  }
  for (int lane = 0; lane < kLanes; ++lane) expected[lane] = (mask >> lane & 1u) ? v[lane] : 0.f;
  DeviceArray<float> in_d(in), out_d{std::vector<float>(kLanes)};
  launch_one_block(partial_mask_shuffle_kernel, kLanes, 0, mask, static_cast<const float*>(in_d.get()),
                   out_d.get());
  char name[64];
  std::snprintf(name, sizeof name, "shfl_xor_width16_mask_%08x", mask);
  const auto actual = bytes_of(out_d.read());
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

inline CaseResult vote_case(unsigned mask, Rng& rng) {
  std::vector<int> pred(kLanes);
  for (int& p : pred) p = rng.below(4) == 0 ? 0 : rng.below(100);  // nonzero is true
  unsigned ballot = 0;
  for (int lane = 0; lane < kLanes; ++lane) {
    if ((mask >> lane & 1u) && pred[lane]) ballot |= 1u << lane;
  }
  std::vector<unsigned> expected(kLanes * 3, 0);
  for (int lane = 0; lane < kLanes; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    expected[lane * 3 + 0] = ballot;
    expected[lane * 3 + 1] = ballot != 0;
    expected[lane * 3 + 2] = ballot == mask;
  }
  DeviceArray<int> pred_d(pred);
  DeviceArray<unsigned> out_d{std::vector<unsigned>(kLanes * 3)};
  launch_one_block(vote_kernel, kLanes, 0, mask, static_cast<const int*>(pred_d.get()), out_d.get());
  char name[64];
  std::snprintf(name, sizeof name, "vote_mask_%08x", mask);
  const auto actual = bytes_of(out_d.read());
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// ---- cp.async: src_bytes read, the rest zero-filled; a group lands at the wait that retires
// it (and not before, on the shim: unlanded slots keep the 0xFF poison). ----
inline CaseResult cp_async_case(Rng& rng, bool hardware_safe) {
  const int copies = kCopyGroups * kLanes;
  std::vector<uint4> src(copies);
  std::vector<int> src_bytes(copies);
  for (int i = 0; i < copies; ++i) {
    src[i] = make_uint4(static_cast<uint32_t>(rng.next()), static_cast<uint32_t>(rng.next()),
                        static_cast<uint32_t>(rng.next()), static_cast<uint32_t>(rng.next()));
    const int choice = rng.below(4);  // a full copy, an empty one, or a partial tail
    src_bytes[i] = choice == 0 ? 16 : choice == 1 ? 0 : 1 + rng.below(15);
  }
  const int landed_groups[kCopySnapshots] = {0, 1, 2, 3, 4};  // after each wait, in order
  const size_t slot_count = static_cast<size_t>(kCopySnapshots) * kLanes * kCopyGroups;
  std::vector<unsigned char> expected(slot_count * 16), portable_mask(slot_count * 16, 0);
  for (int s = 0; s < kCopySnapshots; ++s) {
    for (int lane = 0; lane < kLanes; ++lane) {
      for (int g = 0; g < kCopyGroups; ++g) {
        unsigned char* slot = &expected[((s * kLanes + lane) * kCopyGroups + g) * 16];
        const int copy = g * kLanes + lane;
        if (g < landed_groups[s]) {
          std::memset(slot, 0, 16);
          std::memcpy(slot, &src[copy], static_cast<size_t>(src_bytes[copy]));
          std::memset(&portable_mask[slot - expected.data()], 1, 16);
        } else {
          std::memset(slot, 0xFF, 16);  // the shim's poison: not landed yet
        }
      }
    }
  }
  DeviceArray<uint4> src_d(src), out_d{std::vector<uint4>(slot_count)};
  DeviceArray<int> bytes_d(src_bytes);
  const uint4* src_ptr = src_d.get();
  launch_one_block(cp_async_kernel, kLanes, copies * 16, src_ptr, hardware_safe ? src_ptr : nullptr,
                   static_cast<const int*>(bytes_d.get()), out_d.get());
  const auto actual = bytes_of(out_d.read());
  std::vector<unsigned char> portable;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (portable_mask[i]) portable.push_back(actual[i]);
  }
  return {"cp_async_groups_and_zero_fill", GpuCompare::Bitwise, actual, expected, portable};
}

// ex2.approx.ftz.f32: about 2 ulp on hardware; the shim's exp2f is exact. Inputs stay well
// inside the normal range, where flush-to-zero changes nothing.
inline CaseResult exp2_case(Rng& rng) {
  std::vector<float> in(kLanes), expected(kLanes);
  for (int lane = 0; lane < kLanes; ++lane) {
    in[lane] = rng.uniform(-30.f, 30.f);
    expected[lane] = std::exp2(in[lane]);
  }
  DeviceArray<float> in_d(in), out_d{std::vector<float>(kLanes)};
  launch_one_block(exp2_kernel, kLanes, 0, static_cast<const float*>(in_d.get()), out_d.get());
  const auto actual = bytes_of(out_d.read());
  return {"exp2_approx", GpuCompare::CloseF32, actual, bytes_of(expected), actual};
}

// ptx::thread_index(), the volatile read of %tid.x that the tile copies use: threadIdx.x.
inline CaseResult thread_index_case() {
  std::vector<int> expected(kLanes);
  for (int lane = 0; lane < kLanes; ++lane) expected[lane] = lane;
  DeviceArray<int> out_d{std::vector<int>(kLanes, -1)};
  launch_one_block(thread_index_kernel, kLanes, 0, out_d.get());
  const auto actual = bytes_of(out_d.read());
  return {"thread_index", GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// red.global.add.v2.f32 (sm_90; atomicAdd per element before): "performs a reduction
// operation ... atomically" on two consecutive floats. Small integers, so that the sums are
// exact in any order and the result is bitwise.
inline CaseResult red_add_f32x2_case(Rng& rng) {
  std::vector<float> a(kLanes), b(kLanes), out(2 * kRedSlots), expected;
  for (float& x : out) x = static_cast<float>(rng.below(17) - 8);
  expected = out;
  for (int lane = 0; lane < kLanes; ++lane) {
    a[lane] = static_cast<float>(rng.below(17) - 8);
    b[lane] = static_cast<float>(rng.below(17) - 8);
    expected[2 * (lane % kRedSlots)] += a[lane];
    expected[2 * (lane % kRedSlots) + 1] += b[lane];
  }
  DeviceArray<float> a_d(a), b_d(b), out_d(out);
  launch_one_block(red_add_f32x2_kernel, kLanes, 0, static_cast<const float*>(a_d.get()),
                   static_cast<const float*>(b_d.get()), out_d.get());
  const auto actual = bytes_of(out_d.read());
  return {"red_add_f32x2", GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// Every case, in a fixed order. hardware_safe: give ignored ldmatrix lanes, and zero-byte
// cp.async sources, valid addresses (the shim test uses invalid ones to prove they go unread).
inline std::vector<CaseResult> run_all_cases(uint64_t seed, bool hardware_safe) {
  Rng rng(seed);
  std::vector<CaseResult> results;
  for (bool trans : {false, true}) {
    for (int num : {1, 2, 4}) results.push_back(ldmatrix_case(num, trans, rng, hardware_safe));
  }
  for (bool bf16 : {false, true}) {
    for (bool integers : {true, false}) results.push_back(mma_case(bf16, integers, rng));
  }
  const struct { ShuffleOp op; const char* name; } ops[] = {
      {ShuffleOp::Idx, "shfl_sync"}, {ShuffleOp::Up, "shfl_up_sync"},
      {ShuffleOp::Down, "shfl_down_sync"}, {ShuffleOp::Xor, "shfl_xor_sync"}};
  for (const auto& op : ops) {
    results.push_back(shuffle_case<float>(op.op, op.name, "float", rng));
    results.push_back(shuffle_case<int>(op.op, op.name, "int", rng));
    results.push_back(shuffle_case<double>(op.op, op.name, "double", rng));
  }
  results.push_back(partial_mask_shuffle_case(0x0000ffffu, rng));
  results.push_back(partial_mask_shuffle_case(0xffff0000u, rng));
  results.push_back(vote_case(0xffffffffu, rng));
  results.push_back(vote_case(0x0f0f00ffu, rng));
  results.push_back(cp_async_case(rng, hardware_safe));
  results.push_back(exp2_case(rng));
  results.push_back(thread_index_case());
  results.push_back(red_add_f32x2_case(rng));
  return results;
}

// Prints each failed case with its first differing byte, then the count; 0 when every case
// passed. The wgmma and FP8 self-tests report their layout cases this way.
inline int report_failed_cases(const std::vector<CaseResult>& results) {
  int failures = 0;
  for (const auto& r : results) {
    if (r.actual == r.expected) continue;
    ++failures;
    size_t i = 0;
    while (i < r.actual.size() && i < r.expected.size() && r.actual[i] == r.expected[i]) ++i;
    std::printf("FAIL %s: first differing byte %zu of %zu\n", r.name.c_str(), i, r.actual.size());
  }
  std::printf("%zu cases, %d failed\n", results.size(), failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace primitives
