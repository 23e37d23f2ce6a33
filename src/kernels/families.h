// The hooks each kernel family provides to the tactic registry (src/kernels/registry.cpp).
// Descriptor functions are host-only and always built; the runnable side exists in CUDA builds.
#pragma once
#include <memory>
#include <vector>

#include "fp4moe/tactic.h"

namespace fp4moe {

// portable_mma/: mma.sync bf16, sm_80+ (the guaranteed fallback family).
void append_portable_tactic_descs(std::vector<TacticDesc>& out);
// sm90_wgmma/: TMA + wgmma warp-specialised, sm_90a only.
void append_sm90_tactic_descs(std::vector<TacticDesc>& out);
// sm90_wgmma/sm90_cc.cu: the resident tactic (one token per expert, math on the CUDA cores), sm_90a only.
void append_sm90_cc_tactic_descs(std::vector<TacticDesc>& out);

#ifdef FP4MOE_HAVE_CUDA
void append_portable_tactics(std::vector<std::unique_ptr<GroupedGemmTactic>>& out);
void append_sm90_tactics(std::vector<std::unique_ptr<GroupedGemmTactic>>& out);
void append_sm90_cc_tactics(std::vector<std::unique_ptr<GroupedGemmTactic>>& out);
// The sm90 family's weight layouts (kSm90Interleaved, kSm90E4m3); nullptr for any other.
const WeightLayoutOps* sm90_weight_layout_ops(WeightLayout layout = WeightLayout::kSm90Interleaved);
const WeightLayoutOps* sm90_cc_weight_layout_ops();  // kSm90Cc
#endif

}  // namespace fp4moe
