// The tuner with the fake backend in worker children (this binary re-executed): tactics that kill their
// process (SIGSEGV, abort), lose the device context, or hang. The test process survives, the report and
// the log name the tactic and the cause, and the choice falls to a working tactic.
#include <gtest/gtest.h>

#include <chrono>

#include "tuner_util.h"

namespace fp4moe::testing {
namespace {

TuningResult tune_ok(const std::string& spec, double timeout_s = 30) {
  TuneOptions o = fake_options(spec, /*isolate=*/true);
  o.unit_timeout_s = timeout_s;
  TuningResult r;
  const Status st = tune_layer(fake_layer(), o, &r);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return r;
}

void expect_died(const TuningResult& r, const std::string& tactic, const std::string& verdict,
                 const std::vector<std::string>& words) {
  for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    const TacticReport* t = report_of(r, tactic, op);
    ASSERT_NE(t, nullptr) << tactic;
    EXPECT_EQ(t->verdict, verdict) << tactic;
    for (const auto& w : words) EXPECT_NE(t->reason.find(w), std::string::npos) << "'" << w << "' not in: " << t->reason;
  }
}

// The working tactics were timed at every bucket even though workers died in between.
void expect_others_complete(const TuningResult& r) {
  for (const char* name : {"fake.portable.fallback", "fake.portable.fast", "fake.sm90.big"})
    for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
      const TacticReport* t = report_of(r, name, op);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->verdict, "ok") << name;
      EXPECT_EQ(t->ms.size(), r.buckets.size()) << name;
    }
}

TEST(TunerIsolated, SegfaultingTacticIsNamedAndExcluded) {
  const std::string dir = make_temp_dir();
  const std::string log_path = open_test_log(dir);
  const TuningResult r = tune_ok("profile=h200;faults=segv");
  expect_died(r, "fake.fault.segv", "crashed", {"SIGSEGV", "while running time fake.fault.segv", "tokens=4"});
  expect_others_complete(r);
  expect_choices_avoid(r, "fake.fault.segv", "fake.sm90.big");
  const std::string text = read_file(log_path);
  EXPECT_NE(text.find("E tuner: tactic fake.fault.segv (fc1): worker pid"), std::string::npos) << text;
  EXPECT_NE(text.find("killed by signal 11 (SIGSEGV"), std::string::npos) << text;
}

TEST(TunerIsolated, AbortInInitIsNamedAndExcluded) {
  const TuningResult r = tune_ok("profile=h200;faults=abort");
  expect_died(r, "fake.fault.abort", "crashed", {"SIGABRT", "init fake.fault.abort"});
  expect_others_complete(r);
  expect_choices_avoid(r, "fake.fault.abort", "fake.sm90.big");
}

TEST(TunerIsolated, StickyErrorEndsTheWorkerAndIsNamed) {
  const TuningResult r = tune_ok("profile=h200;faults=sticky");
  expect_died(r, "fake.fault.sticky", "crashed", {"sticky", "cudaErrorIllegalAddress"});
  expect_others_complete(r);
  expect_choices_avoid(r, "fake.fault.sticky", "fake.sm90.big");
}

TEST(TunerIsolated, HungTacticIsKilledAfterTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const TuningResult r = tune_ok("profile=h200;faults=hang", /*timeout_s=*/1.5);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_died(r, "fake.fault.hang", "hung", {"no progress", "time fake.fault.hang"});
  expect_others_complete(r);
  EXPECT_LT(s, 20) << "the hung worker was not killed in time";
}

TEST(TunerIsolated, EveryFaultAtOnce) {
  const std::string dir = make_temp_dir();
  const std::string log_path = open_test_log(dir);
  const TuningResult r = tune_ok("profile=h200;faults=initfail,wrong,segv,abort,sticky,runerror");
  expect_died(r, "fake.fault.segv", "crashed", {"SIGSEGV"});
  expect_died(r, "fake.fault.abort", "crashed", {"SIGABRT"});
  expect_died(r, "fake.fault.sticky", "crashed", {"cudaErrorIllegalAddress"});
  expect_died(r, "fake.fault.initfail", "init-failed", {"cudaFuncSetAttribute"});
  expect_died(r, "fake.fault.wrong", "wrong-result", {"relative L2 error"});
  expect_died(r, "fake.fault.runerror", "failed", {"cudaErrorLaunchOutOfResources"});
  expect_others_complete(r);
  expect_choices_avoid(r, "fake.fault.wrong", "fake.sm90.big");
  // On sm_120 the same faults, and the portable family carries the layer.
  const TuningResult rtx = tune_ok("profile=rtx-pro-6000;faults=initfail,wrong,segv,abort,sticky");
  expect_choices_avoid(rtx, "fake.fault.wrong", "fake.portable.fast");
}

TEST(TunerIsolated, UnknownBackendInTheWorkerIsAnError) {
  TuneOptions o;
  o.backend = "no-such-backend";
  TuningResult r;
  const Status st = tune_layer(fake_layer(), o, &r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("no-such-backend"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe::testing
