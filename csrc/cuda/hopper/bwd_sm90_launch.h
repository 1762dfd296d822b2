// Host launch of the sm_90a backward, under nvcc (a stream) and under the CPU shim (the grid runs
// on the calling thread; errors throw cudasim::SimError): the rows kernel, the main kernel, the
// dQ convert kernel, in that order (bwd_sm90_params.h). Callers: the library's launch
// (launch_bwd_sm90.cuh, with FLASHATTN_CUDA_HOPPER=1), tests/cudasim/selftest/hopper_bwd_test.cpp
// and tests/cudasim/hopper_bwd_gpu.cu.
//
// The caller provides the workspace: bwd_sm90_workspace_floats() floats, 16-byte aligned (row
// stats, then the dQ accumulator); bwd_sm90_bind_workspace() points the params into it.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/hopper/bwd_sm90_kernel.cuh"
#include "cuda/hopper/bwd_sm90_rows.cuh"

#if !(defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__))
#include <cuda_runtime.h>
#endif

namespace flashattn::hopper {

// "" if the arguments fit the kernels, else which one does not, what was expected and what was
// given. (Q, K, V and dO's strides and pointers are checked by the tensor map encoder.)
inline std::string check_bwd_sm90_args(const BwdSm90Params& p, const BwdSm90Rows& rows) {
  auto text = [](const char* name, const std::string& expected, const std::string& got) {
    return std::string(name) + ": expected " + expected + ", got " + got;
  };
  auto address = [](const void* ptr) { return std::to_string(reinterpret_cast<uintptr_t>(ptr)); };
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0)
    return text("batch, seqlen_q, seqlen_k, heads_q", "non-negative sizes",
                std::to_string(p.batch) + ", " + std::to_string(p.seqlen_q) + ", " + std::to_string(p.seqlen_k) +
                    ", " + std::to_string(p.heads_q));
  if (p.head_group < 1 || p.heads_q % p.head_group != 0)
    return text("head_group", "a divisor of heads_q = " + std::to_string(p.heads_q), std::to_string(p.head_group));
  // Bulk copies and reduce-adds move 16-byte-aligned blocks of the workspace.
  const struct {
    const char* name;
    const float* ptr;
  } workspace[3] = {{"lse_log2 (workspace)", p.lse_log2}, {"dpsum (workspace)", p.dpsum}, {"dq_accum (workspace)", p.dq_accum}};
  for (const auto& w : workspace)
    if (w.ptr == nullptr || reinterpret_cast<uintptr_t>(w.ptr) % 16 != 0)
      return text(w.name, "a 16-byte aligned pointer (bwd_sm90_bind_workspace)", address(w.ptr));
  if (rows.o.ptr == nullptr || rows.dout.ptr == nullptr || rows.lse.ptr == nullptr)
    return text("O, dO, LSE", "three tensors", "a null pointer");
  if (p.varlen() && (p.cu_seqlens_k == nullptr || p.total_q < 0 || p.total_k < 0))
    return text("cu_seqlens_k, total_q, total_k", "cu_seqlens_k with cu_seqlens_q, non-negative totals",
                std::string(p.cu_seqlens_k == nullptr ? "none" : "given") + ", " + std::to_string(p.total_q) +
                    ", " + std::to_string(p.total_k));
  // dQ, dK and dV are written as pairs of 16-bit elements (one 32-bit store).
  const struct {
    const char* name;
    const TensorView* view;
  } outputs[3] = {{"dQ", &rows.dq}, {"dK", &p.dk}, {"dV", &p.dv}};
  for (const auto& o : outputs) {
    const TensorView& v = *o.view;
    if (v.ptr == nullptr || reinterpret_cast<uintptr_t>(v.ptr) % 4 != 0)
      return text(o.name, "a 4-byte aligned pointer", address(v.ptr));
    if (v.batch_stride % 2 != 0 || v.row_stride % 2 != 0 || v.head_stride % 2 != 0)
      return text(o.name, "even element strides (batch, row, head)",
                  std::to_string(v.batch_stride) + ", " + std::to_string(v.row_stride) + ", " +
                      std::to_string(v.head_stride));
  }
  return "";
}

// "" if the window fits the main loop chosen (bwd_sm90_kernel's kCausal, kLocal): a kernel
// without a window would ignore it and compute another attention's gradients.
template <bool kCausal, bool kLocal>
std::string check_bwd_sm90_window(const BwdSm90Params& p) {
  static_assert(!(kCausal && kLocal), "causal is the local window (-1, 0): use one of them");
  if (!kLocal && (p.window_left >= 0 || (!kCausal && p.window_right >= 0)))
    return "window_left, window_right: expected " + std::string(kCausal ? "-1 and -1 or 0" : "-1, -1") +
           " without the local-window kernel, got " + std::to_string(p.window_left) + ", " +
           std::to_string(p.window_right);
  if (kLocal && (p.window_left < -1 || p.window_right < -1))
    return "window_left, window_right: expected -1 (no edge) or >= 0, got " + std::to_string(p.window_left) +
           ", " + std::to_string(p.window_right);
  return "";
}

// "" if the ALiBi slopes fit the main loop chosen (kAlibi): slopes for a loop without ALiBi would
// be ignored (another attention's gradients), and the kAlibi loop reads them for every block. The
// attn_mask loops take them or not at run time.
template <bool kAlibi, bool kAttnMask>
std::string check_bwd_sm90_alibi(const BwdSm90Params& p) {
  if (!kAttnMask && kAlibi != (p.alibi_slopes != nullptr))
    return std::string("alibi_slopes: expected ") +
           (kAlibi ? "a pointer for the ALiBi kernel" : "nullptr without the ALiBi kernel") + ", got " +
           (p.alibi_slopes ? "a pointer" : "nullptr");
  if (p.alibi_slopes != nullptr && (p.alibi_batch_stride < 0 || p.alibi_head_stride < 0))
    return "alibi_batch_stride, alibi_head_stride: expected non-negative strides, got " +
           std::to_string(p.alibi_batch_stride) + ", " + std::to_string(p.alibi_head_stride);
  return "";
}

// "" if the softcap fits the main loop chosen (kSoftcap), as the slopes above. The ALiBi loops
// take softcap or not at run time (kSoftcap false) where built so (bwd_sm90_alibi_takes_softcap);
// elsewhere ALiBi with softcap has loops of its own (kAlibi and kSoftcap).
template <int kHeadDim, bool kAlibi, bool kSoftcap>
std::string check_bwd_sm90_softcap(const BwdSm90Params& p) {
  static_assert(!(kAlibi && kSoftcap && bwd_sm90_alibi_takes_softcap(kHeadDim)),
                "the ALiBi loops take softcap at run time at this head dim");
  if (kAlibi && bwd_sm90_alibi_takes_softcap(kHeadDim))
    return p.softcap >= 0.f ? "" : "softcap: expected >= 0, got " + std::to_string(p.softcap);
  if (kSoftcap != (p.softcap > 0.f))
    return std::string("softcap: expected ") +
           (kSoftcap ? "> 0 for the softcap kernel" : "0 without the softcap kernel") + ", got " +
           std::to_string(p.softcap);
  return "";
}

// "" on success, else why a launch failed (or which argument check_bwd_sm90_args rejected).
// "" if attn_mask fits the main loop chosen (kAttnMask), as the slopes above; its loops take ALiBi
// at run time (not as kAlibi), softcap as kSoftcap.
template <bool kAlibi, bool kSoftcap, bool kAttnMask>
std::string check_bwd_sm90_attn_mask(const BwdSm90Params& p) {
  static_assert(!(kAttnMask && kAlibi), "the attn_mask loops take ALiBi at run time");
  if (kAttnMask != (p.attn_mask.ptr != nullptr))
    return std::string("attn_mask: expected ") + (kAttnMask ? "a mask for the attn_mask kernel" : "none") +
           ", got " + (p.attn_mask.ptr ? "a mask" : "none");
  return "";
}

// "" if dropout fits the main loop chosen (kDropout), as the slopes above; none with ALiBi,
// softcap or attn_mask.
template <bool kAlibi, bool kSoftcap, bool kAttnMask, bool kDropout>
std::string check_bwd_sm90_dropout(const BwdSm90Params& p) {
  static_assert(!(kDropout && (kAlibi || kSoftcap || kAttnMask)),
                "no main loop has dropout with ALiBi, softcap or attn_mask");
  if (kDropout != p.dropout.on())
    return std::string("dropout: expected ") + (kDropout ? "an rng_state for the dropout kernel" : "none") +
           ", got " + (p.dropout.on() ? "an rng_state" : "none");
  return "";
}

template <typename Elem, int kHeadDim, bool kCausal, bool kLocal = false, bool kAlibi = false,
          bool kSoftcap = false, bool kAttnMask = false, bool kDropout = false>
std::string launch_bwd_sm90(const BwdSm90Maps& maps, const BwdSm90Params& p, const BwdSm90Rows& rows,
                            void* stream) {
  using Cfg = BwdSm90Config<kHeadDim>;
  std::string bad = check_bwd_sm90_args(p, rows);
  if (bad.empty()) bad = check_bwd_sm90_window<kCausal, kLocal>(p);
  if (bad.empty()) bad = check_bwd_sm90_alibi<kAlibi, kAttnMask>(p);
  if (bad.empty()) bad = check_bwd_sm90_softcap<kHeadDim, kAlibi, kSoftcap>(p);
  if (bad.empty()) bad = check_bwd_sm90_attn_mask<kAlibi, kSoftcap, kAttnMask>(p);
  if (bad.empty()) bad = check_bwd_sm90_dropout<kAlibi, kSoftcap, kAttnMask, kDropout>(p);
  if (!bad.empty()) return bad;
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0 || p.seqlen_k == 0) return "";
  const DqAccumLayout<kHeadDim> dq = bwd_sm90_dq_layout<kHeadDim>(p);
  const BwdSm90Grids g = bwd_sm90_grids<kHeadDim>(p);
  const dim3 rows_grid(g.rows.x, g.rows.y, g.rows.z), grid(g.main.x, g.main.y, g.main.z);
  const dim3 convert_grid(g.convert.x, g.convert.y, g.convert.z);
  auto rows_kernel = bwd_sm90_rows_kernel<Elem, kHeadDim>;
  auto kernel = bwd_sm90_kernel<Elem, kHeadDim, kCausal, kLocal, kAlibi, kSoftcap, kAttnMask, kDropout>;
  auto convert_kernel = bwd_sm90_convert_dq_kernel<Elem, kHeadDim>;
#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
  (void)stream;
  ::cudasim::launch(rows_kernel, rows_grid, dim3(kRowThreads), 0, p, rows, dq);
  ::cudasim::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  ::cudasim::launch(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, maps.q, maps.k, maps.v, maps.dout, p, dq);
  ::cudasim::launch(convert_kernel, convert_grid, dim3(kRowThreads), 0, p, rows, dq);
  return "";
#else
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  rows_kernel<<<rows_grid, kRowThreads, 0, s>>>(p, rows, dq);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return std::string("rows kernel: ") + cudaGetErrorString(status);
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::kSmemBytes));
  if (status != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(status);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(maps.q, maps.k, maps.v, maps.dout, p, dq);
  status = cudaGetLastError();
  if (status != cudaSuccess) return std::string("main kernel: ") + cudaGetErrorString(status);
  convert_kernel<<<convert_grid, kRowThreads, 0, s>>>(p, rows, dq);
  status = cudaGetLastError();
  if (status != cudaSuccess) return std::string("convert kernel: ") + cudaGetErrorString(status);
  return "";
#endif
}

}  // namespace flashattn::hopper
