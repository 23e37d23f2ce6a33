// Synthetic layers: bytes are a pure function of (seed, expert, tensor, index), equal to the
// synthetic_hash.h / synthetic_values.h formulas, and independent of which other experts are generated.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fp4moe/reference.h"
#include "fp4moe/status.h"
#include "fp4moe/synthetic_values.h"

namespace fp4moe {
namespace {

MoeConfig syn_cfg(bool bias = true) {
  MoeConfig c;
  c.hidden = 48;
  c.inter = 80;
  c.num_experts = 6;
  c.topk = 2;
  c.routing = RoutingKind::kSigmoidGrouped;
  c.n_group = 3;
  c.topk_group = 2;
  c.has_correction_bias = bias;
  c.n_shared_experts = 1;
  c.shared_inter = 96;
  return c;
}

void expect_linear_matches_formula(const LinearWeights& w, uint64_t seed, int64_t expert, uint32_t codes_tensor,
                                   uint32_t scales_tensor, int64_t n, int64_t k) {
  ASSERT_EQ(w.format, LinearWeights::Format::kNvfp4);
  ASSERT_EQ(w.n, n);
  ASSERT_EQ(w.k, k);
  ASSERT_EQ(w.nvfp4.codes.size(), static_cast<size_t>(n * k / 2));
  ASSERT_EQ(w.nvfp4.scales.size(), static_cast<size_t>(n * k / 16));
  for (size_t i = 0; i < w.nvfp4.codes.size(); ++i)
    ASSERT_EQ(w.nvfp4.codes[i], synthetic_code_byte(seed, expert, codes_tensor, i)) << "code byte " << i;
  for (size_t i = 0; i < w.nvfp4.scales.size(); ++i)
    ASSERT_EQ(w.nvfp4.scales[i], synthetic_scale_byte(seed, expert, scales_tensor, i)) << "scale byte " << i;
  EXPECT_EQ(w.nvfp4.tensor_scale, synthetic_tensor_scale(seed, expert, codes_tensor, k));
}

TEST(Synthetic, ExpertBytesFollowTheFormulas) {
  const MoeConfig c = syn_cfg();
  const SyntheticSpec spec{0x1234};
  for (int64_t e : {0, 5}) {
    const ExpertWeights x = synthetic_expert(c, spec, e);
    expect_linear_matches_formula(x.gate, spec.seed, e, kSynGateCodes, kSynGateScales, c.inter, c.hidden);
    expect_linear_matches_formula(x.up, spec.seed, e, kSynUpCodes, kSynUpScales, c.inter, c.hidden);
    expect_linear_matches_formula(x.down, spec.seed, e, kSynDownCodes, kSynDownScales, c.hidden, c.inter);
  }
  const ExpertWeights s = synthetic_shared_expert(c, spec);
  expect_linear_matches_formula(s.gate, spec.seed, kSyntheticSharedExpert, kSynGateCodes, kSynGateScales,
                                c.shared_inter, c.hidden);
  expect_linear_matches_formula(s.down, spec.seed, kSyntheticSharedExpert, kSynDownCodes, kSynDownScales, c.hidden,
                                c.shared_inter);
}

bool same_linear(const LinearWeights& a, const LinearWeights& b) {
  return a.n == b.n && a.k == b.k && a.nvfp4.codes == b.nvfp4.codes && a.nvfp4.scales == b.nvfp4.scales &&
         a.nvfp4.tensor_scale == b.nvfp4.tensor_scale;
}
bool same_expert(const ExpertWeights& a, const ExpertWeights& b) {
  return same_linear(a.gate, b.gate) && same_linear(a.up, b.up) && same_linear(a.down, b.down);
}

TEST(Synthetic, ExpertIndependentOfWhichOthersAreGenerated) {
  const MoeConfig c = syn_cfg();
  const SyntheticSpec spec{77};
  const MoeLayerWeights all = synthetic_layer(c, spec);
  const MoeLayerWeights some = synthetic_layer(c, spec, {false, false, false, true, false, false});
  for (int64_t e = 0; e < c.num_experts; ++e) {
    ASSERT_FALSE(all.experts[e].empty());
    EXPECT_EQ(some.experts[e].empty(), e != 3);
  }
  EXPECT_TRUE(same_expert(some.experts[3], all.experts[3]));
  EXPECT_TRUE(same_expert(synthetic_expert(c, spec, 3), all.experts[3]));
  EXPECT_TRUE(same_expert(*some.shared, *all.shared));
  EXPECT_EQ(some.router_weight, all.router_weight);
  EXPECT_EQ(some.correction_bias, all.correction_bias);
  // Different experts, projections and seeds differ.
  EXPECT_FALSE(same_expert(all.experts[2], all.experts[3]));
  EXPECT_NE(all.experts[2].gate.nvfp4.codes, all.experts[2].up.nvfp4.codes);
  EXPECT_NE(all.experts[2].gate.nvfp4.tensor_scale, all.experts[2].up.nvfp4.tensor_scale);
  EXPECT_FALSE(same_expert(synthetic_expert(c, SyntheticSpec{78}, 3), all.experts[3]));
  // Changing the expert count does not change an expert's bytes.
  MoeConfig bigger = c;
  bigger.num_experts = 12;
  EXPECT_TRUE(same_expert(synthetic_expert(bigger, spec, 3), all.experts[3]));
}

TEST(Synthetic, ScalesKeepWeightsInRange) {
  const MoeConfig c = syn_cfg();
  const ExpertWeights e = synthetic_expert(c, SyntheticSpec{}, 1);
  for (uint8_t s : e.gate.nvfp4.scales) {
    const float v = e4m3_decode(s);
    EXPECT_GE(v, 0.125f);
    EXPECT_LE(v, 1.875f);
  }
  // Weight rms ~ 1/sqrt(K): the layer keeps activations O(1).
  double ss = 0;
  for (int64_t r = 0; r < e.gate.n; ++r)
    for (int64_t k = 0; k < e.gate.k; ++k) ss += std::pow(e.gate.at(r, k), 2);
  const double rms = std::sqrt(ss / static_cast<double>(e.gate.n * e.gate.k)) * std::sqrt(double(c.hidden));
  EXPECT_GT(rms, 0.5);
  EXPECT_LT(rms, 2.0);
}

TEST(Synthetic, RouterWeightAndBias) {
  const MoeConfig c = syn_cfg();
  const SyntheticSpec spec{42};
  const std::vector<float> r = synthetic_router_weight(c, spec);
  ASSERT_EQ(r.size(), static_cast<size_t>(c.num_experts * c.hidden));
  const float scale = 4.0f / std::sqrt(48.0f);
  double sum = 0, ss = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i], round_bf16(r[i])) << "router value " << i << " is not a bf16 value";
    EXPECT_LE(std::abs(r[i]), scale * (1 + 1.0 / 256));
    // The documented formula: u from the top 24 bits, times 4/sqrt(H), rounded to bf16.
    const uint64_t bits = synthetic_bits(spec.seed, 0, kSynRouter, i);
    const float u = static_cast<float>(static_cast<int64_t>(bits >> 40) - (1 << 23)) / 8388608.0f;
    EXPECT_EQ(r[i], round_bf16(u * scale));
    sum += r[i];
    ss += static_cast<double>(r[i]) * r[i];
  }
  const double n = static_cast<double>(r.size());
  EXPECT_NEAR(sum / n, 0.0, 0.1 * scale);
  EXPECT_NEAR(std::sqrt(ss / n), scale / std::sqrt(3.0), 0.1 * scale);

  const std::vector<float> b = synthetic_correction_bias(c, spec);
  ASSERT_EQ(b.size(), static_cast<size_t>(c.num_experts));
  for (int64_t e = 0; e < c.num_experts; ++e) {
    EXPECT_GE(b[e], -0.05f);
    EXPECT_LT(b[e], 0.05f);
    EXPECT_EQ(b[e], synthetic_bias_value(spec.seed, e));
  }
  EXPECT_NE(b[0], b[1]);
  const std::vector<float> none = synthetic_correction_bias(syn_cfg(false), spec);
  EXPECT_EQ(none, std::vector<float>(6, 0.0f));
  EXPECT_TRUE(synthetic_layer(syn_cfg(false), spec, std::vector<bool>(6, false)).correction_bias.empty());
}

TEST(Synthetic, Errors) {
  const MoeConfig c = syn_cfg();
  EXPECT_THROW(synthetic_expert(c, SyntheticSpec{}, 6), Error);
  EXPECT_THROW(synthetic_expert(c, SyntheticSpec{}, -1), Error);
  EXPECT_THROW(synthetic_layer(c, SyntheticSpec{}, {true, false}), Error);
  MoeConfig no_shared = c;
  no_shared.n_shared_experts = 0;
  no_shared.shared_inter = 0;
  EXPECT_THROW(synthetic_shared_expert(no_shared, SyntheticSpec{}), Error);
  EXPECT_FALSE(synthetic_layer(no_shared, SyntheticSpec{}, std::vector<bool>(6, false)).shared.has_value());
  MoeConfig bad = c;
  bad.hidden = 40;  // not a multiple of 16
  EXPECT_THROW(synthetic_layer(bad, SyntheticSpec{}), Error);
}

}  // namespace
}  // namespace fp4moe
