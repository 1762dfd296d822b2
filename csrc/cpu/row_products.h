// The two products of the forward for a tile of a few query rows per kv head (decoding: one or
// a few tokens of each query head of a GQA group, for one or several kv heads), taking each key
// and value row where it is, in the input's type: no tile is packed or transposed first, and
// each row is read once for all the tile's query rows of its head. With so few rows a packed
// GEMM spends its time packing; these loops read the cache at memory speed. fp32 accumulation,
// sums in a fixed order (reproducible), compiled for the running CPU's vector width like
// softmax_vec.cpp.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "row_stream.h"
#include "simd.h"

namespace flashattn::cpu {

// The most query rows per kv head a tile may have to take these products rather than packed
// GEMMs.
constexpr int kRowProductMaxRows = 16;

// Whether the forward takes a sequence's products here (fp32 compute types): seqlen_q queries of
// each of head_group query heads per kv head are at most kRowProductMaxRows rows, however a call
// groups them. The backward then recomputes the sequence's scores with dot_key_rows too.
inline bool sequence_takes_row_products(int seqlen_q, int head_group) {
  return int64_t(seqlen_q) * head_group <= kRowProductMaxRows;
}

// How many fp32 lanes the products take at a time: row_lanes() (simd.h). The sums' order, and
// so the bits, differ between the two.

// scores[r * ld + c] = q[r * q_ld + 0 .. dim) · (row c of kv head r / rows of keys)[0 .. dim)
// for r < rows * keys.heads, c < keys.count: `rows` query rows per kv head, head by head.
void dot_key_rows(RowLanes lanes, const float* q, int rows, int64_t q_ld,
                  const RowStream<float>& keys, int dim, float* scores, int64_t ld);
void dot_key_rows(RowLanes lanes, const float* q, int rows, int64_t q_ld,
                  const RowStream<c10::BFloat16>& keys, int dim, float* scores, int64_t ld);
void dot_key_rows(RowLanes lanes, const float* q, int rows, int64_t q_ld,
                  const RowStream<c10::Half>& keys, int dim, float* scores, int64_t ld);

// out[r * out_ld + d] += sum_c probs[r * ld + c] * (row c of kv head r / rows of values)[d]
// for r < rows * values.heads, d < dim, the keys c < values.count in order.
void add_value_rows(RowLanes lanes, const float* probs, int rows, int64_t ld,
                    const RowStream<float>& values, int dim, float* out, int64_t out_ld);
void add_value_rows(RowLanes lanes, const float* probs, int rows, int64_t ld,
                    const RowStream<c10::BFloat16>& values, int dim, float* out, int64_t out_ld);
void add_value_rows(RowLanes lanes, const float* probs, int rows, int64_t ld,
                    const RowStream<c10::Half>& values, int dim, float* out, int64_t out_ld);

// The same two products on vdpbf16ps (AVX512-BF16): bf16 operands, exact products, fp32 sums,
// for the 16-bit operand path when its tile products run on vdpbf16ps too (CPUs where it
// outruns fp32 FMAs: AMD Zen 4/5). Qi is bf16 and unscaled (the caller scales the scores), P
// is rounded to bf16, and like the dot tile kernel (gemm_avx512_16bit.h) vdpbf16ps treats bf16
// subnormal inputs and fp32 subnormal results as zero. The head dim in pairs of elements, each
// pair summed in vdpbf16ps' order; a (row, key) or output element's sum depends on nothing
// else. Call only where avx512::cpu_has_avx512_bf16(). probs[r * ld + c] must be 0 for c in
// [values.count, values.count rounded up to a multiple of 16).
//
// Qi as dot_key_rows_bf16 takes it: `rows` query rows per kv head of the key stream, row r of
// head g at q + (g * rows + r) * ld, a zero after an odd dim; and where takes_query_lanes(rows),
// the same rows as lay_query_lanes_bf16 lays them out in `lanes` (else null). From kLaneRowsMin
// rows the dots take the rows in the lanes of a vector, fewer rows take the keys there (16 keys'
// dots at a time either way, no horizontal sums). Both add a (row, key)'s pairs in order from
// zero, as the dot tile kernel does: a score's bits depend on nothing but its row and key, not
// on the rows per kv head nor on which kernel took the sequence.
struct QueryTileBf16 {
  const c10::BFloat16* q;
  int rows;
  int64_t ld;
  const int32_t* lanes = nullptr;
};
constexpr int kLaneRowsMin = 9;
constexpr int kQueryLanes = 16;  // one zmm of fp32 sums
static_assert(kRowProductMaxRows <= kQueryLanes, "a kv head's query rows fit the lanes");
inline bool takes_query_lanes(int rows) { return rows >= kLaneRowsMin; }
// lanes[(g * ceil(dim / 2) + p) * 16 + r] = the pair of elements 2p, 2p + 1 of head g's row r (0
// for r >= rows): query_lanes_size(heads, dim) int32 in all.
int64_t query_lanes_size(int heads, int dim);
void lay_query_lanes_bf16(const c10::BFloat16* q, int rows, int heads, int64_t ld, int dim,
                          int32_t* lanes);
void dot_key_rows_bf16(const QueryTileBf16& q, const RowStream<c10::BFloat16>& keys, int dim,
                       float* scores, int64_t ld);
void add_value_rows_bf16(const c10::BFloat16* probs, int rows, int64_t ld,
                         const RowStream<c10::BFloat16>& values, int dim, float* out,
                         int64_t out_ld);
// How many times this process has called each (tests/test_cpu_16bit_products.py), and how many
// of the score products took the rows in lanes (tests/test_kvcache.py).
int64_t bf16_row_products_run();
int64_t bf16_query_lanes_run();

}  // namespace flashattn::cpu
