// Synthetic layers (include/fp4moe/weights.h): every byte and value is a pure function of
// (seed, expert, tensor, index), so the GPU engine regenerates the same layer in device memory.
// The formulas (all defined in include/fp4moe/synthetic_hash.h and synthetic_values.h):
//   expert e (e = kSyntheticSharedExpert for the shared expert, width cfg.shared_inter):
//     gate [I, H]: codes byte i  = synthetic_code_byte(seed, e, kSynGateCodes, i),   i < I*H/2 (row-major [I, H/2])
//                  scales byte i = synthetic_scale_byte(seed, e, kSynGateScales, i), i < I*H/16
//                  tensor scale  = synthetic_tensor_scale(seed, e, kSynGateCodes, H)
//     up   [I, H]: the same with kSynUpCodes / kSynUpScales, K = H
//     down [H, I]: the same with kSynDownCodes / kSynDownScales, K = I
//   router [E, H]: w[e*H + h] = synthetic_router_value(seed, e*H + h, synthetic_router_scale(H))
//                             = bf16(u * (4 / sqrt(H))), u = (int32(bits >> 40) - 2^23) * 2^-23,
//                               bits = synthetic_bits(seed, 0, kSynRouter, e*H + h)
//   correction bias [E] (only when cfg.has_correction_bias, zeros otherwise):
//                  b[e] = synthetic_bias_value(seed, e) = u(synthetic_bits(seed, 0, kSynBias, e)) * 0.05f
#include <algorithm>
#include <exception>
#include <thread>

#include "fp4moe/status.h"
#include "fp4moe/synthetic_values.h"
#include "fp4moe/weights.h"

namespace fp4moe {

namespace {

// Fills the packed codes [n, k/2]: byte i is byte (i % 8) of synthetic_bits(.., i / 8), which is what
// synthetic_code_byte(seed, expert, tensor, i) returns, with one hash per 8 bytes.
void fill_code_bytes(uint64_t seed, int64_t expert, uint32_t tensor, std::vector<uint8_t>& out) {
  const size_t n = out.size();
  size_t i = 0;
  for (uint64_t word = 0; i < n; ++word) {
    const uint64_t bits = synthetic_bits(seed, expert, tensor, word);
    for (int b = 0; b < 8 && i < n; ++b, ++i) out[i] = static_cast<uint8_t>(bits >> (8 * b));
  }
}

LinearWeights synthetic_linear(uint64_t seed, int64_t expert, uint32_t codes_tensor, uint32_t scales_tensor,
                               int64_t n, int64_t k) {
  PackedNvfp4Weights q;
  q.n = n;
  q.k = k;
  q.codes.resize(static_cast<size_t>(n * k / 2));
  fill_code_bytes(seed, expert, codes_tensor, q.codes);
  q.scales.resize(static_cast<size_t>(n * k / kNvfp4BlockSize));
  for (size_t i = 0; i < q.scales.size(); ++i) q.scales[i] = synthetic_scale_byte(seed, expert, scales_tensor, i);
  q.tensor_scale = synthetic_tensor_scale(seed, expert, codes_tensor, k);
  return LinearWeights::from_nvfp4(std::move(q));
}

ExpertWeights synthetic_mlp(uint64_t seed, int64_t expert, int64_t hidden, int64_t inter) {
  ExpertWeights e;
  e.gate = synthetic_linear(seed, expert, kSynGateCodes, kSynGateScales, inter, hidden);
  e.up = synthetic_linear(seed, expert, kSynUpCodes, kSynUpScales, inter, hidden);
  e.down = synthetic_linear(seed, expert, kSynDownCodes, kSynDownScales, hidden, inter);
  return e;
}

}  // namespace

ExpertWeights synthetic_expert(const MoeConfig& cfg, const SyntheticSpec& spec, int64_t expert) {
  cfg.validate("synthetic_expert config");
  FP4MOE_CHECK(expert >= 0 && expert < cfg.num_experts, StatusCode::kInvalidArgument,
               "synthetic_expert: expert {} out of range [0, {})", expert, cfg.num_experts);
  return synthetic_mlp(spec.seed, expert, cfg.hidden, cfg.inter);
}

ExpertWeights synthetic_shared_expert(const MoeConfig& cfg, const SyntheticSpec& spec) {
  cfg.validate("synthetic_shared_expert config");
  FP4MOE_CHECK(cfg.n_shared_experts > 0 && cfg.shared_inter > 0, StatusCode::kInvalidArgument,
               "synthetic_shared_expert: config {} has no shared expert (n_shared_experts = {}, shared_inter = {})",
               cfg.name, cfg.n_shared_experts, cfg.shared_inter);
  return synthetic_mlp(spec.seed, kSyntheticSharedExpert, cfg.hidden, cfg.shared_inter);
}

std::vector<float> synthetic_router_weight(const MoeConfig& cfg, const SyntheticSpec& spec) {
  cfg.validate("synthetic_router_weight config");
  const float scale = synthetic_router_scale(cfg.hidden);
  std::vector<float> w(static_cast<size_t>(cfg.num_experts * cfg.hidden));
  for (size_t i = 0; i < w.size(); ++i) w[i] = synthetic_router_value(spec.seed, i, scale);
  return w;
}

std::vector<float> synthetic_correction_bias(const MoeConfig& cfg, const SyntheticSpec& spec) {
  cfg.validate("synthetic_correction_bias config");
  std::vector<float> b(static_cast<size_t>(cfg.num_experts), 0.0f);
  if (cfg.has_correction_bias)
    for (int64_t e = 0; e < cfg.num_experts; ++e) b[static_cast<size_t>(e)] = synthetic_bias_value(spec.seed, e);
  return b;
}

MoeLayerWeights synthetic_layer(const MoeConfig& cfg, const SyntheticSpec& spec, const std::vector<bool>& which) {
  cfg.validate("synthetic_layer config");
  FP4MOE_CHECK(which.empty() || which.size() == static_cast<size_t>(cfg.num_experts), StatusCode::kInvalidArgument,
               "synthetic_layer: `which` has {} entries, expected 0 (all) or num_experts = {}", which.size(),
               cfg.num_experts);
  MoeLayerWeights w;
  w.config = cfg;
  w.experts.resize(static_cast<size_t>(cfg.num_experts));
  std::vector<int64_t> todo;
  for (int64_t e = 0; e < cfg.num_experts; ++e)
    if (which.empty() || which[static_cast<size_t>(e)]) todo.push_back(e);
  // Experts are independent: generate them on a few threads (the bytes do not depend on it).
  const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(todo.size()), hw));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  for (int64_t i = 0; i < n; ++i)
    pool.emplace_back([&, i] {
      try {
        for (size_t j = static_cast<size_t>(i); j < todo.size(); j += static_cast<size_t>(n))
          w.experts[static_cast<size_t>(todo[j])] = synthetic_mlp(spec.seed, todo[j], cfg.hidden, cfg.inter);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  w.router_weight = synthetic_router_weight(cfg, spec);
  if (cfg.has_correction_bias) w.correction_bias = synthetic_correction_bias(cfg, spec);
  if (cfg.n_shared_experts > 0) w.shared = synthetic_shared_expert(cfg, spec);
  return w;
}

}  // namespace fp4moe
