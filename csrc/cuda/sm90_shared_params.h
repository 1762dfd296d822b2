// The fields the sm_90a forward's and backward's kernel parameters (hopper::FwdSm90Params,
// hopper::BwdSm90Params) take alike from AttnParams, filled in one place so that the two passes
// cannot read a call's lengths, heads, scale or mask rules differently. Each launch fills the
// rest (O and its splits, the softcap's terms, dK / dV and workspaces) itself.
#pragma once

#include "../params.h"

namespace flashattn::cuda {

template <typename HopperParams>
inline void fill_sm90_shared_params(HopperParams& hp, const AttnParams& p) {
  hp.batch = p.batch;
  hp.seqlen_q = p.seqlen_q;  // the forward divides it by its packed GQA heads
  hp.seqlen_k = p.seqlen_k;
  hp.seqused_q = p.seqused_q;
  hp.seqused_k = p.seqused_k;
  hp.cu_seqlens_q = p.cu_seqlens_q;
  hp.cu_seqlens_k = p.cu_seqlens_k;
  hp.total_q = p.total_q;
  hp.total_k = p.total_k;
  hp.heads_q = p.heads_q;
  hp.head_group = p.head_group;
  hp.scale = p.scale;
  // exp2 takes the scores scaled by scale * log2(e), computed in double.
  hp.scale_log2 = static_cast<float>(p.scale_fp64 * 1.4426950408889634);
  // Causal is the window (-1, 0) (AttnParams); the causal kernels take it as it is.
  hp.align_bottom_right = p.align_bottom_right;
  hp.window_left = p.window_left;
  hp.window_right = p.window_right;
  // ALiBi's slope of (b, h) (mask.h alibi_slope): [Hq] or [B, Hq] fp32, strided.
  hp.alibi_slopes = static_cast<const float*>(p.alibi.ptr);
  hp.alibi_batch_stride = p.alibi.batch_stride;
  hp.alibi_head_stride = p.alibi.head_stride;
  // attn_mask and its block classes as the sm_80 kernels read them (AttnParams' view).
  hp.attn_mask = p.mask;
  // Dropout's [seed, offset], threshold and 1 / (1 - p) (dropout.h), as the forward drew it.
  hp.dropout = p.dropout;
}

}  // namespace flashattn::cuda
