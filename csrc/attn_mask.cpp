#include "attn_mask.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>
#include <vector>

namespace flashattn {
namespace {

// [batch, heads, seqlen_q, seqlen_k] of the attention scores for q [B, Sq, Hq, D], k [B, Sk, ...].
std::vector<int64_t> scores_shape(const at::Tensor& q, const at::Tensor& k) {
  return {q.size(0), q.size(2), q.size(1), k.size(1)};
}

// The mask with leading size-1 dimensions up to 4-D, as broadcasting aligns it.
at::Tensor as_4d(const at::Tensor& mask) {
  std::vector<int64_t> shape(4 - mask.dim(), 1);
  shape.insert(shape.end(), mask.sizes().begin(), mask.sizes().end());
  return mask.view(shape);
}

// `any` or `all` of `t` [b, h, sq, sk] over blocks of kMaskBlock x kMaskBlock (1 along a
// dimension of size 1, which broadcasts), the padding set to `pad`.
at::Tensor reduce_blocks(const at::Tensor& t, bool pad, bool any) {
  const int64_t rows = t.size(2), keys = t.size(3);
  const int64_t row_block = rows == 1 ? 1 : kMaskBlock, key_block = keys == 1 ? 1 : kMaskBlock;
  const int64_t row_blocks = (rows + row_block - 1) / row_block;
  const int64_t key_blocks = (keys + key_block - 1) / key_block;
  at::Tensor padded = at::constant_pad_nd(
      t, {0, key_blocks * key_block - keys, 0, row_blocks * row_block - rows}, pad ? 1 : 0);
  padded = padded.view({t.size(0), t.size(1), row_blocks, row_block, key_blocks, key_block});
  return any ? padded.any(5).any(3) : padded.all(5).all(3);
}

}  // namespace

void check_attn_mask(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k) {
  const std::vector<int64_t> target = scores_shape(q, k);
  TORCH_CHECK(mask.device() == q.device(), "flashattn: attn_mask must be on the same device as ",
              "q (", q.device(), "), got ", mask.device());
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == q.scalar_type() ||
                  mask.scalar_type() == at::kFloat,
              "flashattn: attn_mask must be bool, float32 or q's dtype ", q.scalar_type(),
              ", got ", mask.scalar_type());
  bool broadcasts = mask.dim() >= 1 && mask.dim() <= 4;
  for (int64_t d = 1; broadcasts && d <= mask.dim(); ++d) {
    const int64_t size = mask.size(-d), wanted = target[4 - d];
    broadcasts = size == 1 || size == wanted;
  }
  TORCH_CHECK(broadcasts, "flashattn: attn_mask of shape ", mask.sizes(),
              " does not broadcast to the attention scores' shape (batch, heads, seqlen_q, "
              "seqlen_k) = ", at::IntArrayRef(target));
}

at::Tensor classify_mask_blocks(const at::Tensor& mask) {
  const at::Tensor m = as_4d(mask);
  const bool is_bool = m.scalar_type() == at::kBool;
  // keep: the entry lets its key take part; open: it leaves the logit as it is.
  const at::Tensor keep = is_bool ? m : m.ne(-std::numeric_limits<double>::infinity());
  const at::Tensor open = is_bool ? m : m.eq(0);
  const at::Tensor any_kept = reduce_blocks(keep, /*pad=*/false, /*any=*/true);
  const at::Tensor all_open = reduce_blocks(open, /*pad=*/true, /*any=*/false);
  const at::Tensor read = at::full_like(any_kept, kMaskRead, at::kByte);
  return at::where(any_kept.logical_not(), at::full_like(read, kMaskHidden),
                   at::where(all_open, at::full_like(read, kMaskOpen), read));
}

AttnMask mask_view(const at::Tensor& mask, const at::Tensor& blocks, const at::Tensor& q,
                   const at::Tensor& k) {
  const std::vector<int64_t> shape = scores_shape(q, k);
  const at::Tensor m = as_4d(mask).expand(shape);
  AttnMask view;
  view.ptr = m.data_ptr();
  switch (m.scalar_type()) {
    case at::kBool: view.kind = MaskKind::kBool; break;
    case at::kFloat: view.kind = MaskKind::kFloat32; break;
    case at::kBFloat16: view.kind = MaskKind::kBFloat16; break;
    case at::kHalf: view.kind = MaskKind::kHalf; break;
    case at::kDouble: view.kind = MaskKind::kFloat64; break;
    default: TORCH_CHECK(false, "flashattn: attn_mask dtype ", m.scalar_type(), " has no kernel");
  }
  view.batch_stride = m.stride(0), view.head_stride = m.stride(1);
  view.row_stride = m.stride(2), view.key_stride = m.stride(3);
  const at::Tensor b = blocks.expand({shape[0], shape[1], (shape[2] + kMaskBlock - 1) / kMaskBlock,
                                      (shape[3] + kMaskBlock - 1) / kMaskBlock});
  view.blocks = b.data_ptr<uint8_t>();
  view.block_batch_stride = b.stride(0), view.block_head_stride = b.stride(1);
  view.block_row_stride = b.stride(2), view.block_key_stride = b.stride(3);
  return view;
}

at::Tensor reduce_mask_grad(const at::Tensor& dlogit, const at::Tensor& mask) {
  return at::sum_to(dlogit, mask.sizes()).to(mask.scalar_type());
}

}  // namespace flashattn
