// What the parallel step's files share (parallel_step.cpp, zero_gradients.cpp): the side
// streams its buffers go on and DeepSpeed's overlap_comm.
#pragma once

#include <cstdint>

#include "gpumem/parallel.hpp"
#include "gpumem/setup.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

// The side streams the wrappers allocate their collectives' buffers on (Event::stream; the
// caching allocator keeps each stream's cached blocks apart, docs/device.md). Numbers of this
// model, not CUDA's: 1 is the gathering stream (FSDP2 FSDPCommContext.all_gather_copy_in_stream,
// FSDP1 state._unshard_stream, DeepSpeed ZeRO-3's PartitionedParameterCoordinator
// __allgather_stream), 2 the reducing one (FSDP2 reduce_scatter_stream, FSDP1
// state._post_backward_stream, ZeRO-1/2's reduction_stream, ZeRO-3's reduce_and_partition_stream).
inline constexpr std::uint8_t kAllGatherStream = 1;
inline constexpr std::uint8_t kReduceScatterStream = 2;

// DeepSpeed's overlap_comm (zero/config.py overlap_comm_valid: None → stage == 3). Without it
// ZeRO-3's all-gather and reduce-and-partition "streams" are get_accelerator().default_stream()
// (parameter_offload.py DeepSpeedZeRoOffload.__init__, stage3.py DeepSpeedZeroOptimizer_Stage3
// .__init__), and ZeRO-1/2 run their reductions under current_stream() (stage_1_and_2.py
// reduce_ipg_grads, average_tensor, allreduce_and_copy): every buffer on the default stream.
inline bool ZeroOverlapComm(const ParallelDef& p, const ShardPlan& plan) {
  return plan.engine == ShardingEngine::Zero &&
         (p.overlapComm == OverlapComm::On || (p.overlapComm == OverlapComm::Default && plan.zeroStage == 3));
}

// The builder's allocations on `stream` for the scope's life (PyTorch's
// `with torch.cuda.stream(s):`).
class OnStream {
 public:
  OnStream(TraceBuilder& b, std::uint8_t stream) : b_(b), saved_(b.stream()) { b.SetStream(stream); }
  ~OnStream() { b_.SetStream(saved_); }
  OnStream(const OnStream&) = delete;
  OnStream& operator=(const OnStream&) = delete;

 private:
  TraceBuilder& b_;
  std::uint8_t saved_;
};

}  // namespace gpumem
