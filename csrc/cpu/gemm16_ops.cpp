// torch.ops.flashattn_internal: the CPU tile products' kernel choice, made visible, and each
// kernel called directly, for tests/test_cpu_gemm_16bit.py and tests/test_cpu_16bit_products.py;
// and the rate of the forward's own tile products on a hot tile, the ceiling that
// `python -m flashattn.bench` reports; and how many heads' packed operands the last forward held
// at once (tests/test_memory.py). Not an API: names and arguments may change.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gemm_avx512_16bit.h"
#include "kernels.h"
#include "panels16.h"
#include "row_products.h"
#include "tile_gemm.h"

namespace flashattn::cpu {
namespace {

Gemm16Kernel kernel_named(const std::string& name) {
  for (int k = 0; k < kNumGemm16Kernels; ++k)
    if (name == gemm16_kernel_name(static_cast<Gemm16Kernel>(k)))
      return static_cast<Gemm16Kernel>(k);
  TORCH_CHECK(false, "flashattn: no 16-bit tile kernel named '", name, "'");
}

void check_16bit(c10::ScalarType dtype) {
  TORCH_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf,
              "flashattn: the 16-bit tile products take bfloat16 or float16, not ", dtype);
}

// c[M, N] (+)= a[M, K] · B with `kernel`, B given as `b`: for rowmajor [K, ldb], else packed for
// the kernel (pack_b below). a and c row-major with a contiguous last dim.
void gemm16(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const std::string& name,
            bool accumulate) {
  check_16bit(a.scalar_type());
  TORCH_CHECK(b.scalar_type() == a.scalar_type() && c.scalar_type() == at::kFloat &&
                  a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(0) == c.size(0) &&
                  a.stride(1) == 1 && b.is_contiguous() && c.stride(1) == 1,
              "flashattn: gemm16 takes a [M, K] and c [M, N] (fp32) row-major, b contiguous");
  const Gemm16Kernel kernel = kernel_named(name);
  const char* why_not = "";
  TORCH_CHECK(gemm16_kernel_runs(kernel, cpu_16bit_features(a.scalar_type()), a.scalar_type(),
                                 &why_not),
              "flashattn: the ", name, " kernel needs ", why_not, ", which this CPU lacks");
  const int64_t M = a.size(0), K = a.size(1), N = c.size(1);
  const bool packed = kernel != Gemm16Kernel::kRowMajor;
  // Packed: [ceil(K/2), 2·ldb]; row-major: [K, ldb].
  const int64_t ldb = packed ? b.size(1) / 2 : b.size(1);
  TORCH_CHECK(ldb >= N && b.size(0) == (packed ? (K + 1) / 2 : K),
              "flashattn: gemm16: b has the wrong shape for K = ", K, ", N = ", N);
  // oneDNN's AMX brgemm on an odd K ran into an illegal instruction (SIGILL) on an AMX-BF16
  // Xeon; the kernels only ever give it whole row pairs (panels16.h pads K to even).
  TORCH_CHECK(kernel != Gemm16Kernel::kAmx || K % 2 == 0,
              "flashattn: gemm16: the amx kernel takes an even K (its VNNI panels hold row "
              "pairs), got K = ", K);
  dispatch_input_dtype(a.scalar_type(), [&](auto tag) {
    using In = typename decltype(tag)::type;
    if constexpr (std::is_same_v<In, c10::BFloat16> || std::is_same_v<In, c10::Half>) {
      tile_gemm_16bit(kernel, M, N, K, a.data_ptr<In>(), a.stride(0), b.data_ptr<In>(), ldb,
                      c.data_ptr<float>(), c.stride(0), accumulate);
      if (kernel == Gemm16Kernel::kAmx) at::native::cpublas::brgemm_release(true);
    }
  });
}

// b [K, N] (16-bit, contiguous) in VNNI-2 order with pair-row stride 2·ldb: [ceil(K/2), 2·ldb].
at::Tensor pack_vnni2(const at::Tensor& b, int64_t ldb) {
  check_16bit(b.scalar_type());
  TORCH_CHECK(b.dim() == 2 && b.is_contiguous() && ldb >= b.size(1),
              "flashattn: pack_vnni2 takes a contiguous [K, N] and ldb >= N");
  const int64_t K = b.size(0), N = b.size(1);
  at::Tensor out = at::full({(K + 1) / 2, 2 * ldb}, -1.0, b.options());  // padding stays -1
  avx512::pack_vnni2(reinterpret_cast<const uint16_t*>(b.data_ptr()), N, K, N,
                     reinterpret_cast<uint16_t*>(out.data_ptr()), ldb);
  return out;
}

// The kernel and path a call of dtype would take now (the environment included): (kernel name,
// whether it takes 16-bit products at all).
std::tuple<std::string, bool> path_for(c10::ScalarType dtype) {
  check_16bit(dtype);
  return {gemm16_kernel_name(gemm16_kernel_for(dtype)), use_native_16bit_products(dtype)};
}

// This CPU's features as the choices see them, for dtype.
std::tuple<bool, bool, bool, bool, bool, bool> features_of(c10::ScalarType dtype) {
  check_16bit(dtype);
  const Cpu16BitFeatures f = cpu_16bit_features(dtype);
  return {f.amx, f.avx512, f.avx512_bf16, f.avx512_fp16, f.dot_outruns_fma, f.dot_outruns_fp32};
}

// The default choices on a CPU with the given features: (kernel name, 16-bit products by
// default).
std::tuple<std::string, bool> choice_for(bool amx, bool avx512, bool avx512_bf16,
                                         bool avx512_fp16, bool dot_outruns_fma,
                                         bool dot_outruns_fp32, c10::ScalarType dtype) {
  check_16bit(dtype);
  const Cpu16BitFeatures f{amx, avx512, avx512_bf16, avx512_fp16, dot_outruns_fma,
                           dot_outruns_fp32};
  return {gemm16_kernel_name(default_gemm16_kernel(f)), default_16bit_products(f, dtype)};
}

// The timings behind dot_outruns_fma / dot_outruns_fp32 (panels16.h), in seconds per product:
// (bf16 dot, bf16 fma, fp32 brgemm); all 0 where they are not timed (no AVX512-BF16, or AMX).
std::tuple<double, double, double> hot_tile_seconds_of() {
  const Cpu16BitFeatures f = cpu_16bit_features(c10::kBFloat16);
  if (!(f.avx512_bf16 && f.avx512 && !f.amx)) return {0.0, 0.0, 0.0};
  const HotTileSeconds& s = hot_tile_seconds();
  return {s.bf16_dot, s.bf16_fma, s.fp32};
}

int64_t products_run(const std::string& name) {
  return gemm16_products[static_cast<int>(kernel_named(name))].load();
}

// ---- The ceiling: the forward's tile products on a hot tile ---------------------------------

constexpr int kTileRows = 128, kTileKeys = 128;  // fwd.cpp's kQueryBlock, kKeyBlock

template <typename T>
void fill_values(std::vector<T>& v, int seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = T(0.25f * std::sin(float(i * 7 + seed)));
}

// One key block of the forward's products, as fwd.cpp makes them, over and over on the same
// operands (so in cache) for `seconds` after a warm-up, on each of the threads at once. Returns
// the FLOP rate of all threads together (the sum of each thread's median, time_steps()).
template <typename Step>
double threads_rate(double flops_per_step, double seconds, const Step& make_and_run) {
  const int threads = at::get_num_threads();
  std::vector<double> rate(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) rate[t] = make_and_run(flops_per_step, seconds);
  });
  double total = 0;
  for (double r : rate) total += r;
  return total;
}

// The median rate of `step` over windows of about 20 ms for `seconds` after a warm-up: a median,
// as the bench's times are, so that on a machine shared with other jobs the ceiling and the
// attention it is held against see the same kind of disturbance.
template <typename Run>
double time_steps(double flops_per_step, double seconds, const Run& step) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 4; ++i) step();  // warm-up: caches, oneDNN's JIT
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<double> rates;
  do {
    const auto start = Clock::now();
    int64_t steps = 0;
    double elapsed = 0;
    do {
      for (int i = 0; i < 4; ++i) step();
      steps += 4;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < 0.02);
    rates.push_back(flops_per_step * double(steps) / elapsed);
  } while (Clock::now() < end);
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

// fp32: S = Q Kjᵀ (128 x 128 x d), O += P Vj (128 x d x 128), fwd.cpp's kCompute products.
double fp32_rate(int d, double seconds) {
  const double flops = 2.0 * 2.0 * kTileRows * kTileKeys * d;
  return threads_rate(flops, seconds, [d](double f, double s) {
    std::vector<float> q(kTileRows * d), kt(d * kTileKeys), v(kTileKeys * d),
        scores(kTileRows * kTileKeys), out(kTileRows * d, 0.f);
    fill_values(q, 1), fill_values(kt, 2), fill_values(v, 3), fill_values(scores, 4);
    const double rate = time_steps(f, s, [&] {
      tile_gemm(kTileRows, kTileKeys, d, q.data(), d, kt.data(), kTileKeys, scores.data(),
                kTileKeys, false);
      tile_gemm(kTileRows, d, kTileKeys, scores.data(), kTileKeys, v.data(), d, out.data(), d,
                true);
    });
    release_tile_gemm(false);
    return rate;
  });
}

// 16-bit: fwd.cpp's kNative16 products, panel by panel, with `kernel`.
template <typename In16>
double rate_16bit(int d, double seconds, Gemm16Kernel kernel) {
  const bool packed = kernel != Gemm16Kernel::kRowMajor;
  if (packed) packed_gemm16_kernel_of<In16>().store(kernel);
  const int gemm_dim = round_up(d, 2), value_panels = num_blocks(d, kPanelWidth);
  const int out_stride = value_panels * kPanelWidth;
  const double flops = 2.0 * 2.0 * kTileRows * kTileKeys * d;
  return threads_rate(flops, seconds, [&](double f, double s) {
    std::vector<In16> q(kTileRows * gemm_dim), probs(kTileRows * kTileKeys);
    std::vector<In16> k_panels(2 * gemm_dim * kPanelWidth), v_panels(value_panels * kTileKeys *
                                                                     kPanelWidth);
    fill_values(q, 1), fill_values(k_panels, 2), fill_values(v_panels, 3), fill_values(probs, 4);
    if (packed) {  // pack each panel as build_panels() does
      std::vector<In16> row_major;
      for (int p = 0; p < 2; ++p) {
        In16* panel = k_panels.data() + p * gemm_dim * kPanelWidth;
        row_major.assign(panel, panel + gemm_dim * kPanelWidth);
        pack_vnni_panel(row_major.data(), panel, gemm_dim);
      }
      for (int p = 0; p < value_panels; ++p) {
        In16* panel = v_panels.data() + p * kTileKeys * kPanelWidth;
        row_major.assign(panel, panel + kTileKeys * kPanelWidth);
        pack_vnni_panel(row_major.data(), panel, kTileKeys);
      }
    }
    std::vector<float> scores(kTileRows * kTileKeys), out(kTileRows * out_stride, 0.f);
    const double rate = time_steps(f, s, [&] {
      for (int p = 0; p < 2; ++p)
        tile_gemm(kTileRows, kPanelWidth, gemm_dim, q.data(), gemm_dim,
                  k_panels.data() + p * gemm_dim * kPanelWidth, kPanelWidth,
                  scores.data() + p * kPanelWidth, kTileKeys, false, packed);
      for (int p = 0; p < value_panels; ++p)
        tile_gemm(kTileRows, kPanelWidth, kTileKeys, probs.data(), kTileKeys,
                  v_panels.data() + p * kTileKeys * kPanelWidth, kPanelWidth,
                  out.data() + p * kPanelWidth, out_stride, true, packed);
    });
    release_tile_gemm(packed);
    return rate;
  });
}

// GFLOP/s of the forward's tile products at head dim d on a hot tile, all threads at once, and
// what ran: path "fp32" (the kCompute products), "16bit" (the kNative16 products with the
// kernel a 16-bit call of dtype takes now), or "auto" (whichever a call of dtype takes now).
std::tuple<double, std::string> tile_products_gflops(c10::ScalarType dtype, int64_t head_dim,
                                                     const std::string& path, double seconds) {
  TORCH_CHECK(head_dim > 0 && seconds > 0, "flashattn: head_dim and seconds must be positive");
  TORCH_CHECK(path == "auto" || path == "fp32" || path == "16bit",
              "flashattn: path must be auto, fp32 or 16bit, got '", path, "'");
  const bool is16 = dtype == c10::kBFloat16 || dtype == c10::kHalf;
  TORCH_CHECK(is16 || dtype == c10::kFloat, "flashattn: tile_products_gflops takes float32, "
              "bfloat16 or float16, not ", dtype);
  TORCH_CHECK(is16 || path != "16bit", "flashattn: float32 has no 16-bit products");
  const bool native16 = path == "16bit" || (path == "auto" && is16 &&
                                            use_native_16bit_products(dtype));
  const int d = static_cast<int>(head_dim);
  if (!native16) return {fp32_rate(d, seconds) / 1e9, "fp32 brgemm"};
  const Gemm16Kernel kernel = gemm16_kernel_for(dtype);
  const double rate = dtype == c10::kBFloat16 ? rate_16bit<c10::BFloat16>(d, seconds, kernel)
                                              : rate_16bit<c10::Half>(d, seconds, kernel);
  return {rate / 1e9, std::string(dtype == c10::kBFloat16 ? "bf16 " : "fp16 ") +
                          gemm16_kernel_name(kernel)};
}

}  // namespace
}  // namespace flashattn::cpu

TORCH_LIBRARY(flashattn_internal, m) {
  using namespace flashattn::cpu;
  m.def("cpu_gemm16(Tensor a, Tensor b, Tensor(a!) c, str kernel, bool accumulate) -> ()",
        &gemm16);
  m.def("cpu_pack_vnni2(Tensor b, int ldb) -> Tensor", &pack_vnni2);
  m.def("cpu_16bit_path(ScalarType dtype) -> (str, bool)", &path_for);
  m.def("cpu_16bit_features(ScalarType dtype) -> (bool, bool, bool, bool, bool, bool)",
        &features_of);
  m.def("cpu_16bit_choice(bool amx, bool avx512, bool avx512_bf16, bool avx512_fp16, "
        "bool dot_outruns_fma, bool dot_outruns_fp32, ScalarType dtype) -> (str, bool)",
        &choice_for);
  m.def("cpu_16bit_products_run(str kernel) -> int", &products_run);
  m.def("cpu_bf16_row_products_run() -> int", &bf16_row_products_run);
  m.def("cpu_bf16_query_lanes_run() -> int", &bf16_query_lanes_run);
  m.def("cpu_16bit_hot_tile_seconds() -> (float, float, float)", &hot_tile_seconds_of);
  m.def("cpu_fwd_packed_heads_peak() -> int", &fwd_packed_heads_peak);
  m.def("cpu_bwd_packed_heads_peak() -> int", &bwd_packed_heads_peak);
  m.def("cpu_tile_products_gflops(ScalarType dtype, int head_dim, str path, float seconds) -> "
        "(float, str)",
        &tile_products_gflops);
}
