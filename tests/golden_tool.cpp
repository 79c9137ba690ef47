// Writes the golden estimates, one JSON line per setup of golden::Setups(), to stdout:
//   build/native/tests/gpumem_golden > tests/data/golden-estimates.jsonl
// Regenerate only for a deliberate change of the simulation, listed in the change's note with
// scripts/validate re-run.
#include <cstdio>

#include "golden.hpp"

int main() {
  for (const std::string& setup : gpumem::golden::Setups()) {
    std::puts(gpumem::golden::Line(setup).c_str());
  }
  return 0;
}
