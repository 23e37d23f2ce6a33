#include "kernels/sm90_wgmma/trace_csv.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/sm90_wgmma/sm90_trace.cuh"

namespace fp4moe {
namespace sm90 {

std::string trace_csv_rows(const std::vector<unsigned long long>& rec, const std::string& prefix) {
  std::string out;
  if (rec.size() < kTraceBytes / 8) return out;
  const auto cta = [&](int m, int c) { return &rec[(size_t(m) * kTraceMaxCtas + c) * kTraceWords]; };
  unsigned long long t0 = ~0ull;
  for (int m = 0; m < 3; ++m)
    for (int c = 0; c < kTraceMaxCtas; ++c)
      if (const unsigned long long e = cta(m, c)[1]) t0 = std::min(t0, e);
  const auto rel = [&](unsigned long long v) { return v ? static_cast<long long>(v - t0) : -1ll; };
  for (int m = 0; m < 3; ++m)
    for (int c = 0; c < kTraceMaxCtas; ++c) {
      const unsigned long long* w = cta(m, c);
      if (!w[1]) continue;
      const int n = static_cast<int>(std::min<unsigned long long>(w[3], kTraceMaxItems));
      for (int j = 0; j < std::max(n, 1); ++j) {
        const unsigned long long* it = w + 6 + 6 * j;
        out += fmt::format("{}{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", prefix, m, c, w[0], rel(w[1]),
                           rel(w[4]), rel(w[2]), n ? j : -1, n ? static_cast<long long>(it[0]) : -1ll,
                           n ? rel(it[1]) : -1ll, n ? rel(it[2]) : -1ll, n ? rel(it[3]) : -1ll, n ? rel(it[4]) : -1ll,
                           n ? rel(it[5]) : -1ll, rel(w[5]), rel(w[kTraceRouteMarks]), rel(w[kTraceRouteMarks + 1]),
                           rel(w[kTraceRouteMarks + 2]), rel(w[kTraceFirstFetch]));
      }
    }
  return out;
}

}  // namespace sm90
}  // namespace fp4moe
