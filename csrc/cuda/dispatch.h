// Runtime -> compile-time switches (element type, head-dim tile), nothing else. Shared by
// api.cu and the CPU-shim test extension, so both pick the same instantiation for an input.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>
#include <utility>

namespace flashattn::cuda {

enum class ElementType { kHalf, kBFloat16, kFloat };

// The head-dim tiles the 16-bit kernels are compiled for (traits.h explains the choice).
template <int... kTiles>
struct HeadDimTiles {};
using CompiledHeadDimTiles = HeadDimTiles<32, 64, 96, 128, 192, 256>;
// The head-dim tiles of the fp32 SIMT kernels.
using SimtHeadDimTiles = HeadDimTiles<64, 128, 256>;

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
