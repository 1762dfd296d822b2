// FastDivmod (csrc/fast_divmod.h) against the / and % operators: every divisor up to 70000 on
// the numerators where a multiply-shift division goes wrong first (multiples of the divisor
// and their neighbours, the top of the range; every numerator below 3 d for d <= 4096), then
// random pairs over the whole range. Exits
// non-zero and prints the first differences on failure.
#include <cstdio>
#include <random>

#include "fast_divmod.h"

using flashattn::FastDivmod;

namespace {

int failures = 0;

void check(const FastDivmod& f, int n) {
  const int q = f.div(n), r = f.mod(n, q);
  if (q == n / f.divisor && r == n % f.divisor) return;
  if (++failures <= 20)
    std::printf("FAIL %d / %d: got %d rem %d, expected %d rem %d\n", n, f.divisor, q, r,
                n / f.divisor, n % f.divisor);
}

}  // namespace

int main() {
  constexpr int kMax = 0x7fffffff;
  for (int d = 1; d <= 70000; ++d) {
    const FastDivmod f(d);
    if (d <= 4096)
      for (int n = 0; n < 3 * d + 2; ++n) check(f, n);
    for (int n = kMax - 2 * (d < 4096 ? d : 4096); n < kMax; ++n) check(f, n);
    check(f, kMax);
    for (int64_t k = 1; k * d < kMax; k = k * 3 + 1) {
      const int64_t m = k * d;
      for (int64_t n = m - 1; n <= m + 1 && n <= kMax; ++n) check(f, static_cast<int>(n));
    }
  }
  std::mt19937 rng(0);
  std::uniform_int_distribution<int> divisors(1, kMax), numerators(0, kMax);
  for (int i = 0; i < 2000000; ++i) check(FastDivmod(divisors(rng)), numerators(rng));
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("FastDivmod agrees with / and %% on every case\n");
  return 0;
}
