// Autograd for torch.ops.flashattn.fwd and .bwd, registered once for every device (the
// Autograd alias key) and boxed like the kernels (op_glue.h), so the arguments are never
// restated as a C++ signature.
//
// fwd's backward node saves the forward's arguments as they were passed, its out and lse, and
// calls bwd with them; its edges are the gradients of q, k, v and a float attn_mask. bwd itself
// is not differentiable: when its inputs require grad (a backward with create_graph=True), its
// outputs get an Error node, so a second differentiation fails with a message instead of
// autograd's fallback quietly giving zeros.
//
// In C++ rather than through torch.library.register_autograd: the Python formula bound the 21
// arguments in Python on every call, which cost a few hundred µs per training step, more than
// the whole step of a small attention (1 x 16 tokens x 8 heads x 64).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "op_args.h"

namespace flashattn {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// The forward's inputs that have gradients, in the order of the backward node's edges, and of
// bwd's first results (dq, dk, dv, dattn_mask).
constexpr std::array<const char*, 4> kDifferentiable = {"q", "k", "v", "attn_mask"};

constexpr const char* kDoubleBackwardMessage =
    "flashattn: double backward is not supported: the gradients of flash attention cannot be "
    "differentiated again (a gradient penalty, a Hessian-vector product). Use "
    "F.scaled_dot_product_attention's math backend for those terms.";

// torch 2.14 holds autograd nodes in c10::intrusive_ptr, earlier releases in std::shared_ptr.
using NodePtr = decltype(Edge::function);

template <typename T, typename... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>)
    return std::make_shared<T>(std::forward<Args>(args)...);
  else
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
}

const c10::OperatorHandle& bwd_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::bwd", "");
  return op;
}

at::Tensor tensor_or_undefined(const c10::IValue& value) {
  return value.isTensor() ? value.toTensor() : at::Tensor();
}

bool requires_grad(const c10::IValue& value) {
  return value.isTensor() && value.toTensor().requires_grad();
}

// dout and dlse of fwd -> bwd(dout, out, lse, dlse, <the forward's arguments>).
class FwdBackward : public Node {
 public:
  std::string name() const override { return "flashattn::FwdBackward"; }

  // The forward's arguments in schema order; tensors are held as SavedVariables (so an
  // in-place change before the backward is an error) and left None here.
  void save_arguments(const std::vector<c10::IValue>& arguments) {
    arguments_ = arguments;
    for (size_t i = 0; i < arguments_.size(); ++i) {
      if (!arguments_[i].isTensor()) continue;
      saved_.emplace_back(i, SavedVariable(arguments_[i].toTensor(), /*is_output=*/false));
      arguments_[i] = c10::IValue();
    }
  }
  // After set_history: the outputs are saved as this node's own.
  void save_outputs(const at::Tensor& out, const at::Tensor& lse) {
    out_ = SavedVariable(out, /*is_output=*/true);
    lse_ = SavedVariable(lse, /*is_output=*/true);
  }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(!released_, torch::autograd::ERR_BACKWARD_TWICE);
    const auto self = getptr();
    const at::Tensor out = out_.unpack(self), lse = lse_.unpack(self);
    // Autograd passes an undefined gradient for an output that was not used.
    at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(out);
    // Autograd may hand over expanded or transposed gradients; the kernels need a contiguous
    // last dimension, and this tensor is autograd's, not the user's.
    if (dout.stride(-1) != 1) dout = dout.contiguous();
    torch::jit::Stack stack;
    stack.reserve(arguments_.size() + 5);
    stack.emplace_back(std::move(dout));
    stack.emplace_back(out);
    stack.emplace_back(lse);
    stack.emplace_back(grads[1].defined() ? c10::IValue(grads[1]) : c10::IValue());
    const size_t first_argument = stack.size();
    for (const c10::IValue& argument : arguments_) stack.push_back(argument);
    for (const auto& [index, saved] : saved_) stack[first_argument + index] = saved.unpack(self);
    stack.emplace_back(should_compute_output(kDifferentiable.size() - 1));  // attn_mask_grad
    stack.emplace_back(false);  // grads_fp32: autograd's gradients have the inputs' dtypes
    bwd_op().callBoxed(stack);
    variable_list result(num_outputs());
    for (size_t i = 0; i < result.size(); ++i)
      if (should_compute_output(i)) result[i] = tensor_or_undefined(stack[i]);
    return result;
  }

  void release_variables() override {
    for (auto& [index, saved] : saved_) saved.reset_data();
    out_.reset_data();
    lse_.reset_data();
    released_ = true;
  }

 private:
  std::vector<c10::IValue> arguments_;
  std::vector<std::pair<size_t, SavedVariable>> saved_;
  SavedVariable out_, lse_;
  bool released_ = false;
};

// The Autograd kernel of fwd: runs the device kernel below autograd and, when a differentiable
// input requires grad, attaches FwdBackward to out and lse.
void fwd_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
  const OpArguments args(op, stack);
  bool needs_grad = false;
  if (torch::autograd::GradMode::is_enabled())
    for (const char* name : kDifferentiable) needs_grad = needs_grad || requires_grad(args[name]);
  std::vector<c10::IValue> arguments;
  std::array<at::Tensor, kDifferentiable.size()> inputs;
  if (needs_grad) {
    const size_t count = op.schema().arguments().size();
    arguments.assign(stack->end() - count, stack->end());
    for (size_t i = 0; i < inputs.size(); ++i)
      inputs[i] = tensor_or_undefined(args[kDifferentiable[i]]);
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  if (!needs_grad) return;
  const at::Tensor& out = (*stack)[stack->size() - 2].toTensor();
  const at::Tensor& lse = (*stack)[stack->size() - 1].toTensor();
  NodePtr node = make_node<FwdBackward>();
  auto& backward = static_cast<FwdBackward&>(*node);
  backward.set_next_edges(
      torch::autograd::collect_next_edges(inputs[0], inputs[1], inputs[2], inputs[3]));
  backward.save_arguments(arguments);
  torch::autograd::set_history(out, node);
  torch::autograd::set_history(lse, node);
  backward.save_outputs(out, lse);
}

// The Autograd kernel of bwd: its results are not differentiable (see the top).
void bwd_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
  const size_t count = op.schema().arguments().size();
  variable_list inputs;
  if (torch::autograd::GradMode::is_enabled())
    for (auto it = stack->end() - count; it != stack->end(); ++it)
      if (requires_grad(*it)) inputs.push_back(it->toTensor());
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  if (inputs.empty()) return;
  NodePtr node = make_node<torch::autograd::Error>(kDoubleBackwardMessage,
                                                   torch::autograd::collect_next_edges(inputs));
  const size_t results = op.schema().returns().size();
  for (auto it = stack->end() - results; it != stack->end(); ++it)
    if (it->isTensor()) torch::autograd::set_history(it->toTensor(), node);
}

TORCH_LIBRARY_IMPL(flashattn, Autograd, m) {
  m.impl("fwd", torch::CppFunction::makeFromBoxedFunction<&fwd_autograd>());
  m.impl("bwd", torch::CppFunction::makeFromBoxedFunction<&bwd_autograd>());
}

}  // namespace
}  // namespace flashattn
