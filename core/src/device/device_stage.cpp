// The device stage: what the GPU holds during the step, as PyTorch's caching allocator and the
// CUDA runtime would hold it. docs/device.md gives every rule and its source.
#include "device/device_stage.hpp"
#include "gpumem/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpumem/format.hpp"

namespace gpumem {
namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

std::string Percent(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %%", share);
  return text;
}

}  // namespace

AllocatorOptions AllocatorOptionsOf(const RuntimeDef& runtime) {
  AllocatorOptions o = DefaultAllocatorOptions();
  o.expandableSegments = runtime.allocator.expandableSegments;
  o.maxSplitSizeMiB = runtime.allocator.maxSplitSizeMiB;
  o.roundupPower2Divisions.fill(static_cast<std::int32_t>(runtime.allocator.roundupPower2Divisions));
  o.garbageCollectionThreshold = runtime.allocator.garbageCollectionThreshold;
  return o;
}

RuntimeOptions RuntimeOptionsOf(const RuntimeDef& runtime) {
  RuntimeOptions o = DefaultRuntimeOptions();
  o.cudaContextMiB = runtime.cudaContextMiB > 0 ? runtime.cudaContextMiB : -1;  // 0: the default
  o.cublasWorkspaceConfig = runtime.cublasWorkspaceConfig;
  return o;
}

void ValidateRuntime(const Setup& setup, std::vector<FieldError>& errors) {
  const AllocatorDef& a = setup.runtime.allocator;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, field, std::move(message)});
  };
  // AllocatorConfig::parseMaxSplitSize: at least kLargeBuffer (20 MiB); 0 keeps SIZE_MAX.
  if (a.maxSplitSizeMiB != 0 && (a.maxSplitSizeMiB < 20 || a.maxSplitSizeMiB > (std::int64_t{1} << 30))) {
    bad("runtime.allocator.maxSplitSizeMiB", "max_split_size_mb must be 0 (unlimited) or between 20 and 2^30 MiB.");
  }
  // parseRoundUpPower2Divisions: a power of two (0 = off).
  const std::int64_t d = a.roundupPower2Divisions;
  if (d < 0 || d > 1024 || (d > 0 && (d & (d - 1)) != 0)) {
    bad("runtime.allocator.roundupPower2Divisions", "roundup_power2_divisions must be 0 (off) or a power of two up to 1024.");
  }
  // parseGarbageCollectionThreshold: a fraction in (0, 1).
  if (!(a.garbageCollectionThreshold >= 0 && a.garbageCollectionThreshold < 1)) {
    bad("runtime.allocator.garbageCollectionThreshold", "garbage_collection_threshold must be 0 (off) or in (0, 1).");
  }
  const double context = setup.runtime.cudaContextMiB;
  if (!std::isfinite(context) || context < 0 || context > 1 << 20) {
    bad("runtime.cudaContextMiB", "The CUDA context must be 0 (the default) or a positive number of MiB up to 2^20.");
  }
  if (setup.runtime.cublasWorkspaceConfig.size() > 256) {
    bad("runtime.cublasWorkspaceConfig", "CUBLAS_WORKSPACE_CONFIG longer than 256 characters is not meaningful.");
  } else if (!setup.runtime.cublasWorkspaceConfig.empty()) {
    RuntimeOptions o = DefaultRuntimeOptions();
    o.cublasWorkspaceConfig = setup.runtime.cublasWorkspaceConfig;
    for (FieldError& e : DeviceOverheads(setup.gpu.id, o).errors) errors.push_back(std::move(e));
  }
}

DeviceEstimate ComputeDeviceEstimate(const Setup& setup, const Trace& trace, std::int64_t capacityBytes,
                                     bool explain, std::vector<std::int64_t>* reservedAfterEvent) {
  DeviceEstimate d;
  d.capacityBytes = capacityBytes;
  const AllocatorOptions options = AllocatorOptionsOf(setup.runtime);
  RuntimeOptions runtime = RuntimeOptionsOf(setup.runtime);
  // Many GPUs: the job's size decides whether NCCL communicators exist (docs/parallel.md).
  runtime.worldSize = static_cast<int>(std::min<std::int64_t>(WorldSize(setup.parallel), 1 << 30));
  const DeviceOverheadsResult overheads = DeviceOverheads(setup.gpu.id, runtime);
  d.contextBytes = overheads.context.bytes;
  d.workspaceBytes = overheads.workspace.bytes;
  d.communicationBytes = overheads.communication.bytes;

  // The events in order, with the workspaces where PyTorch allocates them: a handle's workspace
  // is allocated at its first cuBLAS call (CublasHandlePool.cpp getCurrentCUDABlasHandle →
  // setWorkspaceForHandle), so the forward handle's before step 1's forward (the first
  // matmul comes after at most the embedding lookup) and the backward thread's before step 1's
  // backward. They stay cached for the process's life (never freed).
  const std::vector<std::int64_t>& work = overheads.workspaceAllocations;
  const int handles = RuntimeOptionsOf(setup.runtime).cublasHandles;
  const std::size_t perHandle = handles > 0 ? work.size() / static_cast<std::size_t>(handles) : 0;
  int nextId = 0;
  for (const Event& e : trace.events) nextId = std::max(nextId, e.tensorId + 1);
  std::vector<AllocatorEvent> events;
  events.reserve(trace.events.size() + work.size());
  std::vector<std::size_t> traceIndexOf;  // allocator event → trace event (a workspace: the one it precedes)
  traceIndexOf.reserve(events.capacity());
  std::vector<std::size_t> lastOf(trace.events.size(), 0);  // trace event → its allocator event
  std::size_t placed = 0;
  bool forwardSeen = false, backwardSeen = false;
  auto place = [&](std::size_t count, std::size_t at) {
    for (std::size_t k = 0; k < count && placed < work.size(); ++k, ++placed) {
      events.push_back({AllocatorEventKind::Alloc, nextId++, work[placed]});
      traceIndexOf.push_back(at);
    }
  };
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (!forwardSeen && e.phase == Phase::Forward) {
      forwardSeen = true;
      place(perHandle == 0 ? work.size() : perHandle, i);
    }
    if (!backwardSeen && e.phase == Phase::Backward) {
      backwardSeen = true;
      place(work.size() - placed, i);
    }
    events.push_back({e.kind == EventKind::Alloc ? AllocatorEventKind::Alloc : AllocatorEventKind::Free, e.tensorId, e.bytes});
    traceIndexOf.push_back(i);
    lastOf[i] = events.size() - 1;
  }
  place(work.size() - placed, trace.events.empty() ? 0 : trace.events.size() - 1);  // no forward or backward phase

  const std::int64_t limit = std::max<std::int64_t>(0, capacityBytes - d.contextBytes - d.communicationBytes);
  const AllocatorRecording recording{.timeline = reservedAfterEvent != nullptr, .segmentsAtPeak = false};
  AllocatorResult run = SimulateCachingAllocator(events, options, limit, recording);
  d.fits = !run.oom.happened;
  d.numAllocRetries = run.numAllocRetries;
  if (run.oom.happened) {
    const AllocatorOom& o = run.oom;
    d.oom.happened = true;
    const std::size_t at = static_cast<std::size_t>(o.eventIndex);
    d.oom.eventIndex = trace.events.empty() ? 0 : traceIndexOf[at];
    const bool workspace = trace.events.empty() || lastOf[traceIndexOf[at]] != at;
    d.oom.label = workspace ? "cuBLAS workspace" : trace.Label(trace.events[traceIndexOf[at]]);
    d.oom.requestedBytes = o.requestedBytes;
    d.oom.freeBytes = o.freeBytes;
    d.oom.largestFreeBlockBytes = o.largestFreeBlockBytes;
    d.oom.freeFragments = o.freeFragments;
    // As PyTorch's OutOfMemoryError reads: what was asked, what was free and in how many
    // pieces (largest free block vs the request tells fragmentation from plain shortage).
    d.oom.explanation =
        "a " + HumanBytes(o.requestedBytes) + " request (" + HumanBytes(o.allocationBytes) +
        " segment) found no free block of that size; " + HumanBytes(o.freeBytes) + " was free in " +
        FormatCount(o.freeFragments) + (o.freeFragments == 1 ? " fragment" : " fragments") + ", the largest " +
        HumanBytes(o.largestFreeBlockBytes) +
        (o.freeBytes >= o.allocationBytes ? " (enough in total: fragmentation decided it)" : "");
    // The figures without a limit: the allocator then never frees its cache, so this is what
    // the step reserves on a GPU large enough, not the least it could get by with.
    run = SimulateCachingAllocator(events, options, std::int64_t{1} << 62, recording);
  }
  d.peakAllocatedBytes = run.peakAllocatedBytes;
  d.peakReservedBytes = run.peakReservedBytes;
  d.fragmentationBytes = run.unallocatedAtPeakReservedBytes;
  d.peakDeviceBytes = d.peakReservedBytes + d.contextBytes + d.communicationBytes;
  d.headroomBytes = capacityBytes - d.peakDeviceBytes;
  d.tight = d.fits && d.headroomBytes < std::max<std::int64_t>(kGiB, capacityBytes / 20);
  d.verdict = !d.fits ? "doesNotFit" : d.tight ? "tight" : "fits";

  if (reservedAfterEvent) {
    reservedAfterEvent->assign(trace.events.size(), 0);
    const std::size_t n = run.reservedBytesAfterEvent.size();
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      (*reservedAfterEvent)[i] = lastOf[i] < n ? run.reservedBytesAfterEvent[lastOf[i]] : 0;
    }
  }

  const std::string device = HumanBytes(d.peakDeviceBytes), capacity = HumanBytes(capacityBytes);
  if (!d.fits) {
    d.why = "at " + capacity + " " + d.oom.explanation + ". With no limit the step reserves " +
            HumanBytes(d.peakReservedBytes) + ", " + device + " with the context.";
  } else if (d.tight) {
    d.why = "only " + HumanBytes(d.headroomBytes) + " left of " + capacity +
            " (under 5 % or 1 GiB): another process, a longer sample or a different kernel choice can tip it over.";
  } else {
    d.why = device + " of " + capacity + " (reserved " + HumanBytes(d.peakReservedBytes) + " + context " +
            HumanBytes(d.contextBytes) + "), " + HumanBytes(d.headroomBytes) + " to spare.";
  }
  if (d.fits && d.numAllocRetries > 0) {
    d.why += " The allocator had to free its cache " + FormatCount(d.numAllocRetries) +
             (d.numAllocRetries == 1 ? " time" : " times") + " to get there (slow steps).";
  }
  const double share = d.peakReservedBytes > 0 ? 100.0 * double(d.fragmentationBytes) / double(d.peakReservedBytes) : 0;
  d.fragmentationExplanation =
      "The caching allocator keeps freed blocks in its segments for reuse instead of returning them to CUDA; at its "
      "peak " + HumanBytes(d.fragmentationBytes) + " (" + Percent(share) + " of reserved) sat in such free blocks, "
      "which only requests that fit inside them can use" +
      (setup.runtime.allocator.expandableSegments ? " (expandable segments grow in place, which keeps this small)."
                                                  : "; expandable_segments:True lets segments grow in place instead.");
  if (!explain) return d;
  d.peakAllocatedFormula = "largest sum of live block sizes (requests rounded up to 512 B, workspaces included): " +
                           FormatCount(d.peakAllocatedBytes) + " B";
  d.peakReservedFormula = "largest sum of cudaMalloc segments (2 MiB for requests ≤ 1 MiB, 20 MiB under 10 MiB, "
                          "else rounded up to 2 MiB; freed blocks cached): " + FormatCount(d.peakReservedBytes) + " B";
  d.fragmentationFormula = "reserved − allocated at the reserved peak = " + FormatCount(d.fragmentationBytes) + " B";
  d.contextFormula = overheads.context.formula;
  d.workspaceFormula = overheads.workspace.formula;
  d.communicationFormula = overheads.communication.formula;
  d.peakDeviceFormula = "reserved " + FormatCount(d.peakReservedBytes) + " + context " + FormatCount(d.contextBytes) +
                        " + communication " + FormatCount(d.communicationBytes) + " = " + FormatCount(d.peakDeviceBytes) + " B";
  d.headroomFormula = "capacity " + FormatCount(capacityBytes) + " − device peak " + FormatCount(d.peakDeviceBytes) +
                      " = " + FormatCount(d.headroomBytes) + " B";
  return d;
}

}  // namespace gpumem
