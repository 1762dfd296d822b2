// The op schemas as strings, defined once. csrc/flashattn.cpp registers them as
// torch.ops.flashattn.*; the test-only CPU-shim build registers the same strings under its own
// namespace, so the two executors cannot drift apart.
#pragma once

namespace flashattn {

// q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D], any strides with a contiguous last dim.
// Returns out [B, Sq, Hq, D] and lse [B, Hq, Sq] (fp32, natural log, -inf for a row that
// sees no key). window_* = -1 is unbounded; causal forces window_right = 0.
// deterministic is unused by the forward; it rides along so autograd can hand it to bwd.
// align_bottom_right: the diagonal of causal/window/alibi sits at i + Sk - Sq (FA2) when
// true, at i (F.scaled_dot_product_attention's is_causal) when false.
inline constexpr const char* kFwdSchema =
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, "
    "int window_right, float softcap, Tensor? alibi_slopes, bool align_bottom_right, "
    "bool deterministic) -> (Tensor out, Tensor lse)";

// Gradients of fwd. dlse is the gradient of the lse output (None if it has none); it folds
// into D = rowsum(dout * out) - dlse so the LSE is differentiable.
inline constexpr const char* kBwdSchema =
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
    "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "Tensor? alibi_slopes, bool align_bottom_right, bool deterministic) "
    "-> (Tensor dq, Tensor dk, Tensor dv)";

}  // namespace flashattn
