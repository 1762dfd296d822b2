// Host-side 16-bit [B, S, H, D] tensors for the sm_90a attention self-tests (hopper_fwd_test,
// hopper_bwd_test): the bits of a bf16 / f16 value and back, random non-zero inputs, and the
// BshdTensor view the kernels' tensor maps are made from.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/hopper/bshd_map.h"

namespace selftest {

template <typename Elem>
uint16_t bits_of(float x) {
  Elem h;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) h = __float2bfloat16_rn(x);
  else h = __float2half_rn(x);
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
template <typename Elem>
float value_of(uint16_t b) {
  Elem h;
  std::memcpy(static_cast<void*>(&h), &b, sizeof b);
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return __bfloat162float(h);
  else return __half2float(h);
}
// x as the 16-bit type stores it.
template <typename Elem>
double round_to(double x) {
  return value_of<Elem>(bits_of<Elem>(static_cast<float>(x)));
}

// A [B, S, H, D] tensor of 16-bit bits stored with the given layout; element (b, s, h, d) at
// index().
struct Tensor {
  int batch, seqlen, heads, dim;
  bool heads_outer;  // [B, H, S, D] in memory (else [B, S, H, D])
  std::vector<uint16_t> bits;
  size_t index(int b, int s, int h, int d) const {
    return heads_outer ? ((static_cast<size_t>(b) * heads + h) * seqlen + s) * dim + d
                       : ((static_cast<size_t>(b) * seqlen + s) * heads + h) * dim + d;
  }
  flashattn::hopper::BshdTensor view() const {
    flashattn::hopper::BshdTensor t;
    t.ptr = bits.data();
    t.seqlen = seqlen, t.heads = heads;
    t.batch_stride = static_cast<int64_t>(seqlen) * heads * dim;
    t.row_stride = heads_outer ? dim : static_cast<int64_t>(heads) * dim;
    t.head_stride = heads_outer ? static_cast<int64_t>(seqlen) * dim : dim;
    return t;
  }
};

// Random values of magnitude 0.05-1.5 and either sign: never zero, so no product hides a bug.
template <typename Elem>
Tensor random_tensor(std::mt19937& rng, int b, int s, int h, int d, bool heads_outer) {
  Tensor t{b, s, h, d, heads_outer, {}};
  t.bits.resize(static_cast<size_t>(b) * s * h * d);
  std::uniform_real_distribution<float> mag(0.05f, 1.5f);
  std::bernoulli_distribution sign(0.5);
  for (auto& x : t.bits) x = bits_of<Elem>(sign(rng) ? mag(rng) : -mag(rng));
  return t;
}

}  // namespace selftest
