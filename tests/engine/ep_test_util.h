// Helpers for the expert-parallel (EP) tests: the CPU partial of one rank, and summing partials.
#pragma once
#include <cstdint>
#include <vector>

#include "fp4moe/weights.h"

namespace fp4moe::test {

// The layer as EP rank `rank` of `size` sees it, for moe_forward_reference: each routed expert outside
// the rank's shard [rank * E / size, (rank + 1) * E / size) is replaced by an all-zero NVFP4 expert (every
// code 0, so its output is exactly 0 and its pairs add w * 0 in the reference's own order), and the shared
// expert is kept on rank 0 only. Router weight and bias are unchanged, so routing is the whole layer's.
// moe_forward_reference on the result is the rank's partial: the reference with the other ranks' pairs'
// contributions zeroed. Experts of the shard must be materialised in `w`.
MoeLayerWeights ep_partial_layer(const MoeLayerWeights& w, int size, int rank);

// sum[i] = sum over the partials of bf16 partials[p][i], accumulated in fp32 in rank order.
std::vector<float> sum_partials_f32(const std::vector<std::vector<uint16_t>>& partials);

// Relative L2 of fp32 values against bf16 reference values.
double rel_l2_f32_vs_bf16(const std::vector<float>& got, const std::vector<uint16_t>& ref);

}  // namespace fp4moe::test
