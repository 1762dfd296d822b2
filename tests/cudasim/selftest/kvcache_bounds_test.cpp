// The CUDA kernels on a KV cache with malformed indices, on the shim: on CUDA nothing checks
// cache_seqlens, block_table, cache_batch_idx or cache_leftpad on the host (that would need a
// device sync), so the append kernel and the forward kernels must clamp or skip them
// (kv_rows.h, kv_append.h, mask.h). Built with ASan, every tensor here is a heap block of
// exactly its size, so a read or write outside one is reported.
//   kvcache_bounds_test
// Exit 0: the append, both forward kernels and split-KV's merge ran on every malformed case, with
// each GQA group's query heads as tiles of their own and packed as the rows of one tile
// (cuda/gqa_decode.h).
#include <climits>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/gqa_decode.h"
#include "cuda/kv_append_kernel.cuh"
#include "cuda/launch_fwd.cuh"
#include "cuda/launch_simt.cuh"
#include "cuda/split_merge_kernel.cuh"

namespace {

using flashattn::AttnParams;
using flashattn::KvAppendParams;
using flashattn::TensorView;

constexpr int kHeadDim = 64;  // one 16-bit tile and one SIMT tile
constexpr int kHeadsQ = 2, kHeadsKv = 1, kBatch = 3, kSeqlenQ = 2, kSeqlenNew = 2;
constexpr int kPageSize = 5, kNumPages = 4, kMaxBlocks = 3;  // paged: capacity 15
constexpr int kCacheBatch = 2, kCacheRows = 12;  // dense, with cache_batch_idx: capacity 12
constexpr int kRotaryRows = 6, kRotaryDim = 16;

struct Case {
  const char* name;
  bool paged;
  std::vector<int> cache_seqlens;  // keys before the append; the forward sees + kSeqlenNew
  std::vector<int> block_table;    // paged: [kBatch, kMaxBlocks]
  std::vector<int> batch_index;    // dense: empty, or [kBatch]
  std::vector<int> leftpad;        // dense: empty, or [kBatch]
};

const std::vector<Case> kCases = {
    {"paged, pages outside the cache", true, {0, 7, 13},
     {0, -1, 4, 3, 1000, INT_MIN, INT_MAX, 2, -7}, {}, {}},
    {"paged, lengths past the table", true, {14, -3, INT_MAX - 1}, {0, 1, 2, 3, 0, 1, 2, 3, 0},
     {}, {}},
    {"dense, entries outside the cache", false, {3, 11, 0}, {}, {-1, 2, INT_MAX}, {}},
    {"dense, lengths past the cache", false, {12, INT_MIN, 100}, {}, {1, 0, 1}, {}},
    {"dense, leftpad past the keys", false, {5, 2, 9}, {}, {}, {6, -4, INT_MAX}},
};

// [batch, rows, heads, dim] contiguous.
TensorView dense_view(void* data, int rows, int heads, int dim) {
  return {data, int64_t(rows) * heads * dim, int64_t(heads) * dim, dim};
}

void no_check() {}

template <typename Storage>
void run_case(const Case& c, bool fp32, int splits, bool packed) {
  // Without cache_batch_idx a dense cache has one entry per sequence (the op checks the shape).
  const int cache_entries = c.paged ? kNumPages : (c.batch_index.empty() ? kBatch : kCacheBatch);
  const int cache_rows = c.paged ? kPageSize : kCacheRows;
  std::vector<Storage> q(kBatch * kSeqlenQ * kHeadsQ * kHeadDim, Storage(1)), q_rotated(q.size()),
      o(q.size());
  std::vector<Storage> k_new(kBatch * kSeqlenNew * kHeadsKv * kHeadDim, Storage(1)),
      v_new(k_new.size(), Storage(1));
  std::vector<Storage> k_cache(cache_entries * cache_rows * kHeadsKv * kHeadDim, Storage(1)),
      v_cache(k_cache.size(), Storage(1));
  std::vector<Storage> cos(kRotaryRows * kRotaryDim / 2, Storage(1)), sin(cos.size());
  std::vector<float> lse(kBatch * kHeadsQ * kSeqlenQ);
  // Split-KV's parts, as the executor lays them out (mask.h): every split's o, then every
  // split's lse.
  std::vector<float> split_scratch(splits * (q.size() + lse.size()), 0.f);
  std::fill(split_scratch.begin() + splits * q.size(), split_scratch.end(),
            -std::numeric_limits<float>::infinity());
  std::vector<int> cache_seqlens = c.cache_seqlens, table = c.block_table,
                   batch_index = c.batch_index, leftpad = c.leftpad, seqused_k(kBatch);
  // The forward's lengths, as the op computes them on the device (cache_seqlens + seqlen_new),
  // with int overflow kept out of the test itself.
  for (int b = 0; b < kBatch; ++b)
    seqused_k[b] = cache_seqlens[b] > INT_MAX - kSeqlenNew ? INT_MAX : cache_seqlens[b] + kSeqlenNew;

  flashattn::KvCache cache;
  if (c.paged) {
    cache.block_table = table.data();
    cache.block_table_stride = kMaxBlocks;
    cache.max_blocks = kMaxBlocks;
    cache.page_size = kPageSize;
    cache.num_pages = kNumPages;
  }
  if (!batch_index.empty()) {
    cache.batch_index = batch_index.data();
    cache.cache_batch = kCacheBatch;
  }
  const int capacity = c.paged ? kMaxBlocks * kPageSize : kCacheRows;

  KvAppendParams a;
  a.k_new = dense_view(k_new.data(), kSeqlenNew, kHeadsKv, kHeadDim);
  a.v_new = dense_view(v_new.data(), kSeqlenNew, kHeadsKv, kHeadDim);
  a.k_cache = dense_view(k_cache.data(), cache_rows, kHeadsKv, kHeadDim);
  a.v_cache = dense_view(v_cache.data(), cache_rows, kHeadsKv, kHeadDim);
  a.cache = cache;
  a.cache_seqlens = cache_seqlens.data();
  a.capacity = capacity;
  a.batch = kBatch;
  a.seqlen_new = kSeqlenNew;
  a.heads_kv = kHeadsKv;
  a.head_dim = kHeadDim;
  a.head_dim_v = kHeadDim;
  a.cos = {cos.data(), 0, kRotaryDim / 2, 0};  // [rows, rotary_dim / 2]
  a.sin = {sin.data(), 0, kRotaryDim / 2, 0};
  a.rotary_dim = kRotaryDim;
  a.rotary_rows = kRotaryRows;
  a.q = dense_view(q.data(), kSeqlenQ, kHeadsQ, kHeadDim);
  a.q_rotated = dense_view(q_rotated.data(), kSeqlenQ, kHeadsQ, kHeadDim);
  a.seqlen_q = kSeqlenQ;
  a.heads_q = kHeadsQ;
  a.q_position_per_token = true;

  AttnParams p;
  p.q = a.q_rotated;
  p.k = a.k_cache;
  p.v = a.v_cache;
  p.o = dense_view(o.data(), kSeqlenQ, kHeadsQ, kHeadDim);
  p.lse = {lse.data(), int64_t(kHeadsQ) * kSeqlenQ, 1, kSeqlenQ};  // [B, Hq, Sq]
  p.batch = kBatch;
  p.seqlen_q = kSeqlenQ;
  p.seqlen_k = capacity;
  p.total_q = int64_t(kBatch) * kSeqlenQ;
  p.total_k = int64_t(kBatch) * capacity;
  p.seqused_k = seqused_k.data();
  p.kv_cache = cache;
  p.kv_cache.leftpad = leftpad.empty() ? nullptr : leftpad.data();
  p.heads_q = kHeadsQ;
  p.heads_kv = kHeadsKv;
  p.head_group = kHeadsQ / kHeadsKv;
  p.head_dim = kHeadDim;
  p.head_dim_v = kHeadDim;
  p.scale = 0.125f;
  p.window_right = 0;  // causal: the masks read the clamped lengths too
  p.align_bottom_right = true;
  p.num_splits = splits;
  float* split_scratch_ptr = splits > 1 ? split_scratch.data() : nullptr;

  using namespace flashattn::cuda;
  // The forward as the executor runs it (executor.h): packed or not; the merge unpacked.
  const AttnParams fwd = packed ? pack_gqa_decode(p) : p;
  if (packed != (fwd.packed_heads > 1)) {
    std::printf("%s: packed_heads %d\n", c.name, fwd.packed_heads);
    std::exit(1);
  }
  if (fp32) {
    run_kv_append<float>(a, nullptr, &no_check);
    run_fwd_simt<kHeadDim>(fwd, split_scratch_ptr, nullptr, &no_check);
    if (splits > 1) run_split_merge<float>(p, split_scratch_ptr, nullptr, &no_check);
  } else {
    run_kv_append<__nv_bfloat16>(a, nullptr, &no_check);
    run_fwd_16bit<__nv_bfloat16, kHeadDim, kHeadDim>(fwd, split_scratch_ptr, nullptr, &no_check);
    if (splits > 1) run_split_merge<__nv_bfloat16>(p, split_scratch_ptr, nullptr, &no_check);
  }
  std::printf("%s (%s, %d split%s%s): ran\n", c.name, fp32 ? "fp32" : "bf16", splits,
              splits > 1 ? "s" : "", packed ? ", packed heads" : "");
}

}  // namespace

namespace flashattn::cuda {
template void run_kv_append<__nv_bfloat16>(const KvAppendParams&, cudaStream_t, LaunchCheck);
template void run_kv_append<float>(const KvAppendParams&, cudaStream_t, LaunchCheck);
template void run_fwd_16bit<__nv_bfloat16, kHeadDim, kHeadDim>(const AttnParams&, float*,
                                                               cudaStream_t, LaunchCheck);
template void run_fwd_simt<kHeadDim>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
template void run_split_merge<__nv_bfloat16>(const AttnParams&, const float*, cudaStream_t, LaunchCheck);
template void run_split_merge<float>(const AttnParams&, const float*, cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda

int main() {
  for (const Case& c : kCases)
    for (int splits : {1, 3})
      for (bool packed : {false, true}) {
        run_case<uint16_t>(c, /*fp32=*/false, splits, packed);
        run_case<float>(c, /*fp32=*/true, splits, packed);
      }
  std::printf("all cases ran\n");
  return 0;
}
