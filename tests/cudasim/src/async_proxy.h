// The generic and async proxies of shared memory (PTX ISA, "Proxies"): plain stores
// (FLASHATTN_SMEM, stmatrix) go through the generic proxy; wgmma operand reads and TMA stores
// read through the async proxy, which sees a generic store only after the storing thread has
// executed fence.proxy.async. The shim remembers, per 4-byte word of dynamic shared memory, the
// last store to it (its call site, its thread, and whether that thread has fenced since), so
// that an async-proxy read of a word stored and not yet fenced is an error naming the store.
//
// Standalone: csrc/cuda/ptx.cuh includes this under the shim for the store hook, and the TMA
// emulation calls check_async_proxy_read() / note_async_proxy_write().
#pragma once
#include <cstddef>
#include <string>

namespace cudasim::detail {

// A generic-proxy store of `bytes` at `smem` by the current thread (FLASHATTN_SMEM stores,
// stmatrix). Addresses outside dynamic shared memory are ignored. Cheap: a few word stores.
void note_generic_smem_store(const void* smem, size_t bytes, const char* file, int line);

// fence.proxy.async.shared::cta by the current thread: every generic store it made before is
// visible to the async proxy from now on.
void fence_proxy_async(const char* file, int line);

// An async-proxy read (a wgmma operand, a TMA store's source) of [smem, smem + bytes), issued
// at file:line. Throws SimError naming `what`, file:line and the store's line if a word of the
// range was last stored through the generic proxy by a thread that has not executed
// fence.proxy.async since. The range must lie in dynamic shared memory.
void check_async_proxy_read(const void* smem, size_t bytes, const char* what, const char* file,
                            int line);

// An async-proxy write (a TMA / bulk copy landing) of [smem, smem + bytes), issued at
// file:line: the words need no fence, and the write is remembered for messages that name the
// last line that changed shared memory (a wgmma operand overwritten while in flight).
void note_async_proxy_write(const void* smem, size_t bytes, const char* file, int line);

// "k.cu:42 (a store by thread 5)" for the last recorded write of the word holding `smem` in the
// running block, or "" if none is recorded.
std::string describe_last_smem_write(const void* smem);

}  // namespace cudasim::detail
