// reference_tool: drives the CPU reference from raw little-endian files for check_reference.py, and
// times the GLM-5 reference forward.
//
//   reference_tool forward DIR    DIR/case.json + raw inputs -> raw outputs (see check_reference.py)
//   reference_tool synthetic DIR  DIR/case.json -> the synthetic layer's bytes and values
//   reference_tool glm5 [TOKENS] [THREADS]
//                                 GLM-5 layer, synthetic weights, only the routed experts generated;
//                                 prints the time of each phase; exit 1 on a non-finite or implausible output
//
// Raw files: *.f32 fp32, *.bf16 / *.u16 uint16 bf16 bits, *.i32 int32, *.u8 bytes; row-major.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/reference.h"
#include "fp4moe/status.h"
#include "fp4moe/synthetic_values.h"

namespace fp4moe {
namespace {

using json = nlohmann::json;

template <typename T>
std::vector<T> read_raw(const std::string& path, int64_t count) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  FP4MOE_CHECK(f.good(), StatusCode::kNotFound, "cannot open {}", path);
  const int64_t bytes = static_cast<int64_t>(f.tellg());
  FP4MOE_CHECK(bytes == count * static_cast<int64_t>(sizeof(T)), StatusCode::kFormatError,
               "{}: expected {} bytes ({} elements), found {}", path, count * sizeof(T), count, bytes);
  std::vector<T> v(static_cast<size_t>(count));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), bytes);
  return v;
}

template <typename T>
void write_raw(const std::string& path, const T* data, size_t count) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(T)));
  FP4MOE_CHECK(f.good(), StatusCode::kIoError, "cannot write {}", path);
}
template <typename T>
void write_raw(const std::string& path, const std::vector<T>& v) {
  write_raw(path, v.data(), v.size());
}

MoeConfig config_from_json(const json& j) {
  MoeConfig c;
  c.name = "check";
  c.hidden = j.at("hidden");
  c.inter = j.at("inter");
  c.num_experts = j.at("num_experts");
  c.topk = j.at("topk");
  c.routing = j.at("routing") == "sigmoid" ? RoutingKind::kSigmoidGrouped : RoutingKind::kSoftmaxTopK;
  c.n_group = j.value("n_group", 1);
  c.topk_group = j.value("topk_group", 1);
  c.norm_topk_prob = j.value("norm_topk_prob", false);
  c.routed_scaling_factor = j.value("routed_scaling_factor", 1.0f);
  c.has_correction_bias = j.value("has_correction_bias", false);
  c.n_shared_experts = j.value("n_shared_experts", 0);
  c.shared_inter = j.value("shared_inter", 0);
  c.validate("case.json");
  return c;
}

// Quantises fp32 [n, k] rows `offset ..` of a stacked file and records the packed result for Python.
struct QuantDump {
  std::vector<uint8_t> codes, scales;
  std::vector<float> tensor_scales;
  void add(const PackedNvfp4Weights* q, int64_t n, int64_t k) {
    if (q) {
      codes.insert(codes.end(), q->codes.begin(), q->codes.end());
      scales.insert(scales.end(), q->scales.begin(), q->scales.end());
      tensor_scales.push_back(q->tensor_scale);
    } else {
      codes.insert(codes.end(), static_cast<size_t>(n * k / 2), 0);
      scales.insert(scales.end(), static_cast<size_t>(n * k / 16), 0);
      tensor_scales.push_back(0.0f);
    }
  }
  void write(const std::string& prefix) const {
    write_raw(prefix + "_codes.u8", codes);
    write_raw(prefix + "_scales.u8", scales);
    write_raw(prefix + "_ts.f32", tensor_scales);
  }
};

LinearWeights quantize_slice(const std::vector<float>& all, int64_t index, int64_t n, int64_t k, const char* what) {
  return LinearWeights::from_nvfp4(quantize_nvfp4(all.data() + index * n * k, n, k, what));
}

int cmd_forward(const std::string& dir) {
  std::ifstream jf(dir + "/case.json");
  FP4MOE_CHECK(jf.good(), StatusCode::kNotFound, "cannot open {}/case.json", dir);
  const json j = json::parse(jf);
  const MoeConfig c = config_from_json(j);
  const int64_t T = j.at("tokens"), H = c.hidden, I = c.inter, E = c.num_experts;
  const std::vector<bool> present = j.at("present").get<std::vector<bool>>();
  const int threads = j.value("threads", 0);
  const bool logits_given = j.at("logits_given");

  MoeLayerWeights w;
  w.config = c;
  w.experts.resize(static_cast<size_t>(E));
  const std::vector<float> gate = read_raw<float>(dir + "/gate.f32", E * I * H);
  const std::vector<float> up = read_raw<float>(dir + "/up.f32", E * I * H);
  const std::vector<float> down = read_raw<float>(dir + "/down.f32", E * H * I);
  QuantDump qg, qu, qd;
  for (int64_t e = 0; e < E; ++e) {
    if (present.at(static_cast<size_t>(e))) {
      ExpertWeights& x = w.experts[static_cast<size_t>(e)];
      x.gate = quantize_slice(gate, e, I, H, "gate");
      x.up = quantize_slice(up, e, I, H, "up");
      x.down = quantize_slice(down, e, H, I, "down");
      qg.add(&x.gate.nvfp4, I, H);
      qu.add(&x.up.nvfp4, I, H);
      qd.add(&x.down.nvfp4, H, I);
    } else {
      qg.add(nullptr, I, H);
      qu.add(nullptr, I, H);
      qd.add(nullptr, H, I);
    }
  }
  qg.write(dir + "/q_gate");
  qu.write(dir + "/q_up");
  qd.write(dir + "/q_down");
  if (c.n_shared_experts > 0) {
    const int64_t IS = c.shared_inter;
    ExpertWeights s;
    if (j.at("shared_format") == "bf16") {
      s.gate = LinearWeights::from_bf16(IS, H, read_raw<uint16_t>(dir + "/shared_gate.bf16", IS * H));
      s.up = LinearWeights::from_bf16(IS, H, read_raw<uint16_t>(dir + "/shared_up.bf16", IS * H));
      s.down = LinearWeights::from_bf16(H, IS, read_raw<uint16_t>(dir + "/shared_down.bf16", H * IS));
    } else {
      s.gate = quantize_slice(read_raw<float>(dir + "/shared_gate.f32", IS * H), 0, IS, H, "shared gate");
      s.up = quantize_slice(read_raw<float>(dir + "/shared_up.f32", IS * H), 0, IS, H, "shared up");
      s.down = quantize_slice(read_raw<float>(dir + "/shared_down.f32", H * IS), 0, H, IS, "shared down");
      QuantDump sg, su, sd;
      sg.add(&s.gate.nvfp4, IS, H);
      su.add(&s.up.nvfp4, IS, H);
      sd.add(&s.down.nvfp4, H, IS);
      sg.write(dir + "/qs_gate");
      su.write(dir + "/qs_up");
      sd.write(dir + "/qs_down");
    }
    w.shared = std::move(s);
  }
  if (c.has_correction_bias) w.correction_bias = read_raw<float>(dir + "/bias.f32", E);
  const std::vector<uint16_t> x = read_raw<uint16_t>(dir + "/x.bf16", T * H);
  std::vector<float> logits;
  if (logits_given) {
    logits = read_raw<float>(dir + "/logits.f32", T * E);
  } else {
    w.router_weight = read_raw<float>(dir + "/router.f32", E * H);
    logits = router_logits_reference(x.data(), T, w);
  }
  write_raw(dir + "/logits_used.f32", logits);
  const MoeForwardResult r = moe_forward_reference(w, x.data(), T, logits_given ? logits.data() : nullptr, threads);
  write_raw(dir + "/out.bf16", r.out);
  write_raw(dir + "/ids.i32", r.routing.ids);
  write_raw(dir + "/weights.f32", r.routing.weights);
  return 0;
}

int cmd_synthetic(const std::string& dir) {
  std::ifstream jf(dir + "/case.json");
  FP4MOE_CHECK(jf.good(), StatusCode::kNotFound, "cannot open {}/case.json", dir);
  const json j = json::parse(jf);
  const MoeConfig c = config_from_json(j);
  const SyntheticSpec spec{j.at("seed").get<uint64_t>()};
  const std::vector<int64_t> experts = j.at("experts").get<std::vector<int64_t>>();
  std::vector<bool> which(static_cast<size_t>(c.num_experts), false);
  for (int64_t e : experts) which.at(static_cast<size_t>(e)) = true;
  const MoeLayerWeights w = synthetic_layer(c, spec, which);
  auto dump = [&](const ExpertWeights& x, const std::string& name) {
    const LinearWeights* l[3] = {&x.gate, &x.up, &x.down};
    const char* proj[3] = {"gate", "up", "down"};
    for (int p = 0; p < 3; ++p) {
      const std::string prefix = dir + "/" + name + "_" + proj[p];
      write_raw(prefix + "_codes.u8", l[p]->nvfp4.codes);
      write_raw(prefix + "_scales.u8", l[p]->nvfp4.scales);
      write_raw(prefix + "_ts.f32", &l[p]->nvfp4.tensor_scale, 1);
    }
  };
  for (int64_t e : experts) dump(w.experts[static_cast<size_t>(e)], "expert" + std::to_string(e));
  if (w.shared) dump(*w.shared, "shared");
  write_raw(dir + "/router.f32", w.router_weight);
  write_raw(dir + "/bias.f32", synthetic_correction_bias(c, spec));
  const float scale = synthetic_router_scale(c.hidden);
  write_raw(dir + "/router_scale.f32", &scale, 1);
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int cmd_glm5(int64_t tokens, int threads) {
  using clock = std::chrono::steady_clock;
  const MoeConfig c = glm5_config();
  const SyntheticSpec spec{};
  std::printf("config: %s; T=%lld, threads=%d (0 = all %u cores)\n", c.to_string().c_str(),
              static_cast<long long>(tokens), threads, std::thread::hardware_concurrency());
  std::mt19937 rng(2024);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(tokens * c.hidden));
  for (auto& v : x) v = f32_to_bf16_bits(nd(rng));

  auto t0 = clock::now();
  MoeLayerWeights router_only = synthetic_layer(c, spec, std::vector<bool>(static_cast<size_t>(c.num_experts), false));
  const std::vector<float> logits = router_logits_reference(x.data(), tokens, router_only);
  const RoutingResult routing = route(
      logits.data(), router_only.correction_bias.empty() ? nullptr : router_only.correction_bias.data(), tokens, c);
  std::vector<bool> which(static_cast<size_t>(c.num_experts), false);
  int64_t touched = 0;
  for (int32_t e : routing.ids) {
    touched += which[static_cast<size_t>(e)] ? 0 : 1;
    which[static_cast<size_t>(e)] = true;
  }
  const double t_route = seconds_since(t0);
  t0 = clock::now();
  const MoeLayerWeights w = synthetic_layer(c, spec, which);
  const double t_gen = seconds_since(t0);
  t0 = clock::now();
  const MoeForwardResult r = moe_forward_reference(w, x.data(), tokens, nullptr, threads);
  const double t_fwd = seconds_since(t0);

  double ss = 0;
  bool finite = true;
  for (uint16_t b : r.out) {
    const float v = bf16_bits_to_f32(b);
    finite = finite && std::isfinite(v);
    ss += static_cast<double>(v) * v;
  }
  const double rms = r.out.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(r.out.size()));
  const bool same_routing = r.routing.ids == routing.ids;
  std::printf("touched experts: %lld (+ shared)\n", static_cast<long long>(touched));
  std::printf("router+routing: %.3f s, synthetic weights: %.3f s, forward: %.3f s, total %.3f s\n", t_route, t_gen,
              t_fwd, t_route + t_gen + t_fwd);
  std::printf("output rms %.4f, finite %s, routing reproduced by forward: %s\n", rms, finite ? "yes" : "no",
              same_routing ? "yes" : "no");
  const bool ok = finite && same_routing && (tokens == 0 || (rms > 1e-2 && rms < 1e2));
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace fp4moe

int main(int argc, char** argv) {
  const std::string usage = "usage: reference_tool forward DIR | synthetic DIR | glm5 [TOKENS] [THREADS]";
  if (argc < 2) {
    std::fprintf(stderr, "%s\n", usage.c_str());
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "forward" && argc == 3) return fp4moe::cmd_forward(argv[2]);
    if (cmd == "synthetic" && argc == 3) return fp4moe::cmd_synthetic(argv[2]);
    if (cmd == "glm5" && argc <= 4)
      return fp4moe::cmd_glm5(argc > 2 ? std::stoll(argv[2]) : 4, argc > 3 ? std::stoi(argv[3]) : 0);
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "reference_tool %s: %s: %s\n", cmd.c_str(), fp4moe::status_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reference_tool %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "%s\n", usage.c_str());
  return 2;
}
