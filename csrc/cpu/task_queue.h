// Dynamic scheduling of independent tasks over at::parallel_for's threads.
//
// Attention tasks are uneven (a causal query block near the top sees a few key blocks, one near
// the bottom sees them all), and at::parallel_for hands each thread one fixed, contiguous range.
// Here every worker thread claims the next task from a shared counter, heaviest tasks first
// (within groups of tasks that share operands, below), which keeps the threads busy until the
// end. Each task writes only its own outputs, so which thread runs it never changes a result.
//
// A call takes only as many threads as its work is worth (threads_for_work): waking a pool
// thread costs tens of µs, more than a whole small attention, which one thread then runs
// inline, with no wake-up at all.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <vector>

namespace flashattn::cpu {

// The least work, in multiply-adds, that pays for waking one more thread: about 20-40 µs of
// products on one core, the cost of a wake-up on a 2-core VM.
constexpr int64_t kMinWorkPerThread = int64_t(1) << 20;

// The forward's: its tasks share nothing but a head's packed key blocks, so a second thread
// pays from an eighth of that (the backward, which sums dQ over its threads, does not).
constexpr int64_t kMinForwardWorkPerThread = int64_t(1) << 17;

// Threads for a call of `work` multiply-adds (attention_work): at least 1, at most the pool's.
inline int threads_for_work(int64_t work, int64_t min_work_per_thread = kMinWorkPerThread) {
  return static_cast<int>(
      std::clamp<int64_t>(work / min_work_per_thread, 1, std::max(1, at::get_num_threads())));
}

// at::parallel_for over [0, n) on at most `threads` threads (with one, inline on this thread,
// which at::parallel_for marks as a parallel region: nested loops run inline too).
template <typename F>
void parallel_for_threads(int64_t n, int threads, const F& f) {
  if (n > 0) at::parallel_for(0, n, (n + std::max(threads, 1) - 1) / std::max(threads, 1), f);
}

// Runs worker(claim) on each of at most `threads` threads; claim() returns the next task index,
// or -1 when none is left. Tasks come group by group (group(task) in [0, num_groups)), the
// heaviest group first by the sum of cost(task), and heaviest first within a group: a group's
// tasks run together, so what they share (head_operands.h) lives only while they do, and the
// light tasks of the last groups still fill in at the end. A worker sets up its scratch space
// once, then loops.
template <typename CostFn, typename GroupFn, typename WorkerFn>
void run_task_queue(int threads, int64_t num_tasks, const CostFn& cost, int64_t num_groups,
                    const GroupFn& group, const WorkerFn& worker) {
  if (num_tasks <= 0) return;
  std::vector<int64_t> task_cost(num_tasks), task_group(num_tasks);
  std::vector<int64_t> group_cost(num_groups, 0);
  for (int64_t t = 0; t < num_tasks; ++t) {
    task_cost[t] = cost(t);
    task_group[t] = group(t);
    group_cost[task_group[t]] += task_cost[t];
  }
  std::vector<int64_t> order(num_tasks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const int64_t ga = task_group[a], gb = task_group[b];
    if (ga != gb)
      return group_cost[ga] != group_cost[gb] ? group_cost[ga] > group_cost[gb] : ga < gb;
    return task_cost[a] > task_cost[b];
  });
  std::atomic<int64_t> next{0};
  auto claim = [&]() -> int64_t {
    const int64_t slot = next.fetch_add(1, std::memory_order_relaxed);
    return slot < num_tasks ? order[slot] : -1;
  };
  const int64_t num_workers = std::min<int64_t>(std::max(threads, 1), num_tasks);
  at::parallel_for(0, num_workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) worker(claim);
  });
}

// Every task a group of its own: the heaviest first.
template <typename CostFn, typename WorkerFn>
void run_task_queue(int threads, int64_t num_tasks, const CostFn& cost, const WorkerFn& worker) {
  run_task_queue(threads, num_tasks, cost, num_tasks, [](int64_t task) { return task; }, worker);
}

}  // namespace flashattn::cpu
