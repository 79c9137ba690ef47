// A small model of PyTorch autograd, for simulating a transformer's step op by op.
//
// Forward ops allocate their outputs and record a node that holds what the op saves for
// backward (PyTorch's derivatives.yaml: a linear saves its input, softmax its output, …).
// Backward walks the nodes in reverse creation order — the order PyTorch's engine runs a
// single-device graph — allocating the gradient of each input, handing parameter gradients to
// the GradientSink, and releasing the node's saved tensors and incoming gradients. Storage
// lifetimes are TraceBuilder reference counts, so a tensor is freed exactly when the last
// Python variable, saved slot or gradient buffer lets go of it.
//
// Checkpoint() models torch.utils.checkpoint (reentrant, Hugging Face's default): the block
// runs without recording, keeping only its inputs; at its backward the block is run again with
// recording on and back-propagated on its own. With SetCheckpointReentrant(false) it models
// use_reentrant=False instead (see Checkpoint).
//
// Speed: an estimate simulates 10⁴–10⁵ ops, so nothing here allocates per op. Values, nodes
// and gradients live in flat vectors indexed by id, shapes and small lists are fixed-size, and
// every label is a Text (parts rendered only when shown).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "gpumem/device.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

using ValueId = int;
constexpr ValueId kNoValue = -1;
class ActivationOffload;  // sim/savers.hpp

// A list of at most N items stored inline (ops have a handful of inputs and saved tensors).
template <typename T, int N>
class SmallVec {
 public:
  SmallVec() = default;
  SmallVec(std::initializer_list<T> items) {
    for (const T& t : items) push_back(t);
  }
  void push_back(const T& t) {
    if (size_ == N) std::abort();  // a programming error: an op with more parts than N
    items_[size_++] = t;
  }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { size_ = 0; }
  T& operator[](int i) { return items_[i]; }
  const T& operator[](int i) const { return items_[i]; }
  const T& front() const { return items_[0]; }
  const T* begin() const { return items_; }
  const T* end() const { return items_ + size_; }
  T* begin() { return items_; }
  T* end() { return items_ + size_; }

 private:
  T items_[N];
  int size_ = 0;
};

// One input of an op, and how its gradient is made in backward.
struct In {
  ValueId value = kNoValue;
  enum Rule : std::uint8_t {
    Compute,      // a new gradient of the input's size and dtype is allocated (most ops)
    PassThrough,  // the output's gradient is the input's gradient (add, views, clone)
    NoGrad,       // no gradient flows (masks, indices, constants)
  } rule = Compute;
};

// A tensor an op makes beside its output (saved), or a temporary of its backward.
struct BackwardTemp {
  Shape shape;
  DType type = DType::FP32;
  const char* name = "";  // a literal: "mask", "logsumexp"
  // Freed once the node's temporaries are made, before the input gradients: a helper's locals
  // that die when it returns (torchao's NF4Tensor.get_original_weight in LinearNF4.backward).
  bool beforeGradients = false;
  // Made once the input gradients are, and freed at once: the scratch of autograd's sum_to of a
  // broadcast gradient, which the engine runs on the node's outputs (torch/csrc/autograd/
  // engine.cpp validate_outputs → InputMetadata::reduce_grad → at::sum_to).
  bool afterGradients = false;
};
// An op's backward temporaries (FlashAttention's GQA backward has four).
using BackwardTemps = SmallVec<BackwardTemp, 4>;

class Tape {
 public:
  Tape(TraceBuilder& builder, DType computeType, bool autocast, std::size_t parameterCount);
  TraceBuilder& builder() { return b_; }
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  TextStore& text() { return b_.text(); }
  // Room for this many values and nodes (a forward of a known size grows no vector).
  void Reserve(std::size_t values, std::size_t nodes) {
    values_.reserve(values);
    nodes_.reserve(nodes);
  }
  // A Text of parts, for op and value names built from pieces.
  Text T(std::initializer_list<TextPart> parts) { return b_.text().Make(parts); }

  // --- where events happen (labels and the timeline's layer) ---
  void SetScope(Text scope, int layer) {
    SetScopeText(scope);
    if (layerHook_ && layer != layer_) layerHook_->Enter(b_, layer, inBackward_);
    layer_ = layer;
  }
  // Many GPUs: told of every layer change (core/src/parallel/parallel_step.cpp).
  void SetLayerHook(LayerHook* hook) { layerHook_ = hook; }
  Text scope() const { return scope_; }
  int layer() const { return layer_; }
  bool recording() const { return recording_; }
  // Records no autograd history until set back (returns the previous state): for a branch whose
  // result is only used detached, so that its graph dies with the Python locals that hold it.
  bool SetRecording(bool on) {
    const bool was = recording_;
    recording_ = on;
    return was;
  }

  // --- values ---
  // A tensor whose storage is owned elsewhere (the batch); no gradient.
  ValueId External(TensorHandle storage, Shape shape, DType type, TextPart name);
  // A parameter: a leaf whose gradient goes to the sink; its storage is the model's. A frozen
  // one (requires_grad=False) takes no part in autograd.
  ValueId Parameter(std::size_t inventoryIndex, Shape shape, DType type, Text name, bool requiresGrad = true);
  // x.requires_grad_(True) on a tensor with no history: backward then computes its gradient,
  // held until backward ends. `heldByGraph` (enable_input_require_grads' hook on the embeddings'
  // output, a leaf of the training loop's own graph): the leaf's AccumulateGrad node keeps the
  // tensor (accumulate_grad.h, `Variable variable`), the graph keeps that node while the loss
  // lives, and the gradient stays the leaf's .grad; both go only when the loss is let go
  // (ReleaseGraph). Measured on CPU torch: llama-lora-bf16-ckpt's optimizer step holds both.
  void RequireGrad(ValueId v, bool heldByGraph = false) {
    if (recording_ && v != kNoValue && values_[static_cast<std::size_t>(v)].producer < 0) {
      values_[static_cast<std::size_t>(v)].requiresGrad = true;
      if (heldByGraph) {
        graphLeaves_.push_back(v);
        graphLeafStorage_.push_back(b_.Retain(values_[static_cast<std::size_t>(v)].storage));
      }
    }
  }
  // The loss is let go: the graph's leaves (RequireGrad's heldByGraph) and their .grads with it,
  // each .grad before its tensor (the TensorImpl's autograd meta goes before its storage).
  void ReleaseGraph();
  // A new tensor held once by the caller, with no autograd history (torch.zeros, a mask).
  ValueId Fresh(Shape shape, DType type, TextPart name, Category category = Category::Activations);
  ValueId Keep(ValueId v);  // one more Python reference to the same tensor
  void Drop(ValueId v);     // the caller's reference ends (no-op for kNoValue)
  DType TypeOf(ValueId v) const { return values_[static_cast<std::size_t>(v)].type; }
  bool RequiresGrad(ValueId v) const { return v != kNoValue && values_[static_cast<std::size_t>(v)].requiresGrad; }
  const Shape& ShapeOf(ValueId v) const { return values_[static_cast<std::size_t>(v)].shape; }
  std::int64_t Elements(ValueId v) const { return ShapeOf(v).Elements(); }

  // --- the one primitive: an op with an output that may save things for backward ---
  struct OpSpec {
    TextPart name = "";                  // "q_proj", "softmax" (a literal or a Text)
    SmallVec<In, 4> inputs;
    Shape shape;                         // output shape
    DType type = DType::FP32;            // output dtype
    SmallVec<ValueId, 4> saves;          // values whose storage the node keeps
    bool savesOutput = false;            // the node keeps its own output (softmax, tanh)
    SmallVec<BackwardTemp, 2> saveNew;   // extra tensors made and saved (dropout mask, stats)
    BackwardTemps backwardTemps;
    ValueId viewOf = kNoValue;           // output shares this value's storage (no allocation)
    // What op-level selective checkpointing sees (torchtitan's _save_list): aten.mm (a Linear on
    // a 3-D input) or an SDPA kernel; other ops are recomputed.
    enum class Sac : std::uint8_t { None, Mm, Attention } sac = Sac::None;
  };
  ValueId Apply(const OpSpec& spec);
  // An op whose input gradients are made in forward and held by its node until backward (Liger's
  // fused linear + cross-entropy computes them beside the loss): `gradients[i]` is input i's
  // gradient (kNoValue: the usual rule), a tensor the caller made and still holds. In backward
  // the node hands it over instead of allocating one — as the input's incoming gradient, or as a
  // parameter's .grad (GradientSink::Adopt: AccumulateGrad steals a buffer no one else holds).
  ValueId ApplyPrecomputed(const OpSpec& spec, const SmallVec<ValueId, 4>& gradients);
  // An op with several outputs sharing one node (split): outputs are views of `input`.
  SmallVec<ValueId, 4> Split(TextPart name, ValueId input, std::initializer_list<Shape> shapes);
  // torch.chunk(input, chunks, dim): ceil(size / chunks) along `dim` each (the last smaller, and
  // fewer chunks when they run out), views sharing one SplitBackward node (at most 8).
  SmallVec<ValueId, 8> Chunk(TextPart name, ValueId input, std::int64_t chunks, int dim);

  // --- autocast ---
  bool autocast() const { return autocast_; }
  DType computeType() const { return compute_; }
  // The value an autocast matmul reads: itself when already 16-bit (or autocast is off), else
  // a 16-bit copy; parameters' copies are cached until EndAutocast() (once per forward).
  ValueId ForMatmul(ValueId v);
  void EndAutocast();  // leaving the autocast context: the weight-copy cache lets go

  // --- version-dependent autograd rules (runtime.pytorchVersion) ---
  // Before PyTorch 1.11 softmax and log_softmax saved their input as well as their output
  // (ops::Softmax reads this; pytorch/pytorch#64000, fixed by PR #65242).
  bool softmaxSavesInput() const { return softmaxSavesInput_; }
  void SetSoftmaxSavesInput(bool on) { softmaxSavesInput_ = on; }
  // From PyTorch 2.5 scaled_dot_product_attention takes enable_gqa, and transformers passes it
  // instead of repeating k and v (blocks::AttentionCore reads this).
  bool sdpaEnableGqa() const { return sdpaEnableGqa_; }
  void SetSdpaEnableGqa(bool on) { sdpaEnableGqa_ = on; }
  // The GPU's multiprocessors and threads, which size a CUDA reduction's scratch (ops.cpp
  // SumToScratch; setup.gpu.id, the H100 SXM's when custom).
  const GpuParallelism& gpu() const { return gpu_; }
  void SetGpu(const GpuParallelism& gpu) { gpu_ = gpu; }

  // --- checkpointing ---
  using Values = SmallVec<ValueId, 4>;
  using Block = std::function<Values(Tape&, const Values&)>;
  // Runs `block` without recording; the returned outputs get a checkpoint node that keeps
  // `inputs` and recomputes the block at backward. Inputs that need no gradient (masks, cos)
  // are kept too, as torch.utils.checkpoint's save_for_backward does.
  //
  // selectiveOps: torch.utils.checkpoint with torchtitan's op-level policy
  // (torchtitan/models/llama3/parallelize_llama.py _save_list, _custom_policy): while the block
  // runs, the outputs of SDPA and of every odd-numbered mm (1st, 3rd, …) are kept by the
  // checkpoint (torch/utils/checkpoint.py _CachingTorchDispatchMode: MUST_SAVE outputs stored);
  // the recompute takes them back instead of computing them (_CachedTorchDispatchMode pops them).
  //
  // Non-reentrant (torch/utils/checkpoint.py _checkpoint_without_reentrant_generator): the
  // forward runs with grad mode on, so the block's nodes are recorded and every tensor an op
  // saves goes to _checkpoint_hook's pack, which keeps a holder, not the tensor. The backward
  // differs from the reentrant one in three ways (RunCheckpoint):
  //  - the recompute's outputs are not kept (recompute_fn returns nothing);
  //  - no CheckpointFunction.backward holds the incoming gradients while the block's backward
  //    runs, so the engine can add into them in place;
  //  - with early stop (PyTorch ≥ 2.1) the recompute ends at the pack of the last tensor the
  //    forward saved (_recomputation_hook raises _StopRecomputationError): an op's inputs are
  //    packed before it runs, its outputs after, and the ops after it do not run; an output the
  //    op-level policy kept for an op after the stop stays kept to the block's backward end.
  // No input has to require a gradient: the parameters inside get theirs either way.
  Values Checkpoint(TextPart name, const Values& inputs, Block block, bool selectiveOps = false);
  // torch.utils.checkpoint's use_reentrant (true: Hugging Face's default) and, for
  // use_reentrant=False, whether the recompute stops early (PyTorch ≥ 2.1's default).
  void SetCheckpointReentrant(bool on) { reentrant_ = on; }
  void SetCheckpointEarlyStop(bool on) { earlyStop_ = on; }

  // Forward templates (tape_templates.cpp, RunForwardSpan): the forwards of checkpointed blocks
  // are copied once a prediction matched, given the inventory (the blocks' parameters) and the
  // Parameters' leaf cache (sim/model.hpp) that a block's forward fills. Unset: always simulated.
  void SetForwardTemplates(const Inventory* inventory, std::vector<ValueId>* leaves) {
    inventory_ = inventory;
    leaves_ = leaves;
  }
  // What makes blocks of equal parameters run differently (a Gemma sliding-window layer beside a
  // full-attention one, a SmolLM3 layer without RoPE), one value per block: a block's span is
  // copied only from blocks of its own kind (ComputeLayerSignatures mixes it in; the pattern of
  // the signatures sets the period of the spans' templates: SpanChain).
  void SetLayerKinds(std::vector<std::uint8_t> kinds) {
    layerKinds_ = std::move(kinds);
    layerSignature_.clear();
  }
  // Block `layer`'s forward, not checkpointed: `block` run on `inputs` as it is, recording its
  // nodes; with forward templates set, its span (nodes included) may be copied from the
  // blocks before it instead (tape_templates.cpp, RunForwardSpan).
  Values PlainBlock(int layer, const Values& inputs, const Block& block);

  // --- activation offloading (sim/savers.hpp): the saved-tensor hooks, when set ---
  void SetOffload(ActivationOffload* offload) { offload_ = offload; }
  ActivationOffload* offload() { return offload_; }

  // --- backward ---
  // loss.backward(): the gradient of `loss` (a scalar) is created and back-propagated.
  void Backward(ValueId loss, GradientSink& sink);

 private:
  struct Value {
    TensorHandle storage = kNoTensor;
    Shape shape;
    DType type = DType::FP32;
    bool requiresGrad = false;
    int producer = -1;        // node index, -1 for leaves
    int parameter = -1;       // inventory index for parameters
    Text name;
  };
  struct Node {
    Text label;
    int layer = -1;
    SmallVec<In, 4> inputs;
    SmallVec<ValueId, 8> outputs;  // Chunk makes up to 8
    SmallVec<TensorHandle, 6> saved;  // 6: SDPA's memory-efficient kernel keeps q, k, v, mask, out, lse
    int temps = -1;           // index into temps_ (backward temporaries are rare: SDPA's)
    int block = -1;           // index into blocks_ for checkpoint nodes
    Values blockInputs;       // checkpoint: all inputs, in order
    int packed = -1;          // index into packed_ when a saved tensor was offloaded
    int precomputed = -1;     // index into precomputed_ (ApplyPrecomputed)
    // A non-reentrant checkpoint: how many of its forward's ops saved tensors (packed to
    // holders); -1 for a reentrant one and for every other node.
    int packedOps = -1;
    bool done = false;
  };
  // autocast's weight-copy cache: parameter → its 16-bit copy, and which are set (in order).
  struct CastCache {
    std::vector<ValueId> byParameter;
    std::vector<int> cached;
    // A reentrant checkpoint's recompute: its detached inputs are leaves that require grad, so
    // autocast caches their casts as it does the weights' (one copy for every linear that reads
    // the input directly); the copies, in the order of leafInputs, kNoValue until made.
    std::vector<ValueId> leafInputs, leafCopies;
  };

  ValueId NewValue(const Value& v);
  // The Text a part names: the referenced Text itself, or a new one-part Text.
  Text TextOf(TextPart part) { return part.kind == TextPart::kRef ? Text{part.n, static_cast<std::uint32_t>(part.value)} : T({part}); }
  // "scope: what" (or "what" without a scope) and "scope.tensor".
  Text ScopedLabel(TextPart what, TextPart suffix = "");
  TensorHandle AllocStorage(const Shape& shape, DType type, Category category, TextPart tensor,
                            TextPart what, TextPart suffix = "");
  void RunBackward(int fromNode, int toNode);

  // --- block templates: the checkpointed blocks' backward spans and forwards, copied ---
  // What the backward of one checkpoint node (recompute + backward, RunCheckpoint) did: its
  // events, the text parts and shape dimensions it made, the tensors it made (ids
  // [idFrom, idTo), their holders at its end), the holder changes of older tensors, the .grads
  // it made and the gradients it left for the checkpoint's inputs.
  struct SpanRecord {
    std::size_t eventFrom = 0, eventTo = 0, partFrom = 0, partTo = 0, dimFrom = 0, dimTo = 0;
    int idFrom = 0, idTo = 0;
    std::vector<int> holders;
    std::vector<std::pair<int, int>> touches;
    std::vector<std::pair<int, int>> grads;  // (parameter, .grad)
    SmallVec<TensorHandle, 4> inputGrads;
    int layerAfter = -1;   // the tape's layer when the span ends
    int layer = -1;        // the checkpoint node's layer (its block)
    bool copyable = true;  // nothing happened that a copy cannot reproduce
    // A checkpointed block's forward (RunForwardSpan): the values it made [valueFrom, valueTo),
    // the autocast copies it cached and the parameter leaves it made (parameter, value), its
    // outputs and the scope texts it left (scope_, scopeColon_, scopeDot_, scopeSpace_).
    bool forward = false;
    int valueFrom = 0, valueTo = 0;
    std::vector<std::pair<int, int>> casts, leaves;
    Values outs;
    std::array<Text, 4> scopeAfter{};
    std::vector<Value> values;  // as the span left them (Checkpoint then marks the outputs)
    // A non-reentrant checkpoint's forward: the ops whose saved tensors it packed (packedOps_).
    int packedOps = 0;
    // A plain block's forward (PlainBlock): it records nodes [nodeFrom, nodeTo) and backward
    // temporaries [tempFrom, tempTo); its inputs' dtype and requires_grad decide which ops
    // record, so a copy needs the same (inputKinds: type · 2 + requiresGrad, per input).
    bool plain = false;
    int nodeFrom = 0, nodeTo = 0, tempFrom = 0, tempTo = 0;
    // A plain block's backward: the names of the values it reads from outside (PlainSpanInputs),
    // texts of the block below, which its labels refer to (a copy checks them: block 0's forward
    // is not laid out as the others'). A checkpointed block's: CheckpointOutsideTexts.
    std::vector<Text> inputNames;
    SmallVec<int, 4> inputKinds;
    // Activation offloading: a checkpointed block's backward unpacked its offloaded input and
    // left the tensors it brought back in the offloader's bwd_tensor_stash (packed id, tensor);
    // the stash it found (what the block above brought back, which it frees) too.
    bool unpacked = false;
    std::vector<std::pair<int, TensorHandle>> offloadStash, offloadStashBefore;
  };
  // A span predicted from the two before it (every id, text position, layer and parameter
  // index moving by as much again as from the first to the second).
  struct PredictedSpan {
    SpanRecord record;
    std::vector<Event> events;
    std::vector<TextPart> parts;
    std::vector<std::int64_t> dims;
    std::vector<Value> values;  // a forward span's
    std::vector<Node> nodes;    // a plain forward span's
    std::vector<BackwardTemps> temps;
  };
  // The spans after a checked prediction: the predicted span and how far each of its numbers
  // moves from one span to the next.
  struct EventStep {
    int id, layer;
    std::int64_t label, tensor, formula;
  };
  struct PartStep {
    std::uint32_t index;  // into span.parts
    enum What : std::uint8_t { kPosition, kValue, kParameter } what;
    std::int64_t delta;   // kParameter: the parameter's index now
    std::int64_t parameterStep = 0;
  };
  struct SpanTemplate {
    bool ready = false;
    PredictedSpan span;
    std::int64_t eventStep = 0, partStep = 0, dimStep = 0;
    int idStep = 0, layerStep = 0;
    std::vector<EventStep> eventSteps;
    std::vector<PartStep> partSteps;  // parameters' names (positions and numbers: below)
    // The parts that are positions (most: references to texts and dimensions) and numbers,
    // each in its own list: no branch per part (a Mixtral block's span has 1,000 of them).
    using PartDelta = TextStore::PartStepRule;
    std::vector<PartDelta> positionSteps, numberSteps;
    // Its copies' words (TextStore::AddSeries): the series, how many copies were made from it,
    // and the parts that name a parameter (partSteps' indices), gathered for each copy.
    int series = -1;
    std::int64_t copies = 0;
    std::vector<std::uint32_t> nameParts;
    std::vector<TextPart> names;
    std::vector<int> touchSteps;
    std::vector<std::pair<int, int>> gradSteps;
    std::vector<int> inputGradSteps;
    std::vector<std::pair<int, int>> offloadStashSteps, offloadStashBeforeSteps;
    // A forward span's: values (storage, parameter, name position), casts, leaves, outputs.
    struct ValueStep {
      int storage, parameter, producer;
      std::int64_t name;
    };
    int valueStep = 0;
    std::vector<ValueStep> valueSteps;
    std::vector<std::pair<int, int>> castSteps, leafSteps;
    std::vector<int> outSteps;
    std::array<std::int64_t, 4> scopeSteps{};
    // A plain forward span's nodes: how far each number of each node moves from one span to
    // the next (NextNode checked once, in Predict, that the rest stays).
    struct NodeStep {
      std::int64_t label;
      int layer, temps;
      std::array<int, 4> inputs;   // kNoValue inputs: 0
      std::array<int, 8> outputs;
      std::array<int, 6> saved;    // a weight's (kNoTensor): 0
    };
    std::vector<NodeStep> nodeSteps;
    int nodeStep = 0, tempStep = 0;
    std::vector<std::int64_t> inputNameSteps;
  };
  // The spans a kind of copy learns from (the backward's, of checkpointed and plain blocks, and
  // the forward's). Blocks repeat every period_ blocks (ComputeLayerSignatures: 1 for most
  // models; Gemma 2 alternates sliding-window and global attention, 2; SmolLM3 leaves RoPE out
  // of every fourth block, 4), so a span is predicted from the two simulated spans of its place
  // in the period before it, and each place has a template of its own.
  struct SpanChain {
    std::vector<SpanRecord> spans;        // the last simulated spans, newest last (2 · period + 1)
    std::vector<SpanTemplate> templates;  // by layer mod period
    std::vector<std::uint8_t> checked;    // by layer mod period: a prediction matched a simulation
    void Forget() {
      spans.clear();
      for (SpanTemplate& t : templates) t.ready = false;
      std::fill(checked.begin(), checked.end(), std::uint8_t{0});
    }
  };
  SpanChain backwardChain_, forwardChain_;
  int period_ = 1;
  int PhaseOf(int layer) const { return layer >= 0 ? layer % period_ : 0; }
  bool Checked(const SpanChain& c, int layer) const {
    const auto phase = static_cast<std::size_t>(PhaseOf(layer));
    return phase < c.checked.size() && c.checked[phase] != 0;
  }
  // The simulated span of `layer` in `c`, newest first; null when there is none.
  static const SpanRecord* SpanOf(const SpanChain& c, int layer);
  // The template of the span at `layer` (a checked place of the period): moved on by a period,
  // or built from the two simulated spans of its place before it; null when that fails.
  SpanTemplate* NextTemplate(SpanChain& c, int layer, bool forward);
  // Keeps a simulated span and, while its place is unchecked, checks the prediction of it from
  // the two spans of its place before it.
  void KeepSpan(SpanChain& c, SpanRecord&& r);
  // Per block: a hash of its parameters (shapes, trainable, storage, adapter) and kind, and the
  // index of its first parameter. A span is copied to block k only when block k's parameters are
  // those of the block a period before it, one stride on in the inventory (not so: blocks frozen
  // by finetune.freezeFirstBlocks or left out of trainOnlyModules).
  std::vector<std::uint64_t> layerSignature_;
  std::vector<std::int64_t> layerFirstParameter_;
  void ComputeLayerSignatures();
  void BeginSpanRecord(SpanRecord& r);
  void EndSpanRecord(SpanRecord& r);
  bool LayerFollows(int layer, int previous) const;
  bool BuildTemplate(SpanTemplate& t, const SpanRecord& a, const SpanRecord& b);
  bool AdvanceTemplate(SpanTemplate& t);
  void RunCheckpointSpan(int node);
  // `inputs`: the checkpoint's block inputs, or a plain span's PlainSpanInputs.
  bool ApplyPredicted(int node, const Values& inputs, SpanTemplate& t);
  // The words of the template's next copy (TextStore::AppendCopy).
  void AppendCopyText(SpanTemplate& t);
  // The texts of a checkpoint node's forward that its backward's words refer to: its label,
  // its inputs' names and those of its offloaded inputs (kept in SpanRecord::inputNames).
  void CheckpointOutsideTexts(int index, std::vector<Text>& out) const;
  std::vector<Text> outsideTexts_;
  // The backward of the plain block whose last node is `top` (its nodes: the run of nodes of
  // its layer below `top`), copied or simulated; returns the run's lowest node.
  int RunPlainSpan(int top);
  // The values a plain span's nodes read from outside it that need a gradient (the block's
  // input hidden states), in first-use order; false when more than the list holds.
  bool PlainSpanInputs(int bottom, int top, Values& out) const;
  // Plain blocks shorter than this many nodes are simulated: recording, checking and copying
  // their spans cost more than it saved. Callgrind per estimate against no plain templates:
  // forward copies GPT-2 (36 nodes a block) +2.5 %, Llama-2 (49) -2.7 %, Mixtral (126) -5.4 %;
  // backward copies on top GPT-2 +2.4 %, Llama-2 -0.1 %, Mixtral -1.1 %. Since copies keep
  // their words as a rule (TextStore::AddSeries) a copy costs less: Llama-2's backward copies
  // (a 64-node minimum kept them out) save 4.7 % of its instructions (gpumem_bench 1 "Llama 2",
  // 43.03 -> 41.00 M), while GPT-2's blocks copied at a 30-node minimum still cost 2.7 % more
  // (20.41 -> 20.97 M).
  static constexpr int kMinPlainForwardNodes = 40;
  static constexpr int kMinPlainBackwardNodes = 40;
  bool plainForwardsOff_ = false;  // a plain block was shorter than kMinPlainForwardNodes
  int lowestLayer_ = -1;  // the lowest block with plain nodes: always simulated
  void ForgetSpans() { backwardChain_.Forget(); }
  bool Predict(const SpanRecord& a, const SpanRecord& b, PredictedSpan& out);
  bool SameAsSimulated(const PredictedSpan& predicted, const SpanRecord& actual) const;
  // Forward templates (RunForwardSpan): the checkpointed blocks' forwards, copied.
  // plainLayer: a plain block's index (PlainBlock), -1 for a checkpointed block's forward.
  Values RunForwardSpan(const Values& inputs, const Block& block, int plainLayer = -1);
  void ForgetForwardSpans();
  bool ApplyForward(SpanTemplate& t, const Values& inputs, int layer, Values& outs);
  static bool NextNode(const Node& x, const Node& y, Node& out);
  static bool SameNode(const Node& x, const Node& y);
  static int InputKind(const Value& v) { return static_cast<int>(v.type) * 2 + (v.requiresGrad ? 1 : 0); }
  bool PredictForward(const SpanRecord& a, const SpanRecord& b, PredictedSpan& out) const;
  bool SameForwardAsSimulated(const PredictedSpan& predicted, const SpanRecord& actual) const;
  static bool SameValue(const Value& x, const Value& y);
  bool SpanFits(const PredictedSpan& predicted);
  bool TouchesConsistent(const PredictedSpan& predicted) const;
  mutable std::vector<int> touchDelta_, touchIds_;  // TouchesConsistent's scratch, by tensor id
  mutable std::vector<std::uint8_t> touchFlags_;
  const Inventory& inventory() const { return inventory_ != nullptr ? *inventory_ : sink_->inventory(); }
  const Inventory* inventory_ = nullptr;
  std::vector<std::uint8_t> layerKinds_;  // SetLayerKinds
  std::vector<ValueId>* leaves_ = nullptr;                // Parameters' cache: inventory index → leaf
  std::vector<std::pair<int, int>>* leafLog_ = nullptr;  // while a forward span is recorded
  // The inventory index of the parameter whose name `text` points into, or -1.
  int ParameterOfName(const char* text);
  bool templates_ = false;        // this backward may copy spans (Backward decides)
  int lowestCheckpoint_ = -1;     // the first checkpoint node (block 0's): always simulated
  std::vector<std::pair<const char*, int>> nameIndex_;  // parameter name → index, sorted
  void Execute(int node);
  void RunCheckpoint(int node);
  void Deliver(ValueId value, TensorHandle grad, Text label);
  bool NeedsGrad(const In& in) const;
  // The gradient slot of value v (inline: backward reads it several times per node).
  [[gnu::always_inline]] TensorHandle& GradOf(ValueId v) {
    if (static_cast<std::size_t>(v) >= grads_.size()) GrowGrads();
    return grads_[static_cast<std::size_t>(v)];
  }
  void GrowGrads();  // room for every value made so far, and 1024 more
  // Releases `h` with the label `make()` builds, built only when the release frees it.
  template <typename MakeLabel>
  void ReleaseWith(TensorHandle h, MakeLabel make) {
    if (b_.Holders(h) == 1) b_.Release(h, make());
    else b_.Release(h, Text{});
  }
  CastCache& cache() { return caches_[static_cast<std::size_t>(cacheDepth_)]; }
  // Activation offloading's pack of a node's saved tensors (slot i: its bytes, whether it is a
  // parameter's storage, its name): an offloaded slot's reference goes to the offloader.
  void PackSaved(Node& node, const SmallVec<std::int64_t, 6>& bytes, const SmallVec<bool, 6>& parameter,
                 const SmallVec<Text, 6>& names);
  // Unpacks a node's offloaded tensors as its backward starts: slot → the GPU tensor it reads.
  SmallVec<TensorHandle, 6> UnpackSaved(const Node& node);

  TraceBuilder& b_;
  GradientSink* sink_ = nullptr;
  DType compute_;
  bool autocast_;
  bool softmaxSavesInput_ = false;
  bool sdpaEnableGqa_ = false;
  GpuParallelism gpu_;
  bool recording_ = true;
  // Non-reentrant checkpointing: the setting, the forward that packs saved tensors (and how
  // many ops saved some), and the recompute's early stop (at the stopAt_-th saving op; -1: it
  // runs to the end), how many saving ops it ran and whether it has stopped.
  bool reentrant_ = true;
  bool earlyStop_ = true;
  bool packing_ = false;
  int packedOps_ = 0;
  int stopAt_ = -1;
  int savingOps_ = 0;
  bool stopped_ = false;
  // The scope and its three joins, made once per scope rather than once per event: "scope: ",
  // "scope." and "scope " (each empty when the scope is).
  void SetScopeText(Text scope);
  Text scope_, scopeColon_, scopeDot_, scopeSpace_;
  int layer_ = -1;
  LayerHook* layerHook_ = nullptr;
  bool inBackward_ = false;
  std::size_t parameterCount_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<Block> blocks_;
  // Op-level selective checkpointing: per checkpoint block, the kept outputs in op order; the
  // block being run (building: collect; replaying: take back) and its mm count.
  std::vector<std::vector<TensorHandle>> sacKept_;
  std::vector<TensorHandle> sacBuilding_;
  const std::vector<TensorHandle>* sacReplay_ = nullptr;
  std::size_t sacNext_ = 0;
  bool sacCollect_ = false;
  int sacMmCount_ = 0;
  bool SacSaves(Tape::OpSpec::Sac kind);
  std::vector<BackwardTemps> temps_;
  std::vector<TensorHandle> grads_;  // gradient buffer of each value, during backward
  std::vector<ValueId> graphLeaves_;  // RequireGrad(…, heldByGraph): kept by the graph
  std::vector<TensorHandle> graphLeafStorage_, graphLeafGrads_;  // released by ReleaseGraph
  std::vector<CastCache> caches_;    // [0] the forward's; deeper ones for recomputes
  ActivationOffload* offload_ = nullptr;
  std::vector<SmallVec<int, 6>> packed_;  // per offloading node: each slot's packed id, or -1
  std::vector<SmallVec<TensorHandle, 4>> precomputed_;  // per ApplyPrecomputed node: by input
  int cacheDepth_ = 0;
};

// Block templates on (the default) or off: tests compare the two traces event by event.
void SetBlockTemplates(bool on);
bool BlockTemplatesOn();
// How many checkpointed blocks' forwards were copied so far in this process (tests: that the
// forward templates do copy).
std::size_t ForwardSpansCopied();
// And how many backward spans (checkpointed blocks' and plain blocks') were copied.
std::size_t BackwardSpansCopied();

// The wider of two floating types, as PyTorch promotes mixed operands.
DType Promote(DType a, DType b);

}  // namespace gpumem
