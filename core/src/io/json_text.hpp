// Limits on JSON text the core accepts from people (setups, config.json, safetensors headers),
// checked before nlohmann parses it: wasm has a small stack and no exceptions.
#pragma once

#include <cstddef>
#include <string_view>

namespace gpumem {

constexpr std::size_t kMaxJsonTextBytes = 16u << 20;  // 16 MiB
constexpr int kMaxJsonDepth = 64;

// False when `text` nests arrays/objects deeper than `limit` (strings are skipped).
inline bool NestingWithin(std::string_view text, int limit) {
  int depth = 0;
  bool inString = false, escaped = false;
  for (char c : text) {
    if (inString) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') inString = false;
      continue;
    }
    if (c == '"') inString = true;
    else if (c == '[' || c == '{') { if (++depth > limit) return false; }
    else if (c == ']' || c == '}') --depth;
  }
  return true;
}

}  // namespace gpumem
