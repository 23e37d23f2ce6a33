// Layer-level GPU test helpers (see engine_test_util.h).
#include "engine_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "fp4moe/device_caps.h"
#include "fp4moe/dtype.h"
#include "fp4moe/reference.h"

namespace fp4moe::test {

MoeConfig small_config(const char* name, int64_t hidden, int64_t inter, int64_t experts, int64_t topk) {
  MoeConfig c;
  c.name = name;
  c.hidden = hidden;
  c.inter = inter;
  c.num_experts = experts;
  c.topk = topk;
  return c;
}


LayerRun compare_forward(MoeEngine& engine, const MoeLayerWeights& ref, int64_t T, const std::vector<uint16_t>& x,
                         const std::vector<float>* logits, const std::vector<int64_t>& subset) {
  LayerRun r;
  const MoeConfig& c = engine.config();
  const int64_t H = c.hidden, E = c.num_experts, K = c.topk;
  Dev d_x = Dev::from(x);
  Dev d_logits = logits ? Dev::from(*logits) : Dev();
  Dev d_out(static_cast<size_t>(std::max<int64_t>(T, 1) * H) * 2);
  d_out.poison();
  ForwardOutputs fo;
  const Status st = engine.forward(T ? d_x.as<uint16_t>() : nullptr, T, logits ? d_logits.as<float>() : nullptr,
                                   T ? d_out.as<uint16_t>() : nullptr, nullptr, &fo);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return r;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (T == 0) {
    r.rel_l2 = 0;
    r.id_mismatches = 0;
    r.weight_rel_err = 0;
    return r;
  }
  const std::vector<uint16_t> out = d_out.download<uint16_t>(static_cast<size_t>(T * H));
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  EXPECT_EQ(cudaMemcpy(ids.data(), fo.topk_ids, ids.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(w.data(), fo.topk_weights, w.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count_poison(out), 0u) << "output elements left unwritten";

  std::vector<int64_t> rows = subset;
  if (rows.empty())
    for (int64_t t = 0; t < T; ++t) rows.push_back(t);
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<uint16_t> xs(static_cast<size_t>(n * H));
  std::vector<float> ls;
  for (int64_t i = 0; i < n; ++i) std::copy_n(x.begin() + rows[i] * H, H, xs.begin() + i * H);
  if (logits) {
    ls.resize(static_cast<size_t>(n * E));
    for (int64_t i = 0; i < n; ++i) std::copy_n(logits->begin() + rows[i] * E, E, ls.begin() + i * E);
  }
  const MoeForwardResult ref_out = moe_forward_reference(ref, xs.data(), n, logits ? ls.data() : nullptr);
  std::vector<uint16_t> got(static_cast<size_t>(n * H));
  for (int64_t i = 0; i < n; ++i) std::copy_n(out.begin() + rows[i] * H, H, got.begin() + i * H);
  r.rel_l2 = rel_l2_bf16(got, ref_out.out);
  r.id_mismatches = 0;
  r.weight_rel_err = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const size_t g = static_cast<size_t>(rows[i] * K + k), q = static_cast<size_t>(i * K + k);
      r.id_mismatches += ids[g] != ref_out.routing.ids[q];
      const double rw = ref_out.routing.weights[q];
      r.weight_rel_err = std::max(r.weight_rel_err, std::fabs(w[g] - rw) / std::max(1e-30, std::fabs(rw)));
    }
  r.compared = n;
  return r;
}

LayerRun run_and_compare(MoeEngine& engine, const MoeLayerWeights& ref, int64_t T, uint64_t seed, bool from_router) {
  const MoeConfig& c = engine.config();
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(T * c.hidden), seed);
  const std::vector<float> logits = random_f32(static_cast<size_t>(T * c.num_experts), seed + 1);
  return compare_forward(engine, ref, T, x, from_router ? nullptr : &logits);
}

std::vector<uint16_t> forward_once(MoeEngine& engine, const MoeConfig& c, int64_t T, uint64_t seed, bool from_router) {
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(T * c.hidden), seed);
  const std::vector<float> logits = random_f32(static_cast<size_t>(T * c.num_experts), seed + 1);
  Dev d_x = Dev::from(x), d_l = Dev::from(logits), d_out(static_cast<size_t>(T * c.hidden) * 2);
  d_out.poison();
  const Status st = engine.forward(d_x.as<uint16_t>(), T, from_router ? nullptr : d_l.as<float>(), d_out.as<uint16_t>(), nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_out.download<uint16_t>(static_cast<size_t>(T * c.hidden));
}

int64_t graph_replay_mismatches(MoeEngine& engine, const MoeConfig& c, int64_t T, uint64_t seed) {
  const size_t n = static_cast<size_t>(T * c.hidden);
  const std::vector<uint16_t> x = random_bf16(n, seed);
  const std::vector<float> logits = random_f32(static_cast<size_t>(T * c.num_experts), seed + 1);
  Dev d_x = Dev::from(x), d_l = Dev::from(logits), d_out(n * 2);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  d_out.poison();
  Status st = engine.forward(d_x.as<uint16_t>(), T, d_l.as<float>(), d_out.as<uint16_t>(), s);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const std::vector<uint16_t> eager = d_out.download<uint16_t>(n);
  EXPECT_EQ(count_poison(eager), 0u);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  st = engine.forward(d_x.as<uint16_t>(), T, d_l.as<float>(), d_out.as<uint16_t>(), s);
  EXPECT_TRUE(st.is_ok()) << "forward during capture: " << st.to_string();
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  int64_t mismatches = 0;
  for (int replay = 0; replay < 2; ++replay) {
    d_out.poison();
    EXPECT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<uint16_t> got = d_out.download<uint16_t>(n);
    for (size_t i = 0; i < n; ++i) mismatches += got[i] != eager[i];
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return mismatches;
}

std::vector<std::string> tactics_for_layer(const MoeConfig& c, int64_t max_tokens, bool shared_nvfp4) {
  const DeviceCaps caps = query_device_caps(0);
  std::vector<std::string> names;
  for (const TacticDesc& d : all_tactic_descs()) {
    GroupedGemmTactic* t = find_tactic(d.name);
    if (!t) continue;
    bool ok = true;
    std::string why;
    for (int64_t b = 1; ok; b *= 2) {
      std::vector<GemmProblem> ps;
      auto add = [&](GemmOp op, int64_t E, int64_t n, int64_t k, int64_t rows) {
        GemmProblem p;
        p.op = op;
        p.num_experts = E;
        p.n = n;
        p.k = k;
        p.total_rows = rows;
        p.max_rows_per_expert = b;
        ps.push_back(p);
      };
      add(GemmOp::kFc1SwiGlu, c.num_experts, c.inter, c.hidden, b * c.topk);
      add(GemmOp::kFc2, c.num_experts, c.hidden, c.inter, b * c.topk);
      if (shared_nvfp4) {
        add(GemmOp::kFc1SwiGlu, 1, c.shared_inter, c.hidden, b);
        add(GemmOp::kFc2, 1, c.hidden, c.shared_inter, b);
      }
      for (const GemmProblem& p : ps) {
        const TacticCheck ck = t->check(p, caps);
        if (!ck.ok) {
          ok = false;
          why = p.to_string() + ": " + ck.reason;
          break;
        }
      }
      if (b >= max_tokens) break;
    }
    if (ok)
      names.push_back(d.name);
    else
      std::printf("  tactic %s skipped for %s: %s\n", d.name.c_str(), c.name.c_str(), why.c_str());
  }
  return names;
}

}  // namespace fp4moe::test
