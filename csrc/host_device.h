// FLASHATTN_HOST_DEVICE: a function the CUDA kernels, the CUDA-on-CPU shim and the CPU
// executor share (parameter structs, mask and key-row arithmetic).
#pragma once

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHATTN_HOST_DEVICE inline
#endif
