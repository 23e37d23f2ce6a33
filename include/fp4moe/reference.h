// The CPU reference: routing and the MoE forward, plain loops, the specification every GPU path is
// checked against (shared/DESIGN.md sections 1 and 3).
//
// Where values are rounded to bf16 (the GPU path rounds at exactly these points):
//   R1. hidden states: bf16 on input (f32 inputs are rounded first).
//   R2. router logits: computed (when not given) in fp32 from bf16 x and the fp32 router weight; not rounded.
//       Given logits are used as fp32 (bf16 logits are widened exactly).
//   R3. FC1: acc_gate = sum_k x[k] * w_gate_unscaled[k] (fp32), gate = acc_gate * gate.tensor_scale,
//       likewise up; a = silu(gate) * up in fp32, then rounded to bf16.  silu(g) = g / (1 + exp(-g)).
//   R4. FC2: y = (sum_i a[i] * w_down_unscaled[i]) * down.tensor_scale in fp32, rounded to bf16.
//   R5. finalize: out = sum_k w_k * y_k (+ y_shared) accumulated in fp32, in order k = 0..topk-1 then
//       shared, rounded to bf16.
// (For bf16 weights, "unscaled" is the bf16 value and the tensor scale is 1.)
#pragma once
#include <cstdint>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/weights.h"

namespace fp4moe {

struct RoutingResult {
  int64_t tokens = 0, topk = 0;
  std::vector<int32_t> ids;      // [T, topk] expert ids, best first (ties: lower expert index first)
  std::vector<float> weights;    // [T, topk] fp32 combine weights (after renormalisation and scaling)
};

// logits [T, E] fp32. bias [E] or empty (zeros). Throws on inconsistent sizes.
RoutingResult route_softmax_topk(const float* logits, int64_t tokens, const MoeConfig& cfg);
RoutingResult route_sigmoid_grouped(const float* logits, const float* bias, int64_t tokens,
                                    const MoeConfig& cfg);
// Dispatches on cfg.routing; bias may be null.
RoutingResult route(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg);

// Router logits [T, E] = x [T, H] (bf16 bits) · router_weight [E, H]^T, fp32.
std::vector<float> router_logits_reference(const uint16_t* x_bf16, int64_t tokens,
                                           const MoeLayerWeights& w);

struct MoeForwardResult {
  std::vector<uint16_t> out;     // [T, H] bf16 bits
  RoutingResult routing;
};

// The whole layer. x_bf16 [T, H]; logits [T, E] fp32, or null to compute them from w.router_weight.
// Throws Error(kInvalidArgument) if a routed expert is not materialised, or on size mismatches.
// Uses up to `threads` host threads (0 = hardware concurrency); the result does not depend on it.
MoeForwardResult moe_forward_reference(const MoeLayerWeights& w, const uint16_t* x_bf16,
                                       int64_t tokens, const float* logits, int threads = 0);

// One expert's SwiGLU MLP on one token (R3 and R4 above), y [H] rounded to bf16 (as fp32 values).
// Exposed for kernel-level tests: FC1 alone gives `a` [I] (bf16-rounded).
void expert_fc1_reference(const ExpertWeights& e, const float* x, float* a);
void expert_fc2_reference(const ExpertWeights& e, const float* a, float* y);

// ||a - b||_2 / ||b||_2 over n values (0 when both are zero, inf when only b is zero).
double relative_l2_error(const float* a, const float* b, int64_t n);

}  // namespace fp4moe
