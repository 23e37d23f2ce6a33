// Every registered sm90 tactic against a CPU reference, per GEMM, on random problems with tails:
// experts with 0 rows, 1 row and more rows than a tile, K = 16 * odd, N not a multiple of the tile,
// FC1 gathering token rows (a_row_index) and FC2 reading rows contiguously with a padded row stride.
// Outputs are poisoned with 0xD5 first; rows past offsets[E] must stay poisoned. The reference uses
// the same dequantised weights (e2m1 * e4m3, tensor scale in fp32) and the rounding points of
// reference.h (R3, R4), so only kernel error is measured: relative L2 <= 5e-3. Also: the device pack
// equals the CPU description byte for byte, and shapes a tactic cannot do are refused by check().
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "fp4moe/device_caps.h"
#include "fp4moe/nvfp4.h"
#include "fp4moe/reference.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "sm90_test_util.h"

namespace fp4moe {
namespace {

using sm90test::DeviceBuffer;

struct Case {
  GemmOp op;
  int64_t n, k;
  std::vector<int> rows;   // rows per expert
  int64_t spare_rows;      // capacity past offsets[E] (must stay poisoned)
  bool gather;             // FC1-style a_row_index
  int64_t a_pad;           // a_ld = k + a_pad
  uint32_t seed;
};

std::string case_name(const Case& c) {
  std::string r;
  for (int x : c.rows) r += std::to_string(x) + ",";
  return fmt::format("{} n={} k={} rows=[{}] gather={} a_ld=k+{}", gemm_op_name(c.op), c.n, c.k, r, c.gather, c.a_pad);
}

void run_case(GroupedGemmTactic& tactic, const Case& c) {
  SCOPED_TRACE(tactic.desc().name + " " + case_name(c));
  const int64_t E = static_cast<int64_t>(c.rows.size());
  GemmProblem p;
  p.op = c.op;
  p.num_experts = E;
  p.n = c.n;
  p.k = c.k;
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.rows[e];
  const int64_t used = offsets[E];
  p.total_rows = used + c.spare_rows;
  p.max_rows_per_expert = p.total_rows;
  const DeviceCaps caps = query_device_caps(0);
  const TacticCheck chk = tactic.check(p, caps);
  ASSERT_TRUE(chk.ok) << chk.reason;

  std::mt19937 rng(c.seed);
  // Weights (canonical) and tensor scales.
  const sm90test::RandomWeights w = sm90test::random_weights(p, rng);
  // Activations: FC1 gathers from T tokens, FC2 reads problem rows directly.
  const int64_t a_ld = c.k + c.a_pad;
  const int64_t tokens = c.gather ? std::max<int64_t>(1, used / 2 + 3) : p.total_rows;
  std::vector<uint16_t> a(static_cast<size_t>(tokens * a_ld));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (auto& v : a) v = f32_to_bf16_bits(ux(rng));
  std::vector<int32_t> row_index;
  if (c.gather) {
    row_index.resize(static_cast<size_t>(p.total_rows));
    for (auto& r : row_index) r = static_cast<int32_t>(rng() % tokens);
  }

  // Device buffers; pack through the family's layout ops and compare with the CPU description.
  const WeightLayoutOps* ops = sm90_weight_layout_ops();
  ASSERT_NE(ops, nullptr);
  DeviceBuffer d_canon(w.canonical.size()), d_packed(ops->bytes(p)), d_off(offsets.size() * 4),
      d_a(a.size() * 2), d_idx(std::max<size_t>(4, row_index.size() * 4)), d_ts(w.tensor_scales.size() * 4),
      d_out(static_cast<size_t>(p.total_rows * c.n * 2)), d_ws(std::max<size_t>(16, tactic.workspace_bytes(p)));
  d_canon.upload(w.canonical.data(), w.canonical.size());
  SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, d_ws.size()));  // the tactic's work counters start at zero
  d_off.upload(offsets.data(), offsets.size() * 4);
  d_a.upload(a.data(), a.size() * 2);
  if (c.gather) d_idx.upload(row_index.data(), row_index.size() * 4);
  d_ts.upload(w.tensor_scales.data(), w.tensor_scales.size() * 4);
  ASSERT_TRUE(ops->pack(p, d_canon.get(), d_packed.get(), nullptr).is_ok());
  SM90_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> packed_cpu = sm90::pack_cpu(p, w.canonical.data());
  std::vector<uint8_t> packed_gpu(packed_cpu.size());
  d_packed.download(packed_gpu.data(), packed_gpu.size());
  ASSERT_TRUE(packed_cpu == packed_gpu) << "device pack differs from the CPU description";

  SM90_CUDA_OK(cudaMemset(d_out.get(), 0xD5, d_out.size()));
  GroupedGemmArgs args;
  args.problem = p;
  args.expert_offsets = static_cast<const int32_t*>(d_off.get());
  args.a = static_cast<const uint16_t*>(d_a.get());
  args.a_row_index = c.gather ? static_cast<const int32_t*>(d_idx.get()) : nullptr;
  args.a_ld = a_ld;
  args.weights = d_packed.get();
  args.tensor_scales = static_cast<const float*>(d_ts.get());
  args.out = static_cast<uint16_t*>(d_out.get());
  args.workspace = d_ws.get();
  const Status init = tactic.init(p);
  ASSERT_TRUE(init.is_ok()) << init.to_string();
  const Status st = tactic.run(args, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  SM90_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> out(static_cast<size_t>(p.total_rows * c.n));
  d_out.download(out.data(), out.size() * 2);

  // Reference.
  std::vector<float> ref(static_cast<size_t>(used * c.n)), got(ref.size());
  std::vector<float> x(static_cast<size_t>(c.k));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const int64_t src = c.gather ? row_index[r] : r;
      for (int64_t k = 0; k < c.k; ++k) x[k] = bf16_bits_to_f32(a[src * a_ld + k]);
      sm90test::reference_row(p, w, e, x.data(), ref.data() + r * c.n);
    }
  for (int64_t i = 0; i < used * c.n; ++i) got[i] = bf16_bits_to_f32(out[i]);
  const double err = relative_l2_error(got.data(), ref.data(), used * c.n);
  EXPECT_LE(err, 5e-3) << "relative L2 error " << err;
  if (!(err <= 5e-3)) {  // name the first few bad elements to make a failure readable
    int shown = 0;
    for (int64_t i = 0; i < used * c.n && shown < 8; ++i)
      if (!(std::fabs(got[i] - ref[i]) <= 1e-2f * (std::fabs(ref[i]) + 1e-2f))) {
        ADD_FAILURE() << "row " << i / c.n << " col " << i % c.n << ": got " << got[i] << " want " << ref[i];
        ++shown;
      }
  }
  for (int64_t i = used * c.n; i < p.total_rows * c.n; ++i)
    ASSERT_EQ(out[i], 0xD5D5) << "row " << i / c.n << " past offsets[E] was written";
}

std::vector<Case> cases() {
  return {
      // Tails: an expert with 0 rows, 1 row, more rows than any tile; K = 16 * 13; N off the tile grid.
      {GemmOp::kFc2, 200, 208, {0, 1, 37, 8, 130, 3, 0, 300}, 5, false, 8, 11},
      {GemmOp::kFc1SwiGlu, 80, 208, {0, 1, 37, 8, 130, 3, 0, 300}, 5, true, 0, 12},
      // Longer K (many pipeline stages, ring wrap-around), FC1 contiguous and FC2 gathered too.
      {GemmOp::kFc1SwiGlu, 256, 1024, {5, 64, 0, 17, 1}, 0, false, 0, 13},
      {GemmOp::kFc2, 1024, 256, {5, 64, 0, 17, 1}, 3, true, 24, 14},
      // Decode-like: many experts, most with 0 or 1 row.
      {GemmOp::kFc2, 512, 512, {1, 0, 0, 2, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3}, 0, false, 0, 15},
      {GemmOp::kFc1SwiGlu, 96, 512, {1, 0, 0, 2, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3}, 0, true, 0, 16},
  };
}

class Sm90Tactics : public ::testing::Test {
 protected:
  static std::vector<std::unique_ptr<GroupedGemmTactic>>& tactics() {
    static std::vector<std::unique_ptr<GroupedGemmTactic>> t = [] {
      std::vector<std::unique_ptr<GroupedGemmTactic>> v;
      append_sm90_tactics(v);
      return v;
    }();
    return t;
  }
};

TEST_F(Sm90Tactics, EveryTacticMatchesReference) {
  ASSERT_FALSE(tactics().empty());
  for (auto& t : tactics())
    for (const Case& c : cases()) run_case(*t, c);
}

TEST_F(Sm90Tactics, DescriptorsMatchRegistrationAndCompiler) {
  std::vector<TacticDesc> descs;
  append_sm90_tactic_descs(descs);
  ASSERT_EQ(descs.size(), tactics().size());
  for (size_t i = 0; i < descs.size(); ++i) {
    EXPECT_EQ(descs[i].name, tactics()[i]->desc().name);
    EXPECT_EQ(descs[i].layout, WeightLayout::kSm90Interleaved);
    const cudaFuncAttributes attr = sm90test::kernel_attributes(*tactics()[i]);
    EXPECT_GE(descs[i].req.regs_per_thread, attr.numRegs) << descs[i].name;
    EXPECT_EQ(attr.localSizeBytes, 0u) << descs[i].name << " uses local memory";
  }
}

TEST_F(Sm90Tactics, RefusesWhatItCannotDo) {
  const DeviceCaps caps = query_device_caps(0);
  for (auto& t : tactics()) {
    GemmProblem p;
    p.op = GemmOp::kFc2;
    p.num_experts = 600;
    p.n = 128;
    p.k = 128;
    p.total_rows = 16;
    TacticCheck c = t->check(p, caps);
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.reason.find("experts"), std::string::npos) << c.reason;
    p.num_experts = 4;
    p.k = 24;
    c = t->check(p, caps);
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.reason.find("multiple of 16"), std::string::npos) << c.reason;
    // A device without sm_90a is refused before anything runs.
    EXPECT_FALSE(t->check(GemmProblem{GemmOp::kFc2, 4, 128, 128, 16, 16}, device_profile("a100")).ok);
  }
}

}  // namespace
}  // namespace fp4moe

int main(int argc, char** argv) {
  const int skip = fp4moe::sm90test::skip_unless_sm90();
  if (skip != 0) return skip;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
