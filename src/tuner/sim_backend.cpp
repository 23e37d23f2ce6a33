// The simulated tuning backend ("sim", argument: a device profile name): the registry's tactic
// descriptors on a profile's caps, with timings from a simple roofline model instead of kernels. It
// lets the whole tuning path (preflight, worker isolation, choice, cache, CLI) run on machines without a
// GPU; `fp4moe tune --simulate PROFILE` uses it and says so. Nothing it reports is a measurement.
//
// Model for T tokens on a tactic with tile_n tokens per CTA column (a roofline, nothing more):
//   active experts  A = E * (1 - (1 - 1/E)^(T*topk))
//   weight bytes    A * weight_rows * K * 0.5625 (NVFP4 codes + e4m3 scales per 16)
//   waste           (rows per active expert rounded up to tile_n) / rows per active expert
//   tensor rate     400 TFLOP/s * min(1, tile_n / 128) (narrow token tiles use the MMA poorly)
//   ms = 1e3 * max(bytes / (0.8 * bandwidth), waste * 2 * rows * weight_rows * K / rate) + 0.004
#include <cmath>

#include "fp4moe/tuner.h"

namespace fp4moe {

namespace {

class SimTuningBackend final : public TuningBackend {
 public:
  explicit SimTuningBackend(const std::string& profile) : caps_(device_profile(profile)), descs_(all_tactic_descs()) {
    caps_.name += " (simulated)";  // never mistaken for the real device in caches and reports
  }
  std::vector<TacticDesc> candidates() const override { return descs_; }
  DeviceCaps caps() const override { return caps_; }
  Status init(const std::string& name, const GemmProblem&) override {
    return find(name) ? Status::ok() : Status(StatusCode::kNotFound, "unknown tactic " + name);
  }
  Status time(const std::string& name, const GemmProblem& p, int64_t tokens, double* ms) override {
    const TacticDesc* d = find(name);
    if (!d) return Status(StatusCode::kNotFound, "unknown tactic " + name);
    const double E = double(p.num_experts);
    const double active = E * (1.0 - std::pow(1.0 - 1.0 / E, double(p.total_rows)));
    const double wrows = double(weight_rows(p));
    const double bytes = active * wrows * double(p.k) * 0.5625;
    const double rows_per = double(p.total_rows) / std::max(active, 1.0);
    const double tile_n = std::max(d->tile_n, 1);
    const double waste = std::ceil(rows_per / tile_n) * tile_n / rows_per;
    const double flops = 2.0 * double(p.total_rows) * wrows * double(p.k);
    const double bw = std::max(caps_.mem_bandwidth_gbs, 100.0) * 1e9 * 0.8;
    const double rate = 400e12 * std::min(1.0, tile_n / 128.0);
    (void)tokens;
    *ms = 1e3 * std::max(bytes / bw, waste * flops / rate) + 0.004;
    return Status::ok();
  }
  Status verify(const std::string& name, const GemmProblem&) override {
    return find(name) ? Status::ok() : Status(StatusCode::kNotFound, "unknown tactic " + name);
  }

 private:
  const TacticDesc* find(const std::string& name) const {
    for (const auto& d : descs_)
      if (d.name == name) return &d;
    return nullptr;
  }
  DeviceCaps caps_;
  std::vector<TacticDesc> descs_;
};

}  // namespace

std::unique_ptr<TuningBackend> make_sim_tuning_backend(const std::string& profile) {
  return std::make_unique<SimTuningBackend>(profile);
}

}  // namespace fp4moe
