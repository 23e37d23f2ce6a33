// Stable tactic names of the sm90 family, generated from the tile shape: "sm90.w4a16.m128n8k128.ws.s8",
// "sm90.w4a16.m128n8k128.ws.s4.x2", "sm90.w4a16.m256n8k256.ws.s5.c4"; the e4m3 tile (act 8) names its one
// token per item: "sm90.w4e4m3.m256n1k256.ws.s5.c4".
#pragma once
#include <fmt/format.h>

#include <string>

namespace fp4moe {
namespace sm90 {

// ctas > 1 adds ".x<ctas>": the tile is sized so that several CTAs share an SM; consumers other than 2 add
// ".c<consumers>" (consumer warpgroups per CTA).
inline std::string tactic_name(int bm, int bn, int bk, int stages, int ctas, int consumers, int act = 16) {
  std::string name = act == 8 ? fmt::format("sm90.w4e4m3.m{}n1k{}.ws.s{}", bm, bk, stages)
                              : fmt::format("sm90.w4a16.m{}n{}k{}.ws.s{}", bm, bn, bk, stages);
  if (ctas > 1) name += fmt::format(".x{}", ctas);
  if (consumers != 2) name += fmt::format(".c{}", consumers);
  return name;
}

}  // namespace sm90
}  // namespace fp4moe
