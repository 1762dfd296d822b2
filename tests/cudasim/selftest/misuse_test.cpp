// Kernels that misuse CUDA in ways the shim must report as cudasim::SimError.
//   misuse_test CASE
// Prints the error and exits 3 when the shim reports it, 0 when the launch went through. Then
// runs a correct kernel to show the shim recovered (prints "recovered"). Lines marked
// "// SITE:name" are the call sites the test expects the messages to name.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

// A named namespace: external linkage puts the kernels in the dynamic symbol table (-rdynamic),
// so the shim's messages can name them.
namespace misuse {

using namespace flashattn::ptx;

__global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();  // SITE:divergent_first
  } else {
    __syncthreads();  // SITE:divergent_second
  }
  out[threadIdx.x] = 1;
}

__global__ void shuffle_meets_barrier(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 == 31) {
    __syncthreads();  // SITE:deadlock_barrier
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);  // SITE:deadlock_shuffle
  }
  out[threadIdx.x] = v;
}

__global__ void cp_async_never_waited(const uint4* src) {
  FLASHATTN_DYNAMIC_SMEM(uint4, smem);
  cp_async_16(&smem[threadIdx.x], &src[threadIdx.x], 16);  // SITE:pending_copy
  cp_async_commit();
}

// The shape of a pipelined kernel that drops its final cp_async_wait_all(): the loop's last
// commit formed an empty group, and an older group still holds a copy. The shim must name the
// copy, not trip over the empty group in front of it (which once crashed the process).
__global__ void cp_async_pending_behind_empty_group(const uint4* src) {
  FLASHATTN_DYNAMIC_SMEM(uint4, smem);
  cp_async_commit();  // an empty group, oldest
  cp_async_16(&smem[threadIdx.x], &src[threadIdx.x], 16);  // SITE:pending_behind_empty
  cp_async_commit();
  cp_async_commit();  // an empty group, newest
}

// Only empty groups left at exit: no copy is in flight, which is legal on hardware.
__global__ void cp_async_only_empty_groups_pending(const uint4* src, uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(uint4, smem);
  cp_async_16(&smem[threadIdx.x], &src[threadIdx.x], 16);
  cp_async_commit();
  cp_async_wait<0>();
  cp_async_commit();
  cp_async_commit();
  out[threadIdx.x] = smem[threadIdx.x].x;
}

__global__ void ldmatrix_misaligned(uint32_t* out) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  const int lane = threadIdx.x;
  uint32_t r0, r1, r2, r3;
  ldmatrix_x4(r0, r1, r2, r3, smem + lane * 16 + (lane == 5 ? 8 : 0));  // SITE:misaligned
  out[lane] = r0 + r1 + r2 + r3;
}

__global__ void red_v2_misaligned(float* out) {
  if (threadIdx.x == 0) red_add_f32x2(out + 1, 1.f, 2.f);  // SITE:red_misaligned
}

__global__ void ldmatrix_from_global(const uint4* global_rows, uint32_t* out) {
  const int lane = threadIdx.x;
  uint32_t r0;
  ldmatrix_x1(r0, &global_rows[lane]);  // SITE:not_shared
  out[lane] = r0;
}

__global__ void shuffle_mask_excludes_caller(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xfffffffeu, 1.f, 1);  // SITE:excludes_caller
}

// A half-warp mask with an xor that crosses into the other half: lanes 0-15 read lanes 16-31.
__global__ void shuffle_reads_outside_mask(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x < 16) v = __shfl_xor_sync(0x0000ffffu, v, 16);  // SITE:outside_mask
  out[threadIdx.x] = v;
}

__global__ void shuffle_waits_for_returned_lanes(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);  // SITE:returned_lanes
}

__global__ void mma_in_partial_warp(float* out) {
  float d[4] = {};
  const uint32_t a[4] = {}, b[2] = {};
  mma_m16n8k16_f16(d, a, b);  // SITE:partial_warp
  out[threadIdx.x] = d[0];
}

__global__ void lanes_in_different_collectives(float* out) {
  float v = 1.f;
  if (threadIdx.x < 16) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);  // SITE:mixed_shuffle
  } else {
    __syncwarp();  // SITE:mixed_syncwarp
  }
  out[threadIdx.x] = v;
}

__global__ void cp_async_bad_size(const uint4* src) {
  FLASHATTN_DYNAMIC_SMEM(uint4, smem);
  cp_async_16(&smem[threadIdx.x], &src[threadIdx.x], 17);  // SITE:bad_size
  cp_async_wait_all();
}

__global__ void uses_smem(int* out) {
  FLASHATTN_DYNAMIC_SMEM(int, smem);
  smem[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

// Writes one int past the end of its dynamic shared memory: only ASan can see this.
__global__ void smem_overrun(int* out) {
  FLASHATTN_DYNAMIC_SMEM(int, smem);
  smem[blockDim.x] = 1;  // SITE:smem_overrun
  out[threadIdx.x] = smem[threadIdx.x];
}

}  // namespace misuse

namespace {

using namespace misuse;

std::vector<float> floats(64);
std::vector<int> ints(64);
std::vector<uint32_t> words(64);
std::vector<uint4> rows(64);
const dim3 kOneBlock(1);

const std::map<std::string, std::function<void()>> kCases = {
    {"divergent_barrier", [] { cudasim::launch(divergent_barrier, kOneBlock, dim3(64), 0, ints.data()); }},
    {"deadlock", [] { cudasim::launch(shuffle_meets_barrier, kOneBlock, dim3(64), 0, floats.data()); }},
    {"pending_cp_async", [] { cudasim::launch(cp_async_never_waited, kOneBlock, dim3(32), 512, rows.data()); }},
    {"pending_cp_async_behind_empty_group", [] {
       cudasim::launch(cp_async_pending_behind_empty_group, kOneBlock, dim3(32), 512, rows.data());
     }},
    {"only_empty_cp_async_groups_pending", [] {
       cudasim::launch(cp_async_only_empty_groups_pending, kOneBlock, dim3(32), 512, rows.data(),
                       words.data());
     }},
    {"ldmatrix_misaligned", [] { cudasim::launch(ldmatrix_misaligned, kOneBlock, dim3(32), 1024, words.data()); }},
    {"red_v2_misaligned", [] { cudasim::launch(red_v2_misaligned, kOneBlock, dim3(32), 0, floats.data()); }},
    {"ldmatrix_not_shared", [] { cudasim::launch(ldmatrix_from_global, kOneBlock, dim3(32), 512, rows.data(), words.data()); }},
    {"shuffle_excludes_caller", [] { cudasim::launch(shuffle_mask_excludes_caller, kOneBlock, dim3(32), 0, floats.data()); }},
    {"shuffle_outside_mask", [] { cudasim::launch(shuffle_reads_outside_mask, kOneBlock, dim3(32), 0, floats.data()); }},
    {"shuffle_returned_lanes", [] { cudasim::launch(shuffle_waits_for_returned_lanes, kOneBlock, dim3(32), 0, floats.data()); }},
    {"mma_partial_warp", [] { cudasim::launch(mma_in_partial_warp, kOneBlock, dim3(16), 0, floats.data()); }},
    {"mixed_collectives", [] { cudasim::launch(lanes_in_different_collectives, kOneBlock, dim3(32), 0, floats.data()); }},
    {"cp_async_bad_size", [] { cudasim::launch(cp_async_bad_size, kOneBlock, dim3(32), 512, rows.data()); }},
    {"smem_over_48k_without_opt_in", [] { cudasim::launch(uses_smem, kOneBlock, dim3(32), 64 * 1024, ints.data()); }},
    {"smem_over_48k_with_opt_in", [] {
       auto kernel = &uses_smem;
       flashattn::set_max_dynamic_smem(kernel, 64 * 1024);
       FLASHATTN_LAUNCH_KERNEL(kernel, kOneBlock, dim3(32), 64 * 1024, cudaStream_t{}, ints.data());
       FLASHATTN_LAUNCH_CHECK();
     }},
    {"smem_opt_in_above_227k", [] { flashattn::set_max_dynamic_smem(&uses_smem, 228 * 1024); }},
    {"smem_overrun", [] { cudasim::launch(smem_overrun, kOneBlock, dim3(32), 32 * sizeof(int), ints.data()); }},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || kCases.count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: %s CASE; cases:", argv[0]);
    for (const auto& c : kCases) std::fprintf(stderr, " %s", c.first.c_str());
    std::fprintf(stderr, "\n");
    return 64;
  }
  int status = 0;
  try {
    kCases.at(argv[1])();
    std::printf("no error\n");
  } catch (const cudasim::SimError& e) {
    std::printf("SimError: %s\n", e.what());
    status = 3;
  }
  // The failed launch must have cleaned up: a correct kernel runs normally afterwards.
  cudasim::launch(uses_smem, kOneBlock, dim3(32), 32 * sizeof(int), ints.data());
  std::printf(ints[31] == 0 ? "recovered\n" : "not recovered\n");
  return status;
}
