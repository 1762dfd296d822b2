// torch.ops.flashattn_internal: what `python -m flashattn.bench` reports beside the attention:
// the 16-bit path a call would take, and the rate of the forward's own tile products on a hot
// tile (the ceiling). Not an API: names and arguments may change. The test-only ops (each 16-bit
// kernel called by name, the CPU features, the kernels' counters) are in tests/cpu_test_ext.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "panels16.h"
#include "tile_gemm.h"

namespace flashattn::cpu {
namespace {

void check_16bit(c10::ScalarType dtype) {
  TORCH_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf,
              "flashattn: the 16-bit tile products take bfloat16 or float16, not ", dtype);
}

// The kernel and path a call of dtype would take now (the environment included): (kernel name,
// whether it takes 16-bit products at all).
std::tuple<std::string, bool> path_for(c10::ScalarType dtype) {
  check_16bit(dtype);
  return {gemm16_kernel_name(gemm16_kernel_for(dtype)), use_native_16bit_products(dtype)};
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
  m.def("cpu_16bit_path(ScalarType dtype) -> (str, bool)", &path_for);
  m.def("cpu_tile_products_gflops(ScalarType dtype, int head_dim, str path, float seconds) -> "
        "(float, str)",
        &tile_products_gflops);
}
