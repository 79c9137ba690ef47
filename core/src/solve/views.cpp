// Views of the design space: every number is the peak of EstimateMemory on a changed copy of
// the setup (the same flow as the main estimate), so the page draws and never computes.
#include "gpumem/views.hpp"

#include "device/device_stage.hpp"
#include "parallel/parallel_step.hpp"
#include "sim/reduction.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/gpus.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

PeakPoint PeakOf(const Setup& setup, int& estimates) {
  PeakPoint p;
  std::vector<FieldError> errors = Validate(setup);
  if (errors.empty()) {
    ++estimates;
    // Peaks and the dominant category only: no timeline and no words (a third of the work).
    EstimateResult r = EstimateMemory(setup, {.timeline = EstimateOptions::Timeline::None, .explain = false});
    if (r.ok()) {
      const Estimate& e = r.estimate;
      p.ok = true;
      // The device figure (allocator cache, context, workspaces): what fits is decided on.
      p.peakBytes = e.device.peakDeviceBytes;
      p.allocatedDeviceBytes = e.device.peakAllocatedBytes + e.device.contextBytes + e.device.communicationBytes;
      p.deviceFloorBytes = e.gpuIndependentPeakBytes;
      p.reservedBytes = e.device.peakReservedBytes;
      p.reservedUnlimited = !e.device.fits || !e.device.capacityReached;
      p.tracePeakBytes = e.peak.totalBytes;
      p.unifiedBytes = e.device.unifiedBytes + e.device.unifiedEvictedBytes;
      p.gpuReductions = e.gpuReductions;
      p.fits = e.fits;
      p.dominant = e.peakDominant.category;
      p.dominantBytes = e.peakDominant.bytes;
      p.dominantSharePercent = e.peakDominant.sharePercent;
      return p;
    }
    errors = std::move(r.errors);
  }
  p.error = errors.empty() ? FieldError{ErrorCode::InvalidField, "", "The setup could not be estimated."} : errors.front();
  return p;
}

bool IsPowerOfTwo(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

std::int64_t PowerOfTwoAtLeast(std::int64_t v) {
  std::int64_t p = 1;
  while (p < v && p <= (std::int64_t{1} << 61)) p *= 2;
  return p;
}

// `count` values ending at the top (descending by halving, the first step to the power of two
// below a top that is not one), ascending, with `current` added when it is not among them.
// The top is a few doublings past the current value (so the view shows where it is heading),
// at least 2^(count−1) (a full axis from 1), and never past `limit`.
std::vector<std::int64_t> PowerAxis(std::int64_t current, std::int64_t limit, int count) {
  count = std::clamp(count, 1, 62);
  const std::int64_t anchor = PowerOfTwoAtLeast(std::max<std::int64_t>(1, current));
  std::int64_t top = std::max(anchor * 4, std::int64_t{1} << (count - 1));
  top = std::min(top, std::max<std::int64_t>(1, limit));
  std::vector<std::int64_t> values;
  for (std::int64_t v = top; v >= 1 && static_cast<int>(values.size()) < count;) {
    values.push_back(v);
    v = IsPowerOfTwo(v) ? v / 2 : PowerOfTwoAtLeast(v) / 2;
  }
  if (std::find(values.begin(), values.end(), current) == values.end() && current >= 1) values.push_back(current);
  std::sort(values.begin(), values.end());
  return values;
}

bool HasPositionTable(const Setup& setup) {  // learned positions: GPT-2, BERT (RoPE has no table)
  const Family f = setup.model.architecture.family;
  return setup.model.kind == ModelKind::Transformer && (f == Family::GPT2 || f == Family::BERT);
}

// Curves are denser than the heat map's axis: the powers of two with 3·2^(k−1) between each pair.
std::vector<std::int64_t> CurveAxis(std::int64_t current, std::int64_t limit, int points) {
  std::vector<std::int64_t> powers = PowerAxis(current, limit, (std::clamp(points, 2, 32) + 1) / 2);
  std::vector<std::int64_t> values = powers;
  for (std::size_t i = 0; i + 1 < powers.size(); ++i) {
    const std::int64_t a = powers[i], b = powers[i + 1];
    if (IsPowerOfTwo(a) && b == 2 * a && a >= 2) values.push_back(a + a / 2);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

// The largest value in [1, limit] that fits, given the points already estimated (ascending),
// by bisecting between the last point that fits and the first that does not. The peak grows
// with batch and sequence (the assumption Solve's bisection makes too).
void FindLargestFitting(Curve& curve, const std::function<PeakPoint(std::int64_t)>& peakAt) {
  std::size_t firstMiss = curve.values.size();
  for (std::size_t i = 0; i < curve.values.size(); ++i) {
    if (!curve.points[i].ok || !curve.points[i].fits) { firstMiss = i; break; }
  }
  if (firstMiss == curve.values.size()) {
    if (curve.values.empty()) return;
    curve.largestFound = true;
    curve.largestFitting = curve.values.back();
    curve.largestFittingPeakBytes = curve.points.back().peakBytes;
    curve.largestAtEnd = curve.values.back() < curve.limit.value;
    return;
  }
  std::int64_t lo = 0, loPeak = 0, hi = curve.values[firstMiss];
  if (firstMiss > 0) {
    lo = curve.values[firstMiss - 1];
    loPeak = curve.points[firstMiss - 1].peakBytes;
  } else if (hi > 1) {
    const PeakPoint one = peakAt(1);
    if (one.ok && one.fits) { lo = 1; loPeak = one.peakBytes; }
    else hi = 1;
  }
  while (lo >= 1 && hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    const PeakPoint p = peakAt(mid);
    if (p.ok && p.fits) { lo = mid; loPeak = p.peakBytes; }
    else hi = mid;
  }
  if (lo >= 1) {
    curve.largestFound = true;
    curve.largestFitting = lo;
    curve.largestFittingPeakBytes = loPeak;
  }
}

void AddField(SettingsCandidate& c, const char* field) {
  if (std::find(c.changedFields.begin(), c.changedFields.end(), field) == c.changedFields.end()) {
    c.changedFields.push_back(field);
  }
}

void AddChange(SettingsCandidate& c, const char* id, const char* label, const char* field) {
  if (!c.id.empty()) c.id += '+';
  c.id += id;
  c.labels.push_back(label);
  AddField(c, field);
}

}  // namespace

const char* ChangeTierId(ChangeTier tier) {
  switch (tier) {
    case ChangeTier::AsIs: return "asIs";
    case ChangeTier::SameMath: return "sameMath";
    case ChangeTier::Compute: return "compute";
    case ChangeTier::Numerics: return "numerics";
  }
  return "";
}

const char* ChangeTierLabel(ChangeTier tier) {
  switch (tier) {
    case ChangeTier::AsIs: return "as is";
    case ChangeTier::SameMath: return "same math, other kernels";
    case ChangeTier::Compute: return "more compute (recomputation)";
    case ChangeTier::Numerics: return "changed numerics";
  }
  return "";
}

AxisLimit BatchLimit(const Setup& setup) {
  return {std::min(Limits::maxBatchSize, Limits::maxTokens / std::max<std::int64_t>(1, setup.training.sequenceLength)),
          "the estimator's limits (batch ≤ 1e6, batch × sequence ≤ 1e10 tokens)"};
}

AxisLimit SequenceLimit(const Setup& setup) {
  if (HasPositionTable(setup)) {
    return {setup.model.architecture.maxPositionEmbeddings, "the learned position table (maxPositionEmbeddings)"};
  }
  return {std::min(Limits::maxSequenceLength, Limits::maxTokens / std::max<std::int64_t>(1, setup.training.batchSize)),
          "the estimator's limits (sequence ≤ 1e8, batch × sequence ≤ 1e10 tokens)"};
}

std::vector<std::int64_t> BatchAxis(const Setup& setup, int count) {
  return PowerAxis(setup.training.batchSize, BatchLimit(setup).value, count);
}

std::vector<std::int64_t> SequenceAxis(const Setup& setup, int count) {
  return PowerAxis(setup.training.sequenceLength, SequenceLimit(setup).value, count);
}

std::vector<FieldError> ValidateViewOptions(const ViewOptions& options) {
  std::vector<FieldError> errors;
  if (options.axisValues < 2 || options.axisValues > 12) {
    errors.push_back({ErrorCode::InvalidField, "axisValues",
                      "The heat map takes 2 to 12 values per axis (got " + std::to_string(options.axisValues) + ")."});
  }
  if (options.curvePoints < 2 || options.curvePoints > 32) {
    errors.push_back({ErrorCode::InvalidField, "curvePoints",
                      "A curve takes 2 to 32 points (got " + std::to_string(options.curvePoints) + ")."});
  }
  if (options.partCount < 1 || options.partCount > kMaxViewParts) {
    errors.push_back({ErrorCode::InvalidField, "part.count",
                      "A view is split into 1 to " + std::to_string(kMaxViewParts) + " parts (got " +
                          std::to_string(options.partCount) + ")."});
  } else if (options.partIndex < 0 || options.partIndex >= options.partCount) {
    errors.push_back({ErrorCode::InvalidField, "part.index",
                      "The part's index runs from 0 to " + std::to_string(options.partCount - 1) + " (got " +
                          std::to_string(options.partIndex) + ")."});
  }
  std::vector<FieldError> setupErrors = Validate(options.setup);
  errors.insert(errors.end(), setupErrors.begin(), setupErrors.end());
  return errors;
}

HeatMap ComputeHeatMap(const ViewOptions& options) {
  HeatMap out;
  out.errors = ValidateViewOptions(options);
  if (!out.ok()) return out;
  const Setup& setup = options.setup;
  out.capacityBytes = CapacityBytes(setup.gpu.memoryGiB);
  out.batchLimit = BatchLimit(setup);
  out.sequenceLimit = SequenceLimit(setup);
  out.batchSizes = BatchAxis(setup, options.axisValues);
  out.sequenceLengths = SequenceAxis(setup, options.axisValues);
  out.currentBatchSize = setup.training.batchSize;
  out.currentSequenceLength = setup.training.sequenceLength;
  out.partIndex = options.partIndex;
  out.partCount = options.partCount;
  for (std::size_t i = 0; i < out.batchSizes.size(); ++i) {
    std::vector<PeakPoint> row(out.sequenceLengths.size());
    for (std::size_t j = 0; j < out.sequenceLengths.size(); ++j) {
      if (!out.Computed(i, j)) continue;
      Setup s = setup;
      s.training.batchSize = out.batchSizes[i];
      s.training.sequenceLength = out.sequenceLengths[j];
      row[j] = PeakOf(s, out.estimates);
    }
    out.cells.push_back(std::move(row));
  }
  return out;
}

GpuMatrix ComputeGpuMatrix(const ViewOptions& options) {
  GpuMatrix out;
  out.errors = Validate(options.setup);  // the grid sizes do not apply here
  // Not split: where the candidates stop depends on every one before (ViewOptions::partCount).
  if (options.partCount != 1 || options.partIndex != 0) {
    out.errors.push_back({ErrorCode::InvalidField, options.partCount != 1 ? "part.count" : "part.index",
                          "The GPU matrix is computed whole: its part must be {\"index\": 0, \"count\": 1}."});
  }
  if (!out.ok()) return out;
  const Setup& setup = options.setup;
  const TrainingDef& t = setup.training;
  const bool transformer = setup.model.kind == ModelKind::Transformer;

  // --- the candidates, cheapest for the person first ---
  // Same math: fused attention computes the same softmax(QKᵀ)V without materialising the
  // scores; fused=True runs the same update in one kernel (torch.optim docs). Neither changes
  // the result, so every tier above them includes both.
  const bool canSdpa = transformer && t.attention == AttentionImplementation::Eager;
  auto canFuse = [](const Setup& s) {
    return s.training.optimizer != OptimizerKind::Adafactor && s.training.optimizerImplementation != OptimizerImplementation::Fused;
  };
  auto applySdpa = [&](SettingsCandidate& c) {
    if (!canSdpa) return;
    c.setup.training.attention = AttentionImplementation::SDPA;
    AddChange(c, "attention-sdpa", "fused attention (SDPA)", "training.attention");
  };
  auto applyFused = [&](SettingsCandidate& c) {
    if (!canFuse(c.setup)) return;
    c.setup.training.optimizerImplementation = OptimizerImplementation::Fused;
    AddChange(c, "optimizer-fused", "fused optimizer (fused=True)", "training.optimizerImplementation");
  };
  std::vector<SettingsCandidate> order;
  auto base = [&](ChangeTier tier) {
    SettingsCandidate c;
    c.setup = setup;
    c.tier = tier;
    return c;
  };
  {
    SettingsCandidate c = base(ChangeTier::AsIs);
    c.id = "asIs";
    order.push_back(c);
  }
  const bool fuse = canFuse(setup);
  if (fuse) { SettingsCandidate c = base(ChangeTier::SameMath); applyFused(c); order.push_back(c); }
  if (canSdpa) { SettingsCandidate c = base(ChangeTier::SameMath); applySdpa(c); order.push_back(c); }
  if (fuse && canSdpa) { SettingsCandidate c = base(ChangeTier::SameMath); applyFused(c); applySdpa(c); order.push_back(c); }

  // Compute: checkpointing every block re-runs each block's forward in backward (about a third
  // more compute; HF gradient_checkpointing_enable).
  const bool canCheckpoint = transformer && t.checkpointing != Checkpointing::EveryBlock;
  auto applyCheckpoint = [&](SettingsCandidate& c) {
    c.setup.training.checkpointing = Checkpointing::EveryBlock;
    AddChange(c, "checkpointing-everyBlock", "checkpoint every block", "training.checkpointing");
  };
  if (canCheckpoint) {
    SettingsCandidate c = base(ChangeTier::Compute);
    applyFused(c);
    applySdpa(c);
    applyCheckpoint(c);
    order.push_back(c);
  }

  // Numerics: precision steps (autocast keeps fp32 weights and states, mixed keeps fp32 master
  // weights, pure bf16 keeps no fp32 copy), then optimizer steps (Adafactor's factored second
  // moment, SGD's single momentum), then a precision and an optimizer step together.
  struct Step { const char* id; const char* label; const char* field; void (*apply)(Setup&); };
  std::vector<Step> precisions, optimizers;
  const Precision p = t.precision;
  if (p == Precision::FP32 && setup.model.kind != ModelKind::LayerList) {
    precisions.push_back({"precision-ampBf16", "autocast bf16", "training.precision",
                          [](Setup& s) { s.training.precision = Precision::AmpBF16; }});
  }
  if (p == Precision::FP32 || p == Precision::AmpBF16 || p == Precision::AmpFP16) {
    precisions.push_back({"precision-bf16Mixed", "bf16 with fp32 master weights", "training.precision",
                          [](Setup& s) { s.training.precision = Precision::BF16Mixed; }});
  }
  if (p != Precision::BF16) {
    precisions.push_back({"precision-bf16", "pure bf16", "training.precision",
                          [](Setup& s) { s.training.precision = Precision::BF16; }});
  }
  if (t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW) {
    optimizers.push_back({"optimizer-adafactor", "Adafactor", "training.optimizer", [](Setup& s) {
                            s.training.optimizer = OptimizerKind::Adafactor;
                            s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
                          }});
    optimizers.push_back({"optimizer-sgdMomentum", "SGD with momentum", "training.optimizer",
                          [](Setup& s) { s.training.optimizer = OptimizerKind::SGDMomentum; }});
  } else if (t.optimizer == OptimizerKind::SGDMomentum) {
    optimizers.push_back({"optimizer-sgd", "SGD without momentum", "training.optimizer",
                          [](Setup& s) { s.training.optimizer = OptimizerKind::SGD; }});
  }
  std::vector<std::vector<const Step*>> numerics;
  for (const Step& s : precisions) numerics.push_back({&s});
  for (const Step& s : optimizers) numerics.push_back({&s});
  for (const Step& a : precisions) for (const Step& b : optimizers) numerics.push_back({&a, &b});
  for (const auto& steps : numerics) {
    for (int checkpoint = 0; checkpoint <= (canCheckpoint ? 1 : 0); ++checkpoint) {
      SettingsCandidate c = base(ChangeTier::Numerics);
      for (const Step* s : steps) {
        s->apply(c.setup);
        AddChange(c, s->id, s->label, s->field);
        // Adafactor runs per parameter (HF's implementation), which changes a second field.
        if (c.setup.training.optimizer == OptimizerKind::Adafactor) AddField(c, "training.optimizerImplementation");
      }
      applyFused(c);
      applySdpa(c);
      if (checkpoint) applyCheckpoint(c);
      order.push_back(std::move(c));
    }
  }

  // --- the GPUs ---
  for (const GpuModel& g : Gpus()) {
    GpuFit f;
    f.id = g.id;
    f.label = g.label;
    f.memoryGiB = g.memoryGiB;
    f.capacityBytes = CapacityBytes(g.memoryGiB);
    out.gpus.push_back(std::move(f));
  }
  // A candidate is estimated once, on the setup's GPU; another GPU's figure follows from it
  // without an estimate where the GPU makes the same trace and the same allocator run. A GPU
  // changes three things: its context and NCCL buffers (outside the allocator: added per GPU),
  // its cuBLAS workspace (an allocation the allocator sees) and the scratch of the CUDA sums its
  // SM count sizes (sim/reduction.hpp: trace events). GPUs agreeing on the last two share one
  // unlimited allocator run (estimated on the first of them, at a capacity no step reaches, so
  // that no cache release enters) and its reserved peak. A GPU then fits this candidate when
  // that peak with its context, buffers and unified memory is under its capacity; a GPU between
  // that and the floor below is estimated on its own capacity, where the allocator's retries
  // decide; under the floor it cannot fit. Candidates go in cost order until every GPU has its
  // cheapest.
  std::size_t open = out.gpus.size();
  for (SettingsCandidate& c : order) {
    if (open == 0) break;
    c.peak = PeakOf(c.setup, out.estimates);
    if (!c.peak.ok) continue;
    const int index = static_cast<int>(out.candidates.size());
    c.rank = index;
    if (c.tier == ChangeTier::AsIs) out.currentPeakBytes = c.peak.peakBytes;
    // What decides a GPU's allocator run: its workspaces and the scratch of every CUDA sum.
    auto runKey = [&](const std::string& gpuId, const DeviceOverheadsResult& overheads) {
      std::vector<std::int64_t> key = overheads.workspaceAllocations;
      key.push_back(-1);
      const GpuParallelism gpu = GpuParallelismOf(gpuId);
      for (const ReductionShape& r : c.peak.gpuReductions) {
        const ReductionScratch scratch = LeadingSumScratch(r.rows, r.outputs, r.elementBytes, gpu);
        key.push_back(scratch.bufferBytes);
        key.push_back(scratch.semaphoreBytes);
      }
      return key;
    };
    struct Run {
      std::vector<std::int64_t> key;
      std::int64_t reservedBytes, tracePeakBytes;
    };
    // The candidate's own estimate ran without a limit where it did not fit, and where it did
    // without the capacity refusing a cudaMalloc, the run at capacity was that run.
    // DeepSpeed ZeRO-1/2 (from 0.18.7) flattens the parameters on the GPU only where NVML's free
    // memory holds the flat (parallel_step.cpp): the trace depends on the capacity. A GPU that
    // flattens on the device shares a run with the others that do (the run without a limit
    // flattens there too); one that does not is estimated on its own capacity.
    const bool zeroFlatten = c.setup.parallel.zeroStage > 0 && DeepSpeedZeroOneTwo(c.setup);
    const Inventory inventory = zeroFlatten ? BuildInventory(c.setup) : Inventory{};
    std::vector<Run> runs;
    if (c.peak.reservedUnlimited && (!zeroFlatten || DeepSpeedFlattensOnDevice(c.setup, inventory))) {
      runs.push_back({runKey(c.setup.gpu.id, DeviceOverheadsOf(c.setup)), c.peak.reservedBytes, c.peak.tracePeakBytes});
    }
    // Expandable segments size their virtual range by the capacity, and the garbage collection's
    // threshold is a fraction of it: there every GPU is estimated on its own.
    const bool ownCapacity = AllocatorRunDependsOnCapacity(c.setup);
    for (GpuFit& f : out.gpus) {
      if (f.smallestPeakCandidate < 0 || c.peak.peakBytes < out.candidates[f.smallestPeakCandidate].peak.peakBytes) {
        f.smallestPeakCandidate = index;
      }
      if (f.fits) continue;
      Setup own = c.setup;  // this GPU itself, at its own capacity
      own.gpu.id = f.id;
      own.gpu.memoryGiB = f.memoryGiB;
      auto estimateOnItsOwn = [&] {
        const PeakPoint p = PeakOf(own, out.estimates);
        if (p.ok && p.fits) {
          f.fits = true;
          f.choice = index;
          f.headroomBytes = std::max<std::int64_t>(0, f.capacityBytes - p.peakBytes);
          --open;
        }
      };
      // The floor: to fit, the run at capacity must hold the trace's live tensors at its peak
      // (reserved ≥ allocated ≥ them) within capacity − context − buffers, and no GPU brings
      // them below gpuIndependentPeakBytes. (Not under ZeRO-1/2's flattening by capacity.)
      const DeviceOverheadsResult overheads = DeviceOverheadsOf(own);
      const std::int64_t outside = OutsideAllocatorBytes(overheads);
      if (!zeroFlatten && c.peak.deviceFloorBytes + outside > f.capacityBytes) continue;
      if (ownCapacity || (zeroFlatten && !DeepSpeedFlattensOnDevice(own, inventory))) {
        estimateOnItsOwn();
        continue;
      }
      const std::vector<std::int64_t> key = runKey(f.id, overheads);
      auto run = std::find_if(runs.begin(), runs.end(), [&](const Run& r) { return r.key == key; });
      if (run == runs.end()) {
        Setup on = own;
        on.gpu.memoryGiB = Limits::maxGpuMemoryGiB;
        const PeakPoint p = PeakOf(on, out.estimates);
        if (!p.ok) {
          estimateOnItsOwn();
          continue;
        }
        runs.push_back({key, p.reservedBytes, p.tracePeakBytes});
        run = runs.end() - 1;
      }
      if (run->tracePeakBytes + outside > f.capacityBytes) continue;  // this GPU's own floor
      const std::int64_t peak = run->reservedBytes + outside + c.peak.unifiedBytes;
      if (peak <= f.capacityBytes) {
        f.fits = true;
        f.choice = index;
        f.headroomBytes = f.capacityBytes - peak;
        --open;
      } else {
        // Between the floor and the device figure the allocator's cache decides: at this GPU's
        // capacity it releases its cache and retries before failing.
        estimateOnItsOwn();
      }
    }
    out.candidates.push_back(std::move(c));
  }
  return out;
}

Curves ComputeCurves(const ViewOptions& options) {
  Curves out;
  out.errors = ValidateViewOptions(options);
  if (!out.ok()) return out;
  const Setup& setup = options.setup;
  out.capacityBytes = CapacityBytes(setup.gpu.memoryGiB);
  out.currentBatchSize = setup.training.batchSize;
  out.currentSequenceLength = setup.training.sequenceLength;
  out.currentPeakBytes = PeakOf(setup, out.estimates).peakBytes;

  auto fill = [&](Curve& curve, const char* field, AxisLimit limit, std::int64_t current, auto set) {
    curve.field = field;
    curve.limit = std::move(limit);
    curve.values = CurveAxis(current, curve.limit.value, options.curvePoints);
    auto peakAt = [&](std::int64_t v) {
      Setup s = setup;
      set(s, v);
      return PeakOf(s, out.estimates);
    };
    for (std::int64_t v : curve.values) curve.points.push_back(peakAt(v));
    FindLargestFitting(curve, peakAt);
  };
  out.partIndex = options.partIndex;
  out.partCount = options.partCount;
  if (out.Computed(0)) {
    fill(out.batch, "training.batchSize", BatchLimit(setup), setup.training.batchSize,
         [](Setup& s, std::int64_t v) { s.training.batchSize = v; });
  }
  if (out.Computed(1)) {
    fill(out.sequence, "training.sequenceLength", SequenceLimit(setup), setup.training.sequenceLength,
         [](Setup& s, std::int64_t v) { s.training.sequenceLength = v; });
  }
  return out;
}

}  // namespace gpumem
