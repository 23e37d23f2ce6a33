// A fake tuning backend for CPU tests: tactics with declared requirements and a timing model, some of
// which fail on purpose. Created from a spec string so that the tuner's worker child can re-create it:
//   "profile=h200;faults=initfail,wrong,segv;nofallback"
// Tactics (time in ms for T tokens):
//   fake.portable.fallback  fallback, sm_80+, 48 KB smem          1.0 + 0.010 T
//   fake.portable.fast      sm_80+, 64 KB smem                    0.5 + 0.008 T
//   fake.sm90.big           sm_90a only, 132 KB smem              0.2 + 0.002 T
//   faults (all sm_80+, small smem, so only the fault stops them):
//   fake.fault.initfail     init fails with a CUDA-like error     -
//   fake.fault.wrong        fastest, but verify finds wrong output 0.01
//   fake.fault.segv         raises SIGSEGV while timing T >= 4 tokens
//   fake.fault.abort        abort() in init
//   fake.fault.sticky       timing fails and the "context" is lost (healthy() false)
//   fake.fault.hang         sleeps forever while timing
//   fake.fault.runerror     timing returns an error at T >= 64 (the process stays usable)
#pragma once
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "fp4moe/tuner.h"

namespace fp4moe::testing {

class FakeBackend final : public TuningBackend {
 public:
  explicit FakeBackend(const std::string& spec) {
    std::string profile = "h200";
    std::vector<std::string> faults;
    bool fallback = true;
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ';')) {
      if (item.rfind("profile=", 0) == 0) profile = item.substr(8);
      if (item.rfind("faults=", 0) == 0) {
        std::stringstream fs(item.substr(7));
        std::string f;
        while (std::getline(fs, f, ',')) faults.push_back(f);
      }
      if (item == "nofallback") fallback = false;
    }
    caps_ = device_profile(profile);
    caps_.driver_version = 13000;
    caps_.runtime_version = 13000;
    if (fallback) add("fake.portable.fallback", "portable", 48 * 1024, 80, 0, true, 1.0, 0.010);
    if (fallback) add("fake.portable.fast", "portable", 64 * 1024, 80, 0, false, 0.5, 0.008);
    add("fake.sm90.big", "sm90", 132 * 1024, 90, 90, false, 0.2, 0.002);
    for (const auto& f : faults) add("fake.fault." + f, "fault", 32 * 1024, 80, 0, false, 0.01, 0.0);
  }

  std::vector<TacticDesc> candidates() const override { return descs_; }
  DeviceCaps caps() const override { return caps_; }
  bool healthy() const override { return healthy_; }

  Status init(const std::string& name, const GemmProblem&) override {
    if (!known(name)) return Status(StatusCode::kNotFound, "unknown fake tactic " + name);
    if (name == "fake.fault.initfail")
      return Status(StatusCode::kCudaError,
                    "cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, 238592) failed: cudaErrorInvalidValue "
                    "(invalid argument)");
    if (name == "fake.fault.abort") std::abort();
    return Status::ok();
  }

  Status time(const std::string& name, const GemmProblem& p, int64_t tokens, double* ms) override {
    if (!known(name)) return Status(StatusCode::kNotFound, "unknown fake tactic " + name);
    if (p.total_rows <= 0) return Status(StatusCode::kInvalidArgument, "empty problem");
    if (name == "fake.fault.segv" && tokens >= 4) ::raise(SIGSEGV);
    if (name == "fake.fault.hang")
      while (true) ::pause();
    if (name == "fake.fault.sticky") {
      healthy_ = false;
      return Status(StatusCode::kCudaError,
                    "cudaStreamSynchronize(stream) failed: cudaErrorIllegalAddress (an illegal memory access was "
                    "encountered)");
    }
    if (name == "fake.fault.runerror" && tokens >= 64)
      return Status(StatusCode::kCudaError, "kernel launch failed: cudaErrorLaunchOutOfResources");
    for (size_t i = 0; i < descs_.size(); ++i)
      if (descs_[i].name == name) *ms = base_[i] + per_token_[i] * double(tokens);
    return Status::ok();
  }

  Status verify(const std::string& name, const GemmProblem& p) override {
    if (name == "fake.fault.wrong")
      return Status(StatusCode::kInternal,
                    "wrong result: relative L2 error 4.312e-01 > 5e-03 on " + p.to_string() + " against the fallback");
    return Status::ok();
  }

 private:
  bool known(const std::string& name) const {
    for (const auto& d : descs_)
      if (d.name == name) return true;
    return false;
  }
  void add(const std::string& name, const std::string& family, int64_t smem, int min_cc, int exact_cc, bool fallback,
           double base, double per_token) {
    TacticDesc d;
    d.name = name;
    d.family = family;
    d.is_fallback = fallback;
    d.req.min_cc = min_cc;
    d.req.exact_cc = exact_cc;
    d.req.needs_arch_specific = exact_cc != 0;
    d.req.smem_bytes = smem;
    d.req.threads = 256;
    d.req.regs_per_thread = 128;
    descs_.push_back(d);
    base_.push_back(base);
    per_token_.push_back(per_token);
  }

  DeviceCaps caps_;
  std::vector<TacticDesc> descs_;
  std::vector<double> base_, per_token_;
  bool healthy_ = true;
};

inline void register_fake_backend() {
  register_tuning_backend("fake", [](const std::string& arg) { return std::make_unique<FakeBackend>(arg); });
}

// A small layer shape for the fake tuner.
inline MoeConfig fake_layer() {
  MoeConfig c;
  c.name = "fake";
  c.hidden = 256;
  c.inter = 128;
  c.num_experts = 16;
  c.topk = 4;
  return c;
}

}  // namespace fp4moe::testing
