// The sm_90a FP8 (e4m3) forward, d = 128 (csrc/cuda/hopper/, V transposed by the producer) on
// the shim, against float64 attention on the dequantized inputs.
//   hopper_fp8_fwd_test CASE
// Inputs are random e4m3 codes (magnitudes 0.05-1.5 and either sign; fixed seeds), optionally
// with per (batch, kv head) descales. The kernel rounds P to e4m3 before P V (relative to the
// running row max of the key tiles it has visited, last tile first), so the reference does the
// same: O_ref = sum_j e4m3(exp(s_j - m_tile(j))) exp(m_tile(j) - m) v_j / l, with l the sum of the
// unrounded P. O (bf16) must be within 2x (+1e-5) of the error bf16 rounding makes on O_ref;
// against attention with P unrounded it must be within the bound e4m3 rounding of P allows
// (half an ulp of each P, 2^-10 for the subnormals, plus bf16's rounding). O and the LSE are
// poisoned (NaN) before the launch and a guard after each must stay untouched; the LSE within
// 1e-4 (+1e-5 relative) of float64.
// Exit status: 0 = within tolerance, 1 = not (printed), 2 = setup error, 3 = SimError.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bshd_host_tensor.h"
#include "cuda/hopper/fwd_sm90_launch.h"
#include "named_cases.h"

namespace {

using flashattn::hopper::FwdSm90ConfigOf;
using flashattn::hopper::FwdSm90Input;
using flashattn::hopper::FwdSm90Maps;
using flashattn::hopper::FwdSm90Params;
using selftest::value_of;

constexpr int D = 128;
using Fp8 = __nv_fp8_e4m3;
using Cfg = FwdSm90ConfigOf<Fp8, D>;
using bf16 = __nv_bfloat16;

uint8_t e4m3_bits(double x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(static_cast<float>(x), __NV_SATFINITE, __NV_E4M3));
}
// The exact value of an e4m3 code (no infinities; S.1111.111 is NaN).
double e4m3_value(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, mant = b & 7;
  if (exp == 15 && mant == 7) return NAN;
  const double mag = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10);
  return sign ? -mag : mag;
}
// x rounded as cvt.rn.satfinite.e4m3x2.f32 rounds the f32 P.
double e4m3_round(double x) { return e4m3_value(e4m3_bits(static_cast<float>(x))); }

// A [B, S, H, D] tensor of e4m3 codes.
struct Tensor8 {
  int batch, seqlen, heads;
  bool heads_outer;  // [B, H, S, D] in memory (else [B, S, H, D])
  std::vector<uint8_t> bits;
  size_t index(int b, int s, int h, int d) const {
    return heads_outer ? ((static_cast<size_t>(b) * heads + h) * seqlen + s) * D + d
                       : ((static_cast<size_t>(b) * seqlen + s) * heads + h) * D + d;
  }
  double at(int b, int s, int h, int d) const { return e4m3_value(bits[index(b, s, h, d)]); }
  FwdSm90Input view() const {
    FwdSm90Input t;
    t.ptr = bits.data();
    t.seqlen = seqlen, t.heads = heads;
    t.batch_stride = static_cast<int64_t>(seqlen) * heads * D;
    t.row_stride = heads_outer ? D : static_cast<int64_t>(heads) * D;
    t.head_stride = heads_outer ? static_cast<int64_t>(seqlen) * D : D;
    return t;
  }
};

Tensor8 random_tensor8(std::mt19937& rng, int b, int s, int h, bool heads_outer) {
  Tensor8 t{b, s, h, heads_outer, {}};
  t.bits.resize(static_cast<size_t>(b) * s * h * D);
  std::uniform_real_distribution<float> mag(0.05f, 1.5f);
  std::bernoulli_distribution sign(0.5);
  for (auto& x : t.bits) x = e4m3_bits(sign(rng) ? mag(rng) : -mag(rng));
  return t;
}

struct Shape {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool kv_heads_outer = false;  // K, V as [B, Hkv, Sk, D]
  bool top_left = false;        // causal: SDPA's top-left alignment (else FA2's bottom-right)
  bool descale = false;         // q/k/v_descale given, different per (batch, kv head)
  int seqused_k = -1;           // >= 0: every batch entry uses its first seqused_k keys; V's
                                // later rows are NaN codes (the producer must zero them)
  int seqused_q = -1;           // >= 0: every batch entry uses its first seqused_q queries (O
                                // written from registers, in bf16; later rows left alone)
};

template <bool kCausal>
int run_shape(const Shape& sh, unsigned seed) {
  std::mt19937 rng(seed);
  const Tensor8 q = random_tensor8(rng, sh.batch, sh.seqlen_q, sh.heads_q, false);
  const Tensor8 k = random_tensor8(rng, sh.batch, sh.seqlen_k, sh.heads_kv, sh.kv_heads_outer);
  Tensor8 v = random_tensor8(rng, sh.batch, sh.seqlen_k, sh.heads_kv, sh.kv_heads_outer);
  const int used_k = sh.seqused_k >= 0 ? std::min(sh.seqused_k, sh.seqlen_k) : sh.seqlen_k;
  for (int b = 0; b < sh.batch; ++b)
    for (int j = used_k; j < sh.seqlen_k; ++j)
      for (int h = 0; h < sh.heads_kv; ++h)
        for (int d = 0; d < D; ++d) v.bits[v.index(b, j, h, d)] = 0x7f;  // NaN
  const size_t o_elems = static_cast<size_t>(sh.batch) * sh.seqlen_q * sh.heads_q * D;
  constexpr int kGuard = 64;
  std::vector<uint16_t> o(o_elems + kGuard, 0xFFFF);  // bf16 NaN
  std::vector<float> lse(static_cast<size_t>(sh.batch) * sh.heads_q * sh.seqlen_q + kGuard, NAN);
  std::vector<int> seqused(sh.batch, used_k);
  const int used_q = sh.seqused_q >= 0 ? std::min(sh.seqused_q, sh.seqlen_q) : sh.seqlen_q;
  std::vector<int> seqused_q(sh.batch, used_q);
  // Descales [B, Hkv]: q, k, v each its own, powers of two apart from 1 and not.
  std::vector<float> descale[3];
  for (int x = 0; x < 3; ++x) {
    descale[x].resize(static_cast<size_t>(sh.batch) * sh.heads_kv);
    for (size_t i = 0; i < descale[x].size(); ++i) descale[x][i] = 0.5f + 0.37f * static_cast<float>((i + x) % 4);
  }
  auto descale_of = [&](int x, int b, int hk) {
    return sh.descale ? static_cast<double>(descale[x][static_cast<size_t>(b) * sh.heads_kv + hk]) : 1.0;
  };

  FwdSm90Maps maps;
  FwdSm90Input o_in;  // [B, Sq, Hq, D], dense
  o_in.ptr = o.data(), o_in.seqlen = sh.seqlen_q, o_in.heads = sh.heads_q;
  o_in.batch_stride = static_cast<int64_t>(sh.seqlen_q) * sh.heads_q * D;
  o_in.row_stride = static_cast<int64_t>(sh.heads_q) * D;
  o_in.head_stride = D;
  const std::string error = flashattn::hopper::make_fwd_sm90_maps(
      maps, flashattn::TensorMapDtype::UInt8, D, sh.batch, q.view(), k.view(), v.view(), o_in, Cfg::kBlockM,
      Cfg::kBlockN, 1, flashattn::TensorMapDtype::BFloat16);
  if (!error.empty()) {
    std::printf("tensor maps: %s\n", error.c_str());
    return 2;
  }
  FwdSm90Params p;
  p.lse = lse.data();
  p.lse_batch_stride = static_cast<int64_t>(sh.heads_q) * sh.seqlen_q;
  p.lse_head_stride = sh.seqlen_q;
  p.batch = sh.batch, p.seqlen_q = sh.seqlen_q, p.seqlen_k = sh.seqlen_k;
  p.heads_q = sh.heads_q, p.head_group = sh.heads_q / sh.heads_kv;
  p.align_bottom_right = !sh.top_left;
  p.seqused_k = sh.seqused_k >= 0 ? seqused.data() : nullptr;
  p.seqused_q = sh.seqused_q >= 0 ? seqused_q.data() : nullptr;
  // O itself, for the rows written from registers (seqused_q).
  p.o = o.data();
  p.o_batch_stride = o_in.batch_stride, p.o_row_stride = o_in.row_stride, p.o_head_stride = o_in.head_stride;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.scale = static_cast<float>(scale);
  if (sh.descale) {
    p.q_descale = descale[0].data(), p.k_descale = descale[1].data(), p.v_descale = descale[2].data();
    p.q_descale_batch_stride = p.k_descale_batch_stride = p.v_descale_batch_stride = sh.heads_kv;
  }
  const std::string launch = flashattn::hopper::launch_fwd_sm90<Fp8, D, kCausal>(maps, p, nullptr);
  if (!launch.empty()) {
    std::printf("launch: %s\n", launch.c_str());
    return 2;
  }

  const int diag_offset = sh.top_left ? 0 : used_k - used_q;
  double err = 0, err_rounding = 0, lse_err = 0, excess_unrounded = 0;
  int lse_bad = 0, nonfinite = 0, past_used = 0;
  std::vector<double> s(used_k), p_q(used_k), p_exact(used_k);
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads_q; ++h) {
      const int hk = h / (sh.heads_q / sh.heads_kv);
      const double qk_scale = scale * descale_of(0, b, hk) * descale_of(1, b, hk), vd = descale_of(2, b, hk);
      for (int i = 0; i < sh.seqlen_q; ++i) {
        if (i >= used_q) {  // past seqused_q: O and the LSE untouched (still the poison)
          for (int d = 0; d < D; ++d)
            past_used += o[(static_cast<size_t>(b * sh.seqlen_q + i) * sh.heads_q + h) * D + d] != 0xFFFF;
          past_used += !std::isnan(lse[(static_cast<size_t>(b) * sh.heads_q + h) * sh.seqlen_q + i]);
          continue;
        }
        for (int j = 0; j < used_k; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q.at(b, i, h, d) * k.at(b, j, hk, d);
          s[j] = !kCausal || j <= i + diag_offset ? dot * qk_scale : -INFINITY;
        }
        // The kernel's running max over the key tiles it visited, last tile first.
        const int n_tiles = (used_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
        double m = -INFINITY;
        std::vector<double> m_tile(n_tiles);
        for (int n = n_tiles - 1; n >= 0; --n) {
          for (int j = n * Cfg::kBlockN; j < std::min(used_k, (n + 1) * Cfg::kBlockN); ++j) m = std::max(m, s[j]);
          m_tile[n] = m;
        }
        double l = 0;
        for (int j = 0; j < used_k; ++j) {
          const double mt = m_tile[j / Cfg::kBlockN];
          p_exact[j] = m == -INFINITY ? 0 : std::exp(s[j] - m);
          p_q[j] = mt == -INFINITY ? 0 : e4m3_round(std::exp(s[j] - mt)) * std::exp(mt - m);
          l += p_exact[j];
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0, acc_exact = 0, bound = 0;
          for (int j = 0; j < used_k; ++j) {
            const double vj = v.at(b, j, hk, d);
            acc += p_q[j] * vj;
            acc_exact += p_exact[j] * vj;
            const double mt = m_tile[j / Cfg::kBlockN];
            if (mt != -INFINITY)  // e4m3's half ulp of P relative to the tile's max, 2^-10 at least
              bound += std::max(std::ldexp(p_exact[j] * std::exp(m - mt), -4), std::ldexp(1.0, -10)) *
                       std::exp(mt - m) * std::fabs(vj);
          }
          const double want = l > 0 ? acc / l * vd : 0, want_exact = l > 0 ? acc_exact / l * vd : 0;
          bound = l > 0 ? bound / l * vd : 0;
          const double got = value_of<bf16>(o[(static_cast<size_t>(b * sh.seqlen_q + i) * sh.heads_q + h) * D + d]);
          if (!std::isfinite(got)) ++nonfinite;
          err = std::max(err, std::fabs(got - want));
          err_rounding = std::max(err_rounding, std::fabs(selftest::round_to<bf16>(want) - want));
          const double loose = bound + std::ldexp(std::fabs(want_exact), -8) + 1e-5;
          excess_unrounded = std::max(excess_unrounded, std::fabs(got - want_exact) / loose);
        }
        const double lse_ref = l > 0 ? m + std::log(l) : -INFINITY;
        const double lse_got = lse[(static_cast<size_t>(b) * sh.heads_q + h) * sh.seqlen_q + i];
        const double diff = lse_ref == -INFINITY ? (lse_got == -INFINITY ? 0 : INFINITY) : std::fabs(lse_got - lse_ref);
        if (!(diff <= 1e-4 + 1e-5 * std::fabs(lse_ref))) ++lse_bad;
        lse_err = std::isfinite(diff) ? std::max(lse_err, diff) : INFINITY;
      }
    }
  int guard = 0;
  for (int i = 0; i < kGuard; ++i) guard += o[o_elems + i] != 0xFFFF;
  for (int i = 0; i < kGuard; ++i) guard += !std::isnan(lse[lse.size() - kGuard + i]);
  const bool ok = nonfinite == 0 && err <= 2 * err_rounding + 1e-5 && excess_unrounded <= 1 && lse_bad == 0 &&
                  guard == 0 && past_used == 0;
  std::string tags = sh.kv_heads_outer ? " kv[B,H,S,D]" : "";
  if (kCausal) tags += sh.top_left ? " causal top-left" : " causal";
  if (sh.descale) tags += " descale";
  if (sh.seqused_k >= 0) tags += " seqused_k=" + std::to_string(sh.seqused_k);
  if (sh.seqused_q >= 0) tags += " seqused_q=" + std::to_string(sh.seqused_q);
  std::printf("%s B=%d Hq=%d Hkv=%d Sq=%d Sk=%d%s: O err %.3g (bf16 rounding %.3g, ratio %.2f), "
              "vs unrounded P %.2f of its bound, LSE err %.3g (%d bad), %d non-finite, %d guard writes, "
              "%d writes past seqused_q\n",
              ok ? "ok:" : "WRONG:", sh.batch, sh.heads_q, sh.heads_kv, sh.seqlen_q, sh.seqlen_k, tags.c_str(), err,
              err_rounding, err_rounding > 0 ? err / err_rounding : 0.0, excess_unrounded, lse_err, lse_bad,
              nonfinite, guard, past_used);
  return ok ? 0 : 1;
}

template <bool kCausal>
int run(std::vector<Shape> shapes) {
  int status = 0;
  unsigned seed = 1;
  for (const Shape& sh : shapes) {
    const int rc = run_shape<kCausal>(sh, seed++);
    if (rc != 0) status = rc;
  }
  return status;
}

// Sizes 1, 7, 63, 65, 127, 129, 257, Sq < Sk and Sq > Sk, GQA, batch > 1, both K/V layouts,
// descales, a tail of NaN V rows past seqused_k, seqused_q (O stored from registers). The shim
// costs ~0.15 ms per m64n128k32.
const selftest::NamedCases kCases = {
    {"e4m3_d128", [] { return run<false>({{1, 1, 1, 1, 1}, {2, 2, 1, 7, 129, true},
                                          {1, 1, 1, 257, 63, false, false, true}}); }},
    {"e4m3_d128_sizes", [] { return run<false>({{1, 3, 1, 63, 65}, {1, 2, 2, 127, 257, true, false, true},
                                                {2, 1, 1, 129, 7}}); }},
    {"e4m3_d128_causal", [] { return run<true>({{1, 1, 1, 257, 257}, {1, 2, 1, 65, 257, true, false, true},
                                                {1, 1, 1, 257, 63}, {2, 1, 1, 7, 7}}); }},
    {"e4m3_d128_causal_top_left", [] { return run<true>({{1, 1, 1, 65, 257, false, true},
                                                         {1, 2, 1, 129, 127, true, true, true}}); }},
    {"e4m3_d128_seqused_k", [] { return run<false>({{2, 2, 1, 65, 200, false, false, true, 150},
                                                    {1, 1, 1, 129, 257, true, false, false, 129}}); }},
    {"e4m3_d128_causal_seqused_k", [] { return run<true>({{1, 2, 2, 129, 300, false, false, false, 190}}); }},
    // O from registers in bf16 (clip_o_rows), rows past seqused_q left alone.
    {"e4m3_d128_seqused_q", [] { return run<false>({{2, 2, 1, 257, 129, false, false, true, -1, 100}}); }},
    {"e4m3_d128_causal_seqused_q", [] { return run<true>({{1, 1, 1, 200, 257, true, false, false, 190, 65}}); }},
    // Not in the test matrix: the shim's counters of one CTA-row of a 256 x 512 head (2 x 4 key
    // tiles per CTA), as hopper_fwd_test's counters_bf16_d128, for the lab note.
    {"counters_e4m3_d128", [] {
       return selftest::printing_counters([] { return run<false>({{1, 1, 1, 256, 512}}); });
     }},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
