// Calls torch.ops.flashattn.fwd / bwd through the dispatcher from plain C++ (no Python), with
// arguments by name and the schema's defaults for the rest, and checks them against ATen's own
// attention math in float64. Exit code 0 = pass.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

// Calls the op `name` with the arguments in `named`, the schema's defaults for the others, and
// returns its results.
std::vector<c10::IValue> call_by_name(const char* name,
                                      const std::map<std::string, c10::IValue>& named) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  torch::jit::Stack stack;
  size_t used = 0;
  for (const auto& arg : op.schema().arguments()) {
    const auto it = named.find(arg.name());
    if (it != named.end()) {
      stack.push_back(it->second);
      ++used;
    } else {
      TORCH_CHECK(arg.default_value().has_value(), name, ": missing argument ", arg.name());
      stack.push_back(*arg.default_value());
    }
  }
  TORCH_CHECK(used == named.size(), name, ": an argument name is not in the schema");
  op.callBoxed(&stack);
  return stack;
}

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
  torch::manual_seed(0);
  auto q = torch::randn({2, 37, 4, 32}, torch::kFloat);
  auto k = torch::randn({2, 53, 4, 32}, torch::kFloat);
  auto v = torch::randn({2, 53, 4, 32}, torch::kFloat);
  const double scale = 1.0 / std::sqrt(32.0);
  const auto fwd = call_by_name("flashattn::fwd", {{"q", q}, {"k", k}, {"v", v},
                                                   {"softmax_scale", scale}, {"causal", true}});
  const at::Tensor out = fwd[0].toTensor(), lse = fwd[1].toTensor();

  auto q64 = q.to(at::kDouble).requires_grad_(), k64 = k.to(at::kDouble).requires_grad_(),
       v64 = v.to(at::kDouble).requires_grad_();
  auto ref = reference(q64, k64, v64, scale);
  bool ok = close("out", out, ref, 1e-5);

  auto dout = torch::randn_like(out);
  const auto grads = call_by_name(
      "flashattn::bwd", {{"dout", dout}, {"out", out}, {"lse", lse}, {"dlse", c10::IValue()},
                         {"q", q}, {"k", k}, {"v", v}, {"softmax_scale", scale},
                         {"causal", true}});
  const at::Tensor dq = grads[0].toTensor(), dk = grads[1].toTensor(), dv = grads[2].toTensor();
  (ref * dout.to(at::kDouble)).sum().backward();
  ok &= close("dq", dq, q64.grad(), 1e-4);
  ok &= close("dk", dk, k64.grad(), 1e-4);
  ok &= close("dv", dv, v64.grad(), 1e-4);
  std::cout << (ok ? "PASS" : "FAIL") << "\n";
  return ok ? 0 : 1;
}
