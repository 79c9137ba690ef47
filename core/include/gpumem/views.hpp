// gpumem — views of the design space around one setup, for the page's views panel: a heat map
// of the peak over micro-batch × sequence length, a GPU × settings matrix (the cheapest change
// that fits each GPU of Gpus()), and peak-vs-batch / peak-vs-sequence curves.
//
// Every number is a peak of EstimateMemory on a changed copy of the setup; nothing is
// interpolated. The grids are sized for the fast engine (~0.1–0.5 ms an estimate): at most
// (axisValues + 1)² heat-map cells, 2 × (curvePoints + 1) curve points plus two bisections, and
// at most ~30 candidate settings for the GPU matrix, so each view stays near 100 estimates.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

namespace gpumem {

// The most parts a view may be split into (ViewOptions::partCount).
constexpr int kMaxViewParts = 64;

// The one options struct every view takes.
struct ViewOptions {
  Setup setup;             // the setup the views are about (validated first)
  int axisValues = 8;      // heat map: powers of two per axis, 2–12 (the current value is added)
  int curvePoints = 16;    // curves: points per curve, 2–32 (powers of two and 3·2^k; the current value is added)
  // One part of a view's work, so that several workers share it (the page's pool, web/engine.js):
  // part partIndex of partCount computes the heat map's cells whose index (row × columns +
  // column) is ≡ partIndex mod partCount, and the curves (0 batch, 1 sequence) whose index is;
  // the rest are left out (null in the JSON). Interleaved, so the parts take about equal time
  // (a grid's expensive cells are not in one corner). Every part's cells together are the whole
  // view's, cell for cell (tests/views_test.cpp). The GPU matrix is one part: where it stops
  // depends on every candidate before.
  int partIndex = 0;       // 0 ≤ partIndex < partCount
  int partCount = 1;       // 1–64
};

// The peak of one estimate and what dominates it (Estimate::peakDominant).
struct PeakPoint {
  bool ok = false;                 // false: this setup is invalid or too large to estimate
  FieldError error;                // why, when !ok
  std::int64_t peakBytes = 0;      // Estimate::device.peakDeviceBytes
  bool fits = false;               // peakBytes ≤ the GPU's capacity
  // device.peakAllocatedBytes + context + communication: the device figure less the allocator's
  // cache.
  std::int64_t allocatedDeviceBytes = 0;
  // Estimate::gpuIndependentPeakBytes: on any GPU the device figure of this setup is at least
  // this plus that GPU's context and NCCL buffers (reserved ≥ the allocator's allocated ≥ the
  // bytes of the live tensors at the trace's peak, the cuBLAS workspaces only adding to them).
  // The GPU matrix skips an estimate that could not bring a GPU under its capacity.
  std::int64_t deviceFloorBytes = 0;
  // For the GPU matrix, which derives other GPUs' figures from this estimate's: the allocator's
  // reserved peak without a capacity limit (DeviceEstimate::peakReservedBytes of the run the
  // figures come from), the trace's allocated peak (Estimate::peak.totalBytes), CUDA unified
  // memory (Trace::unifiedBytes) and the sums whose scratch the GPU sizes.
  std::int64_t reservedBytes = 0;
  bool reservedUnlimited = false;  // reservedBytes is the run without a limit (no cache release)
  std::int64_t tracePeakBytes = 0;
  std::int64_t unifiedBytes = 0;
  std::vector<ReductionShape> gpuReductions;
  Category dominant = Category::Parameters;  // Estimate::peakDominant.category
  std::int64_t dominantBytes = 0;  // bytes of that category at the peak
  double dominantSharePercent = 0; // of the peak
};

// Why an axis stops where it does.
struct AxisLimit {
  std::int64_t value = 0;  // the largest value the axis may take (samples or tokens)
  std::string reason;      // "the learned position table (maxPositionEmbeddings)", …
};

struct HeatMap {
  std::vector<FieldError> errors;          // the setup (or the options) is invalid
  std::int64_t capacityBytes = 0;          // the GPU's capacity (B)
  std::vector<std::int64_t> batchSizes;    // rows, ascending (samples per micro-batch)
  std::vector<std::int64_t> sequenceLengths;  // columns, ascending (tokens per sample)
  std::int64_t currentBatchSize = 0;       // the setup's, one of batchSizes
  std::int64_t currentSequenceLength = 0;  // the setup's, one of sequenceLengths
  AxisLimit batchLimit, sequenceLimit;
  std::vector<std::vector<PeakPoint>> cells;  // cells[row][column]: batchSizes[row] × sequenceLengths[column]
  int estimates = 0;                       // how many estimates the view ran
  int partIndex = 0, partCount = 1;        // ViewOptions': the cells this part computed (Computed)
  bool ok() const { return errors.empty(); }
  // Whether cells[row][column] was estimated by this part (a default PeakPoint otherwise).
  bool Computed(std::size_t row, std::size_t column) const {
    return static_cast<int>((row * sequenceLengths.size() + column) % static_cast<std::size_t>(partCount)) == partIndex;
  }
};

// The changes the GPU matrix tries, cheapest for the person first: what keeps the math
// (fused attention, fused optimizer), then what costs compute (checkpointing), then what
// changes the numerics (precision, optimizer).
enum class ChangeTier { AsIs, SameMath, Compute, Numerics };

struct SettingsCandidate {
  std::string id;                           // "asIs", "attention-sdpa+optimizer-fused", …
  std::vector<std::string> labels;          // one per change, for people ("Fused attention (SDPA)")
  std::vector<std::string> changedFields;   // JSON paths: "training.attention", …
  ChangeTier tier = ChangeTier::AsIs;
  int rank = 0;                             // position in the cost order (0 = the setup as is)
  Setup setup;                              // the changed setup
  PeakPoint peak;
};

struct GpuFit {
  std::string id, label;        // Gpus()'s
  double memoryGiB = 0;         // nominal capacity (GiB)
  std::int64_t capacityBytes = 0;
  bool fits = false;            // some candidate fits
  int choice = -1;              // index into GpuMatrix::candidates of the cheapest that fits, or -1
  std::int64_t headroomBytes = 0;  // capacity − that candidate's peak (when fits)
  int smallestPeakCandidate = -1;  // the candidate with the smallest peak (how far off it is)
};

struct GpuMatrix {
  std::vector<FieldError> errors;
  std::int64_t currentPeakBytes = 0;
  std::vector<SettingsCandidate> candidates;  // in cost order; only those that were estimated
  std::vector<GpuFit> gpus;                   // Gpus()' order
  int estimates = 0;
  bool ok() const { return errors.empty(); }
};

struct Curve {
  std::string field;                  // "training.batchSize" or "training.sequenceLength"
  std::vector<std::int64_t> values;   // ascending
  std::vector<PeakPoint> points;      // one per value
  AxisLimit limit;
  bool largestFound = false;          // some value ≥ 1 fits
  std::int64_t largestFitting = 0;    // the largest value that fits, within values' range
  std::int64_t largestFittingPeakBytes = 0;
  bool largestAtEnd = false;          // the last value fits: the true largest may lie beyond
};

struct Curves {
  std::vector<FieldError> errors;
  std::int64_t capacityBytes = 0;
  std::int64_t currentBatchSize = 0, currentSequenceLength = 0;
  std::int64_t currentPeakBytes = 0;
  Curve batch;     // sequence fixed at the setup's
  Curve sequence;  // batch fixed at the setup's
  int estimates = 0;
  int partIndex = 0, partCount = 1;  // ViewOptions': the curves this part computed (Computed)
  bool ok() const { return errors.empty(); }
  // Whether curve 0 (batch) or 1 (sequence) was computed by this part (empty otherwise).
  bool Computed(int curve) const { return curve % partCount == partIndex; }
};

// Problems with the options themselves (field paths "axisValues", "curvePoints", "part.index",
// "part.count") and the setup.
std::vector<FieldError> ValidateViewOptions(const ViewOptions& options);

HeatMap ComputeHeatMap(const ViewOptions& options);
GpuMatrix ComputeGpuMatrix(const ViewOptions& options);
Curves ComputeCurves(const ViewOptions& options);

// The values the heat map and the curves use (exposed for tests): powers of two ending at the
// axis limit or a few doublings past the current value, with the current value added.
std::vector<std::int64_t> BatchAxis(const Setup& setup, int count);
std::vector<std::int64_t> SequenceAxis(const Setup& setup, int count);
AxisLimit BatchLimit(const Setup& setup);
AxisLimit SequenceLimit(const Setup& setup);

const char* ChangeTierId(ChangeTier tier);     // "asIs", "sameMath", "compute", "numerics"
const char* ChangeTierLabel(ChangeTier tier);  // for people

// JSON entry points (schema in docs/schema.md). Each takes one request object
// {"setup":{…},"axisValues":8,"curvePoints":12} (absent fields: DefaultSetup() and the
// defaults above) and returns {"ok":true,"heatMap"|"gpuMatrix"|"curves":{…}} or
// {"ok":false,"errors":[{"code","field","message"}]}. Never throws.
std::string HeatMapJson(std::string_view requestText, int indent = -1);
std::string GpuMatrixJson(std::string_view requestText, int indent = -1);
std::string CurvesJson(std::string_view requestText, int indent = -1);

}  // namespace gpumem
