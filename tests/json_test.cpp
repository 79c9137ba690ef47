// The JSON schema: round trips, partial documents, and hostile input.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "io/json_writer.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;
using nlohmann::json;

namespace {

std::vector<FieldError> ErrorsOf(const std::string& text) {
  Setup setup;
  return ParseAndValidate(text, setup);
}

}  // namespace

TEST_CASE("a setup survives a round trip", "[json]") {
  for (const Setup& original : {DefaultSetup(), ExampleMlpSetup()}) {
    const std::string text = SetupToJson(original);
    const SetupParseResult parsed = ParseSetupJson(text);
    REQUIRE(parsed.ok());
    CHECK(SetupToJson(parsed.setup) == text);
  }
  Setup s = ExampleMlpSetup();
  s.model.layers.insert(s.model.layers.begin() + 1, test::Dropout(0.25));
  s.training.optimizer = OptimizerKind::Adafactor;
  s.training.adafactorBeta1 = true;
  s.training.zeroGradSetToNone = false;
  s.model.largestMatrices = {{3, 4}};
  s.gpu.memoryGiB = 23.5;
  const SetupParseResult parsed = ParseSetupJson(SetupToJson(s, 2));
  REQUIRE(parsed.ok());
  CHECK(SetupToJson(parsed.setup) == SetupToJson(s));
}

TEST_CASE("absent fields keep the defaults", "[json]") {
  const SetupParseResult parsed = ParseSetupJson(R"({"training":{"batchSize":4}})");
  REQUIRE(parsed.ok());
  CHECK(parsed.setup.training.batchSize == 4);
  CHECK(parsed.setup.training.sequenceLength == DefaultSetup().training.sequenceLength);
  CHECK(parsed.setup.model.parameterCount == DefaultSetup().model.parameterCount);
  CHECK(ParseSetupJson("{}").ok());
  CHECK(ParseSetupJson(R"({"model":{"parameterCount":1.5e9}})").setup.model.parameterCount == 1'500'000'000);
}

TEST_CASE("bad documents give errors naming the field", "[json]") {
  SECTION("not JSON") {
    for (const char* text : {"", "{", "not json", "{\"a\":}", "[1,2", "\xff\xfe"}) {
      const auto errors = ErrorsOf(text);
      REQUIRE(errors.size() == 1);
      CHECK(errors[0].code == ErrorCode::MalformedJson);
    }
  }
  SECTION("not an object") {
    CHECK(!ErrorsOf("[]").empty());
    CHECK(!ErrorsOf("42").empty());
    CHECK(HasErrorOn(ErrorsOf(R"({"training": 5})"), "training"));
  }
  SECTION("wrong types") {
    const auto errors = ErrorsOf(
        R"({"training":{"batchSize":"abc","sequenceLength":null,"zeroGradSetToNone":1},"gpu":{"memoryGiB":"80"}})");
    CHECK(HasErrorOn(errors, "training.batchSize"));
    CHECK(HasErrorOn(errors, "training.sequenceLength"));
    CHECK(HasErrorOn(errors, "training.zeroGradSetToNone"));
    CHECK(HasErrorOn(errors, "gpu.memoryGiB"));
  }
  SECTION("fractions, huge numbers and negatives") {
    CHECK(HasErrorOn(ErrorsOf(R"({"training":{"batchSize":2.5}})"), "training.batchSize"));
    CHECK(HasErrorOn(ErrorsOf(R"({"model":{"parameterCount":1e30}})"), "model.parameterCount"));
    CHECK(HasErrorOn(ErrorsOf(R"({"model":{"parameterCount":18446744073709551615}})"), "model.parameterCount"));
    CHECK(HasErrorOn(ErrorsOf(R"({"training":{"batchSize":-1}})"), "training.batchSize"));
  }
  SECTION("unknown fields and enum values") {
    const auto errors = ErrorsOf(R"({"traning":{},"training":{"precision":"fp8","optimizer":"sophia"}})");
    CHECK(HasErrorOn(errors, "traning"));
    CHECK(HasErrorOn(errors, "training.precision"));
    CHECK(HasErrorOn(errors, "training.optimizer"));
    CHECK(errors.front().code == ErrorCode::UnknownField);
  }
  SECTION("layers") {
    const auto errors = ErrorsOf(
        R"({"model":{"kind":"layers","layers":[{"type":"linear","inFeatures":10,"outFeatures":4},)"
        R"({"type":"conv"},{"type":"linear","inFeatures":5,"outFeatures":2},{"type":"linear"},7]}})");
    CHECK(HasErrorOn(errors, "model.layers[1].type"));
    CHECK(!HasErrorOn(errors, "model.layers[1].inFeatures"));  // no follow-on noise
    CHECK(HasErrorOn(errors, "model.layers[3].inFeatures"));
    CHECK(HasErrorOn(errors, "model.layers[4]"));
    const auto mismatch = ErrorsOf(
        R"({"model":{"kind":"layers","layers":[{"type":"linear","inFeatures":10,"outFeatures":4},)"
        R"({"type":"relu"},{"type":"linear","inFeatures":5,"outFeatures":2}]}})");
    REQUIRE(mismatch.size() == 1);
    CHECK(mismatch[0].field == "model.layers[2].inFeatures");
  }
  SECTION("parse errors and range errors are reported together") {
    const auto errors = ErrorsOf(R"({"training":{"batchSize":-1,"precision":"fp8"}})");
    CHECK(HasErrorOn(errors, "training.batchSize"));
    CHECK(HasErrorOn(errors, "training.precision"));
  }
  SECTION("hostile nesting and sizes") {
    CHECK(ErrorsOf(std::string(100000, '[')).front().code == ErrorCode::MalformedJson);
    CHECK(ErrorsOf(std::string(200, '[') + std::string(200, ']')).front().code == ErrorCode::MalformedJson);
    const std::string longKey = "{\"" + std::string(100000, 'x') + "\":1}";
    CHECK(ErrorsOf(longKey).front().code == ErrorCode::UnknownField);
    // An unknown key with invalid UTF-8 is echoed in a message; serialising it must not fail.
    const std::string text = EstimateJson("{\"\xc3\x28\":1}");
    CHECK(json::parse(text)["ok"] == false);
  }
}

TEST_CASE("the estimate envelope", "[json]") {
  SECTION("ok") {
    const json doc = json::parse(EstimateJson(SetupToJson(ExampleMlpSetup())));
    REQUIRE(doc["ok"] == true);
    const json& e = doc["estimate"];
    CHECK(e["schemaVersion"] == kSchemaVersion);
    CHECK(e["modelStates"]["parameterCount"] == 369'405'824);
    CHECK(e["modelStates"]["totalBytes"] == 5'910'493'184);
    CHECK(e["phasePeaks"].size() == 4);
    CHECK(e["phasePeaks"][3]["phase"] == "optimizerStep");
    CHECK(e["peak"]["totalBytes"].get<std::int64_t>() == MustEstimate(ExampleMlpSetup()).peak.totalBytes);
    CHECK(e["timeline"].size() == MustEstimate(ExampleMlpSetup()).timeline.size());
    CHECK(e["gpu"]["fits"].is_boolean());
  }
  SECTION("errors") {
    const json doc = json::parse(EstimateJson(R"({"training":{"batchSize":0}})"));
    REQUIRE(doc["ok"] == false);
    CHECK(doc["errors"][0]["code"] == "invalidField");
    CHECK(doc["errors"][0]["field"] == "training.batchSize");
    CHECK(!doc["errors"][0]["message"].get<std::string>().empty());
  }
  SECTION("validate normalises the setup") {
    const json doc = json::parse(ValidateJson(R"({"training":{"batchSize":3}})"));
    REQUIRE(doc["ok"] == true);
    CHECK(doc["setup"]["training"]["batchSize"] == 3);
    CHECK(doc["setup"]["model"]["parameterCount"] == 1'500'000'000);
  }
}

TEST_CASE("options list every enum and the defaults and the examples", "[json]") {
  const json o = json::parse(OptionsJson());
  CHECK(o["precisions"].size() == NamesOf(Precision{}).size());
  CHECK(o["optimizers"].size() == NamesOf(OptimizerKind{}).size());
  CHECK(o["categories"].size() == static_cast<std::size_t>(kCategoryCount));
  CHECK(o["defaultSetup"] == json::parse(SetupToJson(DefaultSetup())));
  bool mlp = false;
  for (const auto& e : o["examples"]) mlp = mlp || e["id"] == "mlp";
  CHECK(mlp);
  for (const auto& p : NamesOf(Phase{})) {
    Phase back{};
    CHECK(FromId(p.id, back));
    CHECK(back == p.value);
  }
}

TEST_CASE("the JSON writer escapes every byte as JSON requires", "[json]") {
  // JsonWriter::Quote appends runs of plain characters at once: every byte value, alone, at
  // the start, between and at the end of plain runs, must come out as the one-character-at-a-
  // time rule writes it (RFC 8259 section 7: quote, backslash and controls escaped; the short
  // forms for \b \t \n \f \r).
  auto expected = [](std::string_view s) {
    std::string out = "\"";
    for (const char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') out += "\\\"";
      else if (c == '\\') out += "\\\\";
      else if (c == '\b') out += "\\b";
      else if (c == '\t') out += "\\t";
      else if (c == '\n') out += "\\n";
      else if (c == '\f') out += "\\f";
      else if (c == '\r') out += "\\r";
      else if (u < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\u00";
        out += kHex[u >> 4];
        out += kHex[u & 15];
      } else {
        out += c;
      }
    }
    return out + "\"";
  };
  int checked = 0;
  for (int b = 0; b < 256; ++b) {
    const std::string c(1, static_cast<char>(b));
    for (const std::string& s : {c, "layers[0]" + c, c + "tail", "ab" + c + "cd" + c + c + "ef", c + c}) {
      std::string out = "prefix";
      JsonWriter::Quote(out, s);
      INFO("byte " << b);
      CHECK(out == "prefix" + expected(s));
      ++checked;
    }
  }
  CHECK(checked == 256 * 5);
  // And through nlohmann's parser: the text reads back as the string written.
  std::string out;
  const std::string mixed = "a\"b\\c\nd\x01" "e \u00e9 f";
  JsonWriter::Quote(out, mixed);
  CHECK(json::parse(out).get<std::string>() == mixed);
}
