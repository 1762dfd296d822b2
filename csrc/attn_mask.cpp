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

// `t` [b, h, sq, sk] extended to `rows` x `keys` by repeating its last row and column: a
// block's class is then that of its real entries.
at::Tensor extend_by_edges(at::Tensor t, int64_t rows, int64_t keys) {
  if (keys > t.size(3)) {
    const at::Tensor edge = t.narrow(3, t.size(3) - 1, 1);
    t = at::cat({t, edge.expand({t.size(0), t.size(1), t.size(2), keys - t.size(3)})}, 3);
  }
  if (rows > t.size(2)) {
    const at::Tensor edge = t.narrow(2, t.size(2) - 1, 1);
    t = at::cat({t, edge.expand({t.size(0), t.size(1), rows - t.size(2), t.size(3)})}, 2);
  }
  return t;
}

// Rows (or keys) per mask block along a dimension of `size`: 1 where the mask broadcasts.
int64_t block_size(int64_t size) { return size == 1 ? 1 : kMaskBlock; }
int64_t num_mask_blocks(int64_t size) { return (size + block_size(size) - 1) / block_size(size); }

// The max (or min) of `t` [b, h, sq, sk] over each block: [b, h, blocks of sq, blocks of sk].
at::Tensor block_extreme(const at::Tensor& t, bool max) {
  const int64_t rows = t.size(2), keys = t.size(3);
  const int64_t row_block = block_size(rows), key_block = block_size(keys);
  const int64_t row_blocks = num_mask_blocks(rows), key_blocks = num_mask_blocks(keys);
  const at::Tensor blocks =
      extend_by_edges(t, row_blocks * row_block, key_blocks * key_block)
          .reshape({t.size(0), t.size(1), row_blocks, row_block, key_blocks, key_block});
  // Innermost first: one pass over the mask, then a pass over a 32x smaller tensor.
  return max ? blocks.amax(5).amax(3) : blocks.amin(5).amin(3);
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
  if (m.numel() == 0)  // no kernel reads it
    return at::full({m.size(0), m.size(1), num_mask_blocks(m.size(2)), num_mask_blocks(m.size(3))},
                    kMaskOpen, m.options().dtype(at::kByte));
  // A block is hidden when its largest entry hides (false / -inf), open when both its extremes
  // change nothing (true / 0), else read; a NaN entry propagates into the extremes: read.
  const bool is_bool = m.scalar_type() == at::kBool;
  const at::Tensor values = is_bool ? m.view(at::kByte) : m;
  const at::Tensor high = block_extreme(values, /*max=*/true);
  const at::Tensor low = block_extreme(values, /*max=*/false);
  const at::Tensor hidden = is_bool ? high.eq(0) : high.eq(-std::numeric_limits<double>::infinity());
  const at::Tensor open = is_bool ? low.eq(1) : low.eq(0).logical_and_(high.eq(0));
  const at::Tensor read = at::full_like(high, kMaskRead, at::kByte);
  return at::where(hidden, at::full_like(read, kMaskHidden),
                   at::where(open, at::full_like(read, kMaskOpen), read));
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
