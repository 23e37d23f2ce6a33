// MoE layers from Hugging Face checkpoints with ModelOpt NVFP4 tensor names (include/fp4moe/checkpoint.h).
//
// Per NVFP4 linear `P` (ModelOpt unified HF export):
//   P.weight          U8       [N, K/2]   two E2M1 codes per byte, element 2i in the low nibble
//   P.weight_scale    F8_E4M3  [N, K/16]  e4m3fn block scales
//   P.weight_scale_2  F32      [] or [1]  tensor scale
//   P.input_scale     F32      [] or [1]  activation scale; optional, checked, unused (weight-only path)
// Routed experts: model.layers.L.mlp.experts.e.{gate_proj,up_proj,down_proj} (gate/up [I, H], down [H, I]).
// Router: model.layers.L.mlp.gate.weight [E, H] (BF16/F16/F32), optional gate.e_score_correction_bias [E].
// Shared expert: model.layers.L.mlp.shared_experts.{gate_proj,up_proj,down_proj}, NVFP4 as above or a
// BF16 P.weight [N, K], of width config.shared_inter.
#include "fp4moe/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <set>

#include "format/safetensors_json.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

using nlohmann::json;

const char* const kProjs[3] = {"gate_proj", "up_proj", "down_proj"};

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  TensorInfo t;
  t.shape = s;
  return t.shape_string();
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Checks one quantisation description: quant_algo NVFP4 and, where a group size is given, 16.
// `field` is the JSON path of q inside `file` ("quantization", "quantization_config", or "").
void check_quant(const json& q, const std::string& file, const std::string& field) {
  const std::string at = field.empty() ? "" : field + ".";
  FP4MOE_CHECK(q.is_object(), StatusCode::kFormatError, "{}: field '{}': expected an object, found {} {}", file,
               field, detail::json_type_name(q), detail::json_brief(q));
  FP4MOE_CHECK(q.contains("quant_algo"), StatusCode::kFormatError,
               "{}: field '{}quant_algo': expected \"NVFP4\", found no such field{}", file, at,
               q.contains("quant_method") ? fmt::format(" (quant_method is {})", detail::json_brief(q.at("quant_method")))
                                          : "");
  const json& algo = q.at("quant_algo");
  FP4MOE_CHECK(algo.is_string() && upper(algo.get<std::string>()) == "NVFP4", StatusCode::kFormatError,
               "{}: field '{}quant_algo': expected \"NVFP4\", found {}", file, at, detail::json_brief(algo));
  auto check_group = [&](const json& g, const std::string& name) {
    FP4MOE_CHECK(g.is_number_integer() && g.get<int64_t>() == kNvfp4BlockSize, StatusCode::kFormatError,
                 "{}: field '{}': expected {}, found {}", file, name, kNvfp4BlockSize, detail::json_brief(g));
  };
  if (q.contains("group_size")) check_group(q.at("group_size"), at + "group_size");
  // compressed-tensors style description: config_groups.<g>.weights.group_size.
  if (q.contains("config_groups") && q.at("config_groups").is_object()) {
    for (auto g = q.at("config_groups").begin(); g != q.at("config_groups").end(); ++g) {
      if (g->is_object() && g->contains("weights") && g->at("weights").is_object() &&
          g->at("weights").contains("group_size"))
        check_group(g->at("weights").at("group_size"), at + "config_groups." + g.key() + ".weights.group_size");
    }
  }
  // No group size anywhere: NVFP4 defines it as 16, nothing to contradict.
}

json read_json(const std::string& path) {
  const std::string text = detail::read_text_file(path);
  return detail::parse_json_strict(text.data(), text.data() + text.size(), path, 64);
}

// Loads tensors of one layer with messages that name the file, the tensor, expected and found.
class LayerReader {
 public:
  LayerReader(const std::string& dir, const TensorStore& store) : dir_(dir), store_(store) {}

  bool has(const std::string& name) const { return store_.has(name); }

  // The tensor's info, or kNotFound naming the checkpoint and what was expected.
  const TensorInfo& need(const std::string& name, const std::string& expect) const {
    FP4MOE_CHECK(store_.has(name), StatusCode::kNotFound, "{}: tensor '{}' not found in the checkpoint (expected {})",
                 dir_, name, expect);
    return store_.file_of(name).info(name);
  }
  const SafetensorsFile& file(const std::string& name) const { return store_.file_of(name); }

  void expect(const TensorInfo& t, DType dt, const std::vector<int64_t>& shape) const {
    FP4MOE_CHECK(t.dtype == dt && t.shape == shape, StatusCode::kFormatError,
                 "{}: tensor '{}': expected {} {}, found {} {}", file(t.name).path(), t.name, dtype_name(dt),
                 shape_str(shape), dtype_name(t.dtype), t.shape_string());
  }

  // An F32 scalar stored as [] or [1]; must be finite.
  float scalar(const std::string& name) const {
    const TensorInfo& t = need(name, "F32 [] or [1]");
    FP4MOE_CHECK(t.dtype == DType::kF32 && (t.shape.empty() || t.shape == std::vector<int64_t>{1}),
                 StatusCode::kFormatError, "{}: tensor '{}': expected F32 [] or [1], found {} {}", file(name).path(),
                 name, dtype_name(t.dtype), t.shape_string());
    const float v = file(name).read_f32(name)[0];
    FP4MOE_CHECK(std::isfinite(v), StatusCode::kFormatError, "{}: tensor '{}': expected a finite value, found {}",
                 file(name).path(), name, v);
    return v;
  }

  // NVFP4 linear `prefix` of shape [n, k].
  LinearWeights nvfp4(const std::string& prefix, int64_t n, int64_t k) const {
    const std::vector<int64_t> wshape{n, k / 2}, sshape{n, k / kNvfp4BlockSize};
    const std::string wn = prefix + ".weight", sn = prefix + ".weight_scale";
    expect(need(wn, fmt::format("U8 {}", shape_str(wshape))), DType::kU8, wshape);
    expect(need(sn, fmt::format("F8_E4M3 {}", shape_str(sshape))), DType::kF8E4M3, sshape);
    PackedNvfp4Weights q;
    q.n = n;
    q.k = k;
    q.codes = file(wn).read_bytes(wn, DType::kU8, wshape);
    q.scales = file(sn).read_bytes(sn, DType::kF8E4M3, sshape);
    q.tensor_scale = scalar(prefix + ".weight_scale_2");
    if (has(prefix + ".input_scale")) (void)scalar(prefix + ".input_scale");  // checked; the path is weight-only
    return LinearWeights::from_nvfp4(std::move(q));
  }

  // A shared-expert linear: NVFP4 (U8 weight) or BF16 [n, k].
  LinearWeights nvfp4_or_bf16(const std::string& prefix, int64_t n, int64_t k) const {
    const std::string wn = prefix + ".weight";
    const TensorInfo& t = need(wn, fmt::format("U8 [{}, {}] (NVFP4) or BF16 [{}, {}]", n, k / 2, n, k));
    if (t.dtype == DType::kU8) return nvfp4(prefix, n, k);
    FP4MOE_CHECK(t.dtype == DType::kBF16, StatusCode::kFormatError,
                 "{}: tensor '{}': expected U8 [{}, {}] (NVFP4) or BF16 [{}, {}], found {} {}", file(wn).path(), wn, n,
                 k / 2, n, k, dtype_name(t.dtype), t.shape_string());
    expect(t, DType::kBF16, {n, k});
    return LinearWeights::from_bf16(n, k, file(wn).read_bf16(wn, {n, k}));
  }

  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorInfo& t = need(name, fmt::format("BF16/F16/F32 {}", shape_str(shape)));
    FP4MOE_CHECK((t.dtype == DType::kBF16 || t.dtype == DType::kF16 || t.dtype == DType::kF32) && t.shape == shape,
                 StatusCode::kFormatError, "{}: tensor '{}': expected BF16/F16/F32 {}, found {} {}",
                 file(name).path(), name, shape_str(shape), dtype_name(t.dtype), t.shape_string());
    return file(name).read_f32(name, shape);
  }

 private:
  std::string dir_;
  const TensorStore& store_;
};

// Parses "model.layers.<L>.mlp.experts.<e>.": returns false unless `name` has that form.
bool parse_expert_name(const std::string& name, int* layer, int64_t* expert) {
  static const char kHead[] = "model.layers.";
  static const char kMid[] = ".mlp.experts.";
  if (name.compare(0, sizeof(kHead) - 1, kHead) != 0) return false;
  size_t p = sizeof(kHead) - 1;
  auto number = [&](int64_t* out) {
    const size_t start = p;
    int64_t v = 0;
    while (p < name.size() && std::isdigit(static_cast<unsigned char>(name[p])) && p - start < 9)
      v = v * 10 + (name[p++] - '0');
    *out = v;
    return p > start && (p == name.size() || !std::isdigit(static_cast<unsigned char>(name[p])));
  };
  int64_t l = 0;
  if (!number(&l)) return false;
  if (name.compare(p, sizeof(kMid) - 1, kMid) != 0) return false;
  p += sizeof(kMid) - 1;
  int64_t e = 0;
  if (!number(&e) || p >= name.size() || name[p] != '.') return false;
  *layer = static_cast<int>(l);
  *expert = e;
  return true;
}

}  // namespace

MoeConfig read_checkpoint_config(const std::string& dir) {
  const std::string cfg_path = dir + "/config.json";
  MoeConfig cfg = read_hf_config(cfg_path);
  const std::string quant_path = dir + "/hf_quant_config.json";
  if (file_exists(quant_path)) {
    const json q = read_json(quant_path);
    FP4MOE_CHECK(q.is_object(), StatusCode::kFormatError, "{}: expected a JSON object, found {}", quant_path,
                 detail::json_brief(q));
    if (q.contains("quantization"))
      check_quant(q.at("quantization"), quant_path, "quantization");  // ModelOpt's layout
    else
      check_quant(q, quant_path, "");
  }
  const json c = read_json(cfg_path);
  if (c.is_object() && c.contains("quantization_config"))
    check_quant(c.at("quantization_config"), cfg_path, "quantization_config");
  return cfg;
}

MoeLayerWeights load_moe_layer(const std::string& dir, int layer) {
  MoeConfig cfg = read_checkpoint_config(dir);
  const TensorStore store(dir);
  const LayerReader rd(dir, store);
  const int64_t H = cfg.hidden, I = cfg.inter, E = cfg.num_experts;

  // The layer must exist, and must not hold experts beyond the config's E.
  bool any = false;
  for (const std::string& name : store.names()) {
    int l = 0;
    int64_t e = 0;
    if (!parse_expert_name(name, &l, &e) || l != layer) continue;
    any = true;
    FP4MOE_CHECK(e < E, StatusCode::kFormatError,
                 "{}: tensor '{}': expert index {} but config.json has {} experts (expected indices 0..{})",
                 store.file_of(name).path(), name, e, E, E - 1);
  }
  if (!any) {
    std::string layers;
    for (int l : list_moe_layers(store)) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
    throw Error(StatusCode::kNotFound, fmt::format("{}: layer {} has no MoE expert tensors "
                                                   "(model.layers.{}.mlp.experts.*); MoE layers present: [{}]",
                                                   dir, layer, layer, layers));
  }

  MoeLayerWeights w;
  const std::string base = fmt::format("model.layers.{}.mlp.", layer);
  w.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = fmt::format("{}experts.{}.", base, e);
    ExpertWeights& x = w.experts[static_cast<size_t>(e)];
    x.gate = rd.nvfp4(p + kProjs[0], I, H);
    x.up = rd.nvfp4(p + kProjs[1], I, H);
    x.down = rd.nvfp4(p + kProjs[2], H, I);
  }

  w.router_weight = rd.floats(base + "gate.weight", {E, H});
  // The bias is optional, but when config.json implies one (topk_method noaux_tc, or a model type whose
  // router always has it) a missing tensor would silently change the routing: an error.
  const std::string bias = base + "gate.e_score_correction_bias";
  FP4MOE_CHECK(rd.has(bias) || !cfg.has_correction_bias, StatusCode::kNotFound,
               "{}: tensor '{}' not found in the checkpoint, but config.json implies a correction bias "
               "(topk_method noaux_tc or a sigmoid-router model type) (expected BF16/F16/F32 [{}])",
               dir, bias, E);
  cfg.has_correction_bias = rd.has(bias);
  if (cfg.has_correction_bias) w.correction_bias = rd.floats(bias, {E});

  const std::string sp = base + "shared_experts.";
  const bool has_shared = rd.has(sp + "gate_proj.weight") || rd.has(sp + "up_proj.weight") ||
                          rd.has(sp + "down_proj.weight");
  if (cfg.n_shared_experts > 0) {
    const int64_t S = cfg.shared_inter;
    FP4MOE_CHECK(has_shared, StatusCode::kNotFound,
                 "{}: config.json has n_shared_experts = {} (width {}), but tensor '{}gate_proj.weight' is not in the "
                 "checkpoint (expected U8 [{}, {}] (NVFP4) or BF16 [{}, {}])",
                 dir, cfg.n_shared_experts, S, sp, S, H / 2, S, H);
    ExpertWeights s;
    s.gate = rd.nvfp4_or_bf16(sp + kProjs[0], S, H);
    s.up = rd.nvfp4_or_bf16(sp + kProjs[1], S, H);
    s.down = rd.nvfp4_or_bf16(sp + kProjs[2], H, S);
    w.shared = std::move(s);
  } else {
    FP4MOE_CHECK(!has_shared, StatusCode::kFormatError,
                 "{}: the checkpoint has shared expert tensors ({}*), but config.json has n_shared_experts = 0", dir,
                 sp);
  }
  w.config = cfg;
  w.validate();
  return w;
}

std::vector<int> list_moe_layers(const TensorStore& store) {
  std::set<int> layers;
  for (const std::string& name : store.names()) {
    int l = 0;
    int64_t e = 0;
    if (parse_expert_name(name, &l, &e)) layers.insert(l);
  }
  return std::vector<int>(layers.begin(), layers.end());
}

namespace {

void add_nvfp4(SafetensorsWriter& wr, const std::string& prefix, const PackedNvfp4Weights& q) {
  wr.add(prefix + ".weight", DType::kU8, {q.n, q.k / 2}, q.codes.data(), q.codes.size());
  wr.add(prefix + ".weight_scale", DType::kF8E4M3, {q.n, q.k / kNvfp4BlockSize}, q.scales.data(), q.scales.size());
  wr.add(prefix + ".weight_scale_2", DType::kF32, {}, &q.tensor_scale, sizeof(float));
}

void add_linear(SafetensorsWriter& wr, const std::string& prefix, const LinearWeights& lw, bool allow_bf16) {
  FP4MOE_CHECK(!lw.empty(), StatusCode::kInvalidArgument, "{}: weight is empty (not materialised); cannot write it",
               prefix);
  if (lw.format == LinearWeights::Format::kNvfp4) {
    FP4MOE_CHECK(lw.nvfp4.n == lw.n && lw.nvfp4.k == lw.k, StatusCode::kInvalidArgument,
                 "{}: NVFP4 payload is [{}, {}] but the weight says [{}, {}]", prefix, lw.nvfp4.n, lw.nvfp4.k, lw.n,
                 lw.k);
    add_nvfp4(wr, prefix, lw.nvfp4);
    return;
  }
  FP4MOE_CHECK(allow_bf16, StatusCode::kUnsupported,
               "{}: routed experts must be NVFP4 (a BF16 routed expert cannot be loaded back)", prefix);
  wr.add(prefix + ".weight", DType::kBF16, {lw.n, lw.k}, lw.bf16.data(), lw.bf16.size() * sizeof(uint16_t));
}

}  // namespace

void add_moe_layer_tensors(SafetensorsWriter& writer, const MoeLayerWeights& w, int layer) {
  const MoeConfig& c = w.config;
  const std::string base = fmt::format("model.layers.{}.mlp.", layer);
  for (size_t e = 0; e < w.experts.size(); ++e) {
    const std::string p = fmt::format("{}experts.{}.", base, e);
    add_linear(writer, p + kProjs[0], w.experts[e].gate, false);
    add_linear(writer, p + kProjs[1], w.experts[e].up, false);
    add_linear(writer, p + kProjs[2], w.experts[e].down, false);
  }
  if (!w.router_weight.empty()) {
    FP4MOE_CHECK(w.router_weight.size() == static_cast<size_t>(c.num_experts * c.hidden), StatusCode::kInvalidArgument,
                 "layer {}: router weight has {} values, expected [{}, {}]", layer, w.router_weight.size(),
                 c.num_experts, c.hidden);
    writer.add(base + "gate.weight", DType::kF32, {c.num_experts, c.hidden}, w.router_weight.data(),
               w.router_weight.size() * sizeof(float));
  }
  if (!w.correction_bias.empty()) {
    writer.add(base + "gate.e_score_correction_bias", DType::kF32, {static_cast<int64_t>(w.correction_bias.size())},
               w.correction_bias.data(), w.correction_bias.size() * sizeof(float));
  }
  if (w.shared.has_value() && !w.shared->empty()) {
    const std::string sp = base + "shared_experts.";
    add_linear(writer, sp + kProjs[0], w.shared->gate, true);
    add_linear(writer, sp + kProjs[1], w.shared->up, true);
    add_linear(writer, sp + kProjs[2], w.shared->down, true);
  }
}

}  // namespace fp4moe
