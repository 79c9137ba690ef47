// libFuzzer target: EstimateJson (parse + validate + estimate) on arbitrary text.
// Beyond the envelope: an estimate's peak is a non-negative byte count no smaller than any
// phase's peak. (Determinism is a property test: a second call here would halve the executions.)
#include <cstdint>

#include "envelope_check.hpp"
#include "gpumem/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using gpumem::fuzz::Broken;
  const std::string_view text = gpumem::fuzz::AsText(data, size);
  // At most ~3 s under the sanitizers (every preset fits: the largest is 1,632 units).
  if (gpumem::fuzz::SimulationWork(text) > 2000) return 0;
  const std::string answer = gpumem::EstimateJson(text);
  const nlohmann::json j = gpumem::fuzz::CheckEnvelope(answer, "estimate");
  if (j["ok"].get<bool>()) {
    const auto& estimate = j["estimate"];
    const auto& peak = estimate.at("peak").at("totalBytes");
    if (!peak.is_number_integer() || peak.get<std::int64_t>() < 0) Broken("peak.totalBytes is not a byte count", answer);
    for (const auto& phase : estimate.at("phasePeaks")) {
      if (phase.at("totalBytes").get<std::int64_t>() > peak.get<std::int64_t>()) Broken("a phase peak exceeds the peak", answer);
    }
  }
  return 0;
}
