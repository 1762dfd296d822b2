// The forwards' key sources: where their K and V tiles come from, behind one interface, for
// the three ways a sequence's keys are kept (kv_rows.h):
//   rows     the plain rows [k_row0, k_row0 + seqlen_k) of its batch entry of k / v;
//   paged    rows of the pages a block table names (a paged KV cache);
//   indexed  rows of another batch entry (cache_batch_idx), from a left pad on (cache_leftpad).
// The kernel asks for a tile (`load`) and, before it, for the tile's rows to be looked up
// (`look_up`); which of the copies below runs is the source's business.
//
// SimtKeySource, below, is the fp32 SIMT forward's: the same layouts through key_row.
//
// The copies, by kernel: in the one-m-tile kernel, which runs decoding steps on a cache
// (gqa_decode.h), every copy is unrolled (tile_io.cuh, TileChunks), a paged cache's rows read
// from a table of row addresses the CTA writes once per tile (paged_row_table.cuh), an indexed
// entry's as strided rows. Not in the two-m-tile kernels (their registers are full), nor above
// d = 128 (d = 256 spilled 40-48 bytes): there plain rows are unrolled and a cache's copies keep
// the rolled loop with a page lookup per chunk (Traits::kUnrolledCacheCopies).
#pragma once
#include <cstdint>

#include "../kv_rows.h"
#include "../params.h"
#include "paged_row_table.cuh"
#include "ptx.cuh"
#include "tile_io.cuh"

namespace flashattn::cuda {

template <typename Traits>
struct KeySource {
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNThreads = Traits::kNThreads;
  static constexpr bool kUnrolledCacheCopies = Traits::kUnrolledCacheCopies;
  using RowTable = PagedRowTable<kBlockN, kNThreads>;
  static_assert(!kUnrolledCacheCopies || Traits::kPagedRowTableBytes == RowTable::kBytes,
                "traits.h sizes the row table");

  const AttnParams& p;  // a kernel parameter, outliving the source
  // A copy, not a reference: through a pointer to the kernel's Sequence its fields are
  // reloaded after each inline asm (score_rules.cuh, ScoreRules::seq).
  Sequence seq;
  int batch, head_kv;
  bool keys_in_rows;  // the plain rows of batch entry `batch` (kv_rows.h, keys_in_place)
  bool paged_table;   // a paged cache's rows come from row_table (look_up before each tile)
  bool aligned;       // every copy's rows and columns are whole 16-byte chunks
  RowTable row_table;

  // The kernel's SharedStorage (traits.h) holds the row table where the copies read one.
  __device__ __forceinline__ static KeySource make(const AttnParams& p, const Sequence& seq,
                                                   int batch, int head_kv, bool aligned,
                                                   typename Traits::SharedStorage& shared) {
    const uint16_t** row_table = nullptr;  // never read without kUnrolledCacheCopies
    if constexpr (kUnrolledCacheCopies) row_table = shared.row_table;
    return {p,
            seq,
            batch,
            head_kv,
            keys_in_place(p.kv_cache),
            kUnrolledCacheCopies && p.kv_cache.paged(),
            aligned,
            RowTable{row_table}};
  }

  // Where paged_table: writes tile `tile`'s rows into the table, for its copies; the caller's
  // barrier then orders them before the tile's copies. Two buffers, by tile parity
  // (paged_row_table.cuh): tile + 1's may be written while tile's V copy still reads.
  __device__ __forceinline__ void look_up(int tile) const {
    row_table.write(p, seq, head_kv, tile);
  }

  // K's tile `tile` into k_tile (kBlockN rows of the tile's head dim), its first `cols` columns
  // (head_dim).
  template <typename Tile>
  __device__ __forceinline__ void load_keys(const Tile& k_tile, int tile, int cols) const {
    copy<false>(k_tile, tile, cols);
  }
  // V's tile `tile` into v_tile (its own width: MLA's 576 tile holds 512 columns).
  template <typename Tile>
  __device__ __forceinline__ void load_values(const Tile& v_tile, int tile, int cols) const {
    copy<true>(v_tile, tile, cols);
  }

 private:
  // Tile `tile` of K (kValues false) or V into dst, as one cp.async group. The [Sk, D]
  // base of this (batch, kv head) is recomputed per copy rather than kept across the loop: with
  // two m-tiles per warp, those four registers made the d = 128 kernel spill.
  template <bool kValues, typename Tile>
  __device__ __forceinline__ void copy(const Tile& dst, int tile, int cols) const {
    static_assert(Tile::kRows == kBlockN, "a key tile's rows");
    const TensorView& view = kValues ? p.v : p.k;
    const int n_start = tile * kBlockN;
    const int rows_valid = seq.seqlen_k - n_start;
    if constexpr (kUnrolledCacheCopies) {
      if (!p.kv_cache.paged()) {
        const uint16_t* gmem = view.row<const uint16_t>(seq.kv_batch, head_kv, seq.k_row0);
        load_tile_async<kNThreads, true>(
            dst, gmem + n_start * view.row_stride, view.row_stride, rows_valid, cols,
            aligned);
      } else {
        // This tile's rows from the table (written before the barrier preceding this copy).
        const int table_view = kValues ? RowTable::kValues : RowTable::kKeys;
        load_rows_async<kNThreads, true>(
            dst, [&](int r) { return row_table.row_of(tile, r, table_view); },
            view.row<const uint16_t>(0, head_kv, 0), rows_valid, cols, aligned);
      }
    } else {
      const uint16_t* gmem = view.row<const uint16_t>(keys_in_rows ? batch : 0, head_kv,
                                                     keys_in_rows ? seq.k_row0 : 0);
      if (keys_in_rows) {
        load_tile_async<kNThreads, true>(
            dst, gmem + n_start * view.row_stride, view.row_stride, rows_valid, cols,
            aligned);
      } else {
        load_rows_async<kNThreads>(
            dst,
            [&](int r) {
              return key_row<const uint16_t>(view, p.kv_cache, seq, head_kv, n_start + r);
            },
            gmem, rows_valid, cols, aligned);
      }
    }
    ptx::cp_async_commit();
  }
};

// The fp32 SIMT forward's key source (simt_kernels.cuh): the same three layouts, its 32-key
// tiles copied row by row through key_row (kv_rows.h) into smem of pitch Traits::kSmemStride.
template <typename Traits>
struct SimtKeySource {
  static constexpr int kTileKeys = kWarpSize;  // a lane per key

  const AttnParams& p;  // a kernel parameter, outliving the source
  Sequence seq;         // a copy, as KeySource's
  int head_kv;

  __device__ __forceinline__ static SimtKeySource make(const AttnParams& p, const Sequence& seq,
                                                       int head_kv) {
    return {p, seq, head_kv};
  }

  // K's 32-key tile `tile` into k_tile ([32, head dim] floats), its first `cols` columns; keys
  // past the sequence and columns past `cols` become 0.
  template <typename Tile>
  __device__ __forceinline__ void load_keys(const Tile& k_tile, int tile, int cols) const {
    copy(p.k, k_tile, tile, cols);
  }
  // V's tile the same way (cols: head_dim_v).
  template <typename Tile>
  __device__ __forceinline__ void load_values(const Tile& v_tile, int tile, int cols) const {
    copy(p.v, v_tile, tile, cols);
  }

 private:
  template <typename Tile>
  __device__ __forceinline__ void copy(const TensorView& view, const Tile& dst, int tile,
                                       int cols) const {
    static_assert(Tile::kRows == kTileKeys, "a key tile's rows");
    const int n_start = tile * kTileKeys;
    load_rows_f32<Traits::kNThreads>(
        dst,
        [&](int r) { return key_row<const float>(view, p.kv_cache, seq, head_kv, n_start + r); },
        seq.seqlen_k - n_start, cols);
  }
};

}  // namespace flashattn::cuda
