// Which (query block, key block) tiles a mask leaves visible. Both bounds of a row's visible key
// range grow with the row (mask.h), so checking a block's first and last rows is enough.
#pragma once
#include <algorithm>

#include "../mask.h"

namespace flashattn::cpu {

enum class TileVisibility {
  kNone,     // no row of the tile sees any of its keys: skip the tile
  kPartial,  // a boundary tile: mask element by element
  kFull,     // every row sees every key: no masking
};

// Tile of query rows [row_begin, row_end) and keys [key_begin, key_end); both ranges non-empty.
inline TileVisibility tile_visibility(const Sequence& s, int row_begin, int row_end,
                                      int key_begin, int key_end) {
  const int span_begin = first_visible_key(s, row_begin);
  const int span_end = visible_key_end(s, row_end - 1);
  if (span_end <= key_begin || span_begin >= key_end || span_begin >= span_end)
    return TileVisibility::kNone;
  const bool all_visible = first_visible_key(s, row_end - 1) <= key_begin &&
                           visible_key_end(s, row_begin) >= key_end;
  return all_visible ? TileVisibility::kFull : TileVisibility::kPartial;
}

// Key blocks [first, last) of size block_size that rows [row_begin, row_end) may see.
struct BlockRange {
  int first = 0;
  int last = 0;
};

inline BlockRange visible_key_blocks(const Sequence& s, int row_begin, int row_end,
                                     int block_size) {
  const int span_begin = first_visible_key(s, row_begin);
  const int span_end = std::min(visible_key_end(s, row_end - 1), s.seqlen_k);
  if (span_begin >= span_end) return {};
  return {span_begin / block_size, (span_end + block_size - 1) / block_size};
}

inline int num_blocks(int length, int block_size) {
  return (length + block_size - 1) / block_size;
}

}  // namespace flashattn::cpu
