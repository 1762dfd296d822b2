// Runtime -> compile-time switches (element type, head-dim tile), nothing else. Shared by
// api.cu and the CPU-shim test extension, so both pick the same instantiation for an input.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "kernel_list.h"
#include "traits.h"

namespace flashattn::cuda {

enum class ElementType { kHalf, kBFloat16, kFloat };

template <int... kTiles>
struct HeadDimTiles {};

namespace detail {
template <const auto& kList, std::size_t... kIndex>
HeadDimTiles<kList[kIndex]...> head_dim_tiles(std::index_sequence<kIndex...>);

template <std::size_t kN, std::size_t kM>
constexpr bool same_tiles(const int (&a)[kN], const int (&b)[kM]) {
  if (kN != kM) return false;
  for (std::size_t i = 0; i < kN; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}
}  // namespace detail

// HeadDimTiles<the elements of a constexpr int array>.
template <const auto& kList>
using HeadDimTilesOf = decltype(detail::head_dim_tiles<kList>(
    std::make_index_sequence<sizeof(kList) / sizeof(kList[0])>{}));

// A family's tiles keyed by (q's and k's width, v's width): kQk[i] and kV[i] are tile i, in
// (qk, v) order (kernel_list.h).
template <const auto& kQk, const auto& kV>
struct HeadDimPairs {
  static_assert(sizeof(kQk) == sizeof(kV), "kernel_list.h: one v width per tile");
  static constexpr std::size_t kCount = sizeof(kQk) / sizeof(kQk[0]);
};

// The head-dim tiles the kernels are compiled for: kernel_list.h, generated from the one list of
// instantiations, csrc/cuda/kernel_list.py (traits.h explains the choice). An equal head dim the
// backward takes (<= kMaxHeadDimBwd) gets the same tile in both directions, so the backward's
// equal tiles are the forward's up to there (the 16-bit forward adds MLA's 576 / 512), and its
// unequal pairs ((192, 128)) are some of the forward's: a pair without one runs on the equal tile
// of its wider dim.
static_assert(detail::same_tiles(kSm80FwdSimtHeadDims, kSm80BwdSimtHeadDims),
              "kernel_list.py: the fp32 forward and backward need the same head-dim tiles");
// The 16-bit tensor-core kernels', forward and backward, keyed by (qk, v) pairs.
using CompiledFwdHeadDimPairs = HeadDimPairs<kSm80Fwd16bitHeadDims, kSm80Fwd16bitHeadDimsV>;
using CompiledBwdHeadDimPairs = HeadDimPairs<kSm80Bwd16bitHeadDims, kSm80Bwd16bitHeadDimsV>;
namespace detail {
// The backward's equal pairs (qk == v) are the forward's up to kMaxHeadDimBwd, one for one, and
// each of its unequal pairs is one of the forward's.
constexpr bool bwd_tiles_lead_fwd_tiles() {
  constexpr std::size_t kBwd = sizeof(kSm80Bwd16bitHeadDims) / sizeof(int);
  constexpr std::size_t kFwd = sizeof(kSm80Fwd16bitHeadDims) / sizeof(int);
  int last_equal = 0;
  std::size_t bwd = 0;  // the backward's equal pairs matched so far, in order
  for (std::size_t i = 0; i < kFwd; ++i) {
    const int tile = kSm80Fwd16bitHeadDims[i];
    if (tile != kSm80Fwd16bitHeadDimsV[i] || tile > kMaxHeadDimBwd) continue;
    while (bwd < kBwd && kSm80Bwd16bitHeadDims[bwd] != kSm80Bwd16bitHeadDimsV[bwd]) ++bwd;
    if (bwd == kBwd || kSm80Bwd16bitHeadDims[bwd] != tile) return false;
    last_equal = tile;
    ++bwd;
  }
  for (std::size_t j = 0; j < kBwd; ++j) {
    bool in_fwd = false;
    for (std::size_t i = 0; i < kFwd; ++i)
      in_fwd = in_fwd || (kSm80Fwd16bitHeadDims[i] == kSm80Bwd16bitHeadDims[j] &&
                          kSm80Fwd16bitHeadDimsV[i] == kSm80Bwd16bitHeadDimsV[j]);
    if (!in_fwd) return false;
  }
  return last_equal == kMaxHeadDimBwd;
}
}  // namespace detail
static_assert(detail::bwd_tiles_lead_fwd_tiles(),
              "kernel_list.py: the 16-bit backward's equal tiles must be the forward's up to "
              "kMaxHeadDimBwd (traits.h), and its unequal pairs some of the forward's");
// The fp32 SIMT kernels'.
using SimtHeadDimTiles = HeadDimTilesOf<kSm80FwdSimtHeadDims>;

// Calls f(std::integral_constant<int, tile>) for the smallest tile >= head_dim; returns false
// when no tile is large enough.
template <typename F, int kFirst, int... kRest>
bool dispatch_head_dim(HeadDimTiles<kFirst, kRest...>, int head_dim, F&& f) {
  if (head_dim <= kFirst) {
    f(std::integral_constant<int, kFirst>{});
    return true;
  }
  if constexpr (sizeof...(kRest) == 0) {
    return false;
  } else {
    return dispatch_head_dim(HeadDimTiles<kRest...>{}, head_dim, std::forward<F>(f));
  }
}

// Calls f(std::integral_constant<int, qk>, std::integral_constant<int, v>) for the first tile
// (qk, v) of the list, in (qk, v) order, with qk >= head_dim and v >= head_dim_v: the narrowest
// q and k, then the narrowest v (a (192, 128) pair takes the (192, 128) tile, (128, 65) the
// (128, 128) one). Returns false when none covers the pair.
template <const auto& kQk, const auto& kV, std::size_t kIndex = 0, typename F>
bool dispatch_head_dims(HeadDimPairs<kQk, kV> list, int head_dim, int head_dim_v, F&& f) {
  if constexpr (kIndex == decltype(list)::kCount) {
    return false;
  } else {
    if (head_dim <= kQk[kIndex] && head_dim_v <= kV[kIndex]) {
      f(std::integral_constant<int, kQk[kIndex]>{}, std::integral_constant<int, kV[kIndex]>{});
      return true;
    }
    return dispatch_head_dims<kQk, kV, kIndex + 1>(list, head_dim, head_dim_v,
                                                   std::forward<F>(f));
  }
}

// The same over tiles as wide for v as for q (HeadDimTiles): the smallest tile >= both dims,
// passed twice.
template <int... kTiles, typename F>
bool dispatch_head_dims(HeadDimTiles<kTiles...> list, int head_dim, int head_dim_v, F&& f) {
  return dispatch_head_dim(list, head_dim > head_dim_v ? head_dim : head_dim_v,
                           [&](auto tile) { f(tile, tile); });
}

// Calls f(Element{}) with __half, __nv_bfloat16 or float.
template <typename F>
void dispatch_element(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kHalf:
      f(__half{});
      return;
    case ElementType::kBFloat16:
      f(__nv_bfloat16{});
      return;
    case ElementType::kFloat:
      f(float{});
      return;
  }
}

// The head-dim tiles compiled for an element type: tensor-core kernels for 16-bit types, SIMT
// kernels for fp32; forward or backward (kBackward), the 16-bit ones keyed by (qk, v) pairs
// (dispatch_head_dims).
template <typename Element, bool kBackward = false>
using HeadDimTilesFor = std::conditional_t<
    std::is_same_v<Element, float>, SimtHeadDimTiles,
    std::conditional_t<kBackward, CompiledBwdHeadDimPairs, CompiledFwdHeadDimPairs>>;

}  // namespace flashattn::cuda
