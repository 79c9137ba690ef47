// Optimizer states (Adafactor's factoring) and the temporaries of the step.
#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup AdafactorOnMatrix(bool beta1) {
  Setup s = QuickSetup(1024LL * 240000, Precision::FP32, OptimizerKind::Adafactor);
  s.model.largestMatrices = {{1024, 240000}};
  s.training.adafactorBeta1 = beta1;
  return s;
}

std::int64_t PeakIntermediates(const Estimate& e) {
  return BytesIn(e.phasePeaks[static_cast<int>(Phase::OptimizerStep)], Category::OptimizerIntermediates);
}

}  // namespace

TEST_CASE("Adafactor factors the second moment of a matrix", "[optimizer]") {
  SECTION("a 1024 × 240000 weight keeps 1024 + 240000 values") {
    const auto m = MustEstimate(AdafactorOnMatrix(false)).modelStates;
    CHECK(m.optimizerStatesBytes == (1024 + 240000) * 4);
  }
  SECTION("β1 adds a full first moment") {
    const auto m = MustEstimate(AdafactorOnMatrix(true)).modelStates;
    CHECK(m.optimizerStatesBytes == (1024 + 240000 + 1024LL * 240000) * 4);
  }
  SECTION("a vector keeps its full second moment") {
    Setup s = AdafactorOnMatrix(false);
    s.model.parameterCount += 5000;  // the rest is one vector of 5000
    const auto m = MustEstimate(s).modelStates;
    CHECK(m.optimizerStatesBytes == (1024 + 240000 + 5000) * 4);
  }
  SECTION("layer lists: linear weights factored, biases full") {
    Setup s = LayerSetup({Linear(300, 200), Activation(LayerKind::ReLU), Linear(200, 10, false)},
                         LossKind::MSE, 4, 1, Precision::FP32, OptimizerKind::Adafactor);
    const auto m = MustEstimate(s).modelStates;
    CHECK(m.optimizerStatesBytes == ((200 + 300) + 200 + (10 + 200)) * 4);
  }
}

TEST_CASE("optimizer intermediates depend on the implementation", "[optimizer]") {
  const std::int64_t n = 50'000'000;
  Setup s = QuickSetup(n, Precision::FP32, OptimizerKind::Adam);
  s.model.largestMatrices = {{5000, 4000}};  // largest tensor: 20,000,000 elements
  SECTION("foreach Adam: one state-sized copy of every parameter (_foreach_sqrt)") {
    s.training.optimizerImplementation = OptimizerImplementation::ForEach;
    CHECK(PeakIntermediates(MustEstimate(s)) == 4 * n);
  }
  SECTION("per-parameter Adam: two copies of the largest tensor") {
    s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
    // The rest (30,000,000) is larger than the listed matrix, so it is the largest tensor.
    CHECK(PeakIntermediates(MustEstimate(s)) == 2 * 4 * 30'000'000);
  }
  SECTION("fused Adam: none") {
    s.training.optimizerImplementation = OptimizerImplementation::Fused;
    CHECK(PeakIntermediates(MustEstimate(s)) == 0);
  }
  SECTION("SGD and momentum step in place") {
    s.training.optimizer = OptimizerKind::SGDMomentum;
    CHECK(PeakIntermediates(MustEstimate(s)) == 0);
  }
  SECTION("mixed precision adds the fp32 upcast of the gradients") {
    s.training.precision = Precision::BF16Mixed;
    CHECK(PeakIntermediates(MustEstimate(s)) == 4 * n + 4 * n);
  }
}

TEST_CASE("optimizer states appear in step 1 and are held in step 2's forward", "[optimizer]") {
  const std::int64_t n = 1'000'000;
  Setup s = QuickSetup(n, Precision::FP32, OptimizerKind::Adam);
  const Estimate e = MustEstimate(s);
  std::int64_t statesBeforeStep1 = -1, statesInStep2Forward = 0, total = 0, states = 0;
  for (const auto& p : e.timeline) {
    if (p.category == Category::OptimizerStates) states += p.deltaBytes;
    if (p.step == 1 && p.phase == Phase::Backward) statesBeforeStep1 = states;
    if (p.step == 2 && p.phase == Phase::Forward) statesInStep2Forward = states;
    total = p.totalBytes;
  }
  CHECK(statesBeforeStep1 == 0);
  CHECK(statesInStep2Forward == 8 * n);
  // After step 2 with set_to_none: parameters and states remain.
  CHECK(total == 4 * n + 8 * n);
}
