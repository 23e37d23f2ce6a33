// The tuner with the fake backend, in this process (no worker child): preflight against profiles, a
// tactic whose init fails, one whose results are wrong, one that fails to run, nothing usable at all.
#include <gtest/gtest.h>

#include "tuner_util.h"

namespace fp4moe::testing {
namespace {

TEST(TunerInProcess, PicksTheFastestOnEachProfile) {
  const std::string dir = make_temp_dir();
  open_test_log(dir);
  TuningResult h200;
  ASSERT_TRUE(tune_layer(fake_layer(), fake_options("profile=h200", false), &h200).is_ok());
  EXPECT_EQ(h200.buckets, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256}));
  expect_choices_avoid(h200, "", "fake.sm90.big");
  for (const auto& t : h200.tactics) {
    EXPECT_EQ(t.verdict, "ok") << t.tactic;
    EXPECT_EQ(t.ms.size(), h200.buckets.size()) << t.tactic;
  }
  // The times are the backend's (fake.sm90.big: 0.2 + 0.002 T).
  const TacticReport* big = report_of(h200, "fake.sm90.big", GemmOp::kFc2);
  ASSERT_NE(big, nullptr);
  EXPECT_DOUBLE_EQ(big->ms.back().second, 0.2 + 0.002 * 256);

  TuningResult rtx;
  ASSERT_TRUE(tune_layer(fake_layer(), fake_options("profile=rtx-pro-6000", false), &rtx).is_ok());
  expect_choices_avoid(rtx, "fake.sm90.big", "fake.portable.fast");
  const TacticReport* rej = report_of(rtx, "fake.sm90.big", GemmOp::kFc1SwiGlu);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->verdict, "rejected");
  EXPECT_NE(rej->reason.find("is built only for sm_90a, device is sm_120"), std::string::npos) << rej->reason;
  EXPECT_NE(rej->reason.find("needs 132.0 KB shared memory per block, device allows 99.0 KB"), std::string::npos)
      << rej->reason;
  const std::string log_text = read_file(log::file_path());
  EXPECT_NE(log_text.find("fake.sm90.big (fc1) rejected"), std::string::npos) << log_text;
}

TEST(TunerInProcess, InitFailureWrongResultAndRunErrorAreExcluded) {
  const std::string dir = make_temp_dir();
  const std::string log_path = open_test_log(dir);
  log::set_rank(0);
  TuningResult r;
  const Status st = tune_layer(fake_layer(), fake_options("profile=h200;faults=initfail,wrong,runerror", false), &r);
  log::set_rank(-1);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  expect_choices_avoid(r, "fake.fault.wrong", "fake.sm90.big");
  for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    const TacticReport* init = report_of(r, "fake.fault.initfail", op);
    ASSERT_NE(init, nullptr);
    EXPECT_EQ(init->verdict, "init-failed");
    EXPECT_NE(init->reason.find("cudaFuncSetAttribute"), std::string::npos) << init->reason;
    const TacticReport* wrong = report_of(r, "fake.fault.wrong", op);
    EXPECT_EQ(wrong->verdict, "wrong-result");
    EXPECT_NE(wrong->reason.find("relative L2 error"), std::string::npos) << wrong->reason;
    const TacticReport* run = report_of(r, "fake.fault.runerror", op);
    EXPECT_EQ(run->verdict, "failed");
    EXPECT_NE(run->reason.find("cudaErrorLaunchOutOfResources"), std::string::npos) << run->reason;
  }
  // The log names the rank, the tactic and the cause.
  const std::string text = read_file(log_path);
  EXPECT_NE(text.find("rank=0 W tuner: tactic fake.fault.initfail (fc1) init-failed: init: cudaFuncSetAttribute"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tactic fake.fault.wrong (fc2) wrong-result: wrong result: relative L2 error"), std::string::npos)
      << text;

  EngineOptions eo;
  apply_tuning(r, &eo);
  ASSERT_EQ(eo.fc1_by_bucket.size(), r.buckets.size());
  EXPECT_EQ(eo.fc1_by_bucket.front(), (std::pair<int64_t, std::string>{1, "fake.sm90.big"}));
  EXPECT_EQ(eo.fc2_by_bucket.back(), (std::pair<int64_t, std::string>{256, "fake.sm90.big"}));
  for (const char* bad : {"fake.fault.initfail", "fake.fault.wrong", "fake.fault.runerror"})
    EXPECT_NE(std::find(eo.excluded_tactics.begin(), eo.excluded_tactics.end(), bad), eo.excluded_tactics.end()) << bad;

  const std::string table = format_tuning_table(r);
  EXPECT_NE(table.find("fake.fault.wrong"), std::string::npos);
  EXPECT_NE(table.find("wrong-result"), std::string::npos);
  EXPECT_NE(table.find("0.7120*"), std::string::npos) << table;  // sm90.big at 256 tokens, chosen
  const auto j = nlohmann::json::parse(tuning_result_json(r));
  EXPECT_EQ(j["device"]["profile"], "h200");
  EXPECT_EQ(j["choices"].size(), 2 * r.buckets.size());
}

TEST(TunerInProcess, NothingCanRunListsEveryTacticWithItsReason) {
  TuningResult r;
  const Status st = tune_layer(fake_layer(), fake_options("profile=l40s;nofallback", false), &r);
  ASSERT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("no tactic can run fc1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fake.sm90.big: rejected - needs sm_90 or newer, device is sm_89"), std::string::npos)
      << st.message();
}

TEST(TunerInProcess, ExcludedAndPerBucketLimits) {
  TuneOptions o = fake_options("profile=h200", false);
  o.excluded = {"fake.sm90.big"};
  o.buckets = {1, 8, 100};
  TuningResult r;
  ASSERT_TRUE(tune_layer(fake_layer(), o, &r).is_ok());
  expect_choices_avoid(r, "fake.sm90.big", "fake.portable.fast");
  EXPECT_EQ(report_of(r, "fake.sm90.big", GemmOp::kFc2)->verdict, "excluded");

  // A tactic limited to 16 rows per expert is skipped above 16 tokens and still used below.
  std::vector<TacticDesc> descs(1);
  descs[0].name = "small.only";
  descs[0].req.max_rows_per_expert = 16;
  const TuningResult pre = preflight_layer(fake_layer(), descs, device_profile("a100"), tuning_buckets(64));
  const TacticReport* t = report_of(pre, "small.only", GemmOp::kFc1SwiGlu);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->verdict, "ok");
  ASSERT_EQ(t->skipped.size(), 2u);  // 32 and 64
  EXPECT_EQ(t->skipped[0].first, 32);
  EXPECT_EQ(t->skipped[0].second, "handles at most 16 rows per expert, problem may have 32");
  EXPECT_EQ(tuning_buckets(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128}));
  EXPECT_EQ(tuning_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(tuning_buckets(8192).size(), 14u);
}

}  // namespace
}  // namespace fp4moe::testing
