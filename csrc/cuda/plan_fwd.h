// The forward's launch decisions, all in one place: which kernels run (family, architecture:
// the sm_90a forward where plan_fwd_sm90.h allows, head-dim tile, one or two m-tiles per warp),
// how the call is reshaped (GQA packing, split-KV) and how it is launched (grid, block, shared
// memory, the split merge). The CPU executor's counterpart is plan_forward (cpu/fwd.cpp).
//
// Host only and free of CUDA calls: what the plan needs of the GPU comes in as DeviceProps, so
// its decisions are tested without one (tests/test_cudasim_plan.py). executor.h plans, allocates
// and checks; launch_plan.h and launch_*.cuh execute. The launch templates keep the signature
// inst/*.cu instantiates (kernel_list.py), so they receive the plan's params and read its
// per-kernel decisions through the functions below, never a rule of their own.
#pragma once
#include <cstdint>
#include <type_traits>

#include "../mask.h"
#include "../params.h"
#include "dispatch.h"
#include "gqa_decode.h"
#include "grid.h"
#include "plan_fwd_sm90.h"
#include "traits.h"

namespace flashattn::cuda {

// What a plan needs to know of the GPU, read once per call by the executor's Device policy
// (api.cu; the shim's in tests/sim_ext/sim_ops.cpp).
struct DeviceProps {
  int cc_major = 8;  // compute capability
  int cc_minor = 0;
  int sm_count = 1;  // the split-KV heuristic fills them
  int smem_optin_bytes = max_smem_bytes(Arch::kSm80);  // per block, after cudaFuncSetAttribute
  // FLASHATTN_CUDA_HOPPER=1 (plan_fwd_sm90.h): the forward and the backward may run the sm_90a
  // kernels (plan_bwd_sm90.h takes the same opt-in).
  bool hopper_fwd = false;
};

// The device's architecture: Hopper's for compute capability 9.x, else sm_80's (the kernels
// need sm_80 or newer).
inline Arch device_arch(const DeviceProps& device) {
  return device.cc_major == 9 ? Arch::kSm90 : Arch::kSm80;
}

// Whose kernels a plan starts from on a device: sm_80's everywhere, since they run as built on
// sm_90. plan_fwd and plan_bwd then move the calls the sm_90a kernels take to them
// (plan_fwd_sm90.h, plan_bwd_sm90.h).
inline Arch kernel_arch(Arch device) {
  (void)device;
  return Arch::kSm80;
}

// Tensor cores (mma.sync) for fp16/bf16; SIMT for fp32, whose inputs are for accuracy, not
// speed; the small one-warp-per-row kernels (the backward's D_i and dQ conversion).
enum class KernelFamily { kTensorCore, kSimt, kRows };

// The kernels of one call: the family and the head-dim tile follow the element type and the
// head dims, for the architecture. The tile is (head_dim_tile, head_dim_v_tile): Q's and K's
// width, V's and O's (kernel_list.py keys the 16-bit forward's tiles by the pair).
struct KernelChoice {
  KernelFamily family;
  Arch arch;
  ElementType type;
  int head_dim_tile;
  int head_dim_v_tile;
};

// The head dim a tile as wide for v as for q must cover: q's and k's, or v's where that is
// wider. A pair of unequal head dims (MLA: 192 / 128, 128 / 64, 64 / 128) without a tile of its
// own (the fp32 kernels'; the 16-bit ones' but (192, 128) and (128, 64)) runs on the tile
// of the wider one, the kernels reading and writing Q, K, dQ, dK over head_dim columns and V, O,
// dO, dV over head_dim_v, zero-filled up to the tile on load (tile_io.cuh) and never stored
// past it.
inline int tile_head_dim(const AttnParams& p) {
  return p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
}

// The compiled tile of the forward's or the backward's kernels for a (head_dim, head_dim_v)
// pair (dispatch.h, dispatch_head_dims: the narrowest that covers both), or 0 when there is
// none. The executor refuses a pair with no tile before planning, naming its head dims
// (executor.h, check_head_dims). No torch here: the launch headers include this file, and the
// shim's self-tests compile them without torch.
inline KernelChoice choose_kernels(ElementType type, int head_dim, int head_dim_v, Arch arch,
                                   bool backward = false) {
  KernelChoice choice{type == ElementType::kFloat ? KernelFamily::kSimt
                                                  : KernelFamily::kTensorCore,
                      arch, type, 0, 0};
  auto take = [&](auto tile, auto tile_v) {
    choice.head_dim_tile = decltype(tile)::value;
    choice.head_dim_v_tile = decltype(tile_v)::value;
  };
  dispatch_element(type, [&](auto element) {
    using Element = decltype(element);
    if (backward) {
      dispatch_head_dims(HeadDimTilesFor<Element, true>{}, head_dim, head_dim_v, take);
    } else {
      dispatch_head_dims(HeadDimTilesFor<Element>{}, head_dim, head_dim_v, take);
    }
  });
  return choice;
}

// Query rows (a sequence's longest) up to which the forward runs its one-m-tile kernel even
// where a two-m-tile kernel exists: a decoding step's rows (one query token, or one per head of
// a GQA group, gqa_decode.h). Only a tile's first warp then has rows, the others skip their
// products (fwd_kernel.cuh), and that warp computes one m-tile instead of two, one of them empty.
constexpr int kFwdFewRows = kMmaM;

// Whether the 16-bit forward of head-dim tile (kHeadDim, kHeadDimV) runs p (as planned: packed,
// split) on its one-m-tile kernel FwdTile<kHeadDim, kHeadDimV, true>: where it has no other
// (tiles above 128), or p has dropout or packed GQA heads (which only that kernel applies,
// gqa_decode.h), or at most kFwdFewRows query rows, or a value head dim of its own (MLA): the
// two-m-tile kernel assumes them equal (fwd_kernel.cuh, v_cols), since at 255 registers it
// spilled with V's own.
template <int kHeadDim, int kHeadDimV>
bool fwd_one_m_tile(const AttnParams& p) {
  if constexpr (FwdTile<kHeadDim, kHeadDimV, false>::kMTiles ==
                FwdTile<kHeadDim, kHeadDimV, true>::kMTiles) {
    return true;
  } else {
    return p.dropout.on() || p.seqlen_q <= kFwdFewRows || p.packed_heads > 1 ||
           p.head_dim_v != p.head_dim;
  }
}

// Calls f(Traits{}) with the 16-bit forward's traits: the one-m-tile kernel's or the two-m-tile
// kernel's (fwd_one_m_tile). Above d = 128 the two are one geometry and only the first is
// compiled.
template <int kHeadDim, int kHeadDimV, typename F>
void with_fwd_traits(bool one_m_tile, F&& f) {
  using OneMTile = FwdTile<kHeadDim, kHeadDimV, true>;
  using TwoMTiles = FwdTile<kHeadDim, kHeadDimV, false>;
  if constexpr (TwoMTiles::kMTiles == OneMTile::kMTiles) {
    f(OneMTile{});
  } else if (one_m_tile) {
    f(OneMTile{});
  } else {
    f(TwoMTiles{});
  }
}

// The SIMT forward's geometry: one warp per query row.
template <int kHeadDim>
constexpr FwdLaunchShape simt_fwd_shape() {
  return FwdLaunchShape::of<SimtTraits<kHeadDim>>(SimtTraits<kHeadDim>::kNWarps);
}

// The forward kernel's geometry for p (grid.h): the family, the tile and, for the 16-bit
// kernels, one or two m-tiles.
inline FwdLaunchShape fwd_launch_shape(const KernelChoice& choice, bool one_m_tile) {
  FwdLaunchShape shape{};
  dispatch_element(choice.type, [&](auto element) {
    using Element = decltype(element);
    dispatch_head_dims(HeadDimTilesFor<Element>{}, choice.head_dim_tile, choice.head_dim_v_tile,
                       [&](auto tile, auto tile_v) {
      constexpr int kTile = decltype(tile)::value;
      if constexpr (std::is_same_v<Element, float>) {
        shape = simt_fwd_shape<kTile>();
      } else {
        with_fwd_traits<kTile, decltype(tile_v)::value>(one_m_tile, [&](auto traits) {
          shape = FwdLaunchShape::of<decltype(traits)>();
        });
      }
    });
  });
  return shape;
}

// Split-KV: num_splits when given (>= 1; at most kMaxSplits, what the merge and the scratch
// are sized for), else (0) the count s whose modeled step time T(s), in ns, is least:
//   T(s) = max(waves(s) x (kSplitCtaNs + ceil(tiles / s) x kSplitTileNs),
//              KV bytes / (sm_count x kSplitSmBytesPerNs))
//        + (s > 1: the merge) kSplitMergeLaunchNs
//                             + merge_waves x ceil(head_dim_v / 32) x s x kSplitMergeStepNs
// tiles: one CTA's key tiles, ceil(seqlen_k / key_tile); a CTA walks them one after another, each
// an HBM round trip or so (kSplitTileNs), so a decode with few CTAs is bound by latency, not by
// bandwidth. ctas = batch x heads x query-row tiles as packed (B x heads_kv for a GQA decode,
// gqa_decode.h); waves(s) = ceil(ctas x s / (sm_count x kSplitCtasPerSm)). The merge
// (split_merge_kernel.cuh) gives each output row (query slot x query head) one warp, whose lanes
// hold ceil(head_dim_v / 32) columns each and add the splits' parts in turn, so its time still
// grows with s, 32 times slower than the thread per row it replaced;
// merge_waves = ceil(B x Sq x Hq / (sm_count x kSplitMergeWarpsPerSm)). A tie keeps fewer
// splits, and each split keeps at least kSplitMinTiles key tiles. A batch whose CTAs fill the
// SMs is bound by HBM at s = 1 already, so a merge only adds to it: it is not split.
// The constants are H200-sized estimates (docs/lab/2026-12-02-decode-splits.md): a tile ~1 us,
// the merge's step (one dependent L2 round trip of a lane's column and split) 0.2 us, from the
// H200's B = 1, Sk = 32k step that took 480 us at 17 splits with the thread-per-row merge. A GPU
// run calibrates them (docs/lab/2026-12-02-decode-part-2.md says what it owes).
constexpr int kMaxSplits = 64;
constexpr int kSplitMinTiles = 4;
constexpr int64_t kSplitTileNs = 1000;
constexpr int64_t kSplitCtaNs = 2000;
constexpr int64_t kSplitCtasPerSm = 2;
constexpr int64_t kSplitSmBytesPerNs = 32;  // ~4.2 TB/s over 132 SMs
constexpr int64_t kSplitMergeLaunchNs = 4000;  // a launch (gpu_specs.LAUNCH_OVERHEAD_S)
constexpr int64_t kSplitMergeStepNs = 200;
constexpr int64_t kSplitMergeWarpsPerSm = 64;  // resident: 2048 threads

// What the split model needs of a planned call besides its (packed) parameters.
struct SplitShape {
  int block_rows;    // query rows per CTA
  int key_tile;      // keys per main-loop step of the kernel
  int element_bytes; // of K and V
};

// The model's step time of p (packed) in s splits, ns (above).
inline int64_t split_step_ns(const AttnParams& p, const SplitShape& shape, int sm_count,
                             int64_t s) {
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.heads_q *
                       ((p.seqlen_q + shape.block_rows - 1) / shape.block_rows);
  const int64_t tiles = (static_cast<int64_t>(p.seqlen_k) + shape.key_tile - 1) / shape.key_tile;
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  const int64_t slots = sms * kSplitCtasPerSm;
  const int64_t waves = (ctas * s + slots - 1) / slots;
  int64_t t = waves * (kSplitCtaNs + (tiles + s - 1) / s * kSplitTileNs);
  // K and V of every (batch, kv head) once; a CTA's heads_q is heads_kv when GQA is packed.
  const int64_t kv_bytes = static_cast<int64_t>(p.batch) * p.heads_kv * p.seqlen_k *
                           (p.head_dim + p.head_dim_v) * shape.element_bytes;
  const int64_t hbm = kv_bytes / (sms * kSplitSmBytesPerNs);
  if (t < hbm) t = hbm;
  if (s > 1) {
    // The merge's warps: out's rows x query heads, unpacked.
    const int64_t warps = static_cast<int64_t>(p.batch) * (p.seqlen_q / p.packed_heads) *
                          p.heads_q * p.packed_heads;
    const int64_t capacity = sms * kSplitMergeWarpsPerSm;
    const int64_t merge_waves = (warps + capacity - 1) / capacity;
    const int64_t lane_columns = (p.head_dim_v + kWarpSize - 1) / kWarpSize;  // of out
    t += kSplitMergeLaunchNs + merge_waves * lane_columns * s * kSplitMergeStepNs;
  }
  return t;
}

// The split model's shape of a plan's kernel: 16-bit tiles of FwdTile<tile, v, *>::kBlockN keys
// (the same for one and two m-tiles), the SIMT kernel's SimtTraits<tile>::kTileRows.
inline SplitShape fwd_split_shape(const KernelChoice& choice, const FwdLaunchShape& shape) {
  SplitShape split{shape.block_rows, 0, 0};
  dispatch_element(choice.type, [&](auto element) {
    using Element = decltype(element);
    split.element_bytes = static_cast<int>(sizeof(Element));
    dispatch_head_dims(HeadDimTilesFor<Element>{}, choice.head_dim_tile, choice.head_dim_v_tile,
                       [&](auto tile, auto tile_v) {
      constexpr int kTile = decltype(tile)::value;
      if constexpr (std::is_same_v<Element, float>) {
        split.key_tile = SimtTraits<kTile>::kTileRows;
      } else {
        split.key_tile = FwdTile<kTile, decltype(tile_v)::value, true>::kBlockN;
      }
    });
  });
  return split;
}

inline int choose_num_splits(const AttnParams& p, const SplitShape& shape, int sm_count) {
  if (p.num_splits >= 1) return p.num_splits < kMaxSplits ? p.num_splits : kMaxSplits;
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.heads_q *
                       ((p.seqlen_q + shape.block_rows - 1) / shape.block_rows);
  const int64_t tiles = (static_cast<int64_t>(p.seqlen_k) + shape.key_tile - 1) / shape.key_tile;
  if (ctas == 0 || tiles < 2 * kSplitMinTiles) return 1;
  int64_t most = tiles / kSplitMinTiles;
  if (most > kMaxSplits) most = kMaxSplits;
  int64_t best = 1, best_ns = split_step_ns(p, shape, sm_count, 1);
  for (int64_t s = 2; s <= most; ++s) {
    const int64_t ns = split_step_ns(p, shape, sm_count, s);
    if (ns < best_ns) best = s, best_ns = ns;
  }
  return static_cast<int>(best);
}

// B, Hq or Sq is 0: out and lse are empty.
inline bool fwd_launches_nothing(const AttnParams& p) {
  return p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0;
}

struct FwdPlan {
  KernelChoice kernels;
  Arch device_arch;
  bool empty = false;  // fwd_launches_nothing
  // The FP8 forward (plan_fwd_fp8.h): q, k, v float8_e4m3fn, out bfloat16, the e4m3 kernel.
  bool fp8 = false;
  // The 16-bit kernel with one m-tile per warp (FwdTile<tile, v, true>), not two.
  bool one_m_tile = false;
  // What the kernel gets: GQA-packed (params.h packed_heads) and with the planned num_splits.
  AttnParams params;
  FwdLaunchShape shape{};  // query rows per CTA, threads, dynamic shared memory
  dim3 grid;
  dim3 block;
  // What the device gives a block (DeviceProps::smem_optin_bytes); the executor refuses a
  // shape above it. arch_smem_bytes: the chosen architecture's own limit, which the tiles fit.
  int smem_limit_bytes = 0;
  int arch_smem_bytes = 0;
  // Split-KV (params.num_splits > 1): the fp32 scratch of the splits' parts (mask.h), whether
  // it must be filled first (rows outside every sequence, which no split writes, merge to 0
  // and -inf), and the merge's parameters: out's rows as they are, unpacked.
  int64_t split_scratch_floats = 0;
  bool fill_split_scratch = false;
  AttnParams merge_params;

  // A float32 out of 16-bit inputs (params.h out_fp32) takes the split path with one split:
  // the kernel's fp32 part, then the merge's float32 instantiation writes out unrounded, so no
  // kernel is compiled for it.
  bool merges() const { return params.num_splits > 1 || params.out_fp32; }
};

// The split model's shape of the sm_90a forward: FwdSm90Config's query rows per CTA (with packed
// GQA heads the packed rows it holds: whole tokens' groups, fwd_sm90_consumer_tokens) and key
// tile, for K and V of element_bytes (2: 16-bit; 1: e4m3, the FP8 forward, whose tiles are the
// same at d = 128).
inline SplitShape sm90_fwd_split_shape(int head_dim, int packed_heads = 1, int element_bytes = 2) {
  SplitShape split{0, 0, element_bytes};
  const int packed = packed_heads > 1 ? packed_heads : 1;
  dispatch_head_dim(Sm90FwdHeadDims{}, head_dim, [&](auto tile) {
    using Config = hopper::FwdSm90Config<decltype(tile)::value>;
    split = {Config::kConsumers * packed * hopper::fwd_sm90_consumer_tokens(packed), Config::kBlockN,
             element_bytes};
  });
  return split;
}

// The launch of an sm_90a forward plan of Config's geometry (16-bit or e4m3) and smem_bytes of
// dynamic shared memory, for plan.params as they are (GQA heads packed or not): its own split
// count (the caller's num_splits, or the split model on the Hopper kernel's shape: 128 query rows
// and 128 keys per tile against sm_80's 64 x 64 or 16 x 64, so the sm_80 plan's count does not
// carry over), then one launch of the kernel's grid.
template <typename Config>
void plan_sm90_fwd_launch(FwdPlan& plan, int requested_splits, int sm_count, size_t smem_bytes) {
  AttnParams& p = plan.params;
  p.num_splits = requested_splits;
  p.num_splits = choose_num_splits(
      p, sm90_fwd_split_shape(p.head_dim, p.packed_heads, Config::kElemBytes), sm_count);
  plan.merge_params.num_splits = p.num_splits;
  plan.arch_smem_bytes = max_smem_bytes(Arch::kSm90);
  plan.shape = {Config::kBlockM, Config::kThreads, static_cast<int>(smem_bytes)};
  const int packed = p.packed_heads > 1 ? p.packed_heads : 1;
  const hopper::FwdSm90GridDims g =
      Config::grid(p.seqlen_q / packed, p.heads_q, p.batch, p.num_splits, packed);
  plan.grid = dim3(g.x, g.y, g.z);
  plan.block = plan.shape.block();
}

// The split scratch of a plan that merges (params as planned: packed or not, split or not).
inline void plan_split_scratch(FwdPlan& plan) {
  if (!plan.merges()) return;
  const AttnParams& p = plan.params;
  plan.split_scratch_floats = p.num_splits * (split_out_elements(p) + split_lse_elements(p));
  // Otherwise every split writes its part of every query row (0 and -inf where it sees no
  // key), so the scratch needs no fill, which on a GPU would be two more launches per call.
  plan.fill_split_scratch = p.cu_seqlens_q != nullptr || p.seqused_q != nullptr;
}

// Moves a plan whose params sm90_fwd_unsupported() accepts to the sm_90a forward: one launch of
// FwdSm90Config<head_dim>'s geometry (plan_sm90_fwd_launch), split as requested_splits asks.
inline void use_sm90_fwd(FwdPlan& plan, int requested_splits, int sm_count) {
  AttnParams& p = plan.params;
  plan.kernels.arch = Arch::kSm90;
  plan.kernels.head_dim_tile = p.head_dim;
  plan.kernels.head_dim_v_tile = p.head_dim;
  plan.one_m_tile = false;
  dispatch_head_dim(Sm90FwdHeadDims{}, p.head_dim, [&](auto tile) {
    using Config = hopper::FwdSm90Config<decltype(tile)::value>;
    // A gathered cache's ring has its own stage count (fwd_sm90_gather_stages).
    const size_t smem = sm90_fwd_gathers_kv(p) ? hopper::FwdSm90Config<decltype(tile)::value, true>::kSmemBytes
                                               : Config::kSmemBytes;
    plan_sm90_fwd_launch<Config>(plan, requested_splits, sm_count, smem);
  });
}

// Plans the forward of `params` (make_fwd_params) for inputs of `type` on `device`: the sm_80
// plan, then the sm_90a forward instead where it is enabled and takes the call as planned.
inline FwdPlan plan_fwd(const AttnParams& params, ElementType type, const DeviceProps& device) {
  FwdPlan plan;
  plan.device_arch = device_arch(device);
  plan.kernels = choose_kernels(type, params.head_dim, params.head_dim_v,
                                kernel_arch(plan.device_arch));
  plan.smem_limit_bytes = device.smem_optin_bytes;
  plan.arch_smem_bytes = max_smem_bytes(plan.kernels.arch);
  plan.params = params;
  plan.merge_params = params;
  plan.empty = fwd_launches_nothing(params);
  if (plan.empty) return plan;
  AttnParams& p = plan.params;
  // A decoding step with GQA reads each kv head's cache once for its whole group.
  p = pack_gqa_decode(params);
  if (plan.kernels.family == KernelFamily::kTensorCore) {
    dispatch_head_dims(CompiledFwdHeadDimPairs{}, plan.kernels.head_dim_tile,
                       plan.kernels.head_dim_v_tile, [&](auto tile, auto tile_v) {
      plan.one_m_tile = fwd_one_m_tile<decltype(tile)::value, decltype(tile_v)::value>(p);
    });
  }
  plan.shape = fwd_launch_shape(plan.kernels, plan.one_m_tile);
  // The split heuristic sees the packed CTAs (B x heads_kv when packed).
  p.num_splits = choose_num_splits(p, fwd_split_shape(plan.kernels, plan.shape), device.sm_count);
  plan.grid = plan.shape.grid(p);
  plan.block = plan.shape.block();
  plan.merge_params.num_splits = p.num_splits;
  // The Hopper forward takes the call as the sm_80 plan shaped it (GQA heads packed or not, the
  // one decision: gqa_decode.h) and chooses its own split count. It knows no block offsets (params.h,
  // block_offsets): a block of a larger attention stays on the sm_80 kernels.
  if (sm90_fwd_enabled(device.hopper_fwd, device.cc_major, device.cc_minor) &&
      p.block_offsets == nullptr && sm90_fwd_unsupported(p, type) == nullptr) {
    use_sm90_fwd(plan, params.num_splits, device.sm_count);
  }
  plan_split_scratch(plan);
  return plan;
}

// Whether the call of a plan needs its own tile counter: its 16-bit sm_90a kernel walks tiles
// (sm90_fwd_walks; the FP8 kernel never does) and they outnumber the sm_count SMs its launch sizes the grid by
// (hopper::fwd_sm90_walk_counts, the launch's own rule). The executor passes the launch's SM count
// (hopper/fwd_sm90_sms.h), so that the two agree; a call that needs none allocates nothing.
inline bool fwd_plan_takes_tile_counter(const FwdPlan& plan, int sm_count) {
  if (plan.empty || plan.fp8 || plan.kernels.arch != Arch::kSm90 || !sm90_fwd_walks(plan.params)) return false;
  return hopper::fwd_sm90_walk_counts(plan.grid.x * plan.grid.y * plan.grid.z, sm_count);
}

}  // namespace flashattn::cuda
