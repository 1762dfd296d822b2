#include "schedule.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>

namespace cudasim {
namespace {

std::mutex override_mutex;
std::optional<Schedule> schedule_override;
std::optional<CopyCompletion> completion_override;

}  // namespace

Schedule parse_schedule(const std::string& text) {
  if (text == "forward") return Schedule{Order::Forward, 0};
  if (text == "reverse") return Schedule{Order::Reverse, 0};
  const std::string prefix = "random:";
  if (text.compare(0, prefix.size(), prefix) == 0 && text.size() > prefix.size()) {
    const std::string digits = text.substr(prefix.size());
    char* end = nullptr;
    const unsigned long long seed = std::strtoull(digits.c_str(), &end, 10);
    if (*end == '\0' && digits.find_first_not_of("0123456789") == std::string::npos) {
      return Schedule{Order::Random, seed};
    }
  }
  throw SimError("cudasim: bad schedule '" + text +
                 "': expected forward, reverse or random:SEED (SEED a decimal integer)");
}

std::string to_string(const Schedule& schedule) {
  switch (schedule.order) {
    case Order::Forward: return "forward";
    case Order::Reverse: return "reverse";
    case Order::Random: return "random:" + std::to_string(schedule.seed);
  }
  return "?";
}

void set_schedule(const Schedule& schedule) {
  std::lock_guard<std::mutex> lock(override_mutex);
  schedule_override = schedule;
}

void clear_schedule() {
  std::lock_guard<std::mutex> lock(override_mutex);
  schedule_override.reset();
}

Schedule active_schedule() {
  {
    std::lock_guard<std::mutex> lock(override_mutex);
    if (schedule_override) return *schedule_override;
  }
  const char* env = std::getenv("CUDASIM_SCHEDULE");
  if (env != nullptr && *env != '\0') return parse_schedule(env);
  return Schedule{};
}

CopyCompletion parse_copy_completion(const std::string& text) {
  if (text == "lazy") return CopyCompletion::Lazy;
  if (text == "eager") return CopyCompletion::Eager;
  if (text == "random") return CopyCompletion::Random;
  throw SimError("cudasim: bad copy completion '" + text + "': expected lazy, eager or random");
}

std::string to_string(CopyCompletion completion) {
  switch (completion) {
    case CopyCompletion::Lazy: return "lazy";
    case CopyCompletion::Eager: return "eager";
    case CopyCompletion::Random: return "random";
  }
  return "?";
}

void set_copy_completion(CopyCompletion completion) {
  std::lock_guard<std::mutex> lock(override_mutex);
  completion_override = completion;
}

void clear_copy_completion() {
  std::lock_guard<std::mutex> lock(override_mutex);
  completion_override.reset();
}

CopyCompletion active_copy_completion(const Schedule& schedule) {
  {
    std::lock_guard<std::mutex> lock(override_mutex);
    if (completion_override) return *completion_override;
  }
  const char* env = std::getenv("CUDASIM_COPY_COMPLETION");
  if (env != nullptr && *env != '\0') return parse_copy_completion(env);
  return schedule.order == Order::Random ? CopyCompletion::Random : CopyCompletion::Lazy;
}

namespace {
std::optional<int> sm_count_override;
constexpr int kDefaultSmCount = 2;
}  // namespace

int sm_count() {
  {
    std::lock_guard<std::mutex> lock(override_mutex);
    if (sm_count_override) return *sm_count_override;
  }
  const char* env = std::getenv("CUDASIM_SM_COUNT");
  if (env == nullptr || *env == '\0') return kDefaultSmCount;
  const std::string text(env);
  if (text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos || std::atoi(env) <= 0)
    throw SimError("cudasim: bad CUDASIM_SM_COUNT '" + text + "': expected a positive integer (1 to 999999)");
  return std::atoi(env);
}

void set_sm_count(int count) {
  if (count <= 0) throw SimError("cudasim: set_sm_count(" + std::to_string(count) + "): expected a positive count");
  std::lock_guard<std::mutex> lock(override_mutex);
  sm_count_override = count;
}

void clear_sm_count() {
  std::lock_guard<std::mutex> lock(override_mutex);
  sm_count_override.reset();
}

namespace detail {

int stalled_warpgroup() {
  const char* env = std::getenv("CUDASIM_STALL_WARPGROUP");
  if (env == nullptr || *env == '\0') return -1;
  const std::string text(env);
  if (text.size() > 4 || text.find_first_not_of("0123456789") != std::string::npos)
    throw SimError("cudasim: bad CUDASIM_STALL_WARPGROUP '" + text + "': expected a warpgroup index (0, 1, ...)");
  return std::atoi(env);
}

Permuter::Permuter(const Schedule& schedule, uint64_t stream)
    : order_(schedule.order), state_(schedule.seed ^ (stream * 0x9e3779b97f4a7c15ull)) {}

uint64_t Permuter::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

unsigned Permuter::below(unsigned n) { return static_cast<unsigned>(next() % n); }

std::vector<unsigned> Permuter::permutation(unsigned n) {
  std::vector<unsigned> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (order_ == Order::Reverse) {
    std::reverse(order.begin(), order.end());
  } else if (order_ == Order::Random) {
    for (unsigned i = n; i > 1; --i) std::swap(order[i - 1], order[next() % i]);
  }
  return order;
}

}  // namespace detail
}  // namespace cudasim
