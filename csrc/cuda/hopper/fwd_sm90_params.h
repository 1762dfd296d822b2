// The sm_90a forward's own arguments (issue 31, stage 4): a small struct, not AttnParams, until
// the architecture-aware plan wires the kernel into the dispatch. The tensors are AttnParams'
// layouts: Q, O [B, Sq, Hq, D], K, V [B, Sk, Hkv, D], each seen through element strides with a
// contiguous last dimension; the LSE [B, Hq, Sq] (fp32, rows contiguous), natural log, -inf for
// a row that sees no key (the sm_80 kernel's convention).
//
// Q, K, V and O reach the kernel as TMA tensor maps (tensor_map.h), 4D boxes of (64 columns of the
// head dimension = one 128-byte swizzle row (128 columns of e4m3), rows, 1 head, 1 batch), which
// make_fwd_sm90_maps encodes. TMA needs 16-byte aligned base pointers and strides: every stride a multiple of 8
// elements. Rows beyond Sq / Sk read as zeros (the box is zero-filled out of bounds).
#pragma once
#include <cstdint>
#include <string>

#include "cuda/hopper/bshd_map.h"
#include "cuda/hopper/fwd_sm90_config.h"
#include "cuda/tensor_map.h"

namespace flashattn::hopper {

struct FwdSm90Params {
  // (O [B, Sq, Hq, D] is written through its tensor map.)
  // LSE [B, Hq, Sq], written (element strides; rows contiguous).
  float* lse = nullptr;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int batch = 0, seqlen_q = 0, seqlen_k = 0;
  int heads_q = 0, head_group = 1;  // query head h reads kv head h / head_group
  // Batch b takes part with its first seqused_q[b] queries and seqused_k[b] keys only (int32 [B],
  // clamped to its length; FA3's seqused, AttnParams' fields); null: all of them.
  const int* seqused_q = nullptr;
  const int* seqused_k = nullptr;
  // Varlen (AttnParams' cu_seqlens_*, int32 [B + 1], both or neither): sequence b's queries are
  // rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed Q, O and LSE (total_q rows), its
  // keys rows [cu_seqlens_k[b], ...) of K and V (total_k rows); the maps then span the packed rows
  // with a batch extent of 1, and seqlen_q / seqlen_k are the longest sequences' lengths.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;
  // O itself (element strides, as its map): a varlen batch or seqused_q writes O from registers,
  // only the rows of the sequence (the next sequence's rows share the map's 64-row boxes).
  void* o = nullptr;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // Split-KV (num_splits > 1, AttnParams' num_splits): the grid's x holds num_splits CTAs per
  // query tile, each taking a part of its key tiles (mask.h split_part) and writing its O / l and
  // LSE in fp32 to split_scratch instead of O and the LSE, for split_merge_kernel.cuh. The
  // scratch's layout is mask.h's (split_out_row, split_lse_of): num_splits parts of
  // split_o_elements floats with O's element strides, then num_splits parts of
  // split_lse_elements floats with the LSE's.
  int num_splits = 1;
  float* split_scratch = nullptr;
  int64_t split_o_elements = 0, split_lse_elements = 0;
  float scale_log2 = 0.f;           // softmax scale * log2(e): exp2 takes the scores directly
  // The kSoftcap kernels: logit = softcap * tanh(s * scale_over_softcap), scale_over_softcap =
  // softmax scale / softcap (then scale_log2 is not used).
  float softcap = 0.f, scale_over_softcap = 0.f;
  // The kAlibi kernels: the (softcapped) logit plus -slope * |i + diag_offset - j|, slope
  // alibi_slopes[b * alibi_batch_stride + h * alibi_head_stride] (fp32; a batch stride of 0 for
  // [Hq] slopes), and the softmax
  // scale itself (the logit is scale * s without a softcap).
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0, alibi_head_stride = 1;
  float scale = 0.f;
  // Causal kernels: row i sees key j iff j <= i + (align_bottom_right ? Sk - Sq : 0), FA2's
  // alignment by default, SDPA's (top-left) otherwise (AttnParams' field of the same name).
  bool align_bottom_right = true;
  // The kLocal kernels: row i sees key j iff (window_left < 0 || j >= i + diag_offset -
  // window_left) && (window_right < 0 || j <= i + diag_offset + window_right), diag_offset as
  // for causal (AttnParams' fields of the same names).
  int window_left = -1, window_right = -1;
  // (Last, so that the fields above keep their offsets: the other kernels' code is unchanged.)
  // The kAttnMask kernels: attn_mask (AttnParams' view, broadcast to [B, Hq, Sq, Sk] by its
  // strides; score_bias.h mask_bias reads it) added to the logit after softcap and ALiBi, before
  // the visibility mask, as on sm_80 (score_rules.cuh step 4); its block classes let a tile whose
  // blocks are all open skip the reads.
  AttnMask attn_mask;
  // The kGatherKv kernels (fwd_sm90_gather.cuh): K and V are AttnParams' views of a KV cache
  // that is paged or indexed (cache_batch_idx, cache_leftpad), read row by row through
  // kv_rows.h key_row instead of their tensor maps.
  TensorView k_cache, v_cache;
  KvCache kv_cache;
  // The kDropout kernels: dropout of P (AttnParams' view: the [seed, offset] on the device, the
  // threshold and 1 / (1 - p)), the keep mask of dropout.h at the sequence's (b, h, row, key).
  Dropout dropout;
  // Packed GQA heads (gqa_decode.h; AttnParams' packed_heads): 1, or g > 1 when a CTA takes the g
  // query heads of kv head blockIdx.y as rows, token-major: row j of consumer c's 64 is query
  // token c T + j / g of the tile's tokens, of query head blockIdx.y g + j % g, for
  // T = fwd_sm90_consumer_tokens(g) tokens per consumer. seqlen_q (and seqused_q) then count
  // tokens, heads_q is Hkv, head_group 1; the LSE and O's rows are the query heads' own.
  // consumer_tokens is T (64 unpacked), set with packed_heads so that the kernel divides by
  // neither.
  int packed_heads = 1;
  int consumer_tokens = 64;
  // The FP8 (e4m3) kernels: descale factors (fp32 [B, Hkv], element strides, each tensor its
  // own; null: 1), FA3's. The scores are (Q K^T) * q_descale * k_descale and O is
  // (P V) * v_descale.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_batch_stride = 0, q_descale_head_stride = 1;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 1;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 1;
  // The walking kernels (fwd_sm90_walk.h): the call's place counter, 4 bytes of device memory
  // of its own (never shared with a concurrent launch), which launch_fwd_sm90 zeroes on the
  // launch's stream; needed only when the tiles outnumber the SMs (fwd_sm90_walk_counts), else
  // null or ignored. Unused by the other kernels.
  unsigned* tile_counter = nullptr;
};

struct FwdSm90Maps {
  TensorMap q, k, v, o;
};

// Where one [B, S, H, D] input lives, for make_fwd_sm90_maps.
using FwdSm90Input = BshdTensor;

// The Q box's query tokens (of packed_heads rows each): a whole CTA's when its two consumers'
// rows are contiguous (g divides 64: always without packing), else one consumer's, loaded twice.
FLASHATTN_HOST_DEVICE constexpr int fwd_sm90_q_box_tokens(int packed_heads) {
  const int g = packed_heads > 1 ? packed_heads : 1;
  return 64 % g == 0 ? 128 / g : 64 / g;
}

// Encodes the four maps. K and V: dims (D, S, H, B), byte strides of rows, heads and batches,
// boxes of (one 128-byte swizzle row, block_n rows, 1, 1). Q and O: dims (D, H, S, B), boxes of
// (one swizzle row, g heads, tokens, 1) for g = packed_heads (1 without packed GQA heads), which
// land as the rows token-major: Q's of fwd_sm90_q_box_tokens tokens (block_m rows without
// packing), O's of one consumer's fwd_sm90_consumer_tokens. All with the 128-byte swizzle.
// o_dtype: O's, when it differs from Q's, K's and V's (the FP8 forward: UInt8 in, BFloat16 out).
// "" on success, else the encoder's reason.
inline std::string make_fwd_sm90_maps(FwdSm90Maps& maps, TensorMapDtype dtype, int head_dim,
                                      int batch, const FwdSm90Input& q, const FwdSm90Input& k,
                                      const FwdSm90Input& v, const FwdSm90Input& o, int block_m,
                                      int block_n, int packed_heads, TensorMapDtype o_dtype) {
  const int g = packed_heads > 1 ? packed_heads : 1;
  std::string error = encode_bshd_map(&maps.k, dtype, head_dim, batch, k, block_n);
  if (!error.empty()) return "K: " + error;
  error = encode_bshd_map(&maps.v, dtype, head_dim, batch, v, block_n);
  if (!error.empty()) return "V: " + error;
  const int q_tokens = g == 1 ? block_m : fwd_sm90_q_box_tokens(g);
  error = encode_head_major_map(&maps.q, dtype, head_dim, batch, q, g, q_tokens);
  if (!error.empty()) return "Q: " + error;
  error = encode_head_major_map(&maps.o, o_dtype, head_dim, batch, o, g, g == 1 ? 64 : fwd_sm90_consumer_tokens(g));
  if (!error.empty()) return "O: " + error;
  return "";
}

// Q, K, V and O of one dtype (the 16-bit forward).
inline std::string make_fwd_sm90_maps(FwdSm90Maps& maps, TensorMapDtype dtype, int head_dim,
                                      int batch, const FwdSm90Input& q, const FwdSm90Input& k,
                                      const FwdSm90Input& v, const FwdSm90Input& o, int block_m,
                                      int block_n, int packed_heads = 1) {
  return make_fwd_sm90_maps(maps, dtype, head_dim, batch, q, k, v, o, block_m, block_n, packed_heads, dtype);
}

}  // namespace flashattn::hopper
