// The CUDA tuning backend: runs the registry's GroupedGemmTactic objects (plus injected ones, for tests)
// on the layer's FC1/FC2 problems with uniform random routing, timed with CUDA events; verifies a tactic
// against the fallback tactic on a small random case (relative L2 <= 5e-3, rows past the last expert's
// end untouched). Outputs are poisoned (0xD5 bytes) before every measurement.
//
// Timing data: weights are a fixed byte pattern (codes 0x5A, block scales 1.0) and activations a
// constant; the kernels' work does not depend on the values. Verification uses random codes, block
// scales from {0.5, 0.75, 1, 1.5, 2}, tensor scales near 1/64, activations uniform in [-1, 1].
#include "fp4moe/tuner.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "fp4moe/log.h"
#endif

namespace fp4moe {

#ifdef FP4MOE_HAVE_CUDA
namespace {

constexpr double kVerifyTolerance = 5e-3;  // relative L2 per GEMM (project standard)
constexpr uint8_t kPoison = 0xD5;

// Device buffer that grows on demand.
class DevBuf {
 public:
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { release(); }
  void ensure(size_t n) {
    if (n <= bytes_ && p_) return;
    release();
    FP4MOE_CUDA_THROW(cudaMalloc(&p_, std::max<size_t>(n, 256)));
    bytes_ = std::max<size_t>(n, 256);
  }
  void release() {
    if (p_) (void)cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

size_t canonical_bytes(const GemmProblem& p) {
  const size_t rows = size_t(p.num_experts) * size_t(weight_rows(p));
  return rows * size_t(p.k / 2) + rows * size_t(p.k / 16);
}

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Device data of one problem: weights in the canonical layout plus each family's packing of them.
struct WeightSet {
  GemmProblem shape;  // op, E, n, k
  DevBuf canonical;
  DevBuf tensor_scales;
  std::map<WeightLayout, std::unique_ptr<DevBuf>> packed;
  bool same_shape(const GemmProblem& p) const {
    return shape.op == p.op && shape.num_experts == p.num_experts && shape.n == p.n && shape.k == p.k;
  }
};

class CudaTuningBackend final : public TuningBackend {
 public:
  CudaTuningBackend(int device, std::vector<GroupedGemmTactic*> extra) : device_(device) {
    caps_ = query_device_caps(device);
    descs_ = all_tactic_descs();
    for (const auto& d : descs_) tactics_[d.name] = find_tactic(d.name);
    for (GroupedGemmTactic* t : extra) {
      FP4MOE_CHECK(t != nullptr, StatusCode::kInvalidArgument, "null injected tactic");
      descs_.push_back(t->desc());
      tactics_[t->desc().name] = t;
    }
    for (const auto& d : descs_)
      if (d.is_fallback && fallback_.empty()) fallback_ = d.name;
  }
  ~CudaTuningBackend() override {
    if (stream_) (void)cudaStreamDestroy(stream_);
    if (ev0_) (void)cudaEventDestroy(ev0_);
    if (ev1_) (void)cudaEventDestroy(ev1_);
  }

  std::vector<TacticDesc> candidates() const override { return descs_; }
  DeviceCaps caps() const override { return caps_; }
  bool healthy() const override { return healthy_; }

  Status init(const std::string& name, const GemmProblem& problem) override {
    return guarded([&] {
      start();
      tactic(name)->init(problem).throw_if_error();
    });
  }

  Status time(const std::string& name, const GemmProblem& problem, int64_t tokens, double* ms) override {
    return guarded([&] {
      start();
      GroupedGemmTactic* t = tactic(name);
      WeightSet& w = weights_for(problem);
      const void* weights = packed_weights(w, t->desc().layout);
      set_routing(problem, tokens);
      // FC1 is timed the way the engine runs it: on the copy of the token rows in grouped order
      // (contiguous rows, no index) when K = H is a multiple of 8, else through the row index.
      const bool gathered = problem.op == GemmOp::kFc1SwiGlu && problem.k % 8 != 0;
      const size_t a_rows = gathered ? size_t(tokens) : size_t(problem.total_rows);
      act_.ensure(a_rows * size_t(problem.k) * 2);
      FP4MOE_CUDA_THROW(cudaMemsetAsync(act_.get(), 0x3C, a_rows * size_t(problem.k) * 2, stream_));
      out_.ensure(size_t(problem.total_rows) * size_t(problem.n) * 2);
      FP4MOE_CUDA_THROW(cudaMemsetAsync(out_.get(), kPoison, size_t(problem.total_rows) * size_t(problem.n) * 2, stream_));
      workspace_.ensure(t->workspace_bytes(problem));
      // Zeroed before every run (the sm90 work counters): a tactic that failed mid-run may have left it dirty.
      FP4MOE_CUDA_THROW(cudaMemsetAsync(workspace_.get(), 0, t->workspace_bytes(problem), stream_));
      GroupedGemmArgs args;
      args.problem = problem;
      args.expert_offsets = offsets_.get<int32_t>();
      args.a = act_.get<uint16_t>();
      args.a_row_index = gathered ? row_index_.get<int32_t>() : nullptr;
      args.a_ld = problem.k;
      args.weights = weights;
      args.tensor_scales = w.tensor_scales.get<float>();
      args.out = out_.get<uint16_t>();
      args.workspace = workspace_.get();
      // Warm-up, then one timed call to size the loop to about 20 ms (3..100 calls).
      t->run(args, stream_).throw_if_error();
      FP4MOE_CUDA_THROW(cudaGetLastError());
      FP4MOE_CUDA_THROW(cudaStreamSynchronize(stream_));
      const float one = timed(t, args, 1);
      const int iters = std::clamp(int(20.0 / std::max(one, 1e-4f)), 3, 100);
      *ms = double(timed(t, args, iters)) / iters;
    });
  }

  Status verify(const std::string& name, const GemmProblem& problem) override {
    return guarded([&] {
      start();
      FP4MOE_CHECK(!fallback_.empty(), StatusCode::kUnsupported, "no fallback tactic to verify {} against", name);
      GroupedGemmTactic* t = tactic(name);
      GroupedGemmTactic* fb = tactic(fallback_);
      verify_small(t, fb, problem);
    });
  }

 private:
  // Runs f; a CUDA failure that persists (a sticky error) marks this process unusable.
  template <typename F>
  Status guarded(F&& f) {
    Status st = status_from(f);
    if (!st.is_ok()) {
      (void)cudaGetLastError();  // clears a non-sticky error
      if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) healthy_ = false;
    }
    return st;
  }

  void start() {
    FP4MOE_CHECK(healthy_, StatusCode::kCudaError, "the CUDA context was lost earlier in this process");
    if (stream_) return;
    FP4MOE_CUDA_THROW(cudaSetDevice(device_));
    FP4MOE_CUDA_THROW(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FP4MOE_CUDA_THROW(cudaEventCreate(&ev0_));
    FP4MOE_CUDA_THROW(cudaEventCreate(&ev1_));
  }

  GroupedGemmTactic* tactic(const std::string& name) {
    auto it = tactics_.find(name);
    FP4MOE_CHECK(it != tactics_.end(), StatusCode::kNotFound, "tactic {} is not a candidate of this build", name);
    FP4MOE_CHECK(it->second != nullptr, StatusCode::kNotFound, "tactic {} has no runnable kernel in this build", name);
    return it->second;
  }

  float timed(GroupedGemmTactic* t, const GroupedGemmArgs& args, int iters) {
    FP4MOE_CUDA_THROW(cudaEventRecord(ev0_, stream_));
    for (int i = 0; i < iters; ++i) t->run(args, stream_).throw_if_error();
    FP4MOE_CUDA_THROW(cudaGetLastError());
    FP4MOE_CUDA_THROW(cudaEventRecord(ev1_, stream_));
    FP4MOE_CUDA_THROW(cudaEventSynchronize(ev1_));
    float ms = 0;
    FP4MOE_CUDA_THROW(cudaEventElapsedTime(&ms, ev0_, ev1_));
    return ms;
  }

  WeightSet& weights_for(const GemmProblem& p) {
    auto& slot = weights_[int(p.op)];
    if (slot && slot->same_shape(p)) return *slot;
    slot.reset();  // frees the previous shape first
    slot = std::make_unique<WeightSet>();
    slot->shape = p;
    const size_t rows = size_t(p.num_experts) * size_t(weight_rows(p));
    slot->canonical.ensure(canonical_bytes(p));
    FP4MOE_CUDA_THROW(cudaMemsetAsync(slot->canonical.get(), 0x5A, rows * size_t(p.k / 2), stream_));
    FP4MOE_CUDA_THROW(cudaMemsetAsync(slot->canonical.get<uint8_t>() + rows * size_t(p.k / 2), 0x38,
                                      rows * size_t(p.k / 16), stream_));  // e4m3 0x38 = 1.0
    const size_t n_scales = size_t(p.num_experts) * (p.op == GemmOp::kFc1SwiGlu ? 2 : 1);
    std::vector<float> ts(n_scales, 1.0f / 64);
    slot->tensor_scales.ensure(n_scales * 4);
    FP4MOE_CUDA_THROW(cudaMemcpyAsync(slot->tensor_scales.get(), ts.data(), n_scales * 4, cudaMemcpyHostToDevice, stream_));
    FP4MOE_CUDA_THROW(cudaStreamSynchronize(stream_));
    return *slot;
  }

  const void* packed_weights(WeightSet& w, WeightLayout layout) {
    if (layout == WeightLayout::kCanonical) return w.canonical.get();
    auto& dst = w.packed[layout];
    if (!dst) {
      const WeightLayoutOps* ops = find_weight_layout_ops(layout);
      FP4MOE_CHECK(ops && ops->bytes && ops->pack, StatusCode::kUnsupported, "weight layout {} has no packing in this build",
                   weight_layout_name(layout));
      auto buf = std::make_unique<DevBuf>();
      buf->ensure(ops->bytes(w.shape));
      ops->pack(w.shape, w.canonical.get(), buf->get(), stream_).throw_if_error();
      FP4MOE_CUDA_THROW(cudaStreamSynchronize(stream_));
      dst = std::move(buf);
    }
    return dst->get();
  }

  // Uniform random routing of `tokens` tokens, each to topk distinct experts; rows grouped by expert.
  void set_routing(const GemmProblem& p, int64_t tokens) {
    FP4MOE_CHECK(tokens > 0 && p.total_rows % tokens == 0, StatusCode::kInvalidArgument,
                 "tuning problem {} does not hold {} tokens x topk rows", p.to_string(), tokens);
    const int64_t topk = p.total_rows / tokens;
    FP4MOE_CHECK(topk <= p.num_experts, StatusCode::kInvalidArgument, "topk {} > experts {}", topk, p.num_experts);
    std::mt19937_64 rng(0x7u + uint64_t(tokens) * 1000003u + uint64_t(p.num_experts));
    std::vector<std::vector<int32_t>> by_expert(size_t(p.num_experts));
    std::vector<int32_t> pick;
    for (int64_t t = 0; t < tokens; ++t) {
      pick.clear();
      while (int64_t(pick.size()) < topk) {
        const int32_t e = int32_t(rng() % uint64_t(p.num_experts));
        if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
      }
      for (int32_t e : pick) by_expert[size_t(e)].push_back(int32_t(t));
    }
    std::vector<int32_t> offsets(size_t(p.num_experts) + 1, 0), rows;
    rows.reserve(size_t(p.total_rows));
    for (int64_t e = 0; e < p.num_experts; ++e) {
      rows.insert(rows.end(), by_expert[size_t(e)].begin(), by_expert[size_t(e)].end());
      offsets[size_t(e) + 1] = int32_t(rows.size());
    }
    offsets_.ensure(offsets.size() * 4);
    row_index_.ensure(rows.size() * 4);
    FP4MOE_CUDA_THROW(cudaMemcpyAsync(offsets_.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice, stream_));
    FP4MOE_CUDA_THROW(cudaMemcpyAsync(row_index_.get(), rows.data(), rows.size() * 4, cudaMemcpyHostToDevice, stream_));
    FP4MOE_CUDA_THROW(cudaStreamSynchronize(stream_));
  }

  // A small random case of the same op/N/K: 4 experts (one empty), a few dozen rows, gathered rows for
  // FC1, a spare tail of rows that must stay poisoned.
  void verify_small(GroupedGemmTactic* t, GroupedGemmTactic* fb, const GemmProblem& big) {
    std::mt19937_64 rng(0xC0FFEEu + uint64_t(big.n) * 31u + uint64_t(big.k));
    GemmProblem p = big;
    p.num_experts = std::min<int64_t>(big.num_experts, 4);
    // Rows per expert up to 40, within what both tactics declare they handle.
    int64_t limit = 40;
    for (const GroupedGemmTactic* x : {t, fb})
      if (x->desc().req.max_rows_per_expert > 0) limit = std::min(limit, x->desc().req.max_rows_per_expert);
    std::vector<int32_t> offsets(size_t(p.num_experts) + 1, 0);
    int64_t most = 1;
    for (int64_t e = 0; e < p.num_experts; ++e) {
      const int64_t rows = e == 1 ? 0 : 1 + int64_t(rng() % uint64_t(limit));  // expert 1 gets no rows
      most = std::max(most, rows);
      offsets[size_t(e) + 1] = offsets[size_t(e)] + int32_t(rows);
    }
    const int64_t used = offsets.back();
    p.total_rows = used + 8;  // capacity; rows past offsets[E] must be untouched
    p.max_rows_per_expert = most;
    const size_t rows_w = size_t(p.num_experts) * size_t(weight_rows(p));
    std::vector<uint8_t> canon(canonical_bytes(p));
    for (size_t i = 0; i < rows_w * size_t(p.k / 2); ++i) canon[i] = uint8_t(rng());
    const uint8_t scale_codes[] = {0x30, 0x34, 0x38, 0x3C, 0x40};  // e4m3: 0.5, 0.75, 1, 1.5, 2
    for (size_t i = rows_w * size_t(p.k / 2); i < canon.size(); ++i) canon[i] = scale_codes[rng() % 5];
    const size_t n_scales = size_t(p.num_experts) * (p.op == GemmOp::kFc1SwiGlu ? 2 : 1);
    std::vector<float> ts(n_scales);
    for (auto& s : ts) s = float(1.0 / 64 * (0.75 + 0.5 * double(rng() % 1000) / 1000));
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<uint16_t> a(size_t(p.total_rows) * size_t(p.k));
    for (auto& v : a) v = float_to_bf16(uni(rng));
    std::vector<int32_t> gather(size_t(p.total_rows));
    for (size_t i = 0; i < gather.size(); ++i) gather[i] = int32_t(i);
    std::shuffle(gather.begin(), gather.end(), rng);

    DevBuf d_canon, d_ts, d_a, d_off, d_gather, d_out_t, d_out_f, d_ws;
    d_canon.ensure(canon.size());
    d_ts.ensure(n_scales * 4);
    d_a.ensure(a.size() * 2);
    d_off.ensure(offsets.size() * 4);
    d_gather.ensure(gather.size() * 4);
    const size_t out_bytes = size_t(p.total_rows) * size_t(p.n) * 2;
    d_out_t.ensure(out_bytes);
    d_out_f.ensure(out_bytes);
    d_ws.ensure(std::max(t->workspace_bytes(p), fb->workspace_bytes(p)));
    FP4MOE_CUDA_THROW(cudaMemset(d_ws.get(), 0, std::max(t->workspace_bytes(p), fb->workspace_bytes(p))));
    FP4MOE_CUDA_THROW(cudaMemcpy(d_canon.get(), canon.data(), canon.size(), cudaMemcpyHostToDevice));
    FP4MOE_CUDA_THROW(cudaMemcpy(d_ts.get(), ts.data(), n_scales * 4, cudaMemcpyHostToDevice));
    FP4MOE_CUDA_THROW(cudaMemcpy(d_a.get(), a.data(), a.size() * 2, cudaMemcpyHostToDevice));
    FP4MOE_CUDA_THROW(cudaMemcpy(d_off.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
    FP4MOE_CUDA_THROW(cudaMemcpy(d_gather.get(), gather.data(), gather.size() * 4, cudaMemcpyHostToDevice));

    auto run_one = [&](GroupedGemmTactic* tac, DevBuf& out, DevBuf& packed) {
      tac->init(p).throw_if_error();
      const void* w = d_canon.get();
      if (tac->desc().layout != WeightLayout::kCanonical) {
        const WeightLayoutOps* ops = find_weight_layout_ops(tac->desc().layout);
        FP4MOE_CHECK(ops && ops->bytes && ops->pack, StatusCode::kUnsupported, "weight layout {} has no packing",
                     weight_layout_name(tac->desc().layout));
        packed.ensure(ops->bytes(p));
        ops->pack(p, d_canon.get(), packed.get(), stream_).throw_if_error();
        w = packed.get();
      }
      FP4MOE_CUDA_THROW(cudaMemsetAsync(out.get(), kPoison, out_bytes, stream_));
      GroupedGemmArgs args;
      args.problem = p;
      args.expert_offsets = d_off.get<int32_t>();
      args.a = d_a.get<uint16_t>();
      args.a_row_index = p.op == GemmOp::kFc1SwiGlu ? d_gather.get<int32_t>() : nullptr;
      args.a_ld = p.k;
      args.weights = w;
      args.tensor_scales = d_ts.get<float>();
      args.out = out.get<uint16_t>();
      args.workspace = d_ws.get();
      tac->run(args, stream_).throw_if_error();
      FP4MOE_CUDA_THROW(cudaGetLastError());
      FP4MOE_CUDA_THROW(cudaStreamSynchronize(stream_));
      std::vector<uint16_t> host(out_bytes / 2);
      FP4MOE_CUDA_THROW(cudaMemcpy(host.data(), out.get(), out_bytes, cudaMemcpyDeviceToHost));
      return host;
    };
    DevBuf packed_t, packed_f;
    const std::vector<uint16_t> ref = run_one(fb, d_out_f, packed_f);
    const std::vector<uint16_t> got = run_one(t, d_out_t, packed_t);
    const size_t used_vals = size_t(used) * size_t(p.n);
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < used_vals; ++i) {
      const double g = bf16_to_float(got[i]), r = bf16_to_float(ref[i]);
      if (!std::isfinite(g)) ++bad;
      num += (g - r) * (g - r);
      den += r * r;
    }
    const uint16_t poison16 = uint16_t(kPoison) * 0x101;
    size_t touched = 0;
    for (size_t i = used_vals; i < got.size(); ++i) touched += got[i] != poison16;
    const double rel = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
    const std::string where = fmt::format("{} (rows used {}, against fallback {})", p.to_string(), used, fallback_);
    FP4MOE_CHECK(bad == 0, StatusCode::kInternal, "wrong result: {} non-finite outputs on {}", bad, where);
    FP4MOE_CHECK(touched == 0, StatusCode::kInternal, "wrong result: wrote {} values past the last expert's rows on {}",
                 touched, where);
    FP4MOE_CHECK(rel <= kVerifyTolerance, StatusCode::kInternal,
                 "wrong result: relative L2 error {:.3e} > {:.0e} on {}", rel, kVerifyTolerance, where);
  }

  int device_;
  DeviceCaps caps_;
  std::vector<TacticDesc> descs_;
  std::map<std::string, GroupedGemmTactic*> tactics_;
  std::string fallback_;
  bool healthy_ = true;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
  std::unique_ptr<WeightSet> weights_[2];
  DevBuf act_, out_, offsets_, row_index_, workspace_;
};

}  // namespace

std::unique_ptr<TuningBackend> make_cuda_tuning_backend(int device, std::vector<GroupedGemmTactic*> extra) {
  return std::make_unique<CudaTuningBackend>(device, std::move(extra));
}

#else

std::unique_ptr<TuningBackend> make_cuda_tuning_backend(int, std::vector<GroupedGemmTactic*>) {
  throw Error(StatusCode::kUnsupported, "this build of fp4moe has no CUDA backend; use --device-profile NAME for a preflight");
}

#endif

}  // namespace fp4moe
