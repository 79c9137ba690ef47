// Layouts for N GPUs (docs/parallel.md, "Layouts for N GPUs"): the cost formulas pinned on
// small cases, the enumeration's bounds and counts, and the ranking.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// A small Llama: h = 256, 4 layers, 8 heads (tensor parallel 2, 4 and 8 divide everything).
Setup SmallLlama() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;
  s.model.architecture.hiddenSize = 256;
  s.model.architecture.numLayers = 4;
  s.model.architecture.numHeads = 8;
  s.model.architecture.numKeyValueHeads = 8;
  s.model.architecture.intermediateSize = 512;
  s.model.architecture.vocabSize = 1024;
  s.training.precision = Precision::BF16Mixed;
  s.training.batchSize = 2;
  s.training.sequenceLength = 128;
  return s;
}

double Psi(const Setup& s) { return static_cast<double>(BuildInventory(TensorParallelRankSetup(s)).ParameterCount()); }

}  // namespace

TEST_CASE("Layouts: data-parallel communication is the ZeRO paper's 2Ψ and 3Ψ over a ring", "[layouts]") {
  Setup s = SmallLlama();
  const double psi = Psi(s);
  s.parallel.dataParallel = 4;
  // DDP: one all-reduce of 16-bit gradients, 2 · (d − 1)/d · Ψ · 2 B.
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx(2 * 0.75 * psi * 2));
  s.parallel.zeroStage = 1;
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx(2 * 0.75 * psi * 2));
  s.parallel.zeroStage = 3;
  const double zero3 = LayoutCostOf(s).dataParallelBytes;
  CHECK(zero3 == Approx(3 * 0.75 * psi * 2));
  s.parallel.zeroStage = 0;
  s.parallel.fsdp = FsdpMode::FullShard;
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx(zero3));
  // Gradient accumulation: DDP reduces once per step (no_sync), ZeRO-2 every micro-batch, ZeRO-3
  // gathers and reduces every micro-batch.
  s.parallel.fsdp = FsdpMode::Off;
  s.parallel.gradientAccumulationSteps = 4;
  s.parallel.zeroStage = 0;
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx(2 * 0.75 * psi * 2));
  s.parallel.zeroStage = 2;
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx((4 + 1) * 0.75 * psi * 2));
  s.parallel.zeroStage = 3;
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx(4 * 3 * 0.75 * psi * 2));
  // fp32 moves 4-byte elements; one data-parallel rank moves nothing.
  s.parallel.zeroStage = 0;
  s.parallel.gradientAccumulationSteps = 1;
  s.training.precision = Precision::FP32;
  CHECK(LayoutCostOf(s).dataParallelBytes == Approx(2 * 0.75 * psi * 4));
  s.parallel.dataParallel = 1;
  CHECK(LayoutCostOf(s).communicationBytes == 0);
  CHECK(LayoutCostOf(s).computeFactor == 1);
}

TEST_CASE("Layouts: tensor parallel is four all-reduces of b·s·h per layer and six with recompute", "[layouts]") {
  Setup s = SmallLlama();
  s.parallel.tensorParallel = 4;
  const double bsh = 2.0 * 128 * 256 * 2;  // b · s · h · 2 B
  // 4 layers × 4 all-reduces × 2 · (t − 1)/t of b·s·h.
  CHECK(LayoutCostOf(s).tensorParallelBytes == Approx(4 * 4 * 2 * 0.75 * bsh));
  s.training.checkpointing = Checkpointing::EveryBlock;
  const LayoutCost c = LayoutCostOf(s);
  CHECK(c.tensorParallelBytes == Approx(4 * 6 * 2 * 0.75 * bsh));
  CHECK(c.recomputeFactor == Approx(4.0 / 3.0));
  CHECK(c.computeFactor == Approx(4.0 / 3.0));
  // Sequence parallel moves the same volume.
  s.parallel.sequenceParallel = true;
  CHECK(LayoutCostOf(s).tensorParallelBytes == Approx(c.tensorParallelBytes));
}

TEST_CASE("Layouts: the pipeline bubble is (p − 1) / (m·v + p − 1) and its p2p b·s·h per micro-batch", "[layouts]") {
  Setup s = SmallLlama();
  const double bsh = 2.0 * 128 * 256 * 2;
  s.parallel.pipelineParallel = 4;
  s.parallel.gradientAccumulationSteps = 8;
  LayoutCost c = LayoutCostOf(s);
  CHECK(c.bubbleFraction == Approx(3.0 / 11.0));
  CHECK(c.computeFactor == Approx(11.0 / 8.0));
  CHECK(c.pipelineBytes == Approx(2 * 8 * bsh));
  s.parallel.pipelineSchedule = PipelineSchedule::Interleaved;
  s.parallel.virtualStages = 2;
  c = LayoutCostOf(s);
  CHECK(c.bubbleFraction == Approx(3.0 / 19.0));
  CHECK(c.pipelineBytes == Approx(2 * 8 * 2 * bsh));
}

TEST_CASE("Layouts: offload moves the gradient partition out and the parameters back over PCIe", "[layouts]") {
  Setup s = SmallLlama();
  const double psi = Psi(s);
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 2;
  CHECK(LayoutCostOf(s).hostBytes == 0);
  s.parallel.offload = OffloadKind::Optimizer;
  CHECK(LayoutCostOf(s).hostBytes == Approx(psi / 4 * 2 + psi / 4 * 2));
  s.parallel.zeroStage = 3;
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  s.parallel.gradientAccumulationSteps = 2;
  CHECK(LayoutCostOf(s).hostBytes == Approx(psi / 4 * (2 * 2 + 2) + psi / 4 * 2 * 2 * 2));
}

TEST_CASE("Layouts: a small model on 4 GPUs ranks the 2Ψ layouts before the 3Ψ ones", "[layouts]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("gpt2")->architecture;
  s.training.sequenceLength = 256;
  const LayoutsResult r = LayoutsForCluster(s, 4);
  REQUIRE(r.ok());
  // ZeRO-2/3 and FSDP with pipeline stages are refused (DeepSpeed refuses them).
  CHECK(r.refused > 0);
  // Everything fits: every checkpointed and offloaded twin is dominated.
  CHECK(r.notFitting == 0);
  CHECK(r.dominated > 0);
  CHECK(r.estimates == static_cast<std::int64_t>(r.layouts.size()));
  CHECK(r.candidates == r.refused + r.dominated + r.estimates + r.notEstimated);
  // pp = 1: tp 4 alone; tp 2 × dp 2 and dp 4 with DDP, ZeRO-1, ZeRO-2, ZeRO-3, FSDP FULL_SHARD;
  // then the pipelines: pp 2 × tp 2, pp 2 × dp 2 with DDP or ZeRO-1, and pp 4 alone.
  REQUIRE(r.layouts.size() == 15);
  for (std::size_t i = 0; i < r.layouts.size(); ++i) {
    const LayoutRow& row = r.layouts[i];
    INFO(i << ": " << row.sharding << " dp " << row.dataParallel << " tp " << row.tensorParallel << " pp " << row.pipelineParallel);
    CHECK(row.dataParallel * row.tensorParallel * row.pipelineParallel == 4);
    // Without a bubble first: the eleven pp = 1 layouts rank before every pipeline.
    CHECK((row.pipelineParallel == 1) == (i < 11));
    if (row.pipelineParallel > 1) CHECK(row.cost.bubbleFraction > 0);
    CHECK_FALSE(row.checkpointing);
    CHECK(row.offload == "none");
    const Estimate e = MustEstimate(row.setup);
    CHECK(e.fits);
    CHECK(e.device.peakDeviceBytes == row.peakDeviceBytes);
  }
  // At 256 tokens tensor parallelism moves the fewest bytes: tp 4 first, then tp 2 × dp 2.
  CHECK(r.layouts[0].tensorParallel == 4);
  CHECK(r.layouts[1].tensorParallel == 2);
  // Among the dp = 4 rows: 2Ψ first (the smallest device figure first among equal costs), then 3Ψ.
  std::vector<LayoutRow> dp4;
  for (const LayoutRow& row : r.layouts) if (row.dataParallel == 4) dp4.push_back(row);
  REQUIRE(dp4.size() == 5);
  CHECK(dp4[0].cost.communicationBytes == dp4[2].cost.communicationBytes);
  CHECK(dp4[0].peakDeviceBytes <= dp4[1].peakDeviceBytes);
  CHECK(dp4[3].cost.communicationBytes == Approx(1.5 * dp4[0].cost.communicationBytes));
  CHECK((dp4[3].sharding == "ZeRO-3" || dp4[3].sharding == "FSDP FULL_SHARD"));
}

TEST_CASE("Layouts: the context-parallel ranks take their share of the GPUs", "[layouts]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("tinyllama-1.1b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 512;
  s.training.attention = AttentionImplementation::SDPA;  // ring attention runs on fused kernels
  s.parallel.contextParallel = 2;
  const LayoutsResult r = LayoutsForCluster(s, 8, {.allowOffload = false});
  REQUIRE(r.ok());
  REQUIRE_FALSE(r.layouts.empty());
  for (const LayoutRow& row : r.layouts) {
    CHECK(row.dataParallel * row.tensorParallel * row.pipelineParallel * 2 == 8);
    CHECK(row.setup.parallel.contextParallel == 2);
    CHECK(WorldSize(row.setup.parallel) == 8);
  }
  // An odd N cannot hold two context-parallel ranks per replica: no layout.
  CHECK(LayoutsForCluster(s, 3, {.allowOffload = false}).layouts.empty());
}

TEST_CASE("Layouts: Llama 2 7B on 4 × 80 GiB prefers tensor parallel within the node to ZeRO-3", "[layouts]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 512;
  s.gpu.memoryGiB = 80;
  const LayoutsResult r = LayoutsForCluster(s, 4, {.allowOffload = false});
  REQUIRE(r.ok());
  REQUIRE_FALSE(r.layouts.empty());
  INFO(r.layouts[0].sharding << " dp " << r.layouts[0].dataParallel << " tp " << r.layouts[0].tensorParallel);
  // tp = 4 moves 32 layers × 4 × 1.5 × b·s·h ≈ 0.8 GB per step; ZeRO-3 over 4 moves 3 · 0.75 · Ψ · 2 B ≈ 30 GB.
  CHECK(r.layouts[0].tensorParallel == 4);
  CHECK(r.layouts[0].cost.communicationBytes < 1e9);
  bool zero3 = false;
  for (const LayoutRow& row : r.layouts) {
    CHECK(row.cost.hostBytes == 0);
    if (row.dataParallel == 4) {
      CHECK(row.sharding != "DDP");  // 16Ψ = 108 GB does not fit on 80 GiB
      zero3 = zero3 || row.sharding == "ZeRO-3";
    }
  }
  CHECK(zero3);
  // Ranked: no row before a cheaper one.
  for (std::size_t i = 1; i < r.layouts.size(); ++i) {
    const LayoutCost& a = r.layouts[i - 1].cost;
    const LayoutCost& b = r.layouts[i].cost;
    CHECK((a.computeFactor < b.computeFactor - 1e-9 ||
           (std::abs(a.computeFactor - b.computeFactor) <= 1e-9 && a.communicationBytes <= b.communicationBytes)));
  }
}

TEST_CASE("Layouts: the search is bounded and its inputs validated", "[layouts]") {
  Setup s = SmallLlama();
  const LayoutsResult few = LayoutsForCluster(s, 8, {.maxEstimates = 3});
  REQUIRE(few.ok());
  CHECK(few.estimates == 3);
  CHECK(few.notEstimated > 0);
  CHECK(few.candidates == few.refused + few.dominated + few.estimates + few.notEstimated);
  CHECK(HasErrorOn(LayoutsForCluster(s, 0).errors, "gpus"));
  CHECK(HasErrorOn(LayoutsForCluster(s, -8).errors, "gpus"));
  CHECK(HasErrorOn(LayoutsForCluster(s, kMaxLayoutGpus + 1).errors, "gpus"));
  CHECK(HasErrorOn(LayoutsForCluster(s, 8, {.maxEstimates = 0}).errors, "maxEstimates"));
  CHECK(HasErrorOn(LayoutsForCluster(s, 8, {.maxEstimates = kMaxLayoutEstimates + 1}).errors, "maxEstimates"));
  s.training.batchSize = -1;
  CHECK(HasErrorOn(LayoutsForCluster(s, 8).errors, "training.batchSize"));
  // A prime count of GPUs above 8: only data parallel (and pipeline where it divides).
  const LayoutsResult prime = LayoutsForCluster(SmallLlama(), 11, {.allowOffload = false});
  REQUIRE(prime.ok());
  for (const LayoutRow& row : prime.layouts) CHECK(row.dataParallel * row.tensorParallel * row.pipelineParallel == 11);
}

TEST_CASE("Layouts: the JSON request and envelope", "[layouts]") {
  const std::string ok = LayoutsJson(R"({"setup":{"model":{"preset":"gpt2"},"training":{"sequenceLength":128}},"gpus":2,"allowOffload":false})");
  CHECK(ok.find("\"ok\":true") != std::string::npos);
  CHECK(ok.find("\"sharding\":\"ZeRO-2\"") != std::string::npos);
  CHECK(ok.find("\"bubbleFraction\"") != std::string::npos);
  CHECK(ok.find("\"dataParallel\":2") != std::string::npos);
  CHECK(LayoutsJson("{").find("malformedJson") != std::string::npos);
  CHECK(LayoutsJson("[]").find("\"ok\":false") != std::string::npos);
  CHECK(LayoutsJson(R"({"gpus":"8"})").find("\"field\":\"gpus\"") != std::string::npos);
  CHECK(LayoutsJson(R"({"gpus":0})").find("\"field\":\"gpus\"") != std::string::npos);
  CHECK(LayoutsJson(R"({"gpus":8,"allowOffload":1})").find("allowOffload") != std::string::npos);
  CHECK(LayoutsJson(R"({"gpus":8,"nodes":2})").find("unknownField") != std::string::npos);
  CHECK(LayoutsJson(R"({"setup":{"training":{"batchSize":0}},"gpus":8})").find("training.batchSize") != std::string::npos);
}
