// The engine's built-in tactic heuristic (src/engine/tactic_choice.cpp) on hand-made descriptors: the
// token width from the expected rows per expert, and among tiles of that width the first whose k per
// stage leaves at least four pipeline stages (the deepest such stage when the problem has fewer than 512
// work items, else the one with the most stages). The fallback family is the registry's (portable): it is chosen only when
// nothing else is usable.
#include <gtest/gtest.h>

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
  // A deep n8 tile registered second, as in the sm90 tactics.def.
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

TEST_F(HeuristicTest, WideRowsTakeTheLargestTileAndTheFallbackOnlyAlone) {
  EXPECT_EQ(choose(problem(6144, 1 << 20, 256)), "n128.k128");
  std::vector<const TacticDesc*> only_fallback{&descs.back()};
  EXPECT_EQ(heuristic_choice(only_fallback, problem(6144, 64, 256))->name, "fallback.n8");
  EXPECT_EQ(heuristic_choice({}, problem(6144, 64, 256)), nullptr);
}

}  // namespace
}  // namespace fp4moe::engine
