// The stream of key and value rows the row products read (row_products.h): which rows, across
// how many kv heads, and which come next; and how the products request them from memory ahead
// of their use. Shared by the fp32 products (row_products.cpp) and the vdpbf16ps ones
// (row_products_dot.cpp).
#pragma once
#include <cstdint>

#include "simd.h"

namespace flashattn::cpu {

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

namespace row_stream {

// Rows of a cache are far apart (other heads lie between them), so the hardware prefetcher
// does not see a stream: each key is requested ahead of its use (its row in every head of the
// stream), twice. (The vdpbf16ps products, row_products_dot.cpp, request rows differently:
// spread over their work, one head at a time, 32 keys ahead; there bursts for all heads stalled
// on the full miss queue.) kRowsAheadToL1 keys before, into L1, or every row's first touch waits for
// memory (74% of the time of a bf16 decode in perf, one head at a time). kRowsAheadToL2 keys
// before, into L2: more requests in flight than L1's fill buffers hold, for DRAM's latency
// (bf16 decode, B = 8, Sk = 16k, 2 threads, one head at a time: 12.1 -> 15.1 GB/s; 20.1 -> 17.7
// on a cache small enough to stay in L3, which decoding rarely is). Key by key through 8 heads
// (2 KB a key) on a Zen 4, 0, 1 or 6 keys to L1 and 8, 16 or 32 to L2 were all within noise of
// each other (17-19 GB/s, 2 threads).
constexpr int kRowsAheadToL1 = 6;
constexpr int kRowsAheadToL2 = 16;

// Locality 3: prefetcht0 (into L1); 2: prefetcht1 (into L2).
template <int kLocality, typename In>
FLASHATTN_ROW_STEP void prefetch_whole_row(const In* row, int dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t byte = 0; byte < int64_t(dim) * int64_t(sizeof(In)); byte += 64)
    __builtin_prefetch(bytes + byte, 0, kLocality);
}

// Row `at` (of the first head) of the stream, counting on into the next rows; null past them.
template <typename In>
FLASHATTN_ROW_STEP const In* stream_row(const RowStream<In>& stream, int at) {
  if (at < stream.count) return stream.rows[at];
  return at - stream.count < stream.next_count ? stream.next[at - stream.count] : nullptr;
}

// Requests row `at` of every head of the stream (if there is one), into L1 or L2.
template <int kLocality, typename In>
FLASHATTN_ROW_STEP void prefetch_key(const RowStream<In>& stream, int at, int dim) {
  const In* row = stream_row(stream, at);
  if (row == nullptr) return;
  for (int g = 0; g < stream.heads; ++g)
    prefetch_whole_row<kLocality>(row + g * stream.head_stride, dim);
}

// Row c is next: requests the rows kRowsAheadToL1 and kRowsAheadToL2 after it.
template <typename In>
FLASHATTN_ROW_STEP void prefetch_ahead_of(const RowStream<In>& stream, int c, int dim) {
  prefetch_key<3>(stream, c + kRowsAheadToL1, dim);
  prefetch_key<2>(stream, c + kRowsAheadToL2, dim);
}

// Before row 0: what prefetch_ahead_of would have requested for the rows before it. (After a
// call whose next rows these were, most are in flight or cached already: a hit.)
template <typename In>
FLASHATTN_ROW_STEP void prefetch_first_rows(const RowStream<In>& stream, int dim) {
  for (int c = 0; c < kRowsAheadToL1 && c < stream.count; ++c) prefetch_key<3>(stream, c, dim);
  for (int c = kRowsAheadToL1; c < kRowsAheadToL2 && c < stream.count; ++c)
    prefetch_key<2>(stream, c, dim);
}

}  // namespace row_stream
}  // namespace flashattn::cpu
