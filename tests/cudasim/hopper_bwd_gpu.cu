// The GPU side of tests/cudasim/hopper_bwd.py: the sm_90a backward (csrc/cuda/hopper/bwd_sm90_*)
// built with -gencode arch=compute_90a,code=sm_90a into a shared library that the script loads
// with ctypes, so it runs on torch's tensors and stream.
//
//   long long hopper_bwd_workspace_floats(int head_dim, int deterministic, int batch, int heads_q,
//                                         int seqlen_q, int seqlen_k)
//   int hopper_bwd_run(int f16, int head_dim, int causal, int deterministic, const void* q,
//                      const void* k, const void* v, const void* o, const void* dout,
//                      const float* lse, void* dq, void* dk, void* dv, const long long* strides,
//                      int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
//                      float scale, float* workspace, void* stream, char* error, int error_len)
//
// strides: 24 element strides, (batch, row, head) of q, k, v, o, dout, dq, dk, dv in that order;
// the LSE is [B, Hq, Sq] contiguous (natural log, as the forward stores it); causal is
// bottom-right aligned. workspace: hopper_bwd_workspace_floats() floats, 16-byte aligned.
// Returns 0, or -1 with the reason in `error`.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "cuda/hopper/bwd_sm90_launch.h"

namespace {

using namespace flashattn::hopper;

BwdSm90Params params(int deterministic, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float scale) {
  BwdSm90Params p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.heads_q = heads_q;
  p.head_group = heads_kv > 0 ? heads_q / heads_kv : 1;
  p.scale = scale, p.scale_log2 = scale * 1.4426950408889634f;
  p.deterministic = deterministic != 0;
  return p;
}

template <typename Elem, int kHeadDim, bool kCausal>
std::string launch(BwdSm90Params p, const void* const* in, void* dq, void* dk, void* dv, const float* lse,
                   const long long* st, int heads_kv, float* workspace, void* stream) {
  // Tensor `which`'s (batch, row, head) strides, st[3 which ...].
  auto strided = [&](const void* ptr, int which) {
    return flashattn::TensorView{const_cast<void*>(ptr), st[3 * which], st[3 * which + 1], st[3 * which + 2]};
  };
  auto view = [&](const void* ptr, int which, int seqlen, int heads) {
    return bshd_tensor(strided(ptr, which), p.batch, seqlen, heads);
  };
  const auto dtype = std::is_same_v<Elem, __nv_bfloat16> ? flashattn::TensorMapDtype::BFloat16
                                                         : flashattn::TensorMapDtype::Float16;
  BwdSm90Maps maps;
  const std::string error =
      make_bwd_sm90_maps<kHeadDim>(maps, dtype, p.batch, view(in[0], 0, p.seqlen_q, p.heads_q),
                                   view(in[1], 1, p.seqlen_k, heads_kv), view(in[2], 2, p.seqlen_k, heads_kv),
                                   view(in[4], 4, p.seqlen_q, p.heads_q));
  if (!error.empty()) return "tensor maps: " + error;
  p.dk = strided(dk, 6), p.dv = strided(dv, 7);
  bwd_sm90_bind_workspace<kHeadDim>(p, workspace);
  BwdSm90Rows rows;
  rows.o = strided(in[3], 3), rows.dout = strided(in[4], 4), rows.dq = strided(dq, 5);
  rows.lse = flashattn::TensorView{const_cast<float*>(lse), static_cast<int64_t>(p.heads_q) * p.seqlen_q, 1, p.seqlen_q};
  return launch_bwd_sm90<Elem, kHeadDim, kCausal>(maps, p, rows, stream);
}

template <typename Elem>
std::string by_config(int head_dim, int causal, const BwdSm90Params& p, const void* const* in, void* dq, void* dk,
                      void* dv, const float* lse, const long long* st, int hkv, float* ws, void* stream) {
  if (head_dim == 64)
    return causal ? launch<Elem, 64, true>(p, in, dq, dk, dv, lse, st, hkv, ws, stream)
                  : launch<Elem, 64, false>(p, in, dq, dk, dv, lse, st, hkv, ws, stream);
  if (head_dim == 128)
    return causal ? launch<Elem, 128, true>(p, in, dq, dk, dv, lse, st, hkv, ws, stream)
                  : launch<Elem, 128, false>(p, in, dq, dk, dv, lse, st, hkv, ws, stream);
  return "head_dim " + std::to_string(head_dim) + " is not 64 or 128";
}

}  // namespace

extern "C" long long hopper_bwd_workspace_floats(int head_dim, int deterministic, int batch, int heads_q,
                                                 int seqlen_q, int seqlen_k) {
  const BwdSm90Params p = params(deterministic, batch, heads_q, heads_q, seqlen_q, seqlen_k, 1.f);
  if (head_dim == 64) return bwd_sm90_workspace_floats<64>(p);
  if (head_dim == 128) return bwd_sm90_workspace_floats<128>(p);
  return -1;
}

extern "C" int hopper_bwd_run(int f16, int head_dim, int causal, int deterministic, const void* q, const void* k,
                              const void* v, const void* o, const void* dout, const float* lse, void* dq, void* dk,
                              void* dv, const long long* strides, int batch, int seqlen_q, int seqlen_k,
                              int heads_q, int heads_kv, float scale, float* workspace, void* stream, char* error,
                              int error_len) {
  std::string why;
  if (heads_kv <= 0 || heads_q % heads_kv != 0) {
    why = "heads_q must be a multiple of heads_kv";
  } else {
    const BwdSm90Params p = params(deterministic, batch, heads_q, heads_kv, seqlen_q, seqlen_k, scale);
    const void* in[5] = {q, k, v, o, dout};
    why = f16 ? by_config<__half>(head_dim, causal, p, in, dq, dk, dv, lse, strides, heads_kv, workspace, stream)
              : by_config<__nv_bfloat16>(head_dim, causal, p, in, dq, dk, dv, lse, strides, heads_kv, workspace, stream);
  }
  if (why.empty()) return 0;
  if (error != nullptr && error_len > 0) std::snprintf(error, static_cast<size_t>(error_len), "%s", why.c_str());
  return -1;
}
