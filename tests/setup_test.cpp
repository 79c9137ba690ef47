// Defaults and validation: every bad input gets an error naming its field.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

TEST_CASE("the defaults and the examples are valid", "[setup]") {
  CHECK(Validate(DefaultSetup()).empty());
  CHECK(Validate(ExampleMlpSetup()).empty());
  CHECK(DefaultSetup().model.parameterCount == 1'500'000'000);
  CHECK(DefaultSetup().training.precision == Precision::FP16Mixed);
}

TEST_CASE("bad numbers name their field", "[setup]") {
  Setup s = DefaultSetup();
  SECTION("zero and negative counts") {
    s.training.batchSize = 0;
    s.training.sequenceLength = -5;
    s.model.parameterCount = -1;
    const auto errors = Validate(s);
    CHECK(HasErrorOn(errors, "training.batchSize"));
    CHECK(HasErrorOn(errors, "training.sequenceLength"));
    CHECK(HasErrorOn(errors, "model.parameterCount"));
  }
  SECTION("absurdly large values") {
    s.model.parameterCount = Limits::maxParameterCount + 1;
    CHECK(HasErrorOn(Validate(s), "model.parameterCount"));
    s = DefaultSetup();
    s.training.batchSize = 1'000'000;
    s.training.sequenceLength = 100'000;
    CHECK(HasErrorOn(Validate(s), "training.sequenceLength"));  // 1e11 tokens
  }
  SECTION("a combination too large to represent is refused, not overflowed") {
    s.model.parameterCount = Limits::maxParameterCount;
    s.training.batchSize = 100'000;
    s.training.sequenceLength = 100'000;
    const auto errors = Validate(s);
    REQUIRE(!errors.empty());
    CHECK(errors.front().code == ErrorCode::TooLarge);
    CHECK(!EstimateMemory(s).ok());
  }
  SECTION("GPU memory: NaN, infinity, zero, negative") {
    for (double v : {std::nan(""), std::numeric_limits<double>::infinity(), 0.0, -8.0}) {
      s.gpu.memoryGiB = v;
      CHECK(HasErrorOn(Validate(s), "gpu.memoryGiB"));
    }
  }
  SECTION("a GPU id not in the list, set in C++ as the JSON reader would refuse it") {
    s.gpu.id = "nvidia-a100-40gb";  // the list's id is nvidia-a100-40
    CHECK(HasErrorOn(Validate(s), "gpu.id"));
    CHECK(!EstimateMemory(s).ok());
    s.gpu.id = std::string("\xff\x00gpu", 5);
    const auto errors = Validate(s);
    REQUIRE(HasErrorOn(errors, "gpu.id"));
    for (const FieldError& e : errors) CHECK(e.message.find('\xff') == std::string::npos);
    s.gpu.id = "nvidia-a100-40";
    CHECK_FALSE(HasErrorOn(Validate(s), "gpu.id"));
    s.gpu.id = "";  // a custom size
    CHECK_FALSE(HasErrorOn(Validate(s), "gpu.id"));
  }
  SECTION("Adafactor has no fused implementation") {
    s.training.optimizer = OptimizerKind::Adafactor;
    s.training.optimizerImplementation = OptimizerImplementation::Fused;
    CHECK(HasErrorOn(Validate(s), "training.optimizerImplementation"));
  }
  SECTION("listed matrices cannot exceed the parameter count") {
    s.model.parameterCount = 1000;
    s.model.largestMatrices = {{100, 100}};
    CHECK(HasErrorOn(Validate(s), "model.largestMatrices"));
  }
}

TEST_CASE("layer lists are checked layer by layer", "[setup]") {
  SECTION("a width mismatch names the layer's inFeatures") {
    Setup s = LayerSetup({Linear(10, 20), Activation(LayerKind::ReLU), Linear(30, 5)}, LossKind::MSE, 1, 1,
                         Precision::FP32, OptimizerKind::SGD);
    const auto errors = Validate(s);
    REQUIRE(HasErrorOn(errors, "model.layers[2].inFeatures"));
    CHECK(errors.front().message.find("20") != std::string::npos);
  }
  SECTION("an empty list") {
    Setup s = LayerSetup({}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::SGD);
    CHECK(HasErrorOn(Validate(s), "model.layers"));
  }
  SECTION("an embedding after the first layer, an activation first, a bad dropout") {
    Setup s = LayerSetup({Activation(LayerKind::GELU), Embedding(10, 4), Dropout(1.5)}, LossKind::MSE, 1, 1,
                         Precision::FP32, OptimizerKind::SGD);
    const auto errors = Validate(s);
    CHECK(HasErrorOn(errors, "model.layers[0].type"));
    CHECK(HasErrorOn(errors, "model.layers[1].type"));
    CHECK(HasErrorOn(errors, "model.layers[2].p"));
  }
  SECTION("zero features") {
    Setup s = LayerSetup({Linear(0, 20)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::SGD);
    CHECK(HasErrorOn(Validate(s), "model.layers[0].inFeatures"));
  }
  SECTION("an invalid setup is never estimated") {
    Setup s = LayerSetup({Linear(0, 20)}, LossKind::MSE, 1, 1, Precision::FP32, OptimizerKind::SGD);
    const EstimateResult r = EstimateMemory(s);
    CHECK(!r.ok());
    CHECK(r.estimate.timeline.empty());
  }
}

TEST_CASE("OutputWidth follows the layers", "[setup]") {
  const std::vector<LayerDef> layers = {Embedding(100, 16), Dropout(0.1), Linear(16, 8), Activation(LayerKind::GELU)};
  CHECK(OutputWidth(layers, 0) == 16);
  CHECK(OutputWidth(layers, 1) == 16);
  CHECK(OutputWidth(layers, 2) == 8);
  CHECK(OutputWidth(layers, 3) == 8);
}
