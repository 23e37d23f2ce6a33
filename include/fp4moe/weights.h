// A MoE layer's weights on the host, in the checkpoint's own layout (no kernel-specific repacking:
// each GPU tactic repacks once at engine creation).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/nvfp4.h"

namespace fp4moe {

// One linear layer y = x W^T with W [n, k], either NVFP4 or dense bf16 (a bf16 shared expert).
struct LinearWeights {
  enum class Format : uint8_t { kNvfp4, kBF16 };
  Format format = Format::kNvfp4;
  PackedNvfp4Weights nvfp4;        // when kNvfp4
  int64_t n = 0, k = 0;            // always set
  std::vector<uint16_t> bf16;      // when kBF16: [n, k] bf16 bits

  bool empty() const { return n == 0; }
  // The exact weight value used by every backend (fp32): NVFP4 dequantised with its tensor scale, or the bf16 value.
  float at(int64_t r, int64_t c) const;
  static LinearWeights from_nvfp4(PackedNvfp4Weights q);
  static LinearWeights from_bf16(int64_t n, int64_t k, std::vector<uint16_t> bits);
};

// One expert's SwiGLU MLP: gate [I, H], up [I, H], down [H, I].
struct ExpertWeights {
  LinearWeights gate, up, down;
  bool empty() const { return gate.empty(); }
};

struct MoeLayerWeights {
  MoeConfig config;
  // [E]; an expert may be left empty (not materialised), e.g. for synthetic layers where only the
  // experts that the inputs route to are generated. Using an empty expert is an error.
  std::vector<ExpertWeights> experts;
  // Router weight [E, H] in fp32 (from bf16/f32 in the file); empty if the caller passes logits.
  std::vector<float> router_weight;
  // e_score_correction_bias [E] (fp32) for sigmoid routing; empty if absent (treated as zeros).
  std::vector<float> correction_bias;
  // The shared expert (width config.shared_inter), if config.n_shared_experts > 0.
  std::optional<ExpertWeights> shared;

  // Checks every present tensor's shape against config; throws Error(kInvalidArgument) naming
  // the expert, the projection, the expected and the found shape.
  void validate() const;
};

// Deterministic synthetic NVFP4 weights (counter-based, so host and device generate the same bytes
// without materialising the whole layer anywhere). Codes are uniform random nibbles; block scales are
// E4M3 values chosen so that the layer's outputs stay O(1); tensor scales are per tensor.
// Expert e's bytes depend only on (seed, e, projection, byte index).
struct SyntheticSpec {
  uint64_t seed = 0x5eed;
};
ExpertWeights synthetic_expert(const MoeConfig& cfg, const SyntheticSpec& spec, int64_t expert);
ExpertWeights synthetic_shared_expert(const MoeConfig& cfg, const SyntheticSpec& spec);
// Router weight [E, H] and correction bias [E] (zeros when the config has none).
std::vector<float> synthetic_router_weight(const MoeConfig& cfg, const SyntheticSpec& spec);
std::vector<float> synthetic_correction_bias(const MoeConfig& cfg, const SyntheticSpec& spec);
// A whole layer; only experts with which[e] true are generated (all when `which` is empty).
MoeLayerWeights synthetic_layer(const MoeConfig& cfg, const SyntheticSpec& spec,
                                const std::vector<bool>& which = {});

}  // namespace fp4moe
