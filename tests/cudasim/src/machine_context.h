// The saved registers of a suspended flow of control, and the switch between two of them.
// x86-64 uses a hand-written switch: glibc's swapcontext also saves the signal mask with a
// system call on every switch, which made a warp collective (64 switches) cost ~40 us instead
// of ~2 us. Other targets use ucontext.
#pragma once
#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cudasim::detail {

class MachineContext {
 public:
  // Arms this context to start entry() on the stack [stack, stack + bytes) when switched to.
  // entry must never return.
  void prepare(void* stack, size_t bytes, void (*entry)());
  // Saves the running flow of control into *this and continues `target`.
  void switch_to(MachineContext& target);

 private:
#if defined(__x86_64__)
  void* stack_pointer_ = nullptr;
#else
  ucontext_t context_{};
#endif
};

}  // namespace cudasim::detail
