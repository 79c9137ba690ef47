// Pipeline parallelism: the schedules' in-flight micro-batches, the stage's model, the bubble,
// Megatron's in-flight factor, validation, and that a stage's simulated peak grows as its
// schedule keeps micro-batches alive (docs/parallel.md "Pipeline").
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup Gpt2Pipeline(std::int64_t p, std::int64_t m, PipelineSchedule schedule = PipelineSchedule::OneFOneB) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("gpt2")->architecture;  // 12 layers, tied head
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 256;
  s.parallel.pipelineParallel = p;
  s.parallel.gradientAccumulationSteps = m;
  s.parallel.pipelineSchedule = schedule;
  return s;
}

Setup Llama7bPipeline(std::int64_t p) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;  // 32 layers, untied head
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 256;
  s.parallel.pipelineParallel = p;
  return s;
}

Setup WithStage(Setup s, std::int64_t stage) {
  s.parallel.pipelineStage = stage;
  return s;
}

std::int64_t ForwardPeak(const Estimate& e) { return e.phasePeaks[static_cast<std::size_t>(Phase::Forward)].totalBytes; }

}  // namespace

TEST_CASE("Pipeline: 1F1B keeps min(p - r; m) micro-batches in flight on stage r", "[pipeline]") {
  for (std::int64_t p : {2, 4, 8}) {
    for (std::int64_t r = 0; r < p; ++r) {
      for (std::int64_t m : {1, 2, 3, 4, 8, 16}) {
        INFO("p " << p << " r " << r << " m " << m);
        CHECK(PipelinePeakInFlight(PipelineSchedule::OneFOneB, p, r, m, 1) == std::min(p - r, m));
        CHECK(PipelinePeakInFlight(PipelineSchedule::GPipe, p, r, m, 1) == m);
        const std::vector<PipelineAction> a = PipelineScheduleOf(PipelineSchedule::OneFOneB, p, r, m, 1);
        CHECK(a.size() == static_cast<std::size_t>(2 * m));
        CHECK(a.back().backward);
      }
    }
  }
  // Stage 0 of 4 with 8 micro-batches: three warm-up forwards, then F3 B0 F4 B1 …
  const std::vector<PipelineAction> a = PipelineScheduleOf(PipelineSchedule::OneFOneB, 4, 0, 8, 1);
  REQUIRE(a.size() == 16);
  CHECK((!a[0].backward && a[0].microBatch == 0 && !a[2].backward && a[2].microBatch == 2));
  CHECK((!a[3].backward && a[3].microBatch == 3 && a[4].backward && a[4].microBatch == 0));
  CHECK((a[15].backward && a[15].microBatch == 7));
}

TEST_CASE("Pipeline: the interleaved schedule and Megatron's in-flight factor agree on the first stage", "[pipeline]") {
  // Warm-up (p − 1)·2 + (v − 1)·p chunk-forwards and one more in the steady state, each of L/(p·v)
  // layers: p·(1 + (p − 1)/(p·v)) micro-batches of the stage's L/p layers, Megatron's penalty.
  for (std::int64_t p : {2, 4, 8}) {
    for (std::int64_t v : {2, 3, 4}) {
      const std::int64_t m = 4 * p;
      INFO("p " << p << " v " << v);
      const std::int64_t chunks = PipelinePeakInFlight(PipelineSchedule::Interleaved, p, 0, m, v);
      CHECK(chunks == (p - 1) * 2 + (v - 1) * p + 1);
      CHECK(static_cast<double>(chunks) / static_cast<double>(v) ==
            Approx(MegatronInFlightMicroBatches(p, m, v, true)).epsilon(1e-12));
      // Every micro-batch runs through every chunk once forward and once backward.
      const std::vector<PipelineAction> a = PipelineScheduleOf(PipelineSchedule::Interleaved, p, 0, m, v);
      CHECK(a.size() == static_cast<std::size_t>(2 * m * v));
      for (std::int64_t c = 0; c < v; ++c) {
        CHECK(std::count_if(a.begin(), a.end(), [&](const PipelineAction& x) { return !x.backward && x.chunk == c; }) == m);
      }
    }
  }
  // m = p: on the first stage the warm-up (p − 1)·2 + (v − 1)·p covers every chunk-forward.
  CHECK(PipelinePeakInFlight(PipelineSchedule::Interleaved, 4, 0, 4, 2) == 8);
  // The last stage of Megatron's gpt3_7b_tp1_pp4_memory_speed (p 4, m 4, v 8): 0·2 + 7·4 = 28
  // warm-up chunk-forwards of 32, then one forward and one backward each, so 29 in flight at most
  // (get_pp_rank_microbatches; older releases put all 32 in the warm-up when m = p).
  CHECK(PipelinePeakInFlight(PipelineSchedule::Interleaved, 4, 3, 4, 8) == 29);
  const std::vector<PipelineAction> last = PipelineScheduleOf(PipelineSchedule::Interleaved, 4, 3, 4, 8);
  REQUIRE(last.size() == 64);
  CHECK(std::count_if(last.begin(), last.begin() + 28, [](const PipelineAction& x) { return !x.backward; }) == 28);
  CHECK(!last[28].backward);
  CHECK(last[29].backward);
  // Without interleaving Megatron's factor min(m, p) is the simulation's count on stage 0.
  for (std::int64_t m : {1, 2, 3, 4, 9}) {
    CHECK(MegatronInFlightMicroBatches(4, m, 1, false) ==
          Approx(static_cast<double>(PipelinePeakInFlight(PipelineSchedule::OneFOneB, 4, 0, m, 1))));
  }
}

TEST_CASE("Pipeline: Megatron's theoretical activation memory of the first stage", "[pipeline]") {
  // Llama 2 7B (h 4096, ffn 11008, 32 layers), s 4096, b 1, t 8, p 4: per layer
  // 4096·4096·(18 + 4·11008/4096) = 482,344,960 B, × 32, + 8·4096·4 + 4096·4096·4, / 8.
  const ArchitectureDef a = FindPreset("llama-2-7b")->architecture;
  CHECK(MegatronTheoreticalActivationBytes(a, 4096, 1, 8, 4, 1, 8) == 1'937'784'832.0);
  CHECK(MegatronTheoreticalActivationBytes(a, 4096, 1, 8, 4, 1, 2) == 968'892'416.0);  // min(1, m/p) = 1/2
  CHECK(MegatronTheoreticalActivationBytes(a, 4096, 1, 8, 4, 2, 8) == 2'664'454'144.0);  // × (1 + 3/8)
  // Its factors are the simulation's in-flight counts (see the interleaved test above): L/p
  // layers × min(m, p) micro-batches = L layers × min(1, m/p).
  const double perStageMicroBatch = MegatronTheoreticalActivationBytes(a, 4096, 1, 8, 4, 1, 1);
  CHECK(MegatronTheoreticalActivationBytes(a, 4096, 1, 8, 4, 1, 3) == Approx(3 * perStageMicroBatch));
}

TEST_CASE("Pipeline: the bubble is (p - 1) / (m v + p - 1)", "[pipeline]") {
  CHECK(PipelineBubbleFraction(4, 8, 1) == Approx(3.0 / 11.0).epsilon(1e-15));
  CHECK(PipelineBubbleFraction(4, 8, 2) == Approx(3.0 / 19.0).epsilon(1e-15));
  CHECK(PipelineBubbleFraction(8, 64, 4) == Approx(7.0 / 263.0).epsilon(1e-15));
  CHECK(PipelineBubbleFraction(1, 8, 1) == 0.0);
  CHECK(PipelineBubbleFraction(2, 1, 1) == Approx(0.5));
  CHECK(PipelineBubbleFraction(4, 0, 1) == 0.0);
}

TEST_CASE("Pipeline: each stage holds its layers with the embeddings first and the head last", "[pipeline]") {
  const Setup whole = Llama7bPipeline(1);
  const Inventory all = BuildInventory(whole);
  const ArchitectureDef& a = whole.model.architecture;
  const std::int64_t embed = a.vocabSize * a.hiddenSize, head = a.vocabSize * a.hiddenSize, norm = a.hiddenSize;
  const std::int64_t perLayer = (all.ParameterCount() - embed - head - norm) / a.numLayers;
  REQUIRE(perLayer * a.numLayers + embed + head + norm == all.ParameterCount());
  const Setup s = Llama7bPipeline(4);
  auto stageCount = [&](std::int64_t stage) {
    const Setup st = PipelineStageSetup(WithStage(s, stage));
    return PipelineStageInventory(BuildInventory(st), st).ParameterCount();
  };
  CHECK(stageCount(0) == 8 * perLayer + embed);
  CHECK(stageCount(1) == 8 * perLayer);
  CHECK(stageCount(2) == 8 * perLayer);
  CHECK(stageCount(3) == 8 * perLayer + norm + head);
  // The estimate's model states are the stage's.
  const Estimate first = MustEstimate(WithStage(s, 0));
  CHECK(first.modelStates.parameterCount == 8 * perLayer + embed);
  CHECK(first.rank.pipelineStage == 0);
  // GPT-2 ties its head to wte: the last stage keeps a copy of the word embeddings (not wpe).
  const Setup g = Gpt2Pipeline(4, 1);
  const ArchitectureDef& ga = g.model.architecture;
  const Setup last = PipelineStageSetup(WithStage(g, 3));
  const Inventory lastInventory = PipelineStageInventory(BuildInventory(last), last);
  CHECK(lastInventory.IndexOf("transformer.wte.weight") >= 0);
  CHECK(lastInventory.IndexOf("transformer.wpe.weight") < 0);
  CHECK(lastInventory.IndexOf("transformer.ln_f.weight") >= 0);
  const Setup firstG = PipelineStageSetup(WithStage(g, 0));
  const Inventory firstInventory = PipelineStageInventory(BuildInventory(firstG), firstG);
  CHECK(firstInventory.IndexOf("transformer.wpe.weight") >= 0);
  CHECK(firstInventory.IndexOf("transformer.ln_f.weight") < 0);
  CHECK(lastInventory.ParameterCount() - firstInventory.ParameterCount() ==
        2 * ga.hiddenSize - ga.maxPositionEmbeddings * ga.hiddenSize);
}

TEST_CASE("Pipeline: a stage's peak grows with the micro-batches its schedule keeps alive", "[pipeline]") {
  // Stage 0 of 4 under 1F1B: min(4, m) micro-batches in flight, each further one adding the same
  // saved activations until m = p. Beyond p, later forwards run after the first backward, so the
  // gradients are alive too (as with gradient accumulation), and then nothing more grows.
  auto forward = [](std::int64_t m, PipelineSchedule schedule) {
    return ForwardPeak(MustEstimate(WithStage(Gpt2Pipeline(4, m, schedule), 0)));
  };
  const std::int64_t m2 = forward(2, PipelineSchedule::OneFOneB), m3 = forward(3, PipelineSchedule::OneFOneB);
  const std::int64_t m4 = forward(4, PipelineSchedule::OneFOneB), m6 = forward(6, PipelineSchedule::OneFOneB);
  CHECK(m3 > m2);
  CHECK(m4 - m3 == m3 - m2);
  const Estimate e6 = MustEstimate(WithStage(Gpt2Pipeline(4, 6), 0));
  CHECK(m6 - m4 == e6.modelStates.gradientsBytes);
  CHECK(forward(8, PipelineSchedule::OneFOneB) == m6);
  // GPipe keeps every micro-batch: at m = 4 = p it runs as 1F1B does on stage 0, then grows on.
  CHECK(forward(4, PipelineSchedule::GPipe) == m4);
  CHECK(forward(6, PipelineSchedule::GPipe) - m4 == 2 * (m4 - m3));
  // The last stage keeps one micro-batch under 1F1B whatever m is.
  auto lastForward = [](std::int64_t m) { return ForwardPeak(MustEstimate(WithStage(Gpt2Pipeline(4, m), 3))); };
  CHECK(lastForward(2) == lastForward(5));
  // Interleaved, p = 2, v = 2 (3 layers a chunk), m = 4: (2 − 1)·2 + (2 − 1)·2 + 1 = 5
  // chunk-forwards in flight, 2.5 micro-batches of the stage against 1F1B's 2. (GPipe's 4 need not
  // peak higher: its forwards run before any gradient exists.)
  const std::int64_t inter = ForwardPeak(MustEstimate([] {
    Setup s = WithStage(Gpt2Pipeline(2, 4, PipelineSchedule::Interleaved), 0);
    s.parallel.virtualStages = 2;
    return s;
  }()));
  const std::int64_t oneF = ForwardPeak(MustEstimate(WithStage(Gpt2Pipeline(2, 4), 0)));
  CHECK(oneF < inter);
}

TEST_CASE("Pipeline: the estimate shows the first or the last stage whichever peaks higher", "[pipeline]") {
  // GPT-2, 4 × 1024 tokens over 2 stages. Four micro-batches in flight: the first stage.
  Setup many = Gpt2Pipeline(2, 4);
  many.training.batchSize = 4;
  many.training.sequenceLength = 1024;
  const Estimate autoMany = MustEstimate(many);
  const Estimate first = MustEstimate(WithStage(many, 0)), last = MustEstimate(WithStage(many, 1));
  CHECK(first.peak.totalBytes > last.peak.totalBytes);
  CHECK(autoMany.peak.totalBytes == first.peak.totalBytes);
  CHECK(autoMany.rank.pipelineStage == 0);
  CHECK(autoMany.rank.why.find("pipeline stage 0 (the first)") == 0);
  // One micro-batch: the head's fp32 logits and loss (50,257 wide) outweigh the first stage.
  Setup one = many;
  one.parallel.gradientAccumulationSteps = 1;
  const Estimate v = MustEstimate(one);
  CHECK(v.rank.pipelineStage == 1);
  CHECK(v.rank.why.find("the last") != std::string::npos);
  CHECK(v.peak.totalBytes > MustEstimate(WithStage(one, 0)).peak.totalBytes);
}

TEST_CASE("Pipeline: the p2p buffers are b s h in the parameters' dtype", "[pipeline]") {
  Setup s = WithStage(Gpt2Pipeline(4, 2), 1);  // a middle stage: receives input, receives gradients
  EstimateOptions o;
  o.explain = true;
  o.timeline = EstimateOptions::Timeline::Labelled;
  const EstimateResult r = EstimateMemory(s, o);
  REQUIRE(r.ok());
  const std::int64_t bsh = s.training.batchSize * s.training.sequenceLength * s.model.architecture.hiddenSize * 2;
  int received = 0, gradients = 0;
  for (const TimelinePoint& p : r.estimate.timeline) {
    if (p.deltaBytes == bsh && p.label.find("input_tensor (received from the previous stage)") != std::string::npos) ++received;
    if (p.deltaBytes == bsh && p.label.find("send output_tensor") != std::string::npos && p.phase == Phase::Backward) ++gradients;
  }
  INFO(received << " received inputs, " << gradients << " received gradients");
  CHECK(received >= 2);   // one per micro-batch (two steps may merge timeline points)
  CHECK(gradients >= 2);
}

TEST_CASE("Pipeline: data parallel and tensor parallel shard the stage's parameters", "[pipeline]") {
  Setup s = Llama7bPipeline(4);
  s.parallel.pipelineStage = 0;
  s.parallel.dataParallel = 8;
  s.parallel.zeroStage = 1;
  const Setup st = PipelineStageSetup(s);
  const std::int64_t stageParams = PipelineStageInventory(BuildInventory(st), st).ParameterCount();
  const Estimate e = MustEstimate(s);
  const std::int64_t padded = (stageParams + 15) / 16 * 16;  // a multiple of 2 × dp
  CHECK(e.modelStates.masterWeightsBytes == padded / 8 * 4);
  CHECK(e.modelStates.parameterCount == stageParams);
  Setup t = Llama7bPipeline(2);
  t.parallel.pipelineStage = 1;
  t.parallel.tensorParallel = 4;
  const Setup tst = PipelineStageSetup(TensorParallelRankSetup(t));
  const Estimate te = MustEstimate(t);
  CHECK(te.modelStates.parameterCount == PipelineStageInventory(BuildInventory(tst), tst).ParameterCount());
  CHECK(te.modelStates.parameterCount < stageParams * 2 / 4 + 200'000'000);
  // Checkpointing every block lowers the stage's peak.
  Setup c = WithStage(Gpt2Pipeline(4, 4), 0);
  const std::int64_t plain = ForwardPeak(MustEstimate(c));
  c.training.checkpointing = Checkpointing::EveryBlock;
  CHECK(ForwardPeak(MustEstimate(c)) < plain);
}

TEST_CASE("Pipeline: what cannot be split or is not simulated is refused by name", "[pipeline]") {
  Setup quick = DefaultSetup();
  quick.parallel.pipelineParallel = 2;
  CHECK(HasErrorOn(Validate(quick), "parallel.pipelineParallel"));
  CHECK(HasErrorOn(Validate(Gpt2Pipeline(13, 1)), "parallel.pipelineParallel"));  // 12 layers over 13
  // 12 layers over 5 split as torchtitan splits them (tests/pipeline_compose_test.cpp).
  CHECK(Validate(Gpt2Pipeline(5, 1)).empty());
  Setup inter = Gpt2Pipeline(4, 4, PipelineSchedule::Interleaved);
  inter.parallel.virtualStages = 4;  // 12 layers over 4 × 4 chunks: more chunks than layers
  CHECK(HasErrorOn(Validate(inter), "parallel.pipelineParallel"));
  inter.parallel.virtualStages = 2;  // 12 over 8: torchtitan's split (pipeline_compose_test.cpp)
  CHECK(Validate(inter).empty());
  Setup interM = Gpt2Pipeline(2, 3, PipelineSchedule::Interleaved);
  interM.parallel.virtualStages = 2;
  CHECK(HasErrorOn(Validate(interM), "parallel.gradientAccumulationSteps"));
  Setup zero2 = Gpt2Pipeline(2, 2);
  zero2.parallel.dataParallel = 2;
  zero2.parallel.zeroStage = 2;
  CHECK(HasErrorOn(Validate(zero2), "parallel.zeroStage"));
  Setup fsdp = Gpt2Pipeline(2, 2);
  fsdp.parallel.dataParallel = 2;
  fsdp.parallel.fsdp = FsdpMode::FullShard;
  CHECK(HasErrorOn(Validate(fsdp), "parallel.fsdp"));
  CHECK(HasErrorOn(Validate(WithStage(Gpt2Pipeline(2, 1), 2)), "parallel.pipelineStage"));
  CHECK(HasErrorOn(Validate(WithStage(Gpt2Pipeline(2, 1), -2)), "parallel.pipelineStage"));
  Setup bert = Gpt2Pipeline(2, 1);
  bert.model.architecture = FindPreset("bert-base-uncased")->architecture;
  CHECK(HasErrorOn(Validate(bert), "parallel.pipelineParallel"));
  CHECK(Validate(Gpt2Pipeline(4, 8)).empty());
}

TEST_CASE("Pipeline: the simulated stage reads and writes as JSON", "[pipeline]") {
  Setup s = WithStage(Gpt2Pipeline(4, 8), 2);
  const std::string text = SetupToJson(s);
  CHECK(text.find("\"pipelineStage\":2") != std::string::npos);
  const SetupParseResult back = ParseSetupJson(text);
  REQUIRE(back.ok());
  CHECK(back.setup.parallel.pipelineStage == 2);
  CHECK(DefaultSetup().parallel.pipelineStage == -1);
}

TEST_CASE("Pipeline: past the work budget, the micro-batch refusal says what the schedule keeps", "[pipeline][budget]") {
  // Every micro-batch is simulated; 10^6 of them pass the budget. Under 1F1B the first stage
  // peaks once m reaches p (min(p − r, m) in flight); under GPipe it holds all m.
  for (const PipelineSchedule schedule : {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe}) {
    const std::vector<FieldError> errors = Validate(Gpt2Pipeline(2, 1000000, schedule));
    REQUIRE(HasErrorOn(errors, "parallel.gradientAccumulationSteps"));
    const std::string& message = errors.front().message;
    INFO(message);
    if (schedule == PipelineSchedule::GPipe) {
      CHECK(message.find("under GPipe every micro-batch's activations are held at once") != std::string::npos);
    } else {
      CHECK(message.find("once the micro-batches reach the pipeline size (2)") != std::string::npos);
    }
    CHECK(message.find("fewer micro-batches show the same peak") == std::string::npos);
  }
}
