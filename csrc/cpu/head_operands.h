// Operands packed per (sequence, kv head) when a task first needs them, shared by the tasks of
// that head, and passed on to the next head packed when the last of them ends.
//
// Why: packing every head's K and V before the first task held a second copy of the whole
// cache for the whole call, nearly twice SDPA-CPU's memory above the inputs. With the tasks of
// a few heads queued together (run_task_queue's groups), the heads packed at any moment are
// those of the group being worked on and the end of the one before. A finished head's memory
// goes to the next head packed (freed and allocated anew, glibc kept a changing share of it).
// Each head is still packed once; the threads that reach a head together pack its parts between
// them (the backward's threads meet at every head, and one packing while the other waited was
// slow). Measurements: docs/lab/2026-12-03-cpu-comment-ledgers.md.
#pragma once
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "spin_once.h"

namespace flashattn::cpu {

template <typename Operands>
class HeadOperands {
  struct Slot {
    SpinOnce started;
    std::atomic<int> next_piece{0}, pieces_done{0};
    std::atomic<bool> failed{false};  // a part's pack threw
    std::atomic<int64_t> tasks_left{0};
    // On the heap, so that handing them on is a pointer's move: an Operands holds a dozen
    // packings, and moving one under the pool's lock kept the other thread waiting.
    std::unique_ptr<Operands> operands;
  };

 public:
  HeadOperands(int batch, int heads) : heads_(heads), slots_(new Slot[size_t(batch) * heads]) {}

  // Before the run: one more task of head (b, h) will take the operands.
  void expect_task(int b, int h) { slot(b, h).tasks_left.fetch_add(1, std::memory_order_relaxed); }

  // A task's hold on head (b, h)'s operands, packed in `pieces` parts by pack(Operands&, piece)
  // into a finished head's Operands when there is one (pack reuses what memory they hold). The
  // tasks that take the head while it is being packed pack the parts between them (each takes
  // the next part no one has; the parts must write disjoint members), and each returns when
  // every part is packed. The last task's hold to end passes the operands on (release() can
  // end a hold early and run a last step on them, under the same count). A pack that
  // throws (out of memory) throws from its own take, and the takes waiting for it throw too
  // instead of waiting forever.
  class Hold {
   public:
    Hold(Hold&& other) noexcept : owner_(other.owner_), slot_(other.slot_) {
      other.slot_ = nullptr;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    Hold& operator=(Hold&&) = delete;
    ~Hold() {
      if (slot_) release([](Operands&) {});
    }
    // Ends the hold; when it was the head's last, calls last(operands) first (acq_rel: it sees
    // every other task's writes to them), then passes them on.
    template <typename Last>
    void release(const Last& last) {
      Slot* slot = std::exchange(slot_, nullptr);
      if (slot->tasks_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      last(*slot->operands);
      owner_->recycle(std::move(slot->operands));
    }
    // Mutable: operands may be filled in part by part as the tasks need them.
    Operands& operator*() const { return *slot_->operands; }
    Operands* operator->() const { return slot_->operands.get(); }

   private:
    friend class HeadOperands;
    Hold(HeadOperands* owner, Slot* slot) : owner_(owner), slot_(slot) {}
    HeadOperands* owner_;
    Slot* slot_;
  };

  // The most heads whose operands were held at once so far.
  int64_t peak() const { return peak_.load(); }

  template <typename Pack>
  Hold take(int b, int h, int pieces, const Pack& pack) {
    Slot& s = slot(b, h);
    TORCH_INTERNAL_ASSERT(s.tasks_left.load(std::memory_order_relaxed) > 0,
                          "flashattn: a task took operands no task was expected to take");
    s.started.call([&] {
      s.operands = reused();
      const int64_t live = live_.fetch_add(1, std::memory_order_relaxed) + 1;
      for (int64_t peak = peak_.load(); live > peak && !peak_.compare_exchange_weak(peak, live);) {
      }
    });
    for (int piece = s.next_piece.fetch_add(1); piece < pieces; piece = s.next_piece.fetch_add(1)) {
      try {
        pack(*s.operands, piece);
      } catch (...) {
        s.failed.store(true, std::memory_order_relaxed);
        s.pieces_done.fetch_add(1, std::memory_order_release);
        throw;
      }
      s.pieces_done.fetch_add(1, std::memory_order_release);
    }
    while (s.pieces_done.load(std::memory_order_acquire) < pieces) std::this_thread::yield();
    TORCH_CHECK(!s.failed.load(std::memory_order_relaxed),
                "flashattn: packing a head's operands failed in another thread (which raises its "
                "error)");
    return Hold(this, &s);
  }

  // In one piece: pack(Operands&).
  template <typename Pack>
  Hold take(int b, int h, const Pack& pack) {
    return take(b, h, 1, [&](Operands& operands, int) { pack(operands); });
  }

 private:
  Slot& slot(int b, int h) { return slots_[size_t(b) * heads_ + h]; }

  std::unique_ptr<Operands> reused() {
    {
      std::lock_guard<SpinLock> lock(finished_lock_);
      if (!finished_.empty()) {
        std::unique_ptr<Operands> operands = std::move(finished_.back());
        finished_.pop_back();
        return operands;
      }
    }
    return std::make_unique<Operands>();
  }
  void recycle(std::unique_ptr<Operands>&& operands) {
    live_.fetch_sub(1, std::memory_order_relaxed);
    std::lock_guard<SpinLock> lock(finished_lock_);
    finished_.push_back(std::move(operands));
  }

  int heads_;
  std::unique_ptr<Slot[]> slots_;
  SpinLock finished_lock_;  // held to move one pointer in or out
  std::vector<std::unique_ptr<Operands>> finished_;  // the operands of heads whose tasks are done
  std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace flashattn::cpu
