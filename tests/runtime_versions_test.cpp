// runtime.pytorchVersion / cudaVersion / lazyModuleLoading: parsing, validation, and the
// version-dependent rules they select (docs/device.md, "Versions").
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"

using namespace gpumem;

namespace {

bool HasError(const std::vector<FieldError>& errors, const std::string& field) {
  return std::any_of(errors.begin(), errors.end(), [&](const FieldError& e) { return e.field == field; });
}

// BERT-base, eager attention, fp32, batch 2 × 128: the classifier's logits are [2, 2].
Setup BertEager(const char* pytorchVersion) {
  Setup s = DefaultSetup();
  const Preset* bert = FindPreset("bert-base-uncased");
  REQUIRE(bert != nullptr);
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = bert->architecture;
  s.training.attention = AttentionImplementation::Eager;
  s.training.precision = Precision::FP32;
  s.training.batchSize = 2;
  s.training.sequenceLength = 128;
  s.runtime.pytorchVersion = pytorchVersion;
  return s;
}

}  // namespace

TEST_CASE("versions read as major.minor with an optional patch and local part", "[runtime]") {
  int major = 0;
  int minor = 0;
  CHECK(ParseMajorMinor("2.5", major, minor));
  CHECK((major == 2 && minor == 5));
  CHECK(ParseMajorMinor("1.10", major, minor));
  CHECK((major == 1 && minor == 10));
  CHECK(ParseMajorMinor("2.5.1+cu124", major, minor));
  CHECK((major == 2 && minor == 5));
  CHECK(ParseMajorMinor("12.4", major, minor));
  CHECK((major == 12 && minor == 4));
  for (const char* bad : {"", "2", "2.", ".5", "a.b", "2.5x", "12345.1", "1.99999", "-1.2", " 2.5"}) {
    INFO(bad);
    CHECK_FALSE(ParseMajorMinor(bad, major, minor));
  }
}

TEST_CASE("runtime versions are validated by the labels people see", "[runtime]") {
  Setup s = DefaultSetup();
  CHECK(Validate(s).empty());
  s.runtime.pytorchVersion = "latest";
  s.runtime.cudaVersion = "8.0";
  const auto errors = Validate(s);
  CHECK(HasError(errors, "runtime.pytorchVersion"));
  CHECK(HasError(errors, "runtime.cudaVersion"));

  // F.scaled_dot_product_attention needs PyTorch 2.0.
  Setup old = DefaultSetup();
  old.training.attention = AttentionImplementation::SDPA;
  old.runtime.pytorchVersion = "1.13";
  CHECK(HasError(Validate(old), "training.attention"));
  old.training.attention = AttentionImplementation::Eager;
  CHECK(Validate(old).empty());

  // JSON: versions are strings (1.10 as a number would read 1.1).
  auto parsed = ParseSetupJson(R"({"runtime":{"pytorchVersion":1.1}})");
  REQUIRE_FALSE(parsed.ok());
  CHECK(HasError(parsed.errors, "runtime.pytorchVersion"));
  auto good = ParseSetupJson(R"({"runtime":{"pytorchVersion":"1.10","cudaVersion":"11.2","lazyModuleLoading":false}})");
  REQUIRE(good.ok());
  CHECK(good.setup.runtime.pytorchVersion == "1.10");
  CHECK(good.setup.runtime.cudaVersion == "11.2");
  CHECK_FALSE(good.setup.runtime.lazyModuleLoading);
  // Written back and read again, unchanged.
  auto again = ParseSetupJson(SetupToJson(good.setup));
  REQUIRE(again.ok());
  CHECK(again.setup.runtime.pytorchVersion == "1.10");
}

TEST_CASE("before PyTorch 1.11 softmax and log_softmax keep their input for backward", "[runtime]") {
  // pytorch/pytorch#64000, fixed by PR #65242 (first released in 1.11): derivatives.yaml passed
  // `self` to _softmax_backward_data, so the fp32 masked scores of every layer stayed alive, and
  // log_softmax kept the classifier's logits.
  const EstimateResult current = EstimateMemory(BertEager("2.5"));
  const EstimateResult old = EstimateMemory(BertEager("1.10"));
  REQUIRE(current.ok());
  REQUIRE(old.ok());
  const std::int64_t layers = 12, b = 2, heads = 12, s = 128, labels = 2;
  const std::int64_t scores = layers * b * heads * s * s * 4;  // 18,874,368 B
  const std::int64_t logits = b * labels * 4;                  // 16 B
  CHECK(old.estimate.forwardEnd.totalBytes - current.estimate.forwardEnd.totalBytes == scores + logits);
  // Nothing else changes: the model states are the same bytes.
  CHECK(old.estimate.modelStates.totalBytes == current.estimate.modelStates.totalBytes);
  // From 1.11 on, the current rule.
  const EstimateResult v111 = EstimateMemory(BertEager("1.11"));
  REQUIRE(v111.ok());
  CHECK(v111.estimate.forwardEnd.totalBytes == current.estimate.forwardEnd.totalBytes);
}

TEST_CASE("the CUDA version and lazy loading choose the context default", "[runtime]") {
  Setup s = DefaultSetup();
  s.gpu.id = "nvidia-a100-80";
  auto context = [&](const char* cuda, bool lazy) {
    s.runtime.cudaVersion = cuda;
    s.runtime.lazyModuleLoading = lazy;
    const EstimateResult r = EstimateMemory(s);
    REQUIRE(r.ok());
    return r.estimate.device.contextBytes;
  };
  constexpr std::int64_t MiB = 1024 * 1024;
  CHECK(context("12.4", true) == 574 * MiB);    // lazy loading (CUDA ≥ 11.7): 426 + 148 MiB of a step's kernels
  CHECK(context("12.4", false) == 1220 * MiB);  // CUDA_MODULE_LOADING=EAGER: 616 + 604 MiB
  CHECK(context("11.2", true) == 1024 * MiB);  // before 11.7 every kernel image loads at start
}

TEST_CASE("PyTorch before 2.0 has one 4 MiB cuBLAS workspace per handle", "[runtime]") {
  Setup s = DefaultSetup();
  s.gpu.id = "nvidia-h100-sxm";
  s.training.attention = AttentionImplementation::Eager;
  const EstimateResult current = EstimateMemory(s);
  s.runtime.pytorchVersion = "1.13";
  const EstimateResult old = EstimateMemory(s);
  REQUIRE(current.ok());
  REQUIRE(old.ok());
  constexpr std::int64_t KiB = 1024;
  // 2 handles × (cuBLAS + cuBLASLt 1024 KiB): ":4096:8" on Hopper since 2.0, one 4096 KiB before.
  CHECK(current.estimate.device.workspaceBytes == 2 * (4096 * KiB * 8 + 1024 * KiB));
  CHECK(old.estimate.device.workspaceBytes == 2 * (4096 * KiB + 1024 * KiB));
}
