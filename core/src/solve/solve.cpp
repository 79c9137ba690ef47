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
#include "gpumem/trace.hpp"
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
    // The base's inventory, or the shared one of a change that builds another (a fine-tuning
    // change's adapters): those come back too (the 8x22B solve bounded QLoRA's three times and
    // its combinations' four, each sum 0.4 M instructions, callgrind).
    std::shared_ptr<const Inventory> shared;
    const Inventory* inventory = nullptr;
    if (SameInventory(s)) {
      // SharedInventory: the base estimate's own (a transformer's), not a second copy built
      // (1.9 M instructions a Mixtral 8x22B solve, callgrind).
      if (!inventory_) inventory_ = SharedInventory(base_);
      inventory = inventory_.get();
    } else {
      shared = SharedInventory(s);
      inventory = shared.get();
    }
    // On one inventory the states' sum reads only these training fields (ComputeModelStates:
    // the precision's regime, optimizerInBackward; OptimizerStateTensors and the shared and
    // paged states: optimizer, optimizerImplementation, adafactorBeta1). Most changes (attention,
    // checkpointing, the allocator, the loss) leave them as they are.
    const TrainingDef& t = s.training;
    for (const Known& k : known_) {
      if (k.inventory == inventory && k.precision == t.precision && k.optimizer == t.optimizer &&
          k.implementation == t.optimizerImplementation && k.adafactorBeta1 == t.adafactorBeta1 &&
          k.inBackward == t.optimizerInBackward) {
        return k.bytes;
      }
    }
    const std::int64_t bytes = AllocatedStates(s, *inventory);
    known_.push_back({inventory, shared, t.precision, t.optimizer, t.optimizerImplementation, t.adafactorBeta1,
                      t.optimizerInBackward, bytes});
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
    const Inventory* inventory;
    // A shared inventory, held so that no other takes its address while the solve lasts.
    std::shared_ptr<const Inventory> held;
    Precision precision;
    OptimizerKind optimizer;
    OptimizerImplementation implementation;
    bool adafactorBeta1;
    bool inBackward;
    std::int64_t bytes;
  };
  const Setup& base_;
  std::shared_ptr<const Inventory> inventory_;
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
    // EstimateMemory's validation, trace and running totals, without its caching allocator run:
    // the forward's end is an allocated figure (Replay's), and the device stage was most of
    // these two simulations' cost. The trace stops there too (BuildTraceToForwardEnd: the same
    // events up to step 1's forward end, so the same figure): the Mixtral 8x22B solve's ten
    // small traces 11.4 → 4.8 M instructions (callgrind), the backward, the optimizer step and
    // step 2 left out.
    if (!Validate(small, kPeaksOnly.maxPredictedEvents).empty()) return std::nullopt;
    const Estimate replayed = Replay(BuildTraceToForwardEnd(small, *SharedInventory(small)), kPeaksOnly);
    std::int64_t bytes = 0;
    for (const CategoryBytes& row : replayed.forwardEnd.byCategory) {
      if (row.category == Category::Activations) bytes += row.bytes;
    }
    return bytes;
  };
  const auto one = savedAtForwardEnd(1), two = savedAtForwardEnd(2);
  if (!one || !two || *two <= *one) return 0;
  const std::shared_ptr<const Inventory> inventory = SharedInventory(setup);
  const ModelStates states = ModelStateSums(setup, *inventory);
  // Paged optimizer states are no allocation (AllocatedStates).
  return states.parametersBytes + states.masterWeightsBytes + states.optimizerStatesBytes -
         PagedOptimizerStateBytes(setup, *inventory) + (layers - 1) * (*two - *one);
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

namespace {

// One solve: the setup, its estimate, the answer being built, and the two ways to evaluate a
// changed setup — a simulation (counted in estimatesRun) or a lower bound that settles it
// without one (the model states alone, or what the blocks keep at the end of forward).
class Solver {
 public:
  Solver(const Setup& setup, const Estimate& current, SolveResult& out);
  void FindLimits();        // the largest micro-batch and the longest sequence that fit
  void AddSingleChanges();  // each change of one setting that could lower the peak
  void SortSuggestions();   // those that fit first; then the cheapest kind; then the largest saving
  void AddCombination();    // when none fits alone, or only at a cost: cheaper savers together

 private:
  std::optional<PhasePeaks> SimulatedPhasePeaks(const Setup& s);  // one simulation, counted
  std::optional<std::int64_t> PeakOf(const Setup& s);
  // A changed setup's peak: a floor that settles it unsimulated when its model states
  // (`statesBound`, -1 when refused), or those and what its blocks keep at the end of forward,
  // pass the capacity; else one simulation.
  struct Weighed {
    std::optional<std::int64_t> peak;  // nullopt: the setup is refused
    bool simulated = true;
    std::string basis;                 // FitSuggestion::lowerBoundBasis when not simulated
    std::int64_t statesBound = -1;
    bool forwardEndFits = false;  // Floor: the forward-end floor was taken, and fits
  };
  Weighed Weigh(const Setup& s, std::int64_t statesBound);
  // Weigh's lower bounds alone: `simulated` (and no peak) where neither rules a fit out.
  Weighed Floor(const Setup& s, std::int64_t statesBound);
  std::int64_t BoundOf(const Setup& changed, const std::vector<std::string>& fields, std::int64_t known);
  SolvedLimit Largest(std::int64_t limit, std::int64_t known, const PeakFn& peak);
  bool HeldAtPeak(std::initializer_list<Category> categories) const;
  void Add(FitCost cost, std::string id, std::string label, std::string tradeoff, std::vector<std::string> fields,
           const std::function<void(Setup&)>& change, std::optional<std::int64_t> knownPeak = std::nullopt);
  // AddSingleChanges, in the order the suggestions are listed before sorting (ties keep it).
  void AddRecomputeAndAttention();
  void AddPrecisionAndOptimizer();
  void AddAllocatorAndBatch();
  void AddSameResultRewrites();
  void AddStateSavers();
  void AddAdapters();

  const Setup& setup_;
  const Estimate& current_;
  SolveResult& out_;
  const TrainingDef& t_;
  const std::int64_t capacity_;
  const bool transformer_;
  InventoryCache inventories_;
  // The setup's model states as ModelStatesLowerBound counts them; when they alone pass the
  // capacity, no batch and no sequence fits, and neither search simulates.
  const std::int64_t statesBound_;
  const bool nothingFits_;
  const PhasePeaks currentPeaks_;
  // A change that cannot lower the current peak is skipped unsimulated: when a change alters only
  // the events of some categories and the peak holds none of them, the other categories' events
  // are unchanged, so the same moment recurs with the same bytes and the new peak is at least the
  // current one. Attention, checkpointing and the micro-batch alter only activations, their
  // gradients, autocast's weight copies (and the batch itself); a fused optimizer only the
  // optimizer step's temporaries.
  const bool activationsMatter_;
  const bool batchMatters_;
  const bool temporariesMatter_;
};

Solver::Solver(const Setup& setup, const Estimate& current, SolveResult& out)
    : setup_(setup),
      current_(current),
      out_(out),
      t_(setup.training),
      capacity_(current.gpuCapacityBytes),
      transformer_(setup.model.kind == ModelKind::Transformer),
      inventories_(setup),
      statesBound_(inventories_.Bound(setup)),
      nothingFits_(statesBound_ > capacity_),
      currentPeaks_(PhasePeaksOf(current)),
      activationsMatter_(HeldAtPeak({Category::Activations, Category::ActivationGradients, Category::WeightCopies})),
      batchMatters_(activationsMatter_ || HeldAtPeak({Category::InputBatch})),
      temporariesMatter_(HeldAtPeak({Category::OptimizerIntermediates})) {
  out_.currentPeakBytes = current.device.peakDeviceBytes;  // the device figure fits is decided on
  out_.capacityBytes = capacity_;
}

std::optional<PhasePeaks> Solver::SimulatedPhasePeaks(const Setup& s) {
  ++out_.estimatesRun;
  const EstimateResult r = EstimateMemory(s, kPeaksOnly);  // validates first
  if (!r.ok()) return std::nullopt;
  return PhasePeaksOf(r.estimate);
}

std::optional<std::int64_t> Solver::PeakOf(const Setup& s) {
  const auto p = SimulatedPhasePeaks(s);
  return p ? std::optional(Overall(*p)) : std::nullopt;
}

Solver::Weighed Solver::Weigh(const Setup& s, std::int64_t statesBound) {
  Weighed w = Floor(s, statesBound);
  if (w.simulated) w.peak = PeakOf(s);  // refused setups have no bound (-1): simulated, and dropped when refused
  return w;
}

Solver::Weighed Solver::Floor(const Setup& s, std::int64_t statesBound) {
  Weighed w;
  w.statesBound = statesBound;
  if (statesBound > capacity_) {
    w.peak = statesBound;
    w.simulated = false;
    w.basis = "modelStates";
  } else if (const std::int64_t floor = TryForwardEndFloor(s, statesBound, capacity_); floor > capacity_) {
    // Its states fit, but not with what its blocks keep at the end of forward: two small
    // simulations instead of the whole one.
    w.peak = floor;
    w.simulated = false;
    w.basis = "forwardEnd";
  } else {
    w.forwardEndFits = floor > 0;
  }
  return w;
}

// The model-states bound of `changed`, made from the setup by changing `fields`; `known` is the
// bound of the setup it was made from (a refused setup has none, as ModelStatesLowerBound says).
// These fields alone leave every model state as it is (they shape activations, the loss's
// temporaries and the allocator, not parameters, gradients or optimizer states): their bound is
// the setup's own, not computed again.
std::int64_t Solver::BoundOf(const Setup& changed, const std::vector<std::string>& fields, std::int64_t known) {
  static constexpr std::string_view kStatesUnchanged[] = {
      "training.checkpointing",       "training.attention",   "training.batchSize",
      "training.lossImplementation",  "training.lossChunks",  "training.activationOffloading",
      "training.useCache",            "training.useReentrant",  "runtime.allocator.expandableSegments"};
  const bool statesUnchanged = std::all_of(fields.begin(), fields.end(), [](const std::string& f) {
    return std::find(std::begin(kStatesUnchanged), std::end(kStatesUnchanged), f) != std::end(kStatesUnchanged);
  });
  if (!statesUnchanged) return inventories_.Bound(changed);
  return Validate(changed).empty() ? known : std::int64_t{-1};
}

SolvedLimit Solver::Largest(std::int64_t limit, std::int64_t known, const PeakFn& peak) {
  if (!nothingFits_) return LargestFitting(limit, known, currentPeaks_, peak, capacity_);
  SolvedLimit none;  // what LargestFitting returns when not even 1 fits
  none.limit = limit;
  return none;
}

bool Solver::HeldAtPeak(std::initializer_list<Category> categories) const {
  std::int64_t bytes = 0;
  for (const CategoryBytes& row : current_.peak.byCategory) {
    if (std::find(categories.begin(), categories.end(), row.category) != categories.end()) bytes += row.bytes;
  }
  return bytes > 0;
}

void Solver::FindLimits() {
  const SizeBound bound = EstimateSizeBound(setup_);
  // Largest micro-batch: the estimator's limits, then the size bound.
  {
    const std::int64_t hard = std::min(Limits::maxBatchSize, Limits::maxTokens / t_.sequenceLength);
    const std::int64_t limit = BoundLimit(hard, [&](double b) { return bound.Total(b, double(t_.sequenceLength)); });
    out_.maxBatchSize = Largest(limit, t_.batchSize, [&](std::int64_t b) {
      Setup s = setup_;
      s.training.batchSize = b;
      return SimulatedPhasePeaks(s);
    });
    out_.maxBatchSize.limitReason = limit < hard ? kBoundReason
                                                 : "the estimator's limits (batch ≤ 1e6, batch × sequence ≤ 1e10 tokens)";
  }
  // Longest sequence: the position table (GPT-2, BERT), the estimator's limits, the size bound.
  {
    const ArchitectureDef& a = setup_.model.architecture;
    const bool positionTable = transformer_ && (a.family == Family::GPT2 || a.family == Family::BERT);
    const std::int64_t estimatorLimit = std::min(Limits::maxSequenceLength, Limits::maxTokens / t_.batchSize);
    const std::int64_t hard = positionTable ? std::min(estimatorLimit, a.maxPositionEmbeddings) : estimatorLimit;
    const std::int64_t limit = BoundLimit(hard, [&](double n) { return bound.Total(double(t_.batchSize), n); });
    out_.maxSequenceLength = Largest(limit, t_.sequenceLength, [&](std::int64_t n) {
      Setup s = setup_;
      s.training.sequenceLength = n;
      return SimulatedPhasePeaks(s);
    });
    out_.maxSequenceLength.limitReason =
        limit < hard ? kBoundReason
        : positionTable && a.maxPositionEmbeddings <= estimatorLimit
            ? "the learned position table (maxPositionEmbeddings " + FormatCount(a.maxPositionEmbeddings) + ")"
            : "the estimator's limits (sequence ≤ 1e8, batch × sequence ≤ 1e10 tokens)";
  }
}

// A change whose model states alone pass the capacity cannot fit (ModelStatesLowerBound): it is
// listed unsimulated, its peak the floor those states set and its saving the most it could save
// (a 405B model on one GPU: each change is one simulation fewer). Refused setups have no bound
// (-1): they are simulated and dropped as before.
void Solver::Add(FitCost cost, std::string id, std::string label, std::string tradeoff, std::vector<std::string> fields,
                 const std::function<void(Setup&)>& change, std::optional<std::int64_t> knownPeak) {
  FitSuggestion s;
  s.cost = cost;
  s.id = std::move(id);
  s.label = std::move(label);
  s.tradeoff = std::move(tradeoff);
  s.changedFields = std::move(fields);
  s.setup = setup_;
  change(s.setup);
  std::optional<std::int64_t> peak = knownPeak;
  if (!peak) {
    Weighed w = Weigh(s.setup, BoundOf(s.setup, s.changedFields, statesBound_));
    peak = w.peak;
    s.peakIsLowerBound = !w.simulated;
    s.lowerBoundBasis = std::move(w.basis);
  }
  if (!peak) return;
  s.peakBytes = *peak;
  s.savedBytes = out_.currentPeakBytes - *peak;
  s.fits = *peak <= capacity_;
  if (s.savedBytes > 0) out_.suggestions.push_back(std::move(s));
}

void Solver::AddSingleChanges() {
  AddRecomputeAndAttention();
  AddPrecisionAndOptimizer();
  AddAllocatorAndBatch();
  AddSameResultRewrites();
  AddStateSavers();
  AddAdapters();
}

void Solver::AddRecomputeAndAttention() {
  if (transformer_ && activationsMatter_ && t_.checkpointing != Checkpointing::EveryBlock) {
    Add(FitCost::Compute, "checkpointing-everyBlock", "Checkpoint every block",
        "each block's forward runs again during backward: about a third more compute",
        {"training.checkpointing"}, [](Setup& s) { s.training.checkpointing = Checkpointing::EveryBlock; });
  }
  if (transformer_ && activationsMatter_ && t_.checkpointing == Checkpointing::None &&
      t_.attention == AttentionImplementation::Eager) {
    Add(FitCost::Compute, "checkpointing-selective", "Recompute the attention core (selective checkpointing)",
        "the scores and softmax are recomputed in backward: a few percent more compute",
        {"training.checkpointing"}, [](Setup& s) { s.training.checkpointing = Checkpointing::Selective; });
  }
  // Non-reentrant checkpointing (sim/tape.hpp Checkpoint): the same computation, and a block's
  // backward holds neither the recomputed block output nor the incoming gradient, its recompute
  // stopping after the last saved tensor. It helps only where a backward is the peak.
  // (EffectiveTraining: the op-level policy is non-reentrant already.)
  if (transformer_ && activationsMatter_ && families::EffectiveTraining(setup_).useReentrant &&
      t_.checkpointing != Checkpointing::None && current_.peak.phase == Phase::Backward) {
    Add(FitCost::Free, "checkpointing-non-reentrant",
        "Checkpoint without reentrant autograd (gradient_checkpointing_kwargs={\"use_reentrant\": False})",
        "free: the same computation; each block's backward keeps one activation fewer and its recompute stops "
        "after the last tensor backward needs (PyTorch ≥ 2.1)",
        {"training.useReentrant"}, [](Setup& s) { s.training.useReentrant = false; });
  }
  if (transformer_ && activationsMatter_ && t_.attention == AttentionImplementation::Eager) {
    Add(FitCost::Free, "attention-sdpa", "Use fused attention (SDPA / FlashAttention)",
        "same result; needs a GPU and dtype the fused kernels support",
        {"training.attention"}, [](Setup& s) { s.training.attention = AttentionImplementation::SDPA; });
  }
}

void Solver::AddPrecisionAndOptimizer() {
  if (t_.precision == Precision::FP32) {
    if (setup_.model.kind != ModelKind::LayerList) {
      Add(FitCost::ChangesResults, "precision-ampBf16", "Train with autocast bf16", "bf16 matmuls; fp32 weights and states keep full precision",
          {"training.precision"}, [](Setup& s) { s.training.precision = Precision::AmpBF16; });
    }
    Add(FitCost::ChangesResults, "precision-bf16Mixed", "Train in bf16 with fp32 master weights",
        "bf16 weights, gradients and activations; the optimizer keeps fp32 copies",
        {"training.precision"}, [](Setup& s) { s.training.precision = Precision::BF16Mixed; });
  }
  if (t_.precision != Precision::BF16) {
    Add(FitCost::ChangesResults, "precision-bf16", "Train in pure bf16", "no fp32 copies at all: updates lose precision, convergence may suffer",
        {"training.precision"}, [](Setup& s) { s.training.precision = Precision::BF16; });
  }
  if (t_.optimizer == OptimizerKind::Adam || t_.optimizer == OptimizerKind::AdamW) {
    Add(FitCost::ChangesResults, "optimizer-adafactor", "Use Adafactor", "factored second moments: different optimisation dynamics",
        {"training.optimizer", "training.optimizerImplementation"}, [](Setup& s) {
          s.training.optimizer = OptimizerKind::Adafactor;
          s.training.optimizerImplementation = OptimizerImplementation::PerParameter;
        });
    Add(FitCost::ChangesResults, "optimizer-sgdMomentum", "Use SGD with momentum", "one state per parameter instead of two; usually needs retuning",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::SGDMomentum; });
  }
  if (temporariesMatter_ && t_.optimizerImplementation != OptimizerImplementation::Fused &&
      t_.optimizer != OptimizerKind::Adafactor) {
    Add(FitCost::Free, "optimizer-fused", "Use the fused optimizer (fused=True)", "same update, one kernel: no parameter-sized temporaries",
        {"training.optimizerImplementation"},
        [](Setup& s) { s.training.optimizerImplementation = OptimizerImplementation::Fused; });
  }
}

void Solver::AddAllocatorAndBatch() {
  // The allocator's cache at its peak: expandable segments grow in place, so the free blocks
  // stranded inside fixed-size segments mostly go (simulated, not assumed).
  if (!setup_.runtime.allocator.expandableSegments && current_.device.fragmentationBytes > 0) {
    Add(FitCost::Free, "allocator-expandableSegments", "Let the allocator grow segments in place (PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True)",
        "free: the same computation; segments grow in place instead of new cudaMalloc calls (PyTorch ≥ 2.1, Linux)",
        {"runtime.allocator.expandableSegments"}, [](Setup& s) { s.runtime.allocator.expandableSegments = true; });
  }
  // The Trainer's torch_empty_cache_steps=1: the backward starts without the forward's unsplit
  // cached segments (simulated: the allocator model runs the empty_cache). It frees no tensor,
  // so it is tried only where the allocated peak with the context would fit and the segments
  // do not: where the allocator's cache decides the verdict.
  const DeviceEstimate& dev = current_.device;
  const bool cacheDecides = !dev.fits && dev.peakAllocatedBytes + dev.contextBytes + dev.communicationBytes <= capacity_;
  if (t_.emptyCacheSteps != 1 && setup_.parallel.pipelineParallel <= 1 && cacheDecides) {
    Add(FitCost::Compute, "training-emptyCacheSteps-1", "Empty the CUDA cache every step (Trainer: torch_empty_cache_steps=1)",
        "slower steps: the segments released before each backward are cudaMalloc'ed again; the backward starts "
        "without the forward's stranded free blocks",
        {"training.emptyCacheSteps"}, [](Setup& s) { s.training.emptyCacheSteps = 1; });
  }
  if (!t_.zeroGradSetToNone) {
    Add(FitCost::Free, "zero-grad-set-to-none", "zero_grad(set_to_none=True)", "none: gradients are freed instead of zeroed",
        {"training.zeroGradSetToNone"}, [](Setup& s) { s.training.zeroGradSetToNone = true; });
  }
  if (t_.batchSize > 1 && batchMatters_) {
    const SolvedLimit& largest = out_.maxBatchSize;
    const std::int64_t micro = largest.found ? std::max<std::int64_t>(1, std::min(largest.value, t_.batchSize / 2)) : 1;
    const std::int64_t steps = (t_.batchSize + micro - 1) / micro;
    // The batch search already simulated the largest batch that fits.
    std::optional<std::int64_t> known;
    if (largest.found && micro == largest.value) known.emplace(largest.peakBytes);
    Add(FitCost::Compute, "batch-" + std::to_string(micro) + "-accumulate-" + std::to_string(steps),
        "Micro-batch " + FormatCount(micro) + " with " + FormatCount(steps) + " gradient-accumulation steps",
        "same effective batch (" + FormatCount(micro * steps) + "), " + FormatCount(steps) + " forward/backward passes per step",
        {"training.batchSize"}, [micro](Setup& s) { s.training.batchSize = micro; }, known);
  }
}

// The fine-tuning changes (issue 11) that compute the same numbers: the loss, the KV cache,
// the optimizer in backward, activation offloading.
void Solver::AddSameResultRewrites() {
  const bool decoder = transformer_ && setup_.model.architecture.family != Family::BERT;
  // The loss: Liger's fused linear + cross-entropy where it applies (no logits at all, reduced
  // in fp32 in the kernel), else torchtune's chunked loss. One of the two, so that the solver
  // runs no more estimates than before; the fused one is refused under autocast and with a LoRA
  // lm_head (a validation, no estimate).
  Setup fusedLoss = setup_;
  fusedLoss.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy;
  const bool fusedApplies = decoder && activationsMatter_ &&
                            t_.lossImplementation != LossImplementation::FusedLinearCrossEntropy &&
                            t_.lossImplementation != LossImplementation::MegatronVocabParallel &&  // not Liger's
                            Validate(fusedLoss).empty();
  if (fusedApplies) {
    Add(FitCost::Free, "loss-fused", "Fuse the output projection and the loss (Liger use_liger_kernel=True)",
        "free: the same loss; the logits exist one token chunk at a time and the head's gradients are made in forward",
        {"training.lossImplementation"},
        [](Setup& s) { s.training.lossImplementation = LossImplementation::FusedLinearCrossEntropy; });
  } else if (decoder && activationsMatter_ && t_.lossImplementation == LossImplementation::Standard) {
    Add(FitCost::Free, "loss-chunked", "Chunk the output projection and the loss (torchtune CEWithChunkedOutputLoss, 8 chunks)",
        "free: the same loss; the logits are upcast to fp32 one chunk at a time",
        {"training.lossImplementation", "training.lossChunks"}, [](Setup& s) {
          s.training.lossImplementation = LossImplementation::Chunked;
          s.training.lossChunks = 8;
        });
  }
  // transformers' DynamicCache in training: where it keeps copies of every layer's key and value
  // (families::KeepsDynamicCache), use_cache=False computes the same loss without them.
  if (activationsMatter_ && families::KeepsDynamicCache(setup_)) {
    Add(FitCost::Free, "no-kv-cache", "Turn off the KV cache in training (use_cache=False)",
        "free: the same loss; transformers keeps no copy of each layer's key and value for a generation that never comes",
        {"training.useCache"}, [](Setup& s) { s.training.useCache = false; });
  }
  if (!t_.optimizerInBackward && HeldAtPeak({Category::Gradients, Category::OptimizerIntermediates})) {
    Add(FitCost::Free, "optimizer-in-backward", "Step the optimizer in backward (torchtune optimizer_in_bwd=True)",
        "the same update; each gradient is freed once applied, so gradient accumulation is not possible",
        {"training.optimizerInBackward", "training.zeroGradSetToNone"}, [](Setup& s) {
          s.training.optimizerInBackward = true;
          s.training.zeroGradSetToNone = true;
        });
  }
  // Activation offloading: the same math, paid in host transfers that may not fully overlap
  // (ranked with checkpointing). Offered when the setup does not fit.
  if (transformer_ && activationsMatter_ && !t_.activationOffloading && out_.currentPeakBytes > capacity_) {
    Add(FitCost::Compute, "activation-offloading", "Offload activations to host memory (torchtune enable_activation_offloading=True)",
        "the same result; saved activations travel to pinned host memory and back over PCIe, which slows "
        "the step where the copies do not overlap with compute",
        {"training.activationOffloading"}, [](Setup& s) { s.training.activationOffloading = true; });
  }
}

// Optimizers whose states take less of the device: paged (unified memory) or 8-bit.
void Solver::AddStateSavers() {
  if (t_.optimizer == OptimizerKind::Adam || t_.optimizer == OptimizerKind::AdamW) {
    // bitsandbytes' 32-bit AdamW with paged states (transformers' optim="paged_adamw_32bit"): the
    // same update; the states of tensors with at least 1e5 elements are CUDA unified memory, outside
    // the caching allocator, which the driver evicts to host memory rather than fail
    // (docs/device.md, "Paged optimizer states are not allocations").
    Add(FitCost::Compute, "optimizer-pagedAdamw", "Use paged AdamW (bitsandbytes PagedAdamW, paged_adamw_32bit)",
        "the same update; the optimizer states live in CUDA unified memory that the driver moves to host memory "
        "when the GPU runs short, which slows the steps that page them back",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::PagedAdamW; });
  }
  if (t_.optimizer == OptimizerKind::Adam || t_.optimizer == OptimizerKind::AdamW || t_.optimizer == OptimizerKind::PagedAdamW) {
    Add(FitCost::ChangesResults, "optimizer-adamw8bit", "Use 8-bit AdamW (bitsandbytes AdamW8bit)",
        "states quantized blockwise to 8 bits (2.03 B per parameter instead of 8): close to AdamW, not identical",
        {"training.optimizer"}, [](Setup& s) { s.training.optimizer = OptimizerKind::AdamW8bit; });
  }
}

// LoRA and QLoRA (the `finetune` section): adapters change what trains, so they change the
// results. The recipes are the core's one list of training modes (model/training_modes.cpp:
// torchtune's single-device LoRA and QLoRA recipes), the list the page's "What you will do"
// offers. Offered only when the setup does not fit (they change what is trained, not how: a
// setup that fits is not told to train something else) and nothing is adapted yet.
void Solver::AddAdapters() {
  if (!transformer_ || out_.currentPeakBytes <= capacity_ || setup_.finetune.lora ||
      setup_.finetune.quantization != Quantization::None) {
    return;
  }
  const Family family = setup_.model.architecture.family;
  const TrainingMode* lora = FindTrainingMode("lora");
  const TrainingMode* qlora = FindTrainingMode("qlora");
  Add(FitCost::ChangesResults, "finetune-lora", std::string("Fine-tune with ") + lora->label,
      "the base weights are frozen and only low-rank adapters train (peft LoraConfig / torchtune lora recipes): "
      "a different, smaller update than full fine-tuning",
      TrainingModeFields(*lora), [lora, family](Setup& s) { ApplyTrainingMode(*lora, family, s.finetune); });
  Add(FitCost::ChangesResults, "finetune-qlora", std::string("Fine-tune with ") + qlora->label,
      "LoRA on base weights stored in 4 bits (bitsandbytes NF4): the frozen weights are approximated, "
      "and each linear dequantizes its weight in forward and backward",
      TrainingModeFields(*qlora), [qlora, family](Setup& s) { ApplyTrainingMode(*qlora, family, s.finetune); });
}

void Solver::SortSuggestions() {
  std::stable_sort(out_.suggestions.begin(), out_.suggestions.end(), [](const FitSuggestion& a, const FitSuggestion& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.cost != b.cost) return a.cost < b.cost;
    return a.savedBytes > b.savedBytes;
  });
}

// The fields a suggestion changed, copied from its setup onto `next`.
void CopyChangedFields(const FitSuggestion& s, Setup& next) {
  const TrainingDef& from = s.setup.training;
  TrainingDef& to = next.training;
  for (const std::string& f : s.changedFields) {
    if (f == "training.checkpointing") to.checkpointing = from.checkpointing;
    if (f == "training.attention") to.attention = from.attention;
    if (f == "training.precision") to.precision = from.precision;
    if (f == "training.optimizer") to.optimizer = from.optimizer;
    if (f == "training.optimizerImplementation") to.optimizerImplementation = from.optimizerImplementation;
    if (f == "training.zeroGradSetToNone") to.zeroGradSetToNone = from.zeroGradSetToNone;
    if (f == "training.batchSize") to.batchSize = from.batchSize;
    if (f == "runtime.allocator.expandableSegments") next.runtime = s.setup.runtime;
    if (f == "training.lossImplementation") to.lossImplementation = from.lossImplementation;
    if (f == "training.lossChunks") to.lossChunks = from.lossChunks;
    if (f == "training.optimizerInBackward") to.optimizerInBackward = from.optimizerInBackward;
    if (f == "training.activationOffloading") to.activationOffloading = from.activationOffloading;
    if (f == "training.useCache") to.useCache = from.useCache;
    if (f == "training.useReentrant") to.useReentrant = from.useReentrant;
    if (f.rfind("finetune.", 0) == 0) next.finetune = s.setup.finetune;  // only LoRA / QLoRA touch it
  }
}

// No single change fits, or only at a cost (compute, changed results): combine the largest
// savers, one change per field, until it fits — those cheaper than the cheapest single that
// fits, if one does (fused attention and the fused loss together fit where checkpointing alone
// does too: offered first, and only if it fits). The first is already simulated alone; at most
// kCombinationSteps more are weighed (the largest savers come first, and each later one saves
// less, so a long tail rarely helps).
//
// Three rules keep the answer one a person would act on (the third, the optimizer in backward
// against gradient accumulation, where the greedy pass is weighed again below):
// - A change that sets the fields of one taken change replaces it while the combination's model
//   states alone pass the capacity and the newcomer's are fewer. Ranked by what they could save,
//   LoRA (its floor: 16-bit base weights) comes before QLoRA (simulated whole), and used to shut
//   QLoRA out: Llama 3 70B at 1 × 4096 on an H100 ended "LoRA + bf16: 132 GiB, does not fit",
//   where QLoRA with checkpointing fits.
// - Once it fits, what it fits without is left out again, the last change aside: first each
//   change that costs something (compute or results), latest first, with every free change
//   still in (the greedy order takes checkpointing, activation offloading and paged AdamW before
//   the adapters that make most of them needless); then the free ones (the same math), all at
//   once, else one at a time. A person reads the fewest changes, the costly ones fewest first.
//   One more simulation per costly change at most, and one for the free ones where none is
//   needed (Llama 3 70B QLoRA: "checkpointing + QLoRA", not four free changes besides).
//   Where lower bounds inform every trim, their end is guessed and simulated first, before the
//   combination itself (guessEnd): one simulation instead of up to four for the large models.
//   On 3,948 solves (every preset at 16–80 GiB, 2k and 8k tokens, batch 1 and 4, three
//   precisions, checkpointing, LoRA) every answer was the same as without the guess.
void Solver::AddCombination() {
  constexpr int kCombinationSteps = 8;
  std::vector<FitSuggestion>& suggestions = out_.suggestions;
  if (out_.currentPeakBytes <= capacity_ || suggestions.size() <= 1) return;
  // Where a single change fits, only changes that cost less than the cheapest such one are
  // combined, and the combination is offered only if it fits: the same math together before
  // checkpointing alone.
  bool anyFits = false;
  FitCost below = FitCost::ChangesResults;
  for (const FitSuggestion& s : suggestions) {
    if (s.fits && (!anyFits || s.cost < below)) below = s.cost;
    anyFits = anyFits || s.fits;
  }
  if (anyFits && below == FitCost::Free) return;

  using Steps = std::vector<const FitSuggestion*>;
  auto setupOf = [&](const Steps& steps) {
    Setup s = setup_;
    for (const FitSuggestion* step : steps) CopyChangedFields(*step, s);
    return s;
  };
  // Every combination weighed, and every lower bound taken, so that none is taken twice (the
  // trims below may come back to a combination their guess weighed; the greedy pass without the
  // optimizer in backward, to one the first pass weighed).
  std::vector<std::pair<Steps, Weighed>> floors, weighed;
  auto find = [](const std::vector<std::pair<Steps, Weighed>>& seen, const Steps& steps) -> const Weighed* {
    for (const auto& [s, o] : seen) {
      if (s == steps) return &o;
    }
    return nullptr;
  };
  auto floorOf = [&](const Steps& steps) {
    if (const Weighed* seen = find(floors, steps)) return *seen;
    const Setup s = setupOf(steps);
    floors.emplace_back(steps, Floor(s, inventories_.Bound(s)));
    return floors.back().second;
  };
  auto evaluate = [&](const Steps& steps) {
    Weighed o;
    if (steps.size() == 1) {  // a single change: already weighed
      o.peak = steps[0]->peakBytes;
      o.simulated = !steps[0]->peakIsLowerBound;
      o.basis = steps[0]->lowerBoundBasis;
      o.statesBound = inventories_.Bound(steps[0]->setup);
      return o;
    }
    if (const Weighed* seen = find(weighed, steps)) return *seen;
    o = floorOf(steps);  // Weigh, its bounds kept
    if (o.simulated) o.peak = PeakOf(setupOf(steps));
    weighed.emplace_back(steps, o);
    return o;
  };
  auto shareField = [](const FitSuggestion& a, const FitSuggestion& b) {
    return std::any_of(a.changedFields.begin(), a.changedFields.end(), [&](const std::string& f) {
      return std::find(b.changedFields.begin(), b.changedFields.end(), f) != b.changedFields.end();
    });
  };

  Steps taken;
  Weighed now;
  // Whether a weighed combination fits (simulated: a floor never says it fits).
  auto simulatedFit = [&](const Weighed& o) { return o.peak && o.simulated && *o.peak <= capacity_; };
  // Takes `without` when it still fits.
  bool trimmed = false;
  auto tryWithout = [&](const Steps& without) {
    const Weighed o = evaluate(without);
    if (!simulatedFit(o)) return false;
    taken = without;
    now = o;
    trimmed = true;
    return true;
  };
  // Once a combination fits, what it fits without is left out again, its last change aside (the
  // trims): first each costly change, latest first, with every free change still in; then the
  // free ones all at once (usually none is needed once the costly ones fit: one simulation),
  // else one at a time, latest first. `keep(without)` says whether `without` fits, and `steps`
  // becomes it.
  auto trim = [&](Steps& steps, const auto& keep) {
    const FitSuggestion* last = steps.back();
    auto oneByOne = [&](bool free) {
      for (std::size_t i = steps.size() - 1; i-- > 0;) {
        if ((steps[i]->cost == FitCost::Free) != free) continue;
        Steps without = steps;
        without.erase(without.begin() + static_cast<std::ptrdiff_t>(i));
        if (keep(without)) steps = std::move(without);
      }
    };
    oneByOne(false);
    Steps costlyOnly;
    for (const FitSuggestion* step : steps) {
      if (step->cost != FitCost::Free || step == last) costlyOnly.push_back(step);
    }
    // (A single change is not tried: none fits alone.)
    if (costlyOnly.size() < steps.size()) {
      if (costlyOnly.size() > 1 && keep(costlyOnly)) {
        steps = std::move(costlyOnly);
      } else {
        oneByOne(true);
      }
    }
  };
  // A guess at where the trims of `steps` end: each trim that no lower bound rules out taken as
  // fitting; empty unless every one of them had the forward-end floor to go by (the long
  // simulations, TryForwardEndFloor) and at least two are guessed. Simulated first: if the end
  // fits, and the fit is monotone in the changes (more changes, no higher peak) as it is away
  // from the capacity's edge, `steps` and each trim on the way fit as well, so the trims would end
  // there, and one simulation stands for all of theirs and for that of `steps` (Mixtral 8x22B at
  // 1 × 8192 on 80 GiB: one instead of four, "checkpointing + QLoRA"). Where the fit is not
  // monotone, the guess is still a fit with no more changes than the trims would leave.
  auto guessEnd = [&](const Steps& steps) {
    Steps guess = steps;
    bool informed = true;
    int guessed = 0;
    trim(guess, [&](const Steps& without) {
      if (without.size() == 1) return false;  // none fits alone
      const Weighed floor = floorOf(without);
      if (!floor.simulated) return false;  // a bound rules it out
      informed = informed && floor.forwardEndFits;
      ++guessed;
      return true;
    });
    return informed && guessed > 1 ? guess : Steps{};
  };
  bool endGuessed = false, guessMissed = false;
  // The greedy pass, leaving out the optimizer in backward when `withoutInBackward`; says
  // whether it passed over gradient accumulation because the optimizer in backward was taken.
  auto greedy = [&](bool withoutInBackward) {
    taken.clear();
    now = Weighed{};
    endGuessed = false;
    int steps = 0;
    bool accumulationBlocked = false;
    for (const FitSuggestion& s : suggestions) {
      if (anyFits && s.cost >= below) continue;
      if (withoutInBackward && s.setup.training.optimizerInBackward) continue;
      const Setup current = setupOf(taken);
      // The optimizer in backward leaves no gradient to accumulate into.
      const bool accumulates = s.id.rfind("batch-", 0) == 0;
      if (accumulates && current.training.optimizerInBackward) {
        accumulationBlocked = true;
        continue;
      }
      if (s.setup.training.optimizerInBackward && current.training.batchSize != setup_.training.batchSize) continue;
      Steps next = taken;
      std::size_t clashes = 0, clashAt = 0;
      for (std::size_t i = 0; i < taken.size(); ++i) {
        if (shareField(s, *taken[i])) {
          ++clashes;
          clashAt = i;
        }
      }
      if (clashes == 0) {
        next.push_back(&s);
      } else {
        // Replace the one change it clashes with, only while the states alone rule a fit out.
        if (clashes > 1 || now.basis != "modelStates") continue;
        next[clashAt] = &s;
        const std::int64_t bound = inventories_.Bound(setupOf(next));
        if (bound < 0 || bound >= now.statesBound) continue;
      }
      if (!taken.empty() && steps++ == kCombinationSteps) break;
      // Where `next` is to be simulated (no bound rules it out), the end of its trims first; once
      // such a guess has missed, the combinations are simulated as they come.
      if (!guessMissed && next.size() > 2 && floorOf(next).simulated && !find(weighed, next)) {
        const Steps end = guessEnd(next);
        if (!end.empty()) {
          guessMissed = true;
          const Weighed o = evaluate(end);
          if (simulatedFit(o) && Validate(setupOf(next)).empty()) {
            taken = end;
            now = o;
            endGuessed = trimmed = true;
            break;
          }
        }
      }
      const Weighed o = evaluate(next);
      if (!o.peak) continue;
      taken = std::move(next);
      now = o;
      if (*o.peak <= capacity_) break;
    }
    return accumulationBlocked;
  };
  auto fitsNow = [&] { return !taken.empty() && now.peak && *now.peak <= capacity_; };
  // The optimizer in backward (a free change, taken early) rules gradient accumulation out; where
  // the combination then does not fit, it is weighed again without it (Gemma 2 27B in bf16 mixed
  // at 2 × 4096 on an A100 40 GB: QLoRA with checkpointing and batch 1 × 2 accumulated fits).
  if (greedy(false) && !fitsNow()) {
    const Steps first = taken;
    const Weighed firstOutcome = now;
    greedy(true);
    if (!fitsNow()) {
      taken = first;
      now = firstOutcome;
    }
  }
  if (taken.size() <= 1) return;
  if (fitsNow()) {
    if (!endGuessed) {
      const Steps end = guessEnd(taken);
      if (!(!end.empty() && tryWithout(end))) trim(taken, tryWithout);
    }
    // Last, the change that made it fit (the trims keep it), once others are gone: without them
    // it may not be needed either (the fit at the capacity's edge is not monotone in the changes:
    // Gemma 2 27B under autocast at 2 × 4096 on an A100 40 GB fits with checkpointing,
    // accumulation and QLoRA, without the pure bf16 the greedy added last). Otherwise the rest is
    // the combination before it, which did not fit.
    if (trimmed && taken.size() > 2) tryWithout(Steps(taken.begin(), taken.end() - 1));
  }
  if (taken.size() <= 1) return;  // (only a fitting single is left: never, none fits alone)
  if (anyFits && !fitsNow()) return;  // a fitting single is cheaper

  FitSuggestion combo;
  combo.setup = setupOf(taken);
  combo.label = "Combine: ";
  for (std::size_t i = 0; i < taken.size(); ++i) {
    const FitSuggestion& s = *taken[i];
    combo.changedFields.insert(combo.changedFields.end(), s.changedFields.begin(), s.changedFields.end());
    combo.id += (i ? "+" : "") + s.id;
    combo.label += (i ? " + " : "") + s.label;
    combo.tradeoff += (i ? "; " : "") + s.tradeoff;
    combo.cost = std::max(combo.cost, s.cost);
  }
  combo.peakBytes = *now.peak;
  // Unsimulated, it is listed by its floor like a single change: its model states alone, or with
  // what its blocks keep at the end of forward, pass the capacity (a 405B model on one GPU: one
  // simulation fewer).
  combo.peakIsLowerBound = !now.simulated;
  combo.lowerBoundBasis = now.simulated ? "" : now.basis;
  combo.fits = combo.peakBytes <= capacity_;
  combo.savedBytes = out_.currentPeakBytes - combo.peakBytes;
  suggestions.insert(suggestions.begin(), std::move(combo));
}

}  // namespace

SolveResult Solve(const Setup& setup, const Estimate& current) {
  SolveResult out;
  out.errors = Validate(setup);
  if (!out.ok()) return out;
  Solver solver(setup, current, out);
  solver.FindLimits();
  solver.AddSingleChanges();
  solver.SortSuggestions();
  solver.AddCombination();
  return out;
}

}  // namespace gpumem
