// A fixed-width float vector in GCC/Clang's vector extension. The extension is built for
// baseline x86-64, and the compiler lowers each operation to the registers of the function's
// target: one ymm in the AVX2 and AVX-512 clones, two xmm in the baseline. Code written once on
// these types is vectorized for every target, with no reliance on the auto-vectorizer and no
// reassociation of sums (results are reproducible). 8 lanes, not 16: GCC 12 turned the
// 16-lane compare-and-select of max/exp into scalar code in the AVX2 clone (objdump).
#pragma once
#include <cstdint>
#include <cstring>

// The extension is built for baseline x86-64 (it must load on any machine), so the fp32 loops
// are compiled three times, for AVX-512, AVX2+FMA and the baseline, and the loader picks the
// best for the running CPU once (GCC/Clang function multi-versioning). Put on the out-of-line
// entry points; their loop bodies are FLASHATTN_ROW_STEP, forced inline so that they are
// compiled for each clone's target. (GCC left one out of line once, as baseline code, 7x slower.)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// Code whose AVX-512 version is written apart (FLASHATTN_AVX512) takes the other two clones.
#define FLASHATTN_EARLIER_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v3", "default")))
#define FLASHATTN_AVX512 __attribute__((target("arch=x86-64-v4")))
#define FLASHATTN_X86_64_V3 __attribute__((target("arch=x86-64-v3")))
#else
#define FLASHATTN_VECTOR_CLONES
#define FLASHATTN_EARLIER_VECTOR_CLONES
#define FLASHATTN_AVX512
#define FLASHATTN_X86_64_V3
#endif
#define FLASHATTN_ROW_STEP __attribute__((always_inline)) inline

namespace flashattn::cpu {

constexpr int kVecWidth = 8;
using VecF = float __attribute__((vector_size(kVecWidth * sizeof(float))));
using VecI = int32_t __attribute__((vector_size(kVecWidth * sizeof(int32_t))));

// A vector of V's lanes from p / to p, any alignment. V: VecF, or VecF16 in code compiled for
// AVX-512 alone (FLASHATTN_AVX512: the row products, row_products.cpp), so that one template
// serves both widths.
using VecF16 = float __attribute__((vector_size(16 * sizeof(float))));

template <typename V>
constexpr int lanes = sizeof(V) / sizeof(float);

template <typename V>
FLASHATTN_ROW_STEP V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename V>
FLASHATTN_ROW_STEP void store(float* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}

inline VecF load_vec(const float* p) { return load<VecF>(p); }
inline void store_vec(float* p, VecF v) { store(p, v); }

// A broadcast. Not VecF{} + value: 0 + x is not an identity in IEEE arithmetic (-0 + 0 = +0),
// so the compiler kept a scalar add in front of every broadcast (objdump of add_value_rows).
static_assert(kVecWidth == 8, "splat lists kVecWidth lanes");
inline VecF splat(float value) {
  return VecF{value, value, value, value, value, value, value, value};
}

// The same few operations on a plain float, so that one template serves vector and scalar tail.
inline float bits_to_float(int32_t bits) { return __builtin_bit_cast(float, bits); }
inline VecF bits_to_float(VecI bits) { return reinterpret_cast<VecF>(bits); }
inline int32_t float_to_bits(float x) { return __builtin_bit_cast(int32_t, x); }
inline VecI float_to_bits(VecF x) { return reinterpret_cast<VecI>(x); }
// The 16-lane counterparts, for code compiled for AVX-512 alone (FLASHATTN_AVX512).
using VecI16 = int32_t __attribute__((vector_size(16 * sizeof(int32_t))));
inline VecF16 bits_to_float(VecI16 bits) { return reinterpret_cast<VecF16>(bits); }
inline VecI16 float_to_bits(VecF16 x) { return reinterpret_cast<VecI16>(x); }
// A broadcast to either width (see splat).
template <typename V>
FLASHATTN_ROW_STEP V splat_to(float value) {
  if constexpr (lanes<V> == 8) {
    return splat(value);
  } else {
    static_assert(lanes<V> == 16, "splat_to lists 16 lanes");
    return V{value, value, value, value, value, value, value, value,
             value, value, value, value, value, value, value, value};
  }
}

// The width of the loops that come in 8 and 16 lanes (the row products, row_products.h, and the
// forward's online softmax, softmax_vec.h): 16 (one zmm) on a CPU that runs x86-64-v4
// (AVX-512), else 8. FLASHATTN_CPU_ROW_LANES=8 or 16 forces one (16 without AVX-512 is an
// error); unset or "auto": the default. Reads the environment, so a caller asks once per op,
// not per tile.
enum class RowLanes { k8 = 8, k16 = 16 };
RowLanes row_lanes();
// Whether the running CPU can run x86-64-v4 code (AVX-512), and so the 16-lane loops.
bool runs_x86_64_v4();
// Whether it can run x86-64-v3 code (AVX2 and FMA).
bool runs_x86_64_v3();

template <typename F>
inline F select_max(F a, F b) { return a > b ? a : b; }
template <typename F>
inline F select_min(F a, F b) { return a < b ? a : b; }

}  // namespace flashattn::cpu
