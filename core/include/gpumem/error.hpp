// gpumem — errors are values. Nothing in the core throws to report bad input; every function
// that can fail returns the problems it found, each naming the field by its JSON path.
#pragma once

#include <string>
#include <vector>

namespace gpumem {

enum class ErrorCode {
  InvalidField,   // a value out of range, of the wrong kind, or inconsistent with another
  MissingField,   // a required field is absent
  UnknownField,   // a field the schema does not know (usually a typo)
  MalformedJson,  // the text is not JSON at all
  TooLarge,       // the setup would need more memory than the estimator can represent
};

struct FieldError {
  ErrorCode code = ErrorCode::InvalidField;
  std::string field;    // JSON path, e.g. "training.batchSize"; "" for the whole document
  std::string message;  // one sentence a person can act on
};

// Stable identifiers used in JSON and in the JS wrapper's Error.code.
const char* ErrorCodeId(ErrorCode code);

}  // namespace gpumem
