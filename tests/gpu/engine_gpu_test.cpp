// The whole MoE forward on the GPU against the CPU reference (moe_forward_reference on the same weights):
// a matrix of small shapes (T = 0 and 1, E = 1, top-1, experts with no tokens, K = 16 x odd, N not a
// multiple of any tile, both routing families, no / NVFP4 / bf16 shared expert, logits given or computed
// from the router weight), for every registered tactic forced and for the built-in heuristic. Outputs
// are poisoned (0xD5) before every run. Relative L2 <= 1e-2 per layer; routing ids must equal the
// reference's exactly. Also: device-generated synthetic weights equal host-uploaded ones bit for bit,
// a CUDA-graph replay equals the eager forward bit for bit, the sm90 chained launch that routes a decode
// batch itself equals the separate front end bit for bit, the sm90 resident tactic's forwards match the
// reference, and bad inputs return errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "engine_test_util.h"
#include "fp4moe/reference.h"

namespace fp4moe::test {
namespace {

struct LayerCase {
  std::string name;
  MoeConfig cfg;
  std::vector<int64_t> tokens;
  bool shared_bf16 = false;
  bool logits_from_router = false;
};

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> v;
  {
    LayerCase c{"softmax", small_config("softmax", 64, 48, 4, 2), {0, 1, 5, 37}};
    c.cfg.norm_topk_prob = true;
    v.push_back(c);
  }
  {
    LayerCase c{"sigmoid-grouped-shared", small_config("sigmoid-shared", 80, 48, 8, 3), {1, 6, 33}};
    c.cfg.routing = RoutingKind::kSigmoidGrouped;
    c.cfg.n_group = 4;
    c.cfg.topk_group = 2;
    c.cfg.norm_topk_prob = true;
    c.cfg.routed_scaling_factor = 2.5f;
    c.cfg.has_correction_bias = true;
    c.cfg.n_shared_experts = 1;
    c.cfg.shared_inter = 32;
    v.push_back(c);
  }
  {
    LayerCase c{"single-expert-top1", small_config("e1", 48, 16, 1, 1), {0, 1, 9}};
    v.push_back(c);
  }
  {
    LayerCase c{"sparse-top1", small_config("sparse", 96, 80, 16, 1), {3, 20}};
    c.cfg.routing = RoutingKind::kSigmoidGrouped;
    v.push_back(c);
  }
  {
    LayerCase c{"bf16-shared", small_config("bf16-shared", 64, 32, 4, 2), {1, 17}};
    c.cfg.routing = RoutingKind::kSigmoidGrouped;
    c.cfg.n_group = 2;
    c.cfg.topk_group = 1;
    c.cfg.n_shared_experts = 1;
    c.cfg.shared_inter = 48;
    c.shared_bf16 = true;
    v.push_back(c);
  }
  {
    LayerCase c{"router-weight", small_config("router", 64, 48, 4, 2), {7}};
    c.logits_from_router = true;
    v.push_back(c);
  }
  return v;
}

MoeLayerWeights host_layer(const LayerCase& lc) {
  MoeLayerWeights w = synthetic_layer(lc.cfg, SyntheticSpec{0x1234});
  if (lc.shared_bf16) w.shared = random_bf16_expert(lc.cfg.hidden, lc.cfg.shared_inter, 99);
  return w;
}

void run_matrix(const std::vector<LayerCase>& list, bool every_tactic) {
  int runs = 0;
  for (const LayerCase& lc : list) {
    const MoeLayerWeights w = host_layer(lc);
    int64_t max_t = 1;
    for (int64_t t : lc.tokens) max_t = std::max(max_t, t);
    std::vector<std::string> names = {""};  // the heuristic
    if (every_tactic)
      for (const std::string& n : tactics_for_layer(lc.cfg, max_t, w.shared && !lc.shared_bf16)) names.push_back(n);
    for (const std::string& name : names) {
      EngineOptions eo;
      eo.max_tokens = max_t;
      eo.fc1_tactic = eo.fc2_tactic = name;
      std::unique_ptr<MoeEngine> engine;
      const Status st = MoeEngine::create(w, eo, &engine);
      ASSERT_TRUE(st.is_ok()) << lc.name << " tactic '" << name << "': " << st.to_string();
      for (int64_t T : lc.tokens) {
        SCOPED_TRACE(::testing::Message() << lc.name << " T=" << T << " tactic=" << (name.empty() ? "heuristic" : name));
        const LayerRun r = run_and_compare(*engine, w, T, 500 + T, lc.logits_from_router);
        EXPECT_LE(r.rel_l2, 1e-2);
        EXPECT_EQ(r.id_mismatches, 0);
        EXPECT_LE(r.weight_rel_err, 1e-5);
        std::printf("  %-24s T=%-3lld %-32s rel_l2=%.2e\n", lc.name.c_str(), static_cast<long long>(T),
                    name.empty() ? (std::string("heuristic: ") + engine->fc1_tactic_for(T)).c_str() : name.c_str(),
                    r.rel_l2);
        ++runs;
      }
    }
  }
  EXPECT_GT(runs, 0);
}

TEST(Small, EngineMatrix) { run_matrix(layer_cases(), /*every_tactic=*/true); }

TEST(Small, SyntheticDeviceEqualsHost) {
  // create_synthetic generates the layer on the device; create uploads the host generator's bytes.
  const LayerCase lc = layer_cases()[1];
  const MoeLayerWeights w = host_layer(lc);
  EngineOptions eo;
  eo.max_tokens = 33;
  std::unique_ptr<MoeEngine> a, b;
  ASSERT_TRUE(MoeEngine::create(w, eo, &a).is_ok());
  ASSERT_TRUE(MoeEngine::create_synthetic(lc.cfg, SyntheticSpec{0x1234}, eo, &b).is_ok());
  for (bool router : {false, true}) {
    const std::vector<uint16_t> oa = forward_once(*a, lc.cfg, 33, 77, router);
    const std::vector<uint16_t> ob = forward_once(*b, lc.cfg, 33, 77, router);
    ASSERT_EQ(oa.size(), ob.size());
    size_t diff = 0;
    for (size_t i = 0; i < oa.size(); ++i) diff += oa[i] != ob[i];
    EXPECT_EQ(diff, 0u) << "router=" << router;
  }
}

// An engine created with the environment variable `name` set to `value` (restored afterwards).
Status create_with_env(const char* name, const char* value, const MoeLayerWeights& w, const EngineOptions& eo,
                       std::unique_ptr<MoeEngine>* out) {
  const char* prev = std::getenv(name);
  const std::string saved = prev ? prev : "";
  setenv(name, value, 1);
  const Status st = MoeEngine::create(w, eo, out);
  if (prev) setenv(name, saved.c_str(), 1); else unsetenv(name);
  return st;
}

size_t mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t diff = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff += a[i] != b[i];
  return diff;
}

TEST(Small, SerialStreamEqualsOverlap) {
  // FP4MOE_SERIAL_STREAM=1 (the shared expert on the caller's stream, used under racecheck) gives the
  // same bytes as the default side-stream overlap.
  const LayerCase lc = layer_cases()[1];
  const MoeLayerWeights w = host_layer(lc);
  EngineOptions eo;
  eo.max_tokens = 33;
  std::unique_ptr<MoeEngine> overlap, serial;
  ASSERT_TRUE(MoeEngine::create(w, eo, &overlap).is_ok());
  const Status st = create_with_env("FP4MOE_SERIAL_STREAM", "1", w, eo, &serial);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(mismatches(forward_once(*overlap, lc.cfg, 33, 41, false), forward_once(*serial, lc.cfg, 33, 41, false)), 0u);
}

// The forward bytes of an engine created with the environment variable `name` = `a` against one created
// with `name` = `b` (options eo, weights w), at each T, for the inputs of `seed`.
void expect_env_variants_equal(const MoeLayerWeights& w, const MoeConfig& cfg, const EngineOptions& eo,
                               const char* name, const char* a, const char* b, const std::vector<int64_t>& tokens,
                               uint64_t seed) {
  const std::string label = eo.fc1_tactic.empty() ? "heuristic" : eo.fc1_tactic;
  std::unique_ptr<MoeEngine> ea, eb;
  Status st = create_with_env(name, a, w, eo, &ea);
  ASSERT_TRUE(st.is_ok()) << label << ": " << st.to_string();
  st = create_with_env(name, b, w, eo, &eb);
  ASSERT_TRUE(st.is_ok()) << label << ": " << st.to_string();
  for (int64_t T : tokens)
    EXPECT_EQ(mismatches(forward_once(*ea, cfg, T, seed, false), forward_once(*eb, cfg, T, seed, false)), 0u)
        << cfg.name << " " << label << " " << name << "='" << a << "' vs '" << b << "' T=" << T;
}

TEST(Small, GatheredCopyEqualsRowIndex) {
  // FC1 reading its token rows from the grouped copy (the default: contiguous rows, the sm90 family's TMA
  // path) gives the same bytes as reading them through the row index (FP4MOE_FC1_GATHER=index), for the
  // heuristic's tactic and for every tactic forced.
  const LayerCase lc = layer_cases()[1];
  const MoeLayerWeights w = host_layer(lc);
  std::vector<std::string> names{""};
  for (const std::string& n : tactics_for_layer(lc.cfg, 33, true)) names.push_back(n);
  for (const std::string& name : names) {
    EngineOptions eo;
    eo.max_tokens = 33;
    eo.fc1_tactic = eo.fc2_tactic = name;
    expect_env_variants_equal(w, lc.cfg, eo, "FP4MOE_FC1_GATHER", "", "index", {1, 33}, 43);
  }
}

// Layers whose decode batches the sm90 chained launch routes itself (E a multiple of 32 up to 256): grouped
// sigmoid routing with a bias and a shared expert of the routed width (folded into the launch), and softmax
// routing without one.
std::vector<MoeConfig> route_in_chain_configs() {
  std::vector<MoeConfig> cfgs;
  MoeConfig a = small_config("route-sigmoid-shared", 128, 64, 32, 4);
  a.routing = RoutingKind::kSigmoidGrouped;
  a.n_group = 4;
  a.topk_group = 2;
  a.norm_topk_prob = true;
  a.routed_scaling_factor = 2.5f;
  a.has_correction_bias = true;
  a.n_shared_experts = 1;
  a.shared_inter = 64;
  cfgs.push_back(a);
  MoeConfig b = small_config("route-softmax", 128, 64, 64, 8);
  b.norm_topk_prob = true;
  cfgs.push_back(b);
  // Sigmoid scores without a group limit (GLM-5's routing): the two-level routing wherever each warp has at
  // most one of the T x E / 32 slices (common/front_block.cuh), so at T = 5 the launch's 12 or 20 warps route
  // in two levels and the fused front end's 8 warps one warp per token.
  MoeConfig c = a;
  c.name = "route-sigmoid-one-group";
  c.num_experts = 64;
  c.n_group = 1;
  c.topk_group = 1;
  cfgs.push_back(c);
  return cfgs;
}

// The chained launch routing the batch itself (the default) against the fused front end's own launch
// (FP4MOE_ROUTE_IN_CHAIN=0), tactic `name` forced ("" the heuristic): the same output bytes at each T.
void expect_route_in_chain_equal(const MoeConfig& cfg, const std::string& name, const std::vector<int64_t>& tokens) {
  EngineOptions eo;
  eo.max_tokens = *std::max_element(tokens.begin(), tokens.end());
  eo.fc1_tactic = eo.fc2_tactic = name;
  expect_env_variants_equal(host_layer(LayerCase{cfg.name, cfg, {}}), cfg, eo, "FP4MOE_ROUTE_IN_CHAIN", "", "0", tokens,
                            47);
}

TEST(Small, RouteInChainEqualsFrontEnd) {
  // Every sm90 tactic that carries the routing prologue (the n8 tiles) forced, and the heuristic's
  // choice, T from 1 to the 64-pair limit.
  for (const MoeConfig& cfg : route_in_chain_configs()) {
    const int64_t max_t = 64 / cfg.topk;
    std::vector<std::string> names{""};
    bool sm90 = false;  // the device runs the sm90 family
    for (const std::string& n : tactics_for_layer(cfg, max_t, true)) {
      if (n.rfind("sm90.", 0) != 0) continue;
      sm90 = true;
      if (find_tactic(n)->can_route_in_chain(cfg, max_t)) names.push_back(n);
    }
    if (sm90) {
      EXPECT_GE(names.size(), 2u) << cfg.name << ": no sm90 tactic routes in its launch";
    }
    for (const std::string& name : names) expect_route_in_chain_equal(cfg, name, {1, 3, 5, max_t});
  }
}

// The one-token tile (the sm90 e4m3 decode tile) reads a packed layout of its own: the heuristic takes it at
// T = 1 in an engine of one token, or with EngineOptions::extra_weight_layouts, and not otherwise (an
// engine of 8 tokens would hold the weights twice); each engine's T = 1 forward matches the reference.
// Skipped where no one-token tile can run (no sm_90a device).
TEST(Small, OneTokenTileOnlyWhereItsLayoutIsAllowed) {
  const MoeConfig cfg = small_config("one-token", 1024, 1024, 64, 2);  // K = 1024: four k256 stages
  bool runnable = false;
  for (const std::string& n : tactics_for_layer(cfg, 8, false))
    if (find_tactic(n)->desc().tile_n == 1) runnable = true;
  if (!runnable) GTEST_SKIP() << "no one-token tile runs on this device";
  const MoeLayerWeights w = host_layer(LayerCase{cfg.name, cfg, {}});
  struct Want {
    int64_t max_tokens;
    bool extra;
    bool one_token;
  };
  for (const Want& c : {Want{1, false, true}, Want{8, false, false}, Want{8, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "max_tokens=" << c.max_tokens << " extra_weight_layouts=" << c.extra);
    EngineOptions eo;
    eo.max_tokens = c.max_tokens;
    eo.extra_weight_layouts = c.extra;
    std::unique_ptr<MoeEngine> engine;
    const Status st = MoeEngine::create(w, eo, &engine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(find_tactic(engine->fc1_tactic_for(1))->desc().tile_n == 1, c.one_token) << engine->fc1_tactic_for(1);
    EXPECT_EQ(find_tactic(engine->fc2_tactic_for(1))->desc().tile_n == 1, c.one_token) << engine->fc2_tactic_for(1);
    const LayerRun r = run_and_compare(*engine, w, 1, 77, false);
    EXPECT_LE(r.rel_l2, 1e-2);
    EXPECT_EQ(r.id_mismatches, 0);
  }
}

// The sm90 resident tactic (sm90.w4f16.m32n1k512.cc) in the engine: forced by name in an engine of one token,
// with and without an NVFP4 shared expert (folded in as the chained launch's last expert; at top-8 the chain
// spreads it over the routed rows' CTAs), in its defaults (the fused front end before the chained launch,
// FC2's fp32 rows left to finalize), with the launch routing the token itself (FP4MOE_ROUTE_IN_CHAIN=1), with
// the shared expert on the side stream (FP4MOE_FOLD_SHARED=0) and converting its own rows
// (FP4MOE_CHAIN_FP32_ROWS=0), and chosen by the heuristic (by default; not with FP4MOE_SM90_CC=0) for the
// one-token bucket only (its CTAs, 4 rows x 64 / 16, fit one wave; the one-token layout allowed by
// extra_weight_layouts), each forward against the reference. Skipped where it cannot run (no sm_90a device).
constexpr const char* kResidentTactic = "sm90.w4f16.m32n1k512.cc";

// The resident tactic's layer: variant 0 without a shared expert, 1 with an NVFP4 shared expert (folded in
// as the chained launch's last expert), 2 that at top-8 (folded and spread over the routed rows' CTAs).
MoeConfig resident_config(int variant) {
  MoeConfig c = small_config("resident", 2048, 64, 16, 4);
  c.routing = RoutingKind::kSigmoidGrouped;
  c.n_group = 4;
  c.topk_group = 2;
  c.norm_topk_prob = true;
  if (variant > 0) {
    c.n_shared_experts = 1;
    c.shared_inter = 64;
  }
  if (variant == 2) {
    c.topk = 8;
    c.topk_group = 4;
  }
  return c;
}

bool resident_tactic_runs_here() {
  const std::vector<std::string> usable = tactics_for_layer(resident_config(0), 1, false);
  return std::find(usable.begin(), usable.end(), kResidentTactic) != usable.end();
}

TEST(Small, ResidentTacticForward) {
  const std::string cc = kResidentTactic;
  const MoeConfig cfg = resident_config(0);
  if (!resident_tactic_runs_here()) GTEST_SKIP() << cc << " cannot run on this device";
  const std::pair<const char*, const char*> envs[] = {{"FP4MOE_ROUTE_IN_CHAIN", ""},  // the defaults
                                                      {"FP4MOE_ROUTE_IN_CHAIN", "1"},
                                                      {"FP4MOE_FOLD_SHARED", "0"},
                                                      {"FP4MOE_CHAIN_FP32_ROWS", "0"}};
  for (const int variant : {0, 1, 2})
    for (const auto& [env, value] : envs) {
      // 0: no shared expert; 1: a shared expert (folded); 2: top-8 with a shared expert (folded, spread).
      SCOPED_TRACE(::testing::Message() << (variant == 0 ? "no shared expert" : "NVFP4 shared expert")
                                        << (variant == 2 ? ", top-8" : "") << ", " << env << "=" << value);
      const MoeConfig c = resident_config(variant);
      const MoeLayerWeights w = host_layer(LayerCase{c.name, c, {}});
      EngineOptions eo;
      eo.max_tokens = 1;
      eo.fc1_tactic = eo.fc2_tactic = cc;
      std::unique_ptr<MoeEngine> engine;
      const Status st = create_with_env(env, value, w, eo, &engine);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(engine->fc1_tactic_for(1), cc);
      EXPECT_EQ(engine->fc2_tactic_for(1), cc);
      for (int seed : {1, 2, 3}) {
        const LayerRun r = run_and_compare(*engine, w, 1, 900 + seed, false);
        EXPECT_LE(r.rel_l2, 1e-2);
        EXPECT_EQ(r.id_mismatches, 0);
      }
    }
  // The heuristic, by default: the resident tactic for T = 1, not for the buckets of 2 or more tokens; with
  // FP4MOE_SM90_CC=0 not at all. (The switch is read at creation; a value the caller set is put back.)
  const MoeLayerWeights w = host_layer(LayerCase{cfg.name, cfg, {}});
  EngineOptions eo;
  eo.max_tokens = 8;
  eo.extra_weight_layouts = true;
  std::unique_ptr<MoeEngine> engine;
  const Status st = create_with_env("FP4MOE_SM90_CC", "", w, eo, &engine);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(engine->fc1_tactic_for(1), cc);
  EXPECT_EQ(engine->fc2_tactic_for(1), cc);
  EXPECT_NE(engine->fc1_tactic_for(8), cc);
  for (int64_t T : {1, 8}) {
    SCOPED_TRACE(::testing::Message() << "heuristic T=" << T);
    const LayerRun r = run_and_compare(*engine, w, T, 950 + T, false);
    EXPECT_LE(r.rel_l2, 1e-2);
    EXPECT_EQ(r.id_mismatches, 0);
  }
  std::unique_ptr<MoeEngine> off;
  ASSERT_TRUE(create_with_env("FP4MOE_SM90_CC", "0", w, eo, &off).is_ok());
  EXPECT_NE(off->fc1_tactic_for(1), cc);
  EXPECT_NE(off->fc2_tactic_for(1), cc);
  const LayerRun r = run_and_compare(*off, w, 1, 951, false);
  EXPECT_LE(r.rel_l2, 1e-2);
  EXPECT_EQ(r.id_mismatches, 0);
}

TEST(Small, GraphReplayBitwise) {
  const LayerCase lc = layer_cases()[1];
  const MoeLayerWeights w = host_layer(lc);
  EngineOptions eo;
  eo.max_tokens = 33;
  std::unique_ptr<MoeEngine> engine;
  ASSERT_TRUE(MoeEngine::create(w, eo, &engine).is_ok());
  EXPECT_EQ(graph_replay_mismatches(*engine, lc.cfg, 33, 5), 0);
}

TEST(Small, Errors) {
  const LayerCase lc = layer_cases()[0];
  MoeLayerWeights w = host_layer(lc);
  EngineOptions eo;
  eo.max_tokens = 8;
  std::unique_ptr<MoeEngine> engine;
  ASSERT_TRUE(MoeEngine::create(w, eo, &engine).is_ok());
  Dev x(8 * 64 * 2), out(8 * 64 * 2 + 16), logits(8 * 4 * 4);
  auto code = [&](const Status& s) { return s.code(); };
  EXPECT_EQ(code(engine->forward(nullptr, 4, logits.as<float>(), out.as<uint16_t>(), nullptr)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(engine->forward(x.as<uint16_t>(), 4, logits.as<float>(), nullptr, nullptr)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(engine->forward(x.as<uint16_t>(), 9, logits.as<float>(), out.as<uint16_t>(), nullptr)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(engine->forward(x.as<uint16_t>(), -1, logits.as<float>(), out.as<uint16_t>(), nullptr)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(engine->forward(x.as<uint16_t>(), 4, logits.as<float>(), out.as<uint16_t>() + 1, nullptr)), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine->forward(nullptr, 0, nullptr, nullptr, nullptr).is_ok()) << "T = 0 is a no-op";

  EngineOptions bad = eo;
  bad.fc1_tactic = "no.such.tactic";
  Status st = MoeEngine::create(w, bad, &engine);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no.such.tactic"), std::string::npos) << st.message();
  bad = eo;
  bad.max_tokens = 0;
  EXPECT_EQ(MoeEngine::create(w, bad, &engine).code(), StatusCode::kInvalidArgument);
  bad = eo;
  bad.device = 999;
  EXPECT_FALSE(MoeEngine::create(w, bad, &engine).is_ok());
  EXPECT_EQ(MoeEngine::create(w, eo, nullptr).code(), StatusCode::kInvalidArgument);

  MoeConfig badcfg = lc.cfg;
  badcfg.inter = 20;  // not a multiple of 16
  st = MoeEngine::create_synthetic(badcfg, SyntheticSpec{}, eo, &engine);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  MoeLayerWeights missing = w;
  missing.experts[2] = ExpertWeights{};
  st = MoeEngine::create(missing, eo, &engine);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("expert 2"), std::string::npos) << st.message();

  MoeLayerWeights no_router = w;
  no_router.router_weight.clear();
  ASSERT_TRUE(MoeEngine::create(no_router, eo, &engine).is_ok());
  st = engine->forward(x.as<uint16_t>(), 4, nullptr, out.as<uint16_t>(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("router"), std::string::npos) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
}

// Sanitizer subset: one forward per routing family and shared-expert kind, the heuristic's tactics.
TEST(Sanitize, RouteInChain) {
  // The chained launch's own routing under compute-sanitizer (memcheck, racecheck): the heuristic's tactic.
  const MoeConfig cfg = route_in_chain_configs()[0];
  expect_route_in_chain_equal(cfg, "", {1, 64 / cfg.topk});
}

TEST(Sanitize, ResidentTacticForward) {
  // The resident tactic's chained launch in its default forms (after the fused front end, the folded shared
  // expert spread over the routed rows' CTAs, FC2's fp32 rows left to finalize) and routing the token itself
  // (FP4MOE_ROUTE_IN_CHAIN=1), forced by name in an engine of one token, against the reference.
  if (!resident_tactic_runs_here()) GTEST_SKIP() << kResidentTactic << " cannot run on this device";
  const MoeConfig c = resident_config(2);
  const MoeLayerWeights w = host_layer(LayerCase{c.name, c, {}});
  EngineOptions eo;
  eo.max_tokens = 1;
  eo.fc1_tactic = eo.fc2_tactic = kResidentTactic;
  for (const char* route : {"", "1"}) {
    SCOPED_TRACE(::testing::Message() << "FP4MOE_ROUTE_IN_CHAIN=" << route);
    std::unique_ptr<MoeEngine> engine;
    const Status st = create_with_env("FP4MOE_ROUTE_IN_CHAIN", route, w, eo, &engine);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const LayerRun r = run_and_compare(*engine, w, 1, 4242, false);
    EXPECT_LE(r.rel_l2, 1e-2);
    EXPECT_EQ(r.id_mismatches, 0);
  }
}

TEST(Sanitize, EngineForward) {
  std::vector<LayerCase> list;
  for (const LayerCase& lc : layer_cases())
    if (lc.name == "sigmoid-grouped-shared" || lc.name == "bf16-shared" || lc.name == "router-weight") {
      LayerCase c = lc;
      c.tokens = {c.tokens.back() > 6 ? int64_t{6} : c.tokens.back()};
      list.push_back(c);
    }
  run_matrix(list, /*every_tactic=*/false);
}

}  // namespace
}  // namespace fp4moe::test
