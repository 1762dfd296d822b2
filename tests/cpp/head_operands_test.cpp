// HeadOperands (csrc/cpu/head_operands.h) with real threads: the tasks that take a head
// together pack its parts between them, each part once, and all see every part; the last
// task's hold passes the memory on to the next head, after the last step release() gives it, run
// once; and a part whose pack throws makes every
// take of that head throw, none waits forever. And SpinOnce (csrc/cpu/spin_once.h), which the
// heads and the forward's key blocks start with: one thread of those racing runs the step, all
// see what it wrote, and a step that throws is run again by the next caller. Exits non-zero and
// says which check failed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/head_operands.h"
#include "cpu/spin_once.h"

using flashattn::cpu::HeadOperands;
using flashattn::cpu::SpinOnce;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (ok) return;
  ++failures;
  std::printf("FAIL %s\n", what);
}

constexpr int kPieces = 7;
constexpr int kThreads = 3;

struct Parts {
  std::vector<int> part = std::vector<int>(kPieces, 0);
  std::vector<int> by_task = std::vector<int>(kThreads, 0);  // each task's own write
};

// Runs f() on kThreads threads at once; false if any is still running after 20 s (a hang: its
// thread is left behind, detached, and main exits with the failure).
template <typename F>
bool run_together(const F& f) {
  std::atomic<int> ready{0};
  auto finished = std::make_shared<std::atomic<int>>(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&f, &ready, finished] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      f();
      finished->fetch_add(1);
    });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (finished->load() < kThreads && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool all = finished->load() == kThreads;
  for (auto& thread : threads) all ? thread.join() : thread.detach();
  return all;
}

void parts_are_shared() {
  HeadOperands<Parts> heads(1, 2);
  for (int t = 0; t < kThreads; ++t) heads.expect_task(0, 0);
  heads.expect_task(0, 1);
  std::atomic<int> packed{0}, complete{0}, tasks{0}, last_steps{0}, last_saw_all{0};
  const bool finished = run_together([&] {
    auto hold = heads.take(0, 0, kPieces, [&](Parts& parts, int piece) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      parts.part[piece] += piece + 1;
      packed.fetch_add(1);
    });
    bool all = true;
    for (int piece = 0; piece < kPieces; ++piece) all = all && hold->part[piece] == piece + 1;
    complete.fetch_add(all);
    hold->by_task[tasks.fetch_add(1)] = 1;  // which the last step must see
    hold.release([&](Parts& parts) {
      last_steps.fetch_add(1);
      bool saw_all = true;
      for (int task : parts.by_task) saw_all = saw_all && task == 1;
      last_saw_all.store(saw_all);
    });
  });
  check(finished, "parts_are_shared: a take did not return");
  check(packed.load() == kPieces, "parts_are_shared: each part packed once");
  check(complete.load() == kThreads, "parts_are_shared: every take sees every part");
  check(heads.peak() == 1, "parts_are_shared: one head held");
  check(last_steps.load() == 1, "parts_are_shared: the last step runs once");
  check(last_saw_all.load() == 1, "parts_are_shared: the last step sees every task's write");
  // The first head's holds are gone: the next head gets its Parts back (packed parts included).
  auto next = heads.take(0, 1, [](Parts& parts) {
    check(parts.part[kPieces - 1] == kPieces, "parts_are_shared: memory passed on");
  });
  check(heads.peak() == 1, "parts_are_shared: still one head held at a time");
}

void a_failed_part_fails_every_take() {
  HeadOperands<Parts> heads(1, 1);
  for (int t = 0; t < kThreads; ++t) heads.expect_task(0, 0);
  std::atomic<int> thrown{0}, returned{0};
  const bool finished = run_together([&] {
    try {
      auto hold = heads.take(0, 0, kPieces, [&](Parts&, int piece) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (piece == 3) throw std::runtime_error("out of memory");
      });
      returned.fetch_add(1);
    } catch (const std::exception&) {  // the pack's own error or c10::Error
      thrown.fetch_add(1);
    }
  });
  check(finished, "a_failed_part_fails_every_take: a take waited forever");
  check(thrown.load() == kThreads && returned.load() == 0,
        "a_failed_part_fails_every_take: every take throws");
}

}  // namespace

void spin_once_runs_one_step() {
  for (int round = 0; round < 200; ++round) {
    SpinOnce once;
    std::atomic<int> runs{0}, saw{0};
    int written = 0;  // plain: SpinOnce's release/acquire must publish it
    const bool finished = run_together([&] {
      once.call([&] {
        runs.fetch_add(1);
        std::this_thread::yield();  // let the others arrive while it runs
        written = 42;
      });
      if (written == 42) saw.fetch_add(1);
    });
    check(finished, "spin_once: every caller returned");
    check(runs.load() == 1, "spin_once: the step ran once");
    check(saw.load() == kThreads, "spin_once: every caller saw the step's write");
  }
}

void spin_once_retries_a_step_that_threw() {
  SpinOnce once;
  bool threw = false;
  try {
    once.call([] { throw std::runtime_error("out of memory"); });
  } catch (const std::runtime_error&) {
    threw = true;
  }
  check(threw, "spin_once: the step's error reaches its caller");
  int runs = 0;
  once.call([&] { ++runs; });
  once.call([&] { ++runs; });
  check(runs == 1, "spin_once: after a throw, the next caller runs the step, once");
}

int main() {
  parts_are_shared();
  a_failed_part_fails_every_take();
  spin_once_runs_one_step();
  spin_once_retries_a_step_that_threw();
  if (failures) {
    std::printf("%d checks failed\n", failures);
    std::fflush(stdout);
    std::_Exit(1);  // a hung thread may still be waiting
  }
  std::printf("head_operands: all checks passed\n");
  return 0;
}
