// A request object whose "setup" is a gpumem setup and whose other keys are the request's own
// (views: axisValues, curvePoints; layouts: gpus, allowOffload, maxEstimates). The bounds, the
// parse and the setup are read here once; each entry point says what its other keys mean.
// Nothing throws: nlohmann's non-throwing forms, type checks before every read.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "gpumem/json.hpp"
#include "io/json_text.hpp"

namespace gpumem {

// `other(key, value, errors)` reads every key but "setup". Setup errors keep the setup's own
// paths ("training.batchSize"), so the page points at the same controls as for an estimate.
template <class OtherKey>
std::vector<FieldError> ReadSetupRequest(std::string_view text, Setup& setup, OtherKey&& other) {
  std::vector<FieldError> errors;
  if (text.size() > kMaxJsonTextBytes || !NestingWithin(text, kMaxJsonDepth)) {
    return {{ErrorCode::TooLarge, "", "The request is too large or too deeply nested."}};
  }
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded()) return {{ErrorCode::MalformedJson, "", "The request is not valid JSON."}};
  if (!doc.is_object()) return {{ErrorCode::InvalidField, "", "The request must be a JSON object."}};
  for (const auto& [key, value] : doc.items()) {
    if (key != "setup") {
      other(key, value, errors);
      continue;
    }
    if (!value.is_object()) {
      errors.push_back({ErrorCode::InvalidField, "setup", "The setup must be a JSON object."});
      continue;
    }
    const std::string setupText = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::vector<FieldError> setupErrors = ParseAndValidate(setupText, setup);
    errors.insert(errors.end(), setupErrors.begin(), setupErrors.end());
  }
  return errors;
}

}  // namespace gpumem
