// An op's arguments on the dispatcher's stack, read by their schema names. The ops are boxed
// kernels: the argument list is written once, in schema.h, and every reader names what it
// reads instead of restating the list as a C++ signature.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string_view>
#include <utility>

namespace flashattn {

class OpArguments {
 public:
  OpArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : schema_(op.schema()),
        stack_(stack),
        first_(stack->size() - schema_.arguments().size()) {}

  // Whether the op has the argument (ATen ops gain arguments across torch versions).
  bool has(std::string_view name) const {
    return schema_.argumentIndexWithName(name).has_value();
  }
  const c10::IValue& operator[](std::string_view name) const {
    const std::optional<int> index = schema_.argumentIndexWithName(name);
    TORCH_INTERNAL_ASSERT(index.has_value(), schema_.name(), " has no argument ", name);
    return (*stack_)[first_ + *index];
  }
  at::Tensor tensor(std::string_view name) const { return (*this)[name].toTensor(); }
  std::optional<at::Tensor> optional_tensor(std::string_view name) const {
    return (*this)[name].toOptional<at::Tensor>();
  }
  std::optional<double> optional_double(std::string_view name) const {
    return (*this)[name].toOptional<double>();
  }
  // A SymInt? argument; a kernel only ever sees concrete values.
  std::optional<int64_t> optional_int(std::string_view name) const {
    const c10::IValue& value = (*this)[name];
    if (value.isNone()) return std::nullopt;
    return value.isInt() ? value.toInt() : value.toSymInt().guard_int(__FILE__, __LINE__);
  }

  // Replaces the arguments on the stack with the op's results, in schema order.
  template <typename... Results>
  void set_results(Results&&... results) {
    torch::jit::drop(*stack_, schema_.arguments().size());
    (torch::jit::push(*stack_, std::forward<Results>(results)), ...);
  }

 private:
  const c10::FunctionSchema& schema_;
  torch::jit::Stack* stack_;
  size_t first_;
};

}  // namespace flashattn
