// Copies of the [B, S, H, D] operands in the compute type (fp32, or fp64), laid out so each
// tile product is a plain row-major GEMM (tile_gemm.h): once per call, O(S·D) per head, instead
// of converting or transposing a tile each time it is used. Each sequence of the batch is
// packed from its own first row in whole blocks, so a tile never straddles two sequences and a
// sequence's packed data is the same whatever else is in the batch.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "../mask.h"
#include "../params.h"
#include "tiling.h"

namespace flashattn::cpu {

// The rows of batch entry b's sequence in a tensor view: [row0, row0 + length) of each head.
struct SequenceRows {
  int64_t row0;
  int length;
};

// Every batch entry's sequence, read on the host (the CPU's cu_seqlens are host memory).
inline std::vector<Sequence> host_sequences(const AttnParams& p) {
  std::vector<Sequence> seqs(p.batch);
  for (int b = 0; b < p.batch; ++b) seqs[b] = sequence_of(p, b);
  return seqs;
}

// The multiply-adds of one Q·Kᵀ and one P·V over every head of `seqs`, masks aside: the unit
// in which a call's work is weighed against a thread's wake-up (threads_for_work).
inline int64_t attention_work(const AttnParams& p, const std::vector<Sequence>& seqs) {
  int64_t work = 0;
  for (const Sequence& s : seqs) work += int64_t(s.seqlen_q) * s.seqlen_k;
  return work * p.heads_q * (p.head_dim + p.head_dim_v);
}

// Where each (batch entry, head) starts in a packing of whole blocks of block_rows rows:
// head h of entry b holds blocks[b] blocks from block first(b, h); sequences may differ in
// length.
struct BlockLayout {
  // Inline room for a few entries: the backward packs one sequence at a time, 7 times per head.
  c10::SmallVector<int64_t, 4> first_block;  // [B]: of head 0 of entry b
  c10::SmallVector<int, 4> blocks;           // [B]: blocks per head of entry b
  int heads = 0;
  int64_t total_blocks = 0;

  int64_t first(int b, int h) const { return first_block[b] + int64_t(h) * blocks[b]; }
  int64_t num_heads() const { return int64_t(blocks.size()) * heads; }
};

inline BlockLayout block_layout(c10::ArrayRef<SequenceRows> seqs, int heads,
                                int block_rows) {
  BlockLayout layout;
  layout.heads = heads;
  for (const SequenceRows& s : seqs) {
    layout.first_block.push_back(layout.total_blocks);
    layout.blocks.push_back(num_blocks(s.length, block_rows));
    layout.total_blocks += int64_t(heads) * layout.blocks.back();
  }
  return layout;
}

// Calls f(b, h) for every (batch entry, head) of `layout`, in parallel.
template <typename F>
void for_each_head(const BlockLayout& layout, const F& f) {
  at::parallel_for(0, layout.num_heads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh)
      f(static_cast<int>(bh / layout.heads), static_cast<int>(bh % layout.heads));
  });
}

enum class PackLayout {
  kRows,              // [S, D]: tiles of rows are GEMM operands as they are
  kTransposedPanels,  // [S / W][D][W]: the transpose of each block of W rows, for Q·Kᵀ-like products
};

// Scratch memory for a kernel: uninitialized, in the compute type. Memory `owner` holds
// already is reused when it is large enough (head_operands.h recycles packed heads).
template <typename T>
T* alloc_workspace(at::Tensor& owner, int64_t elements) {
  const auto dtype = c10::CppTypeToScalarType<T>::value;
  if (!owner.defined() || owner.scalar_type() != dtype || owner.numel() < elements)
    owner = at::empty({elements}, at::TensorOptions().dtype(dtype));
  return owner.data_ptr<T>();
}

// Heads [first_head, ...) of batch entry b of a view, as batch entry 0 of a view of their own
// (its rows keep their numbers: a varlen sequence's start at its row0).
template <typename In>
TensorView heads_from(const TensorView& t, int b, int first_head) {
  TensorView view = t;
  view.ptr = const_cast<In*>(t.row<const In>(b, first_head, 0));
  view.batch_stride = 0;
  return view;
}

// All (b, h) heads of a tensor, packed in a layout; head (b, h) starts at head(b, h).
template <typename T>
struct PackedHeads {
  at::Tensor storage;
  T* data = nullptr;
  BlockLayout layout;
  int64_t block_elements = 0;

  const T* head(int b, int h) const { return data + layout.first(b, h) * block_elements; }
};

#if defined(__SSE2__)
// out[j][i] = in[i][j] * scale for a 4 x 4 block: in[i] and out[j] point at 4 contiguous floats.
// The two transposing copies below, each 4 rows by 4 columns at a time through SSE registers
// (baseline x86-64) instead of element by element.
inline void scaled_transpose_4x4(const float* const (&in)[4], float* const (&out)[4],
                                 __m128 scale) {
  __m128 r0 = _mm_mul_ps(_mm_loadu_ps(in[0]), scale);
  __m128 r1 = _mm_mul_ps(_mm_loadu_ps(in[1]), scale);
  __m128 r2 = _mm_mul_ps(_mm_loadu_ps(in[2]), scale);
  __m128 r3 = _mm_mul_ps(_mm_loadu_ps(in[3]), scale);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(out[0], r0);
  _mm_storeu_ps(out[1], r1);
  _mm_storeu_ps(out[2], r2);
  _mm_storeu_ps(out[3], r3);
}
#endif

// The transposed panels of rows [0, 4 * (length / 4)) of head (b, h) (pack_heads' layout), in
// 4 x 4 blocks: a (1, 16, 8, 64) fp32 backward spent 6% of its time in the element-wise loop.
// Returns the rows done, which the caller's loop continues from (none for other types, other
// CPUs or panels not a multiple of 4 wide).
template <typename T, typename In, typename RowOf>
int transpose_row_quads(T* dst, const RowOf& row_of, int b, int h, int length, int dim,
                        int block_rows, T factor) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<In, float>) {
    if (block_rows % 4 != 0) return 0;
    const __m128 scale = _mm_set1_ps(factor);
    int s = 0;
    for (; s + 4 <= length; s += 4) {
      const float* rows[4] = {row_of(b, h, s), row_of(b, h, s + 1), row_of(b, h, s + 2),
                              row_of(b, h, s + 3)};
      float* panel = dst + int64_t(s / block_rows) * dim * block_rows + s % block_rows;
      int d = 0;
      for (; d + 4 <= dim; d += 4)
        scaled_transpose_4x4({rows[0] + d, rows[1] + d, rows[2] + d, rows[3] + d},
                             {panel + int64_t(d) * block_rows, panel + int64_t(d + 1) * block_rows,
                              panel + int64_t(d + 2) * block_rows,
                              panel + int64_t(d + 3) * block_rows},
                             scale);
      for (; d < dim; ++d)
        for (int r = 0; r < 4; ++r) panel[int64_t(d) * block_rows + r] = rows[r][d] * factor;
    }
    return s;
  }
#endif
  (void)dst, (void)row_of, (void)b, (void)h, (void)length, (void)dim, (void)block_rows,
      (void)factor;
  return 0;
}

// The way back, for a product left transposed: row r of `rows` rows (row_out(r), dim elements)
// gets columns[d * ld + r] * factor for each d, in 4 x 4 blocks (the backward's dQᵀ into dQ).
// Returns the rows done (all but rows % 4, or none for other types and CPUs); the caller's loop
// does the rest.
template <typename T, typename RowOut>
int untranspose_row_quads(const T* columns, int64_t ld, int rows, int dim, T factor,
                          const RowOut& row_out) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m128 scale = _mm_set1_ps(factor);
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      float* out[4] = {row_out(r), row_out(r + 1), row_out(r + 2), row_out(r + 3)};
      int d = 0;
      for (; d + 4 <= dim; d += 4) {
        const float* column = columns + int64_t(d) * ld + r;
        scaled_transpose_4x4({column, column + ld, column + 2 * ld, column + 3 * ld},
                             {out[0] + d, out[1] + d, out[2] + d, out[3] + d}, scale);
      }
      for (; d < dim; ++d)
        for (int i = 0; i < 4; ++i) out[i][d] = columns[int64_t(d) * ld + r + i] * factor;
    }
    return r;
  }
#endif
  (void)columns, (void)ld, (void)rows, (void)dim, (void)factor, (void)row_out;
  return 0;
}

// Packs each sequence (its `seqs[b].length` rows of every head, `dim` elements of In each, row
// s of head h at row_of(b, h, s)), multiplied by `factor` (1 copies exactly), in parallel over
// heads, in blocks of block_rows rows (the panel width W of kTransposedPanels), into `packed`
// (reusing the memory it holds when large enough).
template <typename T, typename In, typename RowOf>
void pack_heads(PackedHeads<T>& packed, const RowOf& row_of, c10::ArrayRef<SequenceRows> seqs,
                int heads, int dim, PackLayout layout, int block_rows, T factor) {
  packed.layout = block_layout(seqs, heads, block_rows);
  packed.block_elements = int64_t(block_rows) * dim;
  packed.data =
      alloc_workspace<T>(packed.storage, packed.layout.total_blocks * packed.block_elements);
  for_each_head(packed.layout, [&](int b, int h) {
    T* dst = packed.data + packed.layout.first(b, h) * packed.block_elements;
    int s = 0;
    if (layout == PackLayout::kTransposedPanels)
      s = transpose_row_quads<T, In>(dst, row_of, b, h, seqs[b].length, dim, block_rows, factor);
    for (; s < seqs[b].length; ++s) {
      const In* in = row_of(b, h, s);
      if (layout == PackLayout::kRows) {
        for (int d = 0; d < dim; ++d) dst[int64_t(s) * dim + d] = static_cast<T>(in[d]) * factor;
      } else {
        T* panel = dst + int64_t(s / block_rows) * dim * block_rows + s % block_rows;
        for (int d = 0; d < dim; ++d) panel[int64_t(d) * block_rows] = static_cast<T>(in[d]) * factor;
      }
    }
  });
}

// The same for the rows [row0, row0 + length) of batch entry b of a view.
template <typename T, typename In>
void pack_heads(PackedHeads<T>& packed, const TensorView& src,
                c10::ArrayRef<SequenceRows> seqs, int heads, int dim, PackLayout layout,
                int block_rows, T factor) {
  auto row_of = [&](int b, int h, int s) { return src.row<const In>(b, h, seqs[b].row0 + s); };
  pack_heads<T, In>(packed, row_of, seqs, heads, dim, layout, block_rows, factor);
}

}  // namespace flashattn::cpu
