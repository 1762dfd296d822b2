// The 16-bit operand path of the CPU kernels (kNative16): when it is taken, which kernel
// multiplies its tiles, and its operands, the caller's bf16/fp16 values never converted. B
// operands are cut into panels of kPanelWidth columns with an even number of rows; A operands
// are zero-padded row-major tiles.
//
// Why panels: the fast 16-bit products want B in VNNI order (pairs of rows interleaved): AMX's
// oneDNN brgemm in the order ATen's pack() produces, only for an even row count and at most 64
// columns at a time; the AVX-512 kernels (gemm_avx512_16bit.h) in VNNI-2 order. Every product
// of the 16-bit path therefore runs over whole, zero-padded panels, packed for the kernel the
// call uses (Gemm16Kernel, tile_gemm.h). With the row-major kernel (oneDNN's brgemm, which CPUs
// without AMX or AVX-512 take when the 16-bit path is forced) the same panels stay row-major
// (vnni = false), so one code path serves all kernels, and the tests run it with each kernel
// the machine has.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtype_dispatch.h"
#include "gemm_avx512_16bit.h"
#include "packing.h"
#include "tile_gemm.h"
#include "tiling.h"

namespace flashattn::cpu {

constexpr int kPanelWidth = 64;

inline int round_up(int value, int multiple) { return num_blocks(value, multiple) * multiple; }

// ---- Which kernel multiplies the 16-bit tiles, and whether bf16/fp16 take the 16-bit path ----

// One small product through ATen's pack() and brgemm(is_vnni) against the same product in plain
// loops, on integers that bf16/fp16 and fp32 hold exactly. The VNNI layout is private to
// oneDNN and this code had not run on a CPU with AMX when it was written, so a CPU or library
// where it does not multiply as expected falls back (with a warning), never gives wrong results.
template <typename In16>
bool amx_panels_multiply_correctly() {
  constexpr int kRows = 16, kDepth = 32;
  const auto dtype = c10::CppTypeToScalarType<In16>::value;
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
    at::native::cpublas::pack(kDepth, kPanelWidth, kPanelWidth, kPanelWidth, dtype, dtype,
                              b.data(), packed.data());
    at::native::cpublas::brgemm(kRows, kPanelWidth, kDepth, kDepth, kPanelWidth, kPanelWidth,
                                /*add_C=*/false, a.data(), packed.data(), actual.data(),
                                /*is_vnni=*/true);
    at::native::cpublas::brgemm_release(/*is_vnni=*/true);
    return actual == expected;
  } catch (const std::exception&) {
    return false;
  }
}

// Seconds per product of the bf16 dot and fma kernels and of the fp32 brgemm the kCompute path
// uses, on one hot 96 x 64 x 128 tile (a 16-bit panel product's shape), timed in alternation,
// best of 5 rounds of 16 products; once per process, on CPUs with both AVX-512 kernels and no
// AMX. The kernels are called directly (tile_gemm_16bit() would count the products).
struct HotTileSeconds {
  double bf16_dot = 0, bf16_fma = 0, fp32 = 0;
};

inline HotTileSeconds time_hot_tile_products() {
  constexpr int M = 96, N = 64, K = 128, kProducts = 16, kRounds = 5;
  std::vector<uint16_t> a16(M * K), b16(K * N);  // bf16 bits of small values, B VNNI-2 packed
  std::vector<float> a32(M * K), b32(K * N), c(M * N);
  for (int i = 0; i < M * K; ++i) a32[i] = float(i % 5 - 2) * 0.25f;
  for (int i = 0; i < K * N; ++i) b32[i] = float(i % 3 - 1) * 0.5f;
  for (int i = 0; i < M * K; ++i) a16[i] = c10::BFloat16(a32[i]).x;
  for (int i = 0; i < K * N; ++i) b16[i] = c10::BFloat16(b32[i]).x;
  auto dot = [&](bool acc) {
    avx512::gemm_bf16_dot(M, N, K, a16.data(), K, b16.data(), N, c.data(), N, acc);
  };
  auto fma = [&](bool acc) {
    avx512::gemm_bf16_fma(M, N, K, a16.data(), K, b16.data(), N, c.data(), N, acc);
  };
  auto fp32 = [&](bool acc) {
    at::native::cpublas::brgemm(M, N, K, K, N, N, acc, a32.data(), b32.data(), c.data(), false);
  };
  auto best = [&](const auto& product, double current) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kProducts; ++i) product(i > 0);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return std::min(current, elapsed.count() / kProducts);
  };
  HotTileSeconds s{1e30, 1e30, 1e30};
  for (int round = 0; round < kRounds; ++round) {  // the first round warms up too
    s.bf16_dot = best(dot, s.bf16_dot);
    s.bf16_fma = best(fma, s.bf16_fma);
    s.fp32 = best(fp32, s.fp32);
  }
  return s;
}

// time_hot_tile_products(), once per process.
inline const HotTileSeconds& hot_tile_seconds() {
  static const HotTileSeconds seconds = time_hot_tile_products();
  return seconds;
}

// What this CPU offers the 16-bit products, as far as the choices go.
struct Cpu16BitFeatures {
  bool amx = false;          // ATen packs VNNI for brgemm (AMX), and the packed products check out
  bool avx512 = false;       // AVX-512 F/BW/VL/DQ, and the fma kernel checks out (for the dtype)
  bool avx512_bf16 = false;  // AVX512-BF16, and the dot kernel checks out (bf16)
  bool avx512_fp16 = false;  // AVX512-FP16 (Sapphire Rapids and later)
  // On the hot tile (time_hot_tile_products(), bf16): vdpbf16ps at least 1.25x as fast as the
  // fma kernel, and at least 1.5x as fast as the fp32 products. The kernels are either about 2x
  // apart (AMD Zen 4/5: vdpbf16ps twice the FMA rate; Intel without AMX: half) or not, so
  // neither answer flips with noise.
  bool dot_outruns_fma = false;
  bool dot_outruns_fp32 = false;
};

// This CPU's, for dtype (bf16 or fp16); each check and the timing run once per process.
inline Cpu16BitFeatures cpu_16bit_features(c10::ScalarType dtype) {
  Cpu16BitFeatures f;
  const bool bf16 = dtype == c10::kBFloat16;
  if (at::native::cpublas::could_pack(dtype)) {
    if (bf16) {
      static const bool bf16_amx = amx_panels_multiply_correctly<c10::BFloat16>();
      f.amx = bf16_amx;
    } else {
      static const bool fp16_amx = amx_panels_multiply_correctly<c10::Half>();
      f.amx = fp16_amx;
    }
    if (!f.amx) {
      TORCH_WARN_ONCE("flashattn: this CPU offers VNNI-packed 16-bit products (AMX), but a check "
                      "of pack() + brgemm gave wrong results; bf16/fp16 attention does not use "
                      "them (slower, still exact)");
    }
  }
  f.avx512 = bf16 ? avx512::bf16_fma_works() : avx512::fp16_fma_works();
  f.avx512_bf16 = bf16 && avx512::bf16_dot_works();
  f.avx512_fp16 = f.avx512 && avx512::cpu_has_avx512_fp16();
  if (avx512::cpu_has_avx512() && !f.avx512) {
    TORCH_WARN_ONCE("flashattn: the AVX-512 16-bit tile products gave wrong results on this CPU; "
                    "they are not used");
  }
  if (f.avx512_bf16 && f.avx512 && !f.amx) {
    const HotTileSeconds& seconds = hot_tile_seconds();
    f.dot_outruns_fma = seconds.bf16_dot * 1.25 <= seconds.bf16_fma;
    f.dot_outruns_fp32 = seconds.bf16_dot * 1.5 <= seconds.fp32;
  }
  return f;
}

// The kernel the 16-bit path uses when none is forced: AMX where the CPU has it; else on
// AVX-512 the dot kernel where vdpbf16ps outruns fp32 FMAs, the fma kernel elsewhere; else
// oneDNN's row-major brgemm.
inline Gemm16Kernel default_gemm16_kernel(const Cpu16BitFeatures& f) {
  if (f.amx) return Gemm16Kernel::kAmx;
  if (f.avx512_bf16 && f.dot_outruns_fma) return Gemm16Kernel::kAvx512Dot;
  if (f.avx512) return Gemm16Kernel::kAvx512Fma;
  return Gemm16Kernel::kRowMajor;
}

// Whether bf16/fp16 attention takes the 16-bit path when nothing is forced: only where its
// products are clearly faster than the fp32 ones, as the rest of the path costs a little more
// (P and dS rounded to 16 bits, the scale applied to S): with AMX, and for bf16 where vdpbf16ps
// is 1.5x the fp32 products on the hot tile. Without either, the 16-bit path measured slower than
// the fp32 one (docs/lab/2026-11-30-avx512-bf16-16bit-kernels.md).
inline bool default_16bit_products(const Cpu16BitFeatures& f, c10::ScalarType dtype) {
  if (f.amx) return true;
  return dtype == c10::kBFloat16 && f.avx512_bf16 && f.dot_outruns_fp32;
}

inline const char* gemm16_kernel_name(Gemm16Kernel kernel) {
  switch (kernel) {
    case Gemm16Kernel::kRowMajor: return "rowmajor";
    case Gemm16Kernel::kAmx: return "amx";
    case Gemm16Kernel::kAvx512Dot: return "avx512-dot";
    case Gemm16Kernel::kAvx512Fma: return "avx512-fma";
  }
  return "?";
}

// Whether `kernel` can multiply dtype here; else why not (for the error).
inline bool gemm16_kernel_runs(Gemm16Kernel kernel, const Cpu16BitFeatures& f,
                               c10::ScalarType dtype, const char** why_not) {
  switch (kernel) {
    case Gemm16Kernel::kRowMajor: return true;
    case Gemm16Kernel::kAmx: *why_not = "AMX (ATen cannot pack VNNI panels here)"; return f.amx;
    case Gemm16Kernel::kAvx512Dot:
      *why_not = dtype == c10::kBFloat16 ? "AVX512-BF16" : "bf16 operands (it has no fp16 form)";
      return f.avx512_bf16;
    case Gemm16Kernel::kAvx512Fma: *why_not = "AVX-512 (F, BW, VL, DQ)"; return f.avx512;
  }
  return false;
}

// The kernel a 16-bit call of dtype uses: FLASHATTN_CPU_16BIT_KERNEL=rowmajor|amx|avx512-dot|
// avx512-fma forces one (avx512-dot: for bf16; fp16, which vdpbf16ps cannot multiply, then takes
// avx512-fma), an error if this CPU cannot run it, so no instruction it lacks is ever executed;
// unset or "auto": default_gemm16_kernel(). Read on every call, as the tests switch it.
inline Gemm16Kernel gemm16_kernel_for(c10::ScalarType dtype) {
  const Cpu16BitFeatures f = cpu_16bit_features(dtype);
  const char* forced = std::getenv("FLASHATTN_CPU_16BIT_KERNEL");
  if (forced == nullptr || forced[0] == '\0' || std::string(forced) == "auto")
    return default_gemm16_kernel(f);
  for (int k = 0; k < kNumGemm16Kernels; ++k) {
    auto kernel = static_cast<Gemm16Kernel>(k);
    if (std::string(forced) != gemm16_kernel_name(kernel)) continue;
    if (kernel == Gemm16Kernel::kAvx512Dot && dtype == c10::kHalf)
      kernel = Gemm16Kernel::kAvx512Fma;
    const char* why_not = "";
    TORCH_CHECK(gemm16_kernel_runs(kernel, f, dtype, &why_not), "flashattn: "
                "FLASHATTN_CPU_16BIT_KERNEL=", forced, " needs ", why_not, ", which this CPU ",
                "lacks (for ", dtype, ")");
    return kernel;
  }
  TORCH_CHECK(false, "flashattn: FLASHATTN_CPU_16BIT_KERNEL must be auto, rowmajor, amx, "
              "avx512-dot or avx512-fma (or unset), got '", forced, "'");
}

// How a kernel feeds its tile products: packed into the compute type (fp32/fp64), or bf16/fp16
// kept in 16 bits in the panels below.
enum class OperandPath { kCompute, kNative16 };

// Whether bf16/fp16 attention multiplies its tiles in 16 bits (the kNative16 operand path) or
// converts its inputs to fp32 first. FLASHATTN_CPU_16BIT_PRODUCTS=1 or 0 forces either (the tests
// run both); by default, default_16bit_products().
inline bool use_native_16bit_products(c10::ScalarType dtype) {
  const char* forced = std::getenv("FLASHATTN_CPU_16BIT_PRODUCTS");
  if (forced != nullptr && forced[0] != '\0') {
    const std::string value(forced);
    TORCH_CHECK(value == "0" || value == "1",
                "flashattn: FLASHATTN_CPU_16BIT_PRODUCTS must be 0 or 1 (or unset), got '", value,
                "'");
    return value == "1";
  }
  return default_16bit_products(cpu_16bit_features(dtype), dtype);
}

// Runs Kernel<In, path>(p, vnni).run() for an input of `dtype` on the operand path it takes:
// kNative16 for bf16/fp16 when use_native_16bit_products() says so, with B panels packed
// (vnni) for gemm16_kernel_for()'s kernel unless that is kRowMajor; else kCompute. The one place
// fwd.cpp and bwd.cpp decide. `extra` goes on to the kernel's constructor after (params, vnni).
template <template <typename, OperandPath> class Kernel, typename Params, typename... Extra>
void run_on_operand_path(const Params& p, c10::ScalarType dtype, const Extra&... extra) {
  dispatch_input_dtype(dtype, [&](auto tag) {
    using In = typename decltype(tag)::type;
    if constexpr (std::is_same_v<In, c10::BFloat16> || std::is_same_v<In, c10::Half>) {
      if (use_native_16bit_products(dtype)) {
        const Gemm16Kernel kernel = gemm16_kernel_for(dtype);
        const bool packed = kernel != Gemm16Kernel::kRowMajor;
        if (packed) packed_gemm16_kernel_of<In>().store(kernel);
        Kernel<In, OperandPath::kNative16>(p, packed, extra...).run();
        return;
      }
    }
    Kernel<In, OperandPath::kCompute>(p, /*vnni=*/false, extra...).run();
  });
}

// Rearranges a row-major [rows][kPanelWidth] B panel (rows even) into the order the current
// call's packed kernel takes (tile_gemm.h): ATen's pack() for AMX, VNNI-2 for the AVX-512
// kernels. `in` and `out` must not overlap.
template <typename In16>
void pack_vnni_panel(const In16* in, In16* out, int rows) {
  if (packed_gemm16_kernel_of<In16>().load(std::memory_order_relaxed) == Gemm16Kernel::kAmx) {
    const auto dtype = c10::CppTypeToScalarType<In16>::value;
    at::native::cpublas::pack(rows, kPanelWidth, kPanelWidth, kPanelWidth, dtype, dtype, in, out);
    return;
  }
  avx512::pack_vnni2(reinterpret_cast<const uint16_t*>(in), kPanelWidth, rows, kPanelWidth,
                     reinterpret_cast<uint16_t*>(out), kPanelWidth);
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
// VNNI-packs it when `vnni`; in parallel over heads. Into `panels`, reusing the memory it holds
// when large enough.
template <typename In16, typename Fill>
void build_panels(Panels16<In16>& panels, BlockLayout layout, int panels_per_block,
                  int panel_rows, int panel_width, bool vnni, const Fill& fill) {
  TORCH_CHECK(!vnni || (panel_width == kPanelWidth && panel_rows % 2 == 0),
              "flashattn: internal error: VNNI panels must be 64 wide with an even row count");
  panels.layout = std::move(layout);
  panels.panel_rows = panel_rows;
  panels.panel_width = panel_width;
  panels.panels_per_block = panels_per_block;
  panels.data = alloc_workspace<In16>(
      panels.storage, panels.layout.total_blocks * panels_per_block * panels.panel_elements());
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
void pack_key_panels(Panels16<In16>& into, const KeyOf& key_of,
                     c10::ArrayRef<SequenceRows> seqs, int heads, int dim, int key_block,
                     bool vnni) {
  build_panels<In16>(
      into, block_layout(seqs, heads, key_block), key_block / kPanelWidth, round_up(dim, 2),
      kPanelWidth, vnni, [&](int b, int h, int block, int index, In16* panel) {
        fill_key_panel(
            [&](int j) { return key_of(b, h, j); }, seqs[b].length, dim, key_block, block,
            index, panel);
      });
}

template <typename In16>
void pack_key_panels(Panels16<In16>& into, const TensorView& keys,
                     c10::ArrayRef<SequenceRows> seqs, int heads, int dim, int key_block,
                     bool vnni) {
  auto key_of = [&](int b, int h, int j) { return keys.row<const In16>(b, h, seqs[b].row0 + j); };
  pack_key_panels<In16>(into, key_of, seqs, heads, dim, key_block, vnni);
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
void pack_value_panels(Panels16<In16>& into, const ValueOf& value_of,
                       c10::ArrayRef<SequenceRows> seqs, int heads, int dim, int key_block,
                       bool vnni) {
  build_panels<In16>(
      into, block_layout(seqs, heads, key_block), num_blocks(dim, kPanelWidth), key_block,
      kPanelWidth, vnni, [&](int b, int h, int block, int index, In16* panel) {
        fill_value_panel(
            [&](int j) { return value_of(b, h, j); }, seqs[b].length, dim, key_block, block,
            index, panel);
      });
}

template <typename In16>
void pack_value_panels(Panels16<In16>& into, const TensorView& values,
                       c10::ArrayRef<SequenceRows> seqs, int heads, int dim, int key_block,
                       bool vnni) {
  auto value_of = [&](int b, int h, int j) {
    return values.row<const In16>(b, h, seqs[b].row0 + j);
  };
  pack_value_panels<In16>(into, value_of, seqs, heads, dim, key_block, vnni);
}

// A operands (row-major): block kb is rows [kb·block_rows, +block_rows) of `src` as a
// [block_rows][dim rounded up to even] tile, the K of a product with pack_key_panels' panels.
template <typename In16>
void pack_row_tiles(Panels16<In16>& into, const TensorView& src,
                    c10::ArrayRef<SequenceRows> seqs, int heads, int dim, int block_rows) {
  const int width = round_up(dim, 2);
  build_panels<In16>(
      into, block_layout(seqs, heads, block_rows), 1, block_rows, width, /*vnni=*/false,
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
void pack_transposed_tiles(Panels16<In16>& into, const TensorView& src,
                           c10::ArrayRef<SequenceRows> seqs, int heads, int dim,
                           int block_rows) {
  build_panels<In16>(
      into, block_layout(seqs, heads, block_rows), 1, dim, block_rows, /*vnni=*/false,
      [&](int b, int h, int block, int, In16* tile) {
        const int rows = std::min(block_rows, seqs[b].length - block * block_rows);
        for (int j = 0; j < rows; ++j) {
          const In16* row = src.row<const In16>(b, h, seqs[b].row0 + block * block_rows + j);
          for (int d = 0; d < dim; ++d) tile[int64_t(d) * block_rows + j] = row[d];
        }
      });
}

}  // namespace flashattn::cpu
