// Properties every estimate must have, checked over a sampled matrix of presets and layer lists
// (not single hand-picked figures):
//   - the peak never decreases when the batch or the sequence grows;
//   - checkpointing (every block, every k-th block, selective) and SDPA never raise the peak
//     over no checkpointing / eager attention;
//   - the categories at the peak sum to the peak's total, and the same at each phase's peak and
//     at the end of forward;
//   - an estimate is deterministic: the same setup twice gives byte-identical JSON.
//
// The matrix stays small (about 250 distinct estimates, each computed once and cached) so that
// the suite also runs under the sanitizers. Where the simulation breaks a property, the
// violation is listed by name with its figures in kKnownViolations below: a violation missing
// from that table fails the test, and so does an entry that no longer violates (or whose figures
// moved), so that a fix removes its line and the list always says what is true today.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// A property the simulation breaks today: `name` says which setup and which comparison (as
// Describe() and the sweeps below write them), `peakBytes` is the peak of the setup with the
// option, `baselineBytes` the peak of the same setup without it (or at the smaller size).
struct KnownViolation {
  const char* name;
  std::int64_t peakBytes;
  std::int64_t baselineBytes;
};

// Known violations: checkpointing RAISES the peak. (Reported as an issue: Llama-2-7B, ampBf16,
// fused AdamW, SDPA, batch 2 × 1024, selective; Mixtral everyBlock at layer 0's backward.)
// Found by this sweep; each line is removed by the fix that makes the property hold.
// PyTorch does the same: both classes are measured in scripts/validate.py's CHECKPOINT_CASES
// (docs/validation.md, "Checkpointing can raise the peak"), where the measured difference of the
// peaks equals the predicted one but for the 5,056-byte CPU RNG state each reentrant checkpoint
// call stashes. So these are faithful, not simulation bugs: the lines stay, and the option labels
// (core/src/model/names.cpp) warn where the option is offered.
const std::vector<KnownViolation> kKnownViolations = {
    // clang-format off
    // The case: selective checkpointing with SDPA under autocast, +1,065,353,216 B
    // (110.92 GB vs 109.85 GB); the peak is at the loss's backward in both. Confirmed in PyTorch
    // by validation case llama-ampbf16-sdpa-selective vs llama-ampbf16-sdpa (+4,063,232 B
    // predicted and held after forward byte-exact; peak +4,083,456 B measured = + 4 RNG states).
    {"llama-2-7b ampBf16 adamw/fused sdpa b2 s1024: selective vs none", 110919000068, 109853646852},
    // Phi-3 also loses transformers' KV cache under any checkpointing (as GPT-2: use_cache is off with
    // gradient checkpointing), and with it the copies that let the fused qkv go: SDPA's saved value
    // view then holds all of qkv_proj's output (Phi-3's fused projections, families/llama.cpp).
    {"phi-3-mini-4k ampBf16 adamw/fused sdpa b2 s1024: selective vs none", 65692725252, 64090501124},  // +1,602,224,128 B
    {"phi-3-mini-4k fp32 adamw/fused sdpa b2 s1024: selective vs none", 64971436036, 63369211908},  // +1,602,224,128 B
    // The same class since SDPA takes grouped kv heads as they are (enable_gqa, no repeat_kv
    // copies saved without checkpointing): Qwen2.5's 2 kv heads of 14 no longer outweigh the
    // fp32 q and k the checkpoint keeps under autocast.
    {"qwen2.5-0.5b ampBf16 adamw/fused sdpa b1 s512: selective vs none", 8694682116, 8670204420},     // +24,477,696 B
    {"qwen2.5-0.5b ampBf16 adamw/fused sdpa b2 s1024: selective vs none", 14029257220, 13931346436},  // +97,910,784 B
    // Mixtral: every checkpointing mode +75.5 to +92.3 MB at layer 0's backward. Confirmed in
    // PyTorch by validation cases moe8-v256-sgd-every and -selective vs moe8-v256-sgd (peak at
    // layer 0's attention softmax backward: +196,608 / +262,144 B predicted, +206,720 / +272,256 B
    // measured = + 2 RNG states).
    {"mixtral-8x7b ampBf16 adamw/fused eager b2 s1024: everyBlock vs none", 747753283588, 747677786116},     // +75,497,472 B
    {"mixtral-8x7b ampBf16 adamw/fused eager b2 s1024: everyKthBlock vs none", 747753283588, 747677786116},  // +75,497,472 B
    {"mixtral-8x7b ampBf16 adamw/fused eager b2 s1024: selective vs none", 747765866500, 747677786116},      // +88,080,384 B
    {"mixtral-8x7b fp32 adamw/fused eager b2 s1024: everyBlock vs none", 747736506372, 747661008900},        // +75,497,472 B
    {"mixtral-8x7b fp32 adamw/fused eager b2 s1024: everyKthBlock vs none", 747736506372, 747661008900},     // +75,497,472 B
    {"mixtral-8x7b fp32 adamw/fused eager b2 s1024: selective vs none", 747753283588, 747661008900},         // +92,274,688 B
    // clang-format on
};

// Which sweep a known violation's name belongs to.
bool OfGrowthSweep(const std::string& name) { return name.find(" -> ") != std::string::npos; }
bool OfOptionSweep(const std::string& name) {
  return name.ends_with(" vs none") || name.find(": sdpa vs eager with ") != std::string::npos;
}

std::string Describe(const Setup& s) {
  std::ostringstream o;
  if (s.model.kind == ModelKind::Transformer) {
    const Preset* preset = nullptr;
    for (const Preset& p : Presets()) if (p.architecture == s.model.architecture) preset = &p;
    o << (preset != nullptr ? preset->id : "transformer");
  } else if (s.model.kind == ModelKind::LayerList) {
    o << "layers(" << s.model.layers.size() << ")";
  } else {
    o << "quick(" << s.model.parameterCount << ")";
  }
  o << " " << IdOf(s.training.precision) << " " << IdOf(s.training.optimizer) << "/"
    << IdOf(s.training.optimizerImplementation);
  if (s.model.kind == ModelKind::Transformer) o << " " << IdOf(s.training.attention);
  o << " b" << s.training.batchSize << " s" << s.training.sequenceLength;
  return o.str();
}

// Every estimate of the sweep, computed once; each is checked for the category sums as it is
// made.
class Estimates {
 public:
  const Estimate& Of(const Setup& s) {
    const std::string key = SetupToJson(s);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const Estimate& e = cache_.emplace(key, MustEstimate(s)).first->second;
    CheckCategorySums(Describe(s) + " " + IdOf(s.training.checkpointing), e);
    return e;
  }
  std::size_t size() const { return cache_.size(); }

 private:
  static void CheckSnapshot(const std::string& what, const Snapshot& snapshot) {
    std::int64_t sum = 0;
    for (const CategoryBytes& c : snapshot.byCategory) sum += c.bytes;
    INFO(what << " at " << IdOf(snapshot.phase) << " step " << snapshot.step << " (" << snapshot.label << ")");
    CHECK(sum == snapshot.totalBytes);
  }
  static void CheckCategorySums(const std::string& what, const Estimate& e) {
    CheckSnapshot(what + ": peak", e.peak);
    for (const Snapshot& p : e.phasePeaks) CheckSnapshot(what + ": phase peak", p);
    CheckSnapshot(what + ": forward end", e.forwardEnd);
    // The overall peak is the largest of the phase peaks.
    std::int64_t largest = 0;
    for (const Snapshot& p : e.phasePeaks) largest = std::max(largest, p.totalBytes);
    CHECK(largest == e.peak.totalBytes);
  }
  std::map<std::string, Estimate> cache_;
};

// Collects where `peak` > `baseline` and compares the list with kKnownViolations at the end.
class Violations {
 public:
  void Expect(const std::string& name, std::int64_t peak, std::int64_t baseline) {
    checked_++;
    if (peak > baseline) found_[name] = {peak, baseline};
  }
  // Fails on a violation not in the table, on a table entry whose figures changed, and on a
  // table entry of this sweep (`ofThisSweep`) that no longer violates or that the sweep never
  // compared (a typo, or a sweep that changed).
  void Compare(const std::set<std::string>& swept, bool (*ofThisSweep)(const std::string&)) const {
    std::map<std::string, KnownViolation> known;
    for (const KnownViolation& k : kKnownViolations) known[k.name] = k;
    for (const auto& [name, figures] : found_) {
      auto it = known.find(name);
      INFO(name << ": peak " << figures.first << " B > " << figures.second << " B (+" << figures.first - figures.second
                << " B). Known-violation line: {\"" << name << "\", " << figures.first << ", " << figures.second << "},");
      if (it == known.end()) {
        FAIL_CHECK("a new violation");
      } else {
        CHECK(it->second.peakBytes == figures.first);
        CHECK(it->second.baselineBytes == figures.second);
      }
    }
    for (const auto& [name, k] : known) {
      if (!ofThisSweep(name)) continue;
      INFO(name);
      CHECK(swept.count(name) == 1);    // else: the sweep never compares this; fix the name
      CHECK(found_.count(name) == 1);   // else: the property now holds here; remove the line
    }
  }
  std::size_t checked() const { return checked_; }
  std::size_t found() const { return found_.size(); }

 private:
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> found_;
  std::size_t checked_ = 0;
};

Setup PresetSetup(const char* id, Precision precision, AttentionImplementation attention, std::int64_t batch,
                  std::int64_t sequence) {
  const Preset* preset = FindPreset(id);
  REQUIRE(preset != nullptr);
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = preset->architecture;
  s.training.precision = precision;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.optimizerImplementation = OptimizerImplementation::Fused;
  s.training.attention = attention;
  s.training.batchSize = batch;
  // BERT's learned position table bounds the sequence (512).
  const std::int64_t positions = preset->architecture.maxPositionEmbeddings;
  s.training.sequenceLength = positions > 0 && sequence > positions ? positions : sequence;
  return s;
}

// One of each family and shape: GPT-2 (learned positions, tied head), BERT (encoder), Llama-2
// (the model), Qwen2.5 (GQA, QKV biases, tied), Phi-3, and Mixtral (mixture of experts).
constexpr const char* kPresets[] = {"gpt2", "bert-base-uncased", "llama-2-7b", "qwen2.5-0.5b", "phi-3-mini-4k",
                                    "mixtral-8x7b"};

// The layer lists of the sweep: the README's MLP (MSE) and a small language model as a layer
// list with every layer kind (cross-entropy).
std::vector<Setup> LayerListSetups() {
  std::vector<Setup> out;
  out.push_back(ExampleMlpSetup());
  out.push_back(LayerSetup({Embedding(50000, 512), Linear(512, 2048), Activation(LayerKind::GELU), Dropout(0.1),
                            Linear(2048, 512, false), Activation(LayerKind::Tanh), Activation(LayerKind::Sigmoid),
                            Dropout(0), Linear(512, 50000)},
                           LossKind::CrossEntropy, 2, 128, Precision::FP32, OptimizerKind::AdamW));
  return out;
}

Estimates& Shared() {
  static Estimates estimates;
  return estimates;
}

}  // namespace

TEST_CASE("the peak never decreases when the batch or the sequence grows", "[property]") {
  Estimates& estimates = Shared();
  Violations violations;
  std::set<std::string> swept;
  auto sweep = [&](Setup s, bool batch, std::initializer_list<std::int64_t> sizes) {
    std::int64_t previous = -1;
    std::int64_t previousSize = 0;
    for (std::int64_t size : sizes) {
      (batch ? s.training.batchSize : s.training.sequenceLength) = size;
      const std::int64_t peak = estimates.Of(s).peak.totalBytes;
      if (previous >= 0) {
        const std::string name = Describe(s) + ": " + IdOf(s.training.checkpointing) + " " + (batch ? "batch " : "sequence ") +
                                 std::to_string(previousSize) + " -> " + std::to_string(size);
        swept.insert(name);
        // Growing must not shrink the peak: the baseline is the larger size's peak.
        violations.Expect(name, previous, peak);
      }
      previous = peak;
      previousSize = size;
    }
  };
  for (const char* id : kPresets) {
    for (Precision precision : {Precision::BF16Mixed, Precision::AmpBF16}) {
      for (Checkpointing checkpointing : {Checkpointing::None, Checkpointing::EveryBlock}) {
        Setup s = PresetSetup(id, precision, AttentionImplementation::SDPA, 1, 256);
        s.training.checkpointing = checkpointing;
        sweep(s, true, {1, 2, 4});
        sweep(s, false, {128, 256, 512});
      }
    }
  }
  for (Setup s : LayerListSetups()) {
    for (Precision precision : {Precision::FP32, Precision::FP16Mixed, Precision::BF16}) {
      s.training.precision = precision;
      s.training.sequenceLength = 1;
      sweep(s, true, {1, 2, 8, 32});
      s.training.batchSize = 2;
      sweep(s, false, {1, 16, 128});
    }
  }
  for (Precision precision : {Precision::FP32, Precision::AmpFP16}) {
    sweep(QuickSetup(1'500'000'000, precision, OptimizerKind::Adam), true, {1, 2, 4});
    sweep(QuickSetup(1'500'000'000, precision, OptimizerKind::Adam), false, {256, 1024, 4096});
  }
  violations.Compare(swept, OfGrowthSweep);
  WARN(violations.checked() << " comparisons, " << violations.found() << " violations, " << estimates.size()
                            << " distinct estimates so far");
}

TEST_CASE("checkpointing and SDPA never raise the peak", "[property]") {
  Estimates& estimates = Shared();
  Violations violations;
  std::set<std::string> swept;
  const std::int64_t sizes[][2] = {{1, 512}, {2, 1024}};
  for (const char* id : kPresets) {
    for (Precision precision : {Precision::FP32, Precision::AmpBF16}) {
      for (const auto& size : sizes) {
        for (AttentionImplementation attention : {AttentionImplementation::Eager, AttentionImplementation::SDPA}) {
          Setup none = PresetSetup(id, precision, attention, size[0], size[1]);
          const std::int64_t base = estimates.Of(none).peak.totalBytes;
          for (Checkpointing checkpointing : {Checkpointing::EveryBlock, Checkpointing::EveryKthBlock, Checkpointing::Selective}) {
            Setup with = none;
            with.training.checkpointing = checkpointing;
            const std::string name = Describe(none) + ": " + IdOf(checkpointing) + " vs none";
            swept.insert(name);
            violations.Expect(name, estimates.Of(with).peak.totalBytes, base);
          }
        }
        // SDPA against eager, with each checkpointing mode on both sides.
        for (Checkpointing checkpointing :
             {Checkpointing::None, Checkpointing::EveryBlock, Checkpointing::EveryKthBlock, Checkpointing::Selective}) {
          Setup eager = PresetSetup(id, precision, AttentionImplementation::Eager, size[0], size[1]);
          eager.training.checkpointing = checkpointing;
          Setup sdpa = eager;
          sdpa.training.attention = AttentionImplementation::SDPA;
          const std::string name = Describe(eager) + ": sdpa vs eager with " + IdOf(checkpointing);
          swept.insert(name);
          violations.Expect(name, estimates.Of(sdpa).peak.totalBytes, estimates.Of(eager).peak.totalBytes);
        }
      }
    }
  }
  violations.Compare(swept, OfOptionSweep);
  WARN(violations.checked() << " comparisons, " << violations.found() << " violations, " << estimates.size()
                            << " distinct estimates so far");
}

TEST_CASE("the table of known violations names only setups the sweeps check", "[property]") {
  // A line that belongs to no sweep would never be checked again.
  for (const KnownViolation& k : kKnownViolations) {
    INFO(k.name);
    CHECK(OfGrowthSweep(k.name) != OfOptionSweep(k.name));
    CHECK(k.peakBytes > k.baselineBytes);
  }
}

TEST_CASE("an estimate is deterministic: the same setup twice gives identical JSON", "[property]") {
  std::vector<Setup> setups = LayerListSetups();
  for (const char* id : kPresets) {
    Setup s = PresetSetup(id, Precision::AmpBF16, AttentionImplementation::Eager, 2, 128);
    s.training.checkpointing = Checkpointing::Selective;
    setups.push_back(s);
  }
  setups.push_back(QuickSetup(7'000'000'000, Precision::BF16Mixed, OptimizerKind::Adafactor));
  for (const Setup& s : setups) {
    const std::string text = SetupToJson(s);
    const std::string first = EstimateJson(text);
    // Another estimate in between: no state may carry over from one call to the next.
    (void)EstimateJson(SetupToJson(ExampleMlpSetup()));
    const std::string second = EstimateJson(text);
    INFO(Describe(s));
    CHECK(first.find("{\"ok\":true") == 0);
    CHECK(first == second);
  }
}
