// Tuning work units: their JSON form (they travel to the worker child), executing one in this process,
// and the registry of tuning backends (the child re-creates its backend by name).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "work.h"

namespace fp4moe {

namespace {
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, TuningBackendFactory>& registry() {
  static std::map<std::string, TuningBackendFactory> r;
  return r;
}
}  // namespace

void register_tuning_backend(const std::string& name, TuningBackendFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::move(factory);
}

std::unique_ptr<TuningBackend> make_tuning_backend(const std::string& name, const std::string& arg) {
  TuningBackendFactory factory;
  std::string known;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (name == "cuda" && registry().count("cuda") == 0) {
      registry()["cuda"] = [](const std::string& a) {
        int device = 0;
        try {
          device = std::stoi(a.empty() ? "0" : a);
        } catch (const std::exception&) {
          throw Error(StatusCode::kInvalidArgument, fmt::format("cuda tuning backend: bad device index '{}'", a));
        }
        return make_cuda_tuning_backend(device);
      };
    }
    if (name == "sim" && registry().count("sim") == 0)
      registry()["sim"] = [](const std::string& a) { return make_sim_tuning_backend(a); };
    auto it = registry().find(name);
    if (it != registry().end()) factory = it->second;
    for (const auto& kv : registry()) known += (known.empty() ? "" : ", ") + kv.first;
  }
  FP4MOE_CHECK(factory, StatusCode::kInvalidArgument, "unknown tuning backend '{}'; known: {}", name, known);
  auto backend = factory(arg);
  FP4MOE_CHECK(backend != nullptr, StatusCode::kInternal, "tuning backend '{}' factory returned nothing", name);
  return backend;
}

namespace tuner_detail {

const char* unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::kInit: return "init";
    case UnitKind::kTime: return "time";
    case UnitKind::kVerify: return "verify";
  }
  return "?";
}

std::string WorkUnit::describe() const {
  std::string s = fmt::format("{} {} {}", unit_kind_name(kind), tactic, gemm_op_name(problem.op));
  if (kind == UnitKind::kTime) s += fmt::format(" tokens={}", tokens);
  return s;
}

bool gemm_op_from_name(const std::string& name, GemmOp* op) {
  for (GemmOp o : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    if (name == gemm_op_name(o)) {
      *op = o;
      return true;
    }
  }
  return false;
}

nlohmann::json problem_to_json(const GemmProblem& p) {
  return {{"op", gemm_op_name(p.op)}, {"experts", p.num_experts}, {"n", p.n},
          {"k", p.k}, {"rows", p.total_rows}, {"max_rows_per_expert", p.max_rows_per_expert}};
}

GemmProblem problem_from_json(const nlohmann::json& j) {
  GemmProblem p;
  try {
    FP4MOE_CHECK(gemm_op_from_name(j.at("op").get<std::string>(), &p.op), StatusCode::kFormatError,
                 "unknown op '{}'", j.at("op").get<std::string>());
    p.num_experts = j.at("experts").get<int64_t>();
    p.n = j.at("n").get<int64_t>();
    p.k = j.at("k").get<int64_t>();
    p.total_rows = j.at("rows").get<int64_t>();
    p.max_rows_per_expert = j.at("max_rows_per_expert").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kFormatError, fmt::format("bad problem in tuner message: {}", e.what()));
  }
  return p;
}

UnitOutcome execute_unit(TuningBackend& backend, const WorkUnit& unit, std::vector<std::string>& inited) {
  UnitOutcome out;
  out.ran = true;
  const std::string init_key = unit.tactic + "/" + gemm_op_name(unit.problem.op);
  const bool was_inited = std::find(inited.begin(), inited.end(), init_key) != inited.end();
  // A backend that throws is reported like one that returns an error.
  auto guarded = [&](auto&& f) -> Status {
    return status_from([&] { f().throw_if_error(); });
  };
  if (unit.kind == UnitKind::kInit || !was_inited) {
    Status st = guarded([&] { return backend.init(unit.tactic, unit.problem); });
    if (!st.is_ok()) {
      out.status = Status(st.code(), fmt::format("init: {}", st.message()));
      return out;
    }
    inited.push_back(init_key);
    if (unit.kind == UnitKind::kInit) return out;
  }
  if (unit.kind == UnitKind::kTime) {
    double ms = 0;
    out.status = guarded([&] { return backend.time(unit.tactic, unit.problem, unit.tokens, &ms); });
    out.ms = ms;
  } else {
    out.status = guarded([&] { return backend.verify(unit.tactic, unit.problem); });
  }
  return out;
}

}  // namespace tuner_detail
}  // namespace fp4moe
