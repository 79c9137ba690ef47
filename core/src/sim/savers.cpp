// Words for the estimate about the fine-tuning optimizers and memory savers, each figure from
// the same per-tensor rules the simulation uses (optimizer.cpp).
#include "sim/savers.hpp"

#include <algorithm>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

std::int64_t PagedOptimizerStateBytes(const Setup& setup, const Inventory& inventory) {
  // Not a paged optimizer: nothing to walk (the solver asks this of every change it bounds).
  if (setup.training.optimizer != OptimizerKind::PagedAdamW && setup.training.optimizer != OptimizerKind::PagedAdamW8bit) {
    return 0;
  }
  const Regime regime = RegimeOf(setup.training.precision);
  std::int64_t bytes = 0;
  for (const Tensor& p : inventory.parameters) {
    if (!OptimizerStatesPaged(setup.training, p)) continue;
    // get_state_buffer pages state1 and state2 (parameter-sized); absmax stays ordinary.
    for (const StateTensor& s : OptimizerStateTensors(setup.training, regime, p)) {
      if (s.elements == p.Elements()) bytes += s.elements * BytesPerElement(s.type);
    }
  }
  return bytes;
}

void AddSaverNotes(const Setup& setup, const Inventory& inventory, std::vector<std::string>& notes) {
  const TrainingDef& t = setup.training;
  const OptimizerKind k = t.optimizer;
  const bool eightBit = k == OptimizerKind::Adam8bit || k == OptimizerKind::AdamW8bit || k == OptimizerKind::PagedAdamW8bit;
  const bool bnb = eightBit || k == OptimizerKind::PagedAdamW;
  if (eightBit) {
    std::int64_t large = 0, small = 0;
    for (const Tensor& p : inventory.parameters) {
      if (!p.trainable) continue;
      (p.Elements() < kBnbMin8bitSize ? small : large) += 1;
    }
    notes.push_back(std::string(LabelOf(k)) + ": " + FormatCount(large) +
                    " tensors of at least 4,096 elements keep uint8 exp_avg and exp_avg_sq with an fp32 absmax "
                    "per block of 256 (2.03125 B per parameter), " + FormatCount(small) +
                    " smaller ones fp32 states (bitsandbytes Optimizer2State.init_state, min_8bit_size).");
  }
  if (bnb && t.optimizerImplementation != OptimizerImplementation::Fused) {
    notes.push_back("bitsandbytes optimizers update each parameter with one fused kernel; the optimizer "
                    "implementation setting does not apply.");
  }
  if (k == OptimizerKind::Lion && t.optimizerImplementation == OptimizerImplementation::ForEach) {
    notes.push_back("Lion is simulated as lion-pytorch runs it: one parameter at a time (fused: bitsandbytes Lion).");
  }
  if (const std::int64_t paged = PagedOptimizerStateBytes(setup, inventory); paged > 0) {
    notes.push_back(FormatCount(paged) + " B (" + HumanBytes(paged) + ") of optimizer states are paged: bitsandbytes allocates the states of "
                    "tensors with at least 1e5 elements with cudaMallocManaged (get_state_buffer), outside "
                    "PyTorch's caching allocator: torch.cuda.memory_allocated and memory_reserved do not count "
                    "them, nor does the allocated peak here. The device total counts what stays resident beside "
                    "the allocator's segments; the driver evicts the rest to host memory when the GPU runs short, "
                    "so they slow the step instead of running out of memory.");
  }
  // torch.utils.checkpoint(use_reentrant=True) records its node only when an input requires
  // grad (CheckpointFunction is an autograd.Function): with the embeddings frozen and no
  // enable_input_require_grads hook (LoRA / prepare_model_for_kbit_training add it), no
  // checkpointed block's input does, so PyTorch warns "None of the inputs have requires_grad=True"
  // and those blocks' parameters get no gradient and, with .grad None, no optimizer state. Measured
  // on CPU torch (frozen embeddings and first two blocks, every block checkpointed: only the head
  // and the final norm received gradients). The estimate counts every trainable parameter.
  if (setup.model.kind == ModelKind::Transformer && t.checkpointing == Checkpointing::EveryBlock && t.useReentrant &&
      !setup.finetune.lora && !setup.finetune.prepareForKbitTraining) {
    bool embeddingTrains = false, blockTrains = false;
    for (const Tensor& p : inventory.parameters) {
      // Any trained embedding (GPT-2's wpe, BERT's position or token-type table) makes the sum
      // that enters block 0 require grad.
      embeddingTrains = embeddingTrains || (IsEmbedding(p.name) && p.trainable);
      blockTrains = blockTrains || (p.layer >= 0 && p.trainable);
    }
    if (!embeddingTrains && blockTrains) {
      notes.push_back("Reentrant checkpointing with frozen embeddings: no checkpointed block's input requires a "
                      "gradient, so torch.utils.checkpoint (use_reentrant=True) gives the blocks' parameters none "
                      "(PyTorch warns \"None of the inputs have requires_grad=True\") and they do not train. This "
                      "estimate counts their gradients and optimizer states; set use_reentrant=False "
                      "(training.useReentrant) or call model.enable_input_require_grads() for them to train.");
    }
  }
  if (t.optimizerInBackward) {
    notes.push_back("Optimizer in backward (torchtune optimizer_in_bwd): each parameter's own optimizer steps in "
                    "its post-accumulate-grad hook and frees the gradient, so at most the gradients still being "
                    "completed exist; gradient accumulation is not possible.");
  }
  if (t.lossImplementation == LossImplementation::Chunked) {
    notes.push_back("Chunked loss (torchtune CEWithChunkedOutputLoss, " + FormatCount(t.lossChunks) +
                    " chunks): the output projection and the fp32 upcast run one chunk at a time; the saved "
                    "log_softmax outputs and the 16-bit logits are as large as unchunked.");
  }
  if (t.lossImplementation == LossImplementation::FusedLinearCrossEntropy) {
    notes.push_back("Fused linear + cross-entropy (Liger LigerFusedLinearCrossEntropyLoss): the logits exist one "
                    "token chunk at a time (about tokens × hidden elements); the head's input and weight gradients "
                    "are made in forward and held until backward, where the weight's becomes .grad.");
    if (t.lossInModelDtype) notes.push_back("Liger's kernel computes the loss in fp32 registers: the loss dtype changes nothing here.");
  }
  if (t.lossImplementation == LossImplementation::MegatronVocabParallel) {
    notes.push_back("Megatron's vocab-parallel cross-entropy (tensor_parallel.vocab_parallel_cross_entropy): one fp32 "
                    "copy of the rank's logits is softmaxed in place and saved; backward makes the logits' gradient "
                    "in it in place, then in the logits' dtype.");
    if (t.lossInModelDtype) notes.push_back("Megatron's loss always upcasts the logits to fp32: the loss dtype changes nothing here.");
  }
  if (t.packedSequences == PackedSequences::BlockCausalMask) {
    notes.push_back(t.attention == AttentionImplementation::SDPA
                        ? "Packed sequences with a block-causal mask: SDPA cannot use the flash kernel with an explicit "
                          "mask and runs the memory-efficient one; every layer converts the bool mask to a float one "
                          "in the query's dtype and saves it for backward (b × s² elements per layer)."
                        : "Packed sequences under eager attention: the block-causal mask is as large as the causal one "
                          "(b × s² in the model's dtype); nothing else changes.");
  }
  if (t.packedSequences == PackedSequences::FlashVarlen) {
    notes.push_back("Packed sequences with flash-attention varlen: no s² mask (cu_seqlens only); the memory is that of "
                    "the flash kernel on b × s tokens.");
  }
  if (t.lossInModelDtype && RegimeOf(t.precision).autocast) {
    notes.push_back("Under autocast log_softmax runs in fp32 whatever the logits' dtype: the loss in the model "
                    "dtype changes nothing here.");
  }
}

LigerChunking LigerChunks(std::int64_t tokens, std::int64_t vocab, std::int64_t hidden) {
  const auto cdiv = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  const std::int64_t incFactor = cdiv(vocab, hidden);
  std::int64_t chunk = 1;  // triton.next_power_of_2
  while (chunk < cdiv(tokens, incFactor)) chunk *= 2;
  chunk = std::min(chunk, tokens);
  return {chunk, cdiv(tokens, chunk)};
}

void ActivationOffload::ReleaseFreeing(TensorHandle h, Text label) {
  b_.Release(h, b_.Holders(h) == 1 ? label : Text{});
}

int ActivationOffload::Pack(TensorHandle held, std::int64_t bytes, bool parameter, Text label) {
  if (!active_) return -1;
  const int id = ++nextId_;
  packed_.push_back({});
  if (bytes < kMinOffloadBytes || parameter) return -1;  // tracker keeps the GPU tensor as is
  // "First, sync back and dereference previously offloaded tensors": ids ≤ id − 5.
  while (!forwardStash_.empty() && forwardStash_.front() <= id - kMaxForwardStash) {
    Packed& old = packed_[static_cast<std::size_t>(forwardStash_.front() - 1)];
    ReleaseFreeing(old.onGpu, b_.text().Make({old.name, ": offloaded to host, GPU copy released"}));
    old.onGpu = kNoTensor;
    forwardStash_.pop_front();
  }
  Packed& p = packed_[static_cast<std::size_t>(id - 1)];
  p.bytes = bytes;
  p.onGpu = held;
  p.onHost = true;  // cpu_tensor = torch.empty_like(…, pin_memory=True); tracker[id] = (cpu_tensor, True)
  b_.HostActivationBytes(bytes);
  p.name = label;
  forwardStash_.push_back(id);
  return id;
}

void ActivationOffload::BeginOp() { previousOp_ = backwardStash_.size(); }

TensorHandle ActivationOffload::Unpack(int id, Text label, int layer) {
  Packed& p = packed_[static_cast<std::size_t>(id - 1)];
  if (p.onHost) {  // del self.tracker[unpack_tensor_id]: the pinned host copy is let go
    p.onHost = false;
    b_.HostActivationBytes(-p.bytes);
  }
  if (p.onGpu != kNoTensor) return p.onGpu;  // still in fwd_stash: no copy
  TextStore& t = b_.text();
  const TensorHandle back = b_.Alloc(Category::Activations, p.bytes, t.Make({p.name, " (brought back)"}),
                                     t.Make({label, ": saved tensor brought back from host"}),
                                     t.Make({TextPart::Int(p.bytes), " B copied from pinned host memory"}), layer);
  backwardStash_.emplace_back(id, back);
  return back;
}

void ActivationOffload::AfterOp(Text label) {
  TextStore& t = b_.text();
  while (!forwardStash_.empty()) {
    Packed& p = packed_[static_cast<std::size_t>(forwardStash_.front() - 1)];
    ReleaseFreeing(p.onGpu, t.Make({label, ": forward stash dropped"}));
    p.onGpu = kNoTensor;
    forwardStash_.pop_front();
  }
  if (previousOp_ == 0) return;
  const Text freed = t.Make({label, ": previous op's brought-back tensors freed"});
  for (std::size_t i = 0; i < previousOp_; ++i) ReleaseFreeing(backwardStash_[i].second, freed);
  backwardStash_.erase(backwardStash_.begin(), backwardStash_.begin() + static_cast<std::ptrdiff_t>(previousOp_));
  previousOp_ = 0;
}

bool ActivationOffload::CopiedUnpack(const int* ids, std::size_t count, const Stash& stash) {
  if (!forwardStash_.empty() || previousOp_ != 0) return false;
  std::size_t k = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const int id = ids[i];
    if (id < 0) continue;
    if (id > static_cast<int>(packed_.size()) || k >= stash.size() || stash[k].first != id) return false;
    const Packed& p = packed_[static_cast<std::size_t>(id - 1)];
    if (!p.onHost || p.onGpu != kNoTensor) return false;
    ++k;
  }
  if (k != stash.size()) return false;
  for (std::size_t i = 0; i < count; ++i) {
    const int id = ids[i];
    if (id < 0) continue;
    Packed& p = packed_[static_cast<std::size_t>(id - 1)];
    p.onHost = false;
    b_.HostActivationBytes(-p.bytes);
  }
  backwardStash_ = stash;
  return true;
}

void ActivationOffload::EndBackward(Text label) {
  for (const auto& [id, h] : backwardStash_) ReleaseFreeing(h, label);
  backwardStash_.clear();
  previousOp_ = 0;
}

}  // namespace gpumem
