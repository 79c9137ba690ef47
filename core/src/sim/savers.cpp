// Words for the estimate about the fine-tuning optimizers and memory savers, each figure from
// the same per-tensor rules the simulation uses (optimizer.cpp).
#include "sim/savers.hpp"

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

std::int64_t PagedOptimizerStateBytes(const Setup& setup, const Inventory& inventory) {
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
                    "tensors with at least 1e5 elements with cudaMallocManaged (get_state_buffer). They are "
                    "counted here as resident, but they live outside PyTorch's caching allocator and the driver "
                    "evicts them to host memory when the GPU runs short, so they slow the step instead of "
                    "running out of memory.");
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
  if (t.lossInModelDtype && RegimeOf(t.precision).autocast) {
    notes.push_back("Under autocast log_softmax runs in fp32 whatever the logits' dtype: the loss in the model "
                    "dtype changes nothing here.");
  }
}

}  // namespace gpumem
