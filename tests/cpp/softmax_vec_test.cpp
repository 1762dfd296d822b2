// The CPU kernels' fp32 softmax arithmetic against double precision: fast_exp (scalar and
// vector), and the tile functions as the kernels call them, through the clone the loader picked
// for this CPU (AVX-512, AVX2 or baseline). Exits non-zero and says what differs on failure.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
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
    online_softmax_tile(scores.data(), rows, cols, ld, row_max.data(), row_sum.data(), out.data(),
                        dim, dim);
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
  online_softmax_tile(scores.data(), 3, cols, cols, row_max.data(), row_sum.data(), out.data(),
                      1, 1);
  for (int r = 0; r < 2; ++r)
    expect(std::isnan(row_sum[r]), "row sum of a row with a NaN score", row_sum[r], nan);
  expect(std::isnan(scores[4]), "P at the NaN score", scores[4], nan);
  expect(std::isnan(scores[cols + 0]) && std::isnan(scores[cols + 7]),
         "P of a row of -inf and NaN", scores[cols], nan);
  expect(std::isfinite(row_sum[2]) && row_sum[2] == float(cols), "row without NaN", row_sum[2],
         cols);
}

}  // namespace

int main() {
  check_fast_exp();
  check_nan_rows();
  for (int cols : {1, 7, 8, 9, 63, 64, 65, 128, 130}) {
    check_online_softmax_tile(cols);
    check_backward_tiles(cols);
  }
  if (failures) {
    std::printf("%d checks failed\n", failures);
    return 1;
  }
  std::printf("softmax_vec: all checks passed\n");
  return 0;
}
