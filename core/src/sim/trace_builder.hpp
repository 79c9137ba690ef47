// Private machinery of the trace: reference-counted tensors, precision regimes, gradients.
//
// A tensor is freed when the last thing holding it lets go — the Python variable, the autograd
// node that saved it, the batch — which is how PyTorch's caching allocator sees it. Modelling
// references instead of writing frees by hand keeps each op's rule local: "linear saves its
// input" is one Retain, and the input is freed exactly when nothing else holds it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/dtype.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

namespace gpumem {

using TensorHandle = int;
constexpr TensorHandle kNoTensor = -1;

class TraceBuilder {
 public:
  explicit TraceBuilder(Trace& trace) : trace_(trace) {}

  void SetPhase(Phase phase, int step) { phase_ = phase; step_ = step; }
  // The CUDA stream the next allocations are made on (Event::stream; 0, the default stream,
  // unless a multi-GPU wrapper's collective allocates on its side stream: parallel_step.cpp).
  void SetStream(std::uint8_t stream) { stream_ = stream; }
  std::uint8_t stream() const { return stream_; }
  int step() const { return step_; }
  TextStore& text() { return trace_.text; }
  // Megatron's GlobalMemoryBuffer "mpu" (sequence parallelism): made by the first gather of the
  // trace, whichever pass or pipeline chunk runs it, and kept (parallel/sequence_split.cpp).
  TensorHandle sequenceGatherBuffer = kNoTensor;

  // Allocates a tensor held once (by the caller).
  TensorHandle Alloc(Category category, std::int64_t bytes, Text tensor, Text label, Text formula,
                     int layer = -1);
  // The same with owned strings, for the passes that make few events (quick mode; a layer list's batch and loss).
  TensorHandle Alloc(Category category, std::int64_t bytes, std::string tensor, std::string label,
                     std::string formula, int layer = -1) {
    TextStore& t = text();
    return Alloc(category, bytes, t.Own(std::move(tensor)), t.Own(std::move(label)),
                 t.Own(std::move(formula)), layer);
  }
  // One more holder (e.g. autograd saving it for backward).
  [[gnu::always_inline]] TensorHandle Retain(TensorHandle handle) {
    if (handle >= 0 && holders_[static_cast<std::size_t>(handle)] > 0) {
      ++holders_[static_cast<std::size_t>(handle)];
      if (handle < touchesBelow_) [[unlikely]] NoteTouch(handle, +1);
    }
    return handle;
  }
  // One holder lets go; the tensor is freed when none remain. No-op for kNoTensor.
  void Release(TensorHandle handle, Text label);
  void Release(TensorHandle handle, std::string label) {
    if (Holders(handle) == 1) Release(handle, text().Own(std::move(label)));
    else Release(handle, Text{});
  }
  // Appends events [from, to) again as step `step`, each tensor they allocate becoming a new
  // one (allocations of `skip` and the made-once sequenceGatherBuffer are left out), and returns
  // true. Returns false, appending nothing, when the range frees a tensor it did not allocate
  // (then it does not repeat).
  bool Repeat(std::size_t from, std::size_t to, int step, Category skip);
  std::size_t size() const { return trace_.events.size(); }
  // Pinned host bytes of offloaded activations: + when a copy is made, − when it is let go;
  // the trace keeps the highest total (Trace::offloadedActivationsPeakBytes).
  void HostActivationBytes(std::int64_t delta) {
    hostActivationBytes_ += delta;
    if (hostActivationBytes_ > trace_.offloadedActivationsPeakBytes) trace_.offloadedActivationsPeakBytes = hostActivationBytes_;
  }
  // CUDA unified memory outside PyTorch's caching allocator (bitsandbytes' paged optimizer
  // states, cudaMallocManaged): no event, so neither allocated nor reserved counts it; the trace
  // keeps the total (Trace::unifiedBytes), which the device stage places on the GPU.
  void UnifiedBytes(std::int64_t bytes) { trace_.unifiedBytes += bytes; }
  // A CUDA sum whose scratch the GPU sizes, and that scratch here, bytes (Trace::gpuReductions,
  // gpuScratchMaxBytes).
  void GpuReduction(const ReductionShape& shape, std::int64_t scratchBytes) {
    std::vector<ReductionShape>& shapes = trace_.gpuReductions;
    if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
    trace_.gpuScratchMaxBytes = std::max(trace_.gpuScratchMaxBytes, scratchBytes);
  }
  // Something a person should know about this trace (Trace::notes, shown with the estimate).
  void Note(std::string note) { trace_.notes.push_back(std::move(note)); }
  // torch.cuda.empty_cache() here, before the next event (Trace::emptyCacheBefore).
  void EmptyCache() { trace_.emptyCacheBefore.push_back(trace_.events.size()); }
  // How many holders a live tensor has (0 when freed or kNoTensor).
  int Holders(TensorHandle handle) const {
    return handle < 0 ? 0 : holders_[static_cast<std::size_t>(handle)];
  }

  // --- block templates (sim/tape.cpp Tape::RunCheckpointSpan) ---
  const Trace& trace() const { return trace_; }
  std::size_t tensorCount() const { return holders_.size(); }
  // From now on, every holder change of a tensor with an id below `below` (made before a
  // span) is noted as (id, +1 or -1), in order; -1 stops.
  void RecordTouches(int below) {
    touchesBelow_ = below;
    touches_.clear();
  }
  const std::vector<std::pair<int, int>>& touches() const { return touches_; }
  [[gnu::noinline]] void NoteTouch(TensorHandle handle, int delta) { touches_.push_back({handle, delta}); }
  // Appends the events of a copied span. Its allocations make the next tensor ids in order, one
  // per entry of `holders` (each tensor's holders at the span's end); its frees record where
  // their tensors went.
  void AppendCopied(const std::vector<Event>& events, const std::vector<int>& holders) {
    const std::size_t at = trace_.events.size(), ids = holders_.size() + holders.size();
    trace_.events.insert(trace_.events.end(), events.begin(), events.end());
    holders_.insert(holders_.end(), holders.begin(), holders.end());
    trace_.allocAt.resize(ids);
    trace_.freeAt.resize(ids, Trace::kNeverFreed);
    for (std::size_t j = 0; j < events.size(); ++j) {
      const auto id = static_cast<std::size_t>(events[j].tensorId);
      (events[j].kind == EventKind::Alloc ? trace_.allocAt : trace_.freeAt)[id] = static_cast<std::uint32_t>(at + j);
    }
  }
  // A holder change a copied span makes without an event (its Free, if any, is copied).
  void AddHolders(TensorHandle handle, int delta) { holders_[static_cast<std::size_t>(handle)] += delta; }

 private:
  Trace& trace_;
  Phase phase_ = Phase::Init;
  int step_ = 0;
  std::uint8_t stream_ = 0;
  std::int64_t hostActivationBytes_ = 0;
  int touchesBelow_ = -1;                       // RecordTouches
  std::vector<std::pair<int, int>> touches_;
  // By tensor id (ids are handed out in order): holders left. The events' indices are the
  // trace's allocAt / freeAt.
  std::vector<int> holders_;
};

// Every parameter's name as a Text of the trace, in inventory order (made once per trace).
std::vector<Text> ParameterNames(TextStore& text, const Inventory& inventory);

// Element types of one precision regime.
struct Regime {
  DType weights;      // what forward computes with
  DType gradients;    // .grad
  DType states;       // optimizer states (Adafactor keeps fp32 whatever this says)
  DType activations;  // forward outputs and saved tensors
  bool masterWeights; // an fp32 master copy lives in the optimizer
  bool lossInFp32;    // logits are upcast to fp32 for the loss
  bool autocast;      // torch.autocast: matmuls in `compute` on cached 16-bit weight copies
  DType compute;      // dtype of matmul outputs (= activations unless autocast)
};
Regime RegimeOf(Precision precision);

// Many GPUs (core/src/parallel/parallel_step.cpp): where a sharding engine takes a gradient
// instead of .grad (a reduce bucket, an unsharded flat gradient). Produce returns false to
// leave the gradient to the sink.
class GradientHook {
 public:
  virtual ~GradientHook() = default;
  virtual bool Produce(TraceBuilder& builder, std::size_t parameterIndex, Text label) = 0;
  virtual void ReleaseAll(TraceBuilder& builder, Text label) = 0;
};

// Many GPUs: told when forward or backward moves to another layer (block index, -1 for the
// embeddings and head), so that sharded parameters can be gathered and freed around it.
class LayerHook {
 public:
  virtual ~LayerHook() = default;
  virtual void Enter(TraceBuilder& builder, int layer, bool backward) = 0;
  // A transformer's forward starts (before the embeddings) and its model forward ends (before
  // the loss): FSDP2 units of their own for the embedding and the output layer (parallel_step.cpp).
  virtual void ForwardStart(TraceBuilder&) {}
  virtual void ForwardEnd(TraceBuilder&) {}
};

// Receives parameter gradients as backward produces them. The first gradient of a tensor
// becomes its .grad (PyTorch's AccumulateGrad steals the buffer, no copy); later ones are
// added in place, so they only exist for the duration of the add.
class GradientSink {
 public:
  // `names`: each parameter's name as a Text (ParameterNames).
  GradientSink(TraceBuilder& builder, const Inventory& inventory, const std::vector<Text>& names,
               const Regime& regime);
  void Produce(std::size_t parameterIndex, Text label);
  // The parameter's gradient is `grad`, a buffer made earlier (Liger's fused linear +
  // cross-entropy makes grad_weight in forward): AccumulateGrad steals it as .grad when there is
  // none (torch/csrc/autograd/functions/accumulate_grad.h, accumulateGrad: no other reference),
  // else adds it in place and it is freed. The reference to `grad` passes to the sink.
  void Adopt(std::size_t parameterIndex, TensorHandle grad, Text label);
  // zero_grad(set_to_none=True): every .grad released.
  void ReleaseAll(Text label);
  const std::vector<TensorHandle>& handles() const { return grads_; }
  void SetHook(GradientHook* hook) { hook_ = hook; }
  // Block templates: no gradient hook of a sharding engine, and an optimizer in backward only
  // where it can take a copied span's steps (OnCopied).
  bool CopiesAllowed() const { return hook_ == nullptr && (!ready_ || copied_); }
  const Inventory& inventory() const { return inventory_; }
  // Notes (parameter, new .grad) for every .grad made from now on; (parameter, -2) for anything
  // else a gradient does (accumulated, adopted). Null stops.
  void RecordGrads(std::vector<std::pair<int, int>>* record) { record_ = record; }

  // Optimizer in backward: `ready(index)` runs once the parameter's gradient is complete (its
  // last expected contribution arrived: register_post_accumulate_grad_hook fires after the one
  // AccumulateGrad, which the engine runs once all uses have sent their gradients), and its
  // .grad is then freed (the hook's zero_grad()).
  void OnReady(std::function<void(std::size_t)> ready) { ready_ = std::move(ready); }
  // Block templates with the optimizer in backward: a copied span's events hold each of its
  // parameters' steps (the .grad made, the hook's step, the .grad freed), and
  // `copied(index, apply)` tells the optimizer that parameter was stepped (apply), or whether it
  // can be told so (not apply: OptimizerPass::AdoptCopiedStep).
  void OnCopied(std::function<bool(std::size_t, bool)> copied) { copied_ = std::move(copied); }
  // A copied span's .grad of parameter `index` (`grad`): kept as .grad, or, with the optimizer
  // in backward, stepped and freed within the span. CanTakeCopied first: TakeCopied then
  // changes what it checked.
  bool CanTakeCopied(std::size_t index) const;
  void TakeCopied(std::size_t index, TensorHandle grad);
  // Runs the hooks of the parameters whose gradients completed since the last call, in order,
  // freeing each .grad after its hook. Called once the backward op that produced them has
  // released what it held (PyTorch runs AccumulateGrad as a node of its own, after that op).
  void RunReady();
  // How many gradients of parameter `index` the coming backward delivers (a tied weight: two).
  void Expect(std::size_t index, int contributions) { expected_[index] = contributions; }

 private:
  GradientHook* hook_ = nullptr;
  std::vector<std::pair<int, int>>* record_ = nullptr;
  TraceBuilder& builder_;
  const Inventory& inventory_;
  const std::vector<Text>& names_;
  Regime regime_;
  std::vector<TensorHandle> grads_;
  std::function<void(std::size_t)> ready_;
  std::function<bool(std::size_t, bool)> copied_;
  std::vector<int> expected_, received_;
  std::vector<std::size_t> pending_;  // complete, hook not yet run
  std::vector<Text> pendingLabels_;
  void Received(std::size_t index, Text label);  // one more contribution: hook when complete
};

// One model family's forward and backward over a micro-batch.
class ModelPass {
 public:
  virtual ~ModelPass() = default;
  virtual void Forward(TraceBuilder& builder) = 0;
  virtual void Backward(TraceBuilder& builder, GradientSink& gradients) = 0;
  // Releases what the step held to its end (the batch, the loss).
  virtual void EndStep(TraceBuilder& builder) = 0;
  // Many GPUs: where layer changes are reported (passes without layers ignore it).
  virtual void SetLayerHook(LayerHook*) {}
};

struct StateTensors;  // below

// Emits one optimizer.step(): states created on the first call, then the temporaries of the
// chosen implementation. Defined in optimizer.cpp next to the state-size rules.
class OptimizerPass {
 public:
  OptimizerPass(const Setup& setup, const Inventory& inventory, const std::vector<Text>& names,
                const Regime& regime);
  // optimizer.step() over every trainable parameter.
  void Step(TraceBuilder& builder);
  // optimizer.step() with only these trainable parameters in its groups (DeepSpeed ZeRO-3 steps
  // one sub-group's fp32 flat at a time: stage3.py _optimizer_step).
  void StepTensors(TraceBuilder& builder, const std::vector<std::size_t>& indices);
  // Optimizer in backward: the step of parameter `index` alone, run by its gradient hook with
  // an optimizer of its own (torchtune's optimizer_in_bwd builds one per parameter).
  void StepParameter(TraceBuilder& builder, std::size_t index);
  // Block templates: StepParameter's effect on this object for a step a copied span holds the
  // events of (the states made: paged ones' unified bytes). False, with nothing done, where
  // the copy's events could not be that step (the step's first states, whose label it makes).
  bool AdoptCopiedStep(TraceBuilder& builder, std::size_t index, bool apply);

 private:
  void CreateStates(TraceBuilder& builder, std::size_t index);
  // bitsandbytes' two quantization maps are still to be moved to the GPU, by the first 8-bit
  // state (`states`: a parameter's).
  bool SharedMapsPending(const StateTensors& states) const;
  // The implementation that runs: Adafactor, Lion and bitsandbytes always loop over parameters.
  OptimizerImplementation Implementation() const;
  // foreach under fp32 masters: the fp32 copy of every gradient in `indices`, one allocation each
  // (none otherwise). Released by Temporaries.
  std::vector<TensorHandle> UpcastGradients(TraceBuilder& builder, const std::vector<std::size_t>& indices);
  // The step's temporaries over `indices` (one foreach call, or one parameter at a time);
  // `upcast` the foreach fp32 gradients made before the states (null: made here).
  void Temporaries(TraceBuilder& builder, const std::vector<std::size_t>& indices,
                   std::vector<TensorHandle>* upcast = nullptr);
  const Setup& setup_;
  const Inventory& inventory_;
  const std::vector<Text>& names_;
  Regime regime_;
  std::vector<bool> created_;   // by parameter: its states exist
  bool sharedCreated_ = false;  // bitsandbytes' quantization maps
  int createsStep_ = -1;        // the step creates_ was made for
  Text creates_;                // "step N: <optimizer> creates " (CreateStates' labels)
  std::vector<TensorHandle> states_;
};

// The state tensors an optimizer keeps for one parameter tensor (shared by the trace and by
// ComputeModelStates so both always agree).
struct StateTensor {
  const char* name;          // "exp_avg", "exp_avg_sq_row", …
  std::int64_t elements = 0;
  DType type = DType::FP32;
  Shape shape;               // its shape (the formula shows it)
};
// At most four per tensor (bitsandbytes 8-bit: state1, state2, absmax1, absmax2).
struct StateTensors {
  StateTensor items[4];
  int count = 0;
  const StateTensor* begin() const { return items; }
  const StateTensor* end() const { return items + count; }
};
StateTensors OptimizerStateTensors(const TrainingDef& training, const Regime& regime,
                                               const Tensor& parameter);
// States an optimizer keeps once, not per tensor: bitsandbytes' two 256-value fp32 quantization
// maps (qmap1 "dynamic", qmap2 "udynamic"), moved to the GPU by the first 8-bit init_state.
StateTensors OptimizerSharedStates(const TrainingDef& training, const Inventory& inventory);
// bitsandbytes paged optimizers: whether this parameter's states are paged (cudaMallocManaged).
bool OptimizerStatesPaged(const TrainingDef& training, const Tensor& parameter);
// What the bitsandbytes constants are (bitsandbytes/optim/optimizer.py).
inline constexpr std::int64_t kBnbMin8bitSize = 4096;     // Optimizer8bit(min_8bit_size=4096)
inline constexpr std::int64_t kBnbBlockSize = 256;        // init_state: blocksize = 256
inline constexpr std::int64_t kBnbPagedMinElements = 100000;  // get_state_buffer: p.numel() < 1e5 not paged
inline constexpr std::int64_t kBnbQuantMapValues = 256;   // functional.create_dynamic_map: 256 values

}  // namespace gpumem
