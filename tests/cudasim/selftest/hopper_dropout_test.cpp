// Dropout on the sm_90a forward and backward (csrc/cuda/hopper/sm90_dropout.cuh) on the shim,
// launched directly (no torch), so that tests/test_cudasim_hopper_dropout.py can build it against
// a copy of a kernel header with a bug planted and see it fail. q = 0 makes every visible key's
// probability 1 / n (n the row's visible keys), so each check is exact:
// - forward: V one-hot on a window of d keys (V[off + c][c] = 1) puts P_ij Z_ij / (1 - p) of key
//   off + c in column c of O: O must be non-zero exactly where dropout.h's host mask keeps a
//   visible key, and there 1 / (n (1 - p)) within the 16-bit type's rounding;
// - backward: dO one-hot on a window of d queries puts query off + c's dropped probability of key
//   j in dV[j][c]: the same pattern and values, read off dV (its factor 1 / (1 - p) included).
// bf16, d = 128 (the one head dim with both Hopper dropout loops).
//   hopper_dropout_test CASE       CASE = <fwd|bwd>_<mask>
// Exit status: 0 = exact, 1 = not (printed), 2 = setup error, 3 = SimError.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bshd_host_tensor.h"
#include "cuda/hopper/bwd_sm90_launch.h"
#include "cuda/hopper/fwd_sm90_launch.h"
#include "dropout.h"
#include "named_cases.h"

namespace {

using namespace flashattn::hopper;
using selftest::bits_of;
using selftest::Tensor;
using selftest::value_of;

using Elem = __nv_bfloat16;
constexpr int D = 128;
constexpr double kP = 0.17;
constexpr uint16_t kPoison = 0xFFFF;  // NaN in bf16

struct Shape {
  int seqlen_q, seqlen_k;
  bool causal;  // bottom-right
};

// The keep decisions of p = kP for one rng_state, and which keys a query sees.
struct Keep {
  const Shape& sh;
  flashattn::Dropout d;
  int64_t rng_state[2] = {20261203, 4};
  explicit Keep(const Shape& s) : sh(s) {
    d.rng_state = rng_state;
    d.threshold = static_cast<uint64_t>(std::llround(kP * 4294967296.0));
    d.keep_scale = static_cast<float>(1.0 / (1.0 - kP));
  }
  bool visible(int i, int j) const { return !sh.causal || j <= i + sh.seqlen_k - sh.seqlen_q; }
  int seen(int i) const {
    int n = 0;
    for (int j = 0; j < sh.seqlen_k; ++j) n += visible(i, j);
    return n;
  }
  // The dropped probability of (i, j) in float64: 0 or 1 / (n (1 - p)).
  double dropped_p(int i, int j) const {
    if (!visible(i, j) || !flashattn::dropout_keeps(d, flashattn::dropout_seed(d), 0, 0, i, j)) return 0;
    return 1.0 / (seen(i) * (1.0 - kP));
  }
};

// got against dropped_p: zero exactly where it is 0, else within 2^-7 relative (P and the
// output each rounded once to bf16, 2^-9 each, and fp32 sums).
struct Tally {
  int wrong_zero = 0, wrong_value = 0, kept = 0;
  double worst = 0;
  void add(double got, double want) {
    if (want == 0) {
      wrong_zero += got != 0;
      return;
    }
    ++kept;
    const double rel = std::fabs(got - want) / want;
    worst = std::max(worst, std::isfinite(rel) ? rel : 1e9);
    wrong_value += !(rel <= 1.0 / 128);
  }
  int report(const char* what, const Shape& sh) const {
    const bool ok = wrong_zero == 0 && wrong_value == 0 && kept > 0;
    std::printf("%s %s Sq=%d Sk=%d%s: %d kept, %d entries non-zero where dropped or masked, %d off by more "
                "than 2^-7 (worst %.3g)\n",
                ok ? "ok:" : "WRONG:", what, sh.seqlen_q, sh.seqlen_k, sh.causal ? " causal" : "", kept,
                wrong_zero, wrong_value, worst);
    return ok ? 0 : 1;
  }
};

Tensor zeros(int s) { return Tensor{1, s, 1, D, false, std::vector<uint16_t>(static_cast<size_t>(s) * D, 0)}; }

template <bool kCausal>
int forward(const Shape& sh) {
  const Keep keep(sh);
  const Tensor q = zeros(sh.seqlen_q);
  Tensor k = zeros(sh.seqlen_k);
  for (size_t x = 0; x < k.bits.size(); ++x) k.bits[x] = bits_of<Elem>(0.25f * static_cast<float>(x % 7) - 0.5f);
  Tally tally;
  for (int off = 0; off < sh.seqlen_k; off += D) {
    Tensor v = zeros(sh.seqlen_k);
    for (int c = 0; c < D && off + c < sh.seqlen_k; ++c) v.bits[v.index(0, off + c, 0, c)] = bits_of<Elem>(1.f);
    std::vector<uint16_t> o(static_cast<size_t>(sh.seqlen_q) * D, kPoison);
    std::vector<float> lse(sh.seqlen_q, NAN);
    FwdSm90Input o_in;
    o_in.ptr = o.data(), o_in.seqlen = sh.seqlen_q, o_in.heads = 1;
    o_in.batch_stride = static_cast<int64_t>(sh.seqlen_q) * D, o_in.row_stride = D, o_in.head_stride = D;
    FwdSm90Maps maps;
    using Cfg = FwdSm90Config<D>;
    const std::string error = make_fwd_sm90_maps(maps, flashattn::TensorMapDtype::BFloat16, D, 1, q.view(), k.view(),
                                                 v.view(), o_in, Cfg::kBlockM, Cfg::kBlockN);
    if (!error.empty()) {
      std::printf("tensor maps: %s\n", error.c_str());
      return 2;
    }
    FwdSm90Params p;
    p.lse = lse.data();
    p.lse_batch_stride = p.lse_head_stride = sh.seqlen_q;
    p.batch = 1, p.seqlen_q = sh.seqlen_q, p.seqlen_k = sh.seqlen_k, p.heads_q = 1, p.head_group = 1;
    p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    p.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
    p.dropout = keep.d;
    const std::string launch =
        launch_fwd_sm90<Elem, D, kCausal, false, false, false, false, false, true>(maps, p, nullptr);
    if (!launch.empty()) {
      std::printf("launch: %s\n", launch.c_str());
      return 2;
    }
    for (int i = 0; i < sh.seqlen_q; ++i)
      for (int c = 0; c < D; ++c)
        tally.add(value_of<Elem>(o[static_cast<size_t>(i) * D + c]),
                  off + c < sh.seqlen_k ? keep.dropped_p(i, off + c) : 0.0);
  }
  return tally.report("forward", sh);
}

template <bool kCausal>
int backward(const Shape& sh) {
  const Keep keep(sh);
  const int Sq = sh.seqlen_q, Sk = sh.seqlen_k;
  const Tensor q = zeros(Sq), o = zeros(Sq);  // O 0: D = rowsum(dO O) = 0 (dQ, dK not read)
  Tensor k = zeros(Sk), v = zeros(Sk);
  for (size_t x = 0; x < k.bits.size(); ++x) {
    k.bits[x] = bits_of<Elem>(0.25f * static_cast<float>(x % 7) - 0.5f);
    v.bits[x] = bits_of<Elem>(0.5f - 0.125f * static_cast<float>(x % 5));
  }
  // q = 0: every logit 0, so the LSE is ln n.
  std::vector<float> lse(Sq);
  for (int i = 0; i < Sq; ++i) lse[i] = static_cast<float>(std::log(static_cast<double>(keep.seen(i))));
  Tally tally;
  for (int off = 0; off < Sq; off += D) {
    Tensor dout = zeros(Sq);
    for (int c = 0; c < D && off + c < Sq; ++c) dout.bits[dout.index(0, off + c, 0, c)] = bits_of<Elem>(1.f);
    std::vector<uint16_t> dq(static_cast<size_t>(Sq) * D, kPoison), dk(static_cast<size_t>(Sk) * D, kPoison),
        dv(static_cast<size_t>(Sk) * D, kPoison);
    BwdSm90Params prm;
    prm.batch = 1, prm.seqlen_q = Sq, prm.seqlen_k = Sk, prm.heads_q = 1, prm.head_group = 1;
    prm.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    prm.scale_log2 = static_cast<float>(prm.scale * 1.4426950408889634);
    prm.dropout = keep.d;
    prm.dk = {dk.data(), static_cast<int64_t>(Sk) * D, D, D};
    prm.dv = {dv.data(), static_cast<int64_t>(Sk) * D, D, D};
    std::vector<float> workspace(static_cast<size_t>(bwd_sm90_workspace_floats<D>(prm)), NAN);
    bwd_sm90_bind_workspace<D>(prm, workspace.data());
    BwdSm90Rows rows;
    rows.o = {const_cast<uint16_t*>(o.bits.data()), static_cast<int64_t>(Sq) * D, D, D};
    rows.dout = {dout.bits.data(), static_cast<int64_t>(Sq) * D, D, D};
    rows.dq = {dq.data(), static_cast<int64_t>(Sq) * D, D, D};
    rows.lse = {lse.data(), Sq, 1, Sq};
    BwdSm90Maps maps;
    const std::string error =
        make_bwd_sm90_maps<D>(maps, flashattn::TensorMapDtype::BFloat16, 1, q.view(), k.view(), v.view(), dout.view());
    if (!error.empty()) {
      std::printf("tensor maps: %s\n", error.c_str());
      return 2;
    }
    const std::string launch =
        launch_bwd_sm90<Elem, D, kCausal, false, false, false, false, true>(maps, prm, rows, nullptr);
    if (!launch.empty()) {
      std::printf("launch: %s\n", launch.c_str());
      return 2;
    }
    for (int j = 0; j < Sk; ++j)
      for (int c = 0; c < D; ++c)
        tally.add(value_of<Elem>(dv[static_cast<size_t>(j) * D + c]), off + c < Sq ? keep.dropped_p(off + c, j) : 0.0);
  }
  return tally.report("backward dV", sh);
}

// Three key tiles of 128 and a partial one (the forward), two query blocks of 64 and two key
// blocks (the backward); Sq != Sk both ways.
const selftest::NamedCases kCases = {
    {"fwd_none", [] { return forward<false>({65, 300, false}); }},
    {"fwd_causal", [] { return forward<true>({130, 257, true}); }},
    {"bwd_none", [] { return backward<false>({129, 65, false}); }},
    {"bwd_causal", [] { return backward<true>({65, 129, true}); }},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
