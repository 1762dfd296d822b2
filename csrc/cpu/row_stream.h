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
// does not see a stream: the products request each row from memory themselves.
//
// Ahead of their work (NextRows, below): each step of a product, a few keys through one head,
// requests the rows of the same head kKeysAhead keys later into L2, one line per 64 bytes of
// its own rows, spread over its products: a burst for all heads of a key at once stalled on the
// full miss queue, and 32 keys ahead read a decode's cache fastest (16, 64 and 128 slower;
// docs/lab/2026-12-03-cpu-comment-ledgers.md).
constexpr int kKeysAhead = 32;

// At a product's start (prefetch_first_rows): its first kRowsAheadToL2 keys, the first
// kRowsAheadToL1 of them into L1. After a call whose next rows these were (RowStream::next),
// most are in flight or cached already: a hit. Before the products requested rows ahead, a
// bf16 decode waited on each row's first touch for 74% of its time (one head at a time).
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

// Before row 0: its first rows (kRowsAheadToL1, kRowsAheadToL2 above).
template <typename In>
FLASHATTN_ROW_STEP void prefetch_first_rows(const RowStream<In>& stream, int dim) {
  for (int c = 0; c < kRowsAheadToL1 && c < stream.count; ++c) prefetch_key<3>(stream, c, dim);
  for (int c = kRowsAheadToL1; c < kRowsAheadToL2 && c < stream.count; ++c)
    prefetch_key<2>(stream, c, dim);
}

// Head g's rows of kKeys keys from `first` of a stream (the stream's next rows past its end;
// null where there are none), which a step of a product requests into L2 as it works.
template <int kKeys, typename In>
struct NextRows {
  const char* row[kKeys];
  NextRows(const RowStream<In>& stream, int first, int g) {
    for (int j = 0; j < kKeys; ++j) {
      const In* first_head = stream_row(stream, first + j);
      row[j] = first_head ? reinterpret_cast<const char*>(first_head + g * stream.head_stride)
                          : nullptr;
    }
  }
  // The lines of each row that start in bytes [from, to): called for consecutive ranges, it
  // requests each line once.
  FLASHATTN_ROW_STEP void request(int64_t from, int64_t to) const {
    for (int j = 0; j < kKeys; ++j)
      for (int64_t byte = (from + 63) / 64 * 64; row[j] && byte < to; byte += 64)
        __builtin_prefetch(row[j] + byte, 0, 2);
  }
};

}  // namespace row_stream
}  // namespace flashattn::cpu
