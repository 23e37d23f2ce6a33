// What a GPU can do, read from the device or taken from a named profile, so that "what would run on
// an sm_120 card with 99 KB of shared memory per block" can be answered on any machine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe {

struct DeviceCaps {
  std::string name;              // "NVIDIA H200" or the profile's marketing name
  std::string profile;           // profile id ("h200") or "live" when read from a device
  int cc_major = 0, cc_minor = 0;
  bool arch_specific = false;    // the 'a' features (wgmma, setmaxnreg) of sm_90a / sm_100a are usable
  int sm_count = 0;
  int64_t smem_per_block_optin = 0;   // bytes: cudaDevAttrMaxSharedMemoryPerBlockOptin
  int64_t smem_per_sm = 0;            // bytes
  int regs_per_block = 0;             // 32-bit registers
  int regs_per_sm = 0;
  int max_threads_per_block = 0;
  bool cluster_launch = false;        // thread-block clusters (sm_90+)
  int64_t l2_bytes = 0;
  int64_t global_mem_bytes = 0;
  int driver_version = 0;             // cudaDriverGetVersion, e.g. 13000; 0 for a profile
  int runtime_version = 0;            // cudaRuntimeGetVersion
  double mem_bandwidth_gbs = 0;       // datasheet figure, informational only

  int cc() const { return cc_major * 10 + cc_minor; }  // 90 for sm_90
  std::string to_string() const;      // one line for logs
};

// Named profiles: "h100", "h200", "b200", "rtx-pro-6000" (alias "sm120"), "l40s", "a100".
// Throws Error(kInvalidArgument) listing the known names.
DeviceCaps device_profile(const std::string& name);
std::vector<std::string> device_profile_names();

// Reads the caps of CUDA device `device` (throws kUnsupported when this build has no CUDA or the device
// is absent, kCudaError naming the call on a CUDA failure).
DeviceCaps query_device_caps(int device);
// Number of CUDA devices usable by this build (0 without CUDA or without a driver/GPU; never throws).
int cuda_device_count();

}  // namespace fp4moe
