// Pipeline parallelism composed with sequence and context parallelism (Megatron's TP + SP + PP
// layout, torchtitan's FSDP × CP × TP × PP rows), pinned by hand: the stage boundary tensors
// carry the rank's s/(c·t) tokens, the in-flight micro-batches' saved activations are the
// sharded ones, and the stage's parameters are the tensor-parallel rank's slice of its layers
// (docs/parallel.md "Pipeline").
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// Llama 2 7B's blocks (h 4096, 32 heads, SwiGLU 11008, vocabulary 32000, untied head), `layers`
// of them, bf16 with fp32 masters, SDPA, 1 × s tokens, p stages under 1F1B with m micro-batches.
Setup LlamaPipeline(std::int64_t layers, std::int64_t p, std::int64_t m, std::int64_t s) {
  Setup setup = DefaultSetup();
  setup.model.kind = ModelKind::Transformer;
  setup.model.architecture = FindPreset("llama-2-7b")->architecture;
  setup.model.architecture.numLayers = layers;
  setup.training.precision = Precision::BF16Mixed;
  setup.training.attention = AttentionImplementation::SDPA;
  setup.training.batchSize = 1;
  setup.training.sequenceLength = s;
  setup.parallel.pipelineParallel = p;
  setup.parallel.gradientAccumulationSteps = m;
  return setup;
}

Setup WithSequenceParallel(Setup s, std::int64_t t) {
  s.parallel.tensorParallel = t;
  s.parallel.sequenceParallel = true;
  return s;
}

Setup AtStage(Setup s, std::int64_t stage) {
  s.parallel.pipelineStage = stage;
  return s;
}

Estimate Labelled(const Setup& s) {
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::Labelled;
  EstimateResult r = EstimateMemory(s, o);
  if (!r.ok()) FAIL("setup unexpectedly invalid: " << r.errors.front().field << ": " << r.errors.front().message);
  return r.estimate;
}

// Every positive event of a phase whose label holds `label`, as their byte sizes.
std::vector<std::int64_t> EventSizes(const Estimate& e, Phase phase, const std::string& label) {
  std::vector<std::int64_t> sizes;
  for (const TimelinePoint& p : e.timeline) {
    if (p.phase == phase && p.deltaBytes > 0 && p.label.find(label) != std::string::npos) sizes.push_back(p.deltaBytes);
  }
  return sizes;
}

std::int64_t ForwardPeak(const Setup& s) {
  return MustEstimate(s).phasePeaks[static_cast<std::size_t>(Phase::Forward)].totalBytes;
}

// One more micro-batch in flight on `stage`: the forward peak with two less the peak with one
// (under 1F1B stage r keeps min(p − r, m), so both counts are reached on a middle stage of 4).
std::int64_t OneMicroBatchInFlight(Setup s, std::int64_t stage) {
  s.parallel.pipelineStage = stage;
  s.parallel.gradientAccumulationSteps = 2;
  const std::int64_t two = ForwardPeak(s);
  s.parallel.gradientAccumulationSteps = 1;
  return two - ForwardPeak(s);
}

constexpr std::int64_t kHidden = 4096, kFfn = 11008, kHeads = 32, kHeadDim = 128, kVocab = 32000;

}  // namespace

TEST_CASE("Pipeline with sequence parallel: the stage boundary carries b s/t h", "[pipeline][compose]") {
  // PP 2 × TP 2 + SP, 4 layers, 1 × 512 tokens, 2 micro-batches. Megatron schedules.py
  // get_tensor_shapes: (seq_length // tensor_model_parallel_size, micro_batch_size, hidden) with
  // sequence_parallel, in pipeline_dtype (params_dtype, bf16 here).
  const std::int64_t s = 512, t = 2;
  const Setup base = WithSequenceParallel(LlamaPipeline(4, 2, 2, s), t);
  REQUIRE(Validate(base).empty());
  const std::int64_t boundary = 1 * (s / t) * kHidden * 2;  // 2 MiB
  const Estimate last = Labelled(AtStage(base, 1));
  const std::vector<std::int64_t> received =
      EventSizes(last, Phase::Forward, "input_tensor (received from the previous stage)");
  REQUIRE(received.size() >= 2);  // one per micro-batch
  for (std::int64_t bytes : received) CHECK(bytes == boundary);
  // The first stage receives the output gradient of the same shape (recv_backward) in backward.
  const Estimate first = Labelled(AtStage(base, 0));
  const std::vector<std::int64_t> gradients = EventSizes(first, Phase::Backward, "send output_tensor");
  REQUIRE(gradients.size() >= 2);
  for (std::int64_t bytes : gradients) CHECK(bytes == boundary);
  CHECK(EventSizes(first, Phase::Forward, "input_tensor (received").empty());
  // The embeddings reduce-scatter to the rank's s/t tokens on the first stage, as on one stage.
  const std::vector<std::int64_t> scattered = EventSizes(first, Phase::Forward, "embeddings reduce-scatter (s/t)");
  CHECK(scattered.size() == 4);  // two micro-batches in each of two steps
  for (std::int64_t bytes : scattered) CHECK(bytes == boundary);
  // The head on the last stage all-gathers its sequence-sharded input: backward's full
  // grad_input [b, s, h] before the reduce-scatter.
  CHECK(!EventSizes(last, Phase::Backward, "before reduce-scatter").empty());
  // Without sequence parallelism the boundary is the whole sequence.
  Setup tensorOnly = base;
  tensorOnly.parallel.sequenceParallel = false;
  for (std::int64_t bytes : EventSizes(Labelled(AtStage(tensorOnly, 1)), Phase::Forward, "input_tensor (received"))
    CHECK(bytes == t * boundary);
}

TEST_CASE("Pipeline with sequence parallel: a stage's parameters are the rank's slice of its layers", "[pipeline][compose]") {
  // PP 2 × TP 2 + SP over 4 layers: per layer and rank q, k, v, o (4·h·h/t), gate, up, down
  // (3·h·ffn/t) and two whole RMSNorms (2·h); the vocabulary (32000, a multiple of 128·t) V/t rows.
  const std::int64_t t = 2, h = kHidden;
  const std::int64_t perLayer = 4 * h * h / t + 3 * h * kFfn / t + 2 * h;
  const Setup base = WithSequenceParallel(LlamaPipeline(4, 2, 2, 512), t);
  const Estimate first = MustEstimate(AtStage(base, 0)), last = MustEstimate(AtStage(base, 1));
  CHECK(first.modelStates.parameterCount == 2 * perLayer + kVocab / t * h);
  CHECK(last.modelStates.parameterCount == 2 * perLayer + h + kVocab / t * h);
  // bf16 weights, bf16 gradients, fp32 masters and two fp32 Adam moments: 16 B a parameter.
  CHECK(first.modelStates.totalBytes == 16 * first.modelStates.parameterCount);
  CHECK(first.rank.pipelineStage == 0);
  CHECK(last.rank.pipelineStage == 1);
  CHECK(first.rank.worldSize == 4);
}

TEST_CASE("Pipeline with sequence parallel: an in-flight micro-batch holds the sharded activations", "[pipeline][compose]") {
  // A middle stage (1 of 4, two layers, no embeddings, no head) under 1F1B: one more micro-batch
  // in flight keeps its received input and what its two blocks save. One GPU's block saves
  // 24·bsh + 8·bs·ffn + (8 + 4a)·bs (tests/sequence_context_expert_test.cpp), and with sequence
  // parallelism exactly 1/t of it; the received input is b·s/t·h in bf16. The rotary tables
  // cos and sin ([1, 1, s, head_dim], bf16, saved by apply_rotary_pos_emb) stay whole: Megatron
  // gathers the sequence before attention, so every rank's rotary covers all s positions. The
  // sent output keeps one bf16 element (deallocate_output_tensor: out.data = torch.empty((1,))).
  const std::int64_t s = 512, b = 1, h = kHidden;
  const std::int64_t block = 24 * b * s * h + 8 * b * s * kFfn + (8 + 4 * kHeads) * b * s;
  const std::int64_t rotary = 2 * s * kHeadDim * 2;
  const Setup one = LlamaPipeline(8, 4, 2, s);
  CHECK(OneMicroBatchInFlight(one, 1) == 2 * block + b * s * h * 2 + rotary + 2);
  for (std::int64_t t : {2, 4}) {
    INFO("t " << t);
    CHECK(OneMicroBatchInFlight(WithSequenceParallel(one, t), 1) == 2 * block / t + b * (s / t) * h * 2 + rotary + 2);
  }
}

TEST_CASE("Pipeline with context parallel: the stage runs on s/c tokens", "[pipeline][compose]") {
  // Megatron get_tensor_shapes: seq_length // context_parallel_size (and // t with sequence
  // parallelism). The rank's stage saves what the same stage saves on one GPU on s/c tokens.
  const std::int64_t s = 1024, b = 1;
  for (std::int64_t c : {2, 4}) {
    INFO("c " << c);
    Setup cp = LlamaPipeline(8, 4, 2, s);
    cp.parallel.contextParallel = c;
    REQUIRE(Validate(cp).empty());
    const Setup local = LlamaPipeline(8, 4, 2, s / c);
    CHECK(OneMicroBatchInFlight(cp, 1) == OneMicroBatchInFlight(local, 1));
    const Estimate e = Labelled(AtStage(cp, 1));
    for (std::int64_t bytes : EventSizes(e, Phase::Forward, "input_tensor (received"))
      CHECK(bytes == b * (s / c) * kHidden * 2);
    CHECK(e.rank.why.find("context-parallel rank") != std::string::npos);
    CHECK(e.rank.worldSize == 4 * c);
  }
  // PP × CP × TP + SP: the boundary is s/(c·t) tokens.
  Setup all = WithSequenceParallel(LlamaPipeline(8, 4, 2, s), 2);
  all.parallel.contextParallel = 2;
  REQUIRE(Validate(all).empty());
  for (std::int64_t bytes : EventSizes(Labelled(AtStage(all, 2)), Phase::Forward, "input_tensor (received"))
    CHECK(bytes == b * (s / 4) * kHidden * 2);
}

TEST_CASE("Pipeline with expert parallel: an in-flight micro-batch holds what the expert-parallel blocks save", "[pipeline][compose]") {
  // Megatron's MoE layout with a pipeline (EP 2 over DP 2, PP 4, Mixtral's blocks, bf16 mixed,
  // SDPA, 1 × 256): a middle stage of two blocks keeps, per micro-batch in flight, what two
  // expert-parallel blocks save on the one-pass rank (the dispatcher's permuted rows, the local
  // experts' MLPs on their T·k rows, the unpermute's probabilities), its received input
  // (b·s·h bf16), the rotary tables (whole) and the sent output's one element.
  const std::int64_t s = 256, b = 1, h = 4096;
  Setup moe = LlamaPipeline(8, 4, 2, s);
  moe.model.architecture = FindPreset("mixtral-8x7b")->architecture;
  moe.model.architecture.numLayers = 8;
  moe.parallel.dataParallel = 2;
  moe.parallel.expertParallel = 2;
  REQUIRE(Validate(moe).empty());
  Setup onePass = moe;
  onePass.parallel.pipelineParallel = 1;
  onePass.parallel.gradientAccumulationSteps = 1;
  const std::int64_t rotary = 2 * s * 128 * 2;
  CHECK(OneMicroBatchInFlight(moe, 1) == 2 * SavedPerBlock(onePass) + b * s * h * 2 + rotary + 2);
  // The stage holds E/e = 4 experts of each of its two blocks, the router and attention whole.
  const std::int64_t expert = 3 * h * 14336, attention = 2 * h * h + 2 * h * 1024, router = 8 * h;
  CHECK(MustEstimate(AtStage(moe, 1)).modelStates.parameterCount == 2 * (4 * expert + attention + router + 2 * h));
}

TEST_CASE("Pipeline with LoRA: a stage holds its layers' adapters and saves what they save on one GPU", "[pipeline][compose][finetune-parallel]") {
  // LoRA r 16 on q, v (fp32 adapters, PEFT's default) over Llama 2 7B's blocks, bf16, PP 4 × DP 2:
  // a middle stage's received input requires its gradient as block 1's input does on one GPU
  // (block 0's adapters are upstream), so one more micro-batch in flight keeps what two such
  // blocks save, the received input, the rotary tables and the sent output's element.
  const std::int64_t s = 512, b = 1, h = kHidden;
  Setup lora = LlamaPipeline(8, 4, 2, s);
  lora.training.precision = Precision::BF16;
  lora.parallel.dataParallel = 2;
  lora.finetune.lora = true;
  lora.finetune.r = 16;
  REQUIRE(Validate(lora).empty());
  Setup onePass = lora;
  onePass.parallel.pipelineParallel = 1;
  onePass.parallel.gradientAccumulationSteps = 1;
  const std::int64_t rotary = 2 * s * kHeadDim * 2;
  CHECK(OneMicroBatchInFlight(lora, 1) == 2 * SavedPerBlock(onePass) + b * s * h * 2 + rotary + 2);
  // The stage's two blocks: frozen base in bf16, adapters A [16, h] + B [h, 16] on q and v in fp32.
  const Estimate stage = MustEstimate(AtStage(lora, 1));
  const std::int64_t base = 2 * (4 * h * h + 3 * h * kFfn + 2 * h), adapters = 2 * 2 * (16 * h + h * 16);
  CHECK(stage.modelStates.parametersBytes == base * 2 + adapters * 4);
  CHECK(stage.modelStates.optimizerStatesBytes == 2 * adapters * 4);
}

TEST_CASE("Context parallel with LoRA: a rank's blocks save what they save on one GPU on s/c tokens", "[pipeline][compose][finetune-parallel]") {
  // Outside attention every op of a block, the adapters' included, runs on the rank's s/c tokens;
  // the ring attention saves what the full-training context-parallel rank saves. So the LoRA
  // block's saving under c equals the full-training block's under c plus what the adapters add
  // on one GPU on s/c tokens.
  const std::int64_t s = 1024;
  auto lora = [](Setup x) {
    x.training.precision = Precision::BF16;
    x.finetune.lora = true;
    x.finetune.r = 16;
    return x;
  };
  auto full = [](Setup x) {
    x.training.precision = Precision::BF16;
    return x;
  };
  for (std::int64_t c : {2, 4}) {
    INFO("c " << c);
    Setup cp = LlamaPipeline(2, 1, 1, s);
    cp.parallel.contextParallel = c;
    REQUIRE(Validate(lora(cp)).empty());
    const Setup local = LlamaPipeline(2, 1, 1, s / c);
    CHECK(SavedPerBlock(lora(cp)) - SavedPerBlock(full(cp)) == SavedPerBlock(lora(local)) - SavedPerBlock(full(local)));
  }
}

namespace {
std::vector<std::int64_t> Split(std::int64_t layers, std::int64_t p, std::int64_t first = 0, std::int64_t last = 0,
                                PipelineSchedule schedule = PipelineSchedule::OneFOneB, std::int64_t v = 1) {
  ParallelDef par;
  par.pipelineParallel = p;
  par.pipelineFirstStageLayers = first;
  par.pipelineLastStageLayers = last;
  par.pipelineSchedule = schedule;
  par.virtualStages = v;
  return PipelineStageLayers(par, layers);
}
using Layers = std::vector<std::int64_t>;
}  // namespace

TEST_CASE("Unequal stages: Megatron's first and last stage layers and torchtitan's split", "[pipeline][compose]") {
  // Even: Megatron get_num_layers_to_build, L/p.
  CHECK(Split(32, 4) == Layers{8, 8, 8, 8});
  CHECK(Split(32, 4, 0, 0, PipelineSchedule::Interleaved, 2) == Layers{8, 8, 8, 8});
  // torchtitan generate_split_points (December 2024): the first L div p, middle stages one more
  // while the remainder lasts, the last the rest. Llama 3.1 405B, 126 layers over 8 stages.
  CHECK(Split(126, 8) == Layers{15, 16, 16, 16, 16, 16, 16, 15});
  CHECK(Split(12, 5) == Layers{2, 3, 3, 2, 2});  // base 2, remainder 2
  CHECK(Split(7, 4) == Layers{1, 2, 2, 2});      // base 1, remainder 3: the last takes the third
  CHECK(Split(10, 4) == Layers{2, 3, 3, 2});
  CHECK(Split(3, 4).empty());                     // more stages than layers
  // Interleaved: torchtitan's split over the p·v virtual stages, rank r running virtual stages r,
  // r + p, … (12 over 10: 1, 2, 2, 1, 1, 1, 1, 1, 1, 1; rank 1 holds the second and the seventh).
  CHECK(Split(12, 5, 0, 0, PipelineSchedule::Interleaved, 2) == Layers{2, 3, 3, 2, 2});
  // Llama 3.1 405B over 8 ranks × 2 (torchtitan's Interleaved 1F1B row): 16 virtual stages of
  // 7, 8 × 14, 7, so ranks 0 and 7 hold 7 + 8 layers and the others 16.
  CHECK(Split(126, 8, 0, 0, PipelineSchedule::Interleaved, 2) == Layers{15, 16, 16, 16, 16, 16, 16, 15});
  {
    ParallelDef par;
    par.pipelineParallel = 8;
    par.pipelineSchedule = PipelineSchedule::Interleaved;
    par.virtualStages = 2;
    CHECK(PipelineChunkLayers(par, 126) == Layers{7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7});
    CHECK(PipelineChunkLayers(par, 128) == Layers(16, 8));
  }
  CHECK(Split(7, 4, 0, 0, PipelineSchedule::Interleaved, 2).empty());  // 8 virtual stages, 7 layers
  // Megatron --decoder-first/last-pipeline-num-layers: the rest evenly over the other stages.
  CHECK(Split(32, 4, 3, 5) == Layers{3, 12, 12, 5});
  CHECK(Split(30, 4, 6) == Layers{6, 8, 8, 8});
  CHECK(Split(30, 4, 0, 3) == Layers{9, 9, 9, 3});
  CHECK(Split(10, 2, 4) == Layers{4, 6});
  CHECK(Split(10, 2, 4, 6) == Layers{4, 6});
  CHECK(Split(10, 2, 4, 5).empty());   // both set: they must add up to L
  CHECK(Split(32, 4, 3, 4).empty());   // 25 over 2 stages
  CHECK(Split(8, 4, 4, 4).empty());    // nothing left for the middle stages
  CHECK(Split(32, 4, 4, 4, PipelineSchedule::Interleaved, 2).empty());
}

TEST_CASE("Unequal stages: each stage holds and runs its own layers", "[pipeline][compose]") {
  // Llama 2 7B's blocks, 10 layers over 4 stages (torchtitan's split 2, 3, 3, 2).
  const std::int64_t h = kHidden, s = 512, b = 1;
  const std::int64_t perLayer = 4 * h * h + 3 * h * kFfn + 2 * h;
  const Setup base = LlamaPipeline(10, 4, 2, s);
  REQUIRE(Validate(base).empty());
  CHECK(MustEstimate(AtStage(base, 0)).modelStates.parameterCount == 2 * perLayer + kVocab * h);
  CHECK(MustEstimate(AtStage(base, 1)).modelStates.parameterCount == 3 * perLayer);
  CHECK(MustEstimate(AtStage(base, 2)).modelStates.parameterCount == 3 * perLayer);
  CHECK(MustEstimate(AtStage(base, 3)).modelStates.parameterCount == 2 * perLayer + h + kVocab * h);
  // The in-flight micro-batch of stage 1 holds its three blocks' saved activations (as in the
  // sequence-parallel case above: the block by hand, the received input, the rotary tables and
  // the sent output's one element).
  const std::int64_t block = 24 * b * s * h + 8 * b * s * kFfn + (8 + 4 * kHeads) * b * s;
  const std::int64_t rotary = 2 * s * kHeadDim * 2;
  CHECK(OneMicroBatchInFlight(base, 1) == 3 * block + b * s * h * 2 + rotary + 2);
  CHECK(OneMicroBatchInFlight(base, 2) == 3 * block + b * s * h * 2 + rotary + 2);
  // Megatron's first/last stage layers: 1 on the first, 2 on the last, 7 in between (p = 3).
  Setup megatron = LlamaPipeline(10, 3, 2, s);
  megatron.parallel.pipelineFirstStageLayers = 1;
  megatron.parallel.pipelineLastStageLayers = 2;
  REQUIRE(Validate(megatron).empty());
  CHECK(MustEstimate(AtStage(megatron, 0)).modelStates.parameterCount == perLayer + kVocab * h);
  CHECK(MustEstimate(AtStage(megatron, 1)).modelStates.parameterCount == 7 * perLayer);
  CHECK(MustEstimate(AtStage(megatron, 2)).modelStates.parameterCount == 2 * perLayer + h + kVocab * h);
  // Stage −1 also simulates the middle stage with the most layers, and shows it when it peaks
  // above the first and the last.
  const Estimate chosen = MustEstimate(megatron);
  CHECK(chosen.rank.pipelineStage == 1);
  CHECK(chosen.rank.why.find("pipeline stage 1 (a middle stage of 7 layers") == 0);
  CHECK(chosen.peak.totalBytes == MustEstimate(AtStage(megatron, 1)).peak.totalBytes);
  CHECK(chosen.peak.totalBytes > MustEstimate(AtStage(megatron, 0)).peak.totalBytes);
  bool noted = false;
  for (const std::string& n : chosen.notes) noted |= n.find("unequal layer counts (1, 7, 2)") != std::string::npos;
  CHECK(noted);
  // An even split never simulates a middle stage: the first and the last as before.
  const Estimate even = MustEstimate(LlamaPipeline(8, 4, 4, s));
  CHECK((even.rank.pipelineStage == 0 || even.rank.pipelineStage == 3));
  CHECK(even.rank.why.find("middle") == std::string::npos);
}

TEST_CASE("Unequal stages: the fields are validated by name and read and written as JSON", "[pipeline][compose]") {
  CHECK(DefaultSetup().parallel.pipelineFirstStageLayers == 0);
  CHECK(DefaultSetup().parallel.pipelineLastStageLayers == 0);
  Setup s = LlamaPipeline(10, 3, 2, 512);
  s.parallel.pipelineFirstStageLayers = -1;
  CHECK(HasErrorOn(Validate(s), "parallel.pipelineFirstStageLayers"));
  s.parallel.pipelineFirstStageLayers = 2'000'000;
  CHECK(HasErrorOn(Validate(s), "parallel.pipelineFirstStageLayers"));
  s.parallel.pipelineFirstStageLayers = 0;
  s.parallel.pipelineLastStageLayers = 3;  // 7 over 2 stages
  CHECK(HasErrorOn(Validate(s), "parallel.pipelineLastStageLayers"));
  s.parallel.pipelineLastStageLayers = 4;  // 6 over 2
  CHECK(Validate(s).empty());
  Setup one = LlamaPipeline(10, 1, 1, 512);
  one.parallel.pipelineLastStageLayers = 4;
  CHECK(HasErrorOn(Validate(one), "parallel.pipelineLastStageLayers"));
  Setup inter = LlamaPipeline(12, 2, 2, 512);
  inter.parallel.pipelineSchedule = PipelineSchedule::Interleaved;
  inter.parallel.virtualStages = 2;
  inter.parallel.pipelineFirstStageLayers = 4;
  CHECK(HasErrorOn(Validate(inter), "parallel.pipelineFirstStageLayers"));
  inter.parallel.pipelineFirstStageLayers = 0;
  CHECK(Validate(inter).empty());
  inter.model.architecture.numLayers = 10;  // 10 layers over 2 × 2 chunks: torchtitan's split
  CHECK(Validate(inter).empty());
  inter.model.architecture.numLayers = 3;   // fewer layers than the 4 virtual stages
  CHECK(HasErrorOn(Validate(inter), "parallel.pipelineParallel"));
  CHECK(HasErrorOn(Validate(LlamaPipeline(3, 4, 1, 512)), "parallel.pipelineParallel"));
  const std::string text = SetupToJson(s);
  CHECK(text.find("\"pipelineLastStageLayers\":4") != std::string::npos);
  const SetupParseResult back = ParseSetupJson(text);
  REQUIRE(back.ok());
  CHECK(back.setup.parallel.pipelineLastStageLayers == 4);
  CHECK(back.setup.parallel.pipelineFirstStageLayers == 0);
  const SetupParseResult wrong = ParseSetupJson(R"({"parallel":{"pipelineFirstStageLayers":"two"}})");
  CHECK(!wrong.ok());
}

TEST_CASE("Unequal stages: interleaved chunks of unequal layer counts run their own layers", "[pipeline][compose]") {
  // 6 layers over PP 2 × v 2: torchtitan's split over 4 virtual stages is 1, 2, 2, 1, so rank 0
  // runs chunks of 1 and 2 layers (virtual stages 0 and 2), rank 1 of 2 and 1 (1 and 3).
  Setup base = LlamaPipeline(6, 2, 2, 512);
  base.parallel.pipelineSchedule = PipelineSchedule::Interleaved;
  base.parallel.virtualStages = 2;
  REQUIRE(Validate(base).empty());
  CHECK(PipelineStageLayers(base.parallel, 6) == Layers{3, 3});
  CHECK(PipelineStageSetup(AtStage(base, 0)).parallel.stageChunkLayers == Layers{1, 2});
  CHECK(PipelineStageSetup(AtStage(base, 1)).parallel.stageChunkLayers == Layers{2, 1});
  // Equal chunks keep the even split (no list).
  Setup even = base;
  even.model.architecture.numLayers = 8;
  CHECK(PipelineStageSetup(AtStage(even, 0)).parallel.stageChunkLayers.empty());
  const std::int64_t h = kHidden, perLayer = 4 * h * h + 3 * h * kFfn + 2 * h;
  const Estimate first = Labelled(AtStage(base, 0));
  CHECK(first.modelStates.parameterCount == 3 * perLayer + kVocab * h);
  // Rank 0's warm-up runs chunk 0 for both micro-batches before chunk 1 (PipelineScheduleOf:
  // warm-up (p − r − 1)·2 + (v − 1)·p = 4 chunk-forwards): chunk 0 is block 0 alone, so both
  // micro-batches' input_ids are loaded before block 1's first event, and block 1 and block 2
  // first run in the same chunk-forward (no batch loaded between them).
  auto firstIndex = [&](const Estimate& e, auto&& match) {
    for (std::size_t i = 0; i < e.timeline.size(); ++i) if (e.timeline[i].step == 1 && match(e.timeline[i])) return i;
    return e.timeline.size();
  };
  auto loadsBefore = [&](const Estimate& e, std::size_t end) {
    int n = 0;
    for (std::size_t i = 0; i < end; ++i) n += e.timeline[i].step == 1 && e.timeline[i].deltaBytes > 0 &&
                                                e.timeline[i].label.find("batch: input_ids") != std::string::npos;
    return n;
  };
  const std::size_t block1 = firstIndex(first, [](const TimelinePoint& p) { return p.layer == 1; });
  const std::size_t block2 = firstIndex(first, [](const TimelinePoint& p) { return p.layer == 2; });
  REQUIRE(block2 < first.timeline.size());
  CHECK(loadsBefore(first, block1) == 2);
  CHECK(loadsBefore(first, block2) == 2);
  // Rank 1: chunk 0 is blocks 0 and 1, chunk 1 block 2 with the head. Its first chunk-forward
  // (chunk 0, micro-batch 0) reaches block 1 before block 2 appears.
  const Estimate last = Labelled(AtStage(base, 1));
  CHECK(last.modelStates.parameterCount == 3 * perLayer + h + kVocab * h);
  const std::size_t lastBlock1 = firstIndex(last, [](const TimelinePoint& p) { return p.layer == 1; });
  const std::size_t lastBlock2 = firstIndex(last, [](const TimelinePoint& p) { return p.layer == 2; });
  const std::size_t labels = firstIndex(last, [](const TimelinePoint& p) { return p.label.find("batch: labels") != std::string::npos; });
  CHECK(lastBlock1 < lastBlock2);
  CHECK(lastBlock1 < labels);  // chunk 0 loads no labels; chunk 1 (the head's) does
}

TEST_CASE("Pipeline with sequence parallel: the layout cost and the solver", "[pipeline][compose][layouts]") {
  // The p2p traffic is 2·m·v·b·h·s/(c·t) activations a step (Megatron get_tensor_shapes).
  Setup s = WithSequenceParallel(LlamaPipeline(8, 2, 4, 1024), 2);
  const double bsh = 1.0 * 1024 * kHidden * 2;  // bf16 activations
  CHECK(LayoutCostOf(s).pipelineBytes == Approx(2 * 4 * bsh / 2));
  s.parallel.contextParallel = 2;
  CHECK(LayoutCostOf(s).pipelineBytes == Approx(2 * 4 * bsh / 4));
  s.parallel.sequenceParallel = false;
  CHECK(LayoutCostOf(s).pipelineBytes == Approx(2 * 4 * bsh / 2));
  // A setup with sequence parallelism on: the solver now simulates its pipeline layouts (tp > 1)
  // where it refused them before.
  Setup solve = WithSequenceParallel(LlamaPipeline(8, 1, 1, 512), 2);
  solve.gpu.memoryGiB = 80;
  const LayoutsResult r = LayoutsForCluster(solve, 4, {.allowOffload = false, .maxEstimates = 64});
  REQUIRE(r.ok());
  bool pipelineWithSequence = false;
  for (const LayoutRow& row : r.layouts) {
    pipelineWithSequence |= row.pipelineParallel > 1 && row.tensorParallel > 1 && row.setup.parallel.sequenceParallel;
  }
  CHECK(pipelineWithSequence);
}

TEST_CASE("Pipeline composed at torchtitan's 405B size: FSDP2 8 x TP 8 + SP x PP 8 over 126 layers", "[pipeline][compose]") {
  // torchtitan's Table 5 1F1B layout as gpumem states it (llama3_h100_202412_torchtitan.md):
  // the work budget counts the largest stage's 16 layers a micro-batch, not all 126, so its 8
  // micro-batches are simulated; stage −1 finds a middle stage of 16 layers above both ends.
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-3.1-405b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.training.batchSize = 4;
  s.training.sequenceLength = 8192;
  s.parallel.dataParallel = 8;
  s.parallel.fsdp = FsdpMode::FullyShard;
  s.parallel.reshardAfterForward = false;
  s.parallel.fsdpReduceInFp32 = true;
  s.parallel.tensorParallel = 8;
  s.parallel.sequenceParallel = true;
  s.parallel.pipelineParallel = 8;
  s.parallel.gradientAccumulationSteps = 8;
  REQUIRE(Validate(s).empty());
  CHECK(PipelineStageLayers(s.parallel, 126) == Layers{15, 16, 16, 16, 16, 16, 16, 15});
  const Estimate e = MustEstimate(s);
  CHECK(e.rank.pipelineStage == 1);
  CHECK(e.rank.worldSize == 512);
  // The stage's parameters: 16 of the 126 blocks, each sliced 8 ways by tensor parallelism.
  const ArchitectureDef& a = s.model.architecture;
  const std::int64_t h = a.hiddenSize, kv = a.numKeyValueHeads * (h / a.numHeads), ffn = IntermediateSize(a);
  const std::int64_t perLayer = (h * h + 2 * h * kv + h * h) / 8 + 3 * h * ffn / 8 + 2 * h;
  CHECK(e.modelStates.parameterCount == 16 * perLayer);
}

TEST_CASE("Pipeline with sequence parallel: GPT-2's learned positions and tied head on the stages", "[pipeline][compose]") {
  // GPT-2 (124M), 12 layers over 2 stages × TP 2 + SP, 1 × 256 tokens, bf16 mixed. Megatron's
  // LanguageModelEmbedding scatters wte + wpe to s/t tokens before the dropout; the boundary is
  // b·s/t·h; the last stage's tied head (a copy of wte, V/t rows) all-gathers its input.
  Setup g = DefaultSetup();
  g.model.kind = ModelKind::Transformer;
  g.model.architecture = FindPreset("gpt2")->architecture;
  g.training.precision = Precision::BF16Mixed;
  g.training.sequenceLength = 256;
  g.parallel.pipelineParallel = 2;
  g.parallel.gradientAccumulationSteps = 2;
  g = WithSequenceParallel(g, 2);
  REQUIRE(Validate(g).empty());
  const std::int64_t h = 768, boundary = 1 * 128 * h * 2;
  const Estimate first = Labelled(AtStage(g, 0)), last = Labelled(AtStage(g, 1));
  const std::vector<std::int64_t> scattered = EventSizes(first, Phase::Forward, "embeddings scatter (s/t)");
  REQUIRE(!scattered.empty());
  for (std::int64_t bytes : scattered) CHECK(bytes == boundary);
  const std::vector<std::int64_t> received = EventSizes(last, Phase::Forward, "input_tensor (received");
  REQUIRE(!received.empty());
  for (std::int64_t bytes : received) CHECK(bytes == boundary);
  CHECK(!EventSizes(last, Phase::Backward, "before reduce-scatter").empty());
  // The tied head's word embeddings on the last stage: ⌈50257 / 256⌉·256 / 2 rows.
  const std::int64_t vocabRows = (50257 + 255) / 256 * 256 / 2;
  const Setup lastStage = PipelineStageSetup(TensorParallelRankSetup(AtStage(g, 1)));
  const Inventory lastInventory = PipelineStageInventory(BuildInventory(lastStage), lastStage);
  const int wte = lastInventory.IndexOf("transformer.wte.weight");
  REQUIRE(wte >= 0);
  CHECK(lastInventory.parameters[static_cast<std::size_t>(wte)].Elements() == vocabRows * h);
}

TEST_CASE("Unequal stages: the Megatron import reads the first and last stage layer counts", "[pipeline][compose][import]") {
  const Setup base = LlamaPipeline(32, 1, 1, 512);
  const ParallelImport r = ImportMegatronArguments(
      "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5", base);
  REQUIRE(r.errors.empty());
  CHECK(r.setup.parallel.pipelineParallel == 4);
  CHECK(r.setup.parallel.pipelineFirstStageLayers == 3);
  CHECK(r.setup.parallel.pipelineLastStageLayers == 5);
  const ParallelImport bad = ImportMegatronArguments("--decoder-first-pipeline-num-layers 0", base);
  REQUIRE(bad.errors.size() == 1);
  CHECK(bad.errors[0].field == "--decoder-first-pipeline-num-layers");
}
