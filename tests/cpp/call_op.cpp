// Calls torch.ops.flashattn.fwd / bwd through the dispatcher from plain C++ (no Python) and
// checks them against ATen's own attention math in float64. Exit code 0 = pass.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

namespace {

using FwdOp = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                 const at::Tensor&, double, bool, int64_t,
                                                 int64_t, double,
                                                 const std::optional<at::Tensor>&, bool, bool);
using BwdOp = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double, bool,
    int64_t, int64_t, double, const std::optional<at::Tensor>&, bool, bool);

// Reference in (B, S, H, D) layout, bottom-right causal, float64.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     double scale) {
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);
  auto scores = at::matmul(qh, kh.transpose(-1, -2)) * scale;
  const int64_t sq = q.size(1), sk = k.size(1);
  auto i = at::arange(sq, at::kLong).unsqueeze(1);
  auto j = at::arange(sk, at::kLong).unsqueeze(0);
  scores = scores.masked_fill(j > i + (sk - sq), -INFINITY);
  return at::matmul(at::softmax(scores, -1), vh).transpose(1, 2);
}

bool close(const char* what, const at::Tensor& got, const at::Tensor& want, double tol) {
  const double err = (got.to(at::kDouble) - want).abs().max().item<double>();
  std::cout << what << ": max abs error " << err << " (tolerance " << tol << ")\n";
  return err <= tol;
}

}  // namespace

int main() {
  auto fwd = c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::fwd", "").typed<FwdOp>();
  auto bwd = c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::bwd", "").typed<BwdOp>();
  torch::manual_seed(0);
  auto q = torch::randn({2, 37, 4, 32}, torch::kFloat);
  auto k = torch::randn({2, 53, 4, 32}, torch::kFloat);
  auto v = torch::randn({2, 53, 4, 32}, torch::kFloat);
  const double scale = 1.0 / std::sqrt(32.0);
  auto [out, lse] = fwd.call(q, k, v, scale, true, -1, -1, 0.0, std::nullopt, true, false);

  auto q64 = q.to(at::kDouble).requires_grad_(), k64 = k.to(at::kDouble).requires_grad_(),
       v64 = v.to(at::kDouble).requires_grad_();
  auto ref = reference(q64, k64, v64, scale);
  bool ok = close("out", out, ref, 1e-5);

  auto dout = torch::randn_like(out);
  auto [dq, dk, dv] = bwd.call(dout, q, k, v, out, lse, std::nullopt, scale, true, -1, -1, 0.0,
                               std::nullopt, true, false);
  (ref * dout.to(at::kDouble)).sum().backward();
  ok &= close("dq", dq, q64.grad(), 1e-4);
  ok &= close("dk", dk, k64.grad(), 1e-4);
  ok &= close("dv", dv, v64.grad(), 1e-4);
  std::cout << (ok ? "PASS" : "FAIL") << "\n";
  return ok ? 0 : 1;
}
