#include "attn_args.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace flashattn {
namespace {

std::string dtype_list(const std::vector<at::ScalarType>& dtypes) {
  std::ostringstream os;
  for (size_t i = 0; i < dtypes.size(); ++i) os << (i ? ", " : "") << dtypes[i];
  return os.str();
}

void check_rank4(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4, "flashattn: ", name,
              " must be a 4-D tensor [batch, seqlen, heads, head_dim], got ", t.dim(),
              "-D with shape ", t.sizes());
}

void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, "flashattn: ", name,
              " must be contiguous in its last (head_dim) dimension, got strides ", t.strides(),
              "; call .contiguous() on it first");
}

void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.device() == q.device(), "flashattn: ", name, " must be on the same device as q (",
              q.device(), "), got ", t.device());
}

void check_fits_int(int64_t value, const char* what) {
  TORCH_CHECK(value <= INT_MAX, "flashattn: ", what, " must be at most ", INT_MAX, ", got ",
              value);
}

// A window bound larger than any possible distance is the same as unbounded; clipping keeps
// the kernels' 32-bit index arithmetic from overflowing.
int clip_window(int64_t w, int64_t seqlen_q, int64_t seqlen_k) {
  return w > seqlen_q + seqlen_k ? -1 : static_cast<int>(w);
}

// The softmax scale the caller asked for, or FA2's and SDPA's default 1 / sqrt(head_dim).
double resolved_scale(const AttnInputs& in) {
  return in.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(in.q.size(3))));
}

void check_mask_options(const AttnInputs& in) {
  const at::Tensor& q = in.q;
  TORCH_CHECK(in.window_left >= -1, "flashattn: window_size[0] (left) must be -1 (unbounded) "
              "or >= 0, got ", in.window_left);
  TORCH_CHECK(in.window_right >= -1, "flashattn: window_size[1] (right) must be -1 "
              "(unbounded) or >= 0, got ", in.window_right);
  TORCH_CHECK(std::isfinite(resolved_scale(in)), "flashattn: softmax_scale must be finite, got ",
              resolved_scale(in));
  TORCH_CHECK(in.softcap >= 0 && std::isfinite(in.softcap),
              "flashattn: softcap must be >= 0 (0 disables it), got ", in.softcap);
  if (in.alibi_slopes.has_value()) {
    const at::Tensor& s = *in.alibi_slopes;
    const int64_t batch = q.size(0), heads = q.size(2);
    // FA2 takes fp32 slopes only; converting would be a silent copy.
    TORCH_CHECK(s.scalar_type() == at::kFloat, "flashattn: alibi_slopes must be float32, got ",
                s.scalar_type());
    check_same_device(s, "alibi_slopes", q);
    const bool per_head = s.dim() == 1 && s.size(0) == heads;
    const bool per_batch_head = s.dim() == 2 && s.size(0) == batch && s.size(1) == heads;
    TORCH_CHECK(per_head || per_batch_head, "flashattn: alibi_slopes must have shape [",
                heads, "] or [", batch, ", ", heads, "] (nheads or batch x nheads of q), got ",
                s.sizes());
  }
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const ExecutorLimits& limits) {
  check_rank4(q, "q");
  check_rank4(k, "k");
  check_rank4(v, "v");
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  const auto& dtypes = limits.dtypes;
  TORCH_CHECK(std::find(dtypes.begin(), dtypes.end(), q.scalar_type()) != dtypes.end(),
              "flashattn: q has dtype ", q.scalar_type(), ", which the ", limits.name,
              " kernels do not support; supported: ", dtype_list(dtypes));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "flashattn: q, k and v must have the same dtype, got ", q.scalar_type(), ", ",
              k.scalar_type(), " and ", v.scalar_type());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0),
              "flashattn: q, k and v must have the same batch size, got ", q.size(0), ", ",
              k.size(0), " and ", v.size(0));
  TORCH_CHECK(k.size(1) == v.size(1),
              "flashattn: k and v must have the same sequence length, got ", k.size(1), " and ",
              v.size(1));
  TORCH_CHECK(k.size(2) == v.size(2),
              "flashattn: k and v must have the same number of heads, got ", k.size(2), " and ",
              v.size(2));
  TORCH_CHECK(k.size(3) == q.size(3) && v.size(3) == q.size(3),
              "flashattn: q, k and v must have the same head dim, got ", q.size(3), ", ",
              k.size(3), " and ", v.size(3));
  TORCH_CHECK(k.size(2) > 0 || q.size(2) == 0,
              "flashattn: k and v have 0 heads but q has ", q.size(2));
  TORCH_CHECK(k.size(2) == 0 || q.size(2) % k.size(2) == 0,
              "flashattn: the number of query heads must be a multiple of the number of "
              "key/value heads (GQA/MQA), got ", q.size(2), " query heads and ", k.size(2),
              " key/value heads");
  TORCH_CHECK(limits.max_head_dim < 0 || q.size(3) <= limits.max_head_dim, "flashattn: the ",
              limits.name, " kernels support head_dim <= ", limits.max_head_dim, ", got ",
              q.size(3));
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  check_fits_int(q.size(1), "the query sequence length");
  check_fits_int(k.size(1), "the key sequence length");
  check_fits_int(q.size(0), "the batch size");
  check_fits_int(q.size(2), "the number of heads");
  check_fits_int(q.size(3), "head_dim");
}

void check_shape_like(const at::Tensor& t, const char* name, const at::Tensor& like,
                      const char* like_name) {
  TORCH_CHECK(t.sizes() == like.sizes(), "flashattn: ", name, " must have the shape of ",
              like_name, " ", like.sizes(), ", got ", t.sizes());
}

void check_lse_like(const at::Tensor& t, const char* name, const at::Tensor& q) {
  const std::vector<int64_t> expected{q.size(0), q.size(2), q.size(1)};
  TORCH_CHECK(t.sizes() == at::IntArrayRef(expected), "flashattn: ", name,
              " must have shape [batch, heads, seqlen_q] = ", at::IntArrayRef(expected),
              ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "flashattn: ", name, " must be float32, got ",
              t.scalar_type());
  check_same_device(t, name, q);
}

// [batch, seqlen, heads, dim] rows.
TensorView rows_view(const at::Tensor& t) {
  return {const_cast<void*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
}

// Per-row statistics [batch, heads, seqlen].
TensorView stats_view(const at::Tensor& t) {
  return {const_cast<void*>(t.data_ptr()), t.stride(0), t.stride(2), t.stride(1)};
}

// ALiBi slopes [heads] or [batch, heads]: one element per (batch, head).
TensorView slopes_view(const at::Tensor& s) {
  const bool per_batch = s.dim() == 2;
  return {const_cast<void*>(s.data_ptr()), per_batch ? s.stride(0) : 0, 0,
          s.stride(per_batch ? 1 : 0)};
}

bool poisoning_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("FLASHATTN_POISON_OUTPUTS");
    return env != nullptr && env[0] == '1';
  }();
  return enabled;
}

}  // namespace

void poison_if_debugging(at::Tensor& t) {
  if (poisoning_enabled()) t.fill_(std::numeric_limits<double>::quiet_NaN());
}

std::tuple<at::Tensor, at::Tensor> check_and_alloc_fwd(const AttnInputs& in,
                                                       const ExecutorLimits& limits) {
  const at::Tensor& q = in.q;
  check_qkv(q, in.k, in.v, limits);
  check_mask_options(in);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  poison_if_debugging(out);
  poison_if_debugging(lse);
  return {out, lse};
}

AttnParams make_fwd_params(const AttnInputs& in, const at::Tensor& out, const at::Tensor& lse) {
  const at::Tensor &q = in.q, &k = in.k;
  AttnParams p;
  p.q = rows_view(q);
  p.k = rows_view(k);
  p.v = rows_view(in.v);
  p.o = rows_view(out);
  p.lse = stats_view(lse);
  p.batch = static_cast<int>(q.size(0));
  p.seqlen_q = static_cast<int>(q.size(1));
  p.seqlen_k = static_cast<int>(k.size(1));
  p.heads_q = static_cast<int>(q.size(2));
  p.heads_kv = static_cast<int>(k.size(2));
  p.head_group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  p.head_dim = static_cast<int>(q.size(3));
  p.scale_fp64 = resolved_scale(in);
  p.softcap_fp64 = in.softcap;
  p.scale = static_cast<float>(p.scale_fp64);
  p.softcap = static_cast<float>(p.softcap_fp64);
  // FA2's convention: causal is a window whose right edge is the diagonal.
  p.window_left = clip_window(in.window_left, p.seqlen_q, p.seqlen_k);
  p.window_right = in.causal ? 0 : clip_window(in.window_right, p.seqlen_q, p.seqlen_k);
  p.diag_offset = in.align_bottom_right ? p.seqlen_k - p.seqlen_q : 0;
  if (in.alibi_slopes.has_value()) p.alibi = slopes_view(*in.alibi_slopes);
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> check_and_alloc_bwd(const AttnInputs& in,
                                                                   const BwdInputs& grads,
                                                                   const ExecutorLimits& limits) {
  const at::Tensor &q = in.q, &out = grads.out, &dout = grads.dout;
  check_qkv(q, in.k, in.v, limits);
  check_mask_options(in);
  check_rank4(out, "out");
  check_rank4(dout, "dout");
  check_shape_like(out, "out", q, "q");
  check_shape_like(dout, "dout", q, "q");
  TORCH_CHECK(out.scalar_type() == q.scalar_type() && dout.scalar_type() == q.scalar_type(),
              "flashattn: out and dout must have q's dtype ", q.scalar_type(), ", got ",
              out.scalar_type(), " and ", dout.scalar_type());
  check_same_device(out, "out", q);
  check_same_device(dout, "dout", q);
  check_last_dim_contiguous(out, "out");
  check_last_dim_contiguous(dout, "dout");
  check_lse_like(grads.lse, "lse", q);
  if (grads.dlse.has_value()) check_lse_like(*grads.dlse, "dlse", q);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(in.k.sizes(), in.k.options());
  at::Tensor dv = at::empty(in.v.sizes(), in.v.options());
  poison_if_debugging(dq);
  poison_if_debugging(dk);
  poison_if_debugging(dv);
  return {dq, dk, dv};
}

AttnBwdParams make_bwd_params(const AttnInputs& in, const BwdInputs& grads, const at::Tensor& dq,
                              const at::Tensor& dk, const at::Tensor& dv) {
  AttnBwdParams p;
  static_cast<AttnParams&>(p) = make_fwd_params(in, grads.out, grads.lse);
  p.dout = rows_view(grads.dout);
  if (grads.dlse.has_value()) p.dlse = stats_view(*grads.dlse);
  p.dq = rows_view(dq);
  p.dk = rows_view(dk);
  p.dv = rows_view(dv);
  p.deterministic = in.deterministic;
  return p;
}

}  // namespace flashattn
