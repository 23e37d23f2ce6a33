// GPU test helpers (see gpu_test_util.h).
#include "gpu_test_util.h"

#include <cmath>
#include <stdexcept>

#include "fp4moe/device_caps.h"
#include "fp4moe/dtype.h"
#include "fp4moe/nvfp4.h"

namespace fp4moe::test {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

Dev::Dev(size_t bytes) : n_(bytes) {
  if (bytes) check(cudaMalloc(&p_, bytes), "cudaMalloc");
}
Dev::~Dev() {
  if (p_) cudaFree(p_);
}
Dev& Dev::operator=(Dev&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}
void Dev::poison() const {
  if (n_) check(cudaMemset(p_, kPoison, n_), "cudaMemset");
}
void Dev::upload(const void* host, size_t bytes) const {
  if (bytes) check(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void Dev::download_raw(void* host, size_t bytes) const {
  if (bytes) check(cudaMemcpy(host, p_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

std::vector<float> random_f32(size_t n, uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float sigma) {
  std::vector<float> f = random_f32(n, seed, sigma);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16_bits(f[i]);
  return v;
}

std::vector<float> bf16_to_f32(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_bits_to_f32(v[i]);
  return f;
}

LinearWeights random_nvfp4(int64_t n, int64_t k, uint64_t seed, float ts) {
  std::mt19937_64 rng(seed);
  PackedNvfp4Weights q;
  q.n = n;
  q.k = k;
  q.codes.resize(static_cast<size_t>(n * k / 2));
  for (auto& c : q.codes) c = static_cast<uint8_t>(rng());
  q.scales.resize(static_cast<size_t>(n * k / 16));
  for (auto& s : q.scales) {
    const uint32_t r = static_cast<uint32_t>(rng());
    s = static_cast<uint8_t>(((4 + r % 6) << 3) | ((r >> 8) & 7));
  }
  q.tensor_scale = ts;
  return LinearWeights::from_nvfp4(std::move(q));
}

ExpertWeights random_expert(int64_t hidden, int64_t inter, uint64_t seed) {
  // e2m1 rms ~3.2, scales ~1.5: ts ~ 0.2/sqrt(k) keeps every projection near unit gain.
  ExpertWeights e;
  e.gate = random_nvfp4(inter, hidden, seed * 3 + 1, 0.2f / std::sqrt(static_cast<float>(hidden)));
  e.up = random_nvfp4(inter, hidden, seed * 3 + 2, 0.23f / std::sqrt(static_cast<float>(hidden)));
  e.down = random_nvfp4(hidden, inter, seed * 3 + 3, 0.2f / std::sqrt(static_cast<float>(inter)));
  return e;
}

ExpertWeights random_bf16_expert(int64_t hidden, int64_t inter, uint64_t seed) {
  ExpertWeights e;
  e.gate = LinearWeights::from_bf16(inter, hidden, random_bf16(inter * hidden, seed * 5 + 1, 1.0f / std::sqrt(float(hidden))));
  e.up = LinearWeights::from_bf16(inter, hidden, random_bf16(inter * hidden, seed * 5 + 2, 1.0f / std::sqrt(float(hidden))));
  e.down = LinearWeights::from_bf16(hidden, inter, random_bf16(hidden * inter, seed * 5 + 3, 1.0f / std::sqrt(float(inter))));
  return e;
}

void canonical_host(const std::vector<ExpertWeights>& experts, GemmOp op, std::vector<uint8_t>* bytes,
                    std::vector<float>* tensor_scales) {
  bytes->clear();
  tensor_scales->clear();
  std::vector<uint8_t> scales;
  for (const ExpertWeights& e : experts) {
    std::vector<const LinearWeights*> parts;
    if (op == GemmOp::kFc1SwiGlu) {
      parts = {&e.gate, &e.up};
    } else {
      parts = {&e.down};
    }
    for (const LinearWeights* l : parts) {
      bytes->insert(bytes->end(), l->nvfp4.codes.begin(), l->nvfp4.codes.end());
      scales.insert(scales.end(), l->nvfp4.scales.begin(), l->nvfp4.scales.end());
      tensor_scales->push_back(l->nvfp4.tensor_scale);
    }
  }
  bytes->insert(bytes->end(), scales.begin(), scales.end());
}

double rel_l2_bf16(const uint16_t* got, const uint16_t* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = bf16_bits_to_f32(got[i]), b = bf16_bits_to_f32(ref[i]);
    num += (a - b) * (a - b);
    den += b * b;
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  if (std::isnan(num)) return INFINITY;
  return std::sqrt(num / den);
}

double rel_l2_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  return rel_l2_bf16(got.data(), ref.data(), got.size());
}

std::vector<GroupedGemmTactic*> runnable_tactics(const GemmProblem& problem, std::vector<std::string>* skipped) {
  const DeviceCaps caps = query_device_caps(0);
  std::vector<GroupedGemmTactic*> out;
  for (const TacticDesc& d : all_tactic_descs()) {
    GroupedGemmTactic* t = find_tactic(d.name);
    if (!t) {
      if (skipped) skipped->push_back(d.name + ": not runnable in this build");
      continue;
    }
    const TacticCheck c = t->check(problem, caps);
    if (!c.ok) {
      if (skipped) skipped->push_back(d.name + ": " + c.reason);
      continue;
    }
    out.push_back(t);
  }
  return out;
}

size_t count_poison(const std::vector<uint16_t>& v) {
  size_t n = 0;
  for (uint16_t x : v) n += x == static_cast<uint16_t>(kPoison | (kPoison << 8));
  return n;
}

}  // namespace fp4moe::test
