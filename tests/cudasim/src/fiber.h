// A fiber: one CUDA thread's own stack and saved registers.
#pragma once
#include <cstddef>

#include "machine_context.h"

namespace cudasim::detail {

class Fiber {
 public:
  explicit Fiber(size_t stack_bytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Arms the fiber to run body(arg) from the top of its stack at the next resume(). body must
  // end by calling finish(); it must not return.
  void reset(void (*body)(void*), void* arg);
  // Host side: runs the fiber until it calls suspend() or finish().
  void resume();
  // Fiber side: hands control back to whoever called resume().
  void suspend();
  // Fiber side, last act: like suspend(), but the fiber is never resumed again.
  [[noreturn]] void finish();

 private:
  static void trampoline();

  void* mapping_ = nullptr;  // guard page + stack
  size_t mapping_bytes_ = 0;
  void* stack_ = nullptr;    // lowest usable address
  size_t stack_bytes_ = 0;
  MachineContext context_;
  MachineContext host_;  // whoever called resume()
  void (*body_)(void*) = nullptr;
  void* arg_ = nullptr;
  // AddressSanitizer bookkeeping for stack switches (unused in plain builds).
  void* host_fake_stack_ = nullptr;
  void* fiber_fake_stack_ = nullptr;
  const void* host_stack_bottom_ = nullptr;
  size_t host_stack_size_ = 0;
};

}  // namespace cudasim::detail
