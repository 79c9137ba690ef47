// gpumem — a PyTorch CUDA memory snapshot, measured, beside the estimate.
//
// People record one with torch.cuda.memory._record_memory_history() and save it with
// torch.cuda.memory._dump_snapshot("x.pickle"), which pickles the dict that
// torch/csrc/cuda/memory_snapshot.cpp (_memory_snapshot_pickled) builds:
//   {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
//                  "requested_size", "stream", "segment_type": "large"|"small",
//                  "segment_pool_id", "is_expandable", "frames",
//                  "blocks": [{"address", "size", "requested_size",
//                              "state": "active_allocated"|"active_pending_free"|"inactive",
//                              "frames"}]}],
//    "device_traces": [[{"action": "alloc"|"free_requested"|"free_completed"|"segment_alloc"|
//                                 "segment_free"|"segment_map"|"segment_unmap"|"snapshot"|"oom",
//                        "addr" (OOM: "device_free"), "size", "stream", "time_us", "frames"}]
//                      — one list per device, oldest entry first],
//    "allocator_settings": {…}}
// The segments are the allocator's state when the snapshot was taken; the traces are the
// events before it (a ring buffer of max_entries, so the oldest may be gone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/error.hpp"

namespace gpumem {

// Allocated and reserved bytes after one trace entry (index 0: before the first entry).
struct MeasuredPoint {
  std::size_t index = 0;            // trace entries applied
  std::int64_t allocatedBytes = 0;  // torch.cuda.memory_allocated(): blocks handed to tensors
  std::int64_t reservedBytes = 0;   // torch.cuda.memory_reserved(): segments from cudaMalloc
  std::int64_t timeMicros = -1;     // the entry's time_us; −1 when the snapshot has none
};

// The segments at the moment of the snapshot.
struct SegmentSummary {
  std::size_t count = 0;
  std::size_t largeCount = 0;            // segment_type "large" (the ≥ 1 MiB pool)
  std::size_t blockCount = 0;
  std::size_t inactiveBlockCount = 0;    // cached, free for reuse
  std::int64_t reservedBytes = 0;        // Σ total_size
  std::int64_t allocatedBytes = 0;       // Σ size of "active_allocated" blocks
  std::int64_t activeBytes = 0;          // … plus "active_pending_free" (freed, awaiting a stream)
  std::int64_t inactiveBytes = 0;        // Σ size of "inactive" blocks: cached, not in use
  std::int64_t largestInactiveBlockBytes = 0;
  // 1 − largest inactive block / all inactive bytes: 0 when the cached memory is one piece
  // (any request up to its size fits), near 1 when it is scattered in small pieces.
  double fragmentation = 0;
};

struct MeasuredMemory {
  int device = 0;                       // the device shown: the one with the largest peak reserved
  std::size_t deviceCount = 0;          // devices with segments or trace entries
  std::size_t traceEntries = 0;         // entries in that device's trace
  std::int64_t peakAllocatedBytes = 0;  // over the trace window, snapshot state included
  std::int64_t peakReservedBytes = 0;
  std::size_t peakAllocatedIndex = 0;   // the MeasuredPoint index where the peak was reached
  std::int64_t startAllocatedBytes = 0;  // before the first recorded entry (reconstructed)
  std::int64_t startReservedBytes = 0;
  std::size_t oomCount = 0;             // "oom" entries
  SegmentSummary segments;              // that device's segments at the snapshot
  std::vector<MeasuredPoint> timeline;  // thinned to the limit, every peak kept
  std::vector<std::string> notes;       // what a reader should know (empty trace, inconsistencies)
};

struct MeasuredResult {
  std::vector<FieldError> errors;  // fields "snapshot", "snapshot.segments[3].total_size", …
  MeasuredMemory measured;
  bool ok() const { return errors.empty(); }
};

// Reads the bytes of a snapshot pickle (never executes anything: see gpumem/pickle.hpp). The
// timeline keeps at most `timelineLimit` points (≥ 4), per bucket its highest allocated and
// highest reserved point, so the peaks of the thinned timeline are the true peaks.
MeasuredResult ReadMemorySnapshot(std::string_view pickleBytes, std::size_t timelineLimit = 2000);

// The snapshot measured and, when `setupText` is not empty, the setup estimated:
// {"ok":true,"measured":{"device","deviceCount","traceEntries","peakAllocatedBytes",
//   "peakReservedBytes","peakAllocatedIndex","startAllocatedBytes","startReservedBytes",
//   "oomCount","segments":{…SegmentSummary…},"timeline":[{index,allocatedBytes,reservedBytes,
//   timeMicros}],"notes":[…]},
//  "estimate":{"peakBytes","gpuCapacityBytes","timeline":[{index,totalBytes}]}|null,
//  "comparison":{"estimateMinusPeakAllocatedBytes","estimateMinusPeakReservedBytes"}|null}
// or {"ok":false,"errors":[…]} (snapshot errors first, then the setup's).
std::string CompareSnapshotJson(std::string_view snapshotBytes, std::string_view setupText, int indent = -1);

}  // namespace gpumem
