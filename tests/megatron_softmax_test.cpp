// Megatron's fused scale-mask-softmax (training.maskedSoftmaxFusion;
// megatron/core/fusions/fused_softmax.py FusedScaleMaskSoftmax): where is_kernel_available
// holds, one kernel keeps the 16-bit probabilities (ScaledUpperTriangMaskedSoftmax saves only its
// output) instead of the eager ops' fp32 softmax; elsewhere the unfused fallback, as before.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "sim/blocks/blocks.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// The functional test gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files: eager attention,
// hidden and attention dropout 0.1.
Setup DistOptimizerRun() {
  Setup s = MegatronGpt12x512();
  s.model.architecture.hiddenDropout = 0.1;
  s.model.architecture.attentionDropout = 0.1;
  s.training.attention = AttentionImplementation::Eager;
  return s;
}

bool Noted(const Estimate& e, const char* text) {
  return std::any_of(e.notes.begin(), e.notes.end(), [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

}  // namespace

TEST_CASE("Megatron softmax: is_kernel_available as Megatron and apex write it", "[megatron-softmax]") {
  using blocks::MaskedSoftmaxKernelAvailable;
  CHECK(MaskedSoftmaxKernelAvailable(4, 8, 1024, 1024, DType::BF16));
  CHECK(MaskedSoftmaxKernelAvailable(4, 8, 4096, 4096, DType::FP16));
  CHECK_FALSE(MaskedSoftmaxKernelAvailable(4, 8, 1024, 1024, DType::FP32));  // input_in_float16
  CHECK_FALSE(MaskedSoftmaxKernelAvailable(1, 8, 8192, 8192, DType::BF16));  // sk ≤ 4096
  CHECK_FALSE(MaskedSoftmaxKernelAvailable(4, 8, 16, 16, DType::BF16));      // 16 < sk
  CHECK_FALSE(MaskedSoftmaxKernelAvailable(4, 8, 1022, 1022, DType::BF16));  // sq, sk % 4
  CHECK_FALSE(MaskedSoftmaxKernelAvailable(1, 2, 1024, 1024, DType::BF16));  // b·np % 4
  // get_batch_per_block: sk = 20 → next power 32, warp 32, 4 warps × 2 rows = 8 rows a block;
  // sk = 1024 → 4 warps × 1 row = 4.
  CHECK_FALSE(MaskedSoftmaxKernelAvailable(1, 4, 20, 20, DType::BF16));  // 4 % 8
  CHECK(MaskedSoftmaxKernelAvailable(2, 4, 20, 20, DType::BF16));        // 8 % 8
  CHECK(MaskedSoftmaxKernelAvailable(1, 4, 1024, 1024, DType::BF16));    // 4 % 4
}

TEST_CASE("Megatron softmax: each layer keeps its probabilities in bf16 not fp32", "[megatron-softmax]") {
  Setup s = DistOptimizerRun();
  const Estimate eager = MustEstimate(s);
  s.training.maskedSoftmaxFusion = true;
  const Estimate fused = MustEstimate(s);
  // Per layer the eager ops save softmax's fp32 output [4, 8, 1024, 1024] (134,217,728 B); the
  // kernel saves its bf16 output (67,108,864 B). The dropout mask and the dropped probabilities
  // are the same. 12 layers: 805,306,368 B fewer saved activations at the end of forward.
  CHECK(BytesIn(eager.forwardEnd, Category::Activations) - BytesIn(fused.forwardEnd, Category::Activations) ==
        12LL * 67'108'864);
  CHECK(fused.peak.totalBytes < eager.peak.totalBytes);
  CHECK(fused.modelStates.totalBytes == eager.modelStates.totalBytes);
  CHECK(Noted(fused, "one kernel keeps the 16-bit probabilities"));
}

TEST_CASE("Megatron softmax: where the kernel is not available the unfused path runs", "[megatron-softmax]") {
  Setup s = DistOptimizerRun();
  s.model.architecture.numLayers = 2;
  s.model.architecture.maxPositionEmbeddings = 8192;
  s.training.batchSize = 1;
  s.training.sequenceLength = 8192;  // sk > 4096
  const Estimate eager = MustEstimate(s);
  s.training.maskedSoftmaxFusion = true;
  const Estimate fallback = MustEstimate(s);
  CHECK(fallback.peak.totalBytes == eager.peak.totalBytes);
  CHECK(BytesIn(fallback.forwardEnd, Category::Activations) == BytesIn(eager.forwardEnd, Category::Activations));
  CHECK(Noted(fallback, "falls back to the unfused softmax"));
  // Tensor parallelism splits the heads: 8 / 4 = 2 heads a rank, b·np = 2 is not a multiple of 4.
  Setup tp = DistOptimizerRun();
  tp.model.architecture.numLayers = 2;
  tp.training.batchSize = 1;
  tp.parallel.tensorParallel = 4;
  const Estimate tpEager = MustEstimate(tp);
  tp.training.maskedSoftmaxFusion = true;
  CHECK(MustEstimate(tp).peak.totalBytes == tpEager.peak.totalBytes);
}

TEST_CASE("Megatron softmax: validated JSON and imported", "[megatron-softmax]") {
  CHECK_FALSE(DefaultSetup().training.maskedSoftmaxFusion);
  Setup llama = DefaultSetup();
  llama.model.kind = ModelKind::Transformer;
  llama.model.architecture = DefaultArchitecture(Family::Llama);
  llama.training.attention = AttentionImplementation::Eager;
  llama.training.maskedSoftmaxFusion = true;
  CHECK(HasErrorOn(Validate(llama), "training.maskedSoftmaxFusion"));
  Setup sdpa = DistOptimizerRun();
  sdpa.training.attention = AttentionImplementation::SDPA;
  sdpa.training.maskedSoftmaxFusion = true;
  CHECK(HasErrorOn(Validate(sdpa), "training.maskedSoftmaxFusion"));
  Setup quick = DefaultSetup();
  quick.model.kind = ModelKind::ParameterCount;
  quick.training.maskedSoftmaxFusion = true;
  CHECK(HasErrorOn(Validate(quick), "training.maskedSoftmaxFusion"));

  const SetupParseResult parsed = ParseSetupJson(R"({"training": {"maskedSoftmaxFusion": true}})");
  REQUIRE(parsed.ok());
  CHECK(parsed.setup.training.maskedSoftmaxFusion);
  CHECK(SetupToJson(parsed.setup).find(R"("maskedSoftmaxFusion":true)") != std::string::npos);
  CHECK(HasErrorOn(ParseSetupJson(R"({"training": {"maskedSoftmaxFusion": "yes"}})").errors, "training.maskedSoftmaxFusion"));

  const Setup base = DistOptimizerRun();
  CHECK(ImportMegatronArguments("--bf16", base).setup.training.maskedSoftmaxFusion);
  CHECK_FALSE(ImportMegatronArguments("--bf16 --no-masked-softmax-fusion", base).setup.training.maskedSoftmaxFusion);
  Setup sdpaBase = base;
  sdpaBase.training.attention = AttentionImplementation::SDPA;
  CHECK_FALSE(ImportMegatronArguments("--bf16", sdpaBase).setup.training.maskedSoftmaxFusion);
}
