// attn_mask, F.scaled_dot_product_attention's mask, on the host: its checks, its broadcast
// view for the kernels, the classification of its blocks that lets the kernels skip hidden
// tiles and take the unmasked path through open ones, and its gradient's reduction.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

#include "params.h"

namespace flashattn {

// Validates attn_mask (bool, q's dtype or float32, broadcastable to [batch, heads, seqlen_q,
// seqlen_k]) against q [B, Sq, Hq, D] and k [B, Sk, Hkv, D].
void check_attn_mask(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k);

// The classes (kMaskHidden / kMaskOpen / kMaskRead) of attn_mask's kMaskBlock x kMaskBlock
// blocks, as uint8, with size 1 along its broadcast dimensions. Computed with tensor ops on
// the mask's device: no host sync.
at::Tensor classify_mask_blocks(const at::Tensor& mask);

// classify_mask_blocks of the inputs' attn_mask; undefined without one.
inline at::Tensor mask_blocks_of(const std::optional<at::Tensor>& mask) {
  return mask.has_value() ? classify_mask_blocks(*mask) : at::Tensor();
}

// The kernels' view of attn_mask and of its block classes, broadcast to
// [B, Hq, Sq, Sk] / [B, Hq, Sq / kMaskBlock, Sk / kMaskBlock].
AttnMask mask_view(const at::Tensor& mask, const at::Tensor& blocks, const at::Tensor& q,
                   const at::Tensor& k);

// The gradient of attn_mask from the kernels' dL/dlogit [B, Hq, Sq, Sk] (fp32): summed over
// the dimensions the mask broadcasts along, in the mask's shape and dtype.
at::Tensor reduce_mask_grad(const at::Tensor& dlogit, const at::Tensor& mask);

}  // namespace flashattn
