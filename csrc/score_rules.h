// The score pipeline of every executor: how a raw score s = q_i . k_j becomes the logit the
// softmax takes, and what the backward's chain rule multiplies dS by. Its steps, in order:
//   1. scale            s * scale
//   2. softcap          softcap * tanh(s * scale / softcap)      (d/ds: scale (1 - tanh^2))
//   3. ALiBi            + alibi_bias: -slope |i + diag_offset - j|        (score_bias.h)
//   4. attn_mask        + mask_bias: its value, or 0 / -inf for a boolean mask (score_bias.h)
//   5. visibility       -inf where !key_visible: window, causal band, sequence (visibility.h)
//   6. dropout          P_ij * Z_ij / (1 - p) in the product with V only   (dropout.h)
// Steps 3-5 add nothing to d logit / ds; dropout's factor enters dS through dP, so the backward
// owns per entry P_ij, dlogit = P_ij (dP_ij Z_ij / (1 - p) - D_i) and d logit / ds.
//
// This header gathers the per-entry rules every executor calls, so that the CPU and the CUDA
// kernels agree to the bit: which keys a row sees, what ALiBi and attn_mask add, which
// probabilities dropout keeps. On top of it, one form per executor:
//   csrc/cuda/score_rules.cuh  ScoreRules: accumulator fragments (apply, drop) and single
//                              entries (forward, forward_log2, backward)
//   csrc/cpu/score_rows.h      ScoreRows: lines of a score tile (a query row over keys, or a
//                              key over query rows) and the backward's tiles
// A new rule is its per-entry function here (or in the header of its kind, included below),
// then one call in each form.
#pragma once
#include "dropout.h"
#include "score_bias.h"
#include "sequence.h"
#include "visibility.h"
