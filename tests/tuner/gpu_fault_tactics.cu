// GPU test of the tuner with real kernels that fail on purpose, compiled only into this test and
// injected next to the registry's tactics:
//   fault.smem_hog     declares 48 KB, but its init asks cudaFuncSetAttribute for 1 KB more dynamic shared
//                      memory than the device allows (the seed's failure on a 99 KB sm_120 part)
//   fault.fast_wrong   a fast kernel that writes 1.0 into every used output row (wins the timing, fails
//                      verification against the fallback)
//   fault.illegal      a kernel that stores to address 0x10: cudaErrorIllegalAddress, a sticky error that
//                      ends its worker process
// The tuner (worker isolation on) must survive each, name the tactic and the cause in its report and
// log, choose registry tactics, and an engine forward with those choices must match the CPU reference
// (relative L2 <= 1e-2 per layer). Exits 77 without a CUDA device.
//
// Kernels here: one CTA of 256 threads each, no shared memory except the hog's (never launched); the
// weights argument is ignored (no packed layout is read).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fp4moe/engine.h"
#include "fp4moe/log.h"
#include "fp4moe/reference.h"
#include "fp4moe/tuner.h"

namespace fp4moe {
namespace {

int g_failures = 0;
#define EXPECT(cond, ...)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      ++g_failures;                                                                    \
      std::fprintf(stderr, "FAILED %s:%d: %s: %s\n", __FILE__, __LINE__, #cond,        \
                   fmt::format(__VA_ARGS__).c_str());                                  \
    }                                                                                  \
  } while (0)

#define CUDA_OK(call)                                                                                      \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) throw Error(StatusCode::kCudaError, fmt::format("{} failed: {}", #call, cudaGetErrorName(e_))); \
  } while (0)

__global__ void smem_hog_kernel(uint16_t* out) {
  extern __shared__ uint16_t hog_smem[];
  hog_smem[threadIdx.x] = uint16_t(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = hog_smem[255 - threadIdx.x];
}

// out[r, c] = 1.0 (bf16 0x3F80) for every used row r < offsets[E].
__global__ void fast_wrong_kernel(const int32_t* offsets, int64_t experts, int64_t n, uint16_t* out) {
  const int64_t used = int64_t(offsets[experts]) * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < used; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = 0x3F80;
}

__global__ void illegal_store_kernel(uint16_t* out) {
  volatile uint16_t* bad = reinterpret_cast<uint16_t*>(uintptr_t(0x10));
  *bad = out[0];
}

class FaultTactic : public GroupedGemmTactic {
 public:
  explicit FaultTactic(const std::string& name) {
    desc_.name = name;
    desc_.family = "fault";
    desc_.tile_m = 1;
    desc_.tile_n = 1;
    desc_.schedule = "test";
    desc_.req.min_cc = 80;
    desc_.req.smem_bytes = 48 * 1024;
    desc_.req.threads = 256;
    desc_.req.regs_per_thread = 32;
  }
  const TacticDesc& desc() const override { return desc_; }
  Status init(const GemmProblem&) override { return Status::ok(); }
  size_t workspace_bytes(const GemmProblem&) const override { return 0; }

 protected:
  TacticDesc desc_;
};

class SmemHogTactic final : public FaultTactic {
 public:
  SmemHogTactic() : FaultTactic("fault.smem_hog") {}
  Status init(const GemmProblem&) override {
    int device = 0, optin = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    const int want = optin + 1024;
    const cudaError_t e = cudaFuncSetAttribute(smem_hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, want);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return Status(StatusCode::kCudaError,
                    fmt::format("cudaFuncSetAttribute(smem_hog_kernel, MaxDynamicSharedMemorySize, {} bytes) failed: {} "
                                "({}); the device allows {} bytes per block",
                                want, cudaGetErrorName(e), cudaGetErrorString(e), optin));
    }
    return Status::ok();
  }
  Status run(const GroupedGemmArgs& args, Stream stream) const override {
    smem_hog_kernel<<<1, 256, 200 * 1024, stream>>>(args.out);
    return cudaGetLastError() == cudaSuccess ? Status::ok() : Status(StatusCode::kCudaError, "smem_hog_kernel launch");
  }
};

class FastWrongTactic final : public FaultTactic {
 public:
  FastWrongTactic() : FaultTactic("fault.fast_wrong") {}
  Status run(const GroupedGemmArgs& args, Stream stream) const override {
    const int64_t vals = args.problem.total_rows * args.problem.n;
    const int blocks = int(std::min<int64_t>((vals + 255) / 256, 4096));
    fast_wrong_kernel<<<std::max(blocks, 1), 256, 0, stream>>>(args.expert_offsets, args.problem.num_experts,
                                                              args.problem.n, args.out);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? Status::ok() : Status(StatusCode::kCudaError, cudaGetErrorName(e));
  }
};

class IllegalAddressTactic final : public FaultTactic {
 public:
  IllegalAddressTactic() : FaultTactic("fault.illegal") {}
  Status run(const GroupedGemmArgs& args, Stream stream) const override {
    illegal_store_kernel<<<1, 1, 0, stream>>>(args.out);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? Status::ok() : Status(StatusCode::kCudaError, cudaGetErrorName(e));
  }
};

SmemHogTactic g_hog;
FastWrongTactic g_wrong;
IllegalAddressTactic g_illegal;

const TacticReport* report_of(const TuningResult& r, const std::string& tactic, GemmOp op) {
  for (const auto& t : r.tactics)
    if (t.tactic == tactic && t.op == op) return &t;
  return nullptr;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A layer small enough for the CPU reference at 256 tokens, shaped like a real one (K, N multiples of 64).
MoeConfig small_layer() {
  MoeConfig c;
  c.name = "tuner-gpu-test";
  c.hidden = 1024;
  c.inter = 512;
  c.num_experts = 16;
  c.topk = 4;
  c.routing = RoutingKind::kSoftmaxTopK;
  c.norm_topk_prob = true;
  return c;
}

void check_tuning(const TuningResult& r, const std::string& log_text) {
  for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    const TacticReport* hog = report_of(r, "fault.smem_hog", op);
    EXPECT(hog && hog->verdict == "init-failed", "smem_hog verdict {}", hog ? hog->verdict : "missing");
    EXPECT(hog && hog->reason.find("cudaFuncSetAttribute") != std::string::npos &&
               hog->reason.find("cudaErrorInvalidValue") != std::string::npos,
           "smem_hog reason: {}", hog ? hog->reason : "");
    const TacticReport* wrong = report_of(r, "fault.fast_wrong", op);
    EXPECT(wrong && wrong->verdict == "wrong-result", "fast_wrong verdict {}", wrong ? wrong->verdict : "missing");
    EXPECT(wrong && wrong->reason.find("relative L2 error") != std::string::npos, "fast_wrong reason: {}",
           wrong ? wrong->reason : "");
    const TacticReport* ill = report_of(r, "fault.illegal", op);
    EXPECT(ill && ill->verdict == "crashed", "illegal verdict {}", ill ? ill->verdict : "missing");
    EXPECT(ill && ill->reason.find("cudaErrorIllegalAddress") != std::string::npos, "illegal reason: {}",
           ill ? ill->reason : "");
  }
  for (const auto& c : r.choices) {
    EXPECT(c.tactic.rfind("fault.", 0) != 0, "{} tokens={} chose {}", gemm_op_name(c.op), c.bucket, c.tactic);
    EXPECT(c.verified, "{} tokens={} {} not verified", gemm_op_name(c.op), c.bucket, c.tactic);
    EXPECT(find_tactic(c.tactic) != nullptr, "choice {} is not a registry tactic", c.tactic);
  }
  EXPECT(log_text.find("fault.smem_hog (fc1) init-failed") != std::string::npos, "log lacks the smem_hog failure");
  EXPECT(log_text.find("fault.fast_wrong (fc1) wrong-result") != std::string::npos, "log lacks the wrong result");
  EXPECT(log_text.find("tactic fault.illegal") != std::string::npos &&
             log_text.find("cudaErrorIllegalAddress") != std::string::npos,
         "log lacks the illegal address");
}

// Engine forward with the tuned choices against the CPU reference.
void check_forward(const MoeConfig& cfg, const TuningResult& r) {
  EngineOptions eo;
  eo.max_tokens = r.buckets.back();
  apply_tuning(r, &eo);
  const SyntheticSpec spec;
  std::unique_ptr<MoeEngine> engine;
  MoeEngine::create_synthetic(cfg, spec, eo, &engine).throw_if_error();
  const MoeLayerWeights host = synthetic_layer(cfg, spec);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (int64_t T : {int64_t(1), int64_t(37), eo.max_tokens}) {
    std::mt19937 rng{static_cast<uint32_t>(T)};
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> x(size_t(T * cfg.hidden));
    for (auto& v : x) v = to_bf16(nd(rng));
    std::vector<float> logits(size_t(T * cfg.num_experts));
    for (auto& v : logits) v = nd(rng);
    uint16_t *d_x, *d_out;
    float* d_logits;
    CUDA_OK(cudaMalloc(&d_x, x.size() * 2));
    CUDA_OK(cudaMalloc(&d_out, x.size() * 2));
    CUDA_OK(cudaMalloc(&d_logits, logits.size() * 4));
    CUDA_OK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_out, 0xD5, x.size() * 2));
    engine->forward(d_x, T, d_logits, d_out, stream).throw_if_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> out(x.size());
    CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
    cudaFree(d_x);
    cudaFree(d_out);
    cudaFree(d_logits);
    const MoeForwardResult ref = moe_forward_reference(host, x.data(), T, logits.data());
    std::vector<float> got(out.size()), want(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      got[i] = from_bf16(out[i]);
      want[i] = from_bf16(ref.out[i]);
    }
    const double rel = relative_l2_error(got.data(), want.data(), int64_t(got.size()));
    const std::string fc1 = engine->fc1_tactic_for(T), fc2 = engine->fc2_tactic_for(T);
    std::printf("forward T=%lld fc1 %s fc2 %s: relative L2 %.3e\n", (long long)T, fc1.c_str(), fc2.c_str(), rel);
    EXPECT(rel <= 1e-2, "T={} relative L2 {:.3e} > 1e-2", T, rel);
    EXPECT(fc1.rfind("fault.", 0) != 0 && fc2.rfind("fault.", 0) != 0, "engine uses a fault tactic");
  }
  cudaStreamDestroy(stream);
}

int run() {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const std::string log_path = log::open_file(fmt::format("/tmp/fp4moe-tuner-gpu-test-{}.log", log::run_id()));
  const MoeConfig cfg = small_layer();
  TuneOptions opts;
  opts.backend = "cuda-faults";
  opts.backend_arg = "0";
  opts.max_bucket = 256;
  TuningResult r;
  const Status st = tune_layer(cfg, opts, &r);
  std::printf("%s\n", format_tuning_table(r).c_str());
  EXPECT(st.is_ok(), "tune_layer: {}", st.to_string());
  if (!st.is_ok()) return 1;
  std::printf("tuned in %.2f s; log %s\n", r.seconds, log_path.c_str());
  check_tuning(r, slurp(log_path));
  check_forward(cfg, r);
  std::printf(g_failures ? "FAILED (%d)\n" : "PASSED\n", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace
}  // namespace fp4moe

int main(int argc, char** argv) {
  fp4moe::register_tuning_backend("cuda-faults", [](const std::string& arg) {
    return fp4moe::make_cuda_tuning_backend(std::stoi(arg), {&fp4moe::g_hog, &fp4moe::g_wrong, &fp4moe::g_illegal});
  });
  int exit_code = 0;
  if (fp4moe::tuner_worker_main_if_requested(argc, argv, &exit_code)) return exit_code;
  try {
    return fp4moe::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
}
