// Family-specific queries beyond the GroupedGemmTactic interface (CUDA builds), for tests and benches.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "fp4moe/status.h"

namespace fp4moe {
namespace sm90 {

// The larger of the FC1 and FC2 kernels' attributes (registers, local memory) of the named tactic.
Status kernel_resources(const std::string& tactic_name, cudaFuncAttributes* out);

}  // namespace sm90
}  // namespace fp4moe
