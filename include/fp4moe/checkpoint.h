// Loading a MoE layer from a Hugging Face checkpoint directory with ModelOpt NVFP4 names
// (shared/DESIGN.md section 2): model.layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.{weight,
// weight_scale, weight_scale_2, input_scale}, router model.layers.{L}.mlp.gate.weight [E, H] with optional
// model.layers.{L}.mlp.gate.e_score_correction_bias [E], optional shared expert
// model.layers.{L}.mlp.shared_experts.{gate_proj,up_proj,down_proj}.* (NVFP4 or bf16).
#pragma once
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/safetensors.h"
#include "fp4moe/weights.h"

namespace fp4moe {

// Reads dir/config.json (MoE fields) and checks dir/hf_quant_config.json or the config's
// quantization_config when present (quant_algo NVFP4, group_size 16).
MoeConfig read_checkpoint_config(const std::string& dir);

// Loads layer `layer`. Every tensor's dtype and shape is checked against the config; errors name the
// file, the tensor, expected vs found. Accepts weight_scale_2 of shape [] or [1].
MoeLayerWeights load_moe_layer(const std::string& dir, int layer);

// The MoE layers present in a checkpoint (layers with at least one expert tensor), sorted.
std::vector<int> list_moe_layers(const TensorStore& store);

// Writes a layer with ModelOpt names into `writer` (used by tests and tools to make small checkpoints).
void add_moe_layer_tensors(SafetensorsWriter& writer, const MoeLayerWeights& w, int layer);

}  // namespace fp4moe
