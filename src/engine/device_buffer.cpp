#include "fp4moe/device_buffer.h"

#include <fmt/format.h>

#include <utility>

#include "fp4moe/status.h"

#ifdef FP4MOE_HAVE_CUDA
#include "engine/cuda_check.h"
#endif

namespace fp4moe {

namespace {

#ifdef FP4MOE_HAVE_CUDA
// A failed CUDA call on the buffer for `what` as an Error naming the call, the CUDA error, the buffer and
// its size (and clearing the error state a failed allocation leaves).
[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line, const std::string& what,
                             size_t bytes) {
  (void)cudaGetLastError();
  throw Error(StatusCode::kCudaError, fmt::format("{} (buffer of {:.1f} MiB for {})",
                                                  cuda_status(err, call, file, line).message(), bytes / 1048576.0, what));
}
#define FP4MOE_BUFFER_CHECK(call, bytes)                                                    \
  do {                                                                                      \
    const cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) throw_cuda(err_, #call, __FILE__, __LINE__, what_, (bytes));   \
  } while (0)
#else
[[noreturn]] void no_cuda(const std::string& what) {
  throw Error(StatusCode::kUnsupported,
              fmt::format("device buffer for {}: this build of fp4moe has no CUDA backend (nvcc was not found at "
                          "build time)",
                          what));
}
#endif

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {
  if (bytes == 0) return;
#ifdef FP4MOE_HAVE_CUDA
  FP4MOE_BUFFER_CHECK(cudaMalloc(&ptr_, bytes), bytes);
#else
  no_cuda(what_);
#endif
}

DeviceBuffer::~DeviceBuffer() { release(); }

void DeviceBuffer::release() noexcept {
#ifdef FP4MOE_HAVE_CUDA
  if (ptr_ != nullptr) (void)cudaFree(ptr_);  // an error on free cannot be reported from a destructor
#endif
  ptr_ = nullptr;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), what_(std::move(other.what_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    what_ = std::move(other.what_);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  FP4MOE_CHECK(bytes <= bytes_, StatusCode::kInternal, "upload of {} bytes into the {}-byte buffer for {}", bytes,
               bytes_, what_);
  copy(ptr_, host, bytes, true);
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  FP4MOE_CHECK(bytes <= bytes_, StatusCode::kInternal, "download of {} bytes from the {}-byte buffer for {}", bytes,
               bytes_, what_);
  copy(host, ptr_, bytes, false);
}

void DeviceBuffer::copy(void* dst, const void* src, size_t bytes, bool to_device) const {
  if (bytes == 0) return;
#ifdef FP4MOE_HAVE_CUDA
  FP4MOE_BUFFER_CHECK(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost), bytes);
#else
  (void)dst;
  (void)src;
  (void)to_device;
  no_cuda(what_);
#endif
}

void DeviceBuffer::fill(uint8_t value) {
  if (bytes_ == 0) return;
#ifdef FP4MOE_HAVE_CUDA
  FP4MOE_BUFFER_CHECK(cudaMemset(ptr_, value, bytes_), bytes_);
#else
  (void)value;
  no_cuda(what_);
#endif
}

}  // namespace fp4moe
