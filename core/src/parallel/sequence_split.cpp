// Megatron sequence parallelism on the simulated rank (sequence_split.hpp states the rules).
#include "parallel/sequence_split.hpp"

namespace gpumem::sequence_split {

bool IsSequenceSharded(const Model& m, ValueId x) {
  if (m.sequenceShards <= 1) return false;
  const Shape& shape = m.t.ShapeOf(x);
  return shape.rank == 3 && shape[1] * m.sequenceShards == m.s && shape[1] != m.s;
}

ValueId GatherLinear(Model& m, ValueId x, ValueId weight, ValueId bias, std::int64_t out, TextPart name) {
  Tape& t = m.t;
  const ValueId x16 = t.ForMatmul(x);
  const ValueId w16 = t.ForMatmul(weight);
  const ValueId b16 = bias == kNoValue ? kNoValue : t.ForMatmul(bias);
  const DType type = t.autocast() ? t.computeType() : Promote(t.TypeOf(x16), t.TypeOf(w16));
  Shape gathered = t.ShapeOf(x);
  gathered.dims[1] *= m.sequenceShards;
  Shape result = gathered;
  result.back() = out;
  // The forward's all-gather lands in the persistent "mpu" buffer; what is saved is the sharded
  // input and the weight; backward's temporary is the full grad_input before its reduce-scatter
  // (the re-gathered input reuses the "mpu" buffer). megatron/core/utils.py
  // GlobalMemoryBuffer.get_tensor makes the buffer at its first request, the first gather of the
  // run (torch.empty of b·s·h in the input's dtype), and keeps it; every later gather fits in it.
  TraceBuilder& b = t.builder();
  if (b.sequenceGatherBuffer == kNoTensor) {
    const std::int64_t bytes = gathered.Elements() * BytesPerElement(t.TypeOf(x16));
    TextStore& text = b.text();
    b.sequenceGatherBuffer =
        b.Alloc(Category::Activations, bytes, text.Make({"global memory buffer \"mpu\" (sequence-parallel all-gather)"}),
                text.Make({"sequence parallel: Megatron's all-gather buffer, b·s·h (made by the first gather, kept)"}),
                text.Make({TextPart::Count(bytes), " B"}), -1);
  }
  Tape::OpSpec spec{.name = name, .inputs = {{x16}, {w16}}, .shape = result, .type = type};
  if (ops::Grad(t, w16)) spec.saves.push_back(x16);
  if (ops::Grad(t, x16)) spec.saves.push_back(w16);
  if (b16 != kNoValue) spec.inputs.push_back({b16});
  spec.backwardTemps.push_back({gathered, t.TypeOf(x16), "grad_input [b, s, h] before reduce-scatter"});
  // grad_bias = grad_output.sum(dim=0) over the gathered rows (megatron/core/tensor_parallel/
  // layers.py LinearWithGradAccumulationAndAsyncCommunication.backward).
  if (b16 != kNoValue && ops::Grad(t, b16)) ops::SumToScratch(t, spec, result.Elements() / out, out, type);
  const ValueId y = t.Apply(spec);
  t.Drop(x16);
  t.Drop(w16);
  t.Drop(b16);
  return y;
}

ValueId ScatterSequence(Model& m, ValueId y, TextPart name) {
  Tape& t = m.t;
  Shape sharded = t.ShapeOf(y);
  sharded.dims[1] /= m.sequenceShards;
  return t.Apply({.name = name, .inputs = {{y}}, .shape = sharded, .type = t.TypeOf(y)});
}

ValueId RowParallelOutput(Model& m, ValueId y, TextPart name) {
  if (m.sequenceShards <= 1) return y;
  const ValueId sharded = ScatterSequence(m, y, name);
  m.t.Drop(y);
  return sharded;
}

ValueId LmHead(Model& m, ValueId normed, const char* tiedEmbedding, Context& c) {
  Tape& t = m.t;
  t.Drop(c.mask);
  t.Drop(c.slidingMask);
  t.Drop(c.cos);
  t.Drop(c.sin);
  t.Drop(c.slidingCos);
  t.Drop(c.slidingSin);
  m.Scope(-1, "lm_head");
  const ValueId weight = m.parameters.Has("lm_head.weight") ? m.parameters.ByName(t, "lm_head.weight")
                                                            : m.parameters.ByName(t, tiedEmbedding);
  const ValueId logits = GatherLinear(m, normed, weight, kNoValue, m.a.vocabSize, "logits (all-gathered input)");
  m.headInput = normed;  // GPTModel.forward's hidden_states, held to the end of the loss (Model::headInput)
  return logits;
}

std::int64_t GatherBufferBytes(const Setup& rankSetup, const Regime& regime) {
  const DType read = regime.autocast ? regime.compute : regime.activations;
  return rankSetup.training.batchSize * rankSetup.training.sequenceLength * rankSetup.model.architecture.hiddenSize *
         BytesPerElement(read);
}

}  // namespace gpumem::sequence_split
