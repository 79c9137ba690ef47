// Many GPUs: the parallel section, the simulated rank's sharded states and buffers, and the
// published figures and closed forms they must reproduce (docs/parallel.md).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup Zero(std::int64_t psi, std::int64_t dp, int stage) {
  Setup s = QuickSetup(psi, Precision::FP16Mixed, OptimizerKind::Adam);
  s.parallel.dataParallel = dp;
  s.parallel.zeroStage = stage;
  return s;
}

Setup Llama7b() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 512;
  return s;
}

std::int64_t EventBytes(const Estimate& e, Phase phase, const std::string& label) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.phase == phase && p.deltaBytes > 0 && p.label.find(label) != std::string::npos) return p.deltaBytes;
  }
  return -1;
}

}  // namespace

TEST_CASE("Parallel: the default is one GPU and every estimate keeps its figures", "[parallel]") {
  const Setup s = DefaultSetup();
  CHECK_FALSE(IsParallel(s.parallel));
  CHECK(WorldSize(s.parallel) == 1);
  const Estimate e = MustEstimate(s);
  CHECK(e.rank.engineLabel.empty());
  CHECK(e.modelStates.totalBytes == 24'000'000'000);  // 16Ψ for Ψ = 1.5e9
  // The frameworks' defaults (setup.hpp cites each).
  CHECK(s.parallel.bucketCapMB == 25);
  CHECK(s.parallel.reduceBucketSize == 500'000'000);
  CHECK(s.parallel.stage3PrefetchBucketSize == 50'000'000);
  CHECK(s.parallel.stage3ParamPersistenceThreshold == 100'000);
  CHECK(s.parallel.stage3MaxLiveParameters == 1'000'000'000);
  CHECK(s.parallel.stage3MaxReuseDistance == 1'000'000'000);  // deepspeed/runtime/zero/config.py max_reuse_distance
  CHECK(s.parallel.subGroupSize == 1'000'000'000);            // config.py sub_group_size
}

TEST_CASE("Parallel: the ZeRO paper's 120 / 31.4 / 16.6 / 1.9 GB for 7.5B on 64 GPUs", "[parallel]") {
  const double psi = 7.5e9;
  CHECK(ZeroPaperModelStateBytes(psi, 12, 64, 0) == 120e9);
  CHECK(ZeroPaperModelStateBytes(psi, 12, 64, 1) == 31.40625e9);
  CHECK(ZeroPaperModelStateBytes(psi, 12, 64, 2) == 16.640625e9);
  CHECK(ZeroPaperModelStateBytes(psi, 12, 64, 3) == 1.875e9);
  // The simulated rank holds exactly these model states.
  const std::int64_t n = 7'500'000'000;
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage);
    const Estimate e = MustEstimate(Zero(n, 64, stage));
    CHECK(static_cast<double>(e.modelStates.totalBytes) == ZeroPaperModelStateBytes(psi, 12, 64, stage));
    CHECK(e.rank.shardWorld == 64);
    CHECK(e.rank.engineLabel == "DeepSpeed ZeRO-" + std::to_string(stage));
  }
  // The baseline: DDP with gradient_as_bucket_view (no second gradient copy) keeps 16Ψ.
  Setup ddp = Zero(n, 64, 0);
  ddp.parallel.gradientAsBucketView = true;
  CHECK(MustEstimate(ddp).modelStates.totalBytes == 120'000'000'000);
}

TEST_CASE("Parallel: the fused fp32 gradient buffer is 6 GB for 1.5B parameters", "[parallel]") {
  Setup s = Zero(1'500'000'000, 1, 1);
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::Labelled;
  const EstimateResult r = EstimateMemory(s, o);
  REQUIRE(r.ok());
  CHECK(EventBytes(r.estimate, Phase::OptimizerStep, "fp32 gradient partition") == 6'000'000'000);
}

TEST_CASE("Parallel: DDP buckets double the gradients unless they are the gradients", "[parallel]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("gpt2")->architecture;
  s.training.precision = Precision::FP32;
  s.training.sequenceLength = 128;
  s.parallel.dataParallel = 8;
  const Inventory inventory = BuildInventory(s);
  const ShardPlan plan = PlanShards(s, inventory);
  REQUIRE(plan.ddpBucketElements.size() > 2);
  std::int64_t sum = 0;
  for (std::int64_t b : plan.ddpBucketElements) sum += b;
  CHECK(sum == inventory.TrainableCount());
  // The first bucket closes at 1 MiB, the others at bucket_cap_mb (25 MiB), each once reached.
  CHECK(plan.ddpBucketElements[0] * 4 >= 1 << 20);
  CHECK(plan.ddpBucketElements[1] * 4 >= 25 << 20);
  const Estimate copies = MustEstimate(s);
  CHECK(copies.modelStates.gradientsBytes == 2 * 4 * inventory.TrainableCount());
  s.parallel.gradientAsBucketView = true;
  const Estimate views = MustEstimate(s);
  CHECK(views.modelStates.gradientsBytes == 4 * inventory.TrainableCount());
  // The peak falls by the gradient bytes the views save (they are all live at backward's end).
  CHECK(copies.peak.totalBytes - views.peak.totalBytes == 4 * inventory.TrainableCount());
}

TEST_CASE("Parallel: ZeRO-2's reduce bucket is doubled by overlap_comm", "[parallel]") {
  Setup s = Zero(1'000'000'000, 8, 2);
  s.parallel.overlapComm = OverlapComm::Off;
  const Estimate one = MustEstimate(s);
  s.parallel.overlapComm = OverlapComm::On;
  const Estimate two = MustEstimate(s);
  const auto backward = static_cast<std::size_t>(Phase::Backward);
  // 5e8 elements × 2 B (fp16) more during backward.
  CHECK(two.phasePeaks[backward].totalBytes - one.phasePeaks[backward].totalBytes == 1'000'000'000);
  s.parallel.reduceBucketSize = 200'000'000;
  const Estimate smaller = MustEstimate(s);
  CHECK(two.phasePeaks[backward].totalBytes - smaller.phasePeaks[backward].totalBytes == 2 * 2 * 300'000'000);
}

TEST_CASE("Parallel: flat buffers are padded so every rank holds the same partition", "[parallel]") {
  // 1,001 trainable elements over 4 ranks: stage 1/2 pads the flat group to a multiple of
  // 2 × 4 = 8 (1,008), 252 per rank; stage 3 pads each tensor to a multiple of 4.
  Setup s = LayerSetup({Linear(10, 91, true)}, LossKind::MSE, 1, 1, Precision::FP16Mixed, OptimizerKind::Adam);
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 2;
  const Inventory inventory = BuildInventory(s);
  REQUIRE(inventory.TrainableCount() == 1001);
  ShardPlan plan = PlanShards(s, inventory);
  CHECK(plan.paddedFlatElements == 1008);
  CHECK(plan.partitionElements == 252);
  CHECK(MustEstimate(s).modelStates.masterWeightsBytes == 252 * 4);
  s.parallel.zeroStage = 3;
  plan = PlanShards(s, inventory);
  CHECK(plan.partitionElements == 228 + 23);  // ⌈910 / 4⌉ + ⌈91 / 4⌉
  // Both tensors are below stage3_param_persistence_threshold: kept whole besides their partition.
  CHECK(MustEstimate(s).modelStates.parametersBytes == (1001 + 251) * 2);
  s.parallel.stage3ParamPersistenceThreshold = 0;
  CHECK(MustEstimate(s).modelStates.parametersBytes == 251 * 2);
  // FSDP: one FlatParameter (the root unit) of 1,001 elements: ⌈1001 / 4⌉ = 251 per rank, in fp32.
  s.parallel.zeroStage = 0;
  s.parallel.fsdp = FsdpMode::FullShard;
  const Estimate fsdp = MustEstimate(s);
  CHECK(fsdp.modelStates.parametersBytes == 251 * 4);
  CHECK(fsdp.modelStates.gradientsBytes == 251 * 4);
  CHECK(fsdp.modelStates.optimizerStatesBytes == 251 * 8);
  CHECK(fsdp.modelStates.masterWeightsBytes == 0);
}

TEST_CASE("Parallel: FSDP keeps 16 bytes per parameter divided by the shard group", "[parallel]") {
  Setup s = QuickSetup(8'000'000'000, Precision::BF16Mixed, OptimizerKind::AdamW);
  s.parallel.dataParallel = 64;
  s.parallel.fsdp = FsdpMode::FullShard;
  CHECK(MustEstimate(s).modelStates.totalBytes == 16 * 8'000'000'000 / 64);
  s.parallel.fsdp = FsdpMode::HybridShard;  // shards within 8 GPUs, replicated across nodes
  const Estimate hybrid = MustEstimate(s);
  CHECK(hybrid.modelStates.totalBytes == 16 * 8'000'000'000 / 8);
  CHECK(hybrid.rank.shardWorld == 8);
  s.parallel.fsdp = FsdpMode::FullyShard;
  CHECK(MustEstimate(s).modelStates.totalBytes == 16 * 8'000'000'000 / 64);
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  CHECK(MustEstimate(s).modelStates.totalBytes == 0);
}

TEST_CASE("Parallel: DeepSpeed's estimators and where the simulation differs", "[parallel]") {
  // estimate_zero2_model_states_mem_needs(1e9, 8 GPUs, 1 node).
  CHECK(DeepSpeedZero2GpuBytes(1'000'000'000, 8, 1, false) == 6'000'000'000);
  CHECK(DeepSpeedZero2GpuBytes(1'000'000'000, 8, 1, true) == 2'000'000'000);
  // estimate_zero3_model_states_mem_needs(1e9, largest layer 1e8, 8 GPUs, 1 node).
  CHECK(DeepSpeedZero3GpuBytes(1'000'000'000, 100'000'000, 8, 1, false, false) == 2'650'000'000);
  CHECK(DeepSpeedZero3GpuBytes(1'000'000'000, 100'000'000, 8, 1, true, false) == 650'000'000);
  CHECK(DeepSpeedZero3GpuBytes(1'000'000'000, 100'000'000, 8, 1, true, true) == 400'000'000);
  // ZeRO-2 without offload: DeepSpeed counts whole 16-bit gradients and the fp32 gradient
  // partition as states (4Ψ + 16Ψ/N); the rank keeps its 16-bit gradient partition between
  // reductions (2Ψ + 14Ψ/N) and makes the fp32 partition only during the step (in the peak, not
  // in the states): the estimator is higher by 2Ψ − 2Ψ/N + 4Ψ/N = 2Ψ + 2Ψ/N.
  const std::int64_t psi = 1'000'000'000;
  const Estimate zero2 = MustEstimate(Zero(psi, 8, 2));
  CHECK(zero2.modelStates.totalBytes == 2 * psi + 14 * psi / 8);
  CHECK(DeepSpeedZero2GpuBytes(psi, 8, 1, false) - zero2.modelStates.totalBytes == 2 * psi + 2 * psi / 8);
  // ZeRO-3: DeepSpeed 18Ψ/N + 4·largest layer; the rank's states are 16Ψ/N, the gathered layer
  // is in the peak.
  CHECK(MustEstimate(Zero(psi, 8, 3)).modelStates.totalBytes == 16 * psi / 8);
  // ZeRO-2 with the optimizer offloaded: DeepSpeed 2Ψ; the rank keeps its 16-bit parameters.
  Setup offload = Zero(psi, 8, 2);
  offload.parallel.offload = OffloadKind::Optimizer;
  CHECK(MustEstimate(offload).modelStates.totalBytes == DeepSpeedZero2GpuBytes(psi, 8, 1, true));
}

TEST_CASE("Parallel: Megatron's theoretical weight memory and the tensor-parallel rank", "[parallel]") {
  const ArchitectureDef a = FindPreset("llama-2-7b")->architecture;
  const MegatronWeightAndOptimizer full = MegatronTheoreticalWeightAndOptimizer(a, 1, 1, 1, false);
  CHECK(full.parametersOnMostLoadedShard == 6'738'681'856.0);
  CHECK(full.bytes == 18.0 * 6'738'681'856.0);
  // Megatron's formula counts each norm with a bias (4h per layer + 2h at the end); Llama's
  // RMSNorms have none: 32 × 2 × 4096 + 4096 = 266,240 parameters fewer in the simulation.
  const Estimate one = MustEstimate(Llama7b());
  CHECK(static_cast<double>(one.modelStates.parameterCount) == full.parametersOnMostLoadedShard - 266'240);
  // Tensor parallel 2: q/k/v/o, the MLP and the (padded) vocabulary split, norms whole. Megatron
  // divides the norms too; with its doubled norm count that lands on the same figure.
  Setup tp = Llama7b();
  tp.parallel.tensorParallel = 2;
  const Estimate rank = MustEstimate(tp);
  const MegatronWeightAndOptimizer split = MegatronTheoreticalWeightAndOptimizer(a, 2, 1, 1, false);
  CHECK(static_cast<double>(rank.modelStates.parameterCount) == split.parametersOnMostLoadedShard);
  CHECK(rank.modelStates.parameterCount == 3'369'340'928);
  CHECK(rank.peak.totalBytes < one.peak.totalBytes);
  // --use-distributed-optimizer: 6 + 12/dp bytes per parameter.
  CHECK(MegatronTheoreticalWeightAndOptimizer(a, 2, 1, 8, true).bytes == split.parametersOnMostLoadedShard * 7.5);
}

TEST_CASE("Parallel: every field is validated", "[parallel]") {
  auto errorsOf = [](auto change) {
    Setup s = DefaultSetup();
    change(s.parallel);
    return Validate(s);
  };
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.dataParallel = 0; }), "parallel.dataParallel"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.dataParallel = -3; }), "parallel.dataParallel"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.dataParallel = 10'000'000; }), "parallel.dataParallel"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.zeroStage = 4; }), "parallel.zeroStage"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.zeroStage = -1; }), "parallel.zeroStage"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.bucketCapMB = std::nan(""); }), "parallel.bucketCapMB"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.bucketCapMB = 0; }), "parallel.bucketCapMB"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.reduceBucketSize = 0; }), "parallel.reduceBucketSize"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.stage3ParamPersistenceThreshold = -1; }),
                   "parallel.stage3ParamPersistenceThreshold"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.stage3MaxReuseDistance = -1; }), "parallel.stage3MaxReuseDistance"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.subGroupSize = -5; }), "parallel.subGroupSize"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.stage3MaxReuseDistance = 2'000'000'000'000; }),
                   "parallel.stage3MaxReuseDistance"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.zeroStage = 2; p.fsdp = FsdpMode::FullShard; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.offload = OffloadKind::Optimizer; }), "parallel.offload"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.zeroStage = 2; p.offload = OffloadKind::OptimizerAndParameters; }),
                   "parallel.offload"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.sequenceParallel = true; }), "parallel.sequenceParallel"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.virtualStages = 2; }), "parallel.virtualStages"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.pipelineParallel = 4; }), "parallel.pipelineParallel"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.gradientAccumulationSteps = 0; }), "parallel.gradientAccumulationSteps"));
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.tensorParallel = 2; }), "parallel.tensorParallel"));  // quick mode
  CHECK(HasErrorOn(errorsOf([](ParallelDef& p) { p.dataParallel = 12; p.fsdp = FsdpMode::HybridShard; }),
                   "parallel.fsdpShardGroupSize"));
  Setup heads = Llama7b();
  heads.parallel.tensorParallel = 3;  // 32 heads do not split in 3
  CHECK(HasErrorOn(Validate(heads), "parallel.tensorParallel"));
  Setup fine = Llama7b();
  fine.parallel.tensorParallel = 4;
  fine.parallel.dataParallel = 16;
  fine.parallel.zeroStage = 1;
  CHECK(Validate(fine).empty());
}

TEST_CASE("Parallel: the section reads and writes as JSON", "[parallel]") {
  Setup s;
  const auto errors = ParseAndValidate(
      R"({"model":{"kind":"parameterCount","parameterCount":1000000000},)"
      R"("parallel":{"dataParallel":8,"zeroStage":3,"overlapComm":"false","offload":"optimizer","reduceBucketSize":1000}})",
      s);
  CHECK(errors.empty());
  const Estimate e = MustEstimate(s);
  CHECK(std::any_of(e.notes.begin(), e.notes.end(), [](const std::string& n) {
    return n.find("8 GPUs, DeepSpeed ZeRO-3") != std::string::npos;
  }));
  CHECK(std::any_of(e.notes.begin(), e.notes.end(), [](const std::string& n) {
    return n.find("not simulated") != std::string::npos;  // quick mode: no blocks to gather
  }));
  CHECK(s.parallel.dataParallel == 8);
  CHECK(s.parallel.zeroStage == 3);
  CHECK(s.parallel.overlapComm == OverlapComm::Off);
  CHECK(s.parallel.offload == OffloadKind::Optimizer);
  CHECK(s.parallel.reduceBucketSize == 1000);
  Setup back;
  CHECK(ParseAndValidate(SetupToJson(s), back).empty());
  CHECK(back.parallel.zeroStage == 3);
  CHECK(back.parallel.offload == OffloadKind::Optimizer);
  Setup wrong;
  CHECK(HasErrorOn(ParseAndValidate(R"({"parallel":{"dataParalel":2}})", wrong), "parallel.dataParalel"));
  CHECK(HasErrorOn(ParseAndValidate(R"({"parallel":{"fsdp":"FULL"}})", wrong), "parallel.fsdp"));
  const std::string estimate = EstimateJson(R"({"parallel":{"dataParallel":4,"zeroStage":2}})");
  CHECK(estimate.find("\"rank\":{\"worldSize\":4") != std::string::npos);
  CHECK(OptionsJson().find("\"parallelFields\"") != std::string::npos);
  CHECK(OptionsJson().find("\"FULL_SHARD\"") != std::string::npos);
}

TEST_CASE("Parallel: ZeRO-3 and FSDP gather a unit at a time unless told to keep them", "[parallel]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("tinyllama-1.1b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 256;
  s.parallel.dataParallel = 8;
  s.parallel.fsdp = FsdpMode::FullShard;
  const Inventory inventory = BuildInventory(s);
  const ShardPlan plan = PlanShards(s, inventory);
  std::int64_t blocks = 0;
  for (std::int64_t n : plan.unitElements) blocks += n;
  const std::int64_t shards = plan.partitionElements * 4;  // fp32 FlatParameter shards
  // At forward's end (the loss computed) FULL_SHARD holds its shards and the gathered root
  // (embeddings, final norm, head) in bf16; every block was freed after its forward.
  const Estimate full = MustEstimate(s);
  CHECK(BytesIn(full.forwardEnd, Category::Parameters) == shards + 2 * plan.rootUnitElements);
  // SHARD_GRAD_OP keeps every block gathered from its forward to its backward.
  s.parallel.fsdp = FsdpMode::ShardGradOp;
  const Estimate kept = MustEstimate(s);
  CHECK(BytesIn(kept.forwardEnd, Category::Parameters) == shards + 2 * plan.rootUnitElements + 2 * blocks);
  s.parallel.fsdp = FsdpMode::FullyShard;
  s.parallel.reshardAfterForward = false;
  const Estimate kept2 = MustEstimate(s);
  CHECK(BytesIn(kept2.forwardEnd, Category::Parameters) - BytesIn(full.forwardEnd, Category::Parameters) >= 2 * blocks);
  // ZeRO-3: bf16 partitions (⌈n/8⌉ each; small tensors also whole) only. The embeddings were
  // released once block 0 ran and, the first step having no trace yet, the final norm and head
  // after their forward (zero3_fetch_test.cpp); neither is whole (131M elements each) any more.
  s.parallel.fsdp = FsdpMode::Off;
  s.parallel.zeroStage = 3;
  const Estimate zero3 = MustEstimate(s);
  const ShardPlan z = PlanShards(s, inventory);
  std::int64_t held = 0, rootPartitioned = 0;
  for (std::int64_t n : z.parameterElementsHeld) held += n;
  for (const Tensor& t : inventory.parameters) {
    if (t.layer < 0 && t.Elements() >= s.parallel.stage3ParamPersistenceThreshold) rootPartitioned += t.Elements();
  }
  CHECK(rootPartitioned == 2 * 32'000 * 2'048);  // embed_tokens and lm_head
  CHECK(BytesIn(zero3.forwardEnd, Category::Parameters) == 2 * held);
}

TEST_CASE("Parallel: a DeepSpeed config imports with auto values resolved as Hugging Face does", "[parallel]") {
  const Setup base = Llama7b();  // h = 4096
  const ParallelImport r = ImportDeepSpeedConfig(R"({
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 5e8,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}, "sub_group_size": 1e9},
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0})",
                                                 base);
  REQUIRE(r.ok());
  const ParallelDef& p = r.setup.parallel;
  CHECK(p.zeroStage == 3);
  CHECK(p.reduceBucketSize == 4096LL * 4096);
  CHECK(p.stage3PrefetchBucketSize == 15'099'494);  // int(0.9 × 4096²)
  CHECK(p.stage3ParamPersistenceThreshold == 40'960);
  CHECK(p.stage3MaxLiveParameters == 1'000'000'000);
  CHECK(p.stage3MaxReuseDistance == 500'000'000);
  CHECK(p.overlapComm == OverlapComm::On);
  CHECK(p.offload == OffloadKind::Optimizer);
  CHECK(r.setup.training.precision == Precision::BF16Mixed);
  CHECK(r.setup.training.batchSize == 4);
  CHECK(std::find(r.ignoredFields.begin(), r.ignoredFields.end(), "gradient_clipping") != r.ignoredFields.end());
  CHECK(p.subGroupSize == 1'000'000'000);  // read, not ignored: ZeRO-3 steps the optimizer by sub-groups
  CHECK(std::find(r.ignoredFields.begin(), r.ignoredFields.end(), "zero_optimization.sub_group_size") == r.ignoredFields.end());
  // Wrong values name their field; "auto" needs a hidden size.
  CHECK(HasErrorOn(ImportDeepSpeedConfig(R"({"zero_optimization": {"stage": 5}})", base).errors, "zero_optimization.stage"));
  CHECK(HasErrorOn(ImportDeepSpeedConfig(R"({"zero_optimization": {"reduce_bucket_size": -1}})", base).errors,
                   "zero_optimization.reduce_bucket_size"));
  CHECK(HasErrorOn(ImportDeepSpeedConfig(R"({"zero_optimization": {"reduce_bucket_size": "auto"}})", DefaultSetup()).errors,
                   "zero_optimization.reduce_bucket_size"));
  CHECK(HasErrorOn(ImportDeepSpeedConfig(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})", base).errors,
                   "zero_optimization.offload_param.device"));
  CHECK(!ImportDeepSpeedConfig("[1, 2", base).ok());
}

TEST_CASE("Parallel: Megatron's arguments import from a pasted command line", "[parallel]") {
  const ParallelImport r = ImportMegatronArguments(
      "torchrun pretrain_gpt.py --tensor-model-parallel-size 4 \\\n --pipeline-model-parallel-size=2 --sequence-parallel "
      "--use-distributed-optimizer --micro-batch-size 2 --seq-length 4096 --bf16 --num-layers-per-virtual-pipeline-stage 4 "
      "--lr 3e-4",
      Llama7b());
  REQUIRE(r.ok());
  const ParallelDef& p = r.setup.parallel;
  CHECK(p.tensorParallel == 4);
  CHECK(p.pipelineParallel == 2);
  CHECK(p.sequenceParallel);
  CHECK(p.zeroStage == 1);
  CHECK(p.pipelineSchedule == PipelineSchedule::Interleaved);
  CHECK(p.virtualStages == 4);  // 32 layers / 2 stages / 4 per virtual stage
  CHECK(r.setup.training.batchSize == 2);
  CHECK(r.setup.training.sequenceLength == 4096);
  CHECK(r.setup.training.precision == Precision::BF16Mixed);
  CHECK(std::find(r.ignoredFields.begin(), r.ignoredFields.end(), "--lr") != r.ignoredFields.end());
  CHECK(HasErrorOn(ImportMegatronArguments("--tensor-model-parallel-size x", Llama7b()).errors, "--tensor-model-parallel-size"));
  CHECK(HasErrorOn(ImportMegatronArguments("--tensor-model-parallel-size -2", Llama7b()).errors, "--tensor-model-parallel-size"));
}

TEST_CASE("Parallel: gradient accumulation keeps gradients across micro-batches", "[parallel]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("gpt2")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 256;
  const Estimate one = MustEstimate(s);
  s.parallel.gradientAccumulationSteps = 2;
  const Estimate two = MustEstimate(s);
  const Estimate three = MustEstimate([&] { Setup t = s; t.parallel.gradientAccumulationSteps = 3; return t; }());
  const auto forward = static_cast<std::size_t>(Phase::Forward);
  const std::int64_t grads = one.modelStates.gradientsBytes;
  // The second micro-batch's forward runs with the first one's gradients alive.
  CHECK(two.phasePeaks[forward].totalBytes - one.phasePeaks[forward].totalBytes == grads);
  // From the second micro-batch on nothing more accumulates: three peak as two.
  CHECK(three.peak.totalBytes == two.peak.totalBytes);
  CHECK(two.eventCount > one.eventCount);
  // The work budget counts every micro-batch.
  s.parallel.gradientAccumulationSteps = 100'000;
  CHECK(HasErrorOn(Validate(s), "parallel.gradientAccumulationSteps"));
}

TEST_CASE("Parallel: the fewest GPUs of a type that train a model", "[parallel]") {
  Setup small = DefaultSetup();
  small.model.kind = ModelKind::Transformer;
  small.model.architecture = FindPreset("gpt2")->architecture;
  small.training.sequenceLength = 256;
  const FewestGpusResult one = FewestGpus(small);
  REQUIRE(one.found);
  CHECK(one.gpus == 1);
  CHECK(one.candidate.label == "DDP");  // the setup as given, one GPU
  CHECK(one.estimates == 1);

  Setup big = Llama7b();
  big.gpu.memoryGiB = 40;
  // With offload one 40 GiB GPU holds 7B in bf16 (ZeRO-Offload's claim for ~10B on 32 GB).
  const FewestGpusResult offloaded = FewestGpus(big);
  REQUIRE(offloaded.found);
  CHECK(offloaded.gpus == 1);
  CHECK(offloaded.candidate.offload);
  const FewestGpusResult r = FewestGpus(big, 4096, /*allowOffload=*/false);
  REQUIRE(r.found);
  CHECK(r.gpus > 1);
  CHECK_FALSE(r.candidate.offload);
  INFO(r.gpus << " GPUs, " << r.candidate.label);
  const EstimateResult chosen = EstimateMemory(r.layout);
  REQUIRE(chosen.ok());
  CHECK(chosen.estimate.fits);
  CHECK(chosen.estimate.device.peakDeviceBytes == r.peakDeviceBytes);
  // Fewest: nothing fits on half as many.
  if (r.gpus > 1) {
    for (std::int64_t stage = 0; stage <= 3; ++stage) {
      for (OffloadKind offload : {OffloadKind::None}) {
        Setup half = big;
        half.parallel.dataParallel = r.gpus / 2;
        half.parallel.zeroStage = stage;
        half.parallel.offload = offload;
        if (!Validate(half).empty()) continue;
        CHECK_FALSE(MustEstimate(half).fits);
      }
    }
  }
  // A GPU too small for anything: not found, and says so by `found`.
  big.gpu.memoryGiB = 1;
  CHECK_FALSE(FewestGpus(big, 64).found);
}

// runtime.hostMemoryGiB: the host RAM of one node. What offloading keeps there
// (estimate.host.nodeBytes, host_memory.cpp) is checked against it; the GPU verdict stays the
// device figure's. The fewest-GPUs search skips an offload the host cannot hold and, when its
// answer offloads, also gives the fewest GPUs without offloading.
TEST_CASE("Parallel: the host memory per node bounds offloading", "[parallel]") {
  Setup big = Llama7b();
  big.gpu.memoryGiB = 40;
  const FewestGpusResult free = FewestGpus(big);
  REQUIRE(free.found);
  REQUIRE(free.candidate.offload);
  CHECK(free.gpus == 1);
  CHECK(free.hostTooSmall == 0);
  const Estimate chosen = MustEstimate(free.layout);
  CHECK(free.hostNodeBytes == chosen.host.nodeBytes);
  CHECK(free.hostNodeBytes > 0);
  CHECK(chosen.host.capacityBytes == 0);  // not stated: nothing to check against
  CHECK(chosen.host.fits);
  // The answer without offloading is the search that never offloads.
  const FewestGpusResult plain = FewestGpus(big, 4096, /*allowOffload=*/false);
  REQUIRE(free.withoutOffload.found);
  CHECK(free.withoutOffload.gpus == plain.gpus);
  CHECK(free.withoutOffload.candidate.label == plain.candidate.label);
  CHECK(free.withoutOffload.peakDeviceBytes == plain.peakDeviceBytes);
  CHECK(free.withoutOffload.hostNodeBytes == 0);

  // A host one byte short of what that layout keeps there: the estimate says so, the GPU
  // verdict does not change, and the search moves on.
  Setup tight = free.layout;
  tight.runtime.hostMemoryGiB = static_cast<double>(free.hostNodeBytes - 1) / 1073741824.0;
  const Estimate short_ = MustEstimate(tight);
  CHECK(short_.host.capacityBytes == std::llround(tight.runtime.hostMemoryGiB * 1073741824.0));
  CHECK_FALSE(short_.host.fits);
  CHECK(short_.fits == chosen.fits);
  CHECK(short_.device.peakDeviceBytes == chosen.device.peakDeviceBytes);
  CHECK(std::any_of(short_.notes.begin(), short_.notes.end(),
                    [](const std::string& n) { return n.rfind("Host memory:", 0) == 0; }));
  tight.runtime.hostMemoryGiB = static_cast<double>(free.hostNodeBytes) / 1073741824.0 + 1.0;
  CHECK(MustEstimate(tight).host.fits);

  Setup smallHost = big;
  smallHost.runtime.hostMemoryGiB = static_cast<double>(free.hostNodeBytes - 1) / 1073741824.0;
  const FewestGpusResult bounded = FewestGpus(smallHost);
  REQUIRE(bounded.found);
  CHECK(bounded.hostTooSmall > 0);
  CHECK(bounded.gpus > 1);
  CHECK(bounded.hostNodeBytes <= std::llround(smallHost.runtime.hostMemoryGiB * 1073741824.0));
  CHECK(MustEstimate(bounded.layout).host.fits);

  // The cluster layouts skip the same offloads.
  const LayoutsResult all = LayoutsForCluster(big, 1);
  const LayoutsResult some = LayoutsForCluster(smallHost, 1);
  REQUIRE(all.ok());
  REQUIRE(some.ok());
  CHECK(some.hostTooSmall > 0);
  CHECK(some.layouts.size() < all.layouts.size());
  for (const LayoutRow& row : some.layouts) CHECK(row.hostNodeBytes <= free.hostNodeBytes - 1);

  // The field is validated by its label's path.
  for (double bad : {-1.0, std::nan(""), 2e9}) {
    Setup s = big;
    s.runtime.hostMemoryGiB = bad;
    CHECK(HasErrorOn(Validate(s), "runtime.hostMemoryGiB"));
  }
}

TEST_CASE("Parallel: imports and the fewest GPUs as JSON for the page and the CLI", "[parallel]") {
  const std::string base = R"({"model":{"preset":"llama-2-7b"},"training":{"sequenceLength":512}})";
  const std::string ds = ImportDeepSpeedJson(R"({"zero_optimization":{"stage":2,"reduce_bucket_size":"auto"}})", base);
  CHECK(ds.find("\"ok\":true") != std::string::npos);
  CHECK(ds.find("\"reduceBucketSize\":16777216") != std::string::npos);  // 4096²
  CHECK(ImportDeepSpeedJson("{", base).find("\"ok\":false") != std::string::npos);
  CHECK(ImportDeepSpeedJson("{}", R"({"training":{"batchSize":-1}})").find("training.batchSize") != std::string::npos);
  const std::string mg = ImportMegatronJson("--tensor-model-parallel-size 2 --use-distributed-optimizer", base);
  CHECK(mg.find("\"tensorParallel\":2") != std::string::npos);
  CHECK(mg.find("\"zeroStage\":1") != std::string::npos);
  const std::string fewest = FewestGpusJson(R"({"model":{"preset":"llama-2-7b"},"training":{"sequenceLength":512,"precision":"bf16Mixed"},"gpu":{"memoryGiB":40}})", false);
  CHECK(fewest.find("\"found\":true") != std::string::npos);
  // 4, with ZeRO-3: each rank's partition (1.68e9 elements) is two sub-groups of
  // sub_group_size (1e9): 1,002,478,592 and 682,125,312 elements, each with its own fp32 flat,
  // stepped one at a time (zero3_step_test.cpp), so the step's fp32 gradient and Adam's
  // temporaries are a sub-group's, not the partition's: 39.66 GiB on the device of 40 (33.50 GiB
  // allocated at the peak, Adam's sqrt of sub-group 0). Before sub-groups were simulated the
  // answer was 8 (ZeRO-1).
  CHECK(fewest.find("\"gpus\":4") != std::string::npos);
  CHECK(fewest.find("\"layout\":\"ZeRO-3\"") != std::string::npos);
  CHECK(FewestGpusJson(R"({"parallel":{"zeroStage":9}})").find("parallel.zeroStage") != std::string::npos);
  // With offload allowed the answer offloads: its host memory and the answer without offloading.
  const std::string offloaded = FewestGpusJson(R"({"model":{"preset":"llama-2-7b"},"training":{"sequenceLength":512,"precision":"bf16Mixed"},"gpu":{"memoryGiB":40}})", true);
  CHECK(offloaded.find("\"offload\":true") != std::string::npos);
  CHECK(offloaded.find("\"withoutOffload\":{\"gpus\":") != std::string::npos);
  CHECK(offloaded.find("\"hostTooSmall\":0") != std::string::npos);
}

TEST_CASE("Parallel: ZeroRedundancyOptimizer gives whole parameters to ranks and the heaviest is simulated", "[parallel]") {
  // Weights 1024×512, 1024×1024, 512×1024 and biases: largest first, each to the lightest rank.
  Setup s = LayerSetup({Linear(512, 1024), Activation(LayerKind::ReLU), Linear(1024, 1024), Activation(LayerKind::ReLU),
                        Linear(1024, 512)},
                       LossKind::MSE, 32, 1, Precision::FP32, OptimizerKind::Adam);
  s.parallel.dataParallel = 2;
  s.parallel.zeroRedundancyOptimizer = true;
  const Inventory inventory = BuildInventory(s);
  const ZeroRedundancyAssignment a = AssignZeroRedundancy(inventory, 2);
  // 1024×1024 → rank 0; both 524,288-element weights → rank 1 (then a tie); the biases to the
  // lighter rank, the first on a tie.
  CHECK(a.elementsPerRank[0] + a.elementsPerRank[1] == inventory.TrainableCount());
  CHECK(a.rankOf[2] == 0);  // the 1024×1024 weight, largest
  CHECK(a.rankOf[0] == 1);  // the first 1024×512 weight
  const Estimate e = MustEstimate(s);
  CHECK(e.rank.dataParallelRank == a.heaviestRank);
  CHECK(e.modelStates.optimizerStatesBytes == 8 * a.elementsPerRank[static_cast<std::size_t>(a.heaviestRank)]);
  CHECK(e.rank.engineLabel == "DDP + ZeroRedundancyOptimizer");
  // Not with a ZeRO stage, FSDP, one rank or fp32 masters.
  Setup wrong = s;
  wrong.parallel.zeroStage = 1;
  CHECK(HasErrorOn(Validate(wrong), "parallel.zeroRedundancyOptimizer"));
  wrong = s;
  wrong.parallel.dataParallel = 1;
  CHECK(HasErrorOn(Validate(wrong), "parallel.zeroRedundancyOptimizer"));
  wrong = s;
  wrong.training.precision = Precision::BF16Mixed;
  CHECK(HasErrorOn(Validate(wrong), "parallel.zeroRedundancyOptimizer"));
}

TEST_CASE("Parallel: combinations the sharded step does not simulate are refused by name", "[parallel]") {
  Setup lora = Llama7b();
  lora.parallel.dataParallel = 8;
  lora.parallel.zeroStage = 2;
  lora.finetune.lora = true;
  // Fine-tuning with ZeRO 1–2 is simulated (finetune_parallel_test.cpp) where the adapters are in
  // the weights' dtype, as DeepSpeed's module.bfloat16() makes them; fp32 adapters are refused.
  CHECK(HasErrorOn(Validate(lora), "parallel.zeroStage"));
  lora.finetune.adapterDType = AdapterDType::Weights;
  CHECK(Validate(lora).empty());
  lora.parallel.zeroStage = 0;
  lora.parallel.fsdp = FsdpMode::FullyShard;  // FSDP2 with frozen parameters (fsdp2_finetune_test.cpp)
  CHECK(Validate(lora).empty());
  lora.parallel.offload = OffloadKind::Optimizer;  // its CPU offload with adapters: not yet
  CHECK(HasErrorOn(Validate(lora), "parallel.offload"));
  lora.parallel = ParallelDef{};
  CHECK(Validate(lora).empty());  // one GPU with adapters is simulated

  Setup inBackward = Llama7b();
  inBackward.training.optimizerInBackward = true;
  CHECK(Validate(inBackward).empty());
  inBackward.parallel.dataParallel = 2;
  CHECK(HasErrorOn(Validate(inBackward), "parallel.dataParallel"));
  inBackward.parallel.dataParallel = 1;
  inBackward.parallel.gradientAccumulationSteps = 4;
  CHECK(HasErrorOn(Validate(inBackward), "parallel.gradientAccumulationSteps"));
}

// The page's cluster picture reads where each state lives from rank.holds (SimulatedRankOf).
TEST_CASE("Parallel: the rank says where each model state lives", "[parallel]") {
  auto holds = [](const Setup& s) {
    const SimulatedRank r = SimulatedRankOf(s);
    return r.parametersHeld + " " + r.masterWeightsHeld + " " + r.gradientsHeld + " " + r.optimizerStatesHeld;
  };
  CHECK(holds(Zero(7'500'000'000, 64, 0)) == "replicated replicated replicated replicated");
  CHECK(holds(Zero(7'500'000'000, 64, 1)) == "replicated sharded replicated sharded");
  CHECK(holds(Zero(7'500'000'000, 64, 2)) == "replicated sharded sharded sharded");
  CHECK(holds(Zero(7'500'000'000, 64, 3)) == "sharded sharded sharded sharded");
  Setup offload = Zero(7'500'000'000, 64, 3);
  offload.parallel.offload = OffloadKind::Optimizer;
  CHECK(holds(offload) == "sharded host host host");
  offload.parallel.offload = OffloadKind::OptimizerAndParameters;
  CHECK(holds(offload) == "host host host host");
  Setup fsdp = Llama7b();
  fsdp.parallel.dataParallel = 8;
  fsdp.parallel.fsdp = FsdpMode::FullShard;
  CHECK(holds(fsdp) == "sharded none sharded sharded");
  fsdp.parallel.offload = OffloadKind::Optimizer;
  CHECK(holds(fsdp) == "sharded none host host");
  // In the estimate JSON, beside the rank's other fields; one GPU writes no rank at all.
  const std::string json = EstimateJson(R"({"model":{"kind":"parameterCount","parameterCount":7.5e9},"parallel":{"dataParallel":64,"zeroStage":2}})");
  CHECK(json.find(R"("holds":{"parameters":"replicated","masterWeights":"sharded","gradients":"sharded","optimizerStates":"sharded"})") != std::string::npos);
  CHECK(EstimateJson("{}").find("\"holds\"") == std::string::npos);
}

TEST_CASE("Parallel: FSDP without limit_all_gathers says its estimate is a floor", "[parallel]") {
  // The rate limiter (_runtime_utils.py _unshard: at most two all-gathers in flight) is what the
  // simulation's one-unit-ahead gathering assumes; without it the CPU may run ahead.
  Setup s = test::SmallLlama(2);
  s.parallel.dataParallel = 4;
  s.parallel.fsdp = FsdpMode::FullShard;
  auto floorNote = [](const Estimate& e) {
    return std::any_of(e.notes.begin(), e.notes.end(),
                       [](const std::string& n) { return n.find("limit_all_gathers off") != std::string::npos; });
  };
  CHECK_FALSE(floorNote(MustEstimate(s)));
  s.parallel.limitAllGathers = false;
  const Estimate off = MustEstimate(s);
  CHECK(floorNote(off));
  s.parallel.limitAllGathers = true;
  CHECK(off.peak.totalBytes == MustEstimate(s).peak.totalBytes);  // the same simulation either way
}
