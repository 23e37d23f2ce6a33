// LinearWeights accessors and MoeLayerWeights::validate (include/fp4moe/weights.h).
#include <cmath>
#include <string>

#include "fp4moe/status.h"
#include "fp4moe/weights.h"

namespace fp4moe {

float LinearWeights::at(int64_t r, int64_t c) const {
  FP4MOE_CHECK(r >= 0 && r < n && c >= 0 && c < k, StatusCode::kInvalidArgument,
               "LinearWeights::at({}, {}) out of range for a [{}, {}] weight", r, c, n, k);
  if (format == Format::kBF16) return bf16_bits_to_f32(bf16[static_cast<size_t>(r * k + c)]);
  return nvfp4.at(r, c);
}

LinearWeights LinearWeights::from_nvfp4(PackedNvfp4Weights q) {
  FP4MOE_CHECK(q.n >= 0 && q.k >= 0 && q.k % kNvfp4BlockSize == 0, StatusCode::kInvalidArgument,
               "NVFP4 weight shape [{}, {}]: k must be a non-negative multiple of {}", q.n, q.k,
               kNvfp4BlockSize);
  FP4MOE_CHECK(q.codes.size() == static_cast<size_t>(q.n * q.k / 2), StatusCode::kInvalidArgument,
               "NVFP4 weight [{}, {}]: expected {} packed code bytes, found {}", q.n, q.k, q.n * q.k / 2,
               q.codes.size());
  FP4MOE_CHECK(q.scales.size() == static_cast<size_t>(q.n * q.k / kNvfp4BlockSize), StatusCode::kInvalidArgument,
               "NVFP4 weight [{}, {}]: expected {} block scales, found {}", q.n, q.k,
               q.n * q.k / kNvfp4BlockSize, q.scales.size());
  LinearWeights w;
  w.format = Format::kNvfp4;
  w.n = q.n;
  w.k = q.k;
  w.nvfp4 = std::move(q);
  return w;
}

LinearWeights LinearWeights::from_bf16(int64_t n, int64_t k, std::vector<uint16_t> bits) {
  FP4MOE_CHECK(n >= 0 && k >= 0, StatusCode::kInvalidArgument, "bf16 weight shape [{}, {}] is negative", n, k);
  FP4MOE_CHECK(bits.size() == static_cast<size_t>(n * k), StatusCode::kInvalidArgument,
               "bf16 weight [{}, {}]: expected {} values, found {}", n, k, n * k, bits.size());
  LinearWeights w;
  w.format = Format::kBF16;
  w.n = n;
  w.k = k;
  w.bf16 = std::move(bits);
  return w;
}

namespace {

// Checks one projection's shape and storage; `what` names it ("expert 3 gate_proj").
void validate_linear(const LinearWeights& w, int64_t n, int64_t k, const std::string& what) {
  FP4MOE_CHECK(w.n == n && w.k == k, StatusCode::kInvalidArgument, "{}: expected shape [{}, {}], found [{}, {}]",
               what, n, k, w.n, w.k);
  if (w.format == LinearWeights::Format::kBF16) {
    FP4MOE_CHECK(w.bf16.size() == static_cast<size_t>(n * k), StatusCode::kInvalidArgument,
                 "{} (bf16 [{}, {}]): expected {} values, found {}", what, n, k, n * k, w.bf16.size());
    return;
  }
  const PackedNvfp4Weights& q = w.nvfp4;
  FP4MOE_CHECK(q.n == n && q.k == k, StatusCode::kInvalidArgument,
               "{}: NVFP4 payload has shape [{}, {}], expected [{}, {}]", what, q.n, q.k, n, k);
  FP4MOE_CHECK(k % kNvfp4BlockSize == 0, StatusCode::kInvalidArgument,
               "{}: NVFP4 needs k a multiple of {}, found k = {}", what, kNvfp4BlockSize, k);
  FP4MOE_CHECK(q.codes.size() == static_cast<size_t>(n * k / 2), StatusCode::kInvalidArgument,
               "{}: expected packed codes [{}, {}] ({} bytes), found {} bytes", what, n, k / 2, n * k / 2,
               q.codes.size());
  FP4MOE_CHECK(q.scales.size() == static_cast<size_t>(n * k / kNvfp4BlockSize), StatusCode::kInvalidArgument,
               "{}: expected block scales [{}, {}] ({} bytes), found {} bytes", what, n, k / kNvfp4BlockSize,
               n * k / kNvfp4BlockSize, q.scales.size());
  FP4MOE_CHECK(std::isfinite(q.tensor_scale), StatusCode::kInvalidArgument,
               "{}: tensor scale (weight_scale_2) is not finite: {}", what, q.tensor_scale);
}

void validate_expert(const ExpertWeights& e, int64_t hidden, int64_t inter, const std::string& name) {
  validate_linear(e.gate, inter, hidden, name + " gate_proj");
  validate_linear(e.up, inter, hidden, name + " up_proj");
  validate_linear(e.down, hidden, inter, name + " down_proj");
}

}  // namespace

void MoeLayerWeights::validate() const {
  config.validate("MoeLayerWeights.config");
  const MoeConfig& c = config;
  FP4MOE_CHECK(experts.size() == static_cast<size_t>(c.num_experts), StatusCode::kInvalidArgument,
               "MoE layer: expected {} experts (config {}), found {}", c.num_experts, c.name, experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    if (experts[e].empty()) continue;  // not materialised: an error only if a token routes to it
    validate_expert(experts[e], c.hidden, c.inter, fmt::format("expert {}", e));
  }
  FP4MOE_CHECK(router_weight.empty() || router_weight.size() == static_cast<size_t>(c.num_experts * c.hidden),
               StatusCode::kInvalidArgument, "router weight: expected shape [{}, {}] ({} values), found {} values",
               c.num_experts, c.hidden, c.num_experts * c.hidden, router_weight.size());
  FP4MOE_CHECK(correction_bias.empty() || correction_bias.size() == static_cast<size_t>(c.num_experts),
               StatusCode::kInvalidArgument, "e_score_correction_bias: expected shape [{}], found {} values",
               c.num_experts, correction_bias.size());
  if (c.n_shared_experts > 0) {
    FP4MOE_CHECK(shared.has_value() && !shared->empty(), StatusCode::kInvalidArgument,
                 "MoE layer: config has {} shared expert(s) (width {}) but no shared expert weights",
                 c.n_shared_experts, c.shared_inter);
    validate_expert(*shared, c.hidden, c.shared_inter, "shared expert");
  } else {
    FP4MOE_CHECK(!shared.has_value() || shared->empty(), StatusCode::kInvalidArgument,
                 "MoE layer: shared expert weights present but config has n_shared_experts = 0");
  }
}

}  // namespace fp4moe
