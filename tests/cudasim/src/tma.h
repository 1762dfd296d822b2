// The shim's sm_90 entry points that cudasim.h does not declare: bulk stores and their groups,
// tensor (TMA) copies, the tensor-map encoder, fence.mbarrier_init and the counting hooks of
// the sm_90 synchronization wrappers. csrc/cuda/ptx_sm90_sync.cuh and ptx_sm90_tma.cuh call
// them with the kernel's file/line; csrc/cuda/tensor_map.h calls the encoder.
// README.md, "TMA and tensor maps", describes what they model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cudasim {

// The size and alignment of a CUtensorMap, which the shim's encoder fills with its own layout.
constexpr size_t kTensorMapBytes = 128;
constexpr size_t kTensorMapAlignment = 64;

// cuTensorMapEncodeTiled with the driver's documented checks (the enum values are the driver's:
// CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
// CUtensorMapFloatOOBfill). Fills the kTensorMapBytes at `map` and returns "", or returns what
// is wrong, starting with "tensor map: ", and leaves `map` alone. `strides` holds rank - 1 byte
// strides (of dimensions 1 .. rank-1). Usable on the host; no kernel needs to run.
std::string encode_tensor_map_tiled(void* map, int dtype, uint32_t rank, const void* global,
                                    const uint64_t* dims, const uint64_t* strides,
                                    const uint32_t* box, const uint32_t* element_strides,
                                    int interleave, int swizzle, int l2_promotion, int oob_fill);

namespace detail {

// fence.mbarrier_init.release.cluster: orders nothing on the shim; counted.
void mbarrier_fence_init(const char* file, int line);
// Counts a bar.sync (arrive = false) or bar.arrive of the sm_90 wrappers (ptx_sm90_sync.cuh).
void count_named_barrier(bool arrive, const char* file, int line);

// cp.async.bulk.global.shared::cta.bulk_group: `bytes` (a multiple of 16, both addresses 16-byte
// aligned) from shared to global memory, in the issuing thread's current bulk group.
void bulk_copy_shared_to_global(void* gmem_dst, const void* smem_src, uint32_t bytes,
                                const char* file, int line);
// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32: gmem_dst[i] += smem_src[i].
void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src, uint32_t bytes, const char* file,
                         int line);
// cp.async.bulk.commit_group; cp.async.bulk.wait_group[.read] n.
void bulk_commit_group(const char* file, int line);
void bulk_wait_group(int pending_groups_allowed, bool read_only, const char* file, int line);

// cp.async.bulk.tensor.<rank>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes: the box
// at `coords` (rank of them, innermost first) of the tensor `map` describes, to smem_dst,
// completing on the mbarrier `bar`; out-of-bounds elements are zero-filled.
void tma_load(void* smem_dst, const void* map, void* bar, const int32_t* coords, int rank,
              const char* file, int line);
// cp.async.bulk.tensor.<rank>d.global.shared::cta.tile.bulk_group (reduce_add: cp.reduce.async.
// bulk.tensor ... .add): the box at smem_src to the tensor at `coords`; out-of-bounds elements
// are not written.
void tma_store(const void* map, const void* smem_src, const int32_t* coords, int rank,
               bool reduce_add, const char* file, int line);
// prefetch.tensormap: checks the descriptor; counted.
void tma_prefetch(const void* map, const char* file, int line);

}  // namespace detail
}  // namespace cudasim
