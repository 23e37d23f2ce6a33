// The MoE layer's shape and routing (shared/DESIGN.md section 3), read from a Hugging Face config.json
// or taken from an embedded preset.
#pragma once
#include <cstdint>
#include <string>

namespace fp4moe {

enum class RoutingKind : uint8_t {
  kSoftmaxTopK,     // p = softmax(logits); top-k; optional renormalise (Mixtral, Qwen-MoE)
  kSigmoidGrouped,  // s = sigmoid(logits); choose by s + bias, group-limited; weight by s (DeepSeek-V3, GLM)
};
const char* routing_kind_name(RoutingKind k);  // "softmax" or "sigmoid"

struct MoeConfig {
  std::string name = "custom";     // preset or model name, for logs
  int64_t hidden = 0;              // H: hidden_size
  int64_t inter = 0;               // I: moe_intermediate_size (per routed expert)
  int64_t num_experts = 0;         // E: n_routed_experts / num_experts
  int64_t topk = 0;                // num_experts_per_tok
  RoutingKind routing = RoutingKind::kSoftmaxTopK;
  int64_t n_group = 1;             // sigmoid routing: number of expert groups
  int64_t topk_group = 1;          // sigmoid routing: groups kept per token
  bool norm_topk_prob = false;     // renormalise the top-k weights to sum to 1
  float routed_scaling_factor = 1.0f;  // multiplies the routed weights (after renormalisation)
  bool has_correction_bias = false;    // sigmoid routing: e_score_correction_bias present
  int64_t n_shared_experts = 0;    // 0 or more; shared experts are fused into one of width shared_inter
  int64_t shared_inter = 0;        // I_shared = n_shared_experts * moe_intermediate_size unless the config says otherwise

  // Throws Error(kInvalidArgument) naming the first inconsistent field: non-positive sizes, hidden or
  // inter (or shared_inter) not a multiple of 16, topk > E, E % n_group != 0, topk_group > n_group,
  // topk > topk_group * (E / n_group), etc. `origin` (e.g. a file path) prefixes the message.
  void validate(const std::string& origin = "config") const;
  std::string to_string() const;   // one line: "glm5: H=6144 I=2048 E=256 top-8 sigmoid(8/4) scale=2.5 shared=2048"
};

// Embedded presets. Names: "glm5" (the default), "deepseek-v3", "qwen3-235b", "mixtral-8x7b".
MoeConfig moe_preset(const std::string& name);   // throws kInvalidArgument listing the known names
MoeConfig glm5_config();

// Reads the MoE fields of a Hugging Face config.json (file path). Missing required fields, wrong JSON
// types and inconsistent values are errors naming the file and the field.
MoeConfig read_hf_config(const std::string& path);
// Same, from JSON text; `origin` names the source in messages.
MoeConfig parse_hf_config(const std::string& json_text, const std::string& origin);

}  // namespace fp4moe
