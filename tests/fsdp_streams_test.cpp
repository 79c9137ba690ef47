// The side streams of FSDP2 and FSDP1 (parallel_step.cpp OnStream): which buffers the trace
// puts on which stream, read from torch/distributed/fsdp (see the comments there), and that
// the device stage hands the streams to the allocator model.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/device.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"
#include "stream_counts.hpp"

using namespace gpumem;

namespace {

Setup Llama7bOn8(FsdpMode mode) {
  Setup s = test::Llama7bOn8Ranks();
  s.parallel.fsdp = mode;
  return s;
}

using test::CheckStreams;
using test::StartsWith;
using test::StreamCounts;

}  // namespace

TEST_CASE("FSDP2 allocates its all-gather buffers and gradient shards on side streams", "[parallel][streams]") {
  const Setup s = Llama7bOn8(FsdpMode::FullyShard);
  REQUIRE(Validate(s).empty());
  const Inventory inventory = BuildInventory(s);
  const Trace trace = BuildTrace(s, inventory, true);
  // foreach_all_gather: the cast shards (all-gather input) and the flat output under
  // all_gather_copy_in_stream; foreach_reduce: the output and its cast under
  // reduce_scatter_stream; the per-parameter copy-outs, the reduce-scatter input and all the
  // rest on the default stream.
  const StreamCounts c = CheckStreams(trace, [](const std::string& name) {
    if (StartsWith(name, "all-gather input of ") || StartsWith(name, "all-gather output of ")) return 1;
    if (name == "gradient shard" || name == "gradient shard (cast)") return 2;
    return 0;
  });
  INFO(c.firstMisplaced);
  CHECK(c.misplaced == 0);
  // 32 blocks and the root unit, gathered in forward and in backward of two steps, each with
  // its cast shards and its flat output: 4 × 33 × 2 (the root's backward gather is a no-op
  // while it stays gathered, so at least the blocks' 4 × 32 × 2).
  CHECK(c.allocs[1] >= 4 * 32 * 2);
  CHECK(c.allocs[2] >= 2 * 32 * 2);  // a shard and its fp32 cast per block and step
  CHECK(c.allocs[0] > 0);

  // The device stage passes the streams on: its reserved peak is the allocator's on these
  // events, and more than the same events on one stream (whose default-stream requests could
  // take the flat outputs' cached blocks).
  const EstimateResult r = EstimateMemory(s);
  REQUIRE(r.ok());
  const DeviceAllocatorInput input = DeviceAllocatorInputOf(s, trace, r.estimate.gpuCapacityBytes);
  std::vector<AllocatorEvent> oneStream = input.events;
  int side = 0;
  for (AllocatorEvent& e : oneStream) {
    side += e.kind == AllocatorEventKind::Alloc && e.stream != 0;
    e.stream = 0;
  }
  CHECK(side == c.allocs[1] + c.allocs[2]);
  const AllocatorRecording recording{.timeline = false, .segmentsAtPeak = false, .segmentsAtOom = false};
  const AllocatorResult withStreams = SimulateCachingAllocator(input.events, input.options, kUnlimitedDeviceBytes, recording);
  const AllocatorResult single = SimulateCachingAllocator(oneStream, input.options, kUnlimitedDeviceBytes, recording);
  CHECK(r.estimate.device.peakReservedBytes == withStreams.peakReservedBytes);
  CHECK(withStreams.peakReservedBytes > single.peakReservedBytes);
  // The tensors are the same: the requested bytes do not depend on the stream (allocated
  // bytes may: a block that is not split keeps its remainder).
  CHECK(withStreams.peakRequestedBytes == single.peakRequestedBytes);
}

TEST_CASE("FSDP1 gathers on the unshard stream and reduces on the post-backward stream", "[parallel][streams]") {
  const Setup s = Llama7bOn8(FsdpMode::FullShard);
  REQUIRE(Validate(s).empty());
  const Inventory inventory = BuildInventory(s);  // the trace's names point into it: keep it alive
  const Trace trace = BuildTrace(s, inventory, true);
  const StreamCounts c = CheckStreams(trace, [](const std::string& name) {
    if (StartsWith(name, "gathered ")) return 1;  // _alloc_padded_unsharded_flat_param
    if (StartsWith(name, "gradient shard")) return 2;  // _reduce_grad's new_sharded_grad and its cast
    return 0;
  });
  INFO(c.firstMisplaced);
  CHECK(c.misplaced == 0);
  CHECK(c.allocs[1] > 0);
  CHECK(c.allocs[2] > 0);
}

TEST_CASE("one GPU and DDP stay on the default stream", "[parallel][streams]") {
  Setup s = Llama7bOn8(FsdpMode::Off);
  for (const int dp : {1, 8}) {
    s.parallel.dataParallel = dp;
    REQUIRE(Validate(s).empty());
    const Inventory inventory = BuildInventory(s);
    const Trace trace = BuildTrace(s, inventory, true);
    int side = 0;
    for (const Event& e : trace.events) side += e.stream != 0;
    CHECK(side == 0);
  }
}
