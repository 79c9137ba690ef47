// What the blocks of a transformer share during one forward pass: the tape, the architecture
// and training settings, the micro-batch's sizes, and the model's parameters by module name.
#pragma once

#include <string_view>
#include <vector>

#include "sim/ops.hpp"

namespace gpumem {

// A module path ("model.layers.3.self_attn.q_proj"): its name for parameter lookup and as a
// Text for labels. Paths are short (HF names), so the name lives inline.
struct Module {
  static constexpr std::size_t kMaxPath = 160;
  char path[kMaxPath] = {};
  std::size_t length = 0;
  Text text;
  std::string_view name() const { return {path, length}; }
};

// The parameters of one forward pass, created as tape leaves on first use.
class Parameters {
 public:
  // `weights`: the precision's weight dtype; `quantCompute`: the dtype a quantized weight is
  // dequantized to (bnb_4bit_compute_dtype). Frozen parameters become leaves needing no gradient.
  Parameters(const Inventory& inventory, const std::vector<Text>& names, DType weights,
             DType quantCompute = DType::FP32);
  void Reset() { std::fill(values_.begin(), values_.end(), kNoValue); }
  // The leaf of each inventory index made so far (kNoValue: not yet): a copied forward span
  // (Tape::SetForwardTemplates) fills it as the simulated forward would.
  std::vector<ValueId>& leaves() { return values_; }
  // `module` + "." + `tensor` ("weight", "bias"); kNoValue when the model has no such tensor.
  ValueId Find(Tape& t, const Module& module, std::string_view tensor);
  ValueId Get(Tape& t, const Module& module, std::string_view tensor);  // must exist
  ValueId ByName(Tape& t, std::string_view fullName);                   // must exist
  bool Has(std::string_view fullName) const { return IndexOf(fullName) >= 0; }
  // The inventory's tensor `module` + "." + `tensor`, or nullptr (its storage, whether it trains).
  const Tensor* TensorOf(const Module& module, std::string_view tensor) const;

 private:
  ValueId Leaf(Tape& t, std::size_t index);
  // Inventory index of a name, or -1: open addressing over the inventory's own strings (a map
  // with a node per parameter cost more than the lookups it served).
  // Blocks ask for their parameters in inventory order, so the index after the last one found
  // (or that one again: TensorOf then Get) is tried first, before hashing the name.
  std::int64_t IndexOf(std::string_view name) const;
  std::int64_t HashedIndexOf(std::string_view name) const;
  mutable std::size_t last_ = 0;     // the index IndexOf returned last
  bool uniqueNames_ = true;          // no name repeats (the guess is the table's answer)
  const Inventory& inventory_;
  const std::vector<Text>& names_;
  DType weights_;
  DType quantCompute_;
  std::vector<std::int32_t> slots_;  // inventory index per slot, -1 empty; size a power of two
  bool anyBias_ = false;             // whether any name ends in ".bias" (most Llamas have none)
  std::vector<ValueId> values_;
};

struct Model {
  Tape& t;
  const ArchitectureDef& a;
  const TrainingDef& training;
  Parameters& parameters;
  std::int64_t b, s;  // micro-batch and sequence length
  const FinetuneDef* finetune = nullptr;  // adapters and quantization (null: plain training)

  const FinetuneDef& Finetune() const {
    static const FinetuneDef kPlain{};
    return finetune != nullptr ? *finetune : kPlain;
  }

  // The batch's labels, for a head that computes the loss itself (the chunked loss), and that
  // loss (kNoValue when the driver computes it from the logits).
  ValueId labels = kNoValue;
  ValueId loss = kNoValue;
  // The head's input where the forward that makes the logits also computes the loss: Hugging
  // Face's *ForCausalLM.forward keeps `hidden_states` (and `outputs.last_hidden_state`) until it
  // returns, after `self.loss_function(logits, labels)`. The driver drops it after the loss.
  // A trainable head saves it anyway; with a frozen head (LoRA) it is the one hidden-sized
  // tensor alive through the loss that nothing saved.
  ValueId headInput = kNoValue;
  // enable_input_require_grads (PreTrainedModel: a forward hook on get_input_embeddings() that
  // calls output.requires_grad_(True)): the word embedding's output, frozen, becomes a leaf that
  // requires grad, and every op between it and block 0 (GPT-2's + wpe and dropout, BERT's sums,
  // LayerNorm and dropout, Gemma's scaling) records a node and saves what it saves. Held by
  // the graph until the loss goes (Tape::RequireGrad) unless a pipeline stage runs it.
  bool embeddingsRequireGrad = false;
  bool embeddingsHeldByGraph = false;

  // Megatron --sequence-parallel: the tensor-parallel size t when on, else 1. What sits outside
  // the column/row linears holds s/t tokens (core/src/parallel/sequence_split.cpp).
  std::int64_t sequenceShards = 1;
  // Megatron --tensor-model-parallel-size t (else 1): the word embedding is a
  // VocabParallelEmbedding over the rank's V/t rows (blocks::WordEmbedding).
  std::int64_t vocabShards = 1;
  // Megatron --context-parallel-size c (else 1): `s` is already the rank's s/c tokens; attention
  // runs as Transformer Engine's ring (core/src/parallel/context_split.cpp).
  std::int64_t contextShards = 1;
  // Megatron --expert-model-parallel-size e (else 1): the rank holds E/e experts and exchanges
  // tokens with all-to-alls (core/src/parallel/expert_split.cpp).
  std::int64_t expertShards = 1;
  // Megatron --expert-tensor-parallel-size (t unless set; 1 on one GPU): each expert's MLP is
  // 1/etp wide and the dispatcher all-gathers / reduce-scatters its rows over the group.
  std::int64_t expertTensorShards = 1;

  // A child module: "model.layers.3." + "self_attn.q_proj".
  Module Child(const Module& parent, std::string_view name);
  // The root of block i: prefix + i + "." ("model.layers.3.").
  Module BlockRoot(const char* prefix, int i);
  // parent + name + i + "." ("…block_sparse_moe.experts." + 5 + ".").
  Module Indexed(const Module& parent, std::string_view name, std::int64_t i);
  ValueId P(const Module& m, std::string_view tensor = "weight") { return parameters.Get(t, m, tensor); }
  ValueId POptional(const Module& m, std::string_view tensor = "bias") { return parameters.Find(t, m, tensor); }
  // Labels and the timeline's layer: "layers.3 attention".
  void Scope(int layer, const char* what);
};

// The shared context every block sees of the others (rotary tables, the additive mask).
struct Context {
  ValueId mask = kNoValue, cos = kNoValue, sin = kNoValue;
  // Gemma 2's sliding layers' mask (architecture.slidingWindow), beside the full layers' `mask`.
  ValueId slidingMask = kNoValue;
  // Gemma 3's sliding layers' rotary table (its own RoPE base), beside the full layers' cos, sin.
  ValueId slidingCos = kNoValue, slidingSin = kNoValue;
};

}  // namespace gpumem
