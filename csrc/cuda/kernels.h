// The launch templates. Under nvcc each instantiation is compiled once, in inst/*.cu; the
// CPU-shim build includes their definitions (launch_*.cuh) and instantiates what it uses.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../params.h"
#include "grid.h"

namespace flashattn::cuda {

// The 16-bit forward on the head-dim tile (kHeadDim, kHeadDimV): q's and k's width, v's.
template <typename Element, int kHeadDim, int kHeadDimV>
void run_fwd_16bit(const AttnParams& p, float* split_scratch, cudaStream_t stream,
                   LaunchCheck after_launch);

// The sm_90a forward (launch_fwd_sm90.cuh): compiled for sm_90a only, in builds whose
// architecture list holds 90 (kSm90KernelsBuilt). tile_counter: the call's own 4 bytes of device
// memory, the walking kernels' place counter (hopper/fwd_sm90_walk.h), where the plan needs one
// (plan_fwd.h fwd_plan_takes_tile_counter); else null.
template <typename Element, int kHeadDim>
void run_fwd_sm90(const AttnParams& p, float* split_scratch, unsigned* tile_counter, cudaStream_t stream,
                  LaunchCheck after_launch);

// The sm_90a FP8 forward (launch_fwd_sm90.cuh): e4m3 q, k, v at head dim 128, out bfloat16, with
// the descales (params.h Fp8Descales) and split_scratch as run_fwd_sm90's; built as run_fwd_sm90 is.
template <typename Element, int kHeadDim>
void run_fwd_sm90_fp8(const AttnParams& p, const Fp8Descales& descales, float* split_scratch,
                      cudaStream_t stream, LaunchCheck after_launch);

// The sm_90a backward (launch_bwd_sm90.cuh): as run_fwd_sm90.
template <typename Element, int kHeadDim>
void run_bwd_sm90(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                  LaunchCheck after_launch);

// The sm_90a backward of attn_mask with softcap where its main loops are compiled apart from
// run_bwd_sm90's (launch_bwd_sm90_mask_softcap.cuh, hopper::bwd_sm90_attn_mask_softcap_apart):
// run_bwd_sm90 calls it.
template <typename Element, int kHeadDim>
void run_bwd_sm90_mask_softcap(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                               LaunchCheck after_launch);

// The 16-bit backward on the head-dim tile (kHeadDim, kHeadDimV), as run_fwd_16bit.
template <typename Element, int kHeadDim, int kHeadDimV>
void run_bwd_16bit(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                   LaunchCheck after_launch);

template <int kHeadDim>
void run_fwd_simt(const AttnParams& p, float* split_scratch, cudaStream_t stream,
                  LaunchCheck after_launch);

template <int kHeadDim>
void run_bwd_simt(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                  LaunchCheck after_launch);

template <typename Element>
void run_split_merge(const AttnParams& p, const float* split_scratch, cudaStream_t stream,
                     LaunchCheck after_launch);

template <typename Element>
void run_kv_append(const KvAppendParams& p, cudaStream_t stream, LaunchCheck after_launch);

}  // namespace flashattn::cuda
