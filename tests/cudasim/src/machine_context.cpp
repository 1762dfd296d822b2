#include "machine_context.h"

#include <cstdint>

#if defined(__x86_64__)

// cudasim_switch_stack(save, next): pushes the System V callee-saved registers and the SSE/x87
// control words, stores the stack pointer in *save, loads `next` and pops the same frame from
// it. Everything else is caller-saved, so the compiler has already spilled it.
extern "C" void cudasim_switch_stack(void** save, void* next);
asm(R"(
        .text
        .globl  cudasim_switch_stack
        .type   cudasim_switch_stack, @function
cudasim_switch_stack:
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $8, %rsp
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .size   cudasim_switch_stack, .-cudasim_switch_stack
)");

namespace cudasim::detail {
namespace {

constexpr uint32_t kDefaultMxcsr = 0x1f80;  // all SSE exceptions masked, round to nearest
constexpr uint16_t kDefaultFpuControl = 0x037f;

}  // namespace

void MachineContext::prepare(void* stack, size_t bytes, void (*entry)()) {
  // The frame cudasim_switch_stack pops, so that its `ret` "calls" entry with the stack aligned
  // as after a call instruction. Return address 0 and rbp 0 end every unwinder's walk there.
  auto top = reinterpret_cast<uintptr_t>(static_cast<char*>(stack) + bytes) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top);
  *--frame = 0;                                       // entry's return address
  *--frame = reinterpret_cast<uint64_t>(entry);       // popped by ret
  for (int reg = 0; reg < 6; ++reg) *--frame = 0;     // rbp rbx r12 r13 r14 r15
  *--frame = kDefaultMxcsr | uint64_t{kDefaultFpuControl} << 32;
  stack_pointer_ = frame;
}

void MachineContext::switch_to(MachineContext& target) {
  cudasim_switch_stack(&stack_pointer_, target.stack_pointer_);
}

}  // namespace cudasim::detail

#else

namespace cudasim::detail {

void MachineContext::prepare(void* stack, size_t bytes, void (*entry)()) {
  getcontext(&context_);
  context_.uc_stack.ss_sp = stack;
  context_.uc_stack.ss_size = bytes;
  context_.uc_link = nullptr;
  makecontext(&context_, entry, 0);
}

void MachineContext::switch_to(MachineContext& target) { swapcontext(&context_, &target.context_); }

}  // namespace cudasim::detail

#endif
