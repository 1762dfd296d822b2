// Element-wise and reduction kernels on the score tiles: the non-GEMM part of the online
// softmax (forward) and of its gradient (backward). Each has an fp32 overload, vectorized for
// the running CPU (softmax_vec.cpp), and an fp64 one, plain loops for gradcheck. The hot steps
// (the forward's online-softmax step, the backward's exp and softmax gradient) take a whole
// tile per call; the rarer per-row steps (scaling, softcap, ALiBi) run before them.
// tests/cpp/softmax_vec_test.cpp checks the fp32 ones against double precision.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "simd.h"

namespace flashattn::cpu {

// One online-softmax step of the forward (FlashAttention-2) on a rows x cols tile of scores
// (row stride ld). For each row r, with m' = max(row_max[r], max_c S[r][c]):
//   S[r][c] = exp(S[r][c] - m'),  row_sum[r] = row_sum[r] * exp(row_max[r] - m') + sum_c S[r][c],
//   out[r][0..dim) *= exp(row_max[r] - m')  (out row stride out_ld),  row_max[r] = m'.
// A row that has seen no key yet (m' = -inf) becomes zeros and keeps its state. The fp32 ones
// run on `lanes` lanes (row_lanes(), simd.h); both widths give the same bits.
void online_softmax_tile(RowLanes lanes, float* scores, int rows, int cols, int64_t ld,
                         float* row_max, float* row_sum, float* out, int64_t out_ld, int dim);
// The same step for the 16-bit products, which leave S unscaled and take P in 16 bits: S[r][c]
// is first multiplied by `scale`, and P goes rounded to nearest even into probs (row stride
// probs_ld), followed by zeros up to column padded_cols, instead of into S (which is left
// unspecified). One pass over the tile where scale_by, online_softmax_tile and round_to_16bit
// made three; the exponent is S * scale - m', which may be fused into one rounding.
void online_softmax_tile(RowLanes lanes, float* scores, int rows, int cols, int64_t ld,
                         float scale, float* row_max, float* row_sum, float* out, int64_t out_ld,
                         int dim, c10::BFloat16* probs, int64_t probs_ld, int padded_cols);
void online_softmax_tile(RowLanes lanes, float* scores, int rows, int cols, int64_t ld,
                         float scale, float* row_max, float* row_sum, float* out, int64_t out_ld,
                         int dim, c10::Half* probs, int64_t probs_ld, int padded_cols);
void online_softmax_tile(double* scores, int rows, int cols, int64_t ld, double* row_max,
                         double* row_sum, double* out, int64_t out_ld, int dim);

// x[r][c] = exp(x[r][c] - shift[c]) on a rows x cols tile (row stride ld): the backward's
// transposed tile, a row per key and a column per query with its own log-sum-exp.
void exp_shifted_by_tile(float* x, int rows, int cols, int64_t ld, const float* shift);
void exp_shifted_by_tile(double* x, int rows, int cols, int64_t ld, const double* shift);

// x[c] *= factor.
void scale_by(float* x, int n, float factor);
void scale_by(double* x, int n, double factor);

// out[r * ld_out + c] = x[r * ld_x + c] * factor on a rows x n tile: scale_by's products
// (the same bits), into a copy.
void scale_rows_into(const float* x, int64_t ld_x, int rows, int n, float factor, float* out,
                     int64_t ld_out);
void scale_rows_into(const double* x, int64_t ld_x, int rows, int n, double factor, double* out,
                     int64_t ld_out);

// t = tanh(x[c] / softcap); x[c] = softcap * t; also tanh_out[c] = t unless tanh_out is null.
void apply_softcap(float* x, int n, float softcap, float* tanh_out);
void apply_softcap(double* x, int n, double softcap, double* tanh_out);

// x[c] += -slope * |first_distance + c * distance_step|: ALiBi along a row (step -1) or a
// column (step +1) of a score tile.
void add_alibi(float* x, int n, float slope, int first_distance, int distance_step);
void add_alibi(double* x, int n, double slope, int first_distance, int distance_step);

// dP -> dS in place on a rows x cols tile (row stride ld of both): dp[r][c] = p[r][c] *
// (dp[r][c] - d[c]).
void softmax_grad_tile(float* dp, const float* p, int rows, int cols, int64_t ld, const float* d);
void softmax_grad_tile(double* dp, const double* p, int rows, int cols, int64_t ld,
                       const double* d);

// Chain rule through the softcap: ds[c] *= 1 - t[c]^2.
void mul_softcap_grad(float* ds, const float* t, int n);
void mul_softcap_grad(double* ds, const double* t, int n);

// out[c] = x[c] rounded to nearest even in 16 bits (the A operand of the 16-bit P·V product).
void round_to_16bit(const float* x, c10::BFloat16* out, int n);
void round_to_16bit(const float* x, c10::Half* out, int n);

}  // namespace flashattn::cpu
