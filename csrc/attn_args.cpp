#include "attn_args.h"

#include "arg_checks.h"
#include "attn_mask.h"
#include "fp8_args.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

namespace flashattn {
namespace {

std::string dtype_list(const std::vector<at::ScalarType>& dtypes) {
  std::ostringstream os;
  for (size_t i = 0; i < dtypes.size(); ++i) os << (i ? ", " : "") << dtypes[i];
  return os.str();
}

// Tensors of attention rows are [batch, seqlen, heads, head_dim], or [total, heads, head_dim]
// in a varlen batch.
void check_rank(const at::Tensor& t, const char* name, bool varlen) {
  if (varlen) {
    TORCH_CHECK(t.dim() == 3, "flashattn: ", name,
                " must be a 3-D tensor [total_tokens, heads, head_dim] when cu_seqlens_q is "
                "given, got ", t.dim(), "-D with shape ", t.sizes());
  } else {
    TORCH_CHECK(t.dim() == 4, "flashattn: ", name,
                " must be a 4-D tensor [batch, seqlen, heads, head_dim], got ", t.dim(),
                "-D with shape ", t.sizes());
  }
}

// float16 or bfloat16: the dtypes whose out (out_fp32) and gradients (grads_fp32) can be asked
// for in float32 instead.
bool is_16_bit(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// A varlen batch's [total, heads, dim] tensor seen as one sequence of `total` rows, so one set
// of shape checks serves both layouts.
at::Tensor as_4d(const at::Tensor& t, bool varlen) { return varlen ? t.unsqueeze(0) : t; }

int64_t batch_size(const AttnInputs& in) {
  return in.varlen() ? in.cu_seqlens_q->size(0) - 1 : in.q.size(0);
}

// Bound on block_offsets' entries (|diagonal| too), so that a row's position plus the window
// stays within the kernels' 32-bit index arithmetic.
constexpr int64_t kMaxBlockOffset = int64_t(1) << 29;

// A window bound larger than any possible distance is the same as unbounded; clipping keeps
// the kernels' 32-bit index arithmetic from overflowing. A block of a larger attention
// (block_offsets) measures distances in the whole attention, which only bounds them by
// 2 * kMaxBlockOffset.
int clip_window(int64_t w, int64_t seqlen_q, int64_t seqlen_k, bool block) {
  const int64_t longest = block ? 2 * kMaxBlockOffset : seqlen_q + seqlen_k;
  return w > longest ? -1 : static_cast<int>(w);
}

// block_offsets: int32 [batch, 5] on q's device, contiguous; where the executor reads lengths on
// the host (the CPU), also its values: offsets in [0, kMaxBlockOffset), |diagonal| below it.
void check_block_offsets(const AttnInputs& in, const ExecutorLimits& limits) {
  if (!in.block_offsets) return;
  const at::Tensor& t = *in.block_offsets;
  const int64_t batch = batch_size(in);
  TORCH_CHECK(t.scalar_type() == at::kInt, "flashattn: block_offsets must be int32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == batch && t.size(1) == 5, "flashattn: block_offsets "
              "must have shape [batch, 5] = [", batch, ", 5] (row_offset, key_offset, "
              "head_offset, diagonal, sequence per sequence), got ", t.sizes());
  check_same_device(t, "block_offsets", in.q);
  TORCH_CHECK(t.is_contiguous(), "flashattn: block_offsets must be contiguous, got strides ",
              t.strides());
  if (!limits.reads_lengths_on_host) return;
  const int* values = t.data_ptr<int>();
  constexpr const char* kNames[5] = {"row_offset", "key_offset", "head_offset", "diagonal",
                                     "sequence"};
  for (int64_t b = 0; b < batch; ++b)
    for (int c = 0; c < 5; ++c) {
      const int64_t value = values[5 * b + c];
      const int64_t low = c == 3 ? -kMaxBlockOffset + 1 : 0;
      TORCH_CHECK(value >= low && value < kMaxBlockOffset, "flashattn: block_offsets[", b, ", ",
                  c, "] (", kNames[c], ") = ", value, " must be in [", low, ", ",
                  kMaxBlockOffset, ")");
    }
}

// The softmax scale the caller asked for, or FA2's and SDPA's default 1 / sqrt(head_dim).
double resolved_scale(const AttnInputs& in) {
  return in.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(in.q.size(-1))));
}

void check_mask_options(const AttnInputs& in) {
  const at::Tensor& q = in.q;
  TORCH_CHECK(in.window_left >= -1, "flashattn: window_size[0] (left) must be -1 (unbounded) "
              "or >= 0, got ", in.window_left);
  TORCH_CHECK(in.window_right >= -1, "flashattn: window_size[1] (right) must be -1 "
              "(unbounded) or >= 0, got ", in.window_right);
  TORCH_CHECK(in.softmax_scale.has_value() || q.size(-1) > 0,
              "flashattn: head_dim is 0 (q has shape ", q.sizes(), "), so the default "
              "softmax_scale 1/sqrt(head_dim) is infinite; pass softmax_scale explicitly");
  TORCH_CHECK(std::isfinite(resolved_scale(in)), "flashattn: softmax_scale must be finite, got ",
              resolved_scale(in));
  TORCH_CHECK(in.softcap >= 0 && std::isfinite(in.softcap),
              "flashattn: softcap must be >= 0 (0 disables it), got ", in.softcap);
  if (in.alibi_slopes.has_value()) {
    const at::Tensor& s = *in.alibi_slopes;
    const int64_t batch = batch_size(in), heads = q.size(-2);
    // FA2 takes fp32 slopes only; converting would be a silent copy.
    TORCH_CHECK(s.scalar_type() == at::kFloat, "flashattn: alibi_slopes must be float32, got ",
                s.scalar_type());
    check_same_device(s, "alibi_slopes", q);
    const bool per_head = s.dim() == 1 && s.size(0) == heads;
    const bool per_batch_head = s.dim() == 2 && s.size(0) == batch && s.size(1) == heads;
    TORCH_CHECK(per_head || per_batch_head, "flashattn: alibi_slopes must have shape [",
                heads, "] or [", batch, ", ", heads, "] (nheads or batch x nheads of q), got ",
                s.sizes());
  }
  TORCH_CHECK(in.dropout_p >= 0.0 && in.dropout_p <= 1.0,
              "flashattn: dropout_p must be in [0, 1], got ", in.dropout_p);
  if (in.dropout_p > 0.0) {
    TORCH_CHECK(in.rng_state.has_value(), "flashattn: dropout_p > 0 needs rng_state, the [seed, "
                "offset] of torch.ops.flashattn.dropout_rng_state(q)");
    const at::Tensor& r = *in.rng_state;
    TORCH_CHECK(r.scalar_type() == at::kLong && r.dim() == 1 && r.size(0) == 2,
                "flashattn: rng_state must be int64 of shape [2] ([seed, offset]), got ",
                r.scalar_type(), " of shape ", r.sizes());
    check_same_device(r, "rng_state", q);
    TORCH_CHECK(r.is_contiguous(), "flashattn: rng_state must be contiguous");
  }
  if (in.attn_mask.has_value()) {
    TORCH_CHECK(!in.varlen(), "flashattn: attn_mask is not supported with cu_seqlens_q "
                "(a variable-length batch); mask by the sequences' lengths instead");
    check_attn_mask(*in.attn_mask, q, in.k);
  }
}

// k and v are [batch, seqlen, ...] like q, or a KV cache's [pages or cache entries, rows, ...].
bool kv_have_q_batch(const AttnInputs& in) { return !in.paged() && !in.cache_batch_idx; }

void check_qkv(const AttnInputs& in, const ExecutorLimits& limits) {
  check_rank(in.q, "q", in.varlen());
  const bool kv_varlen = in.varlen() && !in.paged();
  if (in.paged()) {
    for (auto [t, name] : {std::pair{&in.k, "k"}, std::pair{&in.v, "v"}})
      TORCH_CHECK(t->dim() == 4, "flashattn: with block_table, ", name, " must be the cache's "
                  "pages, a 4-D tensor [num_blocks, page_size, heads, head_dim], got ", t->dim(),
                  "-D with shape ", t->sizes());
  } else {
    check_rank(in.k, "k", in.varlen());
    check_rank(in.v, "v", in.varlen());
  }
  const at::Tensor q = as_4d(in.q, in.varlen()), k = as_4d(in.k, kv_varlen),
                   v = as_4d(in.v, kv_varlen);
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  const auto& dtypes = limits.dtypes;
  TORCH_CHECK(std::find(dtypes.begin(), dtypes.end(), q.scalar_type()) != dtypes.end(),
              "flashattn: q has dtype ", q.scalar_type(), ", which the ", limits.name,
              " kernels do not support; supported: ", dtype_list(dtypes));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "flashattn: q, k and v must have the same dtype, got ", q.scalar_type(), ", ",
              k.scalar_type(), " and ", v.scalar_type());
  if (kv_have_q_batch(in)) {
    TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0),
                "flashattn: q, k and v must have the same batch size, got ", q.size(0), ", ",
                k.size(0), " and ", v.size(0));
  } else {
    TORCH_CHECK(k.size(0) == v.size(0), "flashattn: k_cache and v_cache must have the same ",
                in.paged() ? "number of blocks" : "batch size", ", got ", k.size(0), " and ",
                v.size(0));
  }
  TORCH_CHECK(k.size(1) == v.size(1),
              "flashattn: k and v must have the same sequence length, got ", k.size(1), " and ",
              v.size(1));
  TORCH_CHECK(k.size(2) == v.size(2),
              "flashattn: k and v must have the same number of heads, got ", k.size(2), " and ",
              v.size(2));
  TORCH_CHECK(k.size(3) == q.size(3), "flashattn: q and k must have the same head dim, got ",
              q.size(3), " and ", k.size(3));
  TORCH_CHECK(k.size(2) > 0 || q.size(2) == 0,
              "flashattn: k and v have 0 heads but q has ", q.size(2));
  TORCH_CHECK(k.size(2) == 0 || q.size(2) % k.size(2) == 0,
              "flashattn: the number of query heads must be a multiple of the number of "
              "key/value heads (GQA/MQA), got ", q.size(2), " query heads and ", k.size(2),
              " key/value heads");
  // v may have a head dim of its own (MLA). A device executor runs the pair on the head-dim
  // tile of the wider of the two, so both must fit its largest.
  if (v.size(3) == q.size(3)) {
    TORCH_CHECK(limits.max_head_dim < 0 || q.size(3) <= limits.max_head_dim, "flashattn: the ",
                limits.name, " kernels support head_dim <= ", limits.max_head_dim, ", got ",
                q.size(3));
  } else {
    TORCH_CHECK(limits.max_head_dim < 0 || std::max(q.size(3), v.size(3)) <= limits.max_head_dim,
                "flashattn: the ", limits.name, " kernels support head dims <= ",
                limits.max_head_dim, ", got head_dim = ", q.size(3), " (q, k) and head_dim_v = ",
                v.size(3), " (v); a wider pair runs on the CPU only");
  }
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  if (!in.varlen()) {
    check_fits_int(q.size(1), "the query sequence length");
    check_fits_int(q.size(0), "the batch size");
  }
  if (!kv_varlen) {
    check_fits_int(k.size(1), "the key sequence length");
    check_fits_int(k.size(0), in.paged() ? "the number of blocks" : "the cache's batch size");
  }
  check_fits_int(q.size(2), "the number of heads");
  check_fits_int(q.size(3), "head_dim");
  check_fits_int(v.size(3), "head_dim_v");
}

// cu_seqlens on the host: 0 first, non-decreasing, at most `total` last, no sequence longer
// than max_seqlen.
void check_cu_seqlens_values(const at::Tensor& cu, const char* name, int64_t total,
                             int64_t max_seqlen, const char* max_name) {
  const int* values = cu.data_ptr<int>();
  const int64_t batch = cu.size(0) - 1;
  TORCH_CHECK(values[0] == 0, "flashattn: ", name, " must start at 0, got ", values[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = int64_t(values[b + 1]) - values[b];
    TORCH_CHECK(length >= 0, "flashattn: ", name, " must be non-decreasing, got ", name, "[",
                b, "] = ", values[b], " > ", name, "[", b + 1, "] = ", values[b + 1]);
    TORCH_CHECK(length <= max_seqlen, "flashattn: ", max_name, " = ", max_seqlen,
                " must bound every sequence, but sequence ", b, " has ", length,
                " (", name, "[", b + 1, "] - ", name, "[", b, "])");
  }
  TORCH_CHECK(values[batch] <= total, "flashattn: the last entry of ", name, " (", values[batch],
              ") must be at most the number of tokens, ", total);
}

// seqused on the host: 0 <= seqused[b] <= the length of sequence b.
void check_seqused_values(const at::Tensor& used, const char* name,
                          const std::optional<at::Tensor>& cu, int64_t dense_length) {
  const int* values = used.data_ptr<int>();
  for (int64_t b = 0; b < used.size(0); ++b) {
    const int64_t length = cu ? int64_t(cu->data_ptr<int>()[b + 1]) - cu->data_ptr<int>()[b]
                              : dense_length;
    TORCH_CHECK(values[b] >= 0 && values[b] <= length, "flashattn: ", name, "[", b, "] = ",
                values[b], " must be in [0, ", length, "], the length of sequence ", b);
  }
}

}  // namespace

KvCache kv_cache_of(const AttnInputs& in) {
  KvCache c;
  if (in.paged()) {
    c.block_table = in.block_table->data_ptr<int>();
    c.block_table_stride = in.block_table->stride(0);
    c.max_blocks = static_cast<int>(in.block_table->size(1));
    c.page_size = static_cast<int>(in.k.size(1));
    c.num_pages = static_cast<int>(in.k.size(0));
  }
  if (in.cache_batch_idx) {
    c.batch_index = in.cache_batch_idx->data_ptr<int>();
    c.cache_batch = static_cast<int>(in.k.size(0));
  }
  if (in.cache_leftpad) c.leftpad = in.cache_leftpad->data_ptr<int>();
  return c;
}

int64_t kv_capacity(const AttnInputs& in) {
  if (in.paged()) return in.block_table->size(1) * in.k.size(1);
  return in.k.size(in.varlen() ? 0 : 1);
}

namespace {

// cu_seqlens_*, max_seqlen_* and seqused_*: present together or not at all, well-formed, and,
// where the executor reads them on the host, with valid values.
void check_sequence_lengths(const AttnInputs& in, const ExecutorLimits& limits) {
  const at::Tensor& q = in.q;
  if (!in.varlen()) {
    TORCH_CHECK(!in.cu_seqlens_k.has_value(),
                "flashattn: cu_seqlens_k is given but cu_seqlens_q is not; pass both");
    TORCH_CHECK(!in.max_seqlen_q.has_value() && !in.max_seqlen_k.has_value(),
                "flashattn: max_seqlen_q / max_seqlen_k only apply with cu_seqlens_q and "
                "cu_seqlens_k (a variable-length batch)");
  } else {
    TORCH_CHECK(in.cu_seqlens_k.has_value(),
                "flashattn: cu_seqlens_q is given but cu_seqlens_k is not; pass both");
    TORCH_CHECK(in.max_seqlen_q.has_value() && in.max_seqlen_k.has_value(),
                "flashattn: a variable-length batch (cu_seqlens_q) needs max_seqlen_q and "
                "max_seqlen_k");
    TORCH_CHECK(in.cu_seqlens_q->dim() == 1 && in.cu_seqlens_q->size(0) >= 1,
                "flashattn: cu_seqlens_q must have shape [batch + 1], got ",
                in.cu_seqlens_q->sizes());
    check_fits_int(batch_size(in), "the batch size");
    const int64_t cu_size = batch_size(in) + 1;
    check_lengths_tensor(*in.cu_seqlens_q, "cu_seqlens_q", cu_size, "batch + 1", q);
    check_lengths_tensor(*in.cu_seqlens_k, "cu_seqlens_k", cu_size,
                         "batch + 1, batch from cu_seqlens_q", q);
    for (auto [value, name] : {std::pair{*in.max_seqlen_q, "max_seqlen_q"},
                               std::pair{*in.max_seqlen_k, "max_seqlen_k"}}) {
      TORCH_CHECK(value >= 0, "flashattn: ", name, " must be >= 0, got ", value);
      check_fits_int(value, name);
    }
  }
  const int64_t batch = batch_size(in);
  if (in.seqused_q) check_lengths_tensor(*in.seqused_q, "seqused_q", batch, "batch", q);
  if (in.seqused_k) check_lengths_tensor(*in.seqused_k, "seqused_k", batch, "batch", q);
  if (!limits.reads_lengths_on_host) return;
  if (in.varlen()) {
    check_cu_seqlens_values(*in.cu_seqlens_q, "cu_seqlens_q", q.size(0), *in.max_seqlen_q,
                            "max_seqlen_q");
    // Paged keys are no rows of k: cu_seqlens_k gives only lengths.
    check_cu_seqlens_values(*in.cu_seqlens_k, "cu_seqlens_k",
                            in.paged() ? std::numeric_limits<int>::max() : in.k.size(0),
                            *in.max_seqlen_k, "max_seqlen_k");
  }
  const int64_t dense_q = in.varlen() ? 0 : q.size(1),
                dense_k = in.varlen() ? 0 : (in.paged() ? kv_capacity(in) : in.k.size(1));
  if (in.seqused_q) check_seqused_values(*in.seqused_q, "seqused_q", in.cu_seqlens_q, dense_q);
  if (in.seqused_k) check_seqused_values(*in.seqused_k, "seqused_k", in.cu_seqlens_k, dense_k);
}

void check_kv_cache(const AttnInputs& in, const ExecutorLimits& limits) {
  TORCH_CHECK(in.num_splits >= 0, "flashattn: num_splits must be >= 0 (0: automatic), got ",
              in.num_splits);
  if (!in.kv_cache()) return;
  TORCH_CHECK(!in.attn_mask, "flashattn: attn_mask is not supported with a KV cache "
              "(block_table, cache_batch_idx, cache_leftpad)");
  const at::Tensor& q = in.q;
  const int64_t batch = batch_size(in);
  if (in.paged()) {
    const at::Tensor& table = *in.block_table;
    TORCH_CHECK(!in.cache_batch_idx && !in.cache_leftpad, "flashattn: cache_batch_idx and "
                "cache_leftpad apply to a dense cache, not with block_table");
    TORCH_CHECK(table.scalar_type() == at::kInt, "flashattn: block_table must be int32, got ",
                table.scalar_type());
    TORCH_CHECK(table.dim() == 2 && table.size(0) == batch, "flashattn: block_table must have "
                "shape [batch, max_blocks_per_sequence] = [", batch, ", ...], got ",
                table.sizes());
    check_same_device(table, "block_table", q);
    TORCH_CHECK(table.stride(1) == 1 || table.size(1) <= 1, "flashattn: block_table must be "
                "contiguous in its last dimension, got strides ", table.strides());
    TORCH_CHECK(in.k.size(1) > 0, "flashattn: the cache's page size (k_cache.shape[1]) must be "
                ">= 1");
    check_fits_int(kv_capacity(in), "max_blocks_per_sequence * page_size");
  } else {
    TORCH_CHECK(!in.varlen(), "flashattn: cache_batch_idx and cache_leftpad need a dense q "
                "[batch, seqlen_q, heads, head_dim]");
    if (in.cache_batch_idx)
      check_lengths_tensor(*in.cache_batch_idx, "cache_batch_idx", batch, "batch", q);
    if (in.cache_leftpad)
      check_lengths_tensor(*in.cache_leftpad, "cache_leftpad", batch, "batch", q);
  }
  if (!limits.reads_lengths_on_host) return;  // device kernels clamp (kv_rows.h, mask.h)
  const int64_t capacity = kv_capacity(in);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t length = capacity;
    if (in.varlen())
      length = int64_t(in.cu_seqlens_k->data_ptr<int>()[b + 1]) - in.cu_seqlens_k->data_ptr<int>()[b];
    if (in.seqused_k) length = in.seqused_k->data_ptr<int>()[b];
    TORCH_CHECK(length <= capacity, "flashattn: sequence ", b, " has ", length, " keys, more "
                "than its ", in.paged() ? "block_table" : "cache", " holds (", capacity,
                in.paged() ? " = max_blocks_per_sequence * page_size)" : ")");
    if (in.paged()) {
      const int* row = in.block_table->data_ptr<int>() + b * in.block_table->stride(0);
      const int64_t pages = (length + in.k.size(1) - 1) / in.k.size(1);
      for (int64_t i = 0; i < pages; ++i)
        TORCH_CHECK(row[i] >= 0 && row[i] < in.k.size(0), "flashattn: block_table[", b, ", ",
                    i, "] = ", row[i], " is not a block of the cache (it has ", in.k.size(0),
                    ")");
    }
    if (in.cache_batch_idx) {
      const int entry = in.cache_batch_idx->data_ptr<int>()[b];
      TORCH_CHECK(entry >= 0 && entry < in.k.size(0), "flashattn: cache_batch_idx[", b, "] = ",
                  entry, " is not an entry of the cache (it has ", in.k.size(0), ")");
    }
    if (in.cache_leftpad) {
      const int pad = in.cache_leftpad->data_ptr<int>()[b];
      TORCH_CHECK(pad >= 0 && pad <= length, "flashattn: cache_leftpad[", b, "] = ", pad,
                  " must be in [0, ", length, "], the sequence's length in the cache");
    }
  }
}

// Whether some rows of the outputs may belong to no sequence (varlen tokens past the last
// cu_seqlens entry, queries or keys past seqused): the kernels never write those, so the
// outputs start as 0 (LSE -inf), what FA2 gives a row that sees no key.
bool has_rows_outside_sequences(const AttnInputs& in) {
  return in.varlen() || in.seqused_q.has_value() || in.seqused_k.has_value();
}

at::Tensor alloc_output(at::IntArrayRef sizes, const at::TensorOptions& options,
                        const AttnInputs& in, double value) {
  at::Tensor t = at::empty(sizes, options);
  prepare_output(t, in, value);
  return t;
}

// out (and dout): q's shape with v's head dim.
std::vector<int64_t> out_shape(const AttnInputs& in) {
  std::vector<int64_t> shape = in.q.sizes().vec();
  shape.back() = in.v.size(-1);
  return shape;
}

std::vector<int64_t> lse_shape(const AttnInputs& in) {
  const at::Tensor& q = in.q;
  if (in.varlen()) return {q.size(1), q.size(0)};
  return {q.size(0), q.size(2), q.size(1)};
}

// out and dout: q's shape with v's head dim.
void check_out_shape(const at::Tensor& t, const char* name, const AttnInputs& in) {
  const std::vector<int64_t> expected = out_shape(in);
  TORCH_CHECK(t.sizes() == at::IntArrayRef(expected), "flashattn: ", name, " must have q's "
              "shape with v's head dim, ", at::IntArrayRef(expected), ", got ", t.sizes());
}

void check_lse_like(const at::Tensor& t, const char* name, const AttnInputs& in) {
  const std::vector<int64_t> expected = lse_shape(in);
  TORCH_CHECK(t.sizes() == at::IntArrayRef(expected), "flashattn: ", name, " must have shape ",
              in.varlen() ? "[heads, total_q] = " : "[batch, heads, seqlen_q] = ",
              at::IntArrayRef(expected), ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "flashattn: ", name, " must be float32, got ",
              t.scalar_type());
  check_same_device(t, name, in.q);
}

// Per-row statistics: [batch, heads, seqlen], or a varlen [heads, total].
TensorView stats_view(const at::Tensor& t, bool varlen) {
  void* ptr = const_cast<void*>(t.data_ptr());
  if (varlen) return {ptr, 0, t.stride(1), t.stride(0)};
  return {ptr, t.stride(0), t.stride(2), t.stride(1)};
}

const int* lengths_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<int>() : nullptr;
}

// ALiBi slopes [heads] or [batch, heads]: one element per (batch, head).
TensorView slopes_view(const at::Tensor& s) {
  const bool per_batch = s.dim() == 2;
  return {const_cast<void*>(s.data_ptr()), per_batch ? s.stride(0) : 0, 0,
          s.stride(per_batch ? 1 : 0)};
}

bool poisoning_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("FLASHATTN_POISON_OUTPUTS");
    return env != nullptr && env[0] == '1';
  }();
  return enabled;
}

}  // namespace

void poison_if_debugging(at::Tensor& t) {
  if (poisoning_enabled()) t.fill_(std::numeric_limits<double>::quiet_NaN());
}

void check_fwd(const AttnInputs& in, const ExecutorLimits& limits) {
  check_fp8_dtypes(in, limits);
  check_qkv(in, limits);
  TORCH_CHECK(!in.out_fp32 || in.q.scalar_type() != at::kDouble, "flashattn: out_fp32 asks "
              "for a float32 out of float16, bfloat16 or float32 inputs; q is float64, whose out "
              "is float64");
  check_sequence_lengths(in, limits);
  // Before the checks of the features FP8 refuses, so that the refusal is what a user sees.
  check_fp8_fwd(in);
  check_block_offsets(in, limits);
  check_kv_cache(in, limits);
  check_mask_options(in);
}

void prepare_output(at::Tensor& t, const AttnInputs& in, double value) {
  if (has_rows_outside_sequences(in)) {
    t.fill_(value);
  } else {
    poison_if_debugging(t);
  }
}

at::Tensor alloc_lse(const AttnInputs& in) {
  return alloc_output(lse_shape(in), in.q.options().dtype(at::kFloat), in,
                      -std::numeric_limits<double>::infinity());
}

std::tuple<at::Tensor, at::Tensor> check_and_alloc_fwd(const AttnInputs& in,
                                                       const ExecutorLimits& limits) {
  check_fwd(in, limits);
  at::Tensor out = alloc_output(out_shape(in), in.q.options().dtype(fwd_out_dtype(in)), in, 0.0);
  return {out, alloc_lse(in)};
}

AttnParams make_fwd_params(const AttnInputs& in, const at::Tensor& out, const at::Tensor& lse,
                           const at::Tensor& mask_blocks) {
  const bool varlen = in.varlen(), kv_varlen = varlen && !in.paged();
  const at::Tensor q = as_4d(in.q, varlen), k = as_4d(in.k, kv_varlen);
  AttnParams p;
  p.q = rows_view(in.q, varlen);
  p.k = rows_view(in.k, kv_varlen);
  p.v = rows_view(in.v, kv_varlen);
  p.o = rows_view(out, varlen);
  p.lse = stats_view(lse, varlen);
  p.batch = static_cast<int>(batch_size(in));
  p.seqlen_q = static_cast<int>(varlen ? *in.max_seqlen_q : q.size(1));
  p.seqlen_k = static_cast<int>(varlen ? *in.max_seqlen_k : k.size(1));
  if (in.paged())
    p.seqlen_k = static_cast<int>(std::min<int64_t>(varlen ? p.seqlen_k : kv_capacity(in),
                                                    kv_capacity(in)));
  p.total_q = varlen ? q.size(1) : int64_t(p.batch) * p.seqlen_q;
  p.total_k = kv_varlen ? k.size(1) : int64_t(k.size(0)) * k.size(1);
  p.kv_cache = kv_cache_of(in);
  p.num_splits = static_cast<int>(std::min<int64_t>(in.num_splits, INT_MAX));
  p.cu_seqlens_q = lengths_ptr(in.cu_seqlens_q);
  p.cu_seqlens_k = lengths_ptr(in.cu_seqlens_k);
  p.seqused_q = lengths_ptr(in.seqused_q);
  p.seqused_k = lengths_ptr(in.seqused_k);
  p.heads_q = static_cast<int>(q.size(2));
  p.heads_kv = static_cast<int>(k.size(2));
  p.head_group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  p.head_dim = static_cast<int>(q.size(3));
  p.head_dim_v = static_cast<int>(in.v.size(-1));
  p.scale_fp64 = resolved_scale(in);
  p.softcap_fp64 = in.softcap;
  p.scale = static_cast<float>(p.scale_fp64);
  p.softcap = static_cast<float>(p.softcap_fp64);
  // FA2's convention: causal is a window whose right edge is the diagonal.
  const bool block = in.block_offsets.has_value();
  p.window_left = clip_window(in.window_left, p.seqlen_q, p.seqlen_k, block);
  p.window_right = in.causal ? 0 : clip_window(in.window_right, p.seqlen_q, p.seqlen_k, block);
  if (block) p.block_offsets = in.block_offsets->data_ptr<int>();
  p.align_bottom_right = in.align_bottom_right;
  p.out_fp32 = in.out_fp32 && is_16_bit(q.scalar_type());
  if (in.alibi_slopes.has_value()) p.alibi = slopes_view(*in.alibi_slopes);
  if (in.attn_mask.has_value()) p.mask = mask_view(*in.attn_mask, mask_blocks, in.q, in.k);
  if (in.dropout_p > 0.0) {
    p.dropout.rng_state = in.rng_state->data_ptr<int64_t>();
    constexpr double kDraws = 4294967296.0;  // 2^32
    p.dropout.threshold = static_cast<uint64_t>(std::llround(in.dropout_p * kDraws));
    p.dropout.keep_scale_fp64 = in.dropout_p < 1.0 ? 1.0 / (1.0 - in.dropout_p) : 0.0;
    p.dropout.keep_scale = static_cast<float>(p.dropout.keep_scale_fp64);
  }
  return p;
}

void check_bwd(const AttnInputs& in, const BwdInputs& grads, const ExecutorLimits& limits) {
  const at::Tensor &q = in.q, &out = grads.out, &dout = grads.dout;
  check_no_fp8_bwd(in);
  TORCH_CHECK(!in.kv_cache() && in.num_splits <= 1, "flashattn: block_table, cache_batch_idx, "
              "cache_leftpad and num_splits are forward only (inference); the backward takes "
              "none of them");
  TORCH_CHECK(!in.out_fp32, "flashattn: out_fp32 is forward only; the backward takes out and "
              "dout in q's dtype");
  TORCH_CHECK(!grads.grads_fp32 || q.scalar_type() != at::kDouble, "flashattn: grads_fp32 asks "
              "for float32 dq, dk, dv of float16, bfloat16 or float32 inputs; q is float64, whose "
              "gradients are float64");
  check_qkv(in, limits);
  check_sequence_lengths(in, limits);
  check_block_offsets(in, limits);
  check_mask_options(in);
  check_rank(out, "out", in.varlen());
  check_rank(dout, "dout", in.varlen());
  check_out_shape(out, "out", in);
  check_out_shape(dout, "dout", in);
  TORCH_CHECK(out.scalar_type() == q.scalar_type() && dout.scalar_type() == q.scalar_type(),
              "flashattn: out and dout must have q's dtype ", q.scalar_type(), ", got ",
              out.scalar_type(), " and ", dout.scalar_type());
  check_same_device(out, "out", q);
  check_same_device(dout, "dout", q);
  check_last_dim_contiguous(out, "out");
  check_last_dim_contiguous(dout, "dout");
  check_lse_like(grads.lse, "lse", in);
  if (grads.dlse.has_value()) check_lse_like(*grads.dlse, "dlse", in);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> check_and_alloc_bwd(const AttnInputs& in,
                                                                   const BwdInputs& grads,
                                                                   const ExecutorLimits& limits) {
  check_bwd(in, grads, limits);
  const at::Tensor& q = in.q;
  const auto grad_options = [&](const at::Tensor& t) {
    return grads.grads_fp32 ? t.options().dtype(at::kFloat) : t.options();
  };
  at::Tensor dq = alloc_output(q.sizes(), grad_options(q), in, 0.0);
  at::Tensor dk = alloc_output(in.k.sizes(), grad_options(in.k), in, 0.0);
  at::Tensor dv = alloc_output(in.v.sizes(), grad_options(in.v), in, 0.0);
  return {dq, dk, dv};
}

at::Tensor alloc_mask_grad(const AttnInputs& in) {
  TORCH_CHECK(in.attn_mask.has_value() && in.attn_mask->is_floating_point(),
              "flashattn: attn_mask_grad needs a float attn_mask; a bool mask has no gradient");
  const at::Tensor &q = in.q, &k = in.k;
  return at::zeros({q.size(0), q.size(2), q.size(1), k.size(1)}, q.options().dtype(at::kFloat));
}

AttnBwdParams make_bwd_params(const AttnInputs& in, const BwdInputs& grads, const at::Tensor& dq,
                              const at::Tensor& dk, const at::Tensor& dv,
                              const at::Tensor& mask_blocks, const at::Tensor& dmask) {
  const bool varlen = in.varlen();
  AttnBwdParams p;
  static_cast<AttnParams&>(p) = make_fwd_params(in, grads.out, grads.lse, mask_blocks);
  if (dmask.defined()) p.dmask = dmask.data_ptr<float>();
  p.dout = rows_view(grads.dout, varlen);
  if (grads.dlse.has_value()) p.dlse = stats_view(*grads.dlse, varlen);
  p.dq = rows_view(dq, varlen);
  p.dk = rows_view(dk, varlen);
  p.dv = rows_view(dv, varlen);
  p.deterministic = in.deterministic;
  p.grads_fp32 = grads.grads_fp32 && is_16_bit(in.q.scalar_type());
  return p;
}

}  // namespace flashattn
