// Persistent model states: parameters, master weights, gradients, optimizer states.
#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

TEST_CASE("mixed precision with Adam costs 16 bytes per parameter", "[model_states]") {
  const Estimate e = MustEstimate(QuickSetup(1'500'000'000, Precision::FP16Mixed, OptimizerKind::Adam));
  const ModelStates& m = e.modelStates;
  CHECK(m.parameterCount == 1'500'000'000);
  CHECK(m.parametersBytes == 3'000'000'000);        // fp16 copy: 2 B
  CHECK(m.masterWeightsBytes == 6'000'000'000);     // fp32 master: 4 B
  CHECK(m.gradientsBytes == 3'000'000'000);         // fp16 gradients: 2 B
  CHECK(m.optimizerStatesBytes == 12'000'000'000);  // fp32 exp_avg + exp_avg_sq: 8 B
  CHECK(m.totalBytes == 24'000'000'000);
}

TEST_CASE("fp32 optimizer states: SGD none and momentum one copy and Adam two", "[model_states]") {
  const std::int64_t n = 10'000'000;
  SECTION("SGD") {
    const auto m = MustEstimate(QuickSetup(n, Precision::FP32, OptimizerKind::SGD)).modelStates;
    CHECK(m.optimizerStatesBytes == 0);
    CHECK(m.totalBytes == 8 * n);
  }
  SECTION("SGD with momentum") {
    const auto m = MustEstimate(QuickSetup(n, Precision::FP32, OptimizerKind::SGDMomentum)).modelStates;
    CHECK(m.optimizerStatesBytes == 4 * n);
    CHECK(m.totalBytes == 12 * n);
  }
  SECTION("Adam and AdamW") {
    for (auto opt : {OptimizerKind::Adam, OptimizerKind::AdamW}) {
      const auto m = MustEstimate(QuickSetup(n, Precision::FP32, opt)).modelStates;
      CHECK(m.optimizerStatesBytes == 8 * n);
      CHECK(m.totalBytes == 16 * n);
      CHECK(m.masterWeightsBytes == 0);
    }
  }
}

TEST_CASE("pure bf16 keeps everything in 2 bytes with no master copy", "[model_states]") {
  const std::int64_t n = 7'000'000;
  const auto m = MustEstimate(QuickSetup(n, Precision::BF16, OptimizerKind::Adam)).modelStates;
  CHECK(m.parametersBytes == 2 * n);
  CHECK(m.masterWeightsBytes == 0);
  CHECK(m.gradientsBytes == 2 * n);
  CHECK(m.optimizerStatesBytes == 4 * n);
  CHECK(m.totalBytes == 8 * n);
}

TEST_CASE("the 240000-1024-512-240000 MLP: why a 1.5 GB model uses 6 GB", "[model_states]") {
  const Estimate e = MustEstimate(ExampleMlpSetup());
  // 240000·1024 + 1024 + 1024·512 + 512 + 512·240000 + 240000
  CHECK(e.modelStates.parameterCount == 369'405'824);
  CHECK(e.modelStates.parametersBytes == 4LL * 369'405'824);  // ≈ 1.48 GB
  CHECK(e.modelStates.totalBytes == 4LL * 4 * 369'405'824);   // ≈ 5.9 GB
  CHECK(e.modelStates.totalBytes == 5'910'493'184);
  CHECK(e.peak.totalBytes >= e.modelStates.totalBytes);
}

TEST_CASE("model-state formulas name the count and the element size", "[model_states]") {
  const auto m = MustEstimate(QuickSetup(1'500'000'000, Precision::FP16Mixed, OptimizerKind::Adam)).modelStates;
  REQUIRE(m.rows.size() == 4);
  CHECK(m.rows[0].formula == "1,500,000,000 parameters × 2 B (fp16)");
  CHECK(m.rows[1].formula == "1,500,000,000 parameters × 4 B (fp32)");
  CHECK(m.rows[3].formula ==
        "exp_avg 1,500,000,000 + exp_avg_sq 1,500,000,000 = 3,000,000,000 values × 4 B (fp32)");
}
