// libFuzzer target: ImportSafetensorsJson(text) on arbitrary text (a safetensors header or a
// model.safetensors.index.json).
#include <cstdint>

#include "envelope_check.hpp"
#include "gpumem/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string answer = gpumem::ImportSafetensorsJson(gpumem::fuzz::AsText(data, size));
  const nlohmann::json j = gpumem::fuzz::CheckEnvelope(answer, "dtypes");
  if (j["ok"].get<bool>()) {
    // Without a setup there is nothing to compare with.
    if (!j.at("differenceFromArchitecture").is_null()) gpumem::fuzz::Broken("a difference without a setup", answer);
  }
  return 0;
}
