// The portable family's host-side entry points (descriptors always; kernels in CUDA builds).
#pragma once
#include <vector>

#include "fp4moe/status.h"
#include "fp4moe/tactic.h"

namespace fp4moe::portable {

// The descriptors of tactics.def, in table order (built once; descs.cpp). The runnable tactics take
// their descriptor from here, so every name and requirement exists exactly once.
const std::vector<TacticDesc>& portable_descs();

#ifdef FP4MOE_HAVE_CUDA
// The bf16-weight variant of the same kernel, for a shared expert stored in bf16 (not a registered
// tactic: it is the engine's internal bf16 path). args.weights = bf16 [E][Nw][K] (FC1: gate rows then up
// rows), args.tensor_scales may be null (1). init once per device before run.
Status init_bf16_grouped();
Status run_bf16_grouped(const GroupedGemmArgs& args, Stream stream);
#endif

}  // namespace fp4moe::portable
