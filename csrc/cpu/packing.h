// Copies of the [B, S, H, D] operands in the compute type (fp32, or fp64), laid out so each
// tile product is a plain row-major GEMM (tile_gemm.h): once per call, O(S·D) per head, instead
// of converting or transposing a tile each time it is used.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "../params.h"
#include "tiling.h"

namespace flashattn::cpu {

enum class PackLayout {
  kRows,              // [S, D]: tiles of rows are GEMM operands as they are
  kTransposedPanels,  // [S / W][D][W]: the transpose of each block of W rows, for Q·Kᵀ-like products
};

// Scratch memory for a kernel: uninitialized, in the compute type.
template <typename T>
T* alloc_workspace(at::Tensor& owner, int64_t elements) {
  owner = at::empty({elements}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
  return owner.data_ptr<T>();
}

// All (b, h) heads of a tensor, packed in a layout; head (b, h) starts at head(b, h).
template <typename T>
struct PackedHeads {
  at::Tensor storage;
  T* data = nullptr;
  int heads = 0;
  int64_t head_elements = 0;

  const T* head(int b, int h) const { return data + (int64_t(b) * heads + h) * head_elements; }
};

// Packs `src` (B x rows x heads x dim of In), multiplied by `factor` (1 copies exactly), in
// parallel over heads. panel_width is the block height W of kTransposedPanels.
template <typename T, typename In>
PackedHeads<T> pack_heads(const TensorView& src, int batch, int heads, int rows,
                          int dim, PackLayout layout, int panel_width, T factor) {
  PackedHeads<T> packed;
  packed.heads = heads;
  const int padded_rows =
      layout == PackLayout::kRows ? rows : num_blocks(rows, panel_width) * panel_width;
  packed.head_elements = int64_t(padded_rows) * dim;
  packed.data = alloc_workspace<T>(packed.storage, int64_t(batch) * heads * packed.head_elements);
  at::parallel_for(0, int64_t(batch) * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int b = static_cast<int>(bh / heads), h = static_cast<int>(bh % heads);
      T* dst = packed.data + bh * packed.head_elements;
      for (int s = 0; s < rows; ++s) {
        const In* in = src.row<const In>(b, h, s);
        if (layout == PackLayout::kRows) {
          for (int d = 0; d < dim; ++d) dst[int64_t(s) * dim + d] = static_cast<T>(in[d]) * factor;
        } else {
          T* panel = dst + int64_t(s / panel_width) * dim * panel_width + s % panel_width;
          for (int d = 0; d < dim; ++d)
            panel[int64_t(d) * panel_width] = static_cast<T>(in[d]) * factor;
        }
      }
    }
  });
  return packed;
}

}  // namespace flashattn::cpu
