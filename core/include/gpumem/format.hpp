// Text for formulas and messages: every number the core and the CLI print is formatted here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "gpumem/dtype.hpp"

namespace gpumem {

std::string FormatCount(std::int64_t value);    // 369405824 → "369,405,824"
std::string FormatScientific(double value);     // 1.5e18 → "1.5e18"
// "32 × 1024 × 4 B (fp32)": the product of the dimensions times the element size.
std::string SizeFormula(std::initializer_list<std::int64_t> dims, DType type);
// "[1024, 240000] = 245,760,000 × 4 B (fp32)" for a shaped tensor.
std::string ShapeFormula(const std::vector<std::int64_t>& shape, DType type);
std::string BytesOf(DType type);                // "4 B (fp32)"
// Binary prefixes for people: 7449556484 → "6.94 GiB" (exact bytes are shown beside it).
std::string HumanBytes(std::int64_t bytes);

}  // namespace gpumem
