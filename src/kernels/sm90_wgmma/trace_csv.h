// CSV rows of the sm90 kernels' timeline records (sm90_trace.cuh), written by bench_sm90 --trace and
// fp4moe bench --trace and read by tools/sm90_timeline.py. Host-only C++.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe {
namespace sm90 {

// The columns after the caller's own leading ones ("T,run," in both benches).
constexpr const char* kTraceCsvColumns =
    "mode,cta,sm,entry_ns,setup_ns,exit_ns,j,item,weights_ns,tokens_ns,start_ns,end_ns,mainloop_ns,routed_ns,"
    "route_step0_ns,route_step1_ns,route_step2_ns,fetch_ns";

// One line per (mode, CTA, item) of the records `rec` (kTraceBytes / 8 words as downloaded), each starting
// with `prefix`; times in ns from the earliest entry of any CTA, -1 where a record is absent.
std::string trace_csv_rows(const std::vector<unsigned long long>& rec, const std::string& prefix);

}  // namespace sm90
}  // namespace fp4moe
