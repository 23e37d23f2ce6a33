// Device weights: upload from host tensors, generation of synthetic layers, layout packing.
#include "engine/device_weights.h"

#include <fmt/format.h>

#include <vector>

#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"
#include "engine/weight_layout.h"
#include "fp4moe/synthetic_values.h"

namespace fp4moe::engine {

namespace {

GemmProblem gemm_shape(GemmOp op, int64_t experts, int64_t n, int64_t k) {
  GemmProblem p;
  p.op = op;
  p.num_experts = experts;
  p.n = n;
  p.k = k;
  return p;
}

void throw_status(const Status& st) {
  if (!st.is_ok()) throw Error(st.code(), st.message());
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  FP4MOE_CUDA_THROW(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

// Allocates the canonical NVFP4 buffer and tensor scales of a GEMM with `experts` experts.
void allocate_nvfp4(DeviceGemmWeights& g, GemmOp op, int64_t experts, int64_t n, int64_t k, const std::string& what) {
  g.shape = gemm_shape(op, experts, n, k);
  g.bf16 = false;
  g.canonical = DeviceBuffer(static_cast<size_t>(canonical_weight_bytes(g.shape)), what + " weights");
  g.tensor_scales = DeviceBuffer(sizeof(float) * static_cast<size_t>(experts * (op == GemmOp::kFc1SwiGlu ? 2 : 1)),
                                 what + " tensor scales");
}

// Copies one NVFP4 projection [rows, k] into rows [row0, row0 + rows) of expert e of a canonical buffer.
void put_nvfp4(DeviceGemmWeights& g, int64_t e, int64_t row0, const LinearWeights& lw, const std::string& what) {
  FP4MOE_CHECK(lw.format == LinearWeights::Format::kNvfp4, StatusCode::kUnsupported,
               "{}: routed experts must be NVFP4; found a bf16 projection", what);
  const int64_t rows_total = weight_rows(g.shape), k = g.shape.k, E = g.shape.num_experts;
  uint8_t* base = g.canonical.as<uint8_t>();
  copy_to_device(base + canonical_codes_offset(e, rows_total, k) + row0 * (k / 2), lw.nvfp4.codes.data(),
                 lw.nvfp4.codes.size());
  copy_to_device(base + canonical_scales_offset(E, e, rows_total, k) + row0 * (k / 16), lw.nvfp4.scales.data(),
                 lw.nvfp4.scales.size());
}

void upload_mlp(DeviceGemmWeights& fc1, DeviceGemmWeights& fc2, int64_t e, const ExpertWeights& x,
                std::vector<float>& ts1, std::vector<float>& ts2, const std::string& name) {
  put_nvfp4(fc1, e, 0, x.gate, name + " gate_proj");
  put_nvfp4(fc1, e, fc1.shape.n, x.up, name + " up_proj");
  put_nvfp4(fc2, e, 0, x.down, name + " down_proj");
  ts1[2 * e] = x.gate.nvfp4.tensor_scale;
  ts1[2 * e + 1] = x.up.nvfp4.tensor_scale;
  ts2[e] = x.down.nvfp4.tensor_scale;
}

void upload_shared(const MoeLayerWeights& w, DeviceLayerWeights* out) {
  const ExpertWeights& s = *w.shared;
  const int64_t H = w.config.hidden, Is = s.gate.n;
  const auto fmt_of = [](const LinearWeights& l) { return l.format; };
  FP4MOE_CHECK(fmt_of(s.gate) == fmt_of(s.up) && fmt_of(s.up) == fmt_of(s.down), StatusCode::kUnsupported,
               "shared expert: gate_proj, up_proj and down_proj must share one format (NVFP4 or bf16)");
  if (s.gate.format == LinearWeights::Format::kNvfp4) {
    allocate_nvfp4(out->shared_fc1, GemmOp::kFc1SwiGlu, 1, Is, H, "shared expert fc1");
    allocate_nvfp4(out->shared_fc2, GemmOp::kFc2, 1, H, Is, "shared expert fc2");
    std::vector<float> ts1(2), ts2(1);
    upload_mlp(out->shared_fc1, out->shared_fc2, 0, s, ts1, ts2, "shared expert");
    copy_to_device(out->shared_fc1.tensor_scales.get(), ts1.data(), sizeof(float) * 2);
    copy_to_device(out->shared_fc2.tensor_scales.get(), ts2.data(), sizeof(float));
    return;
  }
  // bf16: [2Is, H] (gate rows then up rows) and [H, Is].
  out->shared_fc1.shape = gemm_shape(GemmOp::kFc1SwiGlu, 1, Is, H);
  out->shared_fc1.bf16 = true;
  out->shared_fc1.canonical = DeviceBuffer(sizeof(uint16_t) * static_cast<size_t>(2 * Is * H), "shared expert fc1 bf16");
  copy_to_device(out->shared_fc1.canonical.get(), s.gate.bf16.data(), sizeof(uint16_t) * s.gate.bf16.size());
  copy_to_device(out->shared_fc1.canonical.as<uint16_t>() + Is * H, s.up.bf16.data(), sizeof(uint16_t) * s.up.bf16.size());
  out->shared_fc2.shape = gemm_shape(GemmOp::kFc2, 1, H, Is);
  out->shared_fc2.bf16 = true;
  out->shared_fc2.canonical = DeviceBuffer(sizeof(uint16_t) * static_cast<size_t>(H * Is), "shared expert fc2 bf16");
  copy_to_device(out->shared_fc2.canonical.get(), s.down.bf16.data(), sizeof(uint16_t) * s.down.bf16.size());
}

}  // namespace

const void* DeviceGemmWeights::weights(WeightLayout layout) const {
  if (bf16 || layout == WeightLayout::kCanonical) return canonical.get();
  auto it = packed.find(layout);
  return it == packed.end() ? nullptr : it->second.get();
}

size_t DeviceGemmWeights::device_bytes() const {
  size_t b = canonical.bytes() + tensor_scales.bytes();
  for (const auto& kv : packed) b += kv.second.bytes();
  return b;
}

void DeviceGemmWeights::prepare(WeightLayout layout, Stream stream) {
  if (bf16 || layout == WeightLayout::kCanonical || packed.count(layout)) return;
  const WeightLayoutOps* ops = find_weight_layout_ops(layout);
  FP4MOE_CHECK(ops && ops->bytes && ops->pack, StatusCode::kInternal, "no packing routine for weight layout {}",
               weight_layout_name(layout));
  FP4MOE_CHECK(canonical.get() != nullptr, StatusCode::kInternal,
               "weight layout {} requested after the canonical weights were released", weight_layout_name(layout));
  DeviceBuffer dst(ops->bytes(shape), fmt::format("{} weights in layout {}", gemm_op_name(shape.op), weight_layout_name(layout)));
  throw_status(ops->pack(shape, canonical.get(), dst.get(), stream));
  packed.emplace(layout, std::move(dst));
}

void upload_layer(const MoeLayerWeights& w, const ExpertShard& shard, DeviceLayerWeights* out) {
  w.validate();
  const MoeConfig& c = w.config;
  const int64_t E = c.num_experts, H = c.hidden, I = c.inter, n = shard.count;
  FP4MOE_CHECK(static_cast<int64_t>(w.experts.size()) == E, StatusCode::kInvalidArgument,
               "layer has {} expert entries, config says {}", w.experts.size(), E);
  FP4MOE_CHECK(shard.first >= 0 && n >= 1 && shard.first + n <= E, StatusCode::kInternal,
               "expert shard [{}, {}) outside the layer's {} experts", shard.first, shard.first + n, E);
  allocate_nvfp4(out->fc1, GemmOp::kFc1SwiGlu, n, I, H, "routed fc1");
  allocate_nvfp4(out->fc2, GemmOp::kFc2, n, H, I, "routed fc2");
  std::vector<float> ts1(static_cast<size_t>(2 * n)), ts2(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = shard.first + i;
    const ExpertWeights& x = w.experts[static_cast<size_t>(e)];
    FP4MOE_CHECK(!x.empty(), StatusCode::kInvalidArgument,
                 "expert {} is not materialised; MoeEngine::create needs every expert {}", e,
                 shard.is_whole() ? std::string("of the layer")
                                  : fmt::format("of its shard [{}, {}) (ep_rank {} of ep_size {})", shard.first,
                                                shard.first + n, shard.rank, shard.size));
    upload_mlp(out->fc1, out->fc2, i, x, ts1, ts2, fmt::format("expert {}", e));
  }
  copy_to_device(out->fc1.tensor_scales.get(), ts1.data(), sizeof(float) * ts1.size());
  copy_to_device(out->fc2.tensor_scales.get(), ts2.data(), sizeof(float) * ts2.size());
  if (!w.router_weight.empty()) {
    out->router = DeviceBuffer(sizeof(float) * w.router_weight.size(), "router weight");
    copy_to_device(out->router.get(), w.router_weight.data(), sizeof(float) * w.router_weight.size());
  }
  if (!w.correction_bias.empty()) {
    out->bias = DeviceBuffer(sizeof(float) * w.correction_bias.size(), "correction bias");
    copy_to_device(out->bias.get(), w.correction_bias.data(), sizeof(float) * w.correction_bias.size());
  }
  if (shard.shared && w.shared && !w.shared->empty()) upload_shared(w, out);
}

namespace {

// Synthetic MLP weights of experts [e0, e0 + count) into rows of fc1/fc2 starting at expert slot 0.
void generate_mlp(uint64_t seed, int64_t e0, int64_t count, DeviceGemmWeights& fc1, DeviceGemmWeights& fc2,
                  std::vector<float>& ts1, std::vector<float>& ts2, Stream stream) {
  const int64_t I = fc1.shape.n, H = fc1.shape.k, E = fc1.shape.num_experts;
  uint8_t* b1 = fc1.canonical.as<uint8_t>();
  uint8_t* b2 = fc2.canonical.as<uint8_t>();
  const int64_t code1 = I * H / 2, scale1 = I * H / 16;  // one projection of fc1
  const int64_t stride_c1 = 2 * code1, stride_s1 = 2 * scale1;
  const int64_t code2 = H * I / 2, scale2 = H * I / 16;
  // gate rows, then up rows, of every expert
  throw_status(launch_synthetic_bytes(seed, e0, count, kSynGateCodes, false, b1, stride_c1, code1, stream));
  throw_status(launch_synthetic_bytes(seed, e0, count, kSynUpCodes, false, b1 + code1, stride_c1, code1, stream));
  throw_status(launch_synthetic_bytes(seed, e0, count, kSynGateScales, true, b1 + canonical_scales_offset(E, 0, 2 * I, H),
                                      stride_s1, scale1, stream));
  throw_status(launch_synthetic_bytes(seed, e0, count, kSynUpScales, true,
                                      b1 + canonical_scales_offset(E, 0, 2 * I, H) + scale1, stride_s1, scale1, stream));
  throw_status(launch_synthetic_bytes(seed, e0, count, kSynDownCodes, false, b2, code2, code2, stream));
  throw_status(launch_synthetic_bytes(seed, e0, count, kSynDownScales, true, b2 + canonical_scales_offset(E, 0, H, I),
                                      scale2, scale2, stream));
  for (int64_t i = 0; i < count; ++i) {
    ts1[static_cast<size_t>(2 * i)] = synthetic_tensor_scale(seed, e0 + i, kSynGateCodes, H);
    ts1[static_cast<size_t>(2 * i + 1)] = synthetic_tensor_scale(seed, e0 + i, kSynUpCodes, H);
    ts2[static_cast<size_t>(i)] = synthetic_tensor_scale(seed, e0 + i, kSynDownCodes, I);
  }
}

}  // namespace

void generate_synthetic_layer(const MoeConfig& c, const SyntheticSpec& spec, const ExpertShard& shard,
                              DeviceLayerWeights* out, Stream stream) {
  c.validate("synthetic layer config");
  const int64_t E = c.num_experts, H = c.hidden, I = c.inter, n = shard.count;
  FP4MOE_CHECK(shard.first >= 0 && n >= 1 && shard.first + n <= E, StatusCode::kInternal,
               "expert shard [{}, {}) outside the layer's {} experts", shard.first, shard.first + n, E);
  FP4MOE_CHECK(E <= 65535, StatusCode::kUnsupported, "synthetic layers support at most 65535 experts, got {}", E);
  allocate_nvfp4(out->fc1, GemmOp::kFc1SwiGlu, n, I, H, "routed fc1");
  allocate_nvfp4(out->fc2, GemmOp::kFc2, n, H, I, "routed fc2");
  std::vector<float> ts1(static_cast<size_t>(2 * n)), ts2(static_cast<size_t>(n));
  // Global experts [first, first + n) into local slots 0..n-1: the hash takes the global index.
  generate_mlp(spec.seed, shard.first, n, out->fc1, out->fc2, ts1, ts2, stream);
  copy_to_device(out->fc1.tensor_scales.get(), ts1.data(), sizeof(float) * ts1.size());
  copy_to_device(out->fc2.tensor_scales.get(), ts2.data(), sizeof(float) * ts2.size());
  out->router = DeviceBuffer(sizeof(float) * static_cast<size_t>(E * H), "router weight");
  throw_status(launch_synthetic_router(spec.seed, E, H, synthetic_router_scale(H), out->router.as<float>(), stream));
  if (c.has_correction_bias) {
    out->bias = DeviceBuffer(sizeof(float) * static_cast<size_t>(E), "correction bias");
    throw_status(launch_synthetic_bias(spec.seed, E, out->bias.as<float>(), stream));
  }
  if (shard.shared && c.n_shared_experts > 0 && c.shared_inter > 0) {
    const int64_t Is = c.shared_inter;
    allocate_nvfp4(out->shared_fc1, GemmOp::kFc1SwiGlu, 1, Is, H, "shared expert fc1");
    allocate_nvfp4(out->shared_fc2, GemmOp::kFc2, 1, H, Is, "shared expert fc2");
    std::vector<float> s1(2), s2(1);
    generate_mlp(spec.seed, kSyntheticSharedExpert, 1, out->shared_fc1, out->shared_fc2, s1, s2, stream);
    copy_to_device(out->shared_fc1.tensor_scales.get(), s1.data(), sizeof(float) * 2);
    copy_to_device(out->shared_fc2.tensor_scales.get(), s2.data(), sizeof(float));
  }
}

}  // namespace fp4moe::engine
