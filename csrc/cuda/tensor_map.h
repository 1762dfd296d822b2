// Host side of TMA: encoding a tiled tensor map (CUtensorMap) for the copies in ptx_sm90_tma.cuh.
//
// Under nvcc the encoder is the driver's cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion (CUDA 12.0's ABI), so nothing links against libcuda: only
// <cuda.h>/<cudaTypedefs.h> types are used. Under the CPU shim, TensorMap is an opaque struct of
// the same size and alignment that the shim's encoder fills after making the driver's
// documented checks, each failure a named message (tests/cudasim/README.md, "TMA and tensor
// maps").
//
//   flashattn::TensorMap map;
//   flashattn::TensorMapSpec spec;
//   spec.dtype = flashattn::TensorMapDtype::BFloat16;
//   spec.rank = 2; spec.global = ptr;
//   spec.dims[0] = cols; spec.dims[1] = rows; spec.strides[0] = row_stride_bytes;
//   spec.box[0] = 64; spec.box[1] = 64; spec.swizzle = flashattn::TensorMapSwizzle::B128;
//   std::string error = flashattn::encode_tensor_map(&map, spec);   // "" on success
// then pass the map to the kernel as a `const __grid_constant__ flashattn::TensorMap` parameter
// and its address to the ptx::tma_* wrappers.
#pragma once
#include <cstdint>
#include <string>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#include "src/tma.h"  // tests/cudasim/src: the shim's encoder
#else
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#endif

namespace flashattn {

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
struct alignas(::cudasim::kTensorMapAlignment) TensorMap {
  unsigned char opaque[::cudasim::kTensorMapBytes];
};
#else
using TensorMap = CUtensorMap;
#endif
// CUDA 13's header aligns CUtensorMap to 128 bytes; the driver requires 64.
static_assert(sizeof(TensorMap) == 128 && alignof(TensorMap) >= 64, "a CUtensorMap is 128 bytes, 64-aligned");

// The driver's enum values (CUtensorMapDataType, CUtensorMapSwizzle, ...), so both builds agree.
enum class TensorMapDtype : int {
  UInt8 = 0, UInt16 = 1, UInt32 = 2, Int32 = 3, UInt64 = 4, Int64 = 5,
  Float16 = 6, Float32 = 7, Float64 = 8, BFloat16 = 9,
};
enum class TensorMapSwizzle : int { None = 0, B32 = 1, B64 = 2, B128 = 3 };
enum class TensorMapInterleave : int { None = 0, B16 = 1, B32 = 2 };
enum class TensorMapL2Promotion : int { None = 0, B64 = 1, B128 = 2, B256 = 3 };
enum class TensorMapOobFill : int { Zero = 0, NanRequestZeroFma = 1 };

// cuTensorMapEncodeTiled's arguments. dims, box and element_strides: innermost first, `rank` of
// them; strides: the byte strides of dimensions 1 .. rank-1 (strides[0] is a row's).
struct TensorMapSpec {
  TensorMapDtype dtype = TensorMapDtype::Float32;
  uint32_t rank = 2;
  const void* global = nullptr;
  uint64_t dims[5] = {1, 1, 1, 1, 1};
  uint64_t strides[4] = {0, 0, 0, 0};
  uint32_t box[5] = {1, 1, 1, 1, 1};
  uint32_t element_strides[5] = {1, 1, 1, 1, 1};
  TensorMapSwizzle swizzle = TensorMapSwizzle::None;
  TensorMapInterleave interleave = TensorMapInterleave::None;
  TensorMapL2Promotion l2_promotion = TensorMapL2Promotion::None;
  TensorMapOobFill oob_fill = TensorMapOobFill::Zero;
};

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

// "" on success, else the shim's named reason ("tensor map: ...").
inline std::string encode_tensor_map(TensorMap* map, const TensorMapSpec& spec) {
  return ::cudasim::encode_tensor_map_tiled(
      map, static_cast<int>(spec.dtype), spec.rank, spec.global, spec.dims, spec.strides, spec.box,
      spec.element_strides, static_cast<int>(spec.interleave), static_cast<int>(spec.swizzle),
      static_cast<int>(spec.l2_promotion), static_cast<int>(spec.oob_fill));
}

#else

// "" on success, else why not. The driver's CUDA_ERROR_INVALID_VALUE names no argument: run the
// same spec on the shim (tests/cudasim) for a named reason.
inline std::string encode_tensor_map(TensorMap* map, const TensorMapSpec& spec) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t status = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000,
                                                                cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
      return std::string("tensor map: cuTensorMapEncodeTiled not found through "
                         "cudaGetDriverEntryPointByVersion (") +
             cudaGetErrorString(status) + ")";
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], element_strides[5];
  for (int i = 0; i < 5; ++i) {
    dims[i] = spec.dims[i];
    box[i] = spec.box[i];
    element_strides[i] = spec.element_strides[i];
    if (i < 4) strides[i] = spec.strides[i];
  }
  const CUresult result = encode(
      map, static_cast<CUtensorMapDataType>(spec.dtype), spec.rank, const_cast<void*>(spec.global), dims,
      strides, box, element_strides, static_cast<CUtensorMapInterleave>(spec.interleave),
      static_cast<CUtensorMapSwizzle>(spec.swizzle), static_cast<CUtensorMapL2promotion>(spec.l2_promotion),
      static_cast<CUtensorMapFloatOOBfill>(spec.oob_fill));
  if (result != CUDA_SUCCESS) {
    return "tensor map: cuTensorMapEncodeTiled returned CUresult " + std::to_string(static_cast<int>(result));
  }
  return "";
}

#endif

}  // namespace flashattn
