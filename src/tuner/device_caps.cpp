// Device capabilities: read from a CUDA device, or taken from a named profile so that "what would run
// on an sm_120 card with 99 KB of shared memory per block" can be answered on a machine without a GPU.
//
// Sources of the profile figures:
//  - Shared memory per SM / opt-in per block, registers, threads, clusters by compute capability: CUDA C++
//    Programming Guide, "Technical Specifications per Compute Capability" (8.0: 164 KB/SM, 163 KB/block;
//    8.9 and 12.0: 100 KB/SM, 99 KB/block; 9.0 and 10.0: 228 KB/SM, 227 KB/block; 64K registers per SM
//    and per block, 1024 threads per block; thread-block clusters from 9.0).
//  - SM counts, L2, memory size and bandwidth: NVIDIA datasheets / whitepapers (H100 SXM5, H200 SXM,
//    B200 (DGX B200), RTX PRO 6000 Blackwell, L40S, A100 80GB SXM4). Memory sizes are the MiB that
//    nvidia-smi reports; H200's 143771 MiB and 60 MiB L2 were read on the H200 this project tests on.
#include "fp4moe/device_caps.h"

#include <fmt/format.h>

#include <cstdlib>

#include "fp4moe/status.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda_check.h"
#endif

namespace fp4moe {

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

struct Profile {
  const char* id;
  const char* alias;  // nullptr: none
  DeviceCaps caps;
};

DeviceCaps make_caps(const char* name, const char* id, int major, int minor, bool arch_specific, int sms,
                     int64_t smem_block, int64_t smem_sm, bool cluster, int64_t l2, int64_t mem, double bw) {
  DeviceCaps c;
  c.name = name;
  c.profile = id;
  c.cc_major = major;
  c.cc_minor = minor;
  c.arch_specific = arch_specific;
  c.sm_count = sms;
  c.smem_per_block_optin = smem_block;
  c.smem_per_sm = smem_sm;
  c.regs_per_block = 65536;  // 64K 32-bit registers per block and per SM on every cc listed here
  c.regs_per_sm = 65536;
  c.max_threads_per_block = 1024;
  c.cluster_launch = cluster;
  c.l2_bytes = l2;
  c.global_mem_bytes = mem;
  c.mem_bandwidth_gbs = bw;
  return c;
}

const std::vector<Profile>& profiles() {
  // arch_specific: sm_90a / sm_100a features ('a' targets) exist on cc 9.0 and 10.x. Our sm_90a binary
  // runs only on cc 9.0; tactics say so with exact_cc. No family uses sm_120a features yet.
  static const std::vector<Profile> kProfiles = {
      {"h100", nullptr,
       make_caps("NVIDIA H100 80GB HBM3", "h100", 9, 0, true, 132, 232448, 233472, true, 50 * kMiB, 81559 * kMiB,
                 3350)},
      {"h200", nullptr,
       make_caps("NVIDIA H200", "h200", 9, 0, true, 132, 232448, 233472, true, 60 * kMiB, 143771 * kMiB, 4800)},
      {"b200", nullptr,
       make_caps("NVIDIA B200", "b200", 10, 0, true, 148, 232448, 233472, true, 126 * kMiB, 183359 * kMiB, 8000)},
      {"rtx-pro-6000", "sm120",
       make_caps("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000", 12, 0, false, 188, 101376,
                 102400, true, 128 * kMiB, 97887 * kMiB, 1792)},
      {"l40s", nullptr,
       make_caps("NVIDIA L40S", "l40s", 8, 9, false, 142, 101376, 102400, false, 96 * kMiB, 46068 * kMiB, 864)},
      {"a100", nullptr,
       make_caps("NVIDIA A100-SXM4-80GB", "a100", 8, 0, false, 108, 166912, 167936, false, 40 * kMiB, 81920 * kMiB,
                 2039)},
  };
  return kProfiles;
}

#ifdef FP4MOE_HAVE_CUDA

int attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  FP4MOE_CUDA_THROW(cudaDeviceGetAttribute(&v, attr, device));
  return v;
}
#endif

}  // namespace

std::string DeviceCaps::to_string() const {
  return fmt::format(
      "{} ({}): sm_{}{}{} {} SMs, smem {:.1f} KB/block (opt-in) {:.1f} KB/SM, regs {}/block, {} threads/block, "
      "clusters {}, L2 {} MiB, memory {:.1f} GiB, {:.0f} GB/s, driver {}, runtime {}",
      name, profile, cc_major, cc_minor, arch_specific ? "a" : "", sm_count, smem_per_block_optin / 1024.0,
      smem_per_sm / 1024.0, regs_per_block, max_threads_per_block, cluster_launch ? "yes" : "no", l2_bytes / kMiB,
      global_mem_bytes / double(1024 * kMiB), mem_bandwidth_gbs, driver_version, runtime_version);
}

std::vector<std::string> device_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : profiles()) {
    names.push_back(p.id);
    if (p.alias) names.push_back(p.alias);
  }
  return names;
}

DeviceCaps device_profile(const std::string& name) {
  for (const auto& p : profiles())
    if (name == p.id || (p.alias && name == p.alias)) return p.caps;
  throw Error(StatusCode::kInvalidArgument,
              fmt::format("unknown device profile '{}'; known profiles: {}", name,
                          fmt::join(device_profile_names(), ", ")));
}

int cuda_device_count() {
#ifdef FP4MOE_HAVE_CUDA
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: not sticky, clear it so later calls start clean
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

DeviceCaps query_device_caps(int device) {
#ifdef FP4MOE_HAVE_CUDA
  const int count = cuda_device_count();
  FP4MOE_CHECK(count > 0, StatusCode::kUnsupported, "no CUDA device is present (cudaGetDeviceCount found none)");
  FP4MOE_CHECK(device >= 0 && device < count, StatusCode::kInvalidArgument,
               "CUDA device {} does not exist; this machine has {} device(s)", device, count);
  cudaDeviceProp prop{};
  FP4MOE_CUDA_THROW(cudaGetDeviceProperties(&prop, device));
  DeviceCaps c;
  c.name = prop.name;
  c.profile = "live";
  c.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, device);
  c.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, device);
  // Our sm_90a code runs exactly on cc 9.0; sm_100a features exist on cc 10.x.
  c.arch_specific = c.cc() == 90 || c.cc_major == 10;
  c.sm_count = attribute(cudaDevAttrMultiProcessorCount, device);
  c.smem_per_block_optin = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  c.smem_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  c.regs_per_block = attribute(cudaDevAttrMaxRegistersPerBlock, device);
  c.regs_per_sm = attribute(cudaDevAttrMaxRegistersPerMultiprocessor, device);
  c.max_threads_per_block = attribute(cudaDevAttrMaxThreadsPerBlock, device);
  c.cluster_launch = attribute(cudaDevAttrClusterLaunch, device) != 0;
  c.l2_bytes = attribute(cudaDevAttrL2CacheSize, device);
  c.global_mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  FP4MOE_CUDA_THROW(cudaDriverGetVersion(&c.driver_version));
  FP4MOE_CUDA_THROW(cudaRuntimeGetVersion(&c.runtime_version));
  // Peak bandwidth from the memory clock (kHz, double data rate) and bus width (bits): informational.
  const double clock_khz = attribute(cudaDevAttrMemoryClockRate, device);
  const double bus_bits = attribute(cudaDevAttrGlobalMemoryBusWidth, device);
  c.mem_bandwidth_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  return c;
#else
  (void)device;
  throw Error(StatusCode::kUnsupported,
              "this build of fp4moe has no CUDA backend, so no device can be queried; use --device-profile NAME");
#endif
}

}  // namespace fp4moe
