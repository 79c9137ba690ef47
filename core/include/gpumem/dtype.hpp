// gpumem — element types and their sizes.
#pragma once

#include <cstdint>

namespace gpumem {

enum class DType { FP32, FP16, BF16, Int64, Bool, UInt8 };

// Bytes per element: fp32 4, fp16 2, bf16 2, int64 8, bool 1 (PyTorch's storage sizes).
constexpr std::int64_t BytesPerElement(DType type) {
  switch (type) {
    case DType::FP32: return 4;
    case DType::FP16: return 2;
    case DType::BF16: return 2;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::UInt8: return 1;  // bitsandbytes' 8-bit optimizer states
  }
  return 0;
}

const char* DTypeId(DType type);  // "fp32", "fp16", "bf16", "int64", "bool", "uint8"

}  // namespace gpumem
