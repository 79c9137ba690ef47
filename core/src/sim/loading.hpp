// What loading a quantized model allocates and frees on one GPU, weight by weight (init phase).
//
// The caching allocator keeps the segments that loading's transients were cut from, so they set
// reserved memory and where later tensors land even though every transient is freed before the
// first forward. Sources (cited where each rule is applied in loading.cpp):
//   - bitsandbytes nn/modules.py Params4bit._quantize, Int8Params._quantize; functional.py
//     quantize_4bit, quantize_blockwise; backends/cuda/ops.py (quantize_4bit, quantize_blockwise,
//     int8_vectorwise_quant kernels' outputs).
//   - transformers quantizers/quantizer_bnb_4bit.py create_quantized_param: Params4bit(...).to(device).
//   - peft utils/other.py prepare_model_for_kbit_training; tuners/lora/layer.py
//     _move_adapter_to_device_of_base_layer (adapters placed after the model is loaded).
//   - torchao NF4Tensor.from_tensor, double_quantize_scalers, convert_to_norm_float_weight,
//     quantize_tensor_nearest, copy_ (nf4_tensor.py; torchao/dtypes/nf4tensor.py before 2026);
//     torchtune modules/peft/lora.py LoRALinear._create_weight_and_bias and the recipe
//     lora_finetune_single_device.py (_setup_model: build on the device, then load_state_dict).
#pragma once

#include <cstdint>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/text.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

// torchao nf4tensor.py CHUNK_SIZE (1024**2, "Note: Quantize in Chunks", torchao #196, 2024-05-01):
// quantize_tensor_nearest runs on this many values at a time. 0 = the whole weight at once, as
// torchao did before that change (torchao 0.1, torchtune's April 2024 figures).
constexpr std::int64_t kTorchaoNf4QuantizeChunk = std::int64_t{1} << 20;

// Whether loading this setup's model is simulated event by event (bitsandbytes or torchao
// quantized weights, or prepare_model_for_kbit_training's casts); otherwise every parameter is
// allocated in its stored form, as before.
bool LoadingSimulated(const Setup& setup);

// The one-GPU init's parameters as the loaders allocate them: the stored form of each parameter
// (Category::Parameters, StoredBytes, exactly what the plain init allocates) and the loaders'
// transients (Category::WeightCopies, all freed before this returns), labelled "loading: …".
// `torchaoChunk` is kTorchaoNf4QuantizeChunk but for tests of the older, unchunked source.
void AllocParametersAsLoaded(TraceBuilder& b, const Setup& setup, const Inventory& inventory,
                             const std::vector<Text>& names, DType regimeWeights,
                             std::int64_t torchaoChunk = kTorchaoNf4QuantizeChunk);

}  // namespace gpumem
