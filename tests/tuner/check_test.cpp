// Tactic preflight rules and messages, and the device profiles they run against.
#include <gtest/gtest.h>

#include "fp4moe/status.h"
#include "fp4moe/tactic.h"
#include "fp4moe/tuner.h"

namespace fp4moe {
namespace {

TacticDesc plain_desc() {
  TacticDesc d;
  d.name = "test.tactic";
  d.family = "test";
  d.req.min_cc = 80;
  d.req.smem_bytes = 48 * 1024;
  d.req.threads = 256;
  d.req.regs_per_thread = 128;
  return d;
}

GemmProblem problem(GemmOp op = GemmOp::kFc2, int64_t n = 6144, int64_t k = 2048, int64_t rows_per_expert = 64) {
  GemmProblem p;
  p.op = op;
  p.num_experts = 256;
  p.n = n;
  p.k = k;
  p.total_rows = rows_per_expert * 8;
  p.max_rows_per_expert = rows_per_expert;
  return p;
}

TEST(DeviceProfiles, FiguresFromTheSpecifications) {
  const DeviceCaps h100 = device_profile("h100");
  EXPECT_EQ(h100.cc(), 90);
  EXPECT_TRUE(h100.arch_specific);
  EXPECT_EQ(h100.sm_count, 132);
  EXPECT_EQ(h100.smem_per_block_optin, 232448);
  EXPECT_TRUE(h100.cluster_launch);
  const DeviceCaps h200 = device_profile("h200");
  EXPECT_EQ(h200.cc(), 90);
  EXPECT_EQ(h200.smem_per_block_optin, 232448);
  EXPECT_EQ(h200.global_mem_bytes, int64_t(143771) * 1024 * 1024);
  EXPECT_EQ(h200.mem_bandwidth_gbs, 4800);
  const DeviceCaps b200 = device_profile("b200");
  EXPECT_EQ(b200.cc(), 100);
  EXPECT_EQ(b200.sm_count, 148);
  const DeviceCaps rtx = device_profile("rtx-pro-6000");
  EXPECT_EQ(rtx.cc(), 120);
  EXPECT_EQ(rtx.smem_per_block_optin, 101376);  // 99 KB
  EXPECT_EQ(rtx.sm_count, 188);
  EXPECT_FALSE(rtx.arch_specific);
  EXPECT_EQ(device_profile("sm120").name, rtx.name);  // alias
  const DeviceCaps l40s = device_profile("l40s");
  EXPECT_EQ(l40s.cc(), 89);
  EXPECT_EQ(l40s.smem_per_block_optin, 101376);
  EXPECT_FALSE(l40s.cluster_launch);
  const DeviceCaps a100 = device_profile("a100");
  EXPECT_EQ(a100.cc(), 80);
  EXPECT_EQ(a100.smem_per_block_optin, 166912);
  EXPECT_EQ(a100.sm_count, 108);
  for (const auto& name : device_profile_names()) {
    const DeviceCaps c = device_profile(name);
    EXPECT_GT(c.regs_per_block, 0) << name;
    EXPECT_EQ(c.max_threads_per_block, 1024) << name;
    EXPECT_LE(c.smem_per_block_optin, c.smem_per_sm) << name;
    EXPECT_FALSE(c.to_string().empty());
  }
}

TEST(DeviceProfiles, UnknownNameListsTheKnownOnes) {
  try {
    device_profile("h300");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("h300"), std::string::npos) << m;
    EXPECT_NE(m.find("rtx-pro-6000"), std::string::npos) << m;
    EXPECT_NE(m.find("a100"), std::string::npos) << m;
  }
}

TEST(DeviceProfiles, NoDeviceNeverThrows) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    try {
      query_device_caps(0);
      FAIL() << "no error without a device";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kUnsupported);
    }
  }
}

TEST(CheckTactic, PassesWhenEverythingFits) {
  EXPECT_TRUE(check_tactic(plain_desc(), problem(), device_profile("a100")).ok);
  EXPECT_TRUE(check_tactic(plain_desc(), problem(), device_profile("rtx-pro-6000")).ok);
  EXPECT_TRUE(check_tactic_all(plain_desc(), problem(), device_profile("h200")).empty());
}

TEST(CheckTactic, EachRuleSaysWhatItNeedsAndWhatItFound) {
  const DeviceCaps rtx = device_profile("rtx-pro-6000");
  const DeviceCaps l40s = device_profile("l40s");
  const DeviceCaps h200 = device_profile("h200");
  struct Case {
    const char* what;
    TacticDesc desc;
    GemmProblem p;
    DeviceCaps caps;
    std::string expect;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto mutate, GemmProblem p, DeviceCaps caps, std::string expect) {
    TacticDesc d = plain_desc();
    mutate(d);
    cases.push_back({what, d, p, caps, expect});
  };
  add("op", [](TacticDesc& d) { d.req.ops = {GemmOp::kFc2}; }, problem(GemmOp::kFc1SwiGlu), h200,
      "does not implement fc1 (implements: fc2)");
  add("min cc", [](TacticDesc& d) { d.req.min_cc = 90; }, problem(), l40s, "needs sm_90 or newer, device is sm_89");
  add("max cc", [](TacticDesc& d) { d.req.max_cc = 90; }, problem(), rtx, "supports at most sm_90, device is sm_120");
  add("exact cc", [](TacticDesc& d) { d.req.exact_cc = 90; }, problem(), device_profile("b200"),
      "is built only for sm_90a, device is sm_100");
  add("arch specific", [](TacticDesc& d) { d.req.needs_arch_specific = true; }, problem(), rtx,
      "needs arch-specific instructions (wgmma, setmaxnreg), device sm_120 has none");
  add("smem", [](TacticDesc& d) { d.req.smem_bytes = 132 * 1024; }, problem(), rtx,
      "needs 132.0 KB shared memory per block, device allows 99.0 KB");
  add("threads", [](TacticDesc& d) { d.req.threads = 2048; d.req.regs_per_thread = 16; }, problem(), h200,
      "needs 2048 threads per block, device allows 1024");
  add("regs", [](TacticDesc& d) { d.req.threads = 512; d.req.regs_per_thread = 255; }, problem(), h200,
      "needs 255 registers per thread x 512 threads = 130560 registers per block, device allows 65536");
  add("cluster", [](TacticDesc& d) { d.req.cluster = 2; }, problem(), l40s,
      "needs thread-block clusters of 2 CTAs, device has no cluster launch");
  add("k align", [](TacticDesc& d) { d.req.k_align = 128; }, problem(GemmOp::kFc2, 6144, 2064), h200,
      "needs K to be a multiple of 128, K is 2064");
  add("n align", [](TacticDesc& d) { d.req.n_align = 64; }, problem(GemmOp::kFc2, 6160), h200,
      "needs N to be a multiple of 64, N is 6160");
  add("rows", [](TacticDesc& d) { d.req.max_rows_per_expert = 256; }, problem(GemmOp::kFc2, 6144, 2048, 8192), h200,
      "handles at most 256 rows per expert, problem may have 8192");
  for (const auto& c : cases) {
    const TacticCheck r = check_tactic(c.desc, c.p, c.caps);
    EXPECT_FALSE(r.ok) << c.what;
    EXPECT_EQ(r.reason, c.expect) << c.what;
  }
}

TEST(CheckTactic, FirstFailureIsTheReasonAndAllListsEvery) {
  TacticDesc d = plain_desc();
  d.req.min_cc = 90;
  d.req.max_cc = 90;
  d.req.exact_cc = 90;
  d.req.needs_arch_specific = true;
  d.req.smem_bytes = 200 * 1024;
  const DeviceCaps rtx = device_profile("rtx-pro-6000");
  EXPECT_EQ(check_tactic(d, problem(), rtx).reason, "supports at most sm_90, device is sm_120");
  const auto all = check_tactic_all(d, problem(), rtx);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[1], "is built only for sm_90a, device is sm_120");
  EXPECT_EQ(all[3], "needs 200.0 KB shared memory per block, device allows 99.0 KB");
  EXPECT_TRUE(check_tactic(d, problem(), device_profile("h100")).ok);
}

// The registry's real tactics on the profiles: sm_120 with 99 KB takes the portable family only, and the
// Hopper family is accepted on H200 (its resident tactic, one row per expert, at T = 1's 8 rows: one each).
TEST(CheckTactic, RegistryOnProfiles) {
  const auto& descs = all_tactic_descs();
  ASSERT_FALSE(descs.empty());
  ASSERT_TRUE(descs.front().is_fallback) << "the fallback comes first";
  const GemmProblem p = problem(GemmOp::kFc1SwiGlu, 2048, 6144, 64);
  bool any_sm90 = false, any_big_smem = false;
  for (const auto& d : descs) {
    if (d.family == "portable") {
      EXPECT_TRUE(check_tactic(d, p, device_profile("rtx-pro-6000")).ok) << d.name;
      EXPECT_TRUE(check_tactic(d, p, device_profile("a100")).ok) << d.name;
      EXPECT_TRUE(check_tactic(d, p, device_profile("h200")).ok) << d.name;
    }
    if (d.family == "sm90") {
      any_sm90 = true;
      GemmProblem q = p;
      if (d.req.max_rows_per_expert > 0) q.max_rows_per_expert = d.req.max_rows_per_expert;
      EXPECT_TRUE(check_tactic(d, q, device_profile("h200")).ok) << d.name << ": "
                                                                  << check_tactic(d, q, device_profile("h200")).reason;
      EXPECT_FALSE(check_tactic(d, p, device_profile("h200")).ok && d.req.max_rows_per_expert > 0) << d.name;
      EXPECT_FALSE(check_tactic(d, p, device_profile("rtx-pro-6000")).ok) << d.name;
      EXPECT_FALSE(check_tactic(d, p, device_profile("b200")).ok) << d.name;
      if (d.req.smem_bytes > 101376) {
        any_big_smem = true;
        const auto all = check_tactic_all(d, p, device_profile("rtx-pro-6000"));
        bool smem_named = false;
        for (const auto& why : all) smem_named = smem_named || why.find("device allows 99.0 KB") != std::string::npos;
        EXPECT_TRUE(smem_named) << d.name;
      }
    }
  }
  if (!any_sm90) GTEST_SKIP() << "this build has no sm90 family descriptors";
  EXPECT_TRUE(any_big_smem) << "no sm90 tactic needs more than 99 KB, so the sm_120 limit is not exercised";
}

}  // namespace
}  // namespace fp4moe
