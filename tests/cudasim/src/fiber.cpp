#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cudasim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
#endif

namespace cudasim::detail {
namespace {

// The entry function takes no arguments, so the fiber being started is handed over here.
thread_local Fiber* starting_fiber = nullptr;

// ASan tracks one stack per host thread; every stack switch must be bracketed by these calls
// or it reports false stack-buffer errors (and use-after-return fake stacks get lost).
void start_switch(void** fake_stack_save, const void* bottom, size_t size) {
#if CUDASIM_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake_stack_save, const void** bottom_old, size_t* size_old) {
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
#else
  (void)fake_stack_save, (void)bottom_old, (void)size_old;
#endif
}
// A stack reused by a new CUDA thread (or abandoned after an error) may still carry the
// redzone poison of frames that never returned.
void unpoison(void* addr, size_t size) {
#if CUDASIM_ASAN
  __asan_unpoison_memory_region(addr, size);
#else
  (void)addr, (void)size;
#endif
}

}  // namespace

Fiber::Fiber(size_t stack_bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  stack_bytes_ = (stack_bytes + page - 1) / page * page;
  mapping_bytes_ = stack_bytes_ + page;
  // MAP_NORESERVE: only the pages a thread touches cost memory.
  mapping_ = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping_ == MAP_FAILED) {
    throw SimError("cudasim: cannot map a " + std::to_string(stack_bytes_) +
                   "-byte fiber stack: " + std::strerror(errno));
  }
  // A stack overflow hits the guard page (SIGSEGV) instead of another thread's stack.
  mprotect(mapping_, page, PROT_NONE);
  stack_ = static_cast<char*>(mapping_) + page;
}

Fiber::~Fiber() {
  unpoison(stack_, stack_bytes_);
  munmap(mapping_, mapping_bytes_);
}

void Fiber::reset(void (*body)(void*), void* arg) {
  unpoison(stack_, stack_bytes_);
  body_ = body;
  arg_ = arg;
  context_.prepare(stack_, stack_bytes_, &Fiber::trampoline);
}

void Fiber::trampoline() {
  Fiber* self = starting_fiber;
  finish_switch(nullptr, &self->host_stack_bottom_, &self->host_stack_size_);
  self->body_(self->arg_);
}

void Fiber::resume() {
  starting_fiber = this;
  start_switch(&host_fake_stack_, stack_, stack_bytes_);
  host_.switch_to(context_);
  finish_switch(host_fake_stack_, nullptr, nullptr);
}

void Fiber::suspend() {
  start_switch(&fiber_fake_stack_, host_stack_bottom_, host_stack_size_);
  context_.switch_to(host_);
  finish_switch(fiber_fake_stack_, &host_stack_bottom_, &host_stack_size_);
}

void Fiber::finish() {
  // nullptr: this stack is done, ASan may drop its fake frames.
  start_switch(nullptr, host_stack_bottom_, host_stack_size_);
  context_.switch_to(host_);
  __builtin_unreachable();
}

}  // namespace cudasim::detail
