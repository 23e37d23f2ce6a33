// `fp4moe inspect PATH`: lists the tensors of a safetensors file or checkpoint directory and, where
// there are any, its MoE layers (ModelOpt names, see include/fp4moe/checkpoint.h): expert count, each
// projection's format (NVFP4 or a dense dtype) and logical shape, router, bias and shared expert.
// For a directory with config.json it also prints the MoE config read from it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "fp4moe/checkpoint.h"
#include "fp4moe/config.h"
#include "fp4moe/safetensors.h"
#include "fp4moe/status.h"

namespace fp4moe::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool no_tensors = false;
  std::string match;
};

// Parses "<digits>" at s[pos...], advancing pos; false if there are none.
bool parse_index(const std::string& s, size_t* pos, long* value) {
  size_t p = *pos;
  while (p < s.size() && s[p] >= '0' && s[p] <= '9') ++p;
  if (p == *pos || p - *pos > 9) return false;
  *value = std::strtol(s.substr(*pos, p - *pos).c_str(), nullptr, 10);
  *pos = p;
  return true;
}

// "model.layers.<L>.mlp.experts.<e>.<rest>" -> (L, e).
bool parse_expert_name(const std::string& name, long* layer, long* expert) {
  static const std::string kLayers = "model.layers.", kExperts = ".mlp.experts.";
  if (name.compare(0, kLayers.size(), kLayers) != 0) return false;
  size_t pos = kLayers.size();
  if (!parse_index(name, &pos, layer)) return false;
  if (name.compare(pos, kExperts.size(), kExperts) != 0) return false;
  pos += kExperts.size();
  return parse_index(name, &pos, expert) && pos < name.size() && name[pos] == '.';
}

// One linear layer's format: "NVFP4 [N, K]" from .weight U8 [N, K/2] + .weight_scale, or "<DTYPE> <shape>".
std::string describe_linear(const TensorStore& store, const std::string& prefix) {
  const std::string wname = prefix + ".weight";
  if (!store.has(wname)) return "missing";
  const TensorInfo& w = store.file_of(wname).info(wname);
  if (w.dtype == DType::kU8 && store.has(prefix + ".weight_scale") && w.shape.size() == 2) {
    const TensorInfo& s = store.file_of(prefix + ".weight_scale").info(prefix + ".weight_scale");
    std::string ts = "no weight_scale_2";
    if (store.has(prefix + ".weight_scale_2")) {
      const TensorInfo& t = store.file_of(prefix + ".weight_scale_2").info(prefix + ".weight_scale_2");
      ts = fmt::format("weight_scale_2 {} {}", dtype_name(t.dtype), t.shape_string());
    }
    return fmt::format("NVFP4 [{}, {}] (weight U8 {}, weight_scale {} {}, {})", w.shape[0], w.shape[1] * 2,
                       w.shape_string(), dtype_name(s.dtype), s.shape_string(), ts);
  }
  return fmt::format("{} {}", dtype_name(w.dtype), w.shape_string());
}

std::string describe_tensor(const TensorStore& store, const std::string& name) {
  if (!store.has(name)) return "absent";
  const TensorInfo& t = store.file_of(name).info(name);
  return fmt::format("{} {}", dtype_name(t.dtype), t.shape_string());
}

void print_layers(const TensorStore& store, const std::vector<std::string>& names, const MoeConfig* cfg) {
  std::map<long, std::set<long>> experts;  // layer -> expert indices present
  for (const std::string& n : names) {
    long l = 0, e = 0;
    if (parse_expert_name(n, &l, &e)) experts[l].insert(e);
  }
  const std::vector<int> layers = list_moe_layers(store);
  if (layers.empty()) {
    fmt::print("moe layers: none (no tensor named model.layers.<L>.mlp.experts.<e>.*)\n");
    return;
  }
  fmt::print("moe layers: {} ({})\n", layers.size(), fmt::join(layers, ", "));
  for (int layer : layers) {
    const std::string base = fmt::format("model.layers.{}.mlp.", layer);
    const std::set<long>& present = experts[layer];
    const long max_e = present.empty() ? -1 : *present.rbegin();
    std::string count = fmt::format("{} experts (indices {}..{})", present.size(),
                                    present.empty() ? 0 : *present.begin(), max_e);
    if (cfg != nullptr) count += fmt::format(", config says {}", cfg->num_experts);
    fmt::print("layer {}: {}\n", layer, count);
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      // Every expert's format and shape; normally one description for all of them.
      std::map<std::string, long> forms;
      for (long e : present) ++forms[describe_linear(store, fmt::format("{}experts.{}.{}", base, e, proj))];
      for (const auto& [form, n] : forms) {
        fmt::print("  experts.*.{:<10} {}{}\n", proj, form,
                   forms.size() > 1 ? fmt::format("  [{} experts]", n) : std::string());
      }
    }
    fmt::print("  {:<20} {}\n", "gate (router)", describe_tensor(store, base + "gate.weight"));
    fmt::print("  {:<20} {}\n", "correction bias", describe_tensor(store, base + "gate.e_score_correction_bias"));
    if (store.has(base + "shared_experts.gate_proj.weight")) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        fmt::print("  shared.{:<13} {}\n", proj, describe_linear(store, base + "shared_experts." + proj));
      }
    } else {
      fmt::print("  {:<20} absent\n", "shared expert");
    }
  }
}

int inspect_command(const InspectOptions& o) {
  require_existing(o.path, "PATH", /*allow_dir=*/true);
  const bool is_dir = std::filesystem::is_directory(o.path);
  const TensorStore store(o.path);
  const std::vector<std::string> names = store.names();

  std::set<std::string> files;
  uint64_t bytes = 0;
  for (const std::string& n : names) {
    const SafetensorsFile& f = store.file_of(n);
    files.insert(f.path());
    const TensorInfo& t = f.info(n);
    bytes += t.end - t.begin;
  }
  fmt::print("{}: {}\n", is_dir ? "checkpoint" : "file", o.path);
  fmt::print("tensors: {} in {} file{} ({:.1f} MB)\n", names.size(), files.size(), files.size() == 1 ? "" : "s",
             bytes / 1e6);
  if (!o.no_tensors) {
    size_t width = 0;
    for (const std::string& n : names) width = std::max(width, n.size());
    for (const std::string& n : names) {
      if (!o.match.empty() && n.find(o.match) == std::string::npos) continue;
      const SafetensorsFile& f = store.file_of(n);
      const TensorInfo& t = f.info(n);
      fmt::print("  {:<{}}  {:<7} {}{}\n", n, width, dtype_name(t.dtype), t.shape_string(),
                 files.size() > 1 ? "  " + std::filesystem::path(f.path()).filename().string() : std::string());
    }
  }

  std::unique_ptr<MoeConfig> cfg;
  if (is_dir && std::filesystem::exists(std::filesystem::path(o.path) / "config.json")) {
    cfg = std::make_unique<MoeConfig>(read_checkpoint_config(o.path));
    fmt::print("config: {}\n", cfg->to_string());
  }
  print_layers(store, names, cfg.get());
  return kExitOk;
}

std::function<int()> setup_inspect(CLI::App& sub) {
  auto o = std::make_shared<InspectOptions>();
  sub.add_option("PATH", o->path, "a safetensors file or checkpoint directory")->required();
  sub.add_flag("--no-tensors", o->no_tensors, "print only the summary and the MoE layers");
  sub.add_option("--match", o->match, "list only tensors whose name contains this text");
  return [o]() { return inspect_command(*o); };
}

FP4MOE_COMMAND("inspect", "List a safetensors file's or checkpoint's tensors and its MoE layers", setup_inspect);

}  // namespace
}  // namespace fp4moe::cli
