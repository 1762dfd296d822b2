// The CPU kernels' fp32 softmax arithmetic against double precision: fast_exp (scalar and
// vector), and the tile functions as the kernels call them, through the clone the loader picked
// for this CPU (AVX-512, AVX2 or baseline). Exits non-zero and says what differs on failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "cpu/fast_exp.h"
#include "cpu/softmax_vec.h"

using namespace flashattn::cpu;

namespace {

int failures = 0;

void expect(bool ok, const char* what, double got, double want) {
  if (ok) return;
  if (++failures <= 20) std::printf("FAIL %s: got %.9g, expected %.9g\n", what, got, want);
}

double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(got - want) / ulp;
}

void check_fast_exp() {
  constexpr double kMaxUlps = 1.3;  // measured 1.26 (fast_exp.h)
  double worst_scalar = 0, worst_vector = 0;
  // Every 2^-14 over the range where exp is a normal float, and its ends.
  for (double x = -87.33; x <= 0.0; x += 1.0 / 16384) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    worst_scalar = std::max(worst_scalar, ulps(fast_exp(xf), want));
    worst_vector = std::max(worst_vector, ulps(fast_exp(splat(xf))[3], want));
  }
  expect(worst_scalar <= kMaxUlps, "fast_exp(float) worst ulps", worst_scalar, kMaxUlps);
  expect(worst_vector <= kMaxUlps, "fast_exp(VecF) worst ulps", worst_vector, kMaxUlps);
  expect(fast_exp(0.f) == 1.f, "fast_exp(0)", fast_exp(0.f), 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect(std::isnan(fast_exp(nan)) && std::isnan(fast_exp(splat(nan))[0]), "fast_exp(NaN)",
         fast_exp(nan), nan);
  for (float x : {-inf, -1e30f, -1000.f, -88.03f, -88.1f})
    expect(fast_exp(x) == 0.f && fast_exp(splat(x))[0] == 0.f, "fast_exp(x <= -127 ln2) == 0",
           fast_exp(x), x);
}

// One forward online-softmax step on a tile with awkward widths, masked entries and a row
// that sees no key, twice in a row (the second step rescales the first's state).
void check_online_softmax_tile(int cols) {
  const int rows = 5, ld = cols + 3, dim = 11;
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 gen(cols);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> row_max(rows, -inf), row_sum(rows, 0.f), out(rows * dim);
  std::vector<double> ref_max(rows, -inf), ref_sum(rows, 0.0), ref_out(rows * dim);
  for (int i = 0; i < rows * dim; ++i) ref_out[i] = out[i] = normal(gen);
  for (int step = 0; step < 2; ++step) {
    std::vector<float> scores(rows * ld, 12345.f);  // the padding past cols must stay
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        scores[r * ld + c] = (r == 3 || (c % 5 == 1)) ? -inf : normal(gen) + 4.f * step;
    const std::vector<float> input = scores;
    online_softmax_tile(RowLanes::k8, scores.data(), rows, cols, ld, row_max.data(),
                        row_sum.data(), out.data(), dim, dim);
    for (int r = 0; r < rows; ++r) {
      double new_max = ref_max[r];
      for (int c = 0; c < cols; ++c) new_max = std::max(new_max, double(input[r * ld + c]));
      for (int c = cols; c < ld; ++c)
        expect(scores[r * ld + c] == 12345.f, "padding past cols untouched", scores[r * ld + c],
               12345.0);
      if (new_max == -inf) {  // no key seen: zeros, state kept
        for (int c = 0; c < cols; ++c)
          expect(scores[r * ld + c] == 0.f, "unseen row's P", scores[r * ld + c], 0.0);
        continue;
      }
      // The kernels subtract in fp32, as every fp32 softmax does; the reference takes exp of
      // those same differences, so what is compared is exp itself and the bookkeeping.
      const float new_max_f = static_cast<float>(new_max);
      const double rescale = std::exp(double(float(ref_max[r]) - new_max_f));
      double sum = 0;
      for (int c = 0; c < cols; ++c) {
        const double p = std::exp(double(input[r * ld + c] - new_max_f));
        sum += p;
        const float got = scores[r * ld + c];
        expect(std::fabs(got - p) <= 2.5e-7 * p + 1e-38, "P = exp(S - m)", got, p);
      }
      ref_sum[r] = ref_sum[r] * rescale + sum;
      ref_max[r] = new_max;
      for (int d = 0; d < dim; ++d) ref_out[r * dim + d] *= rescale;
      expect(row_max[r] == new_max_f, "row_max", row_max[r], new_max);
      // fp32 sums of up to 130 terms in a different order than the reference's.
      expect(std::fabs(row_sum[r] - ref_sum[r]) <= 4e-6 * ref_sum[r], "row_sum", row_sum[r],
             ref_sum[r]);
      for (int d = 0; d < dim; ++d)
        expect(std::fabs(out[r * dim + d] - ref_out[r * dim + d]) <=
                   1e-6 * std::fabs(ref_out[r * dim + d]),
               "out rescaled", out[r * dim + d], ref_out[r * dim + d]);
    }
  }
}

void check_backward_tiles(int cols) {
  const int rows = 6, ld = cols + 1;
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 gen(100 + cols);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> shift(cols), d_terms(cols), x(rows * ld), dp(rows * ld);
  for (int c = 0; c < cols; ++c) {
    shift[c] = c == 2 ? inf : normal(gen) + 5.f;  // +inf: a query that saw no key
    d_terms[c] = normal(gen);
  }
  for (int i = 0; i < rows * ld; ++i) {
    x[i] = (i % 7 == 3) ? -inf : normal(gen);
    dp[i] = normal(gen);
  }
  const std::vector<float> scores = x, dp_in = dp;
  exp_shifted_by_tile(x.data(), rows, cols, ld, shift.data());
  softmax_grad_tile(dp.data(), x.data(), rows, cols, ld, d_terms.data());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < ld; ++c) {
      const int i = r * ld + c;
      if (c == cols) {
        expect(x[i] == scores[i] && dp[i] == dp_in[i], "column past cols untouched", x[i],
               scores[i]);
        continue;
      }
      const double p = std::exp(double(scores[i] - shift[c]));  // fp32 difference, as above
      expect(std::fabs(x[i] - p) <= 2.5e-7 * p + 1e-38, "P = exp(S - lse)", x[i], p);
      const double ds = double(x[i]) * double(dp_in[i] - d_terms[c]);
      expect(std::fabs(dp[i] - ds) <= 1.2e-7 * std::fabs(ds), "dS = P (dP - D)", dp[i], ds);
    }
}

// A NaN score poisons its row (as softmax does), whether or not the row has finite scores.
void check_nan_rows() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int cols = 20;
  std::vector<float> scores(3 * cols, 1.f), row_max(3, -inf), row_sum(3, 0.f), out(3, 1.f);
  scores[0 * cols + 4] = nan;                                   // NaN among finite scores
  for (int c = 0; c < cols; ++c) scores[1 * cols + c] = c == 7 ? nan : -inf;  // NaN, masked
  online_softmax_tile(RowLanes::k8, scores.data(), 3, cols, cols, row_max.data(),
                      row_sum.data(), out.data(), 1, 1);
  for (int r = 0; r < 2; ++r)
    expect(std::isnan(row_sum[r]), "row sum of a row with a NaN score", row_sum[r], nan);
  expect(std::isnan(scores[4]), "P at the NaN score", scores[4], nan);
  expect(std::isnan(scores[cols + 0]) && std::isnan(scores[cols + 7]),
         "P of a row of -inf and NaN", scores[cols], nan);
  expect(std::isfinite(row_sum[2]) && row_sum[2] == float(cols), "row without NaN", row_sum[2],
         cols);
}

// The state of one online-softmax run: two steps over random tiles (with masked entries and a
// row that sees no key), P as the last step left it.
struct SoftmaxRun {
  std::vector<float> p32, row_max, row_sum, out;
  std::vector<uint16_t> p16;  // the 16-bit P's bits, padding included
  bool bf16 = false;          // P in bf16
  // The same bits, but for the row sums, which may be summed in another order (16 lanes): those
  // agree to fp32 rounding.
  bool operator==(const SoftmaxRun& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    bool sums_agree = row_sum.size() == o.row_sum.size();
    for (size_t r = 0; sums_agree && r < row_sum.size(); ++r)
      sums_agree = std::fabs(row_sum[r] - o.row_sum[r]) <= 2e-6f * std::fabs(o.row_sum[r]) ||
                   (std::isnan(row_sum[r]) && std::isnan(o.row_sum[r]));
    // bf16 P may be rounded by vcvtneps2bf16 (16 lanes on AVX512-BF16 CPUs), which flushes a
    // weight below 2^-126 to zero: bits of such weights may be 0 on one side.
    bool p16_agree = p16.size() == o.p16.size();
    for (size_t i = 0; p16_agree && i < p16.size(); ++i) {
      const bool tiny = bf16 && (p16[i] & 0x7F80) == 0 && (o.p16[i] & 0x7F80) == 0;
      p16_agree = p16[i] == o.p16[i] || (tiny && (p16[i] & 0x7FFF) * (o.p16[i] & 0x7FFF) == 0);
    }
    return same(p32, o.p32) && same(row_max, o.row_max) && sums_agree && same(out, o.out) &&
           p16_agree;
  }
  bool same_sums(const SoftmaxRun& o) const {
    return std::memcmp(row_sum.data(), o.row_sum.data(), row_sum.size() * 4) == 0;
  }
};

// P: float (the fp32 step, in place), or c10::BFloat16 / c10::Half (the 16-bit products'
// fused step, with `scale`). composed: the 16-bit step as scale_by, the fp32 step and
// round_to_16bit in turn.
template <typename P>
SoftmaxRun run_softmax(RowLanes lanes, int cols, float scale, bool composed = false) {
  const int rows = 5, ld = 136, padded = 136, dim = 11;
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 gen(cols);
  std::normal_distribution<float> normal(0.f, 3.f);
  SoftmaxRun run{{}, std::vector<float>(rows, -inf), std::vector<float>(rows, 0.f),
                 std::vector<float>(rows * dim), {}};
  for (float& o : run.out) o = normal(gen);
  std::vector<P> probs(rows * padded, P(7.f));
  for (int step = 0; step < 2; ++step) {
    std::vector<float> scores(rows * ld, 12345.f);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        scores[r * ld + c] = (r == 3 || (c % 5 == 1)) ? -inf : normal(gen) * 8.f + 30.f * step;
    if constexpr (std::is_same_v<P, float>) {
      online_softmax_tile(lanes, scores.data(), rows, cols, ld, run.row_max.data(),
                          run.row_sum.data(), run.out.data(), dim, dim);
      run.p32 = scores;
    } else if (composed) {
      for (int r = 0; r < rows; ++r) scale_by(scores.data() + r * ld, cols, scale);
      online_softmax_tile(lanes, scores.data(), rows, cols, ld, run.row_max.data(),
                          run.row_sum.data(), run.out.data(), dim, dim);
      for (int r = 0; r < rows; ++r) {
        round_to_16bit(scores.data() + r * ld, probs.data() + r * padded, cols);
        std::fill(probs.begin() + r * padded + cols, probs.begin() + (r + 1) * padded, P(0.f));
      }
    } else {
      online_softmax_tile(lanes, scores.data(), rows, cols, ld, scale, run.row_max.data(),
                          run.row_sum.data(), run.out.data(), dim, dim, probs.data(), padded,
                          padded);
    }
  }
  if constexpr (!std::is_same_v<P, float>)
    for (const P& v : probs) run.p16.push_back(v.x);
  run.bf16 = std::is_same_v<P, c10::BFloat16>;
  return run;
}

// The 16-lane steps (AVX-512 CPUs) give the 8-lane steps' P, maxima and O bits, fp32 and fused
// 16-bit alike, and their row sums to rounding; and the fused 16-bit step gives the composed
// one's bits when the scale is a power of two (S * scale is then exact, so S * scale - m rounds
// once either way).
void check_lanes_and_fusion(int cols) {
  std::vector<RowLanes> widths{RowLanes::k8};
  if (runs_x86_64_v4()) widths.push_back(RowLanes::k16);
  for (RowLanes lanes : widths) {
    const double width = double(lanes);
    expect(run_softmax<float>(lanes, cols, 1.f) == run_softmax<float>(RowLanes::k8, cols, 1.f),
           "fp32 step: lanes give the 8-lane bits", width, cols);
    for (float scale : {0.125f, 0.1f, 4.f}) {  // 4: exps down to the denormals and to 0
      expect(run_softmax<c10::BFloat16>(lanes, cols, scale) ==
                 run_softmax<c10::BFloat16>(RowLanes::k8, cols, scale),
             "bf16 fused step: lanes give the 8-lane bits", width, cols);
      expect(run_softmax<c10::Half>(lanes, cols, scale) ==
                 run_softmax<c10::Half>(RowLanes::k8, cols, scale),
             "fp16 fused step: lanes give the 8-lane bits", width, cols);
    }
    for (float scale : {0.125f, 4.f}) {
      const auto bf16 = run_softmax<c10::BFloat16>(lanes, cols, scale);
      const auto bf16_composed = run_softmax<c10::BFloat16>(RowLanes::k8, cols, scale, true);
      expect(bf16 == bf16_composed && (lanes == RowLanes::k16 || bf16.same_sums(bf16_composed)),
             "bf16 fused step gives the composed step's bits", width, cols);
      const auto fp16 = run_softmax<c10::Half>(lanes, cols, scale);
      const auto fp16_composed = run_softmax<c10::Half>(RowLanes::k8, cols, scale, true);
      expect(fp16 == fp16_composed && (lanes == RowLanes::k16 || fp16.same_sums(fp16_composed)),
             "fp16 fused step gives the composed step's bits", width, cols);
    }
  }
}

}  // namespace

int main() {
  check_fast_exp();
  check_nan_rows();
  for (int cols : {1, 7, 8, 9, 63, 64, 65, 128, 130}) {
    check_online_softmax_tile(cols);
    check_lanes_and_fusion(cols);
    check_backward_tiles(cols);
  }
  if (failures) {
    std::printf("%d checks failed\n", failures);
    return 1;
  }
  std::printf("softmax_vec: all checks passed\n");
  return 0;
}
