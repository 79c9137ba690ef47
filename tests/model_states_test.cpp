// Persistent model states: parameters, master weights, gradients, optimizer states.
#include <catch2/catch.hpp>

#include "gpumem/finetune.hpp"
#include "gpumem/inventory.hpp"
#include "sim/trace_builder.hpp"
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

// ComputeModelStates and ModelStateSums take a tensor's sums from an alike one seen before (same
// shape, trainable flag, storage and packed size: estimate.cpp SumModelStates). Adafactor's
// factored states are row + column vectors, so weights of equal element counts but other shapes
// hold other state bytes: [1000, 6000], [2000, 3000] and [3000, 2000] are 6e6 values each, and
// their states 4 × 7,000, 4 × 5,000 and 4 × 5,000 B.
TEST_CASE("tensors of one element count but other shapes keep their own optimizer states", "[model_states]") {
  const Setup s = LayerSetup({Linear(6000, 1000), Linear(1000, 3000), Linear(3000, 2000), Linear(2000, 3000),
                              Linear(3000, 2000), Linear(2000, 6000)},
                             LossKind::MSE, 2, 1, Precision::FP32, OptimizerKind::Adafactor);
  // weights (out, in): rows out and columns in, 4 B each; biases: one fp32 value each.
  const std::int64_t weights = (1000 + 6000) + (3000 + 1000) + (2000 + 3000) + (3000 + 2000) + (2000 + 3000) +
                               (6000 + 2000);
  const std::int64_t biases = 1000 + 3000 + 2000 + 3000 + 2000 + 6000;
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.optimizerStatesBytes == 4 * (weights + biases));
  CHECK(ModelStateSums(s, *SharedInventory(s)).optimizerStatesBytes == 4 * (weights + biases));
}

// The same sums tensor by tensor, with the rules the trace allocates by, on models of many
// repeated tensors: a mixture of experts under QLoRA with 8-bit AdamW (NF4 bases frozen, fp32
// adapters, bitsandbytes' fp32 states below 4,096 values and shared maps; a vocabulary as wide
// as the model, so that the frozen embedding, which prepare_model_for_kbit_training upcasts to
// fp32, is [64, 64] like the NF4 attention projections), and Llama with LoRA and Adafactor.
TEST_CASE("model states summed by kind equal the sums tensor by tensor", "[model_states]") {
  Setup moe = TinyTransformer(Family::Llama, 4, Precision::BF16Mixed);
  moe.model.architecture.numExperts = 4;
  moe.model.architecture.vocabSize = 64;
  moe.finetune.lora = true;
  moe.finetune.r = 8;
  moe.finetune.targetModules = {"all-linear"};
  moe.finetune.quantization = Quantization::NF4;
  moe.finetune.prepareForKbitTraining = true;
  moe.training.optimizer = OptimizerKind::AdamW8bit;
  Setup lora = TinyTransformer(Family::Llama, 6, Precision::FP16Mixed);
  lora.finetune.lora = true;
  lora.finetune.r = 4;
  lora.training.optimizer = OptimizerKind::Adafactor;
  for (const Setup& s : {moe, lora}) {
    REQUIRE(Validate(s).empty());
    const std::shared_ptr<const Inventory> inventory = SharedInventory(s);
    const Regime regime = RegimeOf(s.training.precision);
    ModelStates expected;
    std::int64_t master = 0;
    for (const Tensor& p : inventory->parameters) {
      expected.parametersBytes += StoredBytes(p, regime.weights);
      if (p.trainable) {
        expected.gradientsBytes += p.Elements() * BytesPerElement(GradientTypeOf(p, regime.gradients));
        if (HasMasterCopy(p, regime.masterWeights)) master += p.Elements();
      }
      for (const StateTensor& st : OptimizerStateTensors(s.training, regime, p)) {
        expected.optimizerStatesBytes += st.elements * BytesPerElement(st.type);
      }
    }
    for (const StateTensor& st : OptimizerSharedStates(s.training, *inventory)) {
      expected.optimizerStatesBytes += st.elements * BytesPerElement(st.type);
    }
    expected.masterWeightsBytes = 4 * master;
    for (const ModelStates& m : {ModelStateSums(s, *inventory), ComputeModelStates(s, *inventory)}) {
      CHECK(m.parametersBytes == expected.parametersBytes);
      CHECK(m.gradientsBytes == expected.gradientsBytes);
      CHECK(m.masterWeightsBytes == expected.masterWeightsBytes);
      CHECK(m.optimizerStatesBytes == expected.optimizerStatesBytes);
      CHECK(m.totalBytes == expected.parametersBytes + expected.gradientsBytes + expected.masterWeightsBytes +
                                expected.optimizerStatesBytes);
    }
    CHECK(expected.optimizerStatesBytes > 0);
  }
}
