// PEFT's FSDP wrap policy (parallel.fsdpWrapAdaptersApart; docs/parallel.md, "Fine-tuning on many
// GPUs"): peft/utils/other.py fsdp_auto_wrap_policy makes every lora_A / lora_B Linear an FSDP unit
// of its own, so the blocks' FlatParameters hold frozen weights only and get no gradient. Every
// figure is a hand count on a small Llama.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// Hidden 64, 4 heads, intermediate 128, 2 blocks, vocabulary 1,000, untied head. LoRA r 8 on
// PEFT's Llama defaults q_proj and v_proj (64 → 64): A [8, 64] and B [64, 8], 512 elements each,
// 4 adapter matrices per block, 8 in all (4,096 elements).
// Block: 4 × 64·64 + 3 × 64·128 + 2 norms × 64 = 41,088 frozen elements (+ 2,048 adapters).
// Root: embeddings 64,000 + final norm 64 + lm_head 64,000 = 128,064, all frozen.
constexpr std::int64_t kAdapter = 512, kAdapters = 8, kBlockFrozen = 41088, kBlockWithAdapters = 43136,
                       kRoot = 128064;

Setup TinyLlamaLoraFsdp(std::int64_t ranks, bool apart) {
  // bf16 mixed: FSDP MixedPrecision, fp32 shards and bf16 gathers.
  Setup s = TinyTransformer(Family::Llama, 2, Precision::BF16Mixed);
  s.finetune.lora = true;
  s.finetune.r = 8;
  s.parallel.dataParallel = ranks;
  s.parallel.fsdp = FsdpMode::FullShard;
  s.parallel.fsdpWrapAdaptersApart = apart;
  return s;
}

std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

TEST_CASE("PEFT FSDP wrap: the rank's gradients are the adapters' shards only", "[peft-fsdp-wrap]") {
  const Setup s = TinyLlamaLoraFsdp(2, true);
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  REQUIRE(inv.TrainableCount() == kAdapters * kAdapter);
  const ShardPlan plan = PlanShards(s, inv);
  REQUIRE(plan.adaptersApart);
  // Units: root 128,064 → 64,032; each block's frozen 41,088 → 20,544; each adapter 512 → 256.
  CHECK(plan.rootUnitElements == kRoot);
  REQUIRE(plan.unitElements.size() == 2);
  CHECK(plan.unitElements[0] == kBlockFrozen);
  const std::int64_t adapterShards = kAdapters * 256;
  CHECK(plan.gradientShardElements == adapterShards);
  CHECK(plan.partitionElements == 64032 + 2 * 20544 + adapterShards);
  REQUIRE(plan.trainableShardParts.parameters.size() == kAdapters);
  for (const Tensor& t : plan.trainableShardParts.parameters) CHECK(t.Elements() == 256);

  const Estimate rank = MustEstimate(s);
  // fp32 shards (MixedPrecision keeps the sharded FlatParameters in fp32), fp32 gradient shards.
  CHECK(rank.modelStates.parametersBytes == (64032 + 2 * 20544 + adapterShards) * 4);
  CHECK(rank.modelStates.gradientsBytes == adapterShards * 4);  // 8,192 B
  CHECK(rank.modelStates.optimizerStatesBytes == adapterShards * 2 * 4);  // AdamW: exp_avg, exp_avg_sq
  // Backward: each adapter's own bf16 gradient (512 × 2 B), reduce-scattered to 256 × 2 B; no block
  // or root unit gets an unsharded gradient.
  CHECK(FirstAllocBytes(s, "unsharded gradient of model.layers.1.self_attn.v_proj.lora_B.default.weight's FSDP unit") ==
        kAdapter * 2);
  CHECK(FirstAllocBytes(s, "FSDP reduce-scatter of model.layers.0.self_attn.q_proj.lora_A.default.weight") == 256 * 2);
  CHECK(FirstAllocBytes(s, "unsharded gradient of its FSDP unit") == -1);
  CHECK(FirstAllocBytes(s, "FSDP reduce-scatter of layers.") == -1);
  CHECK(FirstAllocBytes(s, "FSDP reduce-scatter of root unit") == -1);
}

TEST_CASE("PEFT FSDP wrap: off keeps one FlatParameter per block with a whole-block gradient", "[peft-fsdp-wrap]") {
  const Setup off = TinyLlamaLoraFsdp(2, false);
  REQUIRE(Validate(off).empty());
  const ShardPlan plan = PlanShards(off, BuildInventory(off));
  CHECK_FALSE(plan.adaptersApart);
  CHECK(plan.unitElements[0] == kBlockWithAdapters);
  CHECK(plan.gradientShardElements == 2 * kBlockWithAdapters / 2);
  const Estimate rank = MustEstimate(off);
  CHECK(rank.modelStates.gradientsBytes == 2 * (kBlockWithAdapters / 2) * 4);
  CHECK(FirstAllocBytes(off, "unsharded gradient of its FSDP unit") == kBlockWithAdapters * 2);
  // Same parameters in all, sharded differently: the gradients shrink from whole blocks to adapters.
  const Estimate apart = MustEstimate(TinyLlamaLoraFsdp(2, true));
  CHECK(apart.modelStates.gradientsBytes < rank.modelStates.gradientsBytes);
  CHECK(apart.peak.totalBytes < rank.peak.totalBytes);
}

TEST_CASE("PEFT FSDP wrap: each adapter's FlatParameter is padded to the world", "[peft-fsdp-wrap]") {
  // 3 ranks: 512 → ⌈512 / 3⌉ = 171 per rank (513 with the padding element); blocks 41,088 → 13,696,
  // root 128,064 → 42,688.
  const Setup s = TinyLlamaLoraFsdp(3, true);
  REQUIRE(Validate(s).empty());
  const ShardPlan plan = PlanShards(s, BuildInventory(s));
  CHECK(CeilDiv(kAdapter, 3) == 171);
  CHECK(plan.gradientShardElements == kAdapters * 171);
  CHECK(plan.paddedFlatElements == (42688 + 2 * 13696 + kAdapters * 171) * 3);
  const Estimate rank = MustEstimate(s);
  CHECK(rank.modelStates.gradientsBytes == kAdapters * 171 * 4);
  CHECK(rank.modelStates.optimizerStatesBytes == kAdapters * 171 * 2 * 4);
  CHECK(FirstAllocBytes(s, "FSDP reduce-scatter of model.layers.0.self_attn.q_proj.lora_B.default.weight") == 171 * 2);
}

TEST_CASE("PEFT FSDP wrap: gradient accumulation adds into each adapter's kept shard", "[peft-fsdp-wrap]") {
  Setup s = TinyLlamaLoraFsdp(2, true);
  s.parallel.gradientAccumulationSteps = 2;
  REQUIRE(Validate(s).empty());
  CHECK(MustEstimate(s).modelStates.gradientsBytes == kAdapters * 256 * 4);
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::Labelled;
  const EstimateResult r = EstimateMemory(s, o);
  REQUIRE(r.ok());
  int accumulated = 0;
  for (const TimelinePoint& p : r.estimate.timeline) {
    if (p.label.find("FSDP: gradient shard accumulated") != std::string::npos) ++accumulated;
  }
  CHECK(accumulated > 0);
}

TEST_CASE("PEFT FSDP wrap: refused outside FSDP with LoRA by its field", "[peft-fsdp-wrap]") {
  const std::string field = "parallel.fsdpWrapAdaptersApart";
  auto errorsOf = [&](auto change) {
    Setup t = TinyLlamaLoraFsdp(2, true);
    change(t);
    return Validate(t);
  };
  CHECK_FALSE(DefaultSetup().parallel.fsdpWrapAdaptersApart);
  CHECK(errorsOf([](Setup&) {}).empty());
  CHECK(errorsOf([](Setup& t) { t.parallel.fsdp = FsdpMode::ShardGradOp; }).empty());
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.parallel.fsdp = FsdpMode::Off; }), field));  // DDP
  CHECK(HasErrorOn(errorsOf([](Setup& t) {
                     t.parallel.fsdp = FsdpMode::Off;
                     t.parallel.zeroStage = 3;
                   }), field));
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.parallel.fsdp = FsdpMode::FullyShard; }), field));
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.finetune.lora = false; }), field));  // full fine-tuning
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.finetune.useDora = true; }), field));
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.parallel = ParallelDef{}; t.parallel.fsdpWrapAdaptersApart = true; }), field));
  // The message names what to do.
  Setup ddp = TinyLlamaLoraFsdp(2, true);
  ddp.parallel.fsdp = FsdpMode::Off;
  bool named = false;
  for (const FieldError& e : Validate(ddp)) {
    if (e.field == field) named = e.message.find("FULL_SHARD") != std::string::npos;
  }
  CHECK(named);
}

TEST_CASE("PEFT FSDP wrap: JSON round trip and options", "[peft-fsdp-wrap]") {
  const std::string written = SetupToJson(TinyLlamaLoraFsdp(2, true));
  CHECK(written.find(R"("fsdpWrapAdaptersApart":true)") != std::string::npos);
  const SetupParseResult r = ParseSetupJson(written);
  REQUIRE(r.errors.empty());
  CHECK(r.setup.parallel.fsdpWrapAdaptersApart);
  CHECK(HasErrorOn(ParseSetupJson(R"({"parallel": {"fsdpWrapAdaptersApart": 1}})").errors,
                   "parallel.fsdpWrapAdaptersApart"));
  CHECK(OptionsJson().find("fsdpWrapAdaptersApart") != std::string::npos);
}

TEST_CASE("PEFT FSDP wrap: accelerate's fsdp_use_orig_params false on a LoRA setup sets it", "[peft-fsdp-wrap]") {
  // PEFT's examples/sft/configs/fsdp_config.yaml (the guide's Llama-2-70B LoRA run), abridged.
  const std::string yaml =
      "distributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 8\nfsdp_config:\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_sharding_strategy: FULL_SHARD\n"
      "  fsdp_use_orig_params: false\n";
  const ParallelImport lora = ImportAccelerateConfig(yaml, TinyLlamaLoraFsdp(2, false));
  REQUIRE(lora.ok());
  CHECK(lora.setup.parallel.fsdpWrapAdaptersApart);
  CHECK(Validate(lora.setup).empty());
  // Without LoRA there is nothing to wrap apart: the field stays off, the key is listed as ignored.
  const ParallelImport full = ImportAccelerateConfig(yaml, DefaultSetup());
  REQUIRE(full.ok());
  CHECK_FALSE(full.setup.parallel.fsdpWrapAdaptersApart);
  // use_orig_params true leaves the field as it was (it depends on the training script).
  std::string orig = yaml;
  orig.replace(orig.find("false"), 5, "true");
  CHECK_FALSE(ImportAccelerateConfig(orig, TinyLlamaLoraFsdp(2, false)).setup.parallel.fsdpWrapAdaptersApart);
  CHECK(ImportAccelerateConfig(orig, TinyLlamaLoraFsdp(2, true)).setup.parallel.fsdpWrapAdaptersApart);
  // DDP (MULTI_GPU) turns it off.
  CHECK_FALSE(ImportAccelerateConfig("distributed_type: MULTI_GPU\nnum_processes: 2\n", TinyLlamaLoraFsdp(2, true))
                  .setup.parallel.fsdpWrapAdaptersApart);
}
