// flashattn as the kernel behind F.scaled_dot_product_attention: replacements for ATen's own
// flash-attention ops, written once for every executor, which torch.nn.attention's
// activate_flash_attention_impl("flashattn") installs (flashattn/_sdpa_impl.py) and
// restore_flash_attention_impl() removes.
//
//   CPU:  _scaled_dot_product_flash_attention_for_cpu (+ _backward)
//   CUDA: _scaled_dot_product_flash_attention (+ _backward), _flash_attention_forward
//         (+ _backward, + _flash_attention_forward_no_dropout_inplace where torch has it); the
//         last two are what nested-tensor SDPA and torch.nn.attention.varlen call.
//
// The kernels are boxed and read ATen's arguments by name (op_args.h), so one build serves
// every torch version whose schemas keep those names; an argument a version adds is only read
// where it exists. Outputs have exactly the shapes, strides and dtypes of ATen's meta
// functions, so torch.compile sees no difference. What flashattn cannot compute is an error
// that says so, never a call back into the op it replaced.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "attn_args.h"
#include "attn_mask.h"
#include "fp8_args.h"
#include "op_args.h"

namespace flashattn {

// Installs one executor's replacements into a torch::Library of ATen implementations for its
// dispatch key; dropping the library removes them again. Executors announce theirs at load
// time (cpu/api.cpp, cuda/api.cu) with a static SdpaImplInstaller; flashattn.cpp runs them.
using SdpaImplRegisterFn = void (*)(torch::Library& aten);
struct SdpaImplInstaller {
  c10::DispatchKey key;
  SdpaImplRegisterFn register_fn;
  SdpaImplInstaller(c10::DispatchKey key, SdpaImplRegisterFn register_fn);
};

// Whether this torch has the ATen op (an op a newer torch added is replaced only there).
inline bool aten_has_op(const char* name) {
  return c10::Dispatcher::singleton().findSchema({std::string("aten::") + name, ""}).has_value();
}

namespace sdpa_impl {

// Who raised an error: the user called F.scaled_dot_product_attention (or torch's varlen
// attention), not flashattn.
inline constexpr const char* kWho =
    "flashattn (the activated torch.nn.attention flash-attention implementation)";
inline constexpr const char* kHowToOptOut =
    "; call torch.nn.attention.restore_flash_attention_impl() for PyTorch's own kernel";

// How an ATen op lays out and aligns its inputs.
struct OpConvention {
  // (batch, heads, seqlen, head_dim) tensors (the SDPA ops); else FA2's (batch, seqlen, heads,
  // head_dim), or (total, heads, head_dim) with cum_seq_q / cum_seq_k.
  bool heads_before_seqlen;
  // Causal alignment when seqlen_q != seqlen_k: the CPU op aligns top-left, the CUDA ops run
  // FlashAttention-2, which aligns bottom-right (F.sdpa never sends them a non-square causal
  // call).
  bool align_bottom_right;
  // The CPU ops return the LSE in (batch, seqlen_q, heads) memory, in the computation dtype
  // (float64 for float64), and gradients in (batch, seqlen, heads, head_dim) memory; the CUDA
  // ops a contiguous fp32 LSE and gradients laid out like their inputs.
  bool cpu_layouts;
  // Whether the backward gets the forward's dropout seed (the CPU op's does not).
  bool backward_gets_seed;
};
// The op families (an enum, not OpConvention itself, as a template argument: C++17).
enum class AtenOp { kCpuSdpa, kCudaSdpa, kCudaFlash };
constexpr OpConvention convention_of(AtenOp op) {
  switch (op) {
    case AtenOp::kCpuSdpa: return {true, false, true, false};
    case AtenOp::kCudaSdpa: return {true, true, false, true};
    default: return {false, true, false, true};
  }
}

// A Tensor or Tensor? argument that is None or undefined reads as absent (ATen's autograd
// hands a saved None back as an undefined tensor).
inline std::optional<at::Tensor> present_tensor(const OpArguments& args, std::string_view name) {
  if (!args.has(name)) return std::nullopt;
  const c10::IValue& value = args[name];
  if (value.isNone() || !value.toTensor().defined()) return std::nullopt;
  return value.toTensor();
}

inline std::optional<int64_t> present_int(const OpArguments& args, std::string_view name) {
  return args.has(name) ? args.optional_int(name) : std::nullopt;
}

inline at::Tensor seqlen_major(const at::Tensor& t, OpConvention c) {
  return c.heads_before_seqlen ? t.transpose(1, 2) : t;
}

// The arguments of any of the ops as flashattn's inputs, in flashattn's layout.
inline AttnInputs read_inputs(const OpArguments& args, OpConvention c) {
  const at::Tensor query = args.tensor("query"), key = args.tensor("key"),
                   value = args.tensor("value");
  if (c.heads_before_seqlen) {
    for (const auto* t : {&query, &key, &value})
      TORCH_CHECK(t->dim() == 4, kWho, ": query, key and value must be 4-D (batch, heads, ",
                  "seqlen, head_dim), got shapes ", query.sizes(), ", ", key.sizes(), ", ",
                  value.sizes());
  }
  // ATen's flash ops give out query's head dim (their meta functions: empty_like(query)), and
  // F.sdpa sends a value with a head dim of its own to its math backend, never to them; so an
  // unequal pair reaches here only from a direct call, which torch.compile would trace wrong.
  TORCH_CHECK(value.size(-1) == query.size(-1), kWho, ": value's head dim (", value.size(-1),
              ") must equal query's (", query.size(-1), "): ATen's flash-attention ops give ",
              "out query's head dim; flashattn.scaled_dot_product_attention takes unequal ones",
              kHowToOptOut);
  if (args.has("return_debug_mask"))
    TORCH_CHECK(!args["return_debug_mask"].toBool(), kWho, ": return_debug_mask=True is not ",
                "supported (flash_attn_func(..., return_attn_probs=True) returns flashattn's ",
                "dropout mask)", kHowToOptOut);
  TORCH_CHECK(!present_tensor(args, "block_table"), kWho,
              ": block_table (paged KV) is not supported yet", kHowToOptOut);
  AttnInputs in;
  in.q = seqlen_major(query, c);
  in.k = seqlen_major(key, c);
  in.v = seqlen_major(value, c);
  in.softmax_scale = args.optional_double("scale");
  in.causal = args["is_causal"].toBool();
  in.align_bottom_right = c.align_bottom_right;
  in.dropout_p = args["dropout_p"].toDouble();
  TORCH_CHECK(in.dropout_p == 0.0 || c.backward_gets_seed, kWho, ": dropout_p > 0 (got ",
              in.dropout_p, ") needs a seed in the backward, which ATen's CPU op does not pass; ",
              "call flashattn.scaled_dot_product_attention directly", kHowToOptOut);
  in.attn_mask = present_tensor(args, "attn_mask");
  in.alibi_slopes = present_tensor(args, "alibi_slopes");
  in.window_left = present_int(args, "window_size_left").value_or(-1);
  in.window_right = present_int(args, "window_size_right").value_or(-1);
  in.cu_seqlens_q = present_tensor(args, "cum_seq_q");
  in.cu_seqlens_k = present_tensor(args, "cum_seq_k");
  if (in.cu_seqlens_q || in.cu_seqlens_k) {
    in.max_seqlen_q = present_int(args, "max_q");
    in.max_seqlen_k = present_int(args, "max_k");
  }
  in.seqused_k = present_tensor(args, "seqused_k");
  // ATen's flash kernels follow torch.use_deterministic_algorithms.
  in.deterministic = at::globalContext().deterministicAlgorithms();
  return in;
}

// ATen's flash backward ops take neither alibi_slopes nor seqused_k (torch's varlen_attn calls
// seqused_k inference-only), so a forward that uses them must not be differentiated: refused
// when autograd would record it (eager; under torch.compile the forward runs without grad).
inline void check_inference_only(const AttnInputs& in) {
  const bool recorded = at::GradMode::is_enabled() &&
                        (in.q.requires_grad() || in.k.requires_grad() || in.v.requires_grad());
  for (const auto& [name, given] : {std::pair{"alibi_slopes", in.alibi_slopes.has_value()},
                                    std::pair{"seqused_k", in.seqused_k.has_value()}})
    TORCH_CHECK(!(recorded && given), kWho, ": ", name, " is inference-only here: ATen's ",
                "backward op does not receive it, so its gradients would be wrong; call ",
                "flashattn.flash_attn_varlen_func, or run under torch.no_grad()");
}

// A fresh [seed, offset] from the device's generator (flashattn::dropout_rng_state).
inline at::Tensor draw_rng_state(const at::Tensor& like) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("flashattn::dropout_rng_state", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(like);
}

// The backward's seed argument: what the forward returned as rng_state (uint64 [2]).
inline std::optional<at::Tensor> read_rng_state(const OpArguments& args, double dropout_p) {
  if (dropout_p == 0.0) return std::nullopt;
  std::optional<at::Tensor> state = present_tensor(args, "philox_seed");
  if (!state) state = present_tensor(args, "rng_state");
  TORCH_CHECK(state && state->numel() == 2 && state->element_size() == 8, kWho,
              ": dropout_p > 0 needs the forward's rng_state (64-bit, 2 elements), got ",
              state ? state->sizes() : at::IntArrayRef{});
  return state->view(at::kLong);
}

// The forward of every op: (out, lse[, dropout state]) on the stack in the op's result order.
template <typename Executor, AtenOp kOp>
void forward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  constexpr OpConvention kConvention = convention_of(kOp);
  OpArguments args(op, stack);
  AttnInputs in = read_inputs(args, kConvention);
  RECORD_FUNCTION("flashattn::fwd", std::vector<c10::IValue>({in.q, in.k, in.v}));
  check_inference_only(in);
  const at::Tensor query = args.tensor("query");
  if (in.dropout_p > 0.0) in.rng_state = draw_rng_state(query);
  check_fwd(in, Executor::limits());
  // ATen's ops give out query's dtype; the FP8 forward writes a bfloat16 out (fp8_args.h).
  TORCH_CHECK(!is_fp8(in), kWho, ": float8_e4m3fn inputs (the FP8 forward) are not supported "
              "through ", op.schema().name(), "; call flashattn.flash_attn_func with q_descale, "
              "k_descale, v_descale");
  const bool in_place = args.has("out");  // _flash_attention_forward_no_dropout_inplace
  TORCH_CHECK(!in_place || in.dropout_p == 0.0, kWho, ": ", op.schema().name(),
              " takes no dropout, got dropout_p=", in.dropout_p);
  at::Tensor out = in_place ? args.tensor("out") : at::empty_like(query);
  if (in_place)
    TORCH_CHECK(out.sizes() == query.sizes() && out.scalar_type() == query.scalar_type() &&
                    out.device() == query.device() && out.stride(-1) == 1,
                kWho, ": out must have query's shape ", query.sizes(), " and dtype ",
                query.scalar_type(), " with a contiguous last dim, got ", out.sizes(), " ",
                out.scalar_type(), " with strides ", out.strides());
  prepare_output(out, in, 0.0);
  at::Tensor lse;
  if (kConvention.cpu_layouts) {
    const at::ScalarType lse_type =
        query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    lse = at::empty({query.size(0), query.size(2), query.size(1)}, query.options().dtype(lse_type))
              .transpose(1, 2);
  } else {
    lse = alloc_lse(in);
  }
  // The kernels write a float32 LSE; a float64 one is filled from it.
  at::Tensor lse32 = lse.scalar_type() == at::kFloat ? lse : at::empty_like(lse, at::kFloat);
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  Executor::run_fwd(in.q, make_fwd_params(in, seqlen_major(out, kConvention), lse32,
                                          mask_blocks),
                    Fp8Descales{});
  if (!lse.is_same(lse32)) lse.copy_(lse32);

  if (kConvention.cpu_layouts) return args.set_results(std::move(out), std::move(lse));
  if (in_place) return args.set_results(std::move(lse));
  // rng_state: uint64 [2] = [seed, offset], which the backward gets back; `unused` is ATen's
  // slot for the old separate offset. Neither is read without dropout.
  at::Tensor rng_state = in.rng_state ? in.rng_state->view(at::kUInt64)
                                      : at::empty({2}, query.options().dtype(at::kUInt64));
  at::Tensor unused = at::empty({}, query.options().dtype(at::kUInt64));
  at::Tensor debug_mask = at::empty({0}, query.options());
  if (kConvention.heads_before_seqlen) {
    const c10::SymInt max_q = query.sym_size(2), max_k = args.tensor("key").sym_size(2);
    return args.set_results(std::move(out), std::move(lse), at::Tensor(), at::Tensor(), max_q,
                            max_k, std::move(rng_state), std::move(unused),
                            std::move(debug_mask));
  }
  args.set_results(std::move(out), std::move(lse), std::move(rng_state), std::move(unused),
                   std::move(debug_mask));
}

// A gradient laid out as the op's meta function lays it out.
inline at::Tensor alloc_grad(const at::Tensor& like, const AttnInputs& in, OpConvention c) {
  at::Tensor grad = c.cpu_layouts ? at::empty_permuted(like.sizes(), {0, 2, 1, 3}, like.options())
                                  : at::empty_like(like);
  prepare_output(grad, in, 0.0);
  return grad;
}

// The backward of every op: (grad_query, grad_key, grad_value).
template <typename Executor, AtenOp kOp>
void backward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  constexpr OpConvention kConvention = convention_of(kOp);
  OpArguments args(op, stack);
  AttnInputs in = read_inputs(args, kConvention);
  RECORD_FUNCTION("flashattn::bwd", std::vector<c10::IValue>({in.q, in.k, in.v}));
  in.rng_state = read_rng_state(args, in.dropout_p);
  // Autograd may hand an expanded grad_out (the gradient of a sum): the kernels read rows with
  // a contiguous last dim, so that internal tensor is made so.
  at::Tensor grad_out = args.tensor("grad_out");
  if (grad_out.stride(-1) != 1) grad_out = grad_out.contiguous();
  const BwdInputs grads{seqlen_major(grad_out, kConvention),
                        seqlen_major(args.tensor("out"), kConvention),
                        args.tensor("logsumexp").to(at::kFloat), std::nullopt};
  check_bwd(in, grads, Executor::limits());
  at::Tensor dq = alloc_grad(args.tensor("query"), in, kConvention);
  at::Tensor dk = alloc_grad(args.tensor("key"), in, kConvention);
  at::Tensor dv = alloc_grad(args.tensor("value"), in, kConvention);
  at::Tensor dk_rows = seqlen_major(dk, kConvention), dv_rows = seqlen_major(dv, kConvention);
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  Executor::run_bwd(in.q,
                    make_bwd_params(in, grads, seqlen_major(dq, kConvention), dk_rows, dv_rows,
                                    mask_blocks, at::Tensor()),
                    dk_rows, dv_rows);
  args.set_results(std::move(dq), std::move(dk), std::move(dv));
}

template <typename Executor, AtenOp kOp>
torch::CppFunction boxed_forward() {
  return torch::CppFunction::makeFromBoxedFunction<&forward<Executor, kOp>>();
}
template <typename Executor, AtenOp kOp>
torch::CppFunction boxed_backward() {
  return torch::CppFunction::makeFromBoxedFunction<&backward<Executor, kOp>>();
}

}  // namespace sdpa_impl

// The CPU executor's replacements.
template <typename Executor>
void register_cpu_sdpa_impl(torch::Library& aten) {
  using namespace sdpa_impl;
  aten.impl("_scaled_dot_product_flash_attention_for_cpu", boxed_forward<Executor, AtenOp::kCpuSdpa>());
  aten.impl("_scaled_dot_product_flash_attention_for_cpu_backward",
            boxed_backward<Executor, AtenOp::kCpuSdpa>());
}

// A CUDA executor's replacements (the GPU's, and the CPU shim's in tests).
template <typename Executor>
void register_cuda_sdpa_impl(torch::Library& aten) {
  using namespace sdpa_impl;
  aten.impl("_scaled_dot_product_flash_attention", boxed_forward<Executor, AtenOp::kCudaSdpa>());
  aten.impl("_scaled_dot_product_flash_attention_backward",
            boxed_backward<Executor, AtenOp::kCudaSdpa>());
  aten.impl("_flash_attention_forward", boxed_forward<Executor, AtenOp::kCudaFlash>());
  aten.impl("_flash_attention_backward", boxed_backward<Executor, AtenOp::kCudaFlash>());
  if (aten_has_op("_flash_attention_forward_no_dropout_inplace"))
    aten.impl("_flash_attention_forward_no_dropout_inplace",
              boxed_forward<Executor, AtenOp::kCudaFlash>());
}

}  // namespace flashattn
