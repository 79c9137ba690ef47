// Replay's internal entry point for EstimateMemory.
#pragma once

#include <span>

#include "gpumem/estimate.hpp"

namespace gpumem {

// Replay, leaving unrendered the formula of every snapshot row that `known` (the model states'
// rows) holds with the same category and bytes: EstimateMemory replaces exactly those with the
// model state's formula, so rendering their four largest tensors would be thrown away.
Estimate Replay(const Trace& trace, const EstimateOptions& options, std::span<const CategoryBytes> known);

}  // namespace gpumem
