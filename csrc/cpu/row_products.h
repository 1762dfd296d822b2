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

// The key (or value) rows a product reads: rows[0 .. count) of `heads` kv heads, row c of head
// g at rows[c] + g * head_stride; and the rows the caller reads next, next[0 .. next_count)
// (none: next_count 0). A product requests rows from memory a fixed distance ahead of its use;
// past its own last row it requests the next ones, so the stream of cache rows does not
// restart at each call (a decode step reads K rows, V rows, the next block's K rows, ...).
// The products go key by key through all the heads: in a cache laid out (keys, heads, dim)
// that reads memory in order, where one head after another read every row head_stride apart
// (bf16 decode, Sk 16k, 8 kv heads, one thread of a Zen 4: 6 GB/s head by head; a plain read
// loop pulls 12 in that order, 18 key by key).
template <typename In>
struct RowStream {
  const In* const* rows;
  int count;
  const In* const* next = nullptr;
  int next_count = 0;
  int heads = 1;
  int64_t head_stride = 0;
};

// How many fp32 lanes the products take at a time: 16 (one zmm) on a CPU that runs x86-64-v4
// (AVX-512), else 8. The sums' order, and so the bits, differ between the two.
// FLASHATTN_CPU_ROW_LANES=8 or 16 forces one (16 without AVX-512 is an error); unset or "auto":
// the default. Reads the environment, so a caller asks once per op, not per tile.
enum class RowLanes { k8 = 8, k16 = 16 };
RowLanes row_lanes();

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

}  // namespace flashattn::cpu
