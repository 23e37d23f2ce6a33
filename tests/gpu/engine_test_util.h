// Layer-level helpers for the GPU engine tests: run a forward with poisoned outputs and compare it with
// moe_forward_reference on the same weights; replay a captured CUDA graph.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fp4moe/engine.h"
#include "fp4moe/weights.h"
#include "gpu_test_util.h"

namespace fp4moe::test {

// A small layer config: softmax top-k routing, no shared expert; callers adjust the rest.
MoeConfig small_config(const char* name, int64_t hidden, int64_t inter, int64_t experts, int64_t topk);

struct LayerRun {
  double rel_l2 = INFINITY;     // over the compared tokens
  int64_t id_mismatches = -1;   // routed expert ids that differ from the reference's
  double weight_rel_err = INFINITY;  // max relative difference of the routing weights
  int64_t compared = 0;         // tokens compared
};

// Runs engine.forward on x [T, H] (and logits [T, E], or null for the router weight) with the output
// poisoned first, then compares the tokens in `subset` (empty: all) with moe_forward_reference on
// `ref` (which must materialise every expert those tokens use). Test failures are recorded.
LayerRun compare_forward(MoeEngine& engine, const MoeLayerWeights& ref, int64_t T, const std::vector<uint16_t>& x,
                         const std::vector<float>* logits, const std::vector<int64_t>& subset = {});
// Random x (and logits unless from_router) from `seed`, then compare_forward over all tokens.
LayerRun run_and_compare(MoeEngine& engine, const MoeLayerWeights& ref, int64_t T, uint64_t seed, bool from_router);
// One forward on random inputs from `seed`; the output bf16 [T, H].
std::vector<uint16_t> forward_once(MoeEngine& engine, const MoeConfig& cfg, int64_t T, uint64_t seed, bool from_router);
// Eager forward, then a captured graph replayed twice (output poisoned before each replay): the number
// of output elements that differ from the eager result over both replays (0 = bitwise equal).
int64_t graph_replay_mismatches(MoeEngine& engine, const MoeConfig& cfg, int64_t T, uint64_t seed);
// Names of the tactics that can run all of the layer's GEMMs (routed FC1/FC2, NVFP4 shared expert) at
// every token bucket up to max_tokens on device 0.
std::vector<std::string> tactics_for_layer(const MoeConfig& cfg, int64_t max_tokens, bool shared_nvfp4);

}  // namespace fp4moe::test
