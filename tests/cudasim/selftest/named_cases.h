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

}  // namespace selftest
