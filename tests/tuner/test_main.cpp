// main() of the tuner test binaries: registers the fake backend, then lets the tuner's worker child
// (this same binary, re-executed) take over when asked, before GoogleTest sees the arguments.
#include <gtest/gtest.h>

#include "fake_backend.h"

int main(int argc, char** argv) {
  fp4moe::testing::register_fake_backend();
  int exit_code = 0;
  if (fp4moe::tuner_worker_main_if_requested(argc, argv, &exit_code)) return exit_code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
