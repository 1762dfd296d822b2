// Writes the primitive cases' hardware-determined outputs in a form layout_check.py reads:
// per case one header line "name compare nbytes\n" followed by the raw bytes.
#pragma once
#include <cstdio>
#include <vector>

#include "primitive_cases.h"

namespace primitives {

inline bool write_dump(const char* path, const std::vector<CaseResult>& results) {
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr) return false;
  for (const CaseResult& r : results) {
    std::fprintf(f, "%s %s %zu\n", r.name.c_str(),
                 r.gpu_compare == GpuCompare::Bitwise ? "bitwise" : "close_f32", r.portable.size());
    std::fwrite(r.portable.data(), 1, r.portable.size(), f);
  }
  return std::fclose(f) == 0;
}

}  // namespace primitives
