// Setup → Inventory → Trace → Replay → Estimate.
#include "gpumem/estimate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"
#include "device/device_stage.hpp"
#include "replay/host_memory.hpp"
#include "replay/replay.hpp"
#include "sim/savers.hpp"
#include "parallel/parallel_step.hpp"
#include "parallel/pipeline.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

std::string PerParameter(std::int64_t count, DType type) {
  return FormatCount(count) + " parameters × " + BytesOf(type);
}

// Model-state rows are exact products of N; at a peak the same bytes read better as that
// product than as a list of tensors.
void UseModelStateFormulas(Snapshot& snapshot, const ModelStates& states) {
  for (CategoryBytes& row : snapshot.byCategory) {
    for (const CategoryBytes& state : states.rows) {
      if (row.category == state.category && row.bytes == state.bytes) row.formula = state.formula;
    }
  }
}

// The parameter count as a sum a person can check against the architecture.
std::string ParameterFormula(const Setup& setup, const Inventory& inventory) {
  const std::int64_t total = inventory.ParameterCount();
  if (setup.model.kind == ModelKind::ParameterCount) return FormatCount(total) + " parameters, as given";
  std::vector<std::int64_t> perLayer;
  std::int64_t outside = 0;
  for (const Tensor& t : inventory.parameters) {
    if (t.layer < 0) { outside += t.Elements(); continue; }
    if (perLayer.size() <= static_cast<std::size_t>(t.layer)) perLayer.resize(static_cast<std::size_t>(t.layer) + 1, 0);
    perLayer[static_cast<std::size_t>(t.layer)] += t.Elements();
  }
  const std::string tensors = " (" + FormatCount(static_cast<std::int64_t>(inventory.parameters.size())) + " tensors)";
  if (setup.model.kind == ModelKind::Transformer) {
    const bool uniform = !perLayer.empty() &&
                         std::all_of(perLayer.begin(), perLayer.end(), [&](std::int64_t n) { return n == perLayer.front(); });
    std::string blocks = uniform ? FormatCount(static_cast<std::int64_t>(perLayer.size())) + " blocks × " +
                                       FormatCount(perLayer.front())
                                 : FormatCount(static_cast<std::int64_t>(perLayer.size())) + " blocks";
    return "embeddings, final norm and head " + FormatCount(outside) + " + " + blocks + " = " +
           FormatCount(total) + tensors;
  }
  std::string terms;
  std::size_t shown = 0;
  for (std::size_t i = 0; i < perLayer.size(); ++i) {
    if (perLayer[i] == 0) continue;
    if (++shown > 6) { terms += " + …"; break; }
    terms += (terms.empty() ? "" : " + ") + std::string("layers[") + std::to_string(i) + "] " + FormatCount(perLayer[i]);
  }
  return (terms.empty() ? "no parameters" : terms) + " = " + FormatCount(total) + tensors;
}

// The category holding most of the peak, its share, and what makes it large.
std::string ExplainPeak(const Snapshot& peak, Estimate::Dominant& dominant) {
  const CategoryBytes* top = nullptr;
  for (const CategoryBytes& row : peak.byCategory) if (!top || row.bytes > top->bytes) top = &row;
  if (!top || peak.totalBytes <= 0) return "";
  const double share = 100.0 * static_cast<double>(top->bytes) / static_cast<double>(peak.totalBytes);
  char percent[16];
  std::snprintf(percent, sizeof percent, "%.0f%%", share);
  std::string why;
  switch (top->category) {
    case Category::Parameters:
    case Category::MasterWeights:
    case Category::Gradients:
    case Category::OptimizerStates:
      why = "model states grow with the parameter count and the bytes kept per parameter; a lower "
            "precision, an optimizer with fewer states, or sharding them across GPUs shrinks them";
      break;
    case Category::OptimizerIntermediates:
      why = "the optimizer step's temporaries come on top of the states; a fused optimizer has none "
            "and a per-parameter loop holds one tensor's worth at a time";
      break;
    case Category::Activations:
      why = "the tensors saved for backward grow with batch × sequence (attention scores with "
            "sequence²) and are all held when backward starts; checkpointing, fused attention, a "
            "smaller micro-batch or 16-bit activations shrink them";
      break;
    case Category::ActivationGradients:
      why = "gradients flowing back through the layers peak at the largest layer (often the "
            "logits over the vocabulary); a smaller micro-batch or sequence shrinks them";
      break;
    case Category::InputBatch:
      why = "the batch itself is the largest tensor; a smaller micro-batch shrinks it";
      break;
    case Category::WeightCopies:
      why = "autocast keeps a 16-bit copy of every matmul weight until its backward";
      break;
  }
  dominant = {top->category, top->bytes, share, why};
  return std::string(LabelOf(top->category)) + " hold " + percent + " of the peak (" + HumanBytes(top->bytes) +
         " of " + HumanBytes(peak.totalBytes) + ", " + LabelOf(peak.phase) + ", step " + std::to_string(peak.step) +
         "): " + why + ".";
}

// What one tensor adds to the model states' sums. StoredBytes, GradientTypeOf, HasMasterCopy
// and OptimizerStateTensors read a tensor's shape, trainable flag, storage and packed element
// size, and nothing else (no name, layer or adapter flag): tensors alike in those four add the
// same, and a model's tensors are a few kinds repeated per block (Mixtral 8x22B: 1,739
// tensors of 7 kinds). The solver sums them for each precision and optimizer it tries: 14 sums
// of 0.47 M instructions a Mixtral 8x22B solve (callgrind), most of it OptimizerStateTensors.
struct TensorSums {
  const Tensor* like = nullptr;  // the tensor these were computed for; null: an empty slot
  std::int64_t parameterBytes = 0, gradientBytes = 0, masterElements = 0, stateBytes = 0;
  StateTensors states;
};

bool Alike(const Tensor& a, const Tensor& b) {
  return a.trainable == b.trainable && a.storage == b.storage && a.quantStorageBytes == b.quantStorageBytes &&
         a.shape == b.shape;
}

// The sums ComputeModelStates reports, tensor by tensor with the trace's own rules (StoredBytes,
// GradientTypeOf, HasMasterCopy, OptimizerStateTensors, OptimizerSharedStates); `eachState` sees
// every optimizer state and whether it is a shared one, for ComputeModelStates' words (the
// solver's bounds need the sums alone: ModelStatesTotalBytes). Returns the master elements.
// A tensor alike the last one seen in its slot of a 64-slot table (hashed by shape, storage and
// trainable flag) takes that one's sums and states.
template <typename F>
std::int64_t SumModelStates(const Setup& setup, const Inventory& inventory, const Regime& regime, ModelStates& m,
                            F&& eachState) {
  std::int64_t masterElements = 0;
  std::array<TensorSums, 64> kinds;
  for (const Tensor& p : inventory.parameters) {
    std::uint64_t hash = static_cast<std::uint64_t>(p.storage) * 3 + (p.trainable ? 1 : 0);
    for (const std::int64_t d : p.shape) hash = (hash ^ static_cast<std::uint64_t>(d)) * 0x100000001b3ULL;
    TensorSums& k = kinds[(hash * 0x9e3779b97f4a7c15ULL) >> 58];
    if (k.like == nullptr || !Alike(*k.like, p)) {
      k.like = &p;
      k.parameterBytes = StoredBytes(p, regime.weights);
      // The optimizer in backward frees each gradient once applied: no gradient set persists.
      k.gradientBytes = p.trainable && !setup.training.optimizerInBackward
                            ? p.Elements() * BytesPerElement(GradientTypeOf(p, regime.gradients))
                            : 0;
      k.masterElements = p.trainable && HasMasterCopy(p, regime.masterWeights) ? p.Elements() : 0;
      k.states = OptimizerStateTensors(setup.training, regime, p);
      k.stateBytes = 0;
      for (const StateTensor& s : k.states) k.stateBytes += s.elements * BytesPerElement(s.type);
    }
    m.parametersBytes += k.parameterBytes;
    m.gradientsBytes += k.gradientBytes;
    masterElements += k.masterElements;
    m.optimizerStatesBytes += k.stateBytes;
    for (const StateTensor& s : k.states) eachState(s, false);
  }
  m.masterWeightsBytes = masterElements * 4;
  for (const StateTensor& s : OptimizerSharedStates(setup.training, inventory)) {  // bitsandbytes' maps
    m.optimizerStatesBytes += s.elements * BytesPerElement(s.type);
    eachState(s, true);
  }
  m.totalBytes = m.parametersBytes + m.masterWeightsBytes + m.gradientsBytes + m.optimizerStatesBytes;
  return masterElements;
}

}  // namespace

ModelStates ModelStateSums(const Setup& setup, const Inventory& inventory) {
  ModelStates m;
  SumModelStates(setup, inventory, RegimeOf(setup.training.precision), m, [](const StateTensor&, bool) {});
  return m;
}

std::int64_t ModelStatesTotalBytes(const Setup& setup, const Inventory& inventory) {
  return ModelStateSums(setup, inventory).totalBytes;
}

ModelStates ComputeModelStates(const Setup& setup, const Inventory& inventory) {
  const Regime regime = RegimeOf(setup.training.precision);
  ModelStates m;
  m.parameterCount = inventory.ParameterCount();
  m.parameterFormula = ParameterFormula(setup, inventory);
  if (setup.model.kind == ModelKind::Transformer) {
    const ArchitectureDef& a = setup.model.architecture;
    for (const Preset& p : Presets()) {
      // Most presets differ in their width or depth: the whole comparison for the others only.
      if (p.architecture.hiddenSize != a.hiddenSize || p.architecture.numLayers != a.numLayers || p.architecture != a) {
        continue;
      }
      m.presetId = p.id;
      m.publishedParameters = p.publishedParameters;
      m.differenceFromPublished = m.parameterCount - p.publishedParameters;
      break;
    }
  }
  const std::int64_t trainable = inventory.TrainableCount();
  // Per tensor, as the trace allocates them: fine-tuning gives some tensors a dtype or a
  // bitsandbytes layout of their own (finetune.hpp); without it these are N × the regime's bytes.
  // Optimizer states from the same per-tensor rule the trace uses, summed by state name.
  std::vector<std::pair<std::string_view, std::int64_t>> valuesByName;
  DType stateType = regime.states;
  bool mixedTypes = false;  // bitsandbytes 8-bit: uint8 states, fp32 absmax and small tensors
  bool anyState = false;
  const std::int64_t masterElements = SumModelStates(setup, inventory, regime, m, [&](const StateTensor& s, bool shared) {
    if (shared) {  // one each: listed as they are
      valuesByName.emplace_back(s.name, s.elements);
      mixedTypes = mixedTypes || s.type != stateType;
      return;
    }
    mixedTypes = mixedTypes || (anyState && s.type != stateType);
    anyState = true;
    stateType = s.type;
    // The names are OptimizerStateTensors' literals: the same pointer almost always, compared
    // as text otherwise (a memcmp call per state and parameter was 0.7 % of a GPT-2 estimate in
    // wasm, node --cpu-prof).
    auto it = std::find_if(valuesByName.begin(), valuesByName.end(),
                           [&](const auto& v) { return v.first.data() == s.name || v.first == s.name; });
    if (it == valuesByName.end()) valuesByName.emplace_back(s.name, s.elements);
    else it->second += s.elements;
  });

  if (!FinetuneActive(setup.finetune)) {
    m.rows.push_back({Category::Parameters, m.parametersBytes, PerParameter(m.parameterCount, regime.weights)});
    if (regime.masterWeights) {
      m.rows.push_back({Category::MasterWeights, m.masterWeightsBytes, PerParameter(trainable, DType::FP32)});
    }
    m.rows.push_back({Category::Gradients, m.gradientsBytes,
                      setup.training.optimizerInBackward
                          ? "none kept: the optimizer in backward frees each gradient once applied"
                          : PerParameter(trainable, regime.gradients)});
  } else {
    m.rows.push_back({Category::Parameters, m.parametersBytes, FinetuneParameterFormula(setup, inventory)});
    if (regime.masterWeights) {
      m.rows.push_back({Category::MasterWeights, m.masterWeightsBytes,
                        FormatCount(masterElements) + " trainable 16-bit values × 4 B (fp32)"});
    }
    m.rows.push_back({Category::Gradients, m.gradientsBytes,
                      setup.training.optimizerInBackward
                          ? std::string("none kept: the optimizer in backward frees each gradient once applied")
                          : FormatCount(trainable) + " trainable values (of " + FormatCount(m.parameterCount) +
                                ") in their own dtypes; frozen parameters get none"});
  }
  std::string states;
  std::int64_t values = 0;
  for (const auto& [name, count] : valuesByName) {
    states += (states.empty() ? "" : " + ") + std::string(name) + " " + FormatCount(count);
    values += count;
  }
  states = valuesByName.empty()
               ? std::string(LabelOf(setup.training.optimizer)) + " keeps no state"
           : mixedTypes ? states + " = " + FormatCount(values) + " values of mixed types (uint8 states, fp32 absmax, "
                                                                   "maps and tensors under 4,096 elements) = " +
                              FormatCount(m.optimizerStatesBytes) + " B"
                        : states + " = " + FormatCount(values) + " values × " + BytesOf(stateType);
  m.rows.push_back({Category::OptimizerStates, m.optimizerStatesBytes, states});
  return m;
}

EstimateResult EstimateMemory(const Setup& setup, const EstimateOptions& options) {
  EstimateResult result;
  result.errors = Validate(setup, options.maxPredictedEvents);
  if (!result.ok()) return result;

  // Many GPUs: the simulated rank's model (tensor-parallel slices; core/src/parallel/).
  const bool parallel = IsParallel(setup.parallel);
  // Pipeline parallelism with no stage named: the first or the last, whichever peaks higher.
  if (auto stage = EstimateHigherPipelineStage(setup, options)) return std::move(*stage);
  const Setup rankSetup = parallel ? PipelineStageSetup(TensorParallelRankSetup(setup)) : Setup{};
  const Setup& simulated = parallel ? rankSetup : setup;
  // One GPU: the inventory validation just built (SharedInventory), not a second one.
  const std::shared_ptr<const Inventory> shared =
      parallel ? std::make_shared<const Inventory>(PipelineStageInventory(BuildInventory(simulated), simulated))
               : SharedInventory(simulated);
  const Inventory& inventory = *shared;
  const Trace trace = BuildTrace(simulated, inventory, options.explain);
  // The model states first: snapshot rows they replace below are not rendered by Replay.
  ModelStates states = ComputeModelStates(simulated, inventory);
  if (parallel) {
    // The rank's own states (sharded, with buffers' padding), keeping the count's explanation.
    ModelStates rank = ParallelModelStates(simulated, inventory);
    rank.parameterFormula = states.parameterFormula;
    rank.presetId = states.presetId;
    rank.publishedParameters = states.publishedParameters;
    rank.differenceFromPublished = states.differenceFromPublished;
    states = std::move(rank);
  }
  Estimate est = Replay(trace, options, states.rows);
  est.gpuIndependentPeakBytes = std::max<std::int64_t>(0, est.peak.totalBytes - trace.gpuScratchMaxBytes);
  est.gpuReductions = trace.gpuReductions;
  est.modelStates = std::move(states);
  if (parallel) {
    est.rank = SimulatedRankOf(setup);
    for (std::string& note : ParallelNotes(setup)) est.notes.push_back(std::move(note));
  }
  // Host memory: what offloading keeps there and what paging may move there (host_memory.cpp).
  est.host = ComputeHostMemory(setup, simulated, inventory, trace.offloadedActivationsPeakBytes);
  UseModelStateFormulas(est.peak, est.modelStates);
  for (Snapshot& s : est.phasePeaks) UseModelStateFormulas(s, est.modelStates);
  UseModelStateFormulas(est.forwardEnd, est.modelStates);
  est.peakExplanation = ExplainPeak(est.peak, est.peakDominant);
  if (!options.explain) est.peakExplanation.clear();

  est.activationsFromHeuristic = setup.model.kind == ModelKind::ParameterCount;
  est.gpuCapacityBytes = CapacityBytes(setup.gpu.memoryGiB);
  // The device stage: the same events through the caching allocator at the GPU's capacity.
  // "Fits" is its verdict from here on; peak.totalBytes stays the allocated-only figure.
  std::vector<std::int64_t> reserved;
  const bool timeline = options.timeline != EstimateOptions::Timeline::None;
  // The segment picture only for a labelled timeline (the result panel): never on the
  // solver's and views' path, which ask for no timeline or for points.
  const bool segments = options.timeline == EstimateOptions::Timeline::Labelled;
  est.device = ComputeDeviceEstimate(setup, trace, est.gpuCapacityBytes, options.explain,
                                     timeline ? &reserved : nullptr, segments);
  for (TimelinePoint& p : est.timeline) p.reservedBytes = p.index < reserved.size() ? reserved[p.index] : 0;
  est.headroomBytes = est.device.headroomBytes;
  est.fits = est.device.fits;
  if (!est.host.fits) {
    // The GPU verdict stays the device figure's (issue 10); the host's is its own, and said.
    est.notes.push_back("Host memory: this layout keeps " + HumanBytes(est.host.nodeBytes) + " on each node's host (" +
                        FormatCount(est.host.ranksPerNode) + (est.host.ranksPerNode == 1 ? " rank × " : " ranks × ") + HumanBytes(est.host.rankBytes) +
                        "), more than the " + HumanBytes(est.host.capacityBytes) +
                        " stated (runtime.hostMemoryGiB): the processes would run out of CPU memory.");
  }
  if (setup.training.optimizer == OptimizerKind::Adafactor &&
      setup.training.optimizerImplementation == OptimizerImplementation::ForEach) {
    est.notes.push_back("Adafactor is simulated as HF transformers runs it: one parameter at a time.");
  }
  AddSaverNotes(setup, inventory, est.notes);
  est.notes.push_back(
      "Fits is decided on the device figure: the step's tensors through a model of PyTorch's caching allocator "
      "(one stream), plus the CUDA context and cuBLAS workspaces; other processes on the GPU are not counted.");
  result.estimate = std::move(est);
  return result;
}

}  // namespace gpumem
