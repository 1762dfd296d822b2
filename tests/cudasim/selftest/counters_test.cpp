// Small kernels whose counters can be worked out by hand (tests/test_cudasim_counters.py holds
// the hand counts): bank-conflicted and conflict-free shared-memory patterns, ldmatrix rows
// that conflict and rows that do not, mma, cp.async, atomics, global stores, barriers.
//   counters_test            runs every kernel once with counters on, prints counters_json()
//   counters_test off        the same launches with counters off: prints counters_json()
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

// A named namespace: external linkage puts the kernels in the dynamic symbol table (-rdynamic),
// so their counters carry their names.
namespace counted {

using namespace flashattn::ptx;

// 32 lanes store one float each, 32 floats (128 bytes) apart: every address is in bank 0.
// 32 distinct words in one bank: 32 wavefronts, where 1 would do.
__global__ void sts_stride32(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  FLASHATTN_SMEM(s)[threadIdx.x * 32] = 1.f;
  out[threadIdx.x] = 0.f;
}

// Consecutive floats: 32 banks, one word each: 1 wavefront.
__global__ void sts_consecutive(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  FLASHATTN_SMEM(s)[threadIdx.x] = 1.f;
  out[threadIdx.x] = 0.f;
}

// Rows padded to 33 floats, read down a column: lane L reads word 33 L, bank L % 32: 1.
__global__ void lds_stride33(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  out[threadIdx.x] = FLASHATTN_SMEM(s)[threadIdx.x * 33];
}

// Every lane reads the same word: a broadcast, 1 wavefront.
__global__ void lds_broadcast(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  out[threadIdx.x] = *FLASHATTN_SMEM(s);
}

// Stride of 2 floats: words 0, 2, ..., 62 fall two to a bank (2-way conflict): 2.
__global__ void lds_stride2(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  out[threadIdx.x] = FLASHATTN_SMEM(s)[threadIdx.x * 2];
}

// Half the warp active, stride 32 floats: 16 words in bank 0: 16 wavefronts, ideal 1.
__global__ void lds_half_warp_stride32(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  float v = 0.f;
  if (threadIdx.x < 16) v = FLASHATTN_SMEM(s)[threadIdx.x * 32];
  out[threadIdx.x] = v;
}

// 16-byte loads, consecutive: 512 bytes in 4 phases of 8 lanes, each phase conflict-free: 4 = 4.
__global__ void lds_uint4_consecutive(uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint4, s);
  const uint4 v = FLASHATTN_SMEM(s)[threadIdx.x];
  out[threadIdx.x] = v.x;
}

// 16-byte loads 32 bytes apart: a phase of 8 lanes spans 256 bytes, banks 0-3, 8-11, 16-19,
// 24-27 twice each: 2 wavefronts per phase, 8 where 4 would do.
__global__ void lds_uint4_stride32B(uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint4, s);
  const uint4 v = FLASHATTN_SMEM(s)[2 * threadIdx.x];
  out[threadIdx.x] = v.y;
}

// One call site run three times by every lane: 3 instructions, conflict-free: 3 = 3.
__global__ void sts_loop3(float* out) {
  FLASHATTN_DYNAMIC_SMEM(float, s);
  for (int i = 0; i < 3; ++i) FLASHATTN_SMEM(s)[threadIdx.x + 32 * i] = 1.f;
  out[threadIdx.x] = 0.f;
}

// 2-byte stores, consecutive: two lanes per word, 16 words in 16 banks: 1.
__global__ void sts_u16(float* out) {
  FLASHATTN_DYNAMIC_SMEM(uint16_t, s);
  FLASHATTN_SMEM(s)[threadIdx.x] = uint16_t{1};
  out[threadIdx.x] = 0.f;
}

// ldmatrix rows 144 bytes apart (72 halves: a 64-wide tile padded by one 16-byte chunk, as
// traits.h pads): the 8 rows of a matrix start at banks 0, 4, ..., 28: conflict-free.
// x4: 4 wavefronts; x2.trans: 2; x1: 1.
__global__ void ldmatrix_padded(uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint16_t, s);
  const int lane = threadIdx.x;
  uint32_t r[4];
  ldmatrix_x4(r[0], r[1], r[2], r[3], s + lane * 72);
  uint32_t t[2];
  ldmatrix_x2_trans(t[0], t[1], s + lane * 72);
  uint32_t u;
  ldmatrix_x1(u, s + lane * 72);
  out[lane] = r[0] + t[1] + u;
}

// ldmatrix rows 128 bytes apart (an unpadded 64-wide tile): all 8 rows of a matrix sit in
// banks 0-3, 8 words per bank: 8 wavefronts per matrix, 32 for the x4 where 4 would do.
__global__ void ldmatrix_unpadded(uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint16_t, s);
  const int lane = threadIdx.x;
  uint32_t r[4];
  ldmatrix_x4(r[0], r[1], r[2], r[3], s + lane * 64);
  out[lane] = r[0];
}

// Three bf16 and two f16 mma.sync, per warp, in a block of two warps: 6 and 4.
__global__ void mma_count(float* out) {
  float d[4] = {};
  const uint32_t a[4] = {}, b[2] = {};
  for (int i = 0; i < 3; ++i) mma_m16n8k16_bf16(d, a, b);
  for (int i = 0; i < 2; ++i) mma_m16n8k16_f16(d, a, b);
  out[threadIdx.x] = d[0];
}

// Two cp.async instructions of 32 copies each. The first reads 16 contiguous bytes per lane:
// 512 bytes, 16 sectors of 32 bytes. The second reads only in lanes 0-3 (src_bytes 0
// elsewhere: zero-fill): 64 bytes, 2 sectors. Each writes 512 bytes of smem, 16 bytes per lane,
// in 4 conflict-free phases.
__global__ void cp_async_count(const uint4* src, uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint4, s);
  const int lane = threadIdx.x;
  cp_async_16(s + lane, src + lane, 16);
  cp_async_16(s + 32 + lane, lane < 4 ? src + lane : src, lane < 4 ? 16 : 0);
  cp_async_commit();
  cp_async_wait_all();
  out[lane] = s[lane].x + s[32 + lane].x;
}

// 32 float atomicAdds to one word (1 sector), 32 to 32 consecutive words from byte 128 (4
// sectors), and 8 double
// atomicAdds from lanes 0-7 to consecutive doubles (2 sectors).
__global__ void atomic_count(float* f, double* d) {
  const int lane = threadIdx.x;
  atomicAdd(f, 1.f);
  atomicAdd(f + 32 + lane, 1.f);
  if (lane < 8) atomicAdd(d + lane, 1.0);
}

// 32 lanes add a float pair each to 64 consecutive floats from a 128-byte boundary: one
// red.global.add.v2.f32, 32 operations of 8 bytes, 256 bytes = 8 sectors.
__global__ void red_v2_count(float* f) {
  red_add_f32x2(f + 2 * threadIdx.x, 1.f, 2.f);
}

// 32 consecutive 4-byte stores through FLASHATTN_GMEM: 128 bytes, 4 sectors, 1 request; then
// 32 loads of one 8-byte word (a broadcast): 8 bytes each, 1 sector.
__global__ void gmem_count(uint32_t* out, const double* in) {
  FLASHATTN_GMEM(out)[threadIdx.x] = threadIdx.x;
  const double x = *FLASHATTN_GMEM(in);
  if (x != 0.0) out[threadIdx.x] = 0;
}

// Two warps, three barriers and two shuffles per warp, in each of two blocks.
__global__ void barriers_and_shuffles(float* out) {
  float v = static_cast<float>(threadIdx.x);
  __syncthreads();
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

}  // namespace counted

int main(int argc, char** argv) {
  using namespace counted;
  const bool on = !(argc == 2 && std::strcmp(argv[1], "off") == 0);
  cudasim::enable_counters(on);
  const dim3 one(1), warp(32);
  std::vector<float> f(256);
  std::vector<uint32_t> u(256);
  std::vector<double> d(64);
  uint4* src = nullptr;  // 32-byte aligned, so sector counts are exact
  if (posix_memalign(reinterpret_cast<void**>(&src), 128, 32 * sizeof(uint4)) != 0) return 2;
  std::memset(src, 0, 32 * sizeof(uint4));
  float* fa = nullptr;
  double* da = nullptr;
  if (posix_memalign(reinterpret_cast<void**>(&fa), 128, 64 * sizeof(float)) != 0) return 2;
  if (posix_memalign(reinterpret_cast<void**>(&da), 128, 8 * sizeof(double)) != 0) return 2;
  uint32_t* ua = nullptr;
  if (posix_memalign(reinterpret_cast<void**>(&ua), 128, 32 * sizeof(uint32_t)) != 0) return 2;
  std::memset(fa, 0, 64 * sizeof(float));
  std::memset(da, 0, 8 * sizeof(double));
  try {
    cudasim::launch(sts_stride32, one, warp, 32 * 32 * sizeof(float), f.data());
    cudasim::launch(sts_consecutive, one, warp, 32 * sizeof(float), f.data());
    cudasim::launch(lds_stride33, one, warp, 32 * 33 * sizeof(float), f.data());
    cudasim::launch(lds_broadcast, one, warp, 32 * sizeof(float), f.data());
    cudasim::launch(lds_stride2, one, warp, 64 * sizeof(float), f.data());
    cudasim::launch(lds_half_warp_stride32, one, warp, 32 * 32 * sizeof(float), f.data());
    cudasim::launch(lds_uint4_consecutive, one, warp, 32 * sizeof(uint4), u.data());
    cudasim::launch(lds_uint4_stride32B, one, warp, 64 * sizeof(uint4), u.data());
    cudasim::launch(sts_loop3, one, warp, 96 * sizeof(float), f.data());
    cudasim::launch(sts_u16, one, warp, 32 * sizeof(uint16_t), f.data());
    cudasim::launch(ldmatrix_padded, one, warp, 32 * 72 * sizeof(uint16_t), u.data());
    cudasim::launch(ldmatrix_unpadded, one, warp, 32 * 64 * sizeof(uint16_t), u.data());
    cudasim::launch(mma_count, one, dim3(64), 0, f.data());
    cudasim::launch(cp_async_count, one, warp, 64 * sizeof(uint4), src, u.data());
    cudasim::launch(atomic_count, one, warp, 0, fa, da);
    cudasim::launch(gmem_count, one, warp, 0, ua, da);
    cudasim::launch(red_v2_count, one, warp, 0, fa);
    cudasim::launch(barriers_and_shuffles, dim3(2), dim3(64), 0, f.data());
  } catch (const cudasim::SimError& e) {
    std::printf("SimError: %s\n", e.what());
    return 3;
  }
  for (int i = 0; i < 64; ++i) {
    if (fa[i] != (i % 2 == 0 ? 1.f : 2.f) + (i == 0 ? 32.f : 0.f) + (i >= 32 ? 1.f : 0.f)) {
      std::printf("red_v2_count: f[%d] = %g\n", i, fa[i]);
      return 4;
    }
  }
  std::printf("%s\n", cudasim::counters_json().c_str());
  std::free(src);
  std::free(fa);
  std::free(da);
  std::free(ua);
  return 0;
}
