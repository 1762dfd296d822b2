// The sm_90a forward's gathering producer (csrc/cuda/hopper/fwd_sm90_gather.cuh) on the shim:
// the same keys, once in a dense [B, S, Hkv, D] cache read by TMA (the kernel the other tests
// check against float64) and once in a paged cache behind a shuffled block table, or in another
// batch entry of a bigger cache after a left pad (cache_batch_idx, cache_leftpad), must give the
// same bits of O and the LSE: the same tiles in the same order, only the row addresses differ.
// Rows past each sequence hold NaN in both caches (a cache's unwritten rows), and O is poisoned.
//   hopper_paged_test CASE       CASE = <dtype>_d<D>_<mask>_<layout>, e.g. bf16_d128_causal_page16
// Exit status: 0 = the same bits, 1 = not (printed), 2 = setup error, 3 = SimError.
// Built with -DHOPPER_PAGED_ONE_CONFIG it holds bf16_d128_causal_* only (the planted-bug builds).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/hopper/fwd_sm90_launch.h"
#include "named_cases.h"

namespace {

using flashattn::hopper::FwdSm90Config;
using flashattn::hopper::FwdSm90Input;
using flashattn::hopper::FwdSm90Maps;
using flashattn::hopper::FwdSm90Params;

constexpr uint16_t kNan = 0xFFFF;  // NaN in both 16-bit types

enum class Layout { kPaged, kIndexed };

struct Case {
  int heads_q, heads_kv, seqlen_q;
  int capacity;                 // keys each sequence's cache holds
  std::vector<int> seqlens;     // keys each sequence takes part with (<= capacity)
  Layout layout;
  int page_size = 0;            // kPaged
};

template <typename Elem>
uint16_t random_bits(std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.5f, 1.5f);
  Elem h;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) h = __float2bfloat16_rn(value(rng));
  else h = __float2half_rn(value(rng));
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

// [n, rows, heads, dim], dense, as a map input.
FwdSm90Input dense_input(const std::vector<uint16_t>& t, int rows, int heads, int dim) {
  FwdSm90Input in;
  in.ptr = t.data();
  in.seqlen = rows, in.heads = heads;
  in.batch_stride = static_cast<int64_t>(rows) * heads * dim;
  in.row_stride = static_cast<int64_t>(heads) * dim;
  in.head_stride = dim;
  return in;
}

flashattn::TensorView dense_view(const std::vector<uint16_t>& t, int rows, int heads, int dim) {
  flashattn::TensorView view;
  view.ptr = const_cast<uint16_t*>(t.data());
  view.batch_stride = static_cast<int64_t>(rows) * heads * dim;
  view.row_stride = static_cast<int64_t>(heads) * dim;
  view.head_stride = dim;
  return view;
}

template <typename Elem, int kHeadDim, bool kCausal, bool kLocal>
int run_case(const Case& c, unsigned seed) {
  constexpr int D = kHeadDim;
  using Cfg = FwdSm90Config<D>;
  const int batch = static_cast<int>(c.seqlens.size());
  std::mt19937 rng(seed);
  const size_t q_elems = static_cast<size_t>(batch) * c.seqlen_q * c.heads_q * D;
  std::vector<uint16_t> q(q_elems);
  for (auto& x : q) x = random_bits<Elem>(rng);
  // The logical keys and values: [B, capacity, Hkv, D], NaN past each sequence.
  const size_t row_elems = static_cast<size_t>(c.heads_kv) * D;
  std::vector<uint16_t> k(batch * c.capacity * row_elems), v(k.size());
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < c.capacity; ++j)
      for (size_t e = 0; e < row_elems; ++e) {
        const size_t i = (static_cast<size_t>(b) * c.capacity + j) * row_elems + e;
        k[i] = j < c.seqlens[b] ? random_bits<Elem>(rng) : kNan;
        v[i] = j < c.seqlens[b] ? random_bits<Elem>(rng) : kNan;
      }
  const auto dtype = std::is_same_v<Elem, __nv_bfloat16> ? flashattn::TensorMapDtype::BFloat16
                                                         : flashattn::TensorMapDtype::Float16;

  // The gathered cache: every row NaN but the sequences' keys.
  std::vector<uint16_t> k_cache, v_cache;
  std::vector<int> block_table, batch_index, leftpad, used(c.seqlens);
  flashattn::KvCache cache;
  flashattn::TensorView k_view, v_view;
  if (c.layout == Layout::kPaged) {
    const int blocks = (c.capacity + c.page_size - 1) / c.page_size;
    const int pages = 2 * batch * blocks;  // a pool with unused pages, handed out shuffled
    std::vector<int> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    block_table.assign(order.begin(), order.begin() + batch * blocks);
    k_cache.assign(static_cast<size_t>(pages) * c.page_size * row_elems, kNan);
    v_cache.assign(k_cache.size(), kNan);
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < c.capacity; ++j) {
        const size_t from = (static_cast<size_t>(b) * c.capacity + j) * row_elems;
        const size_t to = (static_cast<size_t>(block_table[b * blocks + j / c.page_size]) * c.page_size +
                           j % c.page_size) * row_elems;
        std::copy_n(k.begin() + from, row_elems, k_cache.begin() + to);
        std::copy_n(v.begin() + from, row_elems, v_cache.begin() + to);
      }
    cache.block_table = block_table.data();
    cache.block_table_stride = blocks;
    cache.max_blocks = blocks;
    cache.page_size = c.page_size;
    cache.num_pages = pages;
    k_view = dense_view(k_cache, c.page_size, c.heads_kv, D);
    v_view = dense_view(v_cache, c.page_size, c.heads_kv, D);
  } else {
    // Entry batch_index[b] of a cache of 2B entries, its keys after a left pad of leftpad[b]
    // rows; cache_seqlens (seqused_k) counts the pad.
    const int cache_batch = 2 * batch, rows = c.capacity + 37;
    std::vector<int> entries(cache_batch);
    std::iota(entries.begin(), entries.end(), 0);
    std::shuffle(entries.begin(), entries.end(), rng);
    batch_index.assign(entries.begin(), entries.begin() + batch);
    k_cache.assign(static_cast<size_t>(cache_batch) * rows * row_elems, kNan);
    v_cache.assign(k_cache.size(), kNan);
    for (int b = 0; b < batch; ++b) {
      leftpad.push_back(static_cast<int>(rng() % 38));
      used[b] = c.seqlens[b] + leftpad[b];
      for (int j = 0; j < c.capacity && leftpad[b] + j < rows; ++j) {
        const size_t from = (static_cast<size_t>(b) * c.capacity + j) * row_elems;
        const size_t to = (static_cast<size_t>(batch_index[b]) * rows + leftpad[b] + j) * row_elems;
        std::copy_n(k.begin() + from, row_elems, k_cache.begin() + to);
        std::copy_n(v.begin() + from, row_elems, v_cache.begin() + to);
      }
    }
    cache.batch_index = batch_index.data();
    cache.cache_batch = cache_batch;
    cache.leftpad = leftpad.data();
    k_view = dense_view(k_cache, rows, c.heads_kv, D);
    v_view = dense_view(v_cache, rows, c.heads_kv, D);
  }

  // Runs one kernel (dense TMA or gathered) into fresh poisoned O and LSE.
  const auto launch = [&](bool gather, std::vector<uint16_t>& o, std::vector<float>& lse) -> int {
    o.assign(q_elems, kNan);
    lse.assign(static_cast<size_t>(batch) * c.heads_q * c.seqlen_q, NAN);
    const FwdSm90Input q_in = dense_input(q, c.seqlen_q, c.heads_q, D);
    FwdSm90Maps maps;
    const std::string error = flashattn::hopper::make_fwd_sm90_maps(
        maps, dtype, D, batch, q_in, gather ? q_in : dense_input(k, c.capacity, c.heads_kv, D),
        gather ? q_in : dense_input(v, c.capacity, c.heads_kv, D), dense_input(o, c.seqlen_q, c.heads_q, D),
        Cfg::kBlockM, Cfg::kBlockN);
    if (!error.empty()) {
      std::printf("tensor maps: %s\n", error.c_str());
      return 2;
    }
    FwdSm90Params p;
    p.lse = lse.data();
    p.lse_batch_stride = static_cast<int64_t>(c.heads_q) * c.seqlen_q;
    p.lse_head_stride = c.seqlen_q;
    p.batch = batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.capacity;
    p.heads_q = c.heads_q, p.head_group = c.heads_q / c.heads_kv;
    p.seqused_k = gather ? used.data() : c.seqlens.data();
    p.window_left = kLocal ? 40 : -1;
    p.window_right = kLocal ? 3 : -1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    p.scale = static_cast<float>(scale);
    if (gather) {
      p.k_cache = k_view, p.v_cache = v_view, p.kv_cache = cache;
      if (c.layout == Layout::kIndexed) p.seqlen_k = c.capacity + 37;
    }
    unsigned tile_counter = 0xdeadbeefu;  // the dense kernels walk; the launch zeroes it
    p.tile_counter = &tile_counter;
    const std::string failure =
        gather ? flashattn::hopper::launch_fwd_sm90<Elem, D, kCausal, false, kLocal, false, false, true>(maps, p, nullptr)
               : flashattn::hopper::launch_fwd_sm90<Elem, D, kCausal, false, kLocal, false, false, false>(maps, p, nullptr);
    if (!failure.empty()) {
      std::printf("launch: %s\n", failure.c_str());
      return 2;
    }
    return 0;
  };
  std::vector<uint16_t> o_dense, o_gathered;
  std::vector<float> lse_dense, lse_gathered;
  if (const int rc = launch(false, o_dense, lse_dense)) return rc;
  if (const int rc = launch(true, o_gathered, lse_gathered)) return rc;
  int differ = 0, nan = 0, nonzero = 0;
  for (size_t i = 0; i < q_elems; ++i) {
    differ += o_dense[i] != o_gathered[i];
    nan += o_gathered[i] == kNan;
    nonzero += (o_gathered[i] & 0x7FFF) != 0;
  }
  int lse_differ = 0;
  for (size_t i = 0; i < lse_dense.size(); ++i)
    lse_differ += std::memcmp(&lse_dense[i], &lse_gathered[i], sizeof(float)) != 0;
  const bool ok = differ == 0 && lse_differ == 0 && nan == 0 && nonzero > 0;  // not all-zero twins
  std::string lens;
  for (int n : c.seqlens) lens += " " + std::to_string(n);
  std::printf("%s %s%s Hq=%d Hkv=%d Sq=%d capacity=%d seqlens%s: %d O elements and %d LSE rows differ from "
              "the dense cache's, %d O elements NaN, %d non-zero\n",
              ok ? "ok:" : "WRONG:", c.layout == Layout::kPaged ? "page " : "indexed",
              c.layout == Layout::kPaged ? std::to_string(c.page_size).c_str() : "", c.heads_q, c.heads_kv,
              c.seqlen_q, c.capacity, lens.c_str(), differ, lse_differ, nan, nonzero);
  return ok ? 0 : 1;
}

template <typename Elem, int kHeadDim, bool kCausal, bool kLocal = false>
int run(const std::vector<Case>& cases) {
  int status = 0;
  unsigned seed = 1;
  for (const Case& c : cases) {
    const int rc = run_case<Elem, kHeadDim, kCausal, kLocal>(c, seed++);
    if (rc != 0) status = rc;
  }
  return status;
}

using bf16 = __nv_bfloat16;
using f16 = __half;

// Page sizes 1, 16, 256 and 48 (which divides neither the 128- nor the 64-key tile); sequences
// of 0 keys, of one key, ragged, not multiples of the page size, and full; decodes (Sq 1) and a
// chunk of 65 queries with GQA. The shim costs ~0.3 ms per m64n128k16: a few hundred per case.
Case paged(int page, int heads_q, int heads_kv, int seqlen_q, int capacity, std::vector<int> lens) {
  return {heads_q, heads_kv, seqlen_q, capacity, std::move(lens), Layout::kPaged, page};
}
Case indexed(int heads_q, int heads_kv, int seqlen_q, int capacity, std::vector<int> lens) {
  return {heads_q, heads_kv, seqlen_q, capacity, std::move(lens), Layout::kIndexed};
}

const selftest::NamedCases kCases = {
    {"bf16_d128_causal_page16", [] { return run<bf16, 128, true>({paged(16, 2, 2, 1, 700, {300, 0, 129, 700})}); }},
    {"bf16_d128_causal_page48", [] { return run<bf16, 128, true>({paged(48, 4, 2, 65, 270, {257, 77})}); }},
#if !defined(HOPPER_PAGED_ONE_CONFIG)
    {"bf16_d128_causal_indexed", [] { return run<bf16, 128, true>({indexed(2, 1, 7, 260, {259, 1, 130})}); }},
    {"f16_d64_none_page1", [] { return run<f16, 64, false>({paged(1, 2, 1, 3, 140, {131, 7})}); }},
    {"f16_d64_none_page256", [] { return run<f16, 64, false>({paged(256, 1, 1, 65, 600, {513, 200})}); }},
    {"f16_d64_none_indexed", [] { return run<f16, 64, false>({indexed(2, 2, 1, 200, {0, 199, 63})}); }},
    {"bf16_d256_causal_page16", [] { return run<bf16, 256, true>({paged(16, 2, 1, 1, 200, {193, 64, 65})}); }},
    {"bf16_d256_causal_page48", [] { return run<bf16, 256, true>({paged(48, 1, 1, 70, 150, {150, 97})}); }},
    {"f16_d128_local_page16", [] { return run<f16, 128, false, true>({paged(16, 2, 2, 33, 400, {390, 41})}); }},
    {"bf16_d64_local_indexed", [] { return run<bf16, 64, false, true>({indexed(1, 1, 65, 300, {300, 100})}); }},
#endif
};

}  // namespace

int main(int argc, char** argv) { return selftest::run_named_case(argc, argv, kCases); }
