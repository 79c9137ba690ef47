// What you will do: the training modes the page offers and "Make it fit" tries, one table in the
// core (issue 11). Each mode is a `finetune` section; its adapters follow torchtune's
// single-device recipes, written with PEFT's and bitsandbytes' names.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/setup.hpp"

namespace gpumem {

struct TrainingMode {
  const char* id;      // "full", "lora", "qlora"
  const char* label;   // for people
  const char* source;  // the recipe it follows: file and settings
  bool lora = false;   // LoRA adapters (r 8, lora_alpha 16, dropout 0, the recipe's targets)
  bool nf4 = false;    // NF4 base weights, double quantization, bf16 compute (QLoRA)
};

// Every mode, "full" first (the default: every parameter trains).
std::span<const TrainingMode> TrainingModes();
// The mode of that id, or nullptr.
const TrainingMode* FindTrainingMode(std::string_view id);
// The `finetune` section the mode sets for a family; every field it does not name keeps
// FinetuneDef's default. Targets: for Llama, torchtune's lora_attn_modules [q_proj, v_proj,
// output_proj] with apply_lora_to_mlp (HF: q_proj, v_proj, o_proj, gate_proj, up_proj,
// down_proj); GPT-2 and BERT have no such split names, so PEFT's "all-linear".
FinetuneDef TrainingModeFinetune(const TrainingMode& mode, Family family);
// Sets the fields the mode names on `f`, keeping the others (frozen modules, adapter dtype).
void ApplyTrainingMode(const TrainingMode& mode, Family family, FinetuneDef& f);
// The `finetune.*` fields a mode changes from the defaults (what a suggestion says it changed).
std::vector<std::string> TrainingModeFields(const TrainingMode& mode);

}  // namespace gpumem
