#include "gpumem/heuristics.hpp"

namespace gpumem {

double HeuristicActivationValuesPerToken(std::int64_t parameterCount) {
  return kHeuristicSlope * static_cast<double>(parameterCount) + kHeuristicIntercept;
}

}  // namespace gpumem
