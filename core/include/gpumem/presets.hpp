// gpumem — presets: published architectures, each with the parameter count its publisher states.
//
// Every preset is transcribed from the model's own config.json; a test checks that the
// inventory built from it reproduces the published count exactly.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "gpumem/setup.hpp"

namespace gpumem {

struct Preset {
  const char* id;      // stable identifier for JSON and URLs: "llama-2-7b"
  const char* label;   // what a person reads: "Llama 2 7B"
  const char* source;  // where the configuration comes from (Hugging Face repository)
  ArchitectureDef architecture;
  // Parameters as published (model card / checkpoint metadata). For BERT this is BertModel
  // with its pooler, without the task head the preset trains.
  std::int64_t publishedParameters = 0;
  const char* countedAs;  // which tensors the published count covers
  const char* note = "";  // how the simulation approximates the model, when it does
  // Tokens per sample when a setup names the preset and gives no sequenceLength: the length
  // the model was published for (GPT-2's 1024 and BERT's 512 positions, Llama 2's 4096,
  // TinyLlama's 2048), capped at 4096 for models with longer contexts (Llama 3's 8192,
  // Mistral's and Qwen's 32k+), a typical fine-tuning length whose estimate stays quick.
  std::int64_t defaultSequenceLength = 1024;
};

std::span<const Preset> Presets();
const Preset* FindPreset(std::string_view id);  // nullptr when unknown

// Parameters of an inventory that the published count covers: all of them, except a BERT
// task head (classifier.*, cls.*).
std::int64_t PublishedScopeParameterCount(const Setup& setup);

}  // namespace gpumem
