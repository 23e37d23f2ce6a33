// The sm90 resident tactic's host side beyond the GroupedGemmTactic interface (sm90_cc.cu; its layout:
// sm90_cc_layout.h): the preflight its descriptor alone cannot express, and (CUDA builds) its kernels'
// resources for the tests.
#pragma once
#include <cstdint>
#include <string>

#include "fp4moe/device_caps.h"
#include "fp4moe/tactic.h"
#include "kernels/sm90_wgmma/sm90_cc_layout.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "fp4moe/status.h"
#endif

namespace fp4moe {
namespace sm90 {

// The stable name of the resident tactic: 32 weight rows (16 gate + 16 up) a CTA, one token, FC1 chunks
// of K 512, math on the CUDA cores.
constexpr const char* kCcTacticName = "sm90.w4f16.m32n1k512.cc";

// Timeline words of a launch (in its slot: FC1, FC2 or chained) beyond sm90_trace.cuh's [0] SM, [1] entry,
// [2] exit (every CTA's end past FC2, a row's last CTA's after its conversion; 0 where the fp32 rows go to the
// caller), [3] copies: [4] the expert known, [5] the copies issued, [kCcTraceToken] the token landed, [+1] its
// f16 copy written, [kCcTraceChunks + c] chunk c seen by its first reader (FC1's by thread 0, FC2's by threads
// 0 and 256), [kCcTraceFc1Done] warp 0's column summed, [+1] FC2's start (the SwiGLU values as f16),
// [kCcTraceFc2Done + h] thread 256h's FC2 chunks done.
constexpr int kCcTraceToken = 6, kCcTraceChunks = 8, kCcTraceFc1Done = 40, kCcTraceFc2Done = 42;

// The kernels' largest hidden size: one k16 block of the token a math thread.
constexpr int64_t kCcMaxHidden = 16 * kCcThreads;
// Whether the kernels handle this hidden size; else why (the preflight's and the launch's words).
inline bool cc_hidden_fits(int64_t hidden, std::string* why) {
  if (hidden <= kCcMaxHidden) return true;
  *why = "handles a hidden size of at most " + std::to_string(kCcMaxHidden) +
         " (one k16 block of the token a math thread), problem has " + std::to_string(hidden);
  return false;
}

// check_tactic on the descriptor, then what depends on the problem: the kSm90Cc layout's shape (hidden a
// multiple of 1024, the SwiGLU width a multiple of 16), cc_hidden_fits, at most kCcMaxExperts experts, 2^31
// CTAs, and the chained launch's shared memory at this hidden size (cc_smem_bytes) within the device's
// per-block limit (FC1 or FC2 alone needs less; the chain, the tactic's use, is what is checked for either).
TacticCheck check_cc_tactic(const TacticDesc& desc, const GemmProblem& p, const DeviceCaps& caps);

#ifdef FP4MOE_HAVE_CUDA
// The larger registers and local memory of the tactic's three kernels (FC1, FC2, chain).
Status cc_kernel_resources(cudaFuncAttributes* out);

// The resident kernels' share of set_trace_buffer (sm90_family.h): their timeline words (sm90_cc.cu's
// kCcTrace*) go to `buffer`, each launch's in its own slot. A no-op in a build without FP4MOE_SM90_TRACE.
Status cc_set_trace_buffer(void* buffer);
#endif

}  // namespace sm90
}  // namespace fp4moe
