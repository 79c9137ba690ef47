// gpumem — reading what people already have: a Hugging Face config.json, a safetensors header
// or a model.safetensors.index.json. Offline, in the core; errors are values naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

// A config.json read into an architecture. Fields the estimator does not use are listed, not
// refused (rope_theta, torch_dtype, …); missing required ones are errors ("config.hidden_size").
struct ConfigImport {
  ArchitectureDef architecture;
  std::string modelType;                 // config's model_type ("llama", "gpt2", …)
  bool useCache = true;                  // config's use_cache (transformers' default True)
  std::vector<std::string> ignoredFields;
  std::vector<std::string> notes;        // how the config was read (e.g. Gemma with Llama's block)
  std::vector<FieldError> errors;
  bool ok() const { return errors.empty(); }
};
ConfigImport ImportHfConfig(std::string_view text);

// The quantization_config block of a config.json (transformers BitsAndBytesConfig:
// load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype,
// load_in_8bit) read into finetune's quantization fields; `found` is false without the block.
// Errors name "config.quantization_config.<key>".
struct QuantizationImport {
  bool found = false;
  FinetuneDef finetune;             // only quantization, doubleQuant and computeDType set
  std::vector<std::string> notes;
  std::vector<FieldError> errors;
};
QuantizationImport ImportQuantizationConfig(std::string_view configText);

// A PEFT adapter_config.json (LoraConfig saved by save_pretrained): peft_type LORA, r,
// lora_alpha, lora_dropout, target_modules, use_dora, into finetune's LoRA fields (lora = true).
// Fields that do not change memory are listed as ignored; errors name "adapter.<key>".
struct AdapterImport {
  FinetuneDef finetune;
  std::vector<std::string> ignoredFields;
  std::vector<std::string> notes;
  std::vector<FieldError> errors;
  bool ok() const { return errors.empty(); }
};
AdapterImport ImportAdapterConfig(std::string_view text);

// The tensors of a checkpoint, from a safetensors header (names, dtypes, shapes: an exact
// count) or from an index (names and total bytes only).
struct SafetensorsImport {
  bool fromHeader = false;                   // header: exact shapes; index: names and bytes
  std::optional<std::int64_t> parameterCount;  // Σ elements (header only)
  std::int64_t totalSizeBytes = 0;           // header: Σ tensor bytes; index: metadata.total_size
  std::int64_t tensorCount = 0;
  std::vector<std::pair<std::string, std::int64_t>> dtypes;  // dtype → tensors
  std::vector<MatrixShape> largestMatrices;  // the largest 2-D tensors, largest first (≤ 8)
  std::vector<std::string> largestNames;
  std::int64_t numLayers = 0;                // 1 + the largest block index in the names, 0 if none
  std::vector<std::string> notes;
  std::vector<FieldError> errors;
  bool ok() const { return errors.empty(); }
};
SafetensorsImport ImportSafetensors(std::string_view text);

}  // namespace gpumem
