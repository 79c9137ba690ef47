// Cross-entropy = log_softmax (saves its output) + nll_loss (saves target, total_weight).
// Causal LMs (HF's ForCausalLMLoss) upcast the logits to fp32 and shift the labels by padding;
// BERT's heads call CrossEntropyLoss on the logits as they are (autocast runs it in fp32).
#include "sim/blocks/blocks.hpp"
#include "sim/savers.hpp"

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
  if (causal && m.training.lossImplementation == LossImplementation::MegatronVocabParallel) {
    return MegatronVocabParallelCrossEntropy(m, logits, labels);  // below
  }
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
// `hidden` is the caller's reference, dropped once the chunks are projected: the projection
// runs in TransformerDecoder.unembed, whose `h` goes when the model returns its list of chunk
// logits, before the recipe's loss step shifts the labels (recipes' _loss_step). What keeps it
// then is what the projections saved: the chunk views with a trainable head; nothing with a
// frozen one (LoRA), nor under autocast (the projections save bf16 casts).
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
  t.Drop(hidden);  // the model returns
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

namespace gpumem::blocks {

// Liger's fused linear + cross-entropy, as HF models patched by Liger call it
// (liger_kernel/transformers/model/loss_utils.py LigerForCausalLMLoss: labels padded with -100
// and shifted, hidden_states.view(-1, H); then liger_kernel/ops/fused_linear_cross_entropy.py
// LigerFusedLinearCrossEntropyFunction.forward → fused_linear_cross_entropy_forward, reduction
// "mean", accum_dtype None, no bias, on CUDA). In forward, inside one autograd.Function:
//   grad_input = zeros_like(_input)                 [BT, H], the input's dtype
//   grad_weight = zeros_like(weight)                [V, H], the weight's dtype (when it trains)
//   loss_1d = zeros(BT, float32); target_mask = target != ignore_index (.sum().item())
//   logits_storage = empty((chunk_size, V))         when input and weight share a dtype (mm(out=))
//   per chunk: mm(out=logits) → the CE kernel writes the logits' gradient over them → mm(out=
//   grad_input[rows]) and addmm(out=grad_weight) in place. An fp32 gradient of the logits takes
//   the "legacy fallback", grad_weight += mm(grad_logits.t(), input_chunk).float(): a new [V, H]
//   fp32 product per chunk. With mismatched dtypes each chunk's logits (and grad_logits @ weight)
//   are new tensors instead of the buffer.
//   save_for_backward(grad_input, grad_weight); loss = torch.sum(loss_1d).
// Backward multiplies the saved buffers by grad_output in place (a no-op at 1.0) and returns
// them: the input's incoming gradient, and .grad of the weight (stolen by AccumulateGrad).
ValueId FusedLinearCrossEntropyLoss(Model& m, ValueId hidden, ValueId weight) {
  Tape& t = m.t;
  const DType i64 = DType::Int64;
  const Shape& hs = t.ShapeOf(hidden);
  const std::int64_t tokens = hs.Elements() / hs.back();
  const std::int64_t h = hs.back();
  const std::int64_t v = m.a.vocabSize;
  // LigerForCausalLMLoss: F.pad(labels, (0, 1), value=-100), then [..., 1:].contiguous().
  const ValueId padded = t.Fresh({m.b, m.s + 1}, i64, "labels padded with -100");
  const ValueId target = t.Fresh({m.b, m.s}, i64, "shift_labels (contiguous)");
  t.Drop(padded);

  const DType in = t.TypeOf(hidden);
  const DType w = t.TypeOf(weight);
  const bool weightGrad = t.RequiresGrad(hidden) && t.RequiresGrad(weight);
  const ValueId gradInput = t.Fresh({tokens, h}, in, "grad_input (zeros_like)", Category::ActivationGradients);
  const ValueId gradWeight =
      weightGrad ? t.Fresh({v, h}, w, "grad_weight (zeros_like)", Category::Gradients) : kNoValue;
  const ValueId loss1d = t.Fresh({tokens}, DType::FP32, "loss_1d");
  const ValueId mask = t.Fresh({tokens}, DType::Bool, "target != ignore_index");
  t.Drop(t.Fresh({1}, i64, "target_mask.sum()"));  // .item()

  const LigerChunking plan = LigerChunks(tokens, v, h);
  const bool mmOut = in == w;  // _can_use_mm_out: the same dtype (CUDA, grad mode off)
  const DType logitsType = Promote(in, w);
  const ValueId buffer = mmOut ? t.Fresh({plan.chunkSize, v}, in, "logits_storage (chunk_size × V)") : kNoValue;
  for (std::int64_t c = 0; c < plan.chunks; ++c) {
    const std::int64_t rows = std::min(plan.chunkSize, tokens - c * plan.chunkSize);
    const ValueId logits = mmOut ? kNoValue : t.Fresh({rows, v}, logitsType, "logits_chunk (_input_chunk @ weight.t())");
    if (!mmOut) {  // grad_input[rows] = grad_logits_chunk @ weight
      t.Drop(t.Fresh({rows, h}, logitsType, "grad_logits_chunk @ weight"));
    }
    if (gradWeight != kNoValue && logitsType == DType::FP32 && w == DType::FP32) {
      t.Drop(t.Fresh({v, h}, DType::FP32, "mm(grad_logits_chunk.t(), _input_chunk)"));  // legacy fallback
    }
    t.Drop(logits);
  }
  t.Drop(buffer);  // del logits_storage

  Tape::OpSpec spec{.name = "fused linear + cross-entropy (Liger)",
                    .inputs = {{hidden}, {weight}, {target, In::NoGrad}},
                    .shape = {1},
                    .type = DType::FP32};
  const ValueId loss = t.ApplyPrecomputed(spec, {gradInput, gradWeight, kNoValue});
  t.Drop(gradInput);  // the node's saved buffers now
  t.Drop(gradWeight);
  t.Drop(loss1d);
  t.Drop(mask);
  t.Drop(target);
  return loss;
}

}  // namespace gpumem::blocks

namespace gpumem::blocks {

// Megatron-LM's loss, as GPTModel runs it (Megatron-LM d98e8a6; `parallel_output=True`: the
// output layer, a ColumnParallelLinear, leaves each rank its own [s, b, V/t] slice of the logits
// in the model's dtype, bf16 under --bf16, and nothing casts them before the loss). `logits` is
// that slice ([b, s, V/t] here; the same bytes as Megatron's [s, b, V/t]).
//
// megatron/core/models/common/language_module/language_module.py compute_language_model_loss
// (l.172 labels.transpose(0, 1).contiguous(); l.200 tensor_parallel.vocab_parallel_cross_entropy;
// l.205 loss.transpose(0, 1).contiguous()), then pretrain_gpt.py loss_func (l.254-256:
// losses = output_tensor.view(-1).float(); loss = torch.sum(losses * loss_mask)).
//
// megatron/core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy.forward (l.121-183),
// an autograd.Function, so nothing inside it is recorded:
//   calculate_logits_max (l.25-27): vocab_parallel_logits.float() — a new fp32 copy of the slice
//     (the slice itself when it is fp32 already); torch.max(..., dim=-1)[0] (values and indices made,
//     the indices dropped at once)
//   calculate_predicted_logits (l.42-63): `-=` in place; target_mask = (target < start) |
//     (target >= end); masked_target = target.clone() - start; arange_1d; logits_2d[arange_1d,
//     masked_target_1d] then .clone(); torch.exp(…, out=exp_logits) in place; sum(dim=-1)
//   calculate_cross_entropy_loss (l.74-77): loss = torch.log(sum_exp_logits) - predicted_logits;
//     exp_logits.div_(…) in place
//   l.181 ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
// backward (l.186-210): grad_input = softmax (the saved fp32 buffer), grad_2d[arange_1d,
// masked_target_1d] -= softmax_update, grad_input.mul_(grad_output…) in place, returned. The
// engine then casts it to the input's dtype (torch/csrc/autograd/engine.cpp validate_outputs:
// grad.to(metadata dtype)) while the saved buffer is still held (release_variables runs after
// the call): fp32 + 16-bit [s, b, V/t] at once, then the fp32 buffer goes. With fp32 logits the
// returned gradient is the logits' own storage, softmaxed in place: nothing new is made.
//
// Not modelled: the nonzero() of `masked_target[target_mask] = 0` and `predicted_logits[
// target_mask] = 0.0` (index_put_ with a bool mask: as many int64 indices as masked tokens, which
// depends on the data), and the loss's scalars (num_tokens, the report's torch.cat).
ValueId MegatronVocabParallelCrossEntropy(Model& m, ValueId logits, ValueId labels) {
  Tape& t = m.t;
  (void)labels;  // the [s, b] copy below is what the Function reads
  const DType i64 = DType::Int64;
  const DType f32 = DType::FP32;
  const Shape& slice = t.ShapeOf(logits);
  const std::int64_t tokens = slice.Elements() / slice.back();
  const Shape rows{m.s, m.b};  // Megatron's [s, b]

  const ValueId target = t.Fresh(rows, i64, "labels.transpose(0, 1).contiguous()");
  // --- _VocabParallelCrossEntropy.forward ---
  const bool copies = t.TypeOf(logits) != f32;
  const ValueId exp = copies ? t.Fresh(slice, f32, "vocab_parallel_logits.float()") : t.Keep(logits);
  const ValueId logitsMax = t.Fresh(rows, f32, "logits_max (torch.max values)");
  t.Drop(t.Fresh(rows, i64, "torch.max indices"));  // [0]: the indices go at once
  // vocab_parallel_logits -= logits_max.unsqueeze(-1): in place.
  const ValueId below = t.Fresh(rows, DType::Bool, "target < vocab_start_index");
  const ValueId above = t.Fresh(rows, DType::Bool, "target >= vocab_end_index");
  const ValueId targetMask = t.Fresh(rows, DType::Bool, "target_mask");
  t.Drop(below);
  t.Drop(above);
  const ValueId clone = t.Fresh(rows, i64, "target.clone()");
  const ValueId maskedTarget = t.Fresh(rows, i64, "masked_target (clone - vocab_start_index)");
  t.Drop(clone);
  const ValueId arange = t.Fresh({tokens}, i64, "arange_1d");
  const ValueId picked = t.Fresh({tokens}, f32, "logits_2d[arange_1d, masked_target_1d]");
  const ValueId predicted = t.Fresh({tokens}, f32, "predicted_logits (.clone())");
  t.Drop(picked);
  // torch.exp(vocab_parallel_logits, out=exp_logits): in place.
  const ValueId sumExp = t.Fresh(rows, f32, "sum_exp_logits");
  t.Drop(arange);  // calculate_predicted_logits returns
  const ValueId logSum = t.Fresh(rows, f32, "torch.log(sum_exp_logits)");
  // loss = log(sum) - predicted is the Function's output; exp_logits.div_(…) in place; then saved.
  Tape::OpSpec spec{.name = "vocab_parallel_cross_entropy (Megatron)",
                    .inputs = {{logits}, {target, In::NoGrad}},
                    .shape = rows,
                    .type = f32,
                    .saves = {exp, targetMask, maskedTarget}};
  // Backward's own temporaries (arange_1d; softmax_update and the gathered grad_2d entries) are
  // gone before the engine's cast, so they only count when there is none (fp32 logits).
  if (!copies) {
    spec.backwardTemps = {{{tokens}, i64, "arange_1d"},
                          {{2 * tokens}, f32, "softmax_update, grad_2d[arange_1d, masked_target_1d]"}};
  }
  // fp32 logits: the gradient handed back is the saved buffer itself (the logits' storage).
  const ValueId lossRows = copies ? t.Apply(spec) : t.ApplyPrecomputed(spec, {exp, kNoValue});
  t.Drop(logSum);
  for (ValueId v : {exp, logitsMax, targetMask, maskedTarget, predicted, sumExp}) t.Drop(v);  // locals
  t.Drop(target);  // compute_language_model_loss returns
  const ValueId lossBs = ops::Copy(t, lossRows, {m.b, m.s}, "loss.transpose(0, 1).contiguous()");
  t.Drop(lossRows);
  // pretrain_gpt.py loss_func: the batch's fp32 loss_mask (get_batch; made here with the loss),
  // losses.view(-1).float() (a view: already fp32), torch.sum(losses * loss_mask).
  const ValueId lossMask = t.Fresh({m.b, m.s}, f32, "loss_mask");
  const ValueId losses = ops::View(t, lossBs, {tokens}, "output_tensor.view(-1)");
  t.Drop(lossBs);
  const ValueId masked = ops::Mul(t, losses, lossMask, "losses * loss_mask");
  t.Drop(losses);
  t.Drop(lossMask);
  // SumBackward expands the scalar's gradient (a view): nothing new.
  const ValueId loss = t.Apply({.name = "torch.sum", .inputs = {{masked, In::PassThrough}}, .shape = {1}, .type = f32});
  t.Drop(masked);
  return ScaledLoss(m, loss);
}

}  // namespace gpumem::blocks
