// The device stage of an estimate (called by core/src/replay/estimate.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "gpumem/device.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

namespace gpumem {

// The Setup's runtime as the allocator model and DeviceOverheads read it.
AllocatorOptions AllocatorOptionsOf(const RuntimeDef& runtime);
RuntimeOptions RuntimeOptionsOf(const RuntimeDef& runtime);

// A GPU's capacity in bytes for gpu.memoryGiB (Estimate::gpuCapacityBytes).
std::int64_t CapacityBytes(double memoryGiB);

// What PyTorch's caching allocator may reserve on the setup's GPU: its capacity
// (gpu.memoryGiB) less the CUDA context and NCCL's buffers, bytes; the limit the device stage
// runs the allocator at. DeepSpeed ZeRO-1/2's construction reads the same room
// (parallel_step.cpp FlattenZeroGroup).
std::int64_t AllocatorLimitOf(const Setup& setup);

// The setup's device overheads on its GPU (context, workspaces, NCCL buffers), as the device
// stage takes them.
DeviceOverheadsResult DeviceOverheadsOf(const Setup& setup);

// What a GPU holds outside the caching allocator: the CUDA context and NCCL's buffers, bytes
// (DeviceEstimate::contextBytes + communicationBytes; peakDeviceBytes is the allocator's
// reserved peak plus these and CUDA unified memory).
std::int64_t OutsideAllocatorBytes(const DeviceOverheadsResult& overheads);

// Whether the allocator run without a limit still depends on the capacity: expandable segments
// reserve their virtual range by it, and the garbage collection's threshold is a fraction of it.
bool AllocatorRunDependsOnCapacity(const Setup& setup);

// Field errors of setup.runtime ("runtime.allocator.maxSplitSizeMiB", …).
void ValidateRuntime(const Setup& setup, std::vector<FieldError>& errors);

// The trace's events, with the cuBLAS workspaces in front of the first forward event and of
// the first backward event (one handle each), through SimulateCachingAllocator at
// capacityBytes − context − communication. With `reservedAfterEvent`, it receives the reserved
// bytes after each trace event (size = trace.events.size()). With `segments`, the allocator's
// segments at the reserved peak (DeviceEstimate::segments; a second pass up to that event).
DeviceEstimate ComputeDeviceEstimate(const Setup& setup, const Trace& trace, std::int64_t capacityBytes,
                                     bool explain, std::vector<std::int64_t>* reservedAfterEvent,
                                     bool segments = false);

}  // namespace gpumem
