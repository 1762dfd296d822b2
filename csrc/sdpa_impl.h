// flashattn as the kernel behind F.scaled_dot_product_attention: replacements for ATen's own
// flash-attention ops, written once for every executor, which torch.nn.attention's
// activate_flash_attention_impl("flashattn") installs (flashattn/sdpa_impl.py) and
// restore_flash_attention_impl() removes. They take ATen's (batch, heads, seqlen, head_dim)
// tensors and return outputs with exactly the strides and dtypes of ATen's own kernels and
// meta functions, so torch.compile sees no difference. What flashattn cannot compute is an
// error that says so, never a call back into the op it replaced.
#pragma once
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "attn_args.h"
#include "attn_mask.h"

namespace flashattn {

// Registers the CPU replacements into `aten_cpu`, a torch::Library of ATen implementations for
// the CPU dispatch key (cpu/api.cpp); dropping the library removes them again.
void register_cpu_sdpa_impl(torch::Library& aten_cpu);

// Who raised an error: the user called F.scaled_dot_product_attention, not flashattn.
inline constexpr const char* kSdpaImplName =
    "flashattn (the activated F.scaled_dot_product_attention implementation)";

// The inputs of ATen's SDPA op as flashattn's (batch, seqlen, heads, head_dim) views: SDPA's
// top-left causal alignment, its attn_mask and scale.
inline AttnInputs sdpa_inputs(const at::Tensor& query, const at::Tensor& key,
                              const at::Tensor& value, double dropout_p, bool is_causal,
                              const std::optional<at::Tensor>& attn_mask,
                              std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0, kSdpaImplName, ": dropout_p > 0 is not supported yet, got ",
              dropout_p, "; call torch.nn.attention.restore_flash_attention_impl() to use "
              "PyTorch's own kernel");
  for (const auto* t : {&query, &key, &value})
    TORCH_CHECK(t->dim() == 4, kSdpaImplName, ": query, key and value must be 4-D (batch, ",
                "heads, seqlen, head_dim), got shapes ", query.sizes(), ", ", key.sizes(), ", ",
                value.sizes());
  TORCH_CHECK(value.size(3) == query.size(3), kSdpaImplName, ": value's head dim (",
              value.size(3), ") must equal query's (", query.size(3), "); call "
              "torch.nn.attention.restore_flash_attention_impl() for PyTorch's own kernel");
  AttnInputs in;
  in.q = query.transpose(1, 2);
  in.k = key.transpose(1, 2);
  in.v = value.transpose(1, 2);
  in.softmax_scale = scale;
  in.causal = is_causal;
  in.align_bottom_right = false;
  // ATen's autograd hands a saved None back as an undefined tensor.
  if (attn_mask.has_value() && attn_mask->defined()) in.attn_mask = attn_mask;
  return in;
}

// aten::_scaled_dot_product_flash_attention_for_cpu: output like query (empty_like), the
// log-sum-exp (batch, heads, seqlen_q) in (batch, seqlen_q, heads) memory, in float32 (float64
// for float64 inputs).
template <typename Executor>
std::tuple<at::Tensor, at::Tensor> sdpa_flash_cpu_forward(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  RECORD_FUNCTION("flashattn::fwd", std::vector<c10::IValue>({query, key, value}));
  const AttnInputs in = sdpa_inputs(query, key, value, dropout_p, is_causal, attn_mask, scale);
  check_fwd(in, Executor::limits());
  const int64_t batch = query.size(0), heads = query.size(1), seqlen_q = query.size(2);
  at::Tensor out = at::empty_like(query);
  const auto lse_type = query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor lse =
      at::empty({batch, seqlen_q, heads}, query.options().dtype(lse_type)).transpose(1, 2);
  // The kernels write a float32 LSE; a float64 one is filled from it.
  at::Tensor lse32 = lse_type == at::kFloat ? lse : at::empty_like(lse, at::kFloat);
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  Executor::run_fwd(in.q, make_fwd_params(in, out.transpose(1, 2), lse32, mask_blocks));
  if (lse_type != at::kFloat) lse.copy_(lse32);
  return {out, lse};
}

// aten::_scaled_dot_product_flash_attention_for_cpu_backward: each gradient in
// (batch, seqlen, heads, head_dim) memory, seen as (batch, heads, seqlen, head_dim).
template <typename Executor>
std::tuple<at::Tensor, at::Tensor, at::Tensor> sdpa_flash_cpu_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp,
    double dropout_p, bool is_causal, const std::optional<at::Tensor>& attn_mask,
    std::optional<double> scale) {
  RECORD_FUNCTION("flashattn::bwd", std::vector<c10::IValue>({grad_out, query, key, value}));
  const AttnInputs in = sdpa_inputs(query, key, value, dropout_p, is_causal, attn_mask, scale);
  // Autograd may hand an expanded grad_out (the gradient of a sum): the kernels read rows with
  // a contiguous last dim, so that internal tensor is made so.
  const at::Tensor dout = grad_out.stride(3) == 1 ? grad_out : grad_out.contiguous();
  const BwdInputs grads{dout.transpose(1, 2), out.transpose(1, 2), logsumexp.to(at::kFloat),
                        std::nullopt};
  auto [dq, dk, dv] = check_and_alloc_bwd(in, grads, Executor::limits());
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  Executor::run_bwd(in.q, make_bwd_params(in, grads, dq, dk, dv, mask_blocks, at::Tensor()), dk,
                    dv);
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
}

}  // namespace flashattn
