// gpumem — measuring the estimate on a GPU: the setup written back as the Hugging Face config.json
// it describes, and as a Python script that builds that model (random weights, nothing
// downloaded), trains the same two steps and prints PyTorch's peaks beside the estimate's
// (docs/snapshot.md, "Measure it on your GPU").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

// A transformer architecture as the config.json of the Hugging Face model type that has it
// (the inverse of ImportHfConfig: importing the text gives back `architecture` and `useCache`
// exactly, which HfConfigOf checks). An architecture whose fields no model type has together
// (a page edit: Phi-3's fused projections with Qwen3's q/k norms) is an error on
// "model.architecture".
struct HfConfigExport {
  std::string modelType;  // "llama", "gpt2", …
  std::string text;       // the config.json, two-space indented
  std::vector<FieldError> errors;
  bool ok() const { return errors.empty(); }
};
HfConfigExport HfConfigOf(const ArchitectureDef& architecture, bool useCache);

// The script for a valid one-GPU transformer setup and its estimate. What the script cannot run
// the way the estimate simulates it is an error naming the field (parallel layouts, quantized
// base weights, bitsandbytes optimizers, the savers torchtune and Megatron have): a script that
// measured something else would look like a disagreement.
struct MeasureScript {
  std::string fileName;  // "gpumem_measure_llama.py"
  std::string modelType;
  std::string script;    // Python 3 source, UTF-8
  std::vector<FieldError> errors;
  bool ok() const { return errors.empty(); }
};
MeasureScript MeasureScriptFor(const Setup& setup, const Estimate& estimate);

// Parse, validate, estimate (peaks only), then MeasureScriptFor:
// {"ok":true,"fileName","modelType","script"} or {"ok":false,"errors":[…]}.
std::string MeasureScriptJson(std::string_view setupText, int indent = -1);

}  // namespace gpumem
