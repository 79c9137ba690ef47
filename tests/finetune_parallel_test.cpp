// Fine-tuning on many GPUs: frozen weights, LoRA / QLoRA adapters under DDP and ZeRO 1–2, and
// what stays refused (docs/parallel.md, "Fine-tuning on many GPUs"). Each figure is pinned by
// a hand formula on a small Llama whose adapters can be counted by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/import.hpp"
#include "gpumem/json.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// A small Llama: hidden 64, 4 heads (and 4 key/value heads), intermediate 128, 2 blocks.
// LoRA r 8 on PEFT's default targets q_proj and v_proj (both 64 → 64): per target
// A [8, 64] + B [64, 8] = 1,024 elements, so 2 targets × 2 blocks = 4,096 adapter elements.
constexpr std::int64_t kAdapterElements = 4096;

Setup TinyLlamaLora(Precision precision = Precision::BF16Mixed) {
  Setup s = TinyTransformer(Family::Llama, 2, precision);
  s.finetune.lora = true;
  s.finetune.r = 8;
  return s;
}

}  // namespace

TEST_CASE("Fine-tuning on many GPUs: the LoRA adapters count by hand", "[finetune-parallel]") {
  const Inventory inv = BuildInventory(TinyLlamaLora());
  CHECK(inv.TrainableCount() == kAdapterElements);
}

TEST_CASE("DDP with LoRA: the reducer's bucket holds the adapters only", "[finetune-parallel]") {
  Setup one = TinyLlamaLora();  // fp32 adapters (PEFT's autocast_adapter_dtype) on a bf16 base
  Setup s = one;
  s.parallel.dataParallel = 4;
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  const ShardPlan plan = PlanShards(s, inv);
  // 4,096 fp32 gradient elements = 16 KiB < the first bucket's 1 MiB: one bucket, in fp32.
  REQUIRE(plan.ddpBucketElements.size() == 1);
  CHECK(plan.ddpBucketElements[0] == kAdapterElements);
  CHECK(plan.ddpBucketTypes[0] == DType::FP32);
  const Estimate single = MustEstimate(one);
  const Estimate rank = MustEstimate(s);
  CHECK(FirstAllocBytes(s, "DDP init: reducer bucket 0") == kAdapterElements * 4);
  // Frozen base weights are replicated as on one GPU; the gradients gain the bucket only.
  CHECK(rank.modelStates.parametersBytes == single.modelStates.parametersBytes);
  CHECK(rank.modelStates.masterWeightsBytes == 0);  // fp32 adapters need no master copy
  CHECK(rank.modelStates.gradientsBytes == kAdapterElements * 4 + kAdapterElements * 4);
  CHECK(rank.modelStates.optimizerStatesBytes == single.modelStates.optimizerStatesBytes);
  CHECK(rank.modelStates.optimizerStatesBytes == 2 * kAdapterElements * 4);  // AdamW, fp32 states
  // The bucket lives from init to the end: the peak rises by its bytes.
  CHECK(rank.peak.totalBytes - single.peak.totalBytes == kAdapterElements * 4);
  // gradient_as_bucket_view: .grad are views of the bucket, the adapters' gradients held once.
  s.parallel.gradientAsBucketView = true;
  CHECK(MustEstimate(s).modelStates.gradientsBytes == kAdapterElements * 4);
}

TEST_CASE("DDP with frozen blocks: buckets skip parameters without requires_grad", "[finetune-parallel]") {
  Setup s = TinyLlamaLora(Precision::FP32);
  s.finetune.lora = false;
  s.finetune.freezeFirstBlocks = 1;
  s.finetune.freezeEmbeddings = true;
  s.parallel.dataParallel = 2;
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  const ShardPlan plan = PlanShards(s, inv);
  std::int64_t buckets = 0;
  for (std::int64_t n : plan.ddpBucketElements) buckets += n;
  // Trainable: block 1 (4 × 64·64 + 3 × 64·128 + 2 × 64 norms), the final norm and lm_head.
  const std::int64_t block = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64;
  CHECK(inv.TrainableCount() == block + 64 + 1000 * 64);
  CHECK(buckets == inv.TrainableCount());
  CHECK(MustEstimate(s).modelStates.gradientsBytes == 2 * 4 * inv.TrainableCount());
}

TEST_CASE("DDP with QLoRA: 4-bit weights whole on every rank and an adapter bucket", "[finetune-parallel]") {
  Setup one = TinyLlamaLora(Precision::BF16);
  one.finetune.quantization = Quantization::NF4;
  one.finetune.computeDType = DType::BF16;
  Setup s = one;
  s.parallel.dataParallel = 8;
  REQUIRE(Validate(s).empty());
  const Estimate single = MustEstimate(one);
  const Estimate rank = MustEstimate(s);
  // Per 64×64 linear 2,048 packed bytes + 64 fp32 absmax + the 16-entry fp32 code; 64×128: 4,096 + 128·4 + 64.
  const std::int64_t quantized = 2 * (4 * (2048 + 256 + 64) + 3 * (4096 + 512 + 64));
  const std::int64_t other = 2 * (1000 * 64) + 64 + 2 * 2 * 64;  // embeddings, lm_head, norms (bf16)
  CHECK(rank.modelStates.parametersBytes == quantized + other * 2 + kAdapterElements * 4);
  CHECK(rank.modelStates.parametersBytes == single.modelStates.parametersBytes);
  CHECK(FirstAllocBytes(s, "DDP init: reducer bucket 0") == kAdapterElements * 4);
  CHECK(rank.peak.totalBytes - single.peak.totalBytes == kAdapterElements * 4);
}

TEST_CASE("ZeRO-2 with LoRA: the flat fp32 partition holds the adapters only", "[finetune-parallel]") {
  Setup one = TinyLlamaLora();
  one.finetune.adapterDType = AdapterDType::Weights;  // DeepSpeed casts the module to bf16
  Setup s = one;
  s.parallel.dataParallel = 3;
  s.parallel.zeroStage = 2;
  s.parallel.reduceBucketSize = 1000;
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  const ShardPlan plan = PlanShards(s, inv);
  // flatten_dense_tensors_aligned(…, 2 × dp): 4,096 → ⌈4,096 / 6⌉ · 6 = 4,098; 1,366 per rank.
  CHECK(plan.flatElements == kAdapterElements);
  CHECK(plan.paddedFlatElements == 4098);
  CHECK(plan.partitionElements == 1366);
  const Estimate single = MustEstimate(one);
  const Estimate rank = MustEstimate(s);
  // The frozen weights whole; the adapters in DeepSpeed's bf16 flat with its 2-element pad.
  CHECK(rank.modelStates.parametersBytes == single.modelStates.parametersBytes + 2 * 2);
  CHECK(rank.modelStates.masterWeightsBytes == 1366 * 4);
  CHECK(rank.modelStates.gradientsBytes == 1366 * 2);
  CHECK(rank.modelStates.optimizerStatesBytes == 2 * 1366 * 4);
  CHECK(FirstAllocBytes(s, "ZeRO step: fp32 gradient partition") == 1366 * 4);
  CHECK(FirstAllocBytes(s, "setup_buckets, reduce bucket 0") == 1000 * 2);

  // ZeRO-Offload: only the trainable states move; the frozen weights stay on the GPU.
  s.parallel.offload = OffloadKind::Optimizer;
  REQUIRE(Validate(s).empty());
  const Estimate offloaded = MustEstimate(s);
  CHECK(offloaded.modelStates.parametersBytes == single.modelStates.parametersBytes + 2 * 2);
  CHECK(offloaded.modelStates.masterWeightsBytes == 0);
  CHECK(offloaded.modelStates.optimizerStatesBytes == 0);
  CHECK(offloaded.modelStates.gradientsBytes == 0);
}

TEST_CASE("ZeRO-1 with QLoRA: 16-bit adapters partitioned and 4-bit weights whole", "[finetune-parallel]") {
  Setup s = TinyLlamaLora();
  s.finetune.adapterDType = AdapterDType::Weights;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.doubleQuant = true;
  s.finetune.computeDType = DType::BF16;
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 1;
  REQUIRE(Validate(s).empty());
  const Estimate rank = MustEstimate(s);
  // 4,096 is a multiple of 2 × 4: 1,024 per rank.
  CHECK(rank.modelStates.masterWeightsBytes == 1024 * 4);
  CHECK(rank.modelStates.optimizerStatesBytes == 2 * 1024 * 4);
  CHECK(rank.modelStates.gradientsBytes == kAdapterElements * 2);  // stage 1: whole 16-bit gradients
  std::int64_t stored = 0;
  for (const Tensor& t : BuildInventory(s).parameters) stored += StoredBytes(t, DType::BF16);
  CHECK(rank.modelStates.parametersBytes == stored);
  // The step's 16-bit flat of the partition covers the trainable elements only (1,024 per rank).
  CHECK(FirstAllocBytes(s, "averaged gradients flattened") == 1024 * 2);
}

TEST_CASE("ZeRO-3 with LoRA: frozen weights partitioned too and the fp32 partition of the adapters", "[finetune-parallel]") {
  Setup s = TinyLlamaLora();
  s.finetune.adapterDType = AdapterDType::Weights;
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 3;
  s.parallel.stage3ParamPersistenceThreshold = 0;  // every parameter partitioned
  s.parallel.reduceBucketSize = 1000;
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  std::int64_t shards = 0;
  for (const Tensor& t : inv.parameters) shards += (t.Elements() + 3) / 4;
  const Estimate rank = MustEstimate(s);
  CHECK(rank.modelStates.parametersBytes == shards * 2);
  // Each adapter tensor has 512 elements: ⌈512 / 4⌉ = 128 per rank, 8 tensors.
  CHECK(PlanShards(s, inv).partitionElements == 1024);
  CHECK(rank.modelStates.masterWeightsBytes == 1024 * 4);
  CHECK(rank.modelStates.gradientsBytes == 1024 * 2);
  CHECK(rank.modelStates.optimizerStatesBytes == 2 * 1024 * 4);
  // A block is gathered whole, frozen weights, norms and adapters:
  // 4 × 64·64 + 3 × 64·128 + 2 × 64 + 2,048 adapter elements, in bf16.
  CHECK(FirstAllocBytes(s, "all-gather of layers.0") == (4 * 4096 + 3 * 8192 + 128 + 2048) * 2);
}

TEST_CASE("ZeRO-3 with QLoRA: 4-bit codes in bf16 storage partitioned, statistics whole", "[finetune-parallel]") {
  Setup s = TinyLlamaLora();
  s.finetune.adapterDType = AdapterDType::Weights;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.computeDType = DType::BF16;
  s.finetune.quantStorage = DType::BF16;
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 3;
  s.parallel.stage3ParamPersistenceThreshold = 0;
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  const Tensor& q = inv.parameters[static_cast<std::size_t>(inv.IndexOf("model.layers.0.self_attn.q_proj.base_layer.weight"))];
  // _quantize_4bit_impl: (n + 1) // (2 · itemsize) bf16 elements hold the codes: 4,096 → 1,024.
  CHECK(StorageElements(q) == 1024);
  CHECK(StoredBytes(q, DType::BF16) == 1024 * 2 + 64 * 4 + 16 * 4);  // codes + absmax per 64 + code table
  CHECK(QuantStatisticsBytes(q, DType::BF16) == 64 * 4 + 16 * 4);
  // The rank's 4-bit shard: ⌈1,024 / 4⌉ = 256 bf16 elements, beside the whole statistics.
  const ShardPlan plan = PlanShards(s, inv);
  CHECK(plan.parameterElementsHeld[static_cast<std::size_t>(inv.IndexOf(q.name))] == 256);
  std::int64_t expected = 0;
  for (const Tensor& t : inv.parameters) expected += (StorageElements(t) + 3) / 4 * 2 + QuantStatisticsBytes(t, DType::BF16);
  const Estimate rank = MustEstimate(s);
  CHECK(rank.modelStates.parametersBytes == expected);
  // Gathered block: 4 square weights of 1,024 and 3 wide of 2,048 bf16 elements of codes, the
  // norms and the adapters; then each linear dequantized to a transient bf16 weight as on one GPU.
  CHECK(FirstAllocBytes(s, "all-gather of layers.0") == (4 * 1024 + 3 * 2048 + 128 + 2048) * 2);
  const Trace trace = BuildTrace(s, inv, false);
  std::int64_t dequantized = 0;
  for (const Event& e : trace.events) {
    if (e.kind == EventKind::Alloc && e.category == Category::WeightCopies && e.phase == Phase::Forward)
      dequantized = std::max(dequantized, e.bytes);
  }
  CHECK(dequantized == 128 * 64 * 2);
  // Offload of parameters: the codes go to the host, the statistics stay with the module.
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  REQUIRE(Validate(s).empty());
  std::int64_t statistics = 0;
  for (const Tensor& t : inv.parameters) statistics += QuantStatisticsBytes(t, DType::BF16);
  CHECK(MustEstimate(s).modelStates.parametersBytes == statistics);
}

TEST_CASE("FSDP with LoRA: one FlatParameter per block, a gradient only for blocks that train", "[finetune-parallel]") {
  Setup s = TinyLlamaLora();  // bf16 mixed: FSDP keeps fp32 shards, so fp32 adapters are uniform with them
  s.parallel.dataParallel = 4;
  s.parallel.fsdp = FsdpMode::FullShard;
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  // The block's FlatParameter in module order: q_proj's base, lora_A, lora_B, then k_proj, v_proj …
  REQUIRE(inv.IndexOf("model.layers.0.self_attn.q_proj.lora_B.default.weight") <
          inv.IndexOf("model.layers.0.self_attn.k_proj.weight"));
  REQUIRE(inv.IndexOf("model.layers.0.self_attn.k_proj.weight") <
          inv.IndexOf("model.layers.0.self_attn.v_proj.base_layer.weight"));
  // Block: 4 × 64·64 + 3 × 64·128 + 2 norms × 64 + 2,048 adapters = 43,136 → ⌈/4⌉ = 10,784.
  // Root (embeddings, final norm, lm_head): 64,000 + 64 + 64,000 = 128,064 → 32,016; all frozen.
  const std::int64_t block = 43136, blockShard = 10784, rootShard = 32016;
  const ShardPlan plan = PlanShards(s, inv);
  CHECK(plan.partitionElements == rootShard + 2 * blockShard);
  CHECK(plan.gradientShardElements == 2 * blockShard);  // the frozen root unit gets no gradient
  // Rank 0 holds elements [0, 10,784) of each block: q_proj's base (4,096) and its adapters
  // (512 + 512) end at 5,120, k_proj's weight at 9,216, v_proj's base starts after: only q_proj's
  // adapters are rank 0's to step.
  std::int64_t parts = 0;
  for (const Tensor& t : plan.trainableShardParts.parameters) parts += t.Elements();
  CHECK(parts == 2 * 1024);
  const Estimate rank = MustEstimate(s);
  CHECK(rank.modelStates.parametersBytes == (rootShard + 2 * blockShard) * 4);
  CHECK(rank.modelStates.gradientsBytes == 2 * blockShard * 4);
  CHECK(rank.modelStates.optimizerStatesBytes == 2 * 2 * 1024 * 4);
  // Backward: the whole block's gradient (frozen parts zero) before its reduce-scatter.
  CHECK(FirstAllocBytes(s, "unsharded gradient of its FSDP unit") == block * 2);
  CHECK(FirstAllocBytes(s, "FSDP reduce-scatter of layers.1") == blockShard * 2);
  CHECK(FirstAllocBytes(s, "FSDP reduce-scatter of root unit") == -1);
}

TEST_CASE("FSDP with QLoRA: bf16 quant storage sharded with the block, statistics whole", "[finetune-parallel]") {
  Setup s = TinyLlamaLora(Precision::BF16);  // FSDP-QLoRA keeps the model in bf16
  s.finetune.adapterDType = AdapterDType::Weights;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.computeDType = DType::BF16;
  s.finetune.quantStorage = DType::BF16;
  s.parallel.dataParallel = 4;
  s.parallel.fsdp = FsdpMode::FullShard;
  REQUIRE(Validate(s).empty());
  // Block: codes 4 × 1,024 + 3 × 2,048 bf16 elements, norms 128, adapters 2,048 = 12,416 → 3,104.
  const std::int64_t block = 12416, blockShard = 3104, rootShard = 32016;
  // Statistics per block: 4 × (64 absmax × 4 B + 64 B code) + 3 × (128 × 4 + 64).
  const std::int64_t statistics = 2 * (4 * (256 + 64) + 3 * (512 + 64));
  const Estimate rank = MustEstimate(s);
  CHECK(rank.modelStates.parametersBytes == (rootShard + 2 * blockShard) * 2 + statistics);
  CHECK(FirstAllocBytes(s, "all-gather of layers.0") == block * 2);
  CHECK(FirstAllocBytes(s, "unsharded gradient of its FSDP unit") == block * 2);

  auto errorsOf = [&](auto change) {
    Setup t = s;
    change(t);
    return Validate(t);
  };
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.finetune.quantStorage = DType::UInt8; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.finetune.adapterDType = AdapterDType::FP32; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.training.precision = Precision::BF16Mixed; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf([](Setup& t) { t.parallel.fsdp = FsdpMode::FullyShard; }), "parallel.fsdp"));
  CHECK(errorsOf([](Setup& t) { t.parallel.fsdp = FsdpMode::ShardGradOp; }).empty());
}

TEST_CASE("Quant storage: uint8 by default and validated", "[finetune-parallel]") {
  CHECK(DefaultSetup().finetune.quantStorage == DType::UInt8);
  Setup s = TinyLlamaLora();
  s.finetune.quantStorage = DType::BF16;
  CHECK(HasErrorOn(Validate(s), "finetune.quantStorage"));  // no 4-bit weights
  s.finetune.quantization = Quantization::Int8;
  CHECK(HasErrorOn(Validate(s), "finetune.quantStorage"));
  s.finetune.quantization = Quantization::NF4;
  s.finetune.quantStorage = DType::Int64;
  CHECK(HasErrorOn(Validate(s), "finetune.quantStorage"));
  s.finetune.quantStorage = DType::BF16;
  CHECK(Validate(s).empty());
  // On one GPU bf16 storage changes nothing for even sizes: the same bytes, two codes per byte.
  Setup u8 = s;
  u8.finetune.quantStorage = DType::UInt8;
  CHECK(MustEstimate(s).modelStates.parametersBytes == MustEstimate(u8).modelStates.parametersBytes);
  // ZeRO-3 needs the storage to be the weights' dtype.
  s.finetune.adapterDType = AdapterDType::Weights;
  s.parallel.dataParallel = 2;
  s.parallel.zeroStage = 3;
  CHECK(Validate(s).empty());
  s.finetune.quantStorage = DType::UInt8;
  CHECK(HasErrorOn(Validate(s), "parallel.zeroStage"));
  s.finetune.quantStorage = DType::FP16;
  CHECK(HasErrorOn(Validate(s), "parallel.zeroStage"));
  s.finetune.quantization = Quantization::Int8;
  s.finetune.quantStorage = DType::UInt8;
  CHECK(HasErrorOn(Validate(s), "parallel.zeroStage"));
}

TEST_CASE("Fine-tuning on many GPUs: what is not simulated is refused by its field", "[finetune-parallel]") {
  auto errorsOf = [](auto change) {
    Setup s = TinyLlamaLora();
    s.finetune.adapterDType = AdapterDType::Weights;
    s.parallel.dataParallel = 2;
    change(s);
    return Validate(s);
  };
  CHECK(errorsOf([](Setup&) {}).empty());
  CHECK(errorsOf([](Setup& s) { s.parallel.zeroStage = 2; }).empty());
  CHECK(errorsOf([](Setup& s) { s.parallel.zeroStage = 3; }).empty());
  CHECK(errorsOf([](Setup& s) { s.parallel.fsdp = FsdpMode::FullShard; }).empty());
  // FSDP2 with adapters in the weights' dtype: simulated (fsdp2_finetune_test.cpp).
  CHECK(errorsOf([](Setup& s) { s.parallel.fsdp = FsdpMode::FullyShard; }).empty());
  // Tensor parallelism with LoRA: PEFT's LoraParallelLinear (tensor_parallel_lora_test.cpp).
  CHECK(errorsOf([](Setup& s) {
          s.parallel.tensorParallel = 2;
          s.finetune.adapterDType = AdapterDType::FP32;  // tp_layer.py forces fp32 adapters
        }).empty());
  // Pipeline parallelism with LoRA (pipeline_compose_test.cpp).
  CHECK(errorsOf([](Setup& s) { s.parallel.pipelineParallel = 2; }).empty());
  // Context parallelism with LoRA (pipeline_compose_test.cpp; Llama with fused attention only).
  CHECK(errorsOf([](Setup& s) {
          s.parallel.contextParallel = 2;
          s.training.attention = AttentionImplementation::SDPA;
        }).empty());
  // DeepSpeed's module.bfloat16(): fp32 adapters or kbit upcasts cannot stay fp32 under ZeRO.
  CHECK(HasErrorOn(errorsOf([](Setup& s) {
                     s.parallel.zeroStage = 1;
                     s.finetune.adapterDType = AdapterDType::FP32;
                   }),
                   "parallel.zeroStage"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) {
                     s.parallel.zeroStage = 2;
                     s.finetune.quantization = Quantization::NF4;
                     s.finetune.prepareForKbitTraining = true;
                   }),
                   "parallel.zeroStage"));
  // fp32 training: the adapters are fp32 like everything else, nothing is cast.
  CHECK(errorsOf([](Setup& s) {
          s.training.precision = Precision::FP32;
          s.finetune.adapterDType = AdapterDType::FP32;
          s.parallel.zeroStage = 2;
        }).empty());
}

TEST_CASE("Quant storage: JSON round trip and bnb_4bit_quant_storage import", "[finetune-parallel]") {
  Setup s = TinyLlamaLora();
  s.finetune.quantization = Quantization::NF4;
  s.finetune.quantStorage = DType::BF16;
  const std::string text = SetupToJson(s);
  CHECK(text.find("\"quantStorage\":\"bf16\"") != std::string::npos);
  const SetupParseResult back = ParseSetupJson(text);
  REQUIRE(back.errors.empty());
  CHECK(back.setup.finetune.quantStorage == DType::BF16);
  const SetupParseResult wrong = ParseSetupJson(R"({"finetune": {"quantStorage": "int4"}})");
  CHECK(HasErrorOn(wrong.errors, "finetune.quantStorage"));
  const QuantizationImport q = ImportQuantizationConfig(R"({"quantization_config": {"load_in_4bit": true,
      "bnb_4bit_quant_type": "nf4", "bnb_4bit_quant_storage": "bfloat16"}})");
  REQUIRE(q.errors.empty());
  CHECK(q.finetune.quantStorage == DType::BF16);
  CHECK(ImportQuantizationConfig(R"({"quantization_config": {"load_in_4bit": true}})").finetune.quantStorage == DType::UInt8);
  CHECK(HasErrorOn(ImportQuantizationConfig(R"({"quantization_config": {"load_in_4bit": true,
      "bnb_4bit_quant_storage": "int4"}})").errors, "config.quantization_config.bnb_4bit_quant_storage"));
}

TEST_CASE("DDP's construction broadcasts every parameter, frozen ones included", "[finetune-parallel]") {
  // distributed.py _sync_module_states → dist._broadcast_coalesced (c10d comm.cpp): the module's
  // parameters flattened per dtype into 250 MiB buckets, at most two in flight. The small Llama
  // (bf16 base, fp32 adapters) makes two buckets, both in flight: its init peak is twice its
  // parameters, though the reducer's buckets hold only the adapters.
  Setup s = TinyLlamaLora();
  s.parallel.dataParallel = 2;
  const Estimate e = MustEstimateLabelled(s);
  CHECK(e.phasePeaks[static_cast<std::size_t>(Phase::Init)].totalBytes == 2 * e.modelStates.parametersBytes);
  CHECK(FirstAllocBytes(e, "_broadcast_coalesced flattens bucket 0") > 0);
  CHECK(FirstAllocBytes(e, "_broadcast_coalesced flattens bucket 1") == kAdapterElements * 4);
  CHECK(FirstAllocBytes(e, "_broadcast_coalesced flattens bucket 2") == -1);
  // Megatron's DDP broadcasts each parameter in place: no flat copy.
  s.parallel.gradReduceInFp32 = true;
  s.finetune.lora = false;
  CHECK(FirstAllocBytes(MustEstimateLabelled(s), "_broadcast_coalesced") == -1);
}

TEST_CASE("DDP's construction broadcasts a bucket of one parameter in place", "[finetune-parallel]") {
  // comm.cpp BroadcastWork: flat_tensor_ = flatten_dense_tensors(bucket), which for one tensor is
  // `t.contiguous().view({-1})` (torch/csrc/utils/tensor_flatten.h): no copy. Llama 3 8B's bf16
  // embedding, 128,256 × 4,096 × 2 = 1,050,673,152 B ≥ 250 MiB, is bucket 0 alone. Bucket 1 is
  // layer 0's q, k, v, o, gate and up projections (33,554,432 + 2 × 8,388,608 + 33,554,432 +
  // 2 × 117,440,512 B, the bucket closing at up_proj past 262,144,000 B; LlamaDecoderLayer
  // registers its norms after the MLP, so they follow down_proj into the next bf16 bucket); the
  // fp32 adapters, a dtype of their own, are bucket 2, ordered by their first tensor (layer 0's
  // q_proj.lora_A).
  auto parsed = ParseSetupJson(R"({"model":{"preset":"llama-3-8b"},
      "training":{"batchSize":1,"sequenceLength":256,"precision":"bf16"},
      "finetune":{"lora":true,"r":8,"targetModules":["q_proj","v_proj"]},
      "parallel":{"dataParallel":2}})");
  REQUIRE(parsed.errors.empty());
  const Estimate e = MustEstimateLabelled(parsed.setup);
  CHECK(FirstAllocBytes(e, "flattens bucket 0 of") == -1);
  CHECK(FirstAllocBytes(e, "flattens bucket 1 of") == 318'767'104);
  // 32 layers × (q: 8 × 4,096 + 4,096 × 8; v: 8 × 4,096 + 1,024 × 8) fp32 values.
  CHECK(FirstAllocBytes(e, "flattens bucket 2 of") == 32 * (65'536 + 40'960) * 4);
  // The deque holds the last two BroadcastWorks, the in-place one included: the init peak is the
  // parameters plus the largest two consecutive flat copies (the last, lm_head's bucket, with the
  // one before it).
  std::vector<std::int64_t> flats;
  for (int k = 0;; ++k) {
    const std::int64_t bytes = FirstAllocBytes(e, "flattens bucket " + std::to_string(k) + " of");
    if (bytes < 0 && k > 0) break;
    flats.push_back(std::max<std::int64_t>(bytes, 0));
  }
  REQUIRE(flats.size() > 3);
  std::int64_t pair = 0;
  for (std::size_t k = 1; k < flats.size(); ++k) pair = std::max(pair, flats[k - 1] + flats[k]);
  CHECK(pair > 1'050'673'152);  // lm_head's bucket holds more than lm_head: it is a flat copy
  CHECK(e.phasePeaks[static_cast<std::size_t>(Phase::Init)].totalBytes == e.modelStates.parametersBytes + pair);
}
