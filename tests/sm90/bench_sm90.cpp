// Microbenchmark of the sm90 tactics on the GLM-5 MoE GEMM shapes (H = 6144, I = 2048, E = 256, top-8;
// --tp8 uses the TP8 shard I = 256). For each T it draws uniform random top-8 routing, builds the
// expert offsets and FC1's gather index, and times every tactic on FC1 (gather, SwiGLU), on "fc1c" (FC1
// reading the token rows from a copy already in grouped order, as the engine does for wide token tiles:
// contiguous rows, loaded by TMA) and on FC2 (contiguous) with CUDA-graph replay; then the best pair:
// the best FC1 or, when faster, the gathered copy (the engine's gather_rows kernel, timed inside the
// pair) + the best fc1c, then the best FC2; and per tactic FC1 chained into FC2 in one launch, on the copy
// (the copy included) and through the index (no copy), the faster of the two reported, beside the same
// tactic's two launches. Every sm90 tactic runs, the resident one (sm90_cc.cu) too; a tactic whose preflight
// fails at a T (the resident one past one row per expert) is skipped there with a line naming the reason.
//   touched bytes = active experts * (2I*H + H*I) * 0.5625   (codes + E4M3 scales)
//   FLOPs         = 2 * T * topk * 3 * I * H
// Weights are filled with a constant byte pattern: the kernel's work does not depend on the values
// (correctness is tactics_test's job). The device-to-device copy ceiling is measured in the same run;
// before the read ceiling and before each T the device is left idle 50 ms (docs/perf.md, sm90 step 60).
//   bench_sm90 [--tp8] [--tokens 1,8,32,128] [--iters 50] [--layers N] [--trace FILE]
// A tactic that can leave FC2's fp32 rows to the caller (the resident one) also gets a "chain32" row: its chain
// as the forward runs it (finalize rounds and zeroes the rows there; here they are left to grow).
// --layers N (2 to 64; 0, the default, off): after each T's rows, the best chain and the best pair again as a
// server's decode-step graph holds them: N layers in one graph, each with its own weights (allocated here, as
// many as fit in 80% of the free memory) and its own routing drawn like the first, so that no layer finds the
// one before's weight bytes in L2 and the graph's launch is paid once for N layers; reported per layer.
//   bench_sm90 --floor [--iters 200]
//   bench_sm90 --resident [--iters 200] | --resident-cc [--iters 200]
// --floor: the least a forward replayed from a graph can take to read a decode step's weights, whatever
// its kernels (docs/perf.md, sm90 step 40): per graph replay, one launch that reads nothing, and
// launches that only read the routed (and shared) weight bytes of the GLM-5 layer and its TP8 shard at
// T = 1, L2 cold (a 512 MB read before each, its own time subtracted) and warm (the same bytes again);
// then the resident-weights skeleton of the TP8 shard at T = 1 (resident_probe.cu, sm90 step 61), with
// its stand-in math and without, and its timeline; then the weight producer's bulk-copy ring without the
// math, with 1, 4 or 16 copies per stage.
// --resident: only what sm90 steps 62 and 63 need of --floor (the empty launch, the TP8 shard's plain read,
// the skeleton with FC2's copies after FC1's 9th chunk, with and without its stand-in math), then the
// resident GEMMs with the family's real math (resident_gemm.cu): checked against the CPU reference, then
// timed the same way, each with a timeline; rows "resident GEMMs[ variant][ xs], C/F/L" (C FC1 blocks a
// commit group, FC2's copies after F of FC1's 12 groups, FC1's copies L groups ahead or all at once if 0;
// xs: the token's K half by one copy; variants "clustered" (in clusters of two, placement only), "split"
// (the cluster exchange and FC2 split by K), "ll" (the flag-in-data publication and FC2 by FC1 tiles,
// step 64) and "e4m3" (both GEMMs on the e4m3 tile's math, step 65)) and the four diagnostic builds of
// FC1's loop (no dequantisation, no wgmmas, no waits, no math), which are timed only. --resident --iters
// 0: the checks alone (e.g. under compute-sanitizer).
// --resident-cc: the empty launch and the TP8 shard's plain read, then the GEMMs with no hand-over between
// CTAs (resident_cc.cu, sm90 step 66): checked against the CPU reference, then timed the same way, each
// with a timeline; rows "resident cc[ wide| pre P][, no memset], F/U" (F: FC2's copies after FC1's chunk F - 1,
// 0 at the start; U: FC1 chunks a loop step; P: FC2 chunks decoded before the SwiGLU row), "stores" and "no
// math" (timed only). --resident-cc --iters 0: the checks alone.
// --trace FILE (a build with -DFP4MOE_SM90_TRACE, sm90_trace.cuh): after timing each T, one replay each of
// the best chain (copy + FC1 chained into FC2), the same tactic's pair (copy + FC1 + FC2), and the chain
// with a shared expert (one expert, all T tokens, FC1 then FC2 on the same tactic) on a second stream as
// the engine runs it; every CTA's per-item times go to FILE as CSV (tools/sm90_timeline.py summarises).
// Where the best chain is the resident tactic, a fourth replay runs it as the forward does (through the index,
// FC2's fp32 rows left to the caller), and each replay but the pair's prints the tactic's own timeline on
// stdout instead of FILE ("cc timeline": each of sm90_cc.h's kCcTrace* words of the chained launch, p50 and
// max over the CTAs); in such a build, FP4MOE_SM90_CC_NOMATH=1 makes its plain chain wait for every chunk and
// do no math (wrong output, timed only).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_kernels.h"
#include "fp4moe/device_caps.h"
#include "fp4moe/reference.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_cc.h"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "kernels/sm90_wgmma/sm90_trace.cuh"
#include "kernels/sm90_wgmma/trace_csv.h"
#include "resident_cc_layout.h"
#include "sm90_test_util.h"

namespace fp4moe {
namespace sm90test {
cudaError_t launch_stream_read(const void* src, size_t bytes, uint32_t* sink, int sms, cudaStream_t s);
cudaError_t launch_stream_read_unrolled(const void* src, size_t bytes, uint32_t* sink, int sms, cudaStream_t s);
cudaError_t launch_empty(uint32_t* sink, int sms, cudaStream_t s);
int64_t bulk_stream_bytes_per_cta(int stages);
cudaError_t launch_bulk_stream(const void* src, int stages, int pieces, uint32_t* sink, int sms, cudaStream_t s);
size_t resident_fc1_bytes();
size_t resident_fc2_bytes();
cudaError_t launch_resident_skeleton(const void* fc1, const void* fc2, const void* x, void* act, unsigned* counters,
                                     void* y, unsigned long long* stamps, bool math, bool cluster, int fc2_after,
                                     cudaStream_t s);
int resident_max_active_clusters();
int resident_gemm_pairs();
int resident_gemm_hidden();
int resident_gemm_inter();
cudaError_t launch_resident_gemm(const void* fc1, const void* fc2, const float* s1, const float* s2,
                                 const int* experts, const void* x, float* partials, unsigned* counters, void* act,
                                 void* y, float* yacc, unsigned long long* stamps, unsigned long long* llpart,
                                 int mode, int per_commit, int fc2_after, int lead, bool split, bool clustered,
                                 bool xstage, int ll, bool e4m3, cudaStream_t s);
int resident_gemm_stamps();
int resident_gemm_max_clusters();
void split_fc2_layout(const uint8_t* packed, uint8_t* out, int experts);
int resident_cc_stamps();
size_t resident_cc_bytes(int experts);
cudaError_t launch_resident_cc(const void* packed, const int* experts, const void* x, const float* s1,
                               const float* s2, void* act, float* y, unsigned long long* stamps, int mode,
                               int fc2_after, int unroll, bool wide, int pre, cudaStream_t s);
}
namespace {

using sm90test::DeviceBuffer;

constexpr int64_t kH = 6144, kE = 256, kTopk = 8;
// NVFP4 bytes of a rows x cols weight matrix: half a byte per code, one E4M3 scale per 16 codes.
double nvfp4_bytes(double rows, double cols) { return rows * cols * 0.5625; }

struct Routing {
  std::vector<int32_t> offsets;    // [E + 1]
  std::vector<int32_t> row_token;  // [T * topk] token of each expert-sorted row
  int64_t active = 0;
};

Routing route_uniform(int64_t tokens, std::mt19937& rng) {
  std::vector<std::vector<int32_t>> per(kE);
  std::vector<int32_t> ids(kE);
  std::iota(ids.begin(), ids.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < kTopk; ++k) std::swap(ids[k], ids[k + rng() % (kE - k)]);
    for (int k = 0; k < kTopk; ++k) per[ids[k]].push_back(static_cast<int32_t>(t));
  }
  Routing r;
  r.offsets.assign(kE + 1, 0);
  for (int64_t e = 0; e < kE; ++e) {
    r.offsets[e + 1] = r.offsets[e] + static_cast<int32_t>(per[e].size());
    r.active += per[e].empty() ? 0 : 1;
    r.row_token.insert(r.row_token.end(), per[e].begin(), per[e].end());
  }
  return r;
}

// `body` captured into a CUDA graph on `s`, instantiated and replayed three times (warm-up).
class WarmGraph {
 public:
  template <typename F>
  WarmGraph(F body, cudaStream_t s) {
    SM90_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    body(s);
    SM90_CUDA_OK(cudaStreamEndCapture(s, &g_));
    SM90_CUDA_OK(cudaGraphInstantiate(&ge_, g_, 0));
    for (int i = 0; i < 3; ++i) launch(s);
  }
  ~WarmGraph() {
    cudaGraphExecDestroy(ge_);
    cudaGraphDestroy(g_);
  }
  WarmGraph(const WarmGraph&) = delete;
  WarmGraph& operator=(const WarmGraph&) = delete;
  void launch(cudaStream_t s) const { SM90_CUDA_OK(cudaGraphLaunch(ge_, s)); }

 private:
  cudaGraph_t g_ = nullptr;
  cudaGraphExec_t ge_ = nullptr;
};

// Milliseconds per replay of `body` captured into a graph.
template <typename F>
double time_graph(F body, int iters, cudaStream_t s) {
  const WarmGraph graph(body, s);
  cudaEvent_t a, b;
  SM90_CUDA_OK(cudaEventCreate(&a));
  SM90_CUDA_OK(cudaEventCreate(&b));
  SM90_CUDA_OK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) graph.launch(s);
  SM90_CUDA_OK(cudaEventRecord(b, s));
  SM90_CUDA_OK(cudaEventSynchronize(b));
  float ms = 0;
  SM90_CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

double copy_ceiling_tbs(cudaStream_t s) {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer src(bytes), dst(bytes);
  SM90_CUDA_OK(cudaMemset(src.get(), 1, bytes));
  const double ms = time_graph(
      [&](cudaStream_t st) { SM90_CUDA_OK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, st)); },
      10, s);
  return 2.0 * bytes / (ms * 1e-3) / 1e12;  // read + write
}

double read_ceiling_tbs(cudaStream_t s, int sms) {
  const size_t bytes = size_t(4) << 30;
  DeviceBuffer src(bytes), sink(16);
  SM90_CUDA_OK(cudaMemset(src.get(), 1, bytes));
  const double ms = time_graph(
      [&](cudaStream_t st) {
        SM90_CUDA_OK(sm90test::launch_stream_read(src.get(), bytes, static_cast<uint32_t*>(sink.get()), sms, st));
      },
      10, s);
  return bytes / (ms * 1e-3) / 1e12;
}

// The resident probes' common inputs (TP8 shard, one token): random canonical weights of `pairs` experts,
// their tensor scales on the device, the experts in a shuffled order (device), one random token (bf16 on the
// device, its values on the host); and the check of a launch's outputs against the CPU reference.
struct ResidentInputs {
  GemmProblem p1, p2;
  sm90test::RandomWeights w1, w2;
  std::vector<int> experts;
  std::vector<float> xf;
  DeviceBuffer ts1, ts2, ex, xb;
  ResidentInputs(int pairs, int64_t H, int64_t I, std::mt19937& rng)
      : p1(problem(GemmOp::kFc1SwiGlu, pairs, I, H)), p2(problem(GemmOp::kFc2, pairs, H, I)),
        w1(sm90test::random_weights(p1, rng)), w2(sm90test::random_weights(p2, rng)), experts(pairs), xf(H),
        ts1(w1.tensor_scales.size() * 4), ts2(w2.tensor_scales.size() * 4), ex(pairs * 4), xb(H * 2) {
    SM90_CUDA_OK(cudaMemcpy(ts1.get(), w1.tensor_scales.data(), ts1.size(), cudaMemcpyHostToDevice));
    SM90_CUDA_OK(cudaMemcpy(ts2.get(), w2.tensor_scales.data(), ts2.size(), cudaMemcpyHostToDevice));
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    SM90_CUDA_OK(cudaMemcpy(ex.get(), experts.data(), ex.size(), cudaMemcpyHostToDevice));
    std::vector<uint16_t> xh(H);
    std::uniform_real_distribution<float> ux(-1.f, 1.f);
    for (int64_t k = 0; k < H; ++k) {
      xh[k] = f32_to_bf16_bits(ux(rng));
      xf[k] = bf16_bits_to_f32(xh[k]);
    }
    SM90_CUDA_OK(cudaMemcpy(xb.get(), xh.data(), xb.size(), cudaMemcpyHostToDevice));
  }
  const float* s1() const { return static_cast<const float*>(ts1.get()); }
  const float* s2() const { return static_cast<const float*>(ts2.get()); }
  const int* expert_ids() const { return static_cast<const int*>(ex.get()); }
  // FC1's bf16 rows `act` [pairs][I] and FC2's rows `y` [pairs][H] against the CPU reference (relative L2
  // error of the worst pair <= 5e-3 for FC1, <= 1e-2 for FC2 after FC1); prints the result under `name`.
  bool check(const std::string& name, const std::vector<uint16_t>& act, const std::vector<float>& y) const {
    const int64_t H = p1.k, I = p1.n;
    double worst_a = 0, worst_y = 0;
    bool ok = true;
    // The worst error, NaN (an output never written keeps its NaN poison) kept as NaN.
    auto worse = [](double worst, double e) { return std::isnan(worst) || std::isnan(e) ? NAN : std::max(worst, e); };
    for (size_t j = 0; j < experts.size(); ++j) {
      std::vector<float> ra(I), ry(H), ga(I);
      sm90test::reference_row(p1, w1, experts[j], xf.data(), ra.data());
      sm90test::reference_row(p2, w2, experts[j], ra.data(), ry.data());
      for (int64_t i = 0; i < I; ++i) ga[i] = bf16_bits_to_f32(act[j * I + i]);
      const double ea = relative_l2_error(ga.data(), ra.data(), I);
      const double ey = relative_l2_error(y.data() + j * H, ry.data(), H);
      ok = ok && ea <= 5e-3 && ey <= 1e-2;  // false for NaN
      worst_a = worse(worst_a, ea);
      worst_y = worse(worst_y, ey);
    }
    fmt::print("{}: check against the CPU reference, worst pair's relative L2 error FC1 {:.2e} (<= 5e-3), FC2 "
               "{:.2e} (<= 1e-2): {}\n", name, worst_a, worst_y, ok ? "pass" : "FAIL");
    return ok;
  }

 private:
  static GemmProblem problem(GemmOp op, int pairs, int64_t n, int64_t k) {
    GemmProblem p;
    p.op = op, p.num_experts = pairs, p.n = n, p.k = k, p.total_rows = p.max_rows_per_expert = pairs;
    return p;
  }
};

// The resident-weights GEMMs with their real math (resident_gemm.cu, docs/perf.md sm90 step 62): random
// canonical weights for 8 experts packed by the family's device pack, one random token, the 8 experts in a
// shuffled order; FC1's output and FC2's rows checked against the CPU reference (outputs poisoned first;
// relative L2 error <= 5e-3 for FC1, <= 1e-2 for FC2 after FC1), then timed as the floor's rows are, and
// one cold launch's timeline. Returns 1 when the check fails.
template <class ColdUs, class Median3, class Timeline, class Empty>
int run_resident_gemm(int iters, cudaStream_t s, ColdUs cold_us, Median3 median3, Timeline timeline, Empty empty,
                      double graph_empty, double cold_empty, double copy_tbs) {
  const int pairs = sm90test::resident_gemm_pairs();
  const int64_t H = sm90test::resident_gemm_hidden(), I = sm90test::resident_gemm_inter();
  std::mt19937 rng(20261204);
  const ResidentInputs in(pairs, H, I, rng);
  const GemmProblem &p1 = in.p1, &p2 = in.p2;
  const sm90test::RandomWeights &w1 = in.w1, &w2 = in.w2;
  DeviceBuffer c1(w1.canonical.size()), c2(w2.canonical.size()), k1(sm90::packed_bytes(p1)),
      k2(sm90::packed_bytes(p2)), part(pairs * 16 * 64 * 4), cnt(pairs * 4), act(pairs * I * 2), y(pairs * H * 2),
      yacc(pairs * H * 4), llpart(pairs * 16 * 64 * 8);
  SM90_CUDA_OK(cudaMemcpy(c1.get(), w1.canonical.data(), c1.size(), cudaMemcpyHostToDevice));
  SM90_CUDA_OK(cudaMemcpy(c2.get(), w2.canonical.data(), c2.size(), cudaMemcpyHostToDevice));
  DeviceBuffer k1e(k1.size()), k2e(k2.size());  // the e4m3 rows' kSm90E4m3 layout
  Status st = sm90::pack_device(p1, c1.get(), k1.get(), s);
  if (st.is_ok()) st = sm90::pack_device(p2, c2.get(), k2.get(), s);
  if (st.is_ok()) st = sm90::pack_e4m3_device(p1, c1.get(), k1e.get(), s);
  if (st.is_ok()) st = sm90::pack_e4m3_device(p2, c2.get(), k2e.get(), s);
  if (!st.is_ok()) throw std::runtime_error(st.to_string());
  // FC2 in the split launch's half blocks (resident_gemm.cu, split_fc2_layout), from the device pack's bytes.
  DeviceBuffer k2h(k2.size());
  {
    std::vector<uint8_t> packed(k2.size()), split(k2.size());
    SM90_CUDA_OK(cudaStreamSynchronize(s));  // the pack ran on s
    SM90_CUDA_OK(cudaMemcpy(packed.data(), k2.get(), k2.size(), cudaMemcpyDeviceToHost));
    sm90test::split_fc2_layout(packed.data(), split.data(), pairs);
    SM90_CUDA_OK(cudaMemcpy(k2h.get(), split.data(), k2h.size(), cudaMemcpyHostToDevice));
  }
  SM90_CUDA_OK(cudaMemset(cnt.get(), 0, cnt.size()));
  SM90_CUDA_OK(cudaMemset(llpart.get(), 0, llpart.size()));
  struct Variant {
    int mode, per_commit, fc2_after, lead;
    bool split, clustered, xstage;
    int ll;  // 0, 1 (FC2 on wgmma), 2 (FC2 on the CUDA cores), 3 (1, both tiles awaited first)
    bool e4m3 = false;
  };
  const int clusters = sm90test::resident_gemm_max_clusters();
  fmt::print("resident GEMMs: the device holds {} of the split launch's 2-CTA clusters at once (64 needed)\n",
             clusters);
  // Cold baseline of the split rows: the memset of yacc and an empty launch, so that the floor counts
  // the launch alone (in an engine the next kernel would zero yacc, as finalize zeroes the chain's counters).
  double cold_memset = 0;
  if (iters > 0)
    cold_memset = cold_us([&](cudaStream_t st_) {
      SM90_CUDA_OK(cudaMemsetAsync(yacc.get(), 0, yacc.size(), st_));
      empty(st_);
    });
  for (const Variant vr :
       {Variant{0, 1, 9, 0, false, false, false, 0}, Variant{0, 1, 9, 0, false, false, true, 0},
        Variant{0, 1, 9, 0, false, false, true, 1}, Variant{0, 1, 9, 0, false, false, true, 2},
        Variant{0, 1, 9, 0, false, false, true, 3}, Variant{0, 1, 9, 0, false, false, true, 0, true},
        Variant{0, 1, 6, 0, false, false, true, 0, true}, Variant{0, 1, 9, 4, false, false, true, 0},
        Variant{0, 1, 9, 0, false, true, true, 0}, Variant{0, 1, 9, 0, true, false, true, 0},
        Variant{1, 1, 9, 0, false, false, true, 0}, Variant{2, 1, 9, 0, false, false, true, 0},
        Variant{3, 1, 9, 0, false, false, true, 0}, Variant{4, 1, 9, 0, false, false, true, 0}}) {
    const int mode = vr.mode;
    if ((vr.split || vr.clustered) && clusters < pairs * 16 / 2) continue;
    // Poisoned on the launches' stream (a plain cudaMemset runs on the legacy stream, which `s` does not wait for).
    SM90_CUDA_OK(cudaMemsetAsync(act.get(), 0xFF, act.size(), s));
    SM90_CUDA_OK(cudaMemsetAsync(y.get(), 0xFF, y.size(), s));
    SM90_CUDA_OK(cudaMemsetAsync(yacc.get(), 0xFF, yacc.size(), s));
    auto launch = [&](cudaStream_t st_, unsigned long long* stamps) {
      if (vr.split) SM90_CUDA_OK(cudaMemsetAsync(yacc.get(), 0, yacc.size(), st_));
      SM90_CUDA_OK(sm90test::launch_resident_gemm(
          vr.e4m3 ? k1e.get() : k1.get(), vr.split ? k2h.get() : (vr.e4m3 ? k2e.get() : k2.get()),
          in.s1(), in.s2(), in.expert_ids(), in.xb.get(),
          static_cast<float*>(part.get()), static_cast<unsigned*>(cnt.get()), act.get(), y.get(),
          static_cast<float*>(yacc.get()), stamps, static_cast<unsigned long long*>(llpart.get()), mode,
          vr.per_commit, vr.fc2_after, vr.lead, vr.split, vr.clustered, vr.xstage, vr.ll, vr.e4m3, st_));
    };
    const char* modes[5] = {"resident GEMMs", "resident, FC1 no dequant", "resident, FC1 no wgmma",
                            "resident, FC1 no waits", "resident, FC1 no math"};
    const char* lls[4] = {"", " ll", " ll cc", " ll both"};
    const std::string name =
        fmt::format("{}{}{}{}, {}/{}/{}", modes[mode], vr.split ? " split" : (vr.clustered ? " clustered" : lls[vr.ll]),
                    vr.e4m3 ? " e4m3" : "",
                    vr.xstage ? " xs" : "", vr.per_commit, vr.fc2_after, vr.lead);
    if (mode == 0) {  // the diagnostic modes compute wrong results by design: timed only
      launch(s, nullptr);
      SM90_CUDA_OK(cudaStreamSynchronize(s));
      std::vector<uint16_t> got_a(pairs * I), got_y(pairs * H);
      std::vector<float> got_acc(pairs * H);
      SM90_CUDA_OK(cudaMemcpy(got_a.data(), act.get(), act.size(), cudaMemcpyDeviceToHost));
      SM90_CUDA_OK(cudaMemcpy(got_y.data(), y.get(), y.size(), cudaMemcpyDeviceToHost));
      SM90_CUDA_OK(cudaMemcpy(got_acc.data(), yacc.get(), yacc.size(), cudaMemcpyDeviceToHost));
      if (!vr.split)
        for (int64_t i = 0; i < pairs * H; ++i) got_acc[i] = bf16_bits_to_f32(got_y[i]);
      if (!in.check(name, got_a, got_acc)) return 1;
    }
    if (iters == 0) continue;  // the checks alone (e.g. under compute-sanitizer)
    auto plain = [&](cudaStream_t st_) { launch(st_, nullptr); };
    const double bytes = double(k1.size() + k2.size());
    const double warm = median3([&] { return time_graph(plain, iters, s) * 1e3; });
    const double cold = cold_us(plain);
    // The split rows' memset taken out: their cold baseline is the memset and the empty launch.
    const double floor_us = graph_empty + (cold - (vr.split ? cold_memset : cold_empty));
    fmt::print("{:<32} {:>9.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.2f} {:>11.0f}%\n", name, bytes / 1e6, warm, cold,
               bytes / (cold * 1e-6) / 1e12, floor_us, 100 * bytes / (copy_tbs * 1e12) * 1e6 / floor_us);
    // ll: stamps 5 to 7 are warpgroup 0's polling start (FC2's A fragments ready) and its two FC1 tiles
    // seen (its K columns' SwiGLU values written).
    const bool ll = vr.ll != 0;
    const std::vector<const char*> names = {"entry",
                                            "FC1 group 0 seen",
                                            "FC1 group 5 seen",
                                            "FC1 group 11 seen",
                                            "FC1 summed",
                                            ll ? "wg0 polls" : "publication seen",
                                            ll ? "wg0 first tile seen" : "FC2 B written",
                                            ll ? "wg0 second tile seen" : "FC2 wgmmas retired",
                                            "end"};
    if (static_cast<int>(names.size()) != sm90test::resident_gemm_stamps())
      throw std::runtime_error("bench_sm90: the resident GEMMs' timeline has a different number of stamps");
    timeline([&](unsigned long long* stamps) { launch(s, stamps); }, names);
  }
  return 0;
}

// The TP8 shard's GEMMs at T = 1 with no hand-over between CTAs (resident_cc.cu, docs/perf.md sm90 step 66):
// random canonical weights for 8 experts in the probe's layout, one random token, the 8 experts in a
// shuffled order; FC1's output and FC2's rows (fp32, summed by red.add over the pair's 16 CTAs) checked
// against the CPU reference (FC1's output poisoned first, y zeroed by the launch's memset; relative L2 error
// <= 5e-3 for FC1, <= 1e-2 for FC2), then timed as the floor's rows are, with y's memset in each replay and
// in the baseline (rows "no memset": neither), and one cold launch's timeline. Returns 1 when a check fails.
template <class ColdUs, class Median3, class Timeline, class Empty>
int run_resident_cc(int iters, cudaStream_t s, ColdUs cold_us, Median3 median3, Timeline timeline, Empty empty,
                    double graph_empty, double cold_empty, double copy_tbs) {
  const int pairs = 8;
  const int64_t H = kH, I = 256;
  std::mt19937 rng(20261205);
  const ResidentInputs in(pairs, H, I, rng);
  std::vector<uint8_t> packed(sm90test::resident_cc_bytes(pairs));
  if (packed.size() != static_cast<size_t>(pairs * (I / sm90test::kCcCols) * sm90test::cc_part_bytes(H)))
    throw std::runtime_error("bench_sm90: the resident cc kernel and resident_cc_layout.h count different bytes");
  sm90test::pack_cc_layout(in.w1.canonical.data(), in.w2.canonical.data(), pairs, H, I, packed.data());
  DeviceBuffer k(packed.size()), act(pairs * I * 2), y(pairs * H * 4);
  SM90_CUDA_OK(cudaMemcpy(k.get(), packed.data(), k.size(), cudaMemcpyHostToDevice));
  double cold_memset = 0;
  if (iters > 0)
    cold_memset = cold_us([&](cudaStream_t st_) {
      SM90_CUDA_OK(cudaMemsetAsync(y.get(), 0, y.size(), st_));
      empty(st_);
    });
  struct Variant {
    int mode, fc2_after, unroll;
    bool memset;  // false: y is not zeroed in the replay (timed only; its baseline is the empty launch)
    bool wide = false;
    int pre = 0;  // FC2 chunks decoded before the SwiGLU row
  };
  const char* modes[3] = {"resident cc", "resident cc, stores", "resident cc, no math"};
  for (const Variant vr : {Variant{0, 0, 1, true}, Variant{0, 0, 2, true}, Variant{0, 0, 2, false},
                           Variant{0, 0, 1, true, true}, Variant{0, 0, 2, true, true}, Variant{0, 0, 2, false, true},
                           Variant{0, 0, 2, true, false, 1}, Variant{0, 0, 2, true, false, 2},
                           Variant{0, 0, 2, false, false, 2},
                           Variant{0, 9, 2, true}, Variant{1, 0, 2, true}, Variant{2, 0, 2, true},
                           Variant{2, 0, 2, false}}) {
    if (iters == 0 && !vr.memset) continue;
    auto launch = [&](cudaStream_t st_, unsigned long long* stamps) {
      if (vr.memset) SM90_CUDA_OK(cudaMemsetAsync(y.get(), 0, y.size(), st_));
      SM90_CUDA_OK(sm90test::launch_resident_cc(k.get(), in.expert_ids(), in.xb.get(), in.s1(), in.s2(), act.get(),
                                                static_cast<float*>(y.get()), stamps, vr.mode, vr.fc2_after,
                                                vr.unroll, vr.wide, vr.pre, st_));
    };
    const std::string name =
        fmt::format("{}{}{}{}, {}/{}", modes[vr.mode], vr.wide ? " wide" : "",
                    vr.pre ? fmt::format(" pre {}", vr.pre) : std::string(), vr.memset ? "" : ", no memset",
                    vr.fc2_after, vr.unroll);
    if (vr.mode == 0 && vr.memset) {  // the diagnostic modes compute wrong results by design: timed only
      SM90_CUDA_OK(cudaMemsetAsync(act.get(), 0xFF, act.size(), s));  // y: zeroed by the launch's own memset
      launch(s, nullptr);
      SM90_CUDA_OK(cudaStreamSynchronize(s));
      std::vector<uint16_t> got_a(pairs * I);
      std::vector<float> got_y(pairs * H);
      SM90_CUDA_OK(cudaMemcpy(got_a.data(), act.get(), act.size(), cudaMemcpyDeviceToHost));
      SM90_CUDA_OK(cudaMemcpy(got_y.data(), y.get(), y.size(), cudaMemcpyDeviceToHost));
      if (!in.check(name, got_a, got_y)) return 1;
    }
    if (iters == 0) continue;  // the checks alone (e.g. under compute-sanitizer)
    auto plain = [&](cudaStream_t st_) { launch(st_, nullptr); };
    const double bytes = double(k.size());
    const double warm = median3([&] { return time_graph(plain, iters, s) * 1e3; });
    const double cold = cold_us(plain);
    const double floor_us = graph_empty + (cold - (vr.memset ? cold_memset : cold_empty));
    fmt::print("{:<32} {:>9.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.2f} {:>11.0f}%\n", name, bytes / 1e6, warm, cold,
               bytes / (cold * 1e-6) / 1e12, floor_us, 100 * bytes / (copy_tbs * 1e12) * 1e6 / floor_us);
    const std::vector<const char*> names = {"entry",           "token ready",     "FC1 chunk 0 seen",
                                            "FC1 chunk 11 seen", "FC1 summed",     "FC2 chunk 0 seen",
                                            "FC2 chunk 5 seen",  "end"};
    if (static_cast<int>(names.size()) != sm90test::resident_cc_stamps())
      throw std::runtime_error("bench_sm90: the resident cc timeline has a different number of stamps");
    timeline([&](unsigned long long* stamps) { launch(s, stamps); }, names);
  }
  return 0;
}

// The resident tactic's timeline (sm90_cc.h's kCcTrace* words in the chained slot): each word's p50 and max
// over the CTAs that wrote it, in us from the first CTA's entry.
void print_cc_timeline(const std::vector<unsigned long long>& rec, const std::string& what) {
  using sm90::kTraceMaxCtas;
  using sm90::kTraceWords;
  const size_t base = size_t(2) * kTraceMaxCtas * kTraceWords;
  unsigned long long t0 = ~0ull;
  int nch = 0;
  for (int b = 0; b < kTraceMaxCtas; ++b)
    if (const unsigned long long e = rec[base + size_t(b) * kTraceWords + 1]) {
      t0 = std::min(t0, e);
      nch = static_cast<int>(rec[base + size_t(b) * kTraceWords + 3]);
    }
  if (t0 == ~0ull) {
    fmt::print("cc timeline {}: no records\n", what);
    return;
  }
  std::vector<std::pair<int, std::string>> words = {{1, "entry"}, {4, "expert known"}, {5, "copies issued"},
                                                    {sm90::kCcTraceToken, "token landed"},
                                                    {sm90::kCcTraceToken + 1, "token f16"}};
  for (int c = 0; c < nch && c < sm90::kCcTraceFc1Done - sm90::kCcTraceChunks; ++c)
    words.push_back({sm90::kCcTraceChunks + c, fmt::format("chunk {} seen", c)});
  words.push_back({sm90::kCcTraceFc1Done, "FC1 summed"});
  words.push_back({sm90::kCcTraceFc1Done + 1, "FC2 start"});
  words.push_back({sm90::kCcTraceFc2Done, "FC2 done (even chunks)"});
  words.push_back({sm90::kCcTraceFc2Done + 1, "FC2 done (odd chunks)"});
  words.push_back({2, "exit"});
  fmt::print("cc timeline {} ({} copies; us from the first entry, p50 / max over CTAs):\n", what, nch);
  for (const auto& [w, name] : words) {
    std::vector<double> v;
    for (int b = 0; b < kTraceMaxCtas; ++b) {
      const unsigned long long* r = &rec[base + size_t(b) * kTraceWords];
      if (r[1] != 0 && r[w] != 0) v.push_back(double(r[w] - t0) * 1e-3);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    fmt::print("  {:<24} {:6.2f} / {:6.2f}  ({} CTAs)\n", name, v[v.size() / 2], v.back(), v.size());
  }
}

// --floor (see the header). Cold: the graph [512 MB read, probe] minus the graph [512 MB read], so the
// probe's bytes come from HBM and its launch follows another one, as a forward's second kernel does.
// Floor of a one-graph forward that reads B bytes: a replay of a graph holding one empty launch plus
// (cold probe of B - cold empty probe). The ratio is the time B takes at the copy ceiling over that
// floor: no kernel reading those bytes in its own graph can reach a higher share of the ceiling. The
// ceiling is the Hopper issue's device-copy figure for the H200, 4.16 TB/s (the torch peer's copy, which
// the engine's benchmark measures, agrees within 1%; cudaMemcpy here measures less, see the header).
int run_floor(int iters, cudaStream_t s, int sms, bool resident_only, bool cc_only) {
  if (resident_only && iters == 0) {
    auto none = [](auto&&...) { return 0.0; };
    if (cc_only) return run_resident_cc(0, s, none, none, none, none, 0.0, 0.0, 0.0);
    return run_resident_gemm(0, s, none, none, none, none, 0.0, 0.0, 0.0);
  }
  constexpr double copy_tbs = 4.16;
  struct Case {
    const char* what;
    double bytes;
  };
  auto weights = [](double inter, double experts) {
    return experts * (nvfp4_bytes(2 * inter, kH) + nvfp4_bytes(kH, inter));
  };
  const Case cases[] = {
      {"empty launch", 0.0},
      {"TP8 T=1 routed (8 x I=256)", weights(256, 8)},
      {"TP8 T=1 routed + shared", weights(256, 9)},
      {"GLM-5 T=1 routed (8 x I=2048)", weights(2048, 8)},
      {"GLM-5 T=1 routed + shared", weights(2048, 9)},
  };
  const size_t flush_bytes = size_t(512) << 20;
  DeviceBuffer flush(flush_bytes), probe(static_cast<size_t>(weights(2048, 9)) / 16 * 16 + 16), sink(16);
  SM90_CUDA_OK(cudaMemset(flush.get(), 1, flush.size()));
  SM90_CUDA_OK(cudaMemset(probe.get(), 2, probe.size()));
  uint32_t* sk = static_cast<uint32_t*>(sink.get());
  auto read = [&](cudaStream_t st, double bytes) {
    if (bytes > 0)
      SM90_CUDA_OK(sm90test::launch_stream_read_unrolled(probe.get(), static_cast<size_t>(bytes) / 16 * 16, sk, sms, st));
    else
      SM90_CUDA_OK(sm90test::launch_empty(sk, sms, st));
  };
  auto evict = [&](cudaStream_t st) { SM90_CUDA_OK(sm90test::launch_stream_read_unrolled(flush.get(), flush_bytes, sk, sms, st)); };
  (void)time_graph(evict, iters, s);  // the clocks up before anything is timed
  double cold_empty = 0, graph_empty = 0;
  fmt::print("floor: per graph replay, {} replays, median of 3 rounds; % of a {:.2f} TB/s copy\n", iters, copy_tbs);
  fmt::print("{:<32} {:>9} {:>10} {:>10} {:>10} {:>11} {:>12}\n", "probe", "MB", "warm us", "cold us", "cold TB/s",
             "floor us", "max % copy");
  // The median of three rounds of `once` (microseconds).
  auto median3 = [](auto once) {
    const double a = once(), b = once(), c = once();
    return std::max(std::min(a, b), std::min(std::max(a, b), c));
  };
  // Microseconds per replay of `probe` after the 512 MB read, that read's own time subtracted (timed
  // right before, in each of three rounds), median of the rounds.
  auto cold_us = [&](auto probe) {
    return median3([&] {
      const double t_flush = time_graph(evict, iters, s) * 1e3;
      return time_graph([&](cudaStream_t st) {
               evict(st);
               probe(st);
             }, iters, s) * 1e3 - t_flush;
    });
  };
  for (const Case& c : cases) {
    if (resident_only && c.bytes != 0 && c.bytes != weights(256, 8)) continue;
    const double warm = median3([&] { return time_graph([&](cudaStream_t st) { read(st, c.bytes); }, iters, s) * 1e3; });
    const double cold = cold_us([&](cudaStream_t st) { read(st, c.bytes); });
    if (c.bytes == 0) {
      cold_empty = cold;
      graph_empty = warm;
    }
    const double floor_us = graph_empty + (cold - cold_empty);
    const double ceiling_us = c.bytes / (copy_tbs * 1e12) * 1e6;
    fmt::print("{:<32} {:>9.2f} {:>10.2f} {:>10.2f} {:>10} {:>11.2f} {:>12}\n", c.what, c.bytes / 1e6, warm, cold,
               c.bytes > 0 ? fmt::format("{:.2f}", c.bytes / (cold * 1e-6) / 1e12) : std::string("-"), floor_us,
               c.bytes > 0 ? fmt::format("{:.0f}%", 100 * ceiling_us / floor_us) : std::string("-"));
  }
  // The resident-weights skeleton for the TP8 shard at T = 1 (resident_probe.cu, sm90 step 61): the same
  // bytes as the "TP8 T=1 routed" row, all in shared memory at once, FC1 cut by rows, one publication
  // through global memory ("skeleton") or inside a 16-CTA cluster per expert ("clusters", where the device
  // holds eight such clusters at once); with its stand-in math and without (the structure's own floor).
  // After each, one cold launch with its timeline: per CTA, microseconds from the first CTA's entry.
  DeviceBuffer r1(sm90test::resident_fc1_bytes()), r2(sm90test::resident_fc2_bytes()), rx(kH * 2),
      ract(8 * 256 * 2), rcnt(64), ry(8 * kH * 2), rst(128 * 16 * 8);
  SM90_CUDA_OK(cudaMemset(r1.get(), 0x37, r1.size()));
  SM90_CUDA_OK(cudaMemset(r2.get(), 0x37, r2.size()));
  SM90_CUDA_OK(cudaMemset(rx.get(), 0x3c, rx.size()));
  SM90_CUDA_OK(cudaMemset(rcnt.get(), 0, rcnt.size()));
  // One cold launch of `launch(stamps)` after the 512 MB read, then per CTA microseconds from the first
  // CTA's entry: entry, FC1 summed, publication seen, end (min / p50 / max over the 128 CTAs).
  auto timeline = [&](auto launch, const std::vector<const char*>& names) {
    const size_t n = names.size();
    SM90_CUDA_OK(cudaMemset(rst.get(), 0, rst.size()));
    evict(s);
    launch(static_cast<unsigned long long*>(rst.get()));
    SM90_CUDA_OK(cudaStreamSynchronize(s));
    std::vector<unsigned long long> v(128 * n);
    SM90_CUDA_OK(cudaMemcpy(v.data(), rst.get(), v.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < 128; ++b) t0 = std::min(t0, v[b * n]);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> x(128);
      for (int b = 0; b < 128; ++b) x[b] = (v[b * n + i] - t0) / 1e3;
      std::sort(x.begin(), x.end());
      fmt::print("  {:<22} min {:>6.2f}  p50 {:>6.2f}  max {:>6.2f} us\n", names[i], x[0], x[64], x[127]);
    }
  };
  const int clusters = sm90test::resident_max_active_clusters();
  fmt::print("resident skeleton: the device holds {} of its 16-CTA clusters at once (8 needed)\n", clusters);
  struct Variant {
    bool math, cluster;
    int fc2_after;
  };
  for (const Variant vr : {Variant{true, false, 0}, Variant{false, false, 0}, Variant{false, false, 6},
                           Variant{false, false, 9}, Variant{false, false, 12}, Variant{true, false, 9},
                           Variant{true, true, 0}, Variant{false, true, 0}}) {
    const bool math = vr.math, cluster = vr.cluster;
    if (cluster && clusters < 8) continue;
    if (resident_only && (cluster || vr.fc2_after != 9 || cc_only)) continue;
    auto skeleton = [&](cudaStream_t st, unsigned long long* stamps) {
      SM90_CUDA_OK(sm90test::launch_resident_skeleton(r1.get(), r2.get(), rx.get(), ract.get(),
                                                      static_cast<unsigned*>(rcnt.get()), ry.get(), stamps, math,
                                                      cluster, vr.fc2_after, st));
    };
    auto plain = [&](cudaStream_t st) { skeleton(st, nullptr); };
    const double bytes = double(r1.size() + r2.size());
    const double warm = median3([&] { return time_graph(plain, iters, s) * 1e3; });
    const double cold = cold_us(plain);
    const double floor_us = graph_empty + (cold - cold_empty);
    fmt::print("{:<32} {:>9.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.2f} {:>11.0f}%\n",
               fmt::format("resident {}{}{}", cluster ? "clusters" : "skeleton", math ? "" : ", no math",
                           vr.fc2_after ? fmt::format(", FC2 after {}", vr.fc2_after) : std::string()),
               bytes / 1e6,
               warm, cold,
               bytes / (cold * 1e-6) / 1e12, floor_us, 100 * bytes / (copy_tbs * 1e12) * 1e6 / floor_us);
    timeline([&](unsigned long long* st) { skeleton(s, st); }, {"entry", "FC1 summed", "publication seen", "end"});
  }
  if (cc_only)
    return run_resident_cc(iters, s, cold_us, median3, timeline, [&](cudaStream_t st) { read(st, 0.0); }, graph_empty,
                           cold_empty, copy_tbs);
  if (run_resident_gemm(iters, s, cold_us, median3, timeline, [&](cudaStream_t st) { read(st, 0.0); }, graph_empty,
                        cold_empty, copy_tbs) != 0)
    return 1;
  if (resident_only) return 0;
  // The weight producer's access pattern without the math (stream_probe.cu): 24 k256 stages per SM,
  // a GLM-5 T=1 FC1 tile's bytes, as 4 streams per CTA (the packed layout), 1, or 16; and the same
  // bytes by the plain read. Cold (after the 512 MB read), median of 3 rounds.
  const int bulk_stages = 24;
  const double bulk_bytes = double(sm90test::bulk_stream_bytes_per_cta(bulk_stages)) * sms;
  fmt::print("bulk-copy ring, one CTA per SM, {} stages of 36,864 bytes each ({:.1f} MB), cold:\n", bulk_stages,
             bulk_bytes / 1e6);
  for (int pieces : {0, 1, 4, 16}) {
    const double t = cold_us([&](cudaStream_t st) {
                       if (pieces == 0)
                         read(st, bulk_bytes);
                       else
                         SM90_CUDA_OK(sm90test::launch_bulk_stream(probe.get(), bulk_stages, pieces, sk, sms, st));
                     }) -
                     cold_empty;
    fmt::print("  {:<40} {:>8.2f} us {:>6.2f} TB/s (after the empty launch's {:.2f} us)\n",
               pieces == 0 ? std::string("plain 16-byte loads, all SMs") : fmt::format("{} copies per stage", pieces), t,
               bulk_bytes / (t * 1e-6) / 1e12, cold_empty);
  }
  return 0;
}

int run(int argc, char** argv) {
  bool tp8 = false, ceiling = true, floor_mode = false, resident_only = false, cc_only = false;
  std::string only;  // --tactic NAME: time this tactic alone (e.g. under a profiler)
  std::string trace_path;  // --trace FILE
  int iters = 50, layers = 0;
  std::vector<int64_t> tokens_list = {1, 8, 32, 128, 512, 2048, 8192};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tp8") tp8 = true;
    else if (a == "--floor") floor_mode = true;
    else if (a == "--resident") floor_mode = resident_only = true;
    else if (a == "--resident-cc") floor_mode = resident_only = cc_only = true;
    else if (a == "--no-ceiling") ceiling = false;
    else if (a == "--tactic" && i + 1 < argc) only = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else if (a == "--layers" && i + 1 < argc) layers = std::stoi(argv[++i]);
    else if (a == "--trace" && i + 1 < argc) trace_path = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) {
      tokens_list.clear();
      std::string v = argv[++i];
      size_t pos = 0;
      while (pos < v.size()) {
        const size_t c = v.find(',', pos);
        tokens_list.push_back(std::stoll(v.substr(pos, c - pos)));
        pos = c == std::string::npos ? v.size() : c + 1;
      }
    } else {
      fmt::print(stderr, "usage: bench_sm90 [--tp8] [--tokens 1,8,...] [--iters N] [--layers N] [--tactic NAME] "
                 "[--no-ceiling] [--trace FILE] | --floor [--iters N] | --resident [--iters N] | "
                 "--resident-cc [--iters N]\n");
      return 2;
    }
  }
  if (layers < 0 || layers == 1 || layers > 64) {
    fmt::print(stderr, "bench_sm90: --layers {}: expected 0 (off) or 2 to 64 layers in one graph\n", layers);
    return 2;
  }
  const int skip = sm90test::skip_unless_sm90();
  if (skip) return skip;
  const int64_t I = tp8 ? 256 : 2048;
  cudaStream_t s;
  SM90_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  SM90_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  // The device synchronised, then left idle 50 ms: a large cudaFree (the copy ceiling's 2 GiB) slows the
  // next ~10 ms of kernels (docs/perf.md, sm90 step 60), as `fp4moe bench --settle-ms` does.
  const auto settle = [] {
    SM90_CUDA_OK(cudaDeviceSynchronize());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  const double copy_tbs = ceiling ? copy_ceiling_tbs(s) : 0.0;
  settle();
  const double read_tbs = ceiling ? read_ceiling_tbs(s, prop.multiProcessorCount) : 0.0;
  fmt::print("device {} ({} SMs), copy ceiling {:.2f} TB/s (cudaMemcpy D2D, read+write), read ceiling {:.2f} TB/s "
             "(16-byte loads), shape H={} I={} E={} top-{}\n",
             prop.name, prop.multiProcessorCount, copy_tbs, read_tbs, kH, I, kE, kTopk);
  if (floor_mode) return run_floor(iters, s, prop.multiProcessorCount, resident_only, cc_only);

  std::vector<std::unique_ptr<GroupedGemmTactic>> tactics;
  append_sm90_tactics(tactics);
  append_sm90_cc_tactics(tactics);  // the resident tactic: timed where its preflight passes (one row per expert)
  if (!only.empty()) {
    tactics.erase(std::remove_if(tactics.begin(), tactics.end(), [&](auto& t) { return t->desc().name != only; }),
                  tactics.end());
    if (tactics.empty()) {
      fmt::print(stderr, "bench_sm90: no tactic named {}\n", only);
      return 2;
    }
  }
  const int64_t max_rows = *std::max_element(tokens_list.begin(), tokens_list.end()) * kTopk;
  GemmProblem p1{GemmOp::kFc1SwiGlu, kE, I, kH, max_rows, max_rows};
  GemmProblem p2{GemmOp::kFc2, kE, kH, I, max_rows, max_rows};
  const WeightLayoutOps* ops = sm90_weight_layout_ops();
  // One buffer per GEMM serves every layout (the byte pattern is the same): the larger of their sizes.
  DeviceBuffer w1(std::max(ops->bytes(p1), sm90::cc_packed_bytes_of(p1))),
      w2(std::max(ops->bytes(p2), sm90::cc_packed_bytes_of(p2)));
  SM90_CUDA_OK(cudaMemset(w1.get(), 0x37, w1.size()));
  SM90_CUDA_OK(cudaMemset(w2.get(), 0x37, w2.size()));
  const int64_t max_tokens = max_rows / kTopk;
  DeviceBuffer x(max_tokens * kH * 2), h(max_rows * I * 2), y(max_rows * kH * 2), off((kE + 1) * 4),
      idx(max_rows * 4), ts1(kE * 2 * 4), ts2(kE * 4), xg(max_rows * kH * 2),
      ws([&] {
        size_t b = 16;
        for (auto& t : tactics) b = std::max({b, t->workspace_bytes(p1), t->workspace_bytes(p2)});
        return b;
      }());
  SM90_CUDA_OK(cudaMemset(ws.get(), 0, ws.size()));  // the tactics' work counters
  SM90_CUDA_OK(cudaMemset(x.get(), 0x3c, x.size()));
  SM90_CUDA_OK(cudaMemset(ts1.get(), 0, ts1.size()));
  SM90_CUDA_OK(cudaMemset(ts2.get(), 0, ts2.size()));
  // Every tactic initialised for an FC1 and an FC2 problem; false (and the reason printed) on a failure.
  auto init_all = [&](const GemmProblem& fc1, const GemmProblem& fc2) {
    for (auto& t : tactics) {
      Status st = t->init(fc1);
      if (st.is_ok()) st = t->init(fc2);
      if (!st.is_ok()) {
        fmt::print("{}: init failed: {}\n", t->desc().name, st.to_string());
        return false;
      }
    }
    return true;
  };
  if (!init_all(p1, p2)) return 1;
  // --layers N: layers 1 .. N - 1 of the decode-step rows (layer 0 is the buffers above), each with its own
  // weights (the same byte pattern) and offsets and index; as many as fit in 80% of the free memory.
  struct Layer {
    std::unique_ptr<DeviceBuffer> w1, w2, off, idx;
    Routing r;
  };
  std::vector<Layer> deck;
  if (layers > 1) {
    size_t free_b = 0, total_b = 0;
    SM90_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    const size_t per_layer = w1.size() + w2.size() + off.size() + idx.size();
    const int fit = static_cast<int>(std::min<size_t>(layers, 1 + free_b / 10 * 8 / per_layer));
    if (fit < layers)
      fmt::print("--layers {}: {} layers fit in 80% of the {:.1f} GB free ({:.2f} GB a layer)\n", layers, fit,
                 free_b / 1e9, per_layer / 1e9);
    for (int l = 1; l < fit; ++l) {
      Layer L;
      L.w1 = std::make_unique<DeviceBuffer>(w1.size());
      L.w2 = std::make_unique<DeviceBuffer>(w2.size());
      L.off = std::make_unique<DeviceBuffer>(off.size());
      L.idx = std::make_unique<DeviceBuffer>(idx.size());
      SM90_CUDA_OK(cudaMemset(L.w1->get(), 0x37, L.w1->size()));
      SM90_CUDA_OK(cudaMemset(L.w2->get(), 0x37, L.w2->size()));
      deck.push_back(std::move(L));
    }
  }
  std::mt19937 rng_layers(7);  // the deck's routings, apart from the rows' own (which stay as before)
  // --trace: the timeline buffer, the shared expert's weights (one expert) and its offsets {0, T}.
  std::unique_ptr<DeviceBuffer> trace_buf, ws1, ws2, soff, hs, ys, wss;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace_out(nullptr, &std::fclose);
  GemmProblem ps1{GemmOp::kFc1SwiGlu, 1, I, kH, max_tokens, max_tokens}, ps2{GemmOp::kFc2, 1, kH, I, max_tokens,
                                                                              max_tokens};
  if (!trace_path.empty()) {
    trace_buf = std::make_unique<DeviceBuffer>(sm90::kTraceBytes);
    SM90_CUDA_OK(cudaMemset(trace_buf->get(), 0, trace_buf->size()));
    Status st = sm90::set_trace_buffer(trace_buf->get());
    if (!st.is_ok()) {
      fmt::print(stderr, "bench_sm90 --trace: {}\n", st.to_string());
      return 2;
    }
    trace_out.reset(std::fopen(trace_path.c_str(), "w"));
    if (!trace_out) {
      fmt::print(stderr, "bench_sm90 --trace: cannot open {} for writing\n", trace_path);
      return 2;
    }
    fmt::print(trace_out.get(), "T,run,{}\n", sm90::kTraceCsvColumns);
    ws1 = std::make_unique<DeviceBuffer>(ops->bytes(ps1));
    ws2 = std::make_unique<DeviceBuffer>(ops->bytes(ps2));
    SM90_CUDA_OK(cudaMemset(ws1->get(), 0x37, ws1->size()));
    SM90_CUDA_OK(cudaMemset(ws2->get(), 0x37, ws2->size()));
    soff = std::make_unique<DeviceBuffer>(8);
    hs = std::make_unique<DeviceBuffer>(max_tokens * I * 2);
    ys = std::make_unique<DeviceBuffer>(max_tokens * kH * 2);
    wss = std::make_unique<DeviceBuffer>(ws.size());
    SM90_CUDA_OK(cudaMemset(wss->get(), 0, wss->size()));
    if (!init_all(ps1, ps2)) return 1;
  }
  std::mt19937 rng(2024);
  // Percent of the read ceiling (the weights are only read), "-" when the ceilings were not measured.
  auto pct = [&](double tbs) { return read_tbs > 0 ? fmt::format("{:.0f}%", 100 * tbs / read_tbs) : std::string("-"); };
  // One timed row: T, the GEMM(s), the active experts, the tactic, then from `ms` milliseconds for `bytes`
  // weight bytes and `flops`: microseconds, TB/s, TFLOP/s, % of the read ceiling; then `note` ("" for none).
  auto print_row = [&](int64_t T, const char* what, const std::string& act, const std::string& name, double ms,
                       double bytes, double flops, const std::string& note) {
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    fmt::print("{:>6} {:>7} {:>5} {:<34} {:>9.1f} {:>9.2f} {:>8.1f} {:>8}{}\n", T, what, act, name, ms * 1e3, tbs,
               flops / (ms * 1e-3) / 1e12, pct(tbs), note.empty() ? note : "  (" + note + ")");
  };
  // After a chain that left FC2's fp32 rows in the workspace (chain32): the rows back to zero for the other forms.
  auto zero_fp32_rows = [&] {
    SM90_CUDA_OK(cudaStreamSynchronize(s));
    SM90_CUDA_OK(cudaMemset(ws.get(), 0, ws.size()));
  };
  fmt::print("{:>6} {:>7} {:>5} {:<34} {:>9} {:>9} {:>8} {:>8}\n", "T", "gemm", "act", "tactic", "us", "TB/s",
             "TFLOP/s", "%read");
  for (int64_t T : tokens_list) {
    settle();
    const Routing r = route_uniform(T, rng);
    // A tactic runs where its preflight passes on this T's rows (the resident tactic: one row per expert).
    int32_t per_expert = 0;
    for (int64_t e = 0; e < kE; ++e) per_expert = std::max(per_expert, r.offsets[e + 1] - r.offsets[e]);
    const DeviceCaps caps = query_device_caps(0);
    auto usable = [&](const GroupedGemmTactic& t) {
      for (GemmProblem q : {p1, p2}) {
        q.total_rows = T * kTopk;
        q.max_rows_per_expert = per_expert;
        const TacticCheck c = t.check(q, caps);
        if (!c.ok) {
          fmt::print("{:>6} {:<42} skipped: {}\n", T, t.desc().name, c.reason);
          return false;
        }
      }
      return true;
    };
    std::vector<GroupedGemmTactic*> runnable;
    for (auto& t : tactics)
      if (usable(*t)) runnable.push_back(t.get());
    if (runnable.empty()) {  // every tactic (or the one --tactic names) refused this T: nothing to time
      fmt::print("{:>6} no tactic passes its preflight at this T\n", T);
      continue;
    }
    off.upload(r.offsets.data(), r.offsets.size() * 4);
    idx.upload(r.row_token.data(), r.row_token.size() * 4);
    const int64_t rows = T * kTopk;
    const double bytes1 = r.active * nvfp4_bytes(2 * I, kH), bytes2 = r.active * nvfp4_bytes(kH, I);
    const double flops1 = 2.0 * rows * 2 * I * kH, flops2 = 2.0 * rows * kH * I;
    GroupedGemmArgs a1, a2;
    a1.problem = p1;
    a1.problem.total_rows = rows;
    a1.expert_offsets = static_cast<const int32_t*>(off.get());
    a1.a = static_cast<const uint16_t*>(x.get());
    a1.a_row_index = static_cast<const int32_t*>(idx.get());
    a1.a_ld = kH;
    a1.weights = w1.get();
    a1.tensor_scales = static_cast<const float*>(ts1.get());
    a1.out = static_cast<uint16_t*>(h.get());
    a1.workspace = ws.get();
    a2 = a1;
    a2.problem = p2;
    a2.problem.total_rows = rows;
    a2.a = static_cast<const uint16_t*>(h.get());
    a2.a_row_index = nullptr;
    a2.a_ld = I;
    a2.weights = w2.get();
    a2.tensor_scales = static_cast<const float*>(ts2.get());
    a2.out = static_cast<uint16_t*>(y.get());
    GroupedGemmArgs a1c = a1;  // FC1 on the gathered copy
    a1c.a = static_cast<const uint16_t*>(xg.get());
    a1c.a_row_index = nullptr;
    auto gather_copy = [&](cudaStream_t st_) {
      engine::launch_gather_rows(a1.a, kH, a1.a_row_index, rows, nullptr, kH, static_cast<uint16_t*>(xg.get()),
                                 st_)
          .throw_if_error();
    };
    gather_copy(s);
    const double copy_ms = time_graph(gather_copy, iters, s);
    double best[3] = {1e30, 1e30, 1e30};
    std::string names[3];
    const char* labels[3] = {"fc1", "fc1c", "fc2"};
    for (int which = 0; which < 3; ++which) {
      const GroupedGemmArgs& args = which == 0 ? a1 : (which == 1 ? a1c : a2);
      for (GroupedGemmTactic* t : runnable) {
        Status st;
        const double ms = time_graph([&](cudaStream_t st_) { st = t->run(args, st_); }, iters, s);
        if (!st.is_ok()) {
          fmt::print("{}: {}\n", t->desc().name, st.to_string());
          return 1;
        }
        print_row(T, labels[which], std::to_string(r.active), t->desc().name, ms, which == 2 ? bytes2 : bytes1,
                  which == 2 ? flops2 : flops1, "");
        if (ms < best[which]) {
          best[which] = ms;
          names[which] = t->desc().name;
        }
      }
    }
    fmt::print("{:>6} {:>7} {:>5} {:<34} {:>9.1f}   ({} rows of {} bf16 in grouped order)\n", T, "copy", r.active,
               "gather_rows", copy_ms * 1e3, rows, kH);
    const bool use_copy = copy_ms + best[1] < best[0];
    GroupedGemmTactic* t1 = nullptr;
    GroupedGemmTactic* t2 = nullptr;
    for (GroupedGemmTactic* t : runnable) {
      if (t->desc().name == names[use_copy ? 1 : 0]) t1 = t;
      if (t->desc().name == names[2]) t2 = t;
    }
    const double ms = time_graph(
        [&](cudaStream_t st_) {
          if (use_copy) gather_copy(st_);
          (void)t1->run(use_copy ? a1c : a1, st_);
          (void)t2->run(a2, st_);
        },
        iters, s);
    print_row(T, "fc1+fc2", std::to_string(r.active), "best pair", ms, bytes1 + bytes2, flops1 + flops2,
              fmt::format("fc1 {}{}, fc2 {}", names[use_copy ? 1 : 0],
                          use_copy ? " on the gathered copy, copy included" : "", names[2]));
    // FC1 chained into FC2 in one launch (run_chained), on the gathered copy, the copy included; against
    // the same tactic's two launches (copy + fc1c + fc2) in the same graph form; and the chain with FC1
    // reading its rows through the index, no copy (the resident tactic reads a row with one bulk copy
    // either way). The best chain is the faster of the two forms.
    double best_chain = 1e30;
    std::string best_chain_name;
    GroupedGemmTactic* best_chain_tactic = nullptr;
    bool best_chain_idx = false;
    for (GroupedGemmTactic* t : runnable) {
      if (!t->can_chain()) continue;
      Status st, st_idx;
      const double ms_copy_chain = time_graph(
          [&](cudaStream_t st_) {
            gather_copy(st_);
            st = t->run_chained(a1c, a2, st_);
          },
          iters, s);
      const double ms_idx = time_graph([&](cudaStream_t st_) { st_idx = t->run_chained(a1, a2, st_); }, iters, s);
      if (st.is_ok()) st = st_idx;
      const bool idx_faster = ms_idx < ms_copy_chain;
      const double ms_chain = idx_faster ? ms_idx : ms_copy_chain;
      const double ms_two = time_graph(
          [&](cudaStream_t st_) {
            gather_copy(st_);
            (void)t->run(a1c, st_);
            (void)t->run(a2, st_);
          },
          iters, s);
      if (!st.is_ok()) {
        fmt::print("{}: {}\n", t->desc().name, st.to_string());
        return 1;
      }
      print_row(T, "chain", std::to_string(r.active), t->desc().name, ms_chain, bytes1 + bytes2, flops1 + flops2,
                fmt::format("{}; copy + chain {:.1f} us, chain through the index {:.1f} us, two launches {:.1f} us",
                            idx_faster ? "rows through the index" : "on the gathered copy", ms_copy_chain * 1e3,
                            ms_idx * 1e3, ms_two * 1e3));
      // A tactic that can leave FC2's fp32 rows to the caller (the resident one): the chain also as the
      // forward runs it, the rows summed in the workspace for finalize to read, round and zero; no conversion
      // in the launch, and the zeroing, which is finalize's there, not timed here (the rows just grow).
      if (t->fp32_rows_offset(a1.problem) >= 0) {
        GroupedGemmArgs f1 = idx_faster ? a1 : a1c;
        f1.fp32_rows_to_caller = true;
        Status st32;
        const double ms32 = time_graph(
            [&](cudaStream_t st_) {
              if (!idx_faster) gather_copy(st_);
              st32 = t->run_chained(f1, a2, st_);
            },
            iters, s);
        zero_fp32_rows();
        if (!st32.is_ok()) {
          fmt::print("{}: {}\n", t->desc().name, st32.to_string());
          return 1;
        }
        print_row(T, "chain32", std::to_string(r.active), t->desc().name, ms32, bytes1 + bytes2, flops1 + flops2,
                  "FC2's fp32 rows left to the caller, as the forward runs it; their zeroing is finalize's, not timed");
      }
      if (ms_chain < best_chain) {
        best_chain = ms_chain;
        best_chain_name = t->desc().name + (idx_faster ? " through the index" : " on the copy");
        best_chain_tactic = t;
        best_chain_idx = idx_faster;
      }
    }
    if (!best_chain_name.empty()) {
      print_row(T, "fc1>fc2", std::to_string(r.active), "best chain", best_chain, bytes1 + bytes2, flops1 + flops2,
                fmt::format("{}; best pair {:.1f} us", best_chain_name, ms * 1e3));
    }
    // --layers: the best chain and the best pair as a server's decode-step graph holds them, one launch (or
    // pair) per layer, each layer with its own weights and routing (drawn as above), so that a layer finds no
    // weight bytes of the one before in L2 and the graph's own launch is paid once for all the layers: the
    // time per layer, against the one-layer graph's above.
    if (!deck.empty()) {
      const int n = 1 + static_cast<int>(deck.size());
      struct LayerArgs {
        GroupedGemmArgs a1, a1c, a2;
      };
      std::vector<LayerArgs> la(n, LayerArgs{a1, a1c, a2});
      double layer_bytes = bytes1 + bytes2;
      int64_t active_sum = r.active;
      std::vector<int32_t> pe(n, per_expert);  // each layer's most rows an expert (for the preflights only)
      for (int l = 1; l < n; ++l) {
        Layer& L = deck[l - 1];
        L.r = route_uniform(T, rng_layers);
        L.off->upload(L.r.offsets.data(), L.r.offsets.size() * 4);
        L.idx->upload(L.r.row_token.data(), L.r.row_token.size() * 4);
        layer_bytes += L.r.active * (nvfp4_bytes(2 * I, kH) + nvfp4_bytes(kH, I));
        active_sum += L.r.active;
        pe[l] = 0;
        for (int64_t e = 0; e < kE; ++e) pe[l] = std::max(pe[l], L.r.offsets[e + 1] - L.r.offsets[e]);
        for (GroupedGemmArgs* g : {&la[l].a1, &la[l].a1c, &la[l].a2})
          g->expert_offsets = static_cast<const int32_t*>(L.off->get());
        la[l].a1.a_row_index = static_cast<const int32_t*>(L.idx->get());
        la[l].a1.weights = la[l].a1c.weights = L.w1->get();
        la[l].a2.weights = L.w2->get();
      }
      auto gather_layer = [&](int l, cudaStream_t st_) {
        engine::launch_gather_rows(a1.a, kH, la[l].a1.a_row_index, rows, nullptr, kH,
                                   static_cast<uint16_t*>(xg.get()), st_)
            .throw_if_error();
      };
      // Whether tactic t passes its preflight on every layer's rows ("" when it does).
      auto refusal = [&](const GroupedGemmTactic* t) -> std::string {
        for (int l = 0; l < n; ++l)
          for (const GroupedGemmArgs* g : {&la[l].a1, &la[l].a2}) {
            GemmProblem q = g->problem;
            q.max_rows_per_expert = pe[l];
            const TacticCheck c = t->check(q, caps);
            if (!c.ok) return fmt::format("layer {}: {}", l, c.reason);
          }
        return "";
      };
      auto row = [&](const char* what, const std::string& name, const std::string& why, auto body) {
        if (!why.empty()) {
          fmt::print("{:>6} {:<42} skipped in the {}-layer graph: {}\n", T, name, n, why);
          return;
        }
        print_row(T, what, fmt::format("{:.1f}", double(active_sum) / n), name, time_graph(body, iters, s) / n,
                  layer_bytes / n, flops1 + flops2,
                  fmt::format("{} layers in one graph, each its own weights and routing: us a layer", n));
      };
      if (best_chain_tactic != nullptr) {
        GroupedGemmTactic* tc = best_chain_tactic;
        const std::string why = refusal(tc);
        for (const bool rows32 : {false, true}) {
          if (rows32 && tc->fp32_rows_offset(a1.problem) < 0) continue;
          row("layers", rows32 ? "best chain, fp32 rows" : "best chain", why, [&](cudaStream_t st_) {
            for (int l = 0; l < n; ++l) {
              if (!best_chain_idx) gather_layer(l, st_);
              GroupedGemmArgs f1 = best_chain_idx ? la[l].a1 : la[l].a1c;
              f1.fp32_rows_to_caller = rows32;
              tc->run_chained(f1, la[l].a2, st_).throw_if_error();
            }
          });
          if (rows32) zero_fp32_rows();
        }
      }
      const std::string why1 = refusal(t1), why2 = refusal(t2);
      row("layers", "best pair", why1.empty() ? why2 : why1, [&](cudaStream_t st_) {
        for (int l = 0; l < n; ++l) {
          if (use_copy) gather_layer(l, st_);
          t1->run(use_copy ? la[l].a1c : la[l].a1, st_).throw_if_error();
          t2->run(la[l].a2, st_).throw_if_error();
        }
      });
    }
    if (trace_out && best_chain_tactic != nullptr) {
      GroupedGemmTactic* tc = best_chain_tactic;
      const int32_t shared_off[2] = {0, static_cast<int32_t>(T)};
      soff->upload(shared_off, sizeof(shared_off));
      GroupedGemmArgs s1 = a1c, s2 = a2;
      s1.problem = ps1;
      s1.problem.total_rows = T;
      s1.problem.max_rows_per_expert = T;
      s1.expert_offsets = static_cast<const int32_t*>(soff->get());
      s1.a = static_cast<const uint16_t*>(x.get());
      s1.weights = ws1->get();
      s1.out = static_cast<uint16_t*>(hs->get());
      s1.workspace = wss->get();
      s2.problem = ps2;
      s2.problem.total_rows = T;
      s2.problem.max_rows_per_expert = T;
      s2.expert_offsets = s1.expert_offsets;
      s2.a = static_cast<const uint16_t*>(hs->get());
      s2.weights = ws2->get();
      s2.out = static_cast<uint16_t*>(ys->get());
      s2.workspace = wss->get();
      cudaStream_t side;
      cudaEvent_t fork, join;
      SM90_CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
      SM90_CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
      SM90_CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
      // The resident tactic also as the forward runs it (run 3: through the index, FC2's fp32 rows left to
      // the caller), with its timeline summarised on stdout.
      const bool cc = tc->desc().name == sm90::kCcTacticName;
      const char* runs[4] = {"chain", "pair", "chain+shared", "chain32"};
      for (int run = 0; run < (cc ? 4 : 3); ++run) {
        auto body = [&](cudaStream_t st_) {
          if (run == 2) {
            SM90_CUDA_OK(cudaEventRecord(fork, st_));
            SM90_CUDA_OK(cudaStreamWaitEvent(side, fork, 0));
            tc->run(s1, side).throw_if_error();
            tc->run(s2, side).throw_if_error();
            SM90_CUDA_OK(cudaEventRecord(join, side));
          }
          gather_copy(st_);
          if (run == 1) {
            tc->run(a1c, st_).throw_if_error();
            tc->run(a2, st_).throw_if_error();
          } else if (run == 3) {
            GroupedGemmArgs f1 = a1;
            f1.fp32_rows_to_caller = true;
            tc->run_chained(f1, a2, st_).throw_if_error();
          } else {
            tc->run_chained(a1c, a2, st_).throw_if_error();
          }
          if (run == 2) SM90_CUDA_OK(cudaStreamWaitEvent(st_, join, 0));
        };
        // Warm replays, then one with the records cleared.
        const WarmGraph graph(body, s);
        SM90_CUDA_OK(cudaStreamSynchronize(s));
        SM90_CUDA_OK(cudaMemset(trace_buf->get(), 0, trace_buf->size()));
        graph.launch(s);
        SM90_CUDA_OK(cudaStreamSynchronize(s));
        std::vector<unsigned long long> rec(trace_buf->size() / 8);
        trace_buf->download(rec.data(), trace_buf->size());
        // The resident tactic's words are not the wgmma items' CSV layout: its timeline goes to stdout instead.
        if (!cc) fmt::print(trace_out.get(), "{}", sm90::trace_csv_rows(rec, fmt::format("{},{},", T, runs[run])));
        if (cc && run != 1) print_cc_timeline(rec, fmt::format("T={} {}", T, runs[run]));
      }
      cudaEventDestroy(fork);
      cudaEventDestroy(join);
      cudaStreamDestroy(side);
    }
  }
  SM90_CUDA_OK(cudaDeviceSynchronize());
  if (trace_out) {
    (void)sm90::set_trace_buffer(nullptr);
    trace_out.reset();
    fmt::print("timeline records written to {}\n", trace_path);
  }
  return 0;
}

}  // namespace
}  // namespace fp4moe

int main(int argc, char** argv) {
  try {
    return fp4moe::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_sm90: {}\n", e.what());
    return 1;
  }
}
