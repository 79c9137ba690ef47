// The views: every cell, point and verdict is checked against EstimateMemory of the same setup
// (so a view that reported a different peak, or the wrong GPU verdict, fails here).
#include <catch2/catch.hpp>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "gpumem/gpus.hpp"
#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/views.hpp"
#include "device/device_stage.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup PresetSetup(const char* id, std::int64_t batch, std::int64_t sequence, double gib) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset(id)->architecture;
  s.training.batchSize = batch;
  s.training.sequenceLength = sequence;
  s.training.precision = Precision::AmpBF16;
  s.gpu.memoryGiB = gib;
  return s;
}

ViewOptions Options(const Setup& s, int axisValues = 8, int curvePoints = 12) {
  ViewOptions o;
  o.setup = s;
  o.axisValues = axisValues;
  o.curvePoints = curvePoints;
  return o;
}

void CheckPointMatches(const PeakPoint& p, const Setup& s) {
  const EstimateResult r = EstimateMemory(s);
  REQUIRE(r.ok() == p.ok);
  if (!p.ok) return;
  CHECK(p.peakBytes == r.estimate.device.peakDeviceBytes);
  CHECK(p.fits == r.estimate.fits);
  CHECK(p.dominant == r.estimate.peakDominant.category);
  CHECK(p.dominantBytes == r.estimate.peakDominant.bytes);
}

bool Contains(const std::vector<std::int64_t>& v, std::int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

TEST_CASE("heat map axes respect the position table and include the current values", "[views]") {
  const Setup gpt2 = PresetSetup("gpt2", 3, 300, 24);
  const std::vector<std::int64_t> seq = SequenceAxis(gpt2, 8);
  CHECK(seq.back() == 1024);  // GPT-2's maxPositionEmbeddings
  CHECK(seq.front() == 8);    // 8 powers of two: 8 … 1024
  CHECK(Contains(seq, 300));
  CHECK(seq.size() == 9);
  const std::vector<std::int64_t> batch = BatchAxis(gpt2, 8);
  CHECK(batch == std::vector<std::int64_t>{1, 2, 3, 4, 8, 16, 32, 64, 128});

  // A table that is not a power of two (RoBERTa's 514) is the axis' last value.
  Setup roberta = PresetSetup("bert-base-uncased", 1, 512, 24);
  roberta.model.architecture.maxPositionEmbeddings = 514;
  const std::vector<std::int64_t> r = SequenceAxis(roberta, 4);
  CHECK(r == std::vector<std::int64_t>{128, 256, 512, 514});
  CHECK(SequenceLimit(roberta).value == 514);

  // No position table (Llama): a few doublings past the current length.
  const std::vector<std::int64_t> llama = SequenceAxis(PresetSetup("llama-3.2-1b", 1, 4096, 80), 8);
  CHECK(llama.back() == 16384);
  CHECK(llama.front() == 128);
}

TEST_CASE("every heat map cell is the peak of the same setup", "[views]") {
  const Setup s = PresetSetup("gpt2", 4, 512, 24);
  const HeatMap h = ComputeHeatMap(Options(s, 5));
  REQUIRE(h.ok());
  CHECK(h.capacityBytes == MustEstimate(s).gpuCapacityBytes);
  REQUIRE(h.cells.size() == h.batchSizes.size());
  CHECK(h.estimates == static_cast<int>(h.batchSizes.size() * h.sequenceLengths.size()));
  bool someFit = false, someMiss = false;
  for (std::size_t i = 0; i < h.batchSizes.size(); ++i) {
    REQUIRE(h.cells[i].size() == h.sequenceLengths.size());
    for (std::size_t j = 0; j < h.sequenceLengths.size(); ++j) {
      Setup c = s;
      c.training.batchSize = h.batchSizes[i];
      c.training.sequenceLength = h.sequenceLengths[j];
      CheckPointMatches(h.cells[i][j], c);
      someFit = someFit || h.cells[i][j].fits;
      someMiss = someMiss || !h.cells[i][j].fits;
      if (h.batchSizes[i] == 4 && h.sequenceLengths[j] == 512) CHECK(h.cells[i][j].peakBytes == MustEstimate(s).device.peakDeviceBytes);
    }
  }
  // 24 GiB for GPT-2 in autocast: small grids fit, batch 16 × 1024 does not — a boundary to draw.
  CHECK(someFit);
  CHECK(someMiss);
}

TEST_CASE("heat map axes stop at the token limit so every cell can be estimated", "[views]") {
  // A tiny layer list at exactly 1e10 tokens: each axis stops where batch × sequence would pass it.
  const Setup s = LayerSetup({Linear(4, 4)}, LossKind::MSE, 1'000'000, 10'000, Precision::FP32, OptimizerKind::Adam);
  const HeatMap h = ComputeHeatMap(Options(s, 3));
  REQUIRE(h.ok());
  CHECK(h.batchSizes.back() == 1'000'000);
  CHECK(h.sequenceLengths.back() == 10'000);
  for (const auto& row : h.cells) {
    for (const PeakPoint& p : row) CHECK(p.ok);
  }
}

TEST_CASE("the GPU matrix picks the cheapest fitting candidate for every GPU", "[views]") {
  // Llama 3.2 1B in fp32 with eager attention: the small GPUs need changes, the large ones not.
  Setup s = PresetSetup("llama-3.2-1b", 4, 1024, 80);
  s.training.precision = Precision::FP32;
  s.training.optimizer = OptimizerKind::AdamW;
  const GpuMatrix m = ComputeGpuMatrix(Options(s));
  REQUIRE(m.ok());
  REQUIRE(m.gpus.size() == Gpus().size());
  REQUIRE(!m.candidates.empty());
  CHECK(m.candidates.front().tier == ChangeTier::AsIs);
  CHECK(m.currentPeakBytes == MustEstimate(s).device.peakDeviceBytes);
  for (std::size_t i = 1; i < m.candidates.size(); ++i) {
    CHECK(static_cast<int>(m.candidates[i - 1].tier) <= static_cast<int>(m.candidates[i].tier));
  }
  for (const SettingsCandidate& c : m.candidates) CheckPointMatches(c.peak, c.setup);
  bool sawAsIs = false, sawChange = false, sawNone = false;
  for (std::size_t g = 0; g < m.gpus.size(); ++g) {
    const GpuFit& f = m.gpus[g];
    CAPTURE(f.id);
    CHECK(f.id == Gpus()[g].id);
    if (f.fits) {
      // The chosen setup, estimated on this GPU, fits with the stated headroom…
      Setup on = m.candidates[f.choice].setup;
      on.gpu.id = f.id;
      on.gpu.memoryGiB = f.memoryGiB;
      const Estimate e = MustEstimate(on);
      CHECK(e.fits);
      CHECK(e.gpuCapacityBytes == f.capacityBytes);
      CHECK(e.headroomBytes == f.headroomBytes);
      // …and no cheaper candidate does.
      for (int k = 0; k < f.choice; ++k) CHECK(m.candidates[k].peak.peakBytes > f.capacityBytes);
      (f.choice == 0 ? sawAsIs : sawChange) = true;
    } else {
      CHECK(f.choice == -1);
      for (const SettingsCandidate& c : m.candidates) CHECK(c.peak.peakBytes > f.capacityBytes);
      sawNone = true;
    }
  }
  // Both verdicts occur for this setup, or the test would not exercise the search.
  CHECK(sawAsIs);
  CHECK(sawChange);
  (void)sawNone;
}

TEST_CASE("the GPU matrix says when nothing fits", "[views]") {
  Setup s = QuickSetup(400'000'000'000, Precision::FP32, OptimizerKind::Adam);  // 400B parameters
  const GpuMatrix m = ComputeGpuMatrix(Options(s));
  REQUIRE(m.ok());
  for (const GpuFit& f : m.gpus) {
    CHECK_FALSE(f.fits);
    REQUIRE(f.smallestPeakCandidate >= 0);
    for (const SettingsCandidate& c : m.candidates) CHECK(c.peak.peakBytes >= m.candidates[f.smallestPeakCandidate].peak.peakBytes);
  }
  // Every candidate was tried: 1 as is, the fused optimizer, then 3 precisions, 2 optimizers and 6 pairs.
  CHECK(m.candidates.size() == 13);
  // Once each: no candidate's floor leaves room on any GPU, so none is estimated again for the
  // GPUs of another cuBLAS workspace (52 before the floor: 13 on each of four workspace sizes).
  CHECK(m.estimates == 13);
}

TEST_CASE("the GPU matrix's floor: no GPU's device figure is below it, and no verdict moves by it", "[views]") {
  // Estimate::gpuIndependentPeakBytes plus a GPU's context and NCCL buffers must be at most that
  // GPU's device figure for the same setup, whatever its SM count (the CUDA reduction scratch,
  // sim/reduction.hpp) and workspace; and each GPU's choice must be the first candidate that
  // fits it when estimated on that GPU itself, as if nothing had been skipped.
  std::vector<Setup> setups;
  setups.push_back(PresetSetup("gpt2", 8, 1024, 80));  // Conv1D biases over 8,192 rows: scratch
  {
    Setup s = PresetSetup("llama-2-7b", 2, 1024, 80);
    s.training.precision = Precision::FP32;
    setups.push_back(s);  // the 24 GiB cards need changes, the 80 GiB ones fewer
  }
  {
    Setup s = PresetSetup("bert-base-uncased", 32, 512, 24);
    s.gpu.id = "nvidia-rtx-4090";
    setups.push_back(s);
    // Expandable segments size their virtual range by the capacity: every GPU on its own.
    s.runtime.allocator.expandableSegments = true;
    setups.push_back(s);
  }
  {
    // DeepSpeed ZeRO-2 flattens the parameters on the GPU only where they fit (by capacity).
    auto parsed = ParseSetupJson(R"({"model":{"preset":"llama-2-7b"},
        "training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","precision":"bf16Mixed","checkpointing":"everyBlock"},
        "parallel":{"dataParallel":8,"zeroStage":2},"gpu":{"id":"nvidia-h100-sxm"}})");
    REQUIRE(parsed.errors.empty());
    setups.push_back(parsed.setup);
  }
  bool sawScratch = false;
  for (const Setup& s : setups) {
    CAPTURE(s.model.architecture.hiddenSize, s.training.batchSize);
    const Estimate here = MustEstimate(s);
    CHECK(here.gpuIndependentPeakBytes <= here.peak.totalBytes);
    sawScratch = sawScratch || here.gpuIndependentPeakBytes < here.peak.totalBytes;
    for (const GpuModel& g : Gpus()) {
      CAPTURE(g.id);
      Setup on = s;
      on.gpu.id = g.id;
      on.gpu.memoryGiB = Limits::maxGpuMemoryGiB;
      const Estimate there = MustEstimate(on);
      CHECK(there.peak.totalBytes >= here.gpuIndependentPeakBytes);
      CHECK(there.device.peakDeviceBytes >= here.gpuIndependentPeakBytes + OutsideAllocatorBytes(DeviceOverheadsOf(on)));
    }
    const GpuMatrix m = ComputeGpuMatrix(Options(s));
    REQUIRE(m.ok());
    for (const GpuFit& f : m.gpus) {
      CAPTURE(f.id);
      int first = -1;
      for (std::size_t k = 0; k < m.candidates.size() && first < 0; ++k) {
        Setup own = m.candidates[k].setup;
        own.gpu.id = f.id;
        own.gpu.memoryGiB = f.memoryGiB;
        if (MustEstimate(own).fits) first = static_cast<int>(k);
      }
      CHECK(f.choice == first);
      if (first >= 0) {
        Setup own = m.candidates[static_cast<std::size_t>(first)].setup;
        own.gpu.id = f.id;
        own.gpu.memoryGiB = f.memoryGiB;
        CHECK(f.headroomBytes == MustEstimate(own).headroomBytes);
      }
    }
  }
  CHECK(sawScratch);
}

TEST_CASE("curves are peaks of the same setups and find the largest fitting value", "[views]") {
  const Setup s = PresetSetup("gpt2", 8, 512, 16);
  const Curves c = ComputeCurves(Options(s, 8, 12));
  REQUIRE(c.ok());
  CHECK(c.capacityBytes == MustEstimate(s).gpuCapacityBytes);
  CHECK(c.currentPeakBytes == MustEstimate(s).device.peakDeviceBytes);
  CHECK(Contains(c.batch.values, 8));
  CHECK(Contains(c.sequence.values, 512));
  CHECK(c.sequence.values.back() == 1024);
  CHECK(Contains(c.batch.values, 24));  // 3·2^k between the powers of two
  for (std::size_t i = 0; i < c.batch.values.size(); ++i) {
    Setup b = s;
    b.training.batchSize = c.batch.values[i];
    CheckPointMatches(c.batch.points[i], b);
  }
  for (std::size_t i = 0; i < c.sequence.values.size(); ++i) {
    Setup n = s;
    n.training.sequenceLength = c.sequence.values[i];
    CheckPointMatches(c.sequence.points[i], n);
  }
  REQUIRE(c.batch.largestFound);
  CHECK_FALSE(c.batch.largestAtEnd);
  Setup at = s, above = s;
  at.training.batchSize = c.batch.largestFitting;
  above.training.batchSize = c.batch.largestFitting + 1;
  CHECK(MustEstimate(at).device.peakDeviceBytes == c.batch.largestFittingPeakBytes);
  CHECK(MustEstimate(at).fits);
  CHECK_FALSE(MustEstimate(above).fits);
}

TEST_CASE("views JSON: envelopes with the core's numbers and errors as values", "[views][json]") {
  const std::string request =
      R"({"setup":{"model":{"kind":"transformer","preset":"gpt2"},"training":{"batchSize":2,"sequenceLength":256,"precision":"ampBf16"},"gpu":{"id":"nvidia-rtx-4090"}},"axisValues":3,"curvePoints":4})";
  Setup s;
  REQUIRE(ParseAndValidate(R"({"model":{"kind":"transformer","preset":"gpt2"},"training":{"batchSize":2,"sequenceLength":256,"precision":"ampBf16"},"gpu":{"id":"nvidia-rtx-4090"}})", s).empty());
  const Estimate current = MustEstimate(s);

  const auto heat = nlohmann::json::parse(HeatMapJson(request));
  REQUIRE(heat["ok"] == true);
  const auto& h = heat["heatMap"];
  CHECK(h["capacityBytes"] == current.gpuCapacityBytes);
  const auto& batches = h["batchSizes"];
  const auto& seqs = h["sequenceLengths"];
  for (std::size_t i = 0; i < batches.size(); ++i) {
    for (std::size_t j = 0; j < seqs.size(); ++j) {
      if (batches[i] == 2 && seqs[j] == 256) {
        CHECK(h["cells"][i][j]["peakBytes"] == current.device.peakDeviceBytes);
        CHECK(h["cells"][i][j]["dominant"]["category"] == IdOf(current.peakDominant.category));
      }
    }
  }

  const auto matrix = nlohmann::json::parse(GpuMatrixJson(request));
  REQUIRE(matrix["ok"] == true);
  CHECK(matrix["gpuMatrix"]["gpus"].size() == Gpus().size());
  CHECK(matrix["gpuMatrix"]["currentPeakBytes"] == current.device.peakDeviceBytes);
  CHECK(matrix["gpuMatrix"]["candidates"][0]["id"] == "asIs");

  const auto curves = nlohmann::json::parse(CurvesJson(request));
  REQUIRE(curves["ok"] == true);
  CHECK(curves["curves"]["current"]["peakBytes"] == current.device.peakDeviceBytes);
  CHECK(curves["curves"]["batch"]["field"] == "training.batchSize");

  // Errors: the setup's own paths, the options' names, unknown fields, bad JSON.
  const auto bad = nlohmann::json::parse(HeatMapJson(R"({"setup":{"training":{"batchSize":0}}})"));
  CHECK(bad["ok"] == false);
  CHECK(bad["errors"][0]["field"] == "training.batchSize");
  const auto axes = nlohmann::json::parse(HeatMapJson(R"({"axisValues":40})"));
  CHECK(axes["errors"][0]["field"] == "axisValues");
  const auto unknown = nlohmann::json::parse(CurvesJson(R"({"setpu":{}})"));
  CHECK(unknown["errors"][0]["code"] == "unknownField");
  const auto malformed = nlohmann::json::parse(GpuMatrixJson("{"));
  CHECK(malformed["errors"][0]["code"] == "malformedJson");
  const auto type = nlohmann::json::parse(GpuMatrixJson(R"({"curvePoints":"many"})"));
  CHECK(type["errors"][0]["field"] == "curvePoints");
}

TEST_CASE("a view split into parts: every part's cells together are the whole view's", "[views][json]") {
  // The page's pool (web/engine.js) sends one request per part and merges the cells: the merge
  // must be the whole view, point for point, and each part must leave the others' cells out.
  const std::string setup =
      R"("setup":{"model":{"kind":"transformer","preset":"gpt2"},"training":{"batchSize":2,"sequenceLength":256,"precision":"ampBf16"},"gpu":{"id":"nvidia-rtx-4090"}},"axisValues":3,"curvePoints":4)";
  const auto whole = nlohmann::json::parse(HeatMapJson("{" + setup + "}"))["heatMap"];
  REQUIRE(whole.contains("cells"));
  CHECK_FALSE(whole.contains("part"));
  const std::size_t rows = whole["batchSizes"].size(), columns = whole["sequenceLengths"].size();
  REQUIRE(rows * columns >= 9);
  for (int count : {2, 3, 7, 64}) {
    nlohmann::json merged = nlohmann::json::array();
    for (std::size_t i = 0; i < rows; ++i) merged.push_back(nlohmann::json::array());
    int estimates = 0;
    for (int index = 0; index < count; ++index) {
      const std::string request =
          "{" + setup + R"(,"part":{"index":)" + std::to_string(index) + R"(,"count":)" + std::to_string(count) + "}}";
      const auto part = nlohmann::json::parse(HeatMapJson(request));
      REQUIRE(part["ok"] == true);
      const auto& h = part["heatMap"];
      CHECK(h["part"]["index"] == index);
      CHECK(h["part"]["count"] == count);
      CHECK(h["batchSizes"] == whole["batchSizes"]);
      CHECK(h["sequenceLengths"] == whole["sequenceLengths"]);
      estimates += h["estimates"].get<int>();
      int own = 0;
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < columns; ++j) {
          const auto& cell = h["cells"][i][j];
          const bool mine = static_cast<int>((i * columns + j) % static_cast<std::size_t>(count)) == index;
          CHECK(cell.is_null() == !mine);
          if (!mine) continue;
          ++own;
          if (merged[i].size() <= j) merged[i].get_ref<nlohmann::json::array_t&>().resize(columns);
          merged[i][j] = cell;
        }
      }
      CHECK(h["estimates"] == own);
    }
    CHECK(merged == whole["cells"]);
    CHECK(estimates == whole["estimates"]);
  }

  // The curves: part 0 of 2 the batch curve, part 1 the sequence curve.
  const auto curves = nlohmann::json::parse(CurvesJson("{" + setup + "}"))["curves"];
  const auto batch = nlohmann::json::parse(CurvesJson("{" + setup + R"(,"part":{"index":0,"count":2}})"))["curves"];
  const auto sequence = nlohmann::json::parse(CurvesJson("{" + setup + R"(,"part":{"index":1,"count":2}})"))["curves"];
  CHECK(batch["batch"] == curves["batch"]);
  CHECK(batch["sequence"].is_null());
  CHECK(sequence["sequence"] == curves["sequence"]);
  CHECK(sequence["batch"].is_null());
  CHECK(batch["current"] == curves["current"]);
  CHECK(sequence["current"] == curves["current"]);
  const auto third = nlohmann::json::parse(CurvesJson("{" + setup + R"(,"part":{"index":2,"count":3}})"))["curves"];
  CHECK(third["batch"].is_null());
  CHECK(third["sequence"].is_null());

  // Bad parts are errors naming the field; the GPU matrix is not split.
  auto fieldOf = [](const std::string& text) { return nlohmann::json::parse(text)["errors"][0]["field"]; };
  CHECK(fieldOf(HeatMapJson("{" + setup + R"(,"part":{"index":2,"count":2}})")) == "part.index");
  CHECK(fieldOf(HeatMapJson("{" + setup + R"(,"part":{"index":-1,"count":2}})")) == "part.index");
  CHECK(fieldOf(HeatMapJson("{" + setup + R"(,"part":{"index":0,"count":0}})")) == "part.count");
  CHECK(fieldOf(HeatMapJson("{" + setup + R"(,"part":{"index":0,"count":65}})")) == "part.count");
  CHECK(fieldOf(CurvesJson("{" + setup + R"(,"part":{"index":0.5,"count":2}})")) == "part.index");
  CHECK(fieldOf(CurvesJson("{" + setup + R"(,"part":{"index":0,"of":2}})")) == "part.of");
  CHECK(fieldOf(CurvesJson("{" + setup + R"(,"part":[0,2]})")) == "part");
  CHECK(fieldOf(GpuMatrixJson("{" + setup + R"(,"part":{"index":0,"count":2}})")) == "part.count");
  CHECK(nlohmann::json::parse(GpuMatrixJson("{" + setup + R"(,"part":{"index":0,"count":1}})"))["ok"] == true);
}

TEST_CASE("the GPU matrix estimates a GPU between the allocated and the device figure at its own capacity", "[views]") {
  // Llama 2 7B under DeepSpeed ZeRO-2 over 8 (0.19: the parameters flattened on the GPU, their
  // own 12.55 GiB of segments left cached). On the H100 the device figure is 43.26 GiB, over an
  // A100 40 GB's capacity; the allocated one with the context is 29 GiB, under it. At 40 GiB the
  // allocator frees that cache when a request finds no block and retries: it fits.
  auto parsed = ParseSetupJson(R"({"model":{"preset":"llama-2-7b"},
      "training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","precision":"bf16Mixed","checkpointing":"everyBlock"},
      "parallel":{"dataParallel":8,"zeroStage":2},"gpu":{"id":"nvidia-h100-sxm"}})");
  REQUIRE(parsed.errors.empty());
  const GpuMatrix m = ComputeGpuMatrix(Options(parsed.setup));
  REQUIRE(m.ok());
  REQUIRE(!m.candidates.empty());
  const SettingsCandidate& asIs = m.candidates.front();
  REQUIRE(asIs.tier == ChangeTier::AsIs);
  const auto a100 = std::find_if(m.gpus.begin(), m.gpus.end(), [](const GpuFit& f) { return f.id == "nvidia-a100-40"; });
  REQUIRE(a100 != m.gpus.end());
  CHECK(asIs.peak.peakBytes > a100->capacityBytes);
  CHECK(asIs.peak.allocatedDeviceBytes <= a100->capacityBytes);
  REQUIRE(a100->fits);
  CHECK(a100->choice == 0);
  Setup on = parsed.setup;
  on.gpu.id = a100->id;
  on.gpu.memoryGiB = a100->memoryGiB;
  const Estimate e = MustEstimate(on);
  CHECK(e.fits);
  CHECK(e.device.numAllocRetries > 0);
  CHECK(e.headroomBytes == a100->headroomBytes);
}
