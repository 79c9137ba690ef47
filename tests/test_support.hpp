// Small builders shared by the test files.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "gpumem/estimate.hpp"
#include "gpumem/pickle.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/solve.hpp"

namespace gpumem::test {

// How much slower the instrumented build runs than the release build the time bounds are set
// for: the sanitizers suite (build/asan, ASan + UBSan at -O1) runs these tests 3–5× slower
// (a million-key config import: 0.5 s release, 2.6 s under ASan on the 2-core CI machine); the
// WebAssembly build of the suite under node runs them about 3× slower than the native release
// build (nlohmann's parser in wasm; 2.6 s and 5.5 s for two of them on a loaded 2-core machine).
#if defined(__EMSCRIPTEN__)
inline constexpr double kInstrumentationSlowdown = 3.0;
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr double kInstrumentationSlowdown = 4.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kInstrumentationSlowdown = 4.0;
#else
inline constexpr double kInstrumentationSlowdown = 1.0;
#endif
#else
inline constexpr double kInstrumentationSlowdown = 1.0;
#endif

// Seconds `f` takes, in release-build terms (the time bounds of bounds_test and budget_test:
// they check that work grows linearly, not how fast an instrumented build is).
inline double Seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kInstrumentationSlowdown;
}

inline LayerDef Linear(std::int64_t in, std::int64_t out, bool bias = true) { return LinearLayer(in, out, bias); }
inline LayerDef Embedding(std::int64_t rows, std::int64_t dim) { return EmbeddingLayer(rows, dim); }
inline LayerDef Activation(LayerKind kind) { return ActivationLayer(kind); }
inline LayerDef Dropout(double p) { return DropoutLayer(p); }

inline Setup QuickSetup(std::int64_t parameters, Precision precision, OptimizerKind optimizer) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::ParameterCount;
  s.model.parameterCount = parameters;
  s.training.precision = precision;
  s.training.optimizer = optimizer;
  return s;
}

inline Setup LayerSetup(std::vector<LayerDef> layers, LossKind loss, std::int64_t batch,
                        std::int64_t sequence, Precision precision, OptimizerKind optimizer) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::LayerList;
  s.model.layers = std::move(layers);
  s.model.loss = loss;
  s.training.batchSize = batch;
  s.training.sequenceLength = sequence;
  s.training.precision = precision;
  s.training.optimizer = optimizer;
  return s;
}

// Estimates a setup that must be valid; fails the test otherwise.
inline Estimate MustEstimate(const Setup& setup) {
  EstimateResult r = EstimateMemory(setup);
  if (!r.ok()) {
    std::string all;
    for (const auto& e : r.errors) all += e.field + ": " + e.message + "\n";
    FAIL("setup unexpectedly invalid:\n" << all);
  }
  return r.estimate;
}

// A small transformer of `family` for counts by hand: vocabulary 1,000, hidden 64, 4 heads and 4
// key/value heads, intermediate 128, `layers` blocks (the family's other defaults); batch 2 × 16,
// AdamW in `precision`.
inline Setup TinyTransformer(Family family, int layers = 2, Precision precision = Precision::BF16Mixed) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = DefaultArchitecture(family);
  ArchitectureDef& a = s.model.architecture;
  a.vocabSize = 1000;
  a.hiddenSize = 64;
  a.numLayers = layers;
  a.numHeads = 4;
  a.numKeyValueHeads = 4;
  a.intermediateSize = 128;
  s.training.batchSize = 2;
  s.training.sequenceLength = 16;
  s.training.precision = precision;
  s.training.optimizer = OptimizerKind::AdamW;
  return s;
}

// Llama 3.2 1B in pure bf16 with SDPA and every block checkpointed, 4 × 2048 tokens on 12 GiB:
// the logits and their fp32 copies hold the peak (where make it fit offers a loss change).
// torchtune's QLoRA on a small Llama (qlora_llama3 as torchtune builds it): hidden 256, 4 heads
// (q, k, v, o [256, 256] = 65,536 values = 4 scaler blocks), intermediate 512 (gate, up, down:
// 131,072 = 8 scaler blocks), 2 blocks, an untied head and a vocabulary of 1,001; LoRA r 8 on
// q_proj and v_proj in bf16, every block linear a torchao NF4Tensor.
inline Setup TorchtuneQloraLlama() {
  Setup s = TinyTransformer(Family::Llama, 2, Precision::BF16);  // torchtune: dtype bf16
  ArchitectureDef& a = s.model.architecture;
  a.vocabSize = 1001;
  a.hiddenSize = 256;
  a.intermediateSize = 512;
  s.finetune.lora = true;
  s.finetune.r = 8;
  s.finetune.adapterDType = AdapterDType::Weights;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.quantLayout = QuantLayout::TorchaoNf4;
  s.finetune.computeDType = DType::BF16;  // LinearNF4: weight.to(input.dtype)
  return s;
}

inline Setup LogitsPeakSetup() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-3.2-1b")->architecture;
  s.training.batchSize = 4;
  s.training.sequenceLength = 2048;
  s.training.precision = Precision::BF16;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.gpu.memoryGiB = 12;
  return s;
}

// The suggestion of "Make it fit" with this id, or nullptr when it is not offered.
inline const FitSuggestion* Suggestion(const SolveResult& r, std::string_view id) {
  for (const FitSuggestion& f : r.suggestions) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

// A small Llama whose shapes the parallel tests count by hand: vocabulary 1001 and intermediate
// 171 (odd sizes, so sharding pads), hidden 64, 4 heads of 16, 2 k/v heads, untied head; bf16
// mixed, AdamW, 1 × 32 tokens. A block holds 45,248 elements: q 4,096, k and v 2,048 each,
// o 4,096, gate, up and down 10,944 each, two norms of 64.
inline Setup SmallLlama(std::int64_t layers) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  ArchitectureDef& a = s.model.architecture;
  a.family = Family::Llama;
  a.vocabSize = 1001;
  a.hiddenSize = 64;
  a.numLayers = layers;
  a.numHeads = 4;
  a.numKeyValueHeads = 2;
  a.intermediateSize = 171;
  a.tieWordEmbeddings = false;
  s.training.precision = Precision::BF16Mixed;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.batchSize = 1;
  s.training.sequenceLength = 32;
  return s;
}

// SmallLlama(2) under DeepSpeed ZeRO-3 over 3 ranks (odd sizes pad): the setup the ZeRO-3 tests
// (zero3_reduce_test.cpp, zero3_fetch_test.cpp, zero3_step_test.cpp) count by hand.
inline Setup SmallLlamaZero3() {
  Setup s = SmallLlama(2);
  s.parallel.dataParallel = 3;
  s.parallel.zeroStage = 3;
  return s;
}

// Estimates a setup that must be valid, with the labelled timeline (every event, named).
inline Estimate MustEstimateLabelled(const Setup& setup) {
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::Labelled;
  EstimateResult r = EstimateMemory(setup, o);
  if (!r.ok()) {
    std::string all;
    for (const auto& e : r.errors) all += e.field + ": " + e.message + "\n";
    FAIL("setup unexpectedly invalid:\n" << all);
  }
  return r.estimate;
}

// The index of step `step`'s first timeline event whose label holds `text`; the timeline's size
// when there is none.
inline std::size_t TimelineIndexOf(const Estimate& e, const std::string& text, int step) {
  for (std::size_t i = 0; i < e.timeline.size(); ++i) {
    if (e.timeline[i].step == step && e.timeline[i].label.find(text) != std::string::npos) return i;
  }
  return e.timeline.size();
}

// The bytes of the first allocation whose label holds `label` in a labelled timeline; -1 if none.
inline std::int64_t FirstAllocBytes(const Estimate& e, const std::string& label) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.deltaBytes > 0 && p.label.find(label) != std::string::npos) return p.deltaBytes;
  }
  return -1;
}
inline std::int64_t FirstAllocBytes(const Setup& setup, const std::string& label) {
  return FirstAllocBytes(MustEstimateLabelled(setup), label);
}
// Each allocation whose label holds `label` in step `step` (0: init), in order; empty when none.
inline std::vector<std::int64_t> AllocsOf(const Estimate& e, const std::string& label, int step) {
  std::vector<std::int64_t> out;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step == step && p.deltaBytes > 0 && p.label.find(label) != std::string::npos) out.push_back(p.deltaBytes);
  }
  return out;
}
// The bytes of every allocation whose label holds `label` in step `step` (a foreach list is one
// allocation per tensor); -1 when there is none.
inline std::int64_t StepAllocBytes(const Estimate& e, const std::string& label, int step = 1) {
  std::int64_t sum = -1;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step == step && p.deltaBytes > 0 && p.label.find(label) != std::string::npos) sum = (sum < 0 ? 0 : sum) + p.deltaBytes;
  }
  return sum;
}

// Megatron-LM's GPT 12 × 512 of its functional tests (tests/data/published-parallel.json): 8
// heads, vocabulary 50,304, 1,024 positions, FFN 2,048, tied; bf16 with fp32 masters, fused
// AdamW, micro-batch 4 × 1,024, Megatron's vocab-parallel loss; one GPU unless the test says.
inline Setup MegatronGpt12x512() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = DefaultArchitecture(Family::GPT2);
  ArchitectureDef& a = s.model.architecture;
  a.vocabSize = 50304;
  a.hiddenSize = 512;
  a.numLayers = 12;
  a.numHeads = 8;
  a.numKeyValueHeads = 8;
  a.maxPositionEmbeddings = 1024;
  a.intermediateSize = 2048;
  a.tieWordEmbeddings = true;
  s.training.precision = Precision::BF16Mixed;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.optimizerImplementation = OptimizerImplementation::Fused;
  s.training.batchSize = 4;
  s.training.sequenceLength = 1024;
  s.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  return s;
}

inline std::int64_t BytesIn(const Snapshot& s, Category c) {
  for (const auto& row : s.byCategory) if (row.category == c) return row.bytes;
  return 0;
}

// The activations held at the end of step 1's forward (what the blocks saved for backward).
inline std::int64_t SavedAtForwardEnd(const Setup& s) { return BytesIn(MustEstimate(s).forwardEnd, Category::Activations); }

// What one block saves for backward: the forward-end activations of two blocks less one's.
inline std::int64_t SavedPerBlock(Setup s) {
  s.model.architecture.numLayers = 2;
  const std::int64_t two = SavedAtForwardEnd(s);
  s.model.architecture.numLayers = 1;
  return two - SavedAtForwardEnd(s);
}

inline bool HasErrorOn(const std::vector<FieldError>& errors, const std::string& field) {
  for (const auto& e : errors) if (e.field == field) return true;
  return false;
}

// One entry of a measured snapshot's trace (the H100's stack-labelled snapshots in
// tests/data/cuda/stacks): "alloc", "free_requested", "free_completed", "segment_alloc", …,
// with its bytes and address.
struct StackTraceEntry {
  std::string action;
  std::int64_t size = 0;
  std::int64_t address = 0;
};
inline std::vector<StackTraceEntry> ReadStackTrace(const std::string& name) {
  std::ifstream in(std::string(GPUMEM_TEST_DATA) + "/cuda/stacks/" + name, std::ios::binary);
  REQUIRE(in.good());
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const pickle::Result r = pickle::Unpickle(bytes);
  REQUIRE(r.ok());
  const pickle::Document& d = r.document;
  const pickle::Node* traces = d.Get(d.at(d.root), "device_traces");
  REQUIRE(traces != nullptr);
  REQUIRE_FALSE(traces->items.empty());
  std::vector<StackTraceEntry> entries;
  for (std::uint32_t id : d.at(traces->items[0]).items) {
    const pickle::Node& e = d.at(id);
    const pickle::Node* action = d.Get(e, "action");
    const pickle::Node* size = d.Get(e, "size");
    const pickle::Node* address = d.Get(e, "addr");
    if (action == nullptr || size == nullptr || address == nullptr) continue;
    entries.push_back({std::string(action->text), size->integer, address->integer});
  }
  return entries;
}

}  // namespace gpumem::test
