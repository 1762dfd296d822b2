// Which query a row of a forward tile is: with GQA heads packed into the rows (gqa_decode.h),
// a row stands for one query token of one query head of the group. Shared by the sm_80 kernels
// (fwd_kernel.cuh, simt_kernels.cuh) and the sm_90a forward (hopper/fwd_sm90_kernel.cuh).
#pragma once
#include "host_device.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn::cuda {

// Row r of a forward CTA's tile of (batch, head): query token r of query head `head`, or with
// packed heads (packed > 1, `head` a kv head) token r / packed of query head
// head * packed + r % packed. A kernel that never sees packed heads builds it with packed = 1
// known at compile time, and every mapping folds away.
// Where a row's query is: its query head and its token in the sequence.
struct QueryPlace {
  int q_head;
  int token;
};

struct QueryRows {
  int packed;
  int head;

  FLASHATTN_HOST_DEVICE QueryPlace at(int row) const { return {q_head(row), token(row)}; }

  FLASHATTN_HOST_DEVICE int token(int row) const { return packed == 1 ? row : row / packed; }
  FLASHATTN_HOST_DEVICE int q_head(int row) const {
    return packed == 1 ? head : head * packed + row % packed;
  }
};

}  // namespace flashattn::cuda
