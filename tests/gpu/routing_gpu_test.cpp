// Routing and permutation kernels on their own, at the expert counts of real models (the layer tests use
// small E, which takes the generic routing kernel): ids and weights of launch_routing (the register fast
// path where it applies) and launch_routing_generic against the CPU reference on fresh random logits,
// and the permutation (the one-block kernel for small batches, the three-kernel path for large ones)
// against a stable grouping computed here. Outputs are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/engine_kernels.h"
#include "fp4moe/reference.h"
#include "gpu_test_util.h"

namespace fp4moe::test {
namespace {

struct RouteCase {
  const char* name;
  int64_t experts, topk, n_group, topk_group;
  bool sigmoid, bias, norm;
};

MoeConfig route_config(const RouteCase& rc) {
  MoeConfig c;
  c.name = rc.name;
  c.hidden = 64;
  c.inter = 32;
  c.num_experts = rc.experts;
  c.topk = rc.topk;
  c.routing = rc.sigmoid ? RoutingKind::kSigmoidGrouped : RoutingKind::kSoftmaxTopK;
  c.n_group = rc.sigmoid ? rc.n_group : 1;
  c.topk_group = rc.sigmoid ? rc.topk_group : 1;
  c.has_correction_bias = rc.bias;
  c.norm_topk_prob = rc.norm;
  c.routed_scaling_factor = rc.sigmoid ? 2.5f : 1.0f;
  return c;
}

TEST(Routing, FastAndGenericEqualReference) {
  const RouteCase cases[] = {
      {"glm5-like", 256, 8, 8, 4, true, true, true},   {"deepseek-like-nobias", 256, 8, 8, 4, true, false, true},
      {"one-group", 256, 8, 1, 1, true, true, true},   {"e512-g32", 512, 10, 32, 8, true, true, true},
      {"e64-g2", 64, 6, 2, 1, true, true, false},      {"e32-g32", 32, 4, 32, 4, true, false, true},
      {"softmax-e128", 128, 8, 1, 1, false, false, true}, {"softmax-e64-top1", 64, 1, 1, 1, false, false, false},
      {"e96-generic", 96, 8, 4, 2, true, true, true},  {"softmax-e8-generic", 8, 2, 1, 1, false, false, true},
  };
  int checked = 0;
  for (const RouteCase& rc : cases) {
    const MoeConfig cfg = route_config(rc);
    for (int64_t T : {1, 3, 33, 300}) {
      SCOPED_TRACE(::testing::Message() << rc.name << " T=" << T);
      const uint64_t seed = 7000 + T * 31 + rc.experts;
      const std::vector<float> logits = random_f32(static_cast<size_t>(T * rc.experts), seed, 2.0f);
      std::vector<float> bias;
      if (rc.bias) bias = random_f32(static_cast<size_t>(rc.experts), seed + 1, 0.1f);
      const RoutingResult ref = route(logits.data(), rc.bias ? bias.data() : nullptr, T, cfg);
      Dev d_logits = Dev::from(logits);
      Dev d_bias = rc.bias ? Dev::from(bias) : Dev();
      for (bool generic : {false, true}) {
        Dev ids(static_cast<size_t>(T * rc.topk) * sizeof(int32_t)), w(static_cast<size_t>(T * rc.topk) * sizeof(float));
        ids.poison();
        w.poison();
        const float* bp = rc.bias ? d_bias.as<float>() : nullptr;
        const Status st = generic ? engine::launch_routing_generic(d_logits.as<float>(), bp, T, cfg, ids.as<int32_t>(),
                                                                   w.as<float>(), nullptr)
                                  : engine::launch_routing(d_logits.as<float>(), bp, T, cfg, ids.as<int32_t>(),
                                                           w.as<float>(), nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<int32_t> got_ids = ids.download<int32_t>(static_cast<size_t>(T * rc.topk));
        const std::vector<float> got_w = w.download<float>(static_cast<size_t>(T * rc.topk));
        int id_diff = 0;
        double max_rel = 0.0;
        for (size_t i = 0; i < got_ids.size(); ++i) {
          id_diff += got_ids[i] != ref.ids[i];
          max_rel = std::max(max_rel, std::fabs(double(got_w[i]) - ref.weights[i]) / std::max(1e-30, std::fabs(double(ref.weights[i]))));
        }
        EXPECT_EQ(id_diff, 0) << (generic ? "generic" : "fast");
        EXPECT_LE(max_rel, 1e-5) << (generic ? "generic" : "fast");
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 10 * 4 * 2);
}

// Stable grouping by expert: rows of expert e in pair order.
TEST(Routing, PermuteGroupsStably) {
  for (int64_t E : {8, 256, 300}) {
    for (int64_t T : {0, 1, 7, 128, 512, 600}) {
      const int64_t K = 8 < E ? 8 : 2, P = T * K;
      SCOPED_TRACE(::testing::Message() << "E=" << E << " T=" << T);
      // Distinct experts per token, skewed so some experts get many rows and some none.
      std::mt19937_64 rng(static_cast<uint64_t>(E * 1000 + T));
      std::vector<int32_t> ids(static_cast<size_t>(P));
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> pool(static_cast<size_t>(E));
        std::iota(pool.begin(), pool.end(), 0);
        for (int64_t k = 0; k < K; ++k) {
          const int64_t hot = std::min<int64_t>(E - k, 3 + static_cast<int64_t>(rng() % 5));
          const int64_t j = k + static_cast<int64_t>(rng() % static_cast<uint64_t>(rng() % 4 == 0 ? E - k : hot));
          std::swap(pool[k], pool[j]);
          ids[t * K + k] = pool[k];
        }
      }
      std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0), gather(static_cast<size_t>(P)),
          pos(static_cast<size_t>(P));
      for (int32_t e : ids) ++offsets[e + 1];
      for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
      std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
      for (int64_t i = 0; i < P; ++i) {
        const int32_t row = next[ids[i]]++;
        gather[row] = static_cast<int32_t>(i / K);
        pos[i] = row;
      }
      const int64_t chunks = engine::permute_chunks(P);
      Dev d_ids = P ? Dev::from(ids) : Dev(4);
      Dev rank(static_cast<size_t>(std::max<int64_t>(P, 1)) * 4), cb(static_cast<size_t>(std::max<int64_t>(chunks, 1) * E) * 4),
          off(static_cast<size_t>(E + 1) * 4), g(static_cast<size_t>(std::max<int64_t>(P, 1)) * 4),
          pp(static_cast<size_t>(std::max<int64_t>(P, 1)) * 4), so(8);
      for (const Dev* d : {&off, &g, &pp, &so}) d->poison();
      ASSERT_TRUE(engine::prepare_permute_kernels(E).is_ok());
      engine::PermuteBuffers b;
      b.rank = rank.as<int32_t>();
      b.chunk_base = cb.as<int32_t>();
      b.offsets = off.as<int32_t>();
      b.gather = g.as<int32_t>();
      b.pair_pos = pp.as<int32_t>();
      b.shared_offsets = so.as<int32_t>();
      const Status st = engine::launch_permute(d_ids.as<int32_t>(), T, K, E, b, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(off.download<int32_t>(static_cast<size_t>(E + 1)), offsets);
      if (P > 0) {
        EXPECT_EQ(g.download<int32_t>(static_cast<size_t>(P)), gather);
        EXPECT_EQ(pp.download<int32_t>(static_cast<size_t>(P)), pos);
      }
      EXPECT_EQ(so.download<int32_t>(2), (std::vector<int32_t>{0, static_cast<int32_t>(T)}));
    }
  }
}

}  // namespace
}  // namespace fp4moe::test
