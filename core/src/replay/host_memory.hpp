// Host (CPU) memory of the simulated rank: what ZeRO-Offload / FSDP CPU offload keep there,
// the pinned copies of offloaded activations, and paged optimizer states (docs/device.md,
// "Host memory").
#pragma once

#include <cstdint>

#include "gpumem/estimate.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

// `setup`: what the person gave (world size, node size); `simulated` and `inventory`: the rank's
// setup and model (tensor-parallel slices, pipeline stage), as EstimateMemory simulates them;
// `offloadedActivationsPeakBytes`: Trace::offloadedActivationsPeakBytes.
HostMemory ComputeHostMemory(const Setup& setup, const Setup& simulated, const Inventory& inventory,
                             std::int64_t offloadedActivationsPeakBytes);

// Ranks that share one host: the HYBRID_SHARD group (fsdpShardGroupSize, one node by
// definition) or min(8, world size), capped at the world size.
std::int64_t RanksPerNode(const ParallelDef& parallel);

// DeepSpeed's own CPU figures, per node, as their authors wrote them (bytes, truncated to an
// integer as `int(cpu_mem)` does):
// deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs:
//   offload: total_params × max(4 × total_gpus, 16) × additional_buffer_factor
//   else:    total_params × 4 × num_gpus_per_node × additional_buffer_factor
std::int64_t DeepSpeedZero2CpuBytes(std::int64_t totalParams, std::int64_t gpusPerNode, std::int64_t nodes,
                                    bool cpuOffload, double additionalBufferFactor = 1.5);
// deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs (gpus_factor = 1 / nodes):
//   offload + params: zero_init: total_params × 18 × gpus_factor × abf, else × max(4 × gpus_per_node, 18 × gpus_factor)
//   offload:          zero_init: total_params × 16 × gpus_factor × abf, else × max(4 × gpus_per_node, 16 × gpus_factor)
//   none:             zero_init: largest_layer_params × 4 × gpus_per_node × abf, else total_params × 4 × gpus_per_node × abf
std::int64_t DeepSpeedZero3CpuBytes(std::int64_t totalParams, std::int64_t largestLayerParams,
                                    std::int64_t gpusPerNode, std::int64_t nodes, bool cpuOffload,
                                    bool cpuOffloadParams, bool zeroInit = true,
                                    double additionalBufferFactor = 1.5);

}  // namespace gpumem
