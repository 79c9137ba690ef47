// libFuzzer target: CompareSnapshotJson (the unpickler and the snapshot reader) on arbitrary
// bytes, without a setup so that each input costs one read. Beyond the envelope: a measured
// timeline stays within its limit, no point of it exceeds the peaks, the peak allocated is one
// of its points (thinning keeps peaks), and the fragmentation is a fraction.
#include <algorithm>
#include <cstdint>

#include "envelope_check.hpp"
#include "gpumem/snapshot.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using gpumem::fuzz::Broken;
  const std::string answer = gpumem::CompareSnapshotJson(gpumem::fuzz::AsText(data, size), {});
  const nlohmann::json j = gpumem::fuzz::CheckEnvelope(answer, "measured");
  if (!j["ok"].get<bool>()) return 0;
  const auto& m = j["measured"];
  if (!j["estimate"].is_null()) Broken("an estimate without a setup", answer);
  const auto& timeline = m.at("timeline");
  if (timeline.empty() || timeline.size() > 2000) Broken("the timeline is empty or over 2,000 points", answer);
  const std::int64_t peakAllocated = m.at("peakAllocatedBytes").get<std::int64_t>();
  const std::int64_t peakReserved = m.at("peakReservedBytes").get<std::int64_t>();
  std::int64_t highest = -1;
  for (const auto& p : timeline) {
    const std::int64_t a = p.at("allocatedBytes").get<std::int64_t>();
    if (a < 0 || a > peakAllocated || p.at("reservedBytes").get<std::int64_t>() > peakReserved) {
      Broken("a timeline point is negative or above the peaks", answer);
    }
    highest = std::max(highest, a);
  }
  if (highest != peakAllocated) Broken("the thinned timeline lost the peak allocated", answer);
  const double fragmentation = m.at("segments").at("fragmentation").get<double>();
  if (!(fragmentation >= 0 && fragmentation <= 1)) Broken("fragmentation outside [0, 1]", answer);
  return 0;
}
