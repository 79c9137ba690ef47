// Megatron-LM's vocab-parallel cross-entropy (training.lossImplementation megatronVocabParallel,
// core/src/sim/blocks/loss.cpp MegatronVocabParallelCrossEntropy), byte by byte: what its
// forward allocates on the rank's [b, s, V/t] logits, what it holds through backward, and that
// no other loss changes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup TinyDecoder(Family family, std::int64_t batch, std::int64_t sequence, Precision precision) {
  Setup s = TinyTransformer(family, 2, precision);
  s.model.architecture.maxPositionEmbeddings = 128;
  s.model.architecture.tieWordEmbeddings = family == Family::GPT2;
  s.training.batchSize = batch;
  s.training.sequenceLength = sequence;
  return s;
}

Estimate Labelled(const Setup& s) {
  EstimateOptions labelled;
  labelled.timeline = EstimateOptions::Timeline::Labelled;
  EstimateResult r = EstimateMemory(s, labelled);
  if (!r.ok()) {
    std::string all;
    for (const auto& e : r.errors) all += e.field + ": " + e.message + "\n";
    FAIL("setup unexpectedly invalid:\n" << all);
  }
  return r.estimate;
}

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The loss region of one step and phase: the highest total of its events ("loss: …") above the
// total just before its first event.
struct Region {
  std::int64_t before = -1;
  std::int64_t rise = 0;
};
Region LossRegion(const Estimate& e, int step, Phase phase) {
  Region r;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step != step || p.phase != phase || !StartsWith(p.label, "loss")) continue;
    if (r.before < 0) r.before = p.totalBytes - p.deltaBytes;
    r.rise = std::max(r.rise, p.totalBytes - r.before);
  }
  return r;
}

std::int64_t FirstEventBytes(const Estimate& e, const std::string& text) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.label.find(text) != std::string::npos) return p.deltaBytes;
  }
  return 0;
}

// The loss's node in backward: its gradient of the logits and the saved tensors it frees.
struct LossBackward {
  std::int64_t gradient = 0;
  std::int64_t savedFreed = 0;
};
LossBackward MegatronNode(const Estimate& e, int step) {
  LossBackward r;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step != step || p.phase != Phase::Backward) continue;
    if (!StartsWith(p.label, "loss vocab_parallel_cross_entropy (Megatron) backward: ")) continue;
    if (p.label.find("gradient of") != std::string::npos) r.gradient += p.deltaBytes;
    if (p.label.find("saved tensor freed") != std::string::npos) r.savedFreed -= p.deltaBytes;
  }
  return r;
}

// Forward of _VocabParallelCrossEntropy and the loss around it, N = b·s tokens, Vt = the rank's
// vocabulary (loss.cpp): labels [s, b] int64 8N; the fp32 copy 4N·Vt; logits_max 4N; the max
// indices 8N (gone at once) — then the mask's two bool temporaries and the mask (3N, 2N gone);
// target.clone() and masked_target (16N, 8N gone); arange_1d 8N, the gathered logits 4N and their
// clone 4N (4N gone); sum_exp_logits 4N (arange gone); log 4N and the loss 4N. The highest point
// is 4N·Vt + 37N above the total before the loss.
std::int64_t ForwardRise(std::int64_t n, std::int64_t vt) { return 4 * n * vt + 37 * n; }

}  // namespace

TEST_CASE("Megatron's loss on bf16 logits: one fp32 copy saved and a bf16 gradient (t = 1)", "[megatron-loss]") {
  const std::int64_t n = 2 * 16, v = 1000;  // b·s tokens; GPT-2, V = 1000 at t = 1
  Setup standard = TinyDecoder(Family::GPT2, 2, 16, Precision::BF16Mixed);
  Setup megatron = standard;
  megatron.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  const Estimate e = Labelled(megatron), hf = Labelled(standard);
  for (int step : {1, 2}) {  // both simulated steps
    CHECK(LossRegion(e, step, Phase::Forward).rise == ForwardRise(n, v));
    // Backward: the bf16 gradient (2N·V) is made while the fp32 softmax is still held (the engine's
    // cast in validate_outputs, before release_variables); then the softmax (4N·V), target_mask
    // (N) and masked_target_1d (8N) go.
    const LossBackward node = MegatronNode(e, step);
    CHECK(node.gradient == 2 * n * v);
    CHECK(node.savedFreed == 4 * n * v + 9 * n);
    CHECK(LossRegion(e, step, Phase::Backward).rise == 2 * n * v);
  }
  CHECK(FirstEventBytes(e, "vocab_parallel_logits.float()") == 4 * n * v);
  // Hugging Face's loss on the same logits: the fp32 upcast and the saved log_softmax (8N·V) in
  // forward, and in backward the log_softmax and cast gradients beside the saved output.
  CHECK(LossRegion(hf, 2, Phase::Forward).rise >= 8 * n * v);
  CHECK(LossRegion(hf, 2, Phase::Backward).rise >= 4 * n * v);
  // Everything before the loss is the same but the eager softmax: Megatron's keeps fp32
  // probabilities, Hugging Face's GPT-2 its 16-bit ones (2 B less per score, every layer, the
  // scores [b, heads, s, s]); the model states are the same.
  const ArchitectureDef& a = standard.model.architecture;
  const std::int64_t scores = standard.training.batchSize * a.numHeads * standard.training.sequenceLength *
                              standard.training.sequenceLength;
  CHECK(LossRegion(e, 2, Phase::Forward).before - LossRegion(hf, 2, Phase::Forward).before == 2 * scores * a.numLayers);
  CHECK(e.modelStates.totalBytes == hf.modelStates.totalBytes);
  CHECK(LossRegion(e, 2, Phase::Forward).rise < LossRegion(hf, 2, Phase::Forward).rise);
  CHECK(std::any_of(e.notes.begin(), e.notes.end(),
                    [](const std::string& note) { return note.find("vocab_parallel_cross_entropy") != std::string::npos; }));
}

TEST_CASE("Megatron's loss on a tensor-parallel rank works on its V over t slice (t = 2)", "[megatron-loss]") {
  // Llama, tensor parallel 2: the rank's vocabulary is ceil(1000 / (128·2))·128 = 512
  // (_vocab_size_with_padding, parallel/sharding.cpp); the loss's tensors are the slice's.
  const std::int64_t n = 2 * 16, vt = 512;
  Setup s = TinyDecoder(Family::Llama, 2, 16, Precision::BF16Mixed);
  s.parallel.tensorParallel = 2;
  s.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  const Estimate e = Labelled(s);
  CHECK(FirstEventBytes(e, "vocab_parallel_logits.float()") == 4 * n * vt);
  CHECK(LossRegion(e, 2, Phase::Forward).rise == ForwardRise(n, vt));
  const LossBackward node = MegatronNode(e, 2);
  CHECK(node.gradient == 2 * n * vt);
  CHECK(node.savedFreed == 4 * n * vt + 9 * n);
  // Sequence parallel: the output layer all-gathers its input (s/t tokens a rank → s), so the
  // logits and the loss cover every token of the rank's vocabulary slice, as without it.
  Setup sp = s;
  sp.parallel.sequenceParallel = true;
  const Estimate gathered = Labelled(sp);
  CHECK(FirstEventBytes(gathered, "vocab_parallel_logits.float()") == 4 * n * vt);
  CHECK(LossRegion(gathered, 2, Phase::Forward).rise == ForwardRise(n, vt));
  CHECK(MegatronNode(gathered, 2).gradient == 2 * n * vt);
  // t = 1 on the same model: the whole (unpadded) vocabulary.
  s.parallel.tensorParallel = 1;
  const Estimate whole = Labelled(s);
  CHECK(FirstEventBytes(whole, "vocab_parallel_logits.float()") == 4 * n * 1000);
  CHECK(MegatronNode(whole, 2).gradient == 2 * n * 1000);
}

TEST_CASE("Megatron's loss on fp32 logits works in their own storage", "[megatron-loss]") {
  // .float() of fp32 logits is the logits themselves: -=, exp and div_ run in place on them, they
  // are saved, and backward hands them back as their own gradient. Only backward's temporaries
  // appear: arange_1d (8N), softmax_update and the gathered entries (8N).
  const std::int64_t n = 2 * 16;
  Setup s = TinyDecoder(Family::GPT2, 2, 16, Precision::FP32);
  s.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  const Estimate e = Labelled(s);
  CHECK(FirstEventBytes(e, "vocab_parallel_logits.float()") == 0);
  CHECK(LossRegion(e, 2, Phase::Forward).rise == 37 * n);
  const LossBackward node = MegatronNode(e, 2);
  CHECK(node.gradient == 0);
  CHECK(LossRegion(e, 2, Phase::Backward).rise == 16 * n);
}

TEST_CASE("Megatron's loss is validated and round-trips", "[megatron-loss]") {
  Setup bert = DefaultSetup();
  bert.model.kind = ModelKind::Transformer;
  bert.model.architecture = DefaultArchitecture(Family::BERT);
  bert.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  CHECK(HasErrorOn(Validate(bert), "training.lossImplementation"));
  for (Precision p : {Precision::AmpBF16, Precision::AmpFP16}) {
    Setup amp = TinyDecoder(Family::Llama, 1, 16, p);
    amp.training.lossImplementation = LossImplementation::MegatronVocabParallel;
    CHECK(HasErrorOn(Validate(amp), "training.lossImplementation"));
  }
  Setup ok = TinyDecoder(Family::Llama, 1, 16, Precision::BF16Mixed);
  ok.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  CHECK(Validate(ok).empty());
  const std::string json = SetupToJson(ok);
  CHECK(json.find("\"megatronVocabParallel\"") != std::string::npos);
  CHECK(ParseSetupJson(json).setup.training.lossImplementation == LossImplementation::MegatronVocabParallel);
  CHECK(OptionsJson().find("\"megatronVocabParallel\"") != std::string::npos);
  // The default stays Hugging Face's loss.
  CHECK(DefaultSetup().training.lossImplementation == LossImplementation::Standard);
}

TEST_CASE("the Megatron import sets Megatron's loss", "[megatron-loss]") {
  const Setup base = TinyDecoder(Family::GPT2, 4, 64, Precision::FP32);
  const ParallelImport r = ImportMegatronArguments("--bf16 --micro-batch-size 4", base);
  REQUIRE(r.errors.empty());
  CHECK(r.setup.training.lossImplementation == LossImplementation::MegatronVocabParallel);
  CHECK(Validate(r.setup).empty());
  auto noted = [](const ParallelImport& i, const char* text) {
    return std::any_of(i.notes.begin(), i.notes.end(), [&](const std::string& n) { return n.find(text) != std::string::npos; });
  };
  CHECK(noted(ImportMegatronArguments("--cross-entropy-loss-fusion", base), "native"));
  CHECK(noted(ImportMegatronArguments("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", base),
              "not simulated"));
  CHECK(r.ignoredFields.empty());
  // A BERT base keeps its own loss (Megatron's is simulated for decoders): no refusal of the loss.
  Setup bert = DefaultSetup();
  bert.model.kind = ModelKind::Transformer;
  bert.model.architecture = DefaultArchitecture(Family::BERT);
  const ParallelImport fromBert = ImportMegatronArguments("--bf16", bert);
  CHECK(fromBert.setup.training.lossImplementation == LossImplementation::Standard);
  CHECK_FALSE(HasErrorOn(Validate(fromBert.setup), "training.lossImplementation"));
}

TEST_CASE("make it fit offers no other framework's loss to a Megatron run", "[megatron-loss][solve]") {
  // The setup where make it fit offers Liger's fused loss (savers_test.cpp), with Megatron's loss:
  // Liger's kernel is not something a Megatron run switches on, so neither loss change is offered.
  Setup s = LogitsPeakSetup();
  REQUIRE(Suggestion(Solve(s), "loss-fused") != nullptr);
  s.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  const SolveResult r = Solve(s);
  REQUIRE(r.ok());
  CHECK(Suggestion(r, "loss-fused") == nullptr);
  CHECK(Suggestion(r, "loss-chunked") == nullptr);
}
