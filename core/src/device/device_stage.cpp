// The device stage: what the GPU holds during the step, as PyTorch's caching allocator and the
// CUDA runtime would hold it. docs/device.md gives every rule and its source.
#include "device/device_stage.hpp"
#include "device/caching_allocator.hpp"
#include "gpumem/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/recycle.hpp"

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
  // Validation refuses text that does not parse; the defaults stay for a setup not validated.
  ParseMajorMinor(runtime.pytorchVersion, o.pytorchMajor, o.pytorchMinor);
  ParseMajorMinor(runtime.cudaVersion, o.cudaMajor, o.cudaMinor);
  o.lazyModuleLoading = runtime.lazyModuleLoading;
  o.ncclBuffersMiB = runtime.ncclBuffersMiB > 0 ? runtime.ncclBuffersMiB : -1;  // 0: the estimate
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
  int major = 0;
  int minor = 0;
  if (!ParseMajorMinor(setup.runtime.pytorchVersion, major, minor) || major < 1 || major > 99) {
    bad("runtime.pytorchVersion", "The PyTorch version must read major.minor, from 1.0 (such as \"2.5\" or \"1.10\").");
  } else if (major < 2 && setup.training.attention == AttentionImplementation::SDPA) {
    // F.scaled_dot_product_attention first shipped in PyTorch 2.0.
    bad("training.attention", "SDPA attention needs PyTorch 2.0 or later (F.scaled_dot_product_attention); with PyTorch " +
                                  setup.runtime.pytorchVersion + " choose eager attention.");
  }
  if (!ParseMajorMinor(setup.runtime.cudaVersion, major, minor) || major < 9 || major > 99) {
    bad("runtime.cudaVersion", "The CUDA version must read major.minor, from 9.0 (such as \"12.4\" or \"11.2\").");
  }
  int patch = 0;
  if (!ParseVersion(setup.runtime.deepspeedVersion, major, minor, patch) || major > 99) {
    bad("runtime.deepspeedVersion", "The DeepSpeed version must read major.minor or major.minor.patch (such as \"0.19\" or \"0.18.7\").");
  }
  const double nccl = setup.runtime.ncclBuffersMiB;
  if (!std::isfinite(nccl) || nccl < 0 || nccl > 1 << 20) {
    bad("runtime.ncclBuffersMiB", "The NCCL buffers must be 0 (the estimate) or a positive number of MiB up to 2^20.");
  }
  const double host = setup.runtime.hostMemoryGiB;
  if (!std::isfinite(host) || host < 0 || host > static_cast<double>(1 << 30)) {
    bad("runtime.hostMemoryGiB", "The host memory per node must be 0 (not stated) or a positive number of GiB up to 2^30.");
  }
  if (setup.runtime.cublasWorkspaceConfig.size() > 256) {
    bad("runtime.cublasWorkspaceConfig", "CUBLAS_WORKSPACE_CONFIG longer than 256 characters is not meaningful.");
  } else if (!setup.runtime.cublasWorkspaceConfig.empty()) {
    RuntimeOptions o = DefaultRuntimeOptions();
    o.cublasWorkspaceConfig = setup.runtime.cublasWorkspaceConfig;
    for (FieldError& e : DeviceOverheads(setup.gpu.id, o).errors) errors.push_back(std::move(e));
  }
}

namespace {

// Allocator events placed among the trace's events: `count` of them in front of trace event
// `before` (trace.events.size(): after the last).
struct WorkspaceGroup {
  std::size_t before = 0;
  std::size_t count = 0;
};

// The trace's events for the allocator, with what happens between them outside the trace:
// - the cuBLAS workspaces, where PyTorch allocates them: a handle's workspace is allocated at
//   its first cuBLAS call (CublasHandlePool.cpp getCurrentCUDABlasHandle →
//   setWorkspaceForHandle), so the forward handle's before step 1's forward (the first matmul
//   comes after at most the embedding lookup) and the backward thread's before step 1's
//   backward. They stay cached for the process's life (never freed);
// - the trace's torch.cuda.empty_cache() calls (Trace::emptyCacheBefore), each an EmptyCache
//   event; one at the same place as a workspace group comes first (DeepSpeed's in init, and the
//   Trainer's before the backward, whose thread makes its workspace at its first cuBLAS call).
// The trace's events are not copied: `runs` alternates stretches of them with the placed
// events in `workspaces` (workspaces numbered after the trace's tensor ids).
struct DeviceEvents {
  std::vector<AllocatorEvent> workspaces;
  std::vector<WorkspaceGroup> groups;
  std::vector<AllocatorEventRun> runs;
};

void PlaceEvents(const Setup& setup, const Trace& trace, const DeviceOverheadsResult& overheads, DeviceEvents& out) {
  const std::vector<std::int64_t>& work = overheads.workspaceAllocations;
  const int handles = RuntimeOptionsOf(setup.runtime).cublasHandles;
  const std::size_t perHandle = handles > 0 ? work.size() / static_cast<std::size_t>(handles) : 0;
  const std::size_t n = trace.events.size();
  // The first event of each phase: a scan that stops at the first backward event (the first
  // forward one comes before it, when there is one), not a pass over the trace.
  std::size_t forward = n, backward = n;
  for (std::size_t i = 0; i < n && backward == n; ++i) {
    const Phase phase = trace.events[i].phase;
    if (phase == Phase::Forward && forward == n) forward = i;
    if (phase == Phase::Backward) backward = i;
  }
  if (forward == n && backward < n) {  // no forward event before the first backward one: one after it?
    for (std::size_t i = backward; i < n; ++i) {
      if (trace.events[i].phase == Phase::Forward) {
        forward = i;
        break;
      }
    }
  }
  const std::size_t first = std::min(forward, backward), second = std::max(forward, backward);
  // Workspace ids follow the trace's: every trace id is below allocAt.size() (allocAt is
  // indexed by tensor id), and PictureOf names an id from there on a cuBLAS workspace.
  int nextId = static_cast<int>(trace.allocAt.size());
  out.workspaces.clear();
  out.groups.clear();
  out.runs.clear();
  std::size_t placed = 0, emptied = 0;
  const std::vector<std::size_t>& empties = trace.emptyCacheBefore;
  // The empty_cache calls up to trace event `upTo` (inclusive), each a group of one.
  auto emptyCachesUpTo = [&](std::size_t upTo) {
    for (; emptied < empties.size() && std::min(empties[emptied], n) <= upTo; ++emptied) {
      const std::size_t before = std::min(empties[emptied], n);
      if (!out.groups.empty() && out.groups.back().before == before &&
          out.workspaces.back().kind == AllocatorEventKind::EmptyCache) {
        continue;  // two calls in a row release what one does
      }
      out.groups.push_back({before, 1});
      out.workspaces.push_back({AllocatorEventKind::EmptyCache, -1, 0});
    }
  };
  auto place = [&](std::size_t count, std::size_t before) {
    const std::size_t k = std::min(count, work.size() - placed);
    if (k == 0) return;
    emptyCachesUpTo(before);
    out.groups.push_back({before, k});
    for (std::size_t j = 0; j < k; ++j, ++placed) out.workspaces.push_back({AllocatorEventKind::Alloc, nextId++, work[placed]});
  };
  if (first < n) place(first == forward ? (perHandle == 0 ? work.size() : perHandle) : work.size() - placed, first);
  if (second < n && second != first) place(work.size() - placed, second);
  place(work.size() - placed, n);  // no forward or backward phase
  emptyCachesUpTo(n);
  // The runs: trace [0, g0.before), g0's events, trace [g0.before, g1.before), … (the
  // workspaces vector is final now: the runs point into it).
  std::size_t from = 0, w = 0;
  for (const WorkspaceGroup& g : out.groups) {
    if (g.before > from) out.runs.push_back({.trace = trace.events.data() + from, .count = g.before - from});
    out.runs.push_back({.events = out.workspaces.data() + w, .count = g.count});
    from = g.before;
    w += g.count;
  }
  if (n > from) out.runs.push_back({.trace = trace.events.data() + from, .count = n - from});
}

// The allocator's snapshot as the picture the estimate carries: each block named by its
// tensor, the largest segments (and blocks) kept when there are too many to draw.
DeviceSegments PictureOf(const Trace& trace, const AllocatorResult& run, std::size_t peakTraceEvent) {
  DeviceSegments picture;
  picture.recorded = true;
  picture.eventIndex = peakTraceEvent;
  const std::vector<AllocatorSegmentInfo>& all = run.segmentsAtPeakReserved;
  picture.segmentCount = static_cast<std::int64_t>(all.size());
  for (const AllocatorSegmentInfo& s : all) {
    picture.reservedBytes += s.totalBytes;
    picture.allocatedBytes += s.allocatedBytes;
  }
  // The kMaxPictureSegments largest (ties: lower address), then back to address order.
  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (order.size() > kMaxPictureSegments) {
    std::nth_element(order.begin(), order.begin() + kMaxPictureSegments, order.end(), [&](std::size_t a, std::size_t b) {
      return all[a].totalBytes != all[b].totalBytes ? all[a].totalBytes > all[b].totalBytes : a < b;
    });
    order.resize(kMaxPictureSegments);
    std::sort(order.begin(), order.end());  // `all` is in address order
  }
  // A tensor id names a trace tensor (its Alloc event's tensor name) or, past the trace's
  // tensors, a cuBLAS workspace (PlaceEvents numbers them after the trace's ids).
  auto labelOf = [&](int tensorId) -> std::string {
    const auto id = static_cast<std::size_t>(tensorId);
    if (tensorId < 0 || id >= trace.allocAt.size()) return "cuBLAS workspace";
    const Event& alloc = trace.events[trace.allocAt[id]];
    std::string name = trace.TensorName(alloc);
    return name.empty() ? trace.Label(alloc) : name;
  };
  for (std::size_t i : order) {
    const AllocatorSegmentInfo& s = all[i];
    DeviceSegment segment{.address = s.address, .totalBytes = s.totalBytes, .allocatedBytes = s.allocatedBytes,
                          .smallPool = s.smallPool, .expandable = s.expandable, .stream = s.stream};
    // Blocks kept: all, or the largest kMaxPictureBlocksPerSegment (ties: lower address).
    std::vector<bool> keep(s.blocks.size(), s.blocks.size() <= kMaxPictureBlocksPerSegment);
    if (s.blocks.size() > kMaxPictureBlocksPerSegment) {
      std::vector<std::size_t> bySize(s.blocks.size());
      for (std::size_t b = 0; b < bySize.size(); ++b) bySize[b] = b;
      std::nth_element(bySize.begin(), bySize.begin() + kMaxPictureBlocksPerSegment, bySize.end(),
                       [&](std::size_t a, std::size_t b) {
                         return s.blocks[a].bytes != s.blocks[b].bytes ? s.blocks[a].bytes > s.blocks[b].bytes : a < b;
                       });
      for (std::size_t k = 0; k < kMaxPictureBlocksPerSegment; ++k) keep[bySize[k]] = true;
    }
    for (std::size_t b = 0; b < s.blocks.size(); ++b) {
      const AllocatorBlockInfo& blk = s.blocks[b];
      if (keep[b]) {
        segment.blocks.push_back({.bytes = blk.bytes, .requestedBytes = blk.requestedBytes, .allocated = blk.allocated,
                                  .label = blk.allocated ? labelOf(blk.tensorId) : std::string()});
      } else {
        ++segment.omittedBlocks;
        segment.omittedBlockBytes += blk.bytes;
        if (blk.allocated) segment.omittedAllocatedBlockBytes += blk.bytes;
      }
    }
    picture.segments.push_back(std::move(segment));
  }
  picture.omittedSegments = picture.segmentCount - static_cast<std::int64_t>(picture.segments.size());
  picture.omittedBytes = picture.reservedBytes;
  for (const DeviceSegment& s : picture.segments) picture.omittedBytes -= s.totalBytes;
  return picture;
}

std::int64_t AllocatorLimit(std::int64_t capacityBytes, const DeviceOverheadsResult& overheads) {
  return std::max<std::int64_t>(0, capacityBytes - OutsideAllocatorBytes(overheads));
}

// The setup's device overheads. Many GPUs: the job's size decides whether NCCL communicators
// exist (docs/parallel.md).
DeviceOverheadsResult OverheadsOf(const Setup& setup) {
  RuntimeOptions runtime = RuntimeOptionsOf(setup.runtime);
  runtime.worldSize = static_cast<int>(std::min<std::int64_t>(WorldSize(setup.parallel), 1 << 30));
  runtime.ncclCommunicators = NcclCommunicatorsOf(setup.parallel);
  return DeviceOverheads(setup.gpu.id, runtime);
}

}  // namespace

std::int64_t CapacityBytes(double memoryGiB) { return std::llround(memoryGiB * 1073741824.0); }

std::int64_t AllocatorLimitOf(const Setup& setup) {
  return AllocatorLimit(CapacityBytes(setup.gpu.memoryGiB), OverheadsOf(setup));
}

DeviceOverheadsResult DeviceOverheadsOf(const Setup& setup) { return OverheadsOf(setup); }

std::int64_t OutsideAllocatorBytes(const DeviceOverheadsResult& overheads) {
  return overheads.context.bytes + overheads.communication.bytes;
}

bool AllocatorRunDependsOnCapacity(const Setup& setup) {
  const AllocatorOptions o = AllocatorOptionsOf(setup.runtime);
  return o.expandableSegments || (o.perProcessMemoryFraction > 0 && o.garbageCollectionThreshold > 0);
}

DeviceAllocatorInput DeviceAllocatorInputOf(const Setup& setup, const Trace& trace, std::int64_t capacityBytes) {
  DeviceAllocatorInput input;
  const DeviceOverheadsResult overheads = OverheadsOf(setup);
  DeviceEvents placed;
  PlaceEvents(setup, trace, overheads, placed);
  // One vector of the same events, in the same order (the tests run it through the span API).
  for (const AllocatorEventRun& r : placed.runs) {
    for (std::size_t k = 0; k < r.count; ++k) {
      if (r.trace == nullptr) {
        input.events.push_back(r.events[k]);
      } else {
        const Event& e = r.trace[k];
        input.events.push_back({e.kind == EventKind::Alloc ? AllocatorEventKind::Alloc : AllocatorEventKind::Free,
                                e.tensorId, e.bytes, e.stream});
      }
    }
  }
  input.options = AllocatorOptionsOf(setup.runtime);
  input.limitBytes = AllocatorLimit(capacityBytes, overheads);
  return input;
}

DeviceEstimate ComputeDeviceEstimate(const Setup& setup, const Trace& trace, std::int64_t capacityBytes,
                                     bool explain, std::vector<std::int64_t>* reservedAfterEvent, bool segments) {
  DeviceEstimate d;
  d.capacityBytes = capacityBytes;
  const AllocatorOptions options = AllocatorOptionsOf(setup.runtime);
  const DeviceOverheadsResult overheads = OverheadsOf(setup);
  d.contextBytes = overheads.context.bytes;
  d.workspaceBytes = overheads.workspace.bytes;
  d.communicationBytes = overheads.communication.bytes;

  GPUMEM_THREAD_LOCAL DeviceEvents placed;  // kept for its buffers' capacity
  PlaceEvents(setup, trace, overheads, placed);
  const std::vector<WorkspaceGroup>& groups = placed.groups;
  // Allocator event → {trace event, whether it is a workspace placed in front of that event}.
  auto traceEventOf = [&](std::size_t at) -> std::pair<std::size_t, bool> {
    std::size_t offset = 0;  // workspaces before
    for (const WorkspaceGroup& g : groups) {
      const std::size_t start = g.before + offset;  // the group's first allocator event
      if (at < start) break;
      if (at < start + g.count) return {g.before, true};
      offset += g.count;
    }
    return {at - offset, false};
  };

  const std::int64_t limit = AllocatorLimit(capacityBytes, overheads);
  const AllocatorRecording recording{
      .timeline = reservedAfterEvent != nullptr, .segmentsAtPeak = segments, .segmentsAtOom = false};
  // One pass at the limit; when it fails, the figures without a limit go on from the first
  // cudaMalloc the limit refused (SimulateCachingAllocatorAtCapacity).
  AllocatorCapacityRun runs = SimulateCachingAllocatorAtCapacity(AllocatorEventRuns(placed.runs), options, limit, recording);
  const AllocatorResult& capped = runs.atCapacity;
  d.fits = !capped.oom.happened;
  d.capacityReached = runs.capacityReached;
  d.numAllocRetries = capped.numAllocRetries;
  if (capped.oom.happened) {
    const AllocatorOom& o = capped.oom;
    d.oom.happened = true;
    const auto [traceIndex, workspace] = traceEventOf(static_cast<std::size_t>(o.eventIndex));
    const bool outside = traceIndex >= trace.events.size();  // a workspace after the last event
    d.oom.eventIndex = trace.events.empty() ? 0 : outside ? trace.events.size() - 1 : traceIndex;
    d.oom.label = workspace || outside ? "cuBLAS workspace" : trace.Label(trace.events[traceIndex]);
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
  }
  // The figures without a limit when it failed: the allocator then never frees its cache, so
  // this is what the step reserves on a GPU large enough, not the least it could get by with.
  const AllocatorResult& run = capped.oom.happened ? runs.unlimited : capped;
  d.peakAllocatedBytes = run.peakAllocatedBytes;
  d.peakReservedBytes = run.peakReservedBytes;
  // The allocator's overhead: what its segments hold beyond the most the tensors ever needed at
  // once. (Reserved − allocated at the moment reserved peaked is no measure of it: reserved can
  // reach its peak early in step 2, while little is allocated, and then stays there.)
  d.fragmentationBytes = run.peakReservedBytes - run.peakAllocatedBytes;
  if (segments && run.peakReservedEvent >= 0) {
    // The picture of the run the figures come from (without a limit when it did not fit).
    const auto [traceIndex, workspace] = traceEventOf(static_cast<std::size_t>(run.peakReservedEvent));
    (void)workspace;
    const std::size_t last = trace.events.empty() ? 0 : trace.events.size() - 1;
    d.segments = PictureOf(trace, run, std::min(traceIndex, last));
  }
  // CUDA unified memory (bitsandbytes' paged optimizer states; Trace::unifiedBytes) sits on the
  // GPU while there is room beside the allocator's segments and the context: it is made in step
  // 1's optimizer step and kept, and reserved only grows (no empty_cache), so the end of the
  // step is where both are largest. When a cudaMalloc needs its pages, the driver evicts them
  // to host memory instead of failing: NVIDIA's UVM driver registers eviction callbacks with
  // the GPU's physical memory allocator "to allow RM (which CUDA uses for non-UVM allocations)
  // to successfully allocate memory from the user memory pool allocated by UVM"
  // (open-gpu-kernel-modules kernel-open/nvidia-uvm/uvm_pmm_gpu.c, uvm_pmm_gpu_pma_evict_pages).
  // So it adds to what nvidia-smi shows, up to the capacity, and never decides `fits`.
  const std::int64_t outsideUnified = d.peakReservedBytes + d.contextBytes + d.communicationBytes;
  const std::int64_t room = std::max<std::int64_t>(0, capacityBytes - outsideUnified);
  d.unifiedBytes = std::min(trace.unifiedBytes, room);
  d.unifiedEvictedBytes = trace.unifiedBytes - d.unifiedBytes;
  d.peakDeviceBytes = outsideUnified + d.unifiedBytes;
  d.headroomBytes = capacityBytes - d.peakDeviceBytes;
  // Tight: little left beside what cannot give way. Resident paged states give way (the driver
  // evicts them), so they count in the headroom shown, not in the margin that makes it tight.
  d.tight = d.fits && capacityBytes - outsideUnified < std::max<std::int64_t>(kGiB, capacityBytes / 20);
  d.verdict = !d.fits ? "doesNotFit" : d.tight ? "tight" : "fits";

  if (reservedAfterEvent) {
    reservedAfterEvent->assign(trace.events.size(), 0);
    const std::size_t n = run.reservedBytesAfterEvent.size();
    std::size_t offset = 0, group = 0;  // workspaces in front of trace event i
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      while (group < groups.size() && groups[group].before <= i) offset += groups[group++].count;
      const std::size_t at = i + offset;  // its allocator event
      (*reservedAfterEvent)[i] = at < n ? run.reservedBytesAfterEvent[at] : 0;
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
  if (trace.unifiedBytes > 0) {
    d.why += d.unifiedEvictedBytes > 0
                 ? " Of the " + HumanBytes(trace.unifiedBytes) + " of paged optimizer states " +
                       HumanBytes(d.unifiedEvictedBytes) + " do not fit beside it: the driver keeps them in host " +
                       "memory and pages them in for each update (slower steps, no out-of-memory error)."
                 : " It includes " + HumanBytes(d.unifiedBytes) + " of paged optimizer states (CUDA unified memory, "
                       "outside PyTorch's allocator; evicted to host memory if the GPU runs short).";
  }
  if (d.fits && d.numAllocRetries > 0) {
    d.why += " The allocator had to free its cache " + FormatCount(d.numAllocRetries) +
             (d.numAllocRetries == 1 ? " time" : " times") + " to get there (slow steps).";
  }
  const double share = d.peakReservedBytes > 0 ? 100.0 * double(d.fragmentationBytes) / double(d.peakReservedBytes) : 0;
  d.fragmentationExplanation =
      "The caching allocator keeps freed blocks in its segments for reuse instead of returning them to CUDA; its "
      "segments peak " + HumanBytes(d.fragmentationBytes) + " (" + Percent(share) + " of reserved) above the most the "
      "tensors ever held at once, because a freed block serves only requests that fit inside it" +
      (setup.runtime.allocator.expandableSegments ? " (expandable segments grow in place, which keeps this small)."
                                                  : "; expandable_segments:True lets segments grow in place instead.");
  if (!explain) return d;
  d.peakAllocatedFormula = "largest sum of live block sizes (requests rounded up to 512 B, workspaces included): " +
                           FormatCount(d.peakAllocatedBytes) + " B";
  d.peakReservedFormula = "largest sum of cudaMalloc segments (2 MiB for requests ≤ 1 MiB, 20 MiB under 10 MiB, "
                          "else rounded up to 2 MiB; freed blocks cached): " + FormatCount(d.peakReservedBytes) + " B";
  d.fragmentationFormula = "peak reserved − peak allocated = " + FormatCount(d.peakReservedBytes) + " − " +
                           FormatCount(d.peakAllocatedBytes) + " = " + FormatCount(d.fragmentationBytes) + " B";
  d.contextFormula = overheads.context.formula;
  d.workspaceFormula = overheads.workspace.formula;
  d.communicationFormula = overheads.communication.formula;
  d.unifiedFormula = trace.unifiedBytes == 0
                         ? "no unified memory"
                         : "paged optimizer states " + FormatCount(trace.unifiedBytes) + " B, resident up to capacity − reserved − "
                           "context − communication = " + FormatCount(room) + " B: " + FormatCount(d.unifiedBytes) + " B (" +
                           FormatCount(d.unifiedEvictedBytes) + " B on the host)";
  d.peakDeviceFormula = "reserved " + FormatCount(d.peakReservedBytes) + " + context " + FormatCount(d.contextBytes) +
                        " + communication " + FormatCount(d.communicationBytes) +
                        (trace.unifiedBytes > 0 ? " + paged states " + FormatCount(d.unifiedBytes) : std::string()) + " = " +
                        FormatCount(d.peakDeviceBytes) + " B";
  d.headroomFormula = "capacity " + FormatCount(capacityBytes) + " − device peak " + FormatCount(d.peakDeviceBytes) +
                      " = " + FormatCount(d.headroomBytes) + " B";
  return d;
}

}  // namespace gpumem
