// ldmatrix and mma.sync.m16n8k16, laid out as the PTX ISA's figures for these instructions
// specify ("Warp-level matrix load instruction: ldmatrix", "Matrix Fragments for mma.m16n8k16
// with floating point type").
#include <cstring>

#include "collective.h"
#include "fp_bits.h"

namespace cudasim::detail {
namespace {

constexpr int kRowBytes = 16;  // an ldmatrix row: 8 b16 elements

const char* ldmatrix_name(int num, bool transpose) {
  static const char* names[2][5] = {
      {"", "ldmatrix.x1", "ldmatrix.x2", "", "ldmatrix.x4"},
      {"", "ldmatrix.x1.trans", "ldmatrix.x2.trans", "", "ldmatrix.x4.trans"}};
  return names[transpose ? 1 : 0][num];
}

}  // namespace

uint32_t smem_offset(const void* ptr, const char* file, int line) {
  const SimBlock& block = active_block("smem_u32addr");
  if (!in_smem(block, ptr, 0)) {
    fail(Site{file, line}, "smem_u32addr(" + format_address(ptr) +
                               "): not a dynamic shared memory address (FLASHATTN_DYNAMIC_SMEM)");
  }
  return static_cast<uint32_t>(static_cast<const unsigned char*>(ptr) - block.smem);
}

// Lane 8*m + r gives the address of row r of matrix m (lanes beyond the last matrix are
// ignored). Each lane receives, in register m, two consecutive b16 elements of matrix m:
// row lane/4, columns 2*(lane%4) and +1 -- or, with .trans, the same fragment of the
// transposed matrix, i.e. stored rows 2*(lane%4) and +1 at column lane/4. Low half first.
void ldmatrix(int num_matrices, bool transpose, uint32_t* regs, const void* row_addr,
              const char* file, int line) {
  const CollectiveCall call{ldmatrix_name(num_matrices, transpose), Site{file, line}, kFullWarp, true};
  SimThread& self = current_thread(call.op);
  self.mailbox.row = row_addr;
  rendezvous(call, [&](SimThread* const* lanes, uint32_t) {
    SimBlock& block = active_block(call.op);
    uint16_t tiles[4][8][8];
    for (int m = 0; m < num_matrices; ++m) {
      for (int r = 0; r < 8; ++r) {
        const unsigned lane = static_cast<unsigned>(8 * m + r);
        const void* row = lanes[lane]->mailbox.row;
        if (reinterpret_cast<uintptr_t>(row) % kRowBytes != 0) {
          fail(call.site, std::string(call.op) + ": lane " + std::to_string(lane) + "'s row address " +
                              format_address(row) + " is not 16-byte aligned",
               lanes[lane]);
        }
        if (!in_smem(block, row, kRowBytes)) {
          fail(call.site, std::string(call.op) + ": lane " + std::to_string(lane) + "'s row address " +
                              format_address(row) + " is not a 16-byte row inside dynamic shared memory [" +
                              format_address(block.smem) + ", +" + std::to_string(block.smem_bytes) + ")",
               lanes[lane]);
        }
        std::memcpy(tiles[m][r], row, kRowBytes);
      }
    }
    count_ldmatrix(block, num_matrices, transpose, lanes);
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      const unsigned group = lane / 4, pair = 2 * (lane % 4);
      for (int m = 0; m < num_matrices; ++m) {
        const uint16_t lo = transpose ? tiles[m][pair][group] : tiles[m][group][pair];
        const uint16_t hi = transpose ? tiles[m][pair + 1][group] : tiles[m][group][pair + 1];
        lanes[lane]->mailbox.regs[m] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
      }
    }
  });
  std::memcpy(regs, self.mailbox.regs, sizeof(uint32_t) * static_cast<size_t>(num_matrices));
}

// D = A * B + C with A 16x16 row-major, B 16x8 (k x n) column-major, C/D 16x8 f32.
// With group = lane/4 and pair = 2*(lane%4), lane holds
//   A: a[0] = A[group][pair..+1], a[1] = A[group+8][pair..+1],
//      a[2] = A[group][pair+8..+9], a[3] = A[group+8][pair+8..+9]
//   B: b[0] = B[pair..+1][group], b[1] = B[pair+8..+9][group]
//   C/D: c[0..1] = C[group][pair..+1], c[2..3] = C[group+8][pair..+1]
// (low half of each register = lower column / k index). Products of f16 or bf16 values are exact
// in double, and each output is rounded once to f32; the hardware's internal accumulation
// order and truncation are not modelled.
void mma_m16n8k16(MmaInput input, float* d, const uint32_t* a, const uint32_t* b,
                  const char* file, int line) {
  const char* op = input == MmaInput::F16 ? "mma.m16n8k16.row.col.f32.f16.f16.f32"
                                          : "mma.m16n8k16.row.col.f32.bf16.bf16.f32";
  SimThread& self = current_thread(op);
  std::memcpy(self.mailbox.a, a, sizeof self.mailbox.a);
  std::memcpy(self.mailbox.b, b, sizeof self.mailbox.b);
  std::memcpy(self.mailbox.c, d, sizeof self.mailbox.c);
  rendezvous(CollectiveCall{op, Site{file, line}, kFullWarp, true},
             [&](SimThread* const* lanes, uint32_t) {
    count_mma(active_block(op), input);
    const auto to_float = input == MmaInput::F16 ? f16_to_float : bf16_to_float;
    const auto lo = [&](uint32_t reg) { return to_float(static_cast<uint16_t>(reg & 0xffffu)); };
    const auto hi = [&](uint32_t reg) { return to_float(static_cast<uint16_t>(reg >> 16)); };
    float A[16][16], B[16][8], C[16][8];
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      const LaneMailbox& in = lanes[lane]->mailbox;
      const unsigned group = lane / 4, pair = 2 * (lane % 4);
      for (unsigned half = 0; half < 2; ++half) {   // row block: group, group + 8
        for (unsigned kblk = 0; kblk < 2; ++kblk) {  // k block: pair, pair + 8
          const uint32_t reg = in.a[half + 2 * kblk];
          A[group + 8 * half][pair + 8 * kblk] = lo(reg);
          A[group + 8 * half][pair + 8 * kblk + 1] = hi(reg);
        }
        B[pair + 8 * half][group] = lo(in.b[half]);
        B[pair + 8 * half + 1][group] = hi(in.b[half]);
        C[group + 8 * half][pair] = in.c[2 * half];
        C[group + 8 * half][pair + 1] = in.c[2 * half + 1];
      }
    }
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      const unsigned group = lane / 4, pair = 2 * (lane % 4);
      for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = group + 8 * (i / 2), col = pair + i % 2;
        double sum = C[row][col];
        for (unsigned k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
        lanes[lane]->mailbox.d[i] = static_cast<float>(sum);
      }
    }
  });
  std::memcpy(d, self.mailbox.d, sizeof self.mailbox.d);
}

}  // namespace cudasim::detail
