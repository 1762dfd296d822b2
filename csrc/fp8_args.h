// The FP8 forward's arguments (fwd's q_descale, k_descale, v_descale; schema.h), checked once for
// every executor: which inputs make an FP8 call, what it may be given, the descales' views.
//
// An FP8 call is one whose q, k and v are all float8_e4m3fn (FA3's FP8 forward). It runs the
// sm_90a e4m3 kernel at head dim 128 (csrc/cuda/launch_fwd_sm90.cuh run_fwd_sm90_fp8), which the
// CUDA executor plans on a compute capability 9.0 device with FLASHATTN_CUDA_HOPPER=1
// (cuda/plan_fwd_fp8.h); out is bfloat16 (FA3's), the LSE fp32. Everything the kernel lacks is
// refused here, naming it; the backward of FP8 inputs is refused too (check_no_fp8_bwd).
#pragma once
#include <ATen/core/Tensor.h>

#include "attn_args.h"
#include "params.h"

namespace flashattn {

// q is float8_e4m3fn (after check_fp8_fwd: q, k and v all are).
bool is_fp8(const AttnInputs& in);

// The forward's FP8 checks, before the shared shape checks (attn_args.cpp check_fwd): FP8 q, k,
// v all three or none; descales only with FP8 inputs; an executor with the FP8 forward.
void check_fp8_dtypes(const AttnInputs& in, const ExecutorLimits& limits);

// After the shared shape checks, for an FP8 call: head dim 128; none of the features the FP8
// kernel lacks; each descale fp32 [B, Hkv] (varlen: B sequences) on q's device, any strides.
void check_fp8_fwd(const AttnInputs& in);

// The backward takes no FP8 inputs and no descales (bwd repeats fwd's arguments, schema.h).
void check_no_fp8_bwd(const AttnInputs& in);

// out's dtype: bfloat16 for FP8 inputs, float32 with out_fp32, else q's.
at::ScalarType fwd_out_dtype(const AttnInputs& in);

// The descales as the FP8 launch reads them (ptr null where not given).
Fp8Descales fp8_descales_of(const AttnInputs& in);

}  // namespace flashattn
