// gpumem — errors are values. Nothing in the core throws to report bad input; every function
// that can fail returns the problems it found, each naming the field by its JSON path.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace gpumem {

enum class ErrorCode {
  InvalidField,   // a value out of range, of the wrong kind, or inconsistent with another
  MissingField,   // a required field is absent
  UnknownField,   // a field the schema does not know (usually a typo)
  MalformedJson,  // the text is not JSON at all
  TooLarge,       // the setup would need more memory than the estimator can represent
  TooManyErrors,  // the last entry of a capped list: how many more errors were found, unlisted
};

struct FieldError {
  ErrorCode code = ErrorCode::InvalidField;
  std::string field;    // JSON path, e.g. "training.batchSize"; "" for the whole document
  std::string message;  // one sentence a person can act on
};

// Stable identifiers used in JSON and in the JS wrapper's Error.code.
const char* ErrorCodeId(ErrorCode code);

// Every entry point reports at most this many errors, then one TooManyErrors entry saying how
// many more there were: a 16 MiB document with a million typos costs a counter, not a million
// messages (and a person fixes the first hundred before reading the rest anyway).
constexpr std::size_t kMaxReportedErrors = 100;

// Errors as they are found: the first kMaxReportedErrors kept, every one counted. push_back and
// size() read like std::vector's so that checks can be written the same way ("did this block
// add an error": size() before and after counts every error, kept or not).
class ErrorList {
 public:
  // Errors for which `drop` is true are neither kept nor counted (e.g. a range error on a field
  // whose text already failed to parse and was reported).
  void SetFilter(std::function<bool(const FieldError&)> drop) { drop_ = std::move(drop); }

  void push_back(FieldError error) {
    if (drop_ && drop_(error)) return;
    ++total_;
    if (kept_.size() < kMaxReportedErrors) kept_.push_back(std::move(error));
  }
  // True once the cap is reached: a caller may count instead of building a message.
  bool Full() const { return kept_.size() >= kMaxReportedErrors; }
  // Counts an error without its message (only once Full()).
  void CountOne() { ++total_; }

  std::size_t size() const { return total_; }  // every error found, listed or not
  bool empty() const { return total_ == 0; }
  const std::vector<FieldError>& Kept() const { return kept_; }

  // The kept errors, then — when some were only counted — "…and N more errors, not listed" as
  // a TooManyErrors entry, followed by `note` when given.
  std::vector<FieldError> Report(const std::string& note = "") const;

 private:
  std::vector<FieldError> kept_;
  std::size_t total_ = 0;
  std::function<bool(const FieldError&)> drop_;
};

// Caps an already built list the same way (at most kMaxReportedErrors, then "…and N more").
std::vector<FieldError> CapErrors(std::vector<FieldError> errors);

}  // namespace gpumem
