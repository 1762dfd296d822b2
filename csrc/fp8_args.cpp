#include "fp8_args.h"

#include <c10/util/Exception.h>

#include <utility>

#include "arg_checks.h"

namespace flashattn {
namespace {

constexpr at::ScalarType kFp8 = at::kFloat8_e4m3fn;
// The head dim the FP8 kernel is built for (kernel_list.py fwd_sm90_fp8).
constexpr int64_t kFp8HeadDim = 128;

bool any_descale(const AttnInputs& in) {
  return in.q_descale.has_value() || in.k_descale.has_value() || in.v_descale.has_value();
}

// One FP8 refusal: what the kernel does not do yet.
void refuse(bool given, const char* what) {
  TORCH_CHECK(!given, "flashattn: the FP8 (float8_e4m3fn) forward does not support ", what,
              " yet; it runs head dim 128 with no mask, causal or a sliding window (either "
              "alignment), softcap or not, ALiBi or not, attn_mask or not, GQA (packed for "
              "decoding), split-KV, "
              "seqused_q / seqused_k, varlen batches and paged or indexed KV caches (with a "
              "mask alone)");
}

// fp32 [batch, heads_kv] on q's device, any strides.
void check_descale(const std::optional<at::Tensor>& t, const char* name, int64_t batch,
                   int64_t heads_kv, const at::Tensor& q) {
  if (!t) return;
  TORCH_CHECK(t->scalar_type() == at::kFloat, "flashattn: ", name, " must be float32, got ",
              t->scalar_type());
  TORCH_CHECK(t->dim() == 2 && t->size(0) == batch && t->size(1) == heads_kv, "flashattn: ",
              name, " must have shape (batch, num_kv_heads) = (", batch, ", ", heads_kv,
              "), got ", t->sizes());
  check_same_device(*t, name, q);
}

TensorView descale_view(const std::optional<at::Tensor>& t) {
  if (!t) return {};
  return {const_cast<void*>(t->data_ptr()), t->stride(0), 0, t->stride(1)};
}

}  // namespace

bool is_fp8(const AttnInputs& in) { return in.q.scalar_type() == kFp8; }

void check_fp8_dtypes(const AttnInputs& in, const ExecutorLimits& limits) {
  const bool q8 = in.q.scalar_type() == kFp8, k8 = in.k.scalar_type() == kFp8,
             v8 = in.v.scalar_type() == kFp8;
  if (!q8 && !k8 && !v8) {
    TORCH_CHECK(!any_descale(in), "flashattn: q_descale, k_descale and v_descale apply to "
                "float8_e4m3fn (FP8) q, k, v only; got q, k, v of dtype ", in.q.scalar_type(),
                ", ", in.k.scalar_type(), ", ", in.v.scalar_type());
    return;
  }
  TORCH_CHECK(q8 && k8 && v8, "flashattn: FP8 inputs must be float8_e4m3fn all three, q, k and "
              "v; got q ", in.q.scalar_type(), ", k ", in.k.scalar_type(), ", v ",
              in.v.scalar_type());
  TORCH_CHECK(limits.fp8_forward, "flashattn: float8_e4m3fn (FP8) inputs run on CUDA only: the "
              "sm_90a FP8 forward, on a compute capability 9.0 GPU (H100, H200) with "
              "FLASHATTN_CUDA_HOPPER=1; the ", limits.name, " executor has no FP8 kernels");
}

void check_fp8_fwd(const AttnInputs& in) {
  if (!is_fp8(in)) return;
  TORCH_CHECK(in.q.size(-1) == kFp8HeadDim && in.v.size(-1) == kFp8HeadDim,
              "flashattn: the FP8 (float8_e4m3fn) forward supports head dim ", kFp8HeadDim,
              " only, got head_dim = ", in.q.size(-1), " and head_dim_v = ", in.v.size(-1));
  // Softcap and sliding windows (causal is the window (-1, 0)) are built, each with the other,
  // and ALiBi with each (softcap at run time there), and attn_mask with each (softcap and ALiBi
  // at run time there): kernel_list.py fwd_sm90_fp8's twelve loops.
  // Their own checks (arg_checks) still apply. A GQA decode's packed heads and split-KV
  // (num_splits: flash_attn_with_kvcache's, over a dense cache, kvcache_args.cpp) are the
  // plan's (cuda/plan_fwd_fp8.h), the splits' fp32 parts merged into the bfloat16 out.
  // attn_mask: a bool or float32 one (q's dtype, e4m3, is no bias the kernels read).
  TORCH_CHECK(!in.attn_mask || in.attn_mask->scalar_type() == at::kBool ||
                  in.attn_mask->scalar_type() == at::kFloat,
              "flashattn: with float8_e4m3fn (FP8) inputs attn_mask must be bool or float32, got ",
              in.attn_mask ? in.attn_mask->scalar_type() : at::kBool);
  refuse(in.dropout_p > 0.0, "dropout");
  // A paged, indexed or left-padded cache: the e4m3 kernel's gathering loops (no mask, causal or
  // a window; cuda/plan_fwd_fp8.h), without the features their three loops lack.
  refuse(in.kv_cache() && in.softcap > 0.0, "softcap with a paged or indexed KV cache "
         "(block_table, cache_batch_idx, cache_leftpad)");
  refuse(in.kv_cache() && in.alibi_slopes.has_value(), "alibi_slopes with a paged or indexed KV "
         "cache (block_table, cache_batch_idx, cache_leftpad)");
  refuse(in.kv_cache() && in.attn_mask.has_value(), "attn_mask with a paged or indexed KV cache "
         "(block_table, cache_batch_idx, cache_leftpad)");
  refuse(in.block_offsets.has_value(), "block_offsets (flashattn.distributed)");
  refuse(in.out_fp32, "out_fp32 (its out is bfloat16)");
  const int64_t batch = in.varlen() ? in.cu_seqlens_q->size(0) - 1 : in.q.size(0);
  const int64_t heads_kv = in.k.size(-2);
  check_descale(in.q_descale, "q_descale", batch, heads_kv, in.q);
  check_descale(in.k_descale, "k_descale", batch, heads_kv, in.q);
  check_descale(in.v_descale, "v_descale", batch, heads_kv, in.q);
}

void check_no_fp8_bwd(const AttnInputs& in) {
  const bool fp8 = in.q.scalar_type() == kFp8 || in.k.scalar_type() == kFp8 ||
                   in.v.scalar_type() == kFp8;
  TORCH_CHECK(!fp8 && !any_descale(in), "flashattn: the backward of float8_e4m3fn (FP8) inputs "
              "is not supported: the FP8 forward is inference only (q, k, v of dtype ",
              in.q.scalar_type(), ", ", in.k.scalar_type(), ", ", in.v.scalar_type(),
              any_descale(in) ? ", with descales" : "", ")");
}

at::ScalarType fwd_out_dtype(const AttnInputs& in) {
  if (is_fp8(in)) return at::kBFloat16;
  return in.out_fp32 ? at::kFloat : in.q.scalar_type();
}

Fp8Descales fp8_descales_of(const AttnInputs& in) {
  return {descale_view(in.q_descale), descale_view(in.k_descale), descale_view(in.v_descale)};
}

}  // namespace flashattn
