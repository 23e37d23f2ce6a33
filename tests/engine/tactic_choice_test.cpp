// The engine's built-in tactic heuristic (src/engine/tactic_choice.cpp) on hand-made descriptors: the
// token width of the lowest expected cost (expected_token_tile_cost: the token tiles an expert's
// Poisson-scattered rows take, times width + 67; a last wave counted whole where an op has fewer than two
// waves of items), and among tiles of that width the first whose k per stage leaves at least four
// pipeline stages (the deepest such stage when the problem has fewer than 512 work items, else the one
// with the most stages). The fallback family is the registry's (portable): it is chosen only when
// nothing else is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/tactic_choice.h"

namespace fp4moe::engine {
namespace {

TacticDesc desc(const std::string& name, const std::string& family, int n, int k, bool fallback = false) {
  TacticDesc d;
  d.name = name;
  d.family = family;
  d.tile_m = 128;
  d.tile_n = n;
  d.tile_k = k;
  d.is_fallback = fallback;
  return d;
}

// FC2 with n = 6144 output columns: 48 weight-row tiles of 128 per active expert.
GemmProblem problem(int64_t k, int64_t rows, int64_t experts, int64_t n = 6144) {
  GemmProblem p;
  p.op = GemmOp::kFc2;
  p.num_experts = experts;
  p.n = n;
  p.k = k;
  p.total_rows = p.max_rows_per_expert = rows;
  return p;
}

class HeuristicTest : public ::testing::Test {
 protected:
  // A deep n8 tile registered second (the rule, not the sm90 order: there the two-CTA k256 tile comes
  // first and wins both ways).
  std::vector<TacticDesc> descs{desc("n8.k128", "fast", 8, 128),  desc("n8.k256", "fast", 8, 256),
                                desc("n16.k128", "fast", 16, 128), desc("n16.k256", "fast", 16, 256),
                                desc("n128.k128", "fast", 128, 128), desc("fallback.n8", "portable", 8, 64, true)};
  std::string choose(const GemmProblem& p) {
    std::vector<const TacticDesc*> usable;
    for (const TacticDesc& d : descs) usable.push_back(&d);
    const TacticDesc* d = heuristic_choice(usable, p);
    return d ? d->name : "none";
  }
};

TEST_F(HeuristicTest, LongReductionTakesTheFirstTileOfTheWidth) {
  EXPECT_EQ(choose(problem(6144, 64, 256)), "n8.k128");   // 1 row per 4 experts
  EXPECT_EQ(choose(problem(2048, 512, 256)), "n8.k128");  // 2 rows per expert
  EXPECT_EQ(choose(problem(6144, 4096, 256)), "n16.k128");
}

TEST_F(HeuristicTest, FewWorkItemsTakeTheDeepestStageThatStillPipelines) {
  EXPECT_EQ(choose(problem(2048, 8, 256)), "n8.k256");      // T = 1, top-8: 8 experts x 48 tiles = 384 items
  EXPECT_EQ(choose(problem(1024, 8, 256)), "n8.k256");      // exactly 4 k256 stages
  EXPECT_EQ(choose(problem(768, 8, 256)), "n8.k128");       // 3 k256 stages: not enough
  EXPECT_EQ(choose(problem(256, 8, 256)), "n8.k128");       // the TP8 shard's FC2: 1 against 2 stages
  EXPECT_EQ(choose(problem(6144, 1, 1, 2048)), "n8.k256");  // a shared expert at T = 1: 16 items
  EXPECT_EQ(choose(problem(2048, 16, 256)), "n8.k128");     // 16 experts x 48 tiles = 768 items
  GemmProblem fc1 = problem(6144, 8, 256, 2048);            // FC1, n = I = 2048: 8 x 4096 / 128 = 256 items
  fc1.op = GemmOp::kFc1SwiGlu;
  EXPECT_EQ(choose(fc1), "n8.k256");
  fc1.total_rows = fc1.max_rows_per_expert = 64;            // T = 8: 64 x 32 = 2048 items
  EXPECT_EQ(choose(fc1), "n8.k128");
}

TEST_F(HeuristicTest, ShortReductionAvoidsTheDeepStage) {
  EXPECT_EQ(choose(problem(256, 64, 256)), "n8.k128");  // 1 k256 stage against 2 k128 stages
  EXPECT_EQ(choose(problem(48, 64, 256)), "n8.k128");   // no tile has a whole stage: the first one stays
}

TEST_F(HeuristicTest, TwoCtaTilesNeedOnlyOneStage) {
  // As in the sm90 tactics.def: the two-CTA k256 tile first, then the two-CTA k128 and one-CTA k256 ones.
  TacticDesc x2k256 = desc("n8.k256.x2", "fast", 8, 256), x2k128 = desc("n8.k128.x2", "fast", 8, 128),
             k256 = desc("n8.k256", "fast", 8, 256);
  x2k256.ctas_per_sm = x2k128.ctas_per_sm = 2;
  std::vector<const TacticDesc*> usable{&x2k256, &x2k128, &k256};
  EXPECT_EQ(heuristic_choice(usable, problem(256, 64, 256))->name, "n8.k256.x2");   // TP8 FC2: one stage is enough
  EXPECT_EQ(heuristic_choice(usable, problem(6144, 64, 256))->name, "n8.k256.x2");  // many items: the first
  EXPECT_EQ(heuristic_choice(usable, problem(2048, 8, 256))->name, "n8.k256.x2");   // few items: the deepest, first
  std::vector<const TacticDesc*> one_cta_first{&k256, &x2k128};
  EXPECT_EQ(heuristic_choice(one_cta_first, problem(256, 64, 256))->name, "n8.k128.x2");  // 1 one-CTA stage: not enough
}

TEST(TokenTileCost, CountsTheTilesOfPoissonRows) {
  EXPECT_EQ(expected_token_tile_cost(0.0, 0, 8), 0.0);
  // 8 rows on average: n8 splits 41% of the experts (P(r > 8) = 0.407), n16 almost none (P(r > 16) = 0.004).
  EXPECT_NEAR(expected_token_tile_cost(8.0, 0, 8) / (8 + kTokenTileOverheadColumns), 1.411, 0.002);
  EXPECT_NEAR(expected_token_tile_cost(8.0, 0, 16) / (16 + kTokenTileOverheadColumns), 1.0034, 0.001);
  // Capped rows: with at most 8 rows an expert never takes a second n8 tile (P(r > 0) = 1 - e^-8).
  EXPECT_NEAR(expected_token_tile_cost(8.0, 8, 8) / (8 + kTokenTileOverheadColumns), 1.0 - std::exp(-8.0), 1e-6);
  // Large means (exp(-mean) alone would underflow): about mean / width + 1/2 tiles.
  const double big = expected_token_tile_cost(1e5, 0, 128) / (128 + kTokenTileOverheadColumns);
  EXPECT_NEAR(big, 1e5 / 128 + 0.5, 0.05);
  EXPECT_NEAR(expected_token_tile_cost(1e7, 0, 128) / (128 + kTokenTileOverheadColumns), 1e7 / 128 + 0.5, 0.05);
  EXPECT_NEAR(expected_token_tile_cost(1e7, 4096, 128) / (128 + kTokenTileOverheadColumns), 32.5, 0.05);
}

TEST(HeuristicWidth, PicksTheWidthOfFewestExpectedTileCosts) {
  // As the sm90 table: n8 and n16 with one-CTA k256 and two-CTA k256 tiles, n32 and n64 with one-CTA
  // k256 tiles only, n128 with k128 and k64.
  std::vector<TacticDesc> d{desc("n8.k256", "fast", 8, 256),    desc("n8.k256.x2", "fast", 8, 256),
                            desc("n16.k256", "fast", 16, 256),  desc("n16.k256.x2", "fast", 16, 256),
                            desc("n128.k128", "fast", 128, 128), desc("n128.k64", "fast", 128, 64),
                            desc("n32.k256", "fast", 32, 256),  desc("n64.k256", "fast", 64, 256)};
  d[1].ctas_per_sm = d[3].ctas_per_sm = 2;
  d[0].tile_m = d[2].tile_m = d[4].tile_m = d[5].tile_m = d[6].tile_m = d[7].tile_m = 256;
  std::vector<const TacticDesc*> usable;
  for (const TacticDesc& x : d) usable.push_back(&x);
  auto pick = [&](int64_t k, int64_t rows, int64_t max_rows = 0) {
    GemmProblem p = problem(k, rows, 256);
    p.max_rows_per_expert = max_rows;
    return heuristic_choice(usable, p)->name;
  };
  // GLM-5's FC2 (K = 2048, 8 k256 stages) at T = 128 / 256 / 512 / 1024 / 2048 / 8192 (top-8, 256 experts).
  EXPECT_EQ(pick(2048, 1024), "n8.k256");     // 4 rows per expert
  EXPECT_EQ(pick(2048, 2048), "n16.k256");    // 8: sm90 step 46, n16 1.32 ms against n8 1.65
  EXPECT_EQ(pick(2048, 4096), "n32.k256");    // 16: n32 1.50 against n16 1.86
  EXPECT_EQ(pick(2048, 8192), "n64.k256");    // 32: n64 1.90 against n32 2.17
  EXPECT_EQ(pick(2048, 16384), "n64.k256");   // 64: n64 2.78 against n128 3.07
  EXPECT_EQ(pick(2048, 65536), "n128.k128");  // 256
  // A cap on the rows per expert: at most 8 rows never need more than one n8 tile.
  EXPECT_EQ(pick(2048, 4096, 8), "n8.k256");
  // K = 256 (the TP8 shard's FC2, one k256 stage): the width does not depend on the stages; within it the
  // two-CTA tiles pipeline one stage, and n32 / n64 have only their one-CTA k256 tile (sm90 step 46: the
  // fastest at 16 to 64 rows per expert even so).
  EXPECT_EQ(pick(256, 1024), "n8.k256.x2");
  EXPECT_EQ(pick(256, 2048), "n16.k256.x2");
  EXPECT_EQ(pick(256, 4096), "n32.k256");
  EXPECT_EQ(pick(256, 16384), "n64.k256");
  // Few waves (the SM count given): Mixtral's FC2 (8 experts, n = 4096: 16 m-tiles of 256, K = 14336) at
  // 64 rows per expert: n128's 128 items fill 132 SMs once, n64's ~190 twice, so n128; its FC1 (n = 2 x
  // 14336: 112 m-tiles, 1300 n64 items) stays on n64, and so does the FC2 without an SM count.
  GemmProblem fc2 = problem(14336, 512, 8, 4096);
  EXPECT_EQ(heuristic_choice(usable, fc2, 132)->name, "n128.k128");
  EXPECT_EQ(heuristic_choice(usable, fc2)->name, "n64.k256");
  GemmProblem fc1 = problem(4096, 512, 8, 14336);
  fc1.op = GemmOp::kFc1SwiGlu;
  EXPECT_EQ(heuristic_choice(usable, fc1, 132)->name, "n64.k256");
  // Many waves: GLM-5's FC2 at 64 rows per expert keeps n64 with the SM count.
  EXPECT_EQ(heuristic_choice(usable, problem(2048, 16384, 256), 132)->name, "n64.k256");
}

// A tile of one token per item (the sm90 e4m3 tile: width 1, so 1 + 67 per token tile, about the 9%
// shorter stream it measured against the n8 tile, docs/perf.md sm90 step 50) wins where an expert expects
// so few rows that the n8 tile's tiles cost more than one stream per row: GLM-5 (256 experts, top-8) at
// T = 1 to 4, not at T = 8 (64 rows: 0.25 x 68 = 17.0 against 0.221 x 75 = 16.6).
TEST(HeuristicWidth, OneTokenTilesOnlyForTheFewestRows) {
  std::vector<TacticDesc> d{desc("n8.k256", "fast", 8, 256), desc("n16.k256", "fast", 16, 256),
                            desc("n1.k256", "fast", 1, 256)};
  for (TacticDesc& x : d) x.tile_m = 256;
  std::vector<const TacticDesc*> usable;
  for (const TacticDesc& x : d) usable.push_back(&x);
  auto pick = [&](int64_t k, int64_t rows, int sms = 0) { return heuristic_choice(usable, problem(k, rows, 256), sms)->name; };
  for (int sms : {0, 132}) {
    SCOPED_TRACE(sms);
    EXPECT_EQ(pick(2048, 8, sms), "n1.k256");    // T = 1
    EXPECT_EQ(pick(6144, 16, sms), "n1.k256");   // T = 2
    EXPECT_EQ(pick(2048, 32, sms), "n1.k256");   // T = 4
    EXPECT_EQ(pick(2048, 64, sms), "n8.k256");   // T = 8
    EXPECT_EQ(pick(2048, 1024, sms), "n8.k256");
  }
  // A shared expert alone (one expert holding every token): one row, then two; with the SM count, 8 rows
  // stay on n8 although its 16 items are an eighth of a wave (the few-waves correction does not apply to
  // one-token tiles: 128 of them would read the weights 8 times).
  for (int sms : {0, 132}) {
    SCOPED_TRACE(sms);
    EXPECT_EQ(heuristic_choice(usable, problem(6144, 1, 1, 2048), sms)->name, "n1.k256");
    EXPECT_EQ(heuristic_choice(usable, problem(6144, 2, 1, 2048), sms)->name, "n8.k256");
    EXPECT_EQ(heuristic_choice(usable, problem(6144, 8, 1, 2048), sms)->name, "n8.k256");
  }
  // A short reduction (the TP8 shard's FC2, K = 256: one k256 stage) keeps n8.
  EXPECT_EQ(pick(256, 8), "n8.k256");
  EXPECT_EQ(pick(1024, 8), "n1.k256");  // exactly four stages
  // Only one-token tiles: they are the choice whatever the rows.
  std::vector<const TacticDesc*> only{&d[2]};
  EXPECT_EQ(heuristic_choice(only, problem(2048, 1024, 256))->name, "n1.k256");
}

// A resident tactic (schedule "resident", the sm90 cc tactic: one CTA per row and 16 SwiGLU columns) where
// its CTAs, rows x width / 16, fill at most one wave: the TP8 shard at T = 1 (8 rows x 256 / 16 = 128 CTAs on
// 132 SMs), for FC1 (width N) and FC2 (width K); not GLM-5 at T = 1 (8 x 128 = 1024 CTAs), not without an SM
// count, and never the width rule's pick (it is removed from the pool first).
TEST(HeuristicResident, OnlyWhereItsCtasFillOneWave) {
  std::vector<TacticDesc> d{desc("n8.k256", "fast", 8, 256), desc("n1.k256", "fast", 1, 256),
                            desc("resident", "fast", 1, 512)};
  d[2].schedule = "resident";
  d[2].tile_m = 32;  // 16 gate and 16 up rows: 16 SwiGLU columns a CTA
  std::vector<const TacticDesc*> usable;
  for (const TacticDesc& x : d) usable.push_back(&x);
  const GemmProblem tp8_fc1{GemmOp::kFc1SwiGlu, 256, 256, 6144, 8, 1}, tp8_fc2{GemmOp::kFc2, 256, 6144, 256, 8, 1};
  EXPECT_EQ(heuristic_choice(usable, tp8_fc1, 132)->name, "resident");
  EXPECT_EQ(heuristic_choice(usable, tp8_fc2, 132)->name, "resident");
  EXPECT_EQ(heuristic_choice(usable, tp8_fc1, 0)->name, "n1.k256");
  EXPECT_EQ(heuristic_choice(usable, tp8_fc1, 100)->name, "n1.k256");     // 128 CTAs on 100 SMs: two waves
  const GemmProblem glm_fc1{GemmOp::kFc1SwiGlu, 256, 2048, 6144, 8, 1};
  EXPECT_EQ(heuristic_choice(usable, glm_fc1, 132)->name, "n1.k256");
  EXPECT_EQ(heuristic_choice(usable, problem(2048, 1024, 256), 132)->name, "n8.k256");
  // Alone in the pool it is still the choice (the engine's check has passed).
  std::vector<const TacticDesc*> only{&d[2]};
  EXPECT_EQ(heuristic_choice(only, glm_fc1, 132)->name, "resident");
}

TEST_F(HeuristicTest, WideRowsTakeTheLargestTileAndTheFallbackOnlyAlone) {
  EXPECT_EQ(choose(problem(6144, 1 << 20, 256)), "n128.k128");
  std::vector<const TacticDesc*> only_fallback{&descs.back()};
  EXPECT_EQ(heuristic_choice(only_fallback, problem(6144, 64, 256))->name, "fallback.n8");
  EXPECT_EQ(heuristic_choice({}, problem(6144, 64, 256)), nullptr);
}

// The chained FC1 -> FC2 launch is preferred while the expected weight traffic of the two GEMMs stays
// below kChainMaxBytes and the active experts expect at most 2 rows: GLM-5 (H 6144, I 2048, 256
// experts, top-8) at T = 1 and 8, its TP8 shard (I = 256) up to T = 32; not GLM-5 at T = 32 and beyond,
// the TP8 shard at T = 128, nor prefill.
TEST(ChainTest, SmallTrafficChainsLargeDoesNot) {
  auto fc1 = [](int64_t inter, int64_t tokens) {
    return GemmProblem{GemmOp::kFc1SwiGlu, 256, inter, 6144, tokens * 8, tokens};
  };
  auto fc2 = [](int64_t inter, int64_t tokens) { return GemmProblem{GemmOp::kFc2, 256, 6144, inter, tokens * 8, tokens}; };
  // T = 1: about 8 active experts x 3 x 2048 x 6144 weights x 0.5625 bytes = 0.17 GB.
  EXPECT_NEAR(expected_touched_bytes(fc1(2048, 1), fc2(2048, 1)), 0.167e9, 0.01e9);
  EXPECT_TRUE(prefer_chained(fc1(2048, 1), fc2(2048, 1)));
  EXPECT_TRUE(prefer_chained(fc1(2048, 8), fc2(2048, 8)));
  EXPECT_FALSE(prefer_chained(fc1(2048, 32), fc2(2048, 32)));
  EXPECT_FALSE(prefer_chained(fc1(2048, 8192), fc2(2048, 8192)));
  for (int64_t t : {1, 8, 32}) EXPECT_TRUE(prefer_chained(fc1(256, t), fc2(256, t))) << "TP8 T=" << t;
  EXPECT_FALSE(prefer_chained(fc1(256, 128), fc2(256, 128)));  // 4 rows per active expert
  EXPECT_FALSE(prefer_chained(fc1(2048, 0), fc2(2048, 0)));  // nothing to run
  // One expert holding all T rows: chained for a single row, not for many.
  const GemmProblem s1{GemmOp::kFc1SwiGlu, 1, 2048, 6144, 1, 1}, s2{GemmOp::kFc2, 1, 6144, 2048, 1, 1};
  EXPECT_TRUE(prefer_chained(s1, s2));
  GemmProblem b1 = s1, b2 = s2;
  b1.total_rows = b2.total_rows = 64;
  EXPECT_FALSE(prefer_chained(b1, b2));
}

}  // namespace
}  // namespace fp4moe::engine
