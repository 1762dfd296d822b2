// The sm_90a backward of attn_mask with softcap at the head dims whose main loops for it are
// compiled in files of their own (hopper::bwd_sm90_attn_mask_softcap_apart: d = 128, where beside
// the other loops of its (head dim, dtype) file ptxas spilled them and changed the others' SASS).
// Its three loops (no mask, causal, a local window; ALiBi at run time) are instantiated only here:
// inst/bwd_mask_softcap_hdim128_*_sm90.cu, and the shim's sim_kernels_bwd.cpp.
#pragma once
#include "launch_bwd_sm90.cuh"

namespace flashattn::cuda {

template <typename Element, int kHeadDim>
void run_bwd_sm90_mask_softcap(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                               LaunchCheck after_launch) {
  static_assert(hopper::bwd_sm90_attn_mask_softcap_apart(kHeadDim),
                "at this head dim attn_mask with softcap is built in run_bwd_sm90's file");
  const BwdSm90Launch l = make_bwd_sm90_launch<Element, kHeadDim>(p, workspace);
  check_bwd_sm90_launch(
      launch_bwd_sm90_attn_mask<Element, kHeadDim, true>(l.maps, l.hp, l.rows, stream, sm90_fwd_mask(p)));
  after_launch();
}

}  // namespace flashattn::cuda
