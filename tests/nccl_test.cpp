// NCCL communicator buffers in the device figure (docs/device.md, "NCCL buffers"): NCCL's
// per-protocol buffer sizes, the communicators of a rank, the override and its validation.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "gpumem/device.hpp"
#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

TEST_CASE("NCCL: the per-protocol buffers are NCCL's defaults", "[nccl]") {
  CHECK(kNcclSimpleBufferBytes == 4'194'304);  // DEFAULT_BUFFSIZE 1 << 22
  CHECK(kNcclLlBufferBytes == 524'288);        // 8 lines × 512 threads × 8 steps × 16 B
  CHECK(kNcclLl128BufferBytes == 4'915'200);   // 120 elements × 640 threads × 8 steps × 8 B
  RuntimeOptions o = DefaultRuntimeOptions();
  CHECK(DeviceOverheads("", o).communication.bytes == 0);  // one GPU: no communicator
  o.worldSize = 8;
  o.ncclCommunicators = 1;
  const OverheadPart one = DeviceOverheads("", o).communication;
  CHECK(one.bytes == 16 * (4'194'304 + 4'915'200 + 524'288));
  CHECK(one.formula.find("16 channels") != std::string::npos);
  o.ncclCommunicators = 3;
  CHECK(DeviceOverheads("", o).communication.bytes == 3 * one.bytes);
  o.ncclBuffersMiB = 100;
  CHECK(DeviceOverheads("", o).communication.bytes == 100 * 1024 * 1024);
}

TEST_CASE("NCCL: one communicator per parallel group of more than one rank", "[nccl]") {
  ParallelDef p;
  CHECK(NcclCommunicatorsOf(p) == 0);
  p.dataParallel = 8;
  CHECK(NcclCommunicatorsOf(p) == 1);
  p.tensorParallel = 4;
  CHECK(NcclCommunicatorsOf(p) == 2);
  p.pipelineParallel = 2;
  CHECK(NcclCommunicatorsOf(p) == 3);
  ParallelDef hybrid;
  hybrid.dataParallel = 16;
  hybrid.fsdp = FsdpMode::HybridShard;
  hybrid.fsdpShardGroupSize = 8;
  CHECK(NcclCommunicatorsOf(hybrid) == 2);  // shard group and replicate group
  hybrid.dataParallel = 8;
  CHECK(NcclCommunicatorsOf(hybrid) == 1);
}

TEST_CASE("NCCL: a multi-GPU estimate carries the buffers outside the allocator", "[nccl]") {
  Setup s = QuickSetup(1'000'000'000, Precision::BF16Mixed, OptimizerKind::Adam);
  const Estimate single = MustEstimate(s);
  CHECK(single.device.communicationBytes == 0);
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 2;
  const Estimate four = MustEstimate(s);
  const std::int64_t perCommunicator = 16 * (kNcclSimpleBufferBytes + kNcclLl128BufferBytes + kNcclLlBufferBytes);
  CHECK(four.device.communicationBytes == perCommunicator);
  CHECK(four.device.peakDeviceBytes ==
        four.device.peakReservedBytes + four.device.contextBytes + four.device.communicationBytes);
  s.runtime.ncclBuffersMiB = 512;
  CHECK(MustEstimate(s).device.communicationBytes == 512LL << 20);
  // Validation: 0 = the estimate; negative, NaN and absurd values are refused.
  for (double bad : {-1.0, std::nan(""), 2e6}) {
    s.runtime.ncclBuffersMiB = bad;
    CHECK(HasErrorOn(Validate(s), "runtime.ncclBuffersMiB"));
  }
  // JSON: read and written under runtime.
  Setup read;
  REQUIRE(ParseAndValidate(R"({"runtime":{"ncclBuffersMiB":64}})", read).empty());
  CHECK(read.runtime.ncclBuffersMiB == 64);
  CHECK(SetupToJson(read).find("\"ncclBuffersMiB\":64") != std::string::npos);
  CHECK(HasErrorOn(ParseAndValidate(R"({"runtime":{"ncclBuffersMiB":"lots"}})", read), "runtime.ncclBuffersMiB"));
}
