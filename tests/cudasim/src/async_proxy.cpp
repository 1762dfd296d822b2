// Generic- versus async-proxy shared memory (see async_proxy.h). One record per 4-byte word of
// the block's dynamic shared memory: the last write to it, by whom, and the writer's fence
// count at that moment. fence.proxy.async bumps the thread's fence count, so "stored and not
// fenced since" is one comparison, and neither a fence nor a new block touches the records:
// a block generation stamp tells live records from stale ones.
#include "async_proxy.h"

#include <cstdint>
#include <sstream>
#include <vector>

#include "block.h"
#include "warpgroup.h"

namespace cudasim::detail {
namespace {

constexpr size_t kProxyWordBytes = 4;
constexpr uint32_t kAsyncWriter = 0xffffffffu;  // written by the async proxy: needs no fence

struct ProxyWord {
  uint32_t generation = 0;  // the block run that wrote it; others are stale
  uint32_t fences = 0;      // the writer's fence count when it stored
  uint32_t thread = 0;      // linear thread index, or kAsyncWriter
  int line = 0;
  const char* file = nullptr;
};

// Blocks run one after another on a host thread, so one table per host thread suffices.
struct ProxyState {
  uint32_t generation = 0;
  const unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  std::vector<ProxyWord> words;
  std::vector<uint32_t> fences;  // per thread: fence.proxy.async executed so far
};
thread_local ProxyState proxy;

// The live record range for [ptr, ptr + bytes), or false when it is not dynamic smem.
bool proxy_words(const void* ptr, size_t bytes, size_t& first, size_t& last) {
  const auto p = reinterpret_cast<uintptr_t>(ptr), base = reinterpret_cast<uintptr_t>(proxy.smem);
  if (proxy.smem == nullptr || bytes == 0 || p < base || p - base > proxy.smem_bytes ||
      bytes > proxy.smem_bytes - (p - base)) {
    return false;
  }
  first = (p - base) / kProxyWordBytes;
  last = (p - base + bytes - 1) / kProxyWordBytes;
  return true;
}

// thread is a linear thread index (then its fence count is recorded) or kAsyncWriter.
void proxy_record(const void* ptr, size_t bytes, uint32_t thread, const char* file, int line) {
  size_t first = 0, last = 0;
  if (!proxy_words(ptr, bytes, first, last)) return;
  const uint32_t fences = thread == kAsyncWriter ? 0 : proxy.fences[thread];
  for (size_t w = first; w <= last; ++w) {
    proxy.words[w] = ProxyWord{proxy.generation, fences, thread, line, file};
  }
}

std::string proxy_place(size_t word) {
  std::ostringstream out;
  out << "smem+0x" << std::hex << word * kProxyWordBytes;
  return out.str();
}

}  // namespace

void reset_async_proxy(const SimBlock& block) {
  if (++proxy.generation == 0) {  // wrapped: every old stamp would look live again
    proxy.words.assign(proxy.words.size(), ProxyWord{});
    proxy.generation = 1;
  }
  proxy.smem = block.smem;
  proxy.smem_bytes = block.smem_bytes;
  const size_t words = (block.smem_bytes + kProxyWordBytes - 1) / kProxyWordBytes;
  if (proxy.words.size() < words) proxy.words.resize(words);
  proxy.fences.assign(block.threads.size(), 0);
}

void note_generic_smem_store(const void* smem, size_t bytes, const char* file, int line) {
  size_t first = 0, last = 0;  // outside the running block's dynamic smem: nothing to record
  if (!proxy_words(smem, bytes, first, last)) return;
  proxy_record(smem, bytes, thread_index(current_thread("a shared-memory store")), file, line);
}

void note_generic_smem_store_by(unsigned thread, const void* smem, size_t bytes, const char* file,
                                int line) {
  proxy_record(smem, bytes, thread, file, line);
}

void note_async_proxy_write(const void* smem, size_t bytes, const char* file, int line) {
  proxy_record(smem, bytes, kAsyncWriter, file, line);
}

void fence_proxy_async(const char* file, int line) {
  SimBlock& block = active_block("fence.proxy.async");
  const SimThread& self = current_thread("fence.proxy.async");
  (void)file, (void)line;
  proxy.fences[thread_index(self)] += 1;
  count_fence_proxy_async(block);
}

void check_async_proxy_read(const void* smem, size_t bytes, const char* what, const char* file,
                            int line) {
  size_t first = 0, last = 0;
  if (!proxy_words(smem, bytes, first, last)) return;
  for (size_t w = first; w <= last; ++w) {
    const ProxyWord& r = proxy.words[w];
    if (r.generation != proxy.generation || r.thread == kAsyncWriter) continue;
    if (proxy.fences[r.thread] != r.fences) continue;  // the writer fenced since
    const SimBlock& block = active_block(what);
    const SimThread& writer = block.threads[r.thread];
    fail(Site{file, line},
         std::string(what) + " reads " + proxy_place(w) + " through the async proxy, but thread " +
             std::to_string(r.thread) + " (warp " + std::to_string(writer.warp) + " lane " +
             std::to_string(writer.lane) + ") stored it at " + describe(Site{r.file, r.line}) +
             " through the generic proxy and has not executed fence.proxy.async since (missing "
             "fence_proxy_async between the store and the async-proxy read)");
  }
}

std::string describe_last_smem_write(const void* smem) {
  size_t first = 0, last = 0;
  if (!proxy_words(smem, 1, first, last)) return "";
  const ProxyWord& r = proxy.words[first];
  if (r.generation != proxy.generation) return "";
  return describe(Site{r.file, r.line}) +
         (r.thread == kAsyncWriter ? std::string(" (an async-proxy copy)")
                                   : " (a store by thread " + std::to_string(r.thread) + ")");
}

}  // namespace cudasim::detail
