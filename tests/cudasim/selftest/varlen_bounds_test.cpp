// The CUDA kernels with malformed varlen lengths, on the shim: nothing checks cu_seqlens or
// seqused on the host for CUDA (that would need a device sync), so every kernel must clamp
// them to its tensors (mask.h, sequence_of). Built with ASan, every tensor here is a heap
// block of exactly its size, so a read or write outside one is reported.
//   varlen_bounds_test
// Exit 0: every forward and backward kernel ran on every malformed case.
#include <climits>
#include <cstdio>
#include <vector>

#include "cuda/launch_bwd.cuh"
#include "cuda/launch_fwd.cuh"
#include "cuda/launch_simt.cuh"

namespace {

using flashattn::AttnBwdParams;
using flashattn::TensorView;

constexpr int kHeadDim = 64;  // one 16-bit tile and one SIMT tile
constexpr int kHeadsQ = 2, kHeadsKv = 1, kBatch = 3;
constexpr int kTotalQ = 50, kTotalK = 45, kMaxSeqlen = 40;

struct Case {
  const char* name;
  std::vector<int> cu_q, cu_k;
  std::vector<int> used_q, used_k;  // empty: no seqused
};

const std::vector<Case> kCases = {
    {"decreasing", {0, 30, 20, 50}, {0, 40, 10, 45}, {}, {}},
    {"negative and past the end", {-5, 10, 60, 70}, {-100, 44, 46, 1000}, {}, {}},
    {"huge", {0, 1000000, 2000000, INT_MAX}, {INT_MIN, 0, INT_MAX, INT_MAX}, {}, {}},
    {"longer than max_seqlen", {0, 50, 50, 50}, {0, 45, 45, 45}, {}, {}},
    {"seqused past the sequences", {0, 20, 30, 50}, {0, 15, 30, 45}, {-3, 1000, 7},
     {INT_MAX, -1, 40}},
};

// [rows, heads, dim] contiguous, a varlen view (batch stride 0).
TensorView rows_view(void* data, int heads, int dim) {
  return {data, 0, int64_t(heads) * dim, dim};
}

// [heads, rows] contiguous: the varlen LSE.
TensorView stats_view(float* data, int rows) { return {data, 0, 1, rows}; }

void no_check() {}

template <typename Storage>
void run_case(const Case& c, bool fp32, bool deterministic) {
  std::vector<Storage> q(kTotalQ * kHeadsQ * kHeadDim, Storage(1)), o(q.size()), dout(q.size()),
      dq(q.size());
  std::vector<Storage> k(kTotalK * kHeadsKv * kHeadDim, Storage(1)), v(k.size()), dk(k.size()),
      dv(k.size());
  std::vector<float> lse(kHeadsQ * kTotalQ), workspace(kHeadsQ * kTotalQ * (1 + kHeadDim));
  std::vector<int> cu_q = c.cu_q, cu_k = c.cu_k, used_q = c.used_q, used_k = c.used_k;

  AttnBwdParams p;
  p.q = rows_view(q.data(), kHeadsQ, kHeadDim);
  p.k = rows_view(k.data(), kHeadsKv, kHeadDim);
  p.v = rows_view(v.data(), kHeadsKv, kHeadDim);
  p.o = rows_view(o.data(), kHeadsQ, kHeadDim);
  p.lse = stats_view(lse.data(), kTotalQ);
  p.dout = rows_view(dout.data(), kHeadsQ, kHeadDim);
  p.dq = rows_view(dq.data(), kHeadsQ, kHeadDim);
  p.dk = rows_view(dk.data(), kHeadsKv, kHeadDim);
  p.dv = rows_view(dv.data(), kHeadsKv, kHeadDim);
  p.batch = kBatch;
  p.seqlen_q = p.seqlen_k = kMaxSeqlen;
  p.total_q = kTotalQ;
  p.total_k = kTotalK;
  p.cu_seqlens_q = cu_q.data();
  p.cu_seqlens_k = cu_k.data();
  p.seqused_q = used_q.empty() ? nullptr : used_q.data();
  p.seqused_k = used_k.empty() ? nullptr : used_k.data();
  p.heads_q = kHeadsQ;
  p.heads_kv = kHeadsKv;
  p.head_group = kHeadsQ / kHeadsKv;
  p.head_dim = kHeadDim;
  p.head_dim_v = kHeadDim;
  p.scale = 0.125f;
  p.window_right = 0;  // causal: the masks read the clamped lengths too
  p.deterministic = deterministic;

  using namespace flashattn::cuda;
  float* split_scratch_ptr = nullptr;  // one split
  if (fp32) {
    run_fwd_simt<kHeadDim>(p, split_scratch_ptr, nullptr, &no_check);
    run_bwd_simt<kHeadDim>(p, workspace.data(), nullptr, &no_check);
  } else {
    run_fwd_16bit<__nv_bfloat16, kHeadDim, kHeadDim>(p, split_scratch_ptr, nullptr, &no_check);
    run_bwd_16bit<__nv_bfloat16, kHeadDim, kHeadDim>(p, workspace.data(), nullptr, &no_check);
  }
  std::printf("%s (%s%s): ran\n", c.name, fp32 ? "fp32" : "bf16",
              deterministic ? ", deterministic" : "");
}

}  // namespace

namespace flashattn::cuda {
template void run_fwd_16bit<__nv_bfloat16, kHeadDim, kHeadDim>(const AttnParams&, float*,
                                                               cudaStream_t, LaunchCheck);
template void run_bwd_16bit<__nv_bfloat16, kHeadDim, kHeadDim>(const AttnBwdParams&, float*,
                                                               cudaStream_t, LaunchCheck);
template void run_fwd_simt<kHeadDim>(const AttnParams&, float*, cudaStream_t, LaunchCheck);
template void run_bwd_simt<kHeadDim>(const AttnBwdParams&, float*, cudaStream_t, LaunchCheck);
}  // namespace flashattn::cuda

int main() {
  for (const Case& c : kCases) {
    run_case<uint16_t>(c, /*fp32=*/false, /*deterministic=*/false);
    run_case<uint16_t>(c, /*fp32=*/false, /*deterministic=*/true);
    run_case<float>(c, /*fp32=*/true, /*deterministic=*/false);
  }
  std::printf("all cases ran\n");
  return 0;
}
