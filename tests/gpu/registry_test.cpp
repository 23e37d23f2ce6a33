// The tactic registry without a GPU: every descriptor has a unique stable name, a family, sane
// requirements, exactly one fallback comes first, the portable table and its runnable tactics agree, and
// the set hash is stable.
#include <gtest/gtest.h>

#include <set>

#include "fp4moe/device_caps.h"
#include "fp4moe/tactic.h"

namespace fp4moe {
namespace {

TEST(Registry, DescriptorsAreConsistent) {
  const auto& descs = all_tactic_descs();
  ASSERT_FALSE(descs.empty());
  EXPECT_TRUE(descs.front().is_fallback) << "the fallback comes first";
  std::set<std::string> names;
  int fallbacks = 0;
  for (const TacticDesc& d : descs) {
    EXPECT_TRUE(names.insert(d.name).second) << "duplicate tactic name " << d.name;
    EXPECT_FALSE(d.family.empty()) << d.name;
    EXPECT_EQ(d.name.rfind(d.family + ".", 0), 0u) << d.name << " should start with its family";
    EXPECT_GT(d.tile_m, 0) << d.name;
    EXPECT_GT(d.tile_n, 0) << d.name;
    EXPECT_GT(d.req.threads, 0) << d.name;
    EXPECT_GT(d.req.smem_bytes, 0) << d.name;
    EXPECT_FALSE(d.req.ops.empty()) << d.name;
    fallbacks += d.is_fallback;
    if (d.family == "portable") {
      EXPECT_EQ(d.req.min_cc, 80) << d.name;
      EXPECT_EQ(d.req.k_align, 16) << d.name << ": the fallback family must take any K = 16 j";
      EXPECT_EQ(d.req.n_align, 1) << d.name << ": the fallback family must take any N";
      EXPECT_LE(d.req.smem_bytes, 99 * 1024) << d.name << ": must fit sm_86/89/120";
    }
#ifdef FP4MOE_HAVE_CUDA
    GroupedGemmTactic* t = find_tactic(d.name);
    ASSERT_NE(t, nullptr) << d.name << " has a descriptor but no runnable tactic";
    EXPECT_EQ(t->desc().name, d.name);
    EXPECT_EQ(t->desc().req.smem_bytes, d.req.smem_bytes);
#else
    EXPECT_EQ(find_tactic(d.name), nullptr);
#endif
  }
  EXPECT_EQ(fallbacks, 1);
  EXPECT_EQ(find_tactic("no.such.tactic"), nullptr);
  EXPECT_EQ(tactic_set_hash(), tactic_set_hash());
  EXPECT_EQ(tactic_set_hash().size(), 16u);
}

TEST(Registry, PortableFallbackRunsEverywhere) {
  // Every device profile from sm_80 on accepts the fallback for a tail shape.
  GemmProblem p;
  p.op = GemmOp::kFc1SwiGlu;
  p.num_experts = 3;
  p.n = 40;
  p.k = 48;
  p.total_rows = 7;
  p.max_rows_per_expert = 7;
  for (const std::string& prof : device_profile_names()) {
    const DeviceCaps caps = device_profile(prof);
    const TacticCheck c = check_tactic(all_tactic_descs().front(), p, caps);
    EXPECT_TRUE(c.ok) << prof << ": " << c.reason;
  }
}

TEST(Registry, NamesOfEnums) {
  EXPECT_STREQ(gemm_op_name(GemmOp::kFc1SwiGlu), "fc1");
  EXPECT_STREQ(gemm_op_name(GemmOp::kFc2), "fc2");
  EXPECT_STREQ(weight_layout_name(WeightLayout::kCanonical), "canonical");
  GemmProblem p;
  p.op = GemmOp::kFc2;
  p.num_experts = 256;
  p.n = 6144;
  p.k = 2048;
  p.total_rows = 64;
  EXPECT_EQ(p.to_string(), "fc2 E=256 n=6144 k=2048 rows=64");
}

}  // namespace
}  // namespace fp4moe
