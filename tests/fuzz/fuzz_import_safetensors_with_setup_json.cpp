// libFuzzer target: ImportSafetensorsJson(header, setup). The input is split at its first NUL
// byte: before it the safetensors header (or index), after it the setup (JSON text has no NUL,
// so the split is unambiguous for the seeds; the fuzzer is free to move it).
#include <cstdint>
#include <cstring>

#include "envelope_check.hpp"
#include "gpumem/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view all = gpumem::fuzz::AsText(data, size);
  const std::size_t nul = all.find('\0');
  const std::string_view header = all.substr(0, nul);
  const std::string_view setup = nul == std::string_view::npos ? std::string_view{} : all.substr(nul + 1);
  const std::string answer = gpumem::ImportSafetensorsJson(header, setup);
  const nlohmann::json j = gpumem::fuzz::CheckEnvelope(answer, "dtypes");
  if (j["ok"].get<bool>()) {
    const auto& count = j.at("parameterCount");
    const auto& architecture = j.at("architectureParameterCount");
    const auto& difference = j.at("differenceFromArchitecture");
    // When both counts are there, the difference is exactly header − architecture.
    if (count.is_number_integer() && architecture.is_number_integer()) {
      if (!difference.is_number_integer() ||
          difference.get<std::int64_t>() != count.get<std::int64_t>() - architecture.get<std::int64_t>()) {
        gpumem::fuzz::Broken("differenceFromArchitecture is not header − architecture", answer);
      }
    }
  }
  return 0;
}
