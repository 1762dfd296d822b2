// The sm_90a forward's gathering producer (issue 31): K and V tiles of a KV cache whose rows are
// not one TMA box away from each other (a paged cache, cache_batch_idx, cache_leftpad; kv_rows.h
// key_row maps a key to its row), loaded by the producer warpgroup's 128 threads with 16-byte
// cp.async into the 128-byte swizzled layout a TMA box leaves, so the consumers read the tile as
// they read a TMA tile. Rows past the sequence are zero-filled (cp.async with 0 source bytes).
//
// cp.async writes shared memory through the generic proxy and wgmma reads through the async
// proxy: each thread waits for its own copies, fences (fence.proxy.async) and arrives on the
// stage's full barrier, whose count is the producer's 128 threads (kGatherThreads). K and V of a
// tile are one cp.async group each; the kernel announces a tile only after issuing the next one
// (announce_gathered_tile), so two tiles' copies are in flight while it waits for a free stage.
// The FP8 (e4m3) kernel gathers the same way, one 128-byte row per key at d = 128, and then
// transposes each announced V tile into V^T (fwd_sm90_kernel.cuh transpose_gathered_v).
#pragma once
#include <cstdint>

#include "cuda/hopper/fwd_sm90_config.h"
#include "cuda/hopper/fwd_sm90_params.h"
#include "cuda/ptx.cuh"
#include "kv_rows.h"

namespace flashattn::hopper {

constexpr int kGatherThreads = 128;  // the producer warpgroup

// Sequence `batch`'s keys in the cache, as sequence.h sequence_of finds them (only the fields
// key_row and the kernel read): a varlen paged batch takes its lengths from cu_seqlens_k, then
// seqused_k (cache_seqlens), then the left pad moves the first key and shortens the sequence.
__device__ __forceinline__ Sequence cache_sequence(const FwdSm90Params& p, int batch) {
  Sequence s;
  s.batch = s.kv_batch = batch;
  int length_k = p.seqlen_k;
  if (p.cu_seqlens_k != nullptr) {
    if (p.kv_cache.paged()) {
      const int64_t length = int64_t(p.cu_seqlens_k[batch + 1]) - p.cu_seqlens_k[batch];
      length_k = static_cast<int>(length < 0 ? 0 : (length > p.seqlen_k ? p.seqlen_k : length));
    } else {
      clamped_range(p.cu_seqlens_k, batch, p.total_k, p.seqlen_k, s.k_row0, length_k);
    }
  }
  s.seqlen_k = used_length(p.seqused_k, batch, length_k);
  if (p.kv_cache.batch_index != nullptr)
    s.kv_batch = clamp_index(p.kv_cache.batch_index[batch], p.kv_cache.cache_batch);
  if (p.kv_cache.leftpad != nullptr) {
    const int pad = used_length(p.kv_cache.leftpad, batch, s.seqlen_k);
    s.k_row0 += pad;
    s.seqlen_k -= pad;
  }
  return s;
}

// Key tile n_block of `view` (K or V) into `tile` (kHeadDim * sizeof(Word) / 128 chunks of kBlockN
// swizzled 128-byte rows), issued by producer thread `thread` (0..127) as part of one cp.async
// group the caller commits. Word is an element's size as an integer type: uint16_t (f16, bf16:
// two 64-element chunks at d = 128), uint8_t (e4m3: one 128-element chunk at d = 128, the layout
// e4m3's TMA box leaves, which S and the V^T transpose read). Warp w takes the tile's rows [w * kBlockN / 4, (w + 1) * kBlockN / 4); its lane
// l looks up row l of them once, and the copies take that address by shuffle. Consecutive lanes
// copy consecutive 16-byte pieces of a row, so a warp reads whole rows.
template <int kHeadDim, int kBlockN, typename Word = uint16_t>
__device__ __forceinline__ void gather_kv_tile(unsigned char* tile, const TensorView& view,
                                               const KvCache& cache, const Sequence& seq,
                                               int head_kv, int n_block, int thread) {
  constexpr int kPieceElems = 16 / static_cast<int>(sizeof(Word));
  constexpr int kPiecesPerRow = kHeadDim / kPieceElems;  // 16-byte pieces
  constexpr int kRowsPerWarp = kBlockN / (kGatherThreads / 32);
  constexpr int kRowsPerPass = 32 / kPiecesPerRow;
  static_assert(kRowsPerWarp <= 32 && 32 % kPiecesPerRow == 0 && kRowsPerWarp % kRowsPerPass == 0,
                "a warp's rows: one lookup per lane, whole rows per pass");
  constexpr uint32_t kChunkBytes = kBlockN * kSwizzleRowBytes;
  const int lane = thread % 32, first_row = (thread / 32) * kRowsPerWarp;
  const int tile_key0 = n_block * kBlockN + first_row;
  const int my_key = tile_key0 + lane;
  const Word* my_row = static_cast<const Word*>(view.ptr);  // read by no copy unless valid
  if (lane < kRowsPerWarp && my_key < seq.seqlen_k)
    my_row = key_row<const Word>(view, cache, seq, head_kv, my_key);
  const uint64_t my_address = reinterpret_cast<uint64_t>(my_row);
  const int piece = lane % kPiecesPerRow, chunk = piece / 8;
  // Rolled: the producer keeps 24 registers (setmaxnreg), and two passes at once spilled.
#pragma unroll 1
  for (int pass = 0; pass < kRowsPerWarp / kRowsPerPass; ++pass) {
    const int r = pass * kRowsPerPass + lane / kPiecesPerRow;  // of the warp's rows
    const uint32_t lo = __shfl_sync(0xffffffffu, static_cast<uint32_t>(my_address), r);
    const uint32_t hi = __shfl_sync(0xffffffffu, static_cast<uint32_t>(my_address >> 32), r);
    const Word* row = reinterpret_cast<const Word*>((static_cast<uint64_t>(hi) << 32) | lo);
    const int row_in_tile = first_row + r;
    // The 128-byte swizzle: 16-byte piece j of row r lands at j ^ (r % 8) within the row.
    unsigned char* dst = tile + chunk * kChunkBytes + row_in_tile * kSwizzleRowBytes +
                         16 * ((piece % 8) ^ (row_in_tile % 8));
    ptx::cp_async_16(dst, row + kPieceElems * piece, tile_key0 + r < seq.seqlen_k ? 16 : 0);  // SITE:gather_kv
  }
}

// Announces a gathered tile's K and V to the consumers once this thread's copies of them are
// done: its K group, then its V group, each followed by this thread's fence and its arrival.
// kNewerGroups is how many groups the thread committed after the tile's two (those stay in
// flight).
template <int kNewerGroups>
__device__ __forceinline__ void announce_gathered_tile(uint64_t* k_full, uint64_t* v_full) {
  ptx::cp_async_wait<kNewerGroups + 1>();
  ptx::fence_proxy_async_shared_cta();  // SITE:gather_k_fence
  ptx::mbarrier_arrive(k_full);
  ptx::cp_async_wait<kNewerGroups>();
  ptx::fence_proxy_async_shared_cta();
  ptx::mbarrier_arrive(v_full);  // SITE:gather_v_arrive
}

}  // namespace flashattn::hopper
