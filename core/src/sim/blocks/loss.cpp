// Cross-entropy = log_softmax (saves its output) + nll_loss (saves target, total_weight).
// Causal LMs (HF's ForCausalLMLoss) upcast the logits to fp32 and shift the labels by padding;
// BERT's heads call CrossEntropyLoss on the logits as they are (autocast runs it in fp32).
#include "sim/blocks/blocks.hpp"

namespace gpumem::blocks {

ValueId CrossEntropy(Model& m, ValueId logits, ValueId labels, bool causal) {
  Tape& t = m.t;
  const ValueId input = causal || t.autocast() ? ops::To(t, logits, DType::FP32) : t.Keep(logits);
  ValueId target = t.Keep(labels);
  if (causal) {
    const ValueId padded = t.Fresh({m.b, m.s + 1}, DType::Int64, "labels padded with -100");
    t.Drop(target);
    target = t.Fresh({m.b, m.s}, DType::Int64, "shift_labels (contiguous)");
    t.Drop(padded);
  }
  const ValueId logProbs = ops::SavesOutput(t, input, "log_softmax", t.TypeOf(input));
  t.Drop(input);
  ValueId loss = t.Apply({.name = "nll_loss", .inputs = {{logProbs}, {target, In::NoGrad}}, .shape = {1},
                          .type = t.TypeOf(logProbs), .saves = {target},
                          .saveNew = {{{1}, t.TypeOf(logProbs), "total_weight"}}});
  t.Drop(logProbs);
  t.Drop(target);
  if (m.training.precision == Precision::AmpFP16) {
    // GradScaler.scale(loss): backward starts from the scaled loss.
    const ValueId scaled = ops::Scale(t, loss, "loss × scale (GradScaler)");
    t.Drop(loss);
    loss = scaled;
  }
  return loss;
}

}  // namespace gpumem::blocks
