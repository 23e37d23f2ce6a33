// The GLM-5 layer (H=6144, I=2048, E=256, top-8, sigmoid + bias, shared expert) generated on the device,
// against the CPU reference on the same synthetic weights at T = 1, 7, 64 and 513 (the reference runs on
// 64 random tokens when T > 64), plus CUDA-graph replays equal to the eager forward bit for bit. Run twice:
// with the engine's own tactic choice and with the portable family alone; the TP8 shard (I / 8) once,
// with the engine's choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>

#include "engine_test_util.h"
#include "fp4moe/reference.h"

namespace fp4moe::test {
namespace {

struct Case {
  int64_t T;
  std::vector<uint16_t> x;
  std::vector<float> logits;
  std::vector<int64_t> subset;  // tokens compared with the reference
};

void check_engine(MoeEngine& engine, const MoeLayerWeights& ref, const std::vector<Case>& cases, const char* label) {
  const MoeConfig& cfg = engine.config();
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "GLM-5 (" << label << ") T=" << c.T);
    const LayerRun r = compare_forward(engine, ref, c.T, c.x, &c.logits, c.subset);
    EXPECT_LE(r.rel_l2, 1e-2);
    EXPECT_EQ(r.id_mismatches, 0);
    EXPECT_LE(r.weight_rel_err, 1e-5);
    std::printf("  glm5 %-9s T=%-4lld tokens compared=%-3lld fc1=%s fc2=%s rel_l2=%.3e\n", label,
                static_cast<long long>(c.T), static_cast<long long>(r.compared), engine.fc1_tactic_for(c.T).c_str(),
                engine.fc2_tactic_for(c.T).c_str(), r.rel_l2);
  }
  for (int64_t T : {1, 64, 513}) {
    const int64_t mism = graph_replay_mismatches(engine, cfg, T, 900 + T);
    EXPECT_EQ(mism, 0) << label << " T=" << T;
    std::printf("  glm5 %-9s graph replay T=%lld: %lld elements differ from eager over 2 replays\n", label,
                static_cast<long long>(T), static_cast<long long>(mism));
  }
}

// T = 1, 7, 64 and 513 tokens (or those of `Ts`), each with the subset of tokens the reference runs on;
// `which` marks the experts those subsets route to (only their weights are generated for the reference).
std::vector<Case> glm5_cases(const MoeConfig& cfg, const SyntheticSpec& spec, std::vector<bool>* which,
                             const std::vector<int64_t>& Ts = {1, 7, 64, 513}) {
  const int64_t H = cfg.hidden, E = cfg.num_experts;
  std::vector<Case> cases;
  const std::vector<float> bias = synthetic_correction_bias(cfg, spec);
  which->assign(static_cast<size_t>(E), false);
  for (int64_t T : Ts) {
    Case c{T, random_bf16(static_cast<size_t>(T * H), 100 + T), random_f32(static_cast<size_t>(T * E), 200 + T), {}};
    for (int64_t t = 0; t < T; ++t) c.subset.push_back(t);
    if (T > 64) {
      std::mt19937_64 rng(300 + T);
      std::shuffle(c.subset.begin(), c.subset.end(), rng);
      c.subset.resize(64);
      std::sort(c.subset.begin(), c.subset.end());
    }
    std::vector<float> ls;
    for (int64_t t : c.subset) ls.insert(ls.end(), c.logits.begin() + t * E, c.logits.begin() + (t + 1) * E);
    const RoutingResult r = route(ls.data(), cfg.has_correction_bias ? bias.data() : nullptr,
                                  static_cast<int64_t>(c.subset.size()), cfg);
    for (int32_t e : r.ids) (*which)[static_cast<size_t>(e)] = true;
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(Glm5, LayerAgainstReference) {
  const MoeConfig cfg = glm5_config();
  const SyntheticSpec spec{0x5eed};
  std::vector<bool> which;
  const std::vector<Case> cases = glm5_cases(cfg, spec, &which);
  const MoeLayerWeights ref = synthetic_layer(cfg, spec, which);  // only the experts the subsets use
  // The engine's own choice (a specialised family when one passes), then the portable family alone.
  for (const bool portable_only : {false, true}) {
    EngineOptions eo;
    eo.max_tokens = 513;
    if (portable_only)
      for (const TacticDesc& d : all_tactic_descs())
        if (d.family != "portable") eo.excluded_tactics.push_back(d.name);
    std::unique_ptr<MoeEngine> engine;
    const Status st = MoeEngine::create_synthetic(cfg, spec, eo, &engine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    check_engine(*engine, ref, cases, portable_only ? "portable" : "heuristic");
  }
}

// The TP8 shard (I / 8 = 256 per expert, the shared expert likewise), with the engine's own choice: its
// FC2 (K = 256) has one-stage work items by the thousand at T = 7 and 64 (on the sm90 family, chained to
// FC1 at T <= 32).
TEST(Glm5, Tp8ShardAgainstReference) {
  MoeConfig cfg = glm5_config();
  cfg.inter /= 8;
  cfg.shared_inter /= 8;
  cfg.name += "-tp8";
  const SyntheticSpec spec{0x5eed};
  std::vector<bool> which;
  const std::vector<Case> cases = glm5_cases(cfg, spec, &which);
  const MoeLayerWeights ref = synthetic_layer(cfg, spec, which);
  EngineOptions eo;
  eo.max_tokens = 513;
  std::unique_ptr<MoeEngine> engine;
  const Status st = MoeEngine::create_synthetic(cfg, spec, eo, &engine);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  check_engine(*engine, ref, cases, "tp8");
}

// The TP8 shard at T = 1 on the sm90 resident tactic, forced (by default the fused front end runs before its
// chained launch, the shared expert is folded in as the last expert and spread over the 8 routed rows' 128
// CTAs, FC2's fp32 rows left to finalize), against the reference; then with the launch routing the token
// itself (FP4MOE_ROUTE_IN_CHAIN=1), without the spread form (FP4MOE_SM90_CC_SPREAD=0: 9 rows of 16 CTAs, 144
// on 132 SMs) and with the launch converting its rows (FP4MOE_CHAIN_FP32_ROWS=0). No graph
// check: its FC2 adds partial rows with atomics, so a replay may differ from the eager forward in the last
// bf16 bit (README, FP4MOE_SM90_CC). Skipped where it cannot run (no sm_90a device).
TEST(Glm5, Tp8ShardResidentTacticAtOneToken) {
  MoeConfig cfg = glm5_config();
  cfg.inter /= 8;
  cfg.shared_inter /= 8;
  cfg.name += "-tp8";
  const std::string name = "sm90.w4f16.m32n1k512.cc";
  const std::vector<std::string> usable = tactics_for_layer(cfg, 1, true);
  if (std::find(usable.begin(), usable.end(), name) == usable.end()) GTEST_SKIP() << name << " cannot run here";
  const SyntheticSpec spec{0x5eed};
  std::vector<bool> which;
  const std::vector<Case> cases = glm5_cases(cfg, spec, &which, {1});
  const MoeLayerWeights ref = synthetic_layer(cfg, spec, which);
  EngineOptions eo;
  eo.max_tokens = 1;
  eo.fc1_tactic = eo.fc2_tactic = name;
  const Case& c = cases[0];
  const std::pair<const char*, const char*> envs[] = {
      {"", ""}, {"FP4MOE_ROUTE_IN_CHAIN", "1"}, {"FP4MOE_SM90_CC_SPREAD", "0"}, {"FP4MOE_CHAIN_FP32_ROWS", "0"}};
  for (const auto& [env, value] : envs) {
    const std::string what = *env ? std::string(env) + "=" + value : std::string("defaults");
    SCOPED_TRACE(what);
    const char* prev = *env ? std::getenv(env) : nullptr;
    const std::string saved = prev ? prev : "";
    if (*env) ::setenv(env, value, 1);  // read at creation
    std::unique_ptr<MoeEngine> engine;
    const Status st = MoeEngine::create_synthetic(cfg, spec, eo, &engine);
    if (*env) {
      if (prev) ::setenv(env, saved.c_str(), 1); else ::unsetenv(env);
    }
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(engine->fc1_tactic_for(1), name);
    for (int rep = 0; rep < 2; ++rep) {
      const LayerRun r = compare_forward(*engine, ref, c.T, c.x, &c.logits, c.subset);
      EXPECT_LE(r.rel_l2, 1e-2);
      EXPECT_EQ(r.id_mismatches, 0);
      EXPECT_LE(r.weight_rel_err, 1e-5);
      std::printf("  glm5 tp8 T=1 %s (%s) run %d rel_l2=%.3e\n", name.c_str(), what.c_str(), rep, r.rel_l2);
    }
  }
}

}  // namespace
}  // namespace fp4moe::test
