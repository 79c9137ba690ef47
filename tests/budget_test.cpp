// The work budget (issue 14): every setup is answered or refused in bounded time and memory.
// PredictEvents (setup.hpp) must be an upper bound of the events the simulation makes and
// within 2× of them; setups beyond kMaxPredictedEvents are refused naming the field that drives
// them; each input class at its limit returns in under 2 s; and a structure-aware fuzz run of
// random valid setups checks the properties every estimate must keep.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "gpumem/format.hpp"
#include "gpumem/import.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;
using nlohmann::json;

namespace {

// What the page's views and solver ask for: no timeline, no words.
EstimateOptions Lean() {
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::None;
  o.explain = false;
  return o;
}

Setup PresetSetup(const Preset& p) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = p.architecture;
  s.training.sequenceLength = p.defaultSequenceLength;
  return s;
}

const char* NameOf(Checkpointing c) {
  switch (c) {
    case Checkpointing::None: return "none";
    case Checkpointing::EveryBlock: return "everyBlock";
    case Checkpointing::EveryKthBlock: return "everyKthBlock";
    case Checkpointing::Selective: return "selective";
    case Checkpointing::SelectiveOp: return "selectiveOp";
  }
  return "?";
}

// The first error of a setup that must be refused.
FieldError MustRefuse(const Setup& s) {
  const std::vector<FieldError> errors = Validate(s);
  REQUIRE(!errors.empty());
  return errors.front();
}

// A layer list of `blocks` × (linear width → width, relu).
Setup DeepList(std::size_t blocks, std::int64_t width) {
  std::vector<LayerDef> layers;
  layers.reserve(2 * blocks);
  for (std::size_t i = 0; i < blocks; ++i) {
    layers.push_back(Linear(width, width));
    layers.push_back(Activation(LayerKind::ReLU));
  }
  return LayerSetup(std::move(layers), LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::Adam);
}

// The largest n in [1, hi] for which `fits(n)` holds (fits is monotone, fits(1) holds).
std::int64_t LargestFitting(std::int64_t hi, const std::function<bool(std::int64_t)>& fits) {
  std::int64_t lo = 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid; else hi = mid - 1;
  }
  return lo;
}

bool WithinBudget(const Setup& s) { return PredictEvents(s).predictedEvents <= kMaxPredictedEvents; }

// The most Llama-2-7B-shaped blocks the budget admits, 512 tokens, every block checkpointed.
Setup DeepestLlama() {
  Setup deep = PresetSetup(*FindPreset("llama-2-7b"));
  deep.training.sequenceLength = 512;
  deep.training.checkpointing = Checkpointing::EveryBlock;
  deep.model.architecture.numLayers = LargestFitting(Limits::maxLayers, [&](std::int64_t n) {
    Setup t = deep;
    t.model.architecture.numLayers = n;
    return WithinBudget(t);
  });
  return deep;
}

}  // namespace

TEST_CASE("the predicted events bound activation offloading too", "[budget]") {
  for (const Preset& p : Presets()) {
    for (Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock}) {
      Setup s = PresetSetup(p);
      s.training.checkpointing = c;
      s.training.activationOffloading = true;
      const EstimateResult r = EstimateMemory(s, Lean());
      REQUIRE(r.ok());
      const double real = double(r.estimate.eventCount);
      const double predicted = PredictEvents(s).predictedEvents;
      INFO(p.id << " " << NameOf(c) << ": " << real << " events, predicted " << predicted);
      CHECK(predicted >= real);
      CHECK(predicted <= 2.0 * real);
    }
  }
}

TEST_CASE("the predicted events bound every preset and checkpointing mode within 2x", "[budget]") {
  for (const Preset& p : Presets()) {
    for (Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock, Checkpointing::EveryKthBlock,
                            Checkpointing::Selective, Checkpointing::SelectiveOp}) {
      Setup s = PresetSetup(p);
      s.training.checkpointing = c;
      const EstimateResult r = EstimateMemory(s, Lean());
      REQUIRE(r.ok());
      const double real = double(r.estimate.eventCount);
      const double predicted = PredictEvents(s).predictedEvents;
      INFO(p.id << " " << NameOf(c) << ": " << real << " events, predicted " << predicted);
      CHECK(predicted >= real);
      CHECK(predicted <= 2.0 * real);
      CHECK(predicted <= kMaxPredictedEvents);  // every preset stays inside the budget
    }
  }
}

TEST_CASE("the prediction stays an upper bound across precision optimizer and attention", "[budget]") {
  // The options that add events per block: autocast's weight copies, a Python loop's
  // temporaries, Adafactor's factored moments, eager attention's extra ops.
  for (const char* id : {"gpt2", "bert-base-uncased", "qwen2.5-0.5b", "qwen3-0.6b", "gemma-2b", "mixtral-8x7b",
                         "qwen1.5-moe-a2.7b"}) {
    for (Precision pr : {Precision::FP32, Precision::BF16, Precision::FP16Mixed, Precision::AmpFP16}) {
      for (OptimizerImplementation im : {OptimizerImplementation::ForEach, OptimizerImplementation::PerParameter}) {
        for (OptimizerKind opt : {OptimizerKind::SGD, OptimizerKind::AdamW, OptimizerKind::Adafactor}) {
          for (Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock}) {
            Setup s = PresetSetup(*FindPreset(id));
            s.model.architecture.numLayers = 3;
            s.training.sequenceLength = 32;
            s.training.precision = pr;
            s.training.optimizerImplementation = im;
            s.training.optimizer = opt;
            s.training.checkpointing = c;
            const EstimateResult r = EstimateMemory(s, Lean());
            REQUIRE(r.ok());
            INFO(id << " precision " << int(pr) << " implementation " << int(im) << " optimizer " << int(opt)
                    << " " << NameOf(c));
            CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
          }
        }
      }
    }
  }
  // Layer lists (every kind of layer, both losses) and quick mode with Adafactor's matrices.
  std::vector<LayerDef> layers = {Embedding(100, 16), Linear(16, 16), Activation(LayerKind::GELU),
                                  Activation(LayerKind::Tanh), Activation(LayerKind::Sigmoid),
                                  Dropout(0.1), Linear(16, 8), Activation(LayerKind::ReLU)};
  for (LossKind loss : {LossKind::CrossEntropy, LossKind::MSE}) {
    for (Precision pr : {Precision::FP32, Precision::BF16Mixed}) {
      for (OptimizerKind opt : {OptimizerKind::SGD, OptimizerKind::Adam, OptimizerKind::Adafactor}) {
        const Setup s = LayerSetup(layers, loss, 2, 4, pr, opt);
        const EstimateResult r = EstimateMemory(s, Lean());
        REQUIRE(r.ok());
        CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
      }
    }
  }
  Setup quick = QuickSetup(1'000'000'000, Precision::BF16Mixed, OptimizerKind::Adafactor);
  quick.model.largestMatrices.assign(1000, MatrixShape{100, 100});
  quick.training.optimizerImplementation = OptimizerImplementation::PerParameter;
  const EstimateResult r = EstimateMemory(quick, Lean());
  REQUIRE(r.ok());
  CHECK(PredictEvents(quick).predictedEvents >= double(r.estimate.eventCount));
}

TEST_CASE("setups beyond the work budget are refused naming the field that drives them", "[budget]") {
  Setup deep = PresetSetup(*FindPreset("llama-2-7b"));
  deep.model.architecture.numLayers = 10'000;
  deep.training.sequenceLength = 16;
  FieldError e = MustRefuse(deep);
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.architecture.numLayers");
  CHECK_THAT(e.message, Catch::Contains("memory events"));

  Setup experts = PresetSetup(*FindPreset("mixtral-8x7b"));
  experts.model.architecture.numExperts = 1000;
  experts.training.sequenceLength = 16;
  e = MustRefuse(experts);
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.architecture.numExperts");

  e = MustRefuse(DeepList(50'000, 8));
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.layers");

  Setup matrices = QuickSetup(1'000'000'000'000, Precision::BF16Mixed, OptimizerKind::Adafactor);
  matrices.model.largestMatrices.assign(100'000, MatrixShape{10, 10});
  e = MustRefuse(matrices);
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.largestMatrices");

  // The JSON envelope carries the same refusal, and the refusal is cheap.
  double seconds = 0;
  std::string reply;
  seconds = Seconds([&] { reply = EstimateJson(SetupToJson(deep)); });
  const json doc = json::parse(reply);
  CHECK(doc.at("ok") == false);
  CHECK(doc.at("errors").at(0).at("field") == "model.architecture.numLayers");
  CHECK(seconds < 0.5);
}

TEST_CASE("a layer list may have kMaxListedLayers layers, whatever their events", "[budget]") {
  // At the limit: accepted.
  CHECK(Validate(DeepList(std::size_t(kMaxListedLayers / 2), 64)).empty());
  // One more: refused on the list, with the count and the limit, though its events are few.
  Setup over = DeepList(std::size_t(kMaxListedLayers / 2), 64);
  over.model.layers.push_back(Activation(LayerKind::ReLU));
  REQUIRE(PredictEvents(over).predictedEvents < kMaxPredictedEvents);
  FieldError e = MustRefuse(over);
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.layers");
  CHECK_THAT(e.message, Catch::Contains("4,001 layers") && Catch::Contains("more than the 4,000"));
  // Activations cost the estimate 12 events each, the page a line of the editor each: 39,000 of
  // them passed the event budget and took the page about 2 s (setup.hpp, kMaxListedLayers).
  Setup relus = DeepList(1, 64);
  relus.model.layers.insert(relus.model.layers.end(), 39'000, Activation(LayerKind::ReLU));
  REQUIRE(PredictEvents(relus).predictedEvents < kMaxPredictedEvents);
  e = MustRefuse(relus);
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.layers");
  // The JSON envelope names the same field.
  const json doc = json::parse(EstimateJson(SetupToJson(relus)));
  CHECK(doc.at("ok") == false);
  CHECK(doc.at("errors").at(0).at("field") == "model.layers");
}

TEST_CASE("quick mode may list kMaxListedMatrices matrices, whatever their events", "[budget]") {
  Setup s = QuickSetup(1'000'000'000'000, Precision::BF16Mixed, OptimizerKind::Adafactor);
  s.model.largestMatrices.assign(std::size_t(kMaxListedMatrices), MatrixShape{1000, 1000});
  CHECK(Validate(s).empty());
  s.model.largestMatrices.push_back(MatrixShape{1000, 1000});
  REQUIRE(PredictEvents(s).predictedEvents < kMaxPredictedEvents);
  const FieldError e = MustRefuse(s);
  CHECK(e.code == ErrorCode::TooLarge);
  CHECK(e.field == "model.largestMatrices");
  CHECK_THAT(e.message, Catch::Contains("8,001 matrices") && Catch::Contains("more than the 8,000"));
}

TEST_CASE("the work budget's refusal gives the events in digits", "[budget]") {
  // Just past the budget the rounded "5e05, more than the 5e05" said nothing.
  Setup deep = DeepestLlama();
  ++deep.model.architecture.numLayers;
  const double predicted = PredictEvents(deep).predictedEvents;
  REQUIRE(predicted > kMaxPredictedEvents);
  const FieldError e = MustRefuse(deep);
  CHECK(e.field == "model.architecture.numLayers");
  CHECK_THAT(e.message, Catch::Contains("about " + FormatCount(std::llround(predicted)) + " memory events, more than the 500,000"));
}

TEST_CASE("a native host's larger work budget takes what the page refuses, up to its own limit", "[budget]") {
  // Qwen/Qwen3-30B-A3B's config.json: 48 layers of 128 experts, every expert simulated one at a
  // time (blocks/moe.cpp), about 1.14e6 predicted events.
  const ConfigImport q = ImportHfConfig(R"({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
      "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128,
      "vocab_size": 151936, "tie_word_embeddings": false, "num_experts": 128, "num_experts_per_tok": 8,
      "moe_intermediate_size": 768, "norm_topk_prob": true})");
  REQUIRE(q.ok());
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = q.architecture;
  s.training.sequenceLength = 2048;
  s.training.precision = Precision::BF16;
  s.finetune.lora = true;  // PEFT LoRA on the attention: the experts stay frozen and adapterless
  s.finetune.targetModules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const double predicted = PredictEvents(s).predictedEvents;
  REQUIRE(predicted > kMaxPredictedEvents);
  REQUIRE(predicted < kMaxPagePredictedEvents);
  // A search's budget refuses it and says where a larger one is: the page's single estimate.
  const std::vector<FieldError> search = Validate(s);
  REQUIRE(search.size() == 1);
  CHECK(search[0].field == "model.architecture.numExperts");
  CHECK_THAT(search[0].message, Catch::Contains("more than the 500,000 each estimate of a search may take") &&
                                    Catch::Contains("a single estimate takes up to 1,500,000 in the page") &&
                                    Catch::Contains("command-line tool") && Catch::Contains("2,000,000"));
  // The page's single estimate takes it (frozen experts: 1,258,256 predicted, 853,055 simulated).
  CHECK(Validate(s, kMaxPagePredictedEvents).empty());
  // Past the page's, the page says the command-line tool takes it.
  Setup deeper = s;
  deeper.model.architecture.numLayers = 94;  // Qwen3-235B-A22B's depth
  REQUIRE(PredictEvents(deeper).predictedEvents > kMaxPagePredictedEvents);
  REQUIRE(PredictEvents(deeper).predictedEvents < kMaxHostPredictedEvents);
  const std::vector<FieldError> page = Validate(deeper, kMaxPagePredictedEvents);
  REQUIRE(page.size() == 1);
  CHECK_THAT(page[0].message, Catch::Contains("more than the 1,500,000 an estimate may take in the page") &&
                                  Catch::Contains("command-line tool") && Catch::Contains("2,000,000"));
  // The host's takes it, and the prediction stays an upper bound of what is simulated.
  CHECK(Validate(s, kMaxHostPredictedEvents).empty());
  const EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .timelineLimit = 0,
                                              .explain = false, .maxPredictedEvents = kMaxHostPredictedEvents});
  REQUIRE(r.ok());
  CHECK(double(r.estimate.eventCount) <= predicted);
  CHECK(double(r.estimate.eventCount) > kMaxPredictedEvents);
  // No budget beyond the host's: a budget above it is the host's, and a setup past it is refused
  // without pointing anywhere else.
  s.model.architecture.numLayers = 200;
  const std::vector<FieldError> host = Validate(s, 1e300);
  REQUIRE(host.size() == 1);
  CHECK_THAT(host[0].message, Catch::Contains("more than the 2,000,000") && !Catch::Contains("command-line tool"));
  // And below the smallest, the smallest (NaN too).
  CHECK(Validate(s, 1.0).front().message.find("more than the 500,000") != std::string::npos);
  CHECK(Validate(s, std::nan("")).front().message.find("more than the 500,000") != std::string::npos);
}

TEST_CASE("each input class at its limit returns in under 2 s natively", "[budget]") {
  // The page asks for a labelled timeline (thinned to 2,000 points): the costliest answer.
  auto timeJson = [](const Setup& s, const char* what) {
    const std::string text = SetupToJson(s);
    std::string reply;
    const double seconds = Seconds([&] { reply = EstimateJson(text); });
    INFO(what << ": " << seconds << " s, " << PredictEvents(s).predictedEvents << " events predicted");
    CHECK(json::parse(reply).at("ok") == true);
    CHECK(seconds < 2.0);
  };
  // Deep models: the most Llama-2-7B-shaped blocks the budget admits, with checkpointing.
  const Setup deep = DeepestLlama();
  timeJson(deep, "deep");
  // Many experts: Qwen1.5-MoE's 24 blocks with as many experts as the budget admits.
  Setup moe = PresetSetup(*FindPreset("qwen1.5-moe-a2.7b"));
  moe.training.sequenceLength = 512;
  moe.model.architecture.numExperts = LargestFitting(Limits::maxExperts, [&](std::int64_t n) {
    Setup t = moe;
    t.model.architecture.numExperts = n;
    return WithinBudget(t);
  });
  timeJson(moe, "experts");
  // Many layers in a list: as many as a list may have (kMaxListedLayers binds before the events).
  const std::int64_t blocks = std::min(kMaxListedLayers / 2, LargestFitting(Limits::maxLayers / 2, [&](std::int64_t n) {
    return WithinBudget(DeepList(std::size_t(n), 8));
  }));
  CHECK(blocks == kMaxListedLayers / 2);
  timeJson(DeepList(std::size_t(blocks), 64), "layer list");
  // Long context: a million tokens through GPT-2-sized Llama blocks with SDPA and checkpointing.
  Setup longContext = PresetSetup(*FindPreset("llama-3.2-1b"));
  longContext.training.sequenceLength = 1'000'000;
  longContext.training.attention = AttentionImplementation::SDPA;
  longContext.training.checkpointing = Checkpointing::EveryBlock;
  timeJson(longContext, "long context");
  // Huge error lists: a million bad layers are refused with a capped list.
  Setup bad = DeepList(Limits::maxLayers / 2, 8);
  for (LayerDef& l : bad.model.layers) if (l.kind == LayerKind::Linear) l.inFeatures = -1;
  const std::string text = SetupToJson(bad);
  std::string reply;
  const double seconds = Seconds([&] { reply = EstimateJson(text); });
  CHECK(json::parse(reply).at("ok") == false);
  CHECK(seconds < 2.0);
}

namespace {

// A random valid setup: a family, sizes within the budget, and every training option.
Setup RandomSetup(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  Setup s = DefaultSetup();
  TrainingDef& t = s.training;
  t.batchSize = pick(1, 8);
  t.sequenceLength = pick(1, 512);
  t.optimizer = static_cast<OptimizerKind>(pick(0, 4));
  t.optimizerImplementation = static_cast<OptimizerImplementation>(pick(0, 2));
  if (t.optimizer == OptimizerKind::Adafactor && t.optimizerImplementation == OptimizerImplementation::Fused) {
    t.optimizerImplementation = OptimizerImplementation::ForEach;
  }
  t.zeroGradSetToNone = pick(0, 1) == 1;
  const int kind = int(pick(0, 9));
  if (kind == 0) {  // quick mode
    s.model.kind = ModelKind::ParameterCount;
    s.model.parameterCount = pick(1'000, 100'000'000'000);
    t.precision = static_cast<Precision>(pick(0, 5));
    return s;
  }
  if (kind <= 2) {  // a layer list
    s.model.kind = ModelKind::LayerList;
    s.model.loss = pick(0, 1) ? LossKind::CrossEntropy : LossKind::MSE;
    std::int64_t width = pick(1, 2048);
    if (pick(0, 1)) s.model.layers.push_back(Embedding(pick(1, 50'000), width));
    else s.model.layers.push_back(Linear(pick(1, 2048), width, pick(0, 1) == 1));
    for (std::int64_t i = pick(0, 40); i > 0; --i) {
      switch (pick(0, 5)) {
        case 0: { const std::int64_t out = pick(1, 2048); s.model.layers.push_back(Linear(width, out, pick(0, 1) == 1)); width = out; break; }
        case 1: s.model.layers.push_back(Activation(LayerKind::ReLU)); break;
        case 2: s.model.layers.push_back(Activation(LayerKind::GELU)); break;
        case 3: s.model.layers.push_back(Activation(LayerKind::Tanh)); break;
        case 4: s.model.layers.push_back(Activation(LayerKind::Sigmoid)); break;
        default: s.model.layers.push_back(Dropout(pick(0, 1) ? 0.0 : 0.1)); break;
      }
    }
    const Precision listPrecisions[] = {Precision::FP32, Precision::BF16, Precision::BF16Mixed, Precision::FP16Mixed};
    t.precision = listPrecisions[pick(0, 3)];
    return s;
  }
  s.model.kind = ModelKind::Transformer;
  ArchitectureDef& a = s.model.architecture;
  a.family = static_cast<Family>(pick(0, 3));
  a.numHeads = pick(1, 16);
  const std::int64_t headDim = 2 * pick(4, 64);
  a.hiddenSize = a.numHeads * headDim;
  a.numLayers = pick(1, 24);
  a.vocabSize = pick(100, 60'000);
  a.intermediateSize = pick(0, 1) ? 0 : pick(16, 8192);
  a.maxPositionEmbeddings = 4096;
  if (a.family == Family::Llama) {
    const std::int64_t divisors[] = {1, 2, 4, 8, 16};
    std::int64_t kv = divisors[pick(0, 4)];
    while (a.numHeads % kv != 0) kv /= 2;
    a.numKeyValueHeads = kv;
    a.attentionBias = pick(0, 1) == 1;
    a.queryKeyNorm = pick(0, 2) == 0;
    a.rmsNormUnitOffset = a.embeddingScale = pick(0, 2) == 0;
    if (pick(0, 3) == 0) {  // Phi-3: fused projections (a dense MLP, no biases or q/k norms)
      a.fusedProjections = true;
      a.attentionBias = a.queryKeyNorm = false;
      if (pick(0, 1)) a.partialRotaryFactor = 0.5;
    } else if (pick(0, 3) == 0) {
      a.numExperts = pick(2, 16);
      a.expertsPerToken = pick(1, a.numExperts);
      a.expertIntermediateSize = pick(16, 2048);
      if (pick(0, 1)) a.sharedExpertIntermediateSize = pick(16, 2048);
    } else if (pick(0, 2) == 0) {  // Gemma 2: sandwich norms, soft caps, sliding layers
      a.sandwichNorms = true;
      a.attentionLogitSoftcap = 50.0;
      a.finalLogitSoftcap = pick(0, 1) ? 30.0 : 0.0;
      a.slidingWindow = pick(0, 1) ? pick(1, 4096) : 0;
      a.slidingWindowPattern = pick(0, 3);
      a.gemma3Layout = a.queryKeyNorm && a.embeddingScale && pick(0, 1) == 1;
    } else if (pick(0, 2) == 0) {  // OLMo 2 / 3: post norms, q/k norms over the projections
      a.queryKeyNorm = a.olmo2Layout = true;
      a.rmsNormUnitOffset = a.embeddingScale = false;
      a.rotaryFp32 = pick(0, 1) == 1;
      a.slidingWindow = pick(0, 1) ? pick(1, 4096) : 0;
      a.slidingWindowPattern = pick(0, 4);
    } else if (pick(0, 2) == 0 && !a.embeddingScale) {  // Granite: scalar multipliers
      a.graniteMultipliers = true;
    }
    if (!a.fusedProjections && !a.olmo2Layout && pick(0, 3) == 0) a.noRopeInterval = pick(1, 4);  // SmolLM3
    if (!a.fusedProjections) {  // LlamaConfig's attention_bias on o_proj, mlp_bias on a dense MLP
      a.outputBias = pick(0, 3) == 0;
      a.mlpBias = a.numExperts == 0 && pick(0, 3) == 0;
    }
  } else {
    a.numKeyValueHeads = 0;
    a.numExperts = 0;
    a.attentionBias = a.family == Family::GPTNeoX;
    if (a.family == Family::GPTNeoX) {  // Pythia: a quarter of each head rotated, parallel residual
      a.partialRotaryFactor = headDim % 8 == 0 ? 0.25 : 1.0;
      a.parallelResidual = pick(0, 1) == 1;
    }
  }
  t.precision = static_cast<Precision>(pick(0, 5));
  t.attention = pick(0, 1) ? AttentionImplementation::SDPA : AttentionImplementation::Eager;
  t.checkpointing = static_cast<Checkpointing>(pick(0, 3));
  t.checkpointInterval = pick(1, 4);
  t.sequenceLength = pick(1, 2048);
  return s;
}

std::int64_t SumOfCategories(const Snapshot& s) {
  std::int64_t sum = 0;
  for (const CategoryBytes& c : s.byCategory) sum += c.bytes;
  return sum;
}

}  // namespace

TEST_CASE("a structure-aware fuzz run of valid setups keeps every estimate's properties", "[budget][fuzz]") {
  // Bounded by time (about 20 s here; a wasm run gets as far as it can), from a fixed seed so
  // that a failure names a reproducible setup.
  const double budgetSeconds = 20.0;
  std::mt19937_64 rng(14);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int run = 0, refused = 0, estimates = 0;
  double slowest = 0;
  auto estimate = [&](const Setup& s) {
    EstimateResult r;
    const double seconds = Seconds([&] { r = EstimateMemory(s, Lean()); });
    slowest = std::max(slowest, seconds);
    ++estimates;
    CHECK(seconds < 2.0);
    return r;
  };
  while (elapsed() < budgetSeconds && run < 100'000) {
    const Setup s = RandomSetup(rng);
    ++run;
    if (!Validate(s).empty()) {  // a random combination the validator refuses (a size bound)
      ++refused;
      continue;
    }
    INFO("setup " << run << ": " << SetupToJson(s));
    const EstimateResult r = estimate(s);
    REQUIRE(r.ok());
    CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
    CHECK(SumOfCategories(r.estimate.peak) == r.estimate.peak.totalBytes);
    // Deterministic: the same setup gives the same JSON.
    const EstimateResult again = estimate(s);
    CHECK(EstimateToJson(again.estimate) == EstimateToJson(r.estimate));
    // Monotone: one more sample, or a longer sequence, never lowers the peak.
    Setup bigger = s;
    bigger.training.batchSize += 1;
    if (Validate(bigger).empty()) CHECK(estimate(bigger).estimate.peak.totalBytes >= r.estimate.peak.totalBytes);
    bigger = s;
    bigger.training.sequenceLength = std::min<std::int64_t>(2 * s.training.sequenceLength, 4096);
    if (Validate(bigger).empty()) CHECK(estimate(bigger).estimate.peak.totalBytes >= r.estimate.peak.totalBytes);
  }
  WARN("fuzz: " << run << " setups, " << refused << " refused by validation, " << estimates
                << " estimates, slowest " << slowest << " s");
  CHECK(run - refused > 50);
}
