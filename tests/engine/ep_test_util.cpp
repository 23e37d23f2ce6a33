// Expert-parallel test helpers (see ep_test_util.h).
#include "ep_test_util.h"

#include <stdexcept>

#include "fp4moe/dtype.h"
#include "fp4moe/reference.h"

namespace fp4moe::test {

namespace {

LinearWeights zero_nvfp4(int64_t n, int64_t k) {
  PackedNvfp4Weights q;
  q.n = n;
  q.k = k;
  q.codes.assign(static_cast<size_t>(n * k / 2), 0);         // E2M1 code 0 is +0
  q.scales.assign(static_cast<size_t>(n * k / 16), 0x38);    // e4m3 1.0
  q.tensor_scale = 1.0f;
  return LinearWeights::from_nvfp4(std::move(q));
}

}  // namespace

MoeLayerWeights ep_partial_layer(const MoeLayerWeights& w, int size, int rank) {
  const MoeConfig& c = w.config;
  const int64_t E = c.num_experts;
  if (size < 1 || rank < 0 || rank >= size || E % size != 0) throw std::invalid_argument("ep_partial_layer: bad shard");
  const int64_t count = E / size, first = rank * count;
  MoeLayerWeights p = w;
  ExpertWeights zero;
  zero.gate = zero_nvfp4(c.inter, c.hidden);
  zero.up = zero_nvfp4(c.inter, c.hidden);
  zero.down = zero_nvfp4(c.hidden, c.inter);
  for (int64_t e = 0; e < E; ++e) {
    if (e >= first && e < first + count) {
      if (p.experts[static_cast<size_t>(e)].empty())
        throw std::invalid_argument("ep_partial_layer: expert " + std::to_string(e) + " of the shard is missing");
      continue;
    }
    p.experts[static_cast<size_t>(e)] = zero;
  }
  if (rank != 0) {  // the shared expert lives on rank 0
    p.shared.reset();
    p.config.n_shared_experts = 0;
    p.config.shared_inter = 0;
  }
  return p;
}

std::vector<float> sum_partials_f32(const std::vector<std::vector<uint16_t>>& partials) {
  std::vector<float> sum(partials.empty() ? 0 : partials[0].size(), 0.0f);
  for (const auto& p : partials) {
    if (p.size() != sum.size()) throw std::invalid_argument("sum_partials_f32: partials differ in size");
    for (size_t i = 0; i < p.size(); ++i) sum[i] += bf16_bits_to_f32(p[i]);
  }
  return sum;
}

double rel_l2_f32_vs_bf16(const std::vector<float>& got, const std::vector<uint16_t>& ref) {
  if (got.size() != ref.size()) throw std::invalid_argument("rel_l2_f32_vs_bf16: sizes differ");
  std::vector<float> r(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) r[i] = bf16_bits_to_f32(ref[i]);
  return relative_l2_error(got.data(), r.data(), static_cast<int64_t>(r.size()));
}

}  // namespace fp4moe::test
