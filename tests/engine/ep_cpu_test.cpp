// Expert parallelism on the CPU (no device needed):
//  - the shard of (ep_size, ep_rank): which experts a rank holds, the rank holding the shared expert,
//    the local id map, and the kInvalidArgument errors that name the bad values (the checks
//    MoeEngine::create runs before touching the device);
//  - the decomposition the GPU engine relies on, with the CPU reference alone: the partials of all
//    ranks (the reference with the other ranks' experts zeroed, tests/engine/ep_test_util.h) sum to the
//    whole layer, the one-rank "partial" is the layer bit for bit, and a partial computed from a layer
//    that materialises only the rank's experts equals the one from the whole layer bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "engine/expert_shard.h"
#include "ep_test_util.h"
#include "fp4moe/dtype.h"
#include "fp4moe/reference.h"
#include "fp4moe/status.h"

namespace fp4moe::test {
namespace {

MoeConfig small_config() {
  MoeConfig c;
  c.name = "ep-small";
  c.hidden = 64;
  c.inter = 48;
  c.num_experts = 16;
  c.topk = 4;
  c.routing = RoutingKind::kSigmoidGrouped;
  c.n_group = 4;
  c.topk_group = 2;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.has_correction_bias = true;
  c.n_shared_experts = 1;
  c.shared_inter = 32;
  c.validate("ep-small");
  return c;
}

TEST(ExpertShard, SplitsTheExpertsEvenly) {
  MoeConfig c = small_config();
  c.num_experts = 256;
  std::set<int64_t> seen;
  for (int r = 0; r < 8; ++r) {
    const engine::ExpertShard s = engine::expert_shard(c, 8, r);
    EXPECT_EQ(s.size, 8);
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(s.count, 32);
    EXPECT_EQ(s.first, 32 * r);
    EXPECT_EQ(s.shared, r == 0);
    EXPECT_FALSE(s.is_whole());
    for (int64_t e = 0; e < 256; ++e) {
      const bool held = e >= 32 * r && e < 32 * (r + 1);
      EXPECT_EQ(s.holds(e), held) << "rank " << r << " expert " << e;
      EXPECT_EQ(s.local_id(e), held ? e - 32 * r : 32) << "rank " << r << " expert " << e;
      if (held) {
        EXPECT_TRUE(seen.insert(e).second) << "expert " << e << " held twice";
      }
    }
  }
  EXPECT_EQ(seen.size(), 256u) << "every expert is held by exactly one rank";
  const engine::ExpertShard whole = engine::expert_shard(c, 1, 0);
  EXPECT_TRUE(whole.is_whole());
  EXPECT_EQ(whole.first, 0);
  EXPECT_EQ(whole.count, 256);
  EXPECT_TRUE(whole.shared);
  const engine::ExpertShard all = engine::expert_shard(c, 256, 255);
  EXPECT_EQ(all.first, 255);
  EXPECT_EQ(all.count, 1);
}

void expect_invalid(const MoeConfig& c, int size, int rank, const std::vector<std::string>& words) {
  try {
    (void)engine::expert_shard(c, size, rank);
    ADD_FAILURE() << "ep_size " << size << " ep_rank " << rank << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << e.what();
    const std::string msg = e.what();
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << msg << "' lacks '" << w << "'";
  }
}

TEST(ExpertShard, BadOptionsNameTheValues) {
  MoeConfig c = small_config();
  c.num_experts = 256;
  expect_invalid(c, 3, 0, {"ep_size = 3", "256"});
  expect_invalid(c, 512, 0, {"ep_size = 512", "256"});
  expect_invalid(c, 0, 0, {"ep_size = 0", ">= 1"});
  expect_invalid(c, -2, 0, {"ep_size = -2"});
  expect_invalid(c, 8, 8, {"ep_rank = 8", "ep_size = 8"});
  expect_invalid(c, 8, -1, {"ep_rank = -1"});
  c.num_experts = 16;
  expect_invalid(c, 6, 1, {"ep_size = 6", "16"});
}

// Random bf16 hidden states and N(0, 1) logits.
void random_inputs(const MoeConfig& c, int64_t T, uint64_t seed, std::vector<uint16_t>* x, std::vector<float>* logits) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  x->resize(static_cast<size_t>(T * c.hidden));
  for (auto& v : *x) v = f32_to_bf16_bits(nd(rng));
  logits->resize(static_cast<size_t>(T * c.num_experts));
  for (auto& v : *logits) v = nd(rng);
}

TEST(ExpertParallelReference, PartialsSumToTheLayer) {
  const MoeConfig c = small_config();
  const MoeLayerWeights w = synthetic_layer(c, SyntheticSpec{0x77});
  for (const int64_t T : {1, 7, 64}) {
    for (const bool from_router : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " logits " << (from_router ? "from the router" : "given"));
      std::vector<uint16_t> x;
      std::vector<float> logits;
      random_inputs(c, T, 1000 + T, &x, &logits);
      const float* lg = from_router ? nullptr : logits.data();
      const MoeForwardResult full = moe_forward_reference(w, x.data(), T, lg, 1);

      const MoeForwardResult one = moe_forward_reference(ep_partial_layer(w, 1, 0), x.data(), T, lg, 1);
      EXPECT_EQ(one.out, full.out) << "the single-rank partial is the whole layer";

      std::vector<std::vector<uint16_t>> partials;
      std::set<int> ranks_used;
      for (int r = 0; r < 4; ++r) {
        const MoeForwardResult p = moe_forward_reference(ep_partial_layer(w, 4, r), x.data(), T, lg, 1);
        EXPECT_EQ(p.routing.ids, full.routing.ids) << "routing stays global on rank " << r;
        EXPECT_EQ(p.routing.weights, full.routing.weights) << "rank " << r;
        partials.push_back(p.out);
      }
      for (int32_t e : full.routing.ids) ranks_used.insert(e / 4);
      const double err = rel_l2_f32_vs_bf16(sum_partials_f32(partials), full.out);
      std::printf("  T=%-3lld %-12s ranks with pairs %zu, rel L2(sum of 4 partials, layer) = %.2e\n",
                  static_cast<long long>(T), from_router ? "router" : "logits", ranks_used.size(), err);
      EXPECT_LE(err, 1e-2);
      if (T >= 7) {
        EXPECT_GE(ranks_used.size(), 2u) << "the inputs route to several ranks";
        EXPECT_GT(err, 0.0) << "bf16 rounding of the partials is visible (the partials are not all on one rank)";
      }
      // A rank without the shared expert and without pairs outputs exact zeros.
      for (int r = 1; r < 4; ++r) {
        if (ranks_used.count(r)) continue;
        for (uint16_t v : partials[static_cast<size_t>(r)]) ASSERT_EQ(bf16_bits_to_f32(v), 0.0f) << "rank " << r;
      }
    }
  }
}

TEST(ExpertParallelReference, ShardOnlyLayerGivesTheSamePartial) {
  const MoeConfig c = small_config();
  const MoeLayerWeights w = synthetic_layer(c, SyntheticSpec{0x77});
  std::vector<uint16_t> x;
  std::vector<float> logits;
  random_inputs(c, 33, 5, &x, &logits);
  for (int r = 0; r < 4; ++r) {
    std::vector<bool> which(static_cast<size_t>(c.num_experts), false);
    for (int64_t e = 4 * r; e < 4 * (r + 1); ++e) which[static_cast<size_t>(e)] = true;
    const MoeLayerWeights only = synthetic_layer(c, SyntheticSpec{0x77}, which);
    const MoeForwardResult a = moe_forward_reference(ep_partial_layer(w, 4, r), x.data(), 33, logits.data(), 1);
    const MoeForwardResult b = moe_forward_reference(ep_partial_layer(only, 4, r), x.data(), 33, logits.data(), 1);
    EXPECT_EQ(a.out, b.out) << "rank " << r;
    EXPECT_THROW((void)ep_partial_layer(only, 4, (r + 1) % 4), std::invalid_argument) << "rank " << r;
  }
}

}  // namespace
}  // namespace fp4moe::test
