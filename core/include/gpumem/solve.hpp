// gpumem — solvers: the largest micro-batch and the longest sequence that fit the GPU, and the
// changes that would make a setup fit, ranked by the memory they save. Each answer comes from
// running the same simulation on changed setups. The peak grows with batch and sequence, close
// to affinely (in sequence too, unless eager attention adds its s² scores), so the limits are
// found by extrapolating from two simulations and then interpolating inside the bracket, a few
// simulations each instead of doubling and bisecting through dozens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

struct SolvedLimit {
  bool found = false;          // false when even 1 does not fit
  std::int64_t value = 0;      // the largest value that fits (samples or tokens)
  std::int64_t peakBytes = 0;  // the peak at that value
  std::int64_t limit = 0;      // the largest value allowed (position table, estimator limits)
  std::string limitReason;     // what sets `limit`
};

// What a change costs the person, cheapest first (the order suggestions are ranked in).
enum class FitCost {
  Free,            // the same math: fused kernels, chunked loss, the allocator's settings
  Compute,         // the same result for more compute or transfers: checkpointing, accumulation
  ChangesResults,  // different numerics or training: precision, optimizer, adapters
};
const char* FitCostId(FitCost cost);  // "free", "compute", "changesResults"

struct FitSuggestion {
  std::string id;        // "checkpointing-everyBlock", "batch-4-accumulate-8", …
  std::string label;     // what to change, for people
  std::string tradeoff;  // what it costs
  FitCost cost = FitCost::Free;  // a combination: its dearest change
  Setup setup;           // the changed setup
  std::vector<std::string> changedFields;  // JSON paths that differ: "training.checkpointing"
  std::int64_t peakBytes = 0;
  std::int64_t savedBytes = 0;  // current peak − this peak
  bool fits = false;
  // Not simulated: its model states alone pass the capacity, so peakBytes is their sum (a floor
  // of the peak) and savedBytes the most the change could save.
  bool peakIsLowerBound = false;
  // With peakIsLowerBound, what the floor counts: "modelStates", or "forwardEnd" (the model
  // states and what the blocks keep at the end of forward, ForwardEndFloor).
  std::string lowerBoundBasis;
};

struct SolveResult {
  std::vector<FieldError> errors;  // the setup itself is invalid
  std::int64_t currentPeakBytes = 0;
  std::int64_t capacityBytes = 0;
  SolvedLimit maxBatchSize;
  SolvedLimit maxSequenceLength;
  // Those that fit first, then by cost (FitCost: free before compute before changed results),
  // then by memory saved, largest first; a combination first when no single change fits.
  std::vector<FitSuggestion> suggestions;
  int estimatesRun = 0;  // simulations this solve ran (the setup's own included unless given)
  bool ok() const { return errors.empty(); }
};

// At most this many simulations per solve (the setup's own, two limit searches, about ten
// single changes and a short combination); a test holds the solver to it.
constexpr int kMaxSolveEstimates = 40;

SolveResult Solve(const Setup& setup);

// A floor of a one-GPU transformer setup's allocated peak, or 0 when none is known: at the end of
// step 2's forward the parameters, fp32 master copies and optimizer states are all allocated
// (no gradient yet: zero_grad set them to None), and so is everything each block saved for
// backward. Blocks after the first are alike, so each keeps what the second block of a 2-block
// model keeps beyond a 1-block one (two small simulations); the first block and the rest of the
// forward are left out. Only where the blocks are alike: no frozen first blocks or module lists,
// checkpointing none / every block / selective, no activation offloading.
std::int64_t ForwardEndFloor(const Setup& setup);
// The same, reusing an estimate of `setup` itself (the CLI has one already).
SolveResult Solve(const Setup& setup, const Estimate& current);

}  // namespace gpumem
