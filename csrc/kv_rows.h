// Where a sequence's keys and values are: rows of the k / v views, or rows of the pages of a
// paged KV cache (params.h, KvCache). Every executor reads keys through key_row(), so a paged
// cache, cache_batch_idx and cache_leftpad need nothing else from the kernels.
#pragma once
#include "mask.h"
#include "params.h"

namespace flashattn {

// Where key j of sequence s is in a paged cache (cache.paged()): row `row` of page `page`,
// the same for its key and its value. j < s.seqlen_k, which sequence_of keeps within the block
// table's max_blocks * page_size; a page index outside the cache is clamped, so a bad table
// never leads a kernel out of its tensors (the CPU checks it on the host).
struct PageRow {
  int page;
  int row;
};
FLASHATTN_HOST_DEVICE PageRow page_row_of(const KvCache& cache, const Sequence& s, int j) {
  const int entry = cache.page_size.div(j);
  const int page =
      clamp_index(cache.block_table[s.batch * cache.block_table_stride + entry], cache.num_pages);
  return {page, cache.page_size.mod(j, entry)};
}

// Key (or value) j of sequence s, head h, in a paged cache's view kv (page_row_of).
template <typename T>
FLASHATTN_HOST_DEVICE T* paged_key_row(const TensorView& kv, const KvCache& cache,
                                       const Sequence& s, int h, int j) {
  const PageRow at = page_row_of(cache, s, j);
  return kv.row<T>(at.page, h, at.row);
}

// Key (or value) j of sequence s, head h, in view kv: a page's row, or row k_row0 + j of batch
// entry kv_batch (cache_batch_idx, leftpad and varlen offsets are in those two).
template <typename T>
FLASHATTN_HOST_DEVICE T* key_row(const TensorView& kv, const KvCache& cache, const Sequence& s,
                                 int h, int j) {
  if (cache.paged()) return paged_key_row<T>(kv, cache, s, h, j);
  return kv.row<T>(s.kv_batch, h, s.k_row0 + j);
}

// Whether the keys are the plain rows [k_row0, k_row0 + seqlen_k) of batch entry `batch`.
FLASHATTN_HOST_DEVICE bool keys_in_place(const KvCache& cache) {
  return !cache.paged() && cache.batch_index == nullptr;
}

}  // namespace flashattn
