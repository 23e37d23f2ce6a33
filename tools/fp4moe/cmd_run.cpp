// `fp4moe run`: one forward of a MoE layer on the GPU engine or the CPU reference.
//
// Weights: synthetic NVFP4 (a preset, default glm5, or any HF config.json via --config) or a real
// layer of a ModelOpt NVFP4 checkpoint (--checkpoint DIR [--layer L]). Inputs: hidden states from a
// fixed-seed generator (--tokens T), or --input IN.safetensors holding hidden_states [T, H] (bf16/f32)
// and optionally router_logits [T, E]. Prints the backend, the model, the time and a checksum of the
// output; --output OUT.safetensors receives out [T, H] bf16, topk_ids [T, k] I32, topk_weights [T, k] F32.
// --check also runs the CPU reference on the same inputs and compares.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "fp4moe/checkpoint.h"
#include "fp4moe/config.h"
#include "fp4moe/engine.h"
#include "fp4moe/reference.h"
#include "fp4moe/safetensors.h"
#include "fp4moe/status.h"
#include "fp4moe/tuner.h"
#include "fp4moe/weights.h"
#include "gpu_buffers.h"

namespace fp4moe::cli {
namespace {

constexpr double kCheckTolerance = 1e-2;  // relative L2 error per layer (the project's threshold)

struct RunOptions {
  std::string backend = "auto";
  int64_t tokens = 4;
  uint64_t seed = SyntheticSpec{}.seed;
  std::string preset = "glm5";
  std::string config_path;
  std::string checkpoint;
  int layer = -1;
  std::string input;
  std::string output;
  bool check = false;
  int threads = 0;
  int iters = 1;
  int device = 0;
};

// Where the weights come from.
struct Layer {
  MoeConfig cfg;
  std::optional<MoeLayerWeights> loaded;  // checkpoint layer; empty for synthetic weights
  SyntheticSpec spec;                      // synthetic weights
  std::string description;
};

struct Inputs {
  int64_t tokens = 0;
  std::vector<uint16_t> x;       // [T, H] bf16
  std::vector<float> logits;     // [T, E] or empty (computed from the router weight)
  std::string description;
};

struct Outputs {
  std::vector<uint16_t> out;     // [T, H] bf16
  std::vector<int32_t> ids;      // [T, k]
  std::vector<float> weights;    // [T, k]
  double forward_ms = 0.0;       // mean over the timed forwards
  std::string note;              // e.g. the tactics used
};

Layer load_layer(const RunOptions& o) {
  Layer layer;
  if (!o.checkpoint.empty()) {
    require_existing(o.checkpoint, "--checkpoint directory", /*allow_dir=*/true);
    const TensorStore store(o.checkpoint);
    const std::vector<int> layers = list_moe_layers(store);
    FP4MOE_CHECK(!layers.empty(), StatusCode::kNotFound, "checkpoint '{}' has no MoE layer (no tensor named "
                 "model.layers.<L>.mlp.experts.<e>.*)", o.checkpoint);
    int index = o.layer;
    if (index < 0) {
      index = layers.front();
    } else {
      FP4MOE_CHECK(std::find(layers.begin(), layers.end(), index) != layers.end(), StatusCode::kNotFound,
                   "--layer {}: checkpoint '{}' has no MoE layer {}; its MoE layers are {}", index, o.checkpoint,
                   index, fmt::join(layers, ", "));
    }
    layer.loaded = load_moe_layer(o.checkpoint, index);
    layer.cfg = layer.loaded->config;
    layer.description = fmt::format("checkpoint {} layer {}{}", o.checkpoint, index,
                                    o.layer < 0 ? " (the first MoE layer; choose with --layer)" : "");
    return layer;
  }
  if (!o.config_path.empty()) {
    require_existing(o.config_path, "--config file");
    layer.cfg = read_hf_config(o.config_path);
  } else {
    layer.cfg = moe_preset(o.preset);
  }
  layer.cfg.validate(o.config_path.empty() ? "preset " + o.preset : o.config_path);
  layer.spec.seed = o.seed;
  layer.description = fmt::format("synthetic NVFP4, seed {:#x}", o.seed);
  return layer;
}

Inputs load_inputs(const RunOptions& o, const MoeConfig& cfg) {
  Inputs in;
  if (o.input.empty()) {
    in.tokens = o.tokens;
    in.x = synthetic_hidden_states(o.seed, in.tokens, cfg.hidden);
    in.description = fmt::format("synthetic hidden states, seed {:#x}", o.seed);
    return in;
  }
  require_existing(o.input, "--input file");
  const SafetensorsFile file(o.input);
  FP4MOE_CHECK(file.has("hidden_states"), StatusCode::kNotFound,
               "--input '{}' has no tensor 'hidden_states' (expected [T, {}] bf16 or f32)", o.input, cfg.hidden);
  const TensorInfo& hs = file.info("hidden_states");
  FP4MOE_CHECK(hs.dtype == DType::kBF16 || hs.dtype == DType::kF32 || hs.dtype == DType::kF16,
               StatusCode::kFormatError, "--input '{}': hidden_states has dtype {}, expected BF16, F32 or F16",
               o.input, dtype_name(hs.dtype));
  FP4MOE_CHECK(hs.shape.size() == 2 && hs.shape[1] == cfg.hidden, StatusCode::kInvalidArgument,
               "--input '{}': hidden_states has shape {}, expected [T, {}] (hidden size of the layer {})", o.input,
               hs.shape_string(), cfg.hidden, cfg.name);
  in.tokens = hs.shape[0];
  in.x = file.read_bf16("hidden_states", {in.tokens, cfg.hidden});
  if (file.has("router_logits")) {
    in.logits = file.read_f32("router_logits", {in.tokens, cfg.num_experts});
    in.description = fmt::format("{} (hidden_states {} {}, router_logits given)", o.input,
                                 dtype_name(hs.dtype), hs.shape_string());
  } else {
    in.description = fmt::format("{} (hidden_states {} {}, router logits from the router weight)", o.input,
                                 dtype_name(hs.dtype), hs.shape_string());
  }
  return in;
}

// CPU reference. For synthetic weights only the experts the tokens route to are generated: the tokens
// are routed first with the synthetic router weight and bias (or the given logits).
Outputs run_cpu(const Layer& layer, const Inputs& in, int threads) {
  const MoeConfig& cfg = layer.cfg;
  const float* logits = in.logits.empty() ? nullptr : in.logits.data();
  const MoeLayerWeights* weights = layer.loaded ? &*layer.loaded : nullptr;
  MoeLayerWeights synthetic;
  if (weights == nullptr) {
    MoeLayerWeights router_only;
    router_only.config = cfg;
    router_only.router_weight = synthetic_router_weight(cfg, layer.spec);
    std::vector<float> computed;
    if (logits == nullptr) computed = router_logits_reference(in.x.data(), in.tokens, router_only);
    const std::vector<float> bias = synthetic_correction_bias(cfg, layer.spec);
    const RoutingResult r = route(logits != nullptr ? logits : computed.data(),
                                  cfg.has_correction_bias && !bias.empty() ? bias.data() : nullptr, in.tokens, cfg);
    std::vector<bool> which(static_cast<size_t>(cfg.num_experts), false);
    for (int32_t e : r.ids) {
      FP4MOE_CHECK(e >= 0 && e < cfg.num_experts, StatusCode::kInternal, "routing chose expert {} of {}", e,
                   cfg.num_experts);
      which[static_cast<size_t>(e)] = true;
    }
    // synthetic_layer treats an empty `which` as "all experts": keep at least one entry true.
    if (r.ids.empty() && !which.empty()) which[0] = true;
    synthetic = synthetic_layer(cfg, layer.spec, which);
    weights = &synthetic;
  }
  const StopWatch sw;
  MoeForwardResult fwd = moe_forward_reference(*weights, in.x.data(), in.tokens, logits, threads);
  Outputs out;
  out.forward_ms = sw.elapsed_ms();
  out.out = std::move(fwd.out);
  out.ids = std::move(fwd.routing.ids);
  out.weights = std::move(fwd.routing.weights);
  return out;
}

// GPU engine: weights on the device (generated there for synthetic layers), one untimed warm-up
// forward, 50 ms idle (the engine's set-up frees its staging weights, which slows the next ~10 ms of
// kernels: docs/perf.md, sm90 step 60), then `iters` timed forwards; outputs poisoned (0xD5) before the
// first forward.
Outputs run_cuda(const Layer& layer, const Inputs& in, const RunOptions& o) {
  const MoeConfig& cfg = layer.cfg;
  gpu_set_device(o.device);
  EngineOptions eo;
  eo.device = o.device;
  eo.max_tokens = std::max<int64_t>(in.tokens, 1);
  // The tactics `fp4moe tune` stored for this device and shape, if any (reads only; never tunes here).
  const bool tuned = load_cached_engine_options(cfg, o.device, tuning_cache_path(""), eo.max_tokens, &eo);
  std::unique_ptr<MoeEngine> engine;
  const Status st = layer.loaded ? MoeEngine::create(*layer.loaded, eo, &engine)
                                 : MoeEngine::create_synthetic(cfg, layer.spec, eo, &engine);
  st.throw_if_error();
  FP4MOE_CHECK(engine != nullptr, StatusCode::kInternal, "MoeEngine::create returned ok but no engine");

  const int64_t T = in.tokens, H = cfg.hidden, K = cfg.topk;
  GpuStream stream;
  DeviceBuffer x(static_cast<size_t>(T * H) * sizeof(uint16_t), "the input tokens");
  DeviceBuffer out(static_cast<size_t>(T * H) * sizeof(uint16_t), "the output");
  DeviceBuffer logits;
  x.upload(in.x.data(), x.bytes());
  out.fill(0xD5);
  if (!in.logits.empty()) {
    logits = DeviceBuffer(in.logits.size() * sizeof(float), "the router logits");
    logits.upload(in.logits.data(), logits.bytes());
  }
  ForwardOutputs fo;
  auto forward = [&]() {
    engine->forward(x.as<uint16_t>(), T, in.logits.empty() ? nullptr : logits.as<float>(), out.as<uint16_t>(),
                    stream.get(), &fo)
        .throw_if_error();
  };
  forward();  // warm-up (and the result we keep if the timed runs agree)
  gpu_settle(kSettleMs);
  GpuTimer timer;
  timer.start(stream.get());
  for (int i = 0; i < o.iters; ++i) forward();
  timer.stop(stream.get());
  Outputs res;
  res.forward_ms = static_cast<double>(timer.elapsed_ms()) / o.iters;
  stream.synchronize();

  res.out.resize(static_cast<size_t>(T * H));
  out.download(res.out.data(), res.out.size() * sizeof(uint16_t));
  res.ids.resize(static_cast<size_t>(T * K));
  res.weights.resize(static_cast<size_t>(T * K));
  if (T > 0) {
    FP4MOE_CHECK(fo.topk_ids != nullptr && fo.topk_weights != nullptr, StatusCode::kInternal,
                 "the engine's forward returned no top-k outputs");
    gpu_copy_to_host(res.ids.data(), fo.topk_ids, res.ids.size() * sizeof(int32_t));
    gpu_copy_to_host(res.weights.data(), fo.topk_weights, res.weights.size() * sizeof(float));
  }
  res.note = fmt::format("fc1 {}, fc2 {} ({})", engine->fc1_tactic_for(T), engine->fc2_tactic_for(T),
                         tuned ? "tuned, from the tuning cache" : "built-in heuristic: no tuning cache entry");
  return res;
}

void write_outputs(const std::string& path, const MoeConfig& cfg, const Inputs& in, const Outputs& res,
                   const std::string& backend) {
  const int64_t T = in.tokens;
  SafetensorsWriter w;
  w.add("out", DType::kBF16, {T, cfg.hidden}, res.out.data(), res.out.size() * sizeof(uint16_t));
  w.add("topk_ids", DType::kI32, {T, cfg.topk}, res.ids.data(), res.ids.size() * sizeof(int32_t));
  w.add("topk_weights", DType::kF32, {T, cfg.topk}, res.weights.data(), res.weights.size() * sizeof(float));
  w.add_metadata("backend", backend);
  w.add_metadata("model", cfg.to_string());
  w.write(path);
}

int run_command(const RunOptions& o) {
  // Refuse a bad --output before any work.
  if (!o.output.empty()) {
    std::vector<std::string> protect;
    if (!o.input.empty()) protect.push_back(o.input);
    if (!o.config_path.empty()) protect.push_back(o.config_path);
    if (!o.checkpoint.empty()) {
      for (const std::string& f : files_in_directory(o.checkpoint)) protect.push_back(f);
    }
    check_output_path(o.output, protect);
  }

  // Backend choice.
  std::string why_not;
  std::string backend, reason;
  if (o.backend == "cpu") {
    backend = "cpu";
    reason = "--backend cpu: the CPU reference";
  } else if (o.backend == "cuda") {
    FP4MOE_CHECK(cuda_backend_available(&why_not), StatusCode::kUnsupported,
                 "--backend cuda: the CUDA backend is not available: {}",
                 why_not.empty() ? "no usable CUDA device" : why_not);
    backend = "cuda";
    reason = "--backend cuda";
  } else if (cuda_backend_available(&why_not)) {
    backend = "cuda";
    reason = "auto: a CUDA device is available";
  } else {
    backend = "cpu";
    reason = "auto: " + (why_not.empty() ? std::string("no usable CUDA device") : why_not);
  }

  const StopWatch setup;
  const Layer layer = load_layer(o);
  const Inputs in = load_inputs(o, layer.cfg);
  fmt::print("backend: {} ({})\n", backend, one_line(reason));
  fmt::print("model: {}\n", layer.cfg.to_string());
  fmt::print("weights: {}\n", layer.description);
  fmt::print("input: {}\n", in.description);
  fmt::print("tokens: {}\n", in.tokens);
  std::fflush(stdout);

  const Outputs res = backend == "cuda" ? run_cuda(layer, in, o) : run_cpu(layer, in, o.threads);
  if (!res.note.empty()) fmt::print("tactics: {}\n", res.note);
  fmt::print("time: {:.3f} ms{}\n", res.forward_ms,
             backend == "cuda" ? fmt::format(" (mean of {} forward{} after a warm-up)", o.iters, o.iters == 1 ? "" : "s")
                               : std::string(" (one forward)"));
  fmt::print("total: {:.1f} ms (weights, inputs and forward)\n", setup.elapsed_ms());
  fmt::print("checksum: {}\n", bf16_checksum(res.out));

  int rc = kExitOk;
  if (o.check) {
    if (backend == "cpu") {
      fmt::print("check: skipped (the cpu backend is the reference)\n");
    } else {
      const Outputs ref = run_cpu(layer, in, o.threads);
      const std::vector<float> a = bf16_to_f32(res.out), b = bf16_to_f32(ref.out);
      const double err = relative_l2_error(a.data(), b.data(), static_cast<int64_t>(a.size()));
      int64_t ids_differ = 0;
      for (size_t i = 0; i < res.ids.size() && i < ref.ids.size(); ++i) ids_differ += res.ids[i] != ref.ids[i];
      const bool ok = err <= kCheckTolerance;
      fmt::print("check: relative L2 error {:.3e} vs the cpu reference (limit {:.0e}; reference {:.1f} ms; "
                 "{} of {} top-k ids differ): {}\n",
                 err, kCheckTolerance, ref.forward_ms, ids_differ, res.ids.size(), ok ? "ok" : "FAILED");
      if (!ok) {
        std::fprintf(stderr, "fp4moe run: error: check failed: relative L2 error %.3e vs the cpu reference exceeds %.0e\n",
                     err, kCheckTolerance);
        rc = kExitCheckFailed;
      }
    }
  }

  if (!o.output.empty()) {
    write_outputs(o.output, layer.cfg, in, res, backend);
    fmt::print("output: {} (out [{}, {}] BF16, topk_ids [{}, {}] I32, topk_weights [{}, {}] F32)\n", o.output,
               in.tokens, layer.cfg.hidden, in.tokens, layer.cfg.topk, in.tokens, layer.cfg.topk);
  }
  std::fflush(stdout);
  return rc;
}

std::function<int()> setup_run(CLI::App& sub) {
  auto o = std::make_shared<RunOptions>();
  sub.add_option("--backend", o->backend, "auto (cuda when a usable GPU is present, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  auto* tokens = sub.add_option("--tokens", o->tokens, "number of synthetic tokens (without --input)")
                     ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
                     ->capture_default_str();
  sub.add_option("--seed", o->seed, "seed of the synthetic weights and hidden states (decimal or 0x hex)")
      ->capture_default_str();
  auto* preset = sub.add_option("--preset", o->preset,
                                "embedded model shape: glm5, deepseek-v3, qwen3-235b, mixtral-8x7b")
                     ->capture_default_str();
  auto* config = sub.add_option("--config", o->config_path,
                                "a Hugging Face config.json: synthetic weights with its MoE shape");
  auto* ckpt = sub.add_option("--checkpoint", o->checkpoint, "a ModelOpt NVFP4 checkpoint directory");
  auto* layer = sub.add_option("--layer", o->layer, "MoE layer index in the checkpoint (default: the first)")
                    ->check(CLI::NonNegativeNumber);
  auto* input = sub.add_option("--input", o->input,
                               "safetensors file with hidden_states [T, H] (bf16/f32), optionally router_logits [T, E]");
  sub.add_option("--output", o->output,
                 "write out [T, H] bf16, topk_ids [T, k] I32, topk_weights [T, k] F32 to this safetensors file");
  sub.add_flag("--check", o->check, "also run the CPU reference and compare (fails above 1e-2 relative L2 error)");
  sub.add_option("--threads", o->threads, "CPU threads for the reference (0: all cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub.add_option("--iters", o->iters, "timed GPU forwards (after one warm-up)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub.add_option("--device", o->device, "CUDA device index")->check(CLI::NonNegativeNumber)->capture_default_str();
  preset->excludes(config)->excludes(ckpt);
  config->excludes(ckpt);
  layer->needs(ckpt);
  tokens->excludes(input);
  return [o]() { return run_command(*o); };
}

FP4MOE_COMMAND("run", "Run one MoE layer forward (synthetic GLM-5 layer by default) and print time and checksum",
               setup_run);

}  // namespace
}  // namespace fp4moe::cli
