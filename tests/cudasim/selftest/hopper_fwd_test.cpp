// The sm_90a attention forward (csrc/cuda/hopper/) on the shim, against a float64 reference.
//   hopper_fwd_test CASE
// Each case runs a few shapes of one configuration (element type, head dim, causal). Inputs are
// random and non-zero (fixed seeds); O and the LSE are poisoned (NaN) before the launch, and a
// guard after O must stay untouched. The tolerance is the FlashAttention rule: O's largest error
// against float64 at most 2x (+1e-5) the largest error of the same attention computed the way
// PyTorch computes it in the 16-bit type (scores, P and O rounded to it; the "emulated" column);
// the LSE within 1e-4 (+1e-5 relative) of float64.
// Exit status: 0 = within tolerance, 1 = not (printed), 2 = setup error, 3 = SimError.
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

using flashattn::hopper::FwdSm90Config;
using flashattn::hopper::FwdSm90Input;
using flashattn::hopper::FwdSm90Maps;
using flashattn::hopper::FwdSm90Params;
using selftest::bits_of;
using selftest::random_tensor;
using selftest::round_to;
using selftest::Tensor;
using selftest::value_of;

// Small enough that tanh bends the logits of these inputs (|scale * s| reaches ~2).
constexpr double kSoftcapValue = 0.75;

struct Shape {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool kv_heads_outer;  // K, V as [B, Hkv, Sk, D] (else [B, Sk, Hkv, D], like Q)
  bool top_left = false;  // causal / local: SDPA's top-left alignment (else FA2's bottom-right)
  int window_left = -1, window_right = -1;  // local cases only
  bool no_counter = false;  // launch without a tile counter: must fail exactly when the walk needs one
};

template <typename Elem, int kHeadDim, bool kCausal, bool kSoftcap, bool kLocal, bool kAlibi>
int run_shape(const Shape& sh, unsigned seed) {
  constexpr int D = kHeadDim;
  std::mt19937 rng(seed);
  const Tensor q = random_tensor<Elem>(rng, sh.batch, sh.seqlen_q, sh.heads_q, D, false);
  const Tensor k = random_tensor<Elem>(rng, sh.batch, sh.seqlen_k, sh.heads_kv, D, sh.kv_heads_outer);
  const Tensor v = random_tensor<Elem>(rng, sh.batch, sh.seqlen_k, sh.heads_kv, D, sh.kv_heads_outer);
  const size_t o_elems = static_cast<size_t>(sh.batch) * sh.seqlen_q * sh.heads_q * D;
  constexpr int kGuard = 64;
  std::vector<uint16_t> o(o_elems + kGuard, 0xFFFF);  // NaN in both types
  std::vector<float> lse(static_cast<size_t>(sh.batch) * sh.heads_q * sh.seqlen_q + kGuard, NAN);

  FwdSm90Maps maps;
  using Cfg = FwdSm90Config<D>;
  const auto dtype = std::is_same_v<Elem, __nv_bfloat16> ? flashattn::TensorMapDtype::BFloat16
                                                         : flashattn::TensorMapDtype::Float16;
  FwdSm90Input o_in;  // [B, Sq, Hq, D], dense
  o_in.ptr = o.data(), o_in.seqlen = sh.seqlen_q, o_in.heads = sh.heads_q;
  o_in.batch_stride = static_cast<int64_t>(sh.seqlen_q) * sh.heads_q * D;
  o_in.row_stride = static_cast<int64_t>(sh.heads_q) * D;
  o_in.head_stride = D;
  const std::string error = flashattn::hopper::make_fwd_sm90_maps(
      maps, dtype, D, sh.batch, q.view(), k.view(), v.view(), o_in, Cfg::kBlockM, Cfg::kBlockN);
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
  p.window_left = sh.window_left, p.window_right = sh.window_right;
  // ALiBi slopes [B, Hq], different per batch and head.
  std::vector<float> slopes(static_cast<size_t>(sh.batch) * sh.heads_q);
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads_q; ++h) slopes[static_cast<size_t>(b) * sh.heads_q + h] = 0.02f + 0.05f * h + 0.03f * b;
  p.alibi_slopes = kAlibi ? slopes.data() : nullptr;
  p.alibi_batch_stride = sh.heads_q;
  const int diag_offset = sh.top_left ? 0 : sh.seqlen_k - sh.seqlen_q;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  const double cap = kSoftcap ? kSoftcapValue : 0.0;
  p.softcap = static_cast<float>(cap);
  p.scale_over_softcap = kSoftcap ? static_cast<float>(scale / cap) : 0.f;
  p.scale = static_cast<float>(scale);
  // The logit of a raw score: exact, and rounded as PyTorch computes it in the 16-bit type.
  auto logit = [&](double dot) { return kSoftcap ? cap * std::tanh(dot * scale / cap) : dot * scale; };
  auto logit_16 = [&](float dot) {
    const double x = round_to<Elem>(round_to<Elem>(dot) * scale);
    return kSoftcap ? round_to<Elem>(cap * round_to<Elem>(std::tanh(round_to<Elem>(x / cap)))) : x;
  };
  // The walking kernels' place counter, poisoned: the launch zeroes it where the tiles outnumber
  // the SMs, and a grid covering every tile gets none, as the executor gives it (executor.h).
  // Every other kernel ignores it.
  constexpr bool kWalks = flashattn::hopper::fwd_sm90_walks(D, kLocal, kSoftcap, kAlibi, false, false, false, false);
  const dim3 grid = flashattn::hopper::fwd_sm90_grid<D>(p);
  const unsigned tiles = grid.x * grid.y * grid.z;
  const int sms = flashattn::hopper::fwd_sm90_sm_count();
  const bool counts = kWalks && flashattn::hopper::fwd_sm90_walk_counts(tiles, sms);
  unsigned tile_counter = 0xdeadbeefu;
  p.tile_counter = (!kWalks || counts) && !sh.no_counter ? &tile_counter : nullptr;
  const std::string launch = flashattn::hopper::launch_fwd_sm90<Elem, D, kCausal, kSoftcap, kLocal, kAlibi>(maps, p, nullptr);
  if (sh.no_counter && counts) {
    const bool said = launch.find("walking kernel of " + std::to_string(tiles) + " tiles on " + std::to_string(sms) +
                                  " SMs needs FwdSm90Params::tile_counter") != std::string::npos;
    std::printf("%s %u tiles on %d SMs without a tile counter: '%s'\n", said ? "ok:" : "WRONG:", tiles, sms,
                launch.c_str());
    return said ? 0 : 1;
  }
  if (!launch.empty()) {
    std::printf("launch: %s\n", launch.c_str());
    return 2;
  }
  // Every CTA's first tile is its place (no atomic); each later one takes one atomicAdd, and
  // so does each CTA's last look: `tiles` adds in all, none when the grid covers every tile.
  const unsigned counter_expected = counts ? tiles : 0xdeadbeefu;
  const bool counter_ok = tile_counter == counter_expected;

  // float64 reference and the 16-bit emulation, row by row.
  double err = 0, err_emulated = 0, lse_err = 0;
  int lse_bad = 0, nonfinite = 0;
  std::vector<double> s(sh.seqlen_k), s_emulated(sh.seqlen_k);
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads_q; ++h) {
      const int hk = h / (sh.heads_q / sh.heads_kv);
      for (int i = 0; i < sh.seqlen_q; ++i) {
        double mx = -INFINITY, mx_e = -INFINITY;
        for (int j = 0; j < sh.seqlen_k; ++j) {
          const bool visible =
              (!kCausal || j <= i + diag_offset) &&
              (!kLocal || ((sh.window_left < 0 || j >= i + diag_offset - sh.window_left) &&
                           (sh.window_right < 0 || j <= i + diag_offset + sh.window_right)));
          double dot = 0;
          float dot_f = 0;
          for (int d = 0; d < D; ++d) {
            const double x = value_of<Elem>(q.bits[q.index(b, i, h, d)]) * value_of<Elem>(k.bits[k.index(b, j, hk, d)]);
            dot += x;
            dot_f += static_cast<float>(x);
          }
          const int dist = std::abs(i + diag_offset - j);
          const double bias = kAlibi ? -static_cast<double>(slopes[static_cast<size_t>(b) * sh.heads_q + h]) * dist : 0.0;
          s[j] = visible ? logit(dot) + bias : -INFINITY;
          s_emulated[j] = visible ? round_to<Elem>(logit_16(dot_f) + bias) : -INFINITY;
          mx = std::max(mx, s[j]);
          mx_e = std::max(mx_e, s_emulated[j]);
        }
        double l = 0, l_e = 0;
        for (int j = 0; j < sh.seqlen_k; ++j) {
          s[j] = mx == -INFINITY ? 0 : std::exp(s[j] - mx);
          s_emulated[j] = mx_e == -INFINITY ? 0 : std::exp(s_emulated[j] - mx_e);
          l += s[j];
          l_e += s_emulated[j];
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          float acc_e = 0;
          for (int j = 0; j < sh.seqlen_k; ++j) {
            const double vj = value_of<Elem>(v.bits[v.index(b, j, hk, d)]);
            if (l > 0) acc += s[j] / l * vj;
            if (l_e > 0) acc_e += static_cast<float>(round_to<Elem>(s_emulated[j] / l_e) * vj);
          }
          const double got = value_of<Elem>(o[(static_cast<size_t>(b * sh.seqlen_q + i) * sh.heads_q + h) * D + d]);
          if (!std::isfinite(got)) ++nonfinite;
          err = std::max(err, std::fabs(got - acc));
          err_emulated = std::max(err_emulated, std::fabs(round_to<Elem>(acc_e) - acc));
        }
        const double lse_ref = l > 0 ? mx + std::log(l) : -INFINITY;
        const double lse_got = lse[(static_cast<size_t>(b) * sh.heads_q + h) * sh.seqlen_q + i];
        const double diff = lse_ref == -INFINITY ? (lse_got == -INFINITY ? 0 : INFINITY) : std::fabs(lse_got - lse_ref);
        if (!(diff <= 1e-4 + 1e-5 * std::fabs(lse_ref))) ++lse_bad;
        if (std::isfinite(diff)) lse_err = std::max(lse_err, diff);
        else lse_err = INFINITY;
      }
    }
  int guard = 0;
  for (int i = 0; i < kGuard; ++i) guard += o[o_elems + i] != 0xFFFF;
  for (int i = 0; i < kGuard; ++i) guard += !std::isnan(lse[lse.size() - kGuard + i]);
  const bool ok = nonfinite == 0 && err <= 2 * err_emulated + 1e-5 && lse_bad == 0 && guard == 0 && counter_ok;
  std::string tags = sh.kv_heads_outer ? " kv[B,H,S,D]" : "";
  if ((kCausal || kLocal) && sh.top_left) tags += " top-left";
  if (kLocal) tags += " window (" + std::to_string(sh.window_left) + ", " + std::to_string(sh.window_right) + ")";
  if (kWalks)
    tags += " walk: " + std::to_string(tiles) + " tiles on " + std::to_string(sms) + " SMs, counter " +
            (counts ? std::to_string(tile_counter) + " (expected " + std::to_string(counter_expected) + ")"
                    : std::string(counter_ok ? "untouched" : "TOUCHED"));
  std::printf("%s B=%d Hq=%d Hkv=%d Sq=%d Sk=%d%s: O err %.3g (emulated %.3g, ratio %.2f), LSE err %.3g "
              "(%d bad), %d non-finite, %d guard writes\n",
              ok ? "ok:" : "WRONG:", sh.batch, sh.heads_q, sh.heads_kv, sh.seqlen_q, sh.seqlen_k,
              tags.c_str(), err, err_emulated, err_emulated > 0 ? err / err_emulated : 0.0, lse_err,
              lse_bad, nonfinite, guard);
  return ok ? 0 : 1;
}

template <typename Elem, int kHeadDim, bool kCausal, bool kSoftcap = false, bool kLocal = false,
          bool kAlibi = false>
int run(std::vector<Shape> shapes) {
  int status = 0;
  unsigned seed = 1;
  for (const Shape& sh : shapes) {
    const int rc = run_shape<Elem, kHeadDim, kCausal, kSoftcap, kLocal, kAlibi>(sh, seed++);
    if (rc != 0) status = rc;
  }
  return status;
}

// KeyTiles (fwd_sm90_mask.cuh) against brute force, on the host: for every query tile of many
// lengths, windows and both alignments, every tile holding a key some row sees is visited,
// and every visit the main loop takes unmasked is a whole tile every row sees. Split-KV: the
// parts (keep_part) of 2, 3 and 5 visit exactly the unsplit tiles between them, each once, and
// each part's unmasked visits are whole tiles too.
template <bool kCausal, bool kLocal, int kHeadDim>
int check_key_tiles_mode() {
  using flashattn::hopper::KeyTiles;
  constexpr int M = FwdSm90Config<kHeadDim>::kBlockM, N = FwdSm90Config<kHeadDim>::kBlockN;
  const int lengths[] = {1, 7, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 300, 385};
  const int windows[] = {-1, 0, 1, 5, 37, 127, 128, 129, 200};
  const int part_counts[] = {1, 2, 3, 5};
  int bad = 0, checked = 0;
  for (int sq : lengths)
    for (int sk : lengths)
      for (int wl : windows)
        for (int wr : windows)
          for (int align = 0; align < 2; ++align) {
            if (!kLocal && (wl != -1 || wr != -1)) continue;
            const int offset = flashattn::hopper::causal_diag_offset(align == 1, sq, sk);
            const auto w = flashattn::hopper::key_window<kCausal, kLocal>(offset, wl, wr);
            for (int mb = 0; mb * M < sq; ++mb) {
              const KeyTiles<kCausal, kLocal, M, N> all(mb, sq, sk, w);
              const int row_end = std::min(mb * M + M, sq);
              for (int n = 0; n * N < sk; ++n) {
                bool any = false, whole = n * N + N <= sk;
                for (int i = mb * M; i < row_end; ++i) {
                  const int first = w.left >= 0 ? std::max(0, i + offset - w.left) : 0;
                  const int last = std::min(sk - 1, w.right >= 0 ? i + offset + w.right : sk - 1);
                  any = any || (first <= last && first <= n * N + N - 1 && last >= n * N);
                  whole = whole && first <= n * N && last >= n * N + N - 1;
                }
                const bool unsplit_visits = all.n_end - 1 - n >= 0 && all.n_end - 1 - n < all.n_blocks;
                for (int parts : part_counts) {
                  int visits = 0;
                  bool open_not_whole = false;
                  for (int part = 0; part < parts; ++part) {
                    KeyTiles<kCausal, kLocal, M, N> t = all;
                    if (parts > 1) t.keep_part(part, parts);
                    const int it = t.n_end - 1 - n;
                    const bool visited = it >= 0 && it < t.n_blocks;
                    const bool open = visited && it >= t.n_masked && it < t.n_open_end;
                    visits += visited ? 1 : 0;
                    open_not_whole = open_not_whole || (open && !whole);
                  }
                  ++checked;
                  if ((any && visits == 0) || visits != (unsplit_visits ? 1 : 0) || open_not_whole) {
                    if (bad++ < 5)
                      std::printf("KeyTiles<%d,%d> Sq=%d Sk=%d window (%d, %d) %s m_block %d tile %d, %d "
                                  "parts: visited %d times (unsplit %d), unmasked but not whole %d; a "
                                  "row sees a key %d, every row sees it whole %d\n",
                                  kCausal, kLocal, sq, sk, wl, wr, align ? "bottom-right" : "top-left", mb,
                                  n, parts, visits, unsplit_visits, open_not_whole, any, whole);
                  }
                }
              }
            }
          }
  std::printf("%s: KeyTiles<causal %d, local %d> %d x %d: %d (query tile, key tile, parts) checked, %d wrong\n",
              bad ? "WRONG" : "ok", kCausal, kLocal, M, N, checked, bad);
  return bad ? 1 : 0;
}

// Each distinct tile shape: 128 x 128 (d = 64, 128) and 128 x 64 (d = 256).
template <int kHeadDim>
int check_key_tiles_of() {
  const int a = check_key_tiles_mode<false, false, kHeadDim>();
  const int b = check_key_tiles_mode<true, false, kHeadDim>();
  const int c = check_key_tiles_mode<false, true, kHeadDim>();
  return a | b | c;
}

int check_key_tiles() { return check_key_tiles_of<64>() | check_key_tiles_of<256>(); }

using bf16 = __nv_bfloat16;
using f16 = __half;

// Sizes 1, 7, 63, 65, 127, 129, 257, Sq < Sk and Sq > Sk, GQA, batch > 1, both K/V layouts.
// Each d = 256 main loop (launch_fwd_sm90_features) has a case.
// The shim costs ~0.3 ms per m64n128k16, so each case stays at a few hundred wgmmas.
const selftest::NamedCases kCases = {
    {"bf16_d64", [] { return run<bf16, 64, false>({{1, 1, 1, 1, 1, false}, {2, 2, 1, 7, 129, true},
                                                    {1, 1, 1, 257, 63, false}}); }},
    {"bf16_d128", [] { return run<bf16, 128, false>({{1, 2, 2, 65, 127, true}, {1, 1, 1, 129, 257, false}}); }},
    {"f16_d64", [] { return run<f16, 64, false>({{1, 3, 1, 63, 65, false}, {2, 1, 1, 129, 7, true}}); }},
    {"f16_d128", [] { return run<f16, 128, false>({{1, 1, 1, 127, 129, false}}); }},
    {"bf16_d128_causal", [] { return run<bf16, 128, true>({{1, 1, 1, 257, 257, false}, {1, 2, 1, 65, 257, true},
                                                           {1, 1, 1, 257, 63, false}}); }},
    {"bf16_d64_causal", [] { return run<bf16, 64, true>({{1, 1, 1, 1, 129, false}, {2, 1, 1, 7, 7, false},
                                                         {1, 1, 1, 129, 127, true},
                                                         // heaviest first across query blocks
                                                         // of six (batch, head)s
                                                         {2, 3, 1, 200, 200, false}}); }},
    {"f16_d64_causal", [] { return run<f16, 64, true>({{1, 2, 2, 127, 65, true}, {1, 1, 1, 63, 257, false}}); }},
    {"f16_d128_causal", [] { return run<f16, 128, true>({{1, 1, 1, 129, 129, false}}); }},
    {"bf16_d128_softcap", [] { return run<bf16, 128, false, true>({{1, 2, 1, 129, 257, false}}); }},
    {"f16_d64_causal_softcap", [] { return run<f16, 64, true, true>({{1, 1, 1, 257, 127, true}, {1, 1, 1, 63, 65, false}}); }},
    // Local windows (left, right): a sliding causal one, both edges, one-sided each way, a
    // window that leaves rows without keys (Sq > Sk, bottom-right), top-left alignment.
    {"bf16_d64_local", [] { return run<bf16, 64, false, false, true>({{1, 1, 1, 257, 257, false, false, 100, 0},
                                                                      {1, 2, 1, 129, 300, true, false, 37, 50},
                                                                      {1, 1, 1, 300, 129, false, true, 0, -1},
                                                                      {1, 1, 1, 65, 257, false, false, -1, 10},
                                                                      {1, 1, 1, 257, 63, false, false, 5, 5}}); }},
    {"f16_d128_local", [] { return run<f16, 128, false, false, true>({{1, 1, 1, 129, 385, false, false, 140, 3},
                                                                      {2, 1, 1, 7, 200, true, true, 2, 130}}); }},
    {"key_tiles", [] { return check_key_tiles(); }},
    {"bf16_d128_alibi", [] { return run<bf16, 128, false, false, false, true>({{2, 2, 1, 129, 257, false}}); }},
    {"f16_d64_causal_alibi", [] { return run<f16, 64, true, false, false, true>({{1, 2, 2, 257, 127, true},
                                                                                 {1, 1, 1, 65, 65, false, true}}); }},
    // d = 256: 128 x 64 tiles, two key tiles per query tile's width.
    {"bf16_d256", [] { return run<bf16, 256, false>({{1, 1, 1, 65, 257, false}, {2, 2, 1, 7, 63, true},
                                                     {1, 1, 1, 129, 1, false}}); }},
    {"f16_d256_causal", [] { return run<f16, 256, true>({{1, 1, 1, 257, 127, false}, {1, 2, 1, 63, 129, true},
                                                         {1, 1, 1, 129, 129, false, true}}); }},
    {"bf16_d256_local", [] { return run<bf16, 256, false, false, true>({{1, 1, 1, 257, 257, false, false, 100, 0},
                                                                        {1, 1, 1, 129, 300, true, false, 37, 90},
                                                                        {1, 1, 1, 65, 7, false, true, 0, -1}}); }},
    {"f16_d256_softcap", [] { return run<f16, 256, false, true>({{1, 2, 1, 127, 161, false}}); }},
    {"bf16_d256_causal_softcap", [] { return run<bf16, 256, true, true>({{1, 1, 1, 161, 65, true}}); }},
    {"bf16_d256_alibi", [] { return run<bf16, 256, false, false, false, true>({{2, 1, 1, 63, 129, false}}); }},
    {"f16_d256_causal_alibi", [] { return run<f16, 256, true, false, false, true>({{1, 2, 2, 129, 65, true}}); }},
    {"bf16_d64_causal_top_left", [] { return run<bf16, 64, true>({{1, 1, 1, 65, 257, false, true},
                                                                  {1, 2, 1, 257, 63, true, true},
                                                                  {1, 1, 1, 129, 129, false, true}}); }},
    // The dynamic walk (fwd_sm90_walk.h: d = 64 no mask, causal, local; d = 128 no mask, causal),
    // run at 1, 2 and 3 SMs (CUDASIM_SM_COUNT) by test_walk_matches_float64: causal with keyless
    // first blocks between busy ones (Sq 385 > Sk 129, bottom-right), GQA top-left; local windows
    // (0, 0), whose first block sees no key, and (37, 50) at batch 2; d = 128 causal and no mask.
    // At 1 SM one CTA takes every tile, so the ring's stages wrap in the middle of tiles.
    {"walk_bf16_d64_causal", [] { return run<bf16, 64, true>({{2, 3, 1, 257, 257, false},
                                                              {1, 1, 1, 385, 129, false},
                                                              {1, 4, 2, 129, 257, false, true}}); }},
    {"walk_f16_d64_local", [] { return run<f16, 64, false, false, true>({{1, 1, 1, 385, 257, false, false, 0, 0},
                                                                         {2, 1, 1, 129, 300, true, false, 37, 50}}); }},
    {"walk_bf16_d128", [] { return run<bf16, 128, true>({{1, 2, 1, 257, 129, false},
                                                        {1, 1, 1, 129, 257, false, true}}) |
                                   run<bf16, 128, false>({{2, 1, 1, 385, 65, true}}); }},
    // The walk's grid against the SM count (CUDASIM_SM_COUNT): one tile per (batch, head), Sq 65
    // and 63 (one query block), so that the tiles are SMs - 1, SMs, SMs + 1 and 4 SMs + 3: a grid
    // covering every tile (no counter given, none read) and one whose CTAs take the places past
    // the grid's from the counter. Then the launch without a counter: it runs where the grid
    // covers the tiles, and says what it needs where not.
    {"walk_tiles_vs_sms", [] {
       const int sms = flashattn::hopper::fwd_sm90_sm_count();
       std::vector<Shape> causal, plain, no_counter;
       for (const int tiles : {sms - 1, sms, sms + 1, 4 * sms + 3}) {
         if (tiles < 1) continue;
         causal.push_back({1, tiles, 1, 65, 129, false});
         plain.push_back({tiles, 1, 1, 63, 7, true});
         Shape bare{1, tiles, 1, 7, 65, false};
         bare.no_counter = true;
         no_counter.push_back(bare);
       }
       return run<bf16, 64, true>(causal) | run<f16, 128, false>(plain) | run<bf16, 64, false>(no_counter);
     }},
    // Not in the test matrix: the shim's counters of one CTA-row of a 256 x 512 d = 128 head
    // (2 x 4 key tiles per CTA), for the lab notes and the performance model.
    {"counters_bf16_d128", [] {
       return selftest::printing_counters([] { return run<bf16, 128, false>({{1, 1, 1, 256, 512, false}}); });
     }},
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
