// The driver of the self-test programs made of named cases: `program CASE` runs one case and
// exits with its status; a SimError prints "SimError: <message>" and exits 3, and an unknown
// case lists the cases and exits 64 (the tests/test_cudasim_*.py drivers read all three).
#pragma once
#include <cstdio>
#include <functional>
#include <map>
#include <string>

namespace selftest {

using NamedCases = std::map<std::string, std::function<int()>>;

inline int run_named_case(int argc, char** argv, const NamedCases& cases) {
  if (argc != 2 || cases.count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: %s CASE; cases:", argv[0]);
    for (const auto& c : cases) std::fprintf(stderr, " %s", c.first.c_str());
    std::fprintf(stderr, "\n");
    return 64;
  }
  try {
    return cases.at(argv[1])();
  } catch (const cudasim::SimError& e) {
    std::printf("SimError: %s\n", e.what());
    return 3;
  }
}

// A case that runs with the shim's counters on and prints them (JSON) after.
inline int printing_counters(const std::function<int()>& run) {
  cudasim::enable_counters(true);
  const int rc = run();
  cudasim::enable_counters(false);
  std::printf("%s\n", cudasim::counters_json().c_str());
  return rc;
}

// A case's exit status: 1 after "WRONG: <what>" if it went wrong, else 0 after "OK".
inline int verdict(bool wrong, const std::string& what) {
  if (wrong) {
    std::printf("WRONG: %s\n", what.c_str());
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

// One block's launch with the shim's counters on (reset first): prints them (JSON) and returns
// them, for a case to check.
template <class Kernel, class... Args>
cudasim::Counters counted_launch(Kernel kernel, unsigned threads, size_t smem, Args... args) {
  cudasim::reset_counters();
  cudasim::enable_counters(true);
  cudasim::launch(kernel, dim3(1), dim3(threads), smem, args...);
  cudasim::enable_counters(false);
  const cudasim::Counters c = cudasim::counted_launches().back().counters;
  std::printf("%s\n", cudasim::to_json(c).c_str());
  return c;
}

}  // namespace selftest
