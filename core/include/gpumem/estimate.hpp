// gpumem — Estimate: the plain result the CLI, the JSON, the wasm module and the page all read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

namespace gpumem {

// Bytes held by one category, with the formula that produced them.
struct CategoryBytes {
  Category category = Category::Parameters;
  std::int64_t bytes = 0;
  std::string formula;  // e.g. "369,405,824 parameters × 4 B (fp32)" or a sum of live tensors
};

// Memory at one moment of the replay.
struct Snapshot {
  std::int64_t totalBytes = 0;
  Phase phase = Phase::Init;
  int step = 0;
  std::size_t eventIndex = 0;          // index into the trace / timeline
  std::string label;                   // the event that reached this total
  std::vector<CategoryBytes> byCategory;  // categories holding memory, in Category order
};

// Running total after each event, for the timeline chart.
struct TimelinePoint {
  std::size_t index = 0;        // the event's index in the simulation
  Phase phase = Phase::Init;
  int step = 0;
  int layer = -1;
  std::string label;            // only with EstimateOptions::Timeline::Labelled
  Category category = Category::Activations;
  std::int64_t deltaBytes = 0;  // + allocation, − free
  std::int64_t totalBytes = 0;  // after the event
  // The caching allocator's reserved bytes after the event (Estimate::device's simulation).
  std::int64_t reservedBytes = 0;
};

// What an estimate carries besides the figures. Labels are rendered per event, so a caller
// that runs many estimates (the solver, the page's views) asks for none.
struct EstimateOptions {
  enum class Timeline {
    None,      // no timeline (eventCount still says how many events there were)
    Points,    // every event's running total, phase, step, layer and category
    Labelled,  // and each event's label ("layers.3 attention: q_proj backward: …")
  } timeline = Timeline::Points;
  // At most this many points (0: every event). Beyond it, each run of consecutive events
  // within one phase and step keeps its first, highest and lowest total, so no peak or trough
  // is lost; runs are about 2·events/limit long.
  std::size_t timelineLimit = 0;
  // Words: event labels, tensor names and formulas in the snapshots, the peak's explanation.
  // Off, the figures are the same and every such string is empty (for callers that only
  // compare peaks, such as the solver; about a third faster).
  bool explain = true;
  // The work budget validation holds the setup to (docs/budget.md): the page's and the JS API's
  // kMaxPredictedEvents by default; a native host may raise it up to kMaxHostPredictedEvents.
  double maxPredictedEvents = kMaxPredictedEvents;
};

// Persistent memory of the model (what stays between steps), with formulas.
struct ModelStates {
  std::int64_t parameterCount = 0;
  // Where the count comes from: "embeddings and head 38,597,376 + 12 blocks × 7,087,872 …".
  std::string parameterFormula;
  std::int64_t parametersBytes = 0;
  std::int64_t masterWeightsBytes = 0;
  std::int64_t gradientsBytes = 0;
  std::int64_t optimizerStatesBytes = 0;
  std::int64_t totalBytes = 0;            // sum of the four above
  std::vector<CategoryBytes> rows;        // the four, with formulas
  // When the architecture is exactly a preset's: its published count and how far the count
  // above is from it (a BERT preset's classifier, which the published count leaves out).
  std::string presetId;                   // empty when no preset matches
  std::int64_t publishedParameters = 0;
  std::int64_t differenceFromPublished = 0;  // parameterCount − publishedParameters
};

// Host (CPU) memory of one rank and of one node: what offloading moves off the GPU and what a
// paged optimizer may let the driver move there (docs/device.md "Host memory"; computed in
// core/src/replay/host_memory.cpp from the same shard plan and trace as the GPU figures).
struct HostRow {
  std::string label;      // "fp32 master partition", "optimizer states", "offloaded activations (peak)"
  std::int64_t bytes = 0;  // on one rank
  std::string formula;    // "196,412,672 × 4 B (fp32)"
  std::string source;     // the framework file and function that puts it there
  // "pinned" (page-locked: cudaHostAlloc), "pageable" (ordinary), or "unified" (cudaMallocManaged:
  // on the GPU unless the driver evicts it; not counted in the host totals).
  std::string memory;
};
struct HostMemory {
  std::int64_t rankBytes = 0;     // pinned + pageable bytes one rank keeps on the host
  std::int64_t pinnedBytes = 0;   // of rankBytes, page-locked
  std::int64_t ranksPerNode = 1;  // ranks sharing one host: min(8, world size), or the HYBRID_SHARD group
  std::int64_t nodeBytes = 0;     // rankBytes × ranksPerNode (every rank holds as much: equal partitions)
  std::int64_t unifiedBytes = 0;  // paged optimizer states: may move to the host, counted on the GPU
  std::vector<HostRow> rows;      // empty when nothing lives on the host
  // runtime.hostMemoryGiB in bytes; 0 = not stated. `fits`: nodeBytes ≤ capacityBytes (true when
  // not stated: nothing to check against).
  std::int64_t capacityBytes = 0;
  bool fits = true;
};

struct Estimate {
  ModelStates modelStates;
  Snapshot peak;                     // the largest total of the whole simulation
  // peak.totalBytes less the largest CUDA reduction scratch of the step (Trace::
  // gpuScratchMaxBytes): the only tensors whose sizes depend on the GPU, so on any GPU the same
  // setup's live tensors reach at least this. Not in the JSON; the GPU matrix's lower bound.
  std::int64_t gpuIndependentPeakBytes = 0;
  // Trace::gpuReductions: the CUDA sums whose scratch the GPU's SM count sizes (the GPU matrix
  // tells by them which GPUs make the same trace). Not in the JSON.
  std::vector<ReductionShape> gpuReductions;
  // Which category dominates the peak, its share, and why it is large there (what grows it and
  // what would shrink it), for people.
  std::string peakExplanation;
  // The same in parts, for a page that formats bytes its own way.
  struct Dominant {
    Category category = Category::Parameters;
    std::int64_t bytes = 0;
    double sharePercent = 0;  // of the peak
    std::string reason;       // what makes it large, what would shrink it
  } peakDominant;
  std::vector<Snapshot> phasePeaks;  // one per Phase, in Phase order (largest over both steps)
  // Memory at the end of step 1's forward pass: the model states that exist then, the tensors
  // saved for backward, the batch and the loss.
  Snapshot forwardEnd;
  std::vector<TimelinePoint> timeline;  // per EstimateOptions::timeline
  std::size_t eventCount = 0;           // events simulated (the timeline's length when present)
  std::int64_t gpuCapacityBytes = 0;
  // The device figure (allocator, context, workspaces); `fits` and `headroomBytes` are its
  // own (device.fits, capacity − peakDeviceBytes). The allocated-only peak is peak.totalBytes.
  DeviceEstimate device;
  bool fits = false;
  std::int64_t headroomBytes = 0;    // capacity − device.peakDeviceBytes; negative when it does not fit
  bool activationsFromHeuristic = false;  // quick mode: activations are the per-token heuristic
  std::vector<std::string> notes;
  // Many GPUs: the rank this estimate simulates and why (worldSize 1 on one GPU). modelStates,
  // the peak and the device figure are that rank's.
  SimulatedRank rank;
  // Host memory: empty rows (and zeros) when nothing is offloaded or paged.
  HostMemory host;
};

struct EstimateResult {
  std::vector<FieldError> errors;  // non-empty when the setup could not be estimated
  Estimate estimate;
  bool ok() const { return errors.empty(); }
};

// Setup → Inventory → Trace → Replay → Estimate. Validates first; never throws for bad input.
EstimateResult EstimateMemory(const Setup& setup, const EstimateOptions& options = {});

// Replays a trace: running total, overall and per-phase peaks, what is live at each peak.
Estimate Replay(const Trace& trace, const EstimateOptions& options = {});

// Persistent model states of a validated setup, computed from the same per-tensor rules the
// trace uses (parameters, master weights, gradients, optimizer states).
ModelStates ComputeModelStates(const Setup& setup, const Inventory& inventory);
// Its totalBytes alone, without the words (the solver's bounds).
std::int64_t ModelStatesTotalBytes(const Setup& setup, const Inventory& inventory);
// Its byte sums alone (parametersBytes, masterWeightsBytes, gradientsBytes, optimizerStatesBytes,
// totalBytes), without counts, rows or words (the solver's forward-end floor).
ModelStates ModelStateSums(const Setup& setup, const Inventory& inventory);

}  // namespace gpumem
