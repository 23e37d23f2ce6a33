// Expert parallelism on the GPU: every rank r of ep_size N runs MoeEngine with EngineOptions{ep_size N,
// ep_rank r} on the same inputs, outputs poisoned (0xD5) first. Checked per rank:
//   - no output element left unwritten; the ForwardOutputs ids are the reference's global ids, exactly;
//   - the rank's partial against the CPU reference's partial (moe_forward_reference on the layer with
//     the other ranks' experts zeroed and the shared expert on rank 0 only, tests/engine/ep_test_util.h):
//     relative L2 <= 1e-2;
// and over the ranks: the partials summed in fp32 against the CPU reference's whole layer, relative
// L2 <= 1e-2 (what the combine all-reduce gives). Small layers: E = 16, top-4, an NVFP4 shared expert,
// T in {1, 7, 64}, logits given and computed from the router weight, with the heuristic and with every
// tactic that can run the layer forced by name (both families on an H100/H200); and a GLM-5-like ratio,
// E = 64, top-8, 8 groups, ep_size 8. Also: create_synthetic, create from the whole host layer and create
// from a host layer that materialises only the rank's experts give the same bytes; a CUDA-graph replay
// equals the eager forward; bad options are kInvalidArgument errors naming the values. SanitizeSmall is
// the small case for compute-sanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine_test_util.h"
#include "ep_test_util.h"
#include "fp4moe/device_caps.h"
#include "fp4moe/engine.h"
#include "fp4moe/reference.h"

namespace fp4moe::test {
namespace {

MoeConfig sigmoid_config(const char* name, int64_t H, int64_t I, int64_t E, int64_t topk, int64_t groups,
                         int64_t keep, int64_t shared) {
  MoeConfig c = small_config(name, H, I, E, topk);
  c.routing = RoutingKind::kSigmoidGrouped;
  c.n_group = groups;
  c.topk_group = keep;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.has_correction_bias = true;
  c.n_shared_experts = shared > 0 ? 1 : 0;
  c.shared_inter = shared;
  c.validate(name);
  return c;
}

struct InputCase {
  int64_t T = 0;
  bool from_router = false;
  std::vector<uint16_t> x;
  std::vector<float> logits;
  MoeForwardResult full;                    // CPU reference, whole layer
  std::vector<std::vector<uint16_t>> part;  // CPU reference partial per rank
};

std::vector<InputCase> make_inputs(const MoeLayerWeights& w, int ep, const std::vector<int64_t>& tokens,
                                   bool with_router_case) {
  const MoeConfig& c = w.config;
  std::vector<MoeLayerWeights> rank_layers;
  for (int r = 0; r < ep; ++r) rank_layers.push_back(ep_partial_layer(w, ep, r));
  std::vector<InputCase> v;
  for (int64_t T : tokens)
    for (bool router : {false, true}) {
      if (router && (!with_router_case || T != tokens[tokens.size() / 2])) continue;
      InputCase ic;
      ic.T = T;
      ic.from_router = router;
      ic.x = random_bf16(static_cast<size_t>(T * c.hidden), 900 + T);
      ic.logits = random_f32(static_cast<size_t>(T * c.num_experts), 901 + T);
      const float* lg = router ? nullptr : ic.logits.data();
      ic.full = moe_forward_reference(w, ic.x.data(), T, lg);
      for (const MoeLayerWeights& rl : rank_layers) ic.part.push_back(moe_forward_reference(rl, ic.x.data(), T, lg).out);
      v.push_back(std::move(ic));
    }
  return v;
}

struct RankErrors {
  double worst_partial = 0;  // max over ranks of rel L2(partial, CPU partial)
  double sum = 0;            // rel L2(sum of the partials, CPU whole layer)
};

// Runs every rank's engine on `ic` and checks the partials and their sum.
RankErrors check_ranks(std::vector<std::unique_ptr<MoeEngine>>& engines, const InputCase& ic) {
  RankErrors errs;
  const MoeConfig& c = engines[0]->config();
  const int64_t T = ic.T, H = c.hidden, K = c.topk;
  Dev d_x = Dev::from(ic.x), d_l = Dev::from(ic.logits), d_out(static_cast<size_t>(T * H) * 2);
  std::vector<std::vector<uint16_t>> got;
  for (size_t r = 0; r < engines.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    d_out.poison();
    ForwardOutputs fo;
    const Status st = engines[r]->forward(d_x.as<uint16_t>(), T, ic.from_router ? nullptr : d_l.as<float>(),
                                          d_out.as<uint16_t>(), nullptr, &fo);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got.push_back(d_out.download<uint16_t>(static_cast<size_t>(T * H)));
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> wts(static_cast<size_t>(T * K));
    EXPECT_EQ(cudaMemcpy(ids.data(), fo.topk_ids, ids.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(wts.data(), fo.topk_weights, wts.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(ids, ic.full.routing.ids) << "ForwardOutputs ids must be the global routing";
    double werr = 0;
    for (size_t i = 0; i < wts.size(); ++i)
      werr = std::max(werr, std::fabs(wts[i] - ic.full.routing.weights[i]) /
                                std::max(1e-30, std::fabs(double(ic.full.routing.weights[i]))));
    EXPECT_LE(werr, 1e-5);
    EXPECT_EQ(count_poison(got.back()), 0u) << "output elements left unwritten";
    const double e = rel_l2_bf16(got.back(), ic.part[r]);
    EXPECT_LE(e, 1e-2) << "partial vs the CPU partial";
    errs.worst_partial = std::max(errs.worst_partial, e);
  }
  errs.sum = rel_l2_f32_vs_bf16(sum_partials_f32(got), ic.full.out);
  EXPECT_LE(errs.sum, 1e-2) << "sum of the partials vs the whole layer";
  return errs;
}

std::vector<std::unique_ptr<MoeEngine>> make_ranks(const MoeLayerWeights& w, int ep, int64_t max_tokens,
                                                   const std::string& tactic) {
  std::vector<std::unique_ptr<MoeEngine>> engines;
  for (int r = 0; r < ep; ++r) {
    EngineOptions eo;
    eo.max_tokens = max_tokens;
    eo.ep_size = ep;
    eo.ep_rank = r;
    eo.fc1_tactic = eo.fc2_tactic = tactic;
    std::unique_ptr<MoeEngine> e;
    const Status st = MoeEngine::create(w, eo, &e);
    EXPECT_TRUE(st.is_ok()) << "rank " << r << " tactic '" << tactic << "': " << st.to_string();
    if (!st.is_ok()) return {};
    engines.push_back(std::move(e));
  }
  return engines;
}

std::string family_of(const std::string& name) {
  for (const TacticDesc& d : all_tactic_descs())
    if (d.name == name) return d.family;
  return "?";
}

TEST(ExpertParallel, EveryRankEveryTactic) {
  const MoeConfig cfg = sigmoid_config("ep4-small", 128, 96, 16, 4, 4, 2, 64);
  const MoeLayerWeights w = synthetic_layer(cfg, SyntheticSpec{0xE9});
  const std::vector<InputCase> inputs = make_inputs(w, 4, {1, 7, 64}, true);
  std::vector<std::string> names = {""};
  for (const std::string& n : tactics_for_layer(cfg, 64, true)) names.push_back(n);
  std::set<std::string> families;
  for (const std::string& name : names) {
    auto engines = make_ranks(w, 4, 64, name);
    ASSERT_EQ(engines.size(), 4u);
    if (!name.empty()) families.insert(family_of(name));
    for (const InputCase& ic : inputs) {
      SCOPED_TRACE(::testing::Message() << "T=" << ic.T << (ic.from_router ? " router" : " logits") << " tactic "
                                        << (name.empty() ? "heuristic" : name));
      const RankErrors e = check_ranks(engines, ic);
      std::printf("  ep4 T=%-3lld %-6s %-34s worst partial rel_l2=%.2e, sum of partials rel_l2=%.2e\n",
                  static_cast<long long>(ic.T), ic.from_router ? "router" : "logits",
                  name.empty() ? ("heuristic: " + engines[0]->fc1_tactic_for(ic.T)).c_str() : name.c_str(),
                  e.worst_partial, e.sum);
    }
  }
  EXPECT_TRUE(families.count("portable")) << "a portable tactic ran";
  bool sm90_here = false;
  for (const TacticDesc& d : all_tactic_descs())
    sm90_here |= d.family == "sm90" && find_tactic(d.name) != nullptr && query_device_caps(0).cc() == 90;
  if (sm90_here) {
    EXPECT_TRUE(families.count("sm90")) << "an sm90 tactic ran on this sm_90 device";
  }
}

TEST(ExpertParallel, Glm5RatioEp8) {
  // GLM-5's ratios (top-8 of 256 in 8 groups keeping 4; EP8 holds 32 experts) scaled down to E = 64.
  const MoeConfig cfg = sigmoid_config("ep8-glm-like", 256, 128, 64, 8, 8, 4, 128);
  const MoeLayerWeights w = synthetic_layer(cfg, SyntheticSpec{0x61});
  const std::vector<InputCase> inputs = make_inputs(w, 8, {1, 8, 200}, false);
  auto engines = make_ranks(w, 8, 256, "");
  ASSERT_EQ(engines.size(), 8u);
  for (const InputCase& ic : inputs) {
    SCOPED_TRACE(::testing::Message() << "T=" << ic.T);
    const RankErrors e = check_ranks(engines, ic);
    std::printf("  ep8 T=%-3lld heuristic %s: worst partial rel_l2=%.2e, sum of partials rel_l2=%.2e\n",
                static_cast<long long>(ic.T), engines[0]->fc1_tactic_for(ic.T).c_str(), e.worst_partial, e.sum);
  }
}

TEST(ExpertParallel, SanitizeSmall) {
  // A small run for compute-sanitizer (memcheck / racecheck): the heuristic and the portable fallback
  // family's first tactic, every rank of ep_size 4, T = 7 and 64.
  const MoeConfig cfg = sigmoid_config("ep4-small", 128, 96, 16, 4, 4, 2, 64);
  const MoeLayerWeights w = synthetic_layer(cfg, SyntheticSpec{0xE9});
  const std::vector<InputCase> inputs = make_inputs(w, 4, {7, 64}, false);
  std::string portable;
  for (const std::string& n : tactics_for_layer(cfg, 64, true))
    if (portable.empty() && family_of(n) == "portable") portable = n;
  ASSERT_FALSE(portable.empty());
  for (const std::string& name : {std::string(), portable}) {
    auto engines = make_ranks(w, 4, 64, name);
    ASSERT_EQ(engines.size(), 4u);
    for (const InputCase& ic : inputs) {
      SCOPED_TRACE(::testing::Message() << "T=" << ic.T << " tactic " << (name.empty() ? "heuristic" : name));
      (void)check_ranks(engines, ic);
    }
  }
}

TEST(ExpertParallel, SyntheticAndShardOnlyWeightsMatch) {
  const MoeConfig cfg = sigmoid_config("ep4-small", 128, 96, 16, 4, 4, 2, 64);
  const SyntheticSpec spec{0xE9};
  const MoeLayerWeights whole = synthetic_layer(cfg, spec);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    std::vector<bool> which(16, false);
    for (int e = 4 * r; e < 4 * r + 4; ++e) which[static_cast<size_t>(e)] = true;
    const MoeLayerWeights only = synthetic_layer(cfg, spec, which);
    EngineOptions eo;
    eo.max_tokens = 33;
    eo.ep_size = 4;
    eo.ep_rank = r;
    std::unique_ptr<MoeEngine> a, b, c;
    ASSERT_TRUE(MoeEngine::create(whole, eo, &a).is_ok());
    Status st = MoeEngine::create(only, eo, &b);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    st = MoeEngine::create_synthetic(cfg, spec, eo, &c);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (bool router : {false, true}) {
      const std::vector<uint16_t> oa = forward_once(*a, cfg, 33, 71, router);
      const std::vector<uint16_t> ob = forward_once(*b, cfg, 33, 71, router);
      const std::vector<uint16_t> oc = forward_once(*c, cfg, 33, 71, router);
      EXPECT_EQ(oa, ob) << "shard-only host layer, router=" << router;
      EXPECT_EQ(oa, oc) << "device-generated synthetic shard, router=" << router;
      EXPECT_EQ(count_poison(oa), 0u);
    }
    // A device engine holds only its shard: the rank's weights are about a quarter of the routed ones.
    EngineOptions whole_opts = eo;
    whole_opts.ep_size = 1;
    whole_opts.ep_rank = 0;
    std::unique_ptr<MoeEngine> full;
    ASSERT_TRUE(MoeEngine::create(whole, whole_opts, &full).is_ok());
    EXPECT_LT(a->weight_bytes(), full->weight_bytes() / 2) << a->weight_bytes() << " vs " << full->weight_bytes();
  }
}

TEST(ExpertParallel, GraphReplayBitwise) {
  const MoeConfig cfg = sigmoid_config("ep4-small", 128, 96, 16, 4, 4, 2, 64);
  const MoeLayerWeights w = synthetic_layer(cfg, SyntheticSpec{0xE9});
  auto engines = make_ranks(w, 4, 64, "");
  ASSERT_EQ(engines.size(), 4u);
  for (int r : {0, 3}) EXPECT_EQ(graph_replay_mismatches(*engines[static_cast<size_t>(r)], cfg, 64, 17 + r), 0) << r;
}

TEST(ExpertParallel, BadOptions) {
  const MoeConfig cfg = sigmoid_config("ep4-small", 128, 96, 16, 4, 4, 2, 64);
  const MoeLayerWeights w = synthetic_layer(cfg, SyntheticSpec{0xE9});
  auto expect_invalid = [&](int size, int rank, const std::string& word) {
    EngineOptions eo;
    eo.max_tokens = 8;
    eo.ep_size = size;
    eo.ep_rank = rank;
    std::unique_ptr<MoeEngine> e;
    for (int synthetic = 0; synthetic < 2; ++synthetic) {
      const Status st = synthetic ? MoeEngine::create_synthetic(cfg, SyntheticSpec{0xE9}, eo, &e)
                                  : MoeEngine::create(w, eo, &e);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
      EXPECT_EQ(e, nullptr);
    }
  };
  expect_invalid(3, 0, "ep_size = 3");
  expect_invalid(0, 0, "ep_size = 0");
  expect_invalid(4, 4, "ep_rank = 4");
  expect_invalid(4, -1, "ep_rank = -1");
  // Rank 1's experts missing from the host layer: the error names the expert and the shard.
  std::vector<bool> which(16, false);
  for (int e = 0; e < 4; ++e) which[static_cast<size_t>(e)] = true;
  const MoeLayerWeights rank0_only = synthetic_layer(cfg, SyntheticSpec{0xE9}, which);
  EngineOptions eo;
  eo.max_tokens = 8;
  eo.ep_size = 4;
  eo.ep_rank = 1;
  std::unique_ptr<MoeEngine> e;
  const Status st = MoeEngine::create(rank0_only, eo, &e);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("expert 4"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[4, 8)"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fp4moe::test
