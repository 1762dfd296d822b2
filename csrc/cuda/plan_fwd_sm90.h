// Which forward calls the sm_90a kernels (csrc/cuda/hopper/, issue 31) take, written once for the
// plan (plan_fwd.h) and its tests. Host only and free of CUDA calls, like the plan.
//
// Opt-in until a GPU run has confirmed them: the executor reads FLASHATTN_CUDA_HOPPER once
// (api.cu) into DeviceProps::hopper_fwd. With it, on a compute capability 9.0 device, a call goes
// to the Hopper forward when sm90_fwd_unsupported() finds nothing in it the kernels lack; every
// other call keeps the sm_80 kernels (README's support table lists what stays there).
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "../params.h"
#include "dispatch.h"
#include "hopper/fwd_sm90_config.h"

namespace flashattn::cuda {

// Whether this build holds the Hopper kernels: setup.py defines FLASHATTN_SM90_KERNELS when it
// compiles inst/*_sm90.cu (FLASHATTN_CUDA_ARCHS holds 90), the shim's extension always.
#if defined(FLASHATTN_SM90_KERNELS)
inline constexpr bool kSm90KernelsBuilt = true;
#else
inline constexpr bool kSm90KernelsBuilt = false;
#endif

inline constexpr const char* kHopperOptInVariable = "FLASHATTN_CUDA_HOPPER";

// FLASHATTN_CUDA_HOPPER's value: unset, "" or "0" is off, "1" on; anything else has no value
// (the caller refuses it with hopper_opt_in_error), rather than being read as either.
inline std::optional<bool> parse_hopper_opt_in(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  return std::nullopt;
}

inline std::string hopper_opt_in_error(const char* value) {
  return std::string("flashattn: ") + kHopperOptInVariable + " must be 0 or 1 (or unset), got '" +
         value + "'";
}

// The head dims the Hopper forward is compiled for (kernel_list.py HEAD_DIMS_SM90). It takes a
// head dim equal to one of them; a smaller one stays on sm_80's padded tiles.
using Sm90FwdHeadDims = HeadDimTilesOf<kSm90aFwdSm90HeadDims>;

inline bool is_sm90_fwd_head_dim(int head_dim) {
  bool found = false;
  dispatch_head_dim(Sm90FwdHeadDims{}, head_dim,
                    [&](auto tile) { found = decltype(tile)::value == head_dim; });
  return found;
}

// The extents of the Hopper forward's TMA maps: dense, (B, S) rows; varlen, the packed rows as one
// batch. Q and O's rows and heads are their own: with packed GQA heads (gqa_decode.h, dense only)
// the tokens and the query heads, not the packed rows. The plan's checks and the launch's maps
// (launch_fwd_sm90.cuh) both take them from here.
struct Sm90MapExtents {
  int batch;
  int64_t rows_q, rows_k;
  int heads_q;
};

inline Sm90MapExtents sm90_map_extents(const AttnParams& p) {
  if (p.cu_seqlens_q != nullptr) return {1, p.total_q, p.total_k, p.heads_q};
  const int g = p.packed_heads > 1 ? p.packed_heads : 1;
  return {p.batch, p.seqlen_q / g, p.seqlen_k, p.heads_q * g};
}

// Packed GQA heads (gqa_decode.h, as the sm_80 plan packs them) that the sm_90a forward takes, 16-bit
// or e4m3: a consumer warpgroup's 64 rows hold whole tokens' groups (hopper::fwd_sm90_consumer_tokens),
// so at most 64 query heads per kv head.
inline bool sm90_fwd_takes_packed_heads(const AttnParams& p) { return p.packed_heads <= 64; }

// The sm_90a forward's mask, a template parameter of its main loop (launch_fwd_sm90.cuh): causal
// is the window (-1, 0) in either alignment, any other window is local (hopper/fwd_sm90_mask.cuh).
enum class Sm90FwdMask { kNone, kCausal, kLocal };

inline Sm90FwdMask sm90_fwd_mask(const AttnParams& p) {
  if (p.window_left < 0 && p.window_right == 0) return Sm90FwdMask::kCausal;
  if (p.window_left >= 0 || p.window_right >= 0) return Sm90FwdMask::kLocal;
  return Sm90FwdMask::kNone;
}

// Whether the keys are gathered row by row (hopper/fwd_sm90_gather.cuh): a paged cache,
// cache_batch_idx or cache_leftpad (kv_rows.h key_row); otherwise K and V are TMA boxes.
inline bool sm90_fwd_gathers_kv(const AttnParams& p) {
  return p.kv_cache.paged() || p.kv_cache.batch_index != nullptr || p.kv_cache.leftpad != nullptr;
}

// Whether the 16-bit sm_90a forward's kernel for p (its features as launch_fwd_sm90.cuh
// run_fwd_sm90 picks the kernel by) walks tiles, and so may need the call's tile counter
// (plan_fwd.h fwd_plan_takes_tile_counter).
inline bool sm90_fwd_walks(const AttnParams& p) {
  return hopper::fwd_sm90_walks(p.head_dim, sm90_fwd_mask(p) == Sm90FwdMask::kLocal, p.softcap > 0.f,
                                p.alibi.ptr != nullptr, p.mask.ptr != nullptr, sm90_fwd_gathers_kv(p),
                                p.dropout.on(), /*fp8=*/false);
}

namespace detail {
// TMA (make_fwd_sm90_maps) reads a [B, S, H, D] view through 16-byte aligned addresses and
// strides that are multiples of 16 bytes (8 16-bit elements) below 2^40 bytes. A dimension of
// extent 1 never steps its stride, so any stride passes there (the launch substitutes one).
inline bool tma_stride_ok(int64_t stride, int64_t extent) {
  if (extent <= 1) return true;
  return stride > 0 && stride % 8 == 0 && stride < (int64_t{1} << 39);
}

// TMA coordinates are int32: the rows of a map must fit.
inline bool tma_view_ok(const TensorView& view, int batch, int64_t rows, int heads) {
  return reinterpret_cast<std::uintptr_t>(view.ptr) % 16 == 0 && rows < (int64_t{1} << 31) &&
         tma_stride_ok(view.row_stride, rows) && tma_stride_ok(view.head_stride, heads) &&
         tma_stride_ok(view.batch_stride, batch);
}

// The gathering producer's 16-byte cp.async reads a cache row from a 16-byte aligned address:
// the base pointer and every stride it steps (pages or entries, rows, heads) in 8 elements.
inline bool cp_async_view_ok(const TensorView& view) {
  const auto steps = [](int64_t stride) { return stride % 8 == 0; };
  return reinterpret_cast<std::uintptr_t>(view.ptr) % 16 == 0 && steps(view.batch_stride) &&
         steps(view.row_stride) && steps(view.head_stride);
}
}  // namespace detail

// Why the Hopper forward cannot run p (as the sm_80 plan made it: packed or not; the split count
// is the Hopper plan's own, plan_fwd.h use_sm90_fwd) on 16-bit inputs of `type`: the feature it
// lacks, or nullptr when it can run it. Each feature here is a row of
// README's support table until the kernel has it.
inline const char* sm90_fwd_unsupported(const AttnParams& p, ElementType type) {
  if (type == ElementType::kFloat) return "fp32 inputs";
  if (p.out_fp32) return "a float32 out of 16-bit inputs (out_fp32)";
  if (!is_sm90_fwd_head_dim(p.head_dim)) return "a head dim other than 64, 128 or 256";
  if (p.head_dim_v != p.head_dim) return "a value head dim of its own (MLA)";
  // A paged or indexed cache: the gathering producer's main loops are built for no mask, causal
  // and a local window (launch_fwd_sm90.cuh), the masks a decode takes.
  if (sm90_fwd_gathers_kv(p) && (p.softcap > 0.f || p.alibi.ptr != nullptr || p.mask.ptr != nullptr))
    return "a paged or indexed KV cache with softcap, ALiBi or attn_mask";
  if (sm90_fwd_gathers_kv(p) && (!detail::cp_async_view_ok(p.k) || !detail::cp_async_view_ok(p.v)))
    return "a paged or indexed KV cache whose rows are not 16-byte aligned";
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return "cu_seqlens for only one of q and k";
  if (!sm90_fwd_takes_packed_heads(p)) return "a GQA decode with more than 64 query heads per kv head";
  // attn_mask's main loops: no mask, causal or a local window, softcap and ALiBi at run time, at
  // every head dim (launch_fwd_sm90.cuh). The kernel reads the mask per entry from global memory
  // through its strides, so any layout the op accepts (broadcast strides included) runs here.
  // Dropout's main loops: no mask, causal or a local window, without softcap, ALiBi or attn_mask
  // (launch_fwd_sm90.cuh).
  if (p.dropout.on() && (p.softcap > 0.f || p.alibi.ptr != nullptr || p.mask.ptr != nullptr))
    return "dropout with softcap, ALiBi or attn_mask";
  if (p.dropout.on() && sm90_fwd_gathers_kv(p)) return "dropout with a paged or indexed KV cache";
  // Softcap with a local window runs at every head dim: in softcap's own window loop, in ALiBi's
  // and attn_mask's (softcap at run time there) (launch_fwd_sm90.cuh).
  // The kernel's online softmax takes each row's largest score as the largest logit, true only
  // for a positive scale (the sm_80 kernels turn other scales into logits first).
  if (!(p.scale > 0.f)) return "a softmax scale that is not positive";
  // The grid (FwdSm90Config::grid) puts heads on y and batches on z, each at most 65535.
  if (p.heads_q > 65535 || p.batch > 65535) return "more than 65535 heads or batches";
  // The kernel writes the LSE [B, Hq, Sq] (varlen [Hq, total_q]) with contiguous rows.
  if (p.lse.row_stride != 1) return "an LSE with strided rows";
  const Sm90MapExtents maps = sm90_map_extents(p);
  if (!detail::tma_view_ok(p.q, maps.batch, maps.rows_q, maps.heads_q) ||
      !detail::tma_view_ok(p.o, maps.batch, maps.rows_q, maps.heads_q) ||
      (!sm90_fwd_gathers_kv(p) && (!detail::tma_view_ok(p.k, maps.batch, maps.rows_k, p.heads_kv) ||
                                   !detail::tma_view_ok(p.v, maps.batch, maps.rows_k, p.heads_kv))))
    return "a q/k/v/out layout TMA cannot read (16-byte alignment of pointer and strides)";
  return nullptr;
}

// Whether the plan may consider the Hopper forward at all on this device: opted in, the kernels
// built, and compute capability 9.0 (sm_90a code runs on no other).
inline bool sm90_fwd_enabled(bool opted_in, int cc_major, int cc_minor) {
  return kSm90KernelsBuilt && opted_in && cc_major == 9 && cc_minor == 0;
}

}  // namespace flashattn::cuda
