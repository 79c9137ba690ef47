// The autograd model: values, nodes, backward, checkpointing, autocast's weight-copy cache.
#include "sim/tape.hpp"

#include "gpumem/format.hpp"

namespace gpumem {

std::string TensorFormula(const std::vector<std::int64_t>& shape, DType type) {
  return ShapeFormula(shape, type);
}

DType Promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Int64 || a == DType::Bool) return b;
  if (b == DType::Int64 || b == DType::Bool) return a;
  return DType::FP32;  // fp32 with anything, or fp16 with bf16
}

namespace {
std::int64_t Product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}
}  // namespace

Tape::Tape(TraceBuilder& builder, DType computeType, bool autocast)
    : b_(builder), compute_(computeType), autocast_(autocast) {}

std::int64_t Tape::Elements(ValueId v) const { return Product(values_[v].shape); }

ValueId Tape::NewValue(Value v) {
  values_.push_back(std::move(v));
  return static_cast<ValueId>(values_.size() - 1);
}

TensorHandle Tape::AllocStorage(const std::vector<std::int64_t>& shape, DType type,
                                Category category, const std::string& tensor,
                                const std::string& what) {
  const std::string prefix = scope_.empty() ? "" : scope_ + ": ";
  return b_.Alloc(category, Product(shape) * BytesPerElement(type),
                  scope_.empty() ? tensor : scope_ + "." + tensor, prefix + what,
                  TensorFormula(shape, type), layer_);
}

ValueId Tape::External(TensorHandle storage, std::vector<std::int64_t> shape, DType type,
                       std::string name) {
  Value v;
  v.storage = b_.Retain(storage);
  v.shape = std::move(shape);
  v.type = type;
  v.name = std::move(name);
  return NewValue(std::move(v));
}

ValueId Tape::Parameter(std::size_t index, std::vector<std::int64_t> shape, DType type,
                       std::string name) {
  Value v;
  v.name = std::move(name);
  v.shape = std::move(shape);
  v.type = type;
  v.requiresGrad = true;
  v.parameter = static_cast<int>(index);
  return NewValue(std::move(v));
}

ValueId Tape::Fresh(std::vector<std::int64_t> shape, DType type, const std::string& name,
                    Category category) {
  Value v;
  v.storage = AllocStorage(shape, type, category, name, name);
  v.shape = std::move(shape);
  v.type = type;
  v.name = name;
  return NewValue(std::move(v));
}

ValueId Tape::Keep(ValueId v) {
  if (v != kNoValue) b_.Retain(values_[v].storage);
  return v;
}

void Tape::Drop(ValueId v) {
  if (v == kNoValue) return;
  const std::string prefix = scope_.empty() ? "" : scope_ + ": ";
  b_.Release(values_[v].storage, prefix + values_[v].name + " no longer referenced");
}

bool Tape::NeedsGrad(const In& in) const {
  return in.rule != In::NoGrad && in.value != kNoValue && values_[in.value].requiresGrad;
}

ValueId Tape::Apply(const OpSpec& spec) {
  bool grad = false;
  for (const In& in : spec.inputs) grad = grad || NeedsGrad(in);
  grad = grad && recording_;

  Value out;
  out.shape = spec.shape;
  out.type = spec.type;
  out.name = spec.name;
  out.requiresGrad = grad;
  if (spec.viewOf != kNoValue) {
    out.storage = b_.Retain(values_[spec.viewOf].storage);
  } else {
    out.storage = AllocStorage(spec.shape, spec.type, Category::Activations, spec.name,
                               spec.name + (grad && spec.savesOutput ? " (saved)" : ""));
  }
  // Tensors the op makes beside its output (dropout's mask, norm statistics): kept by the
  // node when recording, freed at once otherwise.
  std::vector<TensorHandle> made;
  for (const BackwardTemp& t : spec.saveNew) {
    made.push_back(AllocStorage(t.shape, t.type, Category::Activations, spec.name + " " + t.name,
                                spec.name + ": " + t.name + (grad ? " (saved)" : "")));
  }
  const ValueId id = NewValue(std::move(out));
  if (!grad) {
    for (TensorHandle h : made) b_.Release(h, scope_ + ": " + spec.name + " not needed without autograd");
    return id;
  }
  Node node;
  node.label = (scope_.empty() ? "" : scope_ + " ") + spec.name + " backward";
  node.layer = layer_;
  node.inputs = spec.inputs;
  node.outputs = {id};
  for (ValueId s : spec.saves) node.saved.push_back(b_.Retain(values_[s].storage));
  if (spec.savesOutput) node.saved.push_back(b_.Retain(values_[id].storage));
  for (TensorHandle h : made) node.saved.push_back(h);
  node.temps = spec.backwardTemps;
  nodes_.push_back(std::move(node));
  values_[id].producer = static_cast<int>(nodes_.size() - 1);
  return id;
}

std::vector<ValueId> Tape::Split(const std::string& name, ValueId input,
                                 const std::vector<std::vector<std::int64_t>>& shapes) {
  const bool grad = recording_ && values_[input].requiresGrad;
  std::vector<ValueId> outs;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    Value v;
    v.storage = b_.Retain(values_[input].storage);
    v.shape = shapes[i];
    v.type = values_[input].type;
    v.name = name + "[" + std::to_string(i) + "]";
    v.requiresGrad = grad;
    outs.push_back(NewValue(std::move(v)));
  }
  if (grad) {
    Node node;
    node.label = scope_ + " " + name + " backward";
    node.layer = layer_;
    node.inputs = {{input, In::Compute}};
    node.outputs = outs;
    nodes_.push_back(std::move(node));
    for (ValueId v : outs) values_[v].producer = static_cast<int>(nodes_.size() - 1);
  }
  return outs;
}

ValueId Tape::ForMatmul(ValueId v) {
  const Value& value = values_[v];
  if (!autocast_ || value.type == compute_ || value.type == DType::Int64) return Keep(v);
  if (value.parameter >= 0) {
    const auto index = static_cast<std::size_t>(value.parameter);
    if (auto it = castCache_.find(index); it != castCache_.end()) return Keep(it->second);
    // The copy autocast caches for the rest of the forward; a WeightCopies tensor.
    Value copy;
    copy.shape = value.shape;
    copy.type = compute_;
    copy.name = value.name + " (16-bit copy)";
    copy.storage = b_.Alloc(Category::WeightCopies, Product(value.shape) * BytesPerElement(compute_),
                            copy.name, scope_ + ": autocast copies " + value.name + " to 16-bit (cached)",
                            TensorFormula(value.shape, compute_), layer_);
    const bool grad = recording_;
    copy.requiresGrad = grad;
    const ValueId id = NewValue(std::move(copy));
    if (grad) {
      Node node;
      node.label = scope_ + " weight cast backward";
      node.layer = layer_;
      node.inputs = {{v, In::Compute}};
      node.outputs = {id};
      nodes_.push_back(std::move(node));
      values_[id].producer = static_cast<int>(nodes_.size() - 1);
    }
    castCache_[index] = id;
    return Keep(id);
  }
  return Apply({.name = "to(" + std::string(DTypeId(compute_)) + ")",
                .inputs = {{v, In::Compute}},
                .shape = value.shape,
                .type = compute_});
}

void Tape::EndAutocast() {
  for (auto& [index, value] : castCache_) Drop(value);
  castCache_.clear();
}

std::vector<ValueId> Tape::Checkpoint(const std::string& name, const std::vector<ValueId>& inputs,
                                      Block block) {
  const bool outer = recording_;
  recording_ = false;
  std::vector<ValueId> outs = block(*this, inputs);
  recording_ = outer;
  if (!outer) return outs;
  bool grad = false;
  for (ValueId v : inputs) grad = grad || values_[v].requiresGrad;
  if (!grad) return outs;
  Node node;
  node.label = scope_ + " " + name + " (checkpoint) backward";
  node.layer = layer_;
  for (ValueId v : inputs) {
    node.saved.push_back(b_.Retain(values_[v].storage));
    if (values_[v].requiresGrad) node.inputs.push_back({v, In::Compute});
  }
  node.blockInputs = inputs;
  node.outputs = outs;
  blocks_.push_back(std::move(block));
  node.block = static_cast<int>(blocks_.size() - 1);
  nodes_.push_back(std::move(node));
  for (ValueId v : outs) {
    values_[v].requiresGrad = true;
    values_[v].producer = static_cast<int>(nodes_.size() - 1);
  }
  return outs;
}

void Tape::Backward(ValueId loss, GradientSink& sink) {
  sink_ = &sink;
  const std::string saved = scope_;
  scope_ = "loss.backward()";
  layer_ = -1;
  const TensorHandle seed = b_.Alloc(Category::ActivationGradients, BytesPerElement(values_[loss].type),
                                     "grad of loss", "loss.backward(): gradient of the loss (1.0)",
                                     TensorFormula({1}, values_[loss].type));
  grads_[loss] = seed;
  RunBackward(0, static_cast<int>(nodes_.size()));
  for (auto& [value, grad] : grads_) b_.Release(grad, "backward finished");
  grads_.clear();
  scope_ = saved;
}

void Tape::RunBackward(int fromNode, int toNode) {
  for (int n = toNode - 1; n >= fromNode; --n) {
    if (nodes_[static_cast<std::size_t>(n)].done) continue;
    if (nodes_[static_cast<std::size_t>(n)].block >= 0) RunCheckpoint(n);
    else Execute(n);
  }
}

void Tape::Deliver(ValueId value, TensorHandle grad, const std::string& label) {
  const Value& v = values_[value];
  if (v.parameter >= 0) {
    // AccumulateGrad: the first gradient becomes .grad (the buffer is stolen, no copy), later
    // ones are added in place. The sink records .grad; this buffer then lets go.
    b_.Release(grad, label + ": handed to .grad");
    return;
  }
  auto it = grads_.find(value);
  if (it == grads_.end()) {
    grads_[value] = grad;
    return;
  }
  // A value used twice (the residual stream): the engine's input buffer adds the second
  // gradient to the first — in place when the first is not shared, else into a new buffer.
  if (b_.Holders(it->second) == 1) {
    b_.Release(grad, label + ": accumulated in place");
  } else if (b_.Holders(grad) == 1) {
    b_.Release(it->second, label + ": accumulated in place");
    it->second = grad;
  } else {
    const TensorHandle sum = b_.Alloc(Category::ActivationGradients,
                                      Product(v.shape) * BytesPerElement(v.type),
                                      v.name + " grad (sum)", label + ": gradients summed",
                                      TensorFormula(v.shape, v.type), layer_);
    b_.Release(it->second, label + ": summed");
    b_.Release(grad, label + ": summed");
    it->second = sum;
  }
}

void Tape::Execute(int index) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  node.done = true;
  bool any = false;
  for (ValueId o : node.outputs) any = any || grads_.count(o) > 0;
  const std::string label = node.label;
  layer_ = node.layer;
  if (any) {
    std::vector<TensorHandle> temps;
    for (const BackwardTemp& t : node.temps) {
      temps.push_back(b_.Alloc(Category::ActivationGradients, Product(t.shape) * BytesPerElement(t.type),
                               t.name, label + ": " + t.name, TensorFormula(t.shape, t.type), layer_));
    }
    for (const In& in : node.inputs) {
      if (!NeedsGrad(in)) continue;
      const Value& v = values_[in.value];
      if (v.parameter >= 0) {
        sink_->Produce(static_cast<std::size_t>(v.parameter), label);
        continue;
      }
      TensorHandle g = kNoTensor;
      const auto out = grads_.find(node.outputs.front());
      if (in.rule == In::PassThrough && out != grads_.end() &&
          values_[node.outputs.front()].type == v.type) {
        g = b_.Retain(out->second);
      } else {
        g = b_.Alloc(Category::ActivationGradients, Product(v.shape) * BytesPerElement(v.type),
                     "grad of " + v.name, label + ": gradient of " + v.name,
                     TensorFormula(v.shape, v.type), layer_);
      }
      Deliver(in.value, g, label);
    }
    for (TensorHandle t : temps) b_.Release(t, label + ": temporary freed");
  }
  for (TensorHandle s : node.saved) b_.Release(s, label + ": saved tensor freed");
  node.saved.clear();
  for (ValueId o : node.outputs) {
    if (auto it = grads_.find(o); it != grads_.end()) {
      b_.Release(it->second, label + ": incoming gradient consumed");
      grads_.erase(it);
    }
  }
}

void Tape::RunCheckpoint(int index) {
  nodes_[static_cast<std::size_t>(index)].done = true;
  const Node node = nodes_[static_cast<std::size_t>(index)];  // copy: nodes_ grows below
  bool any = false;
  for (ValueId o : node.outputs) any = any || grads_.count(o) > 0;
  const std::string label = node.label;
  layer_ = node.layer;
  if (any) {
    // Detached copies of the inputs (same storage) as leaves, then the block again, recorded.
    std::vector<ValueId> detached;
    for (ValueId v : node.blockInputs) {
      Value d = values_[v];
      d.storage = b_.Retain(d.storage);
      d.producer = -1;
      d.parameter = -1;
      detached.push_back(NewValue(std::move(d)));
    }
    const std::string scope = scope_;
    scope_ = label + " recompute";
    const int start = static_cast<int>(nodes_.size());
    std::map<std::size_t, ValueId> outerCache;
    outerCache.swap(castCache_);
    std::vector<ValueId> outs = blocks_[static_cast<std::size_t>(node.block)](*this, detached);
    EndAutocast();  // the recompute's autocast context ends before its backward
    castCache_.swap(outerCache);
    // torch.autograd.backward(recomputed outputs, incoming gradients)
    for (std::size_t i = 0; i < outs.size() && i < node.outputs.size(); ++i) {
      if (auto it = grads_.find(node.outputs[i]); it != grads_.end()) {
        grads_[outs[i]] = b_.Retain(it->second);
      }
    }
    RunBackward(start, static_cast<int>(nodes_.size()));
    for (ValueId o : outs) {
      if (auto it = grads_.find(o); it != grads_.end()) {
        b_.Release(it->second, label + ": gradient consumed");
        grads_.erase(it);
      }
      Drop(o);
    }
    nodes_.resize(static_cast<std::size_t>(start));
    scope_ = scope;
    // The detached leaves' gradients are the checkpoint's input gradients.
    for (std::size_t i = 0; i < detached.size(); ++i) {
      auto it = grads_.find(detached[i]);
      const ValueId original = node.blockInputs[i];
      if (it != grads_.end()) {
        const TensorHandle g = it->second;
        grads_.erase(it);
        if (values_[original].requiresGrad) Deliver(original, g, label);
        else b_.Release(g, label + ": gradient not needed");
      }
      Drop(detached[i]);
    }
  }
  Node& stored = nodes_[static_cast<std::size_t>(index)];
  for (TensorHandle s : stored.saved) b_.Release(s, label + ": saved input freed");
  stored.saved.clear();
  for (ValueId o : node.outputs) {
    if (auto it = grads_.find(o); it != grads_.end()) {
      b_.Release(it->second, label + ": incoming gradient consumed");
      grads_.erase(it);
    }
  }
}

}  // namespace gpumem
