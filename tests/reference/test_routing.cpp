// Routing: hand-worked cases with known answers, invariants on random logits, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fp4moe/reference.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

MoeConfig softmax_cfg(int64_t experts, int64_t topk, bool norm = false, float scale = 1.0f) {
  MoeConfig c;
  c.hidden = 16;
  c.inter = 16;
  c.num_experts = experts;
  c.topk = topk;
  c.routing = RoutingKind::kSoftmaxTopK;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  return c;
}

MoeConfig sigmoid_cfg(int64_t experts, int64_t topk, int64_t n_group, int64_t topk_group, bool norm = false,
                      float scale = 1.0f) {
  MoeConfig c = softmax_cfg(experts, topk, norm, scale);
  c.routing = RoutingKind::kSigmoidGrouped;
  c.n_group = n_group;
  c.topk_group = topk_group;
  return c;
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void expect_weights(const RoutingResult& r, const std::vector<double>& want) {
  ASSERT_EQ(r.weights.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r.weights[i], want[i], 1e-6 * std::abs(want[i]) + 1e-12) << i;
}

TEST(RouteSoftmax, KnownAnswer) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  const RoutingResult r = route_softmax_topk(logits.data(), 1, softmax_cfg(4, 2));
  EXPECT_EQ(r.tokens, 1);
  EXPECT_EQ(r.topk, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  expect_weights(r, {std::exp(3.0) / z, std::exp(2.0) / z});
}

TEST(RouteSoftmax, RenormaliseThenScale) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  const RoutingResult r = route_softmax_topk(logits.data(), 1, softmax_cfg(4, 2, true, 2.5f));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  const double d = std::exp(3.0) + std::exp(2.0);
  expect_weights(r, {2.5 * std::exp(3.0) / d, 2.5 * std::exp(2.0) / d});
  // Without renormalisation the scale still applies to the plain probabilities.
  const RoutingResult s = route_softmax_topk(logits.data(), 1, softmax_cfg(4, 2, false, 2.5f));
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  expect_weights(s, {2.5 * std::exp(3.0) / z, 2.5 * std::exp(2.0) / z});
}

TEST(RouteSoftmax, TiesGoToLowerIndex) {
  const std::vector<float> equal(5, 0.5f);
  RoutingResult r = route_softmax_topk(equal.data(), 1, softmax_cfg(5, 3));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  expect_weights(r, {0.2, 0.2, 0.2});
  const std::vector<float> partial = {1.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  r = route_softmax_topk(partial.data(), 1, softmax_cfg(5, 2));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  r = route_softmax_topk(partial.data(), 1, softmax_cfg(5, 4));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 4, 0}));
}

TEST(RouteSoftmax, LargeLogitsDoNotOverflow) {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  const RoutingResult r = route_softmax_topk(logits.data(), 1, softmax_cfg(3, 2));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  const double z = 1.0 + std::exp(-1.0);
  expect_weights(r, {1.0 / z, std::exp(-1.0) / z});
}

TEST(RouteSoftmax, SeveralTokensAreIndependent) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, /*token 1*/ 5.0f, -1.0f, 0.0f};
  const RoutingResult r = route_softmax_topk(logits.data(), 2, softmax_cfg(3, 1, true));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  expect_weights(r, {1.0, 1.0});
}

// E = 8 in 4 groups of 2, keep 2 groups, top-3.
//   group 0: logits  2, -1   sum of s = 1.150
//   group 1: logits .5, .4   sum      = 1.221
//   group 2: logits  1,  1   sum      = 1.462
//   group 3: logits  3, -3   sum      = 1.000   (holds the best single expert, 6, but loses as a group)
const std::vector<float> kGroupLogits = {2.0f, -1.0f, 0.5f, 0.4f, 1.0f, 1.0f, 3.0f, -3.0f};

TEST(RouteSigmoid, GroupLimitedKnownAnswer) {
  const RoutingResult r = route_sigmoid_grouped(kGroupLogits.data(), nullptr, 1, sigmoid_cfg(8, 3, 4, 2));
  // Kept groups 2 and 1 -> experts 2, 3, 4, 5; experts 4 and 5 tie (lower index first).
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 5, 2}));
  expect_weights(r, {sig(1.0), sig(1.0), sig(0.5)});
}

TEST(RouteSigmoid, BiasChoosesButDoesNotWeigh) {
  std::vector<float> bias(8, 0.0f);
  bias[3] = 0.5f;  // group 1 becomes the best (1.721) and expert 3 the best choice (1.099)
  const RoutingResult r = route_sigmoid_grouped(kGroupLogits.data(), bias.data(), 1, sigmoid_cfg(8, 3, 4, 2));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 4, 5}));
  expect_weights(r, {sig(0.4), sig(1.0), sig(1.0)});
  const RoutingResult n =
      route_sigmoid_grouped(kGroupLogits.data(), bias.data(), 1, sigmoid_cfg(8, 3, 4, 2, true, 2.5f));
  EXPECT_EQ(n.ids, r.ids);
  const double sum = sig(0.4) + 2 * sig(1.0);
  expect_weights(n, {2.5 * sig(0.4) / sum, 2.5 * sig(1.0) / sum, 2.5 * sig(1.0) / sum});
  // route() dispatches to the same function.
  const RoutingResult d = route(kGroupLogits.data(), bias.data(), 1, sigmoid_cfg(8, 3, 4, 2, true, 2.5f));
  EXPECT_EQ(d.ids, n.ids);
  EXPECT_EQ(d.weights, n.weights);
}

TEST(RouteSigmoid, AllGroupsKeptIsPlainTopK) {
  const RoutingResult r = route_sigmoid_grouped(kGroupLogits.data(), nullptr, 1, sigmoid_cfg(8, 3, 4, 4));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{6, 0, 4}));
  const RoutingResult one = route_sigmoid_grouped(kGroupLogits.data(), nullptr, 1, sigmoid_cfg(8, 3, 1, 1));
  EXPECT_EQ(one.ids, r.ids);
}

TEST(RouteSigmoid, GroupTiesGoToLowerGroup) {
  // Both groups score s(1) + s(-1); group 0 is kept.
  const std::vector<float> logits = {1.0f, -1.0f, -1.0f, 1.0f};
  RoutingResult r = route_sigmoid_grouped(logits.data(), nullptr, 1, sigmoid_cfg(4, 2, 2, 1));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  const std::vector<float> zeros(4, 0.0f);
  r = route_sigmoid_grouped(zeros.data(), nullptr, 1, sigmoid_cfg(4, 3, 2, 2));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  expect_weights(r, {0.5, 0.5, 0.5});
}

TEST(RouteSigmoid, GroupsOfOneScoreByTheirExpert) {
  // n_group == E: the group score is the expert's own choice value.
  const std::vector<float> logits = {0.1f, 0.9f, 0.5f, 0.3f};
  const RoutingResult r = route_sigmoid_grouped(logits.data(), nullptr, 1, sigmoid_cfg(4, 2, 4, 2, true));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  const double sum = sig(0.9) + sig(0.5);
  expect_weights(r, {sig(0.9) / sum, sig(0.5) / sum});
}

TEST(RouteSigmoid, GroupScoreIsSumOfTopTwo) {
  // Group 0 has the best expert (3.0) but group 1's top-2 sum is larger; a top-1 score would keep group 0.
  const std::vector<float> logits = {3.0f, -5.0f, -6.0f, 1.0f, 1.0f, -6.0f};
  const RoutingResult r = route_sigmoid_grouped(logits.data(), nullptr, 1, sigmoid_cfg(6, 1, 2, 1));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3}));  // 3 and 4 tie: lower index
}

struct RandomCase {
  MoeConfig cfg;
  bool bias;
};

TEST(Routing, InvariantsOnRandomLogits) {
  const std::vector<RandomCase> cases = {
      {softmax_cfg(1, 1), false},           {softmax_cfg(7, 4, true, 1.5f), false},
      {softmax_cfg(64, 8, false), false},   {sigmoid_cfg(16, 4, 4, 2, true, 2.5f), true},
      {sigmoid_cfg(64, 8, 8, 4, true, 2.5f), true}, {sigmoid_cfg(7, 2, 7, 3, false), true},
      {sigmoid_cfg(16, 8, 2, 1, true), false},
  };
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const RandomCase& rc : cases) {
    const MoeConfig& c = rc.cfg;
    const int64_t T = 50, E = c.num_experts, K = c.topk;
    std::vector<float> logits(static_cast<size_t>(T * E)), bias(static_cast<size_t>(E));
    for (float& v : logits) v = nd(rng);
    for (float& v : bias) v = 0.05f * nd(rng);
    const RoutingResult r = route(logits.data(), rc.bias ? bias.data() : nullptr, T, c);
    ASSERT_EQ(r.ids.size(), static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* ids = r.ids.data() + t * K;
      const float* w = r.weights.data() + t * K;
      const float* l = logits.data() + t * E;
      std::set<int32_t> distinct(ids, ids + K);
      EXPECT_EQ(distinct.size(), static_cast<size_t>(K)) << c.to_string();
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_GE(ids[k], 0);
        ASSERT_LT(ids[k], E);
        EXPECT_GT(w[k], 0.0f);
        sum += w[k];
      }
      if (c.norm_topk_prob) {
        EXPECT_NEAR(sum, c.routed_scaling_factor, 1e-5 * c.routed_scaling_factor);
      }
      if (c.routing == RoutingKind::kSoftmaxTopK) {
        // Ranked by logit; no unselected expert has a larger logit than a selected one.
        for (int64_t k = 1; k < K; ++k) EXPECT_GE(l[ids[k - 1]], l[ids[k]]);
        for (int64_t e = 0; e < E; ++e)
          if (!distinct.count(static_cast<int32_t>(e))) {
            EXPECT_LE(l[e], l[ids[K - 1]]);
          }
        if (!c.norm_topk_prob) {
          EXPECT_LE(sum, c.routed_scaling_factor * (1 + 1e-6));
        }
      } else {
        const int64_t G = E / c.n_group;
        std::set<int64_t> groups;
        for (int64_t k = 0; k < K; ++k) groups.insert(ids[k] / G);
        EXPECT_LE(groups.size(), static_cast<size_t>(c.topk_group));
        // Ranked by biased choice; weights are the unbiased sigmoid (up to renormalisation/scale).
        auto choice = [&](int32_t e) { return sig(l[e]) + (rc.bias ? bias[e] : 0.0); };
        for (int64_t k = 1; k < K; ++k) EXPECT_GE(choice(ids[k - 1]) + 1e-6, choice(ids[k]));
        const double f = c.norm_topk_prob ? w[0] / sig(l[ids[0]]) : c.routed_scaling_factor;
        for (int64_t k = 0; k < K; ++k) EXPECT_NEAR(w[k], f * sig(l[ids[k]]), 1e-5 * w[k]);
        // Within a kept group nothing unselected beats the weakest selected expert.
        for (int64_t e = 0; e < E; ++e)
          if (groups.count(e / G) && !distinct.count(static_cast<int32_t>(e))) {
            EXPECT_LE(choice(static_cast<int32_t>(e)), choice(ids[K - 1]) + 1e-6);
          }
      }
    }
  }
}

TEST(Routing, ZeroTokens) {
  const RoutingResult r = route(nullptr, nullptr, 0, sigmoid_cfg(8, 2, 4, 2));
  EXPECT_EQ(r.tokens, 0);
  EXPECT_EQ(r.topk, 2);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_TRUE(r.weights.empty());
}

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Routing, Errors) {
  const std::vector<float> l(16, 0.0f);
  expect_invalid([&] { route_softmax_topk(l.data(), 1, softmax_cfg(4, 5)); }, "topk = 5");
  expect_invalid([&] { route_softmax_topk(l.data(), 1, softmax_cfg(4, 0)); }, "topk = 0");
  expect_invalid([&] { route_softmax_topk(l.data(), 1, softmax_cfg(0, 1)); }, "num_experts");
  expect_invalid([&] { route_softmax_topk(l.data(), -1, softmax_cfg(4, 1)); }, "negative");
  expect_invalid([&] { route_softmax_topk(nullptr, 2, softmax_cfg(4, 1)); }, "null");
  expect_invalid([&] { route_sigmoid_grouped(l.data(), nullptr, 1, sigmoid_cfg(6, 2, 4, 2)); }, "n_group = 4");
  expect_invalid([&] { route_sigmoid_grouped(l.data(), nullptr, 1, sigmoid_cfg(8, 2, 4, 5)); }, "topk_group = 5");
  expect_invalid([&] { route_sigmoid_grouped(l.data(), nullptr, 1, sigmoid_cfg(8, 5, 4, 2)); }, "topk = 5");
  std::vector<float> bad = l;
  bad[6] = NAN;
  expect_invalid([&] { route_softmax_topk(bad.data(), 2, softmax_cfg(4, 1)); }, "token 1, expert 2");
  bad[6] = INFINITY;
  expect_invalid([&] { route_sigmoid_grouped(bad.data(), nullptr, 2, sigmoid_cfg(4, 1, 2, 1)); }, "token 1, expert 2");
  std::vector<float> bias(4, 0.0f);
  bias[3] = NAN;
  expect_invalid([&] { route_sigmoid_grouped(l.data(), bias.data(), 1, sigmoid_cfg(4, 1, 2, 1)); }, "bias [3]");
}

}  // namespace
}  // namespace fp4moe
