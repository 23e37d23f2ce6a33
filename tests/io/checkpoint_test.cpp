// NVFP4 MoE layer checkpoints: a tiny layer (E=4, H=32, I=16, shared expert) quantised with
// quantize_nvfp4, written with add_moe_layer_tensors next to a config.json, loaded back bit-exact,
// single-file and sharded; then missing / mis-shaped / mis-typed tensors and bad quantisation configs,
// each an error naming the file, the tensor (or field), what was expected and what was found.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>

#include "fp4moe/checkpoint.h"
#include "io_test_util.h"

using namespace fp4moe;
using fp4moe_test::expect_error;
using fp4moe_test::TempDir;

namespace {

// DeepSeek-V3 style: sigmoid routing with groups and a correction bias, one shared expert.
const std::string kSigmoidConfig = R"({
  "model_type": "deepseek_v3", "hidden_size": 32, "moe_intermediate_size": 16, "n_routed_experts": 4,
  "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_shared_experts": 1,
  "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
})";
// Qwen3-MoE style: softmax, no bias, no shared expert, no quantization_config (hf_quant_config.json only).
const std::string kSoftmaxConfig = R"({
  "model_type": "qwen3_moe", "hidden_size": 32, "moe_intermediate_size": 16, "num_experts": 4,
  "num_experts_per_tok": 2, "norm_topk_prob": true
})";
const std::string kQuantConfig = R"({
  "producer": {"name": "modelopt", "version": "0.23.0"},
  "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["lm_head"]}
})";

LinearWeights random_nvfp4(std::mt19937& rng, int64_t n, int64_t k, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> w(static_cast<size_t>(n * k));
  for (float& x : w) x = nd(rng);
  return LinearWeights::from_nvfp4(quantize_nvfp4(w.data(), n, k, "test weight"));
}

LinearWeights random_bf16(std::mt19937& rng, int64_t n, int64_t k) {
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<uint16_t> bits(static_cast<size_t>(n * k));
  for (uint16_t& b : bits) b = f32_to_bf16_bits(nd(rng));
  return LinearWeights::from_bf16(n, k, std::move(bits));
}

MoeLayerWeights random_layer(const MoeConfig& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  MoeLayerWeights w;
  w.config = cfg;
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    ExpertWeights x;
    // Different spreads per projection, so gate and up carry different tensor scales.
    x.gate = random_nvfp4(rng, cfg.inter, cfg.hidden, 1.0f + 0.1f * static_cast<float>(e));
    x.up = random_nvfp4(rng, cfg.inter, cfg.hidden, 0.3f);
    x.down = random_nvfp4(rng, cfg.hidden, cfg.inter, 2.0f);
    w.experts.push_back(std::move(x));
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < cfg.num_experts * cfg.hidden; ++i) w.router_weight.push_back(nd(rng));
  if (cfg.has_correction_bias)
    for (int64_t e = 0; e < cfg.num_experts; ++e) w.correction_bias.push_back(nd(rng));
  if (cfg.n_shared_experts > 0) {
    ExpertWeights s;
    s.gate = random_nvfp4(rng, cfg.shared_inter, cfg.hidden, 0.7f);
    s.up = random_bf16(rng, cfg.shared_inter, cfg.hidden);  // a BF16 projection next to NVFP4 ones
    s.down = random_nvfp4(rng, cfg.hidden, cfg.shared_inter, 0.2f);
    w.shared = std::move(s);
  }
  return w;
}

void expect_linear_eq(const LinearWeights& a, const LinearWeights& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.format, b.format);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.k, b.k);
  if (a.format == LinearWeights::Format::kBF16) {
    EXPECT_EQ(a.bf16, b.bf16);
    return;
  }
  EXPECT_EQ(a.nvfp4.codes, b.nvfp4.codes);
  EXPECT_EQ(a.nvfp4.scales, b.nvfp4.scales);
  EXPECT_EQ(a.nvfp4.tensor_scale, b.nvfp4.tensor_scale);
}

void expect_layer_eq(const MoeLayerWeights& a, const MoeLayerWeights& b) {
  ASSERT_EQ(a.experts.size(), b.experts.size());
  for (size_t e = 0; e < a.experts.size(); ++e) {
    expect_linear_eq(a.experts[e].gate, b.experts[e].gate, "expert " + std::to_string(e) + " gate");
    expect_linear_eq(a.experts[e].up, b.experts[e].up, "expert " + std::to_string(e) + " up");
    expect_linear_eq(a.experts[e].down, b.experts[e].down, "expert " + std::to_string(e) + " down");
  }
  EXPECT_EQ(a.router_weight, b.router_weight);
  EXPECT_EQ(a.correction_bias, b.correction_bias);
  ASSERT_EQ(a.shared.has_value(), b.shared.has_value());
  if (a.shared) {
    expect_linear_eq(a.shared->gate, b.shared->gate, "shared gate");
    expect_linear_eq(a.shared->up, b.shared->up, "shared up");
    expect_linear_eq(a.shared->down, b.shared->down, "shared down");
  }
  EXPECT_EQ(a.config.hidden, b.config.hidden);
  EXPECT_EQ(a.config.inter, b.config.inter);
  EXPECT_EQ(a.config.num_experts, b.config.num_experts);
  EXPECT_EQ(a.config.has_correction_bias, b.config.has_correction_bias);
  EXPECT_EQ(a.config.shared_inter, b.config.shared_inter);
}

// A checkpoint directory holding config.json (+ hf_quant_config.json) and model.safetensors with
// layers 3 and 5 and one unrelated tensor.
struct Checkpoint {
  TempDir dir;
  MoeLayerWeights l3, l5;

  explicit Checkpoint(const std::string& config, bool quant_file = true) {
    fp4moe_test::write_file(dir.file("config.json"), config);
    if (quant_file) fp4moe_test::write_file(dir.file("hf_quant_config.json"), kQuantConfig);
    const MoeConfig cfg = read_checkpoint_config(dir.path());
    l3 = random_layer(cfg, 3);
    l5 = random_layer(cfg, 5);
    SafetensorsWriter w;
    const std::vector<uint16_t> embed(8 * 32, 0x3F80);
    w.add("model.embed_tokens.weight", DType::kBF16, {8, 32}, embed.data(), embed.size() * 2);
    add_moe_layer_tensors(w, l3, 3);
    add_moe_layer_tensors(w, l5, 5);
    w.write(model());
  }
  std::string model() const { return dir.file("model.safetensors"); }

  // Rewrites model.safetensors without `drop`, then lets `add` append tensors.
  void rewrite(const std::set<std::string>& drop, const std::function<void(SafetensorsWriter&)>& add = {}) const {
    SafetensorsWriter w;
    {
      SafetensorsFile f(model());
      for (const TensorInfo& t : f.tensors())
        if (!drop.count(t.name)) w.add(t.name, t.dtype, t.shape, f.data(t.name), t.end - t.begin);
    }
    if (add) add(w);
    w.write(model());
  }
};

const std::string kP = "model.layers.3.mlp.";

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("test bug: '" + from + "' not in the text");
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(Checkpoint, RoundTripSingleFile) {
  Checkpoint c(kSigmoidConfig);
  const MoeLayerWeights got3 = load_moe_layer(c.dir.path(), 3);
  expect_layer_eq(got3, c.l3);
  EXPECT_TRUE(got3.config.has_correction_bias);
  EXPECT_EQ(got3.config.shared_inter, 16);
  expect_layer_eq(load_moe_layer(c.dir.path(), 5), c.l5);
  EXPECT_EQ(list_moe_layers(TensorStore(c.dir.path())), (std::vector<int>{3, 5}));
  expect_error([&] { load_moe_layer(c.dir.path(), 4); }, StatusCode::kNotFound,
               {c.dir.path(), "layer 4", "[3, 5]"});

  // Exactly the ModelOpt names, with the tensor scale as a scalar.
  std::set<std::string> expect{"model.embed_tokens.weight"};
  for (int layer : {3, 5}) {
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
    for (int e = 0; e < 4; ++e)
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
        for (const char* t : {"weight", "weight_scale", "weight_scale_2"})
          expect.insert(p + "experts." + std::to_string(e) + "." + proj + "." + t);
    expect.insert(p + "gate.weight");
    expect.insert(p + "gate.e_score_correction_bias");
    for (const char* t : {"weight", "weight_scale", "weight_scale_2"}) {
      expect.insert(p + "shared_experts.gate_proj." + t);
      expect.insert(p + "shared_experts.down_proj." + t);
    }
    expect.insert(p + "shared_experts.up_proj.weight");
  }
  SafetensorsFile f(c.model());
  std::set<std::string> names;
  for (const TensorInfo& t : f.tensors()) names.insert(t.name);
  EXPECT_EQ(names, expect);
  EXPECT_TRUE(f.info(kP + "experts.2.up_proj.weight_scale_2").shape.empty());
  EXPECT_EQ(f.info(kP + "experts.2.down_proj.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(f.info(kP + "experts.2.down_proj.weight_scale").dtype, DType::kF8E4M3);
}

TEST(Checkpoint, SoftmaxLayerWithoutBiasOrShared) {
  Checkpoint c(kSoftmaxConfig);
  const MoeLayerWeights got = load_moe_layer(c.dir.path(), 5);
  expect_layer_eq(got, c.l5);
  EXPECT_FALSE(got.config.has_correction_bias);
  EXPECT_FALSE(got.shared.has_value());
}

TEST(Checkpoint, ShardedWithIndex) {
  Checkpoint c(kSigmoidConfig);
  // Split: experts 0-1 of layer 3 into shard 1, everything else into shard 2.
  SafetensorsWriter s1, s2;
  std::string map;
  {
    SafetensorsFile f(c.model());
    for (const TensorInfo& t : f.tensors()) {
      const bool first = t.name.rfind(kP + "experts.0.", 0) == 0 || t.name.rfind(kP + "experts.1.", 0) == 0;
      (first ? s1 : s2).add(t.name, t.dtype, t.shape, f.data(t.name), t.end - t.begin);
      map += (map.empty() ? "" : ",\n") + ("\"" + t.name + "\": \"model-0000" + (first ? "1" : "2") +
                                            "-of-00002.safetensors\"");
    }
  }
  s1.write(c.dir.file("model-00001-of-00002.safetensors"));
  s2.write(c.dir.file("model-00002-of-00002.safetensors"));
  std::remove(c.model().c_str());
  fp4moe_test::write_file(c.dir.file("model.safetensors.index.json"),
                          "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
  expect_layer_eq(load_moe_layer(c.dir.path(), 3), c.l3);
  expect_layer_eq(load_moe_layer(c.dir.path(), 5), c.l5);

  // A shard the index names is gone: the error names the index, a tensor and the file.
  std::remove(c.dir.file("model-00001-of-00002.safetensors").c_str());
  expect_error([&] { load_moe_layer(c.dir.path(), 3); }, StatusCode::kNotFound,
               {"model.safetensors.index.json", kP + "experts.0.", "model-00001-of-00002.safetensors"});
}

TEST(Checkpoint, AcceptedVariants) {
  Checkpoint c(kSigmoidConfig);
  const std::string s2 = kP + "experts.1.gate_proj.weight_scale_2";
  const std::string in = kP + "experts.1.gate_proj.input_scale";
  const std::string router = kP + "gate.weight";
  const float ts = c.l3.experts[1].gate.nvfp4.tensor_scale, input_scale = 0.125f;
  std::vector<uint16_t> router_bf16;
  for (float v : c.l3.router_weight) router_bf16.push_back(f32_to_bf16_bits(v));
  c.rewrite({s2, router}, [&](SafetensorsWriter& w) {
    w.add(s2, DType::kF32, {1}, &ts, 4);               // [1] instead of []
    w.add(in, DType::kF32, {}, &input_scale, 4);       // input_scale: read, unused
    w.add(router, DType::kBF16, {4, 32}, router_bf16.data(), router_bf16.size() * 2);  // BF16 router
  });
  const MoeLayerWeights got = load_moe_layer(c.dir.path(), 3);
  EXPECT_EQ(got.experts[1].gate.nvfp4.tensor_scale, ts);
  for (size_t i = 0; i < got.router_weight.size(); ++i)
    ASSERT_EQ(got.router_weight[i], round_bf16(c.l3.router_weight[i])) << i;
}

TEST(Checkpoint, TensorErrorsNameFileTensorExpectedFound) {
  const std::string w1 = kP + "experts.1.down_proj.weight";
  const std::string sc2 = kP + "experts.2.up_proj.weight_scale";
  const std::string ts0 = kP + "experts.0.gate_proj.weight_scale_2";
  const std::string in0 = kP + "experts.0.gate_proj.input_scale";
  const std::string router = kP + "gate.weight";
  const std::string bias = kP + "gate.e_score_correction_bias";
  const std::string shared_up = kP + "shared_experts.up_proj.weight";
  const std::vector<uint8_t> zeros(4096, 0);
  struct Case {
    const char* what;
    std::set<std::string> drop;
    std::function<void(SafetensorsWriter&)> add;
    StatusCode code;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {"missing weight_scale", {sc2}, {}, StatusCode::kNotFound, {"'" + sc2 + "'", "not found", "F8_E4M3 [16, 2]"}},
      {"wrong weight shape", {w1}, [&](SafetensorsWriter& w) { w.add(w1, DType::kU8, {32, 4}, zeros.data(), 128); },
       StatusCode::kFormatError, {"model.safetensors", "'" + w1 + "'", "expected U8 [32, 8]", "found U8 [32, 4]"}},
      {"wrong weight dtype", {w1}, [&](SafetensorsWriter& w) { w.add(w1, DType::kI8, {32, 8}, zeros.data(), 256); },
       StatusCode::kFormatError, {"model.safetensors", "'" + w1 + "'", "expected U8 [32, 8]", "found I8 [32, 8]"}},
      {"wrong scale dtype", {sc2}, [&](SafetensorsWriter& w) { w.add(sc2, DType::kU8, {16, 2}, zeros.data(), 32); },
       StatusCode::kFormatError, {"'" + sc2 + "'", "expected F8_E4M3 [16, 2]", "found U8 [16, 2]"}},
      {"tensor scale of shape [2]", {ts0},
       [&](SafetensorsWriter& w) { w.add(ts0, DType::kF32, {2}, zeros.data(), 8); }, StatusCode::kFormatError,
       {"'" + ts0 + "'", "expected F32 [] or [1]", "found F32 [2]"}},
      {"tensor scale in BF16", {ts0}, [&](SafetensorsWriter& w) { w.add(ts0, DType::kBF16, {}, zeros.data(), 2); },
       StatusCode::kFormatError, {"'" + ts0 + "'", "expected F32 [] or [1]", "found BF16 []"}},
      {"missing tensor scale", {ts0}, {}, StatusCode::kNotFound, {"'" + ts0 + "'", "F32 [] or [1]"}},
      {"input_scale of the wrong type", {}, [&](SafetensorsWriter& w) { w.add(in0, DType::kI32, {}, zeros.data(), 4); },
       StatusCode::kFormatError, {"'" + in0 + "'", "expected F32 [] or [1]", "found I32 []"}},
      {"router wrong shape", {router},
       [&](SafetensorsWriter& w) { w.add(router, DType::kF32, {32, 4}, zeros.data(), 512); },
       StatusCode::kFormatError, {"'" + router + "'", "expected BF16/F16/F32 [4, 32]", "found F32 [32, 4]"}},
      {"router missing", {router}, {}, StatusCode::kNotFound, {"'" + router + "'", "[4, 32]"}},
      {"router integer", {router},
       [&](SafetensorsWriter& w) { w.add(router, DType::kI32, {4, 32}, zeros.data(), 512); },
       StatusCode::kFormatError, {"'" + router + "'", "found I32 [4, 32]"}},
      {"bias wrong shape", {bias}, [&](SafetensorsWriter& w) { w.add(bias, DType::kF32, {5}, zeros.data(), 20); },
       StatusCode::kFormatError, {"'" + bias + "'", "expected BF16/F16/F32 [4]", "found F32 [5]"}},
      {"bias missing though config.json asks for it", {bias}, {}, StatusCode::kNotFound,
       {"'" + bias + "'", "config.json", "noaux_tc"}},
      {"shared BF16 projection wrong shape", {shared_up},
       [&](SafetensorsWriter& w) { w.add(shared_up, DType::kBF16, {16, 16}, zeros.data(), 512); },
       StatusCode::kFormatError, {"'" + shared_up + "'", "expected BF16 [16, 32]", "found BF16 [16, 16]"}},
      {"shared F32 projection", {shared_up},
       [&](SafetensorsWriter& w) { w.add(shared_up, DType::kF32, {16, 32}, zeros.data(), 2048); },
       StatusCode::kFormatError, {"'" + shared_up + "'", "U8 [16, 16] (NVFP4) or BF16 [16, 32]", "found F32"}},
      {"expert beyond E", {},
       [&](SafetensorsWriter& w) { w.add(kP + "experts.4.gate_proj.weight", DType::kU8, {16, 16}, zeros.data(), 256); },
       StatusCode::kFormatError, {"experts.4.gate_proj.weight", "expert index 4", "4 experts"}},
  };
  for (const Case& k : cases) {
    Checkpoint c(kSigmoidConfig);
    c.rewrite(k.drop, k.add);
    expect_error([&] { load_moe_layer(c.dir.path(), 3); }, k.code, k.words, k.what);
  }
}

TEST(Checkpoint, SharedExpertPresenceMustMatchConfig) {
  {
    Checkpoint c(kSigmoidConfig);
    std::set<std::string> drop;
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
      for (const char* t : {"weight", "weight_scale", "weight_scale_2"})
        drop.insert(kP + "shared_experts." + proj + "." + t);
    c.rewrite(drop);
    expect_error([&] { load_moe_layer(c.dir.path(), 3); }, StatusCode::kNotFound,
                 {c.dir.path(), "n_shared_experts = 1", kP + "shared_experts.gate_proj.weight"});
  }
  {
    // Checkpoint written with a shared expert, config.json then claims none.
    Checkpoint c(kSigmoidConfig);
    fp4moe_test::write_file(c.dir.file("config.json"),
                            replaced(kSigmoidConfig, "\"n_shared_experts\": 1", "\"n_shared_experts\": 0"));
    expect_error([&] { load_moe_layer(c.dir.path(), 3); }, StatusCode::kFormatError,
                 {"shared_experts", "n_shared_experts = 0"});
  }
}

TEST(Checkpoint, QuantConfigErrors) {
  struct Case {
    const char* what;
    std::string file, text;
    std::vector<std::string> words;
  };
  const std::string wrong_algo_cfg = replaced(kSigmoidConfig, "\"quant_algo\": \"NVFP4\"", "\"quant_algo\": \"FP8\"");
  const std::string no_algo_cfg = replaced(kSigmoidConfig, "\"quant_algo\": \"NVFP4\", ", "");
  const std::vector<Case> cases = {
      {"FP8 checkpoint", "hf_quant_config.json",
       R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "group_size": 16}})",
       {"hf_quant_config.json", "quantization.quant_algo", "NVFP4", "\"FP8\""}},
      {"group size 32", "hf_quant_config.json",
       R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})",
       {"hf_quant_config.json", "quantization.group_size", "expected 16", "found 32"}},
      {"flat layout, group size as a string", "hf_quant_config.json", R"({"quant_algo": "NVFP4", "group_size": "16"})",
       {"hf_quant_config.json", "'group_size'", "expected 16", "\"16\""}},
      {"no quant_algo", "hf_quant_config.json", R"({"quantization": {"group_size": 16}})",
       {"hf_quant_config.json", "quantization.quant_algo", "NVFP4", "no such field"}},
      {"config.json says FP8", "config.json", wrong_algo_cfg,
       {"config.json", "quantization_config.quant_algo", "NVFP4", "\"FP8\""}},
      {"config.json without quant_algo", "config.json", no_algo_cfg,
       {"config.json", "quantization_config.quant_algo", "no such field", "modelopt"}},
      {"config groups with group size 32", "config.json",
       std::string(kSoftmaxConfig).insert(1, R"("quantization_config": {"quant_algo": "NVFP4", "config_groups": {"group_0": {"weights": {"group_size": 32}}}},)"),
       {"config.json", "quantization_config.config_groups.group_0.weights.group_size", "expected 16", "found 32"}},
      {"malformed hf_quant_config.json", "hf_quant_config.json", "{\"quantization\": ",
       {"hf_quant_config.json", "not valid JSON"}},
  };
  for (const Case& k : cases) {
    Checkpoint c(kSigmoidConfig);
    fp4moe_test::write_file(c.dir.file(k.file), k.text);
    expect_error([&] { read_checkpoint_config(c.dir.path()); }, StatusCode::kFormatError, k.words, k.what);
    expect_error([&] { load_moe_layer(c.dir.path(), 3); }, StatusCode::kFormatError, k.words, k.what);
  }
  // Both spellings of a good description are accepted, with or without a hf_quant_config.json.
  Checkpoint flat(kSigmoidConfig);
  fp4moe_test::write_file(flat.dir.file("hf_quant_config.json"), R"({"quant_algo": "NVFP4", "group_size": 16})");
  EXPECT_EQ(read_checkpoint_config(flat.dir.path()).num_experts, 4);
  Checkpoint none(kSoftmaxConfig, /*quant_file=*/false);
  EXPECT_EQ(read_checkpoint_config(none.dir.path()).hidden, 32);
}
