// Dropout on the CPU kernels' probability tiles (../dropout.h): the same decisions as every
// other executor, one Philox call per four keys of a query row.
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../dropout.h"
#include "../params.h"

namespace flashattn::cpu {

// The keep factor of a kept probability in the compute type: 1 / (1 - p).
template <typename T>
T keep_scale(const Dropout& d) {
  return std::is_same_v<T, double> ? static_cast<T>(d.keep_scale_fp64)
                                   : static_cast<T>(d.keep_scale);
}

// The draws of row `row` of head (b, h) walked key by key from `key`, one Philox call per four
// keys. The keys may start anywhere in a group of four: a block of a larger attention
// (context parallelism, mask.h Sequence::key_offset) starts at any key of the whole one.
class KeyDraws {
 public:
  KeyDraws(const DropoutSeed& seed, int b, int h, int row, int key)
      : seed_(seed), b_(b), h_(h), row_(row), key_(key),
        draws_(dropout_draws(seed, b, h, row, key / 4)) {}
  // The draw of the current key; then on to the next one.
  uint32_t next() {
    const uint32_t draw = draws_.word[key_ % 4];
    if (++key_ % 4 == 0) draws_ = dropout_draws(seed_, b_, h_, row_, key_ / 4);
    return draw;
  }

 private:
  DropoutSeed seed_;
  int b_, h_, row_, key_;
  PhiloxBlock draws_;
};

// Keep decisions for queries [row_begin, row_begin + rows) x keys [key_begin, key_begin + cols)
// of head (b, h), in the whole attention's coordinates, into keep[key][query] (row stride
// ld): the layout of the backward's transposed tiles.
inline void dropout_keeps_transposed(const Dropout& d, const DropoutSeed& seed, int b, int h,
                                     int row_begin, int rows, int key_begin, int cols,
                                     uint8_t* keep, int ld) {
  for (int r = 0; r < rows; ++r) {
    KeyDraws draws(seed, b, h, row_begin + r, key_begin);
    for (int c = 0; c < cols; ++c) keep[size_t(c) * ld + r] = dropout_keeps(d, draws.next());
  }
}

// tile[i] = keep[i] ? tile[i] * scale : 0 over a rows x cols block (row stride ld for both).
template <typename T>
void apply_keeps(const uint8_t* keep, T* tile, int rows, int cols, int ld, T scale) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      tile[size_t(r) * ld + c] = keep[size_t(r) * ld + c] ? tile[size_t(r) * ld + c] * scale : T(0);
}

// Drops P_ij in place in the forward's tile: queries [row_begin, +rows) (tile rows, stride ld)
// x keys [key_begin, +cols), in the whole attention's coordinates; kept values are scaled by
// 1 / (1 - p).
template <typename T>
void dropout_rows(const Dropout& d, const DropoutSeed& seed, int b, int h, int row_begin, int rows,
                  int key_begin, int cols, T* tile, int ld) {
  const T scale = keep_scale<T>(d);
  for (int r = 0; r < rows; ++r) {
    T* row = tile + size_t(r) * ld;
    KeyDraws draws(seed, b, h, row_begin + r, key_begin);
    for (int c = 0; c < cols; ++c) row[c] = dropout_keeps(d, draws.next()) ? row[c] * scale : T(0);
  }
}

}  // namespace flashattn::cpu
