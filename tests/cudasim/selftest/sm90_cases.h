// sm_90 primitive cases: TMA tensor loads (2D-5D, each swizzle, boxes partly outside the
// tensor), tensor stores and f32 add reductions, bulk copies both ways, and mbarrier phases.
// Each runs on the shim (primitives_test, tma_test) and, built with
// -gencode arch=compute_90a,code=sm_90a, on the GPU (layout_check.cu), with identical inputs
// from the same splitmix64; the references are written here from the PTX ISA's and the driver
// API's descriptions, not from the shim's code. Every value is an integer, so the GPU and the
// shim must agree bit for bit.
//
// Shared memory is written only by the async proxy (TMA, bulk copies) before an async-proxy
// read (a store), so no fence.proxy.async is needed.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/ptx.cuh"
#include "cuda/tensor_map.h"
#include "primitive_cases.h"

// Kernel bodies exist for the shim, nvcc's host pass and sm_90+ device code (where ptx.cuh has
// the sm_90 wrappers); an older device pass compiles them empty, and layout_check.cu runs them
// only when built for sm_90a (LAYOUT_CHECK_SM90).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define SM90_CASES_DEVICE_CODE 1
#endif

namespace primitives {
namespace sm90 {

constexpr int kMaxRank = 5;
constexpr uint32_t kSwizzleAtom = 1024;  // the swizzle pattern's period: boxes start aligned to it

// A tensor copy's description, as both sides see it.
struct TensorDesc {
  int rank;
  int elem_bytes;
  uint64_t dims[kMaxRank];
  uint64_t strides[kMaxRank];  // bytes; strides[0] = elem_bytes
  uint32_t box[kMaxRank];
  int swizzle_bytes;  // 0, 32, 64, 128
  // Elements of a global buffer that holds the tensor: up to its last element.
  uint64_t elements() const {
    uint64_t last = 0;
    for (int d = 0; d < rank; ++d) last += (dims[d] - 1) * strides[d];
    return last / elem_bytes + 1;
  }
  uint32_t box_elements() const {
    uint32_t n = 1;
    for (int d = 0; d < rank; ++d) n *= box[d];
    return n;
  }
  uint32_t box_bytes() const { return box_elements() * static_cast<uint32_t>(elem_bytes); }
};

inline flashattn::TensorMapSwizzle swizzle_enum(int bytes) {
  using S = flashattn::TensorMapSwizzle;
  return bytes == 32 ? S::B32 : bytes == 64 ? S::B64 : bytes == 128 ? S::B128 : S::None;
}

// Encodes `desc` over `global`; exits on failure (the encoder's own checks are tma_test's).
inline flashattn::TensorMap encode(const TensorDesc& desc, const void* global, flashattn::TensorMapDtype dtype) {
  flashattn::TensorMapSpec spec;
  spec.dtype = dtype;
  spec.rank = static_cast<uint32_t>(desc.rank);
  spec.global = global;
  for (int d = 0; d < desc.rank; ++d) {
    spec.dims[d] = desc.dims[d];
    spec.box[d] = desc.box[d];
    if (d > 0) spec.strides[d - 1] = desc.strides[d];
  }
  spec.swizzle = swizzle_enum(desc.swizzle_bytes);
  flashattn::TensorMap map;
  const std::string error = flashattn::encode_tensor_map(&map, spec);
  if (!error.empty()) {
    std::fprintf(stderr, "sm90 case: %s\n", error.c_str());
    std::exit(2);
  }
  return map;
}

// ---- The reference, from the PTX ISA ("Tensor copy", "Tensor-map swizzling modes"): the box is
// laid out in shared memory densely, innermost dimension first; with a swizzle of S bytes, the
// 16-byte chunk at byte offset o (from a 1024-byte aligned base) moves to chunk
// (o / 16 % (S / 16)) XOR (o / 128 % (S / 16)) of its S-byte segment. ----
inline uint32_t reference_swizzle(uint32_t offset, int swizzle_bytes) {
  if (swizzle_bytes == 0) return offset;
  const uint32_t chunks = static_cast<uint32_t>(swizzle_bytes) / 16;
  const uint32_t chunk = offset / 16 % chunks;
  const uint32_t row = offset / 128 % chunks;
  return offset - chunk * 16 + (chunk ^ row) * 16;
}

// Calls f(smem byte offset of the element in the box, global element index or -1 outside).
template <class F>
void reference_box(const TensorDesc& t, const int32_t* coords, F&& f) {
  int64_t idx[kMaxRank] = {};
  for (uint32_t linear = 0; linear < t.box_elements(); ++linear) {
    int64_t element = 0;
    bool inside = true;
    for (int d = 0; d < t.rank; ++d) {
      const int64_t x = coords[d] + idx[d];
      inside = inside && x >= 0 && x < static_cast<int64_t>(t.dims[d]);
      element += x * static_cast<int64_t>(t.strides[d] / t.elem_bytes);
    }
    f(reference_swizzle(linear * static_cast<uint32_t>(t.elem_bytes), t.swizzle_bytes), inside ? element : -1);
    for (int d = 0; d < t.rank; ++d) {
      if (++idx[d] < static_cast<int64_t>(t.box[d])) break;
      idx[d] = 0;
    }
  }
}

// Offset that makes `base + pad` 1024-byte aligned in the shared address space (the swizzle
// follows absolute shared-memory addresses).
#ifdef SM90_CASES_DEVICE_CODE
__device__ inline uint32_t atom_pad(const void* base) {
  return (kSwizzleAtom - flashattn::ptx::smem_u32addr(base) % kSwizzleAtom) % kSwizzleAtom;
}
#endif

// ---- Kernels: one warp; thread 0 drives the copies, every lane dumps shared memory. ----
// Loads `boxes` boxes at coords[b * 5 ...] into consecutive 1024-aligned slots, then dumps them.
__global__ void tma_load_kernel(const __grid_constant__ flashattn::TensorMap map, int rank, int boxes,
                                const int32_t* coords, uint32_t slot_bytes, uint32_t box_bytes,
                                unsigned char* out) {
#ifdef SM90_CASES_DEVICE_CODE
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, sm90_smem);
  unsigned char* base = sm90_smem + atom_pad(sm90_smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + boxes * slot_bytes);
  if (threadIdx.x == 0) {
    tma_prefetch_descriptor(&map);
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, box_bytes * boxes);
    for (int b = 0; b < boxes; ++b) {
      const int32_t* c = coords + b * kMaxRank;
      void* dst = base + b * slot_bytes;
      if (rank == 2) tma_load_2d(dst, &map, bar, c[0], c[1]);
      if (rank == 3) tma_load_3d(dst, &map, bar, c[0], c[1], c[2]);
      if (rank == 4) tma_load_4d(dst, &map, bar, c[0], c[1], c[2], c[3]);
      if (rank == 5) tma_load_5d(dst, &map, bar, c[0], c[1], c[2], c[3], c[4]);
    }
  }
  mbarrier_wait_parity(bar, 0);
  for (uint32_t i = threadIdx.x; i < boxes * box_bytes; i += blockDim.x) {
    const uint32_t b = i / box_bytes, at = i % box_bytes;
    out[i] = FLASHATTN_SMEM(base)[b * slot_bytes + at];
  }
#endif
}

// Loads one box through `load_map` at load_coords, then stores (or add-reduces) it through
// `store_map` at store_coords; both maps have the same box.
__global__ void tma_store_kernel(const __grid_constant__ flashattn::TensorMap load_map,
                                 const __grid_constant__ flashattn::TensorMap store_map, int rank,
                                 const int32_t* load_coords, const int32_t* store_coords, uint32_t box_bytes,
                                 int reduce) {
#ifdef SM90_CASES_DEVICE_CODE
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, sm90_smem);
  unsigned char* base = sm90_smem + atom_pad(sm90_smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + (box_bytes + kSwizzleAtom - 1) / kSwizzleAtom * kSwizzleAtom);
  if (threadIdx.x != 0) return;
  mbarrier_init(bar, 1);
  fence_mbarrier_init();
  mbarrier_arrive_expect_tx(bar, box_bytes);
  const int32_t* l = load_coords;
  const int32_t* s = store_coords;
  if (rank == 2) tma_load_2d(base, &load_map, bar, l[0], l[1]);
  if (rank == 3) tma_load_3d(base, &load_map, bar, l[0], l[1], l[2]);
  if (rank == 4) tma_load_4d(base, &load_map, bar, l[0], l[1], l[2], l[3]);
  if (rank == 5) tma_load_5d(base, &load_map, bar, l[0], l[1], l[2], l[3], l[4]);
  mbarrier_wait_parity(bar, 0);
  if (!reduce) {
    if (rank == 2) tma_store_2d(&store_map, base, s[0], s[1]);
    if (rank == 3) tma_store_3d(&store_map, base, s[0], s[1], s[2]);
    if (rank == 4) tma_store_4d(&store_map, base, s[0], s[1], s[2], s[3]);
    if (rank == 5) tma_store_5d(&store_map, base, s[0], s[1], s[2], s[3], s[4]);
  } else {
    if (rank == 2) tma_reduce_add_2d(&store_map, base, s[0], s[1]);
    if (rank == 3) tma_reduce_add_3d(&store_map, base, s[0], s[1], s[2]);
    if (rank == 4) tma_reduce_add_4d(&store_map, base, s[0], s[1], s[2], s[3]);
    if (rank == 5) tma_reduce_add_5d(&store_map, base, s[0], s[1], s[2], s[3], s[4]);
  }
  bulk_commit_group();
  bulk_wait_group_read<0>();
  bulk_wait_group<0>();
#endif
}

// cp.async.bulk: `bytes` from src into shared memory, then back out to dst (stored) and dst_add
// (add-reduced as f32).
__global__ void bulk_copy_kernel(const float* src, float* dst, float* dst_add, uint32_t bytes) {
#ifdef SM90_CASES_DEVICE_CODE
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, sm90_smem);
  unsigned char* base = sm90_smem + atom_pad(sm90_smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + bytes);
  if (threadIdx.x != 0) return;
  mbarrier_init(bar, 1);
  fence_mbarrier_init();
  mbarrier_arrive_expect_tx(bar, bytes);
  bulk_copy_g2s(base, src, bytes / 2, bar);
  bulk_copy_g2s(base + bytes / 2, src + bytes / 8, bytes / 2, bar);
  mbarrier_wait_parity(bar, 0);
  bulk_copy_s2g(dst, base, bytes);
  bulk_commit_group();
  bulk_reduce_add_f32(dst_add, reinterpret_cast<const float*>(base), bytes);
  bulk_commit_group();
  bulk_wait_group_read<0>();
  bulk_wait_group<0>();
#endif
}

// mbarrier phases as test_wait.parity sees them: out[k] = test_wait(parity k % 2) at step k / 2.
__global__ void mbarrier_phase_kernel(const float* src, uint32_t* out) {
#ifdef SM90_CASES_DEVICE_CODE
  using namespace flashattn::ptx;
  FLASHATTN_DYNAMIC_SMEM(unsigned char, sm90_smem);
  unsigned char* base = sm90_smem + atom_pad(sm90_smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + 256);
  if (threadIdx.x != 0) return;
  int k = 0;
  auto probe = [&] {
    out[k++] = mbarrier_test_wait_parity(bar, 0);
    out[k++] = mbarrier_test_wait_parity(bar, 1);
  };
  mbarrier_init(bar, 3);
  fence_mbarrier_init();
  probe();                                 // phase 0 open: parity 1 (the one before) is done
  mbarrier_arrive(bar);
  probe();                                 // 1 of 3 arrivals
  mbarrier_arrive_count(bar, 2);
  probe();                                 // phase 0 complete, phase 1 open
  mbarrier_expect_tx(bar, 128);
  mbarrier_arrive_count(bar, 3);
  probe();                                 // all arrivals, 128 tx bytes pending
  bulk_copy_g2s(base, src, 128, bar);
  mbarrier_wait_parity(bar, 1);
  probe();                                 // phase 1 complete
  mbarrier_arrive_expect_tx(bar, 64);
  bulk_copy_g2s(base + 128, src, 64, bar);
  mbarrier_arrive_count(bar, 2);
  mbarrier_wait_parity(bar, 0);
  probe();                                 // phase 2 complete
  out[k++] = FLASHATTN_SMEM(reinterpret_cast<const uint32_t*>(base))[5];
  mbarrier_inval(bar);
#endif
}

// ---- Cases ----

// A tensor of rank `rank` with small dims, its rows padded to a multiple of 16 bytes (plus a
// random extra 16 * k), and a box whose inner extent is the swizzle span (or 16-48 bytes).
inline TensorDesc random_tensor(int rank, int elem_bytes, int swizzle_bytes, Rng& rng,
                                uint32_t inner_bytes = 0) {
  TensorDesc t{};
  t.rank = rank;
  t.elem_bytes = elem_bytes;
  t.swizzle_bytes = swizzle_bytes;
  if (inner_bytes == 0) {
    inner_bytes = swizzle_bytes != 0 ? static_cast<uint32_t>(swizzle_bytes) : 16u * (1 + rng.below(3));
  }
  t.box[0] = inner_bytes / static_cast<uint32_t>(elem_bytes);
  t.dims[0] = t.box[0] + 1 + rng.below(static_cast<int>(t.box[0]));
  t.strides[0] = static_cast<uint64_t>(elem_bytes);
  uint64_t row_bytes = (t.dims[0] * elem_bytes + 15) / 16 * 16 + 16 * rng.below(2);
  const uint32_t box_budget = rank <= 2 ? 8 : rank == 3 ? 4 : 2;  // keeps boxes <= 4 KB
  for (int d = 1; d < rank; ++d) {
    t.box[d] = 1 + rng.below(static_cast<int>(box_budget));
    t.dims[d] = t.box[d] + 1 + rng.below(3);
    t.strides[d] = row_bytes;
    row_bytes *= t.dims[d];
  }
  return t;
}

inline std::vector<int32_t> random_coords(const TensorDesc& t, bool inside, Rng& rng) {
  std::vector<int32_t> c(kMaxRank, 0);
  for (int d = 0; d < t.rank; ++d) {
    const int span = static_cast<int>(t.dims[d]) - static_cast<int>(t.box[d]);
    // inside: the box fits; otherwise it sticks out at one end in every dimension.
    c[d] = inside ? rng.below(span + 1)
                  : (rng.below(2) ? -1 - rng.below(static_cast<int>(t.box[d])) : span + 1 + rng.below(static_cast<int>(t.box[d])));
  }
  return c;
}

// inner_bytes: the box's inner extent, the swizzle span unless given (then it may be shorter:
// the shim lays such a box out densely, an assumption only hardware can confirm).
inline CaseResult tma_load_case(int rank, int swizzle_bytes, Rng& rng, uint32_t inner_bytes = 0) {
  const int elem_bytes = 2;  // UINT16: f16/bf16-sized, the tiles' element
  TensorDesc t = random_tensor(rank, elem_bytes, swizzle_bytes, rng, inner_bytes);
  if (swizzle_bytes != 0 && t.box_bytes() % static_cast<uint32_t>(swizzle_bytes) != 0) {
    // Whole swizzle spans only, so no chunk is swizzled past the box (rank 2: one more row).
    t.box[1] += 1;
    if (t.dims[1] < t.box[1] + 1) t.dims[1] = t.box[1] + 1;
  }
  std::vector<uint16_t> global(t.elements());
  for (uint16_t& v : global) v = static_cast<uint16_t>(rng.next());
  std::vector<int32_t> coords = random_coords(t, true, rng);
  const std::vector<int32_t> outside = random_coords(t, false, rng);
  coords.insert(coords.end(), outside.begin(), outside.end());
  const int boxes = 2;
  const uint32_t box_bytes = t.box_bytes();
  const uint32_t slot_bytes = (box_bytes + kSwizzleAtom - 1) / kSwizzleAtom * kSwizzleAtom;

  std::vector<unsigned char> expected(boxes * box_bytes, 0);
  for (int b = 0; b < boxes; ++b) {
    reference_box(t, &coords[b * kMaxRank], [&](uint32_t at, int64_t element) {
      const uint16_t v = element < 0 ? 0 : global[static_cast<size_t>(element)];  // zero fill
      std::memcpy(&expected[b * box_bytes + at], &v, 2);
    });
  }
  DeviceArray<uint16_t> global_d(global);
  DeviceArray<int32_t> coords_d(coords);
  DeviceArray<unsigned char> out_d{std::vector<unsigned char>(expected.size(), 0xAB)};
  const flashattn::TensorMap map = encode(t, global_d.get(), flashattn::TensorMapDtype::UInt16);
  launch_one_block(tma_load_kernel, 32, boxes * slot_bytes + kSwizzleAtom + 64, map, rank, boxes,
                   static_cast<const int32_t*>(coords_d.get()), slot_bytes, box_bytes, out_d.get());
  const auto actual = out_d.read();
  const std::string name = "tma_load_" + std::to_string(rank) + "d_swizzle" + std::to_string(swizzle_bytes) +
                           (inner_bytes != 0 ? "_inner" + std::to_string(inner_bytes) : "");
  return {name, GpuCompare::Bitwise, actual, expected, actual};
}

// Loads a box through a map with swizzle `load_swizzle` and stores (or f32-adds) it through one
// with `store_swizzle`: where the two differ, the global result is the box permuted.
inline CaseResult tma_store_case(int rank, int load_swizzle, int store_swizzle, bool reduce, Rng& rng) {
  const int elem_bytes = 4;
  const int inner_bytes = load_swizzle != 0 ? load_swizzle : store_swizzle != 0 ? store_swizzle : 32;
  TensorDesc src = random_tensor(rank, elem_bytes, inner_bytes, rng);
  src.swizzle_bytes = load_swizzle;
  TensorDesc dst = random_tensor(rank, elem_bytes, inner_bytes, rng);
  dst.swizzle_bytes = store_swizzle;
  for (int d = 1; d < rank; ++d) dst.box[d] = src.box[d];  // the same box
  for (int d = 1; d < rank; ++d) {  // dims may need to grow to hold the box; redo the strides
    if (dst.dims[d] < dst.box[d] + 1) dst.dims[d] = dst.box[d] + 1;
  }
  uint64_t row_bytes = dst.strides[1];
  for (int d = 1; d < rank; ++d) {
    dst.strides[d] = row_bytes;
    row_bytes *= dst.dims[d];
  }
  auto value = [&] { return static_cast<float>(rng.below(201) - 100); };
  std::vector<float> src_global(src.elements()), dst_global(dst.elements());
  for (float& v : src_global) v = value();
  for (float& v : dst_global) v = value();
  const std::vector<int32_t> load_coords = random_coords(src, true, rng);
  const std::vector<int32_t> store_coords = random_coords(dst, rng.below(2) == 0, rng);

  // Shared memory after the load: smem offset -> value; then the store reads the same offsets
  // through the store map's swizzle.
  std::vector<float> smem(src.box_bytes() / 4 + 64, 0.f);
  reference_box(src, load_coords.data(), [&](uint32_t at, int64_t element) {
    smem[at / 4] = element < 0 ? 0.f : src_global[static_cast<size_t>(element)];
  });
  std::vector<float> expected = dst_global;
  reference_box(dst, store_coords.data(), [&](uint32_t at, int64_t element) {
    if (element < 0) return;  // outside the tensor: not written
    float& out = expected[static_cast<size_t>(element)];
    out = reduce ? out + smem[at / 4] : smem[at / 4];
  });

  DeviceArray<float> src_d(src_global), dst_d(dst_global);
  DeviceArray<int32_t> load_d(load_coords), store_d(store_coords);
  const flashattn::TensorMap load_map = encode(src, src_d.get(), flashattn::TensorMapDtype::Float32);
  const flashattn::TensorMap store_map = encode(dst, dst_d.get(), flashattn::TensorMapDtype::Float32);
  launch_one_block(tma_store_kernel, 32, 2 * kSwizzleAtom + src.box_bytes() + 64, load_map, store_map, rank,
                   static_cast<const int32_t*>(load_d.get()), static_cast<const int32_t*>(store_d.get()),
                   src.box_bytes(), reduce ? 1 : 0);
  const auto actual = bytes_of(dst_d.read());
  const std::string name = std::string(reduce ? "tma_reduce_add_" : "tma_store_") + std::to_string(rank) +
                           "d_swizzle" + std::to_string(load_swizzle) + "_to_" + std::to_string(store_swizzle);
  return {name, GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

inline CaseResult bulk_copy_case(Rng& rng) {
  const uint32_t bytes = 512;
  const size_t n = bytes / 4;
  std::vector<float> src(n), dst(n), dst_add(n);
  for (float& v : src) v = static_cast<float>(rng.below(101) - 50);
  for (float& v : dst) v = static_cast<float>(rng.below(101) - 50);
  for (float& v : dst_add) v = static_cast<float>(rng.below(101) - 50);
  std::vector<float> expected = src;
  for (size_t i = 0; i < n; ++i) expected.push_back(dst_add[i] + src[i]);
  DeviceArray<float> src_d(src), dst_d(dst), add_d(dst_add);
  launch_one_block(bulk_copy_kernel, 32, bytes + kSwizzleAtom + 64, static_cast<const float*>(src_d.get()),
                   dst_d.get(), add_d.get(), bytes);
  std::vector<float> actual = dst_d.read();
  const std::vector<float> added = add_d.read();
  actual.insert(actual.end(), added.begin(), added.end());
  return {"bulk_copy_g2s_s2g_reduce_add_f32", GpuCompare::Bitwise, bytes_of(actual), bytes_of(expected),
          bytes_of(actual)};
}

inline CaseResult mbarrier_phase_case(Rng& rng) {
  std::vector<float> src(64);
  for (float& v : src) v = static_cast<float>(rng.below(1000));
  // test_wait.parity p is true once the phase of parity p has completed: before any phase
  // completes, parity 1 counts as the phase before phase 0.
  const std::vector<uint32_t> probes = {0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0};
  std::vector<uint32_t> expected = probes;
  uint32_t fifth;
  std::memcpy(&fifth, &src[5], 4);
  expected.push_back(fifth);
  DeviceArray<float> src_d(src);
  DeviceArray<uint32_t> out_d{std::vector<uint32_t>(expected.size(), 7)};
  launch_one_block(mbarrier_phase_kernel, 32, kSwizzleAtom + 512, static_cast<const float*>(src_d.get()),
                   out_d.get());
  const auto actual = bytes_of(out_d.read());
  return {"mbarrier_phases_test_wait", GpuCompare::Bitwise, actual, bytes_of(expected), actual};
}

// Every TMA / mbarrier case, in a fixed order.
inline void run_tma_cases(uint64_t seed, std::vector<CaseResult>& results) {
  Rng rng(seed ^ 0x5a17e5ull);
  for (int rank = 2; rank <= 5; ++rank) {
    for (int swizzle : {0, 32, 64, 128}) results.push_back(tma_load_case(rank, swizzle, rng));
  }
  results.push_back(tma_load_case(2, 128, rng, 64));  // a box narrower than its swizzle span
  results.push_back(tma_store_case(2, 0, 0, false, rng));
  results.push_back(tma_store_case(2, 0, 128, false, rng));
  results.push_back(tma_store_case(3, 64, 0, false, rng));
  results.push_back(tma_store_case(4, 32, 32, false, rng));
  results.push_back(tma_store_case(5, 128, 128, false, rng));
  results.push_back(tma_store_case(2, 128, 0, true, rng));
  results.push_back(tma_store_case(3, 0, 64, true, rng));
  results.push_back(bulk_copy_case(rng));
  results.push_back(mbarrier_phase_case(rng));
}

}  // namespace sm90
}  // namespace primitives

#if __has_include("sm90_wgmma_cases.h")
#include "sm90_wgmma_cases.h"
#define SM90_CASES_HAVE_WGMMA 1
#endif
#include "sm90_fp8_cases.h"

namespace primitives {

// The sm_90 cases: ours, the wgmma helper's when its header exists, then the FP8 ones.
inline void run_sm90_cases(uint64_t seed, std::vector<CaseResult>& results) {
  sm90::run_tma_cases(seed, results);
#ifdef SM90_CASES_HAVE_WGMMA
  run_wgmma_cases(seed, results);
#endif
  run_fp8_cases(seed, results);
}

}  // namespace primitives
