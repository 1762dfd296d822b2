// What every task of one forward call reads, whichever kernel runs it (fwd_tile_kernel.h,
// fwd_decode_kernel.h): made once per call by fwd.cpp's run_forward.
#pragma once
#include <vector>

#include "../params.h"
#include "fwd_plan.h"
#include "fwd_split_merge.h"
#include "simd.h"

namespace flashattn::cpu {

template <typename In>
struct ForwardCallState {
  const AttnParams& p;
  const std::vector<Sequence>& seqs;
  const ForwardPlan& plan;
  RowLanes lanes;  // the online softmax's vector width
  const ForwardOutput<In>& output;
};

}  // namespace flashattn::cpu
