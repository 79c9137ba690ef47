// The solvers: bisection on the simulated peak, and single changes (then a greedy combination)
// evaluated by the same simulation.
#include "gpumem/solve.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "gpumem/estimate.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

std::optional<std::int64_t> PeakOf(const Setup& setup) {
  if (!Validate(setup).empty()) return std::nullopt;
  return EstimateMemory(setup, {.timeline = EstimateOptions::Timeline::None, .explain = false}).estimate.peak.totalBytes;
}

// The largest v in [1, limit] with fits(v), given that the peak grows with v.
SolvedLimit LargestFitting(std::int64_t limit, const std::function<std::optional<std::int64_t>(std::int64_t)>& peak,
                           std::int64_t capacity) {
  SolvedLimit out;
  out.limit = limit;
  auto fits = [&](std::int64_t v, std::int64_t& bytes) {
    const auto p = peak(v);
    if (!p || *p > capacity) return false;
    bytes = *p;
    return true;
  };
  std::int64_t bytes = 0;
  if (limit < 1 || !fits(1, bytes)) return out;
  out.found = true;
  std::int64_t lo = 1, loBytes = bytes, hi = 2;
  while (hi <= limit && fits(hi, bytes)) {
    lo = hi;
    loBytes = bytes;
    hi = hi > limit / 2 ? limit + 1 : hi * 2;
  }
  if (hi > limit) hi = limit + 1;
  while (hi - lo > 1) {  // lo fits, hi does not (or is past the limit)
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid, bytes)) { lo = mid; loBytes = bytes; }
    else hi = mid;
  }
  out.value = lo;
  out.peakBytes = loBytes;
  return out;
}

std::int64_t SequenceLimit(const Setup& setup) {
  const ArchitectureDef& a = setup.model.architecture;
  if (setup.model.kind == ModelKind::Transformer && a.family != Family::Llama) return a.maxPositionEmbeddings;
  return std::min(Limits::maxSequenceLength, Limits::maxTokens / std::max<std::int64_t>(1, setup.training.batchSize));
}

}  // namespace

SolveResult Solve(const Setup& setup) {
  SolveResult out;
  out.errors = Validate(setup);
  if (!out.ok()) return out;
  const Estimate current = EstimateMemory(setup, {.timeline = EstimateOptions::Timeline::None, .explain = false}).estimate;
  out.currentPeakBytes = current.peak.totalBytes;
  out.capacityBytes = current.gpuCapacityBytes;
  const std::int64_t capacity = out.capacityBytes;

  out.maxBatchSize = LargestFitting(
      std::min(Limits::maxBatchSize, Limits::maxTokens / setup.training.sequenceLength),
      [&](std::int64_t b) { Setup s = setup; s.training.batchSize = b; return PeakOf(s); }, capacity);
  out.maxBatchSize.limitReason = "the estimator's limits (batch ≤ 1e6, batch × sequence ≤ 1e10 tokens)";
  out.maxSequenceLength = LargestFitting(
      SequenceLimit(setup), [&](std::int64_t n) { Setup s = setup; s.training.sequenceLength = n; return PeakOf(s); },
      capacity);
  const bool positionTable = setup.model.kind == ModelKind::Transformer && setup.model.architecture.family != Family::Llama;
  out.maxSequenceLength.limitReason = positionTable
      ? "the learned position table (maxPositionEmbeddings)"
      : "the estimator's limits (sequence ≤ 1e8, batch × sequence ≤ 1e10 tokens)";

  // Single changes.
  const TrainingDef& t = setup.training;
  const bool transformer = setup.model.kind == ModelKind::Transformer;
  auto add = [&](std::string id, std::string label, std::string tradeoff, std::vector<std::string> fields,
                 const std::function<void(Setup&)>& change) {
    FitSuggestion s;
    s.id = std::move(id);
    s.label = std::move(label);
    s.tradeoff = std::move(tradeoff);
    s.changedFields = std::move(fields);
    s.setup = setup;
    change(s.setup);
    const auto peak = PeakOf(s.setup);
    if (!peak) return;
    s.peakBytes = *peak;
    s.savedBytes = out.currentPeakBytes - *peak;
    s.fits = *peak <= capacity;
    if (s.savedBytes > 0) out.suggestions.push_back(std::move(s));
  };
  if (transformer && t.checkpointing != Checkpointing::EveryBlock) {
    add("checkpointing-everyBlock", "Checkpoint every block",
        "each block's forward runs again during backward: about a third more compute",
        {"training.checkpointing"}, [](Setup& s) { s.training.checkpointing = Checkpointing::EveryBlock; });
  }
  if (transformer && t.checkpointing == Checkpointing::None && t.attention == AttentionImplementation::Eager) {
    add("checkpointing-selective", "Recompute the attention core (selective checkpointing)",
        "the scores and softmax are recomputed in backward: a few percent more compute",
        {"training.checkpointing"}, [](Setup& s) { s.training.checkpointing = Checkpointing::Selective; });
  }
  if (transformer && t.attention == AttentionImplementation::Eager) {
    add("attention-sdpa", "Use fused attention (SDPA / FlashAttention)",
        "same result; needs a GPU and dtype the fused kernels support",
        {"training.attention"}, [](Setup& s) { s.training.attention = AttentionImplementation::SDPA; });
  }
  if (t.precision == Precision::FP32) {
    if (setup.model.kind != ModelKind::LayerList) {
      add("precision-ampBf16", "Train with autocast bf16", "bf16 matmuls; fp32 weights and states keep full precision",
          {"training.precision"}, [](Setup& s) { s.training.precision = Precision::AmpBF16; });
    }
    add("precision-bf16Mixed", "Train in bf16 with fp32 master weights",
        "bf16 weights, gradients and activations; the optimizer keeps fp32 copies",
        {"training.precision"}, [](Setup& s) { s.training.precision = Precision::BF16Mixed; });
  }
  if (t.precision != Precision::BF16) {
    add("precision-bf16", "Train in pure bf16", "no fp32 copies at all: updates lose precision, convergence may suffer",
        {"training.precision"}, [](Setup& s) { s.training.precision = Precision::BF16; });
  }
  if (t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW) {
    add("optimizer-adafactor", "Use Adafactor", "factored second moments: different optimisation dynamics",
        {"training.optimizer", "training.optimizerImplementation"}, [](Setup& s) {
          s.training.optimizer = OptimizerKind::Adafactor;
          s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
        });
    add("optimizer-sgdMomentum", "Use SGD with momentum", "one state per parameter instead of two; usually needs retuning",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::SGDMomentum; });
  }
  if (t.optimizerImplementation != OptimizerImplementation::Fused && t.optimizer != OptimizerKind::Adafactor) {
    add("optimizer-fused", "Use the fused optimizer (fused=True)", "same update, one kernel: no parameter-sized temporaries",
        {"training.optimizerImplementation"},
        [](Setup& s) { s.training.optimizerImplementation = OptimizerImplementation::Fused; });
  }
  if (!t.zeroGradSetToNone) {
    add("zero-grad-set-to-none", "zero_grad(set_to_none=True)", "none: gradients are freed instead of zeroed",
        {"training.zeroGradSetToNone"}, [](Setup& s) { s.training.zeroGradSetToNone = true; });
  }
  if (t.batchSize > 1) {
    const std::int64_t micro = out.maxBatchSize.found ? std::max<std::int64_t>(1, std::min(out.maxBatchSize.value, t.batchSize / 2))
                                                      : 1;
    const std::int64_t steps = (t.batchSize + micro - 1) / micro;
    add("batch-" + std::to_string(micro) + "-accumulate-" + std::to_string(steps),
        "Micro-batch " + FormatCount(micro) + " with " + FormatCount(steps) + " gradient-accumulation steps",
        "same effective batch (" + FormatCount(micro * steps) + "), " + FormatCount(steps) + " forward/backward passes per step",
        {"training.batchSize"}, [micro](Setup& s) { s.training.batchSize = micro; });
  }
  std::stable_sort(out.suggestions.begin(), out.suggestions.end(),
                   [](const FitSuggestion& a, const FitSuggestion& b) { return a.savedBytes > b.savedBytes; });

  // No single change fits: combine the largest savers, one change per field, until it fits.
  const bool anyFits = std::any_of(out.suggestions.begin(), out.suggestions.end(), [](const FitSuggestion& s) { return s.fits; });
  if (!anyFits && out.currentPeakBytes > capacity && out.suggestions.size() > 1) {
    FitSuggestion combo;
    combo.setup = setup;
    std::vector<std::string> labels;
    for (const FitSuggestion& s : out.suggestions) {
      bool clash = false;
      for (const std::string& f : s.changedFields) {
        clash = clash || std::find(combo.changedFields.begin(), combo.changedFields.end(), f) != combo.changedFields.end();
      }
      if (clash) continue;
      Setup next = combo.setup;
      for (const std::string& f : s.changedFields) {
        if (f == "training.checkpointing") next.training.checkpointing = s.setup.training.checkpointing;
        if (f == "training.attention") next.training.attention = s.setup.training.attention;
        if (f == "training.precision") next.training.precision = s.setup.training.precision;
        if (f == "training.optimizer") next.training.optimizer = s.setup.training.optimizer;
        if (f == "training.optimizerImplementation") next.training.optimizerImplementation = s.setup.training.optimizerImplementation;
        if (f == "training.zeroGradSetToNone") next.training.zeroGradSetToNone = s.setup.training.zeroGradSetToNone;
        if (f == "training.batchSize") next.training.batchSize = s.setup.training.batchSize;
      }
      const auto peak = PeakOf(next);
      if (!peak) continue;
      combo.setup = next;
      combo.changedFields.insert(combo.changedFields.end(), s.changedFields.begin(), s.changedFields.end());
      combo.peakBytes = *peak;
      labels.push_back(s.label);
      combo.id += (combo.id.empty() ? "" : "+") + s.id;
      combo.tradeoff += (combo.tradeoff.empty() ? "" : "; ") + s.tradeoff;
      if (*peak <= capacity) break;
    }
    if (labels.size() > 1) {
      combo.fits = combo.peakBytes <= capacity;
      combo.savedBytes = out.currentPeakBytes - combo.peakBytes;
      combo.label = "Combine: ";
      for (std::size_t i = 0; i < labels.size(); ++i) combo.label += (i ? " + " : "") + labels[i];
      out.suggestions.insert(out.suggestions.begin(), std::move(combo));
    }
  }
  return out;
}

}  // namespace gpumem
