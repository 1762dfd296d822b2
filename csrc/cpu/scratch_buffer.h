// A worker's per-call scratch array, left uninitialized: std::vector value-initializes, and
// zeroing tiles sized for 128 x 128 was 12% of a small forward and 17% of a small backward
// (lab log, 2026-12-02 small problems). Every user writes what it reads.
#pragma once
#include <cstddef>
#include <memory>

namespace flashattn::cpu {

template <typename T>
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  explicit ScratchBuffer(size_t size) : data_(size ? new T[size] : nullptr), size_(size) {}
  // `size` elements, each `value`.
  ScratchBuffer(size_t size, T value) : ScratchBuffer(size) {
    for (size_t i = 0; i < size; ++i) data_[i] = value;
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }

 private:
  std::unique_ptr<T[]> data_;  // new T[] default-initializes: no fill for arithmetic types
  size_t size_ = 0;
};

}  // namespace flashattn::cpu
