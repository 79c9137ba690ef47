// Many GPUs: expert parallelism composed with tensor (and sequence) parallelism, expert tensor
// parallelism, and shared experts, as Megatron runs them (docs/parallel.md, "Expert
// parallelism"). Every figure is worked out by hand from the small models below.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// A small Mixtral: vocabulary 1,000, h 256, 2 layers, 8 heads of 32 (4 key/value heads),
// 4 experts of width 512, top-2; bf16 with fp32 masters, SDPA, 1 × 64 tokens.
constexpr std::int64_t kV = 1000, kH = 256, kLayers = 2, kHeads = 8, kKv = 4, kD = 32, kWidth = 512, kE = 4, kK = 2;
constexpr std::int64_t kSeq = 64;

Setup SmallMixtral() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  ArchitectureDef a = FindPreset("mixtral-8x7b")->architecture;
  a.vocabSize = kV;
  a.hiddenSize = kH;
  a.numLayers = kLayers;
  a.numHeads = kHeads;
  a.numKeyValueHeads = kKv;
  a.intermediateSize = kWidth;
  a.expertIntermediateSize = kWidth;
  a.numExperts = kE;
  a.expertsPerToken = kK;
  s.model.architecture = a;
  s.training.precision = Precision::BF16Mixed;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.batchSize = 1;
  s.training.sequenceLength = kSeq;
  return s;
}

// E 4 over e 2, tensor parallel 2 with sequence parallelism, dp 2 (etp × e = 4 divides
// dp × cp × t = 4): Megatron's Mixtral layout.
Setup EpTimesTp(std::int64_t etp) {
  Setup s = SmallMixtral();
  s.parallel.dataParallel = 2;
  s.parallel.tensorParallel = 2;
  s.parallel.sequenceParallel = true;
  s.parallel.expertParallel = 2;
  s.parallel.expertTensorParallel = etp;
  return s;
}

// Qwen2-MoE's shape on the small model: a shared expert of width 512 and its sigmoid gate.
Setup WithSharedExpert(Setup s) {
  s.model.architecture.sharedExpertIntermediateSize = kWidth;
  s.model.architecture.sharedExpertGate = true;
  return s;
}

std::int64_t EventBytes(const Estimate& e, Phase phase, const std::string& label) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.phase == phase && p.deltaBytes > 0 && p.label.find(label) != std::string::npos) return p.deltaBytes;
  }
  return -1;
}

std::int64_t Padded(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// The rank's parameters by hand: t-way attention and vocabulary, E/e experts each 1/etp wide,
// the router whole; `shared` adds a shared expert (width / t) and its [1, h] gate.
std::int64_t RankParameters(std::int64_t t, std::int64_t e, std::int64_t etp, bool shared) {
  // _vocab_size_with_padding under tensor parallelism: ⌈V / 128t⌉ · 128t (one GPU: V as it is).
  const std::int64_t vocab = t > 1 ? Padded(kV, 128 * t) : kV;
  const std::int64_t embedding = vocab / t * kH, head = vocab / t * kH;
  const std::int64_t attention = (kHeads / t) * kD * kH * 2 + (kKv / t) * kD * kH * 2;  // q, o; k, v
  const std::int64_t norms = 2 * kH, router = kE * kH;
  const std::int64_t experts = (kE / e) * 3 * (kWidth / etp) * kH;
  const std::int64_t sharedExpert = shared ? 3 * (kWidth / t) * kH + kH : 0;
  return embedding + kLayers * (norms + attention + router + experts + sharedExpert) + kH + head;
}

}  // namespace

TEST_CASE("Expert compose: Megatron resolves the expert tensor parallel size to the tensor parallel size", "[parallel][expert][compose]") {
  // megatron/training/arguments.py: expert_tensor_parallel_size = tensor_model_parallel_size when unset.
  ParallelDef p;
  CHECK(p.expertTensorParallel == 0);
  CHECK(ExpertTensorParallelOf(p) == 1);
  p.tensorParallel = 4;
  CHECK(ExpertTensorParallelOf(p) == 4);
  p.expertTensorParallel = 1;
  CHECK(ExpertTensorParallelOf(p) == 1);
  // Expert data parallel = dp · cp · t / (etp · e) (parallel_state.initialize_model_parallel).
  p.dataParallel = 8;
  p.contextParallel = 2;
  p.expertParallel = 8;
  CHECK(ExpertDataParallelOf(p) == 8 * 2 * 4 / (1 * 8));
  p.expertTensorParallel = 0;
  CHECK(ExpertDataParallelOf(p) == 8 * 2 * 4 / (4 * 8));
}

TEST_CASE("Expert compose: parameters per rank under expert x tensor parallel", "[parallel][expert][compose]") {
  // E 4, e 2, t 2: 512 vocabulary rows a rank (1,000 padded to 1,024), half the heads, two
  // experts each 256 wide (etp = t) or 512 (etp = 1).
  CHECK(RankParameters(2, 2, 2, false) == 1'248'512);
  CHECK(MustEstimate(EpTimesTp(0)).modelStates.parameterCount == 1'248'512);
  CHECK(MustEstimate(EpTimesTp(2)).modelStates.parameterCount == 1'248'512);
  CHECK(MustEstimate(EpTimesTp(1)).modelStates.parameterCount == RankParameters(2, 2, 1, false));
  CHECK(RankParameters(2, 2, 1, false) - RankParameters(2, 2, 2, false) == kLayers * 2 * 3 * 256 * kH);
  const Estimate e = MustEstimate(EpTimesTp(0));
  CHECK(e.rank.why.find("expert-tensor-parallel rank 0 holds 1/2") != std::string::npos);
}

TEST_CASE("Expert compose: the dispatcher's tensors with expert tensor parallel", "[parallel][expert][compose]") {
  // Sequence parallelism: the rank routes its s/t = 32 tokens, T·k = 64 copies of h.
  const std::int64_t tokens = kSeq / 2, copies = tokens * kK, rows = copies * 2;  // × etp after the all-gather
  const Estimate e = MustEstimateLabelled(EpTimesTp(0));
  CHECK(EventBytes(e, Phase::Forward, "dispatch: permute") == copies * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: all-to-all") == copies * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: all-gather (expert tensor parallel)") == rows * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: sort_chunks_by_idxs") == rows * kH * 2);
  // Each of the 2 local experts gets rows / 2 = 64 rows; its w1 is 512 / etp = 256 wide.
  CHECK(EventBytes(e, Phase::Forward, "local expert 0 tokens (split)") == (rows / 2) * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "local expert 0 w1") == (rows / 2) * 256 * 2);
  CHECK(EventBytes(e, Phase::Forward, "combine: reduce-scatter (expert tensor parallel)") == copies * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "combine: all-to-all") == copies * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "combine: unpermute") == tokens * kH * 2);
  // Backward: the all-gather's gradient is reduce-scattered (T·k rows), the reduce-scatter's
  // gradient all-gathered (T·k·etp rows).
  CHECK(EventBytes(e, Phase::Backward, "combine: reduce-scatter (expert tensor parallel) backward") == rows * kH * 2);
  CHECK(EventBytes(e, Phase::Backward, "dispatch: all-gather (expert tensor parallel) backward") == copies * kH * 2);
  // With etp = 1 nothing is gathered over the expert tensor group.
  const Estimate one = MustEstimateLabelled(EpTimesTp(1));
  CHECK(EventBytes(one, Phase::Forward, "dispatch: all-gather (expert tensor parallel)") == -1);
  CHECK(EventBytes(one, Phase::Forward, "local expert 0 w1") == (copies / 2) * kWidth * 2);
}

TEST_CASE("Expert compose: what a block saves with expert tensor parallel", "[parallel][expert][compose]") {
  // The experts' saved activations: per local expert its n input rows (h wide, saved by w1 and
  // w3) and four width-wide tensors (w1's output, act, w3's output, act·up). etp = 2 gives each
  // expert twice the rows at half the width: the four wide tensors are the same bytes, the input
  // rows twice as many, T·k·(etp − 1)·h·2 bytes more. Nothing else differs.
  const std::int64_t copies = (kSeq / 2) * kK;
  CHECK(SavedPerBlock(EpTimesTp(2)) - SavedPerBlock(EpTimesTp(1)) == copies * (2 - 1) * kH * 2);
  // Sequence parallelism alone (e = 1) runs the same dispatcher without all-to-all.
  Setup sp = SmallMixtral();
  sp.parallel.tensorParallel = 2;
  sp.parallel.sequenceParallel = true;
  const Estimate e = MustEstimateLabelled(sp);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: all-to-all") == -1);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: all-gather (expert tensor parallel)") == copies * 2 * kH * 2);
  CHECK(e.modelStates.parameterCount == RankParameters(2, 1, 2, false));
  bool noted = false;
  for (const std::string& n : e.notes) noted |= n.find("Sequence parallel with experts") != std::string::npos &&
                                                 n.find("over 2 expert-tensor-parallel ranks") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("Expert compose: expert states are sharded over dp x cp x t / (etp x e)", "[parallel][expert][compose]") {
  for (std::int64_t etp : {2, 1}) {
    Setup s = EpTimesTp(etp);
    s.parallel.dataParallel = 4;
    s.parallel.zeroStage = 1;
    const Estimate est = MustEstimate(s);
    const std::int64_t experts = kLayers * 2 * 3 * (kWidth / etp) * kH;
    const std::int64_t dense = RankParameters(2, 2, etp, false) - experts;
    const std::int64_t expertDp = 4 * 2 / (etp * 2);  // 2 with etp = 2, 4 with etp = 1
    const std::int64_t partition = Padded(dense, 2 * 4) / 4 + Padded(experts, 2 * expertDp) / expertDp;
    INFO("etp " << etp);
    CHECK(est.modelStates.masterWeightsBytes == partition * 4);
    CHECK(est.modelStates.optimizerStatesBytes == partition * 8);
  }
}

TEST_CASE("Expert compose: refused where Megatron refuses or the grid does not divide", "[parallel][expert][compose]") {
  // Megatron's MoELayer.forward raises in training with tensor parallelism and no sequence parallelism.
  Setup noSp = EpTimesTp(0);
  noSp.parallel.sequenceParallel = false;
  CHECK(HasErrorOn(Validate(noSp), "parallel.sequenceParallel"));
  // etp × e must divide dp × cp × t: 4 × 2 = 8 does not divide 2 × 2 = 4.
  Setup grid = EpTimesTp(4);
  CHECK(HasErrorOn(Validate(grid), "parallel.expertParallel"));
  // etp must divide each expert's width (512 / 3).
  Setup width = EpTimesTp(3);
  width.parallel.dataParallel = 6;
  CHECK(HasErrorOn(Validate(width), "parallel.expertTensorParallel"));
  // Out of range, and on a model with no experts.
  Setup negative = EpTimesTp(-1);
  CHECK(HasErrorOn(Validate(negative), "parallel.expertTensorParallel"));
  Setup huge = EpTimesTp(5000);
  CHECK(HasErrorOn(Validate(huge), "parallel.expertTensorParallel"));
  Setup dense = DefaultSetup();
  dense.parallel.tensorParallel = 2;
  dense.parallel.expertTensorParallel = 2;
  CHECK(HasErrorOn(Validate(dense), "parallel.expertTensorParallel"));
  // An expert tensor parallel size other than t needs the dispatcher (expert or sequence parallel).
  Setup hf = SmallMixtral();
  hf.parallel.tensorParallel = 2;
  hf.parallel.expertTensorParallel = 1;
  CHECK(HasErrorOn(Validate(hf), "parallel.expertTensorParallel"));
  hf.parallel.sequenceParallel = true;
  CHECK(Validate(hf).empty());
  CHECK(Validate(EpTimesTp(0)).empty());
  CHECK(Validate(EpTimesTp(1)).empty());
}

TEST_CASE("Expert compose: the expert tensor parallel size in JSON and the panel", "[parallel][expert][compose]") {
  CHECK(SetupToJson(DefaultSetup()).find(R"("expertTensorParallel":0)") != std::string::npos);
  const SetupParseResult parsed = ParseSetupJson(R"({"parallel": {"expertTensorParallel": 2}})");
  REQUIRE(parsed.errors.empty());
  CHECK(parsed.setup.parallel.expertTensorParallel == 2);
  CHECK(HasErrorOn(ParseSetupJson(R"({"parallel": {"expertTensorParallel": "two"}})").errors,
                   "parallel.expertTensorParallel"));
  CHECK(OptionsJson().find(R"("expertTensorParallel")") != std::string::npos);
}

TEST_CASE("Expert compose: a shared expert is a dense MLP on every expert-parallel rank", "[parallel][expert][compose]") {
  // Qwen2-MoE's shared_expert and shared_expert_gate; Megatron's SharedExpertMLP is an MLP over
  // the (attention) tensor parallel group: width / t a rank, its [1, h] gate whole.
  const Setup s = WithSharedExpert(EpTimesTp(0));
  CHECK(Validate(s).empty());
  CHECK(RankParameters(2, 2, 2, true) - RankParameters(2, 2, 2, false) == kLayers * (3 * 256 * kH + kH));
  CHECK(MustEstimate(s).modelStates.parameterCount == RankParameters(2, 2, 2, true));
  // Expert parallelism alone: the whole shared expert on every rank, E/e routed experts.
  Setup ep = WithSharedExpert(SmallMixtral());
  ep.parallel.dataParallel = 2;
  ep.parallel.expertParallel = 2;
  CHECK(MustEstimate(ep).modelStates.parameterCount == RankParameters(1, 2, 1, true));
  // Under sequence parallelism it is computed first (MoELayer.forward: shared_experts_compute
  // before route) on the rank's s/t = 32 tokens: gate_proj all-gathers them (64 × 256-wide
  // output), down_proj reduce-scatters back to 32 tokens; the gate multiplies the sharded
  // tokens; the sum with the routed output is [32, h].
  const Estimate e = MustEstimateLabelled(s);
  CHECK(EventBytes(e, Phase::Forward, "shared expert gate_proj") == kSeq * 256 * 2);
  CHECK(EventBytes(e, Phase::Forward, "down_proj reduce-scatter (s/t)") == (kSeq / 2) * kH * 2);
  CHECK(EventBytes(e, Phase::Forward, "shared_expert_gate") == (kSeq / 2) * 1 * 2);
  CHECK(EventBytes(e, Phase::Forward, "routed + shared") == (kSeq / 2) * kH * 2);
  std::size_t sharedAt = 0, routerAt = 0;
  for (std::size_t i = 0; i < e.timeline.size(); ++i) {
    if (sharedAt == 0 && e.timeline[i].label.find("shared expert gate_proj") != std::string::npos) sharedAt = i;
    if (routerAt == 0 && e.timeline[i].label.find("router logits") != std::string::npos) routerAt = i;
  }
  CHECK(sharedAt > 0);
  CHECK(sharedAt < routerAt);
  // What a block saves grows by the shared expert's: its sharded input is already saved by the
  // router; gate_proj / up_proj save nothing new (the s/t input), then four width/t tensors of
  // the gathered s tokens (gate_proj's output, act, up_proj's output, act·up), the gate's
  // sigmoid output [s/t, 1] and the gated product's two inputs: the shared output [s/t, h] and
  // the sigmoid (already counted).
  const std::int64_t tokens = kSeq / 2, wide = kSeq * (kWidth / 2);
  CHECK(SavedPerBlock(s) - SavedPerBlock(EpTimesTp(0)) == (4 * wide + tokens * 1 + tokens * kH) * 2);
}

TEST_CASE("Expert compose: FSDP2 and ZeRO-3 with expert parallelism stay refused by name", "[parallel][expert][compose]") {
  Setup fsdp2 = SmallMixtral();
  fsdp2.parallel.dataParallel = 4;
  fsdp2.parallel.expertParallel = 2;
  fsdp2.parallel.fsdp = FsdpMode::FullyShard;
  const std::vector<FieldError> errors = Validate(fsdp2);
  REQUIRE(HasErrorOn(errors, "parallel.expertParallel"));
  bool namesTorchtitanMesh = false;
  for (const FieldError& e : errors) namesTorchtitanMesh |= e.message.find("efsdp") != std::string::npos;
  CHECK(namesTorchtitanMesh);
  // ZeRO-3: DeepSpeed's own assertion (engine.py _configure_zero_optimizer) is quoted.
  Setup zero3 = fsdp2;
  zero3.parallel.fsdp = FsdpMode::Off;
  zero3.parallel.zeroStage = 3;
  const std::vector<FieldError> zeroErrors = Validate(zero3);
  REQUIRE(HasErrorOn(zeroErrors, "parallel.expertParallel"));
  bool quotesDeepSpeed = false;
  for (const FieldError& e : zeroErrors) quotesDeepSpeed |= e.message.find("MoE not supported with Stage 3") != std::string::npos;
  CHECK(quotesDeepSpeed);
  // FSDP1 modes: refused on the same field.
  for (FsdpMode mode : {FsdpMode::FullShard, FsdpMode::ShardGradOp, FsdpMode::HybridShard}) {
    Setup fsdp1 = fsdp2;
    fsdp1.parallel.fsdp = mode;
    CHECK(HasErrorOn(Validate(fsdp1), "parallel.expertParallel"));
  }
  // Without expert parallelism FSDP2 shards a mixture of experts like any model.
  fsdp2.parallel.expertParallel = 1;
  CHECK(Validate(fsdp2).empty());
}

TEST_CASE("Expert compose: a pasted Megatron command line with expert tensor parallel", "[parallel][expert][compose]") {
  const ParallelImport imported = ImportMegatronArguments(
      "--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 "
      "--expert-tensor-parallel-size 1 --use-distributed-optimizer --micro-batch-size 1 --seq-length 64 --bf16",
      SmallMixtral());
  REQUIRE(imported.ok());
  Setup s = imported.setup;
  CHECK(s.parallel.expertTensorParallel == 1);
  s.parallel.dataParallel = 2;
  CHECK(MustEstimate(s).modelStates.parameterCount == RankParameters(2, 2, 1, false));
}

TEST_CASE("Expert compose: checkpointing and context parallel with expert x tensor parallel estimate", "[parallel][expert][compose]") {
  for (Checkpointing mode : {Checkpointing::None, Checkpointing::Selective, Checkpointing::EveryBlock}) {
    Setup s = WithSharedExpert(EpTimesTp(0));
    s.training.checkpointing = mode;
    s.parallel.contextParallel = 2;
    s.parallel.zeroStage = 2;
    s.parallel.gradientAccumulationSteps = 2;
    INFO("checkpointing " << static_cast<int>(mode));
    CHECK(MustEstimate(s).peak.totalBytes > 0);
  }
  // A checkpointed block keeps its input only: the rank's s/t tokens of h.
  Setup every = EpTimesTp(0);
  every.training.checkpointing = Checkpointing::EveryBlock;
  CHECK(SavedPerBlock(every) == (kSeq / 2) * kH * 2);
}
