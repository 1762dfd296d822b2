// One [B, S, H, D] tensor (element strides, contiguous last dimension) as the 4D TMA map the
// sm_90a kernels load tiles through, written once for the forward (make_fwd_sm90_maps) and the
// backward (make_bwd_sm90_maps): dims (D, S, H, B), byte strides of rows, heads and batches, boxes
// of (one 128-byte swizzle row of the head dimension: 64 16-bit columns, 128 of a UInt8 (e4m3)
// tensor; box_rows rows, 1 head, 1 batch) with the 128-byte swizzle; rows beyond S read as zeros.
// TMA needs 16-byte aligned base pointers and strides: every stride a multiple of 16 bytes.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/tensor_map.h"
#include "params.h"  // TensorView

namespace flashattn::hopper {

// Where one [B, S, H, D] tensor lives.
struct BshdTensor {
  const void* ptr = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // elements
  int seqlen = 0, heads = 0;
};

// view (AttnParams' strided [B, S, H, D] rows) as a map reads it: `rows` rows per batch (a varlen
// batch: the packed rows, batch 1). A dimension of extent 1 never steps its stride, which may then
// be 0 (a broadcast) or unaligned and TMA would refuse it: it gets 8 elements (16 bytes) instead.
inline BshdTensor bshd_tensor(const TensorView& view, int batch, int64_t rows, int heads) {
  const auto stride = [](int64_t s, int64_t extent) { return extent <= 1 ? int64_t{8} : s; };
  BshdTensor t;
  t.ptr = view.ptr;
  t.batch_stride = stride(view.batch_stride, batch);
  t.row_stride = stride(view.row_stride, rows);
  t.head_stride = stride(view.head_stride, heads);
  t.seqlen = static_cast<int>(rows);  // < 2^31: the plans' tma_view_ok
  t.heads = heads;
  return t;
}

// The bytes of one element: e4m3 (the FP8 forward) travels as UInt8, one byte per element and
// 128 per swizzle row; the 16-bit types take two, 64 per row.
inline uint64_t element_bytes(TensorMapDtype dtype) { return dtype == TensorMapDtype::UInt8 ? 1 : 2; }

// One of the map's two middle dimensions: a tensor's rows or its heads, in the order the box
// brings them to shared memory.
struct MapAxis {
  int64_t extent, stride;  // stride in elements
  int box;
};

// dims (D, inner, outer, B), boxes of (one 128-byte swizzle row of D, inner.box, outer.box, 1).
// "" on success, else the encoder's reason.
inline std::string encode_swizzled_map(TensorMap* map, TensorMapDtype dtype, int head_dim, int batch,
                                       const void* ptr, MapAxis inner, MapAxis outer,
                                       int64_t batch_stride) {
  TensorMapSpec spec;
  spec.dtype = dtype;
  spec.rank = 4;
  spec.global = ptr;
  const uint64_t bytes = element_bytes(dtype);
  spec.dims[0] = static_cast<uint64_t>(head_dim);
  spec.dims[1] = static_cast<uint64_t>(inner.extent);
  spec.dims[2] = static_cast<uint64_t>(outer.extent);
  spec.dims[3] = static_cast<uint64_t>(batch);
  spec.strides[0] = static_cast<uint64_t>(inner.stride) * bytes;
  spec.strides[1] = static_cast<uint64_t>(outer.stride) * bytes;
  spec.strides[2] = static_cast<uint64_t>(batch_stride) * bytes;
  spec.box[0] = static_cast<uint32_t>(128 / bytes);
  spec.box[1] = static_cast<uint32_t>(inner.box);
  spec.box[2] = static_cast<uint32_t>(outer.box);
  spec.swizzle = TensorMapSwizzle::B128;
  spec.l2_promotion = TensorMapL2Promotion::B128;
  return encode_tensor_map(map, spec);
}

// Rows before heads: dims (D, S, H, B), boxes of box_rows rows of one head.
inline std::string encode_bshd_map(TensorMap* map, TensorMapDtype dtype, int head_dim, int batch,
                                   const BshdTensor& t, int box_rows) {
  return encode_swizzled_map(map, dtype, head_dim, batch, t.ptr, {t.seqlen, t.row_stride, box_rows},
                             {t.heads, t.head_stride, 1}, t.batch_stride);
}

// Heads before rows: dims (D, H, S, B), boxes of (box_heads heads, box_rows rows), which land in
// shared memory row by row, box_heads consecutive heads of a row after another (the sm_90a
// forward's packed GQA rows; with box_heads = 1, the rows of one head as encode_bshd_map's box
// brings them).
inline std::string encode_head_major_map(TensorMap* map, TensorMapDtype dtype, int head_dim, int batch,
                                         const BshdTensor& t, int box_heads, int box_rows) {
  return encode_swizzled_map(map, dtype, head_dim, batch, t.ptr, {t.heads, t.head_stride, box_heads},
                             {t.seqlen, t.row_stride, box_rows}, t.batch_stride);
}

}  // namespace flashattn::hopper
