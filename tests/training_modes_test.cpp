// The one list of training modes (gpumem/training_modes.hpp): what the page's "What you will do"
// offers (OptionsJson's trainingModes) is what "Make it fit" suggests, recipe for recipe.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"
#include "gpumem/training_modes.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup OnCard(const char* preset, double gib) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset(preset)->architecture;
  s.training.sequenceLength = 512;  // within BERT's positions
  s.gpu.memoryGiB = gib;
  return s;
}

}  // namespace

TEST_CASE("the training modes are full then torchtune's LoRA and QLoRA recipes", "[modes]") {
  const auto modes = TrainingModes();
  REQUIRE(modes.size() == 3);
  CHECK(std::string(modes[0].id) == "full");
  CHECK(TrainingModeFinetune(modes[0], Family::Llama) == FinetuneDef{});  // full: the defaults
  const TrainingMode* lora = FindTrainingMode("lora");
  const TrainingMode* qlora = FindTrainingMode("qlora");
  REQUIRE(lora);
  REQUIRE(qlora);
  CHECK(FindTrainingMode("dora") == nullptr);
  const FinetuneDef l = TrainingModeFinetune(*lora, Family::Llama);
  CHECK(l.lora);
  CHECK(l.r == 8);
  CHECK(l.loraAlpha == 16);
  CHECK(l.loraDropout == 0);
  CHECK(l.targetModules == std::vector<std::string>{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                                   "qkv_proj", "gate_up_proj"});
  CHECK(l.quantization == Quantization::None);
  CHECK(TrainingModeFinetune(*lora, Family::GPT2).targetModules == std::vector<std::string>{"all-linear"});
  const FinetuneDef q = TrainingModeFinetune(*qlora, Family::Llama);
  CHECK(q.quantization == Quantization::NF4);
  CHECK(q.doubleQuant);
  CHECK(q.computeDType == DType::BF16);
  CHECK(q.targetModules == l.targetModules);
  // Every mode is a valid setup for every family's preset.
  for (const char* preset : {"gpt2", "llama-3.2-1b", "bert-base-uncased"}) {
    for (const TrainingMode& m : modes) {
      Setup s = OnCard(preset, 80);
      s.finetune = TrainingModeFinetune(m, s.model.architecture.family);
      INFO(preset << " " << m.id);
      CHECK(Validate(s).empty());
    }
  }
  // Applying a mode keeps what it does not name.
  FinetuneDef frozen;
  frozen.freezeEmbeddings = true;
  ApplyTrainingMode(*lora, Family::Llama, frozen);
  CHECK(frozen.freezeEmbeddings);
  CHECK(frozen.targetModules == l.targetModules);
}

TEST_CASE("make it fit suggests exactly the table's LoRA and QLoRA", "[modes][solve]") {
  for (const char* preset : {"llama-3-8b", "gpt2-xl"}) {
    Setup s = OnCard(preset, std::string(preset) == "gpt2-xl" ? 8 : 24);
    const Family family = s.model.architecture.family;
    const SolveResult r = Solve(s);
    REQUIRE(r.ok());
    for (const char* id : {"lora", "qlora"}) {
      INFO(preset << " " << id);
      const FitSuggestion* f = Suggestion(r, std::string("finetune-") + id);
      REQUIRE(f);
      const TrainingMode& mode = *FindTrainingMode(id);
      CHECK(f->setup.finetune == TrainingModeFinetune(mode, family));
      CHECK(f->changedFields == TrainingModeFields(mode));
      CHECK(f->label.find(mode.label) != std::string::npos);
    }
  }
}

TEST_CASE("the options carry the training modes with their finetune section per family", "[modes]") {
  const nlohmann::json options = nlohmann::json::parse(OptionsJson(-1));
  const auto& modes = options.at("trainingModes");
  REQUIRE(modes.size() == TrainingModes().size());
  for (std::size_t i = 0; i < modes.size(); ++i) {
    const TrainingMode& mode = TrainingModes()[i];
    CHECK(modes[i].at("id") == mode.id);
    CHECK(modes[i].at("label") == mode.label);
    CHECK(!modes[i].at("source").get<std::string>().empty());
    for (const auto& family : NamesOf(Family{})) {
      INFO(mode.id << " " << family.id);
      // The section the page writes reads back as the table's.
      nlohmann::json setup = {{"model", {{"preset", family.value == Family::Llama ? "llama-3.2-1b" : family.value == Family::GPT2 ? "gpt2" : "bert-base-uncased"}}},
                              {"finetune", modes[i].at("finetuneByFamily").at(family.id)}};
      Setup parsed;
      REQUIRE(ParseAndValidate(setup.dump(), parsed).empty());
      CHECK(parsed.finetune == TrainingModeFinetune(mode, family.value));
    }
  }
}
