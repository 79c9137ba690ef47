// gpumem — solvers: the largest micro-batch and the longest sequence that fit the GPU, and the
// changes that would make a setup fit, ranked by the memory they save. Each answer comes from
// running the same simulation on changed setups (the peak grows with batch and sequence, so
// the limits are found by doubling and then bisecting).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

struct SolvedLimit {
  bool found = false;          // false when even 1 does not fit
  std::int64_t value = 0;      // the largest value that fits (samples or tokens)
  std::int64_t peakBytes = 0;  // the peak at that value
  std::int64_t limit = 0;      // the largest value allowed (position table, estimator limits)
  std::string limitReason;     // what sets `limit`
};

struct FitSuggestion {
  std::string id;        // "checkpointing-everyBlock", "batch-4-accumulate-8", …
  std::string label;     // what to change, for people
  std::string tradeoff;  // what it costs
  Setup setup;           // the changed setup
  std::vector<std::string> changedFields;  // JSON paths that differ: "training.checkpointing"
  std::int64_t peakBytes = 0;
  std::int64_t savedBytes = 0;  // current peak − this peak
  bool fits = false;
};

struct SolveResult {
  std::vector<FieldError> errors;  // the setup itself is invalid
  std::int64_t currentPeakBytes = 0;
  std::int64_t capacityBytes = 0;
  SolvedLimit maxBatchSize;
  SolvedLimit maxSequenceLength;
  std::vector<FitSuggestion> suggestions;  // by memory saved, largest first; a combination
                                           // first when no single change fits
  bool ok() const { return errors.empty(); }
};

SolveResult Solve(const Setup& setup);

}  // namespace gpumem
