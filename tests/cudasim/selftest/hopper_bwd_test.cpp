// The sm_90a attention backward (csrc/cuda/hopper/bwd_sm90_*) on the shim, against a float64
// reference of dQ, dK and dV.
//   hopper_bwd_test CASE
// Each case runs a few shapes of one configuration (element type, head dim, causal,
// deterministic dQ). Q, K, V, dO are random and non-zero (fixed seeds); O and the LSE are the
// exact forward's (O rounded to the 16-bit type, as a forward would store it). dQ, dK, dV and
// the workspace are poisoned (NaN) before the launch, and a guard after each output must stay
// untouched. Tolerance: each gradient's largest error against float64 at most 3x (+1e-5) the
// largest error of the same backward computed the way PyTorch's autograd computes it in the
// 16-bit type (every matmul and softmax output rounded to it; the "emulated" column).
// Every shape also prints "dq-bits HASH HASH" (FNV-1a of dQ's bits and of the fp32 accumulator's):
// the pytest driver checks that deterministic cases print the same under every schedule and copy
// completion.
// Exit status: 0 = within tolerance, 1 = not (printed), 2 = setup error, 3 = SimError.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bshd_host_tensor.h"
#include "cuda/hopper/bwd_sm90_launch.h"
#include "named_cases.h"

namespace {

using namespace flashattn::hopper;
using namespace selftest;

struct Shape {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool kv_heads_outer;    // K, V as [B, Hkv, Sk, D] (else [B, Sk, Hkv, D], like Q)
  bool top_left = false;  // causal / window: SDPA's top-left alignment (else FA2's bottom-right)
  int window_left = -1, window_right = -1;  // the kLocal cases' window (AttnParams' meaning)
  bool alibi_per_batch = false;  // the kAlibi cases' slopes: [B, Hq] (else [Hq], batch stride 0)
};

constexpr int kGuard = 64;
constexpr uint16_t kPoison = 0xFFFF;  // NaN in both 16-bit types

uint64_t fnv1a(const void* data, size_t bytes) {
  const unsigned char* b = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Largest |got - exact| and |emulated - exact| of one gradient.
struct ErrorPair {
  double err = 0, emulated = 0;
  int nonfinite = 0;
  void add(double got, double exact, double emulated_value) {
    if (!std::isfinite(got)) ++nonfinite;
    err = std::max(err, std::fabs(got - exact));
    emulated = std::max(emulated, std::fabs(emulated_value - exact));
  }
  bool ok() const { return nonfinite == 0 && err <= 3 * emulated + 1e-5; }
};

// The softcap of the kSoftcap cases: small enough that tanh bends the scores of these inputs
// (|scale * s| reaches ~4), so 1 - tanh^2 matters in dS.
constexpr double kSoftcapValue = 1.5;

template <typename Elem, int kHeadDim, bool kCausal, bool kLocal, bool kAlibi, bool kSoftcap>
int run_shape(const Shape& sh, unsigned seed, bool deterministic) {
  constexpr int D = kHeadDim;
  const int B = sh.batch, Hq = sh.heads_q, Hkv = sh.heads_kv, Sq = sh.seqlen_q, Sk = sh.seqlen_k;
  const int group = Hq / Hkv;
  std::mt19937 rng(seed);
  const Tensor q = random_tensor<Elem>(rng, B, Sq, Hq, D, false);
  const Tensor k = random_tensor<Elem>(rng, B, Sk, Hkv, D, sh.kv_heads_outer);
  const Tensor v = random_tensor<Elem>(rng, B, Sk, Hkv, D, sh.kv_heads_outer);
  const Tensor dout = random_tensor<Elem>(rng, B, Sq, Hq, D, false);
  const int diag_offset = sh.top_left ? 0 : Sk - Sq;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto val = [](const Tensor& t, int b, int s, int h, int d) { return static_cast<double>(value_of<Elem>(t.bits[t.index(b, s, h, d)])); };
  const int wl = kLocal ? sh.window_left : -1, wr = kCausal ? 0 : (kLocal ? sh.window_right : -1);
  auto visible = [&](int i, int j) {
    return (wl < 0 || j >= i + diag_offset - wl) && (wr < 0 || j <= i + diag_offset + wr);
  };
  // ALiBi: slopes in [0.01, 0.51) (as tests/checks.py draws them), [B, Hq] or [Hq]; the logit
  // gets -slope |i + diag_offset - j| (mask.h alibi_bias).
  const int64_t alibi_batch_stride = sh.alibi_per_batch ? Hq : 0;
  std::vector<float> slopes(static_cast<size_t>(sh.alibi_per_batch ? B : 1) * Hq);
  std::uniform_real_distribution<float> slope_of(0.01f, 0.51f);
  for (auto& x : slopes) x = slope_of(rng);
  // The logit of x = scale * s and d logit / dx: softcap * tanh(x / softcap) and 1 - tanh^2.
  auto logit = [](double x, double& dlogit) {
    dlogit = 1;
    if (!kSoftcap) return x;
    const double t = std::tanh(x / kSoftcapValue);
    dlogit = 1 - t * t;
    return kSoftcapValue * t;
  };
  // PyTorch's 16-bit autograd of the same: every op's output rounded (tanh's backward uses its
  // rounded output t16).
  auto logit16 = [](double x16, double& t16) {
    if (!kSoftcap) return x16;
    t16 = round_to<Elem>(std::tanh(round_to<Elem>(x16 / kSoftcapValue)));
    return round_to<Elem>(kSoftcapValue * t16);
  };
  auto dlogit16 = [](double g16, double t16) {
    if (!kSoftcap) return g16;
    g16 = round_to<Elem>(g16 * kSoftcapValue);
    g16 = round_to<Elem>(g16 * round_to<Elem>(1 - round_to<Elem>(t16 * t16)));
    return round_to<Elem>(g16 / kSoftcapValue);
  };
  auto bias = [&](int b, int h, int i, int j) {
    if (!kAlibi) return 0.0;
    const int dist = i + diag_offset - j;
    return -static_cast<double>(slopes[b * alibi_batch_stride + h]) * std::abs(dist);
  };

  // The exact forward and backward in float64, and PyTorch's 16-bit computation.
  Tensor o{B, Sq, Hq, D, false, std::vector<uint16_t>(static_cast<size_t>(B) * Sq * Hq * D)};
  std::vector<float> lse(static_cast<size_t>(B) * Hq * Sq);
  const size_t q_elems = static_cast<size_t>(B) * Sq * Hq * D, kv_elems = static_cast<size_t>(B) * Sk * Hkv * D;
  std::vector<double> dq_ref(q_elems, 0), dk_ref(kv_elems, 0), dv_ref(kv_elems, 0);
  std::vector<double> dq_emu(q_elems, 0), dk_emu(kv_elems, 0), dv_emu(kv_elems, 0);
  std::vector<double> dk_emu_acc(kv_elems, 0), dv_emu_acc(kv_elems, 0);  // fp32-like sums before rounding
  auto qi = [&](int b, int i, int h, int d) { return ((static_cast<size_t>(b) * Sq + i) * Hq + h) * D + d; };
  auto ki = [&](int b, int j, int h, int d) { return ((static_cast<size_t>(b) * Sk + j) * Hkv + h) * D + d; };
  std::vector<double> p(Sk), p16(Sk), ds(Sk), ds16(Sk), dlogit(Sk), t16(Sk);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / group;
      for (int i = 0; i < Sq; ++i) {
        double mx = -INFINITY, mx16 = -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          double dot = 0;
          float dot_f = 0;
          for (int d = 0; d < D; ++d) {
            const double x = val(q, b, i, h, d) * val(k, b, j, hk, d);
            dot += x;
            dot_f += static_cast<float>(x);
          }
          // The bias is added to the rounded scores exactly: a 16-bit bias (or sum) would be off
          // by up to 0.25 at distance 200 (bf16 spacing at 64-128) and loosen the yardstick
          // enough to hide a distance off by one.
          p[j] = visible(i, j) ? logit(dot * scale, dlogit[j]) + bias(b, h, i, j) : -INFINITY;
          p16[j] = visible(i, j) ? logit16(round_to<Elem>(round_to<Elem>(dot_f) * scale), t16[j]) + bias(b, h, i, j)
                                 : -INFINITY;
          mx = std::max(mx, p[j]);
          mx16 = std::max(mx16, p16[j]);
        }
        double l = 0, l16 = 0;
        for (int j = 0; j < Sk; ++j) {
          p[j] = mx == -INFINITY ? 0 : std::exp(p[j] - mx);
          p16[j] = mx16 == -INFINITY ? 0 : std::exp(p16[j] - mx16);
          l += p[j];
          l16 += p16[j];
        }
        for (int j = 0; j < Sk; ++j) {
          p[j] = l > 0 ? p[j] / l : 0;
          p16[j] = l16 > 0 ? round_to<Elem>(p16[j] / l16) : 0;
        }
        lse[(static_cast<size_t>(b) * Hq + h) * Sq + i] = l > 0 ? static_cast<float>(mx + std::log(l)) : -INFINITY;
        std::vector<double> o_row(D, 0);
        for (int d = 0; d < D; ++d) {
          for (int j = 0; j < Sk; ++j) o_row[d] += p[j] * val(v, b, j, hk, d);
          o.bits[o.index(b, i, h, d)] = bits_of<Elem>(static_cast<float>(o_row[d]));
        }
        // dP = dO V^T; D = rowsum(dO * O) = sum_j P dP; dS = P (dP - D) (times scale for dQ, dK).
        double dsum = 0;
        float dsum16 = 0;
        std::vector<double> dp16(Sk);
        for (int j = 0; j < Sk; ++j) {
          double dp = 0;
          float dp_f = 0;
          for (int d = 0; d < D; ++d) {
            const double x = val(dout, b, i, h, d) * val(v, b, j, hk, d);
            dp += x;
            dp_f += static_cast<float>(x);
          }
          ds[j] = dp;
          dp16[j] = round_to<Elem>(dp_f);
          dsum += p[j] * dp;
          dsum16 += static_cast<float>(p16[j] * dp16[j]);
        }
        for (int j = 0; j < Sk; ++j) {
          ds[j] = p[j] * (ds[j] - dsum) * dlogit[j] * scale;
          ds16[j] = round_to<Elem>(
              dlogit16(round_to<Elem>(static_cast<float>(p16[j] * (dp16[j] - dsum16))), t16[j]) * scale);
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          float acc_f = 0;
          for (int j = 0; j < Sk; ++j) {
            acc += ds[j] * val(k, b, j, hk, d);
            acc_f += static_cast<float>(ds16[j] * val(k, b, j, hk, d));
          }
          dq_ref[qi(b, i, h, d)] = acc;
          dq_emu[qi(b, i, h, d)] = round_to<Elem>(acc_f);
        }
        for (int j = 0; j < Sk; ++j)
          for (int d = 0; d < D; ++d) {
            dk_ref[ki(b, j, hk, d)] += ds[j] * val(q, b, i, h, d);
            dv_ref[ki(b, j, hk, d)] += p[j] * val(dout, b, i, h, d);
            dk_emu_acc[ki(b, j, hk, d)] += static_cast<float>(ds16[j] * val(q, b, i, h, d));
            dv_emu_acc[ki(b, j, hk, d)] += static_cast<float>(p16[j] * val(dout, b, i, h, d));
          }
      }
    }
  // dK, dV: one rounding of the fp32 sum over the kv head's query heads (PyTorch's GQA through
  // repeat_interleave rounds each head's gradient first, a larger error: this is the tighter yardstick).
  for (size_t x = 0; x < kv_elems; ++x) {
    dk_emu[x] = round_to<Elem>(dk_emu_acc[x]);
    dv_emu[x] = round_to<Elem>(dv_emu_acc[x]);
  }

  // The kernels' outputs, poisoned, with guards.
  std::vector<uint16_t> dq(q_elems + kGuard, kPoison), dk(kv_elems + kGuard, kPoison), dv(kv_elems + kGuard, kPoison);
  BwdSm90Params prm;
  prm.batch = B, prm.seqlen_q = Sq, prm.seqlen_k = Sk, prm.heads_q = Hq, prm.head_group = group;
  prm.scale = static_cast<float>(scale);
  prm.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  prm.align_bottom_right = !sh.top_left;
  prm.deterministic = deterministic;
  prm.window_left = kLocal ? sh.window_left : -1;
  prm.window_right = kLocal ? sh.window_right : -1;
  set_bwd_sm90_softcap(prm, kSoftcap ? static_cast<float>(kSoftcapValue) : 0.f);
  if (kAlibi) {
    prm.alibi_slopes = slopes.data();
    prm.alibi_batch_stride = alibi_batch_stride;
    prm.alibi_head_stride = 1;
  }
  const int64_t kv_row = static_cast<int64_t>(Hkv) * D, q_row = static_cast<int64_t>(Hq) * D;
  prm.dk = {dk.data(), Sk * kv_row, kv_row, D};
  prm.dv = {dv.data(), Sk * kv_row, kv_row, D};
  std::vector<float> workspace(static_cast<size_t>(bwd_sm90_workspace_floats<D>(prm)), NAN);
  bwd_sm90_bind_workspace<D>(prm, workspace.data());
  BwdSm90Rows rows;
  rows.o = {const_cast<uint16_t*>(o.bits.data()), Sq * q_row, q_row, D};
  rows.dout = {const_cast<uint16_t*>(dout.bits.data()), Sq * q_row, q_row, D};
  rows.dq = {dq.data(), Sq * q_row, q_row, D};
  rows.lse = {lse.data(), static_cast<int64_t>(Hq) * Sq, 1, Sq};

  BwdSm90Maps maps;
  const auto dtype = std::is_same_v<Elem, __nv_bfloat16> ? flashattn::TensorMapDtype::BFloat16
                                                         : flashattn::TensorMapDtype::Float16;
  const std::string error = make_bwd_sm90_maps<D>(maps, dtype, B, q.view(), k.view(), v.view(), dout.view());
  if (!error.empty()) {
    std::printf("tensor maps: %s\n", error.c_str());
    return 2;
  }
  const std::string launch = launch_bwd_sm90<Elem, D, kCausal, kLocal, kAlibi, kSoftcap>(maps, prm, rows, nullptr);
  if (!launch.empty()) {
    std::printf("launch: %s\n", launch.c_str());
    return 2;
  }

  ErrorPair e_dq, e_dk, e_dv;
  for (size_t x = 0; x < q_elems; ++x) e_dq.add(value_of<Elem>(dq[x]), dq_ref[x], dq_emu[x]);
  for (size_t x = 0; x < kv_elems; ++x) {
    e_dk.add(value_of<Elem>(dk[x]), dk_ref[x], dk_emu[x]);
    e_dv.add(value_of<Elem>(dv[x]), dv_ref[x], dv_emu[x]);
  }
  int guard = 0;
  for (int i = 0; i < kGuard; ++i)
    guard += (dq[q_elems + i] != kPoison) + (dk[kv_elems + i] != kPoison) + (dv[kv_elems + i] != kPoison);
  const bool ok = e_dq.ok() && e_dk.ok() && e_dv.ok() && guard == 0;
  std::string tags = sh.kv_heads_outer ? " kv[B,H,S,D]" : "";
  if (kCausal) tags += sh.top_left ? " causal top-left" : " causal";
  if (kLocal)
    tags += " window (" + std::to_string(wl) + ", " + std::to_string(wr) + ")" + (sh.top_left ? " top-left" : "");
  if (kAlibi) tags += sh.alibi_per_batch ? " ALiBi [B, Hq]" : " ALiBi [Hq]";
  if (kSoftcap) tags += " softcap";
  if (deterministic) tags += " deterministic";
  auto ratio = [](const ErrorPair& e) { return e.emulated > 0 ? e.err / e.emulated : 0.0; };
  std::printf("%s B=%d Hq=%d Hkv=%d Sq=%d Sk=%d%s: dQ err %.3g (emulated %.3g, ratio %.2f), dK %.3g (%.3g, %.2f), "
              "dV %.3g (%.3g, %.2f), %d non-finite, %d guard writes\n",
              ok ? "ok:" : "WRONG:", B, Hq, Hkv, Sq, Sk, tags.c_str(), e_dq.err, e_dq.emulated, ratio(e_dq), e_dk.err,
              e_dk.emulated, ratio(e_dk), e_dv.err, e_dv.emulated, ratio(e_dv),
              e_dq.nonfinite + e_dk.nonfinite + e_dv.nonfinite, guard);
  // dQ's bits, and the fp32 accumulator's (the rounding to 16 bits can hide an order effect).
  const DqAccumLayout<D> dq_layout = bwd_sm90_dq_layout<D>(prm);
  std::printf("dq-bits %016llx %016llx\n", static_cast<unsigned long long>(fnv1a(dq.data(), q_elems * 2)),
              static_cast<unsigned long long>(fnv1a(prm.dq_accum, static_cast<size_t>(dq_layout.floats()) * 4)));
  return ok ? 0 : 1;
}

template <typename Elem, int kHeadDim, bool kCausal, bool kLocal = false, bool kAlibi = false, bool kSoftcap = false>
int run(std::vector<Shape> shapes, bool deterministic = false) {
  int status = 0;
  unsigned seed = 1;
  for (const Shape& sh : shapes) {
    const int rc = run_shape<Elem, kHeadDim, kCausal, kLocal, kAlibi, kSoftcap>(sh, seed++, deterministic);
    if (rc != 0) status = rc;
  }
  return status;
}

// Each rejected argument gets an error naming it, before any kernel runs (outputs untouched).
int check_bad_arguments() {
  constexpr int D = 64;
  const int B = 1, H = 2, S = 65;
  std::mt19937 rng(7);
  const Tensor q = random_tensor<__nv_bfloat16>(rng, B, S, H, D, false);
  std::vector<float> lse(static_cast<size_t>(B) * H * S, 0.f);
  std::vector<uint16_t> dq(q.bits.size() + 8, kPoison), dk(q.bits.size() + 8, kPoison), dv(q.bits.size() + 8, kPoison);
  auto valid = [&](BwdSm90Params& p, BwdSm90Rows& rows, std::vector<float>& workspace) {
    p = BwdSm90Params();
    p.batch = B, p.seqlen_q = p.seqlen_k = S, p.heads_q = H, p.head_group = 1;
    p.scale = 0.125f, p.scale_log2 = 0.125f * 1.4426950408889634f;
    const int64_t row = static_cast<int64_t>(H) * D;
    p.dk = {dk.data(), S * row, row, D};
    p.dv = {dv.data(), S * row, row, D};
    workspace.assign(static_cast<size_t>(bwd_sm90_workspace_floats<D>(p)), NAN);
    bwd_sm90_bind_workspace<D>(p, workspace.data());
    rows = BwdSm90Rows();
    void* q_bits = const_cast<uint16_t*>(q.bits.data());
    rows.o = rows.dout = {q_bits, S * row, row, D};
    rows.dq = {dq.data(), S * row, row, D};
    rows.lse = {lse.data(), static_cast<int64_t>(H) * S, 1, S};
  };
  BwdSm90Maps maps;
  const auto dtype = flashattn::TensorMapDtype::BFloat16;
  if (!make_bwd_sm90_maps<D>(maps, dtype, B, q.view(), q.view(), q.view(), q.view()).empty()) return 2;
  const struct {
    const char* what;
    const char* expect;  // the start of the error
    void (*edit)(BwdSm90Params&, BwdSm90Rows&);
  } bad[] = {
      {"negative Sk", "batch, seqlen_q, seqlen_k, heads_q: expected non-negative sizes, got 1, 65, -1, 2",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.seqlen_k = -1; }},
      {"head_group 3 of 2 heads", "head_group: expected a divisor of heads_q = 2, got 3",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.head_group = 3; }},
      {"head_group 0", "head_group: expected a divisor of heads_q = 2, got 0",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.head_group = 0; }},
      {"no workspace", "lse_log2 (workspace): expected a 16-byte aligned pointer",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.lse_log2 = nullptr; }},
      {"misaligned dQ accumulator", "dq_accum (workspace): expected a 16-byte aligned pointer",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.dq_accum += 1; }},
      {"no LSE", "O, dO, LSE: expected three tensors, got a null pointer",
       [](BwdSm90Params&, BwdSm90Rows& r) { r.lse.ptr = nullptr; }},
      {"odd dK row stride", "dK: expected even element strides (batch, row, head), got 8320, 129, 64",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.dk.row_stride = 129; }},
      {"misaligned dV", "dV: expected a 4-byte aligned pointer",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.dv.ptr = static_cast<char*>(p.dv.ptr) + 2; }},
      {"no dQ", "dQ: expected a 4-byte aligned pointer, got 0", [](BwdSm90Params&, BwdSm90Rows& r) { r.dq.ptr = nullptr; }},
      // The kernel without a window would compute another attention's gradients.
      {"a window for the kernel without one",
       "window_left, window_right: expected -1, -1 without the local-window kernel, got 16, 0",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.window_left = 16, p.window_right = 0; }},
      {"a right edge for the kernel without one", "window_left, window_right: expected -1, -1 without the "
       "local-window kernel, got -1, 3", [](BwdSm90Params& p, BwdSm90Rows&) { p.window_right = 3; }},
      // Slopes the kernel without ALiBi would ignore (the ALiBi kernel without them: below).
      {"ALiBi slopes for the kernel without ALiBi",
       "alibi_slopes: expected nullptr without the ALiBi kernel, got a pointer",
       [](BwdSm90Params& p, BwdSm90Rows&) { p.alibi_slopes = p.lse_log2; }},
      {"a softcap for the kernel without one", "softcap: expected 0 without the softcap kernel, got 2.5",
       [](BwdSm90Params& p, BwdSm90Rows&) { set_bwd_sm90_softcap(p, 2.5f); }},
  };
  int wrong = 0;
  for (const auto& b : bad) {
    BwdSm90Params p;
    BwdSm90Rows rows;
    std::vector<float> workspace;
    valid(p, rows, workspace);
    b.edit(p, rows);
    const std::string error = launch_bwd_sm90<__nv_bfloat16, D, false>(maps, p, rows, nullptr);
    const bool ok = error.rfind(b.expect, 0) == 0;
    wrong += !ok;
    std::printf("%s %s: \"%s\"\n", ok ? "ok:" : "WRONG:", b.what, error.c_str());
  }
  {
    BwdSm90Params p;
    BwdSm90Rows rows;
    std::vector<float> workspace;
    valid(p, rows, workspace);
    const std::string error = launch_bwd_sm90<__nv_bfloat16, D, false, false, true>(maps, p, rows, nullptr);
    const bool ok = error == "alibi_slopes: expected a pointer for the ALiBi kernel, got nullptr";
    wrong += !ok;
    std::printf("%s the ALiBi kernel without slopes: \"%s\"\n", ok ? "ok:" : "WRONG:", error.c_str());
  }
  int touched = 0;
  for (size_t i = 0; i < dq.size(); ++i) touched += (dq[i] != kPoison) + (dk[i] != kPoison) + (dv[i] != kPoison);
  std::printf("%s outputs untouched by the rejected launches: %d writes\n", touched ? "WRONG:" : "ok:", touched);
  return wrong || touched ? 1 : 0;
}

// Which query blocks a key block visits and which of those it masks (QueryBlocks), against
// brute force over lengths, windows and both alignments: a block is visited iff some row of it
// sees some key of the key block, and masked iff some (row, key) pair of the two is not visible
// (or the key block is ragged), so no block is skipped that a row needs and none is masked or
// visited for nothing. Prints how many of the (query block, key block) pairs were skipped.
template <bool kCausal, bool kLocal, int kHeadDim>
int check_query_blocks_mode() {
  constexpr int M = BwdSm90Config<kHeadDim>::kBlockM, N = BwdSm90Config<kHeadDim>::kBlockN;
  const int lengths[] = {1, 7, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 300, 385};
  const int windows[] = {-1, 0, 1, 5, 37, 127, 128, 129, 200, 1000};
  long pairs = 0, skipped = 0, masked = 0;
  int bad = 0;
  for (int sq : lengths)
    for (int sk : lengths)
      for (int wl : windows)
        for (int wr : windows)
          for (int align = 0; align < 2; ++align) {
            if (!kLocal && (wl != -1 || wr != -1)) continue;
            const int offset = causal_diag_offset(align == 1, sq, sk);
            const KeyWindow w = key_window<kCausal, kLocal>(offset, wl, wr);
            auto visible = [&](int i, int j) {
              return j < sk && (w.left < 0 || j >= i + offset - w.left) && (w.right < 0 || j <= i + offset + w.right);
            };
            for (int nb = 0; nb * N < sk; ++nb) {
              const QueryBlocks<kCausal, kLocal, M, N> blocks(nb, sq, sk, w.offset, w.left, w.right);
              for (int mb = 0; mb * M < sq; ++mb) {
                bool any = false, all = true;
                for (int i = mb * M; i < std::min(mb * M + M, sq); ++i)
                  for (int j = nb * N; j < nb * N + N; ++j) {
                    const bool v = visible(i, j);
                    any = any || v;
                    all = all && v;
                  }
                const bool visited = mb >= blocks.begin && mb < blocks.end;
                const bool mask = visited && blocks.needs_mask(mb);
                ++pairs;
                skipped += !visited;
                masked += mask;
                if (visited != any || (visited && mask == all)) {
                  if (bad++ < 5)
                    std::printf("QueryBlocks<%d,%d> %d x %d Sq=%d Sk=%d window (%d, %d) %s key block %d query "
                                "block %d: visited %d (a row sees a key %d), masked %d (every pair visible %d)\n",
                                kCausal, kLocal, M, N, sq, sk, wl, wr, align ? "bottom-right" : "top-left", nb, mb,
                                visited, any, mask, all);
                }
              }
            }
          }
  std::printf("%s: QueryBlocks<causal %d, local %d> %d x %d: %ld (query block, key block) pairs, %ld skipped, %ld "
              "masked, %d wrong\n",
              bad ? "WRONG" : "ok", kCausal, kLocal, M, N, pairs, skipped, masked, bad);
  return bad ? 1 : 0;
}

// Both tile shapes: 128 x 128 (d = 64) and 64 x 128 (d = 128).
template <int kHeadDim>
int check_query_blocks_of() {
  const int a = check_query_blocks_mode<false, false, kHeadDim>();
  const int b = check_query_blocks_mode<true, false, kHeadDim>();
  const int c = check_query_blocks_mode<false, true, kHeadDim>();
  return a | b | c;
}

using bf16 = __nv_bfloat16;
using f16 = __half;

// Sizes 1, 63, 65, 127, 129, 257, Sq < Sk and Sq > Sk, GQA, batch > 1, both K/V layouts,
// both causal alignments (top-left with Sk > Sq leaves key blocks no row sees: dK = dV = 0).
const selftest::NamedCases kCases = {
    {"bf16_d64", [] { return run<bf16, 64, false>({{1, 1, 1, 1, 1, false}, {1, 2, 1, 65, 257, true},
                                                    {1, 1, 1, 257, 63, false}}); }},
    {"bf16_d128", [] { return run<bf16, 128, false>({{1, 1, 1, 129, 127, false}, {2, 2, 2, 63, 65, true}}); }},
    {"f16_d64", [] { return run<f16, 64, false>({{1, 2, 2, 127, 129, true}}); }},
    {"f16_d128", [] { return run<f16, 128, false>({{1, 3, 1, 257, 129, false}}); }},
    {"bf16_d128_causal", [] { return run<bf16, 128, true>({{1, 1, 1, 257, 257, false}, {1, 2, 1, 65, 257, true},
                                                           {1, 1, 1, 257, 63, false}}); }},
    {"bf16_d64_causal", [] { return run<bf16, 64, true>({{1, 1, 1, 1, 129, false}, {1, 1, 1, 129, 127, true},
                                                         {1, 1, 1, 65, 257, false, true}}); }},
    {"f16_d64_causal", [] { return run<f16, 64, true>({{1, 2, 2, 127, 65, true}, {1, 1, 1, 63, 257, false, true}}); }},
    {"f16_d128_causal", [] { return run<f16, 128, true>({{1, 1, 1, 129, 129, false}, {1, 1, 1, 257, 127, false, true}}); }},
    // Deterministic dQ: one accumulator slice per key block, summed in order.
    {"bf16_d64_deterministic", [] { return run<bf16, 64, false>({{1, 2, 1, 129, 385, false}}, true); }},
    {"bf16_d128_causal_deterministic", [] { return run<bf16, 128, true>({{1, 1, 1, 257, 257, false}}, true); }},
    // The shared accumulator's dQ (not deterministic) for the same shape: its bits follow the
    // block order, which is what the deterministic slices remove.
    {"bf16_d64_shared_dq", [] { return run<bf16, 64, false>({{1, 2, 1, 129, 385, false}}); }},
    // Local windows (left, right): a sliding causal one (w, 0), both edges, one side each way,
    // (0, 0), a window wider than both sequences, rows without keys (Sq > Sk), top-left.
    {"bf16_d64_local", [] { return run<bf16, 64, false, true>({{1, 1, 1, 257, 257, false, false, 100, 0},
                                                               {1, 2, 1, 129, 300, true, false, 37, 50},
                                                               {1, 1, 1, 65, 257, false, false, -1, 10},
                                                               {1, 1, 1, 257, 63, false, false, 0, 0},
                                                               {1, 1, 1, 7, 129, false, true, 1000, 1000}}); }},
    {"f16_d128_local", [] { return run<f16, 128, false, true>({{1, 1, 1, 127, 257, false, false, 140, 3},
                                                               {1, 2, 2, 129, 65, true, true, 5, -1},
                                                               {1, 1, 1, 1, 1, false, false, 0, 0}}); }},
    // ALiBi (slopes [Hq] or [B, Hq]), causal or not, both alignments, GQA, awkward sizes.
    {"bf16_d64_alibi", [] { return run<bf16, 64, false, false, true>({{1, 2, 1, 65, 257, false},
                                                                      {2, 2, 2, 257, 63, true, true, -1, -1, true},
                                                                      {1, 1, 1, 1, 1, false}}); }},
    {"f16_d128_alibi", [] { return run<f16, 128, false, false, true>({{2, 3, 1, 129, 127, false, false, -1, -1, true},
                                                                      {1, 1, 1, 7, 129, true, true}}); }},
    {"bf16_d128_alibi_causal", [] { return run<bf16, 128, true, false, true>({{1, 2, 1, 257, 129, false},
                                                                              {2, 2, 2, 63, 257, true, true, -1, -1, true}}); }},
    {"f16_d64_alibi_causal", [] { return run<f16, 64, true, false, true>({{1, 1, 1, 129, 257, false, false, -1, -1, true},
                                                                          {1, 2, 1, 127, 65, true, true}}); }},
    {"bf16_d64_alibi_causal_deterministic", [] {
       return run<bf16, 64, true, false, true>({{1, 2, 1, 200, 385, false}}, true); }},
    // Softcap, with each mask (d = 64's P^T of 128 columns, d = 128's of 64).
    {"bf16_d128_softcap", [] { return run<bf16, 128, false, false, false, true>({{1, 2, 1, 129, 257, false},
                                                                                 {1, 1, 1, 1, 7, true}}); }},
    {"f16_d64_softcap", [] { return run<f16, 64, false, false, false, true>({{2, 2, 2, 257, 63, true, true}}); }},
    {"f16_d64_causal_softcap", [] { return run<f16, 64, true, false, false, true>({{1, 1, 1, 257, 127, true},
                                                                                   {1, 1, 1, 65, 65, false, true}}); }},
    {"bf16_d128_causal_softcap", [] { return run<bf16, 128, true, false, false, true>({{1, 3, 1, 127, 257, false}}); }},
    {"bf16_d64_local_softcap", [] { return run<bf16, 64, false, true, false, true>({{1, 1, 1, 200, 129, false, false, 20, 7}}); }},
    {"f16_d128_local_softcap", [] { return run<f16, 128, false, true, false, true>({{1, 1, 1, 65, 257, false, true, 3, 30}}); }},
    {"query_blocks", [] { return check_query_blocks_of<64>() | check_query_blocks_of<128>(); }},
    {"bad_arguments", [] { return check_bad_arguments(); }},
    // Not in the test matrix: the shim's counters of one 256 x 512 d = 128 head.
    {"counters_bf16_d128", [] {
       return selftest::printing_counters([] { return run<bf16, 128, false>({{1, 1, 1, 256, 512, false}}); });
     }},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
