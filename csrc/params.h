// The parameter struct every executor (CPU, CUDA, the CUDA-on-CPU shim) receives.
//
// Shape and stride logic is done once, on the host, in attn_args.cpp; kernels only read
// these plain fields. Strides are in elements; the last dimension is always contiguous.
#pragma once
#include <cstdint>

namespace flashattn {

struct AttnParams {
  // Q [B, Sq, Hq, D], K/V [B, Sk, Hkv, D], O [B, Sq, Hq, D]; last dim contiguous.
  const void* q_ptr = nullptr;
  const void* k_ptr = nullptr;
  const void* v_ptr = nullptr;
  void* o_ptr = nullptr;
  // LSE [B, Hq, Sq], fp32, contiguous. Natural-log log-sum-exp of the scores; -inf for a row
  // that sees no key.
  float* lse_ptr = nullptr;

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_group = 1;  // heads_q / heads_kv: query head h reads kv head h / head_group
  int head_dim = 0;

  float scale = 1.f;    // softmax scale applied to q·k
  float softcap = 0.f;  // > 0: s = softcap * tanh(s / softcap), after scaling
  // The same two in full precision, for executors that compute in fp64 (the CPU's float64
  // path, which gradcheck and the float64 tests compare against an fp64 reference).
  double scale_fp64 = 1.0;
  double softcap_fp64 = 0.0;

  // Which keys a query row sees. Row i sees key j iff
  //   (window_left  < 0 || j >= i + diag_offset - window_left) &&
  //   (window_right < 0 || j <= i + diag_offset + window_right).
  // Causal attention is window_right = 0. diag_offset is Sk - Sq for FA2's bottom-right
  // alignment and 0 for SDPA's top-left alignment.
  int window_left = -1;
  int window_right = -1;
  int diag_offset = 0;
  bool is_causal = false;  // == (window_right == 0); lets kernels pick the causal instantiation

  // ALiBi slopes, fp32, [B, Hq] (alibi_batch_stride = Hq) or [Hq] (alibi_batch_stride = 0).
  // Adds -slope * |i + diag_offset - j| to the (soft-capped) score.
  const float* alibi_ptr = nullptr;
  int64_t alibi_batch_stride = 0;
};

struct AttnBwdParams : AttnParams {
  // dO [B, Sq, Hq, D], last dim contiguous.
  const void* do_ptr = nullptr;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  // dLSE [B, Hq, Sq] fp32 contiguous, or nullptr when the LSE output has no gradient.
  const float* dlse_ptr = nullptr;

  // dQ [B, Sq, Hq, D], dK/dV [B, Sk, Hkv, D]; freshly allocated, last dim contiguous.
  void* dq_ptr = nullptr;
  void* dk_ptr = nullptr;
  void* dv_ptr = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;
};

}  // namespace flashattn
