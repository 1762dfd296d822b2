// Which kernels run for an input, written once for api.cu and for the CPU-shim test
// extension: the element type picks the family (tensor cores for fp16/bf16, SIMT for fp32),
// the head dim picks the smallest compiled tile that holds it.
#pragma once
#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

#include "../params.h"
#include "dispatch.h"
#include "grid.h"
#include "kernels.h"
#include "traits.h"

namespace flashattn::cuda {

struct KernelChoice {
  ElementType type;
  int head_dim_tile;
};

// head_dim <= kMaxHeadDim, which the shared input checks enforce (ExecutorLimits); every
// element type has a tile that large.
inline KernelChoice choose_kernels(ElementType type, int head_dim) {
  KernelChoice choice{type, 0};
  dispatch_element(type, [&](auto element) {
    dispatch_head_dim(HeadDimTilesFor<decltype(element)>{}, head_dim,
                      [&](auto tile) { choice.head_dim_tile = decltype(tile)::value; });
  });
  TORCH_INTERNAL_ASSERT(choice.head_dim_tile != 0, "flashattn: no CUDA tile for head_dim ",
                        head_dim);
  return choice;
}

// Calls f(Element{}, std::integral_constant<int, tile>{}) for a choice with a tile.
template <typename F>
void dispatch_choice(const KernelChoice& choice, F&& f) {
  dispatch_element(choice.type, [&](auto element) {
    dispatch_head_dim(HeadDimTilesFor<decltype(element)>{}, choice.head_dim_tile,
                      [&](auto tile) { f(element, tile); });
  });
}

template <typename Element>
inline constexpr bool kIsFloat = std::is_same_v<Element, float>;

// The forward's launch shape for p (grid.h): which kernel runs depends on the element type,
// the head-dim tile, dropout and the query rows.
inline FwdLaunchShape fwd_launch_shape(const KernelChoice& choice, const AttnParams& p) {
  FwdLaunchShape shape{};
  dispatch_choice(choice, [&](auto element, auto tile) {
    constexpr int kTile = decltype(tile)::value;
    if constexpr (kIsFloat<decltype(element)>) {
      shape = FwdLaunchShape::of<SimtTraits<kTile>>(SimtTraits<kTile>::kNWarps);
    } else {
      with_fwd_traits<kTile>(p, [&](auto traits) {
        shape = FwdLaunchShape::of<decltype(traits)>();
      });
    }
  });
  return shape;
}

// Largest dynamic shared memory any kernel of the backward asks for.
inline int bwd_smem_bytes(const KernelChoice& choice) {
  int bytes = 0;
  dispatch_choice(choice, [&](auto element, auto tile) {
    constexpr int kTile = decltype(tile)::value;
    if constexpr (kIsFloat<decltype(element)>) {
      bytes = SimtTraits<kTile>::kDkdvSmemBytes > SimtTraits<kTile>::kSmemBytes
                  ? SimtTraits<kTile>::kDkdvSmemBytes
                  : SimtTraits<kTile>::kSmemBytes;
    } else {
      bytes = BwdTraits<kTile>::kSmemBytes > BwdDqTraits<kTile>::kSmemBytes
                  ? BwdTraits<kTile>::kSmemBytes
                  : BwdDqTraits<kTile>::kSmemBytes;
    }
  });
  return bytes;
}

// fp32 scratch of the backward, in floats, rows by query_row_index (mask.h): D_i [Hq, total_q],
// then, for the 16-bit kernels unless deterministic, the dQ accumulator
// [Hq, total_q, head_dim_tile] from dq_accum_offset(p) on (grid.h).
inline int64_t bwd_workspace_floats(const AttnBwdParams& p, const KernelChoice& choice) {
  const int64_t rows = static_cast<int64_t>(p.heads_q) * p.total_q;
  const bool dq_accum = choice.type != ElementType::kFloat && !p.deterministic;
  return dq_accum ? dq_accum_offset(p) + rows * choice.head_dim_tile : rows;
}

// Launches the forward for p on `stream`. p must have batch, heads and seqlen_q > 0 and
// choice a tile.
inline void launch_fwd(const AttnParams& p, const KernelChoice& choice, float* split_scratch,
                       cudaStream_t stream,
                       LaunchCheck after_launch) {
  dispatch_choice(choice, [&](auto element, auto tile) {
    using Element = decltype(element);
    constexpr int kTile = decltype(tile)::value;
    if constexpr (kIsFloat<Element>) {
      run_fwd_simt<kTile>(p, split_scratch, stream, after_launch);
    } else {
      run_fwd_16bit<Element, kTile>(p, split_scratch, stream, after_launch);
    }
  });
}

// The split count of a forward that runs in `shape` (fwd_launch_shape): num_splits when given
// (>= 1; at most kMaxSplits), else (0) enough CTAs for every SM, each split keeping at least
// two 64-key tiles.
constexpr int kMaxSplits = 64;
inline int choose_num_splits(const AttnParams& p, const FwdLaunchShape& shape, int sm_count) {
  if (p.num_splits >= 1) return p.num_splits < kMaxSplits ? p.num_splits : kMaxSplits;
  const int rows = shape.block_rows;
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.heads_q * ((p.seqlen_q + rows - 1) / rows);
  if (ctas == 0 || ctas >= sm_count) return 1;
  int64_t splits = (sm_count + ctas - 1) / ctas;
  const int64_t by_keys = p.seqlen_k / 128;
  if (splits > by_keys) splits = by_keys;
  if (splits > kMaxSplits) splits = kMaxSplits;
  return splits > 1 ? static_cast<int>(splits) : 1;
}

// Merges split-KV's parts into out and lse (split_merge_kernel.cuh).
inline void launch_split_merge(const AttnParams& p, const float* split_scratch, ElementType type,
                               cudaStream_t stream, LaunchCheck after_launch) {
  dispatch_element(type, [&](auto element) {
    run_split_merge<decltype(element)>(p, split_scratch, stream, after_launch);
  });
}

// Appends to a KV cache and applies rotary embeddings (kv_append_kernel.cuh).
inline void launch_kv_append(const KvAppendParams& p, ElementType type, cudaStream_t stream,
                             LaunchCheck after_launch) {
  dispatch_element(type, [&](auto element) {
    run_kv_append<decltype(element)>(p, stream, after_launch);
  });
}

// Launches the backward for p; workspace: bwd_workspace_floats(p, choice) floats.
inline void launch_bwd(const AttnBwdParams& p, const KernelChoice& choice, float* workspace,
                       cudaStream_t stream, LaunchCheck after_launch) {
  dispatch_choice(choice, [&](auto element, auto tile) {
    using Element = decltype(element);
    constexpr int kTile = decltype(tile)::value;
    if constexpr (kIsFloat<Element>) {
      run_bwd_simt<kTile>(p, workspace, stream, after_launch);
    } else {
      run_bwd_16bit<Element, kTile>(p, workspace, stream, after_launch);
    }
  });
}

}  // namespace flashattn::cuda
