// The presets, transcribed from each model's config.json (the Hugging Face repository named
// in `source`). Only fields that differ from DefaultArchitecture(family) are set.
#include "gpumem/presets.hpp"

#include <string>
#include <vector>

#include "gpumem/inventory.hpp"

namespace gpumem {
namespace {

std::vector<Preset> MakePresets() {
  std::vector<Preset> out;
  auto add = [&](const char* id, const char* label, const char* source, ArchitectureDef a,
                 std::int64_t published, const char* countedAs = "all parameters (tied head counted once)") {
    out.push_back({id, label, source, a, published, countedAs});
  };

  ArchitectureDef gpt2 = DefaultArchitecture(Family::GPT2);
  add("gpt2", "GPT-2 (124M)", "openai-community/gpt2", gpt2, 124'439'808);

  ArchitectureDef gpt2xl = gpt2;
  gpt2xl.hiddenSize = 1600; gpt2xl.numLayers = 48; gpt2xl.numHeads = 25;
  add("gpt2-xl", "GPT-2 XL (1.5B)", "openai-community/gpt2-xl", gpt2xl, 1'557'611'200);

  ArchitectureDef bertLarge = DefaultArchitecture(Family::BERT);
  bertLarge.hiddenSize = 1024; bertLarge.numLayers = 24; bertLarge.numHeads = 16;
  bertLarge.intermediateSize = 4096;
  add("bert-large-uncased", "BERT-large uncased (335M), classification",
      "google-bert/bert-large-uncased", bertLarge, 335'141'888,
      "BertModel with its pooler, without the classifier");

  ArchitectureDef llama2 = DefaultArchitecture(Family::Llama);
  add("llama-2-7b", "Llama 2 7B", "meta-llama/Llama-2-7b-hf", llama2, 6'738'415'616);

  ArchitectureDef mistral = llama2;
  mistral.numKeyValueHeads = 8; mistral.intermediateSize = 14336;
  add("mistral-7b-v0.1", "Mistral 7B v0.1", "mistralai/Mistral-7B-v0.1", mistral, 7'241'732'096);

  ArchitectureDef llama3 = mistral;
  llama3.vocabSize = 128256;
  add("llama-3-8b", "Llama 3 8B", "meta-llama/Meta-Llama-3-8B", llama3, 8'030'261'248);

  ArchitectureDef qwen = llama2;
  qwen.vocabSize = 151936; qwen.hiddenSize = 1536; qwen.numLayers = 28; qwen.numHeads = 12;
  qwen.numKeyValueHeads = 2; qwen.intermediateSize = 8960; qwen.tieWordEmbeddings = true;
  qwen.attentionBias = true;
  add("qwen2.5-1.5b", "Qwen2.5 1.5B", "Qwen/Qwen2.5-1.5B", qwen, 1'543'714'304);

  ArchitectureDef mixtral = mistral;
  mixtral.numExperts = 8; mixtral.expertsPerToken = 2;
  add("mixtral-8x7b", "Mixtral 8x7B", "mistralai/Mixtral-8x7B-v0.1", mixtral, 46'702'792'704);
  return out;
}

}  // namespace

std::span<const Preset> Presets() {
  static const std::vector<Preset> presets = MakePresets();
  return presets;
}

const Preset* FindPreset(std::string_view id) {
  for (const Preset& p : Presets()) if (id == p.id) return &p;
  return nullptr;
}

std::int64_t PublishedScopeParameterCount(const Setup& setup) {
  std::int64_t n = 0;
  for (const Tensor& t : BuildInventory(setup).parameters) {
    if (t.name.starts_with("classifier.") || t.name.starts_with("cls.")) continue;
    n += t.Elements();
  }
  return n;
}

}  // namespace gpumem
