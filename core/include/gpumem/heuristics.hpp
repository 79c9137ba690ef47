// gpumem — quick mode's activation heuristic, kept apart from the exact simulation and labelled
// as a heuristic wherever it is shown.
#pragma once

#include <cstdint>

namespace gpumem {

// Published per-token activation fit for transformer language models:
//   A(N) = 4.6894e-4 · N + 1.8494e6   activation values saved per token,
// N = parameter count. Bytes = A(N) × batch × sequence × bytes per activation value.
// It is a regression over real models, not a derivation: the exact mode counts what each op
// keeps for backward instead.
constexpr double kHeuristicSlope = 4.6894e-4;      // values per token per parameter
constexpr double kHeuristicIntercept = 1.8494e6;   // values per token

double HeuristicActivationValuesPerToken(std::int64_t parameterCount);

}  // namespace gpumem
