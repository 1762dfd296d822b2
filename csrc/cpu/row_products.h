// The two products of the forward for a tile of a few query rows (decoding: one or a few
// tokens of each query head of a GQA group), taking each key and value row where it is, in the
// input's type: no tile is packed or transposed first, and each row is read once for all the
// tile's query rows. With so few rows a packed GEMM spends its time packing; these loops read
// the cache at memory speed. fp32 accumulation, sums in a fixed order (reproducible), compiled
// for the running CPU's vector width like softmax_vec.cpp.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace flashattn::cpu {

// The most query rows a tile may have to take these products rather than packed GEMMs.
constexpr int kRowProductMaxRows = 16;

// How many fp32 lanes the products take at a time: 16 (one zmm) on a CPU that runs x86-64-v4
// (AVX-512), else 8. The sums' order, and so the bits, differ between the two.
// FLASHATTN_CPU_ROW_LANES=8 or 16 forces one (16 without AVX-512 is an error); unset or "auto":
// the default. Reads the environment, so a caller asks once per op, not per tile.
enum class RowLanes { k8 = 8, k16 = 16 };
RowLanes row_lanes();

// scores[r * ld + c] = q[r * q_ld + 0 .. dim) · keys[c][0 .. dim) for r < rows, c < cols.
void dot_key_rows(RowLanes lanes, const float* q, int rows, int64_t q_ld, const float* const* keys,
                  int cols, int dim, float* scores, int64_t ld);
void dot_key_rows(RowLanes lanes, const float* q, int rows, int64_t q_ld,
                  const c10::BFloat16* const* keys, int cols, int dim, float* scores, int64_t ld);
void dot_key_rows(RowLanes lanes, const float* q, int rows, int64_t q_ld,
                  const c10::Half* const* keys, int cols, int dim, float* scores, int64_t ld);

// out[r * out_ld + d] += sum_c probs[r * ld + c] * values[c][d] for r < rows, d < dim, the
// keys c in order.
void add_value_rows(RowLanes lanes, const float* probs, int rows, int64_t ld,
                    const float* const* values, int cols, int dim, float* out, int64_t out_ld);
void add_value_rows(RowLanes lanes, const float* probs, int rows, int64_t ld,
                    const c10::BFloat16* const* values, int cols, int dim, float* out,
                    int64_t out_ld);
void add_value_rows(RowLanes lanes, const float* probs, int rows, int64_t ld,
                    const c10::Half* const* values, int cols, int dim, float* out, int64_t out_ld);

}  // namespace flashattn::cpu
