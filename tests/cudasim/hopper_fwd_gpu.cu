// The GPU side of tests/cudasim/hopper_fwd.py: the sm_90a forward (csrc/cuda/hopper/) built with
// -gencode arch=compute_90a,code=sm_90a into a shared library that the script loads with ctypes,
// so it runs on torch's tensors and stream.
//
//   int hopper_fwd_run(int f16, int head_dim, int causal, const void* q, const void* k,
//                      const void* v, void* o, float* lse, const long long* strides,
//                      int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
//                      float scale, float softcap, int window_left, int window_right,
//                      void* stream, char* error, int error_len)
//
// strides: 12 element strides, (batch, row, head) of q, k, v and o in that order; the LSE is
// [B, Hq, Sq] contiguous. softcap > 0 (bf16 only): logits softcap * tanh(scale * s / softcap).
// A window edge >= 0 (bf16, not causal, no softcap): the local kernel, bottom-right aligned.
// Returns 0, or -1 with the reason in `error`.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "cuda/hopper/fwd_sm90_launch.h"

namespace {

using namespace flashattn::hopper;

template <typename Elem, int kHeadDim, bool kCausal, bool kSoftcap, bool kLocal = false>
std::string launch(const void* q, const void* k, const void* v, void* o, float* lse,
                   const long long* st, int batch, int sq, int sk, int hq, int hkv, float scale,
                   float softcap, void* stream, int window_left = -1, int window_right = -1) {
  using Cfg = FwdSm90Config<kHeadDim>;
  auto input = [&](const void* ptr, int which, int seqlen, int heads) {
    FwdSm90Input in;
    in.ptr = ptr, in.seqlen = seqlen, in.heads = heads;
    in.batch_stride = st[3 * which], in.row_stride = st[3 * which + 1], in.head_stride = st[3 * which + 2];
    return in;
  };
  FwdSm90Maps maps;
  const auto dtype = std::is_same_v<Elem, __nv_bfloat16> ? flashattn::TensorMapDtype::BFloat16
                                                         : flashattn::TensorMapDtype::Float16;
  std::string error = make_fwd_sm90_maps(maps, dtype, kHeadDim, batch, input(q, 0, sq, hq),
                                         input(k, 1, sk, hkv), input(v, 2, sk, hkv),
                                         input(o, 3, sq, hq), Cfg::kBlockM, Cfg::kBlockN);
  if (!error.empty()) return "tensor maps: " + error;
  FwdSm90Params p;
  p.lse = lse;
  p.lse_batch_stride = static_cast<int64_t>(hq) * sq, p.lse_head_stride = sq;
  p.batch = batch, p.seqlen_q = sq, p.seqlen_k = sk, p.heads_q = hq, p.head_group = hq / hkv;
  p.scale_log2 = scale * 1.4426950408889634f;
  p.softcap = softcap, p.scale_over_softcap = softcap > 0.f ? scale / softcap : 0.f;
  p.window_left = window_left, p.window_right = window_right;
  // The walking kernels' place counter, this call's own (stream-ordered allocation).
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cudaMallocAsync(reinterpret_cast<void**>(&p.tile_counter), sizeof(unsigned), s) != cudaSuccess)
    return "cudaMallocAsync (the tile counter) failed";
  const std::string launched = launch_fwd_sm90<Elem, kHeadDim, kCausal, kSoftcap, kLocal>(maps, p, stream);
  cudaFreeAsync(p.tile_counter, s);
  return launched;
}

template <typename Elem, bool kSoftcap>
std::string by_config(int head_dim, int causal, const void* q, const void* k, const void* v, void* o,
                      float* lse, const long long* st, int b, int sq, int sk, int hq, int hkv,
                      float scale, float cap, void* stream) {
  if (head_dim == 64)
    return causal ? launch<Elem, 64, true, kSoftcap>(q, k, v, o, lse, st, b, sq, sk, hq, hkv, scale, cap, stream)
                  : launch<Elem, 64, false, kSoftcap>(q, k, v, o, lse, st, b, sq, sk, hq, hkv, scale, cap, stream);
  if (head_dim == 128)
    return causal ? launch<Elem, 128, true, kSoftcap>(q, k, v, o, lse, st, b, sq, sk, hq, hkv, scale, cap, stream)
                  : launch<Elem, 128, false, kSoftcap>(q, k, v, o, lse, st, b, sq, sk, hq, hkv, scale, cap, stream);
  return "head_dim " + std::to_string(head_dim) + " is not 64 or 128";
}

}  // namespace

// The ALiBi kernels are not reachable from hopper_fwd_run yet (no slopes argument); one is
// instantiated here so that ptxas and the SASS checks of hopper_fwd.py see its code.
template __global__ void flashattn::hopper::fwd_sm90_kernel<__nv_bfloat16, 128, true, false, false, true>(
    const __grid_constant__ flashattn::TensorMap, const __grid_constant__ flashattn::TensorMap,
    const __grid_constant__ flashattn::TensorMap, const __grid_constant__ flashattn::TensorMap,
    const flashattn::hopper::FwdSm90Params);

extern "C" int hopper_fwd_run(int f16, int head_dim, int causal, const void* q, const void* k,
                              const void* v, void* o, float* lse, const long long* strides,
                              int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                              float scale, float softcap, int window_left, int window_right,
                              void* stream, char* error, int error_len) {
  std::string why;
  if (heads_kv <= 0 || heads_q % heads_kv != 0) {
    why = "heads_q must be a multiple of heads_kv";
  } else if (window_left >= 0 || window_right >= 0) {
    using bf16 = __nv_bfloat16;
    if (f16 || causal || softcap > 0.f) {
      why = "a window is built for bf16, not causal, without softcap";
    } else if (head_dim == 64) {
      why = launch<bf16, 64, false, false, true>(q, k, v, o, lse, strides, batch, seqlen_q, seqlen_k, heads_q,
                                                 heads_kv, scale, 0.f, stream, window_left, window_right);
    } else if (head_dim == 128) {
      why = launch<bf16, 128, false, false, true>(q, k, v, o, lse, strides, batch, seqlen_q, seqlen_k, heads_q,
                                                  heads_kv, scale, 0.f, stream, window_left, window_right);
    } else {
      why = "head_dim " + std::to_string(head_dim) + " is not 64 or 128";
    }
  } else if (softcap > 0.f && f16) {
    why = "softcap is built for bf16 only";
  } else if (softcap > 0.f) {
    why = by_config<__nv_bfloat16, true>(head_dim, causal, q, k, v, o, lse, strides, batch, seqlen_q,
                                         seqlen_k, heads_q, heads_kv, scale, softcap, stream);
  } else {
    why = f16 ? by_config<__half, false>(head_dim, causal, q, k, v, o, lse, strides, batch, seqlen_q,
                                         seqlen_k, heads_q, heads_kv, scale, 0.f, stream)
              : by_config<__nv_bfloat16, false>(head_dim, causal, q, k, v, o, lse, strides, batch,
                                                seqlen_q, seqlen_k, heads_q, heads_kv, scale, 0.f, stream);
  }
  if (why.empty()) return 0;
  if (error != nullptr && error_len > 0) std::snprintf(error, static_cast<size_t>(error_len), "%s", why.c_str());
  return -1;
}
