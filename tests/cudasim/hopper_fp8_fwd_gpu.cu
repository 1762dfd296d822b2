// The GPU side of tests/cudasim/hopper_fp8_fwd.py: the sm_90a FP8 (e4m3) forward at d = 128
// (csrc/cuda/hopper/) built with -gencode arch=compute_90a,code=sm_90a into a shared library
// that the script loads with ctypes, so it runs on torch's tensors and stream.
//
//   int hopper_fp8_fwd_run(int causal, const void* q, const void* k, const void* v, void* o,
//                          float* lse, const long long* strides, int batch, int seqlen_q,
//                          int seqlen_k, int heads_q, int heads_kv, float scale,
//                          const float* q_descale, const float* k_descale,
//                          const float* v_descale, void* stream, char* error, int error_len)
//
// q, k, v: float8_e4m3fn [B, S, H, 128]; o: bf16; strides: 12 element strides, (batch, row,
// head) of q, k, v and o in that order; the LSE is [B, Hq, Sq] contiguous; the descales are
// float32 [B, Hkv] contiguous, or null (1). Causal is bottom-right aligned.
// Returns 0, or -1 with the reason in `error`.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "cuda/hopper/fwd_sm90_launch.h"

namespace {

using namespace flashattn::hopper;
using Fp8 = __nv_fp8_e4m3;
constexpr int kHeadDim = 128;

template <bool kCausal>
std::string launch(const void* q, const void* k, const void* v, void* o, float* lse, const long long* st,
                   int batch, int sq, int sk, int hq, int hkv, float scale, const float* q_descale,
                   const float* k_descale, const float* v_descale, void* stream) {
  using Cfg = FwdSm90ConfigOf<Fp8, kHeadDim>;
  auto input = [&](const void* ptr, int which, int seqlen, int heads) {
    FwdSm90Input in;
    in.ptr = ptr, in.seqlen = seqlen, in.heads = heads;
    in.batch_stride = st[3 * which], in.row_stride = st[3 * which + 1], in.head_stride = st[3 * which + 2];
    return in;
  };
  FwdSm90Maps maps;
  std::string error = make_fwd_sm90_maps(maps, flashattn::TensorMapDtype::UInt8, kHeadDim, batch,
                                         input(q, 0, sq, hq), input(k, 1, sk, hkv), input(v, 2, sk, hkv),
                                         input(o, 3, sq, hq), Cfg::kBlockM, Cfg::kBlockN, 1,
                                         flashattn::TensorMapDtype::BFloat16);
  if (!error.empty()) return "tensor maps: " + error;
  FwdSm90Params p;
  p.lse = lse;
  p.lse_batch_stride = static_cast<int64_t>(hq) * sq, p.lse_head_stride = sq;
  p.batch = batch, p.seqlen_q = sq, p.seqlen_k = sk, p.heads_q = hq, p.head_group = hq / hkv;
  p.scale = scale, p.scale_log2 = scale * 1.4426950408889634f;
  p.q_descale = q_descale, p.k_descale = k_descale, p.v_descale = v_descale;
  p.q_descale_batch_stride = p.k_descale_batch_stride = p.v_descale_batch_stride = hkv;
  return launch_fwd_sm90<Fp8, kHeadDim, kCausal>(maps, p, stream);
}

}  // namespace

extern "C" int hopper_fp8_fwd_run(int causal, const void* q, const void* k, const void* v, void* o,
                                  float* lse, const long long* strides, int batch, int seqlen_q,
                                  int seqlen_k, int heads_q, int heads_kv, float scale,
                                  const float* q_descale, const float* k_descale,
                                  const float* v_descale, void* stream, char* error, int error_len) {
  std::string why;
  if (heads_kv <= 0 || heads_q % heads_kv != 0) {
    why = "heads_q must be a multiple of heads_kv";
  } else {
    why = causal ? launch<true>(q, k, v, o, lse, strides, batch, seqlen_q, seqlen_k, heads_q, heads_kv, scale,
                                q_descale, k_descale, v_descale, stream)
                 : launch<false>(q, k, v, o, lse, strides, batch, seqlen_q, seqlen_k, heads_q, heads_kv, scale,
                                 q_descale, k_descale, v_descale, stream);
  }
  if (why.empty()) return 0;
  if (error != nullptr && error_len > 0) std::snprintf(error, static_cast<size_t>(error_len), "%s", why.c_str());
  return -1;
}
