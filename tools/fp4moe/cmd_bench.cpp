// `fp4moe bench`: the performance table of shared/DESIGN.md section 6 for one MoE layer shape on the GPU.
//
// Per token count T (default 1, 8, 32, 128, 512, 2048, 8192): the forward is captured in a CUDA graph
// and timed over replays with events (uniform random routing from N(0, 1) logits), after the card has
// been left idle --settle-ms (the set-up's large frees leave the driver work that slows the next ~10 ms
// of kernels) and --warmup replays (--warmup-ms: more, by time). One warp measures the SM clock before
// the warm-up and right after the timed replays (fp4moe/sm_clock.h); the table prints both. Reported: time,
// effective TB/s on the touched weight bytes (experts that received a token x (2I*H + H*I) x 0.5625
// bytes), TFLOP/s (2*T*topk*3*I*H), and the percentage of the floor max(bytes / copy ceiling, FLOPs /
// matmul ceiling). The copy ceiling is measured in the same run (device-to-device cudaMemcpy of 1 GiB,
// read + write bytes); the bf16 matmul ceiling needs a dense GEMM library and is taken from
// --matmul-tflops (bench/torch_peer.py measures it with torch in the same session and recomputes the
// table). The shared expert, when the model has one, runs and is timed but, as in DESIGN.md, is not
// counted in bytes or FLOPs. --dump-dir writes bench.json and each T's routing (topk ids/weights) so the
// PyTorch peer runs the same routing.
//
// Shards of a multi-GPU deployment, one GPU's part: --tp N runs I / N per expert (and shared I / N);
// --ep N runs expert-parallel rank --ep-rank (default 0) of N: the engine holds experts
// [r*E/N, (r+1)*E/N) (plus the shared expert on rank 0), routing stays global over all E experts and the
// pairs routed to other ranks are dropped. For an EP shard, touched bytes count the local experts that
// received a token and FLOPs the local pairs (2 * 3 * I * H each); the table and bench.json name the shard.
//
// --trace FILE (a build configured with -DFP4MOE_SM90_TRACE=ON, src/kernels/sm90_wgmma/sm90_trace.cuh):
// after timing each T, one more replay with the sm90 kernels' timeline records cleared, written as CSV
// (run "forward"; tools/sm90_timeline.py summarises it).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "gpu_buffers.h"
#include "fp4moe/config.h"
#include "fp4moe/device_caps.h"
#include "fp4moe/engine.h"
#include "fp4moe/sm_clock.h"
#include "fp4moe/status.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(FP4MOE_HAVE_CUDA) && defined(FP4MOE_SM90_TRACE)
#include "kernels/sm90_wgmma/sm90_family.h"
#include "kernels/sm90_wgmma/sm90_trace.cuh"
#include "kernels/sm90_wgmma/trace_csv.h"
#endif

namespace fp4moe::cli {
namespace {

struct BenchOptions {
  std::string preset = "glm5";
  std::string config_path;
  std::string tokens = "1,8,32,128,512,2048,8192";
  int iters = 20;
  int warmup = 3;
  double warmup_ms = 0;       // after `warmup` replays, more untimed replays until this much time has passed
  // Before the copy ceiling and before each T is captured and timed: the device synchronised, then the
  // host idle this long. The driver's work after a large cudaFree (the engine's set-up releases its
  // staging copy of the weights, the copy ceiling's probe its 2 GiB) competes with the next ~10 ms of
  // kernels on the card: a T = 1 forward timed within them takes 63 us instead of 59, and the copy
  // ceiling reads 3.8 TB/s instead of 4.2 (docs/perf.md, sm90 step 60). It also keeps a row from
  // inheriting the previous T's power draw.
  double settle_ms = kSettleMs;
  int device = 0;
  uint64_t seed = SyntheticSpec{}.seed;
  int tp = 1;                 // tensor-parallel shard: I / tp per GPU
  int ep = 1;                 // expert-parallel shard: E / ep experts per GPU
  int ep_rank = 0;            // which expert-parallel rank to run
  double matmul_tflops = 744; // bf16 dense ceiling (DESIGN.md section 6 measured 744 to 790 on this H200)
  std::string tactic;         // force one tactic for FC1 and FC2
  std::string family;         // choose only among this family's tactics
  std::vector<std::string> exclude;  // tactic names the engine must not choose
  bool extra_layouts = false; // EngineOptions::extra_weight_layouts
  std::string dump_dir;
  std::string trace_path;     // --trace FILE: sm90 timeline records of one replay per T (trace builds)
};

std::vector<int64_t> parse_tokens(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    FP4MOE_CHECK(!item.empty(), StatusCode::kInvalidArgument, "--tokens '{}': empty entry", s);
    size_t used = 0;
    int64_t t = 0;
    try {
      t = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FP4MOE_CHECK(used == item.size() && t >= 1, StatusCode::kInvalidArgument,
                 "--tokens '{}': '{}' is not a positive integer", s, item);
    v.push_back(t);
  }
  FP4MOE_CHECK(!v.empty(), StatusCode::kInvalidArgument, "--tokens is empty");
  return v;
}

// The layer shape one GPU runs, and which shard of the deployment it is.
struct BenchShape {
  MoeConfig cfg;                  // the engine's config (TP: I / tp; EP: the whole config, E global)
  int64_t first = 0, count = 0;   // routed experts held: [first, first + count)
  bool shared = true;             // runs the shared expert (when the model has one)
  std::string shard;              // one line for the table
};

// Checks --tp / --ep / --ep-rank against the config (before any device work, so the errors are the same
// with or without a GPU). Throws Error(kInvalidArgument) naming the values.
BenchShape bench_shape(const BenchOptions& o) {
  BenchShape b;
  MoeConfig cfg = o.config_path.empty() ? moe_preset(o.preset) : read_hf_config(o.config_path);
  FP4MOE_CHECK(!(o.ep > 1 && o.tp > 1), StatusCode::kInvalidArgument,
               "--ep {} and --tp {}: expert and tensor parallelism are not supported together; give one of them",
               o.ep, o.tp);
  FP4MOE_CHECK(o.tp >= 1 && cfg.inter % (16 * o.tp) == 0, StatusCode::kInvalidArgument,
               "--tp {}: moe_intermediate_size {} must split into multiples of 16", o.tp, cfg.inter);
  FP4MOE_CHECK(o.ep >= 1 && cfg.num_experts % o.ep == 0, StatusCode::kInvalidArgument,
               "--ep {}: must divide the {} routed experts of {}", o.ep, cfg.num_experts, cfg.name);
  FP4MOE_CHECK(o.ep_rank >= 0 && o.ep_rank < o.ep, StatusCode::kInvalidArgument,
               "--ep-rank {}: must be in [0, --ep {})", o.ep_rank, o.ep);
  const bool has_shared = cfg.n_shared_experts > 0 && cfg.shared_inter > 0;
  b.count = cfg.num_experts;
  b.shard = "whole layer";
  if (o.tp > 1) {
    cfg.inter /= o.tp;
    cfg.shared_inter /= o.tp;
    cfg.name += fmt::format("-tp{}", o.tp);
    b.shard = fmt::format("TP{} shard: I / {} = {} per expert{} on one GPU", o.tp, o.tp, cfg.inter,
                          has_shared ? fmt::format(", shared expert I / {} = {}", o.tp, cfg.shared_inter) : "");
  }
  if (o.ep > 1) {
    b.count = cfg.num_experts / o.ep;
    b.first = o.ep_rank * b.count;
    b.shared = o.ep_rank == 0;
    cfg.name += o.ep_rank == 0 ? fmt::format("-ep{}", o.ep) : fmt::format("-ep{}r{}", o.ep, o.ep_rank);
    b.shard = fmt::format("EP{} shard, rank {}: routed experts [{}, {}) of {}{}; routing over all {}, pairs of other "
                          "ranks' experts dropped",
                          o.ep, o.ep_rank, b.first, b.first + b.count, cfg.num_experts,
                          has_shared ? (b.shared ? " + the shared expert" : ", no shared expert (rank 0 runs it)") : "",
                          cfg.num_experts);
  }
  b.shared = b.shared && has_shared;
  b.cfg = cfg;
  return b;
}

#ifdef FP4MOE_HAVE_CUDA

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(StatusCode::kCudaError, fmt::format("{} failed: {}", what, cudaGetErrorString(e)));
}

void probe_ok(const Status& st) {
  if (!st.is_ok()) throw Error(st.code(), st.message());
}

// The SM clock probes' window (include/fp4moe/sm_clock.h): long against %globaltimer's update step.
constexpr int64_t kProbeWindowNs = 50000;

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

// Device-to-device copy bandwidth in TB/s (read + write bytes), best of 5 copies of 1 GiB.
double measure_copy_tbs(cudaStream_t s) {
  const size_t bytes = size_t{1} << 30;
  DevMem a(bytes), b(bytes);
  cuda_ok(cudaMemsetAsync(a.p, 1, bytes, s), "cudaMemsetAsync");
  cudaEvent_t e0, e1;
  cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
  float best = 1e30f;
  for (int i = 0; i < 6; ++i) {
    cuda_ok(cudaEventRecord(e0, s), "cudaEventRecord");
    cuda_ok(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    cuda_ok(cudaEventRecord(e1, s), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (i > 0) best = std::min(best, ms);  // the first copy warms up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * bytes / (best * 1e-3) / 1e12;
}

struct Row {
  int64_t tokens = 0, touched = 0, pairs = 0, warmup_replays = 0;
  double mhz_before = 0, mhz_after = 0;  // SM clock before the warm-up and right after the timed replays
  double ms = 0, bytes = 0, flops = 0, tbs = 0, tflops = 0, floor_ms = 0, pct = 0;
  std::string fc1, fc2;
};

int bench_command(const BenchOptions& o) {
  const BenchShape shape = bench_shape(o);
  const MoeConfig& cfg = shape.cfg;
  const std::vector<int64_t> tokens = parse_tokens(o.tokens);
  std::string why;
  if (!cuda_backend_available(&why)) throw Error(StatusCode::kUnsupported, "no usable GPU: " + why);
  const int64_t max_t = *std::max_element(tokens.begin(), tokens.end());
  cuda_ok(cudaSetDevice(o.device), "cudaSetDevice");
  const DeviceCaps caps = query_device_caps(o.device);
  EngineOptions eo;
  eo.device = o.device;
  eo.max_tokens = max_t;
  eo.fc1_tactic = eo.fc2_tactic = o.tactic;
  eo.ep_size = o.ep;
  eo.ep_rank = o.ep_rank;
  eo.extra_weight_layouts = o.extra_layouts;
  if (!o.family.empty()) {
    bool known = false;
    for (const TacticDesc& d : all_tactic_descs()) {
      known |= d.family == o.family;
      if (d.family != o.family) eo.excluded_tactics.push_back(d.name);
    }
    FP4MOE_CHECK(known, StatusCode::kInvalidArgument, "--family {}: no tactic of that family in this build", o.family);
  }
  for (const std::string& name : o.exclude) {
    const bool known = std::any_of(all_tactic_descs().begin(), all_tactic_descs().end(),
                                   [&](const TacticDesc& d) { return d.name == name; });
    FP4MOE_CHECK(known, StatusCode::kInvalidArgument, "--exclude: unknown tactic '{}' (fp4moe doctor lists them)", name);
    eo.excluded_tactics.push_back(name);
  }
  std::unique_ptr<MoeEngine> engine;
  const Status st = MoeEngine::create_synthetic(cfg, SyntheticSpec{o.seed}, eo, &engine);
  if (!st.is_ok()) throw Error(st.code(), "engine creation: " + st.message());
  cudaStream_t s;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace_out(nullptr, &std::fclose);
  std::unique_ptr<DevMem> trace_buf;
  if (!o.trace_path.empty()) {
#ifdef FP4MOE_SM90_TRACE
    trace_buf = std::make_unique<DevMem>(sm90::kTraceBytes);
    cuda_ok(cudaMemset(trace_buf->p, 0, sm90::kTraceBytes), "cudaMemset trace");
    const Status ts = sm90::set_trace_buffer(trace_buf->p);
    if (!ts.is_ok()) throw Error(ts.code(), "--trace: " + ts.message());
    trace_out.reset(std::fopen(o.trace_path.c_str(), "w"));
    FP4MOE_CHECK(trace_out != nullptr, StatusCode::kIoError, "--trace: cannot open {} for writing", o.trace_path);
    fmt::print(trace_out.get(), "T,run,{}\n", sm90::kTraceCsvColumns);
#else
    throw Error(StatusCode::kUnsupported,
                "--trace: this build records no sm90 timeline (configure with -DFP4MOE_SM90_TRACE=ON)");
#endif
  }
  gpu_settle(o.settle_ms);  // the engine's set-up has just released its staging copy of the weights
  const double copy_tbs = measure_copy_tbs(s);
  fmt::print("device: {} (sm_{}, {} SMs), copy ceiling {:.2f} TB/s (measured), bf16 matmul ceiling {:.0f} TFLOP/s "
             "(given)\n",
             caps.name, caps.cc(), caps.sm_count, copy_tbs, o.matmul_tflops);
  fmt::print("layer: {}; weights {:.2f} GB on device, workspace {:.2f} GB\n", cfg.to_string(),
             engine->weight_bytes() / 1e9, engine->workspace_bytes() / 1e9);

  const int64_t H = cfg.hidden, E = cfg.num_experts, K = cfg.topk, I = cfg.inter;
  const double expert_bytes = (2.0 * I * H + 1.0 * H * I) * 0.5625;
  DevMem probe(32);  // two SM clock probes' (cycles, ns)
  DevMem x(static_cast<size_t>(max_t * H) * 2), logits(static_cast<size_t>(max_t * E) * 4),
      out(static_cast<size_t>(max_t * H) * 2);
  std::vector<Row> rows;
  nlohmann::json dump_rows = nlohmann::json::array();
  for (int64_t T : tokens) {
    const std::vector<uint16_t> hx = synthetic_hidden_states(o.seed + static_cast<uint64_t>(T), T, H);
    std::vector<float> hl(static_cast<size_t>(T * E));
    std::mt19937_64 rng(o.seed * 31 + static_cast<uint64_t>(T));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : hl) v = nd(rng);
    cuda_ok(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy x");
    cuda_ok(cudaMemcpy(logits.p, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy logits");
    ForwardOutputs fo;
    Status fs = engine->forward(static_cast<uint16_t*>(x.p), T, static_cast<float*>(logits.p),
                                static_cast<uint16_t*>(out.p), s, &fo);
    if (!fs.is_ok()) throw Error(fs.code(), fmt::format("forward T={}: {}", T, fs.message()));
    cuda_ok(cudaStreamSynchronize(s), "forward");
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> w(static_cast<size_t>(T * K));
    cuda_ok(cudaMemcpy(ids.data(), fo.topk_ids, ids.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy ids");
    cuda_ok(cudaMemcpy(w.data(), fo.topk_weights, w.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy weights");
    // The held experts that received a token, and the pairs routed to them (all of them without EP).
    std::set<int32_t> held;
    int64_t pairs = 0;
    for (int32_t e : ids)
      if (e >= shape.first && e < shape.first + shape.count) {
        held.insert(e);
        ++pairs;
      }
    const int64_t touched = static_cast<int64_t>(held.size());

    gpu_settle(o.settle_ms);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    fs = engine->forward(static_cast<uint16_t*>(x.p), T, static_cast<float*>(logits.p), static_cast<uint16_t*>(out.p), s);
    cuda_ok(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
    if (!fs.is_ok()) throw Error(fs.code(), fmt::format("forward T={} during capture: {}", T, fs.message()));
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cuda_ok(cudaMemsetAsync(probe.p, 0, 32, s), "cudaMemsetAsync probe");
    probe_ok(enqueue_sm_clock_probe(s, kProbeWindowNs, static_cast<uint64_t*>(probe.p)));
    cudaEvent_t e0, e1;
    cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
    for (int i = 0; i < o.warmup; ++i) cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    int64_t warmup_replays = o.warmup;
    if (o.warmup_ms > 0) {
      // Time-based warm-up: 3 replays estimate a replay's time, then as many more as fill warmup_ms.
      cuda_ok(cudaEventRecord(e0, s), "cudaEventRecord");
      for (int i = 0; i < 3; ++i) cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
      cuda_ok(cudaEventRecord(e1, s), "cudaEventRecord");
      cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float est_ms = 0;
      cuda_ok(cudaEventElapsedTime(&est_ms, e0, e1), "cudaEventElapsedTime");
      const double per = std::max(1e-4, est_ms / 3.0);
      const int64_t more = std::max<int64_t>(0, static_cast<int64_t>((o.warmup_ms - est_ms) / per + 0.999));
      for (int64_t i = 0; i < more; ++i) cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
      warmup_replays += 3 + more;
    }
    cuda_ok(cudaEventRecord(e0, s), "cudaEventRecord");
    for (int i = 0; i < o.iters; ++i) cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    cuda_ok(cudaEventRecord(e1, s), "cudaEventRecord");
    probe_ok(enqueue_sm_clock_probe(s, kProbeWindowNs, static_cast<uint64_t*>(probe.p) + 2));
    cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float total_ms = 0;
    cuda_ok(cudaEventElapsedTime(&total_ms, e0, e1), "cudaEventElapsedTime");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    uint64_t clk[4] = {0, 0, 0, 0};
    cuda_ok(cudaMemcpyAsync(clk, probe.p, sizeof(clk), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync probe");
    cuda_ok(cudaStreamSynchronize(s), "sm clock probe");
#ifdef FP4MOE_SM90_TRACE
    if (trace_out) {  // one more replay with the records cleared
      cuda_ok(cudaMemset(trace_buf->p, 0, sm90::kTraceBytes), "cudaMemset trace");
      cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
      cuda_ok(cudaStreamSynchronize(s), "trace replay");
      std::vector<unsigned long long> rec(sm90::kTraceBytes / 8);
      cuda_ok(cudaMemcpy(rec.data(), trace_buf->p, sm90::kTraceBytes, cudaMemcpyDeviceToHost), "cudaMemcpy trace");
      fmt::print(trace_out.get(), "{}", sm90::trace_csv_rows(rec, fmt::format("{},forward,", T)));
    }
#endif
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    Row r;
    r.tokens = T;
    r.touched = touched;
    r.pairs = pairs;
    r.ms = total_ms / o.iters;
    r.warmup_replays = warmup_replays;
    r.mhz_before = sm_clock_mhz(clk);
    r.mhz_after = sm_clock_mhz(clk + 2);
    r.bytes = touched * expert_bytes;
    r.flops = 2.0 * pairs * 3.0 * I * H;
    r.tbs = r.bytes / (r.ms * 1e-3) / 1e12;
    r.tflops = r.flops / (r.ms * 1e-3) / 1e12;
    r.floor_ms = std::max(r.bytes / (copy_tbs * 1e12), r.flops / (o.matmul_tflops * 1e12)) * 1e3;
    r.pct = 100.0 * r.floor_ms / r.ms;
    r.fc1 = engine->fc1_tactic_for(T);
    r.fc2 = engine->fc2_tactic_for(T);
    rows.push_back(r);
    dump_rows.push_back({{"tokens", T}, {"touched_experts", touched}, {"local_pairs", pairs}, {"ms", r.ms}, {"bytes", r.bytes},
                         {"flops", r.flops}, {"fc1", r.fc1}, {"fc2", r.fc2},
                         {"warmup_replays", r.warmup_replays}, {"sm_mhz_before_warmup", r.mhz_before},
                         {"sm_mhz_after_timing", r.mhz_after}});
    if (!o.dump_dir.empty()) {
      std::ofstream fi(fmt::format("{}/routing_T{}_ids.bin", o.dump_dir, T), std::ios::binary);
      fi.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
      std::ofstream fw(fmt::format("{}/routing_T{}_weights.bin", o.dump_dir, T), std::ios::binary);
      fw.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
      FP4MOE_CHECK(fi.good() && fw.good(), StatusCode::kIoError, "cannot write the routing of T={} into --dump-dir {}",
                   T, o.dump_dir);
    }
  }
  cudaStreamDestroy(s);
#ifdef FP4MOE_SM90_TRACE
  if (trace_out) {
    (void)sm90::set_trace_buffer(nullptr);
    trace_out.reset();
    fmt::print("timeline records written to {}\n", o.trace_path);
  }
#endif

  fmt::print("\n{}\n{:>6} {:>8} {:>7} {:>11} {:>9} {:>9} {:>10} {:>8} {:>7} {:>11}  {}\n", shape.shard, "T", "experts",
             "pairs", "time (us)", "TB/s", "TFLOP/s", "floor (us)", "% floor", "warm-up", "SM MHz b/a",
             "tactics (fc1 / fc2)");
  for (const Row& r : rows)
    fmt::print("{:>6} {:>8} {:>7} {:>11.1f} {:>9.2f} {:>9.1f} {:>10.1f} {:>7.1f}% {:>7} {:>5.0f}/{:<5.0f}  {} / {}\n",
               r.tokens, r.touched, r.pairs, r.ms * 1e3, r.tbs, r.tflops, r.floor_ms * 1e3, r.pct, r.warmup_replays,
               r.mhz_before, r.mhz_after, r.fc1, r.fc2);
  if (!o.dump_dir.empty()) {
    nlohmann::json j;
    j["device"] = caps.name;
    j["cc"] = caps.cc();
    j["config"] = {{"name", cfg.name},           {"hidden", H},
                   {"inter", I},                 {"experts", E},
                   {"topk", K},                  {"shared_inter", cfg.n_shared_experts > 0 ? cfg.shared_inter : 0},
                   {"routing", routing_kind_name(cfg.routing)}};
    j["shard"] = {{"text", shape.shard},
                  {"tp", o.tp},
                  {"ep_size", o.ep},
                  {"ep_rank", o.ep_rank},
                  {"expert_first", shape.first},
                  {"local_experts", shape.count},
                  {"shared_expert", shape.shared}};
    j["family"] = o.family.empty() ? std::string("any") : o.family;
    j["copy_tbs"] = copy_tbs;
    j["matmul_tflops_given"] = o.matmul_tflops;
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["warmup_ms"] = o.warmup_ms;
    j["settle_ms"] = o.settle_ms;
    j["rows"] = dump_rows;
    std::ofstream f(o.dump_dir + "/bench.json");
    f << j.dump(2) << "\n";
    FP4MOE_CHECK(f.good(), StatusCode::kIoError, "cannot write {}/bench.json", o.dump_dir);
    fmt::print("\nwrote {}/bench.json and the routing of each T\n", o.dump_dir);
  }
  std::fflush(stdout);
  return kExitOk;
}

#else

int bench_command(const BenchOptions& o) {
  (void)parse_tokens(o.tokens);  // report a malformed --tokens or shard before the missing backend
  (void)bench_shape(o);
  throw Error(StatusCode::kUnsupported, "this build has no CUDA backend; `fp4moe bench` needs a GPU");
}

#endif

std::function<int()> setup_bench(CLI::App& sub) {
  auto o = std::make_shared<BenchOptions>();
  auto* preset = sub.add_option("--preset", o->preset, "embedded model shape: glm5, deepseek-v3, qwen3-235b, mixtral-8x7b")
                     ->capture_default_str();
  auto* config = sub.add_option("--config", o->config_path, "a Hugging Face config.json giving the MoE shape");
  sub.add_option("--tokens", o->tokens, "comma-separated token counts")->capture_default_str();
  sub.add_option("--iters", o->iters, "timed graph replays per T")->check(CLI::Range(1, 100000))->capture_default_str();
  sub.add_option("--warmup", o->warmup, "untimed replays per T")->check(CLI::Range(0, 1000))->capture_default_str();
  sub.add_option("--warmup-ms", o->warmup_ms,
                 "after --warmup, more untimed replays until this many milliseconds of them have run (0: none)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  sub.add_option("--settle-ms", o->settle_ms,
                 "before each T: synchronise, then leave the card idle this many milliseconds (the driver's work "
                 "after the set-up's large frees slows the next ~10 ms of kernels; 0: none)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  sub.add_option("--device", o->device, "CUDA device index")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub.add_option("--seed", o->seed, "seed of the synthetic weights and inputs")->capture_default_str();
  sub.add_option("--tp", o->tp, "tensor-parallel shard: benchmark one GPU's I / tp slice")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub.add_option("--ep", o->ep,
                 "expert-parallel shard: benchmark one GPU's E / ep experts (rank --ep-rank; global routing, other "
                 "ranks' pairs dropped; the shared expert on rank 0); not with --tp")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub.add_option("--ep-rank", o->ep_rank, "which expert-parallel rank --ep runs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--matmul-tflops", o->matmul_tflops, "bf16 dense matmul ceiling for the floor (TFLOP/s)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--tactic", o->tactic, "force this tactic (stable name) for FC1 and FC2");
  sub.add_option("--family", o->family, "choose only among the tactics of this family (e.g. portable)");
  sub.add_option("--exclude", o->exclude,
                 "comma-separated tactics the engine must not choose (e.g. sm90.w4e4m3.m256n1k256.ws.s5.c4, which "
                 "holds a second packed copy of the weights)")
      ->delimiter(',');
  sub.add_flag("--extra-layouts", o->extra_layouts,
               "let the engine hold a second packed copy of the weights where a tile with a layout of its own is "
               "the better choice for some T (the sm90 e4m3 decode tile at T = 1); without it that tile runs "
               "only when every T of the run would choose it (--tokens 1)");
  sub.add_option("--dump-dir", o->dump_dir, "write bench.json and routing_T<T>_{ids,weights}.bin here (existing directory)")
      ->check(CLI::ExistingDirectory);
  sub.add_option("--trace", o->trace_path,
                 "write the sm90 kernels' timeline records of one replay per T to this CSV file (builds "
                 "configured with -DFP4MOE_SM90_TRACE=ON)");
  preset->excludes(config);
  return [o]() {
    if (!o->config_path.empty()) require_existing(o->config_path, "--config file");
    return bench_command(*o);
  };
}

FP4MOE_COMMAND("bench", "Time the MoE forward (CUDA graph replays) per token count; DESIGN.md section 6 table",
               setup_bench);

}  // namespace
}  // namespace fp4moe::cli
