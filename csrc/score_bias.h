// What ALiBi and attn_mask add to a logit, and attn_mask's class of a tile, the same on every
// executor so that CPU and CUDA agree to the bit: parts of the score pipeline, whose steps are
// csrc/score_rules.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "params.h"

namespace flashattn {

// The ALiBi slope of query head h in batch b; 0 when there is no ALiBi.
FLASHATTN_HOST_DEVICE float alibi_slope(const AttnParams& p, int b, int h) {
  return p.alibi.ptr != nullptr ? *p.alibi.row<const float>(b, h, 0) : 0.f;
}

// An IEEE half's bits as a float (host and device alike, without cuda_fp16.h on the host).
FLASHATTN_HOST_DEVICE float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu, word;
  if (exponent == 0x1fu) {
    word = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;  // +-0
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    word = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  memcpy(&value, &word, sizeof(value));
  return value;
}

// What attn_mask adds to the logit of (query row, key) of head (b, h), in the compute type T:
// 0 or -inf for a boolean mask, the value itself for a float one (float64 only with float64
// inputs, which only the CPU takes).
template <typename T = float>
FLASHATTN_HOST_DEVICE T mask_bias(const AttnMask& m, int b, int h, int64_t row, int64_t key) {
  const int64_t at =
      b * m.batch_stride + h * m.head_stride + row * m.row_stride + key * m.key_stride;
  switch (m.kind) {
    case MaskKind::kBool:
      return static_cast<const uint8_t*>(m.ptr)[at] != 0 ? T(0) : T(-INFINITY);
    case MaskKind::kFloat64:
      return static_cast<T>(static_cast<const double*>(m.ptr)[at]);
    case MaskKind::kFloat32:
      return static_cast<const float*>(m.ptr)[at];
    case MaskKind::kBFloat16: {
      const uint32_t word = static_cast<uint32_t>(static_cast<const uint16_t*>(m.ptr)[at]) << 16;
      float value;
      memcpy(&value, &word, sizeof(value));
      return value;
    }
    case MaskKind::kHalf:
      return half_bits_to_float(static_cast<const uint16_t*>(m.ptr)[at]);
  }
  return T(0);
}

// The class of tile [row_begin, row_end) x [key_begin, key_end) (both non-empty) of head (b, h)
// of attn_mask: kMaskHidden if every mask block it touches is, kMaskOpen if every one is (or
// there is no mask), else kMaskRead.
FLASHATTN_HOST_DEVICE uint8_t mask_tile(const AttnMask& m, int b, int h, int row_begin,
                                        int row_end, int key_begin, int key_end) {
  if (m.ptr == nullptr) return kMaskOpen;
  bool hidden = true, open = true;
  const uint8_t* head_blocks = m.blocks + b * m.block_batch_stride + h * m.block_head_stride;
  for (int rb = row_begin / kMaskBlock; rb <= (row_end - 1) / kMaskBlock; ++rb)
    for (int kb = key_begin / kMaskBlock; kb <= (key_end - 1) / kMaskBlock; ++kb) {
      const uint8_t block = head_blocks[rb * m.block_row_stride + kb * m.block_key_stride];
      hidden = hidden && block == kMaskHidden;
      open = open && block == kMaskOpen;
    }
  return hidden ? kMaskHidden : (open ? kMaskOpen : kMaskRead);
}

// -slope * |i + diag_offset - j|; slope 0 when there is no ALiBi.
FLASHATTN_HOST_DEVICE float alibi_bias(float slope, int diag_offset, int row, int key) {
  int dist = row + diag_offset - key;
  return -slope * static_cast<float>(dist < 0 ? -dist : dist);
}

}  // namespace flashattn
