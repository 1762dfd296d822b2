// Which backward calls the sm_90a kernels (csrc/cuda/hopper/bwd_sm90_*, issue 31) take, written
// once for the plan (plan_bwd.h), the launch (launch_bwd_sm90.cuh) and their tests. Host only and
// free of CUDA calls, like the plan.
//
// The same opt-in as the forward's (plan_fwd_sm90.h, sm90_fwd_enabled): FLASHATTN_CUDA_HOPPER=1
// on a compute capability 9.0 device, in a build holding the sm_90a kernels. A call goes to the
// Hopper backward when sm90_bwd_unsupported() finds nothing in it the kernels lack; every other
// call keeps the sm_80 backward (README's support table lists what stays there).
#pragma once
#include <cstdint>

#include "../params.h"
#include "dispatch.h"
#include "hopper/bwd_sm90_params.h"
#include "plan_fwd_sm90.h"
#include "sm90_shared_params.h"

namespace flashattn::cuda {

// The head dims the Hopper backward is compiled for (kernel_list.py HEAD_DIMS_SM90, family
// bwd_sm90). It takes a head dim equal to one of them; a smaller one keeps sm_80's padded tiles.
using Sm90BwdHeadDims = HeadDimTilesOf<kSm90aBwdSm90HeadDims>;

inline bool is_sm90_bwd_head_dim(int head_dim) {
  bool found = false;
  dispatch_head_dim(Sm90BwdHeadDims{}, head_dim,
                    [&](auto tile) { found = decltype(tile)::value == head_dim; });
  return found;
}

// The Hopper backward's own arguments for p (no workspace bound yet: the launch binds it, the
// plan sizes it from these).
inline hopper::BwdSm90Params make_bwd_sm90_params(const AttnBwdParams& p) {
  hopper::BwdSm90Params hp;
  fill_sm90_shared_params(hp, p);
  hp.deterministic = p.deterministic;
  hopper::set_bwd_sm90_softcap(hp, p.softcap);
  hp.dk = p.dk;
  hp.dv = p.dv;
  return hp;
}

namespace detail {
// The kernels write dQ, dK and dV as pairs of 16-bit elements (check_bwd_sm90_args).
inline bool pair_store_ok(const TensorView& view) {
  return reinterpret_cast<std::uintptr_t>(view.ptr) % 4 == 0 && view.batch_stride % 2 == 0 &&
         view.row_stride % 2 == 0 && view.head_stride % 2 == 0;
}
}  // namespace detail

// Why the Hopper backward cannot run p on 16-bit inputs of `type`: the feature it lacks, or
// nullptr when it can run it. Each feature here is a row of README's support table until the
// kernels have it.
inline const char* sm90_bwd_unsupported(const AttnBwdParams& p, ElementType type) {
  if (type == ElementType::kFloat) return "fp32 inputs";
  if (p.grads_fp32) return "float32 gradients of 16-bit inputs (grads_fp32)";
  if (!is_sm90_bwd_head_dim(p.head_dim) || p.head_dim_v != p.head_dim)
    return "a head dim other than 64 or 128";
  // An empty side launches nothing there, and dQ (no keys) or dK, dV (no queries) must still be
  // written as zeros, which sm_80's row kernels do.
  if (p.seqlen_q == 0 || p.seqlen_k == 0) return "an empty query or key sequence";
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return "cu_seqlens for only one of q and k";
  if (p.kv_cache.paged() || p.kv_cache.batch_index != nullptr || p.kv_cache.leftpad != nullptr)
    return "a paged or indexed KV cache";
  // attn_mask's main loops: no mask, causal or a local window, ALiBi at run time, softcap or not
  // (launch_bwd_sm90.cuh), read per entry through the mask's strides (any layout the op accepts).
  // Its gradient (a float mask that requires grad) is sm_80's alone. With softcap at d = 128 in
  // files of their own (run_bwd_sm90_mask_softcap).
  if (p.dmask != nullptr) return "a gradient of attn_mask";
  // Dropout's main loops: no mask, causal or a local window (launch_bwd_sm90.cuh), as the forward's.
  if (p.dropout.on() && (p.alibi.ptr != nullptr || p.softcap > 0.f || p.mask.ptr != nullptr))
    return "dropout with ALiBi, softcap or attn_mask";
  if (p.dropout.on() && !hopper::bwd_sm90_builds_dropout(p.head_dim, sm90_fwd_mask(p) == Sm90FwdMask::kLocal))
    return "dropout with a local window at head dim 64";
  // ALiBi's main loops: no mask, causal or a local window (launch_bwd_sm90.cuh), softcap or not
  // (at run time at d = 128, in loops of its own at d = 64).
  // The rows kernel computes D = rowsum(dO * O) without a dLSE term.
  if (p.dlse.ptr != nullptr) return "a gradient of the LSE output";
  // Grids put heads on y and batches on z (bwd_sm90_grids), each at most 65535.
  if (p.heads_q > 65535 || p.batch > 65535) return "more than 65535 heads or batches";
  // The rows kernel reads the LSE [B, Hq, Sq] with contiguous rows.
  if (p.lse.row_stride != 1) return "an LSE with strided rows";
  // Varlen: the row stats and the dQ accumulator pad each sequence to whole query blocks
  // (hopper::bwd_sm90_seq), total_q + B * kBlockM rows, an int (kBlockM is 128 at most).
  constexpr int64_t kLargestBlockM = hopper::BwdSm90Config<64>::kBlockM;
  static_assert(kLargestBlockM >= hopper::BwdSm90Config<128>::kBlockM);
  if (p.cu_seqlens_q != nullptr && p.total_q + p.batch * kLargestBlockM >= (int64_t{1} << 31))
    return "a varlen batch of 2^31 query rows or more";
  const Sm90MapExtents maps = sm90_map_extents(p);
  if (!detail::tma_view_ok(p.q, maps.batch, maps.rows_q, p.heads_q) ||
      !detail::tma_view_ok(p.dout, maps.batch, maps.rows_q, p.heads_q) ||
      !detail::tma_view_ok(p.k, maps.batch, maps.rows_k, p.heads_kv) ||
      !detail::tma_view_ok(p.v, maps.batch, maps.rows_k, p.heads_kv))
    return "a q/k/v/dout layout TMA cannot read (16-byte alignment of pointer and strides)";
  if (!detail::pair_store_ok(p.dq) || !detail::pair_store_ok(p.dk) ||
      !detail::pair_store_ok(p.dv))
    return "a dq/dk/dv layout with odd strides";
  return nullptr;
}

// Whether the plan may consider the Hopper backward on this device: the forward's rule (one
// opt-in for both, FLASHATTN_CUDA_HOPPER).
inline bool sm90_bwd_enabled(bool opted_in, int cc_major, int cc_minor) {
  return sm90_fwd_enabled(opted_in, cc_major, cc_minor);
}

}  // namespace flashattn::cuda
