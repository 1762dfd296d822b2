// The shim's entry points for Hopper's warpgroup MMA and its companions: what
// csrc/cuda/ptx_sm90_mma.cuh's wrappers call under the shim, each with the kernel's call site.
// Standalone (the wrappers include it); the emulation is in wgmma.cpp and stmatrix.cpp, and
// tests/cudasim/README.md ("wgmma") describes the model.
#pragma once
#include <cstdint>

namespace cudasim::detail {

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} and
// .m64nNk32.f32.e4m3.e4m3: one warpgroup-wide D (64 x n, f32) = A (64 x K) * B (K x n) [+ D],
// K = 16 (16-bit inputs) or 32 (e4m3). A comes from the descriptor desc_a or, when a_regs is
// not null, from the four b32 registers a_regs of each thread; B from desc_b.
// trans_a / trans_b: the imm-trans immediates (0 K-major, 1 M- or N-major; trans_a must be 0
// with register A, and both 0 for e4m3, which the ISA does not transpose). scale_d 0 ignores
// D's old value. d is the thread's n/2 accumulator floats: they read as NaN until the
// wgmma.wait_group that retires this MMA's commit group.
enum class WgmmaInput : int { F16 = 0, BF16 = 1, E4M3 = 2 };  // Counters::wgmma's first index
struct WgmmaShape {
  int n;  // 8 to 256, a multiple of 8
  WgmmaInput input;
  int trans_a, trans_b;
};
void wgmma_mma_async(const WgmmaShape& shape, float* d, const uint32_t* a_regs, uint64_t desc_a,
                     uint64_t desc_b, int scale_d, const char* file, int line);
// wgmma.fence / wgmma.commit_group / wgmma.wait_group N: warpgroup collectives.
void wgmma_fence(const char* file, int line);
void wgmma_commit_group(const char* file, int line);
void wgmma_wait_group(int pending_groups_allowed, const char* file, int line);
// setmaxnreg.{inc,dec}.sync.aligned.u32 count: a warpgroup collective (see README.md).
void setmaxnreg(bool increase, int count, const char* file, int line);
// stmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: the inverse of ldmatrix. Lane 8m + r
// gives the address of row r of matrix m; each lane supplies register m of every matrix.
void stmatrix(int num_matrices, bool transpose, const uint32_t* regs, void* row_addr,
              const char* file, int line);

}  // namespace cudasim::detail
