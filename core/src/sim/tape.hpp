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
// recording on and back-propagated on its own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sim/trace_builder.hpp"

namespace gpumem {

using ValueId = int;
constexpr ValueId kNoValue = -1;

// One input of an op, and how its gradient is made in backward.
struct In {
  ValueId value = kNoValue;
  enum Rule {
    Compute,      // a new gradient of the input's size and dtype is allocated (most ops)
    PassThrough,  // the output's gradient is the input's gradient (add, views, clone)
    NoGrad,       // no gradient flows (masks, indices, constants)
  } rule = Compute;
};

// A temporary of an op's backward, allocated when the node runs and freed when it ends.
struct BackwardTemp {
  std::vector<std::int64_t> shape;
  DType type = DType::FP32;
  std::string name;
};

class Tape {
 public:
  Tape(TraceBuilder& builder, DType computeType, bool autocast);

  // --- where events happen (labels and the timeline's layer) ---
  void SetScope(std::string scope, int layer) { scope_ = std::move(scope); layer_ = layer; }
  const std::string& scope() const { return scope_; }
  int layer() const { return layer_; }
  bool recording() const { return recording_; }

  // --- values ---
  // A tensor whose storage is owned elsewhere (the batch); no gradient.
  ValueId External(TensorHandle storage, std::vector<std::int64_t> shape, DType type, std::string name);
  // A parameter: a leaf whose gradient goes to the sink; its storage is the model's.
  ValueId Parameter(std::size_t inventoryIndex, std::vector<std::int64_t> shape, DType type,
                    std::string name);
  // A new tensor held once by the caller, with no autograd history (torch.zeros, a mask).
  ValueId Fresh(std::vector<std::int64_t> shape, DType type, const std::string& name,
                Category category = Category::Activations);
  ValueId Keep(ValueId v);  // one more Python reference to the same tensor
  void Drop(ValueId v);     // the caller's reference ends (no-op for kNoValue)
  DType TypeOf(ValueId v) const { return values_[v].type; }
  bool RequiresGrad(ValueId v) const { return v != kNoValue && values_[v].requiresGrad; }
  const std::vector<std::int64_t>& ShapeOf(ValueId v) const { return values_[v].shape; }
  std::int64_t Elements(ValueId v) const;

  // --- the one primitive: an op with an output that may save things for backward ---
  struct OpSpec {
    std::string name;                    // "q_proj", "softmax"
    std::vector<In> inputs;
    std::vector<std::int64_t> shape;     // output shape
    DType type = DType::FP32;            // output dtype
    std::vector<ValueId> saves;          // values whose storage the node keeps
    bool savesOutput = false;            // the node keeps its own output (softmax, tanh)
    std::vector<BackwardTemp> saveNew;   // extra tensors made and saved (dropout mask, stats)
    std::vector<BackwardTemp> backwardTemps;
    ValueId viewOf = kNoValue;           // output shares this value's storage (no allocation)
  };
  ValueId Apply(const OpSpec& spec);
  // An op with several outputs sharing one node (split): outputs are views of inputs[0].
  std::vector<ValueId> Split(const std::string& name, ValueId input,
                             const std::vector<std::vector<std::int64_t>>& shapes);

  // --- autocast ---
  bool autocast() const { return autocast_; }
  DType computeType() const { return compute_; }
  // The value an autocast matmul reads: itself when already 16-bit (or autocast is off), else
  // a 16-bit copy; parameters' copies are cached until EndAutocast() (once per forward).
  ValueId ForMatmul(ValueId v);
  void EndAutocast();  // leaving the autocast context: the weight-copy cache lets go

  // --- checkpointing ---
  using Block = std::function<std::vector<ValueId>(Tape&, const std::vector<ValueId>&)>;
  // Runs `block` without recording; the returned outputs get a checkpoint node that keeps
  // `inputs` and recomputes the block at backward. Inputs that need no gradient (masks, cos)
  // are kept too, as torch.utils.checkpoint's save_for_backward does.
  std::vector<ValueId> Checkpoint(const std::string& name, const std::vector<ValueId>& inputs,
                                  Block block);

  // --- backward ---
  // loss.backward(): the gradient of `loss` (a scalar) is created and back-propagated.
  void Backward(ValueId loss, GradientSink& sink);

 private:
  struct Value {
    TensorHandle storage = kNoTensor;
    std::vector<std::int64_t> shape;
    DType type = DType::FP32;
    int producer = -1;        // node index, -1 for leaves
    bool requiresGrad = false;
    int parameter = -1;       // inventory index for parameters
    std::string name;
  };
  struct Node {
    std::string label;
    int layer = -1;
    std::vector<In> inputs;
    std::vector<ValueId> outputs;
    std::vector<TensorHandle> saved;
    std::vector<BackwardTemp> temps;
    int block = -1;                   // index into blocks_ for checkpoint nodes
    std::vector<ValueId> blockInputs; // checkpoint: all inputs, in order
    bool done = false;
  };

  ValueId NewValue(Value v);
  TensorHandle AllocStorage(const std::vector<std::int64_t>& shape, DType type, Category category,
                            const std::string& tensor, const std::string& what);
  void RunBackward(int fromNode, int toNode);
  void Execute(int node);
  void RunCheckpoint(int node);
  void Deliver(ValueId value, TensorHandle grad, const std::string& label);
  bool NeedsGrad(const In& in) const;

  TraceBuilder& b_;
  GradientSink* sink_ = nullptr;
  DType compute_;
  bool autocast_;
  bool recording_ = true;
  std::string scope_;
  int layer_ = -1;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<Block> blocks_;
  std::map<ValueId, TensorHandle> grads_;        // gradient buffer of each value, during backward
  std::map<std::size_t, ValueId> castCache_;     // parameter → its autocast copy
};

// Formats "[2, 128, 768] = 196,608 × 2 B (bf16)".
std::string TensorFormula(const std::vector<std::int64_t>& shape, DType type);

// The wider of two floating types, as PyTorch promotes mixed operands.
DType Promote(DType a, DType b);

}  // namespace gpumem
