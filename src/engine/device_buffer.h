// One device allocation (cudaMalloc), freed on destruction; move-only. Allocation failures throw
// Error(kCudaError) naming what the buffer is for and its size. Host code (CUDA builds).
#pragma once
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <utility>

#include "engine/cuda_check.h"

namespace fp4moe::engine {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t err = cudaMalloc(&ptr_, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      ptr_ = nullptr;
      throw Error(StatusCode::kCudaError, fmt::format("cudaMalloc of {:.1f} MiB for {} failed: {}",
                                                      bytes / 1048576.0, what, cudaGetErrorString(err)));
    }
  }
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) (void)cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fp4moe::engine
