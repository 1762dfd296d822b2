// Orders in which the scheduler visits blocks, warps and lanes, and the random draws of random
// copy completion. Internal to the shim.
#pragma once
#include <cstdint>
#include <vector>

#include "cudasim.h"

namespace cudasim::detail {

// CUDASIM_STALL_WARPGROUP=G: warpgroup G's warps run only when no thread outside it can (its
// peers run as far ahead as they can), which exposes a missing barrier between warpgroups that
// run the same code and would otherwise stay in step at every warpgroup collective. -1 (unset):
// no warpgroup is held back.
int stalled_warpgroup();

// Produces permutations of 0..n-1 under one schedule: identity, reversed, or a reproducible
// pseudo-random shuffle (splitmix64 + Fisher-Yates, so the same seed gives the same runs on
// every machine, unlike std::shuffle whose algorithm is unspecified).
class Permuter {
 public:
  Permuter(const Schedule& schedule, uint64_t stream);
  std::vector<unsigned> permutation(unsigned n);
  // A reproducible pseudo-random draw in [0, n), whatever the order (random copy completion).
  unsigned below(unsigned n);

 private:
  uint64_t next();
  Order order_;
  uint64_t state_;
};

}  // namespace cudasim::detail
