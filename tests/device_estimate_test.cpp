// The device figure of an estimate (Estimate::device): the trace through the caching allocator
// at the GPU's capacity less the CUDA context, with the cuBLAS workspaces. Figures worked out
// from the allocator rules of docs/device.md.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"

using namespace gpumem;

namespace {
constexpr std::int64_t MiB = 1024 * 1024;

// 64 → 32 → ReLU → 8, batch 4, fp32, Adam: every tensor is far under 1 MiB (small pool).
Setup TinyMlp(double memoryGiB) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::LayerList;
  s.model.layers = {LinearLayer(64, 32), ActivationLayer(LayerKind::ReLU), LinearLayer(32, 8)};
  s.model.loss = LossKind::MSE;
  s.training.batchSize = 4;
  s.training.sequenceLength = 1;
  s.training.precision = Precision::FP32;
  s.gpu.memoryGiB = memoryGiB;
  return s;
}

Estimate Run(const Setup& s) {
  EstimateResult r = EstimateMemory(s);
  REQUIRE(r.ok());
  return r.estimate;
}
}  // namespace

TEST_CASE("device figure of a tiny MLP from the allocator rules", "[device]") {
  const Estimate e = Run(TinyMlp(1.0));
  const DeviceEstimate& d = e.device;
  // Workspaces (no gpu id: before Hopper): 2 handles × (cuBLAS 8,519,680 + cuBLASLt 1,048,576).
  CHECK(d.workspaceBytes == 19'136'512);
  // Reserved: the forward cuBLAS workspace (8.125 MiB, large pool, < 10 MiB) opens a 20 MiB
  // segment; the backward one is best-fit into its 11.875 MiB remainder (split: > 1 MiB left).
  // The 1 MiB cuBLASLt workspaces are small-pool requests: the first shares a 2 MiB segment
  // with the parameters, the second finds less than 1 MiB free there and opens another.
  CHECK(d.peakReservedBytes == 24 * MiB);
  // Allocated: the workspaces + the tensors, each rounded up to 512 B.
  CHECK(d.peakAllocatedBytes > d.workspaceBytes + e.peak.totalBytes - 1);
  CHECK(d.peakAllocatedBytes - d.workspaceBytes == 53'760);  // foreach: one sqrt per tensor, each rounded
  CHECK(d.contextBytes == 574 * MiB);  // CUDA ≥ 11.7, lazy loading, no GPU named: 426 + 148 MiB
  CHECK(d.peakDeviceBytes == 598 * MiB);
  CHECK(d.capacityBytes == 1024 * MiB);
  CHECK(d.headroomBytes == 426 * MiB);
  CHECK(d.fits);
  CHECK(d.tight);  // 426 MiB < 1 GiB
  CHECK(d.verdict == "tight");
  CHECK(d.why.find("426.00 MiB") != std::string::npos);
  CHECK_FALSE(d.oom.happened);
  // Estimate::fits and headroomBytes are the device figure; the allocated peak is unchanged.
  CHECK(e.fits == d.fits);
  CHECK(e.headroomBytes == d.headroomBytes);
  CHECK(e.peak.totalBytes == 48'288);  // the MSE loss's output-sized storage: 128 B, not 4
}

TEST_CASE("fits is decided by the allocator at capacity", "[device]") {
  // Exactly the device peak: the allocator reaches 24 MiB against a 24 MiB limit.
  const Estimate at = Run(TinyMlp(598.0 / 1024.0));
  CHECK(at.device.fits);
  CHECK(at.device.headroomBytes == 0);
  CHECK(at.device.verdict == "tight");
  // One MiB less: the limit is 23 MiB and the backward cuBLASLt workspace's 2 MiB segment
  // cannot be had; nothing cached is free to release (every segment holds a live block).
  const Estimate below = Run(TinyMlp(597.0 / 1024.0));
  CHECK_FALSE(below.device.fits);
  CHECK_FALSE(below.fits);
  CHECK(below.device.verdict == "doesNotFit");
  REQUIRE(below.device.oom.happened);
  CHECK(below.device.oom.label == "cuBLAS workspace");
  CHECK(below.device.oom.requestedBytes == 1'048'576);
  // 6 MB is free, but not where a small-pool request can use it: the large segment's rest
  // 20 MiB − 2 × 8,519,680 = 3,932,160 B, 1 MiB of unreserved limit (23 − 22 MiB, less than
  // a 2 MiB segment), and 1,035,264 B left in the small segment.
  CHECK(below.device.oom.largestFreeBlockBytes == 3'932'160);
  CHECK(below.device.oom.freeBytes == 3'932'160 + 1'048'576 + 1'035'264);
  CHECK(below.device.oom.explanation.find("fragmentation decided it") != std::string::npos);
  CHECK(below.device.why.find("found no free block") != std::string::npos);
  // Without a limit it reserves what it did above.
  CHECK(below.device.peakDeviceBytes == 598 * MiB);
  CHECK(below.device.headroomBytes == -1 * MiB);
  // Far from capacity: fits and not tight.
  const Estimate roomy = Run(TinyMlp(8.0));
  CHECK(roomy.device.verdict == "fits");
  CHECK_FALSE(roomy.device.tight);
}

TEST_CASE("context override and workspace config change the device figure", "[device]") {
  Setup s = TinyMlp(8.0);
  s.runtime.cudaContextMiB = 1000;
  s.runtime.cublasWorkspaceConfig = ":4096:8";  // 32 MiB per handle: its own 32 MiB segment each
  const Estimate e = Run(s);
  CHECK(e.device.contextBytes == 1000 * MiB);
  CHECK(e.device.workspaceBytes == 2 * (32 * MiB + MiB));
  // Two 32 MiB segments (rounded to 2 MiB, not split below), two 2 MiB small segments.
  CHECK(e.device.peakReservedBytes == 68 * MiB);
  CHECK(e.device.peakDeviceBytes == 1068 * MiB);
}

TEST_CASE("runtime validation names its fields", "[device]") {
  Setup s = TinyMlp(8.0);
  s.runtime.allocator.maxSplitSizeMiB = 10;
  s.runtime.allocator.roundupPower2Divisions = 3;
  s.runtime.allocator.garbageCollectionThreshold = 1.5;
  s.runtime.cudaContextMiB = -1;
  s.runtime.cublasWorkspaceConfig = "nonsense";
  const std::vector<FieldError> errors = Validate(s);
  auto has = [&](const std::string& field) {
    for (const FieldError& e : errors) if (e.field == field) return true;
    return false;
  };
  CHECK(has("runtime.allocator.maxSplitSizeMiB"));
  CHECK(has("runtime.allocator.roundupPower2Divisions"));
  CHECK(has("runtime.allocator.garbageCollectionThreshold"));
  CHECK(has("runtime.cudaContextMiB"));
  CHECK(has("runtime.cublasWorkspaceConfig"));
  CHECK(Validate(TinyMlp(8.0)).empty());
}

TEST_CASE("Llama 3.2 1B on an RTX 4090 that fits on allocated bytes does not fit on the device", "[device]") {
  // The known case: allocated-only, this left tens of MiB of headroom and the page said
  // "Fits". The allocator's segments, the context and the workspaces need gigabytes more.
  // (5,580 tokens: the 4090's 23.65 GiB CUDA total less the allocated peak is 39 MiB.)
  Setup s;
  REQUIRE(ParseAndValidate(R"({"model":{"preset":"llama-3.2-1b"},
      "training":{"batchSize":1,"sequenceLength":5580,"precision":"ampBf16","attention":"sdpa",
                  "checkpointing":"everyBlock"},"gpu":{"id":"nvidia-rtx-4090"}})", s).empty());
  const Estimate e = Run(s);
  const std::int64_t allocatedHeadroom = e.gpuCapacityBytes - e.peak.totalBytes;
  CHECK(allocatedHeadroom > 0);
  CHECK(allocatedHeadroom < 100 * MiB);
  CHECK_FALSE(e.fits);
  CHECK(e.device.verdict == "doesNotFit");
  CHECK(e.device.oom.happened);
  CHECK(e.device.peakDeviceBytes > e.gpuCapacityBytes);
  CHECK(e.device.headroomBytes < 0);
  CHECK(e.device.peakReservedBytes >= e.device.peakAllocatedBytes);
}

TEST_CASE("expandable segments change the verdict", "[device]") {
  Setup s;
  REQUIRE(ParseAndValidate(R"({"model":{"preset":"llama-3.2-1b"},
      "training":{"batchSize":1,"sequenceLength":8192,"precision":"ampBf16","attention":"sdpa",
                  "checkpointing":"everyBlock"},"gpu":{"id":"nvidia-rtx-4090"}})", s).empty());
  const Estimate fixed = Run(s);
  s.runtime.allocator.expandableSegments = true;
  const Estimate expandable = Run(s);
  // Expandable segments grow in place: far less is stranded in cached blocks.
  CHECK(expandable.device.peakReservedBytes < fixed.device.peakReservedBytes);
  CHECK(expandable.device.fragmentationBytes < fixed.device.fragmentationBytes);
  // A GPU of exactly what the expandable run needs (its unlimited run never releases, so at
  // that limit it runs the same and fits, with no headroom); fixed segments fail there.
  s.gpu.id = "";
  s.gpu.memoryGiB = double(expandable.device.peakDeviceBytes) / double(1 << 30);
  const Estimate fits = Run(s);
  CHECK(fits.device.fits);
  CHECK(fits.device.headroomBytes == 0);
  s.runtime.allocator.expandableSegments = false;
  const Estimate fails = Run(s);
  CHECK_FALSE(fails.device.fits);
  CHECK(fails.device.oom.happened);
}

TEST_CASE("the timeline carries reserved beside allocated", "[device]") {
  const Estimate e = Run(TinyMlp(8.0));
  REQUIRE_FALSE(e.timeline.empty());
  std::int64_t most = 0;
  for (const TimelinePoint& p : e.timeline) {
    CHECK(p.reservedBytes >= p.totalBytes);
    most = std::max(most, p.reservedBytes);
  }
  CHECK(most == e.device.peakReservedBytes);
}

TEST_CASE("estimate JSON has the device object", "[device]") {
  const std::string text = EstimateJson(R"({"model":{"kind":"layers","layers":[{"type":"linear","inFeatures":64,"outFeatures":32}],"loss":"mse"},"training":{"batchSize":4,"sequenceLength":1,"precision":"fp32"},"gpu":{"memoryGiB":0.4}})");
  CHECK(text.find("\"device\":{\"peakAllocatedBytes\":") != std::string::npos);
  CHECK(text.find("\"verdict\":\"doesNotFit\"") != std::string::npos);
  CHECK(text.find("\"oom\":{\"eventIndex\":") != std::string::npos);
  CHECK(text.find("\"reservedBytes\":") != std::string::npos);
}

namespace {
Estimate RunLabelled(const Setup& s) {
  EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::Labelled});
  REQUIRE(r.ok());
  return r.estimate;
}

// Every segment's shown and omitted blocks add up to its size and allocated bytes; the
// segments add up to the picture's totals.
void CheckPictureSums(const DeviceSegments& p) {
  std::int64_t shown = 0, allocated = 0;
  for (const DeviceSegment& s : p.segments) {
    std::int64_t blocks = s.omittedBlockBytes, blocksAllocated = s.omittedAllocatedBlockBytes;
    for (const DeviceSegmentBlock& b : s.blocks) {
      blocks += b.bytes;
      if (b.allocated) blocksAllocated += b.bytes;
      CHECK(b.bytes % 512 == 0);
      CHECK(b.allocated == !b.label.empty());
      CHECK((b.requestedBytes > 0) == b.allocated);
    }
    CHECK(blocks == s.totalBytes);
    CHECK(blocksAllocated == s.allocatedBytes);
    CHECK(s.blocks.size() <= kMaxPictureBlocksPerSegment);
    shown += s.totalBytes;
    allocated += s.allocatedBytes;
  }
  CHECK(shown + p.omittedBytes == p.reservedBytes);
  CHECK(p.omittedSegments == p.segmentCount - static_cast<std::int64_t>(p.segments.size()));
  for (std::size_t i = 1; i < p.segments.size(); ++i) CHECK(p.segments[i - 1].address < p.segments[i].address);
  if (p.omittedSegments == 0) CHECK(allocated == p.allocatedBytes);
}
}  // namespace

TEST_CASE("segments at the reserved peak of a tiny MLP from the allocator rules", "[device][segments]") {
  const Estimate e = RunLabelled(TinyMlp(1.0));
  const DeviceSegments& p = e.device.segments;
  REQUIRE(p.recorded);
  CheckPictureSums(p);
  // Reserved peaks when the backward thread's cuBLASLt workspace opens a second small segment
  // (see "device figure of a tiny MLP"): 2 MiB (parameters, forward cuBLASLt workspace), the
  // 20 MiB segment of both cuBLAS workspaces, then that new 2 MiB one, in address order.
  CHECK(p.reservedBytes == e.device.peakReservedBytes);
  REQUIRE(p.segments.size() == 3);
  CHECK(p.segmentCount == 3);
  CHECK(p.omittedSegments == 0);
  CHECK(p.segments[0].totalBytes == 2 * MiB);
  CHECK(p.segments[0].smallPool);
  // Its free bytes are the 1,035,264 B the OOM case finds there at the same event.
  CHECK(p.segments[0].totalBytes - p.segments[0].allocatedBytes == 1'035'264);
  const DeviceSegment& large = p.segments[1];
  CHECK_FALSE(large.smallPool);
  CHECK(large.totalBytes == 20 * MiB);
  REQUIRE(large.blocks.size() == 3);  // best-fit split twice: two workspaces and the rest
  CHECK(large.blocks[0].bytes == 8'519'680);
  CHECK(large.blocks[0].label == "cuBLAS workspace");
  CHECK(large.blocks[1].bytes == 8'519'680);
  CHECK(large.blocks[1].allocated);
  CHECK(large.blocks[2].bytes == 3'932'160);
  CHECK_FALSE(large.blocks[2].allocated);
  const DeviceSegment& second = p.segments[2];
  REQUIRE(second.blocks.size() == 2);  // 1 MiB workspace, then the 1 MiB split remainder (≥ 512 B)
  CHECK(second.blocks[0].bytes == MiB);
  CHECK(second.blocks[0].label == "cuBLAS workspace");
  CHECK(second.blocks[1].bytes == MiB);
  CHECK_FALSE(second.blocks[1].allocated);
  // The parameters' blocks name their tensors (the trace's tensor names).
  bool named = false;
  for (const DeviceSegmentBlock& b : p.segments[0].blocks) named |= b.allocated && b.label != "cuBLAS workspace";
  CHECK(named);
  // The event the picture is taken at is where the timeline's reserved line peaks.
  REQUIRE(p.eventIndex < e.timeline.size());
  CHECK(e.timeline[p.eventIndex].reservedBytes == e.device.peakReservedBytes);
}

TEST_CASE("segments only for a labelled timeline", "[device][segments]") {
  CHECK_FALSE(Run(TinyMlp(1.0)).device.segments.recorded);  // points: the views
  EstimateResult none = EstimateMemory(TinyMlp(1.0), {.timeline = EstimateOptions::Timeline::None, .explain = false});
  REQUIRE(none.ok());
  CHECK_FALSE(none.estimate.device.segments.recorded);  // the solver
  CHECK(none.estimate.device.segments.segments.empty());
}

TEST_CASE("segment picture is capped for huge models with counts of what is left out", "[device][segments]") {
  // 250 bias-free 2048 × 2048 fp32 linear layers: every 16 MiB weight (≥ 10 MiB) is a segment
  // of its own, and so is its gradient: far over 200 segments.
  Setup s = TinyMlp(80.0);
  s.model.layers.clear();
  for (int i = 0; i < 250; ++i) s.model.layers.push_back(LinearLayer(2048, 2048, false));
  s.training.optimizer = OptimizerKind::SGD;
  const Estimate e = RunLabelled(s);
  const DeviceSegments& p = e.device.segments;
  REQUIRE(p.recorded);
  CHECK(p.segmentCount > 500);
  CHECK(p.segments.size() == kMaxPictureSegments);
  CHECK(p.omittedSegments == p.segmentCount - 200);
  CHECK(p.omittedBytes > 0);
  CHECK(p.reservedBytes == e.device.peakReservedBytes);
  CheckPictureSums(p);
  // The kept ones are the largest: none smaller than 16 MiB while 16 MiB ones are left out.
  for (const DeviceSegment& seg : p.segments) CHECK(seg.totalBytes >= 16 * MiB);

  // 100 tiny layers: 200 parameter blocks of 512 B share one 2 MiB small segment; at most 16
  // are listed, the rest counted.
  Setup tiny = TinyMlp(8.0);
  tiny.model.layers.clear();
  for (int i = 0; i < 100; ++i) tiny.model.layers.push_back(LinearLayer(8, 8));
  const DeviceSegments& q = RunLabelled(tiny).device.segments;
  REQUIRE_FALSE(q.segments.empty());
  CheckPictureSums(q);
  CHECK(q.segments[0].blocks.size() == kMaxPictureBlocksPerSegment);
  CHECK(q.segments[0].omittedBlocks > 100);
}

TEST_CASE("estimate JSON carries the segments with a labelled timeline", "[device][segments]") {
  const std::string setup = R"({"model":{"kind":"layers","layers":[{"type":"linear","inFeatures":64,"outFeatures":32}],"loss":"mse"},"training":{"batchSize":4,"sequenceLength":1,"precision":"fp32"},"gpu":{"memoryGiB":8}})";
  const std::string labelled = EstimateJson(setup);
  CHECK(labelled.find("\"segments\":{\"eventIndex\":") != std::string::npos);
  CHECK(labelled.find("\"pool\":\"large\"") != std::string::npos);
  CHECK(labelled.find("\"label\":\"cuBLAS workspace\"") != std::string::npos);
  CHECK(labelled.find("\"address\":\"0x") != std::string::npos);
  const std::string points = EstimateJson(setup, -1, {.timeline = EstimateOptions::Timeline::Points});
  CHECK(points.find("\"segments\":null") != std::string::npos);
}
