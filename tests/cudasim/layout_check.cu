// GPU side of the layout check: runs every primitive case on the GPU, with the inputs the
// shim's primitives_test uses, and dumps the outputs for layout_check.py to compare.
//   layout_check_gpu --dump FILE [SEED]
// Built by layout_check.py with nvcc; the shim side is primitives_test --hardware-safe (plus
// --sm90 when this is built for sm_90a with -DLAYOUT_CHECK_SM90, which adds the sm_90 cases).
#include <cstdlib>
#include <cstring>

#include "selftest/case_dump.h"
#ifdef LAYOUT_CHECK_SM90  // sm_90a only: an sm_80 or plain sm_90 build must not see wgmma PTX
#include "selftest/sm90_cases.h"
#endif

int main(int argc, char** argv) {
  const char* dump = nullptr;
  uint64_t seed = 20261129;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump = argv[++i];
    } else {
      seed = std::strtoull(argv[i], nullptr, 10);
    }
  }
  if (dump == nullptr) {
    std::fprintf(stderr, "usage: %s --dump FILE [SEED]\n", argv[0]);
    return 64;
  }
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("GPU: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  auto results = primitives::run_all_cases(seed, /*hardware_safe=*/true);
#ifdef LAYOUT_CHECK_SM90
  if (prop.major != 9) {
    std::fprintf(stderr, "built for sm_90a, but the GPU is sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }
  primitives::run_sm90_cases(seed, results);
#endif
  if (!primitives::write_dump(dump, results)) {
    std::fprintf(stderr, "cannot write %s\n", dump);
    return 1;
  }
  return 0;
}
