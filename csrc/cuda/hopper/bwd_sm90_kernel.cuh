// The sm_90a attention backward's main kernel (issue 31, stage 5): warp-specialized, TMA ->
// mbarrier ring -> wgmma, dK and dV in registers, dQ added into an fp32 accumulator in global
// memory by bulk reduce-adds. FA3's design (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp), written
// as plain CUDA with PTX only through ptx.cuh so the CPU shim (tests/cudasim) runs it.
//
// Grid (ceil(Sk / 128), Hkv, B); 384 threads; BwdSm90Config's dynamic shared memory. One CTA
// per key block of one kv head walks every query block of every query head of its group (GQA:
// dK and dV of the kv head are summed over its query heads in registers, so no second pass and
// no atomics on dK/dV).
// - Warpgroup 0, the producer, gives registers back (setmaxnreg.dec). Warp 0's thread 0 loads K
//   and V once (kv_full), then per query block Q, dO (TMA) and the rows' LSE * log2(e) and D
//   (bulk copies) into ring stage s (q_full[s]) after waiting q_empty[s]. Warp 1's thread 0 is
//   the dQ writer: per query block and consumer it waits dq_full[c], adds the consumer's 64 x 64
//   fp32 part into the accumulator with cp.reduce.async.bulk add.f32, waits for the source to be
//   read and gives the buffer back (dq_empty[c]).
// - Warpgroups 1 and 2, the consumers (setmaxnreg.inc), own 64 keys each. Per query block, keys
//   as rows (the m64 of wgmma):
//     S^T = K Q^T, dP^T = V dO^T          wgmma ss, K-major, m64 n{kBlockM}
//     P^T = exp2(S^T * scale * log2e - LSE_i * log2e), masked entries 0 (the kAlibi and
//       kSoftcap loops: the logit's bias or tanh first, below)
//     dS^T = P^T * (dP^T - D_i)
//     dV += P^T dO, dK += dS^T Q          wgmma rs: A = the accumulators rounded to 16 bits (the
//                                          m64nN D layout is the m64k16 A layout), B MN-major
//     dS^T -> shared memory (stmatrix), one named barrier for both consumers
//     dQ part = dS K                       wgmma ss, A (dS) and B (K) MN-major, m64 n64
//   then release the stage and hand the dQ part to the dQ writer. dK is scaled once at the end;
//   dQ's scale is applied by the convert kernel.
//
// Lines marked "// SITE:name" are named by tests/test_cudasim_hopper_bwd.py.
#pragma once
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "cuda/element.cuh"
#include "cuda/hopper/bwd_sm90_config.h"
#include "cuda/hopper/bwd_sm90_params.h"
#include "cuda/hopper/fwd_sm90_mask.cuh"  // causal_diag_offset, KeyWindow
#include "cuda/hopper/sm90_dropout.cuh"
#include "cuda/logit.cuh"                   // kLog2e
#include "cuda/ptx.cuh"
#include "cuda/tensor_map.h"

namespace flashattn::hopper {

// Named barrier 1: both consumers' dS^T of a query block are in shared memory.
constexpr unsigned kDsReadyBarrier = 1;

// D[64 x N] (+)= A * B over one k16 step, A and B from shared memory.
template <typename Elem, int N, ptx::WgmmaMajor kMajorA, ptx::WgmmaMajor kMajorB>
__device__ __forceinline__ void bwd_wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d FLASHATTN_CALLER_SITE) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    ptx::wgmma_bf16_ss<N, kMajorA, kMajorB>(d, desc_a, desc_b, scale_d FLASHATTN_CALLER_SITE_ARGS);
  } else {
    ptx::wgmma_f16_ss<N, kMajorA, kMajorB>(d, desc_a, desc_b, scale_d FLASHATTN_CALLER_SITE_ARGS);
  }
}

// D[64 x N] += A * B over one k16 step, A from registers, B MN-major.
template <typename Elem, int N>
__device__ __forceinline__ void bwd_wgmma_rs(float (&d)[N / 2], const uint32_t* a,
                                             uint64_t desc_b FLASHATTN_CALLER_SITE) {
  const uint32_t frag[4] = {a[0], a[1], a[2], a[3]};
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    ptx::wgmma_bf16_rs<N, ptx::WgmmaMajor::MN>(d, frag, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  } else {
    ptx::wgmma_f16_rs<N, ptx::WgmmaMajor::MN>(d, frag, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  }
}

// kN fp32 accumulator elements rounded into kN / 2 packed pairs: for an m64nN accumulator, k16
// step kk's A fragment is pairs 4kk..4kk+3 (ptx_sm90_mma.cuh's layouts).
template <typename Elem, int kN>
__device__ __forceinline__ void pack_pairs(const float (&x)[kN], uint32_t (&out)[kN / 2]) {
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) out[i] = cuda::pack_rn<Elem>(x[2 * i], x[2 * i + 1]);
}

// Whether this consumer's tile of query block m0 (its 64 keys from keys_begin x kN queries, clipped
// to the sequence) reads attn_mask: not when every kMaskBlock block it touches is open (adds 0), as
// sm_80's kMaskOpen tiles (mask.h mask_tile). Where it is looked up is per head dim (the kernel's
// kMaskClassEarly), by what ptxas allocates without spilling.
template <int kN>
__device__ __forceinline__ bool bwd_attn_mask_reads(const BwdSm90Params& p, int batch, int head, int m0,
                                                    int seqlen_q, int seqlen_k, int keys_begin) {
  const int rows_end = m0 + 2 * kN < seqlen_q ? m0 + 2 * kN : seqlen_q;
  const int keys_end = keys_begin + 64 < seqlen_k ? keys_begin + 64 : seqlen_k;
  return m0 < rows_end && keys_begin < keys_end &&
         mask_tile(p.attn_mask, batch, head, m0, rows_end, keys_begin, keys_end) != kMaskOpen;
}

// S^T (m64 keys x kN queries) := scale * S^T - ALiBi's bias + attn_mask's bias (reads:
// bwd_attn_mask_reads), the natural-log logit (score_bias.h mask_bias, fp32; the forward's order:
// scale, ALiBi, then the mask). alibi_slope: the head's slope, 0 without ALiBi (a slope of 0 adds
// nothing either way); alibi_dist: element 0's query + offset - key (its distance, signed).
// Element i is key key_row + 8 ((i % 4) / 2), query m0 + 8 (i / 4) + 2 tq + i % 2; entries past the
// sequence are not read (the mask ends there; visibility hides them).
// kScaled: s already holds the softcapped logit (bwd_softcap_logits_parked), not scaled again.
template <int kN, bool kScaled = false>
__device__ __forceinline__ void bwd_attn_mask_logits(float (&s)[kN], const BwdSm90Params& p, bool reads, int batch, int head,
                                                     int m0, int key_row, int tq, int seqlen_q, int seqlen_k,
                                                     float alibi_slope, float alibi_dist) {
  if constexpr (!kScaled) {
#pragma unroll
    for (int i = 0; i < kN; ++i) s[i] *= p.scale;
  }
  if (alibi_slope != 0.f) {
#pragma unroll
    for (int i = 0; i < kN; ++i)
      s[i] -= alibi_slope * fabsf(alibi_dist + static_cast<float>(8 * (i / 4) + i % 2 - 8 * ((i % 4) / 2)));
  }
  if (!reads) return;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int key = key_row + 8 * ((i % 4) / 2), query = m0 + 8 * (i / 4) + 2 * tq + i % 2;
    if (query < seqlen_q && key < seqlen_k) s[i] += mask_bias(p.attn_mask, batch, head, query, key);
  }
}

// Where a thread parks kN / 2 packed pairs (bwd_softcap_logits_parked) until the dS^T pass: its
// warp's 16 rows of this consumer's half of dS buffer `ds_tile`, which the warp's own stmatrix
// overwrites only after the dS^T pass has read them back (both consumers' dQ MMAs of the buffer's
// previous query block ended before the last ds_ready barrier). Pair k is word 32 (k % 16) + lane
// of chunk k / 16 (16 rows x 128 bytes = 16 words per lane): conflict-free, and it fits exactly
// (kN / 2 pairs of 16 bits = the warp's kN x 16 dS^T entries).
template <int kDsChunkBytes>
__device__ __forceinline__ uint32_t* bwd_park_slot(unsigned char* ds_tile, int consumer, int warp, int lane, int k) {
  return reinterpret_cast<uint32_t*>(ds_tile + (k / 16) * kDsChunkBytes + (64 * consumer + 16 * warp) * kSwizzleRowBytes) +
         32 * (k % 16) + lane;
}

// s := softcap * tanh(scale * s / softcap), the forward's softcapped logit (apply_softcap), and
// softcap's chain factor 1 - tanh^2 of each element parked in shared memory as fp16 pairs
// (bwd_park_slot), for the dS^T pass. The softcap loops recover tanh from P instead; with
// attn_mask that would read the mask a second time (its bias is in log P), and holding the
// factors across dP^T's wait costs kN registers.
template <int kN, int kDsChunkBytes>
__device__ __forceinline__ void bwd_softcap_logits_parked(float (&s)[kN], const BwdSm90Params& p, unsigned char* ds_tile,
                                                          int consumer, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < kN; i += 2) {
    const float t0 = cuda::tanh_accurate(s[i] * p.scale_over_softcap);
    const float t1 = cuda::tanh_accurate(s[i + 1] * p.scale_over_softcap);
    FLASHATTN_SMEM(bwd_park_slot<kDsChunkBytes>(ds_tile, consumer, warp, lane, i / 2))[0] =
        cuda::pack_rn<__half>(1.f - t0 * t0, 1.f - t1 * t1);  // SITE:park_softcap
    s[i] = p.softcap * t0;
    s[i + 1] = p.softcap * t1;
  }
}

// The main loops, each its own instantiation (kernel_list.py, launch_bwd_sm90.cuh): kCausal /
// kLocal, the mask (causal is the window (-1, 0); at most one of them): which query blocks a key
// block visits, which of those need the mask (QueryBlocks), and the mask itself. kAlibi: ALiBi's
// bias (BwdSm90Params::alibi_slopes) in the recomputed P^T of every block. kSoftcap: logits
// softcap * tanh(scale * s / softcap) in P^T, and dS^T times 1 - tanh^2 (the kAlibi loops
// take softcap at run time instead, BwdSm90Params::softcap > 0, the bias added after it, where
// bwd_sm90_alibi_takes_softcap; elsewhere ALiBi with softcap is kAlibi and kSoftcap).
// kAttnMask: attn_mask's bias (BwdSm90Params::attn_mask) added to the logit scale * s of P^T,
// read from global memory per block; ALiBi's bias before it at run time (alibi_slopes non-null);
// with kSoftcap, the logit softcapped first and 1 - tanh^2 parked in shared memory for dS^T
// (bwd_softcap_logits_parked; at d = 128 built in files of their own,
// bwd_sm90_attn_mask_softcap_apart).
// kDropout: dropout (BwdSm90Params::dropout), the forward's keep mask recomputed
// (sm90_dropout.cuh): dV takes the dropped P^T * Z / (1 - p), dS^T = P^T * (dP^T * Z / (1 - p) - D)
// (score_rules.cuh's backward); neither with ALiBi, softcap nor attn_mask.
template <typename Elem, int kHeadDim, bool kCausal, bool kLocal = false, bool kAlibi = false, bool kSoftcap = false,
          bool kAttnMask = false, bool kDropout = false>
__global__ void __launch_bounds__(BwdSm90Config<kHeadDim>::kThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                    const __grid_constant__ TensorMap map_v, const __grid_constant__ TensorMap map_do,
                    const BwdSm90Params p, const DqAccumLayout<kHeadDim> dq_layout) {
  using namespace flashattn::ptx;
  using Cfg = BwdSm90Config<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem_base);
  unsigned char* smem =
      smem_base + (kSwizzleAtomBytes - smem_u32addr(smem_base) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* q_full = kv_full + 1;
  uint64_t* q_empty = q_full + kStages;
  uint64_t* dq_full = q_empty + kStages;
  uint64_t* dq_empty = dq_full + Cfg::kConsumers;
  uint64_t* tail_loaded = dq_empty + Cfg::kConsumers;

  const int tid = threadIdx.x, group = tid / 128;
  const int n_block = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  // This sequence's rows (a varlen batch: its range of the packed rows; seqused: its first rows).
  // The grid covers the longest sequence: a key block past this one's keys has nothing to do.
  const BwdSm90Seq seq = bwd_sm90_seq<kBlockM>(p, batch);
  if (n_block * kBlockN >= seq.seqlen_k) return;
  const KeyWindow window = key_window<kCausal, kLocal>(
      causal_diag_offset(p.align_bottom_right, seq.seqlen_q, seq.seqlen_k), p.window_left, p.window_right);
  const QueryBlocks<kCausal, kLocal, kBlockM, kBlockN> blocks(n_block, seq.seqlen_q, seq.seqlen_k, window.offset,
                                                              window.left, window.right);
  const int n_m = blocks.end - blocks.begin;
  const int n_iters = n_m * p.head_group;  // (query head of the group, query block) pairs
  auto head_of = [&](int it) { return kv_head * p.head_group + it / n_m; };
  auto m_block_of = [&](int it) { return blocks.begin + it % n_m; };

  if (tid == 0) {
    tma_prefetch_descriptor(&map_q);
    tma_prefetch_descriptor(&map_k);
    tma_prefetch_descriptor(&map_v);
    tma_prefetch_descriptor(&map_do);
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&q_full[s], 1);
      mbarrier_init(&q_empty[s], Cfg::kConsumers);
    }
    for (int c = 0; c < Cfg::kConsumers; ++c) {
      mbarrier_init(&dq_full[c], 128);
      mbarrier_init(&dq_empty[c], 1);
    }
    mbarrier_init(tail_loaded, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  if (group == 0) {
    // ---- Producer warpgroup ----
    setmaxnreg_dec<Cfg::kProducerRegisters>();
    if (tid == 0 && n_iters > 0) {
      // Warp 0: the loads. The maps span every row (varlen: all sequences' packed rows): a tile
      // reaching past the sequence holds rows of the next sequence, or rows past seqused, maybe
      // NaN or Inf. Masking their scores is not enough (P = 0 times a NaN in dO, Q, K or V is NaN
      // in dV, dK or dQ), so such a tile is loaded onto tail_loaded, its outside rows are zeroed,
      // and then it is handed over, as sm_80's zero-filling copies leave them. Rows past the map
      // arrive as zeros from TMA already. Whole 128-byte rows: the swizzle permutes 16-byte
      // chunks within a row only.
      const bool varlen = p.varlen();
      const int map_batch = seq.map_batch;
      const int64_t q_map_rows = varlen ? p.total_q : p.seqlen_q, k_map_rows = varlen ? p.total_k : p.seqlen_k;
      const int q_row0 = static_cast<int>(seq.q_row0), k_row0 = static_cast<int>(seq.k_row0);
      uint32_t tail_phase = 0;
      auto wait_tail = [&] {
        mbarrier_wait_parity(tail_loaded, tail_phase);
        tail_phase ^= 1;
      };
      // Rows [first_row, rows) of each chunk of a tile.
      auto zero_rows = [&](unsigned char* tile, uint32_t chunk_bytes, int first_row, int rows) {
        for (int c = 0; c < Cfg::kChunks; ++c) {
          uint4* from = reinterpret_cast<uint4*>(tile + c * chunk_bytes + first_row * kSwizzleRowBytes);
          for (int i = 0; i < (rows - first_row) * static_cast<int>(kSwizzleRowBytes / 16); ++i)
            FLASHATTN_SMEM(from)[i] = make_uint4(0, 0, 0, 0);  // SITE:zero_tail
        }
      };
      const int k_valid = seq.seqlen_k - n_block * kBlockN;
      const bool zero_kv = k_valid < kBlockN && k_row0 + seq.seqlen_k < k_map_rows;
      uint64_t* kv_bar = zero_kv ? tail_loaded : kv_full;
      mbarrier_arrive_expect_tx(kv_bar, 2 * Cfg::kKvBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kChunks; ++c) {
        tma_load_4d(smem + Cfg::kKOffset + c * Cfg::kKvChunkBytes, &map_k, kv_bar, 64 * c,
                    k_row0 + n_block * kBlockN, kv_head, map_batch);  // SITE:load_k
        tma_load_4d(smem + Cfg::kVOffset + c * Cfg::kKvChunkBytes, &map_v, kv_bar, 64 * c,
                    k_row0 + n_block * kBlockN, kv_head, map_batch);  // SITE:load_v
      }
      if (zero_kv) {
        wait_tail();
        zero_rows(smem + Cfg::kKOffset, Cfg::kKvChunkBytes, k_valid, kBlockN);
        zero_rows(smem + Cfg::kVOffset, Cfg::kKvChunkBytes, k_valid, kBlockN);
        fence_proxy_async_shared_cta();  // the consumers' wgmma reads K and V through the async proxy
        mbarrier_arrive(kv_full);
      }
      for (int it = 0; it < n_iters; ++it) {
        const int s = it % kStages, head = head_of(it), m_block = m_block_of(it);
        const int q_valid = seq.seqlen_q - m_block * kBlockM;
        const bool zero_q = q_valid < kBlockM && q_row0 + seq.seqlen_q < q_map_rows;
        uint64_t* q_bar = zero_q ? tail_loaded : &q_full[s];
        mbarrier_wait_parity(&q_empty[s], ((it / kStages) & 1) ^ 1);  // passes at once in round 0
        mbarrier_arrive_expect_tx(q_bar, 2 * Cfg::kQBytes + 2 * Cfg::kRowStatBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kChunks; ++c) {
          tma_load_4d(smem + Cfg::kQOffset + s * Cfg::kQBytes + c * Cfg::kQChunkBytes, &map_q, q_bar, 64 * c,
                      q_row0 + m_block * kBlockM, head, map_batch);  // SITE:load_q
          tma_load_4d(smem + Cfg::kDoOffset + s * Cfg::kQBytes + c * Cfg::kQChunkBytes, &map_do, q_bar, 64 * c,
                      q_row0 + m_block * kBlockM, head, map_batch);  // SITE:load_do
        }
        const int64_t stat = dq_layout.stat(map_batch, head, seq.stat_row0 + m_block * kBlockM);
        bulk_copy_g2s(smem + Cfg::kLseOffset + s * Cfg::kRowStatBytes, p.lse_log2 + stat, Cfg::kRowStatBytes,
                      q_bar);  // SITE:load_lse
        bulk_copy_g2s(smem + Cfg::kDpsumOffset + s * Cfg::kRowStatBytes, p.dpsum + stat, Cfg::kRowStatBytes,
                      q_bar);  // SITE:load_dpsum
        if (zero_q) {
          wait_tail();
          zero_rows(smem + Cfg::kQOffset + s * Cfg::kQBytes, Cfg::kQChunkBytes, q_valid, kBlockM);
          zero_rows(smem + Cfg::kDoOffset + s * Cfg::kQBytes, Cfg::kQChunkBytes, q_valid, kBlockM);
          fence_proxy_async_shared_cta();  // the consumers' wgmma reads Q and dO through the async proxy
          mbarrier_arrive(&q_full[s]);
        }
      }
    } else if (tid == 32) {
      // Warp 1: the dQ writer. Deterministic dQ: this key block's own slice, so no two CTAs add
      // into the same floats and the convert kernel sums the slices in a fixed order.
      const int slice = p.deterministic ? n_block : 0;
      for (int it = 0; it < n_iters; ++it) {
        for (int c = 0; c < Cfg::kConsumers; ++c) {
          mbarrier_wait_parity(&dq_full[c], static_cast<uint32_t>(it) & 1);
          const int64_t tile = seq.stat_row0 / kBlockM + m_block_of(it);
          float* dst = p.dq_accum + dq_layout.part(slice, seq.map_batch, head_of(it), tile, c);
          bulk_reduce_add_f32(dst, reinterpret_cast<const float*>(smem + Cfg::kDqOffset + c * Cfg::kDqPartBytes),
                              Cfg::kDqPartBytes);  // SITE:reduce_dq
          bulk_commit_group();
          bulk_wait_group_read<0>();  // the part's buffer may be refilled
          mbarrier_arrive(&dq_empty[c]);  // SITE:dq_empty
        }
      }
      bulk_wait_group<0>();  // every add has reached global memory before the thread exits
    }
    return;
  }

  // ---- Consumers ----
  setmaxnreg_inc<Cfg::kConsumerRegisters>();
  const int consumer = group - 1, t = tid % 128, warp = t / 32, lane = t % 32;
  const int g = lane / 4, tq = lane % 4;
  // This thread's accumulator rows (keys) of the m64 tiles: key_row and key_row + 8.
  const int key_row = n_block * kBlockN + 64 * consumer + 16 * warp + g;

  float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  // Descriptors (128-byte swizzle, tiles in chunks of [rows x 128 bytes]).
  // K-major operands (K, V as A of S^T / dP^T; Q, dO as B): rows 128 bytes apart in 8-row atoms
  // (SBO 1024), a k16 step 32 bytes further, the next 64 columns of d one chunk further.
  // MN-major operands (dO, Q as B of dV / dK; dS as A and K as B of dQ): 64 contiguous
  // elements of M / N per 128-byte row, the rows being K; k16 = 16 rows (2048 bytes); the next
  // 64 of M / N one chunk further (LBO).
  const uint32_t smem_addr = smem_u32addr(smem);
  const uint64_t desc_k = wgmma_descriptor(smem_addr + Cfg::kKOffset + consumer * 64 * kSwizzleRowBytes, 16, 1024,
                                           WgmmaSwizzle::B128);
  const uint64_t desc_v = wgmma_descriptor(smem_addr + Cfg::kVOffset + consumer * 64 * kSwizzleRowBytes, 16, 1024,
                                           WgmmaSwizzle::B128);
  const uint64_t desc_q = wgmma_descriptor(smem_addr + Cfg::kQOffset, 16, 1024, WgmmaSwizzle::B128);
  const uint64_t desc_do = wgmma_descriptor(smem_addr + Cfg::kDoOffset, 16, 1024, WgmmaSwizzle::B128);
  const uint64_t desc_q_mn = wgmma_descriptor(smem_addr + Cfg::kQOffset, Cfg::kQChunkBytes, 1024, WgmmaSwizzle::B128);
  const uint64_t desc_do_mn =
      wgmma_descriptor(smem_addr + Cfg::kDoOffset, Cfg::kQChunkBytes, 1024, WgmmaSwizzle::B128);
  // dQ part: rows 64c of the query block (A's chunk c) or columns 64c of d (K's chunk c).
  const uint64_t desc_ds_mn =
      wgmma_descriptor(smem_addr + Cfg::kDsOffset + (Cfg::kDqPartRows ? consumer * Cfg::kDsChunkBytes : 0),
                       Cfg::kDsChunkBytes, 1024, WgmmaSwizzle::B128);
  const uint64_t desc_k_mn =
      wgmma_descriptor(smem_addr + Cfg::kKOffset + (Cfg::kDqPartRows ? 0 : consumer * Cfg::kKvChunkBytes),
                       Cfg::kKvChunkBytes, 1024, WgmmaSwizzle::B128);
  constexpr uint32_t kK16Rows = 16 * kSwizzleRowBytes;  // an MN-major k16 step

  if (n_iters > 0) mbarrier_wait_parity(kv_full, 0);
  for (int it = 0; it < n_iters; ++it) {
    const int s = it % kStages, m_block = m_block_of(it);
    // ALiBi's slope of this query head in log2 units, read before the wait (off its path).
    float alibi_slope_log2 = 0.f;
    if constexpr (kAlibi) {
      const int64_t slope = batch * p.alibi_batch_stride + head_of(it) * p.alibi_head_stride;
      alibi_slope_log2 = FLASHATTN_GMEM(p.alibi_slopes)[slope] * cuda::kLog2e;
    }
    // attn_mask's block classes of this tile: at d = 64 looked up here, before the stage's wait
    // (in the score step the local window's loop spilled 8 bytes, bf16); at d = 128 in the score
    // step (here all three mask loops spilled 8-24 bytes: dK and dV hold 128 registers), but here
    // with softcap (in the score step its fp16 causal and local loops spilled 8 bytes).
    constexpr bool kMaskClassEarly = kHeadDim == 64 || kSoftcap;
    // The d = 64 dropout loops and ALiBi + softcap loops (kBlockM = 128) issue dP^T = V dO^T
    // only once P^T is packed: S^T and dP^T live together beside dK, dV and the keep bits (or
    // the bias and tanh's temporaries) spilled in every arrangement tried
    // (docs/lab/2026-12-04-hopper-backward-spills.md). The P^T pass then overlaps no MMA. So do
    // the attn_mask + softcap loops (built at d = 64; overlapped they spilled up to 400 bytes,
    // docs/lab/2026-12-04-hopper-feature-combinations-3.md).
    constexpr bool kDpAfterP = ((kDropout || (kAlibi && kSoftcap)) && kHeadDim == 64) || (kAttnMask && kSoftcap);
    auto mask_reads = [&]() {
      return bwd_attn_mask_reads<kBlockM / 2>(p, batch, head_of(it), m_block * kBlockM, seq.seqlen_q, seq.seqlen_k,
                                              n_block * kBlockN + 64 * consumer);
    };
    bool mask_reads_early = false;
    if constexpr (kAttnMask && kMaskClassEarly) mask_reads_early = mask_reads();
    // Dropout's decisions for this tile, drawn before the stage's wait, while only dK and dV are
    // live. With kDpAfterP the thread's key row and the seed are read here afresh (a volatile
    // read each), so that no value of the draw is held across the loop.
    [[maybe_unused]] uint64_t keep = 0;
    if constexpr (kDropout && kDpAfterP) {
      const int th = thread_index() % 128, lane_here = th % 32;
      const int key_row_here = n_block * kBlockN + 64 * (thread_index() / 128 - 1) + 16 * (th / 32) + lane_here / 4;
      keep = keep_bits_key_rows<kBlockM / 2, true>(p.dropout, batch, head_of(it), key_row_here, m_block * kBlockM,
                                                   lane_here % 4);
    } else if constexpr (kDropout) {
      keep = keep_bits_key_rows<kBlockM / 2>(p.dropout, batch, head_of(it), key_row, m_block * kBlockM, tq);
    }
    mbarrier_wait_parity(&q_full[s], static_cast<uint32_t>(it / kStages) & 1);

    // S^T and dP^T, two commit groups.
    float sacc[kBlockM / 2], dpacc[kBlockM / 2];
    wgmma_fence_operand(sacc);
    wgmma_fence_operand(dpacc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t kv_off = (kk / 4) * Cfg::kKvChunkBytes + 32 * (kk % 4);
      const uint32_t q_off = s * Cfg::kQBytes + (kk / 4) * Cfg::kQChunkBytes + 32 * (kk % 4);
      bwd_wgmma_ss<Elem, kBlockM, WgmmaMajor::K, WgmmaMajor::K>(sacc, wgmma_descriptor_advance(desc_k, kv_off),
                                                                wgmma_descriptor_advance(desc_q, q_off), kk > 0);  // SITE:wgmma_s
    }
    wgmma_commit_group();
    if constexpr (!kDpAfterP) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t kv_off = (kk / 4) * Cfg::kKvChunkBytes + 32 * (kk % 4);
        const uint32_t q_off = s * Cfg::kQBytes + (kk / 4) * Cfg::kQChunkBytes + 32 * (kk % 4);
        bwd_wgmma_ss<Elem, kBlockM, WgmmaMajor::K, WgmmaMajor::K>(dpacc, wgmma_descriptor_advance(desc_v, kv_off),
                                                                  wgmma_descriptor_advance(desc_do, q_off), kk > 0);  // SITE:wgmma_dp
      }
      wgmma_commit_group();
    }

    // Element i of a row: query column 8 (i / 4) + 2 tq + i % 2, key row key_row + 8 ((i % 4) / 2).
    const float* lse_log2 = reinterpret_cast<const float*>(smem + Cfg::kLseOffset + s * Cfg::kRowStatBytes);
    const float* dpsum = reinterpret_cast<const float*>(smem + Cfg::kDpsumOffset + s * Cfg::kRowStatBytes);
    // Masked blocks: key (row r of the thread's two) is visible from query column col iff
    // key < Sk, key <= m0 + col + offset + right (right >= 0) and key >= m0 + col + offset - left
    // (left >= 0), i.e. first_col[r] <= col <= last_col[r].
    int first_col[2] = {0, 0}, last_col[2] = {kBlockM, kBlockM};
    if (blocks.needs_mask(m_block)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = key_row + 8 * r, key_rel = key - window.offset - m_block * kBlockM;
        first_col[r] = key >= seq.seqlen_k ? kBlockM : (window.right >= 0 ? key_rel - window.right : 0);
        if constexpr (kLocal) last_col[r] = window.left >= 0 ? key_rel + window.left : kBlockM;
      }
    }
    auto visible = [&](int i, int col) {
      const int r = (i % 4) / 2;
      return col >= first_col[r] && (!kLocal || col <= last_col[r]);
    };
    // P^T while dP^T is on the tensor cores (kDpAfterP: before dP^T is issued).
    if constexpr (kDpAfterP) {
      wgmma_wait_group<0>();  // SITE:wait_s_alone
    } else {
      wgmma_wait_group<1>();  // SITE:wait_s
    }
    wgmma_fence_operand(sacc);
    // ALiBi: element i's distance |query + offset - key| is |alibi_dist + 8 (i / 4) + i % 2 -
    // 8 r| (r = (i % 4) / 2, exact in fp32 below 2^24), one add and one FMA per element. Made
    // here from live values rather than kept across the loop (the d = 64 loop has no register
    // to spare for it).
    const float alibi_dist = static_cast<float>(m_block * kBlockM + window.offset - key_row + 2 * tq);
    if constexpr (kAttnMask) {
      // The logit scale * s + the biases in fp32, the forward's (fwd_sm90_kernel's scores_to_p),
      // so P is recomputed from the logit the LSE was taken over. ALiBi at run time, its slope
      // (natural-log units, 0 without it) read here: held from before the wait, it spilled the
      // d = 128 loops.
      const float slope = p.alibi_slopes != nullptr
                              ? FLASHATTN_GMEM(p.alibi_slopes)[batch * p.alibi_batch_stride + head_of(it) * p.alibi_head_stride]
                              : 0.f;
      // With softcap (kSoftcap): the capped logit first, its chain factor parked for dS^T.
      if constexpr (kSoftcap)
        bwd_softcap_logits_parked<kBlockM / 2, Cfg::kDsChunkBytes>(sacc, p, smem + Cfg::kDsOffset + (it % 2) * Cfg::kDsBytes,
                                                                   consumer, warp, lane);
      bwd_attn_mask_logits<kBlockM / 2, kSoftcap>(sacc, p, kMaskClassEarly ? mask_reads_early : mask_reads(), batch,
                                                  head_of(it), m_block * kBlockM, key_row, tq, seq.seqlen_q,
                                                  seq.seqlen_k, slope, alibi_dist);
    }
    // The ALiBi loops take softcap at run time (uniform over the grid) where they are built with
    // it (bwd_sm90_alibi_takes_softcap): with_softcap runs a pass as the loop with or without it;
    // elsewhere ALiBi with softcap is a loop of its own (kSoftcap). Every other loop runs its
    // passes with its own kSoftcap.
    auto with_softcap = [&](auto pass) {
      if constexpr (kSoftcap) {
        pass(std::true_type{});
      } else if constexpr (bwd_sm90_alibi_takes_softcap(kHeadDim)) {
        if (p.softcap > 0.f) {
          pass(std::true_type{});
        } else {
          pass(std::false_type{});
        }
      } else {
        pass(std::false_type{});
      }
    };
    // ALiBi's bias of element i in log2 units (its distance as above).
    auto alibi_log2 = [&](int i) {
      return alibi_slope_log2 * fabsf(alibi_dist + static_cast<float>(8 * (i / 4) + i % 2 - 8 * ((i % 4) / 2)));
    };
    // P^T = exp2(logit * to_log2 - LSE_log2 [- ALiBi's bias]) on the visible entries; kCap:
    // softcapped logits, a loop parameter or, in the ALiBi loops, a run-time choice.
    auto p_pass = [&](auto cap) {
      constexpr bool kCap = decltype(cap)::value;
#pragma unroll
      for (int i = 0; i < kBlockM / 2; ++i) {
        const int col = 8 * (i / 4) + 2 * tq + i % 2;
        // Softcap: logit.cuh's tanh_accurate (--use_fast_math's tanhf is tanh.approx, 2^-11).
        const float logit = kCap ? cuda::tanh_accurate(sacc[i] * p.scale_over_softcap) : sacc[i];
        // kAttnMask: sacc already holds the natural-log logit.
        const float to_log2 = kCap ? p.softcap_log2 : (kAttnMask ? cuda::kLog2e : p.scale_log2);
        float x = logit * to_log2 - FLASHATTN_SMEM(lse_log2)[col];
        if constexpr (kAlibi) x -= alibi_log2(i);
        sacc[i] = visible(i, col) ? exp2_approx(x) : 0.f;
      }
    };
    if constexpr (kAlibi) {
      with_softcap(p_pass);
    } else {
      p_pass(std::bool_constant<kSoftcap && !kAttnMask>{});  // the attn_mask loops' logits are capped above
    }
    // P^T rounded into dV's A fragments right away: S^T's registers are free before dP^T's
    // wait, which keeps the d = 64 consumers (kBlockM = 128) within 240 registers. dS^T takes
    // the rounded P^T too (as PyTorch's 16-bit softmax backward does).
    uint32_t pfrag[kBlockM / 4], dsfrag[kBlockM / 4];
    pack_pairs<Elem>(sacc, pfrag);
    if constexpr (kDpAfterP) {
      // dP^T as above, its operands' stage the same.
      wgmma_fence_operand(pfrag);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t kv_off = (kk / 4) * Cfg::kKvChunkBytes + 32 * (kk % 4);
        const uint32_t q_off = s * Cfg::kQBytes + (kk / 4) * Cfg::kQChunkBytes + 32 * (kk % 4);
        bwd_wgmma_ss<Elem, kBlockM, WgmmaMajor::K, WgmmaMajor::K>(dpacc, wgmma_descriptor_advance(desc_v, kv_off),
                                                                  wgmma_descriptor_advance(desc_do, q_off), kk > 0);  // SITE:wgmma_dp_after_p
      }
      wgmma_commit_group();
    }
    wgmma_wait_group<0>();  // SITE:wait_dp
    wgmma_fence_operand(dpacc);
    // dS^T = P^T (dP^T - D), times softcap's chain factor where the logits were softcapped.
    auto ds_pass = [&](auto cap) {
      constexpr bool kCap = decltype(cap)::value;
#pragma unroll
      for (int i = 0; i < kBlockM / 2; ++i) {
        const int col = 8 * (i / 4) + 2 * tq + i % 2;
        const float prob = cuda::to_float<Elem>(static_cast<uint16_t>(pfrag[i / 2] >> (16 * (i % 2))));
        const float dp = kDropout ? dpacc[i] * keep_factor(keep, i, p.dropout.keep_scale) : dpacc[i];
        dpacc[i] = prob * (dp - FLASHATTN_SMEM(dpsum)[col]);  // SITE:ds
        if constexpr (kCap) {
          // 1 - tanh^2 with tanh recovered from P: log2 P = softcap tanh log2(e) - LSE log2(e).
          // Kept from the P^T pass instead, the factors (or tanh) held 32-64 more registers
          // across dP^T's wait and spilled in every arrangement tried (the 2026-12-03 windows lab
          // entry); recovered, they cost one LG2 per element and no register. The rounded P
          // gives tanh within 2^-9 / (ln 2 softcap log2 e) (bf16), below PyTorch's own rounding of
          // tanh; P = 0 (masked, or underflowed) gives -inf (NaN for a padded row's LSE +inf),
          // which the clamp turns into -1 (fmaxf returns the non-NaN operand): a factor 0 on dS 0.
          // With ALiBi, log2 P also holds the bias, added back.
          float t = kAlibi ? (log2f(prob) + FLASHATTN_SMEM(lse_log2)[col] + alibi_log2(i)) * p.inv_softcap_log2
                           : (log2f(prob) + FLASHATTN_SMEM(lse_log2)[col]) * p.inv_softcap_log2;
          t = fminf(fmaxf(t, -1.f), 1.f);
          dpacc[i] *= 1.f - t * t;
        }
      }
    };
    if constexpr (kAlibi) {
      with_softcap(ds_pass);
    } else if constexpr (kAttnMask && kSoftcap) {
      // The chain factor parked by bwd_softcap_logits_parked, one load per pair. (Not inside
      // ds_pass: naming more of the kernel's variables there changes every loop's SASS.)
      ds_pass(std::false_type{});
#pragma unroll
      for (int i = 0; i < kBlockM / 2; i += 2) {
        const uint32_t parked = FLASHATTN_SMEM(bwd_park_slot<Cfg::kDsChunkBytes>(
            smem + Cfg::kDsOffset + (it % 2) * Cfg::kDsBytes, consumer, warp, lane, i / 2))[0];
        dpacc[i] *= cuda::to_float<__half>(static_cast<uint16_t>(parked));
        dpacc[i + 1] *= cuda::to_float<__half>(static_cast<uint16_t>(parked >> 16));
      }
    } else {
      ds_pass(std::bool_constant<kSoftcap>{});
    }
    pack_pairs<Elem>(dpacc, dsfrag);
    if constexpr (kDropout) {
      // dV's A fragments: the rounded P^T (which dS^T took) times Z / (1 - p), rounded again.
#pragma unroll
      for (int i = 0; i < kBlockM / 4; ++i) {
        const float lo = cuda::to_float<Elem>(static_cast<uint16_t>(pfrag[i])) * keep_factor(keep, 2 * i, p.dropout.keep_scale);
        const float hi = cuda::to_float<Elem>(static_cast<uint16_t>(pfrag[i] >> 16)) *
                         keep_factor(keep, 2 * i + 1, p.dropout.keep_scale);
        pfrag[i] = cuda::pack_rn<Elem>(lo, hi);  // SITE:drop_p
      }
    }

    // dS^T -> dS buffer it % 2 (rows = this consumer's keys, 64 queries per chunk, 128-byte
    // swizzle): stmatrix.x4 stores rows 0-7 / 8-15 of the warp's 16 at columns 8j and 8j + 8;
    // lane 8m + r addresses row r of matrix m. Written before the dK MMA reads dsfrag. Lane
    // 8m + r's 16-byte chunk of column group j + m / 2 (j even) is ((j + m / 2) % 8) ^ (row % 8)
    // = (j % 8) ^ x, x = (m / 2) ^ r: four addresses for the eight stores (chunk j / 8 is an
    // immediate), not eight, which the loop keeps in registers.
    unsigned char* ds_tile = smem + Cfg::kDsOffset + (it % 2) * Cfg::kDsBytes;
    // The warp's parked factors (read above) sit where its stmatrix writes.
    if constexpr (kAttnMask && kSoftcap) __syncwarp();
    {
      const int m = lane / 8, row = 64 * consumer + 16 * warp + lane % 8 + 8 * (m % 2);
      const int x = (m / 2) ^ (lane % 8);
#pragma unroll
      for (int j = 0; j < kBlockM / 8; j += 2) {
        unsigned char* dst = ds_tile + (j / 8) * Cfg::kDsChunkBytes + row * kSwizzleRowBytes + 16 * ((j % 8) ^ x);
        stmatrix_x4(dst, dsfrag[2 * j], dsfrag[2 * j + 1], dsfrag[2 * j + 2], dsfrag[2 * j + 3]);  // SITE:store_ds
      }
    }
    fence_proxy_async_shared_cta();  // dQ's wgmma reads dS through the async proxy

    // dV += P^T dO, dK += dS^T Q.
    wgmma_fence_operand(dv);
    wgmma_fence_operand(dk);
    wgmma_fence_operand(pfrag);
    wgmma_fence_operand(dsfrag);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      bwd_wgmma_rs<Elem, kHeadDim>(dv, &pfrag[4 * kk],
                                   wgmma_descriptor_advance(desc_do_mn, s * Cfg::kQBytes + kk * kK16Rows));  // SITE:wgmma_dv
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      bwd_wgmma_rs<Elem, kHeadDim>(dk, &dsfrag[4 * kk],
                                   wgmma_descriptor_advance(desc_q_mn, s * Cfg::kQBytes + kk * kK16Rows));  // SITE:wgmma_dk
    wgmma_commit_group();

    // dQ part = dS K over all kBlockN keys: both consumers' dS^T must be in place. The buffer
    // alternates, so the other consumer's dQ MMA of query block it - 1 may still read the other
    // one; it finished the one written here (it - 2) before arriving at it - 1's barrier.
    named_barrier_sync(kDsReadyBarrier, 256);  // SITE:ds_ready
    float dq[Cfg::kDqPartFloats / 128];
    wgmma_fence_operand(dq);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      bwd_wgmma_ss<Elem, 64, WgmmaMajor::MN, WgmmaMajor::MN>(
          dq, wgmma_descriptor_advance(desc_ds_mn, (it % 2) * Cfg::kDsBytes + kk * kK16Rows),
          wgmma_descriptor_advance(desc_k_mn, kk * kK16Rows), kk > 0);  // SITE:wgmma_dq
    wgmma_commit_group();
    wgmma_wait_group<0>();  // SITE:wait_all
    wgmma_fence_operand(dv);
    wgmma_fence_operand(dk);
    wgmma_fence_operand(dq);
    wgmma_fence_operand(pfrag);
    wgmma_fence_operand(dsfrag);
    if (t == 0) mbarrier_arrive(&q_empty[s]);  // SITE:release

    // The dQ part -> this consumer's buffer -> the dQ writer. The buffer (and the accumulator)
    // holds the part in accumulator order, element i of thread t at i * 128 + t
    // (DqAccumLayout): a warp's stores are 32 consecutive floats, free of bank conflicts.
    mbarrier_wait_parity(&dq_empty[consumer], (static_cast<uint32_t>(it) & 1) ^ 1);  // SITE:dq_wait_empty
    float* dq_tile = reinterpret_cast<float*>(smem + Cfg::kDqOffset + consumer * Cfg::kDqPartBytes);
#pragma unroll
    for (int i = 0; i < Cfg::kDqPartFloats / 128; ++i) FLASHATTN_SMEM(dq_tile)[i * 128 + t] = dq[i];  // SITE:store_dq
    fence_proxy_async_shared_cta();  // the bulk reduce reads the buffer through the async proxy
    mbarrier_arrive(&dq_full[consumer]);
  }

  // ---- Epilogue: dK (scaled) and dV rounded and stored from registers; keys past the sequence's
  // skipped ----
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; i += 2) {
    const int key = key_row + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * tq;
    if (key < seq.seqlen_k) {
      uint16_t* dk_row = p.dk.row<uint16_t>(batch, kv_head, seq.k_row0 + key) + col;
      uint16_t* dv_row = p.dv.row<uint16_t>(batch, kv_head, seq.k_row0 + key) + col;
      *FLASHATTN_GMEM(reinterpret_cast<uint32_t*>(dk_row)) = cuda::pack_rn<Elem>(dk[i] * p.scale, dk[i + 1] * p.scale);
      *FLASHATTN_GMEM(reinterpret_cast<uint32_t*>(dv_row)) = cuda::pack_rn<Elem>(dv[i], dv[i + 1]);  // SITE:store_dkdv
    }
  }
}

}  // namespace flashattn::hopper
