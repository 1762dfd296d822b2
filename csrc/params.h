// The parameter struct every executor (CPU, CUDA, the CUDA-on-CPU shim) receives.
//
// Shape and stride logic is done once, on the host, in attn_args.cpp; kernels only read
// these plain fields. Strides are in elements; the last dimension is always contiguous.
#pragma once
#include <cstdint>

#include "fast_divmod.h"
#include "host_device.h"

namespace flashattn {

// One tensor of attention rows, [batch, seqlen, heads, dim] with a contiguous last dim, seen
// through its element strides: any layout ((B, S, H, D), (B, H, S, D), a slice of packed QKV,
// an expanded tensor) reaches the kernels without a copy. The same view serves the per-row
// statistics [batch, heads, seqlen] (LSE, dLSE; row_stride 1, no dim) and the ALiBi slopes
// ([batch, heads] or [heads], batch_stride 0; one "row" each).
struct TensorView {
  void* ptr = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;

  // Row s of head h in batch b. T is the element type, const for an input.
  template <typename T>
  FLASHATTN_HOST_DEVICE T* row(int64_t b, int64_t h, int64_t s) const {
    return static_cast<T*>(ptr) + b * batch_stride + h * head_stride + s * row_stride;
  }
  // Row 0 of head h in batch b: the [seqlen, dim] matrix of one head, rows row_stride apart.
  template <typename T>
  FLASHATTN_HOST_DEVICE T* head(int64_t b, int64_t h) const {
    return row<T>(b, h, 0);
  }
};

// Shapes are written for a dense batch; in a variable-length batch (varlen) each [B, S, H, D]
// tensor is [total, H, D] instead, a view with batch_stride 0, and the LSE is [Hq, total_q].
// An attention mask as F.scaled_dot_product_attention takes it (attn_mask), broadcast to
// [B, Hq, Sq, Sk] by its strides (0 along broadcast dimensions): a boolean (true = the key
// takes part) or a float added to the logit. ptr is null without a mask. mask.h reads it.
enum class MaskKind : uint8_t { kBool, kFloat32, kBFloat16, kHalf, kFloat64 };

// What every entry of one block of the mask does (attn_args.cpp classifies each block once
// per call): kMaskHidden, every key is masked out (false / -inf), so a tile inside it is
// skipped; kMaskOpen, every entry leaves its logit as it is (true / 0), so a tile inside it
// takes the unmasked path; kMaskRead, anything else: the tile reads the mask.
constexpr uint8_t kMaskHidden = 0, kMaskOpen = 1, kMaskRead = 2;
constexpr int kMaskBlock = 32;  // rows and keys per block; every kernel tile is a multiple

struct AttnMask {
  const void* ptr = nullptr;
  MaskKind kind = MaskKind::kBool;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0, key_stride = 0;
  // [B, Hq, ceil(Sq / kMaskBlock), ceil(Sk / kMaskBlock)] block classes, broadcast by strides.
  const uint8_t* blocks = nullptr;
  int64_t block_batch_stride = 0, block_head_stride = 0, block_row_stride = 0,
          block_key_stride = 0;
};

// Attention dropout (dropout.h): off when rng_state is null.
struct Dropout {
  const int64_t* rng_state = nullptr;  // [seed, offset], int64, on the tensors' device
  uint64_t threshold = 0;              // a key is kept iff its 32-bit draw >= round(p * 2^32)
  float keep_scale = 1.f;              // 1 / (1 - p) for kept keys; 0 when p = 1
  double keep_scale_fp64 = 1.0;        // the same, for the CPU's float64 path

  FLASHATTN_HOST_DEVICE bool on() const { return rng_state != nullptr; }
};

// Where keys live when they are a KV cache (flash_attn_with_kvcache, and block_table in the
// varlen forward). Forward only. kv_rows.h reads it.
struct KvCache {
  // Paged: int32 [B, max_blocks]; key j of sequence b is row j % page_size of page
  // block_table[b][j / page_size], and k, v are [num_pages, page_size, Hkv, D] views (their
  // batch stride steps from page to page). null: k, v are dense [B_cache, S_cache, Hkv, D].
  const int* block_table = nullptr;
  int64_t block_table_stride = 0;  // elements from one sequence's row of the table to the next
  int max_blocks = 0;
  // Rows per page, with the division by it (key j: table entry j / page_size). Assigned an
  // int, which builds the divisor.
  FastDivmod page_size;
  int num_pages = 0;
  // cache_batch_idx: sequence b reads the keys of cache entry batch_index[b] (int32 [B]; dense
  // caches only), of the cache's cache_batch entries. null: entry b.
  const int* batch_index = nullptr;
  int cache_batch = 0;
  // cache_leftpad: sequence b's keys start at row leftpad[b] of its cache entry (int32 [B];
  // dense caches only); the rows before it take no part. null: row 0.
  const int* leftpad = nullptr;

  FLASHATTN_HOST_DEVICE bool paged() const { return block_table != nullptr; }
};

struct AttnParams {
  TensorView q;  // [B, Sq, Hq, D]
  TensorView k;  // [B, Sk, Hkv, D]
  TensorView v;  // [B, Sk, Hkv, Dv] (Dv = head_dim_v)
  TensorView o;  // [B, Sq, Hq, Dv], written
  // LSE [B, Hq, Sq], fp32, written. Natural-log log-sum-exp of the scores; -inf for a row that
  // sees no key.
  TensorView lse;

  int batch = 0;
  // The longest query / key sequence: every sequence's length when dense, max_seqlen_* (an upper
  // bound, which sizes grids and scratch) in a varlen batch.
  int seqlen_q = 0;
  int seqlen_k = 0;
  // GQA decoding on CUDA (cuda/gqa_decode.h): 1, or g > 1 when the forward's CTAs take the g
  // query heads of one kv head as the rows of one tile. Then heads_q is heads_kv, head_group 1,
  // seqlen_q and total_q count rows (g per query token), and row r of a sequence (QueryRows
  // there) is its query r / g of query head h * g + r % g; q, o and lse keep their views.
  // Placed in the 4 bytes of padding before total_q: growing the struct moved the backward's
  // parameters and made ptxas spill its dK/dV kernel (d = 128, sm_80).
  int packed_heads = 1;
  // Query / key rows in all: batch * seqlen_* when dense, the tensors' token count in varlen.
  int64_t total_q = 0;
  int64_t total_k = 0;
  // Varlen: sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, its keys
  // rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k; int32 [batch + 1], on the tensors'
  // device. nullptr when dense.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // Only the first seqused_q[b] queries and seqused_k[b] keys of sequence b take part (FA3's
  // seqused); int32 [batch], or nullptr for all. Dense or varlen.
  const int* seqused_q = nullptr;
  const int* seqused_k = nullptr;

  int heads_q = 0;
  int heads_kv = 0;
  int head_group = 1;  // heads_q / heads_kv: query head h reads kv head h / head_group
  int head_dim = 0;    // of q and k

  float scale = 1.f;    // softmax scale applied to q·k
  float softcap = 0.f;  // > 0: s = softcap * tanh(s / softcap), after scaling
  // The same two in full precision, for executors that compute in fp64 (the CPU's float64
  // path, which gradcheck and the float64 tests compare against an fp64 reference).
  double scale_fp64 = 1.0;
  double softcap_fp64 = 0.0;

  // Which keys a query row of a sequence sees (mask.h, Sequence): row i sees key j iff
  //   (window_left  < 0 || j >= i + diag_offset - window_left) &&
  //   (window_right < 0 || j <= i + diag_offset + window_right),
  // where diag_offset is the sequence's Sk - Sq for FA2's bottom-right alignment and 0 for
  // SDPA's top-left alignment. Causal attention is window_right = 0.
  int window_left = -1;
  int window_right = -1;
  bool align_bottom_right = true;
  // out is float32 though q, k, v are 16-bit (fwd's internal out_fp32, schema.h): the
  // normalized O_i is stored without rounding to 16 bits, so that flashattn.distributed's ring
  // merges its blocks' partial outputs in float32 and rounds once. False for 32/64-bit inputs,
  // whose out has their dtype. Forward only. In the padding after align_bottom_right (below).
  bool out_fp32 = false;
  // The head dim of v, out (and dout, dv): head_dim, or another (MLA: q and k 192, v 128; an
  // absorbed decode 576 and 512). Placed in the padding after align_bottom_right, as
  // packed_heads is, so the struct the CUDA kernels receive keeps its size.
  int head_dim_v = 0;

  // ALiBi slopes, fp32, [B, Hq] or [Hq] (batch_stride 0); ptr is null without ALiBi. Adds
  // -slope * |i + diag_offset - j| to the (soft-capped) score. alibi_slope() in mask.h reads it.
  TensorView alibi;

  // attn_mask (dense batches only): added to the logit after softcap and ALiBi.
  AttnMask mask;

  // Dropout of the probabilities P_ij (after the softmax; the LSE is that of the full P).
  Dropout dropout;

  KvCache kv_cache;

  // Context parallelism (flashattn.distributed): the call is one block of a larger attention.
  // int32 [batch, 5] on the tensors' device, per sequence b: (row_offset, key_offset,
  // head_offset, diagonal, sequence): its local query row i, key j and query head h are row
  // row_offset + i, key key_offset + j and head head_offset + h of sequence `sequence` of the
  // whole attention, whose own diagonal offset is `diagonal` (its Sk - Sq aligned bottom-right,
  // 0 top-left). Masks, ALiBi and dropout then act on the whole attention's positions (mask.h,
  // sequence_of); align_bottom_right is unused. null: the call is the whole attention.
  const int* block_offsets = nullptr;

  // Split-KV: each (sequence, head, query block) splits its visible key blocks into num_splits
  // contiguous parts (split_part() in mask.h), computed independently and merged by their LSEs.
  // 1: no split. The device kernels write the parts to a scratch passed beside these params
  // (mask.h, split_out_row): not a field here, as the backward shares this struct, and its
  // kernels sit at the register limit, where 8 more bytes of parameters made ptxas spill.
  int num_splits = 1;
};

// The FP8 forward's descale factors (fwd's q_descale, k_descale, v_descale; fp8_args.h), fp32
// [B, Hkv] each, seen as TensorViews with batch_stride and head_stride (row_stride unused);
// ptr null where not given (1). Beside AttnParams, not in it: only the FP8 launch reads them, and
// the struct the other kernels receive keeps its size.
struct Fp8Descales {
  TensorView q, k, v;
};

// flash_attn_with_kvcache's in-place append of the new keys and values, with the rotary
// embedding of keys and queries (kv_append.h). Forward only.
struct KvAppendParams {
  TensorView k_new, v_new;      // [B, S_new, Hkv, D]
  TensorView k_cache, v_cache;  // as AttnParams.k / v; written
  KvCache cache;                // paged, cache_batch_idx (positions are absolute: no leftpad)
  // New key t of sequence b goes to key position cache_seqlens[b] + t; positions past
  // `capacity` are skipped (the CPU rejects them first).
  const int* cache_seqlens = nullptr;
  int capacity = 0;
  int batch = 0, seqlen_new = 0, heads_kv = 0, head_dim = 0;
  int head_dim_v = 0;  // of v_new and v_cache (head_dim: of k_new, k_cache and q)
  // Rotary embedding, or rotary_dim 0: cos, sin [rotary_rows, rotary_dim / 2] in q's dtype,
  // pairs (d, d + rotary_dim / 2) (GPT-NeoX), or (2d, 2d + 1) when interleaved (GPT-J).
  TensorView cos, sin;
  int rotary_dim = 0, rotary_rows = 0;
  bool interleaved = true;
  // q [B, Sq, Hq, D] rotated into q_rotated: query i of sequence b at position
  // cache_seqlens[b] + i when q_position_per_token (causal or local), else cache_seqlens[b].
  TensorView q, q_rotated;
  int seqlen_q = 0, heads_q = 0;
  bool q_position_per_token = false;
};

struct AttnBwdParams : AttnParams {
  TensorView dout;  // [B, Sq, Hq, Dv]
  // dLSE [B, Hq, Sq] fp32, or ptr null when the LSE output has no gradient.
  TensorView dlse;

  // Freshly allocated, written: dQ [B, Sq, Hq, D], dK [B, Sk, Hkv, D], dV [B, Sk, Hkv, Dv].
  TensorView dq;
  TensorView dk;
  TensorView dv;

  // The gradient of a float attn_mask, dL/dlogit: fp32 [B, Hq, Sq, Sk] contiguous, zeroed
  // before the kernels, which write the entries of the tiles they visit; null when not wanted.
  float* dmask = nullptr;

  bool deterministic = false;
  // dq, dk, dv are float32 though q, k, v are 16-bit (bwd's internal grads_fp32, schema.h): the
  // float32 sums are stored without rounding to 16 bits, so that flashattn.distributed's ring
  // adds its blocks' gradients in float32 and rounds once. False for 32/64-bit inputs, whose
  // gradients have their dtype. In the padding after deterministic.
  bool grads_fp32 = false;
};

}  // namespace flashattn
