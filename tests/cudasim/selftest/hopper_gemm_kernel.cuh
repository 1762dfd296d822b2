// A test kernel, not a library kernel: the Hopper pipeline the sm_90a attention kernels will be
// built from (issue 31, stage 3), as one warp-specialized GEMM, C[M x N] (f32) = A[M x K] * B
// with bf16, f16 or e4m3 inputs:
//   A row-major, K contiguous (Q of attention);
//   B either N x K, K contiguous (K of attention; C = A * B^T), or, 16-bit only, K x N, N
//   contiguous (V of attention; C = A * B), read by wgmma through an MN-major descriptor (8-bit
//   operands must be K-major: an FP8 P * V needs V transposed first).
//
// One CTA computes a kBlockM x 128 tile of C (kBlockM = 64 per consumer warpgroup) over K in
// steps of kBlockK = one 128-byte swizzle row (64 bf16 / f16, 128 e4m3):
// - Warpgroup 0 is the producer. It gives registers back (setmaxnreg.dec) and one thread issues,
//   per K step, the TMA loads of A's and B's tiles (128-byte swizzle) into a ring of kStages
//   stages. Stage s has a "full" mbarrier (1 arrival: the producer's arrive.expect_tx of the
//   stage's bytes; the copies complete_tx them) and an "empty" one (one arrival per consumer
//   warpgroup), which the producer waits on before reusing the stage.
// - Warpgroups 1..kConsumers are consumers (setmaxnreg.inc). Each owns 64 rows of the tile and
//   keeps one K step of wgmma m64n128k16 (m64n128k32 for e4m3) in flight: wait the stage's
//   full barrier, wgmma.fence, four MMAs from shared-memory descriptors, commit, then wgmma.wait_group 1 retires the
//   previous step, whose stage it releases on the empty barrier (the last step's after the
//   loop's wait_group 0).
// - Epilogue: each consumer stores its 64 x 128 f32 accumulators into shared memory with plain
//   stores (stmatrix moves 16-bit elements only, so not for an f32 C), executes
//   fence.proxy.async (the TMA store reads through the async proxy), meets its warpgroup at a
//   named barrier, and one thread issues the TMA store of the box, which skips the elements
//   outside C, then waits for the bulk group.
// Out-of-range rows, columns and K of A and B are zero-filled by the loads, so ragged M, N and K
// need no code. Not persistent: one tile per CTA.
//
// Limits from the tensor maps: K % 8 == 0 (K % 16 for e4m3: the 16-byte row stride of A and
// K-major B), N % 8 == 0 for an N-major B, N % 4 == 0 for C.
//
// Lines marked "// SITE:name" are the call sites tests/test_cudasim_hopper_gemm.py expects the
// shim's messages to name.
#pragma once
#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#include <cuda_fp8.h>

#include "cuda/ptx.cuh"
#include "cuda/tensor_map.h"

namespace hopper_gemm {

// Planted bugs the shim must report in this kernel.
enum class Bug {
  None,
  EarlyRelease,  // a consumer releases a stage before the wgmma.wait_group retiring its MMAs
  NoExpectTx,    // the producer arrives on "full" without announcing the copies' bytes
  NoProxyFence,  // the epilogue's plain stores reach the TMA store without fence.proxy.async
};

constexpr int kBlockN = 128;
constexpr uint32_t kRowBytes = 128;  // a 128-byte swizzle row: 64 16-bit or 128 8-bit elements
template <typename Elem>
constexpr int kBlockK = static_cast<int>(kRowBytes / sizeof(Elem));
constexpr uint32_t kSwizzleAtom = 1024;      // 8 rows of 128 bytes: tiles start 1024-aligned

template <int kConsumers, int kStages>
struct Config {
  static_assert(kConsumers == 1 || kConsumers == 2, "one or two consumer warpgroups");
  static_assert(kStages >= 2, "a ring of at least two stages");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr uint32_t kABytes = kBlockM * kRowBytes;        // kBlockM rows of 64 k
  static constexpr uint32_t kBBytes = kBlockN * kRowBytes;        // 128 x 64, either major
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;      // what each full phase expects
  static constexpr uint32_t kCBytes = 64 * kBlockN * 4;           // one consumer's f32 rows
  static constexpr uint32_t kCOffset = kStages * kStageBytes;
  static constexpr uint32_t kBarrierOffset = kCOffset + kConsumers * kCBytes;
  // + the slack that lets the kernel round the dynamic shared memory up to 1024 bytes (nvcc
  // aligns it to 128 only; the shim to 1024).
  static constexpr size_t kSmemBytes = kBarrierOffset + 2 * kStages * 8 + kSwizzleAtom;
  // Registers per thread after setmaxnreg: the producer keeps few, the consumers take the rest
  // of the 64K-register file (multiples of 8).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = kConsumers == 1 ? 240 : 232;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536,
                "setmaxnreg counts must fit the register file");
};

template <typename Elem>
struct ElemTraits;
template <>
struct ElemTraits<__nv_bfloat16> {
  static constexpr flashattn::TensorMapDtype kDtype = flashattn::TensorMapDtype::BFloat16;
};
template <>
struct ElemTraits<__half> {
  static constexpr flashattn::TensorMapDtype kDtype = flashattn::TensorMapDtype::Float16;
};
template <>
struct ElemTraits<__nv_fp8_e4m3> {  // TMA moves bytes: e4m3 travels as UInt8
  static constexpr flashattn::TensorMapDtype kDtype = flashattn::TensorMapDtype::UInt8;
};
template <typename Elem>
constexpr bool kIsE4m3 = sizeof(Elem) == 1;

// D[64 x 128] += A * B over one instruction's K (16 for bf16 / f16, 32 for e4m3): 32 bytes of
// each K-major row either way.
template <typename Elem, flashattn::ptx::WgmmaMajor kMajorB>
__device__ inline void mma_step(float (&d)[kBlockN / 2], uint64_t desc_a, uint64_t desc_b
                                FLASHATTN_CALLER_SITE) {
  using flashattn::ptx::WgmmaMajor;
  if constexpr (kIsE4m3<Elem>) {
    static_assert(kMajorB == WgmmaMajor::K, "e4m3 wgmma operands are K-major only");
    flashattn::ptx::wgmma_e4m3_ss<kBlockN>(d, desc_a, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  } else if constexpr (ElemTraits<Elem>::kDtype == flashattn::TensorMapDtype::BFloat16) {
    flashattn::ptx::wgmma_bf16_ss<kBlockN, WgmmaMajor::K, kMajorB>(d, desc_a, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  } else {
    flashattn::ptx::wgmma_f16_ss<kBlockN, WgmmaMajor::K, kMajorB>(d, desc_a, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  }
}

// grid (ceil(N / 128), ceil(M / kBlockM)), block Config::kThreads, Config::kSmemBytes of dynamic
// shared memory; k_tiles = ceil(K / kBlockK<Elem>). Maps from make_maps() below.
template <typename Elem, bool kBNMajor, int kConsumers, int kStages, Bug kBug = Bug::None>
__global__ void __launch_bounds__(Config<kConsumers, kStages>::kThreads, 1)
    gemm_kernel(const __grid_constant__ flashattn::TensorMap map_a,
                const __grid_constant__ flashattn::TensorMap map_b,
                const __grid_constant__ flashattn::TensorMap map_c, int k_tiles) {
  using namespace flashattn::ptx;
  using Cfg = Config<kConsumers, kStages>;
  constexpr WgmmaMajor kMajorB = kBNMajor ? WgmmaMajor::MN : WgmmaMajor::K;
  constexpr int kBlockK = hopper_gemm::kBlockK<Elem>;
  static_assert(!(kBNMajor && kIsE4m3<Elem>), "e4m3 wgmma operands are K-major only");
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem_base);
  unsigned char* smem = smem_base + (kSwizzleAtom - smem_u32addr(smem_base) % kSwizzleAtom) % kSwizzleAtom;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x, group = tid / 128;
  const int m0 = blockIdx.y * Cfg::kBlockM, n0 = blockIdx.x * kBlockN;

  if (tid == 0) {
    tma_prefetch_descriptor(&map_a);
    tma_prefetch_descriptor(&map_b);
    tma_prefetch_descriptor(&map_c);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kConsumers);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (group == 0) {
    // ---- Producer ----
    setmaxnreg_dec<Cfg::kProducerRegisters>();
    if (tid == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        const uint32_t round = static_cast<uint32_t>(kt / kStages);
        mbarrier_wait_parity(&empty[s], (round & 1) ^ 1);  // passes at once in round 0
        unsigned char* a_tile = smem + s * Cfg::kStageBytes;
        unsigned char* b_tile = a_tile + Cfg::kABytes;
        if (kBug == Bug::NoExpectTx) {
          mbarrier_arrive(&full[s]);  // SITE:arrive_no_tx
        } else {
          mbarrier_arrive_expect_tx(&full[s], Cfg::kStageBytes);
        }
        const int k0 = kt * kBlockK;
        tma_load_2d(a_tile, &map_a, &full[s], k0, m0);  // SITE:load_a
        if (kBNMajor) {  // two boxes of 64 n x 64 k: one 128-byte swizzle row holds 64 n
          tma_load_2d(b_tile, &map_b, &full[s], n0, k0);  // SITE:load_b_mn0
          tma_load_2d(b_tile + kBlockK * kRowBytes, &map_b, &full[s], n0 + 64, k0);  // SITE:load_b_mn1
        } else {
          tma_load_2d(b_tile, &map_b, &full[s], k0, n0);  // SITE:load_b
        }
      }
    }
    return;
  }

  // ---- Consumers ----
  setmaxnreg_inc<Cfg::kConsumerRegisters>();
  const int consumer = group - 1, t = tid % 128;
  float d[kBlockN / 2];
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) d[i] = 0.f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    mbarrier_wait_parity(&full[s], static_cast<uint32_t>(kt / kStages) & 1);
    const unsigned char* a_tile = smem + s * Cfg::kStageBytes + consumer * 64 * kRowBytes;
    const unsigned char* b_tile = smem + s * Cfg::kStageBytes + Cfg::kABytes;
    // K-major: rows of 128 bytes, 8-row atoms at SBO 1024, each instruction's K (16 16-bit or
    // 32 8-bit elements) 32 bytes further. MN-major: k-rows of 64 n at 128 bytes, 8-k groups at
    // SBO 1024, the next 64 n at LBO (the second box), k16 steps 16 k-rows (2048 bytes) further.
    const uint64_t desc_a = wgmma_descriptor(smem_u32addr(a_tile), 16, 1024, WgmmaSwizzle::B128);
    const uint64_t desc_b = wgmma_descriptor(smem_u32addr(b_tile), kBNMajor ? kBlockK * kRowBytes : 16,
                                             1024, WgmmaSwizzle::B128);
    wgmma_fence_operand(d);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < static_cast<int>(kRowBytes / 32); ++k) {
      const uint64_t da = wgmma_descriptor_advance(desc_a, 32 * k);
      const uint64_t db = wgmma_descriptor_advance(desc_b, (kBNMajor ? 16 * kRowBytes : 32) * k);
      mma_step<Elem, kMajorB>(d, da, db);  // SITE:wgmma
    }
    wgmma_commit_group();
    wgmma_fence_operand(d);
    // The planted bug releases this step's stage as soon as its MMAs are issued: the producer
    // may then load the step after next into it while they still read it.
    if (kBug == Bug::EarlyRelease && t == 0) mbarrier_arrive(&empty[s]);  // SITE:early_release
    // This step's MMAs run on; the previous step's have retired and their stage is free.
    wgmma_wait_group<1>();  // SITE:wait_previous
    if (kBug != Bug::EarlyRelease && kt > 0 && t == 0) mbarrier_arrive(&empty[(kt - 1) % kStages]);
  }
  wgmma_wait_group<0>();  // SITE:wait_last
  wgmma_fence_operand(d);
  if (kBug != Bug::EarlyRelease && k_tiles > 0 && t == 0) mbarrier_arrive(&empty[(k_tiles - 1) % kStages]);

  // ---- Epilogue: registers -> shared memory -> TMA store ----
  float* c_tile = reinterpret_cast<float*>(smem + Cfg::kCOffset + consumer * Cfg::kCBytes);
  const int warp = t / 32, lane = t % 32;
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    // The m64nN f32 accumulator layout (ptx_sm90_mma.cuh).
    const int row = 16 * warp + lane / 4 + 8 * ((i % 4) / 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    FLASHATTN_SMEM(c_tile)[row * kBlockN + col] = d[i];  // SITE:stage_c
  }
  if (kBug != Bug::NoProxyFence) fence_proxy_async_shared_cta();
  named_barrier_sync(1 + consumer, 128);
  if (t == 0) {
    tma_store_2d(&map_c, c_tile, n0, m0 + 64 * consumer);  // SITE:store_c
    bulk_commit_group();
    bulk_wait_group<0>();
  }
}

struct Maps {
  flashattn::TensorMap a, b, c;
};

// Tensor maps for A (M x K), B (N x K, or K x N when b_n_major) and C (M x N, f32), all
// row-major and dense. "" on success, else the encoder's reason.
template <typename Elem>
std::string make_maps(Maps& maps, const void* a, const void* b, void* c, int m, int n, int k,
                      bool b_n_major, int block_m) {
  constexpr int kBlockK = hopper_gemm::kBlockK<Elem>;
  constexpr uint64_t kBytes = sizeof(Elem);
  flashattn::TensorMapSpec spec;
  spec.dtype = ElemTraits<Elem>::kDtype;
  spec.rank = 2;
  spec.swizzle = flashattn::TensorMapSwizzle::B128;
  spec.l2_promotion = flashattn::TensorMapL2Promotion::B128;
  spec.global = a;
  spec.dims[0] = k, spec.dims[1] = m;
  spec.strides[0] = static_cast<uint64_t>(k) * kBytes;
  spec.box[0] = kBlockK, spec.box[1] = block_m;
  std::string error = flashattn::encode_tensor_map(&maps.a, spec);
  if (!error.empty()) return "A: " + error;
  spec.global = b;
  if (b_n_major) {
    spec.dims[0] = n, spec.dims[1] = k;
    spec.strides[0] = static_cast<uint64_t>(n) * kBytes;
    spec.box[0] = 64, spec.box[1] = kBlockK;
  } else {
    spec.dims[0] = k, spec.dims[1] = n;
    spec.strides[0] = static_cast<uint64_t>(k) * kBytes;
    spec.box[0] = kBlockK, spec.box[1] = kBlockN;
  }
  error = flashattn::encode_tensor_map(&maps.b, spec);
  if (!error.empty()) return "B: " + error;
  spec.dtype = flashattn::TensorMapDtype::Float32;
  spec.swizzle = flashattn::TensorMapSwizzle::None;
  spec.global = c;
  spec.dims[0] = n, spec.dims[1] = m;
  spec.strides[0] = static_cast<uint64_t>(n) * 4;
  spec.box[0] = kBlockN, spec.box[1] = 64;
  error = flashattn::encode_tensor_map(&maps.c, spec);
  if (!error.empty()) return "C: " + error;
  return "";
}

}  // namespace hopper_gemm
