// MoeConfig: presets, validation rules, and the Hugging Face config.json reader on literal configs
// shaped like the real DeepSeek-V3, GLM-4.5/5, Qwen3 / Qwen2-MoE and Mixtral ones.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "fp4moe/config.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

template <typename F>
std::string error_of(F&& f, StatusCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << status_code_name(e.code()) << ": " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

void expect_same_shape(const MoeConfig& a, const MoeConfig& b) {
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.inter, b.inter);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.topk, b.topk);
  EXPECT_EQ(a.routing, b.routing);
  EXPECT_EQ(a.n_group, b.n_group);
  EXPECT_EQ(a.topk_group, b.topk_group);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.has_correction_bias, b.has_correction_bias);
  EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
  EXPECT_EQ(a.shared_inter, b.shared_inter);
}

TEST(Config, RoutingKindNames) {
  EXPECT_STREQ(routing_kind_name(RoutingKind::kSoftmaxTopK), "softmax");
  EXPECT_STREQ(routing_kind_name(RoutingKind::kSigmoidGrouped), "sigmoid");
}

TEST(Config, PresetsHaveTheDocumentedShapes) {
  const MoeConfig g = glm5_config();
  EXPECT_EQ(g.name, "glm5");
  EXPECT_EQ(g.hidden, 6144);
  EXPECT_EQ(g.inter, 2048);
  EXPECT_EQ(g.num_experts, 256);
  EXPECT_EQ(g.topk, 8);
  EXPECT_EQ(g.routing, RoutingKind::kSigmoidGrouped);
  EXPECT_EQ(g.n_group, 1);
  EXPECT_EQ(g.topk_group, 1);
  EXPECT_TRUE(g.norm_topk_prob);
  EXPECT_EQ(g.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(g.has_correction_bias);
  EXPECT_EQ(g.n_shared_experts, 1);
  EXPECT_EQ(g.shared_inter, 2048);
  expect_same_shape(moe_preset("glm5"), g);

  const MoeConfig d = moe_preset("deepseek-v3");
  EXPECT_EQ(d.hidden, 7168);
  EXPECT_EQ(d.inter, 2048);
  EXPECT_EQ(d.num_experts, 256);
  EXPECT_EQ(d.n_group, 8);
  EXPECT_EQ(d.topk_group, 4);
  EXPECT_EQ(d.routing, RoutingKind::kSigmoidGrouped);
  EXPECT_TRUE(d.has_correction_bias);
  EXPECT_EQ(d.shared_inter, 2048);

  const MoeConfig q = moe_preset("qwen3-235b");
  EXPECT_EQ(q.hidden, 4096);
  EXPECT_EQ(q.inter, 1536);
  EXPECT_EQ(q.num_experts, 128);
  EXPECT_EQ(q.topk, 8);
  EXPECT_EQ(q.routing, RoutingKind::kSoftmaxTopK);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_EQ(q.routed_scaling_factor, 1.0f);
  EXPECT_EQ(q.n_shared_experts, 0);

  const MoeConfig m = moe_preset("mixtral-8x7b");
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.inter, 14336);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.topk, 2);
  EXPECT_EQ(m.routing, RoutingKind::kSoftmaxTopK);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.shared_inter, 0);

  for (const char* name : {"glm5", "deepseek-v3", "qwen3-235b", "mixtral-8x7b"}) {
    EXPECT_NO_THROW(moe_preset(name).validate(name)) << name;
    EXPECT_EQ(moe_preset(name).name, name);
  }
}

TEST(Config, UnknownPresetListsTheKnownOnes) {
  const std::string msg = error_of([] { moe_preset("glm9"); }, StatusCode::kInvalidArgument);
  expect_contains(msg, "glm9");
  for (const char* name : {"glm5", "deepseek-v3", "qwen3-235b", "mixtral-8x7b"}) expect_contains(msg, name);
}

TEST(Config, ToStringIsOneDescriptiveLine) {
  const std::string g = glm5_config().to_string();
  EXPECT_EQ(g, "glm5: H=6144 I=2048 E=256 top-8 sigmoid(1/1)+bias norm scale=2.5 shared=2048");
  expect_contains(moe_preset("deepseek-v3").to_string(), "sigmoid(8/4)");
  EXPECT_EQ(moe_preset("mixtral-8x7b").to_string(), "mixtral-8x7b: H=4096 I=14336 E=8 top-2 softmax norm scale=1 shared=0");
}

// Each rule, starting from a valid config: the message names the origin, the field and the value.
TEST(Config, ValidateNamesTheFirstBadField) {
  struct Case {
    std::function<void(MoeConfig&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {[](MoeConfig& c) { c.hidden = 0; }, {"hidden", "= 0", "positive"}},
      {[](MoeConfig& c) { c.hidden = 6100; }, {"hidden", "6100", "multiple of 16"}},
      {[](MoeConfig& c) { c.inter = -16; }, {"inter", "-16"}},
      {[](MoeConfig& c) { c.inter = 2056; }, {"inter", "2056", "multiple of 16"}},
      {[](MoeConfig& c) { c.num_experts = 0; }, {"num_experts", "= 0"}},
      {[](MoeConfig& c) { c.topk = 0; }, {"topk", "= 0"}},
      {[](MoeConfig& c) { c.topk = 300; }, {"topk", "300", "num_experts = 256"}},
      {[](MoeConfig& c) { c.n_group = 0; }, {"n_group = 0"}},
      {[](MoeConfig& c) { c.n_group = 7; c.topk_group = 1; }, {"num_experts = 256", "n_group = 7"}},
      {[](MoeConfig& c) { c.n_group = 8; c.topk_group = 9; }, {"topk_group = 9", "n_group = 8"}},
      {[](MoeConfig& c) { c.n_group = 8; c.topk_group = 1; c.topk = 40; }, {"topk = 40", "topk_group = 1", "32"}},
      {[](MoeConfig& c) { c.n_group = 256; c.topk_group = 8; }, {"n_group = 256", "at least 2"}},
      {[](MoeConfig& c) { c.routing = RoutingKind::kSoftmaxTopK; c.has_correction_bias = false; c.n_group = 8; },
       {"softmax", "n_group = 8"}},
      {[](MoeConfig& c) { c.routing = RoutingKind::kSoftmaxTopK; }, {"has_correction_bias", "softmax"}},
      {[](MoeConfig& c) { c.routed_scaling_factor = 0.0f; }, {"routed_scaling_factor", "0"}},
      {[](MoeConfig& c) { c.n_shared_experts = -1; }, {"n_shared_experts = -1"}},
      {[](MoeConfig& c) { c.shared_inter = 100; }, {"shared_inter", "100", "multiple of 16"}},
      {[](MoeConfig& c) { c.n_shared_experts = 0; }, {"n_shared_experts = 0", "shared_inter = 2048"}},
      {[](MoeConfig& c) { c.hidden = int64_t{1} << 40; }, {"hidden", "larger than"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    MoeConfig c = glm5_config();
    cases[i].edit(c);
    const std::string msg = error_of([&] { c.validate("my/config.json"); }, StatusCode::kInvalidArgument);
    expect_contains(msg, "my/config.json: ");
    for (const auto& p : cases[i].parts) expect_contains(msg, p);
  }
}

const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 8, "topk_group": 4, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid", "topk_method": "noaux_tc", "first_k_dense_replace": 3,
  "num_hidden_layers": 61, "rope_scaling": {"type": "yarn", "factor": 40},
  "quantization_config": {"quant_algo": "NVFP4", "group_size": 16}
})";

TEST(HfConfig, DeepSeekV3) {
  const MoeConfig c = parse_hf_config(kDeepSeekV3, "dsv3/config.json");
  EXPECT_EQ(c.name, "deepseek_v3");
  MoeConfig want = moe_preset("deepseek-v3");
  expect_same_shape(c, want);
}

TEST(HfConfig, Glm45WithoutScoringFuncUsesSigmoidAndBias) {
  const char* json = R"({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "use_qk_norm": true})";
  const MoeConfig c = parse_hf_config(json, "glm45");
  EXPECT_EQ(c.hidden, 5120);
  EXPECT_EQ(c.inter, 1536);
  EXPECT_EQ(c.num_experts, 160);
  EXPECT_EQ(c.routing, RoutingKind::kSigmoidGrouped);
  EXPECT_TRUE(c.has_correction_bias);
  EXPECT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.shared_inter, 1536);
}

TEST(HfConfig, Glm5ShapedConfigMatchesThePreset) {
  const char* json = R"({"model_type": "glm_moe_dsa", "hidden_size": 6144, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc"})";
  expect_same_shape(parse_hf_config(json, "glm5"), glm5_config());  // norm_topk_prob defaults to true here
}

TEST(HfConfig, Qwen3Moe) {
  const char* json = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001, "tie_word_embeddings": false})";
  const MoeConfig c = parse_hf_config(json, "qwen3");
  expect_same_shape(c, moe_preset("qwen3-235b"));
  EXPECT_EQ(c.name, "qwen3_moe");
}

TEST(HfConfig, Qwen2MoeSharedExpertWidth) {
  const char* json = R"({"model_type": "qwen2_moe", "hidden_size": 3584, "intermediate_size": 18944,
    "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480, "num_experts": 64,
    "num_experts_per_tok": 8, "norm_topk_prob": false})";
  const MoeConfig c = parse_hf_config(json, "qwen2");
  EXPECT_EQ(c.inter, 2560);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.shared_inter, 20480);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.routing, RoutingKind::kSoftmaxTopK);
}

TEST(HfConfig, MixtralUsesIntermediateSizeAndLocalExperts) {
  const char* json = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.02, "sliding_window": null})";
  const MoeConfig c = parse_hf_config(json, "mixtral");
  expect_same_shape(c, moe_preset("mixtral-8x7b"));
}

TEST(HfConfig, MultimodalWrapperIsReadThroughTextConfig) {
  const char* json = R"({"model_type": "glm4v_moe", "vision_config": {"hidden_size": 1536},
    "text_config": {"model_type": "glm4v_moe_text", "hidden_size": 4096, "moe_intermediate_size": 1408,
      "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1,
      "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 1.0}})";
  const MoeConfig c = parse_hf_config(json, "glm45v");
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.inter, 1408);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.routing, RoutingKind::kSigmoidGrouped);
  EXPECT_TRUE(c.has_correction_bias);
  EXPECT_EQ(c.shared_inter, 1408);

  const std::string msg =
      error_of([] { parse_hf_config(R"({"text_config": {"hidden_size": 64}})", "wrap.json"); },
               StatusCode::kFormatError);
  expect_contains(msg, "wrap.json");
  expect_contains(msg, "text_config.");
  expect_contains(error_of([] { parse_hf_config(R"({"text_config": 5})", "wrap.json"); }, StatusCode::kFormatError),
                  "text_config");
}

TEST(HfConfig, MalformedInputsNameTheField) {
  struct Case {
    std::string json;
    StatusCode code;
    std::vector<std::string> parts;
  };
  const std::string base = R"("model_type": "qwen3_moe", "moe_intermediate_size": 64, "num_experts": 8)";
  const std::vector<Case> cases = {
      {"{\"hidden_size\": 64,", StatusCode::kFormatError, {"malformed JSON"}},
      {"", StatusCode::kFormatError, {"malformed JSON"}},
      {"[1, 2]", StatusCode::kFormatError, {"JSON object", "array"}},
      {"{" + base + R"(, "hidden_size": "64", "num_experts_per_tok": 2})", StatusCode::kFormatError,
       {"hidden_size", "integer", "string"}},
      {"{" + base + R"(, "hidden_size": 64.0, "num_experts_per_tok": 2})", StatusCode::kFormatError,
       {"hidden_size", "integer"}},
      {"{" + base + R"(, "hidden_size": 64})", StatusCode::kFormatError, {"num_experts_per_tok", "missing"}},
      {"{" + base + R"(, "hidden_size": null, "num_experts_per_tok": 2})", StatusCode::kFormatError,
       {"hidden_size", "missing"}},
      {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 64, "num_experts_per_tok": 2})",
       StatusCode::kFormatError, {"n_routed_experts"}},
      {R"({"model_type": "x", "hidden_size": 64, "num_experts": 8, "num_experts_per_tok": 2})",
       StatusCode::kFormatError, {"moe_intermediate_size"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "scoring_func": "relu"})",
       StatusCode::kFormatError, {"scoring_func", "relu"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "norm_topk_prob": 1})",
       StatusCode::kFormatError, {"norm_topk_prob", "true or false"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "routed_scaling_factor": "2.5"})",
       StatusCode::kFormatError, {"routed_scaling_factor", "number"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "n_group": [8]})", StatusCode::kFormatError,
       {"n_group", "array"}},
      {"{" + base + R"(, "hidden_size": 18446744073709551615, "num_experts_per_tok": 2})", StatusCode::kFormatError,
       {"hidden_size", "out of range"}},
      {"{" + base + R"(, "hidden_size": 1e30, "num_experts_per_tok": 2})", StatusCode::kFormatError,
       {"hidden_size", "integer"}},
      {R"({"model_type": "mymoe", "hidden_size": 64, "moe_intermediate_size": 64, "num_experts": 8,
          "num_experts_per_tok": 2})",
       StatusCode::kFormatError, {"norm_topk_prob", "mymoe"}},
      // Well-formed JSON, inconsistent values: validate() with the origin.
      {"{" + base + R"(, "hidden_size": 60, "num_experts_per_tok": 2})", StatusCode::kInvalidArgument,
       {"hidden", "60", "multiple of 16"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 9})", StatusCode::kInvalidArgument,
       {"topk", "9", "num_experts = 8"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "n_group": 3})",
       StatusCode::kInvalidArgument, {"n_group = 3"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "topk_method": "noaux_tc"})",
       StatusCode::kInvalidArgument, {"has_correction_bias", "softmax"}},
      {"{" + base + R"(, "hidden_size": -64, "num_experts_per_tok": 2})", StatusCode::kInvalidArgument,
       {"hidden", "-64"}},
      {"{" + base + R"(, "hidden_size": 64, "num_experts_per_tok": 2, "n_shared_experts": 100000})",
       StatusCode::kInvalidArgument, {"n_shared_experts = 100000"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    const std::string msg = error_of([&] { parse_hf_config(c.json, "ckpt/config.json"); }, c.code);
    expect_contains(msg, "ckpt/config.json");
    for (const auto& p : c.parts) expect_contains(msg, p);
  }
}

TEST(HfConfig, ReadFromFile) {
  const std::string path = ::testing::TempDir() + "fp4moe_format_config_test.json";
  {
    std::ofstream out(path);
    out << kDeepSeekV3;
  }
  const MoeConfig c = read_hf_config(path);
  expect_same_shape(c, moe_preset("deepseek-v3"));
  std::remove(path.c_str());
  expect_contains(error_of([&] { read_hf_config(path); }, StatusCode::kNotFound), path);

  {
    std::ofstream out(path);
    out << R"({"hidden_size": true})";
  }
  const std::string msg = error_of([&] { read_hf_config(path); }, StatusCode::kFormatError);
  expect_contains(msg, path);
  expect_contains(msg, "hidden_size");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace fp4moe
