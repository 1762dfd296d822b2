// stmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: the inverse of ldmatrix (PTX ISA,
// "Warp-level matrix store instruction: stmatrix"), a warp collective like it.
#include <cstring>

#include "async_proxy.h"
#include "collective.h"
#include "warpgroup.h"
#include "wgmma.h"

namespace cudasim::detail {
namespace {

constexpr int kStmatrixRowBytes = 16;  // a row of an 8x8 b16 matrix

const char* stmatrix_name(int num, bool transpose) {
  static const char* names[2][5] = {
      {"", "stmatrix.x1", "stmatrix.x2", "", "stmatrix.x4"},
      {"", "stmatrix.x1.trans", "stmatrix.x2.trans", "", "stmatrix.x4.trans"}};
  return names[transpose ? 1 : 0][num];
}

}  // namespace

// Lane 8m + r gives the address of row r of matrix m (lanes beyond the last matrix are
// ignored). Register m of each lane holds its fragment of matrix m as ldmatrix delivers it:
// row laneid / 4, columns 2 * (laneid % 4) and +1, low half first; with .trans the lane's two
// elements are those of the transposed matrix, i.e. they land in rows 2 * (laneid % 4) and +1
// of column laneid / 4.
void stmatrix(int num_matrices, bool transpose, const uint32_t* regs, void* row_addr,
              const char* file, int line) {
  if (num_matrices != 1 && num_matrices != 2 && num_matrices != 4) {
    fail(Site{file, line}, "stmatrix: x" + std::to_string(num_matrices) + " is not x1, x2 or x4");
  }
  const CollectiveCall call{stmatrix_name(num_matrices, transpose), Site{file, line}, kFullWarp,
                            true};
  SimThread& self = current_thread(call.op);
  self.mailbox.row = row_addr;
  std::memcpy(self.mailbox.a, regs, sizeof(uint32_t) * static_cast<size_t>(num_matrices));
  rendezvous(call, [&](SimThread* const* lanes, uint32_t) {
    SimBlock& block = active_block(call.op);
    for (int m = 0; m < num_matrices; ++m) {
      for (int r = 0; r < 8; ++r) {
        const unsigned lane = static_cast<unsigned>(8 * m + r);
        const void* row = lanes[lane]->mailbox.row;
        if (reinterpret_cast<uintptr_t>(row) % kStmatrixRowBytes != 0) {
          fail(call.site, std::string(call.op) + ": lane " + std::to_string(lane) +
                              "'s row address " + format_address(row) + " is not 16-byte aligned",
               lanes[lane]);
        }
        if (!in_smem(block, row, kStmatrixRowBytes)) {
          fail(call.site, std::string(call.op) + ": lane " + std::to_string(lane) +
                              "'s row address " + format_address(row) +
                              " is not a 16-byte row inside dynamic shared memory [" +
                              format_address(block.smem) + ", +" +
                              std::to_string(block.smem_bytes) + ")",
               lanes[lane]);
        }
      }
    }
    uint16_t tiles[4][8][8];
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      const unsigned group = lane / 4, pair = 2 * (lane % 4);
      for (int m = 0; m < num_matrices; ++m) {
        const uint32_t reg = lanes[lane]->mailbox.a[m];
        for (unsigned half = 0; half < 2; ++half) {
          const auto value = static_cast<uint16_t>(reg >> (16 * half));
          if (transpose) {
            tiles[m][pair + half][group] = value;
          } else {
            tiles[m][group][pair + half] = value;
          }
        }
      }
    }
    count_stmatrix(block, num_matrices, transpose, lanes);
    for (int m = 0; m < num_matrices; ++m) {
      for (int r = 0; r < 8; ++r) {
        const unsigned lane = static_cast<unsigned>(8 * m + r);
        void* row = const_cast<void*>(lanes[lane]->mailbox.row);
        std::memcpy(row, tiles[m][r], kStmatrixRowBytes);
        note_generic_smem_store_by(thread_index(*lanes[lane]), row, kStmatrixRowBytes, call.site.file,
                                   call.site.line);
      }
    }
  });
}

}  // namespace cudasim::detail
