// Routing and permutation kernels on their own, at the expert counts of real models (the layer tests use
// small E, which takes the generic routing kernel): ids and weights of launch_routing (the register fast
// path where it applies) and launch_routing_generic against the CPU reference on fresh random logits,
// and the permutation (the one-block kernel for small batches, the three-kernel path for large ones)
// against a stable grouping computed here; and the fused small-batch front end (launch_front_small) against
// those separate launches, byte for byte, also with the token rows appended as one more expert (the
// engine's folded shared expert); and the weighted combine (finalize) against the host. Outputs are
// poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "engine/engine_kernels.h"
#include "fp4moe/dtype.h"
#include "fp4moe/reference.h"
#include "gpu_test_util.h"

namespace fp4moe::test {
namespace {

struct RouteCase {
  const char* name;
  int64_t experts, topk, n_group, topk_group;
  bool sigmoid, bias, norm;
  bool ties = false;  // logits on a coarse grid: many equal scores, so the tie rule decides
};

// Fresh random logits (scale 2), or (ties) the same clamped to [-1, 1] and rounded to multiples of 0.25.
std::vector<float> route_logits(const RouteCase& rc, int64_t tokens, uint64_t seed) {
  std::vector<float> l = random_f32(static_cast<size_t>(tokens * rc.experts), seed, 2.0f);
  if (rc.ties)
    for (float& v : l) v = std::round(std::min(1.0f, std::max(-1.0f, v)) * 4.0f) / 4.0f;
  return l;
}

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

// The fused small-batch front end writes the bytes of the separate launches (routing's fast path, the
// expert-parallel id map, the permutation and the gathered row copy), for the whole layer and a shard.
TEST(Routing, FrontSmallEqualsSeparateLaunches) {
  const RouteCase cases[] = {
      {"glm5-like", 256, 8, 8, 4, true, true, true},
      {"e512-g32", 512, 10, 32, 8, true, true, true},
      {"softmax-e128", 128, 8, 1, 1, false, false, true},
      {"softmax-e64-top1", 64, 1, 1, 1, false, false, false},
      // Sigmoid scores without a group limit take the two-level routing (front_block.cuh): GLM-5's own
      // routing, one without bias or normalisation over two slices, and both with many tied scores.
      {"glm5", 256, 8, 1, 1, true, true, true},
      {"e64-top6-nobias", 64, 6, 2, 2, true, false, false},
      {"glm5-ties", 256, 8, 1, 1, true, true, true, true},
      {"e64-top6-ties", 64, 6, 1, 1, true, false, true, true},
  };
  const int64_t H = 520, ld = 536;  // x rows are ld apart, y rows H
  int checked = 0;
  for (const RouteCase& rc : cases) {
    MoeConfig cfg = route_config(rc);
    cfg.hidden = H;
    const int64_t E = rc.experts, K = rc.topk;
    for (int64_t T : {1, 3, 8, 64}) {
      if (T * K > 64) continue;  // the fused path's limit (checked below)
      const int64_t P = T * K;
      ASSERT_TRUE(engine::front_small_supported(cfg, T, E)) << rc.name << " T=" << T;
      for (const engine::FrontShard shard : {engine::FrontShard{0, E}, engine::FrontShard{E / 4, E / 8}}) {
        const bool whole = shard.count == E;
        const int64_t PE = whole ? E : shard.count + 1;
        SCOPED_TRACE(::testing::Message() << rc.name << " T=" << T << " shard [" << shard.first << ", "
                                          << shard.first + shard.count << ")");
        const uint64_t seed = 9100 + T * 17 + E + shard.first;
        Dev logits = Dev::from(route_logits(rc, T, seed));
        std::vector<float> hbias = random_f32(static_cast<size_t>(E), seed + 1, 0.1f);
        if (rc.ties)  // ties of the selection score need equal biases too
          for (float& v : hbias) v = std::round(v * 20.0f) / 20.0f;
        Dev bias = rc.bias ? Dev::from(hbias) : Dev();
        Dev x = Dev::from(random_bf16(static_cast<size_t>(T * ld), seed + 2));
        const float* bp = rc.bias ? bias.as<float>() : nullptr;
        struct Out {
          Dev ids, w, off, gather, pos, y;
        };
        auto make = [&] {
          // One more offset, T more gather entries and rows: room for the appended token rows (append_tokens
          // below).
          Out o{Dev(static_cast<size_t>(P) * 4), Dev(static_cast<size_t>(P) * 4), Dev(static_cast<size_t>(PE + 2) * 4),
                Dev(static_cast<size_t>(P + T) * 4), Dev(static_cast<size_t>(P) * 4),
                Dev(static_cast<size_t>((P + T) * H) * 2)};
          for (const Dev* d : {&o.ids, &o.w, &o.off, &o.gather, &o.pos, &o.y}) d->poison();
          return o;
        };
        auto buffers = [](const Out& o, engine::PermuteBuffers* b) {
          b->offsets = o.off.as<int32_t>();
          b->gather = o.gather.as<int32_t>();
          b->pair_pos = o.pos.as<int32_t>();
        };
        // Separate launches, as the engine runs them for larger batches.
        Out ref = make();
        Dev local(static_cast<size_t>(P) * 4), rank(static_cast<size_t>(P) * 4),
            cb(static_cast<size_t>(engine::permute_chunks(P) * PE) * 4);
        engine::PermuteBuffers rb;
        buffers(ref, &rb);
        rb.rank = rank.as<int32_t>();
        rb.chunk_base = cb.as<int32_t>();
        ASSERT_TRUE(engine::launch_routing(logits.as<float>(), bp, T, cfg, ref.ids.as<int32_t>(), ref.w.as<float>(), nullptr)
                        .is_ok());
        const int32_t* ids = ref.ids.as<int32_t>();
        if (!whole) {
          ASSERT_TRUE(engine::launch_local_expert_ids(ids, P, shard.first, shard.count, local.as<int32_t>(), nullptr).is_ok());
          ids = local.as<int32_t>();
        }
        ASSERT_TRUE(engine::prepare_permute_kernels(PE).is_ok());
        ASSERT_TRUE(engine::launch_permute(ids, T, K, PE, rb, nullptr).is_ok());
        ASSERT_TRUE(engine::launch_gather_rows(x.as<uint16_t>(), ld, ref.gather.as<int32_t>(), P,
                                               whole ? nullptr : ref.off.as<int32_t>() + shard.count, H,
                                               ref.y.as<uint16_t>(), nullptr)
                        .is_ok());
        // One fused launch.
        Out got = make();
        engine::PermuteBuffers gb;
        buffers(got, &gb);
        const Status st = engine::launch_front_small(logits.as<float>(), bp, T, cfg, shard, x.as<uint16_t>(), ld,
                                                     got.ids.as<int32_t>(), got.w.as<float>(), gb, got.y.as<uint16_t>(),
                                                     nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        const auto n = static_cast<size_t>(P);
        EXPECT_EQ(got.ids.download<int32_t>(n), ref.ids.download<int32_t>(n));
        EXPECT_EQ(got.w.download<uint32_t>(n), ref.w.download<uint32_t>(n));  // the bits
        const std::vector<int32_t> off = ref.off.download<int32_t>(static_cast<size_t>(PE + 1));
        EXPECT_EQ(got.off.download<int32_t>(static_cast<size_t>(PE + 1)), off);
        EXPECT_EQ(got.gather.download<int32_t>(n), ref.gather.download<int32_t>(n));
        EXPECT_EQ(got.pos.download<int32_t>(n), ref.pos.download<int32_t>(n));
        const int64_t kept = whole ? P : off[static_cast<size_t>(shard.count)];
        const auto rows = static_cast<size_t>(kept * H);
        EXPECT_EQ(got.y.download<uint16_t>(rows), ref.y.download<uint16_t>(rows));
        // The rows past the kept ones (another rank's experts, and the room for appended rows) are left as
        // they were, and so is the offset past PE.
        const uint16_t poison = static_cast<uint16_t>(kPoison | (kPoison << 8));
        const std::vector<uint16_t> all = got.y.download<uint16_t>(static_cast<size_t>((P + T) * H));
        EXPECT_TRUE(std::all_of(all.begin() + static_cast<std::ptrdiff_t>(rows), all.end(),
                                [&](uint16_t v) { return v == poison; }));
        EXPECT_EQ(static_cast<uint32_t>(got.off.download<int32_t>(static_cast<size_t>(PE + 2))[PE + 1]),
                  kPoison * 0x01010101u);
        // append_tokens (the engine's folded shared expert): the same bytes, then offsets[PE + 1] = P + T
        // and y[P + t] = x[t]; refused for an expert shard.
        Out app = make();
        engine::PermuteBuffers ab;
        buffers(app, &ab);
        const Status sa = engine::launch_front_small(logits.as<float>(), bp, T, cfg, shard, x.as<uint16_t>(), ld,
                                                     app.ids.as<int32_t>(), app.w.as<float>(), ab, app.y.as<uint16_t>(),
                                                     nullptr, true);
        if (!whole) {
          EXPECT_EQ(sa.code(), StatusCode::kInvalidArgument) << sa.to_string();
          EXPECT_NE(sa.message().find("whole layer"), std::string::npos) << sa.message();
          ++checked;
          continue;
        }
        ASSERT_TRUE(sa.is_ok()) << sa.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(app.ids.download<int32_t>(n), ref.ids.download<int32_t>(n));
        EXPECT_EQ(app.w.download<uint32_t>(n), ref.w.download<uint32_t>(n));
        std::vector<int32_t> off2 = off;
        off2.push_back(static_cast<int32_t>(P + T));
        EXPECT_EQ(app.off.download<int32_t>(static_cast<size_t>(PE + 2)), off2);
        std::vector<int32_t> gather2 = ref.gather.download<int32_t>(n);
        for (int64_t t = 0; t < T; ++t) gather2.push_back(static_cast<int32_t>(t));  // the appended rows' tokens
        EXPECT_EQ(app.gather.download<int32_t>(static_cast<size_t>(P + T)), gather2);
        EXPECT_EQ(app.pos.download<int32_t>(n), ref.pos.download<int32_t>(n));
        const std::vector<uint16_t> ya = app.y.download<uint16_t>(static_cast<size_t>((P + T) * H));
        const std::vector<uint16_t> xs = x.download<uint16_t>(static_cast<size_t>(T * ld));
        EXPECT_TRUE(std::equal(ya.begin(), ya.begin() + static_cast<std::ptrdiff_t>(rows), all.begin()));
        for (int64_t t = 0; t < T; ++t)
          EXPECT_TRUE(std::equal(ya.begin() + (P + t) * H, ya.begin() + (P + t + 1) * H, xs.begin() + t * ld))
              << "appended row " << t;
        // Without y (the resident tactic reads the rows through gather): the same maps, no row written.
        Out nc = make();
        engine::PermuteBuffers nb;
        buffers(nc, &nb);
        const Status sn = engine::launch_front_small(logits.as<float>(), bp, T, cfg, shard, x.as<uint16_t>(), ld,
                                                     nc.ids.as<int32_t>(), nc.w.as<float>(), nb, nullptr, nullptr, true);
        ASSERT_TRUE(sn.is_ok()) << sn.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(nc.ids.download<int32_t>(n), ref.ids.download<int32_t>(n));
        EXPECT_EQ(nc.w.download<uint32_t>(n), ref.w.download<uint32_t>(n));
        EXPECT_EQ(nc.off.download<int32_t>(static_cast<size_t>(PE + 2)), off2);
        EXPECT_EQ(nc.gather.download<int32_t>(static_cast<size_t>(P + T)), gather2);
        EXPECT_EQ(nc.pos.download<int32_t>(n), ref.pos.download<int32_t>(n));
        const std::vector<uint16_t> yn = nc.y.download<uint16_t>(static_cast<size_t>((P + T) * H));
        EXPECT_TRUE(std::all_of(yn.begin(), yn.end(), [&](uint16_t v) { return v == poison; })) << "rows copied";
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, (3 + 2 + 3 + 4 + 3 + 3 + 3 + 3) * 2);  // top-10 stops at T = 3, top-1 goes on to T = 64
  // Outside its shapes the fused path says so instead of running.
  const MoeConfig glm = route_config(cases[0]);
  EXPECT_TRUE(engine::front_small_supported(glm, 8, 256));
  EXPECT_FALSE(engine::front_small_supported(glm, 9, 256));         // 72 pairs
  EXPECT_FALSE(engine::front_small_supported(route_config({"e8", 8, 2, 1, 1, false, false, true}), 1, 8));  // not 32k experts
  const Status big = engine::launch_front_small(nullptr, nullptr, 9, glm, engine::FrontShard{0, 256}, nullptr, 8, nullptr,
                                                nullptr, engine::PermuteBuffers{}, nullptr, nullptr);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("9 tokens x top-8"), std::string::npos) << big.message();
  const Status bad_shard = engine::launch_front_small(nullptr, nullptr, 1, glm, engine::FrontShard{250, 8}, nullptr, 8,
                                                      nullptr, nullptr, engine::PermuteBuffers{}, nullptr, nullptr);
  EXPECT_EQ(bad_shard.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_shard.message().find("[250, 258)"), std::string::npos) << bad_shard.message();
}

// The weighted combine (launch_finalize_partial) against the same operations on the host, byte for byte:
// per token, fp32 products and sums in rank order, then the shared expert's row, rounded to bf16. One
// token and several, top-k 8 (the batched loads) and 20 (one pair at a time), with and without a shared
// row, and with an expert shard's dropped pairs (kept_rows) whose rows must not count. Outputs are
// poisoned first. Where the shard's case runs, the kernel also zeroes a poisoned region after its wait
// (the chained GEMM launch's counters, GroupedGemmArgs::caller_resets), larger than its grid at T = 1.
TEST(Finalize, EqualsHostCombine) {
  const int64_t H = 1040;  // two column blocks of 256 threads x 8, the second partial
  int checked = 0;
  for (int64_t K : {8, 20})
    for (int64_t T : {1, 3})
      for (bool shared : {false, true})
        for (bool shard : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "top-" << K << " T=" << T << (shared ? " shared" : "")
                                            << (shard ? " kept rows" : ""));
          const int64_t P = T * K, kept = shard ? P - 3 : P;
          const uint64_t seed = 7700 + K * 31 + T * 7 + (shared ? 2 : 0) + (shard ? 1 : 0);
          const std::vector<uint16_t> hy = random_bf16(static_cast<size_t>(P * H), seed);
          const std::vector<uint16_t> hs = random_bf16(static_cast<size_t>(T * H), seed + 1);
          const std::vector<float> hw = random_f32(static_cast<size_t>(P), seed + 2, 0.5f);
          std::vector<int32_t> pos(static_cast<size_t>(P));  // pair -> grouped row: a permutation of 0 .. P-1
          std::iota(pos.begin(), pos.end(), 0);
          std::mt19937_64 rng(seed + 3);
          std::shuffle(pos.begin(), pos.end(), rng);
          Dev y = Dev::from(hy), ys = Dev::from(hs), w = Dev::from(hw), pp = Dev::from(pos);
          Dev kr = Dev::from(std::vector<int32_t>{static_cast<int32_t>(kept)});
          Dev out(static_cast<size_t>(T * H) * 2);
          out.poison();
          const size_t reset_bytes = shard ? 16 * 1031 : 0;  // more 16-byte units than the grid has threads
          Dev reset(16 * 1031 + 16);
          reset.poison();
          const Status st = engine::launch_finalize_partial(y.as<uint16_t>(), pp.as<int32_t>(), w.as<float>(),
                                                            shard ? kr.as<int32_t>() : nullptr,
                                                            shared ? ys.as<uint16_t>() : nullptr, T, K, H,
                                                            out.as<uint16_t>(), nullptr, reset.get(), reset_bytes);
          ASSERT_TRUE(st.is_ok()) << st.to_string();
          CUDA_OK(cudaDeviceSynchronize());
          const std::vector<uint8_t> rb = reset.download<uint8_t>(16 * 1031 + 16);
          for (size_t i = 0; i < rb.size(); ++i) {
            const bool zeroed = i < reset_bytes;
            ASSERT_EQ(rb[i] == 0, zeroed) << "reset byte " << i << " of " << reset_bytes;
          }
          std::vector<uint16_t> want(static_cast<size_t>(T * H));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < H; ++c) {
              float acc = 0.0f;
              for (int64_t k = 0; k < K; ++k) {
                const int64_t r = pos[static_cast<size_t>(t * K + k)];
                if (r >= kept) continue;
                const float prod = hw[static_cast<size_t>(t * K + k)] * bf16_bits_to_f32(hy[static_cast<size_t>(r * H + c)]);
                acc = acc + prod;
              }
              if (shared) acc = acc + bf16_bits_to_f32(hs[static_cast<size_t>(t * H + c)]);
              want[static_cast<size_t>(t * H + c)] = f32_to_bf16_bits(acc);
            }
          EXPECT_EQ(out.download<uint16_t>(want.size()), want);
          ++checked;
        }
  EXPECT_EQ(checked, 16);
  // A region to zero that is not a 16-byte aligned multiple of 16 is refused, naming it.
  Dev y(16 * 64), w(64), pp(64), out(16 * 64), reset(64);
  for (const auto& [off, bytes] : {std::pair<size_t, size_t>{0, 24}, {4, 16}}) {
    const Status st = engine::launch_finalize_partial(y.as<uint16_t>(), pp.as<int32_t>(), w.as<float>(), nullptr,
                                                      nullptr, 1, 8, 64, out.as<uint16_t>(), nullptr,
                                                      static_cast<uint8_t*>(reset.get()) + off, bytes);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << off << " " << bytes;
    EXPECT_NE(st.message().find("to zero"), std::string::npos) << st.message();
  }
}

// Router logits (launch_router_logits) against the CPU reference on fresh random x and router weights:
// decode batches (the rows kernel: one token, odd counts, a partial token group, an odd expert count,
// GLM-5's H and E) and the tiled kernel's cases (more than 1024 tokens with partial token, expert and k
// tiles; H not a multiple of 4, x not 8-byte aligned: its element-wise loads). Outputs are poisoned (NaN)
// first; each logit must be within 2e-5 of the sum of |x_k w_k| (fp32 sums in another order). On the rows kernel a token's logits are bitwise those of the same token routed
// alone: the sums do not depend on the batch.
TEST(RouterLogits, EqualsReference) {
  struct Case {
    int64_t T, H, E;
    int64_t x_offset;  // elements: x starts this far into its buffer
    bool rows;         // the decode kernel is expected (then also checked token by token)
  };
  const Case cases[] = {{1, 6144, 256, 0, true}, {2, 512, 160, 0, true},  {3, 256, 64, 0, true},
                        {5, 1024, 257, 0, true}, {8, 520, 128, 0, true},  {9, 384, 96, 0, true},
                        {70, 256, 33, 0, true},  {513, 128, 64, 0, true}, {1100, 200, 70, 0, false},
                        {4, 130, 16, 0, false},  {4, 128, 16, 1, false}};
  int checked = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " H=" << c.H << " E=" << c.E << " x offset " << c.x_offset);
    const uint64_t seed = 8100 + c.T * 131 + c.H + c.E;
    MoeLayerWeights w;
    w.config.hidden = c.H;
    w.config.num_experts = c.E;
    w.router_weight = random_f32(static_cast<size_t>(c.E * c.H), seed, 0.05f);
    const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(c.T * c.H + c.x_offset), seed + 1);
    const std::vector<float> ref = router_logits_reference(x.data() + c.x_offset, c.T, w);
    Dev d_x = Dev::from(x), d_w = Dev::from(w.router_weight);
    Dev d_l(static_cast<size_t>(c.T * c.E) * sizeof(float));
    CUDA_OK(cudaMemset(d_l.get(), 0xFF, d_l.bytes()));  // NaN
    const Status st = engine::launch_router_logits(d_x.as<uint16_t>() + c.x_offset, d_w.as<float>(), c.T, c.H, c.E,
                                                   d_l.as<float>(), nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = d_l.download<float>(static_cast<size_t>(c.T * c.E));
    int bad = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t e = 0; e < c.E; ++e) {
        double mag = 0.0;
        for (int64_t k = 0; k < c.H; ++k)
          mag += std::fabs(double(bf16_bits_to_f32(x[c.x_offset + t * c.H + k])) * w.router_weight[e * c.H + k]);
        const float g = got[t * c.E + e], r = ref[t * c.E + e];
        if (!(std::fabs(double(g) - r) <= 2e-5 * mag)) {
          if (++bad <= 5) ADD_FAILURE() << "token " << t << " expert " << e << ": " << g << " against " << r;
        }
      }
    EXPECT_EQ(bad, 0);
    if (c.rows) {
      for (int64_t t : {int64_t(0), c.T - 1}) {
        Dev one(static_cast<size_t>(c.E) * sizeof(float));
        CUDA_OK(cudaMemset(one.get(), 0xFF, one.bytes()));
        ASSERT_TRUE(engine::launch_router_logits(d_x.as<uint16_t>() + c.x_offset + t * c.H, d_w.as<float>(), 1, c.H, c.E,
                                                 one.as<float>(), nullptr)
                        .is_ok());
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> alone = one.download<float>(static_cast<size_t>(c.E));
        EXPECT_EQ(std::memcmp(alone.data(), got.data() + t * c.E, alone.size() * sizeof(float)), 0)
            << "token " << t << " routed alone";
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 11);
  const Status bad = engine::launch_router_logits(nullptr, nullptr, 2, 0, 16, nullptr, nullptr);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.to_string();
  EXPECT_NE(bad.message().find("H = 0"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace fp4moe::test
