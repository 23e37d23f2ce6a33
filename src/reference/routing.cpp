// Reference routing (shared/DESIGN.md section 3), in fp32, one token at a time.
//
// softmax top-k (Mixtral, Qwen-MoE):
//   m = max_e l[e]; p[e] = exp(l[e] - m) / sum_e exp(l[e] - m)      (sum in expert order)
//   ids = the k largest p, best first, ties -> lower expert index
//   w = p[ids]; if norm_topk_prob: w /= sum(w) (sum in rank order); w *= routed_scaling_factor
//
// sigmoid, grouped (DeepSeek-V3, GLM "noaux_tc"):
//   s[e] = 1 / (1 + exp(-l[e])); c[e] = s[e] + bias[e]  (bias 0 when absent)
//   experts form n_group contiguous groups of G = E / n_group;
//   group score = top1(c in group) + top2(c in group)  (top1 alone when G == 1)
//   keep the topk_group best groups (ties -> lower group index)
//   ids = the k largest c among experts of kept groups, best first (ties -> lower expert index)
//   w = s[ids] (unbiased); if norm_topk_prob: w /= (sum(w) + 1e-20); w *= routed_scaling_factor
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "fp4moe/reference.h"
#include "fp4moe/status.h"

namespace fp4moe {

namespace {

// Orders candidate indices by score, larger first, ties -> lower index (a strict weak order).
struct ByScoreThenIndex {
  const float* score;
  bool operator()(int32_t a, int32_t b) const {
    if (score[a] != score[b]) return score[a] > score[b];
    return a < b;
  }
};

void check_common(const float* logits, int64_t tokens, const MoeConfig& cfg, const char* fn) {
  FP4MOE_CHECK(tokens >= 0, StatusCode::kInvalidArgument, "{}: token count {} is negative", fn, tokens);
  FP4MOE_CHECK(cfg.num_experts > 0, StatusCode::kInvalidArgument, "{}: num_experts = {} must be positive", fn,
               cfg.num_experts);
  FP4MOE_CHECK(cfg.topk > 0 && cfg.topk <= cfg.num_experts, StatusCode::kInvalidArgument,
               "{}: topk = {} must be in [1, num_experts = {}]", fn, cfg.topk, cfg.num_experts);
  FP4MOE_CHECK(tokens == 0 || logits != nullptr, StatusCode::kInvalidArgument, "{}: logits pointer is null for {} tokens",
               fn, tokens);
  FP4MOE_CHECK(std::isfinite(cfg.routed_scaling_factor), StatusCode::kInvalidArgument,
               "{}: routed_scaling_factor is not finite", fn);
  const int64_t E = cfg.num_experts;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < E; ++e)
      FP4MOE_CHECK(std::isfinite(logits[t * E + e]), StatusCode::kInvalidArgument,
                   "{}: logit [token {}, expert {}] is not finite ({})", fn, t, e, logits[t * E + e]);
}

RoutingResult empty_result(int64_t tokens, int64_t topk) {
  RoutingResult r;
  r.tokens = tokens;
  r.topk = topk;
  r.ids.assign(static_cast<size_t>(tokens * topk), 0);
  r.weights.assign(static_cast<size_t>(tokens * topk), 0.0f);
  return r;
}

}  // namespace

RoutingResult route_softmax_topk(const float* logits, int64_t tokens, const MoeConfig& cfg) {
  check_common(logits, tokens, cfg, "route_softmax_topk");
  const int64_t E = cfg.num_experts, K = cfg.topk;
  RoutingResult r = empty_result(tokens, K);
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    float m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - m);
      sum += p[e];
    }
    for (int64_t e = 0; e < E; ++e) p[e] = p[e] / sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), ByScoreThenIndex{p.data()});
    int32_t* ids = r.ids.data() + t * K;
    float* w = r.weights.data() + t * K;
    float wsum = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      ids[k] = order[k];
      w[k] = p[order[k]];
      wsum += w[k];
    }
    for (int64_t k = 0; k < K; ++k) {
      if (cfg.norm_topk_prob) w[k] = w[k] / wsum;
      w[k] *= cfg.routed_scaling_factor;
    }
  }
  return r;
}

RoutingResult route_sigmoid_grouped(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg) {
  check_common(logits, tokens, cfg, "route_sigmoid_grouped");
  const int64_t E = cfg.num_experts, K = cfg.topk, NG = cfg.n_group, KG = cfg.topk_group;
  FP4MOE_CHECK(NG > 0 && E % NG == 0, StatusCode::kInvalidArgument,
               "route_sigmoid_grouped: n_group = {} must be positive and divide num_experts = {}", NG, E);
  FP4MOE_CHECK(KG > 0 && KG <= NG, StatusCode::kInvalidArgument,
               "route_sigmoid_grouped: topk_group = {} must be in [1, n_group = {}]", KG, NG);
  const int64_t G = E / NG;
  FP4MOE_CHECK(K <= KG * G, StatusCode::kInvalidArgument,
               "route_sigmoid_grouped: topk = {} exceeds the experts in the kept groups (topk_group {} x group size {})",
               K, KG, G);
  if (bias != nullptr)
    for (int64_t e = 0; e < E; ++e)
      FP4MOE_CHECK(std::isfinite(bias[e]), StatusCode::kInvalidArgument,
                   "route_sigmoid_grouped: correction bias [{}] is not finite ({})", e, bias[e]);

  RoutingResult r = empty_result(tokens, K);
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), gscore(static_cast<size_t>(NG));
  std::vector<int32_t> gorder(static_cast<size_t>(NG)), cand;
  cand.reserve(static_cast<size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      choice[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    for (int64_t g = 0; g < NG; ++g) {
      const float* c = choice.data() + g * G;
      if (G == 1) {
        gscore[g] = c[0];
        continue;
      }
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int64_t j = 0; j < G; ++j) {
        if (c[j] > top1) {
          top2 = top1;
          top1 = c[j];
        } else if (c[j] > top2) {
          top2 = c[j];
        }
      }
      gscore[g] = top1 + top2;
    }
    std::iota(gorder.begin(), gorder.end(), 0);
    std::partial_sort(gorder.begin(), gorder.begin() + KG, gorder.end(), ByScoreThenIndex{gscore.data()});
    cand.clear();
    for (int64_t gi = 0; gi < KG; ++gi)
      for (int64_t j = 0; j < G; ++j) cand.push_back(static_cast<int32_t>(gorder[gi] * G + j));
    std::partial_sort(cand.begin(), cand.begin() + K, cand.end(), ByScoreThenIndex{choice.data()});
    int32_t* ids = r.ids.data() + t * K;
    float* w = r.weights.data() + t * K;
    float wsum = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      ids[k] = cand[k];
      w[k] = s[cand[k]];
      wsum += w[k];
    }
    for (int64_t k = 0; k < K; ++k) {
      if (cfg.norm_topk_prob) w[k] = w[k] / (wsum + 1e-20f);
      w[k] *= cfg.routed_scaling_factor;
    }
  }
  return r;
}

RoutingResult route(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg) {
  switch (cfg.routing) {
    case RoutingKind::kSoftmaxTopK: return route_softmax_topk(logits, tokens, cfg);
    case RoutingKind::kSigmoidGrouped: return route_sigmoid_grouped(logits, bias, tokens, cfg);
  }
  throw Error(StatusCode::kInvalidArgument,
              fmt::format("route: unknown routing kind {}", static_cast<int>(cfg.routing)));
}

}  // namespace fp4moe
