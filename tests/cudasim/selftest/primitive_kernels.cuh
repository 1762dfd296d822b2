// One-warp kernels that run each wrapped primitive once. The shim's self-test (primitives.cpp)
// compares their outputs with a scalar reference; the GPU layout check (layout_check.cu) runs
// the same kernels on hardware. Compiles under nvcc and under the shim.
#pragma once
#include <cstdint>

#include "cuda/ptx.cuh"

namespace primitives {

constexpr int kLanes = 32;
constexpr int kRowBytes = 16;
constexpr int kSmemSlots = 64;  // 16-byte rows an ldmatrix may pick from
constexpr int kShuffleWidths = 6;  // 1, 2, 4, ..., 32
constexpr int kCopyGroups = 4;     // cp.async test: 3 committed groups + 1 uncommitted
constexpr int kCopySnapshots = 5;

enum class ShuffleOp { Idx, Up, Down, Xor };

// image: kSmemSlots rows of 8 b16 values, copied to shared memory. row_slot[lane]: the row that
// lane points ldmatrix at; kUnusedLane asks for a deliberately bad address (misaligned, outside
// shared memory) on lanes whose address the instruction ignores. out: [32 lanes][kNum].
constexpr int kUnusedLane = -1;
template <int kNum, bool kTrans>
__global__ void ldmatrix_kernel(const uint4* image, const int* row_slot, uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint4, smem);
  const int lane = threadIdx.x;
  for (int i = lane; i < kSmemSlots; i += kLanes) smem[i] = image[i];
  __syncthreads();
  const int slot = row_slot[lane];
  const void* row = slot == kUnusedLane ? static_cast<const void*>(reinterpret_cast<const char*>(image) + 3)
                                        : static_cast<const void*>(&smem[slot]);
  uint32_t r[4] = {};
  using namespace flashattn::ptx;
  if (kNum == 1 && !kTrans) ldmatrix_x1(r[0], row);
  if (kNum == 2 && !kTrans) ldmatrix_x2(r[0], r[1], row);
  if (kNum == 4 && !kTrans) ldmatrix_x4(r[0], r[1], r[2], r[3], row);
  if (kNum == 1 && kTrans) ldmatrix_x1_trans(r[0], row);
  if (kNum == 2 && kTrans) ldmatrix_x2_trans(r[0], r[1], row);
  if (kNum == 4 && kTrans) ldmatrix_x4_trans(r[0], r[1], r[2], r[3], row);
  for (int i = 0; i < kNum; ++i) out[lane * kNum + i] = r[i];
}

// a: [32][4], b: [32][2] registers as the ISA lays them out; cd: [32][4], C in, D out.
template <bool kBf16>
__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, float* cd) {
  const int lane = threadIdx.x;
  uint32_t a_frag[4], b_frag[2];
  float d[4];
  for (int i = 0; i < 4; ++i) a_frag[i] = a[lane * 4 + i], d[i] = cd[lane * 4 + i];
  for (int i = 0; i < 2; ++i) b_frag[i] = b[lane * 2 + i];
  if (kBf16) {
    flashattn::ptx::mma_m16n8k16_bf16(d, a_frag, b_frag);
  } else {
    flashattn::ptx::mma_m16n8k16_f16(d, a_frag, b_frag);
  }
  for (int i = 0; i < 4; ++i) cd[lane * 4 + i] = d[i];
}

// For each width w = 1 << k: out[k][lane] = shuffle of in[k][*] with lane argument arg[k][lane].
// T is float, int or double (8-byte operands travel as two 32-bit shuffles on hardware).
template <class T>
__global__ void shuffle_kernel(ShuffleOp op, const T* in, const int* arg, T* out) {
  const int lane = threadIdx.x;
  for (int k = 0; k < kShuffleWidths; ++k) {
    const int width = 1 << k, i = k * kLanes + lane;
    T r{};
    switch (op) {
      case ShuffleOp::Idx: r = __shfl_sync(0xffffffffu, in[i], arg[i], width); break;
      case ShuffleOp::Up: r = __shfl_up_sync(0xffffffffu, in[i], static_cast<unsigned>(arg[i]), width); break;
      case ShuffleOp::Down: r = __shfl_down_sync(0xffffffffu, in[i], static_cast<unsigned>(arg[i]), width); break;
      case ShuffleOp::Xor: r = __shfl_xor_sync(0xffffffffu, in[i], arg[i], width); break;
    }
    out[i] = r;
  }
}

// Only the lanes of `mask` take part (the others skip the shuffle and write 0): a half-warp
// xor-reduction with width 16, as a split warp would do it.
__global__ void partial_mask_shuffle_kernel(unsigned mask, const float* in, float* out) {
  const int lane = threadIdx.x;
  float v = in[lane];
  if (mask >> lane & 1u) {
    for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset, 16);
  } else {
    v = 0.f;
  }
  out[lane] = v;
}

// out[lane] = {ballot, any, all} of pred over `mask`; lanes outside mask write 0s.
__global__ void vote_kernel(unsigned mask, const int* pred, unsigned* out) {
  const int lane = threadIdx.x;
  unsigned ballot = 0, any = 0, all = 0;
  if (mask >> lane & 1u) {
    ballot = __ballot_sync(mask, pred[lane]);
    any = static_cast<unsigned>(__any_sync(mask, pred[lane]));
    all = static_cast<unsigned>(__all_sync(mask, pred[lane]));
  }
  out[lane * 3 + 0] = ballot;
  out[lane * 3 + 1] = any;
  out[lane * 3 + 2] = all;
}

__global__ void exp2_kernel(const float* in, float* out) {
  out[threadIdx.x] = flashattn::ptx::exp2_approx(in[threadIdx.x]);
}

__global__ void thread_index_kernel(int* out) {
  out[threadIdx.x] = flashattn::ptx::thread_index();
}

// Lane L adds the pair (a[L], b[L]) into out[2 s], out[2 s + 1] for s = L % kRedSlots: four
// lanes per 8-byte slot, so the adds must be atomic (the dK/dV kernel's dQ atomics).
constexpr int kRedSlots = 8;
__global__ void red_add_f32x2_kernel(const float* a, const float* b, float* out) {
  const int lane = threadIdx.x;
  flashattn::ptx::red_add_f32x2(out + 2 * (lane % kRedSlots), a[lane], b[lane]);
}

// Lane L issues one 16-byte copy per group g into slot g*32+L, reading src_bytes[g*32+L] bytes
// from src + (g*32+L)*16, or from empty_source when that is 0 (the shim test passes nullptr: a
// zero-byte copy must not read). Groups 0-2 are committed, group 3 is not. After each step it snapshots its own 4 slots:
//   0: before any wait   1: wait_group 2   2: wait_group 1   3: wait_group 0   4: wait_all
// out: [kCopySnapshots][32 lanes][kCopyGroups] 16-byte slots.
__global__ void cp_async_kernel(const uint4* src, const uint4* empty_source, const int* src_bytes,
                                uint4* out) {
  FLASHATTN_DYNAMIC_SMEM(uint4, smem);
  const int lane = threadIdx.x;
  using namespace flashattn::ptx;
  for (int g = 0; g < kCopyGroups; ++g) {
    const int slot = g * kLanes + lane;
    const int bytes = src_bytes[slot];
    cp_async_16(&smem[slot], bytes > 0 ? &src[slot] : empty_source, bytes);
    if (g + 1 < kCopyGroups) cp_async_commit();
  }
  auto snapshot = [&](int s) {
    for (int g = 0; g < kCopyGroups; ++g) {
      out[(s * kLanes + lane) * kCopyGroups + g] = smem[g * kLanes + lane];
    }
  };
  snapshot(0);
  cp_async_wait<2>();
  snapshot(1);
  cp_async_wait<1>();
  snapshot(2);
  cp_async_wait<0>();
  snapshot(3);
  cp_async_wait_all();
  snapshot(4);
}

}  // namespace primitives
