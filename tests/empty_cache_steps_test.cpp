// training.emptyCacheSteps: the Hugging Face Trainer's torch_empty_cache_steps (transformers
// trainer.py training_step: compute_loss, `del inputs`, then torch.cuda.empty_cache() when
// global_step % torch_empty_cache_steps == 0, then the backward). Where the call lands in the
// trace, what it does to the device figure, its refusals, and the solver's suggestion.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/solve.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// The first backward event of each micro-batch, in order: where the phase turns to Backward.
std::vector<std::size_t> BackwardStarts(const Trace& trace) {
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const bool backward = trace.events[i].phase == Phase::Backward;
    const bool before = i > 0 && trace.events[i - 1].phase == Phase::Backward;
    if (backward && !before) starts.push_back(i);
  }
  return starts;
}

Setup SmallWith(std::int64_t every, std::int64_t accumulation = 1) {
  Setup s = test::SmallLlama(2);
  s.training.emptyCacheSteps = every;
  s.parallel.gradientAccumulationSteps = accumulation;
  return s;
}

std::vector<std::size_t> EmptyCachesOf(const Setup& s) {
  REQUIRE(Validate(s).empty());
  return BuildTrace(s, BuildInventory(s), false).emptyCacheBefore;
}

// Llama 3.2 1B under autocast bf16, every block checkpointed, 17 × 2,048 on an H100: the case of
// docs/validation.md's out-of-memory line that the allocator's segments decide (measured: out of
// memory at 17).
Setup Llama1bBatch17() {
  auto parsed = ParseSetupJson(R"({"model":{"preset":"llama-3.2-1b"},
      "training":{"batchSize":17,"sequenceLength":2048,"precision":"ampBf16","attention":"sdpa","checkpointing":"everyBlock"},
      "gpu":{"id":"nvidia-h100-sxm"}})");
  REQUIRE(parsed.errors.empty());
  return parsed.setup;
}

}  // namespace

TEST_CASE("torch_empty_cache_steps empties the cache between the loss and the backward of every N-th update",
          "[empty-cache-steps]") {
  CHECK(EmptyCachesOf(SmallWith(0)).empty());
  // Steps 1 and 2 are global_step 0 and 1: N = 1 empties in both, N = 2 (or more) in step 1 only.
  const Setup every = SmallWith(1);
  const Trace t = BuildTrace(every, BuildInventory(every), false);
  const std::vector<std::size_t> starts = BackwardStarts(t);
  REQUIRE(starts.size() == 2);
  CHECK(t.emptyCacheBefore == starts);
  CHECK(t.events[starts[0] - 1].phase == Phase::Forward);  // right after the loss
  const std::vector<std::size_t> second = EmptyCachesOf(SmallWith(2));
  REQUIRE(second.size() == 1);
  CHECK(second[0] == starts[0]);
  CHECK(EmptyCachesOf(SmallWith(7)).size() == 1);
  // Every micro-batch of an update runs training_step: with 3 micro-batches, 3 calls a step.
  const Setup accumulating = SmallWith(1, 3);
  const Trace a = BuildTrace(accumulating, BuildInventory(accumulating), false);
  CHECK(a.emptyCacheBefore.size() == 6);
  CHECK(a.emptyCacheBefore == BackwardStarts(a));
  // The allocated figures do not move: empty_cache frees no tensor.
  const Estimate plain = test::MustEstimate(SmallWith(0));
  const Estimate emptied = test::MustEstimate(SmallWith(1));
  CHECK(emptied.peak.totalBytes == plain.peak.totalBytes);
  CHECK(emptied.device.peakAllocatedBytes == plain.device.peakAllocatedBytes);
}

TEST_CASE("emptying the cache before each backward turns the batch-17 out-of-memory into a fit", "[empty-cache-steps]") {
  // Without it a 16.63 GiB request finds no free block although 25.88 GiB are free in 32
  // fragments: the forward's freed blocks strand the backward's large requests. With it the
  // backward starts from the segments that hold live tensors only.
  Setup s = Llama1bBatch17();
  const Estimate plain = test::MustEstimate(s);
  CHECK_FALSE(plain.device.fits);
  s.training.emptyCacheSteps = 1;
  const Estimate emptied = test::MustEstimate(s);
  CHECK(emptied.device.fits);
  CHECK(emptied.device.peakAllocatedBytes == plain.device.peakAllocatedBytes);
  CHECK(emptied.device.peakReservedBytes < plain.device.peakReservedBytes);
  // And the solver offers it, simulated.
  const SolveResult solved = Solve(Llama1bBatch17());
  const FitSuggestion* suggestion = test::Suggestion(solved, "training-emptyCacheSteps-1");
  REQUIRE(suggestion != nullptr);
  CHECK(suggestion->fits);
  CHECK_FALSE(suggestion->peakIsLowerBound);
  CHECK(suggestion->changedFields == std::vector<std::string>{"training.emptyCacheSteps"});
  CHECK(suggestion->peakBytes == emptied.device.peakDeviceBytes);
}

TEST_CASE("training.emptyCacheSteps is refused when negative, absurd, or under pipeline parallelism", "[empty-cache-steps]") {
  Setup s = SmallWith(-1);
  CHECK(test::HasErrorOn(Validate(s), "training.emptyCacheSteps"));
  s.training.emptyCacheSteps = std::int64_t{1} << 40;
  CHECK(test::HasErrorOn(Validate(s), "training.emptyCacheSteps"));
  s.training.emptyCacheSteps = 1;
  s.parallel.pipelineParallel = 2;
  s.parallel.dataParallel = 1;
  CHECK(test::HasErrorOn(Validate(s), "training.emptyCacheSteps"));
  auto parsed = ParseSetupJson(R"({"training":{"emptyCacheSteps":"1"}})");
  CHECK(test::HasErrorOn(parsed.errors, "training.emptyCacheSteps"));
  auto good = ParseSetupJson(R"({"training":{"emptyCacheSteps":4}})");
  CHECK(good.errors.empty());
  CHECK(good.setup.training.emptyCacheSteps == 4);
}
