// TMA on the shim: the tensor-map encoder with cuTensorMapEncodeTiled's documented checks,
// tensor loads (through the async engine, completing on an mbarrier), tensor stores and
// reductions, bulk stores and reductions, and the per-thread bulk groups that retire them.
//
// A tensor copy moves a box of box[0] x ... x box[rank-1] elements; in shared memory the box is
// dense, innermost dimension first, each element at (dst - smem base + linear index * element
// size) passed through the map's swizzle (swizzle.h). Box elements outside the tensor are
// zero-filled by loads and not written by stores. Out of scope, each a named error: interleaved
// layouts, element strides other than 1, NaN out-of-bounds fill, the packed 4/6-bit types, and
// reductions other than f32 add.
#include <cstdio>
#include <cstring>

#include "async_proxy.h"
#include "block.h"
#include "swizzle.h"
#include "tma.h"

namespace cudasim {
namespace {

constexpr uint64_t kMagic = 0x70616d726f736e65ull;  // the shim's encoder wrote this map
constexpr int kMaxRank = 5;
constexpr uint32_t kMaxBox = 256;
constexpr uint64_t kMaxDim = 1ull << 32;
constexpr uint64_t kMaxStride = 1ull << 40;
constexpr uintptr_t kTensorSmemAlignment = 128;  // of a tensor copy's shared-memory box

// The shim's layout of the 128 opaque bytes.
struct ShimTensorMap {
  uint64_t magic;
  const unsigned char* global;
  uint64_t strides[kMaxRank];  // bytes; strides[0] is the element size
  uint32_t dims_minus_1[kMaxRank];
  uint16_t box[kMaxRank];
  uint8_t rank, dtype, elem_bytes, swizzle_bytes;
};
static_assert(sizeof(ShimTensorMap) <= kTensorMapBytes, "the shim's map must fit a CUtensorMap");

// Element size of a CUtensorMapDataType, 0 for the types the shim does not model.
int element_bytes(int dtype) {
  switch (dtype) {
    case 0: return 1;                          // UINT8
    case 1: case 6: case 9: return 2;          // UINT16, FLOAT16, BFLOAT16
    case 2: case 3: case 7: case 10: case 11: case 12: return 4;  // (U)INT32, FLOAT32(_FTZ), TF32(_FTZ)
    case 4: case 5: case 8: return 8;          // (U)INT64, FLOAT64
    default: return 0;
  }
}
bool is_f32(int dtype) { return dtype == 7 || dtype == 10; }

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

std::string encode_tensor_map_tiled(void* map, int dtype, uint32_t rank, const void* global,
                                    const uint64_t* dims, const uint64_t* strides,
                                    const uint32_t* box, const uint32_t* element_strides,
                                    int interleave, int swizzle, int l2_promotion, int oob_fill) {
  const std::string e = "tensor map: ";
  if (map == nullptr || reinterpret_cast<uintptr_t>(map) % kTensorMapAlignment != 0) {
    return e + "the CUtensorMap address " + detail::format_address(map) +
           " is not 64-byte aligned";
  }
  if (dtype < 0 || dtype > 15) return e + "data type " + std::to_string(dtype) + " is not a CUtensorMapDataType";
  const int esize = element_bytes(dtype);
  if (esize == 0) {
    return e + "data type " + std::to_string(dtype) + " (a packed 4/6-bit type) is not modelled by the shim";
  }
  if (interleave < 0 || interleave > 2) return e + "interleave " + std::to_string(interleave) + " is not a CUtensorMapInterleave";
  if (rank < 1 || rank > kMaxRank) {
    return e + "rank " + str(rank) + " is out of range: the tensor rank must be 1 to 5";
  }
  if (interleave != 0 && rank < 3) {
    return e + "rank " + str(rank) + " is out of range: an interleaved layout needs rank 3 to 5";
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(global);
  const uintptr_t address_alignment = interleave == 2 ? 32 : 16;
  if (global == nullptr || address % address_alignment != 0) {
    return e + "global address " + detail::format_address(global) + " is not " +
           str(address_alignment) + "-byte aligned";
  }
  for (uint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > kMaxDim) {
      return e + "globalDim[" + str(i) + "] = " + str(dims[i]) + " is out of range: it must be 1 to 2^32";
    }
  }
  const uint64_t stride_alignment = interleave == 2 ? 32 : 16;
  for (uint32_t i = 0; i + 1 < rank; ++i) {
    if (strides[i] % stride_alignment != 0) {
      return e + "globalStrides[" + str(i) + "] = " + str(strides[i]) + " bytes is not a multiple of " +
             str(stride_alignment);
    }
    if (strides[i] >= kMaxStride) {
      return e + "globalStrides[" + str(i) + "] = " + str(strides[i]) + " bytes is out of range: it must be below 2^40";
    }
  }
  for (uint32_t i = 0; i < rank; ++i) {
    if (box[i] == 0 || box[i] > kMaxBox) {
      return e + "boxDim[" + str(i) + "] = " + str(box[i]) + " is out of range: it must be 1 to 256";
    }
  }
  const uint64_t inner_bytes = uint64_t{box[0]} * esize;
  if (interleave == 0 && inner_bytes % 16 != 0) {
    return e + "the box's inner dimension is " + str(inner_bytes) +
           " bytes (boxDim[0] * element size), not a multiple of 16";
  }
  for (uint32_t i = 0; i < rank; ++i) {
    if (element_strides[i] == 0 || element_strides[i] > 8) {
      return e + "elementStrides[" + str(i) + "] = " + str(element_strides[i]) + " is out of range: it must be 1 to 8";
    }
  }
  if (swizzle < 0 || swizzle > 6) return e + "swizzle " + std::to_string(swizzle) + " is not a CUtensorMapSwizzle";
  if (interleave == 2 && swizzle != 1) {
    return e + "interleave 32B requires swizzle 32B";
  }
  const int swizzle_bytes = swizzle == 1 ? 32 : swizzle == 2 ? 64 : swizzle == 0 ? 0 : 128;
  if (interleave == 0 && swizzle != 0 && inner_bytes > static_cast<uint64_t>(swizzle_bytes)) {
    return e + "the box's inner dimension is " + str(inner_bytes) + " bytes, more than the " +
           std::to_string(swizzle_bytes) + "-byte swizzle span";
  }
  if (l2_promotion < 0 || l2_promotion > 3) {
    return e + "L2 promotion " + std::to_string(l2_promotion) + " is not a CUtensorMapL2promotion";
  }
  if (oob_fill < 0 || oob_fill > 1) return e + "OOB fill " + std::to_string(oob_fill) + " is not a CUtensorMapFloatOOBfill";
  const bool is_float = dtype >= 6 && dtype <= 12;
  if (oob_fill == 1 && !is_float) {
    return e + "NaN out-of-bounds fill needs a floating-point data type, not " + std::to_string(dtype);
  }
  // Valid for the driver, but beyond what the shim models.
  if (interleave != 0) return e + "interleaved layouts are not modelled by the shim";
  if (swizzle > 3) return e + "swizzle " + std::to_string(swizzle) + " (a 128B atom variant) is not modelled by the shim";
  if (oob_fill != 0) return e + "NaN out-of-bounds fill is not modelled by the shim";
  for (uint32_t i = 1; i < rank; ++i) {  // elementStrides[0] is ignored without interleave
    if (element_strides[i] != 1) return e + "element strides other than 1 are not modelled by the shim";
  }

  ShimTensorMap m{};
  m.magic = kMagic;
  m.global = static_cast<const unsigned char*>(global);
  m.rank = static_cast<uint8_t>(rank);
  m.dtype = static_cast<uint8_t>(dtype);
  m.elem_bytes = static_cast<uint8_t>(esize);
  m.swizzle_bytes = static_cast<uint8_t>(swizzle_bytes);
  m.strides[0] = static_cast<uint64_t>(esize);
  for (uint32_t i = 0; i < kMaxRank; ++i) {
    const bool used = i < rank;
    m.dims_minus_1[i] = used ? static_cast<uint32_t>(dims[i] - 1) : 0;
    m.box[i] = static_cast<uint16_t>(used ? box[i] : 1);
    if (i > 0) m.strides[i] = used ? strides[i - 1] : 0;
  }
  std::memset(map, 0, kTensorMapBytes);
  std::memcpy(map, &m, sizeof m);
  return "";
}

namespace detail {
namespace {

ShimTensorMap read_map(const SimBlock& block, const void* map, const char* op, const Site& site) {
  if (map == nullptr || reinterpret_cast<uintptr_t>(map) % kTensorMapAlignment != 0) {
    fail(site, std::string(op) + ": the tensor map address " + format_address(map) +
                   " is not 64-byte aligned");
  }
  if (overlaps_smem(block, map, kTensorMapBytes)) {
    fail(site, std::string(op) + ": the tensor map at " + format_address(map) +
                   " lies in shared memory; it must be a kernel parameter (__grid_constant__) or "
                   "in global or constant memory");
  }
  ShimTensorMap m;
  std::memcpy(&m, map, sizeof m);
  if (m.magic != kMagic) {
    fail(site, std::string(op) + ": " + format_address(map) +
                   " holds no tensor map encoded by flashattn::encode_tensor_map");
  }
  return m;
}

uint64_t box_elements(const ShimTensorMap& m) {
  uint64_t n = 1;
  for (int d = 0; d < m.rank; ++d) n *= m.box[d];
  return n;
}

// The shared-memory bytes a box spans: its size, rounded up to the swizzle span, as a swizzle
// moves 16-byte chunks only within their aligned span.
uint64_t box_smem_span(const ShimTensorMap& m) {
  const uint64_t bytes = box_elements(m) * m.elem_bytes;
  const uint64_t span = m.swizzle_bytes == 0 ? 1 : m.swizzle_bytes;
  return (bytes + span - 1) / span * span;
}

// Calls f(smem_offset_from_box_start_in_swizzled_smem, global_element_or_null) for every box
// element, in box order; null for an element outside the tensor.
template <class F>
void for_each_box_element(const ShimTensorMap& m, const int32_t* coords, uint32_t box_offset,
                          F&& f) {
  const uint64_t n = box_elements(m);
  int64_t index[kMaxRank] = {};
  for (uint64_t linear = 0; linear < n; ++linear) {
    bool inside = true;
    const unsigned char* g = m.global;
    for (int d = 0; d < m.rank; ++d) {
      const int64_t x = static_cast<int64_t>(coords[d]) + index[d];
      if (x < 0 || x > static_cast<int64_t>(m.dims_minus_1[d])) {
        inside = false;
        break;
      }
      g += static_cast<uint64_t>(x) * m.strides[d];
    }
    const uint32_t offset =
        swizzle_offset(box_offset + static_cast<uint32_t>(linear * m.elem_bytes), m.swizzle_bytes);
    f(offset - box_offset, inside ? g : nullptr);
    for (int d = 0; d < m.rank; ++d) {  // next index, innermost first
      if (++index[d] < m.box[d]) break;
      index[d] = 0;
    }
  }
}

// Calls f(offset from the box's start) for each 16-byte chunk of shared memory the box occupies:
// a swizzle moves whole chunks, and a box row is a whole number of them.
template <class F>
void for_each_box_chunk(const ShimTensorMap& m, uint32_t box_offset, F&& f) {
  const uint64_t bytes = box_elements(m) * m.elem_bytes;
  for (uint32_t at = 0; at < bytes; at += 16) f(swizzle_offset(box_offset + at, m.swizzle_bytes) - box_offset);
}

void check_rank(const ShimTensorMap& m, int rank, const char* op, const Site& site) {
  if (rank != m.rank) {
    fail(site, std::string(op) + ": a " + std::to_string(rank) + "d copy through a tensor map of rank " +
                   std::to_string(m.rank));
  }
}

void check_box_in_smem(const SimBlock& block, const void* smem, uint64_t span, const char* op,
                       const char* role, const Site& site) {
  if (reinterpret_cast<uintptr_t>(smem) % kTensorSmemAlignment != 0 || !in_smem(block, smem, span)) {
    fail(site, std::string(op) + ": " + role + " " + format_address(smem) + " + " + std::to_string(span) +
                   " bytes is not a 128-byte aligned range inside dynamic shared memory [" +
                   format_address(block.smem) + ", +" + std::to_string(block.smem_bytes) + ")");
  }
}

ThreadBulkGroups& bulk_groups(SimBlock& block, const SimThread& self) {
  if (block.async.bulk.size() != block.threads.size()) block.async.bulk.resize(block.threads.size());
  return block.async.bulk[thread_index(self)];
}

// Queues a store in the issuing thread's open bulk group, its source read now.
void issue_bulk_store(SimBlock& block, const SimThread& self, const Site& site,
                      const unsigned char* smem, uint64_t span,
                      std::function<void(const unsigned char*)> write) {
  BulkStore store;
  store.site = site;
  store.issuer = thread_index(self);
  store.smem = smem;
  store.snapshot.assign(smem, smem + span);
  store.write = std::move(write);
  bulk_groups(block, self).uncommitted.push_back(std::move(store));
}

// The source of `store` must still hold what it held at issue until wait_group.read retires it.
void check_source_unchanged(const SimBlock& block, const BulkStore& store, const char* op,
                            const Site& site) {
  if (std::memcmp(store.smem, store.snapshot.data(), store.snapshot.size()) == 0) return;
  size_t first = 0;
  while (store.smem[first] == store.snapshot[first]) ++first;
  fail(site, std::string(op) + ": bulk store source overwritten before cp.async.bulk.wait_group.read: "
                 "the store issued at " + describe(store.site) + " reads " +
                 smem_location(block, store.smem) + " + " + std::to_string(store.snapshot.size()) +
                 " bytes, and byte " + std::to_string(first) +
                 " changed before a wait_group.read retired it (hardware may read it any time "
                 "until then)");
}

}  // namespace

void mbarrier_fence_init(const char* file, int line) {
  SimBlock& block = active_block("fence.mbarrier_init");
  current_thread("fence.mbarrier_init");
  count_sm90(block, kCountMbarrierFenceInit, 0, file, line);
}

void count_named_barrier(bool arrive, const char* file, int line) {
  SimBlock& block = active_block(arrive ? "bar.arrive" : "bar.sync");
  count_sm90(block, arrive ? kCountBarArrive : kCountBarSync, 0, file, line);
}

void tma_load(void* smem_dst, const void* map, void* bar, const int32_t* coords, int rank,
              const char* file, int line) {
  const Site site{file, line};
  const char* op = "cp.async.bulk.tensor (load)";
  SimBlock& block = active_block(op);
  const SimThread& self = current_thread(op);
  const ShimTensorMap m = read_map(block, map, op, site);
  check_rank(m, rank, op, site);
  const uint64_t span = box_smem_span(m);
  check_box_in_smem(block, smem_dst, span, op, "destination", site);
  check_mbarrier_initialized(block, bar, op, site);
  const uint64_t bytes = box_elements(m) * m.elem_bytes;
  count_sm90(block, kCountTmaLoad, bytes, file, line);
  auto* dst = static_cast<unsigned char*>(smem_dst);
  const uint32_t box_offset = static_cast<uint32_t>(dst - block.smem);
  int32_t c[kMaxRank] = {};
  for (int d = 0; d < rank; ++d) c[d] = coords[d];
  AsyncCopy copy{site, thread_index(self), bar, static_cast<uint32_t>(bytes), [m, c, dst, box_offset, site] {
                   for_each_box_element(m, c, box_offset, [&](uint32_t at, const unsigned char* g) {
                     if (g != nullptr) {
                       std::memcpy(dst + at, g, m.elem_bytes);
                     } else {
                       std::memset(dst + at, 0, m.elem_bytes);
                     }
                   });
                   // Written through the async proxy: a later TMA store or wgmma needs no fence.
                   for_each_box_chunk(m, box_offset, [&](uint32_t at) {
                     note_async_proxy_write(dst + at, 16, site.file, site.line);
                   });
                 }};
  copy.op = "cp.async.bulk.tensor";
  issue_async_copy(block, std::move(copy));
}

void tma_store(const void* map, const void* smem_src, const int32_t* coords, int rank,
               bool reduce_add, const char* file, int line) {
  const Site site{file, line};
  const char* op = reduce_add ? "cp.reduce.async.bulk.tensor (add)" : "cp.async.bulk.tensor (store)";
  SimBlock& block = active_block(op);
  const SimThread& self = current_thread(op);
  const ShimTensorMap m = read_map(block, map, op, site);
  check_rank(m, rank, op, site);
  if (reduce_add && !is_f32(m.dtype)) {
    fail(site, std::string(op) + ": the shim models .add only for f32 tensor maps, not data type " +
                   std::to_string(m.dtype));
  }
  const uint64_t span = box_smem_span(m);
  check_box_in_smem(block, smem_src, span, op, "source", site);
  count_sm90(block, reduce_add ? kCountTmaReduce : kCountTmaStore, box_elements(m) * m.elem_bytes,
             file, line);
  const auto* src = static_cast<const unsigned char*>(smem_src);
  const uint32_t box_offset = static_cast<uint32_t>(src - block.smem);
  // The async proxy reads the box: plain stores to it need fence.proxy.async first.
  for_each_box_chunk(m, box_offset, [&](uint32_t at) { check_async_proxy_read(src + at, 16, op, file, line); });
  int32_t c[kMaxRank] = {};
  for (int d = 0; d < rank; ++d) c[d] = coords[d];
  issue_bulk_store(block, self, site, src, span,
                   [m, c, box_offset, reduce_add](const unsigned char* source) {
                     for_each_box_element(m, c, box_offset, [&](uint32_t at, const unsigned char* g) {
                       if (g == nullptr) return;  // outside the tensor: not written
                       auto* out = const_cast<unsigned char*>(g);
                       if (reduce_add) {
                         float sum, add;
                         std::memcpy(&sum, out, 4);
                         std::memcpy(&add, source + at, 4);
                         sum += add;
                         std::memcpy(out, &sum, 4);
                       } else {
                         std::memcpy(out, source + at, m.elem_bytes);
                       }
                     });
                   });
}

void tma_prefetch(const void* map, const char* file, int line) {
  const Site site{file, line};
  SimBlock& block = active_block("prefetch.tensormap");
  current_thread("prefetch.tensormap");
  read_map(block, map, "prefetch.tensormap", site);
  count_sm90(block, kCountTmaPrefetch, 0, file, line);
}

namespace {

void bulk_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes, bool reduce_add,
              const char* file, int line) {
  const Site site{file, line};
  const char* op = reduce_add ? "cp.reduce.async.bulk (add.f32)" : "cp.async.bulk (store)";
  SimBlock& block = active_block(op);
  const SimThread& self = current_thread(op);
  if (bytes == 0 || bytes % 16 != 0) {
    fail(site, std::string(op) + ": size " + std::to_string(bytes) +
                   " is not a positive multiple of 16 bytes");
  }
  if (reinterpret_cast<uintptr_t>(smem_src) % 16 != 0 || !in_smem(block, smem_src, bytes)) {
    fail(site, std::string(op) + ": source " + format_address(smem_src) + " + " + std::to_string(bytes) +
                   " bytes is not a 16-byte aligned range inside dynamic shared memory [" +
                   format_address(block.smem) + ", +" + std::to_string(block.smem_bytes) + ")");
  }
  if (reinterpret_cast<uintptr_t>(gmem_dst) % 16 != 0) {
    fail(site, std::string(op) + ": destination " + format_address(gmem_dst) + " is not 16-byte aligned");
  }
  if (overlaps_smem(block, gmem_dst, bytes)) {
    fail(site, std::string(op) + ": destination " + format_address(gmem_dst) +
                   " lies in shared memory, not global");
  }
  check_async_proxy_read(smem_src, bytes, op, file, line);
  count_sm90(block, reduce_add ? kCountBulkReduce : kCountBulkStore, bytes, file, line);
  auto* dst = static_cast<unsigned char*>(gmem_dst);
  issue_bulk_store(block, self, site, static_cast<const unsigned char*>(smem_src), bytes,
                   [dst, bytes, reduce_add](const unsigned char* source) {
                     if (!reduce_add) {
                       std::memcpy(dst, source, bytes);
                       return;
                     }
                     for (uint32_t i = 0; i < bytes; i += 4) {
                       float sum, add;
                       std::memcpy(&sum, dst + i, 4);
                       std::memcpy(&add, source + i, 4);
                       sum += add;
                       std::memcpy(dst + i, &sum, 4);
                     }
                   });
}

}  // namespace

void bulk_copy_shared_to_global(void* gmem_dst, const void* smem_src, uint32_t bytes,
                                const char* file, int line) {
  bulk_s2g(gmem_dst, smem_src, bytes, false, file, line);
}

void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src, uint32_t bytes, const char* file,
                         int line) {
  bulk_s2g(gmem_dst, smem_src, bytes, true, file, line);
}

void bulk_commit_group(const char* file, int line) {
  SimBlock& block = active_block("cp.async.bulk.commit_group");
  const SimThread& self = current_thread("cp.async.bulk.commit_group");
  count_sm90(block, kCountBulkCommit, 0, file, line);
  ThreadBulkGroups& groups = bulk_groups(block, self);
  BulkGroup group;
  group.stores = std::move(groups.uncommitted);
  groups.uncommitted.clear();
  groups.committed.push_back(std::move(group));
}

void bulk_wait_group(int pending_groups_allowed, bool read_only, const char* file, int line) {
  const Site site{file, line};
  const char* op = read_only ? "cp.async.bulk.wait_group.read" : "cp.async.bulk.wait_group";
  SimBlock& block = active_block(op);
  const SimThread& self = current_thread(op);
  if (pending_groups_allowed < 0) fail(site, std::string(op) + " " + std::to_string(pending_groups_allowed) + ": negative");
  count_sm90(block, read_only ? kCountBulkWaitRead : kCountBulkWait, 0, file, line);
  ThreadBulkGroups& groups = bulk_groups(block, self);
  const size_t allowed = static_cast<size_t>(pending_groups_allowed);
  // The oldest groups beyond `allowed` have finished reading shared memory; without .read they
  // have also finished writing global memory.
  size_t retire = groups.committed.size() > allowed ? groups.committed.size() - allowed : 0;
  for (size_t g = 0; g < retire; ++g) {
    BulkGroup& group = groups.committed[g];
    if (!group.read) {
      for (const BulkStore& store : group.stores) check_source_unchanged(block, store, op, site);
      group.read = true;
    }
  }
  if (read_only) return;
  for (; retire > 0; --retire) {
    for (BulkStore& store : groups.committed.front().stores) store.write(store.snapshot.data());
    groups.committed.pop_front();
  }
}

}  // namespace detail
}  // namespace cudasim
