// Memory and a one-block launch that work the same on a GPU (nvcc) and on the shim (g++), so
// the primitive cases run unchanged on both.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifdef __CUDACC__
#include <cuda_runtime.h>

inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    cuda_check(cudaMalloc(&ptr_, bytes()), "cudaMalloc");
    cuda_check(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> read() const {
    std::vector<T> host(size_);
    cuda_check(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  T* ptr_ = nullptr;
  size_t size_;
};

template <class... Params, class... Args>
void launch_one_block(void (*kernel)(Params...), unsigned threads, size_t smem_bytes, Args... args) {
  kernel<<<1, threads, smem_bytes>>>(args...);
  cuda_check(cudaGetLastError(), "kernel launch");
  cuda_check(cudaDeviceSynchronize(), "kernel run");
}

#else

template <class T>
class DeviceArray {
 public:
  // An exact-size copy, so ASan builds see any overrun of the inputs.
  explicit DeviceArray(const std::vector<T>& host) : data_(host) {}
  T* get() const { return const_cast<T*>(data_.data()); }
  std::vector<T> read() const { return data_; }

 private:
  std::vector<T> data_;
};

template <class... Params, class... Args>
void launch_one_block(void (*kernel)(Params...), unsigned threads, size_t smem_bytes, Args... args) {
  cudasim::launch(kernel, dim3(1), dim3(threads), smem_bytes, args...);
}

#endif
