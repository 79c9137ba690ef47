// gpumem — fine-tuning: frozen parameters, LoRA / DoRA adapters, quantized base weights.
//
// What each rule follows (read from the sources, cited where the rule is applied):
//   - PEFT (huggingface/peft): get_peft_model → LoraModel._mark_only_adapters_as_trainable (every
//     base parameter frozen), lora/layer.py Linear.forward and LoraLayer.update_layer (A [r, in],
//     B [out, r], scaling = lora_alpha / r), lora/dora.py DoraLinearLayer (magnitude [out]),
//     utils/other.py prepare_model_for_kbit_training, utils/constants.py
//     TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (default targets), tuners_utils.py
//     (target_modules matching on the module name's last components; "all-linear" = every
//     linear but the output layer).
//   - bitsandbytes: functional.py quantize_4bit / QuantState (blocksize 64, packed uint8 of two
//     4-bit codes, fp32 absmax per block; compress_statistics: the absmax quantized to 8 bits
//     with quantize_blockwise, blocksize 256, an fp32 absmax per 256 blocks, an fp32 offset and
//     the 256-entry fp32 code table); nn/modules.py Linear4bit / Params4bit, Int8Params and
//     Linear8bitLt (int8 weight CB [out, in] and fp32 row scales SCB [out]).
//   - transformers integrations/bitsandbytes.py replace_with_bnb_linear: nn.Linear (and GPT-2's
//     Conv1D) are replaced, except modules_to_not_convert (get_keys_to_not_convert: the output
//     head); embeddings and norms are no linears and stay.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "gpumem/dtype.hpp"
#include "gpumem/error.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/text.hpp"

namespace gpumem {

// Whether the setup asks for anything beyond plain training (a default FinetuneDef does not).
bool FinetuneActive(const FinetuneDef& f);

// Every problem with setup.finetune, named by JSON path ("finetune.r"). With `modelValid` (the
// model passed validation) the adapted inventory is built to check targets and that something trains.
void ValidateFinetune(const Setup& setup, std::vector<FieldError>& errors, bool modelValid);

// --- bitsandbytes layouts (bytes, exact) ---
constexpr std::int64_t kBnb4BitBlockSize = 64;        // quantize_4bit(blocksize=64), transformers' default
constexpr std::int64_t kBnbNestedBlockSize = 256;     // compress_statistics: quantize_blockwise(blocksize=256)
constexpr std::int64_t kBnb4BitCodeEntries = 16;      // get_4bit_type: the NF4 / FP4 code, fp32, per weight
// NF4 / FP4 weight of n elements (bitsandbytes functional.py quantize_4bit, QuantState):
//   plain:  ⌈n/2⌉ packed bytes + ⌈n/64⌉ fp32 absmax + the 16-entry fp32 code
//           → 0.5 + 4/64 = 0.5625 B per weight
//   double: ⌈n/2⌉ + ⌈n/64⌉ uint8 absmax + one fp32 offset + ⌈⌈n/64⌉/256⌉ fp32 nested absmax
//           + the code → 0.5 + 1/64 + 4/16384 ≈ 0.5159 B per weight (0.127 bit of statistics)
// With bnb_4bit_quant_storage of `storageBytes` per element the packed codes are
// (n + 1) / (2 · storageBytes) elements of that type (bitsandbytes backends/cuda/ops.py
// _quantize_4bit_impl: out = empty(((n + 1) // (quant_storage.itemsize * 2), 1))).
std::int64_t Nf4WeightBytes(std::int64_t elements, bool doubleQuant, std::int64_t storageBytes = 1);
// --- torchao's NF4Tensor (torchtune's QLoRA: LoRALinear(quantize_base=True) and FrozenNF4Linear
// hold their weight as torchao/dtypes/nf4tensor.py to_nf4(weight), block_size 64,
// scaler_block_size 256) ---
constexpr std::int64_t kTorchaoNf4BlockSize = 64;         // to_nf4(block_size=64)
constexpr std::int64_t kTorchaoNf4ScalerBlockSize = 256;  // to_nf4(scaler_block_size=256)
constexpr std::int64_t kTorchaoNf4TableEntries = 16;      // NF4Tensor.nf4: the 16-value lookup table
// NF4Tensor.from_tensor on n elements of dtype w bytes (n must be a multiple of 64 · 256:
// from_tensor and double_quantize_scalers assert it):
//   quantized_data      uint8 [n/2]        (convert_to_norm_float_weight: two codes a byte)
//   quantized_scalers   int8  [n/64]       (double_quantize_scalers: absmax per 64, minus their mean, ×256/(2·absmax per 256), round)
//   quantization_factor w     [n/16384]    (256 / (2 · scaler_absmax), in the input's dtype)
//   scaler_mean         w     scalar       (scalers_1.mean())
//   nf4                 w     [16]         (torch.tensor([...], dtype=input_tensor.dtype))
// The first three are what FSDP2 shards and all-gathers (_INNER_TENSOR_NAMES_FOR_SHARDING,
// fsdp_pre_all_gather); the last two stay whole beside every shard.
std::int64_t TorchaoNf4ShardedBytes(std::int64_t elements, std::int64_t weightBytes);   // the first three
std::int64_t TorchaoNf4MetadataBytes(std::int64_t weightBytes);                         // scaler_mean + nf4
// LLM.int8 weight [rows, cols]: rows·cols int8 + rows fp32 scales (SCB).
std::int64_t Int8WeightBytes(std::int64_t rows, std::int64_t cols);

// Bytes a parameter occupies on the GPU under the regime's weight dtype.
std::int64_t StoredBytes(const Tensor& p, DType regimeWeights);
// Whether it is a bitsandbytes weight (NF4 / FP4 / int8).
bool IsQuantized(const Tensor& p);
// Elements of the tensor torch holds as the parameter (what FSDP / ZeRO-3 flatten and shard):
// a 4-bit weight's packed codes in its quant storage type, an int8 weight's n values, else n;
// a torchao NF4Tensor's three sharded inner tensors as bytes (FSDP2 all-gathers inputs of mixed
// dtypes viewed as uint8: _fsdp_collectives.py foreach_all_gather).
std::int64_t StorageElements(const Tensor& p);
// Bytes of a quantized weight's statistics (absmax, nested absmax, code, int8 row scales), held
// beside the parameter in its QuantState (not a parameter: never flattened or sharded); 0 else.
std::int64_t QuantStatisticsBytes(const Tensor& p, DType regimeWeights);
// The dtype a parameter is read as by the forward: its own float dtype, the regime's, or for a
// quantized weight the compute dtype it is dequantized to.
DType ParameterType(const Tensor& p, DType regimeWeights, DType quantCompute);
// The dtype of its gradient and optimizer states (a parameter kept in its own float dtype keeps
// them in that dtype: torch.zeros_like, AccumulateGrad), and whether an fp32 master copy exists.
DType GradientTypeOf(const Tensor& p, DType regimeGradients);
DType StateTypeOf(const Tensor& p, DType regimeStates);
bool HasMasterCopy(const Tensor& p, bool regimeMaster);
// The formula "explain" shows for a parameter's storage: its shape × dtype, or the bitsandbytes
// layout of a quantized weight.
Text StorageFormula(TextStore& text, const Tensor& p, DType regimeWeights);

// The model-state row's formula: bytes by storage ("6,979,321,856 × 4-bit + 1,050,673,152 × 2 B
// + 3,407,872 adapters × 4 B").
std::string FinetuneParameterFormula(const Setup& setup, const Inventory& inventory);

// Whether a parameter is an input embedding (token, position or token-type: what
// freezeEmbeddings freezes), by its Hugging Face name.
bool IsEmbedding(std::string_view name);

// --- LoRA targets ---
// PEFT's default target_modules for the family (q_proj/v_proj, c_attn, query/value).
std::span<const char* const> DefaultTargetModules(Family family);
// The decoder's vocabulary projection as the model names it: lm_head, GPT-NeoX's embed_out.
const char* OutputModule(Family family);
// Whether the linear at module path `module` ("model.layers.0.self_attn.q_proj") is adapted.
bool IsLoraTarget(const FinetuneDef& f, Family family, std::string_view module);

// Freezes, adds adapters to and quantizes the inventory of a transformer, in place. The base
// weight of an adapted module is renamed "<module>.base_layer.weight" as PEFT names it; its
// adapters follow it: "<module>.lora_A.default.weight" [r, in], "<module>.lora_B.default.weight"
// [out, r] and with DoRA "<module>.lora_magnitude_vector.default.weight" [out].
void ApplyFinetune(const Setup& setup, Inventory& inventory);

// Upper bound of the extra trace events the adapters add per block (for the work budget).
double FinetuneEventsPerBlock(const Setup& setup);
// For the work budget too: whether a block's routed experts train their own weights (not under
// LoRA, which freezes every base weight, nor quantized), and the trained tensors the adapters
// add to a block (lora_A and lora_B per adapted linear, and DoRA's magnitude).
bool ExpertWeightsTrain(const FinetuneDef& f);
double AdapterTensorsPerBlock(const Setup& setup);

}  // namespace gpumem
