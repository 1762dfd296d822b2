// The shared-memory swizzle of Hopper's tensor maps (CU_TENSOR_MAP_SWIZZLE_32B/64B/128B) and of
// wgmma's matrix descriptors: the one place the shim spells the rule, so TMA (tma.cpp) and
// wgmma agree by construction, and the layout check settles it against hardware.
//
// A swizzle of S bytes permutes the 16-byte chunks of each S-byte row segment: the chunk index
// (byte-offset bits [4, 4 + b)) is XORed with the index of the 128-byte row it lies in, modulo
// S / 16 (offset bits [7, 7 + b)), where b = log2(S / 16): 1 bit for 32 B, 2 for 64 B, 3 for
// 128 B. The pattern repeats every 256, 512 or 1024 bytes, which is why a swizzled tile must
// start 1024-byte aligned (CUTLASS writes the same rule as Swizzle<b, 4, 3>). Offsets are from
// a 1024-byte aligned base; bytes within a chunk keep their order.
#pragma once
#include <cstdint>

namespace cudasim::detail {

// byte_offset's swizzled position; swizzle_bytes is 0 (none), 32, 64 or 128.
inline uint32_t swizzle_offset(uint32_t byte_offset, int swizzle_bytes) {
  uint32_t bits = 0;  // b above
  switch (swizzle_bytes) {
    case 32: bits = 1; break;
    case 64: bits = 2; break;
    case 128: bits = 3; break;
    default: return byte_offset;  // 0: no swizzle
  }
  const uint32_t mask = (1u << bits) - 1;
  const uint32_t row = (byte_offset >> 7) & mask;
  return byte_offset ^ (row << 4);
}

}  // namespace cudasim::detail
