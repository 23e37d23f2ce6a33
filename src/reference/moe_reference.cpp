// The reference MoE forward (include/fp4moe/reference.h): router logits, routing, per-token expert
// MLPs and the weighted combine, with bf16 rounding at exactly the points R1..R5 listed there.
//
// Weights are never dequantised as a whole: each weight row is decoded (unscaled, e2m1 * e4m3, exact in
// fp32) into a per-thread buffer right before its dot product, so memory stays at the packed size and
// only the experts a token uses are touched. Tokens are split into contiguous ranges, one per thread;
// each output element is computed by one thread in a fixed order, so results do not depend on the
// thread count.
//
// Dot products accumulate in fp32 in 16 strided partial sums (element i into lane i % 16), combined
// pairwise at the end. The order of the fp32 sums is not a rounding point of the specification (the GPU
// sums in its own order); the strided form keeps the reference accurate and fast.
#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>
#include <vector>

#include "fp4moe/reference.h"
#include "fp4moe/status.h"

namespace fp4moe {

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) acc[i & 15] += a[i] * b[i];
  for (int w = 8; w > 0; w >>= 1)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// Decoding tables built from the format's own decoders: every byte of packed codes -> its two E2M1
// values (low nibble first), every E4M3 byte -> its value.
struct DecodeTables {
  float pair[256][2];
  float e4m3[256];
  DecodeTables() {
    for (int b = 0; b < 256; ++b) {
      pair[b][0] = e2m1_decode(static_cast<uint8_t>(b & 0xF));
      pair[b][1] = e2m1_decode(static_cast<uint8_t>(b >> 4));
      e4m3[b] = e4m3_decode(static_cast<uint8_t>(b));
    }
  }
};
const DecodeTables& decode_tables() {
  static const DecodeTables t;
  return t;
}

// Decodes row r of w into out[0, w.k) without the tensor scale (e2m1 * e4m3, exact in fp32, i.e.
// PackedNvfp4Weights::at_unscaled; or the bf16 value) and returns the factor still to apply: the NVFP4
// tensor scale, or 1 for bf16.
float decode_row_unscaled(const LinearWeights& w, int64_t r, float* out) {
  const int64_t k = w.k;
  if (w.format == LinearWeights::Format::kBF16) {
    const uint16_t* src = w.bf16.data() + r * k;
    for (int64_t c = 0; c < k; ++c) out[c] = bf16_bits_to_f32(src[c]);
    return 1.0f;
  }
  const DecodeTables& t = decode_tables();
  const PackedNvfp4Weights& q = w.nvfp4;
  const uint8_t* codes = q.codes.data() + r * (k / 2);
  const uint8_t* scales = q.scales.data() + r * (k / kNvfp4BlockSize);
  for (int64_t b = 0; b < k / kNvfp4BlockSize; ++b) {
    const float s = t.e4m3[scales[b]];
    const uint8_t* cb = codes + b * (kNvfp4BlockSize / 2);
    float* ob = out + b * kNvfp4BlockSize;
    for (int j = 0; j < kNvfp4BlockSize / 2; ++j) {
      ob[2 * j] = t.pair[cb[j]][0] * s;
      ob[2 * j + 1] = t.pair[cb[j]][1] * s;
    }
  }
  return q.tensor_scale;
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

// R3: a[i] = bf16(silu(gate_acc * gate_scale) * (up_acc * up_scale)). `row` holds >= H floats.
void fc1(const ExpertWeights& e, const float* x, float* a, float* row) {
  const int64_t H = e.gate.k, I = e.gate.n;
  for (int64_t i = 0; i < I; ++i) {
    const float gs = decode_row_unscaled(e.gate, i, row);
    const float gate = dot(x, row, H) * gs;
    const float us = decode_row_unscaled(e.up, i, row);
    const float up = dot(x, row, H) * us;
    a[i] = round_bf16(silu(gate) * up);
  }
}

// R4: y[h] = bf16(down_acc * down_scale). `row` holds >= I floats.
void fc2(const ExpertWeights& e, const float* a, float* y, float* row) {
  const int64_t I = e.down.k, H = e.down.n;
  for (int64_t h = 0; h < H; ++h) {
    const float ds = decode_row_unscaled(e.down, h, row);
    y[h] = round_bf16(dot(a, row, I) * ds);
  }
}

void check_expert_shapes(const ExpertWeights& e, const char* fn) {
  FP4MOE_CHECK(!e.empty(), StatusCode::kInvalidArgument, "{}: the expert is not materialised", fn);
  FP4MOE_CHECK(e.up.n == e.gate.n && e.up.k == e.gate.k && e.down.n == e.gate.k && e.down.k == e.gate.n,
               StatusCode::kInvalidArgument,
               "{}: inconsistent expert shapes gate [{}, {}], up [{}, {}], down [{}, {}] (expected [I, H], [I, H], [H, I])",
               fn, e.gate.n, e.gate.k, e.up.n, e.up.k, e.down.n, e.down.k);
}

// Per-thread buffers for one token.
struct Scratch {
  std::vector<float> x, row, a, y, acc;
};

void forward_tokens(const MoeLayerWeights& w, const uint16_t* x_bf16, const RoutingResult& routing,
                    int64_t t_begin, int64_t t_end, uint16_t* out) {
  const MoeConfig& c = w.config;
  const int64_t H = c.hidden, K = c.topk;
  const int64_t I_max = std::max(c.inter, w.shared ? c.shared_inter : int64_t{0});
  Scratch s;
  s.x.resize(static_cast<size_t>(H));
  s.row.resize(static_cast<size_t>(std::max(H, I_max)));
  s.a.resize(static_cast<size_t>(I_max));
  s.y.resize(static_cast<size_t>(H));
  s.acc.resize(static_cast<size_t>(H));
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int64_t h = 0; h < H; ++h) s.x[h] = bf16_bits_to_f32(x_bf16[t * H + h]);  // R1
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    for (int64_t k = 0; k < K; ++k) {  // R5: routed experts in rank order
      const ExpertWeights& e = w.experts[static_cast<size_t>(routing.ids[t * K + k])];
      const float wk = routing.weights[t * K + k];
      fc1(e, s.x.data(), s.a.data(), s.row.data());
      fc2(e, s.a.data(), s.y.data(), s.row.data());
      for (int64_t h = 0; h < H; ++h) s.acc[h] += wk * s.y[h];
    }
    if (w.shared && !w.shared->empty()) {  // then the shared expert, weight 1
      fc1(*w.shared, s.x.data(), s.a.data(), s.row.data());
      fc2(*w.shared, s.a.data(), s.y.data(), s.row.data());
      for (int64_t h = 0; h < H; ++h) s.acc[h] += s.y[h];
    }
    for (int64_t h = 0; h < H; ++h) out[t * H + h] = f32_to_bf16_bits(s.acc[h]);
  }
}

}  // namespace

void expert_fc1_reference(const ExpertWeights& e, const float* x, float* a) {
  check_expert_shapes(e, "expert_fc1_reference");
  std::vector<float> row(static_cast<size_t>(e.gate.k));
  fc1(e, x, a, row.data());
}

void expert_fc2_reference(const ExpertWeights& e, const float* a, float* y) {
  check_expert_shapes(e, "expert_fc2_reference");
  std::vector<float> row(static_cast<size_t>(e.down.k));
  fc2(e, a, y, row.data());
}

std::vector<float> router_logits_reference(const uint16_t* x_bf16, int64_t tokens, const MoeLayerWeights& w) {
  const int64_t H = w.config.hidden, E = w.config.num_experts;
  FP4MOE_CHECK(tokens >= 0, StatusCode::kInvalidArgument, "router_logits_reference: token count {} is negative",
               tokens);
  FP4MOE_CHECK(H > 0 && E > 0, StatusCode::kInvalidArgument,
               "router_logits_reference: config has hidden = {}, num_experts = {}", H, E);
  FP4MOE_CHECK(w.router_weight.size() == static_cast<size_t>(E * H), StatusCode::kInvalidArgument,
               "router_logits_reference: router weight must be [{}, {}] ({} values), found {} values{}", E, H, E * H,
               w.router_weight.size(), w.router_weight.empty() ? " (no router weight: pass logits instead)" : "");
  FP4MOE_CHECK(tokens == 0 || x_bf16 != nullptr, StatusCode::kInvalidArgument,
               "router_logits_reference: x is null for {} tokens", tokens);
  std::vector<float> logits(static_cast<size_t>(tokens * E));
  std::vector<float> x(static_cast<size_t>(H));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) x[h] = bf16_bits_to_f32(x_bf16[t * H + h]);
    for (int64_t e = 0; e < E; ++e) logits[t * E + e] = dot(x.data(), w.router_weight.data() + e * H, H);  // R2
  }
  return logits;
}

MoeForwardResult moe_forward_reference(const MoeLayerWeights& w, const uint16_t* x_bf16, int64_t tokens,
                                       const float* logits, int threads) {
  w.validate();
  const MoeConfig& c = w.config;
  FP4MOE_CHECK(tokens >= 0, StatusCode::kInvalidArgument, "moe_forward_reference: token count {} is negative",
               tokens);
  FP4MOE_CHECK(tokens == 0 || x_bf16 != nullptr, StatusCode::kInvalidArgument,
               "moe_forward_reference: x is null for {} tokens", tokens);
  std::vector<float> computed;
  if (logits == nullptr && tokens > 0) {
    computed = router_logits_reference(x_bf16, tokens, w);
    logits = computed.data();
  }
  MoeForwardResult result;
  result.routing = route(logits, w.correction_bias.empty() ? nullptr : w.correction_bias.data(), tokens, c);
  const RoutingResult& r = result.routing;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < c.topk; ++k) {
      const int32_t e = r.ids[t * c.topk + k];
      FP4MOE_CHECK(!w.experts[static_cast<size_t>(e)].empty(), StatusCode::kInvalidArgument,
                   "moe_forward_reference: token {} routes to expert {} (rank {}), which is not materialised", t, e,
                   k);
    }
  }
  result.out.assign(static_cast<size_t>(tokens * c.hidden), 0);
  if (tokens == 0) return result;

  int64_t n = threads > 0 ? threads : static_cast<int64_t>(std::thread::hardware_concurrency());
  n = std::max<int64_t>(1, std::min(n, tokens));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  auto work = [&](int64_t i) {
    try {
      forward_tokens(w, x_bf16, r, tokens * i / n, tokens * (i + 1) / n, result.out.data());
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  for (int64_t i = 1; i < n; ++i) pool.emplace_back(work, i);
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return result;
}

double relative_l2_error(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num) / std::sqrt(den);
}

}  // namespace fp4moe
