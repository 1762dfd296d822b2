// The 16-bit operand path of the CPU kernels (kNative16): when it is taken, and its operands,
// the caller's bf16/fp16 values never converted. B operands are cut into panels of
// kPanelWidth columns with an even number of rows; A operands are zero-padded row-major tiles.
//
// Why panels: on CPUs with AMX, oneDNN's brgemm wants B in VNNI order (pairs of rows
// interleaved), which ATen's pack() produces only for an even row count and at most 64 columns
// at a time. Every product of the 16-bit path therefore runs over whole, zero-padded panels. On
// other CPUs the same panels are used row-major (vnni = false), so one code path, and the tests
// that run it on any machine, serve both.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtype_dispatch.h"
#include "packing.h"
#include "tile_gemm.h"
#include "tiling.h"

namespace flashattn::cpu {

constexpr int kPanelWidth = 64;

inline int round_up(int value, int multiple) { return num_blocks(value, multiple) * multiple; }

template <typename In16>
void pack_vnni_panel(const In16* in, In16* out, int rows);

// One small product through pack() and brgemm(is_vnni) against the same product in plain
// loops, on integers that bf16/fp16 and fp32 hold exactly. The VNNI layout is private to
// oneDNN and this code had not run on a CPU with AMX when it was written, so a CPU or library
// where it does not multiply as expected falls back (with a warning), never gives wrong results.
template <typename In16>
bool vnni_panels_multiply_correctly() {
  constexpr int kRows = 16, kDepth = 32;
  try {
    std::vector<In16> a(kRows * kDepth), b(kDepth * kPanelWidth), packed(b.size());
    std::vector<float> expected(kRows * kPanelWidth, 0.f), actual(expected.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = In16(float(int(i * 7 % 5) - 2));
    for (size_t i = 0; i < b.size(); ++i) b[i] = In16(float(int(i * 3 % 7) - 3));
    for (int m = 0; m < kRows; ++m)
      for (int k = 0; k < kDepth; ++k)
        for (int n = 0; n < kPanelWidth; ++n)
          expected[m * kPanelWidth + n] +=
              float(a[m * kDepth + k]) * float(b[k * kPanelWidth + n]);
    pack_vnni_panel(b.data(), packed.data(), kDepth);
    tile_gemm(kRows, kPanelWidth, kDepth, a.data(), kDepth, packed.data(), kPanelWidth,
              actual.data(), kPanelWidth, /*accumulate=*/false, /*vnni=*/true);
    release_tile_gemm(/*vnni=*/true);
    return actual == expected;
  } catch (const std::exception&) {
    return false;
  }
}

// Whether this CPU takes 16-bit B operands in VNNI order (AMX and AVX-512 BF16/FP16 machines)
// and they multiply correctly; checked once per dtype.
inline bool cpu_packs_vnni(c10::ScalarType dtype) {
  if (!at::native::cpublas::could_pack(dtype)) return false;
  bool works = false;
  if (dtype == c10::kBFloat16) {
    static const bool bf16_works = vnni_panels_multiply_correctly<c10::BFloat16>();
    works = bf16_works;
  } else if (dtype == c10::kHalf) {
    static const bool fp16_works = vnni_panels_multiply_correctly<c10::Half>();
    works = fp16_works;
  }
  if (!works)
    TORCH_WARN_ONCE("flashattn: this CPU offers VNNI-packed 16-bit products, but a check of "
                    "pack() + brgemm gave wrong results; bf16/fp16 attention uses fp32 products "
                    "instead (slower, still exact)");
  return works;
}

// How a kernel feeds its tile products: packed into the compute type (fp32/fp64), or bf16/fp16
// kept in 16 bits in the panels below.
enum class OperandPath { kCompute, kNative16 };

// Whether bf16/fp16 attention multiplies its tiles in 16 bits (the kNative16 operand path) or
// converts its inputs to fp32 first. FLASHATTN_CPU_16BIT_PRODUCTS=1 or 0 forces either (the tests
// run both); by default the 16-bit path is taken where the CPU packs VNNI, i.e. has native
// 16-bit dot products, the only place it is faster.
inline bool use_native_16bit_products(c10::ScalarType dtype) {
  const char* forced = std::getenv("FLASHATTN_CPU_16BIT_PRODUCTS");
  if (forced != nullptr && forced[0] != '\0') {
    const std::string value(forced);
    TORCH_CHECK(value == "0" || value == "1",
                "flashattn: FLASHATTN_CPU_16BIT_PRODUCTS must be 0 or 1 (or unset), got '", value,
                "'");
    return value == "1";
  }
  return cpu_packs_vnni(dtype);
}

// Runs Kernel<In, path>(p, vnni).run() for an input of `dtype` on the operand path it takes:
// kNative16 (VNNI panels where the CPU packs them) for bf16/fp16 when
// use_native_16bit_products() says so, else kCompute. The one place fwd.cpp and bwd.cpp decide.
// `extra` goes on to the kernel's constructor after (params, vnni).
template <template <typename, OperandPath> class Kernel, typename Params, typename... Extra>
void run_on_operand_path(const Params& p, c10::ScalarType dtype, const Extra&... extra) {
  dispatch_input_dtype(dtype, [&](auto tag) {
    using In = typename decltype(tag)::type;
    if constexpr (std::is_same_v<In, c10::BFloat16> || std::is_same_v<In, c10::Half>) {
      if (use_native_16bit_products(dtype)) {
        Kernel<In, OperandPath::kNative16>(p, cpu_packs_vnni(dtype), extra...).run();
        return;
      }
    }
    Kernel<In, OperandPath::kCompute>(p, /*vnni=*/false, extra...).run();
  });
}

// Rearranges a row-major [rows][kPanelWidth] B panel into the VNNI order brgemm takes with
// is_vnni = true; rows even. `in` and `out` must not overlap.
template <typename In16>
void pack_vnni_panel(const In16* in, In16* out, int rows) {
  const auto dtype = c10::CppTypeToScalarType<In16>::value;
  at::native::cpublas::pack(rows, kPanelWidth, kPanelWidth, kPanelWidth, dtype, dtype, in, out);
}

// panels[(b, h)][block][index], each [panel_rows][panel_width], row-major or VNNI-packed, with
// the blocks of each (batch entry, head) placed by a BlockLayout (sequences may differ in
// length). B operands are kPanelWidth wide with an even row count; A operands (never VNNI) may
// be any shape.
template <typename In16>
struct Panels16 {
  at::Tensor storage;
  const In16* data = nullptr;
  BlockLayout layout;
  int panel_rows = 0;
  int panel_width = kPanelWidth;
  int panels_per_block = 0;

  int64_t panel_elements() const { return int64_t(panel_rows) * panel_width; }
  const In16* panel(int b, int h, int block, int index) const {
    return data + ((layout.first(b, h) + block) * panels_per_block + index) * panel_elements();
  }
};

// Calls fill(b, h, block, index, panel) for every panel, on a zeroed row-major panel, then
// VNNI-packs it when `vnni`; in parallel over heads.
template <typename In16, typename Fill>
Panels16<In16> build_panels(BlockLayout layout, int panels_per_block, int panel_rows,
                            int panel_width, bool vnni, const Fill& fill) {
  TORCH_CHECK(!vnni || (panel_width == kPanelWidth && panel_rows % 2 == 0),
              "flashattn: internal error: VNNI panels must be 64 wide with an even row count");
  Panels16<In16> panels;
  panels.layout = std::move(layout);
  panels.panel_rows = panel_rows;
  panels.panel_width = panel_width;
  panels.panels_per_block = panels_per_block;
  panels.storage =
      at::empty({panels.layout.total_blocks * panels_per_block * panels.panel_elements()},
                at::TensorOptions().dtype(c10::CppTypeToScalarType<In16>::value));
  In16* data = panels.storage.template data_ptr<In16>();
  panels.data = data;
  const BlockLayout& placed = panels.layout;
  at::parallel_for(0, placed.num_heads(), 1, [&](int64_t begin, int64_t end) {
    std::vector<In16> row_major(vnni ? panels.panel_elements() : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int b = static_cast<int>(bh / placed.heads), h = static_cast<int>(bh % placed.heads);
      for (int block = 0; block < placed.blocks[b]; ++block)
        for (int index = 0; index < panels_per_block; ++index) {
          In16* dst = const_cast<In16*>(panels.panel(b, h, block, index));
          In16* staging = vnni ? row_major.data() : dst;
          std::fill_n(staging, panels.panel_elements(), In16(0.f));  // padding must be 0, not NaN
          fill(b, h, block, index, staging);
          if (vnni) pack_vnni_panel(staging, dst, panel_rows);
        }
    }
  });
  return panels;
}

// Kᵀ for S = Q Kᵀ: block kb holds keys [kb·key_block, +key_block) as key_block / kPanelWidth
// panels; panel p is [dim rounded up to even][kPanelWidth], column j = key kb·key_block + p·64 + j.
// fill_key_panel writes panel `index` of block `block` of one sequence of `length` keys, key j
// at key_of(j), into a zeroed row-major panel.
template <typename In16, typename KeyOf>
void fill_key_panel(const KeyOf& key_of, int length, int dim, int key_block, int block, int index,
                    In16* panel) {
  const int first = block * key_block + index * kPanelWidth;
  const int count = std::clamp(length - first, 0, kPanelWidth);
  for (int j = 0; j < count; ++j) {
    const In16* key = key_of(first + j);
    for (int d = 0; d < dim; ++d) panel[int64_t(d) * kPanelWidth + j] = key[d];
  }
}

// key_of(b, h, j): key j of sequence b, head h.
template <typename In16, typename KeyOf>
Panels16<In16> pack_key_panels(const KeyOf& key_of, const std::vector<SequenceRows>& seqs,
                               int heads, int dim, int key_block, bool vnni) {
  return build_panels<In16>(
      block_layout(seqs, heads, key_block), key_block / kPanelWidth, round_up(dim, 2),
      kPanelWidth, vnni, [&](int b, int h, int block, int index, In16* panel) {
        fill_key_panel(
            [&](int j) { return key_of(b, h, j); }, seqs[b].length, dim, key_block, block,
            index, panel);
      });
}

template <typename In16>
Panels16<In16> pack_key_panels(const TensorView& keys, const std::vector<SequenceRows>& seqs,
                               int heads, int dim, int key_block, bool vnni) {
  auto key_of = [&](int b, int h, int j) { return keys.row<const In16>(b, h, seqs[b].row0 + j); };
  return pack_key_panels<In16>(key_of, seqs, heads, dim, key_block, vnni);
}

// V for O += P V: block kb holds rows [kb·key_block, +key_block) (key_block is even) as
// ceil(dim / 64) panels; panel c is [key_block][kPanelWidth], columns c·64 ... c·64 + 63 of V.
// fill_value_panel writes one, as fill_key_panel.
template <typename In16, typename ValueOf>
void fill_value_panel(const ValueOf& value_of, int length, int dim, int key_block, int block,
                      int index, In16* panel) {
  const int rows = std::min(key_block, length - block * key_block);
  const int first_col = index * kPanelWidth;
  const int cols = std::min(kPanelWidth, dim - first_col);
  for (int j = 0; j < rows; ++j)
    std::copy_n(value_of(block * key_block + j) + first_col, cols,
                panel + int64_t(j) * kPanelWidth);
}

template <typename In16, typename ValueOf>
Panels16<In16> pack_value_panels(const ValueOf& value_of, const std::vector<SequenceRows>& seqs,
                                 int heads, int dim, int key_block, bool vnni) {
  return build_panels<In16>(
      block_layout(seqs, heads, key_block), num_blocks(dim, kPanelWidth), key_block, kPanelWidth,
      vnni, [&](int b, int h, int block, int index, In16* panel) {
        fill_value_panel(
            [&](int j) { return value_of(b, h, j); }, seqs[b].length, dim, key_block, block,
            index, panel);
      });
}

template <typename In16>
Panels16<In16> pack_value_panels(const TensorView& values, const std::vector<SequenceRows>& seqs,
                                 int heads, int dim, int key_block, bool vnni) {
  auto value_of = [&](int b, int h, int j) {
    return values.row<const In16>(b, h, seqs[b].row0 + j);
  };
  return pack_value_panels<In16>(value_of, seqs, heads, dim, key_block, vnni);
}

// A operands (row-major): block kb is rows [kb·block_rows, +block_rows) of `src` as a
// [block_rows][dim rounded up to even] tile, the K of a product with pack_key_panels' panels.
template <typename In16>
Panels16<In16> pack_row_tiles(const TensorView& src, const std::vector<SequenceRows>& seqs,
                              int heads, int dim, int block_rows) {
  const int width = round_up(dim, 2);
  return build_panels<In16>(
      block_layout(seqs, heads, block_rows), 1, block_rows, width, /*vnni=*/false,
      [&](int b, int h, int block, int, In16* tile) {
        const int rows = std::min(block_rows, seqs[b].length - block * block_rows);
        for (int j = 0; j < rows; ++j)
          std::copy_n(src.row<const In16>(b, h, seqs[b].row0 + block * block_rows + j), dim,
                      tile + int64_t(j) * width);
      });
}

// A operands (row-major): block kb is the transpose of rows [kb·block_rows, +block_rows) of
// `src`, a [dim][block_rows] tile with zero columns past the last row.
template <typename In16>
Panels16<In16> pack_transposed_tiles(const TensorView& src, const std::vector<SequenceRows>& seqs,
                                     int heads, int dim, int block_rows) {
  return build_panels<In16>(
      block_layout(seqs, heads, block_rows), 1, dim, block_rows, /*vnni=*/false,
      [&](int b, int h, int block, int, In16* tile) {
        const int rows = std::min(block_rows, seqs[b].length - block * block_rows);
        for (int j = 0; j < rows; ++j) {
          const In16* row = src.row<const In16>(b, h, seqs[b].row0 + block * block_rows + j);
          for (int d = 0; d < dim; ++d) tile[int64_t(d) * block_rows + j] = row[d];
        }
      });
}

}  // namespace flashattn::cpu
