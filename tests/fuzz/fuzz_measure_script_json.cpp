// libFuzzer target: MeasureScriptJson (parse + validate + estimate + the measuring script) on
// arbitrary text. Beyond the envelope (errors as in every entry point): a script that is made is
// Python with every token replaced, named after its model type.
#include <cstdint>

#include "envelope_check.hpp"
#include "gpumem/measure.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using gpumem::fuzz::Broken;
  const std::string_view text = gpumem::fuzz::AsText(data, size);
  // As the estimate's target: at most ~3 s under the sanitizers.
  if (gpumem::fuzz::SimulationWork(text) > 2000) return 0;
  const std::string answer = gpumem::MeasureScriptJson(text);
  const nlohmann::json j = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ok") || !j["ok"].is_boolean()) Broken("no envelope", answer);
  if (!j["ok"].get<bool>()) {
    gpumem::fuzz::CheckEnvelope(answer, "");
    return 0;
  }
  for (const char* key : {"fileName", "modelType", "script"}) {
    if (!j.contains(key) || !j[key].is_string()) Broken("ok:true without fileName, modelType and script strings", answer);
  }
  const std::string& script = j["script"].get_ref<const std::string&>();
  if (script.rfind("#!/usr/bin/env python3\n", 0) != 0) Broken("the script is not a Python script", answer);
  if (script.find('@') != std::string::npos) Broken("a token is left in the script", answer);
  if (j["fileName"].get<std::string>() != "gpumem_measure_" + j["modelType"].get<std::string>() + ".py") {
    Broken("the file is not named after its model type", answer);
  }
  return 0;
}
