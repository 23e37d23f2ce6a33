// MoeEngine in builds without CUDA: every entry point says so (kUnsupported).
#include "fp4moe/engine.h"

namespace fp4moe {

namespace {
Status no_cuda() {
  return Status(StatusCode::kUnsupported, "this build of fp4moe has no CUDA backend (nvcc was not found at configure time)");
}
}  // namespace

Status MoeEngine::create(const MoeLayerWeights&, const EngineOptions&, std::unique_ptr<MoeEngine>* out) {
  if (out) out->reset();
  return no_cuda();
}

Status MoeEngine::create_synthetic(const MoeConfig&, const SyntheticSpec&, const EngineOptions&,
                                   std::unique_ptr<MoeEngine>* out) {
  if (out) out->reset();
  return no_cuda();
}

bool cuda_backend_available(std::string* why_not) {
  if (why_not) *why_not = no_cuda().message();
  return false;
}

}  // namespace fp4moe
