// Attention dropout, the same bits on every executor and device: whether the probability of
// (batch b, query head h, query row i, key j) is kept is a pure function of (seed, offset, b, h,
// i, j), computed by Philox4x32-10 (the generator torch and FlashAttention use), never of tile
// sizes, thread counts or launch geometry. So the CPU is an exact oracle for the GPU's mask.
//
// Philox is a keyed bijection of a 128-bit counter: the key is (seed + offset) as two 32-bit
// words, the counter (j / 4, i, b, h); its four 32-bit outputs decide keys 4 (j / 4) ... + 3.
// A key is kept iff its 32-bit draw is >= round(p * 2^32): resolution 2^-32, so the keep rate
// is 1 - p to within 2^-33 (FlashAttention-2 compares 8 bits: 0.828 for p = 0.17).
#pragma once
#include <cstdint>

#include "params.h"

namespace flashattn {

struct PhiloxBlock {
  uint32_t word[4];
};

FLASHATTN_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
FLASHATTN_HOST_DEVICE PhiloxBlock philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kMul0, c0, hi0, lo0);
    mul_hi_lo(kMul1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// The seed and offset of a call: the [seed, offset] the forward drew (Dropout::rng_state).
struct DropoutSeed {
  uint64_t seed, offset;
};

FLASHATTN_HOST_DEVICE DropoutSeed dropout_seed(const Dropout& d) {
  if (!d.on()) return {0, 0};
  return {static_cast<uint64_t>(d.rng_state[0]), static_cast<uint64_t>(d.rng_state[1])};
}

// The draws of keys [4 * group, 4 * group + 4) of row `row` of head (b, h).
FLASHATTN_HOST_DEVICE PhiloxBlock dropout_draws(const DropoutSeed& s, int b, int h, int row,
                                                int key_group) {
  const uint64_t key = s.seed + s.offset;
  return philox4x32_10(static_cast<uint32_t>(key_group), static_cast<uint32_t>(row),
                       static_cast<uint32_t>(b), static_cast<uint32_t>(h),
                       static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// Word i (0-3) of a block, by selects: indexing the array with a runtime i would place it in
// local memory on a GPU.
FLASHATTN_HOST_DEVICE uint32_t philox_word(const PhiloxBlock& block, int i) {
  const uint32_t even = (i & 1) ? block.word[1] : block.word[0];
  const uint32_t odd = (i & 1) ? block.word[3] : block.word[2];
  return (i & 2) ? odd : even;
}

FLASHATTN_HOST_DEVICE bool dropout_keeps(const Dropout& d, uint32_t draw) {
  return draw >= d.threshold;
}

// Whether (b, h, row, key) is kept; one Philox call for one element (the keep-mask op). Kernels
// call dropout_draws once per group of four keys.
FLASHATTN_HOST_DEVICE bool dropout_keeps(const Dropout& d, const DropoutSeed& s, int b, int h,
                                         int row, int key) {
  return dropout_keeps(d, philox_word(dropout_draws(s, b, h, row, key / 4), key % 4));
}

// What the probability of (b, h, row, key) is multiplied by: 1 / (1 - p) if kept, 0 if dropped,
// 1 without dropout.
FLASHATTN_HOST_DEVICE float dropout_factor(const Dropout& d, const DropoutSeed& s, int b, int h,
                                           int row, int key) {
  if (!d.on()) return 1.f;
  return dropout_keeps(d, s, b, h, row, key) ? d.keep_scale : 0.f;
}

}  // namespace flashattn
