// Fine-tuning optimizers (bitsandbytes 8-bit and paged, Lion) and the memory savers (chunked
// loss, the loss in the model dtype, the optimizer in backward), byte by byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"
#include "sim/savers.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

bool AnyNoteContains(const Estimate& e, const std::string& text) {
  return std::any_of(e.notes.begin(), e.notes.end(), [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

Setup TinyGpt2(std::int64_t batch, std::int64_t sequence) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  ArchitectureDef a = DefaultArchitecture(Family::GPT2);
  a.vocabSize = 1000;
  a.hiddenSize = 64;
  a.numLayers = 2;
  a.numHeads = 4;
  a.maxPositionEmbeddings = 128;
  a.tieWordEmbeddings = true;
  s.model.architecture = a;
  s.training.batchSize = batch;
  s.training.sequenceLength = sequence;
  s.training.precision = Precision::BF16;
  s.training.optimizer = OptimizerKind::AdamW;
  return s;
}

std::size_t CountLabels(const Estimate& e, const std::string& text) {
  return static_cast<std::size_t>(std::count_if(e.timeline.begin(), e.timeline.end(), [&](const TimelinePoint& p) {
    return p.label.find(text) != std::string::npos;
  }));
}

}  // namespace

TEST_CASE("bitsandbytes 8-bit AdamW states are byte-exact", "[savers]") {
  // bitsandbytes/optim/optimizer.py Optimizer2State.init_state: 5,000 weights ≥ min_8bit_size
  // (4,096) get uint8 state1 and state2 (10,000 B) and fp32 absmax1, absmax2 of ceil(5000/256) =
  // 20 blocks (160 B); the 50-element bias keeps fp32 state1 and state2 (400 B); the first 8-bit
  // tensor moves the two 256-value fp32 maps to the GPU (2,048 B).
  Setup s = LayerSetup({Linear(100, 50)}, LossKind::MSE, 2, 1, Precision::FP32, OptimizerKind::AdamW8bit);
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.optimizerStatesBytes == 10000 + 160 + 400 + 2048);
  // Adam8bit and PagedAdamW8bit keep the same layout; paged 32-bit AdamW keeps fp32 states.
  s.training.optimizer = OptimizerKind::Adam8bit;
  CHECK(MustEstimate(s).modelStates.optimizerStatesBytes == 12608);
  s.training.optimizer = OptimizerKind::PagedAdamW8bit;
  CHECK(MustEstimate(s).modelStates.optimizerStatesBytes == 12608);
  s.training.optimizer = OptimizerKind::PagedAdamW;
  CHECK(MustEstimate(s).modelStates.optimizerStatesBytes == 5050 * 8);
  // The trace allocates the same bytes (step 2's optimizer phase holds all states).
  s.training.optimizer = OptimizerKind::AdamW8bit;
  CHECK(BytesIn(MustEstimate(s).phasePeaks[3], Category::OptimizerStates) == 12608);
}

TEST_CASE("the 8-bit threshold is min_8bit_size = 4096 elements", "[savers]") {
  // 4,096 elements: 8-bit (2 × 4,096 + 2 × 16 blocks × 4 B + maps 2,048); 4,095: fp32 (8 B each).
  Setup at = LayerSetup({Linear(64, 64, false)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::AdamW8bit);
  CHECK(MustEstimate(at).modelStates.optimizerStatesBytes == 2 * 4096 + 2 * 16 * 4 + 2048);
  Setup below = LayerSetup({Linear(4095, 1, false)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::AdamW8bit);
  CHECK(MustEstimate(below).modelStates.optimizerStatesBytes == 4095 * 8);  // no 8-bit tensor: no maps
  // A block count rounds up: 4,097 elements need 17 blocks.
  Setup odd = LayerSetup({Linear(4097, 1, false)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::AdamW8bit);
  CHECK(MustEstimate(odd).modelStates.optimizerStatesBytes == 2 * 4097 + 2 * 17 * 4 + 2048);
}

TEST_CASE("about 2.03 B per parameter for a large model with 8-bit AdamW", "[savers]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-3.2-1b")->architecture;
  s.training.sequenceLength = 128;
  s.training.optimizer = OptimizerKind::AdamW8bit;
  const Estimate e = MustEstimate(s);
  const double perParameter = double(e.modelStates.optimizerStatesBytes) / double(e.modelStates.parameterCount);
  CHECK(perParameter > 2.031);
  CHECK(perParameter < 2.032);
}

TEST_CASE("paged optimizer states are flagged with their bytes", "[savers]") {
  // get_state_buffer pages tensors of at least 1e5 elements: the 100,000-weight matrix's two
  // fp32 states (800,000 B); its 1,000-element bias stays ordinary.
  Setup s = LayerSetup({Linear(100, 1000)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::PagedAdamW);
  CHECK(AnyNoteContains(MustEstimate(s), "800,000 B"));
  // 8-bit: uint8 states of the same tensor, 200,000 B.
  s.training.optimizer = OptimizerKind::PagedAdamW8bit;
  CHECK(AnyNoteContains(MustEstimate(s), "200,000 B"));
  // 99,999 elements: nothing paged, no note.
  Setup small = LayerSetup({Linear(99999, 1, false)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::PagedAdamW);
  CHECK_FALSE(AnyNoteContains(MustEstimate(small), "paged"));
}

TEST_CASE("paged optimizer states live outside the caching allocator", "[savers][device]") {
  // bitsandbytes' F.get_paged (cudaMallocManaged, wrapped by torch.frombuffer): never a request
  // to PyTorch's allocator. PagedAdamW8bit keeps AdamW8bit's layout and loop, so the two differ
  // only by the paged uint8 state1 and state2 of the 100,000-weight matrix: 200,000 B.
  Setup s = LayerSetup({Linear(100, 1000)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::AdamW8bit);
  const Estimate plain = MustEstimate(s);
  s.training.optimizer = OptimizerKind::PagedAdamW8bit;
  const Estimate paged = MustEstimate(s);
  CHECK(paged.host.unifiedBytes == 200'000);
  CHECK(paged.modelStates.optimizerStatesBytes == plain.modelStates.optimizerStatesBytes);  // still states
  // Step 2's peak has every state in both runs: the paged ones are not allocated.
  CHECK(paged.peak.step == 2);
  CHECK(plain.peak.step == 2);
  CHECK(paged.peak.totalBytes == plain.peak.totalBytes - 200'000);
  CHECK(paged.device.peakReservedBytes <= plain.device.peakReservedBytes);
  // Resident beside the segments, and on the device total.
  const DeviceEstimate& d = paged.device;
  CHECK(d.unifiedBytes == 200'000);
  CHECK(d.unifiedEvictedBytes == 0);
  CHECK(d.peakDeviceBytes == d.peakReservedBytes + d.contextBytes + d.communicationBytes + 200'000);
  CHECK(plain.device.unifiedBytes == 0);

  // A GPU with room for only 50,000 of them beside the rest: the driver keeps 150,000 B on the
  // host; still fits (eviction, not an out-of-memory error), with no headroom shown, and tight
  // only by what cannot give way: 50,000 B is under 5 % of this small capacity.
  const std::int64_t outside = d.peakReservedBytes + d.contextBytes + d.communicationBytes;
  s.gpu.memoryGiB = static_cast<double>(outside + 50'000) / 1073741824.0;
  const Estimate squeezed = MustEstimate(s);
  CHECK(squeezed.device.fits);
  CHECK(squeezed.device.unifiedBytes == 50'000);
  CHECK(squeezed.device.unifiedEvictedBytes == 150'000);
  CHECK(squeezed.device.peakDeviceBytes == squeezed.device.capacityBytes);
  CHECK(squeezed.device.headroomBytes == 0);
  CHECK(squeezed.device.verdict == "tight");
  CHECK(squeezed.device.why.find("do not fit beside it") != std::string::npos);

  // 2 GiB beside what cannot give way, filled by paged states: no headroom shown, but not tight
  // (the states give way; 2 GiB is above both 1 GiB and 5 % of the capacity).
  Setup big = LayerSetup({Linear(100'000, 10'000)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::PagedAdamW);
  const DeviceEstimate roomy = MustEstimate(big).device;
  REQUIRE(roomy.unifiedBytes == 8'000'000'000);  // 1e9 weights × fp32 state1 and state2
  const std::int64_t rest = roomy.peakReservedBytes + roomy.contextBytes + roomy.communicationBytes;
  big.gpu.memoryGiB = static_cast<double>(rest + 2 * 1073741824LL) / 1073741824.0;
  const DeviceEstimate full = MustEstimate(big).device;
  CHECK(full.fits);
  CHECK(full.unifiedBytes == 2 * 1073741824LL);
  CHECK(full.headroomBytes == 0);
  CHECK_FALSE(full.tight);
  CHECK(full.verdict == "fits");
}

TEST_CASE("Lion keeps one state and two temporaries per parameter", "[savers]") {
  // One Linear(100, 50): 5,050 fp32 values of exp_avg. lion-pytorch's update_fn holds
  // exp_avg.clone() and the update of the weight at once: 2 × 20,000 B.
  Setup s = LayerSetup({Linear(100, 50)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::Lion);
  s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.optimizerStatesBytes == 5050 * 4);
  CHECK(BytesIn(e.phasePeaks[3], Category::OptimizerIntermediates) == 2 * 20000);
  // bitsandbytes' Lion (fused): fp32 state1, no temporaries.
  s.training.optimizerImplementation = OptimizerImplementation::Fused;
  const Estimate fused = MustEstimate(s);
  CHECK(fused.modelStates.optimizerStatesBytes == 5050 * 4);
  CHECK(BytesIn(fused.phasePeaks[3], Category::OptimizerIntermediates) == 0);
}

TEST_CASE("the optimizer in backward frees each gradient once applied", "[savers]") {
  // trace_test's tiny MLP (peak 288 B with every gradient live). In backward: mse gradient 16
  // (212); layers[2]: input gradient 24 (236), weight gradient 24 (260), bias 8 (268, the
  // peak), incoming gradient freed (252), then its AccumulateGrad hooks step and free the
  // weight's and the bias's gradients (220); ReLU: input gradient 24 (244), saved output and
  // incoming freed (196); layers[0]: weight 48 (244), bias 12 (256), incoming freed (232),
  // both stepped and freed (184).
  Setup s = LayerSetup({Linear(4, 3), Activation(LayerKind::ReLU), Linear(3, 2)}, LossKind::MSE, 2, 1,
                       Precision::FP32, OptimizerKind::SGD);
  s.training.optimizerInBackward = true;
  const Estimate e = MustEstimate(s);
  CHECK(e.phasePeaks[2].totalBytes == 268);
  CHECK(e.peak.totalBytes == 268);
  CHECK(e.modelStates.gradientsBytes == 0);  // no gradient set persists
  // With Adam the states appear in step 1's backward, each as its parameter is stepped.
  s.training.optimizer = OptimizerKind::Adam;
  const Estimate adam = MustEstimate(s);
  CHECK(BytesIn(adam.phasePeaks[2], Category::OptimizerStates) > 0);
  CHECK(adam.modelStates.optimizerStatesBytes == 23 * 8);
}

TEST_CASE("a tied weight is stepped once after both of its gradients", "[savers]") {
  Setup s = TinyGpt2(1, 16);
  s.training.optimizerInBackward = true;
  EstimateOptions labelled;
  labelled.timeline = EstimateOptions::Timeline::Labelled;
  const EstimateResult r = EstimateMemory(s, labelled);
  REQUIRE(r.ok());
  // One free of the tied embedding's gradient per step, after the embedding's backward added
  // the second contribution.
  CHECK(CountLabels(r.estimate, "optimizer in backward frees transformer.wte.weight.grad") == 2);
  CHECK(CountLabels(r.estimate, "accumulated into transformer.wte.weight.grad") == 2);
}

TEST_CASE("the chunked loss upcasts one chunk at a time", "[savers]") {
  // b·s·V = 2 × 64 × 1000 = 128,000 logits. Standard: the whole fp32 upcast (512,000 B) beside
  // the saved fp32 log_softmax; chunked (8): one chunk's upcast, 64,000 B.
  Setup standard = TinyGpt2(2, 64);
  Setup chunked = standard;
  chunked.training.lossImplementation = LossImplementation::Chunked;
  const Estimate a = MustEstimate(standard), b = MustEstimate(chunked);
  CHECK(b.phasePeaks[1].totalBytes < a.phasePeaks[1].totalBytes);
  CHECK(a.phasePeaks[1].totalBytes - b.phasePeaks[1].totalBytes >= 7 * 64000 - 4096);
  CHECK(a.phasePeaks[1].totalBytes - b.phasePeaks[1].totalBytes <= 7 * 64000 + 4096);
  // Gradients, parameters and states are the same.
  CHECK(a.modelStates.totalBytes == b.modelStates.totalBytes);
  CHECK(AnyNoteContains(b, "CEWithChunkedOutputLoss"));
}

TEST_CASE("the loss in the model dtype keeps 16-bit logits", "[savers]") {
  // trace_test's fp16-mixed cross-entropy: ids 24 + labels 24, embedding out 24, logits 60
  // (612 with 480 of model states), then log_softmax in fp16 60 (672), total_weight 2 and the
  // loss 2 (676): no fp32 upcast (852 before).
  Setup s = LayerSetup({Embedding(10, 4), Linear(4, 10, false)}, LossKind::CrossEntropy, 1, 3,
                       Precision::FP16Mixed, OptimizerKind::SGD);
  s.training.lossInModelDtype = true;
  const Estimate e = MustEstimate(s);
  CHECK(e.phasePeaks[1].totalBytes == 676);
  // Under autocast log_softmax runs in fp32 anyway: said in a note.
  Setup amp = TinyGpt2(1, 16);
  amp.training.precision = Precision::AmpBF16;
  amp.training.lossInModelDtype = true;
  Setup ampPlain = amp;
  ampPlain.training.lossInModelDtype = false;
  CHECK(MustEstimate(amp).peak.totalBytes == MustEstimate(ampPlain).peak.totalBytes);
  CHECK(AnyNoteContains(MustEstimate(amp), "changes nothing"));
}

TEST_CASE("saver fields are validated", "[savers]") {
  Setup s = TinyGpt2(1, 16);
  for (std::int64_t chunks : {0, -1, 9}) {
    Setup c = s;
    c.training.lossChunks = chunks;
    CHECK(HasErrorOn(Validate(c), "training.lossChunks"));
  }
  Setup bert = s;
  bert.model.architecture = DefaultArchitecture(Family::BERT);
  bert.training.lossImplementation = LossImplementation::Chunked;
  CHECK(HasErrorOn(Validate(bert), "training.lossImplementation"));
  Setup layers = LayerSetup({Linear(4, 3)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::SGD);
  layers.training.lossImplementation = LossImplementation::Chunked;
  CHECK(HasErrorOn(Validate(layers), "training.lossImplementation"));
  layers.training.lossImplementation = LossImplementation::Standard;
  layers.training.lossInModelDtype = true;  // mse has no upcast
  CHECK(HasErrorOn(Validate(layers), "training.lossInModelDtype"));
  Setup quick = QuickSetup(1'000'000, Precision::BF16Mixed, OptimizerKind::Adam);
  quick.training.lossInModelDtype = true;
  CHECK(HasErrorOn(Validate(quick), "training.lossInModelDtype"));
  Setup keep = s;
  keep.training.optimizerInBackward = true;
  keep.training.zeroGradSetToNone = false;
  CHECK(HasErrorOn(Validate(keep), "training.optimizerInBackward"));
}

TEST_CASE("saver fields and optimizers round-trip through JSON and the options", "[savers]") {
  Setup parsed;
  const auto errors = ParseAndValidate(
      R"({"model":{"preset":"gpt2"},"training":{"sequenceLength":64,"optimizer":"pagedAdamw8bit","lossImplementation":"chunked","lossChunks":4,"lossInModelDtype":true,"optimizerInBackward":true}})",
      parsed);
  REQUIRE(errors.empty());
  CHECK(parsed.training.optimizer == OptimizerKind::PagedAdamW8bit);
  CHECK(parsed.training.lossImplementation == LossImplementation::Chunked);
  CHECK(parsed.training.lossChunks == 4);
  CHECK(parsed.training.lossInModelDtype);
  CHECK(parsed.training.optimizerInBackward);
  Setup again;
  REQUIRE(ParseAndValidate(SetupToJson(parsed, -1), again).empty());
  CHECK(again.training.lossChunks == 4);
  CHECK(again.training.optimizer == OptimizerKind::PagedAdamW8bit);
  const std::string options = OptionsJson(-1);
  for (const char* id : {"\"adamw8bit\"", "\"pagedAdamw\"", "\"lion\"", "\"lossImplementations\"", "\"savers\"",
                         "optimizer_in_bwd", "CEWithChunkedOutputLoss"}) {
    INFO(id);
    CHECK(options.find(id) != std::string::npos);
  }
  Setup bad;
  CHECK(HasErrorOn(ParseAndValidate(R"({"training":{"lossImplementation":"liger"}})", bad), "training.lossImplementation"));
}

TEST_CASE("make it fit offers the optimizer in backward as free and 8-bit AdamW as changing results", "[savers]") {
  // GPT-2 in fp32 with SDPA and checkpointing on 1.7 GiB: the peak is the optimizer step's. Its
  // model states (1.99 GB) pass the capacity; with either change they no longer do (1.49 and
  // 1.25 GB), so both are simulated (the solver lists a change it can bound above the capacity
  // unsimulated).
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("gpt2")->architecture;
  s.training.sequenceLength = 128;
  s.training.precision = Precision::FP32;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.gpu.memoryGiB = 1.85;
  const SolveResult r = Solve(s);
  REQUIRE(r.ok());
  const FitSuggestion* inBackward = Suggestion(r, "optimizer-in-backward");
  const FitSuggestion* eightBit = Suggestion(r, "optimizer-adamw8bit");
  REQUIRE(inBackward != nullptr);
  REQUIRE(eightBit != nullptr);
  CHECK(inBackward->cost == FitCost::Free);
  CHECK(eightBit->cost == FitCost::ChangesResults);
  CHECK(inBackward->setup.training.optimizerInBackward);
  CHECK(MustEstimate(inBackward->setup).device.peakDeviceBytes == inBackward->peakBytes);
  CHECK(MustEstimate(eightBit->setup).device.peakDeviceBytes == eightBit->peakBytes);
  CHECK_FALSE(inBackward->peakIsLowerBound);
  CHECK_FALSE(eightBit->peakIsLowerBound);
  // Neither fits 1.85 GiB: the free one ranks first, though 8-bit AdamW saves more.
  CHECK(eightBit->savedBytes > inBackward->savedBytes);
  CHECK(inBackward < eightBit);
  // Paged AdamW: the same update with its 1 GB of states outside the allocator, so it fits; its
  // device figure is the whole GPU (the states resident in what the step leaves, the rest on the
  // host), and as the one change that fits it ranks first.
  const FitSuggestion* paged = Suggestion(r, "optimizer-pagedAdamw");
  REQUIRE(paged != nullptr);
  CHECK(paged->cost == FitCost::Compute);
  CHECK(paged->setup.training.optimizer == OptimizerKind::PagedAdamW);
  CHECK(paged->fits);
  const Estimate pagedEstimate = MustEstimate(paged->setup);
  CHECK(pagedEstimate.device.peakDeviceBytes == paged->peakBytes);
  CHECK(paged->peakBytes == pagedEstimate.device.capacityBytes);
  CHECK(pagedEstimate.device.unifiedEvictedBytes > 0);
  CHECK(paged == r.suggestions.data() + (r.suggestions.front().fits && r.suggestions.front().cost == FitCost::Free ? 1 : 0));
}

TEST_CASE("autocast in a layer list casts each linear's arguments", "[savers]") {
  // Linear(4→3) → ReLU → Linear(3→2), MSE, batch 2, autocast bf16, SGD: 92 B of fp32 parameters.
  // Forward: fp32 features 32 and targets 16 (140); layers[0]: a bf16 copy of its fp32 input 16
  // (saved), weight copy 24 and bias copy 6 (cached; the weight not saved, its input needing
  // no gradient), output 12 (198); ReLU 12 (210), then layers[0]'s output goes (198);
  // layers[2]: weight copy 12 (saved) and bias copy 4, output 8 (222); mse_loss on an fp32 copy
  // 16 (238, saved), the loss 16 (254: mse_loss's scalar keeps an output-sized fp32 storage)
  // and its squared error 16 (270, the forward peak); the cached copies but the saved weight
  // leave with the context (220).
  // Backward: mse gradient 16, its input copy freed, cast to bf16 8 and the fp32 one freed
  // (212); layers[2]: input gradient 12, weight and bias gradients in bf16 12 + 4 (240), saved
  // weight 12 and incoming 8 freed (220), the bias's and weight's fp32 .grad 8 and 24 replace
  // their bf16 ones (236); ReLU: 12 in, 12 + 12 out (224); layers[0]: bf16 weight and bias
  // gradients 24 + 6 (254), saved input copy 16 and incoming 12 freed (226), fp32 bias 12
  // (bf16 freed: 232), fp32 weight 48 (280, the peak) and its bf16 one freed.
  Setup s = LayerSetup({Linear(4, 3), Activation(LayerKind::ReLU), Linear(3, 2)}, LossKind::MSE, 2, 1,
                       Precision::AmpBF16, OptimizerKind::SGD);
  REQUIRE(Validate(s).empty());
  const Estimate e = MustEstimate(s);
  CHECK(e.phasePeaks[1].totalBytes == 270);
  CHECK(e.phasePeaks[2].totalBytes == 280);
  CHECK(e.peak.totalBytes == 280);
  CHECK(BytesIn(e.forwardEnd, Category::WeightCopies) == 12);  // layers[2]'s saved weight copy
  CHECK(e.modelStates.parametersBytes == 92);
  CHECK(e.modelStates.gradientsBytes == 92);
}

TEST_CASE("the work budget still bounds the events of the new optimizers and savers", "[savers][budget]") {
  // PredictEvents must never be below the simulated event count (issue 14's budget).
  for (const char* preset : {"gpt2", "tinyllama-1.1b"}) {
    for (OptimizerKind k : {OptimizerKind::AdamW8bit, OptimizerKind::PagedAdamW, OptimizerKind::Lion}) {
      for (int saver = 0; saver < 3; ++saver) {
        Setup s = DefaultSetup();
        s.model.kind = ModelKind::Transformer;
        s.model.architecture = FindPreset(preset)->architecture;
        s.training.sequenceLength = 64;
        s.training.optimizer = k;
        s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
        if (saver == 1) s.training.optimizerInBackward = true;
        if (saver == 2) s.training.lossImplementation = LossImplementation::Chunked;
        INFO(preset << " optimizer " << static_cast<int>(k) << " saver " << saver);
        const EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .explain = false});
        REQUIRE(r.ok());
        CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
        CHECK(PredictEvents(s).predictedEvents <= 2.5 * double(r.estimate.eventCount));
      }
    }
  }
}

// --- activation offloading (torchtune OffloadActivations, sim/savers.hpp) ---

TEST_CASE("activation offloading keeps the last five packed tensors and brings the rest back one op at a time", "[savers]") {
  Trace trace;
  TraceBuilder b(trace);
  TextStore& text = b.text();
  ActivationOffload offload(b);
  auto alloc = [&](std::int64_t bytes) { return b.Alloc(Category::Activations, bytes, text.Make({"x"}), text.Make({"x"}), Text{}); };
  const Text name = text.Make({"saved"});
  // Outside the context (no `with`): nothing is packed.
  const TensorHandle outside = alloc(4096);
  CHECK(offload.Pack(outside, 4096, false, name) == -1);
  offload.SetActive(true);
  // Ids count every pack. Id 1: 1,023 B, under min_offload_size: stays saved. Id 2: a
  // parameter: stays. Ids 3–9: 2,048 B activations, offloaded; each is held only by its saver.
  const TensorHandle small = alloc(1023);
  CHECK(offload.Pack(small, 1023, false, name) == -1);
  const TensorHandle parameter = alloc(8192);
  CHECK(offload.Pack(parameter, 8192, true, name) == -1);
  std::vector<TensorHandle> acts;
  for (int id = 3; id <= 9; ++id) {
    acts.push_back(alloc(2048));
    CHECK(offload.Pack(acts.back(), 2048, false, name) == id);
    // The pack of id drops the stashed ids ≤ id − 5: tensor 3 goes at the pack of 8.
    for (int older = 3; older <= id; ++older) {
      INFO("pack " << id << ", tensor " << older);
      CHECK(b.Holders(acts[static_cast<std::size_t>(older - 3)]) == (older > id - 5 ? 1 : 0));
    }
  }
  offload.SetActive(false);
  // Backward, last op first. Op A unpacks id 9 (still stashed: no copy) and id 4 (brought back).
  const std::size_t before = trace.events.size();
  offload.BeginOp();
  CHECK(offload.Unpack(9, name, -1) == acts[6]);
  const TensorHandle back4 = offload.Unpack(4, name, -1);
  CHECK(back4 != acts[1]);
  CHECK(trace.events.size() == before + 1);
  CHECK(trace.events.back().bytes == 2048);
  CHECK(trace.events.back().kind == EventKind::Alloc);
  // Its post-hook drops the whole forward stash (ids 5–9); what it brought back stays.
  offload.AfterOp(name);
  for (std::size_t i = 2; i < acts.size(); ++i) CHECK(b.Holders(acts[i]) == 0);
  CHECK(b.Holders(back4) == 1);
  // Op B brings back id 3; after its hook, op A's copy (id 4) is freed, its own is kept.
  offload.BeginOp();
  const TensorHandle back3 = offload.Unpack(3, name, -1);
  CHECK(b.Holders(back4) == 1);  // both ops' tensors overlap while B runs
  offload.AfterOp(name);
  CHECK(b.Holders(back4) == 0);
  CHECK(b.Holders(back3) == 1);
  // The end-of-backward callback frees the rest.
  offload.EndBackward(name);
  CHECK(b.Holders(back3) == 0);
  // What was never offloaded is untouched.
  CHECK(b.Holders(small) == 1);
  CHECK(b.Holders(parameter) == 1);
  CHECK(b.Holders(outside) == 1);
}

TEST_CASE("activation offloading in a transformer: activations leave the GPU and come back in backward", "[savers]") {
  Setup s = TinyGpt2(4, 128);
  s.training.attention = AttentionImplementation::SDPA;
  s.training.optimizer = OptimizerKind::SGD;
  const EstimateOptions labelled{.timeline = EstimateOptions::Timeline::Labelled};
  const Estimate plain = EstimateMemory(s, labelled).estimate;
  s.training.activationOffloading = true;
  const Estimate offloaded = EstimateMemory(s, labelled).estimate;
  // Parameters and states are untouched; the forward holds less (the last five packed tensors
  // and what Python still references), the head and loss keep theirs.
  CHECK(offloaded.modelStates.totalBytes == plain.modelStates.totalBytes);
  CHECK(offloaded.phasePeaks[1].totalBytes < plain.phasePeaks[1].totalBytes);
  CHECK(CountLabels(offloaded, "brought back from host") > 0);
  CHECK(CountLabels(plain, "brought back from host") == 0);
  CHECK(CountLabels(offloaded, "offloaded to host") > 0);
  // Nothing is brought back for the loss or the head: they were never packed.
  for (const TimelinePoint& p : offloaded.timeline) {
    if (p.label.find("brought back") != std::string::npos) CHECK(p.label.find("lm_head") == std::string::npos);
  }
  // Every brought-back tensor is freed in the same backward (the end-of-backward callback).
  CHECK(BytesIn(offloaded.phasePeaks[3], Category::Activations) == BytesIn(plain.phasePeaks[3], Category::Activations));
}

TEST_CASE("activation offloading is refused outside transformers", "[savers]") {
  Setup s = LayerSetup({Linear(100, 50)}, LossKind::MSE, 2, 1, Precision::FP32, OptimizerKind::AdamW);
  s.training.activationOffloading = true;
  CHECK(HasErrorOn(Validate(s), "training.activationOffloading"));
  // And read and written as JSON.
  Setup t = TinyGpt2(1, 16);
  t.training.activationOffloading = true;
  CHECK(ParseSetupJson(SetupToJson(t)).setup.training.activationOffloading);
}

namespace {

// The bytes of the first event whose label contains `text` (0 when none).
std::int64_t FirstEventBytes(const Estimate& e, const std::string& text) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.label.find(text) != std::string::npos) return p.deltaBytes;
  }
  return 0;
}

std::int64_t ExactEventBytes(const Estimate& e, const std::string& label) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.label == label) return p.deltaBytes;
  }
  return 0;
}

Estimate Labelled(const Setup& s) {
  EstimateOptions labelled;
  labelled.timeline = EstimateOptions::Timeline::Labelled;
  EstimateResult r = EstimateMemory(s, labelled);
  REQUIRE(r.ok());
  return r.estimate;
}

}  // namespace

TEST_CASE("Liger's chunk size is the next power of two of BT over ceil(V over H)", "[savers]") {
  // fused_linear_cross_entropy_forward: inc_factor = cdiv(V, H), chunk_size =
  // min(next_power_of_2(cdiv(BT, inc_factor)), BT), num_chunks = cdiv(BT, chunk_size).
  // Its own comment's example: BT = 4096·4, V = 32000, H = 4096 → inc_factor 8, chunk 2048.
  CHECK(LigerChunks(16384, 32000, 4096).chunkSize == 2048);
  CHECK(LigerChunks(16384, 32000, 4096).chunks == 8);
  // Llama 3 8B, 2 × 2048 tokens: cdiv(128256, 4096) = 32, 4096 / 32 = 128.
  CHECK(LigerChunks(4096, 128256, 4096).chunkSize == 128);
  CHECK(LigerChunks(4096, 128256, 4096).chunks == 32);
  // Not a power of two: cdiv(1000, 64) = 16, cdiv(100, 16) = 7 → 8; 13 chunks, the last of 4.
  CHECK(LigerChunks(100, 1000, 64).chunkSize == 8);
  CHECK(LigerChunks(100, 1000, 64).chunks == 13);
  // Never more than BT: V < H gives inc_factor 1, next_power_of_2(3) = 4 → 3, one chunk.
  CHECK(LigerChunks(3, 10, 64).chunkSize == 3);
  CHECK(LigerChunks(3, 10, 64).chunks == 1);
}

TEST_CASE("the fused linear cross-entropy never makes the logits and makes the gradients in forward", "[savers]") {
  // TinyGpt2 in pure bf16, b·s = 2 × 64 = 128 tokens, V = 1000, H = 64: chunk 8 (16 chunks).
  Setup standard = TinyGpt2(2, 64);
  Setup fused = standard;
  fused.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  const Estimate a = Labelled(standard), b = Labelled(fused);
  // The buffers of fused_linear_cross_entropy_forward, by hand:
  CHECK(FirstEventBytes(b, "logits_storage (chunk_size × V)") == 8 * 1000 * 2);  // [chunk, V] bf16
  CHECK(FirstEventBytes(b, "grad_input (zeros_like)") == 128 * 64 * 2);         // [BT, H] bf16
  CHECK(FirstEventBytes(b, "grad_weight (zeros_like)") == 1000 * 64 * 2);        // [V, H] bf16
  CHECK(FirstEventBytes(b, "loss_1d") == 128 * 4);                              // fp32
  CHECK(FirstEventBytes(b, "target != ignore_index") == 128);                   // bool
  // The full logits (b·s·V bf16 = 256,000 B) exist in the standard run only.
  CHECK(ExactEventBytes(a, "lm_head: logits") == 128 * 1000 * 2);
  CHECK(ExactEventBytes(b, "lm_head: logits") == 0);
  CHECK(FirstEventBytes(b, "legacy") == 0);  // bf16: addmm(out=grad_weight) in place
  // grad_weight is a gradient from forward on; backward hands it over as .grad (one per step),
  // then the embedding's use of the tied weight is added into it.
  CHECK(BytesIn(b.forwardEnd, Category::Gradients) >= 1000 * 64 * 2);
  CHECK(BytesIn(a.forwardEnd, Category::Gradients) == 0);
  CHECK(CountLabels(b, "accumulated into transformer.wte.weight.grad") == 2);
  // The same model states; a lower peak (the logits, their fp32 copy and log_softmax are gone).
  CHECK(a.modelStates.totalBytes == b.modelStates.totalBytes);
  CHECK(b.peak.totalBytes < a.peak.totalBytes);
  CHECK(AnyNoteContains(b, "LigerFusedLinearCrossEntropyLoss"));
}

TEST_CASE("the fused linear cross-entropy in fp32 takes Liger's fallback for the weight gradient", "[savers]") {
  // fp32 logits gradient: grad_weight += mm(grad_logits_chunk.t(), _input_chunk).float(), a
  // [V, H] fp32 product per chunk (16 chunks, 2 steps).
  Setup s = TinyGpt2(2, 64);
  s.training.precision = Precision::FP32;
  s.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  const Estimate e = Labelled(s);
  CHECK(FirstEventBytes(e, "mm(grad_logits_chunk.t(), _input_chunk)") == 1000 * 64 * 4);
  CHECK(CountLabels(e, "mm(grad_logits_chunk.t(), _input_chunk)") == 2 * 16 * 2);  // alloc + free
  CHECK(FirstEventBytes(e, "logits_storage (chunk_size × V)") == 8 * 1000 * 4);
}

TEST_CASE("a frozen head gets no grad_weight from the fused loss", "[savers]") {
  Setup s = TinyGpt2(2, 64);
  s.model.architecture.tieWordEmbeddings = false;
  s.finetune.lora = true;  // PEFT defaults (c_attn): lm_head frozen
  s.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  const Estimate e = Labelled(s);
  CHECK(FirstEventBytes(e, "grad_weight (zeros_like)") == 0);
  CHECK(FirstEventBytes(e, "grad_input (zeros_like)") == 128 * 64 * 2);
  Setup standard = s;
  standard.training.lossImplementation = LossImplementation::Standard;
  CHECK(MustEstimate(standard).modelStates.totalBytes == e.modelStates.totalBytes);
}

TEST_CASE("the fused linear cross-entropy is refused where Liger does not apply", "[savers]") {
  Setup s = TinyGpt2(1, 16);
  s.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  CHECK(Validate(s).empty());
  Setup bert = s;
  bert.model.architecture = DefaultArchitecture(Family::BERT);
  CHECK(HasErrorOn(Validate(bert), "training.lossImplementation"));
  Setup layers = LayerSetup({Linear(4, 3)}, LossKind::CrossEntropy, 1, 1, Precision::FP32, OptimizerKind::SGD);
  layers.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  CHECK(HasErrorOn(Validate(layers), "training.lossImplementation"));
  Setup amp = s;
  amp.training.precision = Precision::AmpBF16;
  CHECK(HasErrorOn(Validate(amp), "training.lossImplementation"));
  Setup head = s;
  head.model.architecture.tieWordEmbeddings = false;
  head.finetune.lora = true;
  head.finetune.targetModules = {"c_attn", "lm_head"};
  CHECK(HasErrorOn(Validate(head), "training.lossImplementation"));
  Setup parsed;
  REQUIRE(ParseAndValidate(R"({"model":{"preset":"gpt2"},"training":{"lossImplementation":"fusedLinearCrossEntropy"}})",
                           parsed).empty());
  CHECK(parsed.training.lossImplementation == LossImplementation::FusedLinearCrossEntropy);
  CHECK(OptionsJson(-1).find("\"fusedLinearCrossEntropy\"") != std::string::npos);
}

TEST_CASE("packed sequences under SDPA: the memory-efficient kernel saves a float mask per layer", "[savers]") {
  // TinyGpt2: b 2, s 64, 4 heads, 2 layers, pure bf16, SDPA.
  Setup plain = TinyGpt2(2, 64);
  plain.training.attention = AttentionImplementation::SDPA;
  Setup packed = plain;
  packed.training.packedSequences = PackedSequences::BlockCausalMask;
  const Estimate a = Labelled(plain), b = Labelled(packed);
  // masking_utils' bool [b, 1, s, s], once per forward.
  CHECK(FirstEventBytes(b, "block-causal mask, packed (b, 1, s, s) bool") == 2 * 64 * 64);
  // convert_boolean_attn_mask: [b, 1, s, s] in bf16 per layer (s = 64 is aligned: no pad),
  // beside a transient bool logical_not().
  CHECK(FirstEventBytes(b, "attn_mask as float (convert_boolean_attn_mask)") == 2 * 64 * 64 * 2);
  CHECK(FirstEventBytes(b, "attn_mask.logical_not()") == 2 * 64 * 64);
  CHECK(CountLabels(b, "attn_mask as float (convert_boolean_attn_mask)") == 2 * 2);  // made by each layer, each step
  CHECK(CountLabels(b, "memory-efficient") > 0);
  CHECK(CountLabels(a, "memory-efficient") == 0);
  // Saved until backward: at the end of forward the two layers' float masks (2 × 16,384 B) are
  // what packing adds (the bool mask is gone with the decoder's forward; the logsumexp of 64
  // rows is 32-aligned already).
  CHECK(b.forwardEnd.totalBytes - a.forwardEnd.totalBytes == 2 * 2 * 64 * 64 * 2);
  CHECK(AnyNoteContains(b, "memory-efficient"));
  // s = 60: the mask is padded to 64 columns (pad_bias, alignment 8) and the logsumexp to 64 rows.
  Setup odd = packed;
  odd.training.sequenceLength = 60;
  const Estimate c = Labelled(odd);
  CHECK(FirstEventBytes(c, "attn_mask padded to 8 (pad_bias)") == 2 * 60 * 64 * 2);
  CHECK(FirstEventBytes(c, "logsumexp") == 2 * 4 * 64 * 4);
}

TEST_CASE("packed sequences under eager attention or flash varlen cost no more memory", "[savers]") {
  Setup eager = TinyGpt2(2, 64);
  Setup packedEager = eager;
  packedEager.training.packedSequences = PackedSequences::BlockCausalMask;
  CHECK(MustEstimate(packedEager).peak.totalBytes == MustEstimate(eager).peak.totalBytes);
  Setup sdpa = eager;
  sdpa.training.attention = AttentionImplementation::SDPA;
  Setup varlen = sdpa;
  varlen.training.packedSequences = PackedSequences::FlashVarlen;
  CHECK(MustEstimate(varlen).peak.totalBytes == MustEstimate(sdpa).peak.totalBytes);
  CHECK(AnyNoteContains(MustEstimate(varlen), "varlen"));
}

TEST_CASE("packed sequences are validated and round-trip through JSON", "[savers]") {
  Setup s = TinyGpt2(1, 16);
  s.training.packedSequences = PackedSequences::FlashVarlen;  // eager attention: refused
  CHECK(HasErrorOn(Validate(s), "training.packedSequences"));
  s.training.attention = AttentionImplementation::SDPA;
  CHECK(Validate(s).empty());
  Setup bert = s;
  bert.model.architecture = DefaultArchitecture(Family::BERT);
  bert.training.packedSequences = PackedSequences::BlockCausalMask;
  CHECK(HasErrorOn(Validate(bert), "training.packedSequences"));
  Setup layers = LayerSetup({Linear(4, 3)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::SGD);
  layers.training.packedSequences = PackedSequences::BlockCausalMask;
  CHECK(HasErrorOn(Validate(layers), "training.packedSequences"));
  Setup parsed;
  REQUIRE(ParseAndValidate(R"({"model":{"preset":"gpt2"},"training":{"attention":"sdpa","packedSequences":"blockCausalMask"}})",
                           parsed).empty());
  CHECK(parsed.training.packedSequences == PackedSequences::BlockCausalMask);
  Setup again;
  REQUIRE(ParseAndValidate(SetupToJson(parsed, -1), again).empty());
  CHECK(again.training.packedSequences == PackedSequences::BlockCausalMask);
  Setup bad;
  CHECK(HasErrorOn(ParseAndValidate(R"({"training":{"packedSequences":true}})", bad), "training.packedSequences"));
  const std::string options = OptionsJson(-1);
  CHECK(options.find("\"flashVarlen\"") != std::string::npos);
  CHECK(options.find("DataCollatorWithFlattening") != std::string::npos);
}

TEST_CASE("the work budget bounds the fused loss's token chunks", "[savers][budget]") {
  // cdiv(V, H) chunks at most: a tiny hidden size over a large vocabulary means one chunk per
  // token (here 2^19 of them), refused before simulating; the same with the standard loss runs.
  Setup s = TinyGpt2(64, 8192);
  s.model.architecture.maxPositionEmbeddings = 8192;
  s.model.architecture.vocabSize = 4'000'000;
  s.model.architecture.hiddenSize = 8;
  s.model.architecture.numHeads = 2;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  CHECK(PredictEvents(s).predictedEvents > kMaxPredictedEvents);
  CHECK(HasErrorOn(Validate(s), "model.architecture.vocabSize"));
  s.training.lossImplementation = LossImplementation::Standard;
  CHECK(PredictEvents(s).predictedEvents < kMaxPredictedEvents);
  // A real model stays far below: Llama 3 8B at 8 × 8192 tokens has 32 chunks.
  Setup llama = TinyGpt2(8, 8192);
  llama.model.architecture = DefaultArchitecture(Family::Llama);
  llama.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  Setup plain = llama;
  plain.training.lossImplementation = LossImplementation::Standard;
  CHECK(PredictEvents(llama).predictedEvents - PredictEvents(plain).predictedEvents <= 2 * 4 * 32);
}

TEST_CASE("make it fit offers the fused loss as free where the logits matter", "[savers][solve]") {
  Setup s = LogitsPeakSetup();
  const SolveResult r = Solve(s);
  REQUIRE(r.ok());
  const FitSuggestion* fused = Suggestion(r, "loss-fused");
  REQUIRE(fused != nullptr);
  CHECK(Suggestion(r, "loss-chunked") == nullptr);  // one loss change: the fused one where it applies
  CHECK(fused->cost == FitCost::Free);
  CHECK(fused->setup.training.lossImplementation == LossImplementation::FusedLinearCrossEntropy);
  CHECK(MustEstimate(fused->setup).device.peakDeviceBytes == fused->peakBytes);
  Setup chunked = s;
  chunked.training.lossImplementation = LossImplementation::Chunked;
  CHECK(fused->peakBytes < MustEstimate(chunked).device.peakDeviceBytes);  // no logits at all against chunked ones
  // Under autocast Liger is refused: the chunked loss is offered instead.
  s.training.precision = Precision::AmpBF16;
  const SolveResult amp = Solve(s);
  CHECK(Suggestion(amp, "loss-fused") == nullptr);
  CHECK(Suggestion(amp, "loss-chunked") != nullptr);
}

TEST_CASE("Reentrant checkpointing with a frozen word embedding is noted: the blocks get no gradient", "[savers]") {
  auto hasNote = [](const Setup& s) {
    const Estimate e = MustEstimate(s);
    return std::any_of(e.notes.begin(), e.notes.end(),
                       [](const std::string& n) { return n.find("None of the inputs have requires_grad") != std::string::npos; });
  };
  Setup s = TinyTransformer(Family::Llama, 2, Precision::FP32);
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.finetune.freezeEmbeddings = true;
  CHECK(hasNote(s));
  s.training.useReentrant = false;  // the non-reentrant checkpoint reaches the parameters
  CHECK_FALSE(hasNote(s));
  s.training.useReentrant = true;
  s.finetune.freezeEmbeddings = false;  // the embedding's output requires grad
  CHECK_FALSE(hasNote(s));
  s.finetune.lora = true;  // PEFT's enable_input_require_grads hook
  CHECK_FALSE(hasNote(s));
}
