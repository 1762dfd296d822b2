// TMA, bulk copies and mbarriers on the shim: the sm_90 primitive cases (sm90_cases.h) and a
// producer/consumer ring of swizzled TMA tiles, correct under every schedule and copy
// completion; planted bugs and misuse (a TMA store of plain stores without fence.proxy.async
// among them), each reported as its named error or as stale data; the tensor-map encoder's
// checks; the counters.
//   tma_test CASE [SEED]
// Exit status: 0 = correct results, 1 = wrong results (printed), 3 = SimError (printed).
// Lines marked "// SITE:name" are the call sites the tests expect messages to name.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sm90_cases.h"
#include "named_cases.h"

namespace tma_ring {

using flashattn::TensorMap;

// A producer warp (warp 0, lane 0) loads kTiles tiles of 8 rows x 64 u16 (1024 bytes, 128-byte
// swizzle) by TMA into a ring of kStages stages; two consumer warps read each tile once its
// "full" mbarrier completes, undoing the swizzle by hand, and release the stage on "empty".
// Element (row r, col c) of the tensor holds r * 64 + c + 1, so a read of a stage that has not
// landed (the 0xFF poison, an older tile) is stale.
constexpr int kStages = 2, kTiles = 6, kRows = 8, kCols = 64;
constexpr uint32_t kTileBytes = kRows * kCols * 2;  // one 1024-byte swizzle atom
constexpr int kConsumerWarps = 2, kThreads = 32 * (1 + kConsumerWarps);
constexpr size_t kSmemBytes = kStages * kTileBytes + 64;

enum class Bug {
  None,
  MissingExpectTx,      // the producer arrives without announcing the tile's bytes
  ProducerWrongParity,  // the producer waits on phase 0 of the empty stages: nobody completes it
  ConsumerWrongParity,  // a consumer waits on the phase before its tile's
  ReadBeforeWait,       // a consumer reads its stage, then waits on "full"
};

__host__ __device__ inline uint16_t value(int row, int col) { return static_cast<uint16_t>(row * kCols + col + 1); }

template <Bug kBug>
__global__ void ring(const __grid_constant__ TensorMap map, uint16_t* out, int* stale) {
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kTileBytes);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    tma_prefetch_descriptor(&map);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kConsumerWarps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == 0) {
    if (lane != 0) return;
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % kStages;
      const uint32_t phase = (t / kStages) & 1;
      mbarrier_wait_parity(&empty[s], kBug == Bug::ProducerWrongParity ? phase : phase ^ 1);  // SITE:producer_wait
      if (kBug == Bug::MissingExpectTx) {
        mbarrier_arrive(&full[s]);
      } else {
        mbarrier_arrive_expect_tx(&full[s], kTileBytes);
      }
      tma_load_2d(smem + s * kTileBytes, &map, &full[s], 0, t * kRows);  // SITE:producer_load
    }
    return;
  }

  const int consumer = warp - 1;
  for (int t = 0; t < kTiles; ++t) {
    const int s = t % kStages;
    const uint32_t phase = (t / kStages) & 1;
    constexpr int kPerLane = kRows / kConsumerWarps * 2;
    uint16_t v[kPerLane];
    auto read = [&] {
      for (int j = 0; j < kPerLane; ++j) {
        const int row = consumer * (kRows / kConsumerWarps) + j / 2, col = lane * 2 + j % 2;
        const uint32_t offset = row * 128 + col * 2;
        const uint32_t swizzled = offset ^ (((offset >> 7) & 7) << 4);  // 128-byte swizzle
        v[j] = FLASHATTN_SMEM(reinterpret_cast<const uint16_t*>(smem + s * kTileBytes + swizzled))[0];
      }
    };
    if (kBug == Bug::ReadBeforeWait) read();  // SITE:early_read
    mbarrier_wait_parity(&full[s], kBug == Bug::ConsumerWrongParity ? phase ^ 1 : phase);  // SITE:consumer_wait
    if (kBug != Bug::ReadBeforeWait) read();
    for (int j = 0; j < kPerLane; ++j) {
      const int row = consumer * (kRows / kConsumerWarps) + j / 2, col = lane * 2 + j % 2;
      if (v[j] != value(t * kRows + row, col)) atomicAdd(stale, 1);
      out[(t * kRows + row) * kCols + col] = v[j];
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&empty[s]);  // SITE:consumer_release
  }
}

template <Bug kBug>
int run() {
  std::vector<uint16_t> src(kTiles * kRows * kCols), out(src.size(), 0);
  for (int r = 0; r < kTiles * kRows; ++r) {
    for (int c = 0; c < kCols; ++c) src[r * kCols + c] = value(r, c);
  }
  flashattn::TensorMapSpec spec;
  spec.dtype = flashattn::TensorMapDtype::UInt16;
  spec.rank = 2;
  spec.global = src.data();
  spec.dims[0] = kCols;
  spec.dims[1] = kTiles * kRows;
  spec.strides[0] = kCols * 2;
  spec.box[0] = kCols;
  spec.box[1] = kRows;
  spec.swizzle = flashattn::TensorMapSwizzle::B128;
  TensorMap map;
  const std::string error = flashattn::encode_tensor_map(&map, spec);
  if (!error.empty()) {
    std::printf("encode: %s\n", error.c_str());
    return 2;
  }
  int stale = 0;
  cudasim::launch(ring<kBug>, dim3(1), dim3(kThreads), kSmemBytes, map, out.data(), &stale);
  const bool wrong = stale != 0 || out != src;
  return selftest::verdict(wrong, "consumers read " + std::to_string(stale) + " stale values");
}

}  // namespace tma_ring

namespace tma_misuse {

using flashattn::TensorMap;
using namespace flashattn::ptx;

// A 2D map over 16 x 16 floats, box 16 x 4 (256 bytes), and a 1-warp kernel doing one thing.
enum class Misuse {
  RankMismatch, MisalignedBox, NotAMap, MapInSmem, LoadBeforeInit, ReduceNotF32,
  StoreWithoutWait, StoreSourceOverwritten, StoreUncommitted, StoreReadWaitThenExit,
  GenericStoreWithoutFence, GenericStoreWithFence,
};

template <Misuse kMisuse>
__global__ void kernel(const __grid_constant__ TensorMap map, const __grid_constant__ TensorMap u16_map,
                       const float* garbage) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 2048);
  if (threadIdx.x != 0) return;
  if (kMisuse != Misuse::LoadBeforeInit) mbarrier_init(bar, 1);
  if (kMisuse == Misuse::RankMismatch) {
    mbarrier_arrive_expect_tx(bar, 256);
    tma_load_3d(smem, &map, bar, 0, 0, 0);  // SITE:rank_mismatch
  }
  if (kMisuse == Misuse::MisalignedBox) {
    mbarrier_arrive_expect_tx(bar, 256);
    tma_load_2d(smem + 64, &map, bar, 0, 0);  // SITE:misaligned_box
  }
  if (kMisuse == Misuse::NotAMap) tma_prefetch_descriptor(garbage);  // SITE:not_a_map
  if (kMisuse == Misuse::MapInSmem) tma_store_2d(smem + 1024, smem, 0, 0);  // SITE:map_in_smem
  if (kMisuse == Misuse::LoadBeforeInit) tma_load_2d(smem, &map, bar, 0, 0);  // SITE:load_before_init
  if (kMisuse == Misuse::ReduceNotF32) tma_reduce_add_2d(&u16_map, smem, 0, 0);  // SITE:reduce_not_f32
  if (kMisuse == Misuse::GenericStoreWithoutFence || kMisuse == Misuse::GenericStoreWithFence) {
    // The box written by plain stores, then stored by TMA: the async proxy sees the stores only
    // after fence.proxy.async.
    for (int i = 0; i < 64; ++i) FLASHATTN_SMEM(reinterpret_cast<float*>(smem))[i] = 1000.f + i;  // SITE:generic_store
    if (kMisuse == Misuse::GenericStoreWithFence) fence_proxy_async_shared_cta();
    tma_store_2d(&map, smem, 0, 12);  // SITE:unfenced_store
    bulk_commit_group();
    bulk_wait_group<0>();
    return;
  }
  if (kMisuse >= Misuse::StoreWithoutWait) {
    mbarrier_arrive_expect_tx(bar, 256);
    tma_load_2d(smem, &map, bar, 0, 4);
    mbarrier_wait_parity(bar, 0);
    tma_store_2d(&map, smem, 0, 8);  // SITE:store
    if (kMisuse != Misuse::StoreUncommitted) bulk_commit_group();
    if (kMisuse == Misuse::StoreSourceOverwritten) {
      FLASHATTN_SMEM(reinterpret_cast<float*>(smem))[3] = -1.f;  // SITE:overwrite
      bulk_wait_group_read<0>();  // SITE:read_wait
    }
    if (kMisuse == Misuse::StoreUncommitted) bulk_wait_group<0>();
    if (kMisuse == Misuse::StoreReadWaitThenExit) bulk_wait_group_read<0>();
  }
}

template <Misuse kMisuse>
int run() {
  static std::vector<float> global(16 * 16);
  static std::vector<uint16_t> global16(16 * 16);
  for (int i = 0; i < 256; ++i) global[i] = static_cast<float>(i);
  flashattn::TensorMapSpec spec;
  spec.dtype = flashattn::TensorMapDtype::Float32;
  spec.global = global.data();
  spec.dims[0] = spec.dims[1] = 16;
  spec.strides[0] = 64;
  spec.box[0] = 16;
  spec.box[1] = 4;
  TensorMap map, u16_map;
  flashattn::encode_tensor_map(&map, spec);
  spec.dtype = flashattn::TensorMapDtype::UInt16;
  spec.global = global16.data();
  spec.strides[0] = 32;
  flashattn::encode_tensor_map(&u16_map, spec);
  alignas(64) static float garbage[32] = {};
  cudasim::launch(kernel<kMisuse>, dim3(1), dim3(32), 4096, map, u16_map, garbage);
  // A store retired by wait_group.read alone completes by the end of the grid.
  if (kMisuse == Misuse::StoreReadWaitThenExit) {
    for (int i = 0; i < 64; ++i) {
      if (global[8 * 16 + i] != static_cast<float>(4 * 16 + i)) {
        std::printf("WRONG: element %d of the stored box is %g\n", i, global[8 * 16 + i]);
        return 1;
      }
    }
  }
  if (kMisuse == Misuse::GenericStoreWithFence) {
    for (int i = 0; i < 64; ++i) {
      if (global[12 * 16 + i] != 1000.f + i) {
        std::printf("WRONG: element %d of the fenced store is %g\n", i, global[12 * 16 + i]);
        return 1;
      }
    }
  }
  std::printf("OK\n");
  return 0;
}

}  // namespace tma_misuse

namespace encoder {

// Each bad argument to cuTensorMapEncodeTiled, one at a time, from a valid 3D spec.
int run() {
  alignas(128) static unsigned char global[1 << 16];
  auto valid = [] {
    flashattn::TensorMapSpec s;
    s.dtype = flashattn::TensorMapDtype::BFloat16;
    s.rank = 3;
    s.global = global;
    s.dims[0] = 64, s.dims[1] = 32, s.dims[2] = 4;
    s.strides[0] = 128, s.strides[1] = 128 * 32;
    s.box[0] = 64, s.box[1] = 16, s.box[2] = 1;
    s.swizzle = flashattn::TensorMapSwizzle::B128;
    return s;
  };
  using Edit = std::function<void(flashattn::TensorMapSpec&)>;
  const std::vector<std::pair<const char*, Edit>> edits = {
      {"valid", [](flashattn::TensorMapSpec&) {}},
      {"rank_zero", [](flashattn::TensorMapSpec& s) { s.rank = 0; }},
      {"rank_six", [](flashattn::TensorMapSpec& s) { s.rank = 6; }},
      {"global_misaligned", [](flashattn::TensorMapSpec& s) { s.global = global + 8; }},
      {"dim_zero", [](flashattn::TensorMapSpec& s) { s.dims[1] = 0; }},
      {"dim_too_big", [](flashattn::TensorMapSpec& s) { s.dims[2] = (1ull << 32) + 1; }},
      {"stride_not_16", [](flashattn::TensorMapSpec& s) { s.strides[0] = 136; }},
      {"stride_too_big", [](flashattn::TensorMapSpec& s) { s.strides[1] = 1ull << 40; }},
      {"box_zero", [](flashattn::TensorMapSpec& s) { s.box[2] = 0; }},
      {"box_too_big", [](flashattn::TensorMapSpec& s) { s.box[1] = 257; }},
      {"box_inner_not_16_bytes", [](flashattn::TensorMapSpec& s) {
         s.swizzle = flashattn::TensorMapSwizzle::None;
         s.box[0] = 12;
       }},
      {"box_inner_over_swizzle", [](flashattn::TensorMapSpec& s) { s.swizzle = flashattn::TensorMapSwizzle::B64; }},
      {"element_stride_zero", [](flashattn::TensorMapSpec& s) { s.element_strides[1] = 0; }},
      {"element_stride_nine", [](flashattn::TensorMapSpec& s) { s.element_strides[2] = 9; }},
      {"bad_dtype", [](flashattn::TensorMapSpec& s) { s.dtype = static_cast<flashattn::TensorMapDtype>(42); }},
      {"bad_swizzle", [](flashattn::TensorMapSpec& s) { s.swizzle = static_cast<flashattn::TensorMapSwizzle>(9); }},
      {"nan_fill_integer", [](flashattn::TensorMapSpec& s) {
         s.dtype = flashattn::TensorMapDtype::UInt16;
         s.oob_fill = flashattn::TensorMapOobFill::NanRequestZeroFma;
       }},
      {"interleave_32_rank_2", [](flashattn::TensorMapSpec& s) {
         s.rank = 2;
         s.interleave = flashattn::TensorMapInterleave::B32;
       }},
      {"unmodelled_interleave", [](flashattn::TensorMapSpec& s) {
         s.interleave = flashattn::TensorMapInterleave::B16;
         s.swizzle = flashattn::TensorMapSwizzle::None;
       }},
      {"unmodelled_element_stride", [](flashattn::TensorMapSpec& s) { s.element_strides[1] = 2; }},
      {"unmodelled_nan_fill", [](flashattn::TensorMapSpec& s) { s.oob_fill = flashattn::TensorMapOobFill::NanRequestZeroFma; }},
  };
  for (const auto& [name, edit] : edits) {
    flashattn::TensorMapSpec spec = valid();
    edit(spec);
    flashattn::TensorMap map;
    const std::string error = flashattn::encode_tensor_map(&map, spec);
    std::printf("%s: %s\n", name, error.empty() ? "ok" : error.c_str());
  }
  // The map itself must be 64-byte aligned.
  alignas(64) static unsigned char raw[256];
  flashattn::TensorMapSpec spec = valid();
  std::printf("map_misaligned: %s\n",
              cudasim::encode_tensor_map_tiled(raw + 32, 9, 3, global, spec.dims, spec.strides, spec.box,
                                               spec.element_strides, 0, 3, 0, 0)
                  .c_str());
  return 0;
}

}  // namespace encoder

namespace counted {

using namespace flashattn::ptx;

// Known numbers of each counted sm_90 operation, from two warps.
__global__ void kernel(const __grid_constant__ flashattn::TensorMap map, float* gmem) {
  FLASHATTN_DYNAMIC_SMEM(unsigned char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 2048);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_prefetch_descriptor(&map);
    mbarrier_arrive_expect_tx(bar, 256 + 64);
    tma_load_2d(smem, &map, bar, 0, 0);
    bulk_copy_g2s(smem + 1024, gmem, 64, bar);
  }
  mbarrier_wait_parity(bar, 0);
  named_barrier_sync(1, 64);
  if (threadIdx.x == 0) {
    tma_store_2d(&map, smem, 0, 8);
    bulk_commit_group();
    bulk_wait_group_read<0>();
    bulk_copy_s2g(gmem + 64, smem + 1024, 64);
    bulk_reduce_add_f32(gmem + 128, reinterpret_cast<const float*>(smem + 1024), 64);
    bulk_commit_group();
    bulk_wait_group<0>();
    mbarrier_inval(bar);
  }
}

int run() {
  std::vector<float> global(16 * 16, 1.f);
  flashattn::TensorMapSpec spec;
  spec.dtype = flashattn::TensorMapDtype::Float32;
  spec.global = global.data();
  spec.dims[0] = spec.dims[1] = 16;
  spec.strides[0] = 64;
  spec.box[0] = 16;
  spec.box[1] = 4;
  flashattn::TensorMap map;
  flashattn::encode_tensor_map(&map, spec);
  selftest::counted_launch(kernel, 64, 4096, map, global.data());
  return 0;
}

}  // namespace counted

int run_cases(uint64_t seed) {
  std::vector<primitives::CaseResult> results;
  primitives::sm90::run_tma_cases(seed, results);
  int failures = 0;
  for (const auto& r : results) {
    if (r.actual != r.expected) {
      ++failures;
      std::printf("WRONG %s\n", r.name.c_str());
    }
  }
  if (failures == 0) std::printf("OK %zu cases\n", results.size());
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CASE [SEED]\n", argv[0]);
    return 64;
  }
  const std::string name = argv[1];
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20261129;
  using tma_ring::Bug;
  using tma_misuse::Misuse;
  const std::map<std::string, std::function<int()>> cases = {
      {"cases", [seed] { return run_cases(seed); }},
      {"ring", tma_ring::run<Bug::None>},
      {"ring_missing_expect_tx", tma_ring::run<Bug::MissingExpectTx>},
      {"ring_producer_wrong_parity", tma_ring::run<Bug::ProducerWrongParity>},
      {"ring_consumer_wrong_parity", tma_ring::run<Bug::ConsumerWrongParity>},
      {"ring_read_before_wait", tma_ring::run<Bug::ReadBeforeWait>},
      {"rank_mismatch", tma_misuse::run<Misuse::RankMismatch>},
      {"misaligned_box", tma_misuse::run<Misuse::MisalignedBox>},
      {"not_a_map", tma_misuse::run<Misuse::NotAMap>},
      {"map_in_smem", tma_misuse::run<Misuse::MapInSmem>},
      {"load_before_init", tma_misuse::run<Misuse::LoadBeforeInit>},
      {"reduce_not_f32", tma_misuse::run<Misuse::ReduceNotF32>},
      {"store_without_wait", tma_misuse::run<Misuse::StoreWithoutWait>},
      {"store_source_overwritten", tma_misuse::run<Misuse::StoreSourceOverwritten>},
      {"store_uncommitted", tma_misuse::run<Misuse::StoreUncommitted>},
      {"store_read_wait_then_exit", tma_misuse::run<Misuse::StoreReadWaitThenExit>},
      {"generic_store_without_fence", tma_misuse::run<Misuse::GenericStoreWithoutFence>},
      {"generic_store_with_fence", tma_misuse::run<Misuse::GenericStoreWithFence>},
      {"encoder", encoder::run},
      {"counters", counted::run},
  };
  auto it = cases.find(name);
  if (it == cases.end()) {
    std::fprintf(stderr, "unknown case %s\n", name.c_str());
    return 64;
  }
  try {
    return it->second();
  } catch (const cudasim::SimError& e) {
    std::printf("%s\n", e.what());
    return 3;
  }
}
