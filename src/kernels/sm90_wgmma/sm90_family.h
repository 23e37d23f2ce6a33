// Family-specific queries beyond the GroupedGemmTactic interface (CUDA builds), for tests and benches.
#pragma once
#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include <string>

#include "fp4moe/status.h"

namespace fp4moe {
namespace sm90 {

// A CUDA call's error as the family's tactics report it: "TACTIC: WHAT failed: REASON" (kCudaError).
inline Status cuda_status(cudaError_t err, const char* what, const std::string& tactic) {
  if (err == cudaSuccess) return Status::ok();
  return Status(StatusCode::kCudaError, fmt::format("{}: {} failed: {}", tactic, what, cudaGetErrorString(err)));
}

// The larger of the FC1 and FC2 kernels' attributes (registers, local memory) of the named tactic.
Status kernel_resources(const std::string& tactic_name, cudaFuncAttributes* out);

// Points the kernels' timeline records at `buffer` (device, sm90_trace.cuh's kTraceBytes, zeroed by the
// caller; null stops recording). kUnsupported unless the family was built with FP4MOE_SM90_TRACE.
Status set_trace_buffer(void* buffer);

}  // namespace sm90
}  // namespace fp4moe
