// libFuzzer target: SolveJson (the solvers: dozens of estimates per input) on arbitrary text.
// Run with a small -max_len (scripts/test uses 1024) so that it still gets many executions.
// Beyond the envelope: a limit that was found fits the capacity, and every suggestion's
// savedBytes is the current peak minus its own.
#include <cstdint>

#include "envelope_check.hpp"
#include "gpumem/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using gpumem::fuzz::Broken;
  const std::string_view text = gpumem::fuzz::AsText(data, size);
  // The solver runs ~60 estimates: GPT-2-sized setups at most (12 blocks: ~2.4 s in all under
  // the sanitizers), so that a timeout means a hang. Larger setups are parsed, not solved.
  if (gpumem::fuzz::SimulationWork(text) > 100) return 0;
  const std::string answer = gpumem::SolveJson(text);
  const nlohmann::json j = gpumem::fuzz::CheckEnvelope(answer, "solve");
  if (j["ok"].get<bool>()) {
    const auto& solve = j["solve"];
    const std::int64_t current = solve.at("currentPeakBytes").get<std::int64_t>();
    const std::int64_t capacity = solve.at("capacityBytes").get<std::int64_t>();
    for (const char* limit : {"maxBatchSize", "maxSequenceLength"}) {
      const auto& l = solve.at(limit);
      if (!l.is_null() && l.at("peakBytes").get<std::int64_t>() > capacity) Broken("a solver limit does not fit", answer);
    }
    for (const auto& s : solve.at("suggestions")) {
      if (s.at("savedBytes").get<std::int64_t>() != current - s.at("peakBytes").get<std::int64_t>()) {
        Broken("a suggestion's savedBytes is not currentPeak − peak", answer);
      }
    }
  }
  return 0;
}
