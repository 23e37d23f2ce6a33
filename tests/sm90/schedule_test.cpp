// The sm90 family's host-side schedule rules on the CPU (src/kernels/sm90_wgmma/tile_config.h): how many K
// parts the folded last expert's FC1 units split into, fold_split_parts(FC1 stages, FC2 stages).
#include <algorithm>

#include <gtest/gtest.h>

#include "kernels/sm90_wgmma/tile_config.h"

namespace fp4moe {
namespace {

using sm90::fold_split_parts;
using sm90::kMaxSplit;

// The model shapes of docs/perf.md (k256 stages): the fewest parts, dividing FC1's stages, that are no
// longer than an FC2 item.
TEST(Sm90Schedule, FoldPartsOfTheModels) {
  EXPECT_EQ(fold_split_parts(6144 / 256, 2048 / 256), 3);  // GLM-5: 24 stages, FC2 8 -> 3 parts of 8
  EXPECT_EQ(fold_split_parts(7168 / 256, 2048 / 256), 4);  // DeepSeek-V3: 28 stages, FC2 8 -> 4 parts of 7
  EXPECT_EQ(fold_split_parts(6144 / 256, 256 / 256), 8);   // TP8 shard: FC2 of one stage -> at most kMaxSplit
}

// The shapes sm90_tactics_test folds (I = 512; k256 and k128 stages), as its comment states them.
TEST(Sm90Schedule, FoldPartsOfTheTacticsTest) {
  EXPECT_EQ(fold_split_parts(1536 / 256, 512 / 256), 3);  // 6 stages, FC2 2 -> 3 parts of 2
  EXPECT_EQ(fold_split_parts(1536 / 128, 512 / 128), 3);  // 12 stages, FC2 4 -> 3 parts of 4
  EXPECT_EQ(fold_split_parts(1792 / 256, 512 / 256), 7);  // 7 stages, FC2 2: target 4; 7 is the next divisor
  EXPECT_EQ(fold_split_parts(1792 / 128, 512 / 128), 7);  // 14 stages
}

// Every result divides FC1's stages and stays within [1, kMaxSplit], and is 1 only where no divisor in
// [2, kMaxSplit] exists (a prime stage count above kMaxSplit). With the target ceil(FC1 / FC2 stages)
// (at least 2): the result is the nearest divisor at or above it where one is in range, else
// the nearest below it.
TEST(Sm90Schedule, FoldPartsDivideAndStayInRange) {
  auto divides = [](int s0, int d) { return s0 % d == 0; };
  for (int s0 = 1; s0 <= 96; ++s0) {
    for (int s1 = 0; s1 <= 32; ++s1) {
      const int parts = fold_split_parts(s0, s1);
      SCOPED_TRACE(::testing::Message() << "stages " << s0 << " / " << s1 << " -> " << parts);
      ASSERT_GE(parts, 1);
      ASSERT_LE(parts, kMaxSplit);
      EXPECT_TRUE(divides(s0, parts));
      bool has_divisor = false, has_divisor_above = false;
      const int target = s1 > 0 ? std::max(2, (s0 + s1 - 1) / s1) : 2;
      for (int d = 2; d <= kMaxSplit; ++d) {
        has_divisor = has_divisor || divides(s0, d);
        has_divisor_above = has_divisor_above || (d >= target && divides(s0, d));
      }
      EXPECT_EQ(parts == 1, !has_divisor);
      if (has_divisor_above) {
        EXPECT_GE(parts, target);
        for (int d = target; d < parts; ++d) EXPECT_FALSE(divides(s0, d)) << "a nearer divisor " << d;
      } else if (parts > 1) {
        EXPECT_LT(parts, target);
        for (int d = parts + 1; d < target && d <= kMaxSplit; ++d)
          EXPECT_FALSE(divides(s0, d)) << "a nearer divisor " << d;
      }
    }
  }
}

// Usable where the kernel's constants are: a constant expression.
static_assert(fold_split_parts(24, 8) == 3, "GLM-5's folded FC1 splits in three");

}  // namespace
}  // namespace fp4moe
