// Runtime -> compile-time switches (element type, head-dim tile), nothing else. Shared by
// api.cu and the CPU-shim test extension, so both pick the same instantiation for an input.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "kernel_list.h"

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

// The head-dim tiles the kernels are compiled for: kernel_list.h, generated from the one list of
// instantiations, csrc/cuda/kernel_list.py (traits.h explains the choice). One choice serves a
// call's forward and backward, so both directions must list the same tiles.
static_assert(detail::same_tiles(kSm80Fwd16bitHeadDims, kSm80Bwd16bitHeadDims) &&
                  detail::same_tiles(kSm80FwdSimtHeadDims, kSm80BwdSimtHeadDims),
              "kernel_list.py: the forward and the backward need the same head-dim tiles");
// The 16-bit tensor-core kernels'.
using CompiledHeadDimTiles = HeadDimTilesOf<kSm80Fwd16bitHeadDims>;
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
// kernels for fp32.
template <typename Element>
using HeadDimTilesFor =
    std::conditional_t<std::is_same_v<Element, float>, SimtHeadDimTiles, CompiledHeadDimTiles>;

}  // namespace flashattn::cuda
