// main() of the sm90 GPU test binaries (sm90_tactics_test, sm90_cc_tactic_test, sm90_e4m3_test): exits 77
// (ctest: skipped) unless device 0 is an sm_90 GPU (sm90test::skip_unless_sm90 says why on stderr).
#include <gtest/gtest.h>

#include "sm90_test_util.h"

int main(int argc, char** argv) {
  const int skip = fp4moe::sm90test::skip_unless_sm90();
  if (skip != 0) return skip;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
