// main() of the GPU test binary: exits 77 (ctest: skipped) when there is no usable CUDA device.
#include <gtest/gtest.h>

#include <cstdio>

#include "fp4moe/engine.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  if (!::testing::GTEST_FLAG(list_tests) && !fp4moe::cuda_backend_available(&why)) {
    std::printf("skipping the GPU tests: %s\n", why.c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
