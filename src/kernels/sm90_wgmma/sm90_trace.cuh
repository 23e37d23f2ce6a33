// Opt-in timeline of the sm90 kernels (compile with -DFP4MOE_SM90_TRACE, CMake option FP4MOE_SM90_TRACE;
// off in every normal build, where the macros below expand to nothing and the SASS is unchanged).
//
// Each CTA of a launch writes kTraceWords 64-bit words at trace + (mode * kTraceMaxCtas + blockIdx.x) *
// kTraceWords (mode: 0 FC1, 1 FC2, 2 chained), all times %globaltimer nanoseconds:
//   [0] SM id   [1] entry (after the programmatic-launch wait)   [2] exit (consumers done)   [3] items
//   [4] set-up done (work table and item space built)   [5] routing done (a launch that routes, else 0)
//   item j < kTraceMaxItems at 6 + 6j: [item index, weight producer's first copy, token producer ready
//   (after a chained FC2 item's wait for FC1), consumer start (first stage landed), consumer end (epilogue
//   stored), consumer's last wgmma retired (before the split reduction and the epilogue)]
//   [252..254] the routing's steps in a launch that routes (routed, past its barrier, offsets complete),
//   [255] the weight producer's first item fetch returned
// The host points the kernels at a zeroed buffer of kTraceBytes with sm90::set_trace_buffer()
// (sm90_family.h) and reads it back after the launch; a later launch of the same mode overwrites it.
// bench_sm90 --trace FILE writes it as CSV (docs/perf.md has what it showed).
#pragma once
#include <cstddef>
#include <cstdint>

namespace fp4moe {
namespace sm90 {

constexpr int kTraceWords = 256;
constexpr int kTraceMaxItems = (kTraceWords - 10) / 6;
constexpr int kTraceRouteMarks = kTraceWords - 4;  // [252..254]: the routing's steps (front_route_permute's marks)
constexpr int kTraceFirstFetch = kTraceWords - 1;  // [255]: the first item fetch returned (the weight producer's)
constexpr int kTraceMaxCtas = 1024;
constexpr size_t kTraceBytes = size_t(3) * kTraceMaxCtas * kTraceWords * 8;

#if defined(FP4MOE_SM90_TRACE) && defined(__CUDACC__)
__device__ unsigned long long* g_trace = nullptr;

__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned long long trace_smid() {
  unsigned v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
__device__ __forceinline__ unsigned long long* trace_cta(int mode) {
  return g_trace && blockIdx.x < kTraceMaxCtas ? g_trace + (size_t(mode) * kTraceMaxCtas + blockIdx.x) * kTraceWords
                                                : nullptr;
}
__device__ __forceinline__ void trace_put(int mode, int word, unsigned long long v) {
  if (unsigned long long* c = trace_cta(mode)) c[word] = v;
}
__device__ __forceinline__ void trace_item(int mode, int j, int field, unsigned long long v) {
  if (j < kTraceMaxItems) trace_put(mode, 6 + 6 * j + field, v);
}
#define FP4MOE_TRACE_PUT(mode, word, v) ::fp4moe::sm90::trace_put(mode, word, v)
#define FP4MOE_TRACE_ITEM(mode, j, field, v) ::fp4moe::sm90::trace_item(mode, j, field, v)
#define FP4MOE_TRACE_NOW() ::fp4moe::sm90::trace_now()
#define FP4MOE_TRACE_SMID() ::fp4moe::sm90::trace_smid()
#else
#define FP4MOE_TRACE_PUT(mode, word, v) ((void)0)
#define FP4MOE_TRACE_ITEM(mode, j, field, v) ((void)0)
#define FP4MOE_TRACE_NOW() 0ull
#define FP4MOE_TRACE_SMID() 0ull
#endif

}  // namespace sm90
}  // namespace fp4moe
