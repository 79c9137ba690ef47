// Transformers: exact inventories of published models, the tensors autograd keeps after the
// forward pass counted by hand, checkpointing, fused attention, autocast and bad input.
#include <limits>
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;
using json = nlohmann::json;

namespace {

Setup TransformerSetup(const ArchitectureDef& a, std::int64_t batch, std::int64_t sequence,
                       Precision precision = Precision::FP32) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = a;
  s.training.batchSize = batch;
  s.training.sequenceLength = sequence;
  s.training.precision = precision;
  s.training.optimizer = OptimizerKind::AdamW;
  return s;
}

// A small Llama: hidden 64, 4 heads of 16, 2 layers, intermediate 96, vocabulary 100.
ArchitectureDef TinyLlama() {
  ArchitectureDef a = DefaultArchitecture(Family::Llama);
  a.vocabSize = 100; a.hiddenSize = 64; a.numLayers = 2; a.numHeads = 4; a.numKeyValueHeads = 4;
  a.intermediateSize = 96;
  return a;
}

// Bytes of each category live at the end of step 1's forward pass (activations start at zero).
std::map<Category, std::int64_t> HeldAfterForward(const Estimate& e) {
  std::map<Category, std::int64_t> held;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step == 1 && p.phase == Phase::Forward) held[p.category] += p.deltaBytes;
  }
  return held;
}

// A Llama-family model in pure bf16 (no autocast), eager attention, for the norm tests: the
// shapes given, `change` then edits its architecture.
template <typename Change>
Setup NormTestLlama(std::int64_t b, std::int64_t s, std::int64_t layers, std::int64_t h, std::int64_t heads,
                    std::int64_t kv, std::int64_t d, Change change) {
  Setup x = TinyTransformer(Family::Llama, static_cast<int>(layers), Precision::BF16);
  ArchitectureDef& a = x.model.architecture;
  a.hiddenSize = h; a.numHeads = heads; a.numKeyValueHeads = kv; a.headDim = d;
  x.training.batchSize = b;
  x.training.sequenceLength = s;
  change(a);
  return x;
}

}  // namespace

TEST_CASE("every preset reproduces its published parameter count", "[transformer][presets]") {
  REQUIRE(Presets().size() >= 25);
  for (const Preset& p : Presets()) {
    INFO(p.id);
    Setup s = TransformerSetup(p.architecture, 1, 128);
    CHECK(Validate(s).empty());
    CHECK(PublishedScopeParameterCount(s) == p.publishedParameters);
  }
  // The figures each publisher states, typed here once more so that a preset cannot drift
  // together with its own expected value.
  const std::map<std::string, std::int64_t> published = {
      {"gpt2", 124'439'808},         {"gpt2-xl", 1'557'611'200},
      {"bert-large-uncased", 335'141'888}, {"llama-2-7b", 6'738'415'616},
      {"mistral-7b-v0.1", 7'241'732'096}, {"llama-3-8b", 8'030'261'248},
      {"qwen2.5-1.5b", 1'543'714'304}, {"mixtral-8x7b", 46'702'792'704},
      {"gpt2-medium", 354'823'168}, {"gpt2-large", 774'030'080}, {"bert-base-uncased", 109'482'240},
      {"llama-2-13b", 13'015'864'320}, {"llama-2-70b", 68'976'648'192}, {"tinyllama-1.1b", 1'100'048'384},
      {"llama-3-70b", 70'553'706'496}, {"llama-3.1-405b", 405'853'388'800}, {"llama-3.2-1b", 1'235'814'400},
      {"llama-3.2-3b", 3'212'749'824}, {"mistral-7b-v0.3", 7'248'023'552}, {"qwen2.5-0.5b", 494'032'768},
      {"qwen2.5-7b", 7'615'616'512}, {"qwen2.5-14b", 14'770'033'664}, {"qwen2.5-72b", 72'706'203'648},
      {"gemma-2b", 2'506'172'416}, {"gemma-7b", 8'537'680'896}, {"phi-3-mini-4k", 3'821'079'552},
      {"mixtral-8x22b", 140'620'634'112}, {"qwen1.5-moe-a2.7b", 14'315'784'192},
  };
  for (const auto& [id, count] : published) {
    SECTION(id) {
      const Preset* p = FindPreset(id);
      REQUIRE(p != nullptr);
      CHECK(p->publishedParameters == count);
      Setup s = TransformerSetup(p->architecture, 1, 128);
      CHECK(Validate(s).empty());
      CHECK(PublishedScopeParameterCount(s) == count);
    }
  }
}

TEST_CASE("inventories use Hugging Face names and shapes", "[transformer]") {
  SECTION("the count is explained as embeddings and head plus blocks") {
    const Estimate e = MustEstimate(TransformerSetup(FindPreset("gpt2")->architecture, 1, 8));
    CHECK(e.modelStates.parameterFormula ==
          "embeddings, final norm and head 39,385,344 + 12 blocks × 7,087,872 = 124,439,808 (148 tensors)");
  }
  SECTION("an architecture that is exactly a preset's carries its published count") {
    const Estimate gpt2 = MustEstimate(TransformerSetup(FindPreset("gpt2")->architecture, 1, 8));
    CHECK(gpt2.modelStates.presetId == "gpt2");
    CHECK(gpt2.modelStates.differenceFromPublished == 0);
    // BERT's published count leaves out the classifier: 1,024 × 2 + 2.
    const Estimate bert = MustEstimate(TransformerSetup(FindPreset("bert-large-uncased")->architecture, 1, 8));
    CHECK(bert.modelStates.differenceFromPublished == 2'050);
    ArchitectureDef changed = FindPreset("gpt2")->architecture;
    changed.numLayers = 11;
    CHECK(MustEstimate(TransformerSetup(changed, 1, 8)).modelStates.presetId.empty());
  }
  SECTION("GPT-2: a tied head is listed once, Conv1D weights are [in, out]") {
    const Inventory inv = BuildInventory(TransformerSetup(FindPreset("gpt2")->architecture, 1, 8));
    CHECK(inv.parameters.size() == 2 + 12 * 12 + 2);
    CHECK(inv.IndexOf("lm_head.weight") == -1);
    const auto i = inv.IndexOf("transformer.h.0.attn.c_attn.weight");
    REQUIRE(i >= 0);
    CHECK(inv.parameters[static_cast<std::size_t>(i)].shape == std::vector<std::int64_t>{768, 2304});
  }
  SECTION("Qwen2.5: grouped-query k/v with biases, no o_proj bias") {
    const Inventory inv = BuildInventory(TransformerSetup(FindPreset("qwen2.5-1.5b")->architecture, 1, 8));
    const auto k = inv.IndexOf("model.layers.0.self_attn.k_proj.weight");
    REQUIRE(k >= 0);
    CHECK(inv.parameters[static_cast<std::size_t>(k)].shape == std::vector<std::int64_t>{256, 1536});
    CHECK(inv.IndexOf("model.layers.0.self_attn.k_proj.bias") >= 0);
    CHECK(inv.IndexOf("model.layers.0.self_attn.o_proj.bias") == -1);
  }
  SECTION("Mixtral: every expert's weights are held") {
    const Inventory inv = BuildInventory(TransformerSetup(FindPreset("mixtral-8x7b")->architecture, 1, 8));
    CHECK(inv.IndexOf("model.layers.31.block_sparse_moe.experts.7.w2.weight") >= 0);
    CHECK(inv.IndexOf("model.layers.0.block_sparse_moe.gate.weight") >= 0);
  }
}

TEST_CASE("what an fp32 Llama keeps after forward is counted tensor by tensor", "[transformer][trace]") {
  // Per layer, in elements (T = b·s tokens, h hidden, i intermediate):
  //   input_layernorm: its input x (saved by pow and mul), rsqrt [T,1], x·rsqrt, its output
  //   v_proj output (saved by probs·v); q and k after RoPE (saved by q·kᵀ); softmax output
  //   b·heads·s·s; attention output (saved by o_proj); the residual sum (post-norm input),
  //   post_attention_layernorm rsqrt, x·rsqrt and output; gate, silu(gate), up, silu·up.
  //   = 10·T·h + 2·T + 4·T·i + b·heads·s² values.
  // Once: final norm (input, rsqrt, x·rsqrt, output = 3·T·h + T), cos and sin (s·d each),
  // log_softmax (T·V), the shifted labels (T int64), nll's total_weight and the loss (4 B each).
  const ArchitectureDef a = TinyLlama();
  const std::int64_t b = 2, s = 16, T = b * s, h = 64, i = 96, heads = 4, d = 16, V = 100;
  Setup setup = TransformerSetup(a, b, s);
  const auto held = HeldAfterForward(MustEstimate(setup));
  const std::int64_t perLayer = 10 * T * h + 2 * T + 4 * T * i + b * heads * s * s;
  const std::int64_t once = 3 * T * h + T + 2 * s * d + T * V;
  CHECK(held.at(Category::Activations) == (2 * perLayer + once) * 4 + T * 8 + 4 + 4);

  SECTION("checkpointing every block keeps each block's input and the rotary tables it is given") {
    setup.training.checkpointing = Checkpointing::EveryBlock;
    setup.training.attention = AttentionImplementation::SDPA;  // no mask to keep
    const auto ckpt = HeldAfterForward(MustEstimate(setup));
    CHECK(ckpt.at(Category::Activations) == (2 * T * h + once) * 4 + T * 8 + 4 + 4);
  }
  SECTION("fused attention keeps an fp32 log-sum-exp instead of the probabilities") {
    // Its output, in [b, s, heads, d] memory order, is o_proj's input as it is: the eager
    // path's contiguous copy of the attention output is not made.
    setup.training.attention = AttentionImplementation::SDPA;
    const auto fused = HeldAfterForward(MustEstimate(setup));
    const std::int64_t eagerCore = b * heads * s * s;
    const std::int64_t fusedCore = b * heads * s;
    CHECK(fused.at(Category::Activations) ==
          held.at(Category::Activations) + 2 * (fusedCore - eagerCore) * 4);
  }
}

TEST_CASE("autocast keeps 16-bit copies of the matmul weights until their backward", "[transformer][precision]") {
  const ArchitectureDef a = TinyLlama();
  Setup setup = TransformerSetup(a, 2, 16, Precision::AmpBF16);
  const Estimate e = MustEstimate(setup);
  const Inventory inv = BuildInventory(setup);
  // Every nn.Linear weight is copied once per forward; the embedding and the norms are not.
  std::int64_t matmulWeights = 0;
  for (const Tensor& t : inv.parameters) {
    if (t.shape.size() == 2 && t.name != "model.embed_tokens.weight") matmulWeights += t.Elements();
  }
  CHECK(HeldAfterForward(e).at(Category::WeightCopies) == matmulWeights * 2);
  // fp32 weights and gradients, fp32 Adam states, no master copy: 16 B per parameter.
  CHECK(e.modelStates.totalBytes == inv.ParameterCount() * 16);
  CHECK(e.modelStates.masterWeightsBytes == 0);
}

TEST_CASE("the large-vocabulary loss is the forward peak of a small causal LM", "[transformer][trace]") {
  // Vocabulary 32,000 against hidden 64: the fp32 upcast of the logits and log_softmax's output
  // live together with the 16-bit logits at the loss.
  ArchitectureDef a = TinyLlama();
  a.vocabSize = 32000;
  const Estimate e = MustEstimate(TransformerSetup(a, 2, 64, Precision::BF16Mixed));
  CHECK(e.phasePeaks[1].label.find("loss") != std::string::npos);
}

TEST_CASE("a step frees everything it allocated but the model states", "[transformer][trace]") {
  for (const char* id : {"gpt2", "mixtral-8x7b", "bert-large-uncased"}) {
    ArchitectureDef a = FindPreset(id)->architecture;
    a.numLayers = 2;
    if (a.family != Family::GPT2) { a.hiddenSize = 128; a.numHeads = 4; a.numKeyValueHeads = 0; a.intermediateSize = 256; }
    for (Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock, Checkpointing::Selective}) {
      for (Precision p : {Precision::FP32, Precision::AmpBF16, Precision::BF16Mixed}) {
        Setup s = TransformerSetup(a, 2, 32, p);
        s.training.checkpointing = c;
        const Estimate e = MustEstimate(s);
        INFO(id << " " << static_cast<int>(c) << " " << static_cast<int>(p));
        CHECK(e.timeline.back().totalBytes == e.modelStates.totalBytes - e.modelStates.gradientsBytes);
      }
    }
  }
}

TEST_CASE("the peak says which category dominates it and why", "[transformer][explain]") {
  Setup s = TransformerSetup(FindPreset("gpt2")->architecture, 8, 1024, Precision::AmpBF16);
  const Estimate e = MustEstimate(s);
  CHECK(e.peakExplanation.rfind("Activations hold ", 0) == 0);
  CHECK(e.peakExplanation.find("checkpointing") != std::string::npos);
}

TEST_CASE("step 2 holds optimizer states through its forward pass", "[transformer][trace]") {
  const Estimate e = MustEstimate(TransformerSetup(TinyLlama(), 2, 16));
  CHECK(e.phasePeaks[1].step == 2);
  CHECK(BytesIn(e.phasePeaks[1], Category::OptimizerStates) == e.modelStates.optimizerStatesBytes);
}

TEST_CASE("bad architectures are refused naming the field", "[transformer][validation]") {
  Setup s = TransformerSetup(TinyLlama(), 1, 16);
  SECTION("heads not dividing the hidden size") {
    s.model.architecture.numHeads = 7;
    CHECK(HasErrorOn(Validate(s), "model.architecture.numHeads"));
  }
  SECTION("key/value heads not dividing the heads") {
    s.model.architecture.numKeyValueHeads = 3;
    CHECK(HasErrorOn(Validate(s), "model.architecture.numKeyValueHeads"));
  }
  SECTION("more experts per token than experts") {
    s.model.architecture.numExperts = 4;
    s.model.architecture.expertsPerToken = 5;
    CHECK(HasErrorOn(Validate(s), "model.architecture.expertsPerToken"));
  }
  SECTION("a sequence longer than the learned position table") {
    s.model.architecture = FindPreset("gpt2")->architecture;
    s.training.sequenceLength = 2048;
    CHECK(HasErrorOn(Validate(s), "training.sequenceLength"));
  }
  SECTION("zero and negative sizes") {
    s.model.architecture.hiddenSize = 0;
    s.model.architecture.vocabSize = -5;
    const auto errors = Validate(s);
    CHECK(HasErrorOn(errors, "model.architecture.hiddenSize"));
    CHECK(HasErrorOn(errors, "model.architecture.vocabSize"));
  }
  SECTION("absurd sizes are refused before any arithmetic overflows") {
    s.model.architecture.numLayers = 100000;
    s.model.architecture.numExperts = 100000;
    CHECK(HasErrorOn(Validate(s), "model.architecture.numLayers"));
  }
  SECTION("a checkpoint interval below 1") {
    s.training.checkpointing = Checkpointing::EveryKthBlock;
    s.training.checkpointInterval = 0;
    CHECK(HasErrorOn(Validate(s), "training.checkpointInterval"));
  }
  SECTION("autocast on a layer list is simulated (savers_test.cpp)") {
    Setup l = ExampleMlpSetup();
    l.training.precision = Precision::AmpBF16;
    CHECK_FALSE(HasErrorOn(Validate(l), "training.precision"));
  }
}

TEST_CASE("the form's architecture fields are exactly the schema's", "[transformer][json]") {
  // Every field but the family is listed once, and each listed key is one the parser reads.
  const std::string setup = SetupToJson(DefaultSetup(), -1);
  std::size_t listed = 0;
  for (const ArchitectureField& f : ArchitectureFields()) {
    INFO(f.key);
    CHECK(setup.find(std::string("\"") + f.key + "\":") != std::string::npos);
    CHECK((f.gpt2 || f.llama || f.bert || f.neox));
    ++listed;
  }
  Setup parsed;
  for (const ArchitectureField& f : ArchitectureFields()) {
    const std::string value = std::string(f.kind) == "bool" ? "true" : std::string(f.kind) == "select" ? "\"x\"" : "1";
    const auto errors = ParseAndValidate(std::string(R"({"model":{"kind":"transformer","architecture":{")") + f.key +
                                             "\":" + value + "}}}", parsed);
    for (const FieldError& e : errors) CHECK(e.code != ErrorCode::UnknownField);
  }
  CHECK(listed == 40);
}

TEST_CASE("transformer setups in JSON", "[transformer][json]") {
  SECTION("a preset by id, with fields overriding it") {
    const EstimateResult r = EstimateFromJson(
        R"({"model":{"preset":"gpt2","architecture":{"numLayers":2}},"training":{"sequenceLength":64}})");
    REQUIRE(r.ok());
    // 124,439,808 less 10 of GPT-2's 12 blocks (7,087,872 parameters each).
    CHECK(r.estimate.modelStates.parameterCount == 124'439'808 - 10 * 7'087'872);
  }
  SECTION("naming another family starts from its defaults") {
    Setup s;
    CHECK(ParseAndValidate(R"({"model":{"kind":"transformer","architecture":{"family":"bert"}},"training":{"sequenceLength":128}})", s).empty());
    CHECK(s.model.architecture.maxPositionEmbeddings == 512);
    CHECK(s.model.architecture.hiddenAct == HiddenAct::GELU);
  }
  SECTION("errors name the field") {
    Setup s;
    CHECK(HasErrorOn(ParseAndValidate(R"({"model":{"preset":"gpt-5"}})", s), "model.preset"));
    CHECK(HasErrorOn(ParseAndValidate(R"({"model":{"preset":"gpt2","architecture":{"numHeads":"twelve"}}})", s),
                     "model.architecture.numHeads"));
    CHECK(HasErrorOn(ParseAndValidate(R"({"model":{"preset":"gpt2","architecture":{"heads":12}}})", s),
                     "model.architecture.heads"));
    CHECK(HasErrorOn(ParseAndValidate(R"({"model":{"preset":"gpt2"},"training":{"checkpointing":"sometimes"}})", s),
                     "training.checkpointing"));
    CHECK(HasErrorOn(ParseAndValidate(R"({"model":{"preset":"gpt2","architecture":{"hiddenDropout":1.5}}})", s),
                     "model.architecture.hiddenDropout"));
  }
  SECTION("a setup survives a round trip") {
    Setup s;
    REQUIRE(ParseAndValidate(R"({"model":{"preset":"mixtral-8x7b"},"training":{"attention":"sdpa","checkpointing":"everyKthBlock","checkpointInterval":4,"precision":"ampBf16"}})", s).empty());
    Setup back;
    REQUIRE(ParseAndValidate(SetupToJson(s, -1), back).empty());
    CHECK(back.model.architecture.numExperts == 8);
    CHECK(back.training.checkpointInterval == 4);
    CHECK(back.training.precision == Precision::AmpBF16);
    CHECK(back.training.attention == AttentionImplementation::SDPA);
  }
}

TEST_CASE("transformers' DynamicCache: GPT-2 under SDPA keeps a copy of every layer's key and value",
          "[transformer][cache]") {
  // transformers 5.x builds the cache in training whenever use_cache holds, and its first update
  // copies the key and the value (torch.cat onto an empty tensor); SDPA then saves those copies.
  // Measured on an H100 (tests/data/cuda, docs/validation.md "CUDA truth"): GPT-2 8 × 1024 under
  // autocast, 303 MB between use_cache on and off.
  ArchitectureDef a = DefaultArchitecture(Family::GPT2);
  a.vocabSize = 100; a.hiddenSize = 64; a.numLayers = 3; a.numHeads = 4; a.maxPositionEmbeddings = 64;
  const std::int64_t b = 2, s = 16, h = 64, layers = 3;
  Setup setup = TransformerSetup(a, b, s, Precision::AmpBF16);
  setup.training.attention = AttentionImplementation::SDPA;
  REQUIRE(setup.training.useCache);  // transformers' default
  const std::int64_t cached = SavedAtForwardEnd(setup);
  setup.training.useCache = false;
  const std::int64_t uncached = SavedAtForwardEnd(setup);
  // Two bf16 tensors of b·s·h per layer.
  CHECK(cached - uncached == layers * 2 * b * s * h * 2);

  SECTION("nothing changes where the copies cost nothing or the cache is off") {
    auto difference = [](Setup with) {
      with.training.useCache = true;
      Setup without = with;
      without.training.useCache = false;
      return SavedAtForwardEnd(with) - SavedAtForwardEnd(without);
    };
    Setup eager = setup;  // eager matmuls copy the non-contiguous k and v anyway
    eager.training.attention = AttentionImplementation::Eager;
    CHECK(difference(eager) == 0);
    Setup checkpointed = setup;  // gradient checkpointing turns use_cache off
    checkpointed.training.checkpointing = Checkpointing::EveryBlock;
    CHECK(difference(checkpointed) == 0);
    Setup llama = TransformerSetup(TinyLlama(), b, s, Precision::AmpBF16);  // k after RoPE and v_proj's
    llama.training.attention = AttentionImplementation::SDPA;               // output are freed once copied
    CHECK(difference(llama) == 0);
  }
  SECTION("a config with use_cache false imports as training.useCache false") {
    const json imported = json::parse(ImportConfigJson(
        R"({"model_type": "gpt2", "vocab_size": 100, "n_embd": 64, "n_layer": 3, "n_head": 4,
            "n_positions": 64, "use_cache": false})"));
    REQUIRE(imported["ok"] == true);
    CHECK(imported["setup"]["training"]["useCache"] == false);
    const json defaulted = json::parse(ImportConfigJson(
        R"({"model_type": "gpt2", "vocab_size": 100, "n_embd": 64, "n_layer": 3, "n_head": 4, "n_positions": 64})"));
    CHECK_FALSE(defaulted["setup"].contains("training"));
  }
  SECTION("the estimate says so, and make it fit offers use_cache=False where it saves") {
    const auto noted = [](const Setup& with) {
      const Estimate r = MustEstimate(with);
      return std::any_of(r.notes.begin(), r.notes.end(),
                         [](const std::string& n) { return n.find("DynamicCache") != std::string::npos; });
    };
    const auto offer = [](const Setup& with) -> std::optional<FitSuggestion> {
      const SolveResult r = Solve(with);
      REQUIRE(r.ok());
      const FitSuggestion* f = Suggestion(r, "no-kv-cache");
      return f != nullptr ? std::optional<FitSuggestion>(*f) : std::nullopt;
    };
    // Activations hold the peak (at b·s = 32 × 64), so the solver tries the change.
    setup = TransformerSetup(a, 32, 64, Precision::AmpBF16);
    setup.training.attention = AttentionImplementation::SDPA;
    CHECK(noted(setup));
    const std::optional<FitSuggestion> off = offer(setup);
    REQUIRE(off);
    CHECK(off->cost == FitCost::Free);
    CHECK(off->changedFields == std::vector<std::string>{"training.useCache"});
    CHECK_FALSE(off->setup.training.useCache);
    Setup without = setup;
    without.training.useCache = false;
    CHECK(off->peakBytes == MustEstimate(without).device.peakDeviceBytes);
    CHECK(off->savedBytes == MustEstimate(setup).device.peakDeviceBytes - off->peakBytes);
    CHECK(off->savedBytes > 0);
    // Not offered, nor noted, where the cache costs nothing or is off already.
    Setup eager = setup;
    eager.training.attention = AttentionImplementation::Eager;
    Setup llama = TransformerSetup(TinyLlama(), 32, 64, Precision::AmpBF16);
    llama.training.attention = AttentionImplementation::SDPA;
    Setup kbit = setup;  // peft's prepare_model_for_kbit_training turns checkpointing on
    kbit.finetune.lora = true;
    kbit.finetune.prepareForKbitTraining = true;
    for (const Setup& other : {without, eager, llama, kbit}) {
      CHECK_FALSE(noted(other));
      CHECK_FALSE(offer(other));
    }
  }
}

TEST_CASE("SDPA takes grouped key/value heads as they are from PyTorch 2.5 (transformers' enable_gqa)",
          "[transformer][gqa]") {
  // transformers' sdpa_attention_forward passes enable_gqa=True instead of calling repeat_kv on
  // PyTorch >= 2.5 without an attention mask; FlashAttention (16-bit) then saves the kv heads as
  // they are. Measured on an H100 (docs/validation.md "CUDA truth": Llama 3.2 1B and Qwen2.5 under
  // SDPA went from +2.3 / +1.3 % to exact).
  ArchitectureDef a = TinyLlama();
  a.numKeyValueHeads = 1;  // 4 query heads of 16 share one key/value head
  const std::int64_t b = 2, s = 32, layers = 2, heads = 4, kv = 1, d = 16;
  Setup setup = TransformerSetup(a, b, s, Precision::BF16);
  setup.training.attention = AttentionImplementation::SDPA;
  REQUIRE(setup.runtime.pytorchVersion == "2.5");  // the default
  const auto withRepeat = [](Setup x) {
    x.runtime.pytorchVersion = "2.4";
    return x;
  };
  // Before 2.5 SDPA saves repeat_kv's copies of k and v, (heads − kv)·d wider each per token.
  CHECK(SavedAtForwardEnd(withRepeat(setup)) - SavedAtForwardEnd(setup) == layers * 2 * b * s * (heads - kv) * d * 2);
  // Flash's backward writes dk and dv per query head, then sums each group into dk, dv.
  const Estimate grouped = MustEstimateLabelled(setup);
  CHECK(FirstAllocBytes(grouped, "dk per query head (dk_expanded)") == b * s * heads * d * 2);
  CHECK(FirstAllocBytes(grouped, "dv per query head (dv_expanded)") == b * s * heads * d * 2);
  CHECK(FirstAllocBytes(grouped, "repeat_kv") == -1);
  CHECK(FirstAllocBytes(withRepeat(setup), "repeat_kv(key)") == b * s * heads * d * 2);
  CHECK(FirstAllocBytes(withRepeat(setup), "dk_expanded") == -1);

  SECTION("under autocast too: the kernel reads 16-bit copies") {
    Setup amp = setup;
    amp.training.precision = Precision::AmpBF16;
    CHECK(SavedAtForwardEnd(withRepeat(amp)) > SavedAtForwardEnd(amp));
    CHECK(FirstAllocBytes(amp, "dk_expanded") == b * s * heads * d * 2);
  }
  SECTION("fp32, eager attention and multi-head attention keep what they had") {
    Setup fp32 = setup;  // flash does not run in fp32: repeat_kv stays (docs/device.md)
    fp32.training.precision = Precision::FP32;
    Setup eager = setup;  // eager_attention_forward always repeats
    eager.training.attention = AttentionImplementation::Eager;
    Setup mha = setup;  // nothing to repeat
    mha.model.architecture.numKeyValueHeads = heads;
    for (const Setup& x : {fp32, eager, mha}) {
      CHECK(SavedAtForwardEnd(withRepeat(x)) == SavedAtForwardEnd(x));
      CHECK(FirstAllocBytes(x, "dk_expanded") == -1);
    }
  }
}

TEST_CASE("Qwen3's per-head q/k norms and Gemma's norm keep what their forwards save", "[transformer]") {
  // A Llama-family model in pure bf16 (no autocast), eager attention, b = 2, s = 64.
  const std::int64_t b = 2, s = 64, L = 2, h = 128, heads = 4, kv = 2, d = 48;
  auto setup = [&](auto change) { return NormTestLlama(b, s, L, h, heads, kv, d, change); };
  const std::int64_t plain = SavedAtForwardEnd(setup([](ArchitectureDef&) {}));
  SECTION("q_norm and k_norm save, per head and token, the fp32 copy, its rsqrt and the bf16 cast") {
    // Qwen3RMSNorm on [b, s, n, d]: hidden_states.to(float32) (4 B per element, kept by pow),
    // rsqrt of the mean (4 B per row), the bf16 cast the weight multiplies (2 B per element).
    // The projections' outputs were never saved (RoPE multiplies by cos and sin, which need no
    // gradient), so nothing else changes.
    const std::int64_t rows = b * s * (heads + kv);
    const std::int64_t perLayer = rows * (4 * d + 4 + 2 * d);
    CHECK(SavedAtForwardEnd(setup([](ArchitectureDef& a) { a.queryKeyNorm = true; })) - plain == L * perLayer);
  }
  SECTION("GemmaRMSNorm keeps its fp32 normalised rows where Llama's keeps their bf16 cast") {
    // output * (1.0 + self.weight.float()) saves the fp32 product's input (4 B per element, not
    // Llama's 2) and the [h] fp32 scale; two norms a block and the final one, all held at the
    // end of the forward. The scaled embeddings change nothing saved.
    const std::int64_t norms = 2 * L + 1;
    const std::int64_t perNorm = b * s * h * (4 - 2) + 4 * h;
    CHECK(SavedAtForwardEnd(setup([](ArchitectureDef& a) { a.rmsNormUnitOffset = a.embeddingScale = true; })) - plain ==
          norms * perNorm);
  }
}

TEST_CASE("norm_topk_prob: renormalising the routing weights keeps the top-k values and their sum", "[transformer]") {
  // `routing_weights /= routing_weights.sum(dim=-1, keepdim=True)` saves the division's inputs:
  // the fp32 top-k weights [T, k] and their sum [T, 1], in every MoE block until its backward.
  // Without it (Qwen1.5-MoE-A2.7B's config) neither is kept (topk saves only its int64 indices,
  // which both keep). b = 2, s = 64, 2 layers of 8 experts, top-2.
  const std::int64_t b = 2, s = 64, L = 2, k = 2;
  auto setup = [&](bool norm) {
    return NormTestLlama(b, s, L, 128, 4, 2, 32, [&](ArchitectureDef& a) {
      a.numExperts = 8;
      a.expertsPerToken = k;
      a.normTopkProb = norm;
    });
  };
  const std::int64_t tokens = b * s;
  CHECK(SavedAtForwardEnd(setup(true)) - SavedAtForwardEnd(setup(false)) == L * tokens * (k + 1) * 4);
  // The import reads it, with each config class's default.
  CHECK_FALSE(FindPreset("qwen1.5-moe-a2.7b")->architecture.normTopkProb);
  CHECK(FindPreset("mixtral-8x7b")->architecture.normTopkProb);
}

TEST_CASE("Gemma 2's sandwich norms, soft caps and sliding-window masks keep what their forwards save", "[transformer]") {
  // A Gemma-style model (Gemma's norms and scaled embeddings) in pure bf16, b = 2, s = 64, eager
  // attention unless a section says otherwise; every Gemma 2 field off, then one at a time.
  const std::int64_t b = 2, s = 64, h = 128, heads = 4, kv = 2, d = 48, V = 1000;
  auto setup = [&](std::int64_t layers, auto change) {
    Setup x = TinyTransformer(Family::Llama, static_cast<int>(layers), Precision::BF16);
    ArchitectureDef& a = x.model.architecture;
    a.hiddenSize = h; a.numHeads = heads; a.numKeyValueHeads = kv; a.headDim = d; a.vocabSize = V;
    a.rmsNormUnitOffset = a.embeddingScale = true;
    x.training.batchSize = b;
    x.training.sequenceLength = s;
    change(x);
    return x;
  };
  const auto none = [](Setup&) {};
  SECTION("two more Gemma norms a block, each keeping its fp32 rows twice, its rsqrt and its fp32 scale") {
    // post_attention_layernorm on o_proj's output and post_feedforward_layernorm on down_proj's
    // (pre_feedforward_layernorm takes the place of Llama's post_attention_layernorm). A Gemma
    // norm keeps x.float() (4 B per element, for pow and the product), rsqrt of the mean (4 B per
    // row), the normalised fp32 rows (4 B per element, for × (1 + w)) and 1 + w.float() ([h],
    // 4 B). Neither projection's output was saved before, so nothing else changes.
    const std::int64_t L = 2;
    const std::int64_t perNorm = b * s * h * (4 + 4) + b * s * 4 + 4 * h;
    CHECK(SavedAtForwardEnd(setup(L, [](Setup& x) { x.model.architecture.sandwichNorms = true; })) -
              SavedAtForwardEnd(setup(L, none)) ==
          L * 2 * perNorm);
  }
  SECTION("the attention soft cap keeps tanh's output: one bf16 [b, heads, s, s] per layer") {
    // scores / cap and × cap save nothing (a Python scalar); tanh saves its result.
    const std::int64_t L = 2;
    CHECK(SavedAtForwardEnd(setup(L, [](Setup& x) { x.model.architecture.attentionLogitSoftcap = 50.0; })) -
              SavedAtForwardEnd(setup(L, none)) ==
          L * b * heads * s * s * 2);
    SECTION("SDPA's kernels take no cap here, so nothing changes there") {
      auto sdpa = [](double cap) {
        return [cap](Setup& x) {
          x.training.attention = AttentionImplementation::SDPA;
          x.model.architecture.attentionLogitSoftcap = cap;
        };
      };
      CHECK(SavedAtForwardEnd(setup(L, sdpa(50.0))) == SavedAtForwardEnd(setup(L, sdpa(0.0))));
    }
  }
  SECTION("the final soft cap keeps tanh's output: one bf16 [b, s, vocab]") {
    const std::int64_t L = 1;
    CHECK(SavedAtForwardEnd(setup(L, [](Setup& x) { x.model.architecture.finalLogitSoftcap = 30.0; })) -
              SavedAtForwardEnd(setup(L, none)) ==
          b * s * V * 2);
  }
  SECTION("sliding layers (0 and 2 of 3, a full one every 2) read a second mask") {
    const std::int64_t L = 3;
    auto window = [](std::int64_t w, AttentionImplementation attention, Checkpointing checkpointing) {
      return [=](Setup& x) {
        x.model.architecture.slidingWindow = w;
        x.model.architecture.slidingWindowPattern = 2;
        x.model.architecture.numKeyValueHeads = heads;  // no grouped heads: the kernels save the same k, v
        x.training.attention = attention;
        x.training.checkpointing = checkpointing;
      };
    };
    using A = AttentionImplementation;
    SECTION("eager: a bf16 [b, 1, s, s] mask, kept by the checkpoints of the sliding blocks") {
      const std::int64_t base = SavedAtForwardEnd(setup(L, window(0, A::Eager, Checkpointing::EveryBlock)));
      CHECK(SavedAtForwardEnd(setup(L, window(32, A::Eager, Checkpointing::EveryBlock))) - base == b * s * s * 2);
    }
    SECTION("SDPA: no mask while the sequence is shorter than the window") {
      CHECK(SavedAtForwardEnd(setup(L, window(s + 1, A::SDPA, Checkpointing::None))) ==
            SavedAtForwardEnd(setup(L, window(0, A::SDPA, Checkpointing::None))));
    }
    SECTION("SDPA from the window on: each sliding layer's kernel keeps the mask as a bf16 bias") {
      // The memory-efficient kernel (an explicit mask rules out flash) saves
      // convert_boolean_attn_mask's [b, 1, s, s] in q's dtype; s = 64 needs no padding to 8, and
      // its logsumexp, ceil(s / 32)·32 = s per row, weighs what flash's does. A window of s
      // itself already makes the mask (kv_length < local_attention_size is what skips it).
      const std::int64_t none = SavedAtForwardEnd(setup(L, window(0, A::SDPA, Checkpointing::None)));
      CHECK(SavedAtForwardEnd(setup(L, window(32, A::SDPA, Checkpointing::None))) - none == 2 * b * s * s * 2);
      CHECK(SavedAtForwardEnd(setup(L, window(s, A::SDPA, Checkpointing::None))) - none == 2 * b * s * s * 2);
    }
    SECTION("every layer sliding (Mistral's sliding_window): one mask, the sliding one") {
      auto mistral = [&](std::int64_t w, AttentionImplementation attention) {
        return [=](Setup& x) {
          window(w, attention, Checkpointing::EveryBlock)(x);
          x.model.architecture.slidingWindowPattern = 0;
        };
      };
      // Eager: the sliding mask takes the causal one's place (the same bytes).
      CHECK(SavedAtForwardEnd(setup(L, mistral(32, A::Eager))) ==
            SavedAtForwardEnd(setup(L, window(0, A::Eager, Checkpointing::EveryBlock))));
      // SDPA from the window on: a bool mask kept by every checkpoint (all three blocks slide).
      CHECK(SavedAtForwardEnd(setup(L, mistral(32, A::SDPA))) -
                SavedAtForwardEnd(setup(L, window(0, A::SDPA, Checkpointing::EveryBlock))) ==
            b * s * s);
    }
  }
}

TEST_CASE("Gemma 3's layout keeps one more rotary table, for its sliding layers", "[transformer]") {
  // Gemma 3 (q/k norms, sandwich norms, scaled embeddings, a 32-token window on layers 0 and 2 of
  // 3), every block checkpointed: the checkpoints keep the cos and sin each block was given.
  // With the layout the sliding blocks get their own pair, [1, 1, s, d] bf16 each. Its other
  // changes move nothing held at the end of the forward: the q/k norms save the same tensors in
  // another order, and Gemma 1/2's unscaled embeddings were released after the last block.
  const std::int64_t s = 64, d = 48;
  auto setup = [&](bool layout) {
    Setup x = TinyTransformer(Family::Llama, 3, Precision::BF16);
    ArchitectureDef& a = x.model.architecture;
    a.hiddenSize = 128; a.numHeads = 4; a.numKeyValueHeads = 2; a.headDim = d;
    a.queryKeyNorm = a.sandwichNorms = a.rmsNormUnitOffset = a.embeddingScale = true;
    a.slidingWindow = 32; a.slidingWindowPattern = 2;
    a.gemma3Layout = layout;
    x.training.batchSize = 2;
    x.training.sequenceLength = s;
    x.training.checkpointing = Checkpointing::EveryBlock;
    return x;
  };
  CHECK(SavedAtForwardEnd(setup(true)) - SavedAtForwardEnd(setup(false)) == 2 * s * d * 2);
  SECTION("the layout needs the fields it places") {
    Setup bare = TransformerSetup(TinyLlama(), 1, 16);
    bare.model.architecture.gemma3Layout = true;
    CHECK(HasErrorOn(Validate(bare), "model.architecture.gemma3Layout"));
  }
}

TEST_CASE("OLMo 2's norms after each sub-layer and over whole projections keep what its forward saves", "[transformer]") {
  // A Llama-family model in pure bf16, eager attention, b = 2, s = 64, two blocks; Llama's layout
  // against OLMo 2's (transformers models/olmo2/modeling_olmo2.py), worked tensor by tensor.
  const std::int64_t b = 2, s = 64, L = 2, h = 128, heads = 4, kv = 2, d = 48;
  auto setup = [&](auto change) { return NormTestLlama(b, s, L, h, heads, kv, d, change); };
  const std::int64_t llama = SavedAtForwardEnd(setup([](ArchitectureDef&) {}));
  const std::int64_t olmo = SavedAtForwardEnd(setup([](ArchitectureDef& a) { a.queryKeyNorm = a.olmo2Layout = true; }));
  SECTION("norms on the outputs, q/k norms over the projections, the weight times fp32 rows") {
    // Llama, per block: input_layernorm and post_attention_layernorm each save the fp32 copy
    // (4 B an element), the rsqrt (4 B a row) and the bf16 cast the weight multiplies (2 B);
    // the q/k/v and gate/up projections save the norms' bf16 outputs (2 B each).
    // OLMo 2, per block: post_attention_layernorm and post_feedforward_layernorm save the fp32
    // copy, the rsqrt and the fp32 rows the weight multiplies (Olmo2RMSNorm: (weight · x).to);
    // the projections save the block's input and the residual sum (2 B each, as before);
    // q_norm and k_norm do the same over [b, s, heads·d] and [b, s, kv·d].
    const std::int64_t bsh = b * s * h, rows = b * s;
    const std::int64_t llamaBlock = 2 * (6 * bsh + 4 * rows) + 2 * bsh + 2 * bsh;
    const std::int64_t olmoBlock = 2 * (8 * bsh + 4 * rows) + 2 * bsh + 2 * bsh +
                                   (8 * rows * heads * d + 4 * rows) + (8 * rows * kv * d + 4 * rows);
    // The final norm keeps its fp32 rows (4 B) where Llama's keeps their bf16 cast (2 B).
    CHECK(olmo - llama == L * (olmoBlock - llamaBlock) + 2 * bsh);
  }
  SECTION("OLMo 2's rotary tables stay fp32: cos and sin, saved by RoPE's products, twice the bytes") {
    const std::int64_t fp32 = SavedAtForwardEnd(
        setup([](ArchitectureDef& a) { a.queryKeyNorm = a.olmo2Layout = a.rotaryFp32 = true; }));
    CHECK(fp32 - olmo == 2 * s * d * (4 - 2));
  }
  SECTION("the layout needs its q/k norms and no other family's norms") {
    Setup bare = setup([](ArchitectureDef& a) { a.olmo2Layout = true; });
    CHECK(HasErrorOn(Validate(bare), "model.architecture.olmo2Layout"));
    Setup gemma = setup([](ArchitectureDef& a) { a.queryKeyNorm = a.olmo2Layout = a.sandwichNorms = true; });
    CHECK(HasErrorOn(Validate(gemma), "model.architecture.olmo2Layout"));
    Setup phi = setup([](ArchitectureDef& a) { a.fusedProjections = a.rotaryFp32 = true; });
    CHECK(HasErrorOn(Validate(phi), "model.architecture.rotaryFp32"));
  }
}

TEST_CASE("Granite's multipliers make new tensors and save none", "[transformer]") {
  // GraniteModel / GraniteDecoderLayer / GraniteForCausalLM: inputs_embeds × embedding_multiplier,
  // residual + out × residual_multiplier after attention and after the MLP, logits ÷
  // logits_scaling, each by a Python float: a product the size of its input, alive until the next
  // op has used it, saving nothing for backward. Pure bf16, b = 2, s = 64, two blocks.
  const std::int64_t b = 2, s = 64, L = 2, h = 64, V = 100;
  auto setup = [&](bool granite) {
    ArchitectureDef a = TinyLlama();
    a.graniteMultipliers = granite;
    return TransformerSetup(a, b, s, Precision::BF16);
  };
  CHECK(SavedAtForwardEnd(setup(true)) == SavedAtForwardEnd(setup(false)));
  const Setup granite = setup(true);
  const Trace trace = BuildTrace(granite, BuildInventory(granite));
  std::int64_t residual = 0, embeddings = 0, logits = 0;
  for (const Event& e : trace.events) {
    if (e.kind != EventKind::Alloc || e.step != 1 || e.phase != Phase::Forward) continue;
    const std::string label = trace.Label(e);
    if (label.find("* residual_multiplier") != std::string::npos && e.bytes == b * s * h * 2) ++residual;
    if (label.find("* embedding_multiplier") != std::string::npos && e.bytes == b * s * h * 2) ++embeddings;
    if (label.find("/ logits_scaling") != std::string::npos && e.bytes == b * s * V * 2) ++logits;
  }
  CHECK(residual == 2 * L);
  CHECK(embeddings == 1);
  CHECK(logits == 1);
  SECTION("the chunked loss makes no whole logits tensor to scale: refused") {
    Setup chunked = setup(true);
    chunked.training.lossImplementation = LossImplementation::Chunked;
    CHECK(HasErrorOn(Validate(chunked), "training.lossImplementation"));
  }
}

TEST_CASE("attention_bias puts a bias on o_proj as well, and mlp_bias on gate, up and down", "[transformer]") {
  // LlamaAttention: o_proj = nn.Linear(…, bias=config.attention_bias); LlamaMLP: every projection
  // bias=config.mlp_bias. Qwen2's fixed q/k/v biases leave o_proj without one (attentionBias
  // alone). Two blocks of hidden 64, MLP width 96.
  auto estimate = [](const ArchitectureDef& a) { return MustEstimate(TransformerSetup(a, 1, 16)).modelStates; };
  ArchitectureDef a = TinyLlama();
  const ModelStates plain = estimate(a);
  a.outputBias = true;
  CHECK(estimate(a).parameterCount - plain.parameterCount == 2 * 64);
  a.mlpBias = true;
  const ModelStates biased = estimate(a);
  CHECK(biased.parameterCount - plain.parameterCount == 2 * (64 + 96 + 96 + 64));
  // Each bias value is an fp32 weight, its gradient and two AdamW states: 16 B.
  CHECK(biased.totalBytes - plain.totalBytes == 16 * 2 * (64 + 96 + 96 + 64));
  const Setup with = TransformerSetup(a, 1, 16);
  SECTION("refused where the projections are fused or the MLP is a mixture of experts") {
    Setup phi = with;
    phi.model.architecture.fusedProjections = true;
    CHECK(HasErrorOn(Validate(phi), "model.architecture.outputBias"));
    Setup moe = with;
    moe.model.architecture.numExperts = 4;
    CHECK(HasErrorOn(Validate(moe), "model.architecture.mlpBias"));
  }
}

TEST_CASE("SmolLM3's layers without RoPE hand attention their q and k views", "[transformer]") {
  // SmolLM3Attention skips apply_rotary_pos_emb where no_rope_layers[i] is 0 (every fourth layer
  // by default): no rotated q and k are made there, and attention saves the projections' views,
  // as many bytes as the rotated tensors it saves elsewhere. Four blocks, pure bf16.
  auto setup = [&](std::int64_t interval) {
    ArchitectureDef a = TinyLlama();
    a.numLayers = 4;
    a.noRopeInterval = interval;
    return TransformerSetup(a, 2, 32, Precision::BF16);
  };
  auto rotated = [](const Setup& s) {
    const Trace trace = BuildTrace(s, BuildInventory(s));
    int n = 0;
    for (const Event& e : trace.events) {
      if (e.kind == EventKind::Alloc && e.step == 1 && e.phase == Phase::Forward &&
          trace.Label(e).find("q with RoPE") != std::string::npos) {
        ++n;
      }
    }
    return n;
  };
  CHECK(rotated(setup(0)) == 4);
  CHECK(rotated(setup(4)) == 3);  // layer 3 has none
  CHECK(rotated(setup(2)) == 2);  // layers 1 and 3 have none
  CHECK(rotated(setup(1)) == 0);
  CHECK(SavedAtForwardEnd(setup(4)) == SavedAtForwardEnd(setup(0)));
  SECTION("refused where the attention is not Llama's") {
    Setup phi = setup(4);
    phi.model.architecture.fusedProjections = true;
    CHECK(HasErrorOn(Validate(phi), "model.architecture.noRopeInterval"));
    Setup negative = setup(-1);
    CHECK(HasErrorOn(Validate(negative), "model.architecture.noRopeInterval"));
  }
}

TEST_CASE("GPT-NeoX keeps what its forward saves: the MLP's norm input and the value's view of query_key_value",
          "[transformer]") {
  // Pythia-style blocks in pure bf16, b = 2, s = 64, h = 128 (4 heads of 32, a quarter rotated).
  const std::int64_t b = 2, s = 64, h = 128, L = 2;
  auto setup = [&](auto change) {
    Setup x = TinyTransformer(Family::GPTNeoX, static_cast<int>(L), Precision::BF16);
    ArchitectureDef& a = x.model.architecture;
    a.hiddenSize = h; a.numHeads = 4; a.numKeyValueHeads = 0; a.intermediateSize = 4 * h;
    a.partialRotaryFactor = 0.25; a.maxPositionEmbeddings = 2048;
    x.training.batchSize = b;
    x.training.sequenceLength = s;
    change(x);
    return x;
  };
  SECTION("without the parallel residual, the MLP's LayerNorm saves attn + x, a tensor of its own") {
    // With it, post_attention_layernorm reads the block input, which input_layernorm saves already.
    CHECK(SavedAtForwardEnd(setup([](Setup& x) { x.model.architecture.parallelResidual = false; })) -
              SavedAtForwardEnd(setup([](Setup&) {})) ==
          L * b * s * h * 2);
  }
  SECTION("under SDPA the value's view holds all of query_key_value unless the KV cache copies k and v") {
    // Without the cache SDPA saves q, k and the value view (qkv's 3·b·s·h); with it q and the
    // cache's copies of k and v (b·s·h each): 2·b·s·h per layer less.
    auto sdpa = [](bool cache) {
      return [cache](Setup& x) {
        x.training.attention = AttentionImplementation::SDPA;
        x.training.useCache = cache;
      };
    };
    CHECK(SavedAtForwardEnd(setup(sdpa(false))) - SavedAtForwardEnd(setup(sdpa(true))) == L * 2 * b * s * h * 2);
  }
  SECTION("refused where it is not simulated") {
    Setup tp = setup([](Setup& x) { x.parallel.tensorParallel = 2; });
    CHECK(HasErrorOn(Validate(tp), "parallel.tensorParallel"));
    Setup kv = setup([](Setup& x) { x.model.architecture.numKeyValueHeads = 2; });
    CHECK(HasErrorOn(Validate(kv), "model.architecture.numKeyValueHeads"));
  }
}

TEST_CASE("Gemma 2's fields are refused where they are not simulated", "[transformer][validation]") {
  Setup s = TransformerSetup(TinyLlama(), 1, 16);
  SECTION("outside the llama family") {
    s.model.architecture = FindPreset("gpt2")->architecture;
    s.model.architecture.finalLogitSoftcap = 30.0;
    CHECK(HasErrorOn(Validate(s), "model.architecture.finalLogitSoftcap"));
  }
  SECTION("a negative or non-finite cap") {
    s.model.architecture.attentionLogitSoftcap = -1.0;
    s.model.architecture.finalLogitSoftcap = std::numeric_limits<double>::quiet_NaN();
    const auto errors = Validate(s);
    CHECK(HasErrorOn(errors, "model.architecture.attentionLogitSoftcap"));
    CHECK(HasErrorOn(errors, "model.architecture.finalLogitSoftcap"));
  }
  SECTION("a negative window") {
    s.model.architecture.slidingWindow = -4;
    CHECK(HasErrorOn(Validate(s), "model.architecture.slidingWindow"));
  }
  SECTION("sandwich norms with experts") {
    s.model.architecture.sandwichNorms = true;
    s.model.architecture.numExperts = 4;
    CHECK(HasErrorOn(Validate(s), "model.architecture.sandwichNorms"));
  }
  SECTION("the logit cap with a loss that makes no logits tensor") {
    s.model.architecture.finalLogitSoftcap = 30.0;
    s.training.lossImplementation = LossImplementation::Chunked;
    CHECK(HasErrorOn(Validate(s), "training.lossImplementation"));
  }
}

TEST_CASE("Phi-3's fused qkv_proj stays whole while SDPA saves the value, unless the KV cache copies it", "[transformer]") {
  // Same shapes with separate and with fused projections, pure bf16, b = 2, s = 64.
  const std::int64_t b = 2, s = 64, L = 2, h = 128, heads = 4, d = 32;
  auto saved = [&](bool fused, AttentionImplementation attention, bool useCache) {
    Setup x = TinyTransformer(Family::Llama, static_cast<int>(L), Precision::BF16);
    ArchitectureDef& a = x.model.architecture;
    a.hiddenSize = h; a.numHeads = heads; a.numKeyValueHeads = heads; a.headDim = d;
    a.fusedProjections = fused;
    x.training.batchSize = b;
    x.training.sequenceLength = s;
    x.training.attention = attention;
    x.training.useCache = useCache;
    return SavedAtForwardEnd(x);
  };
  const auto sdpa = AttentionImplementation::SDPA, eager = AttentionImplementation::Eager;
  // Without the cache SDPA saves the value as the view it is: of v_proj's output, or of the
  // whole fused projection, whose query and key parts (heads·d + kv·d per token, 2 B) then stay
  // too. The gate/up halves are views of gate_up_proj's output: the same bytes as two projections.
  CHECK(saved(true, sdpa, false) - saved(false, sdpa, false) == L * b * s * (heads * d + heads * d) * 2);
  // With transformers' DynamicCache (use_cache, the default) SDPA saves the cache's copies of the
  // key and the value: qkv goes, and the fused model keeps what the separate one does.
  CHECK(saved(true, sdpa, true) == saved(false, sdpa, true));
  // Eager's matmul copies the transposed value view to 3-D and saves the copy, as many bytes as
  // v_proj's output: fused or not, the same is kept.
  CHECK(saved(true, eager, true) == saved(false, eager, true));
  CHECK(saved(true, eager, false) == saved(false, eager, false));
}
