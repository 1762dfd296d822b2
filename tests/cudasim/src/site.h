// A place in the kernel source, recorded from the call site of a wrapper or intrinsic.
// Internal to the shim.
#pragma once
#include <string>

namespace cudasim::detail {

struct Site {
  const char* file = "?";
  int line = 0;
};
bool same_site(const Site& a, const Site& b);
std::string describe(const Site& site);  // "file:line"

}  // namespace cudasim::detail
