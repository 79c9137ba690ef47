// The simulated step: exact totals of small models worked out by hand, and the invariants of
// the replay.
#include <catch2/catch.hpp>

#include <algorithm>

#include "gpumem/heuristics.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

TEST_CASE("a tiny fp32 MLP counted byte by byte", "[trace]") {
  // Linear(4→3) → ReLU → Linear(3→2), MSE, batch 2, fp32, SGD.
  // Parameters 12+3+6+2 = 23 × 4 B = 92 B. Forward adds input 32, targets 16, linear output 24,
  // ReLU output 24 → 188 (the linear output, saved by nobody, is then freed: 164), output 16
  // → 180, the loss 16 (mse_loss's meta function allocates its output at the element-wise
  // size, 2 × 2 × 4 B, and resize_({}) keeps that storage) → 196, mse's element-wise squared
  // error 16 → 212, the forward peak; the squared error is freed once reduced → 196.
  // Backward: mse gradient 16 (212; the output stays, held by the loop), layers[2]: input
  // gradient 24 (236), weight grad 24 (260), bias grad 8 (268), incoming gradient freed (252);
  // layers[1] ReLU: input gradient 24 (276), saved output and incoming gradient freed (228);
  // layers[0]: weight grad 48 (276), bias grad 12 (288) — the peak — incoming gradient freed.
  Setup s = LayerSetup({Linear(4, 3), Activation(LayerKind::ReLU), Linear(3, 2)}, LossKind::MSE, 2, 1,
                       Precision::FP32, OptimizerKind::SGD);
  const Estimate e = MustEstimate(s);
  CHECK(e.phasePeaks[0].totalBytes == 92);
  CHECK(e.phasePeaks[1].totalBytes == 212);
  CHECK(e.phasePeaks[2].totalBytes == 288);
  CHECK(e.peak.totalBytes == 288);
  CHECK(e.peak.phase == Phase::Backward);
  CHECK(e.peak.step == 1);
  CHECK(BytesIn(e.peak, Category::Gradients) == 92);
  CHECK(BytesIn(e.peak, Category::InputBatch) == 48);
  CHECK(BytesIn(e.peak, Category::Activations) == 16 + 16);  // the held output and the loss
  // After the step: zero_grad frees the gradients; output, loss and batch go; parameters remain.
  CHECK(e.timeline.back().totalBytes == 92);
}

TEST_CASE("mixed precision cross-entropy keeps fp32 logits and their gradient", "[trace]") {
  // Embedding(10, 4) → Linear(4→10, no bias), cross-entropy, batch 1 × 3 tokens, fp16 mixed, SGD.
  // init: 80 params × (2 B + 4 B master) = 480.
  // forward: ids 24 + labels 24, embedding out 24, 16-bit logits 60 (612, held by the loop),
  //   fp32 upcast 120 (732), log_softmax 120 (852) — forward peak — upcast freed (732),
  //   total_weight 4 and loss 4 (740).
  // backward: nll gradient 120 (860), total_weight freed (856), log_softmax gradient 120 (976)
  //   — backward peak — then the nll gradient and log_softmax output are freed (736), the
  //   gradient cast to 16-bit 60 (796) and its fp32 original freed (676); the linear and the
  //   embedding add 24 + 80 + 80 of gradients and free 24 + 60 + 24 → 752.
  // step: foreach SGD upcasts all 80 gradients to fp32: 752 + 320 = 1072, the overall peak.
  Setup s = LayerSetup({Embedding(10, 4), Linear(4, 10, false)}, LossKind::CrossEntropy, 1, 3,
                       Precision::FP16Mixed, OptimizerKind::SGD);
  const Estimate e = MustEstimate(s);
  CHECK(e.phasePeaks[0].totalBytes == 480);
  CHECK(e.phasePeaks[1].totalBytes == 852);
  CHECK(e.phasePeaks[2].totalBytes == 976);
  CHECK(e.phasePeaks[3].totalBytes == 1072);
  CHECK(e.peak.totalBytes == 1072);
  CHECK(e.peak.phase == Phase::OptimizerStep);
  CHECK(BytesIn(e.phasePeaks[2], Category::ActivationGradients) == 240);
  SECTION("fused: no upcast, the backward pass is the peak") {
    s.training.optimizerImplementation = OptimizerImplementation::Fused;
    CHECK(MustEstimate(s).peak.totalBytes == 976);
  }
  SECTION("fp32: no upcast of the logits") {
    s.training.precision = Precision::FP32;
    // 80 × 4 = 320; ids, labels 48; embedding out 48; logits 120; log_softmax 120 → 656, then
    // total_weight and loss, 4 B each.
    CHECK(MustEstimate(s).phasePeaks[1].totalBytes == 320 + 48 + 48 + 120 + 120 + 4 + 4);
  }
}

TEST_CASE("saved-for-backward rules of each activation", "[trace]") {
  // Linear → (the op) → Linear, MSE. What is still held once the loss is computed tells which
  // tensors each op saved: the forward peak alone would hide it (an op's input and output
  // briefly coexist whatever it saves).
  const std::int64_t b = 8, w = 1000;
  auto heldAfterForward = [&](std::vector<LayerDef> middle) {
    std::vector<LayerDef> layers = {Linear(w, w, false)};
    layers.insert(layers.end(), middle.begin(), middle.end());
    layers.push_back(Linear(w, w, false));
    Setup s = LayerSetup(layers, LossKind::MSE, b, 1, Precision::FP32, OptimizerKind::SGD);
    std::int64_t held = 0;
    for (const auto& p : MustEstimate(s).timeline) {
      if (p.step == 1 && p.phase == Phase::Forward && p.category == Category::Activations) held += p.deltaBytes;
    }
    return held;
  };
  const std::int64_t act = b * w * 4;  // one activation, bytes
  const std::int64_t none = heldAfterForward({});
  // The first linear's output (saved by the second), the output, and the loss, whose scalar
  // keeps the output-sized storage mse_loss's meta function allocated (resize_({})).
  CHECK(none == 3 * act);
  SECTION("ReLU, Tanh, Sigmoid keep their output; their input is freed") {
    for (auto k : {LayerKind::ReLU, LayerKind::Tanh, LayerKind::Sigmoid}) {
      CHECK(heldAfterForward({Activation(k)}) == none);
    }
  }
  SECTION("GELU keeps its input as well") {
    CHECK(heldAfterForward({Activation(LayerKind::GELU)}) == none + act);
  }
  SECTION("dropout keeps a 1-byte mask; p = 0 is the identity") {
    CHECK(heldAfterForward({Dropout(0.1)}) == none + b * w);
    CHECK(heldAfterForward({Dropout(0.0)}) == none);
  }
}

TEST_CASE("replay invariants", "[trace]") {
  Setup s = ExampleMlpSetup();
  for (auto opt : {OptimizerKind::SGD, OptimizerKind::Adam, OptimizerKind::Adafactor}) {
    for (auto prec : {Precision::FP32, Precision::FP16Mixed, Precision::BF16}) {
      s.training.optimizer = opt;
      s.training.precision = prec;
      const Estimate e = MustEstimate(s);
      std::int64_t running = 0, maxTotal = 0;
      for (const auto& p : e.timeline) {
        running += p.deltaBytes;
        REQUIRE(running == p.totalBytes);
        REQUIRE(running >= 0);
        maxTotal = std::max(maxTotal, running);
      }
      CHECK(e.peak.totalBytes == maxTotal);
      std::int64_t maxPhase = 0, sum = 0;
      for (const auto& p : e.phasePeaks) maxPhase = std::max(maxPhase, p.totalBytes);
      CHECK(maxPhase == e.peak.totalBytes);
      for (const auto& row : e.peak.byCategory) sum += row.bytes;
      CHECK(sum == e.peak.totalBytes);
      // What remains after two steps is exactly the persistent state.
      CHECK(e.timeline.back().totalBytes ==
            e.modelStates.parametersBytes + e.modelStates.masterWeightsBytes + e.modelStates.optimizerStatesBytes);
    }
  }
}

TEST_CASE("zero_grad(set_to_none=False) keeps gradients through the next forward", "[trace]") {
  Setup s = ExampleMlpSetup();
  s.training.zeroGradSetToNone = false;
  const Estimate e = MustEstimate(s);
  CHECK(e.timeline.back().totalBytes == e.modelStates.totalBytes);
  CHECK(BytesIn(e.phasePeaks[1], Category::Gradients) == e.modelStates.gradientsBytes);
}

TEST_CASE("quick mode uses the labelled per-token heuristic", "[trace]") {
  Setup s = QuickSetup(1'500'000'000, Precision::FP16Mixed, OptimizerKind::Adam);
  s.training.batchSize = 2;
  s.training.sequenceLength = 1024;
  const Estimate e = MustEstimate(s);
  CHECK(e.activationsFromHeuristic);
  const double perToken = 4.6894e-4 * 1.5e9 + 1.8494e6;
  CHECK(HeuristicActivationValuesPerToken(1'500'000'000) == Approx(perToken).epsilon(1e-12));
  const auto& forward = e.phasePeaks[static_cast<int>(Phase::Forward)];
  CHECK(double(BytesIn(forward, Category::Activations)) == Approx(perToken * 2 * 1024 * 2).epsilon(1e-9));
  bool labelled = false;
  for (const auto& n : e.notes) labelled = labelled || n.find("heuristic") != std::string::npos;
  CHECK(labelled);
  CHECK(!MustEstimate(ExampleMlpSetup()).activationsFromHeuristic);
}

TEST_CASE("the trace to step 1's forward end is the whole trace's events up to there", "[trace]") {
  // BuildTraceToForwardEnd (the solver's forward-end floor reads it): the same events, field by
  // field, as BuildTrace's up to the last event of step 1's forward (the end Replay reports as
  // forwardEnd), and nothing after. Across families, adapters and a quantized base,
  // checkpointing, the optimizer in backward, micro-batches (the last one's forward ends it),
  // empty_cache steps and packed sequences.
  int compared = 0;
  for (const char* preset : {"gpt2", "llama-3.2-1b", "bert-base-uncased", "mixtral-8x7b"})
    for (int variant = 0; variant < 8; ++variant) {
      Setup s = DefaultSetup();
      s.model.kind = ModelKind::Transformer;
      s.model.architecture = FindPreset(preset)->architecture;
      s.model.architecture.numLayers = 3;
      s.training.batchSize = 2;
      s.training.sequenceLength = 128;
      s.training.precision = Precision::BF16Mixed;
      if (variant == 1) {
        s.finetune.lora = true;
        s.finetune.targetModules = {"all-linear"};
        s.finetune.quantization = Quantization::NF4;
      }
      if (variant == 2) s.training.checkpointing = Checkpointing::EveryBlock;
      if (variant == 3) s.training.optimizerInBackward = true;
      if (variant == 4) s.parallel.gradientAccumulationSteps = 3;
      if (variant == 5) s.training.emptyCacheSteps = 1;
      if (variant == 6) {
        s.training.attention = AttentionImplementation::SDPA;
        s.training.packedSequences = PackedSequences::BlockCausalMask;
      }
      if (variant == 7) s.training.checkpointing = Checkpointing::EveryKthBlock;
      if (!Validate(s).empty()) continue;
      INFO(preset << " variant " << variant);
      const Inventory inventory = BuildInventory(s);
      const Trace whole = BuildTrace(s, inventory, false);
      const Trace part = BuildTraceToForwardEnd(s, inventory);
      std::size_t forwardEnd = whole.events.size();
      for (std::size_t i = 0; i < whole.events.size(); ++i) {
        if (whole.events[i].step == 1 && whole.events[i].phase == Phase::Forward) forwardEnd = i;
      }
      REQUIRE(forwardEnd < whole.events.size());
      REQUIRE(part.events.size() == forwardEnd + 1);
      for (std::size_t i = 0; i < part.events.size(); ++i) {
        const Event& a = part.events[i];
        const Event& b = whole.events[i];
        const bool same = a.bytes == b.bytes && a.tensorId == b.tensorId && a.layer == b.layer && a.kind == b.kind &&
                          a.category == b.category && a.phase == b.phase && a.step == b.step && a.stream == b.stream;
        if (!same) FAIL("event " << i << " differs");
      }
      const Estimate wholeReplay = Replay(whole), partReplay = Replay(part);
      CHECK(partReplay.forwardEnd.eventIndex == wholeReplay.forwardEnd.eventIndex);
      CHECK(partReplay.forwardEnd.totalBytes == wholeReplay.forwardEnd.totalBytes);
      CHECK(BytesIn(partReplay.forwardEnd, Category::Activations) == BytesIn(wholeReplay.forwardEnd, Category::Activations));
      ++compared;
    }
  CHECK(compared >= 28);
}
