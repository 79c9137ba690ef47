// The measuring script (gpumem/measure.hpp): the setup written back as the config.json of its
// Hugging Face model type, and the Python that measures it on a GPU.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "gpumem/import.hpp"
#include "gpumem/json.hpp"
#include "gpumem/measure.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup PresetSetup(std::string_view id) {
  const Preset* p = FindPreset(id);
  REQUIRE(p != nullptr);
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = p->architecture;
  s.training.sequenceLength = 256;
  return s;
}

std::string ReadData(const std::string& name) {
  std::ifstream in(std::string(GPUMEM_TEST_DATA) + "/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("every preset is written back as the config.json it was read from", "[measure][config]") {
  // HfConfigOf imports its own text again and compares: ok() means the architecture came back
  // field for field. The model type is the one the preset's own config.json names.
  const std::pair<const char*, const char*> types[] = {
      {"gpt2", "gpt2"},
      {"pythia-1b", "gpt_neox"},
      {"bert-base-uncased", "bert"},
      {"llama-3.2-1b", "llama"},
      {"mistral-7b-v0.1", "mistral"},
      {"qwen2.5-7b", "qwen2"},
      {"qwen3-8b", "qwen3"},
      {"gemma-2b", "gemma"},
      {"gemma-2-9b", "gemma2"},
      {"gemma-3-1b", "gemma3_text"},
      {"phi-3-mini-4k", "phi3"},
      {"olmo-2-7b", "olmo2"},
      {"granite-3.1-8b", "granite"},
      {"smollm3-3b", "smollm3"},
      {"mixtral-8x7b", "mixtral"},
      {"qwen1.5-moe-a2.7b", "qwen2_moe"},
  };
  for (const auto& [preset, type] : types) {
    INFO(preset);
    const HfConfigExport e = HfConfigOf(FindPreset(preset)->architecture, true);
    REQUIRE(e.ok());
    CHECK(e.modelType == type);
  }
  for (const Preset& p : Presets()) {
    INFO(p.id);
    for (const bool useCache : {true, false}) {
      const HfConfigExport e = HfConfigOf(p.architecture, useCache);
      CHECK(e.ok());
      const ConfigImport back = ImportHfConfig(e.text);
      // The config spells out the sizes 0 stands for: the head size, key/value heads, the MLP's
      // width (GPT-2 leaves n_inner null, which means the same 4 × hidden).
      ArchitectureDef spelled = p.architecture, read = back.architecture;
      for (ArchitectureDef* a : {&spelled, &read}) {
        if (a->family == Family::Llama) {
          a->headDim = HeadDim(*a);
          a->numKeyValueHeads = KeyValueHeads(*a);
          if (a->numExperts > 0) a->expertIntermediateSize = ExpertIntermediateSize(*a);
        }
        a->intermediateSize = IntermediateSize(*a);
      }
      CHECK(read == spelled);
      CHECK(back.useCache == useCache);
    }
  }
}

TEST_CASE("published config.json files come back with their own model type", "[measure][config]") {
  for (const char* name : {"gpt2", "llama-2-7b", "qwen2.5-1.5b", "mixtral-8x7b", "gemma-2-9b", "gemma-3-1b",
                           "olmo-2-1124-7b", "bert-base-uncased"}) {
    INFO(name);
    const ConfigImport original = ImportHfConfig(ReadData(std::string("configs/") + name + ".json"));
    REQUIRE(original.ok());
    const HfConfigExport e = HfConfigOf(original.architecture, original.useCache);
    REQUIRE(e.ok());
    CHECK(e.modelType == original.modelType);
  }
}

TEST_CASE("sizes the simulation defaults are written out, not left to the config class", "[measure][config]") {
  // 0 stands for the simulation's default (4 × hidden for the MLP, hidden / heads per head); the
  // config classes have their own (Gemma: head_dim 256) or build nothing (intermediate_size 0).
  ArchitectureDef a = FindPreset("gemma-2b")->architecture;
  a.headDim = 0;
  a.intermediateSize = 0;
  const HfConfigExport e = HfConfigOf(a, true);
  REQUIRE(e.ok());
  CHECK(e.text.find("\"head_dim\": " + std::to_string(a.hiddenSize / a.numHeads) + ",") != std::string::npos);
  CHECK(e.text.find("\"intermediate_size\": " + std::to_string(4 * a.hiddenSize) + ",") != std::string::npos);
  ArchitectureDef moe = FindPreset("qwen1.5-moe-a2.7b")->architecture;
  moe.expertIntermediateSize = 0;
  const HfConfigExport m = HfConfigOf(moe, true);
  REQUIRE(m.ok());
  CHECK(m.text.find("\"moe_intermediate_size\": " + std::to_string(ExpertIntermediateSize(moe)) + ",") != std::string::npos);
}

TEST_CASE("an architecture no model type has is refused, naming the fields", "[measure][config]") {
  ArchitectureDef a = FindPreset("phi-3-mini-4k")->architecture;
  a.queryKeyNorm = true;  // Phi-3's fused projections with Qwen3's q/k norms: no such model
  const HfConfigExport e = HfConfigOf(a, true);
  REQUIRE_FALSE(e.ok());
  CHECK(e.errors.front().field == "model.architecture");
  CHECK_THAT(e.errors.front().message, Catch::Contains("phi3 (the nearest) differs in queryKeyNorm"));
  ArchitectureDef m = FindPreset("mistral-7b-v0.1")->architecture;
  m.attentionBias = true;  // MistralAttention takes no biases; Qwen2's are on q/k/v only
  m.outputBias = true;
  const HfConfigExport mistral = HfConfigOf(m, true);
  REQUIRE_FALSE(mistral.ok());
  CHECK_THAT(mistral.errors.front().message, Catch::Contains("attentionBias"));
}

TEST_CASE("the script carries the setup's training and the estimate's figures", "[measure][script]") {
  Setup s = PresetSetup("llama-3.2-1b");
  s.training.precision = Precision::AmpBF16;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.training.useReentrant = false;
  s.training.batchSize = 4;
  s.training.sequenceLength = 2048;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.optimizerImplementation = OptimizerImplementation::Fused;
  s.runtime.allocator.expandableSegments = true;
  s.gpu.id = "nvidia-h100-sxm";
  const Estimate est = MustEstimate(s);
  const MeasureScript m = MeasureScriptFor(s, est);
  REQUIRE(m.ok());
  CHECK(m.fileName == "gpumem_measure_llama.py");
  const std::string& py = m.script;
  for (const std::string line : {"PRECISION = \"ampBf16\"", "ATTENTION = \"sdpa\"", "BATCH, SEQUENCE = 4, 2048",
                                 "CHECKPOINTING = True", "USE_REENTRANT = False", "OPTIMIZER = \"adamw\"",
                                 "IMPLEMENTATION = \"fused\"", "ZERO_GRAD_SET_TO_NONE = True", "LORA = json.loads(\"null\")",
                                 "os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"",
                                 "\"model_type\": \"llama\"", "\"num_key_value_heads\": 8", "\"head_dim\": 64",
                                 "\"use_cache\": true",
                                 "\"gpu\": \"NVIDIA H100 SXM 80 GB\""}) {
    INFO(line);
    CHECK(py.find(line) != std::string::npos);
  }
  // The predicted figures are the estimate's, byte for byte.
  CHECK(py.find("\"peakAllocatedBytes\": " + std::to_string(est.device.peakAllocatedBytes) + ",") != std::string::npos);
  CHECK(py.find("\"peakReservedBytes\": " + std::to_string(est.device.peakReservedBytes) + ",") != std::string::npos);
  CHECK(py.find("\"peakDeviceBytes\": " + std::to_string(est.device.peakDeviceBytes) + ",") != std::string::npos);
  CHECK(py.find("\"capacityBytes\": " + std::to_string(est.device.capacityBytes) + ",") != std::string::npos);
  // No token left unreplaced.
  CHECK(py.find("@") == std::string::npos);
}

TEST_CASE("LoRA goes to PEFT with the modules the estimate adapts", "[measure][script]") {
  Setup s = PresetSetup("qwen2.5-0.5b");
  s.training.precision = Precision::BF16;
  s.finetune.lora = true;
  s.finetune.r = 16;
  s.finetune.loraAlpha = 32;
  s.finetune.adapterDType = AdapterDType::Weights;
  const MeasureScript m = MeasureScriptFor(s, MustEstimate(s));
  REQUIRE(m.ok());
  CHECK(m.modelType == "qwen2");
  // PEFT's own default would do here; the estimate's resolution is written out all the same.
  CHECK(m.script.find(R"(\"target_modules\":[\"q_proj\",\"v_proj\"])") != std::string::npos);
  CHECK(m.script.find(R"(\"r\":16)") != std::string::npos);
  CHECK(m.script.find("ADAPTERS_IN_FP32 = False") != std::string::npos);
  CHECK(m.script.find("transformers, peft (0.12 or later).") != std::string::npos);
}

TEST_CASE("bitsandbytes' optimizers, Adafactor and gradient accumulation are scripted", "[measure][script]") {
  Setup s = PresetSetup("gpt2");
  s.training.precision = Precision::AmpBF16;
  s.training.optimizer = OptimizerKind::PagedAdamW8bit;
  s.parallel.gradientAccumulationSteps = 4;
  const MeasureScript m = MeasureScriptFor(s, MustEstimate(s));
  REQUIRE(m.ok());
  CHECK(m.script.find("OPTIMIZER = \"pagedAdamw8bit\"") != std::string::npos);
  CHECK(m.script.find("\"pagedAdamw8bit\": \"PagedAdamW8bit\"") != std::string::npos);
  CHECK(m.script.find("ACCUMULATION = 4 ") != std::string::npos);
  CHECK(m.script.find("transformers, bitsandbytes.") != std::string::npos);
  s.training.optimizer = OptimizerKind::Adafactor;
  s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
  s.training.adafactorBeta1 = true;
  const MeasureScript a = MeasureScriptFor(s, MustEstimate(s));
  REQUIRE(a.ok());
  CHECK(a.script.find("ADAFACTOR_BETA1 = True") != std::string::npos);
}

TEST_CASE("QLoRA loads its base weights through bitsandbytes as the estimate's init phase does", "[measure][script]") {
  Setup s = PresetSetup("llama-3.2-1b");
  s.training.precision = Precision::BF16;
  s.finetune.lora = true;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.doubleQuant = true;
  s.finetune.computeDType = DType::BF16;
  s.finetune.prepareForKbitTraining = true;
  const MeasureScript m = MeasureScriptFor(s, MustEstimate(s));
  REQUIRE(m.ok());
  CHECK(m.script.find(R"(QUANTIZATION = json.loads("{\"load_in_4bit\":true,\"bnb_4bit_quant_type\":\"nf4\",)"
                      R"(\"bnb_4bit_use_double_quant\":true,\"bnb_4bit_compute_dtype\":\"bfloat16\",)"
                      R"(\"bnb_4bit_quant_storage\":\"uint8\"}"))") != std::string::npos);
  CHECK(m.script.find("PREPARE_FOR_KBIT = True") != std::string::npos);
  // prepare_model_for_kbit_training checkpoints every block, as the estimate takes it.
  CHECK(m.script.find("CHECKPOINTING = True") != std::string::npos);
  CHECK(m.script.find("transformers, peft (0.12 or later), bitsandbytes, accelerate.") != std::string::npos);
  s.finetune.quantization = Quantization::Int8;
  s.finetune.doubleQuant = false;
  s.finetune.prepareForKbitTraining = false;
  const MeasureScript int8 = MeasureScriptFor(s, MustEstimate(s));
  REQUIRE(int8.ok());
  CHECK(int8.script.find(R"(QUANTIZATION = json.loads("{\"load_in_8bit\":true}"))") != std::string::npos);
  CHECK(int8.script.find("CHECKPOINTING = False") != std::string::npos);
}

TEST_CASE("what the script cannot run is refused by field", "[measure][script]") {
  auto fieldsOf = [](const Setup& s) {
    std::vector<std::string> fields;
    for (const FieldError& e : MeasureScriptFor(s, Estimate{}).errors) fields.push_back(e.field);
    return fields;
  };
  Setup torchtune = PresetSetup("llama-3.2-1b");
  torchtune.finetune.lora = true;
  torchtune.finetune.quantization = Quantization::NF4;
  torchtune.finetune.quantLayout = QuantLayout::TorchaoNf4;
  CHECK(fieldsOf(torchtune) == std::vector<std::string>{"finetune.quantLayout"});
  Setup lion = PresetSetup("llama-3.2-1b");
  lion.training.optimizer = OptimizerKind::Lion;
  lion.training.lossImplementation = LossImplementation::Chunked;
  CHECK(fieldsOf(lion) == std::vector<std::string>{"training.optimizer", "training.lossImplementation"});
  Setup inBackward = PresetSetup("llama-3.2-1b");  // default precision: fp16 with fp32 masters
  inBackward.training.optimizerInBackward = true;
  CHECK(fieldsOf(inBackward) == std::vector<std::string>{"training.optimizerInBackward"});
  inBackward.training.precision = Precision::BF16;
  inBackward.training.emptyCacheSteps = 2;
  const MeasureScript scripted = MeasureScriptFor(inBackward, MustEstimate(inBackward));
  REQUIRE(scripted.ok());
  CHECK(scripted.script.find("IN_BACKWARD = True") != std::string::npos);
  CHECK(scripted.script.find("EMPTY_CACHE_STEPS = 2 ") != std::string::npos);
  Setup parallel = PresetSetup("llama-3.2-1b");
  parallel.parallel.dataParallel = 8;
  parallel.parallel.zeroStage = 3;
  CHECK(fieldsOf(parallel) == std::vector<std::string>{"parallel"});
  CHECK(fieldsOf(ExampleMlpSetup()) == std::vector<std::string>{"model.kind"});
  // Through the JSON entry point: the envelope of errors.
  const std::string refused = MeasureScriptJson(R"({"model":{"preset":"gpt2"},"parallel":{"dataParallel":2}})");
  CHECK_THAT(refused, Catch::StartsWith(R"({"ok":false,"errors":[{"code":"invalidField","field":"parallel")"));
  const std::string ok = MeasureScriptJson(R"({"model":{"preset":"gpt2"},"training":{"precision":"ampBf16"}})");
  CHECK_THAT(ok, Catch::StartsWith(R"({"ok":true,"fileName":"gpumem_measure_gpt2.py","modelType":"gpt2","script":"#!/usr/bin/env python3)"));
}
