// The solvers: the largest batch and sequence that fit (extrapolation from two simulations,
// then interpolation inside the bracket), and single changes (then a short greedy combination),
// each evaluated by the same simulation. Every simulation is counted (SolveResult.estimatesRun).
#include "gpumem/solve.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "gpumem/estimate.hpp"
#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/names.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/training_modes.hpp"
#include "sim/families/family.hpp"
#include "sim/savers.hpp"

namespace gpumem {
namespace {

constexpr EstimateOptions kPeaksOnly{.timeline = EstimateOptions::Timeline::None, .explain = false};

// The peak of each phase (Phase order) of one simulation; nullopt when the setup is refused.
using PhasePeaks = std::vector<std::int64_t>;
using PeakFn = std::function<std::optional<PhasePeaks>(std::int64_t)>;

// Each phase's allocated peak shifted by what the device adds at the overall peak (allocator
// cache, context, workspaces), so that the largest is the device peak the fit is decided on
// (Estimate::device: fits ⇔ peakDeviceBytes ≤ capacity, as the allocator simulation at capacity
// fails exactly when the step needs more) and the secant still follows each phase's growth.
PhasePeaks PhasePeaksOf(const Estimate& e) {
  PhasePeaks out;
  const std::int64_t deviceOverhead = e.device.peakDeviceBytes - e.peak.totalBytes;
  for (const Snapshot& s : e.phasePeaks) out.push_back(s.totalBytes + deviceOverhead);
  if (out.empty()) out.push_back(e.peak.totalBytes + deviceOverhead);
  return out;
}

std::int64_t Overall(const PhasePeaks& p) { return *std::max_element(p.begin(), p.end()); }

// Where the line through two points of each phase's peak crosses `capacity`, the earliest
// phase first (the overall peak is the largest phase peak, and each phase's peak is close to
// affine where the overall one bends: the optimizer step stays put while the backward grows).
// +inf when no phase grows.
double Crossing(std::int64_t va, const PhasePeaks& pa, std::int64_t vb, const PhasePeaks& pb, double capacity) {
  double x = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < pa.size() && k < pb.size(); ++k) {
    const double slope = (double(pb[k]) - double(pa[k])) / (double(vb) - double(va));
    if (slope > 0) x = std::min(x, double(vb) + (capacity - double(pb[k])) / slope);
  }
  return x;
}

// The largest v in [1, limit] whose peak fits `capacity`, given that the peak grows with v.
// `known` is one value whose peaks are already known (the setup's own), reused as a first point.
//
// Why not doubling and bisection (50–90 simulations a solve): each phase's peak is close to
// affine in batch (and in sequence, unless eager attention adds its s² scores), so the secant
// through the two latest points lands next to the answer, and the next guess (clamped inside
// the bracket) is its neighbour that settles it. A bisection step whenever the bracket fails
// to halve three times in a row keeps the worst case logarithmic.
SolvedLimit LargestFitting(std::int64_t limit, std::int64_t known, const PhasePeaks& knownPeaks, const PeakFn& peak,
                           std::int64_t capacity) {
  SolvedLimit out;
  out.limit = limit;
  if (limit < 1) return out;
  const double cap = static_cast<double>(capacity);
  // lo fits (0: none known); hi does not (limit + 1: none known yet).
  std::int64_t lo = 0, hi = limit + 1, loPeak = 0;
  struct Point { std::int64_t v; PhasePeaks peaks; };
  std::vector<Point> latest;  // the two latest valid points, newest last
  auto record = [&](std::int64_t v, const std::optional<PhasePeaks>& p) {
    if (p) {
      latest.push_back({v, *p});
      if (latest.size() > 2) latest.erase(latest.begin());
    }
    if (p && Overall(*p) <= capacity) {
      if (v > lo) { lo = v; loPeak = Overall(*p); }
    } else if (v < hi) {
      hi = v;
    }
  };
  if (known >= 1 && known <= limit) record(known, knownPeaks);
  if (lo == 0) {
    if (hi == 1) return out;
    record(1, peak(1));
    if (lo == 0) return out;
  }
  int stalls = 0;
  while (hi - lo > 1) {
    const std::int64_t width = hi - lo;
    const bool bounded = hi <= limit;
    double x = latest.size() == 2 ? Crossing(latest[0].v, latest[0].peaks, latest[1].v, latest[1].peaks, cap)
                                  : std::numeric_limits<double>::quiet_NaN();
    std::int64_t v;
    if (bounded && stalls >= 3) {
      v = lo + width / 2;
      stalls = 0;
    } else if (!std::isnan(x)) {
      v = x >= double(hi - 1) ? hi - 1 : x <= double(lo + 1) ? lo + 1 : static_cast<std::int64_t>(std::floor(x));
    } else {
      v = bounded ? lo + width / 2 : std::min(limit, 2 * lo);
    }
    record(v, peak(v));
    if (bounded) stalls = (hi - lo) * 2 > width ? stalls + 1 : 0;
  }
  out.found = true;
  out.value = lo;
  out.peakBytes = loPeak;
  return out;
}

// The largest v in [1, hardLimit] whose size bound stays representable (bound(v) < 2^53).
std::int64_t BoundLimit(std::int64_t hardLimit, const std::function<double(double)>& bound) {
  if (hardLimit < 1 || bound(double(hardLimit)) < Limits::maxEstimateBytes) return hardLimit;
  std::int64_t lo = 0, hi = hardLimit;  // bound(lo) fits (or lo = 0), bound(hi) does not
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (bound(double(mid)) < Limits::maxEstimateBytes ? lo : hi) = mid;
  }
  return lo;
}

// ModelStatesLowerBound (InventoryCache::Bound below): a lower bound of a setup's device peak
// (Overall of its phase peaks) found without simulating it, or -1 when none is known (this
// function is false): its model states (ComputeModelStates, which sums them per tensor
// with the trace's own rules). On one GPU all of them are allocated together when step 2's
// optimizer step begins: the parameters and fp32 master copies from init, never freed; every
// optimizer state, created by step 1's step (or its per-parameter steps in backward) and never
// freed; and every .grad, complete once backward has run (ComputeModelStates counts none with
// the optimizer in backward, which frees each one as it is applied). So the allocated peak is at
// least their sum; the caching allocator's reserved memory holds every allocated block (rounded
// up), and the device figure adds the context to it (ComputeDeviceEstimate). With many GPUs
// states are sharded or offloaded: no bound. A refused setup has none either.
bool HasModelStatesBound(const Setup& s) { return !IsParallel(s.parallel) && Validate(s).empty(); }

// The model states the caching allocator holds: all of them but bitsandbytes' paged optimizer
// states, which live in CUDA unified memory the driver evicts rather than fail (device_stage.cpp),
// so they bound nothing.
std::int64_t AllocatedStates(const Setup& s, const Inventory& inventory) {
  return ModelStatesTotalBytes(s, inventory) - PagedOptimizerStateBytes(s, inventory);
}

// The inventory of the setup a solve starts from, shared by the changes that build the same
// one. BuildInventory reads the model (a transformer's tensors: its architecture alone,
// ForEachTransformerTensor), the finetune section and, with a finetune active, the precision
// (ApplyFinetune, model/finetune.cpp: prepare_model_for_kbit_training's fp32 cast), and
// parallel.expertParallel (KeepLocalExperts, parallel/expert_split.cpp). A change that leaves
// all of those as they are gets the same inventory: of a bound on Mixtral 8x22B (5 M
// instructions), building the inventory and freeing its names were 2.9 M (callgrind).
class InventoryCache {
 public:
  explicit InventoryCache(const Setup& base) : base_(base) {}
  // ModelStatesLowerBound: validated first (an inventory is built only for a valid setup).
  std::int64_t Bound(const Setup& s) {
    if (!HasModelStatesBound(s)) return -1;
    if (!SameInventory(s)) return AllocatedStates(s, *SharedInventory(s));
    if (!inventory_) inventory_.emplace(BuildInventory(base_));
    // On one inventory the states' sum reads only these training fields (ComputeModelStates:
    // the precision's regime, optimizerInBackward; OptimizerStateTensors and the shared and
    // paged states: optimizer, optimizerImplementation, adafactorBeta1). Most changes (attention,
    // checkpointing, the allocator, the loss) leave them as they are.
    const TrainingDef& t = s.training;
    for (const Known& k : known_) {
      if (k.precision == t.precision && k.optimizer == t.optimizer && k.implementation == t.optimizerImplementation &&
          k.adafactorBeta1 == t.adafactorBeta1 && k.inBackward == t.optimizerInBackward) {
        return k.bytes;
      }
    }
    const std::int64_t bytes = AllocatedStates(s, *inventory_);
    known_.push_back({t.precision, t.optimizer, t.optimizerImplementation, t.adafactorBeta1, t.optimizerInBackward, bytes});
    return bytes;
  }

 private:
  bool SameInventory(const Setup& s) const {
    return s.model.kind == ModelKind::Transformer && base_.model.kind == ModelKind::Transformer &&
           s.model.architecture == base_.model.architecture && s.finetune == base_.finetune &&
           s.parallel.expertParallel == base_.parallel.expertParallel &&
           (s.training.precision == base_.training.precision || !FinetuneActive(s.finetune));
  }
  struct Known {
    Precision precision;
    OptimizerKind optimizer;
    OptimizerImplementation implementation;
    bool adafactorBeta1;
    bool inBackward;
    std::int64_t bytes;
  };
  const Setup& base_;
  std::optional<Inventory> inventory_;
  std::vector<Known> known_;  // Bound's sums on inventory_, by the fields they read
};

}  // namespace

std::int64_t ForwardEndFloor(const Setup& setup) {
  const TrainingDef& t = setup.training;
  const FinetuneDef& f = setup.finetune;
  const std::int64_t layers = setup.model.architecture.numLayers;
  const bool alike = t.checkpointing != Checkpointing::EveryKthBlock && !t.activationOffloading &&
                     f.freezeFirstBlocks == 0 && f.trainOnlyModules.empty();
  if (setup.model.kind != ModelKind::Transformer || IsParallel(setup.parallel) || layers < 3 || !alike) return 0;
  auto savedAtForwardEnd = [&](std::int64_t blocks) -> std::optional<std::int64_t> {
    Setup small = setup;
    small.model.architecture.numLayers = blocks;
    const EstimateResult r = EstimateMemory(small, kPeaksOnly);
    if (!r.ok()) return std::nullopt;
    std::int64_t bytes = 0;
    for (const CategoryBytes& row : r.estimate.forwardEnd.byCategory) {
      if (row.category == Category::Activations) bytes += row.bytes;
    }
    return bytes;
  };
  const auto one = savedAtForwardEnd(1), two = savedAtForwardEnd(2);
  if (!one || !two || *two <= *one) return 0;
  const ModelStates states = ComputeModelStates(setup, *SharedInventory(setup));
  // Paged optimizer states are no allocation (AllocatedStates).
  return states.parametersBytes + states.masterWeightsBytes + states.optimizerStatesBytes -
         PagedOptimizerStateBytes(setup, *SharedInventory(setup)) + (layers - 1) * (*two - *one);
}

namespace {

// Whether to try ForwardEndFloor before simulating a change whose model states (`states`, −1 for
// none) fit: only where the whole simulation is long (more than 100,000 predicted events, several
// milliseconds in the page: Mixtral 8x22B at 8k tokens with QLoRA predicts 290,356; Llama 3 8B
// with LoRA 37,620) and the floor is likely to settle it (the states alone take half the GPU or
// more). Its two small simulations cost 3/L of the whole one. Elsewhere the change is simulated,
// so its peak and saving are exact rather than bounds.
std::int64_t TryForwardEndFloor(const Setup& s, std::int64_t states, std::int64_t capacity) {
  if (states < 0 || 2 * states < capacity || s.model.architecture.numLayers < 16) return 0;
  if (PredictEvents(s).predictedEvents <= 100'000) return 0;
  return ForwardEndFloor(s);
}

const char* kBoundReason =
    "the estimator's size bound: beyond it, this setup's upper bound of memory passes 2^53 bytes "
    "(≈ 9.0e15), the largest the estimator represents";

}  // namespace

const char* FitCostId(FitCost cost) {
  switch (cost) {
    case FitCost::Free: return "free";
    case FitCost::Compute: return "compute";
    case FitCost::ChangesResults: return "changesResults";
  }
  return "";
}

SolveResult Solve(const Setup& setup) {
  // Only peaks are compared: no timeline, no words (a third of the work).
  EstimateResult current = EstimateMemory(setup, kPeaksOnly);
  if (!current.ok()) {
    SolveResult out;
    out.errors = std::move(current.errors);
    out.estimatesRun = 0;
    return out;
  }
  SolveResult out = Solve(setup, current.estimate);
  ++out.estimatesRun;
  return out;
}

SolveResult Solve(const Setup& setup, const Estimate& current) {
  SolveResult out;
  out.errors = Validate(setup);
  if (!out.ok()) return out;
  out.currentPeakBytes = current.device.peakDeviceBytes;  // the device figure fits is decided on
  out.capacityBytes = current.gpuCapacityBytes;
  const std::int64_t capacity = out.capacityBytes;
  auto phasePeaksOf = [&](const Setup& s) -> std::optional<PhasePeaks> {
    ++out.estimatesRun;
    const EstimateResult r = EstimateMemory(s, kPeaksOnly);  // validates first
    if (!r.ok()) return std::nullopt;
    return PhasePeaksOf(r.estimate);
  };
  auto peakOf = [&](const Setup& s) -> std::optional<std::int64_t> {
    const auto p = phasePeaksOf(s);
    return p ? std::optional(Overall(*p)) : std::nullopt;
  };
  const PhasePeaks currentPeaks = PhasePeaksOf(current);
  const TrainingDef& t = setup.training;
  const bool transformer = setup.model.kind == ModelKind::Transformer;
  const SizeBound bound = EstimateSizeBound(setup);
  // Batch size and sequence length do not change the model states: when those alone pass the
  // capacity, no batch and no sequence fits, and neither search simulates.
  InventoryCache inventories(setup);
  const std::int64_t statesBound = inventories.Bound(setup);
  const bool nothingFits = statesBound > capacity;
  // A change of these fields alone leaves every model state as it is (they shape activations,
  // the loss's temporaries and the allocator, not parameters, gradients or optimizer states): its
  // bound is the setup's own, not computed again.
  auto statesUnchanged = [](const std::vector<std::string>& fields) {
    static constexpr std::string_view kStatesUnchanged[] = {
        "training.checkpointing",       "training.attention",   "training.batchSize",
        "training.lossImplementation",  "training.lossChunks",  "training.activationOffloading",
        "training.useCache",            "training.useReentrant",  "runtime.allocator.expandableSegments"};
    return std::all_of(fields.begin(), fields.end(), [](const std::string& f) {
      return std::find(std::begin(kStatesUnchanged), std::end(kStatesUnchanged), f) != std::end(kStatesUnchanged);
    });
  };
  // `known`: the bound of the setup `changed` was made from by changing `fields` (a refused
  // setup has none, as ModelStatesLowerBound says).
  auto boundOf = [&](const Setup& changed, const std::vector<std::string>& fields, std::int64_t known) {
    if (!statesUnchanged(fields)) return inventories.Bound(changed);
    return Validate(changed).empty() ? known : std::int64_t{-1};
  };
  auto largestFitting = [&](std::int64_t limit, std::int64_t known, const PeakFn& peak) {
    if (!nothingFits) return LargestFitting(limit, known, currentPeaks, peak, capacity);
    SolvedLimit none;  // what LargestFitting returns when not even 1 fits
    none.limit = limit;
    return none;
  };

  // Largest micro-batch: the estimator's limits, then the size bound.
  {
    const std::int64_t hard = std::min(Limits::maxBatchSize, Limits::maxTokens / t.sequenceLength);
    const std::int64_t limit = BoundLimit(hard, [&](double b) { return bound.Total(b, double(t.sequenceLength)); });
    out.maxBatchSize = largestFitting(limit, t.batchSize, [&](std::int64_t b) {
      Setup s = setup;
      s.training.batchSize = b;
      return phasePeaksOf(s);
    });
    out.maxBatchSize.limitReason = limit < hard ? kBoundReason
                                                : "the estimator's limits (batch ≤ 1e6, batch × sequence ≤ 1e10 tokens)";
  }
  // Longest sequence: the position table (GPT-2, BERT), the estimator's limits, the size bound.
  {
    const ArchitectureDef& a = setup.model.architecture;
    const bool positionTable = transformer && (a.family == Family::GPT2 || a.family == Family::BERT);
    const std::int64_t estimatorLimit = std::min(Limits::maxSequenceLength, Limits::maxTokens / t.batchSize);
    const std::int64_t hard = positionTable ? std::min(estimatorLimit, a.maxPositionEmbeddings) : estimatorLimit;
    const std::int64_t limit = BoundLimit(hard, [&](double n) { return bound.Total(double(t.batchSize), n); });
    out.maxSequenceLength = largestFitting(limit, t.sequenceLength, [&](std::int64_t n) {
      Setup s = setup;
      s.training.sequenceLength = n;
      return phasePeaksOf(s);
    });
    out.maxSequenceLength.limitReason =
        limit < hard ? kBoundReason
        : positionTable && a.maxPositionEmbeddings <= estimatorLimit
            ? "the learned position table (maxPositionEmbeddings " + FormatCount(a.maxPositionEmbeddings) + ")"
            : "the estimator's limits (sequence ≤ 1e8, batch × sequence ≤ 1e10 tokens)";
  }

  // Single changes. A change that cannot lower the current peak is skipped unsimulated: when a
  // change alters only the events of some categories and the peak holds none of them, the other
  // categories' events are unchanged, so the same moment recurs with the same bytes and the new
  // peak is at least the current one. Attention, checkpointing and the micro-batch alter only
  // activations, their gradients, autocast's weight copies (and the batch itself); a fused
  // optimizer only the optimizer step's temporaries.
  auto heldAtPeak = [&](std::initializer_list<Category> categories) {
    std::int64_t bytes = 0;
    for (const CategoryBytes& row : current.peak.byCategory) {
      if (std::find(categories.begin(), categories.end(), row.category) != categories.end()) bytes += row.bytes;
    }
    return bytes > 0;
  };
  const bool activationsMatter =
      heldAtPeak({Category::Activations, Category::ActivationGradients, Category::WeightCopies});
  const bool batchMatters = activationsMatter || heldAtPeak({Category::InputBatch});
  const bool temporariesMatter = heldAtPeak({Category::OptimizerIntermediates});
  auto add = [&](FitCost cost, std::string id, std::string label, std::string tradeoff, std::vector<std::string> fields,
                 const std::function<void(Setup&)>& change, std::optional<std::int64_t> knownPeak = std::nullopt) {
    FitSuggestion s;
    s.cost = cost;
    s.id = std::move(id);
    s.label = std::move(label);
    s.tradeoff = std::move(tradeoff);
    s.changedFields = std::move(fields);
    s.setup = setup;
    change(s.setup);
    // A change whose model states alone pass the capacity cannot fit (ModelStatesLowerBound):
    // it is listed unsimulated, its peak the floor those states set and its saving the most it
    // could save (a 405B model on one GPU: each change is one simulation fewer). Refused setups
    // have no bound (-1): they are simulated and dropped as before.
    std::optional<std::int64_t> peak = knownPeak;
    if (!peak) {
      if (const std::int64_t least = boundOf(s.setup, s.changedFields, statesBound); least > capacity) {
        peak = least;
        s.peakIsLowerBound = true;
        s.lowerBoundBasis = "modelStates";
      } else if (const std::int64_t floor = TryForwardEndFloor(s.setup, least, capacity); floor > capacity) {
        // Its states fit, but not with what its blocks keep at the end of forward: two small
        // simulations instead of the whole one.
        peak = floor;
        s.peakIsLowerBound = true;
        s.lowerBoundBasis = "forwardEnd";
      } else {
        peak = peakOf(s.setup);
      }
    }
    if (!peak) return;
    s.peakBytes = *peak;
    s.savedBytes = out.currentPeakBytes - *peak;
    s.fits = *peak <= capacity;
    if (s.savedBytes > 0) out.suggestions.push_back(std::move(s));
  };
  if (transformer && activationsMatter && t.checkpointing != Checkpointing::EveryBlock) {
    add(FitCost::Compute, "checkpointing-everyBlock", "Checkpoint every block",
        "each block's forward runs again during backward: about a third more compute",
        {"training.checkpointing"}, [](Setup& s) { s.training.checkpointing = Checkpointing::EveryBlock; });
  }
  if (transformer && activationsMatter && t.checkpointing == Checkpointing::None &&
      t.attention == AttentionImplementation::Eager) {
    add(FitCost::Compute, "checkpointing-selective", "Recompute the attention core (selective checkpointing)",
        "the scores and softmax are recomputed in backward: a few percent more compute",
        {"training.checkpointing"}, [](Setup& s) { s.training.checkpointing = Checkpointing::Selective; });
  }
  // Non-reentrant checkpointing (sim/tape.hpp Checkpoint): the same computation, and a block's
  // backward holds neither the recomputed block output nor the incoming gradient, its recompute
  // stopping after the last saved tensor. It helps only where a backward is the peak.
  // (EffectiveTraining: the op-level policy is non-reentrant already.)
  if (transformer && activationsMatter && families::EffectiveTraining(setup).useReentrant &&
      t.checkpointing != Checkpointing::None && current.peak.phase == Phase::Backward) {
    add(FitCost::Free, "checkpointing-non-reentrant",
        "Checkpoint without reentrant autograd (gradient_checkpointing_kwargs={\"use_reentrant\": False})",
        "free: the same computation; each block's backward keeps one activation fewer and its recompute stops "
        "after the last tensor backward needs (PyTorch ≥ 2.1)",
        {"training.useReentrant"}, [](Setup& s) { s.training.useReentrant = false; });
  }
  if (transformer && activationsMatter && t.attention == AttentionImplementation::Eager) {
    add(FitCost::Free, "attention-sdpa", "Use fused attention (SDPA / FlashAttention)",
        "same result; needs a GPU and dtype the fused kernels support",
        {"training.attention"}, [](Setup& s) { s.training.attention = AttentionImplementation::SDPA; });
  }
  if (t.precision == Precision::FP32) {
    if (setup.model.kind != ModelKind::LayerList) {
      add(FitCost::ChangesResults, "precision-ampBf16", "Train with autocast bf16", "bf16 matmuls; fp32 weights and states keep full precision",
          {"training.precision"}, [](Setup& s) { s.training.precision = Precision::AmpBF16; });
    }
    add(FitCost::ChangesResults, "precision-bf16Mixed", "Train in bf16 with fp32 master weights",
        "bf16 weights, gradients and activations; the optimizer keeps fp32 copies",
        {"training.precision"}, [](Setup& s) { s.training.precision = Precision::BF16Mixed; });
  }
  if (t.precision != Precision::BF16) {
    add(FitCost::ChangesResults, "precision-bf16", "Train in pure bf16", "no fp32 copies at all: updates lose precision, convergence may suffer",
        {"training.precision"}, [](Setup& s) { s.training.precision = Precision::BF16; });
  }
  if (t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW) {
    add(FitCost::ChangesResults, "optimizer-adafactor", "Use Adafactor", "factored second moments: different optimisation dynamics",
        {"training.optimizer", "training.optimizerImplementation"}, [](Setup& s) {
          s.training.optimizer = OptimizerKind::Adafactor;
          s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
        });
    add(FitCost::ChangesResults, "optimizer-sgdMomentum", "Use SGD with momentum", "one state per parameter instead of two; usually needs retuning",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::SGDMomentum; });
  }
  if (temporariesMatter && t.optimizerImplementation != OptimizerImplementation::Fused &&
      t.optimizer != OptimizerKind::Adafactor) {
    add(FitCost::Free, "optimizer-fused", "Use the fused optimizer (fused=True)", "same update, one kernel: no parameter-sized temporaries",
        {"training.optimizerImplementation"},
        [](Setup& s) { s.training.optimizerImplementation = OptimizerImplementation::Fused; });
  }
  // The allocator's cache at its peak: expandable segments grow in place, so the free blocks
  // stranded inside fixed-size segments mostly go (simulated, not assumed).
  if (!setup.runtime.allocator.expandableSegments && current.device.fragmentationBytes > 0) {
    add(FitCost::Free, "allocator-expandableSegments", "Let the allocator grow segments in place (PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True)",
        "free: the same computation; segments grow in place instead of new cudaMalloc calls (PyTorch ≥ 2.1, Linux)",
        {"runtime.allocator.expandableSegments"}, [](Setup& s) { s.runtime.allocator.expandableSegments = true; });
  }
  // The Trainer's torch_empty_cache_steps=1: the backward starts without the forward's unsplit
  // cached segments (simulated: the allocator model runs the empty_cache). It frees no tensor,
  // so it is tried only where the allocated peak with the context would fit and the segments
  // do not: where the allocator's cache decides the verdict.
  const DeviceEstimate& dev = current.device;
  const bool cacheDecides = !dev.fits && dev.peakAllocatedBytes + dev.contextBytes + dev.communicationBytes <= capacity;
  if (t.emptyCacheSteps != 1 && setup.parallel.pipelineParallel <= 1 && cacheDecides) {
    add(FitCost::Compute, "training-emptyCacheSteps-1", "Empty the CUDA cache every step (Trainer: torch_empty_cache_steps=1)",
        "slower steps: the segments released before each backward are cudaMalloc'ed again; the backward starts "
        "without the forward's stranded free blocks",
        {"training.emptyCacheSteps"}, [](Setup& s) { s.training.emptyCacheSteps = 1; });
  }
  if (!t.zeroGradSetToNone) {
    add(FitCost::Free, "zero-grad-set-to-none", "zero_grad(set_to_none=True)", "none: gradients are freed instead of zeroed",
        {"training.zeroGradSetToNone"}, [](Setup& s) { s.training.zeroGradSetToNone = true; });
  }
  if (t.batchSize > 1 && batchMatters) {
    const std::int64_t micro = out.maxBatchSize.found ? std::max<std::int64_t>(1, std::min(out.maxBatchSize.value, t.batchSize / 2))
                                                      : 1;
    const std::int64_t steps = (t.batchSize + micro - 1) / micro;
    // The batch search already simulated the largest batch that fits.
    std::optional<std::int64_t> known;
    if (out.maxBatchSize.found && micro == out.maxBatchSize.value) known.emplace(out.maxBatchSize.peakBytes);
    add(FitCost::Compute, "batch-" + std::to_string(micro) + "-accumulate-" + std::to_string(steps),
        "Micro-batch " + FormatCount(micro) + " with " + FormatCount(steps) + " gradient-accumulation steps",
        "same effective batch (" + FormatCount(micro * steps) + "), " + FormatCount(steps) + " forward/backward passes per step",
        {"training.batchSize"}, [micro](Setup& s) { s.training.batchSize = micro; }, known);
  }
  // The fine-tuning changes (issue 11). Free: the chunked loss and the optimizer in backward
  // compute the same numbers; an 8-bit optimizer changes the update's precision.
  const bool decoder = transformer && setup.model.architecture.family != Family::BERT;
  // The loss: Liger's fused linear + cross-entropy where it applies (no logits at all, reduced
  // in fp32 in the kernel), else torchtune's chunked loss. One of the two, so that the solver
  // runs no more estimates than before; the fused one is refused under autocast and with a LoRA
  // lm_head (a validation, no estimate).
  Setup fusedLoss = setup;
  fusedLoss.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  const bool fusedApplies = decoder && activationsMatter &&
                            t.lossImplementation != LossImplementation::FusedLinearCrossEntropy &&
                            t.lossImplementation != LossImplementation::MegatronVocabParallel &&  // not Liger's
                            Validate(fusedLoss).empty();
  if (fusedApplies) {
    add(FitCost::Free, "loss-fused", "Fuse the output projection and the loss (Liger use_liger_kernel=True)",
        "free: the same loss; the logits exist one token chunk at a time and the head's gradients are made in forward",
        {"training.lossImplementation"},
        [](Setup& s) { s.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy; });
  } else if (decoder && activationsMatter && t.lossImplementation == LossImplementation::Standard) {
    add(FitCost::Free, "loss-chunked", "Chunk the output projection and the loss (torchtune CEWithChunkedOutputLoss, 8 chunks)",
        "free: the same loss; the logits are upcast to fp32 one chunk at a time",
        {"training.lossImplementation", "training.lossChunks"}, [](Setup& s) {
          s.training.lossImplementation = LossImplementation::Chunked;
          s.training.lossChunks = 8;
        });
  }
  // transformers' DynamicCache in training: where it keeps copies of every layer's key and value
  // (families::KeepsDynamicCache), use_cache=False computes the same loss without them.
  if (activationsMatter && families::KeepsDynamicCache(setup)) {
    add(FitCost::Free, "no-kv-cache", "Turn off the KV cache in training (use_cache=False)",
        "free: the same loss; transformers keeps no copy of each layer's key and value for a generation that never comes",
        {"training.useCache"}, [](Setup& s) { s.training.useCache = false; });
  }
  if (!t.optimizerInBackward && heldAtPeak({Category::Gradients, Category::OptimizerIntermediates})) {
    add(FitCost::Free, "optimizer-in-backward", "Step the optimizer in backward (torchtune optimizer_in_bwd=True)",
        "the same update; each gradient is freed once applied, so gradient accumulation is not possible",
        {"training.optimizerInBackward", "training.zeroGradSetToNone"}, [](Setup& s) {
          s.training.optimizerInBackward = true;
          s.training.zeroGradSetToNone = true;
        });
  }
  // Activation offloading: the same math, paid in host transfers that may not fully overlap
  // (ranked with checkpointing). Offered when the setup does not fit.
  if (transformer && activationsMatter && !t.activationOffloading && out.currentPeakBytes > capacity) {
    add(FitCost::Compute, "activation-offloading", "Offload activations to host memory (torchtune enable_activation_offloading=True)",
        "the same result; saved activations travel to pinned host memory and back over PCIe, which slows "
        "the step where the copies do not overlap with compute",
        {"training.activationOffloading"}, [](Setup& s) { s.training.activationOffloading = true; });
  }
  if (t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW) {
    // bitsandbytes' 32-bit AdamW with paged states (transformers' optim="paged_adamw_32bit"): the
    // same update; the states of tensors with at least 1e5 elements are CUDA unified memory, outside
    // the caching allocator, which the driver evicts to host memory rather than fail
    // (docs/device.md, "Paged optimizer states are not allocations").
    add(FitCost::Compute, "optimizer-pagedAdamw", "Use paged AdamW (bitsandbytes PagedAdamW, paged_adamw_32bit)",
        "the same update; the optimizer states live in CUDA unified memory that the driver moves to host memory "
        "when the GPU runs short, which slows the steps that page them back",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::PagedAdamW; });
  }
  if (t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW || t.optimizer == OptimizerKind::PagedAdamW) {
    add(FitCost::ChangesResults, "optimizer-adamw8bit", "Use 8-bit AdamW (bitsandbytes AdamW8bit)",
        "states quantized blockwise to 8 bits (2.03 B per parameter instead of 8): close to AdamW, not identical",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::AdamW8bit; });
  }
  // LoRA and QLoRA (the `finetune` section): adapters change what trains, so they change the
  // results. The recipes are the core's one list of training modes (model/training_modes.cpp:
  // torchtune's single-device LoRA and QLoRA recipes), the list the page's "What you will do"
  // offers. Offered only when the setup does not fit (they change what is trained, not how: a
  // setup that fits is not told to train something else) and nothing is adapted yet.
  if (transformer && out.currentPeakBytes > capacity && !setup.finetune.lora &&
      setup.finetune.quantization == Quantization::None) {
    const Family family = setup.model.architecture.family;
    const TrainingMode* lora = FindTrainingMode("lora");
    const TrainingMode* qlora = FindTrainingMode("qlora");
    add(FitCost::ChangesResults, "finetune-lora", std::string("Fine-tune with ") + lora->label,
        "the base weights are frozen and only low-rank adapters train (peft LoraConfig / torchtune lora recipes): "
        "a different, smaller update than full fine-tuning",
        TrainingModeFields(*lora), [lora, family](Setup& s) { ApplyTrainingMode(*lora, family, s.finetune); });
    add(FitCost::ChangesResults, "finetune-qlora", std::string("Fine-tune with ") + qlora->label,
        "LoRA on base weights stored in 4 bits (bitsandbytes NF4): the frozen weights are approximated, "
        "and each linear dequantizes its weight in forward and backward",
        TrainingModeFields(*qlora), [qlora, family](Setup& s) { ApplyTrainingMode(*qlora, family, s.finetune); });
  }

  // Those that fit first; then the cheapest kind of change; then the largest saving.
  std::stable_sort(out.suggestions.begin(), out.suggestions.end(), [](const FitSuggestion& a, const FitSuggestion& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.cost != b.cost) return a.cost < b.cost;
    return a.savedBytes > b.savedBytes;
  });

  // No single change fits: combine the largest savers, one change per field, until it fits.
  // The first is already simulated alone; at most kCombinationSteps more are simulated (the
  // largest savers come first, and each later one saves less, so a long tail rarely helps).
  constexpr int kCombinationSteps = 8;
  const bool anyFits = std::any_of(out.suggestions.begin(), out.suggestions.end(), [](const FitSuggestion& s) { return s.fits; });
  if (!anyFits && out.currentPeakBytes > capacity && out.suggestions.size() > 1) {
    FitSuggestion combo;
    combo.setup = setup;
    std::vector<std::string> labels;
    bool comboSimulated = true;  // combo.peakBytes is the simulated peak of combo.setup
    std::int64_t comboBound = statesBound;  // ModelStatesLowerBound(combo.setup)
    int steps = 0;
    for (const FitSuggestion& s : out.suggestions) {
      bool clash = false;
      for (const std::string& f : s.changedFields) {
        clash = clash || std::find(combo.changedFields.begin(), combo.changedFields.end(), f) != combo.changedFields.end();
      }
      // The optimizer in backward leaves no gradient to accumulate into.
      const bool accumulates = s.id.rfind("batch-", 0) == 0;
      clash = clash || (accumulates && combo.setup.training.optimizerInBackward) ||
              (s.setup.training.optimizerInBackward && combo.setup.training.batchSize != setup.training.batchSize);
      if (clash) continue;
      if (!labels.empty() && steps++ == kCombinationSteps) break;
      Setup next = combo.setup;
      for (const std::string& f : s.changedFields) {
        if (f == "training.checkpointing") next.training.checkpointing = s.setup.training.checkpointing;
        if (f == "training.attention") next.training.attention = s.setup.training.attention;
        if (f == "training.precision") next.training.precision = s.setup.training.precision;
        if (f == "training.optimizer") next.training.optimizer = s.setup.training.optimizer;
        if (f == "training.optimizerImplementation") next.training.optimizerImplementation = s.setup.training.optimizerImplementation;
        if (f == "training.zeroGradSetToNone") next.training.zeroGradSetToNone = s.setup.training.zeroGradSetToNone;
        if (f == "training.batchSize") next.training.batchSize = s.setup.training.batchSize;
        if (f == "runtime.allocator.expandableSegments") next.runtime = s.setup.runtime;
        if (f == "training.lossImplementation") next.training.lossImplementation = s.setup.training.lossImplementation;
        if (f == "training.lossChunks") next.training.lossChunks = s.setup.training.lossChunks;
        if (f == "training.optimizerInBackward") next.training.optimizerInBackward = s.setup.training.optimizerInBackward;
        if (f == "training.activationOffloading") next.training.activationOffloading = s.setup.training.activationOffloading;
        if (f == "training.useCache") next.training.useCache = s.setup.training.useCache;
        if (f == "training.useReentrant") next.training.useReentrant = s.setup.training.useReentrant;
        if (f.rfind("finetune.", 0) == 0) next.finetune = s.setup.finetune;  // only LoRA / QLoRA touch it
      }
      // A step whose model states alone pass the capacity cannot fit: it is
      // taken unsimulated (only the last step's peak is reported, and only a fit ends the loop),
      // and a combination whose last step was such a one is listed by that step's floor.
      std::optional<std::int64_t> peak;
      bool simulated = true;
      const std::int64_t nextBound = boundOf(next, s.changedFields, comboBound);
      if (labels.empty()) {
        peak = s.peakBytes;
        simulated = !s.peakIsLowerBound;
      } else if (const std::int64_t least = nextBound; least > capacity) {
        peak = least;  // refused setups have no bound (-1), so they are simulated and skipped as before
        simulated = false;
      } else {
        peak = peakOf(next);
      }
      if (!peak) continue;
      comboSimulated = simulated;
      comboBound = nextBound;
      combo.setup = next;
      combo.changedFields.insert(combo.changedFields.end(), s.changedFields.begin(), s.changedFields.end());
      combo.peakBytes = *peak;
      labels.push_back(s.label);
      combo.id += (combo.id.empty() ? "" : "+") + s.id;
      combo.tradeoff += (combo.tradeoff.empty() ? "" : "; ") + s.tradeoff;
      combo.cost = std::max(combo.cost, s.cost);
      if (*peak <= capacity) break;
    }
    if (labels.size() > 1 && !comboSimulated) {
      // Its last step was left unsimulated because that step's model states alone pass the
      // capacity, and combo.peakBytes is their sum: the combination cannot fit either, and is
      // listed by that floor like a single change (a 405B model on one GPU: one simulation
      // fewer).
      combo.peakIsLowerBound = true;
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
