// The solvers: the largest batch and sequence that fit (the next one up does not), and the
// changes that would make a setup fit, each checked against the simulation itself.
#include <catch2/catch.hpp>

#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup Gpt2(std::int64_t batch, std::int64_t sequence, double gib) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("gpt2")->architecture;
  s.training.batchSize = batch;
  s.training.sequenceLength = sequence;
  s.training.precision = Precision::AmpBF16;
  s.gpu.memoryGiB = gib;
  return s;
}

// The device figure the solver decides fits on (Estimate::device; the allocated peak is peak.totalBytes).
std::int64_t Peak(Setup s) { return MustEstimate(s).device.peakDeviceBytes; }

}  // namespace

TEST_CASE("the largest micro-batch fits and the next one does not", "[solve]") {
  const Setup s = Gpt2(4, 1024, 24);
  const SolveResult r = Solve(s);
  REQUIRE(r.ok());
  REQUIRE(r.maxBatchSize.found);
  Setup at = s, above = s;
  at.training.batchSize = r.maxBatchSize.value;
  above.training.batchSize = r.maxBatchSize.value + 1;
  CHECK(Peak(at) == r.maxBatchSize.peakBytes);
  CHECK(Peak(at) <= r.capacityBytes);
  CHECK(Peak(above) > r.capacityBytes);
}

TEST_CASE("the longest sequence stops at the position table", "[solve]") {
  const SolveResult r = Solve(Gpt2(1, 128, 80));
  REQUIRE(r.maxSequenceLength.found);
  CHECK(r.maxSequenceLength.limit == 1024);
  CHECK(r.maxSequenceLength.value == 1024);
}

TEST_CASE("nothing fits: limits say so and changes are ranked by cost then memory saved", "[solve]") {
  Setup s = Gpt2(64, 1024, 8);
  s.training.precision = Precision::FP32;
  const SolveResult r = Solve(s);
  REQUIRE(r.ok());
  CHECK(r.currentPeakBytes > r.capacityBytes);
  REQUIRE(r.suggestions.size() >= 3);
  for (std::size_t i = 0; i < r.suggestions.size(); ++i) {
    const FitSuggestion& f = r.suggestions[i];
    INFO(f.id);
    CHECK(Peak(f.setup) == f.peakBytes);
    CHECK(f.savedBytes == r.currentPeakBytes - f.peakBytes);
    CHECK(f.fits == (f.peakBytes <= r.capacityBytes));
    // After the combination: fitting ones first, then free before compute before changed
    // results, then by memory saved.
    if (i > 1) {
      const FitSuggestion& e = r.suggestions[i - 1];
      CHECK((e.fits > f.fits || (e.fits == f.fits && (e.cost < f.cost || (e.cost == f.cost && e.savedBytes >= f.savedBytes)))));
    }
  }
}

TEST_CASE("when no single change fits a combination comes first", "[solve]") {
  // GPT-2 in fp32 at batch 1 × 1024 on 1.9 GiB: 16 B per parameter alone is 1.85 GiB, so only
  // several changes together fit (checkpointing and pure bf16: 1.29 GiB allocated, with the
  // allocator cache and the 426 MiB context under 1.9 GiB).
  Setup s = Gpt2(1, 1024, 1.9);
  s.training.precision = Precision::FP32;
  const SolveResult r = Solve(s);
  REQUIRE(r.suggestions.size() >= 2);
  for (std::size_t i = 1; i < r.suggestions.size(); ++i) CHECK_FALSE(r.suggestions[i].fits);
  const FitSuggestion& combo = r.suggestions.front();
  CHECK(combo.label.rfind("Combine: ", 0) == 0);
  CHECK(combo.changedFields.size() >= 2);
  CHECK(combo.fits);
  CHECK(Peak(combo.setup) == combo.peakBytes);
}

TEST_CASE("an invalid setup is not solved", "[solve]") {
  Setup s = Gpt2(0, 1024, 8);
  CHECK(HasErrorOn(Solve(s).errors, "training.batchSize"));
}
