// The sm_90a attention forward (issue 31, stage 4): warp-specialized, TMA -> mbarrier ring ->
// wgmma, online softmax in registers. FA3's design (hopper/flash_fwd_kernel_sm90.h,
// mainloop_fwd_sm90_tma_gmma_ws.hpp), written as plain CUDA with PTX only through ptx.cuh so
// the CPU shim (tests/cudasim) runs it.
//
// Grid (ceil(Sq / 128), Hq, B), causal blocks issued heaviest first (fwd_sm90_tile_order.h);
// 384 threads; FwdSm90Config's dynamic shared memory. The kernels that walk tiles (fwd_sm90_walk.h:
// the dense ones at d = 64, and at d = 128 without a window) run min(tiles, SMs) CTAs instead,
// each taking tile after tile of the same order from a counter.
// - Warpgroup 0, the producer, gives registers back (setmaxnreg.dec); its thread 0 loads Q once
//   (q_full) and then, per key tile, K into k_full[s] and V into v_full[s] of ring stage s,
//   after waiting for kv_empty[s] (one arrival per consumer warpgroup). Every load is a 4D
//   TMA box; rows beyond Sq / Sk land as zeros. A paged or indexed KV cache (kGatherKv) is
//   gathered instead by all 128 producer threads with cp.async (fwd_sm90_gather.cuh), through
//   a ring of three stages up to d = 128 so that two tiles load at once; Q still arrives by TMA.
// - Warpgroups 1 and 2, the consumers (setmaxnreg.inc), each own 64 query rows. Per key tile:
//   S = Q K^T (wgmma m64n128k16, both operands from shared memory, K-major), the mask on the
//   tiles that need it, the online softmax (fwd_sm90_softmax.cuh), P rounded into wgmma
//   A-fragments in registers, O += P V (wgmma m64nDk16, A from registers, V MN-major), then
//   the stage is released.
// - Epilogue: O / l rounded and stored by stmatrix into the consumer's (now free) Q rows (a
//   walking kernel's: into an O buffer of its own, fwd_sm90_walk.h), then one TMA store per 64
//   columns (rows beyond Sq are skipped by the store); the LSE stored straight from registers.
// - Packed GQA heads (a decode, FwdSm90Params::packed_heads = g): the CTA of kv head h takes the g
//   query heads of h as rows, token-major, floor(64 / g) tokens per consumer, so each K/V tile
//   crosses from memory once per kv head. Q and O move as TMA boxes of (d, g heads, tokens); the
//   mask takes each row's token, O's split parts and the LSE each row's (token, query head). The
//   main loop is the same (the mapping is a run-time value, 1 without packing).
// - FP8 (Elem = __nv_fp8_e4m3, d = 128, no mask, causal or a local window, softcap or not, ALiBi or not,
//   attn_mask or not): the
//   same loop on k32 steps. e4m3 wgmma takes K-major operands only, so the whole producer
//   warpgroup transposes each V tile into V^T after its load (fwd_sm90_transpose_v.cuh,
//   vt_full[s]) and P V reads V^T; P is rounded to e4m3 in registers; Q's and K's descales fold
//   into the exp2 scale (with softcap into its tanh's factor), V's into 1 / l; O is bf16.
//   A paged or indexed e4m3 cache (kGatherKv, with a mask alone) is gathered as the 16-bit one,
//   each announced V tile then transposed by the same warpgroup.
//
// Lines marked "// SITE:name" are named by tests/test_cudasim_hopper_fwd.py.
#pragma once
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#include <cuda_fp8.h>

#include "cuda/element.cuh"
#include "cuda/hopper/fwd_sm90_config.h"
#include "cuda/hopper/fwd_sm90_gather.cuh"
#include "cuda/hopper/fwd_sm90_mask.cuh"
#include "cuda/hopper/fwd_sm90_params.h"
#include "cuda/hopper/fwd_sm90_softmax.cuh"
#include "cuda/hopper/fwd_sm90_tile_order.h"
#include "cuda/hopper/fwd_sm90_transpose_v.cuh"
#include "cuda/hopper/fwd_sm90_walk.h"
#include "cuda/hopper/sm90_dropout.cuh"
#include "cuda/logit.cuh"
#include "cuda/ptx.cuh"
#include "cuda/tensor_map.h"
#include "mask.h"

namespace flashattn::hopper {

// Named barrier ids: 0 is __syncthreads; kTurnBarrier + c is consumer c's pingpong turn,
// kEpilogueBarrier + c its warpgroup's meeting before the TMA store of O.
constexpr unsigned kTurnBarrier = 1;
constexpr unsigned kEpilogueBarrier = 3;

// The forward's configuration for its input element: FwdSm90Config with the element's bytes.
template <typename Elem, int kHeadDim, bool kGatherKv = false>
using FwdSm90ConfigOf = FwdSm90Config<kHeadDim, kGatherKv, static_cast<int>(sizeof(Elem))>;

// Whether the inputs are e4m3 (the FP8 forward: O in bf16, V transposed by the producer).
template <typename Elem>
constexpr bool kIsE4m3 = std::is_same_v<Elem, __nv_fp8_e4m3>;

// O's element: the input's, bf16 for e4m3 inputs (FA3's choice).
template <typename Elem>
using FwdSm90OutElem = std::conditional_t<kIsE4m3<Elem>, __nv_bfloat16, Elem>;

// D[64 x N] (+)= A * B over one MMA step (k16, k32 for e4m3: 32 bytes of each row), both from
// shared memory, K-major (S = Q K^T).
template <typename Elem, int N>
__device__ __forceinline__ void wgmma_ss_k(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d FLASHATTN_CALLER_SITE) {
  using ptx::WgmmaMajor;
  if constexpr (kIsE4m3<Elem>) {
    ptx::wgmma_e4m3_ss<N>(d, desc_a, desc_b, scale_d FLASHATTN_CALLER_SITE_ARGS);
  } else if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    ptx::wgmma_bf16_ss<N, WgmmaMajor::K, WgmmaMajor::K>(d, desc_a, desc_b, scale_d FLASHATTN_CALLER_SITE_ARGS);
  } else {
    ptx::wgmma_f16_ss<N, WgmmaMajor::K, WgmmaMajor::K>(d, desc_a, desc_b, scale_d FLASHATTN_CALLER_SITE_ARGS);
  }
}

// D[64 x N] += A * B over one k16 step, A from registers, B MN-major (O += P V).
template <typename Elem, int N>
__device__ __forceinline__ void wgmma_rs_mn(float (&d)[N / 2], const uint32_t (&a)[4],
                                            uint64_t desc_b FLASHATTN_CALLER_SITE) {
  using ptx::WgmmaMajor;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    ptx::wgmma_bf16_rs<N, WgmmaMajor::MN>(d, a, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  } else {
    ptx::wgmma_f16_rs<N, WgmmaMajor::MN>(d, a, desc_b, 1 FLASHATTN_CALLER_SITE_ARGS);
  }
}

// O += P V over MMA step kk of the key tile in ring stage s. 16-bit inputs: a k16 step of V
// itself (MN-major, 16 key rows = 2048 bytes further each step). e4m3: a k32 step of V^T
// (K-major, 32 bytes further each step; fwd_sm90_transpose_v.cuh).
template <typename Elem, typename Cfg>
__device__ __forceinline__ void wgmma_pv_step(float (&o)[Cfg::kHeadDim / 2], const uint32_t (&a)[4], uint64_t desc_v0,
                                              int s, int kk FLASHATTN_CALLER_SITE) {
  if constexpr (Cfg::kTransposeV) {
    ptx::wgmma_e4m3_rs<Cfg::kHeadDim>(o, a, ptx::wgmma_descriptor_advance(desc_v0, s * Cfg::kVtBytes + 32 * kk), 1
                                      FLASHATTN_CALLER_SITE_ARGS);
  } else {
    wgmma_rs_mn<Elem, Cfg::kHeadDim>(o, a, ptx::wgmma_descriptor_advance(desc_v0, s * Cfg::kKvBytes + kk * 16 * kSwizzleRowBytes)
                                     FLASHATTN_CALLER_SITE_ARGS);
  }
}

// A descale factor of the FP8 forward (FwdSm90Params::q_descale ...) for (batch, kv head): 1
// where not given.
__device__ __forceinline__ float fp8_descale(const float* descale, int64_t batch_stride, int64_t head_stride,
                                             int batch, int kv_head) {
  return descale != nullptr ? descale[batch * batch_stride + kv_head * head_stride] : 1.f;
}

// s := softcap * tanh(s * scale_over_softcap), the sm_80 kernels' logit (logit.cuh's accurate tanh).
template <int kN>
__device__ __forceinline__ void apply_softcap(float (&s)[kN], float softcap, float scale_over_softcap) {
#pragma unroll
  for (int i = 0; i < kN; ++i) s[i] = softcap * cuda::tanh_accurate(s[i] * scale_over_softcap);
}

// The P of one key tile, rounded into the A fragments of its kBlockN / 16 k16 steps: step kk's
// a[0..3] are accumulator elements 8kk..8kk+7 in pairs (the m64nN D layout and the m64k16 A
// layout share their rows and column pairs; ptx_sm90_mma.cuh).
// e4m3: P rounded by cvt.rn.satfinite into the 8-bit A fragments of the kBlockN / 32 k32 steps,
// no byte moved between threads: of step kk's accumulator elements 16kk..16kk+15 (keys 2q, 2q + 1
// of its four 8-column blocks, rows g and g + 8), a[0] takes blocks 0 and 1 of row g, a[1] the
// same of row g + 8, a[2] and a[3] blocks 2 and 3; V^T's key order matches (vt_column_key).
template <typename Elem, int kN>
__device__ __forceinline__ void convert_p(const float (&s)[kN], uint32_t (&p)[kN * sizeof(Elem) / 4]) {
  if constexpr (kIsE4m3<Elem>) {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // 8-column blocks 2 (i / 2) and 2 (i / 2) + 1 of the step, row g + 8 when i is odd
        const int lo = 16 * kk + 8 * (i / 2) + 2 * (i % 2);
        p[4 * kk + i] = static_cast<uint32_t>(ptx::cvt_e4m3x2_f32(s[lo], s[lo + 1])) |
                        static_cast<uint32_t>(ptx::cvt_e4m3x2_f32(s[lo + 4], s[lo + 5])) << 16;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) p[i] = cuda::pack_rn<Elem>(s[2 * i], s[2 * i + 1]);
  }
}

// The query positions of a consumer thread's rows j and j + 8 in one register, which the mask
// reads on the main loop's masked tiles (two registers spilled the d = 128 causal softcap and the
// d = 256 local loops): without packed heads the first row's (the second is 8 further); with
// packed heads, whose tokens are fewer than 64 (can_pack_gqa_decode: ceil(Sq g / 64) < g), the
// first row's token in the low 16 bits and how many tokens further the second's is above them.
struct RowPositions {
  int code;

  __device__ __forceinline__ static RowPositions packed_rows(int first, int second) {
    return {first | (second - first) << 16};
  }
  __device__ __forceinline__ int token(bool packed, int r) const {
    if (!packed) return code + 8 * r;
    return (code & 0xffff) + r * (code >> 16);
  }
};

// kSoftcap: logits are softcap * tanh(scale * s / softcap) (FwdSm90Params::softcap > 0), so the
// scores become natural-log logits before the mask and the softmax, whose exp2 factor is then
// log2(e) instead of scale * log2(e).
// kLocal: a sliding window (FwdSm90Params::window_left / window_right, AttnParams' meaning);
// tiles outside it are never loaded and only the tiles on its edges are masked.
// kAlibi: ALiBi's position bias (FwdSm90Params::alibi_slopes) on every tile, after softcap when
// FwdSm90Params::softcap > 0 (a run-time choice in these loops; kSoftcap stays false).
// kAttnMask: attn_mask's bias (FwdSm90Params::attn_mask) on every tile, read from global memory
// per score tile (apply_attn_mask), after the logit and before the visibility mask; softcap
// (FwdSm90Params::softcap > 0) and ALiBi (alibi_slopes non-null) are run-time choices in these
// loops, as softcap is in the ALiBi loops.
// kGatherKv: K and V come from a paged or indexed KV cache (FwdSm90Params::kv_cache), gathered
// row by row by the whole producer warpgroup (fwd_sm90_gather.cuh) instead of TMA boxes.
// kDropout: dropout (FwdSm90Params::dropout) of P in the product with V, after the row sums took
// the whole P (sm90_dropout.cuh: the sm_80 kernels' and the CPU's keep mask).
template <typename Elem, int kHeadDim, bool kCausal, bool kSoftcap = false, bool kLocal = false,
          bool kAlibi = false, bool kAttnMask = false, bool kGatherKv = false, bool kDropout = false>
__global__ void __launch_bounds__(FwdSm90Config<kHeadDim>::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                    const __grid_constant__ TensorMap map_v, const __grid_constant__ TensorMap map_o,
                    const FwdSm90Params p) {
  using namespace flashattn::ptx;
  using Cfg = FwdSm90ConfigOf<Elem, kHeadDim, kGatherKv>;
  using OutElem = FwdSm90OutElem<Elem>;
  static_assert(!Cfg::kTransposeV || !kDropout,
                "the FP8 forward is built with no mask, causal or a local window, softcap or not, ALiBi "
                "or not, attn_mask or not");
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem_base);
  unsigned char* smem =
      smem_base + (kSwizzleAtomBytes - smem_u32addr(smem_base) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* kv_empty = v_full + kStages;
  uint64_t* v_tail_ready = kv_empty + kStages;
  uint64_t* vt_full = v_tail_ready + 1;  // kTransposeV only

  const int tid = threadIdx.x, group = tid / 128;
  // This CTA's query block, split-KV part (num_splits CTAs per query tile, each taking a part of
  // its key tiles), head and batch entry: causal takes the heaviest blocks first
  // (fwd_sm90_tile_order.h). A gathered KV cache keeps the grid's own order: its producer, at 24
  // registers, holds the batch entry's cache rows per tile, which a batch entry computed by
  // division puts in vector registers (28 bytes spilled); from blockIdx.z they stay uniform.
  const int splits = p.num_splits > 1 ? p.num_splits : 1;
  constexpr bool kOrdered = !kGatherKv;
  const FwdSm90TileOrder order =
      fwd_sm90_tile_order<kCausal && kOrdered, kLocal && kOrdered, kHeadDim, kBlockM, kBlockN>(p);
  // A walking kernel (fwd_sm90_walks) runs this for every tile its CTA takes; any other, once for
  // its blockIdx's tile. `walk` (fwd_sm90_walk.h) carries the ring's running key-tile count and
  // the barrier phases across tiles; FwdSm90OneTile's are the constants of a lone tile.
  // q_empty and tile_slot: the walk's only (fwd_sm90_walk.h).
  [[maybe_unused]] uint64_t* q_empty = vt_full + (Cfg::kTransposeV ? kStages : 0);
  [[maybe_unused]] FwdSm90Tile* tile_slot = reinterpret_cast<FwdSm90Tile*>(q_empty + 1);
  auto run_tile = [&](const FwdSm90Tile tile, auto& walk) {
  using Walk = std::decay_t<decltype(walk)>;
  const int m_block = tile.m_block, split = tile.split, head = tile.head, batch = tile.batch;
  const int kv_head = head / p.head_group;
  // Packed GQA heads (FwdSm90Params::packed_heads = g > 1): `head` is a kv head, and each
  // consumer's 64 rows are p.consumer_tokens tokens of g query heads. Without, g = 1 and a
  // consumer's rows are 64 tokens of `head`. Positions below are tokens either way.
  const int packed = p.packed_heads;
  const int token0 = m_block * 2 * p.consumer_tokens;  // the tile's first query position
  // This sequence's rows (mask.h, as every executor): in a varlen batch its range of the packed
  // rows, clamped; then the first seqused_q / seqused_k[batch] when given. The maps span all rows:
  // a tail tile's keys past the sequence are loaded and masked, later tiles skipped.
  int64_t q_row0 = 0, k_row0 = 0;
  int length_q = p.seqlen_q, length_k = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    clamped_range(p.cu_seqlens_q, batch, p.total_q, p.seqlen_q, q_row0, length_q);
    clamped_range(p.cu_seqlens_k, batch, p.total_k, p.seqlen_k, k_row0, length_k);
  }
  const int seqlen_q = used_length(p.seqused_q, batch, length_q);
  // A gathered cache's keys: sequence.h's rules for a paged / indexed cache (fwd_sm90_gather.cuh);
  // the producer looks the sequence up again, so that the consumers keep only its length.
  const int seqlen_k = kGatherKv ? cache_sequence(p, batch).seqlen_k : used_length(p.seqused_k, batch, length_k);
  // A CTA past its sequence's queries (the grid covers the longest) has nothing to do.
  if (token0 >= seqlen_q) return;
  const int map_batch = p.cu_seqlens_q != nullptr ? 0 : batch;  // varlen maps: one batch
  const int64_t k_map_rows = p.cu_seqlens_q != nullptr ? p.total_k : p.seqlen_k;
  // Varlen or seqused_q: O from registers, row by row (the TMA store's boxes would write rows
  // past the sequence: the next sequence's, or the rows the host filled with 0).
  const bool clip_o_rows = p.cu_seqlens_q != nullptr || p.seqused_q != nullptr;
  const int diag_offset = causal_diag_offset(p.align_bottom_right, seqlen_q, seqlen_k);
  const KeyWindow window = key_window<kCausal, kLocal>(diag_offset, p.window_left, p.window_right);
  KeyTiles<kCausal, kLocal, kBlockM, kBlockN> tiles(
      QueryRange{token0, token0 + 2 * p.consumer_tokens < seqlen_q ? token0 + 2 * p.consumer_tokens : seqlen_q},
      seqlen_k, window);
  if (splits > 1) tiles.keep_part(split, splits);
  // The first tile visited (the last, n_end - 1) may hold rows past seqlen_k that the map still
  // covers (seqused_k, or the next sequence of a varlen batch): real memory, maybe NaN or Inf (a
  // KV cache's unwritten rows). Their scores are masked, but P = 0 times a non-finite V is NaN, so
  // the producer zeroes those V rows before the consumers read the tile (v_tail_ready), as
  // sm_80's zero-filling copies leave them. Rows past the map arrive as zeros from TMA already.
  const int v_tail_row = seqlen_k - (tiles.n_end - 1) * kBlockN;  // the first row to zero
  // (A gathered tile's rows past seqlen_k are zero-filled by its copies.)
  const bool zero_v_tail = !kGatherKv && tiles.n_blocks > 0 && k_row0 + seqlen_k < k_map_rows && v_tail_row < kBlockN;

  if constexpr (!Walk::kOn) {
  if (tid == 0) {
    tma_prefetch_descriptor(&map_q);
    if constexpr (!kGatherKv) {
      tma_prefetch_descriptor(&map_k);
      tma_prefetch_descriptor(&map_v);
    }
    tma_prefetch_descriptor(&map_o);
    mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], kGatherKv ? kGatherThreads : 1);
      mbarrier_init(&v_full[s], kGatherKv ? kGatherThreads : 1);
      mbarrier_init(&kv_empty[s], Cfg::kConsumers);
    }
    mbarrier_init(v_tail_ready, 1);
    if constexpr (Cfg::kTransposeV) {
      for (int s = 0; s < kStages; ++s) mbarrier_init(&vt_full[s], 128);  // every producer thread
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  }

  // Q of the tile by TMA, issued by one producer thread: one box of 128 rows (the query heads'
  // rows of a packed tile when g divides 64), else one per consumer's 64 (fwd_sm90_q_box_tokens).
  auto load_q = [&]() {
    const bool one_box = packed * p.consumer_tokens == 64;
    const int boxes = one_box ? 1 : 2, box_tokens = one_box ? 2 * p.consumer_tokens : p.consumer_tokens;
    mbarrier_arrive_expect_tx(q_full, Cfg::kChunks * boxes * packed * box_tokens * kSwizzleRowBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c)
      for (int b = 0; b < boxes; ++b)
        tma_load_4d(smem + Cfg::kQOffset + c * Cfg::kQChunkBytes + b * 64 * kSwizzleRowBytes, &map_q, q_full, Cfg::kRowElems * c,
                    head * packed, static_cast<int>(q_row0) + token0 + b * box_tokens, map_batch);  // SITE:load_q
  };

  if (Walk::role(group) == 0) {
    // ---- Producer ----
    if constexpr (!Walk::kOn) setmaxnreg_dec<Cfg::kProducerRegisters>();
    if constexpr (kGatherKv) {
      if (tiles.n_blocks > 0) {
        if (tid == 0) load_q();
        // Tiles issued but not yet announced while the producer waits for the next empty stage:
        // one with a third stage (its copies overlap the next tile's), none with two (the
        // consumers release stage j-1 only after K_j arrived; fwd_sm90_gather_stages).
        constexpr int kLag = kStages - 2;
        static_assert(kLag == 0 || kLag == 1, "the gathering producer runs two or three stages");
        using GatherWord = std::conditional_t<Cfg::kTransposeV, uint8_t, uint16_t>;  // an element
        // e4m3: V^T of announced tile `it` (its stage's V rows came from every producer thread's
        // copies, so each waits for v_full, the 128 arrivals, before reading the tile), as the
        // TMA producer does; the gathered rows past seqlen_k are zeros already.
        auto transpose_gathered_v = [&](int it) {
          if constexpr (Cfg::kTransposeV) {
            const int s = it % kStages;
            mbarrier_wait_parity(&v_full[s], static_cast<uint32_t>(it / kStages) & 1);
            transpose_v_tile<kBlockN, kHeadDim>(smem + Cfg::kVOffset + s * Cfg::kKvBytes,
                                                smem + Cfg::kVtOffset + s * Cfg::kVtBytes, kBlockN, tid);
            fence_proxy_async_shared_cta();  // V^T is read by the consumers' wgmma (the async proxy)
            mbarrier_arrive(&vt_full[s]);    // SITE:gathered_vt_full
          }
        };
        for (int it = 0; it < tiles.n_blocks; ++it) {
          const int n_block = tiles.n_end - 1 - it, s = it % kStages;
          mbarrier_wait_parity(&kv_empty[s], ((it / kStages) & 1) ^ 1);  // passes at once in round 0
          // Looked up per tile (a few cached loads) rather than held: the producer has 24 registers.
          const Sequence cache_seq = cache_sequence(p, batch);
          gather_kv_tile<kHeadDim, kBlockN, GatherWord>(smem + Cfg::kKOffset + s * Cfg::kKvBytes, p.k_cache,
                                                        p.kv_cache, cache_seq, kv_head, n_block, tid);
          cp_async_commit();
          gather_kv_tile<kHeadDim, kBlockN, GatherWord>(smem + Cfg::kVOffset + s * Cfg::kKvBytes, p.v_cache,
                                                        p.kv_cache, cache_seq, kv_head, n_block, tid);
          cp_async_commit();
          if (it >= kLag) {
            const int older = (it - kLag) % kStages;  // K and V of `it` stay in flight
            announce_gathered_tile<2 * kLag>(&k_full[older], &v_full[older]);
            transpose_gathered_v(it - kLag);
          }
        }
        if constexpr (kLag == 1) {
          const int last = (tiles.n_blocks - 1) % kStages;
          announce_gathered_tile<0>(&k_full[last], &v_full[last]);
          transpose_gathered_v(tiles.n_blocks - 1);
        }
      }
      return;
    }
    // Thread 0 issues the TMA loads. With e4m3 inputs the whole warpgroup then transposes each V
    // tile into V^T (fwd_sm90_transpose_v.cuh), zeroing its keys past seqlen_k on the way.
    // A walk hands the tile to the consumers (through tile_slot, once the last tile's S MMAs
    // have retired: q_empty) and loads its Q only after issuing its first `early` K / V tiles:
    // the consumers released the last tile's stages before its epilogue, and stage O in a
    // buffer of their own, so those loads and Q's overlap it (fwd_sm90_walk.h). A V tail is
    // zeroed only after the hand-out (the last tile's v_tail_ready phase may be awaited until
    // q_empty). A tile without key tiles completes q_full without Q.
    const bool issuer = tid == 0;
    [[maybe_unused]] const int early = tiles.n_blocks < kStages ? tiles.n_blocks : kStages;  // SITE:early
    if constexpr (Walk::kOn) {
      if (tiles.n_blocks == 0) walk.hand_out(q_full, q_empty, tile_slot, tile, false);
    }
    if ((issuer || Cfg::kTransposeV) && tiles.n_blocks > 0) {
      if (!Walk::kOn && issuer) load_q();
      for (int it = 0; it < tiles.n_blocks; ++it) {
        // kv: the key tile's number in the CTA's life (its ring stage and phase)
        const int n_block = tiles.n_end - 1 - it, kv = walk.kv_base + it, s = kv % kStages;
        mbarrier_wait_parity(&kv_empty[s], ((kv / kStages) & 1) ^ 1);  // passes at once in round 0
        unsigned char* k_tile = smem + Cfg::kKOffset + s * Cfg::kKvBytes;
        unsigned char* v_tile = smem + Cfg::kVOffset + s * Cfg::kKvBytes;
        if (issuer) {
          mbarrier_arrive_expect_tx(&k_full[s], Cfg::kKvBytes);
#pragma unroll
          for (int c = 0; c < Cfg::kChunks; ++c)
            tma_load_4d(k_tile + c * Cfg::kKvChunkBytes, &map_k, &k_full[s], Cfg::kRowElems * c,
                        static_cast<int>(k_row0) + n_block * kBlockN, kv_head, map_batch);  // SITE:load_k
          mbarrier_arrive_expect_tx(&v_full[s], Cfg::kKvBytes);
#pragma unroll
          for (int c = 0; c < Cfg::kChunks; ++c)
            tma_load_4d(v_tile + c * Cfg::kKvChunkBytes, &map_v, &v_full[s], Cfg::kRowElems * c,
                        static_cast<int>(k_row0) + n_block * kBlockN, kv_head, map_batch);  // SITE:load_v
        }
        if constexpr (Walk::kOn) {
          if (it + 1 == early) {
            walk.hand_out(q_full, q_empty, tile_slot, tile, true);  // SITE:late_hand_out
            load_q();
          }
        }
        if constexpr (Cfg::kTransposeV) {
          mbarrier_wait_parity(&v_full[s], static_cast<uint32_t>(kv / kStages) & 1);
          transpose_v_tile<kBlockN, kHeadDim>(v_tile, smem + Cfg::kVtOffset + s * Cfg::kVtBytes,
                                              it == 0 && zero_v_tail ? v_tail_row : kBlockN, tid);
          fence_proxy_async_shared_cta();  // the consumers' wgmma reads V^T through the async proxy
          mbarrier_arrive(&vt_full[s]);    // SITE:vt_full
        } else if ((Walk::kOn ? it + 1 == early : it == 0) && zero_v_tail) {
          // The tile's first V (it == 0). A walk zeroes it after the hand-out (it + 1 == early),
          // so that its v_tail_ready arrival cannot complete a phase the consumers have not yet
          // awaited (they await the last tile's in its main loop, before q_empty).
          const int tail_kv = Walk::kOn ? walk.kv_base : kv, tail_s = Walk::kOn ? walk.kv_base % kStages : s;
          unsigned char* tail_tile = Walk::kOn ? smem + Cfg::kVOffset + tail_s * Cfg::kKvBytes : v_tile;
          // Whole 128-byte rows, so the swizzle (which permutes 16-byte chunks within a row) does
          // not matter. Once per CTA, and only with seqused_k.
          mbarrier_wait_parity(&v_full[tail_s], static_cast<uint32_t>(tail_kv / kStages) & 1);
          for (int c = 0; c < Cfg::kChunks; ++c) {
            uint4* rows = reinterpret_cast<uint4*>(tail_tile + c * Cfg::kKvChunkBytes + v_tail_row * kSwizzleRowBytes);
            for (int i = 0; i < (kBlockN - v_tail_row) * static_cast<int>(kSwizzleRowBytes / 16); ++i)
              FLASHATTN_SMEM(rows)[i] = make_uint4(0, 0, 0, 0);  // SITE:zero_v_tail
          }
          fence_proxy_async_shared_cta();  // the consumers' wgmma reads V through the async proxy
          mbarrier_arrive(v_tail_ready);
        }
      }
    }
    if constexpr (Walk::kOn) walk.kv_base += tiles.n_blocks;
    return;
  }

  // ---- Consumers ----
  if constexpr (!Walk::kOn) setmaxnreg_inc<Cfg::kConsumerRegisters>();
  const int consumer = group - 1, t = tid % 128, warp = t / 32, lane = t % 32;
  // This thread's rows j and j + 8 of its consumer's 64, j = 16 warp + lane / 4, and their query
  // positions (tokens): one register through the main loop (RowPositions). row0 is the first
  // row's, which ALiBi, attn_mask and dropout take (the plan never packs them: gqa_decode.h).
  const int row_j = 16 * warp + lane / 4;
  const int consumer_token0 = token0 + consumer * p.consumer_tokens;
  const RowPositions rows =
      packed == 1 ? RowPositions{consumer_token0 + row_j}
                  : RowPositions::packed_rows(consumer_token0 + row_j / packed, consumer_token0 + (row_j + 8) / packed);
  const int row0 = rows.code;

  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
  // Accumulator (or softcapped logit) units -> log2 units.
  // The FP8 forward folds Q's and K's descale into it (and V's into 1 / l in the epilogue); with
  // softcap the descales belong inside the tanh (softcap * tanh(s qd kd scale / softcap)), so
  // they go into softcap's factor instead and exp2's stays log2(e). With ALiBi they scale the
  // scores before the bias (the logit s qd kd scale, or its softcap at run time), not the bias;
  // so with attn_mask (whose loops take softcap and ALiBi at run time).
  float exp2_scale = kSoftcap || kAlibi || kAttnMask ? cuda::kLog2e : p.scale_log2;
  [[maybe_unused]] float fp8_scale_over_softcap = 0.f;  // kTransposeV && (kSoftcap || kAlibi || kAttnMask)
  [[maybe_unused]] float fp8_scale = 0.f;               // kTransposeV && (kAlibi || kAttnMask)
  if constexpr (Cfg::kTransposeV) {
    const float qk_descale =
        fp8_descale(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, batch, kv_head) *
        fp8_descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, batch, kv_head);
    if constexpr (kSoftcap || kAlibi || kAttnMask) fp8_scale_over_softcap = p.scale_over_softcap * qk_descale;
    if constexpr (kAlibi || kAttnMask) fp8_scale = p.scale * qk_descale;
    if constexpr (!kSoftcap && !kAlibi && !kAttnMask) exp2_scale *= qk_descale;
  }
  const float alibi_slope = kAlibi || (kAttnMask && p.alibi_slopes != nullptr)
                                ? p.alibi_slopes[batch * p.alibi_batch_stride + head * p.alibi_head_stride]
                                : 0.f;
  OnlineSoftmax softmax;
  softmax.init();

  // Descriptors (128-byte swizzle). Q and K are K-major: rows 128 bytes apart in 8-row atoms
  // (SBO 1024), a k16 step 32 bytes further, the next 64 columns of d one chunk further. V is
  // MN-major (B = V is keys x d with d contiguous): key rows of 64 d at 128 bytes, 8-key groups
  // at SBO 1024, the next 64 d (the next chunk) at LBO, a k16 step 16 key rows (2048 bytes).
  // kLeanDescriptors (the d = 256 loops that leave the least room: attn_mask's, whose mask reads
  // come on top, and softcap's local window, whose accurate tanh does): Q's consumer broadcast
  // from lane 0, which ptxas then keeps warp-uniform, and S's descriptors advanced on their low
  // word (wgmma_descriptor_advance_low). Without both, ptxas holds Q's 16 advanced descriptors as
  // 32 vector registers and spills them (attn_mask: 116-228 bytes, softcap's window: 24;
  // docs/lab/2026-12-04-hopper-feature-combinations-5.md). The other loops keep main's code.
  constexpr bool kLeanDescriptors = kHeadDim == 256 && (kAttnMask || (kSoftcap && kLocal));
  const int q_consumer = kLeanDescriptors ? __shfl_sync(0xFFFFFFFFu, consumer, 0) : consumer;
  const uint64_t desc_q = wgmma_descriptor(smem_u32addr(smem + Cfg::kQOffset + q_consumer * 64 * kSwizzleRowBytes),
                                           16, 1024, WgmmaSwizzle::B128);
  const uint64_t desc_k0 = wgmma_descriptor(smem_u32addr(smem + Cfg::kKOffset), 16, 1024, WgmmaSwizzle::B128);
  // e4m3: V^T is K-major like K (fwd_sm90_transpose_v.cuh), a k32 step 32 bytes further.
  const uint64_t desc_v0 =
      Cfg::kTransposeV
          ? wgmma_descriptor(smem_u32addr(smem + Cfg::kVtOffset), 16, 1024, WgmmaSwizzle::B128)
          : wgmma_descriptor(smem_u32addr(smem + Cfg::kVOffset), Cfg::kKvChunkBytes, 1024, WgmmaSwizzle::B128);

  // Pingpong: the consumers take turns issuing their MMAs (both products of one step), so one
  // warpgroup's softmax runs while the other's MMAs hold the tensor cores (FA3's scheduler
  // barriers). Consumer c waits at named barrier kTurn + c (its own 128 threads sync, the
  // other's 128 arrive) and, once its MMAs are issued, arrives at the other's. Consumer 0 goes
  // first (consumer 1 arrives at its barrier up front) and consumer 1 leaves out its last
  // arrival, so every generation of both barriers completes.
  const int n_blocks = tiles.n_blocks;
  auto wait_turn = [&]() { named_barrier_sync(kTurnBarrier + consumer, 256); };  // SITE:turn_wait
  auto pass_turn = [&](int it) {
    if (consumer == 0 || it + 1 < n_blocks) named_barrier_arrive(kTurnBarrier + (1 - consumer), 256);  // SITE:turn_pass
  };
  if (n_blocks > 0 && consumer == 1) named_barrier_arrive(kTurnBarrier, 256);

  float sacc[kBlockN / 2];     // S of the newest key tile, then its P (unrounded)
  uint32_t pfrag[kBlockN * sizeof(Elem) / 8];  // P of the previous key tile as wgmma A fragments
  // S = Q K^T of key tile `it` into sacc (issued and committed, not waited for).
  auto issue_s = [&](int it) {
    const int kv = walk.kv_base + it, s = kv % kStages;
    mbarrier_wait_parity(&k_full[s], static_cast<uint32_t>(kv / kStages) & 1);
    // wgmma.fence right before the MMAs, after the wait: a fence followed by the wait's spin
    // loop makes ptxas serialize every wgmma (C7520).
    wgmma_fence_operand(sacc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / Cfg::kMmaK; ++kk) {
      const uint32_t q_off = (kk / 4) * Cfg::kQChunkBytes + 32 * (kk % 4);
      const uint32_t k_off = s * Cfg::kKvBytes + (kk / 4) * Cfg::kKvChunkBytes + 32 * (kk % 4);
      const uint64_t dq = kLeanDescriptors ? wgmma_descriptor_advance_low(desc_q, q_off)
                                           : wgmma_descriptor_advance(desc_q, q_off);
      const uint64_t dk = kLeanDescriptors ? wgmma_descriptor_advance_low(desc_k0, k_off)
                                           : wgmma_descriptor_advance(desc_k0, k_off);
      wgmma_ss_k<Elem, kBlockN>(sacc, dq, dk, kk > 0 ? 1 : 0);  // SITE:wgmma_s
    }
    wgmma_commit_group();
  };
  // O += P V of key tile `it` (issued and committed).
  auto issue_pv = [&](int it) {
    const int kv = walk.kv_base + it, s = kv % kStages;
    if (Cfg::kTransposeV) mbarrier_wait_parity(&vt_full[s], static_cast<uint32_t>(kv / kStages) & 1);
    else if (it == 0 && zero_v_tail) mbarrier_wait_parity(v_tail_ready, walk.v_tail_parity);  // after v_full, zeroed
    else mbarrier_wait_parity(&v_full[s], static_cast<uint32_t>(kv / kStages) & 1);
    wgmma_fence_operand(o);
    wgmma_fence_operand(pfrag);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / Cfg::kMmaK; ++kk) {
      const uint32_t a[4] = {pfrag[4 * kk], pfrag[4 * kk + 1], pfrag[4 * kk + 2], pfrag[4 * kk + 3]};
      wgmma_pv_step<Elem, Cfg>(o, a, desc_v0, s, kk);  // SITE:wgmma_o
    }
    wgmma_commit_group();
    wgmma_fence_operand(pfrag);
  };
  auto release = [&](int it) {
    if (t == 0) mbarrier_arrive(&kv_empty[(walk.kv_base + it) % kStages]);  // SITE:release
  };
  // Dropout's decisions for key tile `it`, drawn before its S is live (while the other consumer's
  // MMAs run): drawn while S is in flight, they spilled the d = 256 loops.
  auto keep_bits = [&](int it) {
    return keep_bits_query_rows<kBlockN / 2>(p.dropout, batch, head, row0, (tiles.n_end - 1 - it) * kBlockN,
                                             lane % 4);
  };
  auto scores_to_p = [&](int it, auto masked) {
    if constexpr (kSoftcap && Cfg::kTransposeV) {
      apply_softcap(sacc, p.softcap, fp8_scale_over_softcap);
    } else if constexpr (kSoftcap) {
      apply_softcap(sacc, p.softcap, p.scale_over_softcap);
    } else if constexpr (kAlibi || kAttnMask) {
      // The ALiBi and attn_mask loops take softcap at run time (uniform over the grid), not as
      // loops of their own: the logit is softcapped, then biased.
      // (With e4m3 inputs the factors carry the descales, as above.)
      if (p.softcap > 0.f) {
        apply_softcap(sacc, p.softcap, Cfg::kTransposeV ? fp8_scale_over_softcap : p.scale_over_softcap);
      } else {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) sacc[i] *= Cfg::kTransposeV ? fp8_scale : p.scale;
      }
    }
    if constexpr (kAlibi) {
      apply_alibi(sacc, row0, (tiles.n_end - 1 - it) * kBlockN, lane, alibi_slope, diag_offset);
    } else if constexpr (kAttnMask) {
      // The attn_mask loops take ALiBi at run time too, its bias before the mask's.
      if (p.alibi_slopes != nullptr)
        apply_alibi(sacc, row0, (tiles.n_end - 1 - it) * kBlockN, lane, alibi_slope, diag_offset);
    }
    if constexpr (kAttnMask) {
      const int rows_begin = consumer_token0;
      const int rows_end = rows_begin + 64 < seqlen_q ? rows_begin + 64 : seqlen_q;
      apply_attn_mask(sacc, p.attn_mask, batch, head, row0, (tiles.n_end - 1 - it) * kBlockN, lane,
                      rows_begin, rows_end, seqlen_k);
    }
    if constexpr (decltype(masked)::value)
      apply_mask<kCausal, kLocal>(sacc, rows.token(packed > 1, 0), rows.token(packed > 1, 1),
                                  (tiles.n_end - 1 - it) * kBlockN, lane, seqlen_k, window);
    softmax.max_and_exp(sacc, exp2_scale);
  };

  // The main loop overlaps the softmax of tile j with P_{j-1} V on the tensor cores (FA3's
  // intra-warpgroup overlap): step j issues S_j, then P_{j-1} V_{j-1}; waits for S_j alone
  // (wait_group 1) and turns it into P_j while the PV MMAs run; then waits for them, releases
  // stage j-1, rescales O by P_j's correction and rounds P_j into A fragments. The registers
  // of P_{j-1} (pfrag) and O are left alone until that wait.
  if (n_blocks > 0) {
    [[maybe_unused]] uint64_t keep = 0;
    if constexpr (kDropout) keep = keep_bits(0);
    if constexpr (!Walk::kOn) mbarrier_wait_parity(q_full, 0);  // a walk waited for the tile's place
    wait_turn();
    issue_s(0);
    pass_turn(0);
    wgmma_wait_group<0>();  // SITE:wait_s0
    wgmma_fence_operand(sacc);
    if (tiles.n_masked > 0 || tiles.n_open_end == 0) scores_to_p(0, std::true_type{});
    else scores_to_p(0, std::false_type{});
    if constexpr (kDropout) apply_dropout(sacc, keep, p.dropout.keep_scale);  // SITE:drop_p0
    convert_p<Elem>(sacc, pfrag);  // O is still 0: no rescale
  }
  auto step = [&](int it, auto masked) {
    [[maybe_unused]] uint64_t keep = 0;
    if constexpr (kDropout) keep = keep_bits(it);
    wait_turn();
    issue_s(it);
    issue_pv(it - 1);
    pass_turn(it);
    wgmma_wait_group<1>();  // SITE:wait_s
    wgmma_fence_operand(sacc);
    scores_to_p(it, masked);
    if constexpr (kDropout) apply_dropout(sacc, keep, p.dropout.keep_scale);  // SITE:drop_p
    wgmma_wait_group<0>();  // SITE:wait_o
    wgmma_fence_operand(o);
    release(it - 1);
    softmax.rescale_o(o);
    convert_p<Elem>(sacc, pfrag);
  };
  int it = 1;
  for (; it < tiles.n_masked; ++it) step(it, std::true_type{});
  for (; it < tiles.n_open_end; ++it) step(it, std::false_type{});
  if constexpr (kLocal) {
    for (; it < n_blocks; ++it) step(it, std::true_type{});
  }
  if (n_blocks > 0) {
    issue_pv(n_blocks - 1);
    wgmma_wait_group<0>();  // SITE:wait_o_last
    wgmma_fence_operand(o);
    release(n_blocks - 1);
  }
  if constexpr (Walk::kOn) {
    walk.end_consumer_tile(n_blocks, zero_v_tail);
    // Every S MMA of the tile has retired (wait_o_last): Q's rows may take the next tile's Q
    // while this epilogue stages O in a buffer of its own (fwd_sm90_walk.h).
    mbarrier_arrive(q_empty);  // SITE:q_empty_arrive
  }

  // ---- Epilogue: O / l -> stmatrix into this consumer's Q rows -> TMA store; LSE direct ----
  // This consumer's S MMAs have all retired, so its 64 rows of Q are free and hold O in the
  // same layout (chunks of 64 columns, 128-byte swizzled rows), which the O map's TMA store
  // reads. stmatrix.x4 stores four 8x8 matrices: rows 0-7 and 8-15 of the warp's 16, columns
  // 8j.. and 8(j+1).. ; lane 8m + r gives the address of row r of matrix m, and the m64nN
  // accumulator's pairs are exactly stmatrix's fragments (row lane / 4, columns 2 (lane % 4)).
  float inv_l[2], lse[2];
  softmax.finalize(exp2_scale, inv_l, lse);
  // Row r's (r = 0, 1: j and j + 8) token and query head, and whether O and the LSE hold it: a
  // token of the sequence, and with packed heads one of the consumer's packed rows (the rows
  // past them hold no query).
  // (Row j's query head is head g + j % g, j % g = j - (its token - consumer_token0) g.)
  auto row_token = [&](int r) { return rows.token(packed > 1, r); };
  auto row_head = [&](int r) { return head * packed + row_j + 8 * r - (row_token(r) - consumer_token0) * packed; };
  auto row_stored = [&](int r) {
    return row_token(r) < seqlen_q && row_j + 8 * r < packed * p.consumer_tokens;
  };
  if constexpr (Cfg::kTransposeV) {
    const float v_descale = fp8_descale(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride, batch, kv_head);
    inv_l[0] *= v_descale, inv_l[1] *= v_descale;
  }
  if (splits > 1) {
    // This split's part, in fp32, for split_merge_kernel.cuh: O / l and the LSE of each of the
    // sequence's rows (0 and -inf where the part holds no key it sees), at O's and the LSE's
    // element offsets in the part (mask.h split_out_row, split_lse_of). Every row < seqlen_q
    // is written, so the scratch needs no fill outside varlen / seqused_q (plan_fwd.h).
    float* o_part = p.split_scratch + split * p.split_o_elements;
    float* lse_part = p.split_scratch + splits * p.split_o_elements + split * p.split_lse_elements;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!row_stored(r)) continue;
      const int row = row_token(r), q_head = row_head(r);
      float* dst = o_part + map_batch * p.o_batch_stride + (q_row0 + row) * p.o_row_stride +
                   q_head * p.o_head_stride + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        FLASHATTN_GMEM(reinterpret_cast<float2*>(dst + 8 * j))[0] =
            make_float2(o[4 * j + 2 * r] * inv_l[r], o[4 * j + 2 * r + 1] * inv_l[r]);  // SITE:store_o_split
      if (lane % 4 == 0)
        FLASHATTN_GMEM(lse_part)[batch * p.lse_batch_stride + q_head * p.lse_head_stride + q_row0 + row] = lse[r];
    }
    return;
  }
  if (clip_o_rows) {
    // Straight from the accumulators: this thread's rows row0 and row0 + 8, columns
    // 8j + 2 (lane % 4) and the next, of the sequence's rows only.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!row_stored(r)) continue;
      const int row = row_token(r), q_head = row_head(r);
      OutElem* dst = static_cast<OutElem*>(p.o) + map_batch * p.o_batch_stride + (q_row0 + row) * p.o_row_stride +
                     q_head * p.o_head_stride + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        FLASHATTN_GMEM(reinterpret_cast<uint32_t*>(dst + 8 * j))[0] =
            cuda::pack_rn<OutElem>(o[4 * j + 2 * r] * inv_l[r], o[4 * j + 2 * r + 1] * inv_l[r]);  // SITE:store_o_rows
    }
  } else {
    // A walk stages O in its own buffer (Q's rows may hold the next tile's Q by now), which the
    // last tile's store may still read: its issuer waits for that read, and the warpgroup for it.
    unsigned char* o_tile = smem + (Walk::kOn ? Cfg::kOOffset : Cfg::kQOffset) + consumer * 64 * kSwizzleRowBytes;
    if constexpr (Walk::kOn) {
      if (t == 0) bulk_wait_group_read<0>();  // SITE:o_read_wait
      named_barrier_sync(kEpilogueBarrier + consumer, 128);  // SITE:o_free
    }
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; j += 2) {
      const int m = lane / 8, row = 16 * warp + lane % 8 + 8 * (m % 2), col = 8 * (j + m / 2);
      const int chunk16 = (col % 64) / 8;  // the 16-byte chunk in its 128-byte row, before the swizzle
      unsigned char* dst = o_tile + (col / 64) * Cfg::kQChunkBytes + row * kSwizzleRowBytes + 16 * (chunk16 ^ (row % 8));
      stmatrix_x4(dst, cuda::pack_rn<OutElem>(o[4 * j] * inv_l[0], o[4 * j + 1] * inv_l[0]),
                  cuda::pack_rn<OutElem>(o[4 * j + 2] * inv_l[1], o[4 * j + 3] * inv_l[1]),
                  cuda::pack_rn<OutElem>(o[4 * j + 4] * inv_l[0], o[4 * j + 5] * inv_l[0]),
                  cuda::pack_rn<OutElem>(o[4 * j + 6] * inv_l[1], o[4 * j + 7] * inv_l[1]));  // SITE:stage_o
    }
    fence_proxy_async_shared_cta();  // the TMA store reads through the async proxy
    named_barrier_sync(kEpilogueBarrier + consumer, 128);
    // The O box: the consumer's tokens x g query heads (64 rows of `head` unpacked), token-major.
    if (t == 0 && consumer_token0 < seqlen_q) {
#pragma unroll
      for (int c = 0; c < Cfg::kOChunks; ++c)
        tma_store_4d(&map_o, o_tile + c * Cfg::kQChunkBytes, 64 * c, head * packed, consumer_token0, batch);  // SITE:store_o
      bulk_commit_group();
      // The smem must stay until read; the grid's end completes the writes. A walk waits for the
      // read before its next staging of O, or at its end.
      if constexpr (!Walk::kOn) bulk_wait_group_read<0>();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row_stored(r) && lane % 4 == 0)
      FLASHATTN_GMEM(p.lse)[batch * p.lse_batch_stride + row_head(r) * p.lse_head_stride + q_row0 + row_token(r)] =
          lse[r];
  }
  };

  if constexpr (!fwd_sm90_walks(kHeadDim, kLocal, kSoftcap, kAlibi, kAttnMask, kGatherKv, kDropout, Cfg::kTransposeV)) {
    FwdSm90OneTile one;
    run_tile(fwd_sm90_tile(order, blockIdx.x, blockIdx.y, blockIdx.z), one);
  } else {
    // ---- The dynamic walk (fwd_sm90_walk.h): setup once, then tile after tile ----
    // The walking producer works every tile out (its lengths, key tiles and V tail) on top of
    // the place counter and the hand-out (fwd_sm90_walk.h: which kernels walk, and why 40 / 232).
    constexpr int kWalkProducerRegisters = kFwdSm90WalkProducerRegisters;
    constexpr int kWalkConsumerRegisters = kFwdSm90WalkConsumerRegisters;
    static_assert(128 * (kWalkProducerRegisters + Cfg::kConsumers * kWalkConsumerRegisters) <= 65536,
                  "setmaxnreg counts must fit the register file");
    static_assert(Cfg::kWalkSmemBytes <= 227 * 1024, "a walk's O buffer above the 227 KB opt-in limit");
    if (tid == 0) {
      tma_prefetch_descriptor(&map_q);
      tma_prefetch_descriptor(&map_k);
      tma_prefetch_descriptor(&map_v);
      tma_prefetch_descriptor(&map_o);
      mbarrier_init(q_full, 1);
      for (int s = 0; s < kStages; ++s) {
        mbarrier_init(&k_full[s], 1);
        mbarrier_init(&v_full[s], 1);
        mbarrier_init(&kv_empty[s], Cfg::kConsumers);
      }
      mbarrier_init(v_tail_ready, 1);
      mbarrier_init(q_empty, 128 * Cfg::kConsumers);  // every consumer thread, after its S MMAs
      fence_mbarrier_init();
    }
    __syncthreads();
    const unsigned places = fwd_sm90_tile_places(order);
    if (group == 0) {
      setmaxnreg_dec<kWalkProducerRegisters>();
      if (tid != 0) return;
      FwdSm90Walk<true> walk;
      // The first gridDim.x places (the heaviest) go one to each CTA without the counter.
      for (unsigned place = blockIdx.x; place < places; place = fwd_sm90_next_place(p.tile_counter, places))  // SITE:first_place
        run_tile(fwd_sm90_tile_at(order, place), walk);  // an idle tile hands nothing out
      walk.hand_out(q_full, q_empty, tile_slot, FwdSm90Walk<true>::end(), false);
      return;
    }
    setmaxnreg_inc<kWalkConsumerRegisters>();
    FwdSm90Walk<false> walk;
    for (;;) {
      const FwdSm90Tile tile = walk.take(q_full, tile_slot);
      if (tile.m_block < 0) break;  // the end
      run_tile(tile, walk);  // arrives at q_empty once its S MMAs have retired
    }
    // The last store's read of O, before the CTA's shared memory goes (its issuer's bulk group).
    if (tid % 128 == 0) bulk_wait_group_read<0>();  // SITE:o_read_wait_end
  }
}

}  // namespace flashattn::hopper
