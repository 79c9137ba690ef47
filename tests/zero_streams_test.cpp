// DeepSpeed ZeRO's side streams (parallel_step.cpp ZeroOverlapComm / OnStream): which of the
// buffers the simulation makes for ZeRO-1/2/3 DeepSpeed allocates inside a
// `with get_accelerator().stream(s):` block, read from deepspeed/runtime/zero (see the comments
// in parallel_step.cpp), by tensor name; and that the device stage hands them to the allocator.
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

Setup Llama7bZeroOn8(int stage, OverlapComm overlap) {
  Setup s = test::Llama7bOn8Ranks();
  s.parallel.zeroStage = stage;
  s.parallel.overlapComm = overlap;
  return s;
}

using test::CheckStreams;
using test::StartsWith;
using test::StreamCounts;

StreamCounts CheckSetup(const Setup& s, int (*expected)(const std::string&)) {
  REQUIRE(Validate(s).empty());
  const Inventory inventory = BuildInventory(s);  // the trace's names point into it
  const Trace trace = BuildTrace(s, inventory, true);
  return CheckStreams(trace, expected);
}

int AllOnDefault(const std::string&) { return 0; }

}  // namespace

TEST_CASE("ZeRO-3 gathers on the all-gather stream with overlap_comm", "[parallel][streams]") {
  // overlap_comm defaults to on for stage 3 (zero/config.py overlap_comm_valid).
  for (const OverlapComm overlap : {OverlapComm::Default, OverlapComm::On}) {
    const Setup s = Llama7bZeroOn8(3, overlap);
    REQUIRE(Validate(s).empty());
    const Inventory inventory = BuildInventory(s);
    const Trace trace = BuildTrace(s, inventory, true);
    // partitioned_param_coordinator.py __all_gather_params_: all_gather_coalesced (the flat
    // output, and the per-parameter torch.cat made by the wait, under the same stream) on
    // __allgather_stream. stage3.py __reduce_and_partition_ipg_grads: reduce_scatter_coalesced's
    // torch.cat of the bucket's padded partitions under reduce_and_partition_stream. The
    // partitions, the fp32 partition, the IPG bucket (made at construction), the .grad tensors
    // (autograd), the gradient partition and the step's fp32 gradients on the default stream.
    const StreamCounts c = CheckStreams(trace, [](const std::string& name) {
      return StartsWith(name, "gathered ") ? 1
             : StartsWith(name, "reduce_scatter_coalesced flat buffer") || StartsWith(name, "grad_partitions_flat_buffer is")
                 ? 2
                 : 0;
    });
    INFO(c.firstMisplaced);
    CHECK(c.misplaced == 0);
    // 32 blocks gathered in forward and in backward of two steps, at least (the root once a
    // step and the prefetches besides).
    CHECK(c.allocs[1] >= 32 * 2 * 2);
    // Llama 2 7B's 6,738,415,616 gradient elements through a bucket of 500M, filled in
    // backward's order until the next gradient would overflow it: 14 reductions a step; and the
    // step's has_overflow masks (isinf, isnan) under the same stream.
    CHECK(c.allocs[2] == (14 + 2) * 2);
    CHECK(c.allocs[0] > 0);
  }
}

TEST_CASE("ZeRO-3 without overlap_comm gathers on the default stream", "[parallel][streams]") {
  // parameter_offload.py: __allgather_stream = get_accelerator().default_stream() when
  // overlap_comm is off.
  const StreamCounts c = CheckSetup(Llama7bZeroOn8(3, OverlapComm::Off), AllOnDefault);
  INFO(c.firstMisplaced);
  CHECK(c.misplaced == 0);
  CHECK(c.allocs[0] > 0);
}

TEST_CASE("ZeRO-3's side stream reaches the allocator", "[parallel][streams]") {
  const Setup s = Llama7bZeroOn8(3, OverlapComm::Default);
  REQUIRE(Validate(s).empty());
  const Inventory inventory = BuildInventory(s);
  const Trace trace = BuildTrace(s, inventory, true);
  const EstimateResult r = EstimateMemory(s);
  REQUIRE(r.ok());
  const DeviceAllocatorInput input = DeviceAllocatorInputOf(s, trace, r.estimate.gpuCapacityBytes);
  std::vector<AllocatorEvent> oneStream = input.events;
  int side = 0, gathers = 0;
  for (AllocatorEvent& e : oneStream) {
    side += e.kind == AllocatorEventKind::Alloc && e.stream == 1;
    e.stream = 0;
  }
  for (const Event& e : trace.events) gathers += e.kind == EventKind::Alloc && StartsWith(trace.TensorName(e), "gathered ");
  CHECK(side == gathers);
  const AllocatorRecording recording{.timeline = false, .segmentsAtPeak = false, .segmentsAtOom = false};
  const AllocatorResult withStreams = SimulateCachingAllocator(input.events, input.options, kUnlimitedDeviceBytes, recording);
  const AllocatorResult single = SimulateCachingAllocator(oneStream, input.options, kUnlimitedDeviceBytes, recording);
  CHECK(r.estimate.device.peakReservedBytes == withStreams.peakReservedBytes);
  CHECK(withStreams.peakRequestedBytes == single.peakRequestedBytes);
  // The gathered blocks are cached for the all-gather stream alone: the default stream's
  // activations can no longer take them, so more is reserved.
  CHECK(withStreams.peakReservedBytes > single.peakReservedBytes);
}

TEST_CASE("ZeRO-2 with overlap_comm makes grads_in_partition on the reduction stream", "[parallel][streams]") {
  // stage_1_and_2.py: copy_grads_in_partition makes grads_in_partition at the first copy, inside
  // reduce_ipg_grads' `with get_accelerator().stream(self.reduction_stream)`; setup_buckets
  // makes both ipg_buffer halves from the gradient hook, on the default stream.
  const StreamCounts c = CheckSetup(Llama7bZeroOn8(2, OverlapComm::On),
                                    [](const std::string& name) { return name == "grads_in_partition" ? 2 : 0; });
  INFO(c.firstMisplaced);
  CHECK(c.misplaced == 0);
  CHECK(c.allocs[2] == 2);  // once a step
  CHECK(c.allocs[1] == 0);
}

TEST_CASE("ZeRO-1 with overlap_comm makes grads_in_partition on the reduction stream", "[parallel][streams]") {
  // With overlap_comm ZeRO-1's hook reduces at the accumulation boundary (every step here), and
  // reduce_ipg_grads runs copy_grads_in_partition under self.reduction_stream, as for ZeRO-2.
  const StreamCounts c = CheckSetup(Llama7bZeroOn8(1, OverlapComm::On),
                                    [](const std::string& name) { return name == "grads_in_partition" ? 2 : 0; });
  INFO(c.firstMisplaced);
  CHECK(c.misplaced == 0);
  CHECK(c.allocs[2] == 2);  // once a step
  CHECK(c.allocs[1] == 0);
}

TEST_CASE("ZeRO-1 and ZeRO-2 stay on the default stream by default", "[parallel][streams]") {
  // overlap_comm defaults to off below stage 3: reductions run on current_stream().
  for (const int stage : {1, 2}) {
    for (const OverlapComm overlap : {OverlapComm::Default, OverlapComm::Off}) {
      const StreamCounts c = CheckSetup(Llama7bZeroOn8(stage, overlap), AllOnDefault);
      INFO("stage " << stage << ": " << c.firstMisplaced);
      CHECK(c.misplaced == 0);
      CHECK(c.allocs[0] > 0);
    }
  }
}

// stage3.py _setup_for_real_optimizer makes grad_partitions_flat_buffer at construction, right
// after the IPG buffer, and keeps it: every partition's gradient is a view of it. ZeRO-2's
// grads_in_partition is made by the first copy and let go in step (_release_ipg_buffers).
TEST_CASE("ZeRO-3's flat gradient buffer lives from construction to the end; ZeRO-2's partition per step", "[parallel]") {
  const Setup s = Llama7bZeroOn8(3, OverlapComm::Default);
  REQUIRE(Validate(s).empty());
  const Inventory inventory = BuildInventory(s);
  const Trace trace = BuildTrace(s, inventory, true);
  int found = 0;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.kind != EventKind::Alloc || trace.TensorName(e) != "grad_partitions_flat_buffer") continue;
    ++found;
    CHECK(e.phase == Phase::Init);
    // 6,738,415,616 parameters over 8 ranks: ⌈n / 8⌉ per tensor, summed, × 2 B (bf16).
    CHECK(e.bytes % 2 == 0);
    CHECK(e.bytes >= 6'738'415'616LL / 8 * 2);
    CHECK(e.bytes < 6'738'415'616LL / 8 * 2 + 2 * 8 * 2 * static_cast<std::int64_t>(inventory.parameters.size()));
    CHECK(trace.freeAt[static_cast<std::size_t>(e.tensorId)] == Trace::kNeverFreed);
  }
  CHECK(found == 1);

  const Setup two = Llama7bZeroOn8(2, OverlapComm::Default);
  const Inventory inventory2 = BuildInventory(two);
  const Trace trace2 = BuildTrace(two, inventory2, true);
  int made = 0, freed = 0;
  for (const Event& e : trace2.events) {
    if (trace2.TensorName(e) != "grads_in_partition") continue;
    (e.kind == EventKind::Alloc ? made : freed) += 1;
    CHECK(e.phase != Phase::Init);
  }
  CHECK(made == 2);  // one per step
  CHECK(freed == 2);
}

// stage_1_and_2.py / stage3.py initialize_optimizer_states: an optimizer step on a zero-valued
// fp32 gradient at construction makes the states; step 1 finds them. Megatron's distributed
// optimizer (tensor parallel here) makes them in its first step.
TEST_CASE("DeepSpeed ZeRO makes the optimizer states at construction; Megatron in the first step", "[parallel]") {
  for (const int stage : {1, 2, 3}) {
    const Setup s = Llama7bZeroOn8(stage, OverlapComm::Default);
    REQUIRE(Validate(s).empty());
    const Inventory inventory = BuildInventory(s);
    const Trace trace = BuildTrace(s, inventory, true);
    int statesAtInit = 0, statesLater = 0, zeroGradients = 0;
    std::int64_t zeroBytes = 0, stateBytes = 0;
    for (const Event& e : trace.events) {
      if (e.kind != EventKind::Alloc) continue;
      if (e.category == Category::OptimizerStates) {
        (e.phase == Phase::Init ? statesAtInit : statesLater) += 1;
        if (e.phase == Phase::Init) stateBytes += e.bytes;
      }
      if (trace.TensorName(e) == "initial zero gradient (fp32)") {
        ++zeroGradients;
        zeroBytes = e.bytes;
        CHECK(e.phase == Phase::Init);
        CHECK(trace.freeAt[static_cast<std::size_t>(e.tensorId)] != Trace::kNeverFreed);
        CHECK(trace.events[trace.freeAt[static_cast<std::size_t>(e.tensorId)]].phase == Phase::Init);
      }
    }
    INFO("stage " << stage);
    CHECK(zeroGradients == 1);
    CHECK(statesAtInit == 2);  // AdamW's exp_avg and exp_avg_sq of the one fp32 partition
    CHECK(statesLater == 0);
    CHECK(stateBytes == 2 * zeroBytes);  // both fp32, partition-sized
  }
  Setup megatron = Llama7bZeroOn8(1, OverlapComm::Default);
  megatron.parallel.tensorParallel = 2;
  megatron.parallel.dataParallel = 4;
  REQUIRE(Validate(megatron).empty());
  const Inventory inventory = BuildInventory(megatron);
  const Trace trace = BuildTrace(megatron, inventory, true);
  for (const Event& e : trace.events) {
    if (e.kind == EventKind::Alloc && e.category == Category::OptimizerStates) CHECK(e.phase != Phase::Init);
  }
}
