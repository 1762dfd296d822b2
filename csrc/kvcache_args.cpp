#include "kvcache_args.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "arg_checks.h"
#include "fp8_args.h"

namespace flashattn {
namespace {

// q [B, Sq, Hq, D]: query i of sequence b is rotated at position cache_seqlens[b] + i when
// causal or local (it sits at the end of the sequence), else every query at cache_seqlens[b]
// (FlashAttention-2's convention).
bool q_position_per_token(const AttnInputs& attn) {
  return attn.causal || attn.window_left >= 0 || attn.window_right >= 0;
}

// k (new keys) has the head dim of k_cache, v (new values) that of v_cache.
void check_new_rows(const at::Tensor& t, const char* name, const at::Tensor& cache,
                    const char* cache_name, const KvcacheInputs& in) {
  const at::Tensor& q = in.attn.q;
  TORCH_CHECK(t.dim() == 4 && t.size(0) == q.size(0) && t.size(2) == cache.size(2) &&
                  t.size(3) == cache.size(3),
              "flashattn: ", name, " must have shape [batch, seqlen_new, heads_kv, ", cache_name,
              "'s head_dim] = [", q.size(0), ", seqlen_new, ", cache.size(2), ", ",
              cache.size(3), "], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " must have q's dtype ",
              q.scalar_type(), ", got ", t.scalar_type());
  check_same_device(t, name, q);
  check_last_dim_contiguous(t, name);
}

void check_rotary_table(const at::Tensor& t, const char* name, const at::Tensor& like,
                        const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 2 && t.sizes() == like.sizes(), "flashattn: ", name, " must be 2-D "
              "[seqlen_rotary, rotary_dim / 2] like rotary_cos ", like.sizes(), ", got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " must have q's dtype ",
              q.scalar_type(), ", got ", t.scalar_type());
  check_same_device(t, name, q);
  check_last_dim_contiguous(t, name);
}

// The values, on the host: every new key fits in the cache, and every rotated position has a
// row of the rotary tables.
void check_append_values(const KvcacheInputs& in) {
  const int* seqlens = in.cache_seqlens->data_ptr<int>();
  const int64_t capacity = kv_capacity(in.attn), seqlen_new = in.seqlen_new();
  const int64_t rotary_rows = in.rotary() ? in.rotary_cos->size(0) : 0;
  const int64_t q_span = q_position_per_token(in.attn) ? in.attn.q.size(1) : 1;
  for (int64_t b = 0; b < in.attn.q.size(0); ++b) {
    const int64_t length = seqlens[b];
    TORCH_CHECK(length >= 0 && length + seqlen_new <= capacity, "flashattn: cache_seqlens[", b,
                "] + seqlen_new = ", length, " + ", seqlen_new, " keys do not fit in the ",
                in.attn.paged() ? "block_table's pages" : "cache", ", which hold ", capacity,
                in.attn.paged() ? " (max_blocks_per_sequence * page_size)" : "");
    if (!in.rotary()) continue;
    const int64_t last = length + std::max<int64_t>(seqlen_new, q_span) - 1;
    TORCH_CHECK(last < rotary_rows, "flashattn: rotary_cos / rotary_sin have ", rotary_rows,
                " rows (positions), but sequence ", b, " needs position ", last,
                " (cache_seqlens[", b, "] = ", length, ")");
  }
}


// Whether v_cache is k_cache's first head_dim_v columns (k_cache[..., :head_dim_v]), as MLA
// keeps its latent cache: each value is the start of its key row. The attention only reads the
// caches, so the kernels read the values there, with v_cache's own strides, without a copy.
bool values_inside_keys(const KvcacheInputs& in) {
  const at::Tensor &k = in.attn.k, &v = in.attn.v;
  if (k.dim() != 4 || v.dim() != 4 || !k.has_storage() || !v.has_storage() ||
      k.device() != v.device() || !k.storage().is_alias_of(v.storage()))
    return false;
  for (int64_t d = 0; d < 3; ++d)
    if (k.size(d) != v.size(d) || (k.size(d) > 1 && k.stride(d) != v.stride(d))) return false;
  return k.data_ptr() == v.data_ptr() && v.size(3) <= k.size(3);
}

// ---- Aliasing. An append writes the caches in place, so no argument it reads may share memory
// with the caches, and k_cache and v_cache may not share memory with each other.

// Whether two tensors share an element in memory: kNo, kYes, or kUnknown where the exact search
// below ran out of its budget (then the caller treats them as overlapping).
enum class Overlap { kNo, kYes, kUnknown };

// One index of a tensor as a term of an address: digit x in [lo, hi] times coefficient c > 0
// (bytes).
struct AddressTerm {
  int64_t c, lo, hi;
};

// Whether sum(x_i * c_i), each x_i in its range, can lie strictly between low and high: a
// depth-first search over the terms by decreasing coefficient, each level trying only the
// digits that keep the remaining terms able to reach the interval. suffix_min/max[i]: the
// smallest and largest sums of terms i... Exact; `budget` bounds the nodes visited.
bool reaches(const std::vector<AddressTerm>& terms, const std::vector<int64_t>& suffix_min,
             const std::vector<int64_t>& suffix_max, size_t i, int64_t low, int64_t high,
             int64_t& budget) {
  if (--budget < 0) return true;
  if (i == terms.size()) return low < 0 && 0 < high;
  const AddressTerm& t = terms[i];
  // x * c + suffix_min[i + 1] < high and x * c + suffix_max[i + 1] > low.
  const int64_t upper = high - suffix_min[i + 1] - 1, lower = low - suffix_max[i + 1] + 1;
  auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  const int64_t first = std::max(t.lo, -floor_div(-lower, t.c)), last = std::min(t.hi, floor_div(upper, t.c));
  for (int64_t x = first; x <= last; ++x)
    if (reaches(terms, suffix_min, suffix_max, i + 1, low - x * t.c, high - x * t.c, budget))
      return true;
  return false;
}

Overlap memory_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.has_storage() || !b.has_storage() ||
      a.device() != b.device() || a.is_meta() || b.is_meta())
    return Overlap::kNo;
  if (!a.storage().is_alias_of(b.storage())) return Overlap::kNo;
  // Element [i] of a starts at byte A(i) = a0 + sum i_d * sa_d and covers [A, A + ea); likewise
  // b. They share a byte iff -eb < B(j) - A(i) < ea, i.e. sum j_d sb_d - sum i_d sa_d lies in
  // (-eb - (b0 - a0), ea - (b0 - a0)).
  const int64_t ea = a.element_size(), eb = b.element_size();
  const int64_t a0 = static_cast<int64_t>(reinterpret_cast<intptr_t>(a.data_ptr())),
                b0 = static_cast<int64_t>(reinterpret_cast<intptr_t>(b.data_ptr()));
  std::vector<AddressTerm> terms;
  int64_t a_end = a0 + ea, b_end = b0 + eb;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) <= 1 || a.stride(d) == 0) continue;
    terms.push_back({a.stride(d) * ea, -(a.size(d) - 1), 0});
    a_end += (a.size(d) - 1) * a.stride(d) * ea;
  }
  for (int64_t d = 0; d < b.dim(); ++d) {
    if (b.size(d) <= 1 || b.stride(d) == 0) continue;
    terms.push_back({b.stride(d) * eb, 0, b.size(d) - 1});
    b_end += (b.size(d) - 1) * b.stride(d) * eb;
  }
  if (a_end <= b0 || b_end <= a0) return Overlap::kNo;  // disjoint byte ranges
  std::sort(terms.begin(), terms.end(),
            [](const AddressTerm& x, const AddressTerm& y) { return x.c > y.c; });
  std::vector<int64_t> suffix_min(terms.size() + 1, 0), suffix_max(terms.size() + 1, 0);
  for (size_t i = terms.size(); i-- > 0;) {
    suffix_min[i] = suffix_min[i + 1] + terms[i].lo * terms[i].c;
    suffix_max[i] = suffix_max[i + 1] + terms[i].hi * terms[i].c;
  }
  int64_t budget = 1 << 16;
  const bool found = reaches(terms, suffix_min, suffix_max, 0, -eb - (b0 - a0), ea - (b0 - a0),
                             budget);
  if (budget < 0) return Overlap::kUnknown;
  return found ? Overlap::kYes : Overlap::kNo;
}

void check_no_overlap(const at::Tensor& read, const char* read_name, const at::Tensor& cache,
                      const char* cache_name) {
  const Overlap o = memory_overlap(read, cache);
  TORCH_CHECK(o == Overlap::kNo, "flashattn: ", read_name, " and ", cache_name,
              o == Overlap::kYes ? " share memory" : " may share memory (their strides are too "
              "irregular to tell)", "; the append writes ", cache_name, " in place, so ",
              read_name, " must not alias it", read_name[0] == 'v' && read_name[1] == '_'
              ? " (a packed cache's kv[:, :, 0] and kv[:, :, 1] are fine)" : "",
              ". Pass a separate tensor (e.g. ", read_name, ".clone())");
}

// An append: k_cache and v_cache disjoint (or v_cache inside k_cache, which then appends the
// key rows only), and no tensor it reads inside either.
void check_append_aliasing(const KvcacheInputs& in) {
  const at::Tensor &k_cache = in.attn.k, &v_cache = in.attn.v;
  if (!values_inside_keys(in)) check_no_overlap(v_cache, "v_cache", k_cache, "k_cache");
  for (auto [cache, cache_name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    check_no_overlap(in.attn.q, "q", *cache, cache_name);
    check_no_overlap(*in.k_new, "k", *cache, cache_name);
    if (in.v_new) check_no_overlap(*in.v_new, "v", *cache, cache_name);
    if (in.rotary()) {
      check_no_overlap(*in.rotary_cos, "rotary_cos", *cache, cache_name);
      check_no_overlap(*in.rotary_sin, "rotary_sin", *cache, cache_name);
    }
  }
}

// On the host (lengths known): every new key (and value) goes to a cache row of its own that no
// other sequence reads. A block_table naming one page for two sequences, or a cache_batch_idx
// naming one entry twice, can send two new keys to one row (one would be lost) or a new key
// into a row holding another sequence's key (that sequence's cache corrupted). Sharing pages
// that are only read (a common prefix) is fine. Rows whose page or entry is out of range are
// left to check_fwd, which runs before any write.
void check_append_targets(const KvcacheInputs& in) {
  const AttnInputs& attn = in.attn;
  if (in.seqlen_new() == 0 || attn.k.is_meta()) return;
  // The addressing tensors are validated by check_fwd; until then, only well-formed ones are
  // read here.
  const int64_t batch = attn.q.size(0);
  auto well_formed = [&](const std::optional<at::Tensor>& t, int64_t dim) {
    return t->scalar_type() == at::kInt && t->dim() == dim && t->size(0) == batch &&
           t->device() == attn.q.device() && !t->is_meta() &&
           (dim == 1 ? t->is_contiguous() : t->stride(1) == 1 || t->size(1) <= 1);
  };
  const bool paged = attn.paged();
  if (paged && !well_formed(attn.block_table, 2)) return;
  if (!paged && attn.cache_batch_idx && !well_formed(attn.cache_batch_idx, 1)) return;
  if (!paged && attn.cache_leftpad && !well_formed(attn.cache_leftpad, 1)) return;
  const int* seqlens = in.cache_seqlens->data_ptr<int>();
  const int64_t page = attn.k.size(1), entries = attn.k.size(0);
  const int64_t max_blocks = paged ? attn.block_table->size(1) : 0;
  // (entry, row) of sequence b's key at `position`; entry -1 where the table has none.
  auto locate = [&](int64_t b, int64_t position) -> std::pair<int64_t, int64_t> {
    if (paged) {
      const int64_t block = position / page;
      if (block >= max_blocks) return {-1, 0};
      const int64_t entry =
          attn.block_table->data_ptr<int>()[b * attn.block_table->stride(0) + block];
      return {entry >= 0 && entry < entries ? entry : -1, position % page};
    }
    const int64_t entry = attn.cache_batch_idx ? attn.cache_batch_idx->data_ptr<int>()[b] : b;
    return {entry >= 0 && entry < entries ? entry : -1, position};
  };
  struct Target {
    int64_t entry, row, b, t;
    bool operator<(const Target& o) const {
      return entry != o.entry ? entry < o.entry : row < o.row;
    }
  };
  std::vector<Target> targets;
  targets.reserve(static_cast<size_t>(batch * in.seqlen_new()));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < in.seqlen_new(); ++t) {
      const auto [entry, row] = locate(b, int64_t(seqlens[b]) + t);
      if (entry >= 0) targets.push_back({entry, row, b, t});
    }
  }
  std::sort(targets.begin(), targets.end());
  const char* table_name = paged ? "block_table" : "cache_batch_idx";
  const char* entry_name = paged ? "block " : "cache entry ";
  for (size_t i = 1; i < targets.size(); ++i) {
    const Target &x = targets[i - 1], &y = targets[i];
    TORCH_CHECK(x.entry != y.entry || x.row != y.row, "flashattn: new key ", x.t, " of sequence ",
                x.b, " and new key ", y.t, " of sequence ", y.b, " would both be written to row ",
                x.row, " of ", entry_name, x.entry, " (", table_name, " maps both sequences "
                "there), so one would be lost; each cache row may receive one new key per call");
  }
  // The rows each sequence already holds, [leftpad, cache_seqlens[b]): none may be a target of
  // another sequence. One binary search per page (dense: per sequence) for the targets in it.
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start =
        !paged && attn.cache_leftpad ? attn.cache_leftpad->data_ptr<int>()[b] : 0;
    const int64_t length = seqlens[b];
    for (int64_t position = std::max<int64_t>(start, 0); position < length;) {
      const auto [entry, row] = locate(b, position);
      const int64_t span = paged ? std::min(page - row, length - position) : length - position;
      if (entry >= 0) {
        auto hit = std::lower_bound(targets.begin(), targets.end(), Target{entry, row, 0, 0});
        for (; hit != targets.end() && hit->entry == entry && hit->row < row + span; ++hit)
          TORCH_CHECK(hit->b == b, "flashattn: new key ", hit->t, " of sequence ", hit->b,
                      " would be written to row ", hit->row, " of ", entry_name, entry,
                      ", which holds key ", position + (hit->row - row), " of sequence ", b,
                      " (", table_name, " gives both sequences that ",
                      paged ? "block" : "entry", "); an append may only write rows no other "
                      "sequence reads");
      }
      position += span;
    }
  }
}

// An FP8 call over a cache (fp8_args.h): q, k_cache and v_cache all float8_e4m3fn, on an
// executor with the FP8 forward (refused here, before anything is written, as fwd refuses it).
// A dense cache is read by TMA in place; a paged (block_table), indexed (cache_batch_idx) or
// left-padded (cache_leftpad) one by the e4m3 kernel's gathering producer, whose loops take no
// softcap, ALiBi or attn_mask (check_fp8_fwd refuses those by name). The descales stay per
// (sequence b of q, kv head), also with cache_batch_idx (FA3's too). The append is the
// row copy of kv_append.h (k, v must then be e4m3 too: check_new_rows), but rotary is not: it
// would rotate values already rounded to e4m3.
void check_fp8_cache(const KvcacheInputs& in, const ExecutorLimits& limits) {
  const AttnInputs& attn = in.attn;
  constexpr at::ScalarType kFp8 = at::kFloat8_e4m3fn;
  const bool q8 = attn.q.scalar_type() == kFp8, k8 = attn.k.scalar_type() == kFp8,
             v8 = attn.v.scalar_type() == kFp8;
  if (!q8 && !k8 && !v8) return;  // descales without FP8 inputs: check_fp8_dtypes (check_fwd)
  TORCH_CHECK(q8 && k8 && v8, "flashattn: flash_attn_with_kvcache's FP8 forward needs q, "
              "k_cache and v_cache all float8_e4m3fn; got q ", attn.q.scalar_type(),
              ", k_cache ", attn.k.scalar_type(), ", v_cache ", attn.v.scalar_type());
  check_fp8_dtypes(attn, limits);
  const auto refuse = [](bool given, const char* what, const char* why) {
    TORCH_CHECK(!given, "flashattn: flash_attn_with_kvcache with float8_e4m3fn (FP8) tensors "
                "does not support ", what, ": ", why);
  };
  refuse(in.rotary_cos.has_value() || in.rotary_sin.has_value(), "rotary_cos / rotary_sin",
         "rotating float8_e4m3fn values would round them again; rotate q and k in 16 bits "
         "before quantizing them");
}

}  // namespace

void check_kvcache_append(KvcacheInputs& in, const ExecutorLimits& limits) {
  const at::Tensor& q = in.attn.q;
  check_fp8_cache(in, limits);
  TORCH_CHECK(q.dim() == 4, "flashattn: q must be a 4-D tensor [batch, seqlen_q, heads, "
              "head_dim], got ", q.dim(), "-D with shape ", q.sizes());
  TORCH_CHECK(in.attn.k.dim() == 4, "flashattn: k_cache must be a 4-D tensor [batch_cache, "
              "seqlen_cache, heads_kv, head_dim] (or [num_blocks, page_size, heads_kv, "
              "head_dim] with block_table), got shape ", in.attn.k.sizes());
  TORCH_CHECK(in.attn.k.size(3) == q.size(3), "flashattn: k_cache must have q's head_dim ",
              q.size(3), " in its last dimension, got shape ", in.attn.k.sizes());
  TORCH_CHECK(in.attn.v.dim() == 4, "flashattn: v_cache must be a 4-D tensor like k_cache, "
              "with its own head_dim last, got shape ", in.attn.v.sizes());
  // With v_cache inside k_cache, appending the key rows appends the values: v must be None (a
  // separate v would write the same memory a second time, and could disagree with k).
  const bool inside = values_inside_keys(in);
  if (inside) {
    TORCH_CHECK(!in.v_new.has_value(), "flashattn: v_cache is k_cache[..., :", in.attn.v.size(3),
                "] (each value is the start of its key row), so appending k writes the values "
                "too; pass v=None");
  } else {
    TORCH_CHECK(in.k_new.has_value() == in.v_new.has_value(), "flashattn: pass both k and v "
                "(the keys and values to append) or neither");
  }
  if (in.k_new) {
    check_new_rows(*in.k_new, "k", in.attn.k, "k_cache", in);
    if (in.v_new) {
      check_new_rows(*in.v_new, "v", in.attn.v, "v_cache", in);
      TORCH_CHECK(in.v_new->size(1) == in.k_new->size(1), "flashattn: k and v must have the "
                  "same seqlen_new, got ", in.k_new->size(1), " and ", in.v_new->size(1));
    }
    TORCH_CHECK(in.cache_seqlens.has_value(), "flashattn: appending k and v needs "
                "cache_seqlens, where each sequence's new keys go");
  }
  TORCH_CHECK(in.rotary_cos.has_value() == in.rotary_sin.has_value(), "flashattn: pass both "
              "rotary_cos and rotary_sin or neither");
  if (in.rotary()) {
    TORCH_CHECK(in.k_new.has_value(), "flashattn: rotary_cos / rotary_sin rotate the new keys "
                "k as they are appended, and q; pass k and v too");
    TORCH_CHECK(!inside, "flashattn: rotary_cos / rotary_sin rotate the first rotary_dim columns "
                "of the new keys, but v_cache is k_cache[..., :", in.attn.v.size(3), "], so the "
                "values would be rotated too; rotate k before the call instead");
    check_rotary_table(*in.rotary_cos, "rotary_cos", *in.rotary_cos, q);
    check_rotary_table(*in.rotary_sin, "rotary_sin", *in.rotary_cos, q);
    const int64_t rotary_dim = 2 * in.rotary_cos->size(1);
    TORCH_CHECK(rotary_dim > 0 && rotary_dim <= q.size(3), "flashattn: rotary_dim = 2 * "
                "rotary_cos.shape[1] = ", rotary_dim, " must be in [2, head_dim = ", q.size(3),
                "]");
  }
  if (in.cache_seqlens) {
    check_lengths_tensor(*in.cache_seqlens, "cache_seqlens", q.size(0), "batch", q);
    if (limits.reads_lengths_on_host) check_append_values(in);
    if (in.seqlen_new() > 0) {
      check_append_aliasing(in);
      if (limits.reads_lengths_on_host) check_append_targets(in);
    }
    in.attn.seqused_k =
        in.seqlen_new() > 0 ? at::add(*in.cache_seqlens, in.seqlen_new()) : *in.cache_seqlens;
  }
}

KvAppendParams make_append_params(const KvcacheInputs& in, const at::Tensor& q_rotated) {
  KvAppendParams p;
  const AttnInputs& attn = in.attn;
  if (in.k_new) {
    p.k_new = rows_view(*in.k_new, false);
    // No v (v_cache inside k_cache): the key rows carry the values; v_new.ptr stays null.
    if (in.v_new) p.v_new = rows_view(*in.v_new, false);
    p.cache_seqlens = in.cache_seqlens->data_ptr<int>();
  }
  p.k_cache = rows_view(attn.k, false);
  p.v_cache = rows_view(attn.v, false);
  p.cache = kv_cache_of(attn);
  p.cache.leftpad = nullptr;  // new keys go to absolute positions
  p.capacity = static_cast<int>(kv_capacity(attn));
  p.batch = static_cast<int>(attn.q.size(0));
  p.seqlen_new = static_cast<int>(in.seqlen_new());
  p.heads_kv = static_cast<int>(attn.k.size(2));
  p.head_dim = static_cast<int>(attn.q.size(3));
  p.head_dim_v = static_cast<int>(attn.v.size(3));
  if (in.rotary()) {
    const at::Tensor &cos = *in.rotary_cos, &sin = *in.rotary_sin;
    p.cos = {const_cast<void*>(cos.data_ptr()), 0, cos.stride(0), 0};
    p.sin = {const_cast<void*>(sin.data_ptr()), 0, sin.stride(0), 0};
    p.rotary_dim = static_cast<int>(2 * cos.size(1));
    p.rotary_rows = static_cast<int>(cos.size(0));
    p.interleaved = in.rotary_interleaved;
    p.q = rows_view(attn.q, false);
    p.q_rotated = rows_view(q_rotated, false);
    p.seqlen_q = static_cast<int>(attn.q.size(1));
    p.heads_q = static_cast<int>(attn.q.size(2));
    p.q_position_per_token = q_position_per_token(attn);
  }
  return p;
}

}  // namespace flashattn
