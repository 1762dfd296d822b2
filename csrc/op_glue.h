// The ops' kernels, written once for every executor: the arguments are read by name
// (op_args.h, schema.h), the shared checks validate them and allocate the outputs
// (attn_args.h), and the executor runs on the filled parameter struct. An executor is a type
// with
//   static const ExecutorLimits& limits();
//   static void run_fwd(const at::Tensor& q, const AttnParams& p, const Fp8Descales& fp8);
//   static void check_fwd_runs(const at::Tensor& q, const AttnParams& p);  // refusals run_fwd
//                                      // would make, asked before a KV cache is written
//   static void run_bwd(const at::Tensor& q, const AttnBwdParams& p, at::Tensor& dk,
//                       at::Tensor& dv);
//   static void run_kv_append(const at::Tensor& q, const KvAppendParams& p);
// and registers them for its dispatch key with register_attention_ops<Executor>(m).
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "attn_args.h"
#include "attn_mask.h"
#include "fp8_args.h"
#include "kvcache_args.h"
#include "op_args.h"

namespace flashattn {

// The arguments that turn scores into logits and mask them, which every op's schema names alike.
inline void read_score_rules(const OpArguments& args, AttnInputs& in) {
  in.softmax_scale = args.optional_double("softmax_scale");
  in.causal = args["causal"].toBool();
  in.window_left = args["window_left"].toInt();
  in.window_right = args["window_right"].toInt();
  in.softcap = args["softcap"].toDouble();
  in.alibi_slopes = args.optional_tensor("alibi_slopes");
}

inline AttnInputs read_attn_inputs(const OpArguments& args) {
  AttnInputs in;
  in.q = args.tensor("q");
  in.k = args.tensor("k");
  in.v = args.tensor("v");
  read_score_rules(args, in);
  in.attn_mask = args.optional_tensor("attn_mask");
  in.dropout_p = args["dropout_p"].toDouble();
  in.rng_state = args.optional_tensor("rng_state");
  in.align_bottom_right = args["align_bottom_right"].toBool();
  in.deterministic = args["deterministic"].toBool();
  in.cu_seqlens_q = args.optional_tensor("cu_seqlens_q");
  in.cu_seqlens_k = args.optional_tensor("cu_seqlens_k");
  in.max_seqlen_q = args.optional_int("max_seqlen_q");
  in.max_seqlen_k = args.optional_int("max_seqlen_k");
  in.seqused_q = args.optional_tensor("seqused_q");
  in.seqused_k = args.optional_tensor("seqused_k");
  in.block_table = args.optional_tensor("block_table");
  in.block_offsets = args.optional_tensor("block_offsets");
  in.out_fp32 = args["out_fp32"].toBool();
  in.q_descale = args.optional_tensor("q_descale");
  in.k_descale = args.optional_tensor("k_descale");
  in.v_descale = args.optional_tensor("v_descale");
  return in;
}

inline BwdInputs read_bwd_inputs(const OpArguments& args) {
  return {args.tensor("dout"), args.tensor("out"), args.tensor("lse"),
          args.optional_tensor("dlse"), args["grads_fp32"].toBool()};
}

// fwd of `in` (the op's arguments, which a test op may amend: the shim's fwd_split) on the
// Executor, its out and lse the op's results.
template <typename Executor>
void run_fwd_op(OpArguments& args, const AttnInputs& in) {
  auto [out, lse] = check_and_alloc_fwd(in, Executor::limits());
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  Executor::run_fwd(in.q, make_fwd_params(in, out, lse, mask_blocks), fp8_descales_of(in));
  args.set_results(std::move(out), std::move(lse));
}

template <typename Executor>
void fwd_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpArguments args(op, stack);
  run_fwd_op<Executor>(args, read_attn_inputs(args));
}

template <typename Executor>
void bwd_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpArguments args(op, stack);
  const AttnInputs in = read_attn_inputs(args);
  const BwdInputs grads = read_bwd_inputs(args);
  const bool mask_grad = args["attn_mask_grad"].toBool();
  auto [dq, dk, dv] = check_and_alloc_bwd(in, grads, Executor::limits());
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  const at::Tensor dlogit = mask_grad ? alloc_mask_grad(in) : at::Tensor();
  Executor::run_bwd(in.q, make_bwd_params(in, grads, dq, dk, dv, mask_blocks, dlogit), dk, dv);
  c10::IValue dmask;
  if (mask_grad) dmask = reduce_mask_grad(dlogit, *in.attn_mask);
  args.set_results(std::move(dq), std::move(dk), std::move(dv), std::move(dmask));
}

inline KvcacheInputs read_kvcache_inputs(const OpArguments& args) {
  KvcacheInputs in;
  AttnInputs& attn = in.attn;
  attn.q = args.tensor("q");
  attn.k = args.tensor("k_cache");
  attn.v = args.tensor("v_cache");
  read_score_rules(args, attn);
  attn.block_table = args.optional_tensor("block_table");
  attn.cache_batch_idx = args.optional_tensor("cache_batch_idx");
  attn.cache_leftpad = args.optional_tensor("cache_leftpad");
  attn.num_splits = args["num_splits"].toInt();
  in.k_new = args.optional_tensor("k");
  in.v_new = args.optional_tensor("v");
  in.rotary_cos = args.optional_tensor("rotary_cos");
  in.rotary_sin = args.optional_tensor("rotary_sin");
  in.cache_seqlens = args.optional_tensor("cache_seqlens");
  in.rotary_interleaved = args["rotary_interleaved"].toBool();
  attn.q_descale = args.optional_tensor("q_descale");
  attn.k_descale = args.optional_tensor("k_descale");
  attn.v_descale = args.optional_tensor("v_descale");
  return in;
}

// fwd_kvcache: everything is validated, and the outputs allocated, before the caches are
// written, so a call that fails on a bad argument or an allocation leaves the caches as they were.
template <typename Executor>
void fwd_kvcache_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpArguments args(op, stack);
  KvcacheInputs in = read_kvcache_inputs(args);
  check_kvcache_append(in, Executor::limits());
  auto [out, lse] = check_and_alloc_fwd(in.attn, Executor::limits());
  // The executor's own refusals of an FP8 call (one its kernel cannot run, e.g. a TMA-unaligned
  // layout) before the append, which they would otherwise follow; 16-bit calls always run.
  if (is_fp8(in.attn))
    Executor::check_fwd_runs(in.attn.q, make_fwd_params(in.attn, out, lse, at::Tensor()));
  if (in.seqlen_new() > 0 || in.rotary()) {
    const at::Tensor q_rotated = in.rotary() ? at::empty_like(in.attn.q) : at::Tensor();
    Executor::run_kv_append(in.attn.q, make_append_params(in, q_rotated));
    if (in.rotary()) in.attn.q = q_rotated;
  }
  Executor::run_fwd(in.attn.q, make_fwd_params(in.attn, out, lse, at::Tensor()),
                    fp8_descales_of(in.attn));
  args.set_results(std::move(out), std::move(lse));
}

// Registers fwd, bwd and fwd_kvcache of Executor in a TORCH_LIBRARY_IMPL block.
template <typename Executor>
void register_attention_ops(torch::Library& m) {
  m.impl("fwd", torch::CppFunction::makeFromBoxedFunction<&fwd_kernel<Executor>>());
  m.impl("bwd", torch::CppFunction::makeFromBoxedFunction<&bwd_kernel<Executor>>());
  m.impl("fwd_kvcache", torch::CppFunction::makeFromBoxedFunction<&fwd_kvcache_kernel<Executor>>());
}

}  // namespace flashattn
