// Argument checks and tensor views shared by the ops' host code (attn_args.cpp,
// kvcache_args.cpp). Every error names the argument and says what was expected and given.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <climits>
#include <cstdint>

#include "params.h"

namespace flashattn {

inline void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, "flashattn: ", name,
              " must be contiguous in its last (head_dim) dimension, got strides ", t.strides(),
              "; call .contiguous() on it first");
}

inline void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.device() == q.device(), "flashattn: ", name, " must be on the same device as q (",
              q.device(), "), got ", t.device());
}

inline void check_fits_int(int64_t value, const char* what) {
  TORCH_CHECK(value <= INT_MAX, "flashattn: ", what, " must be at most ", INT_MAX, ", got ",
              value);
}

// An int32 vector of lengths on q's device, read in place (so contiguous).
inline void check_lengths_tensor(const at::Tensor& t, const char* name, int64_t size,
                                 const char* size_meaning, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == at::kInt, "flashattn: ", name, " must be int32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.size(0) == size, "flashattn: ", name, " must have shape [",
              size, "] (", size_meaning, "), got ", t.sizes());
  check_same_device(t, name, q);
  TORCH_CHECK(t.is_contiguous(), "flashattn: ", name, " must be contiguous, got strides ",
              t.strides());
}

// Attention rows: [batch, seqlen, heads, dim], or a varlen [total, heads, dim] (batch stride 0:
// the sequences' row offsets find them).
inline TensorView rows_view(const at::Tensor& t, bool varlen) {
  void* ptr = const_cast<void*>(t.data_ptr());
  if (varlen) return {ptr, 0, t.stride(0), t.stride(1)};
  return {ptr, t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace flashattn
