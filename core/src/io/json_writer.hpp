// A direct JSON writer for the large documents (estimates, timelines): building an ojson tree
// of thousands of nodes cost more than the simulation itself. Writes the same text as
// nlohmann's dump(indent): compact with indent < 0, else one member per line.
#pragma once

#include <array>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace gpumem {

class JsonWriter {
 public:
  explicit JsonWriter(int indent = -1) : indent_(indent) { out_.reserve(4096); }

  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }
  // A member's name; its value follows.
  JsonWriter& Key(std::string_view name) {
    Separate();
    AppendString(name);
    out_ += indent_ >= 0 ? ": " : ":";
    afterKey_ = true;
    return *this;
  }
  JsonWriter& String(std::string_view s) {
    Separate();
    AppendString(s);
    return *this;
  }
  JsonWriter& Int(std::int64_t v) {
    Separate();
    char digits[24];
    const auto result = std::to_chars(digits, digits + sizeof digits, v);
    out_.append(digits, result.ptr);
    return *this;
  }
  JsonWriter& Bool(bool v) {
    Separate();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& Null() {
    Separate();
    out_ += "null";
    return *this;
  }
  // The shortest text that reads back as v, with ".0" on whole numbers, as nlohmann writes.
  JsonWriter& Double(double v) {
    Separate();
    // (libc++ of the wasm toolchain has no floating-point to_chars: the fewest of 15–17
    // significant digits that read back exactly.)
    char digits[32];
    int length = 0;
    for (int precision = 15; precision <= 17; ++precision) {
      length = std::snprintf(digits, sizeof digits, "%.*g", precision, v);
      if (std::strtod(digits, nullptr) == v) break;
    }
    const std::string_view text(digits, static_cast<std::size_t>(length > 0 ? length : 0));
    out_ += text;
    if (text.find_first_of(".eE") == std::string_view::npos && text != "inf" && text != "nan") out_ += ".0";
    return *this;
  }
  // Text that is already JSON (a value).
  JsonWriter& Raw(std::string_view json) {
    Separate();
    out_ += json;
    return *this;
  }
  JsonWriter& Strings(const std::vector<std::string>& list) {
    BeginArray();
    for (const std::string& s : list) String(s);
    return EndArray();
  }

  std::string& text() { return out_; }

  // Appends s as a JSON string: quotes, backslashes and control characters escaped.
  static void Quote(std::string& out, std::string_view s) {
    out += '"';
    // Runs of characters written as they are go in with one append each (a character at a
    // time cost a capacity check per character: most of the writer's time on labels).
    // A table of the bytes to escape: one load and one test a character (three compares before,
    // 12 instructions a byte of an estimate's labels and formulas, callgrind).
    std::size_t plain = 0;  // where the current run starts
    for (std::size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      const auto u = static_cast<unsigned char>(c);
      if (!kEscaped[u]) continue;
      out.append(s.data() + plain, i - plain);
      plain = i + 1;
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else {
        static constexpr char kShort[] = "btn\0fr";  // \b \t \n (\v) \f \r
        if (u >= 8 && u <= 13 && u != 11) {
          out += '\\';
          out += kShort[u - 8];
        } else {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
          out += escaped;
        }
      }
    }
    out.append(s.data() + plain, s.size() - plain);
    out += '"';
  }

 private:
  // The bytes Quote escapes: control characters, the quote and the backslash.
  static constexpr auto kEscaped = [] {
    std::array<bool, 256> escaped{};
    for (int c = 0; c < 0x20; ++c) escaped[static_cast<std::size_t>(c)] = true;
    escaped['"'] = escaped['\\'] = true;
    return escaped;
  }();
  void AppendString(std::string_view s) { Quote(out_, s); }
  // Before a value or a key: a comma after a sibling, and a new line when pretty.
  void Separate() {
    if (afterKey_) {
      afterKey_ = false;
      return;
    }
    if (stack_.empty()) return;
    if (!stack_.back()) out_ += ',';
    stack_.back() = false;
    if (indent_ >= 0) {
      out_ += '\n';
      out_.append(static_cast<std::size_t>(indent_) * stack_.size(), ' ');
    }
  }
  JsonWriter& Open(char c) {
    Separate();
    out_ += c;
    stack_.push_back(true);
    return *this;
  }
  JsonWriter& Close(char c) {
    const bool empty = stack_.back();
    stack_.pop_back();
    if (!empty && indent_ >= 0) {
      out_ += '\n';
      out_.append(static_cast<std::size_t>(indent_) * stack_.size(), ' ');
    }
    out_ += c;
    return *this;
  }

  int indent_;
  std::string out_;
  std::vector<bool> stack_;  // per open container: no member written yet
  bool afterKey_ = false;
};

}  // namespace gpumem
