// Runs every wrapped primitive on the shim and compares it with the scalar reference.
//   primitives_test [--dump FILE] [--hardware-safe] [--sm90] [SEED]
// Prints "PASS name" or "FAIL name: ..." per case; exit status 1 if any case fails.
// --dump writes the outputs for layout_check.py (which passes --hardware-safe to match the GPU).
// --sm90 adds the sm_90 cases (sm90_cases.h: TMA, bulk copies, mbarriers, and wgmma where its
// cases exist), which layout_check.py --arch 90a compares with an sm_90a GPU.
#include <cstdlib>
#include <cstring>

#include "case_dump.h"
#include "sm90_cases.h"

int main(int argc, char** argv) {
  const char* dump = nullptr;
  bool hardware_safe = false, sm90 = false;
  uint64_t seed = 20261129;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump = argv[++i];
    } else if (std::strcmp(argv[i], "--hardware-safe") == 0) {
      hardware_safe = true;
    } else if (std::strcmp(argv[i], "--sm90") == 0) {
      sm90 = true;
    } else {
      seed = std::strtoull(argv[i], nullptr, 10);
    }
  }
  std::vector<primitives::CaseResult> results;
  try {
    results = primitives::run_all_cases(seed, hardware_safe);
    if (sm90) primitives::run_sm90_cases(seed, results);
  } catch (const cudasim::SimError& e) {
    std::printf("FAIL run: %s\n", e.what());
    return 1;
  }
  int failures = 0;
  for (const auto& r : results) {
    size_t first_diff = 0;
    while (first_diff < r.actual.size() && r.actual[first_diff] == r.expected[first_diff]) ++first_diff;
    if (r.actual.size() == r.expected.size() && first_diff == r.actual.size()) {
      std::printf("PASS %s\n", r.name.c_str());
    } else {
      ++failures;
      std::printf("FAIL %s: first differing byte %zu of %zu (got 0x%02x, want 0x%02x)\n",
                  r.name.c_str(), first_diff, r.actual.size(),
                  first_diff < r.actual.size() ? r.actual[first_diff] : 0,
                  first_diff < r.expected.size() ? r.expected[first_diff] : 0);
    }
  }
  if (dump != nullptr && !primitives::write_dump(dump, results)) {
    std::printf("FAIL dump: cannot write %s\n", dump);
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
