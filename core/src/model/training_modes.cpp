// The one list of training modes (gpumem/training_modes.hpp): the page's "What you will do"
// select (OptionsJson's trainingModes) and the solver's LoRA / QLoRA suggestions read it.
#include "gpumem/training_modes.hpp"

namespace gpumem {
namespace {

// torchtune recipes/configs/llama3/8B_lora_single_device.yaml (lora_attn_modules: [q_proj,
// v_proj, output_proj], apply_lora_to_mlp: True, apply_lora_to_output: False, lora_rank: 8,
// lora_alpha: 16, lora_dropout: 0.0) and 8B_qlora_single_device.yaml (the same on
// torchtune.models.llama3.qlora_llama3_8b: NF4 base weights). As transformers and bitsandbytes
// write QLoRA (the QLoRA paper's recipe): BitsAndBytesConfig(load_in_4bit=True,
// bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16).
constexpr TrainingMode kModes[] = {
    {"full", "Full training (every parameter learns)", "every parameter trains: no finetune section", false, false},
    {"lora", "LoRA adapters (r 8, alpha 16, attention and MLP projections; base weights frozen)",
     "torchtune recipes/configs/llama3/8B_lora_single_device.yaml (lora_rank 8, lora_alpha 16, "
     "lora_attn_modules q_proj/v_proj/output_proj, apply_lora_to_mlp); PEFT LoraConfig names",
     true, false},
    {"qlora", "QLoRA (NF4 base weights with double quantization, bf16 compute, LoRA r 8)",
     "torchtune recipes/configs/llama3/8B_qlora_single_device.yaml (qlora_llama3_8b: NF4 base weights); "
     "bitsandbytes BitsAndBytesConfig load_in_4bit, nf4, double quant, bf16 compute",
     true, true},
};

}  // namespace

std::span<const TrainingMode> TrainingModes() { return kModes; }

const TrainingMode* FindTrainingMode(std::string_view id) {
  for (const TrainingMode& m : kModes) {
    if (id == m.id) return &m;
  }
  return nullptr;
}

FinetuneDef TrainingModeFinetune(const TrainingMode& mode, Family family) {
  FinetuneDef f;
  ApplyTrainingMode(mode, family, f);
  return f;
}

void ApplyTrainingMode(const TrainingMode& mode, Family family, FinetuneDef& f) {
  if (!mode.lora) return;
  f.lora = true;
  f.r = 8;
  f.loraAlpha = 16;
  f.loraDropout = 0;
  // Phi-3's fused projections are named qkv_proj and gate_up_proj (its PEFT recipes target those
  // with o_proj and down_proj); a name that matches no module is skipped, as PEFT does while
  // another one matches.
  f.targetModules = family == Family::Llama
                        ? std::vector<std::string>{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj", "qkv_proj", "gate_up_proj"}
                        : std::vector<std::string>{"all-linear"};
  if (mode.nf4) {
    f.quantization = Quantization::NF4;
    f.doubleQuant = true;
    f.computeDType = DType::BF16;
  }
}

std::vector<std::string> TrainingModeFields(const TrainingMode& mode) {
  std::vector<std::string> fields;
  if (mode.lora) {
    fields = {"finetune.lora", "finetune.r", "finetune.loraAlpha", "finetune.loraDropout", "finetune.targetModules"};
  }
  if (mode.nf4) fields.insert(fields.end(), {"finetune.quantization", "finetune.doubleQuant", "finetune.computeDType"});
  return fields;
}

}  // namespace gpumem
