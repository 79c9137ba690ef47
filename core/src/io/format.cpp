#include "gpumem/format.hpp"

#include <cmath>
#include <cstdio>

namespace gpumem {

std::string FormatCount(std::int64_t value) {
  // The magnitude as unsigned, so that INT64_MIN has one too.
  const std::uint64_t magnitude = value < 0 ? 0 - static_cast<std::uint64_t>(value)
                                            : static_cast<std::uint64_t>(value);
  const std::string digits = std::to_string(magnitude);
  std::string out = value < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string HumanBytes(std::int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = std::fabs(static_cast<double>(bytes));
  int unit = 0;
  while (v >= 1024.0 && unit < 6) { v /= 1024.0; ++unit; }
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, unit == 0 ? "%s%.0f %s" : "%s%.2f %s", bytes < 0 ? "-" : "", v,
                kUnits[unit]);
  return buffer;
}

std::string FormatScientific(double value) {
  if (!std::isfinite(value)) return "infinity";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g", value);
  std::string s = buffer;
  // "1.5e+18" → "1.5e18"
  if (auto pos = s.find("e+"); pos != std::string::npos) s.erase(pos + 1, 1);
  return s;
}

std::string BytesOf(DType type) {
  return std::to_string(BytesPerElement(type)) + " B (" + DTypeId(type) + ")";
}

std::string SizeFormula(std::initializer_list<std::int64_t> dims, DType type) {
  std::string out;
  for (std::int64_t d : dims) out += FormatCount(d) + " × ";
  return out + BytesOf(type);
}

std::string ShapeFormula(const std::vector<std::int64_t>& shape, DType type) {
  std::string out = "[";
  std::int64_t elements = 1;
  bool first = true;
  for (std::int64_t d : shape) {
    out += (first ? "" : ", ") + FormatCount(d);
    elements *= d;
    first = false;
  }
  return out + "] = " + FormatCount(elements) + " × " + BytesOf(type);
}

}  // namespace gpumem
