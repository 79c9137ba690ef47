// The autograd model: values, nodes, backward, checkpointing, autocast's weight-copy cache.
#include "sim/tape.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include "gpumem/names.hpp"
#include "gpumem/recycle.hpp"
#include "sim/savers.hpp"

namespace gpumem {

DType Promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Int64 || a == DType::Bool) return b;
  if (b == DType::Int64 || b == DType::Bool) return a;
  return DType::FP32;  // fp32 with anything, or fp16 with bf16
}

Tape::Tape(TraceBuilder& builder, DType computeType, bool autocast, std::size_t parameterCount)
    : b_(builder), compute_(computeType), autocast_(autocast), parameterCount_(parameterCount),
      values_(Recycled<Value>::Take()), nodes_(Recycled<Node>::Take()), grads_(Recycled<TensorHandle>::Take()) {
  caches_.resize(1);
  if (autocast_) caches_[0].byParameter.assign(parameterCount_, kNoValue);
}

Tape::~Tape() {
  Recycled<Value>::Give(std::move(values_));
  Recycled<Node>::Give(std::move(nodes_));
  Recycled<TensorHandle>::Give(std::move(grads_));
}

ValueId Tape::NewValue(const Value& v) {
  values_.push_back(v);
  return static_cast<ValueId>(values_.size() - 1);
}

void Tape::GrowGrads() { grads_.resize(values_.size() + 1024, kNoTensor); }

void Tape::SetScopeText(Text scope) {
  scope_ = scope;
  scopeColon_ = scope.empty() ? Text{} : T({scope, ": "});
  scopeDot_ = scope.empty() ? Text{} : T({scope, "."});
  scopeSpace_ = scope.empty() ? Text{} : T({scope, " "});
}

Text Tape::ScopedLabel(TextPart what, TextPart suffix) { return T({scopeColon_, what, suffix}); }

TensorHandle Tape::AllocStorage(const Shape& shape, DType type, Category category, TextPart tensor,
                                TextPart what, TextPart suffix) {
  const Text tensorName = T({scopeDot_, tensor});
  return b_.Alloc(category, shape.Elements() * BytesPerElement(type), tensorName, ScopedLabel(what, suffix),
                  text().Shape(shape, type), layer_);
}

ValueId Tape::External(TensorHandle storage, Shape shape, DType type, TextPart name) {
  Value v;
  v.storage = b_.Retain(storage);
  v.shape = shape;
  v.type = type;
  v.name = TextOf(name);
  return NewValue(v);
}

ValueId Tape::Parameter(std::size_t index, Shape shape, DType type, Text name, bool requiresGrad) {
  Value v;
  v.name = name;
  v.shape = shape;
  v.type = type;
  v.requiresGrad = requiresGrad;
  v.parameter = static_cast<int>(index);
  const ValueId id = NewValue(v);
  if (leafLog_ != nullptr) leafLog_->push_back({static_cast<int>(index), id});
  return id;
}

ValueId Tape::Fresh(Shape shape, DType type, TextPart name, Category category) {
  Value v;
  v.name = TextOf(name);
  // (After a non-reentrant recompute's early stop nothing runs.)
  v.storage = stopped_ ? kNoTensor : AllocStorage(shape, type, category, v.name, v.name);
  v.shape = shape;
  v.type = type;
  return NewValue(v);
}

ValueId Tape::Keep(ValueId v) {
  if (v != kNoValue) b_.Retain(values_[static_cast<std::size_t>(v)].storage);
  return v;
}

void Tape::Drop(ValueId v) {
  if (v == kNoValue) return;
  const Value& value = values_[static_cast<std::size_t>(v)];
  ReleaseWith(value.storage, [&] { return ScopedLabel(value.name, " no longer referenced"); });
}

bool Tape::NeedsGrad(const In& in) const {
  return in.rule != In::NoGrad && in.value != kNoValue && values_[static_cast<std::size_t>(in.value)].requiresGrad;
}

bool Tape::SacSaves(OpSpec::Sac kind) {
  if (kind == OpSpec::Sac::None || (!sacCollect_ && sacReplay_ == nullptr)) return false;
  // _custom_policy: mm counted per mode (forward / recompute); every second one recomputed.
  if (kind == OpSpec::Sac::Mm) return ++sacMmCount_ % 2 == 1;
  return true;
}

// Whether an op's node keeps any tensor (its inputs, its output, tensors made beside it): what
// a non-reentrant checkpoint's pack hook sees and its recompute counts.
static bool SavesAnything(const Tape::OpSpec& spec) {
  return !spec.saves.empty() || spec.savesOutput || !spec.saveNew.empty();
}

ValueId Tape::Apply(const OpSpec& spec) {
  bool grad = false;
  for (const In& in : spec.inputs) grad = grad || NeedsGrad(in);
  grad = grad && recording_;

  Value out;
  out.shape = spec.shape;
  out.type = spec.type;
  out.name = TextOf(spec.name);
  out.requiresGrad = grad;
  const bool sacSaved = spec.viewOf == kNoValue && SacSaves(spec.sac);
  // The recompute of an op-level selective checkpoint takes the kept output (and the tensors
  // made beside it) back instead of computing them.
  const bool sacTaken = sacSaved && sacReplay_ != nullptr && sacNext_ + 1 + spec.saveNew.size() <= sacReplay_->size();
  // A non-reentrant checkpoint's recompute with early stop: the op that saves the forward's
  // last saved tensors is the last to run, and runs only if it saves one of its own outputs
  // (packed after it runs; its inputs are packed before). The ops after it do not run: their
  // values have no storage, their nodes are recorded for the backward.
  bool runs = true;
  if (stopAt_ >= 0) {
    const bool saving = grad && SavesAnything(spec);
    if (stopped_) {
      runs = false;
    } else if (saving && ++savingOps_ == stopAt_) {
      stopped_ = true;
      runs = spec.savesOutput || !spec.saveNew.empty();
    }
  }
  const bool saved = grad && !packing_;  // a non-reentrant checkpoint's forward keeps none
  if (spec.viewOf != kNoValue) {
    out.storage = b_.Retain(values_[static_cast<std::size_t>(spec.viewOf)].storage);
  } else if (!runs) {
    out.storage = kNoTensor;
  } else if (sacTaken) {
    out.storage = (*sacReplay_)[sacNext_++];
  } else {
    out.storage = AllocStorage(spec.shape, spec.type, Category::Activations, out.name, out.name,
                               saved && spec.savesOutput ? TextPart(" (saved)") : TextPart(""));
  }
  // Tensors the op makes beside its output (dropout's mask, norm statistics): kept by the
  // node when recording, freed at once otherwise.
  SmallVec<TensorHandle, 2> made;
  for (const BackwardTemp& t : spec.saveNew) {
    if (!runs) break;
    if (sacTaken) {
      made.push_back((*sacReplay_)[sacNext_++]);
      continue;
    }
    const TextPart name = TextPart::View(t.name);
    made.push_back(AllocStorage(t.shape, t.type, Category::Activations, T({out.name, " ", name}),
                                T({out.name, ": ", name}), saved ? TextPart(" (saved)") : TextPart("")));
  }
  if (sacSaved && sacCollect_ && (!recording_ || packing_)) {
    // MUST_SAVE: the checkpoint keeps the op's outputs (all of them: SDPA's logsumexp too).
    sacBuilding_.push_back(b_.Retain(out.storage));
    for (TensorHandle h : made) sacBuilding_.push_back(b_.Retain(h));
  }
  const ValueId id = NewValue(out);
  if (!saved) {
    for (TensorHandle h : made) {
      ReleaseWith(h, [&] {
        return T({scope_, ": ", out.name, packing_ ? TextPart(" packed by the checkpoint, not kept") : TextPart(" not needed without autograd")});
      });
    }
    if (!grad) return id;
  }
  Node& node = nodes_.emplace_back();
  node.label = T({scopeSpace_, out.name, " backward"});
  node.layer = layer_;
  node.inputs = spec.inputs;
  node.outputs.push_back(id);
  if (packing_) {
    // _checkpoint_hook's pack: a holder in place of each saved tensor. The node is dropped when
    // the checkpoint's forward ends; the count tells the recompute where to stop.
    if (SavesAnything(spec)) ++packedOps_;
    values_[static_cast<std::size_t>(id)].producer = static_cast<int>(nodes_.size() - 1);
    return id;
  }
  for (ValueId s : spec.saves) node.saved.push_back(b_.Retain(values_[static_cast<std::size_t>(s)].storage));
  if (spec.savesOutput) node.saved.push_back(b_.Retain(values_[static_cast<std::size_t>(id)].storage));
  for (TensorHandle h : made) node.saved.push_back(h);
  if (offload_ && offload_->active()) {
    SmallVec<std::int64_t, 6> bytes;
    SmallVec<bool, 6> parameter;
    SmallVec<Text, 6> names;
    auto slot = [&](ValueId v) {
      const Value& value = values_[static_cast<std::size_t>(v)];
      bytes.push_back(value.shape.Elements() * BytesPerElement(value.type));
      parameter.push_back(value.parameter >= 0);
      names.push_back(value.name);
    };
    for (ValueId s : spec.saves) slot(s);
    if (spec.savesOutput) slot(id);
    for (const BackwardTemp& t : spec.saveNew) {
      bytes.push_back(t.shape.Elements() * BytesPerElement(t.type));
      parameter.push_back(false);
      names.push_back(T({out.name, " ", TextPart::View(t.name)}));
    }
    PackSaved(node, bytes, parameter, names);
  }
  if (!spec.backwardTemps.empty()) {
    node.temps = static_cast<int>(temps_.size());
    temps_.push_back(spec.backwardTemps);
  }
  values_[static_cast<std::size_t>(id)].producer = static_cast<int>(nodes_.size() - 1);
  return id;
}

ValueId Tape::ApplyPrecomputed(const OpSpec& spec, const SmallVec<ValueId, 4>& gradients) {
  const std::size_t before = nodes_.size();
  const ValueId id = Apply(spec);
  // No autograd node (or one a non-reentrant checkpoint's forward drops): the caller's tensors just go.
  if (nodes_.size() == before || packing_) return id;
  SmallVec<TensorHandle, 4> held;
  for (int i = 0; i < spec.inputs.size(); ++i) {
    const ValueId g = i < gradients.size() ? gradients[i] : kNoValue;
    held.push_back(g != kNoValue && NeedsGrad(spec.inputs[i]) ? b_.Retain(values_[static_cast<std::size_t>(g)].storage)
                                                                : kNoTensor);
  }
  nodes_.back().precomputed = static_cast<int>(precomputed_.size());
  precomputed_.push_back(held);
  return id;
}

SmallVec<ValueId, 4> Tape::Split(TextPart name, ValueId input, std::initializer_list<Shape> shapes) {
  const bool grad = recording_ && values_[static_cast<std::size_t>(input)].requiresGrad;
  const Text base = T({name});
  SmallVec<ValueId, 4> outs;
  int i = 0;
  for (const Shape& shape : shapes) {
    Value v;
    v.storage = b_.Retain(values_[static_cast<std::size_t>(input)].storage);
    v.shape = shape;
    v.type = values_[static_cast<std::size_t>(input)].type;
    v.name = T({base, "[", TextPart::Int(i++), "]"});
    v.requiresGrad = grad;
    outs.push_back(NewValue(v));
  }
  if (grad) {
    Node node;
    node.label = T({scope_, " ", base, " backward"});
    node.layer = layer_;
    node.inputs = {{input, In::Compute}};
    for (ValueId v : outs) node.outputs.push_back(v);
    nodes_.push_back(node);
    for (ValueId v : outs) values_[static_cast<std::size_t>(v)].producer = static_cast<int>(nodes_.size() - 1);
  }
  return outs;
}

SmallVec<ValueId, 8> Tape::Chunk(TextPart name, ValueId input, std::int64_t chunks, int dim) {
  const Shape whole = values_[static_cast<std::size_t>(input)].shape;
  const std::int64_t size = whole[dim];
  const std::int64_t each = (size + chunks - 1) / chunks;  // torch.chunk: ceil(size / chunks)
  const bool grad = recording_ && values_[static_cast<std::size_t>(input)].requiresGrad;
  const Text base = T({name});
  SmallVec<ValueId, 8> outs;
  for (std::int64_t start = 0, i = 0; start < size && i < 8; start += each, ++i) {
    Value v;
    v.storage = b_.Retain(values_[static_cast<std::size_t>(input)].storage);
    v.shape = whole;
    v.shape.dims[dim] = std::min(each, size - start);
    v.type = values_[static_cast<std::size_t>(input)].type;
    v.name = T({base, "[", TextPart::Int(i), "]"});
    v.requiresGrad = grad;
    outs.push_back(NewValue(v));
  }
  if (grad) {
    Node node;
    node.label = T({scope_, " ", base, " backward"});
    node.layer = layer_;
    node.inputs = {{input, In::Compute}};
    node.outputs = outs;
    nodes_.push_back(node);
    for (ValueId v : outs) values_[static_cast<std::size_t>(v)].producer = static_cast<int>(nodes_.size() - 1);
  }
  return outs;
}

ValueId Tape::ForMatmul(ValueId v) {
  const Value& value = values_[static_cast<std::size_t>(v)];
  if (!autocast_ || value.type == compute_ || value.type == DType::Int64) return Keep(v);
  // autocast caches the cast of a leaf that requires grad only (autocast_mode.cpp
  // cached_cast: arg.requires_grad() && arg.is_leaf()); a frozen weight is cast at every use,
  // its copy freed after the op unless the op saves it.
  if (value.parameter >= 0 && value.requiresGrad) {
    const auto index = static_cast<std::size_t>(value.parameter);
    CastCache& c = cache();
    if (c.byParameter[index] != kNoValue) return Keep(c.byParameter[index]);
    // The copy autocast caches for the rest of the forward; a WeightCopies tensor.
    Value copy;
    copy.shape = value.shape;
    copy.type = compute_;
    copy.name = T({value.name, " (16-bit copy)"});
    copy.storage = b_.Alloc(Category::WeightCopies, value.shape.Elements() * BytesPerElement(compute_),
                            copy.name, T({scope_, ": autocast copies ", value.name, " to 16-bit (cached)"}),
                            text().Shape(value.shape, compute_), layer_);
    const bool grad = recording_;
    copy.requiresGrad = grad;
    const ValueId id = NewValue(copy);
    if (grad) {
      Node node;
      node.label = T({scope_, " weight cast backward"});
      node.layer = layer_;
      node.inputs = {{v, In::Compute}};
      node.outputs.push_back(id);
      nodes_.push_back(node);
      values_[static_cast<std::size_t>(id)].producer = static_cast<int>(nodes_.size() - 1);
    }
    c.byParameter[index] = id;
    c.cached.push_back(static_cast<int>(index));
    return Keep(id);
  }
  static constexpr const char* kTo[] = {"to(fp32)", "to(fp16)", "to(bf16)", "to(int64)", "to(bool)"};
  const Tape::OpSpec cast{.name = TextPart::View(kTo[static_cast<int>(compute_)]),
                          .inputs = {{v, In::Compute}},
                          .shape = value.shape,
                          .type = compute_};
  // The same rule for a reentrant recompute's detached fp32 input (cached_cast: a float leaf
  // that requires grad): BERT's query, key and value read one cached copy of the block's input
  // there, where the checkpointed forward (no grad, no leaf) casts it for each. Measured on CPU
  // torch, bert-cls-ckpt-ampbf16: one 16-bit copy in each block's recompute.
  CastCache& c = cache();
  for (std::size_t i = 0; i < c.leafInputs.size(); ++i) {
    if (c.leafInputs[i] != v || value.type != DType::FP32) continue;
    if (c.leafCopies[i] == kNoValue) c.leafCopies[i] = Apply(cast);
    return Keep(c.leafCopies[i]);
  }
  return Apply(cast);
}

void Tape::EndAutocast() {
  CastCache& c = cache();
  for (ValueId copy : c.leafCopies) Drop(copy);  // (kNoValue: never made)
  c.leafInputs.clear();
  c.leafCopies.clear();
  // In parameter order, as the map this replaces iterated.
  std::sort(c.cached.begin(), c.cached.end());
  for (int index : c.cached) {
    const ValueId value = c.byParameter[static_cast<std::size_t>(index)];
    c.byParameter[static_cast<std::size_t>(index)] = kNoValue;
    Drop(value);
  }
  c.cached.clear();
}

Tape::Values Tape::PlainBlock(int layer, const Values& inputs, const Block& block) {
  // As Checkpoint's forward templates, and only in a recorded forward (not inside a
  // checkpointed block, a recompute or a backward).
  const bool copyable = recording_ && !inBackward_ && !sacCollect_ && sacReplay_ == nullptr && BlockTemplatesOn() &&
                        inventory_ != nullptr && leaves_ != nullptr && offload_ == nullptr && layerHook_ == nullptr &&
                        cacheDepth_ == 0 && layer >= 0 && !plainForwardsOff_;
  return copyable ? RunForwardSpan(inputs, block, layer) : block(*this, inputs);
}

Tape::Values Tape::Checkpoint(TextPart name, const Values& inputs, Block block, bool selectiveOps) {
  const bool outer = recording_;
  // use_reentrant=False: grad mode stays on and the saved tensors are packed (Apply).
  const bool nonReentrant = outer && !reentrant_;
  const std::size_t nodesBefore = nodes_.size();
  const auto valuesBefore = static_cast<ValueId>(values_.size());
  if (nonReentrant) {
    packing_ = true;
    packedOps_ = 0;
  } else {
    recording_ = false;
  }
  sacCollect_ = selectiveOps && outer;
  sacMmCount_ = 0;
  // Forward templates (tape_templates.cpp RunForwardSpan): only where nothing outside the tape
  // sees the block's forward (no sharding engine's layer hook), nothing is kept by the
  // checkpoint (no op-level selective policy), and not inside a recompute. A non-reentrant
  // forward's copy makes no nodes (they are dropped below) and counts its packs. Offloading's
  // pack hook sees none of the forward: a reentrant checkpoint's records nothing, a non-reentrant
  // one's ops are packed by the checkpoint's own hooks (the innermost; Apply returns before the
  // offloader's), and the checkpoint's saved inputs are packed below, after the span.
  const bool copyable = outer && !selectiveOps && BlockTemplatesOn() && inventory_ != nullptr &&
                        leaves_ != nullptr && layerHook_ == nullptr && cacheDepth_ == 0;
  Values outs = copyable ? RunForwardSpan(inputs, block) : block(*this, inputs);
  sacCollect_ = false;
  std::vector<TensorHandle> kept;
  kept.swap(sacBuilding_);
  recording_ = outer;
  bool grad = false;
  int packedOps = -1;
  if (nonReentrant) {
    packing_ = false;
    packedOps = packedOps_;
    // The block's own nodes hold nothing; the checkpoint node below stands for them, and its
    // backward records them again. Autocast's cached weight copies made in the block outlive
    // it without that history, as in a reentrant checkpoint's forward.
    nodes_.resize(nodesBefore);
    for (int index : cache().cached) {
      const ValueId copy = cache().byParameter[static_cast<std::size_t>(index)];
      if (copy >= valuesBefore) {
        values_[static_cast<std::size_t>(copy)].producer = -1;
        values_[static_cast<std::size_t>(copy)].requiresGrad = false;
      }
    }
    // Gradients reach the block's parameters whether or not an input requires one.
    for (ValueId v : outs) {
      grad = grad || values_[static_cast<std::size_t>(v)].requiresGrad;
      values_[static_cast<std::size_t>(v)].producer = -1;  // its node is gone (set again below)
    }
  } else {
    for (ValueId v : inputs) grad = grad || values_[static_cast<std::size_t>(v)].requiresGrad;
  }
  if (!outer || !grad) {  // no backward will recompute the block: nothing to keep
    for (TensorHandle h : kept) ReleaseWith(h, [&] { return T({scope_, ": selective checkpoint output not needed"}); });
    return outs;
  }
  Node node;
  node.label = T({scope_, " ", name, " (checkpoint) backward"});
  node.layer = layer_;
  node.packedOps = packedOps;
  for (ValueId v : inputs) {
    node.saved.push_back(b_.Retain(values_[static_cast<std::size_t>(v)].storage));
    if (values_[static_cast<std::size_t>(v)].requiresGrad) node.inputs.push_back({v, In::Compute});
  }
  node.blockInputs = inputs;
  for (ValueId v : outs) node.outputs.push_back(v);
  if (offload_ && offload_->active()) {  // save_for_backward of the inputs runs under the hooks
    SmallVec<std::int64_t, 6> bytes;
    SmallVec<bool, 6> parameter;
    SmallVec<Text, 6> names;
    for (ValueId v : inputs) {
      const Value& value = values_[static_cast<std::size_t>(v)];
      bytes.push_back(value.shape.Elements() * BytesPerElement(value.type));
      parameter.push_back(value.parameter >= 0);
      names.push_back(value.name);
    }
    PackSaved(node, bytes, parameter, names);
  }
  blocks_.push_back(std::move(block));
  node.block = static_cast<int>(blocks_.size() - 1);
  if (sacKept_.size() < blocks_.size()) sacKept_.resize(blocks_.size());
  sacKept_.back() = std::move(kept);
  nodes_.push_back(node);
  for (ValueId v : outs) {
    values_[static_cast<std::size_t>(v)].requiresGrad = true;
    values_[static_cast<std::size_t>(v)].producer = static_cast<int>(nodes_.size() - 1);
  }
  return outs;
}

void Tape::Backward(ValueId loss, GradientSink& sink) {
  sink_ = &sink;
  const Text saved = scope_;
  SetScopeText(T({"loss.backward()"}));
  inBackward_ = true;
  if (layerHook_ && layer_ != -1) layerHook_->Enter(b_, -1, true);
  layer_ = -1;
  const DType type = values_[static_cast<std::size_t>(loss)].type;
  const TensorHandle seed = b_.Alloc(Category::ActivationGradients, BytesPerElement(type), T({"grad of loss"}),
                                     T({"loss.backward(): gradient of the loss (1.0)"}),
                                     text().Shape(Shape{1}, type));
  GradOf(loss) = seed;
  // How many gradients each parameter receives (a tied weight: two), so that a hook that needs
  // the complete gradient (the optimizer in backward) runs after the last. Parameters inside
  // checkpointed blocks are used by recomputed nodes made later: one each.
  std::vector<int> uses(parameterCount_, 0);
  for (const Node& node : nodes_) {
    for (const In& in : node.inputs) {
      const int parameter = values_[static_cast<std::size_t>(in.value)].parameter;
      if (parameter >= 0 && NeedsGrad(in)) ++uses[static_cast<std::size_t>(parameter)];
    }
  }
  for (std::size_t i = 0; i < uses.size(); ++i) if (uses[i] > 1) sink.Expect(i, uses[i]);
  // Block templates: only where nothing outside the tape and the sink sees a block's backward
  // but the activation offloader and the optimizer in backward, whose parts a copy redoes (no
  // layer hook of a sharding engine, no selective checkpoint).
  bool selective = false;
  for (const std::vector<TensorHandle>& kept : sacKept_) selective = selective || !kept.empty();
  templates_ = BlockTemplatesOn() && layerHook_ == nullptr && sink.CopiesAllowed() && cacheDepth_ == 0 && !selective;
  lowestCheckpoint_ = -1;
  lowestLayer_ = -1;
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    if (nodes_[n].block >= 0 && lowestCheckpoint_ < 0) lowestCheckpoint_ = static_cast<int>(n);
    if (nodes_[n].block < 0 && nodes_[n].layer >= 0 && (lowestLayer_ < 0 || nodes_[n].layer < lowestLayer_)) {
      lowestLayer_ = nodes_[n].layer;
    }
  }
  ForgetSpans();
  ForgetForwardSpans();  // a forward span is copied only right after the ones it was predicted from
  layerSignature_.clear();  // made when a first span is recorded (ComputeLayerSignatures)
  RunBackward(0, static_cast<int>(nodes_.size()));
  ForgetSpans();
  // What is still held (in value order, as the map this replaces iterated).
  const Text finished = T({"backward finished"});
  for (ValueId leaf : graphLeaves_) {  // each leaf's .grad stays until the graph goes
    TensorHandle& grad = GradOf(leaf);
    if (grad != kNoTensor) graphLeafGrads_.push_back(grad);
    grad = kNoTensor;
  }
  for (TensorHandle& grad : grads_) {
    if (grad == kNoTensor) continue;
    b_.Release(grad, finished);
    grad = kNoTensor;
  }
  if (offload_) offload_->EndBackward(finished);
  SetScopeText(saved);
  inBackward_ = false;
}

void Tape::RunBackward(int fromNode, int toNode) {
  // Spans are copied only in the outer backward (a recompute's own nodes are never checkpoints
  // of blocks), and only from spans that follow one another with nothing between (the spans of
  // a period's other places aside).
  const bool outer = fromNode == 0;
  // The blocks' period (ComputeLayerSignatures) decides which blocks are always simulated.
  if (outer && templates_ && layerSignature_.empty()) ComputeLayerSignatures();
  for (int n = toNode - 1; n >= fromNode; --n) {
    if (nodes_[static_cast<std::size_t>(n)].done) continue;
    const Node& node = nodes_[static_cast<std::size_t>(n)];
    if (node.block >= 0) {
      if (outer && templates_) RunCheckpointSpan(n);
      else RunCheckpoint(n);
    } else if (outer && templates_ && node.layer >= 0 && node.layer != lowestLayer_ &&
               (period_ == 1 || node.layer >= lowestLayer_ + period_)) {
      n = RunPlainSpan(n);  // the block's nodes down to its lowest
    } else {
      Execute(n);
      if (outer) ForgetSpans();
    }
  }
}

void Tape::Deliver(ValueId value, TensorHandle grad, Text label) {
  const Value& v = values_[static_cast<std::size_t>(value)];
  if (v.parameter >= 0) {
    // AccumulateGrad: the first gradient becomes .grad (the buffer is stolen, no copy), later
    // ones are added in place. The sink records .grad; this buffer then lets go.
    ReleaseWith(grad, [&] { return T({label, ": handed to .grad"}); });
    return;
  }
  TensorHandle& held = GradOf(value);
  if (held == kNoTensor) {
    held = grad;
    return;
  }
  // A value used twice (the residual stream): the engine's input buffer adds the second
  // gradient to the first — in place when the first is not shared, else into a new buffer.
  if (b_.Holders(held) == 1) {
    ReleaseWith(grad, [&] { return T({label, ": accumulated in place"}); });
  } else if (b_.Holders(grad) == 1) {
    ReleaseWith(held, [&] { return T({label, ": accumulated in place"}); });
    held = grad;
  } else {
    const TensorHandle sum = b_.Alloc(Category::ActivationGradients, v.shape.Elements() * BytesPerElement(v.type),
                                      T({v.name, " grad (sum)"}), T({label, ": gradients summed"}),
                                      text().Shape(v.shape, v.type), layer_);
    const Text summed = T({label, ": summed"});
    b_.Release(held, summed);
    b_.Release(grad, summed);
    held = sum;
  }
}

void Tape::Execute(int index) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  node.done = true;
  bool any = false;
  for (ValueId o : node.outputs) any = any || GradOf(o) != kNoTensor;
  const Text label = node.label;
  if (layerHook_ && node.layer != layer_) layerHook_->Enter(b_, node.layer, true);
  layer_ = node.layer;
  const bool unpacks = any && offload_ && node.packed >= 0;
  if (unpacks) UnpackSaved(node);
  if (any) {
    SmallVec<TensorHandle, 4> temps;
    static const BackwardTemps kNone{};
    const BackwardTemps& specs = node.temps >= 0 ? temps_[static_cast<std::size_t>(node.temps)] : kNone;
    auto make = [&](const BackwardTemp& t) {
      const TextPart name = TextPart::View(t.name);
      return b_.Alloc(Category::ActivationGradients, t.shape.Elements() * BytesPerElement(t.type), T({name}),
                      T({label, ": ", name}), text().Shape(t.shape, t.type), layer_);
    };
    for (const BackwardTemp& t : specs) temps.push_back(t.afterGradients ? kNoTensor : make(t));
    for (int k = 0; k < specs.size(); ++k) {
      if (!specs[k].beforeGradients) continue;
      ReleaseWith(temps[k], [&] { return T({label, ": temporary freed"}); });
      temps[k] = kNoTensor;
    }
    for (int i = 0; i < node.inputs.size(); ++i) {
      const In& in = node.inputs[i];
      if (!NeedsGrad(in)) continue;
      const Value& v = values_[static_cast<std::size_t>(in.value)];
      if (node.precomputed >= 0) {  // made in forward (ApplyPrecomputed): handed over as it is
        TensorHandle& made = precomputed_[static_cast<std::size_t>(node.precomputed)][i];
        if (made != kNoTensor) {
          if (v.parameter >= 0) sink_->Adopt(static_cast<std::size_t>(v.parameter), made, label);
          else Deliver(in.value, made, label);
          made = kNoTensor;
          continue;
        }
      }
      if (v.parameter >= 0) {
        sink_->Produce(static_cast<std::size_t>(v.parameter), label);
        continue;
      }
      TensorHandle g = kNoTensor;
      const ValueId first = node.outputs.front();
      const TensorHandle out = GradOf(first);
      if (in.rule == In::PassThrough && out != kNoTensor && values_[static_cast<std::size_t>(first)].type == v.type) {
        g = b_.Retain(out);
      } else {
        g = b_.Alloc(Category::ActivationGradients, v.shape.Elements() * BytesPerElement(v.type),
                     T({"grad of ", v.name}), T({label, ": gradient of ", v.name}),
                     text().Shape(v.shape, v.type), layer_);
      }
      Deliver(in.value, g, label);
    }
    for (int k = 0; k < specs.size(); ++k) {
      if (specs[k].afterGradients) temps[k] = make(specs[k]);
    }
    for (TensorHandle t : temps) {
      if (t != kNoTensor) ReleaseWith(t, [&] { return T({label, ": temporary freed"}); });
    }
  }
  if (unpacks) offload_->AfterOp(label);  // the node's post-hook
  Node& done = nodes_[static_cast<std::size_t>(index)];
  if (done.precomputed >= 0) {  // gradients made in forward that no input took
    for (TensorHandle& made : precomputed_[static_cast<std::size_t>(done.precomputed)]) {
      if (made != kNoTensor) ReleaseWith(made, [&] { return T({label, ": precomputed gradient not needed"}); });
      made = kNoTensor;
    }
  }
  Text savedFreed;  // one label for every saved tensor this node frees, made on the first
  for (TensorHandle s : done.saved) {
    ReleaseWith(s, [&] {
      if (savedFreed.empty()) savedFreed = T({label, ": saved tensor freed"});
      return savedFreed;
    });
  }
  done.saved.clear();
  for (ValueId o : done.outputs) {
    TensorHandle& g = GradOf(o);
    if (g != kNoTensor) {
      ReleaseWith(g, [&] { return T({label, ": incoming gradient consumed"}); });
      g = kNoTensor;
    }
  }
  // The parameters' AccumulateGrad nodes run after this node is done (its saved tensors and
  // incoming gradient gone): their hooks (the optimizer in backward) run now.
  sink_->RunReady();
}

void Tape::RunCheckpoint(int index) {
  nodes_[static_cast<std::size_t>(index)].done = true;
  const Node node = nodes_[static_cast<std::size_t>(index)];  // copy: nodes_ grows below
  bool any = false;
  for (ValueId o : node.outputs) any = any || GradOf(o) != kNoTensor;
  const Text label = node.label;
  if (layerHook_ && node.layer != layer_) layerHook_->Enter(b_, node.layer, true);
  layer_ = node.layer;
  const bool unpacks = any && offload_ && node.packed >= 0;
  if (any) {
    // ctx.saved_tensors: brought back from host where they were offloaded.
    const SmallVec<TensorHandle, 6> unpacked = unpacks ? UnpackSaved(node) : SmallVec<TensorHandle, 6>{};
    // Detached copies of the inputs (same storage) as leaves, then the block again, recorded.
    Values detached;
    for (int i = 0; i < node.blockInputs.size(); ++i) {
      const ValueId v = node.blockInputs[i];
      Value d = values_[static_cast<std::size_t>(v)];
      d.storage = b_.Retain(unpacks && unpacked[i] != kNoTensor ? unpacked[i] : d.storage);
      d.producer = -1;
      d.parameter = -1;
      detached.push_back(NewValue(d));
    }
    const Text scope = scope_;
    SetScopeText(T({label, " recompute"}));
    const int start = static_cast<int>(nodes_.size());
    // The recompute's own autocast cache (a fresh one, as the block runs in a new context).
    ++cacheDepth_;
    if (caches_.size() <= static_cast<std::size_t>(cacheDepth_)) caches_.emplace_back();
    if (autocast_) cache().byParameter.assign(parameterCount_, kNoValue);
    if (autocast_ && node.packedOps < 0) {  // reentrant: torch.utils.checkpoint's detach_variable leaves
      for (ValueId d : detached) {
        if (!values_[static_cast<std::size_t>(d)].requiresGrad) continue;
        cache().leafInputs.push_back(d);
        cache().leafCopies.push_back(kNoValue);
      }
    }
    const bool replays = static_cast<std::size_t>(node.block) < sacKept_.size() &&
                         !sacKept_[static_cast<std::size_t>(node.block)].empty();
    if (replays) {
      sacReplay_ = &sacKept_[static_cast<std::size_t>(node.block)];
      sacNext_ = 0;
      sacMmCount_ = 0;
    }
    const bool nonReentrant = node.packedOps >= 0;
    if (nonReentrant && earlyStop_) {
      stopAt_ = node.packedOps;
      savingOps_ = 0;
      stopped_ = false;
    }
    Values outs = blocks_[static_cast<std::size_t>(node.block)](*this, detached);
    stopAt_ = -1;
    stopped_ = false;
    // Kept outputs the recompute did not take back (none when the policy ran the same ops; the
    // ops after an early stop's last one). A non-reentrant checkpoint's SAC storage lives in its
    // frame's recompute context, which the block's saved-tensor holders keep to the end of the
    // block's backward.
    std::vector<TensorHandle> untaken;
    if (replays) {
      untaken.assign(sacReplay_->begin() + static_cast<std::ptrdiff_t>(sacNext_), sacReplay_->end());
      sacKept_[static_cast<std::size_t>(node.block)].clear();
      sacReplay_ = nullptr;
    }
    auto releaseUntaken = [&] {
      for (TensorHandle h : untaken) ReleaseWith(h, [&] { return T({label, ": selective checkpoint output freed"}); });
    };
    if (!nonReentrant) releaseUntaken();
    EndAutocast();  // the recompute's autocast context ends before its backward
    --cacheDepth_;
    // Reentrant: torch.autograd.backward(recomputed outputs, incoming gradients), inside
    // CheckpointFunction.backward, whose arguments hold the incoming gradients until it
    // returns. Non-reentrant: the block's own nodes take the gradients from the engine, and
    // recompute_fn's outputs were never kept.
    for (int i = 0; i < outs.size() && i < node.outputs.size(); ++i) {
      const TensorHandle incoming = GradOf(node.outputs[i]);
      if (incoming == kNoTensor) continue;
      GradOf(outs[i]) = nonReentrant ? incoming : b_.Retain(incoming);
      if (nonReentrant) GradOf(node.outputs[i]) = kNoTensor;
    }
    if (nonReentrant) {
      for (ValueId o : outs) Drop(o);
    }
    RunBackward(start, static_cast<int>(nodes_.size()));
    for (ValueId o : outs) {
      TensorHandle& g = GradOf(o);
      if (g != kNoTensor) {
        ReleaseWith(g, [&] { return T({label, ": gradient consumed"}); });
        g = kNoTensor;
      }
      if (!nonReentrant) Drop(o);
    }
    if (nonReentrant) releaseUntaken();
    nodes_.resize(static_cast<std::size_t>(start));
    SetScopeText(scope);
    // The detached leaves' gradients are the checkpoint's input gradients.
    for (int i = 0; i < detached.size(); ++i) {
      TensorHandle& slot = GradOf(detached[i]);
      const ValueId original = node.blockInputs[i];
      if (slot != kNoTensor) {
        const TensorHandle g = slot;
        slot = kNoTensor;
        if (values_[static_cast<std::size_t>(original)].requiresGrad) Deliver(original, g, label);
        else ReleaseWith(g, [&] { return T({label, ": gradient not needed"}); });
      }
      Drop(detached[i]);
    }
  }
  if (unpacks) offload_->AfterOp(label);  // the checkpoint node's post-hook
  Node& stored = nodes_[static_cast<std::size_t>(index)];
  for (TensorHandle s : stored.saved) ReleaseWith(s, [&] { return T({label, ": saved input freed"}); });
  stored.saved.clear();
  for (ValueId o : node.outputs) {
    TensorHandle& g = GradOf(o);
    if (g != kNoTensor) {
      ReleaseWith(g, [&] { return T({label, ": incoming gradient consumed"}); });
      g = kNoTensor;
    }
  }
}

void Tape::ReleaseGraph() {
  const Text gone = T({"the loss let go: its graph's AccumulateGrad nodes free their leaves"});
  for (TensorHandle h : graphLeafGrads_) b_.Release(h, gone);
  for (TensorHandle h : graphLeafStorage_) b_.Release(h, gone);
  graphLeafGrads_.clear();
  graphLeafStorage_.clear();
  graphLeaves_.clear();
}

void Tape::PackSaved(Node& node, const SmallVec<std::int64_t, 6>& bytes, const SmallVec<bool, 6>& parameter,
                     const SmallVec<Text, 6>& names) {
  SmallVec<int, 6> ids;
  bool any = false;
  for (int i = 0; i < node.saved.size(); ++i) {
    const int id = offload_->Pack(node.saved[i], bytes[i], parameter[i], names[i]);
    ids.push_back(id);
    if (id >= 0) {
      node.saved[i] = kNoTensor;  // the reference is the forward stash's now
      any = true;
    }
  }
  if (!any) return;
  node.packed = static_cast<int>(packed_.size());
  packed_.push_back(ids);
}

SmallVec<TensorHandle, 6> Tape::UnpackSaved(const Node& node) {
  SmallVec<TensorHandle, 6> out;
  offload_->BeginOp();
  for (int id : packed_[static_cast<std::size_t>(node.packed)]) {
    out.push_back(id >= 0 ? offload_->Unpack(id, node.label, node.layer) : kNoTensor);
  }
  return out;
}

}  // namespace gpumem
