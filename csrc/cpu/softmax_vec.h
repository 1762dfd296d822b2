// Element-wise and reduction kernels on one row of a score tile: the non-GEMM part of the
// online softmax (forward) and of its gradient (backward). Each has an fp32 overload,
// vectorized for the running CPU (softmax_vec.cpp), and an fp64 one, plain loops for gradcheck.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace flashattn::cpu {

// Largest of x[0..n); -inf when n == 0.
float max_of(const float* x, int n);
double max_of(const double* x, int n);

// x[c] = exp(x[c] - shift); returns the sum of the new x.
float exp_shifted_sum(float* x, int n, float shift);
double exp_shifted_sum(double* x, int n, double shift);

// x[c] = exp(x[c] - shift[c]).
void exp_shifted_by(float* x, const float* shift, int n);
void exp_shifted_by(double* x, const double* shift, int n);

// x[c] *= factor.
void scale_by(float* x, int n, float factor);
void scale_by(double* x, int n, double factor);

// t = tanh(x[c] / softcap); x[c] = softcap * t; also tanh_out[c] = t unless tanh_out is null.
void apply_softcap(float* x, int n, float softcap, float* tanh_out);
void apply_softcap(double* x, int n, double softcap, double* tanh_out);

// x[c] += -slope * |first_distance + c * distance_step|: ALiBi along a row (step -1) or a
// column (step +1) of a score tile.
void add_alibi(float* x, int n, float slope, int first_distance, int distance_step);
void add_alibi(double* x, int n, double slope, int first_distance, int distance_step);

// dP -> dS in place: dp[c] = p[c] * (dp[c] - d[c]).
void softmax_grad(float* dp, const float* p, const float* d, int n);
void softmax_grad(double* dp, const double* p, const double* d, int n);

// Chain rule through the softcap: ds[c] *= 1 - t[c]^2.
void mul_softcap_grad(float* ds, const float* t, int n);
void mul_softcap_grad(double* ds, const double* t, int n);

// out[c] = x[c] rounded to nearest even in 16 bits (the A operand of the 16-bit P·V product).
void round_to_16bit(const float* x, c10::BFloat16* out, int n);
void round_to_16bit(const float* x, c10::Half* out, int n);

}  // namespace flashattn::cpu
