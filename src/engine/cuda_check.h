// Checked CUDA runtime calls: a failure becomes a Status (or an Error) that names the call, the CUDA
// error and the place. Host code only.
#pragma once
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "fp4moe/status.h"

namespace fp4moe {

inline Status cuda_status(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  const char* base = file;
  for (const char* c = file; *c; ++c)
    if (*c == '/') base = c + 1;
  return Status(StatusCode::kCudaError,
                fmt::format("{} failed: {} ({}) at {}:{}", call, cudaGetErrorString(err), cudaGetErrorName(err), base, line));
}

// The error of the last kernel launch on this thread (cudaGetLastError), as a Status naming `what`.
inline Status cuda_launch_status(const char* what, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return cuda_status(err, what, file, line);
}

}  // namespace fp4moe

// Returns a kCudaError Status from the enclosing function when `call` fails.
#define FP4MOE_CUDA_RETURN(call)                                                              \
  do {                                                                                        \
    const cudaError_t fp4moe_err_ = (call);                                                   \
    if (fp4moe_err_ != cudaSuccess) return ::fp4moe::cuda_status(fp4moe_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Throws fp4moe::Error(kCudaError) when `call` fails.
#define FP4MOE_CUDA_THROW(call)                                                                    \
  do {                                                                                             \
    const cudaError_t fp4moe_err_ = (call);                                                        \
    if (fp4moe_err_ != cudaSuccess)                                                                \
      throw ::fp4moe::Error(::fp4moe::StatusCode::kCudaError,                                      \
                            ::fp4moe::cuda_status(fp4moe_err_, #call, __FILE__, __LINE__).message()); \
  } while (0)

// After a kernel launch: returns the launch error, if any, naming the kernel.
#define FP4MOE_LAUNCH_RETURN(what)                                                     \
  do {                                                                                 \
    ::fp4moe::Status fp4moe_st_ = ::fp4moe::cuda_launch_status(what, __FILE__, __LINE__); \
    if (!fp4moe_st_.is_ok()) return fp4moe_st_;                                        \
  } while (0)
