// Stable tactic names of the sm90 family, generated from the tile shape: "sm90.w4a16.m128n8k128.ws.s8",
// "sm90.w4a16.m128n8k128.ws.s4.x2".
#pragma once
#include <fmt/format.h>

#include <string>

namespace fp4moe {
namespace sm90 {

// ctas > 1 adds ".x<ctas>": the tile is sized so that several CTAs share an SM.
inline std::string tactic_name(int bm, int bn, int bk, int stages, int ctas) {
  const std::string base = fmt::format("sm90.w4a16.m{}n{}k{}.ws.s{}", bm, bn, bk, stages);
  return ctas > 1 ? fmt::format("{}.x{}", base, ctas) : base;
}

}  // namespace sm90
}  // namespace fp4moe
