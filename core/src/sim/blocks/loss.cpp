// Cross-entropy = log_softmax (saves its output) + nll_loss (saves target, total_weight).
// Causal LMs (HF's ForCausalLMLoss) upcast the logits to fp32 and shift the labels by padding;
// BERT's heads call CrossEntropyLoss on the logits as they are (autocast runs it in fp32).
#include "sim/blocks/blocks.hpp"

namespace gpumem::blocks {
namespace {
// With fp16 autocast, GradScaler.scale(loss): backward starts from the scaled loss.
ValueId ScaledLoss(Model& m, ValueId loss) {
  if (m.training.precision != Precision::AmpFP16) return loss;
  const ValueId scaled = ops::Scale(m.t, loss, "loss × scale (GradScaler)");
  m.t.Drop(loss);
  return scaled;
}
}  // namespace

ValueId CrossEntropy(Model& m, ValueId logits, ValueId labels, bool causal) {
  Tape& t = m.t;
  // lossInModelDtype: no logits.float() (autocast still runs log_softmax in fp32).
  const bool upcast = (causal && !m.training.lossInModelDtype) || t.autocast();
  const ValueId input = upcast ? ops::To(t, logits, DType::FP32) : t.Keep(logits);
  ValueId target = t.Keep(labels);
  if (causal) {
    const ValueId padded = t.Fresh({m.b, m.s + 1}, DType::Int64, "labels padded with -100");
    t.Drop(target);
    target = t.Fresh({m.b, m.s}, DType::Int64, "shift_labels (contiguous)");
    t.Drop(padded);
  }
  const ValueId logProbs = ops::Softmax(t, input, "log_softmax", t.TypeOf(input));
  t.Drop(input);
  ValueId loss = t.Apply({.name = "nll_loss", .inputs = {{logProbs}, {target, In::NoGrad}}, .shape = {1},
                          .type = t.TypeOf(logProbs), .saves = {target},
                          .saveNew = {{{1}, t.TypeOf(logProbs), "total_weight"}}});
  t.Drop(logProbs);
  t.Drop(target);
  return ScaledLoss(m, loss);
}

}  // namespace gpumem::blocks

namespace gpumem::blocks {

// torchtune (torchtune/modules/transformer.py TransformerDecoder.chunked_output and
// torchtune/modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss.forward):
//   output = [self.output(chunk) for chunk in h.chunk(num_output_chunks, dim=1)]
//   labels = [c.reshape(-1) for c in labels.chunk(num_output_chunks, dim=1)]
//   total_loss += F.cross_entropy(logits_chunk.float(), labels_chunk, reduction="sum")
//   return total_loss / (labels != ignore_index).sum()
// Each chunk's fp32 copy lives only through its own log_softmax; the log_softmax outputs (fp32,
// saved) and the 16-bit chunk logits (held by the recipe's `logits` until `del logits`) are as
// large as the unchunked ones. In backward the engine runs every chunk's loss nodes (created
// last) before any chunk's projection, so the 16-bit gradients of all chunks' logits coexist.
// The labels are shifted by the recipe first (torch.hstack: one new [b, s] int64 tensor).
ValueId ChunkedOutputLoss(Model& m, ValueId hidden, ValueId weight, ValueId labels) {
  Tape& t = m.t;
  const DType i64 = DType::Int64;
  (void)labels;  // the recipe's shifted copy is what the loss reads
  const SmallVec<ValueId, 8> chunks = t.Chunk("h.chunk", hidden, m.training.lossChunks, 1);
  SmallVec<ValueId, 8> logits;
  for (int i = 0; i < chunks.size(); ++i) {
    logits.push_back(ops::Linear(t, chunks[i], weight, kNoValue, m.a.vocabSize, t.T({"output (chunk ", TextPart::Int(i), ")"})));
    t.Drop(chunks[i]);
  }
  // The recipe, after the model: labels = torch.hstack((labels[..., 1:], ignore_labels_cache)).
  const ValueId shifted = t.Fresh({m.b, m.s}, i64, "labels shifted (torch.hstack)");
  // total_elements = (labels != ignore_index).sum(): a bool mask, then an int64 scalar.
  const ValueId mask = t.Fresh({m.b, m.s}, DType::Bool, "labels != ignore_index");
  const ValueId count = t.Fresh({1}, i64, "total_elements");
  t.Drop(mask);
  // labels = [c.reshape(-1) for c in labels.chunk(n, dim=1)]: copies when b > 1 (a chunk of a
  // [b, s] tensor along dim 1 is not contiguous), all made before the loop.
  SmallVec<ValueId, 8> targets;
  for (int i = 0; i < logits.size(); ++i) {
    const std::int64_t tokens = t.ShapeOf(logits[i])[0] * t.ShapeOf(logits[i])[1];
    targets.push_back(m.b > 1 ? t.Fresh({tokens}, i64, "labels chunk (reshape copy)") : t.Keep(shifted));
  }
  const bool upcast = !m.training.lossInModelDtype || t.autocast();
  ValueId total = kNoValue;
  for (int i = 0; i < logits.size(); ++i) {
    const ValueId target = targets[i];
    const ValueId input = upcast ? ops::To(t, logits[i], DType::FP32) : t.Keep(logits[i]);
    const ValueId logProbs = ops::Softmax(t, input, "log_softmax", t.TypeOf(input));
    t.Drop(input);
    const ValueId chunkLoss = t.Apply({.name = "nll_loss (sum)", .inputs = {{logProbs}, {target, In::NoGrad}},
                                       .shape = {1}, .type = t.TypeOf(logProbs), .saves = {target},
                                       .saveNew = {{{1}, t.TypeOf(logProbs), "total_weight"}}});
    t.Drop(logProbs);
    t.Drop(target);
    // total_loss = 0.0 + loss₀, then total_loss += lossᵢ (new scalars).
    const ValueId sum = total == kNoValue ? ops::AddConstant(t, chunkLoss, kNoValue, "total_loss")
                                          : ops::Add(t, total, chunkLoss, "total_loss");
    t.Drop(total);
    t.Drop(chunkLoss);
    total = sum;
  }
  const ValueId loss = t.Apply({.name = "total_loss / total_elements", .inputs = {{total}, {count, In::NoGrad}},
                                .shape = {1}, .type = t.TypeOf(total), .saves = {count}});
  t.Drop(total);
  t.Drop(count);
  t.Drop(shifted);
  for (ValueId l : logits) t.Drop(l);  // del logits
  return ScaledLoss(m, loss);
}

}  // namespace gpumem::blocks
