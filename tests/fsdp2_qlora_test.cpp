// torchtune's QLoRA: base weights as torchao NF4Tensor (finetune.quantLayout torchaoNf4), on one
// GPU and under FSDP2 fully_shard (docs/parallel.md, "Fine-tuning on many GPUs"). Every figure is
// counted by hand from torchao/dtypes/nf4tensor.py (NF4Tensor.from_tensor, nf4_split,
// fsdp_pre_all_gather, LinearNF4, get_original_weight) on a small Llama whose quantized weights
// hold a multiple of 16,384 values (to_nf4's block 64 × scaler block 256).
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// test_support.hpp's TorchtuneQloraLlama (its vocabulary of 1,001 padded on dim 0 under FSDP2),
// on `world` ranks of FSDP2.
Setup TorchtuneQlora(std::int64_t world) {
  Setup s = TorchtuneQloraLlama();
  if (world > 1) {
    s.parallel.dataParallel = world;
    s.parallel.fsdp = FsdpMode::FullyShard;
  }
  return s;
}

// Index of the first event at or after `from` (init events skipped) whose label contains
// `label`: allocations only unless `frees`; −1 if none.
long FirstIndex(const Estimate& e, const std::string& label, std::size_t from = 0, bool frees = false) {
  for (std::size_t i = from; i < e.timeline.size(); ++i) {
    const TimelinePoint& p = e.timeline[i];
    if (p.phase == Phase::Init) continue;
    if ((frees || p.deltaBytes > 0) && p.label.find(label) != std::string::npos) return static_cast<long>(i);
  }
  return -1;
}

// Per NF4Tensor of n values in bf16 (w = 2): quantized_data n/2 + quantized_scalers n/64 (int8)
// + quantization_factor n/16,384 × 2, sharded; scaler_mean (2) + nf4 table (16 × 2) = 34, whole.
constexpr std::int64_t kSquareNf4 = 32768 + 1024 + 4 * 2;  // [256, 256]: 33,800 B
constexpr std::int64_t kWideNf4 = 65536 + 2048 + 8 * 2;    // [512, 256] or [256, 512]: 67,600 B
constexpr std::int64_t kBlockNf4 = 4 * kSquareNf4 + 3 * kWideNf4;  // 338,000 B
constexpr std::int64_t kMetadata = 14 * 34;                         // 7 weights × 2 blocks: 476 B

}  // namespace

TEST_CASE("torchao NF4Tensor bytes by hand and against bitsandbytes' layouts", "[fsdp2-qlora]") {
  CHECK(TorchaoNf4ShardedBytes(65536, 2) == kSquareNf4);
  CHECK(TorchaoNf4ShardedBytes(131072, 2) == kWideNf4);
  CHECK(TorchaoNf4MetadataBytes(2) == 34);
  // bitsandbytes' NF4 of the same weight: 32,768 + 1,024 fp32 absmax (4,096) + fp32 code (64) =
  // 36,928; with double quant 32,768 + 1,024 + 4 + 4 × 4 + 64 = 33,876: both differ from torchao's
  // 33,834 (a bf16 factor per 256 scalers, a bf16 mean and a bf16 table).
  CHECK(Nf4WeightBytes(65536, false) == 36928);
  CHECK(Nf4WeightBytes(65536, true) == 33876);
  CHECK(kSquareNf4 + 34 == 33834);

  // One GPU: embed_tokens and lm_head [1,001, 256] bf16 (512,512 B each), norms 5 × 256 × 2 =
  // 2,560, adapters 4 × (2,048 + 2,048) × 2 = 32,768, NF4Tensors 2 × 338,000 + 476.
  const Setup s = TorchtuneQlora(1);
  REQUIRE(Validate(s).empty());
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == 2 * 512512 + 2560 + 32768 + 2 * kBlockNf4 + kMetadata);
  CHECK(e.modelStates.gradientsBytes == 16384 * 2);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * 16384 * 2);
  // The same setup with bitsandbytes' double-quantized layout holds other bytes.
  Setup bnb = s;
  bnb.finetune.quantLayout = QuantLayout::Bitsandbytes;
  bnb.finetune.doubleQuant = true;
  REQUIRE(Validate(bnb).empty());
  CHECK(MustEstimate(bnb).modelStates.parametersBytes != e.modelStates.parametersBytes);
}

TEST_CASE("torchao LinearNF4: the dequantization transient in forward and backward", "[fsdp2-qlora]") {
  const Setup s = TorchtuneQlora(1);
  const Estimate e = MustEstimateLabelled(s);
  // q_proj of block 0, n = 65,536: get_original_weight's locals, then the stacked weight.
  const long first = FirstIndex(e, "q_proj first_elements (int64)");
  const long second = FirstIndex(e, "q_proj second_elements (int64)");
  const long scaled = FirstIndex(e, "q_proj scaled_second");
  const long stacked = FirstIndex(e, "q_proj dequantized weight (torch.stack)");
  REQUIRE(first >= 0);
  REQUIRE(second > first);
  REQUIRE(scaled > second);
  REQUIRE(stacked > scaled);
  CHECK(e.timeline[static_cast<std::size_t>(first)].deltaBytes == 32768 * 8);   // int64 [n/2]
  CHECK(e.timeline[static_cast<std::size_t>(scaled)].deltaBytes == 32768 * 2);  // bf16 [n/2]
  CHECK(e.timeline[static_cast<std::size_t>(stacked)].deltaBytes == 65536 * 2); // bf16 [256, 256]
  // At the stack every local is alive: 2 × 262,144 (int64 codes) + 4 × 65,536 (lookups and
  // scaled halves) + 2,048 (scalers) + 131,072 (the stack) = 919,552 B above what came before the
  // first shift (uint8 [n/2], itself freed once widened).
  const long shift = FirstIndex(e, "q_proj quantized_data >> 4");
  REQUIRE(shift >= 0);
  REQUIRE(shift < first);
  const std::int64_t before = e.timeline[static_cast<std::size_t>(shift)].totalBytes -
                              e.timeline[static_cast<std::size_t>(shift)].deltaBytes;
  CHECK(e.timeline[static_cast<std::size_t>(stacked)].totalBytes - before == 919552);
  // Backward: the locals again (one temporary of the same bytes minus the stack: 788,480), the
  // weight (131,072), the locals freed before the input's gradient is made. Block 1's q_proj:
  // block 0's projections read the frozen embedding's output, which needs no gradient, so their
  // LinearNF4 backward never runs (no dequantization there).
  const long locals = FirstIndex(e, "layers.1 attention q_proj backward: get_original_weight locals (backward)");
  CHECK(FirstIndex(e, "layers.0 attention q_proj backward: get_original_weight") == -1);
  REQUIRE(locals >= 0);
  CHECK(e.timeline[static_cast<std::size_t>(locals)].deltaBytes == 788480);
  const std::size_t after = static_cast<std::size_t>(locals);
  CHECK(e.timeline[after + 1].deltaBytes == 131072);
  CHECK(e.timeline[after + 2].deltaBytes == -788480);
  CHECK(e.timeline[after + 3].deltaBytes > 0);  // then the input's gradient
  // No input cast (bitsandbytes' Linear4bit casts to the compute dtype) and no result.clone().
  CHECK(FirstIndex(e, "result.clone()") == -1);
}

TEST_CASE("FSDP2 QLoRA on 2 ranks: NF4Tensor shards and adapters by hand", "[fsdp2-qlora]") {
  const Setup s = TorchtuneQlora(2);
  REQUIRE(Validate(s).empty());
  // Non-NF4 shards, ⌈rows / 2⌉ rows: norms 2 × 128, lora_A [8, 256] → 4 × 256 = 1,024, lora_B
  // [256, 8] → 128 × 8 = 1,024, two targets: 4,352 a block. Root: embed_tokens and lm_head →
  // 501 × 256 = 128,256 each (one row of padding) + final norm 128 = 256,640.
  const std::int64_t shards = 256640 + 2 * 4352;  // 265,344 bf16
  const ShardPlan plan = PlanShards(s, BuildInventory(s));
  CHECK(plan.partitionElements == shards);
  CHECK(plan.quantShardBytes == 2 * kBlockNf4 / 2);  // nf4_split: half of each inner tensor
  CHECK(plan.gradientShardElements == 2 * 4096);
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == shards * 2 + kBlockNf4 + kMetadata);  // 869,164 B
  CHECK(e.modelStates.gradientsBytes == 8192 * 2);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * 8192 * 2);
}

TEST_CASE("FSDP2 QLoRA on 4 ranks: NF4Tensor shards and adapters by hand", "[fsdp2-qlora]") {
  const Setup s = TorchtuneQlora(4);
  REQUIRE(Validate(s).empty());
  // Norms 2 × 64; lora_A → 2 × 256 = 512, lora_B → 64 × 8 = 512; 2 targets: 2,176 a block.
  // Root: ⌈1,001 / 4⌉ = 251 rows × 256 = 64,256 twice (3 rows of padding) + 64 = 128,576.
  const std::int64_t shards = 128576 + 2 * 2176;  // 132,928
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == shards * 2 + 2 * kBlockNf4 / 4 + kMetadata);  // 435,332 B
  CHECK(e.modelStates.gradientsBytes == 4096 * 2);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * 4096 * 2);
}

TEST_CASE("FSDP2 QLoRA: one block's all-gather carries the NF4 codes and scalers", "[fsdp2-qlora]") {
  const Setup s = TorchtuneQlora(2);
  const Estimate e = MustEstimateLabelled(s);
  // fsdp_pre_all_gather hands (quantized_scalers, quantization_factor, quantized_data) to the
  // all-gather, viewed as uint8 beside the bf16 norms and adapters: 338,000 B of NF4 + (2 × 256
  // + 2 × (2,048 + 2,048)) = 8,704 bf16 values.
  const long gather = FirstIndex(e, "all-gather of layers.1");
  REQUIRE(gather >= 0);
  CHECK(e.timeline[static_cast<std::size_t>(gather)].deltaBytes == kBlockNf4 + 8704 * 2);
  // Gathered again in backward (resharded after forward), where each NF4 linear dequantizes again.
  const long again = FirstIndex(e, "all-gather of layers.1", static_cast<std::size_t>(gather) + 1);
  REQUIRE(again >= 0);
  const long locals = FirstIndex(e, "get_original_weight locals (backward)", static_cast<std::size_t>(again));
  CHECK(locals > again);
  // The frozen NF4 weights get no gradient; the adapters' reduce-scatter input is theirs only
  // (2 × 4,096 padded elements).
  CHECK(FirstIndex(e, "q_proj.base_layer.weight.grad") == -1);
  CHECK(e.timeline[static_cast<std::size_t>(FirstIndex(e, "reduce-scatter input of layers.1"))].deltaBytes == 8192 * 2);
}

TEST_CASE("torchao NF4 layout: what is refused is refused by its field", "[fsdp2-qlora]") {
  auto errorsOf = [](std::int64_t world, auto change) {
    Setup s = TorchtuneQlora(world);
    change(s);
    return Validate(s);
  };
  CHECK(errorsOf(1, [](Setup&) {}).empty());
  CHECK(errorsOf(2, [](Setup&) {}).empty());
  // 8 ranks: the [256, 256] weights have 4 quantization factors, which nf4_split cannot cut in 8.
  CHECK(HasErrorOn(errorsOf(8, [](Setup&) {}), "parallel.dataParallel"));
  // Odd rows: an intermediate of 1,024 + 64 gives [1,088, 256] (17 factors): not even over 2.
  CHECK(HasErrorOn(errorsOf(2, [](Setup& s) { s.model.architecture.intermediateSize = 1088; }), "parallel.dataParallel"));
  // A weight that is not a multiple of 16,384 values (to_nf4 asserts it): hidden 64.
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) {
                     s.model.architecture.hiddenSize = 64;
                     s.model.architecture.intermediateSize = 128;
                   }),
                   "finetune.quantLayout"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.finetune.quantization = Quantization::FP4; }), "finetune.quantLayout"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.finetune.doubleQuant = true; }), "finetune.doubleQuant"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.finetune.quantStorage = DType::BF16; }), "finetune.quantStorage"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.finetune.computeDType = DType::FP32; }), "finetune.computeDType"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.training.precision = Precision::BF16Mixed; }), "finetune.quantLayout"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.finetune.useDora = true; }), "finetune.useDora"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.finetune.prepareForKbitTraining = true; }), "finetune.prepareForKbitTraining"));
  // Many GPUs without FSDP2 (torchtune shards QLoRA with fully_shard only).
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) { s.parallel.dataParallel = 2; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf(1, [](Setup& s) {
                     s.parallel.dataParallel = 2;
                     s.parallel.zeroStage = 3;
                   }),
                   "parallel.fsdp"));
  // bitsandbytes' 4-bit weights under FSDP2 stay refused; CPUOffloadPolicy offloads all or nothing.
  CHECK(HasErrorOn(errorsOf(2, [](Setup& s) { s.finetune.quantLayout = QuantLayout::Bitsandbytes; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf(2, [](Setup& s) { s.parallel.offload = OffloadKind::Optimizer; }), "parallel.offload"));
  CHECK(errorsOf(2, [](Setup& s) { s.parallel.offload = OffloadKind::OptimizerAndParameters; }).empty());
}

namespace {
// The small Llama of tests/fsdp2_finetune_test.cpp (hidden 64, vocabulary 1,001, LoRA r 8 on q/v,
// bf16) with torchtune's fsdp_cpu_offload: True (CPUOffloadPolicy: parameters, gradients and the
// optimizer on the host).
Setup OffloadedLora(std::int64_t world) {
  Setup s = TinyTransformer(Family::Llama, 2, Precision::BF16);
  s.model.architecture.vocabSize = 1001;
  s.finetune.lora = true;
  s.finetune.r = 8;
  s.finetune.adapterDType = AdapterDType::Weights;
  s.parallel.dataParallel = world;
  s.parallel.fsdp = FsdpMode::FullyShard;
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  return s;
}

std::int64_t HostRowBytes(const Estimate& e, const std::string& label) {
  for (const HostRow& r : e.host.rows) if (r.label == label) return r.bytes;
  return -1;
}
}  // namespace

TEST_CASE("FSDP2 CPUOffloadPolicy with LoRA: frozen and adapter shards on the host and adapters' gradients and states only", "[fsdp2-qlora]") {
  const Setup s = OffloadedLora(2);
  REQUIRE(Validate(s).empty());
  const Estimate e = MustEstimateLabelled(s);
  // Nothing of the model states stays on the GPU.
  CHECK(e.modelStates.parametersBytes == 0);
  CHECK(e.modelStates.gradientsBytes == 0);
  CHECK(e.modelStates.optimizerStatesBytes == 0);
  // The host, by hand (tests/fsdp2_finetune_test.cpp's counts): 107,296 bf16 shard elements,
  // frozen and adapters; gradients of the 2,048 adapter shard elements only; AdamW's two bf16
  // states on those.
  CHECK(HostRowBytes(e, "parameter shards") == 107296 * 2);
  CHECK(HostRowBytes(e, "gradient shards") == 2048 * 2);
  CHECK(HostRowBytes(e, "optimizer states") == 2 * 2048 * 2);
  CHECK(e.host.rankBytes == 107296 * 2 + 2048 * 2 + 2 * 2048 * 2);
  // Still gathered to the GPU per block, frozen base with the adapters (43,136 × 2 B), and the
  // reduced gradient shard (1,024 × 2 B) let go as it is copied to the host.
  const long gather = FirstIndex(e, "all-gather of layers.1");
  REQUIRE(gather >= 0);
  CHECK(e.timeline[static_cast<std::size_t>(gather)].deltaBytes == 43136 * 2);
  const long shard = FirstIndex(e, "FSDP2 reduce-scatter of layers.1");
  REQUIRE(shard >= 0);
  CHECK(e.timeline[static_cast<std::size_t>(shard)].deltaBytes == 1024 * 2);
  const long copied = FirstIndex(e, "gradient shard of layers.1 copied to the host", static_cast<std::size_t>(shard), true);
  REQUIRE(copied > shard);
  CHECK(e.timeline[static_cast<std::size_t>(copied)].deltaBytes == -1024 * 2);
  // No optimizer state is made on the GPU.
  for (const TimelinePoint& p : e.timeline) CHECK(p.category != Category::OptimizerStates);
}

TEST_CASE("FSDP2 CPUOffloadPolicy with torchao NF4Tensor weights: the NF4 shards go to the host whole", "[fsdp2-qlora]") {
  Setup s = TorchtuneQlora(2);
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  REQUIRE(Validate(s).empty());
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == 0);  // the scaler means and tables travel with their shards
  CHECK(HostRowBytes(e, "NF4Tensor shards") == kBlockNf4 + kMetadata);  // 2 blocks × 338,000 / 2 + 476
  CHECK(HostRowBytes(e, "parameter shards") == (256640 + 2 * 4352) * 2);
  CHECK(HostRowBytes(e, "gradient shards") == 8192 * 2);
  CHECK(HostRowBytes(e, "optimizer states") == 2 * 8192 * 2);
  // The optimizer alone is no FSDP2 option.
  s.parallel.offload = OffloadKind::Optimizer;
  CHECK(HasErrorOn(Validate(s), "parallel.offload"));
}
