// Grid layout shared by the attention kernels.
//
// grid.x = query (or key) tiles: up to 2^31 - 1, so S up to 2^20 and beyond is never a limit.
// grid.y x grid.z = batch * heads, folded: grid.y and grid.z are each capped at 65535, so
// B * H >= 65536 is split as ceil(BH / 65535) slices of at most 65535; kernels read
// batch_head = blockIdx.z * gridDim.y + blockIdx.y and return when it is >= B * H (at most
// grid.z - 1 idle rows of CTAs).
//
// Variable-length batches: grid.x covers the longest sequence (max_seqlen_q, or max_seqlen_k for
// the key-tile kernels) for every sequence, and a CTA past its own sequence's end exits at once,
// FA2's way. A flattened list of real tiles would launch no idle CTAs, but building it needs
// cu_seqlens on the host (a device sync per call) or a scan kernel before every launch; an idle
// CTA costs two loads of cu_seqlens and an exit.
#pragma once
#include <cstdint>

#include "../params.h"
#include "launch.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Called by the launch templates right after each launch (api.cu: C10_CUDA_KERNEL_LAUNCH_CHECK).
using LaunchCheck = void (*)();

// Opts a kernel in to more than the default 48 KB of dynamic shared memory when it needs it.
template <typename Kernel>
void allow_smem(Kernel* kernel, int bytes) {
  if (bytes > kDefaultSmemBytes) set_max_dynamic_smem(kernel, bytes);
}

// Launches a kernel with `smem_bytes` of dynamic shared memory, opted in first (allow_smem).
template <typename Kernel, typename... Args>
void launch_with_smem(Kernel* kernel, dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                      const Args&... args) {
  allow_smem(kernel, smem_bytes);
  FLASHATTN_LAUNCH_KERNEL(kernel, grid, block, smem_bytes, stream, args...);
}

constexpr int64_t kMaxGridYZ = 65535;

// grid.x = ceil(seqlen / block), grid.y x grid.z >= batch_heads.
inline dim3 attention_grid(int seqlen, int block, int64_t batch_heads) {
  const int64_t z = (batch_heads + kMaxGridYZ - 1) / kMaxGridYZ;
  const int64_t y = (batch_heads + z - 1) / z;
  const int64_t x = (static_cast<int64_t>(seqlen) + block - 1) / block;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z));
}

// attention_grid() with num_splits CTAs per query block (split-KV; fwd kernels).
inline dim3 split_attention_grid(int seqlen, int block, int64_t batch_heads, int num_splits) {
  dim3 grid = attention_grid(seqlen, block, batch_heads);
  grid.x *= static_cast<unsigned>(num_splits > 1 ? num_splits : 1);
  return grid;
}

// A forward kernel's launch: query rows per CTA, threads per CTA, dynamic shared memory, and the
// grid they give for an input. The plan (plan_fwd.h) and the launch templates read a forward's
// geometry from here only.
struct FwdLaunchShape {
  int block_rows;
  int threads;
  int smem_bytes;

  template <typename Traits>
  static constexpr FwdLaunchShape of(int block_rows = Traits::kBlockM) {
    return {block_rows, Traits::kNThreads, Traits::kSmemBytes};
  }
  dim3 grid(const AttnParams& p) const {
    return split_attention_grid(p.seqlen_q, block_rows, static_cast<int64_t>(p.batch) * p.heads_q,
                                p.num_splits);
  }
  dim3 block() const { return dim3(static_cast<unsigned>(threads)); }
};

// The (batch, head) index of this CTA in a grid laid out by attention_grid().
__device__ __forceinline__ int64_t folded_batch_head() {
  return static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
}

}  // namespace flashattn::cuda
