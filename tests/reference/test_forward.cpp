// The reference forward: known answers on diagonal weights (bf16 and NVFP4, with a shared expert),
// a float64 re-computation from LinearWeights::at, thread-count independence, errors, and
// relative_l2_error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fp4moe/reference.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

constexpr uint8_t kE2M1One = 0x2;     // E2M1 code of 1.0
constexpr uint8_t kE4M3One = 0x38;    // E4M3 byte of 1.0 (exponent 7, mantissa 0)

float silu(float g) { return g / (1.0f + std::exp(-g)); }

// [n, k] bf16 with v at (i, i) for i < min(n, k).
LinearWeights diag_bf16(int64_t n, int64_t k, float v) {
  std::vector<uint16_t> bits(static_cast<size_t>(n * k), 0);
  for (int64_t i = 0; i < std::min(n, k); ++i) bits[static_cast<size_t>(i * k + i)] = f32_to_bf16_bits(v);
  return LinearWeights::from_bf16(n, k, std::move(bits));
}

// [n, k] NVFP4 with code `code` at (i, i), block scales 1.0, the given tensor scale.
LinearWeights diag_nvfp4(int64_t n, int64_t k, uint8_t code, float tensor_scale) {
  PackedNvfp4Weights q;
  q.n = n;
  q.k = k;
  q.codes.assign(static_cast<size_t>(n * k / 2), 0);
  q.scales.assign(static_cast<size_t>(n * k / 16), kE4M3One);
  for (int64_t i = 0; i < std::min(n, k); ++i)
    q.codes[static_cast<size_t>(i * (k / 2) + i / 2)] |= static_cast<uint8_t>(i % 2 ? code << 4 : code);
  q.tensor_scale = tensor_scale;
  return LinearWeights::from_nvfp4(std::move(q));
}

MoeConfig small_cfg(int64_t H, int64_t I, int64_t E, int64_t K) {
  MoeConfig c;
  c.hidden = H;
  c.inter = I;
  c.num_experts = E;
  c.topk = K;
  c.routing = RoutingKind::kSoftmaxTopK;
  return c;
}

std::vector<uint16_t> random_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x) v = f32_to_bf16_bits(nd(rng));
  return x;
}

TEST(Forward, DiagonalKnownAnswerWithSharedExpert) {
  const int64_t H = 16, I = 16, IS = 32;
  MoeLayerWeights w;
  w.config = small_cfg(H, I, 2, 1);
  w.config.norm_topk_prob = true;  // top-1 weight becomes exactly 1, then x 2.5
  w.config.routed_scaling_factor = 2.5f;
  w.config.n_shared_experts = 1;
  w.config.shared_inter = IS;
  w.experts.resize(2);
  w.experts[0] = {diag_bf16(I, H, 1.0f), diag_bf16(I, H, 2.0f), diag_bf16(H, I, 0.5f)};
  w.experts[1] = {diag_nvfp4(I, H, kE2M1One, 0.25f), diag_nvfp4(I, H, kE2M1One, 1.0f),
                  diag_nvfp4(H, I, kE2M1One | 8u, 3.0f)};  // down = -3 on the diagonal
  // Shared expert, wider than H: gate 0.5, up 1, down 2 on the diagonal; rows >= H are zero.
  w.shared = ExpertWeights{diag_nvfp4(IS, H, kE2M1One, 0.5f), diag_nvfp4(IS, H, kE2M1One, 1.0f),
                           diag_nvfp4(H, IS, kE2M1One, 2.0f)};
  const std::vector<uint16_t> x = random_x(2 * H, 7);
  const std::vector<float> logits = {1.0f, 0.0f, /*token 1*/ 0.0f, 3.0f};
  for (int threads : {1, 2}) {
    const MoeForwardResult r = moe_forward_reference(w, x.data(), 2, logits.data(), threads);
    ASSERT_EQ(r.out.size(), static_cast<size_t>(2 * H));
    EXPECT_EQ(r.routing.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(r.routing.weights, (std::vector<float>{2.5f, 2.5f}));
    for (int64_t h = 0; h < H; ++h) {
      const float x0 = bf16_bits_to_f32(x[h]), x1 = bf16_bits_to_f32(x[H + h]);
      const float y0 = round_bf16(0.5f * round_bf16(silu(x0) * (2.0f * x0)));
      const float y1 = round_bf16(-3.0f * round_bf16(silu(0.25f * x1) * x1));
      const float s0 = round_bf16(2.0f * round_bf16(silu(0.5f * x0) * x0));
      const float s1 = round_bf16(2.0f * round_bf16(silu(0.5f * x1) * x1));
      EXPECT_EQ(bf16_bits_to_f32(r.out[h]), round_bf16(2.5f * y0 + s0)) << "token 0, h " << h;
      EXPECT_EQ(bf16_bits_to_f32(r.out[H + h]), round_bf16(2.5f * y1 + s1)) << "token 1, h " << h;
    }
  }
}

TEST(Forward, ExpertFc1Fc2KnownAnswer) {
  const int64_t H = 32, I = 48;
  ExpertWeights e{diag_nvfp4(I, H, 0x7, 0.125f),   // gate 6 * 0.125 = 0.75
                  diag_nvfp4(I, H, 0x1, 2.0f),     // up 0.5 * 2 = 1
                  diag_nvfp4(H, I, 0x3, 1.0f)};    // down 1.5
  std::vector<float> x(static_cast<size_t>(H)), a(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) x[h] = round_bf16(0.37f * static_cast<float>(h - 13));
  expert_fc1_reference(e, x.data(), a.data());
  for (int64_t i = 0; i < I; ++i) {
    const float want = i < H ? round_bf16(silu(0.75f * x[i]) * x[i]) : 0.0f;
    EXPECT_EQ(a[i], want) << i;
  }
  expert_fc2_reference(e, a.data(), y.data());
  for (int64_t h = 0; h < H; ++h) EXPECT_EQ(y[h], round_bf16(1.5f * a[h])) << h;
  EXPECT_THROW(expert_fc1_reference(ExpertWeights{}, x.data(), a.data()), Error);
}

MoeConfig random_cfg() {
  MoeConfig c = small_cfg(48, 80, 7, 3);
  c.routing = RoutingKind::kSigmoidGrouped;
  c.n_group = 1;  // (groups of one expert are routing-only: MoeConfig::validate rejects them)
  c.topk_group = 1;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.has_correction_bias = true;
  c.n_shared_experts = 1;
  c.shared_inter = 64;
  return c;
}

// float64 recomputation of one expert from LinearWeights::at, rounding at R3 and R4 only.
std::vector<double> expert_f64(const ExpertWeights& e, const std::vector<float>& x) {
  const int64_t I = e.gate.n, H = e.gate.k;
  std::vector<double> a(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += static_cast<double>(x[h]) * e.gate.at(i, h);
      u += static_cast<double>(x[h]) * e.up.at(i, h);
    }
    a[i] = round_bf16(static_cast<float>(g / (1 + std::exp(-g)) * u));
  }
  for (int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += a[i] * e.down.at(h, i);
    y[h] = round_bf16(static_cast<float>(s));
  }
  return y;
}

TEST(Forward, MatchesFloat64RecomputationOnSyntheticWeights) {
  const MoeConfig c = random_cfg();
  const MoeLayerWeights w = synthetic_layer(c, SyntheticSpec{99});
  const int64_t T = 9, H = c.hidden;
  const std::vector<uint16_t> x = random_x(T * H, 3);
  const MoeForwardResult r = moe_forward_reference(w, x.data(), T, nullptr, 2);
  std::vector<float> got(static_cast<size_t>(T * H)), want(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> xt(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) xt[h] = bf16_bits_to_f32(x[t * H + h]);
    std::vector<double> acc(static_cast<size_t>(H), 0.0);
    for (int64_t k = 0; k < c.topk; ++k) {
      const std::vector<double> y = expert_f64(w.experts[r.routing.ids[t * c.topk + k]], xt);
      for (int64_t h = 0; h < H; ++h) acc[h] += r.routing.weights[t * c.topk + k] * y[h];
    }
    const std::vector<double> ys = expert_f64(*w.shared, xt);
    for (int64_t h = 0; h < H; ++h) {
      want[t * H + h] = round_bf16(static_cast<float>(acc[h] + ys[h]));
      got[t * H + h] = bf16_bits_to_f32(r.out[t * H + h]);
    }
  }
  const double err = relative_l2_error(got.data(), want.data(), T * H);
  EXPECT_LE(err, 5e-3);
  // Synthetic weights keep the output O(1).
  double ss = 0;
  for (float v : want) ss += static_cast<double>(v) * v;
  const double rms = std::sqrt(ss / static_cast<double>(want.size()));
  EXPECT_GT(rms, 0.05);
  EXPECT_LT(rms, 20.0);
}

TEST(Forward, ResultDoesNotDependOnThreadCount) {
  const MoeConfig c = random_cfg();
  const MoeLayerWeights w = synthetic_layer(c, SyntheticSpec{5});
  const int64_t T = 13;
  const std::vector<uint16_t> x = random_x(T * c.hidden, 11);
  const MoeForwardResult one = moe_forward_reference(w, x.data(), T, nullptr, 1);
  for (int threads : {0, 2, 3, 8, 64}) {
    const MoeForwardResult r = moe_forward_reference(w, x.data(), T, nullptr, threads);
    EXPECT_EQ(r.out, one.out) << threads << " threads";
    EXPECT_EQ(r.routing.ids, one.routing.ids);
    EXPECT_EQ(r.routing.weights, one.routing.weights);
  }
  // Passing the logits the layer would compute gives the same answer.
  const std::vector<float> logits = router_logits_reference(x.data(), T, w);
  const MoeForwardResult given = moe_forward_reference(w, x.data(), T, logits.data(), 2);
  EXPECT_EQ(given.out, one.out);
}

TEST(Forward, ZeroTokens) {
  const MoeLayerWeights w = synthetic_layer(random_cfg(), SyntheticSpec{});
  const MoeForwardResult r = moe_forward_reference(w, nullptr, 0, nullptr);
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(r.routing.tokens, 0);
}

TEST(Forward, RouterLogitsKnownAnswer) {
  MoeLayerWeights w;
  w.config = small_cfg(16, 16, 3, 1);
  w.router_weight.assign(3 * 16, 0.0f);
  for (int e = 0; e < 3; ++e) w.router_weight[e * 16 + 2 * e] = -2.0f;  // logit e = -2 x[2e]
  const std::vector<uint16_t> x = random_x(2 * 16, 1);
  const std::vector<float> l = router_logits_reference(x.data(), 2, w);
  ASSERT_EQ(l.size(), 6u);
  for (int t = 0; t < 2; ++t)
    for (int e = 0; e < 3; ++e) EXPECT_EQ(l[t * 3 + e], -2.0f * bf16_bits_to_f32(x[t * 16 + 2 * e]));
  w.router_weight.clear();
  EXPECT_THROW(router_logits_reference(x.data(), 2, w), Error);
}

TEST(Forward, UnmaterialisedExpertIsAnError) {
  const MoeConfig c = small_cfg(16, 32, 4, 2);
  std::vector<bool> which = {true, false, true, true};
  const MoeLayerWeights w = synthetic_layer(c, SyntheticSpec{}, which);
  ASSERT_TRUE(w.experts[1].empty());
  const std::vector<uint16_t> x = random_x(3 * 16, 2);
  std::vector<float> logits = {5, 0, 4, 0, /*token 1*/ 0, 0, 4, 5, /*token 2*/ 0, 5, 4, 0};
  try {
    moe_forward_reference(w, x.data(), 3, logits.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("token 2 routes to expert 1"), std::string::npos) << e.what();
  }
  logits[9] = 0;  // nobody routes to expert 1 now: the missing expert is fine
  EXPECT_NO_THROW(moe_forward_reference(w, x.data(), 3, logits.data()));
  // Null logits and no router weight.
  MoeLayerWeights nr = w;
  nr.router_weight.clear();
  EXPECT_THROW(moe_forward_reference(nr, x.data(), 3, nullptr), Error);
  EXPECT_THROW(moe_forward_reference(w, nullptr, 3, logits.data()), Error);
}

void expect_invalid_layer(const MoeLayerWeights& w, const std::string& needle) {
  try {
    w.validate();
    ADD_FAILURE() << "validate() accepted a bad layer; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Weights, ValidateNamesTheBadTensor) {
  const MoeConfig c = random_cfg();
  const MoeLayerWeights good = synthetic_layer(c, SyntheticSpec{}, {true, false, true, false, false, false, true});
  EXPECT_NO_THROW(good.validate());
  MoeLayerWeights w = good;
  w.experts[2].up = diag_nvfp4(80, 32, kE2M1One, 1.0f);
  expect_invalid_layer(w, "expert 2 up_proj: expected shape [80, 48], found [80, 32]");
  w = good;
  w.experts[6].down.nvfp4.scales.pop_back();
  expect_invalid_layer(w, "expert 6 down_proj: expected block scales [48, 5]");
  w = good;
  w.experts[0].gate.nvfp4.tensor_scale = NAN;
  expect_invalid_layer(w, "expert 0 gate_proj: tensor scale");
  w = good;
  w.experts.pop_back();
  expect_invalid_layer(w, "expected 7 experts");
  w = good;
  w.router_weight.resize(10);
  expect_invalid_layer(w, "router weight");
  w = good;
  w.correction_bias.resize(3);
  expect_invalid_layer(w, "e_score_correction_bias");
  w = good;
  w.shared.reset();
  expect_invalid_layer(w, "no shared expert");
  w = good;
  w.shared->gate = diag_bf16(80, 48, 1.0f);
  expect_invalid_layer(w, "shared expert gate_proj: expected shape [64, 48], found [80, 48]");
}

TEST(Weights, LinearWeightsAccessors) {
  const LinearWeights b = diag_bf16(16, 16, 1.5f);
  EXPECT_EQ(b.at(3, 3), 1.5f);
  EXPECT_EQ(b.at(3, 4), 0.0f);
  EXPECT_THROW(b.at(16, 0), Error);
  EXPECT_THROW(LinearWeights::from_bf16(4, 4, std::vector<uint16_t>(15)), Error);
  PackedNvfp4Weights q;
  q.n = 2;
  q.k = 32;
  q.codes = {0x9F};  // wrong size
  EXPECT_THROW(LinearWeights::from_nvfp4(q), Error);
  q.codes.assign(32, 0);
  q.codes[0] = 0x9F;   // (0,0) = code 0xF (-6), (0,1) = code 0x9 (-0.5)
  q.codes[17] = 0x05;  // (1,2) = code 0x5 (3)
  q.scales = {0x40, kE4M3One, 0x30, 0x38};  // row 0 block 0: 2.0; row 1 block 0: 0.5
  q.tensor_scale = 0.25f;
  const LinearWeights n = LinearWeights::from_nvfp4(q);
  EXPECT_EQ(n.format, LinearWeights::Format::kNvfp4);
  EXPECT_EQ(n.n, 2);
  EXPECT_EQ(n.k, 32);
  EXPECT_EQ(n.at(0, 0), -6.0f * 2.0f * 0.25f);
  EXPECT_EQ(n.at(0, 1), -0.5f * 2.0f * 0.25f);
  EXPECT_EQ(n.at(1, 2), 3.0f * 0.5f * 0.25f);
  EXPECT_EQ(n.at(1, 3), 0.0f);
}

TEST(RelativeL2, Values) {
  const std::vector<float> b = {3.0f, 4.0f}, a = {3.0f, 4.5f}, z = {0.0f, 0.0f};
  EXPECT_DOUBLE_EQ(relative_l2_error(a.data(), b.data(), 2), 0.5 / 5.0);
  EXPECT_DOUBLE_EQ(relative_l2_error(b.data(), b.data(), 2), 0.0);
  EXPECT_DOUBLE_EQ(relative_l2_error(z.data(), z.data(), 2), 0.0);
  EXPECT_TRUE(std::isinf(relative_l2_error(a.data(), z.data(), 2)));
  EXPECT_DOUBLE_EQ(relative_l2_error(z.data(), b.data(), 2), 1.0);
  const std::vector<float> nan = {NAN, 4.0f};
  EXPECT_FALSE(relative_l2_error(nan.data(), b.data(), 2) <= 1.0);  // a NaN never passes a threshold
  EXPECT_DOUBLE_EQ(relative_l2_error(nullptr, nullptr, 0), 0.0);
}

}  // namespace
}  // namespace fp4moe
