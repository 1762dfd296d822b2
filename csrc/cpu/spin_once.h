// A step run once by the first of the threads that need it, the others spinning until it is
// done; and a lock whose waiters spin the same way.
//
// std::call_once parks the threads that lose the race in a futex, and waking a parked thread
// costs tens of µs on a VM: more than the step they wait for (packing one key block takes a
// few µs). Profiles of small forwards (B 1, S 256, H 2, d 32, two threads sharing a head's key
// blocks) put ~9% of the time in call_once's futex sleeps and wake-ups.
#pragma once
#include <atomic>
#include <thread>

namespace flashattn::cpu {

class SpinOnce {
 public:
  // Runs step() unless another thread has run it or is running it; returns once it has run
  // (its writes visible here). A step that throws leaves it to the next caller to try again,
  // as std::call_once does.
  template <typename Step>
  void call(const Step& step) {
    for (int state = state_.load(std::memory_order_acquire); state != kDone;
         state = state_.load(std::memory_order_acquire)) {
      if (state == kIdle &&
          state_.compare_exchange_weak(state, kRunning, std::memory_order_acquire)) {
        try {
          step();
        } catch (...) {
          state_.store(kIdle, std::memory_order_release);
          throw;
        }
        state_.store(kDone, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }

 private:
  static constexpr int kIdle = 0, kRunning = 1, kDone = 2;
  std::atomic<int> state_{kIdle};
};

// A mutex for critical sections of a few instructions (moving a handful of pointers), which the
// threads of one call enter in turn many times: std::mutex parks a thread that finds it taken in
// a futex, and at (B 8, S 16, H 8, d 64) the backward's two threads met on its operand pool ~6
// times a call, so that the call took longer on two threads (280 µs) than on one (252).
// BasicLockable: std::lock_guard takes it.
class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire))
      while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace flashattn::cpu
