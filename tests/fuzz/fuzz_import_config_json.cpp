// libFuzzer target: ImportConfigJson (a Hugging Face config.json) on arbitrary text. A config
// that imports must give a setup that the estimator accepts as a document (its own schema).
#include <cstdint>

#include "envelope_check.hpp"
#include "gpumem/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string answer = gpumem::ImportConfigJson(gpumem::fuzz::AsText(data, size));
  const nlohmann::json j = gpumem::fuzz::CheckEnvelope(answer, "setup");
  if (j["ok"].get<bool>()) {
    // The imported setup must read back without parse errors (range errors are allowed: a
    // config may describe a model too large to estimate).
    const gpumem::SetupParseResult back = gpumem::ParseSetupJson(j["setup"].dump());
    if (!back.ok()) gpumem::fuzz::Broken("the imported setup does not parse as a setup", answer);
  }
  return 0;
}
