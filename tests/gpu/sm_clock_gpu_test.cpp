// The SM clock probe (include/fp4moe/sm_clock.h): its window is at least what was asked, the clock it
// reads lies between a tenth of the device's rated clock and 1.2 times it, two probes in a row agree
// within 25%, and bad arguments are refused with the problem named, without a launch.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "fp4moe/sm_clock.h"
#include "gpu_test_util.h"

namespace fp4moe::test {
namespace {

TEST(SmClockProbe, ReadsAPlausibleClock) {
  int dev = 0, rated_khz = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&rated_khz, cudaDevAttrClockRate, dev));
  ASSERT_GT(rated_khz, 0);
  Dev slot(32);
  slot.poison();
  const int64_t window_ns = 20000;
  ASSERT_TRUE(enqueue_sm_clock_probe(nullptr, window_ns, slot.as<uint64_t>()).is_ok());
  ASSERT_TRUE(enqueue_sm_clock_probe(nullptr, window_ns, slot.as<uint64_t>() + 2).is_ok());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint64_t> v = slot.download<uint64_t>(4);
  for (int i = 0; i < 2; ++i) {
    const uint64_t* s = v.data() + 2 * i;
    EXPECT_GE(s[1], static_cast<uint64_t>(window_ns)) << "probe " << i << ": window shorter than asked";
    EXPECT_LT(s[1], uint64_t{100} * window_ns) << "probe " << i << ": window far longer than asked";
    const double mhz = sm_clock_mhz(s);
    EXPECT_GT(mhz, rated_khz / 1e3 / 10) << "probe " << i << " read " << mhz << " MHz, rated " << rated_khz / 1e3;
    EXPECT_LT(mhz, rated_khz / 1e3 * 1.2) << "probe " << i << " read " << mhz << " MHz, rated " << rated_khz / 1e3;
  }
  const double a = sm_clock_mhz(v.data()), b = sm_clock_mhz(v.data() + 2);
  EXPECT_LT(std::abs(a - b), 0.25 * std::max(a, b)) << a << " MHz then " << b << " MHz";
}

TEST(SmClockProbe, RefusesBadArguments) {
  Dev slot(32);
  const Status null_slot = enqueue_sm_clock_probe(nullptr, 20000, nullptr);
  EXPECT_EQ(null_slot.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_slot.message().find("null slot"), std::string::npos) << null_slot.message();
  for (int64_t w : {int64_t{0}, int64_t{999}, int64_t{10000001}}) {
    const Status st = enqueue_sm_clock_probe(nullptr, w, slot.as<uint64_t>());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << w;
    EXPECT_NE(st.message().find(std::to_string(w) + " ns"), std::string::npos) << st.message();
  }
  const uint64_t zero[2] = {5, 0};
  EXPECT_EQ(sm_clock_mhz(zero), 0.0);
}

}  // namespace
}  // namespace fp4moe::test
