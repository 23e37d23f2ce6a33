// MoE layer configuration: validation, presets and the Hugging Face config.json reader
// (shared/DESIGN.md section 3).
//
// Field mapping from config.json (the first present key wins):
//   hidden        <- hidden_size                                    (required)
//   inter         <- moe_intermediate_size | intermediate_size      (required; the second for Mixtral)
//   num_experts   <- n_routed_experts | num_experts | num_local_experts (required)
//   topk          <- num_experts_per_tok                            (required)
//   routing       <- scoring_func: "sigmoid" -> kSigmoidGrouped, "softmax" -> kSoftmaxTopK; when absent,
//                    the model type's own router decides (DeepSeek-V3 / Kimi-K2 / GLM-4.5 / GLM-5 always
//                    use sigmoid with a correction bias), otherwise softmax
//   n_group, topk_group <- n_group, topk_group                      (default 1)
//   norm_topk_prob <- norm_topk_prob; when absent, the model type's default (Mixtral always
//                    renormalises); an unknown model type without the field is an error
//   routed_scaling_factor <- routed_scaling_factor                  (default 1)
//   has_correction_bias <- topk_method == "noaux_tc", or a sigmoid-router model type as above
//   n_shared_experts <- n_shared_experts (default 0; 1 when only shared_expert_intermediate_size is given)
//   shared_inter  <- shared_expert_intermediate_size, else n_shared_experts * inter
// A null value counts as absent. Multimodal wrappers keep these fields in "text_config"; they are read
// from there when the top level has no num_experts_per_tok.
#include "fp4moe/config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4moe/status.h"

namespace fp4moe {

const char* routing_kind_name(RoutingKind k) {
  switch (k) {
    case RoutingKind::kSoftmaxTopK: return "softmax";
    case RoutingKind::kSigmoidGrouped: return "sigmoid";
  }
  return "unknown";
}

namespace {

// Upper bounds that keep every product of sizes far from int64 overflow; far above any real model.
constexpr int64_t kMaxDim = int64_t{1} << 20;      // hidden, inter, shared_inter
constexpr int64_t kMaxExperts = int64_t{1} << 16;  // num_experts

void check_dim(const std::string& origin, const char* field, const char* hf_key, int64_t v, bool allow_zero) {
  FP4MOE_CHECK(allow_zero ? v >= 0 : v > 0, StatusCode::kInvalidArgument, "{}: {} ({}) = {} must be {}", origin,
               field, hf_key, v, allow_zero ? "non-negative" : "positive");
  FP4MOE_CHECK(v <= kMaxDim, StatusCode::kInvalidArgument, "{}: {} ({}) = {} is larger than the supported {}",
               origin, field, hf_key, v, kMaxDim);
  FP4MOE_CHECK(v % 16 == 0, StatusCode::kInvalidArgument,
               "{}: {} ({}) = {} is not a multiple of 16 (the NVFP4 block size along k)", origin, field, hf_key, v);
}

}  // namespace

void MoeConfig::validate(const std::string& origin) const {
  const std::string& o = origin;
  check_dim(o, "hidden", "hidden_size", hidden, false);
  check_dim(o, "inter", "moe_intermediate_size", inter, false);
  FP4MOE_CHECK(num_experts > 0 && num_experts <= kMaxExperts, StatusCode::kInvalidArgument,
               "{}: num_experts (n_routed_experts) = {} must be in 1..{}", o, num_experts, kMaxExperts);
  FP4MOE_CHECK(topk > 0, StatusCode::kInvalidArgument, "{}: topk (num_experts_per_tok) = {} must be positive", o,
               topk);
  FP4MOE_CHECK(topk <= num_experts, StatusCode::kInvalidArgument,
               "{}: topk (num_experts_per_tok) = {} is larger than num_experts = {}", o, topk, num_experts);
  FP4MOE_CHECK(n_group >= 1, StatusCode::kInvalidArgument, "{}: n_group = {} must be at least 1", o, n_group);
  FP4MOE_CHECK(topk_group >= 1, StatusCode::kInvalidArgument, "{}: topk_group = {} must be at least 1", o,
               topk_group);
  FP4MOE_CHECK(topk_group <= n_group, StatusCode::kInvalidArgument,
               "{}: topk_group = {} is larger than n_group = {}", o, topk_group, n_group);
  FP4MOE_CHECK(num_experts % n_group == 0, StatusCode::kInvalidArgument,
               "{}: num_experts = {} is not divisible by n_group = {}", o, num_experts, n_group);
  const int64_t per_group = num_experts / n_group;
  FP4MOE_CHECK(topk <= topk_group * per_group, StatusCode::kInvalidArgument,
               "{}: topk = {} is larger than the {} experts reachable in topk_group = {} groups of {}", o, topk,
               topk_group * per_group, topk_group, per_group);
  if (routing == RoutingKind::kSoftmaxTopK) {
    // The softmax router has no group limit and no bias; accepting them would silently route differently.
    FP4MOE_CHECK(n_group == 1 && topk_group == 1, StatusCode::kInvalidArgument,
                 "{}: softmax routing with n_group = {}, topk_group = {} (group-limited softmax routing) is not "
                 "supported; groups need scoring_func sigmoid",
                 o, n_group, topk_group);
    FP4MOE_CHECK(!has_correction_bias, StatusCode::kInvalidArgument,
                 "{}: has_correction_bias is set with softmax routing; the correction bias belongs to sigmoid "
                 "(noaux_tc) routing",
                 o);
  } else if (n_group > 1) {
    // Group scores are the sum of each group's top-2 experts.
    FP4MOE_CHECK(per_group >= 2, StatusCode::kInvalidArgument,
                 "{}: n_group = {} leaves {} expert(s) per group; sigmoid group scoring needs at least 2", o,
                 n_group, per_group);
  }
  FP4MOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f, StatusCode::kInvalidArgument,
               "{}: routed_scaling_factor = {} must be a positive finite number", o, routed_scaling_factor);
  FP4MOE_CHECK(n_shared_experts >= 0 && n_shared_experts <= kMaxExperts, StatusCode::kInvalidArgument,
               "{}: n_shared_experts = {} must be in 0..{}", o, n_shared_experts, kMaxExperts);
  check_dim(o, "shared_inter", "shared_expert_intermediate_size", shared_inter, true);
  FP4MOE_CHECK((n_shared_experts == 0) == (shared_inter == 0), StatusCode::kInvalidArgument,
               "{}: n_shared_experts = {} and shared_inter = {} disagree (both zero or both positive)", o,
               n_shared_experts, shared_inter);
}

std::string MoeConfig::to_string() const {
  std::string routing_desc = routing_kind_name(routing);
  if (routing == RoutingKind::kSigmoidGrouped) {
    routing_desc += fmt::format("({}/{})", n_group, topk_group);
    if (has_correction_bias) routing_desc += "+bias";
  }
  return fmt::format("{}: H={} I={} E={} top-{} {}{} scale={:g} shared={}", name, hidden, inter, num_experts, topk,
                     routing_desc, norm_topk_prob ? " norm" : "", routed_scaling_factor, shared_inter);
}

namespace {

MoeConfig make_preset(const char* name, int64_t hidden, int64_t inter, int64_t experts, int64_t topk,
                      RoutingKind routing, int64_t n_group, int64_t topk_group, bool norm, float scale, bool bias,
                      int64_t n_shared, int64_t shared_inter) {
  MoeConfig c;
  c.name = name;
  c.hidden = hidden;
  c.inter = inter;
  c.num_experts = experts;
  c.topk = topk;
  c.routing = routing;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  c.has_correction_bias = bias;
  c.n_shared_experts = n_shared;
  c.shared_inter = shared_inter;
  return c;
}

constexpr const char* kPresetNames = "glm5, deepseek-v3, qwen3-235b, mixtral-8x7b";

}  // namespace

MoeConfig moe_preset(const std::string& name) {
  constexpr RoutingKind kSig = RoutingKind::kSigmoidGrouped, kSoft = RoutingKind::kSoftmaxTopK;
  //                        name            H     I      E    k  routing grp tkg  norm  scale bias sh sh_I
  if (name == "glm5") return make_preset("glm5", 6144, 2048, 256, 8, kSig, 1, 1, true, 2.5f, true, 1, 2048);
  if (name == "deepseek-v3")
    return make_preset("deepseek-v3", 7168, 2048, 256, 8, kSig, 8, 4, true, 2.5f, true, 1, 2048);
  if (name == "qwen3-235b")
    return make_preset("qwen3-235b", 4096, 1536, 128, 8, kSoft, 1, 1, true, 1.0f, false, 0, 0);
  if (name == "mixtral-8x7b")
    return make_preset("mixtral-8x7b", 4096, 14336, 8, 2, kSoft, 1, 1, true, 1.0f, false, 0, 0);
  throw Error(StatusCode::kInvalidArgument,
              fmt::format("unknown MoE preset '{}'; known presets: {}", name, kPresetNames));
}

MoeConfig glm5_config() { return moe_preset("glm5"); }

namespace {

using nlohmann::json;

// Reads fields of one JSON object, naming `origin` and the field (with `prefix`, e.g. "text_config.")
// in every error.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string origin, std::string prefix)
      : obj_(obj), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  // Present and not null.
  bool has(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }

  int64_t integer(const char* key) const {
    const json& v = get(key);
    if (v.is_number_integer()) {
      if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        FP4MOE_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), StatusCode::kFormatError,
                     "{}: field '{}{}' = {} is out of range", origin_, prefix_, key, u);
        return static_cast<int64_t>(u);
      }
      return v.get<int64_t>();
    }
    throw type_error(key, "an integer", v);
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const char* key) const {
    const json& v = get(key);
    if (v.is_number()) return v.get<double>();
    throw type_error(key, "a number", v);
  }

  bool boolean(const char* key) const {
    const json& v = get(key);
    if (v.is_boolean()) return v.get<bool>();
    throw type_error(key, "true or false", v);
  }

  std::string string(const char* key) const {
    const json& v = get(key);
    if (v.is_string()) return v.get<std::string>();
    throw type_error(key, "a string", v);
  }

  // The first present key of `keys`, or nullptr.
  const char* first_present(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return k;
    return nullptr;
  }

  Error missing(const std::string& what) const {
    return Error(StatusCode::kFormatError, fmt::format("{}: missing required field {}{}", origin_, prefix_, what));
  }

  const std::string& origin() const { return origin_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& get(const char* key) const {
    if (!has(key)) throw missing(fmt::format("'{}'", key));
    return obj_.at(key);
  }

  Error type_error(const char* key, const char* expected, const json& found) const {
    std::string text = found.dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    return Error(StatusCode::kFormatError, fmt::format("{}: field '{}{}' must be {}, found {} {}", origin_, prefix_,
                                                       key, expected, found.type_name(), text));
  }

  const json& obj_;
  std::string origin_, prefix_;
};

// Model types whose router is sigmoid + e_score_correction_bias regardless of scoring_func
// (Hugging Face DeepseekV3TopkRouter and the GLM-4.5 / GLM-5 routers derived from it).
bool is_sigmoid_router_model(const std::string& model_type) {
  for (const char* t : {"deepseek_v3", "kimi_k2", "glm4_moe", "glm4v_moe", "glm4v_moe_text", "glm_moe_dsa"})
    if (model_type == t) return true;
  return false;
}

// norm_topk_prob when config.json leaves it out: the model class's default. Returns false in `known`
// for a model type we do not know.
bool default_norm_topk_prob(const std::string& model_type, bool* known) {
  *known = true;
  if (model_type == "mixtral") return true;  // Mixtral always renormalises its top-2 weights
  if (is_sigmoid_router_model(model_type)) return true;
  if (model_type == "qwen2_moe" || model_type == "qwen3_moe" || model_type == "deepseek_v2") return false;
  *known = false;
  return false;
}

}  // namespace

MoeConfig parse_hf_config(const std::string& json_text, const std::string& origin) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw Error(StatusCode::kFormatError, fmt::format("{}: malformed JSON: {}", origin, e.what()));
  }
  FP4MOE_CHECK(root.is_object(), StatusCode::kFormatError, "{}: config must be a JSON object, found {}", origin,
               root.type_name());

  // Multimodal wrappers: the language model's fields live in text_config.
  const json* obj = &root;
  std::string prefix;
  if (!root.contains("num_experts_per_tok") && root.contains("text_config") && !root["text_config"].is_null()) {
    FP4MOE_CHECK(root["text_config"].is_object(), StatusCode::kFormatError,
                 "{}: field 'text_config' must be an object, found {}", origin, root["text_config"].type_name());
    obj = &root["text_config"];
    prefix = "text_config.";
  }
  const FieldReader f(*obj, origin, prefix);
  const FieldReader top(root, origin, "");

  std::string model_type;
  if (f.has("model_type")) model_type = f.string("model_type");
  else if (top.has("model_type")) model_type = top.string("model_type");

  MoeConfig c;
  c.name = model_type.empty() ? "custom" : model_type;
  c.hidden = f.integer("hidden_size");

  const char* inter_key = f.first_present({"moe_intermediate_size", "intermediate_size"});
  if (inter_key == nullptr) throw f.missing("'moe_intermediate_size' (or 'intermediate_size')");
  c.inter = f.integer(inter_key);

  const char* experts_key = f.first_present({"n_routed_experts", "num_experts", "num_local_experts"});
  if (experts_key == nullptr)
    throw f.missing("'n_routed_experts' (or 'num_experts' / 'num_local_experts'); is this a MoE model?");
  c.num_experts = f.integer(experts_key);
  c.topk = f.integer("num_experts_per_tok");

  const bool sigmoid_model = is_sigmoid_router_model(model_type);
  if (f.has("scoring_func")) {
    const std::string s = f.string("scoring_func");
    if (s == "sigmoid") c.routing = RoutingKind::kSigmoidGrouped;
    else if (s == "softmax") c.routing = RoutingKind::kSoftmaxTopK;
    else
      throw Error(StatusCode::kFormatError,
                  fmt::format("{}: field '{}scoring_func' = \"{}\" is not supported (expected \"sigmoid\" or "
                              "\"softmax\")",
                              origin, prefix, s));
  } else {
    c.routing = sigmoid_model ? RoutingKind::kSigmoidGrouped : RoutingKind::kSoftmaxTopK;
  }

  c.n_group = f.integer_or("n_group", 1);
  c.topk_group = f.integer_or("topk_group", 1);

  if (f.has("norm_topk_prob")) {
    c.norm_topk_prob = f.boolean("norm_topk_prob");
  } else {
    bool known = false;
    c.norm_topk_prob = default_norm_topk_prob(model_type, &known);
    FP4MOE_CHECK(known, StatusCode::kFormatError,
                 "{}: field '{}norm_topk_prob' is missing and model_type '{}' has no known default; add "
                 "\"norm_topk_prob\": true or false",
                 origin, prefix, model_type);
  }

  if (f.has("routed_scaling_factor")) c.routed_scaling_factor = static_cast<float>(f.number("routed_scaling_factor"));

  bool noaux_tc = false;
  if (f.has("topk_method")) noaux_tc = f.string("topk_method") == "noaux_tc";
  c.has_correction_bias = noaux_tc || (sigmoid_model && c.routing == RoutingKind::kSigmoidGrouped);

  if (f.has("shared_expert_intermediate_size")) {
    c.shared_inter = f.integer("shared_expert_intermediate_size");
    c.n_shared_experts = f.integer_or("n_shared_experts", c.shared_inter > 0 ? 1 : 0);
  } else {
    c.n_shared_experts = f.integer_or("n_shared_experts", 0);
    // Multiply only factors in range; otherwise validate() below names the bad factor.
    if (c.n_shared_experts > 0 && c.n_shared_experts <= kMaxExperts && c.inter > 0 && c.inter <= kMaxDim)
      c.shared_inter = c.n_shared_experts * c.inter;
  }
  c.validate(origin);
  return c;
}

MoeConfig read_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FP4MOE_CHECK(in.is_open(), StatusCode::kNotFound, "{}: cannot open the model config (missing or unreadable)",
               path);
  std::ostringstream text;
  text << in.rdbuf();
  FP4MOE_CHECK(!in.bad(), StatusCode::kIoError, "{}: read failed", path);
  return parse_hf_config(text.str(), path);
}

}  // namespace fp4moe
