// Division by a divisor fixed for a whole call (a paged cache's page size), as a multiply and a
// shift: on a GPU an integer division by a runtime value is a ~20-instruction subroutine, and
// the paged K/V copies divide once per row (kv_rows.h). Granlund and Montgomery's method, in the
// form cutlass's FastDivmod uses: for a divisor d > 1, with p = 31 + ceil(log2 d) and
// m = ceil(2^p / d) (which fits in 32 bits), n / d = (n * m) >> p for every 0 <= n < 2^31.
// Built on the host; tests/cpp/fast_divmod_test.cpp checks it against the / operator.
#pragma once
#include <cstdint>

#include "host_device.h"

namespace flashattn {

struct FastDivmod {
  int divisor = 1;
  uint32_t multiplier = 0;  // m; unused for divisor 1
  int shift = 0;            // p - 32

  FastDivmod() = default;
  // divisor >= 1 (a page size of 0 is rejected before a kernel divides by it). Not explicit:
  // a field of this type is set like the int it replaces, and cannot hold a stale divisor.
  FastDivmod(int d) : divisor(d) {  // NOLINT(google-explicit-constructor)
    if (d <= 1) return;
    int ceil_log2 = 0;
    while ((int64_t{1} << ceil_log2) < d) ++ceil_log2;
    const int p = 31 + ceil_log2;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << p) + uint64_t(d) - 1) / uint64_t(d));
    shift = p - 32;
  }

  // n / divisor, for 0 <= n < 2^31. The high half of a 32 x 32-bit product (mul.hi on a GPU).
  FLASHATTN_HOST_DEVICE int div(int n) const {
    if (divisor == 1) return n;
    const uint32_t high = static_cast<uint32_t>((uint64_t(uint32_t(n)) * multiplier) >> 32);
    return static_cast<int>(high >> shift);
  }
  // n % divisor, given q = div(n).
  FLASHATTN_HOST_DEVICE int mod(int n, int q) const { return n - q * divisor; }
};

}  // namespace flashattn
