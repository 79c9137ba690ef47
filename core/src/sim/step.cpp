// The step: init, then two iterations of forward → backward → optimizer step → zero_grad.
#include "gpumem/trace.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "gpumem/recycle.hpp"
#include "parallel/parallel_step.hpp"
#include "parallel/pipeline.hpp"
#include "sim/loading.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

std::unique_ptr<ModelPass> MakeLayerListPass(const Setup& setup, const Inventory& inventory,
                                             const Regime& regime);
std::unique_ptr<ModelPass> MakeTransformerPass(const Setup& setup, const Inventory& inventory,
                                               const std::vector<Text>& names, const Regime& regime,
                                               std::vector<std::string>& notes);

namespace {
// About how many events a setup makes, so the event list is allocated once: two steps of
// roughly 160 events per transformer block, a few per layer otherwise.
std::size_t EventCapacityHint(const Setup& setup) {
  const ModelDef& m = setup.model;
  if (m.kind == ModelKind::Transformer) {
    const auto experts = static_cast<std::size_t>(std::max<std::int64_t>(0, m.architecture.numExperts));
    const auto blocks = static_cast<std::size_t>(std::max<std::int64_t>(0, m.architecture.numLayers));
    return std::min<std::size_t>(blocks * (700 + 130 * experts) + 4096, std::size_t{1} << 21);
  }
  if (m.kind == ModelKind::LayerList) return std::min<std::size_t>(m.layers.size() * 24 + 256, std::size_t{1} << 20);
  return 256;
}
}  // namespace
std::unique_ptr<ModelPass> MakeQuickPass(const Setup& setup, const Inventory& inventory,
                                         const Regime& regime, std::vector<std::string>& notes);

namespace {
struct AllocAtTag {};
struct FreeAtTag {};
}  // namespace

Trace::Trace()
    : events(Recycled<Event>::Take()),
      allocAt(Recycled<std::uint32_t, AllocAtTag>::Take()),
      freeAt(Recycled<std::uint32_t, FreeAtTag>::Take()) {}

Trace::~Trace() {
  Recycled<Event>::Give(std::move(events));
  Recycled<std::uint32_t, AllocAtTag>::Give(std::move(allocAt));
  Recycled<std::uint32_t, FreeAtTag>::Give(std::move(freeAt));
}

TensorHandle TraceBuilder::Alloc(Category category, std::int64_t bytes, Text tensor, Text label,
                                 Text formula, int layer) {
  Event e;
  e.kind = EventKind::Alloc;
  e.tensorId = static_cast<int>(holders_.size());
  e.bytes = bytes;
  e.category = category;
  e.phase = phase_;
  e.step = static_cast<std::uint8_t>(step_);
  e.stream = stream_;
  e.layer = layer;
  e.label = label;
  e.tensor = tensor;
  e.formula = formula;
  holders_.push_back(1);
  trace_.allocAt.push_back(static_cast<std::uint32_t>(trace_.events.size()));
  trace_.freeAt.push_back(Trace::kNeverFreed);
  trace_.events.push_back(e);
  return e.tensorId;
}

void TraceBuilder::Release(TensorHandle handle, Text label) {
  if (handle < 0) return;
  int& holders = holders_[static_cast<std::size_t>(handle)];
  if (holders == 0) return;
  if (handle < touchesBelow_) [[unlikely]] NoteTouch(handle, -1);
  if (--holders > 0) return;
  const Event& alloc = trace_.events[trace_.allocAt[static_cast<std::size_t>(handle)]];
  trace_.freeAt[static_cast<std::size_t>(handle)] = static_cast<std::uint32_t>(trace_.events.size());
  trace_.events.push_back({alloc.bytes, alloc.tensorId, alloc.layer, EventKind::Free, alloc.category, phase_,
                           static_cast<std::uint8_t>(step_), alloc.stream, label, alloc.tensor, alloc.formula});
}

bool TraceBuilder::Repeat(std::size_t from, std::size_t to, int step, Category skip) {
  std::vector<Event>& events = trace_.events;
  const std::size_t mark = events.size(), firstNew = holders_.size();
  // Only the trace's tail repeats (the one caller's step): the tensors it allocates are then the
  // last ids handed out, [idFrom, firstNew).
  if (from > to || to != mark) return false;
  int idFrom = static_cast<int>(firstNew);
  for (std::size_t i = from; i < to; ++i) {
    if (events[i].kind == EventKind::Alloc) {
      idFrom = events[i].tensorId;
      break;
    }
  }
  if (idFrom < 0 || static_cast<std::size_t>(idFrom) > firstNew) return false;
  const std::size_t idCount = firstNew - static_cast<std::size_t>(idFrom);
  std::vector<int> renamed(idCount, -1);
  // The range is copied at once (one memcpy, where a 48-byte copy per event in the loop below
  // was most of this function: 7 % of a Mixtral estimate, callgrind) and renamed in place;
  // events move down only after the first one left out (the optimizer states' allocations, in
  // the step's last phase).
  const std::size_t n = to - from;
  events.resize(mark + n);
  if (n > 0) std::memcpy(static_cast<void*>(events.data() + mark), events.data() + from, n * sizeof(Event));
  holders_.resize(firstNew + idCount);
  trace_.allocAt.resize(firstNew + idCount);
  trace_.freeAt.resize(firstNew + idCount, Trace::kNeverFreed);
  const auto stepByte = static_cast<std::uint8_t>(step);
  std::size_t out = mark, id = firstNew;
  for (std::size_t i = mark; i < mark + n; ++i) {
    Event& e = events[i];
    if (e.kind == EventKind::Alloc) {
      if (e.category == skip || e.tensorId == sequenceGatherBuffer) continue;
      renamed[static_cast<std::size_t>(e.tensorId - idFrom)] = static_cast<int>(id);
      holders_[id] = holders_[static_cast<std::size_t>(e.tensorId)];  // as held at the range's end
      trace_.allocAt[id] = static_cast<std::uint32_t>(out);
      e.tensorId = static_cast<int>(id++);
    } else {
      const int old = e.tensorId;
      const int renamedId = old >= idFrom && static_cast<std::size_t>(old) < firstNew
                                ? renamed[static_cast<std::size_t>(old - idFrom)]
                                : -1;
      if (renamedId < 0) {  // freed here, allocated before (or left out): this range is no step that repeats
        events.resize(mark);
        holders_.resize(firstNew);
        trace_.allocAt.resize(firstNew);
        trace_.freeAt.resize(firstNew);
        return false;
      }
      e.tensorId = renamedId;
      trace_.freeAt[static_cast<std::size_t>(renamedId)] = static_cast<std::uint32_t>(out);
    }
    e.step = stepByte;
    if (out != i) events[out] = e;
    ++out;
  }
  events.resize(out);
  holders_.resize(id);
  trace_.allocAt.resize(id);
  trace_.freeAt.resize(id);
  step_ = step;
  return true;
}

std::vector<Text> ParameterNames(TextStore& text, const Inventory& inventory) {
  std::vector<Text> names;
  names.reserve(inventory.parameters.size());
  for (const Tensor& p : inventory.parameters) names.push_back(text.Make({TextPart::View(p.name)}));
  return names;
}

Regime RegimeOf(Precision precision) {
  switch (precision) {
    case Precision::FP32:
      return {DType::FP32, DType::FP32, DType::FP32, DType::FP32, false, false, false, DType::FP32};
    case Precision::FP16Mixed:
      return {DType::FP16, DType::FP16, DType::FP32, DType::FP16, true, true, false, DType::FP16};
    case Precision::BF16Mixed:
      return {DType::BF16, DType::BF16, DType::FP32, DType::BF16, true, true, false, DType::BF16};
    case Precision::BF16:
      return {DType::BF16, DType::BF16, DType::BF16, DType::BF16, false, false, false, DType::BF16};
    case Precision::AmpBF16:
      return {DType::FP32, DType::FP32, DType::FP32, DType::BF16, false, true, true, DType::BF16};
    case Precision::AmpFP16:
      return {DType::FP32, DType::FP32, DType::FP32, DType::FP16, false, true, true, DType::FP16};
  }
  return {DType::FP32, DType::FP32, DType::FP32, DType::FP32, false, false, false, DType::FP32};
}

GradientSink::GradientSink(TraceBuilder& builder, const Inventory& inventory,
                           const std::vector<Text>& names, const Regime& regime)
    : builder_(builder), inventory_(inventory), names_(names), regime_(regime),
      grads_(inventory.parameters.size(), kNoTensor), expected_(inventory.parameters.size(), 1),
      received_(inventory.parameters.size(), 0) {}

void GradientSink::Produce(std::size_t index, Text label) {
  const Tensor& p = inventory_.parameters[index];
  if (!p.trainable) return;
  if (hook_ && hook_->Produce(builder_, index, label)) return;
  const DType type = GradientTypeOf(p, regime_.gradients);  // a parameter's own dtype (finetune.hpp)
  const std::int64_t bytes = p.Elements() * BytesPerElement(type);
  TextStore& t = builder_.text();
  const Text name = names_[index];
  const Text formula = t.Shape(Shape(p.shape), type);
  if (grads_[index] == kNoTensor) {
    grads_[index] = builder_.Alloc(Category::Gradients, bytes, t.Make({name, ".grad"}),
                                   t.Make({label, ": ", name, ".grad"}), formula, p.layer);
    if (record_) record_->push_back({static_cast<int>(index), grads_[index]});
  } else {
    if (record_) record_->push_back({static_cast<int>(index), -2});
    // .grad already exists (kept by zero_grad(set_to_none=False), or a tied weight's second
    // use): the new gradient is added into it in place and then freed.
    TensorHandle fresh = builder_.Alloc(Category::Gradients, bytes, t.Make({name, " new gradient"}),
                                        t.Make({label, ": new gradient of ", name}), formula, p.layer);
    builder_.Release(fresh, t.Make({label, ": accumulated into ", name, ".grad"}));
  }
  Received(index, label);
}

void GradientSink::Adopt(std::size_t index, TensorHandle grad, Text label) {
  if (record_) record_->push_back({static_cast<int>(index), -2});
  TextStore& t = builder_.text();
  const Tensor& p = inventory_.parameters[index];
  if (!p.trainable) {
    builder_.Release(grad, t.Make({label, ": gradient of a frozen parameter dropped"}));
    return;
  }
  if (hook_ && hook_->Produce(builder_, index, label)) {  // the hook's buffer takes a copy
    builder_.Release(grad, t.Make({label, ": gradient copied for ", names_[index]}));
    return;
  }
  if (grads_[index] == kNoTensor) {
    grads_[index] = grad;  // stolen: the buffer becomes .grad, no copy
  } else {
    builder_.Release(grad, t.Make({label, ": accumulated into ", names_[index], ".grad"}));
  }
  Received(index, label);
}

bool GradientSink::CanTakeCopied(std::size_t index) const {
  if (grads_[index] != kNoTensor) return false;
  if (!ready_) return true;
  // The span's step ran once its one gradient arrived, and left no count behind.
  return received_[index] == 0 && expected_[index] == 1 && copied_(index, false);
}

void GradientSink::TakeCopied(std::size_t index, TensorHandle grad) {
  if (!ready_) {
    grads_[index] = grad;
    return;
  }
  copied_(index, true);  // the .grad was made, stepped and freed within the span
}

void GradientSink::Received(std::size_t index, Text label) {
  if (!ready_ || ++received_[index] < expected_[index]) return;
  received_[index] = 0;
  expected_[index] = 1;
  pending_.push_back(index);
  pendingLabels_.push_back(label);
}

void GradientSink::RunReady() {
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    const std::size_t index = pending_[k];
    ready_(index);
    builder_.Release(grads_[index], builder_.text().Make({pendingLabels_[k], ": optimizer in backward frees ",
                                                          names_[index], ".grad"}));
    grads_[index] = kNoTensor;
  }
  pending_.clear();
  pendingLabels_.clear();
}

void GradientSink::ReleaseAll(Text label) {
  if (hook_) hook_->ReleaseAll(builder_, label);
  for (TensorHandle& h : grads_) {
    builder_.Release(h, label);
    h = kNoTensor;
  }
}

namespace {

Trace Build(const Setup& setup, const Inventory& inventory, bool explain, bool toForwardEnd) {
  Trace trace;
  trace.text.SetEnabled(explain);
  TraceBuilder b(trace);
  Regime regime = RegimeOf(setup.training.precision);
  // The loss in the model's dtype (no logits.float()); autocast's log_softmax stays fp32.
  if (setup.training.lossInModelDtype && !regime.autocast) regime.lossInFp32 = false;

  trace.events.reserve(EventCapacityHint(setup));
  if (explain) trace.text.Reserve(EventCapacityHint(setup) * 8);
  TextStore& text = trace.text;
  const std::vector<Text> names = ParameterNames(text, inventory);

  b.SetPhase(Phase::Init, 0);
  // Many GPUs: the rank's sharded states and buffers (core/src/parallel/); one GPU: as before.
  std::optional<ParallelStep> parallel;
  if (IsParallel(setup.parallel)) {
    parallel.emplace(setup, inventory, names, regime, text);
    parallel->Init(b);
  } else {
    if (LoadingSimulated(setup)) {  // the loaders' transients (sim/loading.cpp)
      AllocParametersAsLoaded(b, setup, inventory, names, regime.weights,
                              setup.finetune.torchaoQuantizeInChunks ? kTorchaoNf4QuantizeChunk : 0);
    }
    for (std::size_t i = 0; i < inventory.parameters.size() && !LoadingSimulated(setup); ++i) {
      const Tensor& p = inventory.parameters[i];
      b.Alloc(Category::Parameters, StoredBytes(p, regime.weights), names[i], text.Make({"model init: ", names[i]}),
              StorageFormula(text, p, regime.weights), p.layer);
    }
    if (regime.masterWeights) {
      for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
        const Tensor& p = inventory.parameters[i];
        if (!p.trainable || !HasMasterCopy(p, regime.masterWeights)) continue;
        b.Alloc(Category::MasterWeights, p.Elements() * 4, text.Make({names[i], " (fp32 master)"}),
                text.Make({"optimizer construction: fp32 master copy of ", names[i]}),
                text.Shape(Shape(p.shape), DType::FP32), p.layer);
      }
    }
  }

  std::unique_ptr<ModelPass> pass =
      setup.model.kind == ModelKind::ParameterCount ? MakeQuickPass(setup, inventory, regime, trace.notes)
      : setup.model.kind == ModelKind::Transformer  ? MakeTransformerPass(setup, inventory, names, regime, trace.notes)
                                                    : MakeLayerListPass(setup, inventory, regime);
  GradientSink gradients(b, inventory, names, regime);
  if (parallel) gradients.SetHook(&*parallel);
  if (parallel && parallel->gathers()) pass->SetLayerHook(&*parallel);
  OptimizerPass optimizer(setup, parallel ? parallel->optimizerInventory() : inventory,
                          parallel ? parallel->optimizerNames() : names,
                          parallel ? parallel->optimizerRegime() : regime);
  // The optimizer in backward (savers.hpp; refused with many GPUs by validation).
  const bool inBackward = setup.training.optimizerInBackward;
  if (inBackward) {
    gradients.OnReady([&](std::size_t index) { optimizer.StepParameter(b, index); });
    gradients.OnCopied([&](std::size_t index, bool apply) { return optimizer.AdoptCopiedStep(b, index, apply); });
  }
  if (parallel && parallel->InitializesOptimizerStates()) {
    // DeepSpeed ZeRO makes the optimizer's states at construction (parallel_step.hpp).
    parallel->BeforeInitialOptimizerStep(b);
    const std::size_t groups = parallel->OptimizerSubGroups();
    if (groups == 0) optimizer.Step(b);
    for (std::size_t k = 0; k < groups; ++k) optimizer.StepTensors(b, {k});  // each sub-group's .grad a view
    parallel->AfterInitialOptimizerStep(b);
  }

  // Gradient accumulation (parallel.gradientAccumulationSteps): the micro-batches before the
  // last run forward and backward and let go of their batch; their gradients stay and the next
  // ones are added into them (AccumulateGrad), then one optimizer step.
  const std::int64_t microBatches = setup.parallel.gradientAccumulationSteps;
  // Pipeline parallelism: the stage's micro-batches in schedule order (parallel/pipeline.cpp).
  std::optional<PipelineRun> pipeline;
  if (setup.parallel.pipelineParallel > 1) pipeline.emplace(setup, inventory, names, regime);
  // The Trainer's torch_empty_cache_steps: training_step empties the cache after the loss and
  // before the backward when global_step (step − 1 here) is a multiple of it.
  const std::int64_t emptyEvery = setup.training.emptyCacheSteps;
  auto emptyCache = [&](int step) {
    if (emptyEvery > 0 && (step - 1) % emptyEvery == 0) b.EmptyCache();
  };
  // Nothing after step 1's last forward: no event of it changes an earlier one.
  const bool stopAtForwardEnd = toForwardEnd && !pipeline;
  auto runStep = [&](int step) {
    if (pipeline) pipeline->Run(b, step, gradients, parallel ? &*parallel : nullptr);
    for (std::int64_t k = 1; k < microBatches && !pipeline; ++k) {
      b.SetPhase(Phase::Forward, step);
      pass->Forward(b);
      emptyCache(step);
      b.SetPhase(Phase::Backward, step);
      if (parallel) parallel->StartBackward(b);
      pass->Backward(b, gradients);
      if (parallel) parallel->EndBackward(b);
      pass->EndStep(b);
    }
    if (!pipeline) {
      b.SetPhase(Phase::Forward, step);
      pass->Forward(b);
      if (stopAtForwardEnd) return;
      emptyCache(step);
      b.SetPhase(Phase::Backward, step);
      if (parallel) parallel->StartBackward(b);
      pass->Backward(b, gradients);
    }
    gradients.RunReady();  // what a pass left pending (quick mode's single backward)
    if (parallel) parallel->EndBackward(b);
    b.SetPhase(Phase::OptimizerStep, step);
    if (parallel) parallel->BeforeOptimizerStep(b);
    const std::size_t groups = parallel && !inBackward ? parallel->OptimizerSubGroups() : 0;
    if (!inBackward && groups == 0) optimizer.Step(b);
    for (std::size_t k = 0; k < groups; ++k) {  // DeepSpeed ZeRO-3: one sub-group at a time
      parallel->BeforeSubGroupStep(b, k);
      optimizer.StepTensors(b, {k});
      parallel->AfterSubGroupStep(b, k);
    }
    if (parallel) parallel->AfterOptimizerStep(b);
    if (setup.training.zeroGradSetToNone) gradients.ReleaseAll(text.Make({"zero_grad(set_to_none=True)"}));
    if (!pipeline) pass->EndStep(b);
  };
  const std::size_t stepStart = b.size();
  runStep(1);
  if (stopAtForwardEnd) return trace;
  // Step 2 is step 1 again but for the optimizer states, which step 1 created and step 2
  // finds: with zero_grad(set_to_none=True) nothing else outlives a step, so each event
  // repeats (a new tensor for each tensor, the same words). Only peaks differ, as the states
  // are live throughout step 2. Where that does not hold, step 2 is simulated.
  // ZeRO-3's first step records the trace its later steps prefetch and keep parameters by.
  // A step with an empty_cache call is simulated, not repeated (TraceBuilder::Repeat copies
  // events only).
  const bool sameEveryStep = (!parallel || parallel->SameEveryStep()) && emptyEvery == 0;
  if (!setup.training.zeroGradSetToNone || !sameEveryStep || !b.Repeat(stepStart, b.size(), 2, Category::OptimizerStates)) {
    runStep(2);
  }

  if (regime.masterWeights) {
    trace.notes.push_back(std::string(LabelOf(setup.training.precision)) +
                          ": weights, gradients and activations are 16-bit; the optimizer "
                          "keeps an fp32 master copy and fp32 states (16 B per parameter "
                          "with Adam, before activations).");
  }
  return trace;
}

}  // namespace

Trace BuildTrace(const Setup& setup, const Inventory& inventory, bool explain) {
  return Build(setup, inventory, explain, false);
}

Trace BuildTraceToForwardEnd(const Setup& setup, const Inventory& inventory) {
  return Build(setup, inventory, false, true);
}

}  // namespace gpumem
