// The primitive ops (see ops.hpp for what each saves and why).
#include "sim/ops.hpp"

#include "sim/reduction.hpp"

namespace gpumem::ops {
namespace {

Shape WithLast(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

const Shape& Larger(const Tape& t, ValueId a, ValueId b) {
  return t.Elements(a) >= t.Elements(b) ? t.ShapeOf(a) : t.ShapeOf(b);
}

}  // namespace

bool Grad(const Tape& t, ValueId v) { return t.recording() && t.RequiresGrad(v); }

void SumToScratch(Tape& t, Tape::OpSpec& spec, std::int64_t rows, std::int64_t outputs, DType type) {
  // (BackwardTemps holds 4: the ops that add this have at most one other temporary.)
  if (spec.backwardTemps.size() > 2) return;
  const ReductionScratch r = LeadingSumScratch(rows, outputs, BytesPerElement(type), t.gpu());
  // Noted whether or not this GPU splits the sum: another one may (Trace::gpuReductions).
  t.builder().GpuReduction({rows, outputs, BytesPerElement(type)}, r.bufferBytes + r.semaphoreBytes);
  if (r.bufferBytes <= 0) return;
  // Reduce.cuh gpu_reduce_kernel: buffer then semaphores from the caching allocator, both freed
  // when the launch returns. The buffer holds fp32 partial sums (global_memory_size: outputs ×
  // blocks per output × block.x × output_vec_size), the semaphores one int per output tile.
  spec.backwardTemps.push_back({.shape = {r.bufferBytes / 4}, .type = DType::FP32,
                                .name = "sum_to scratch (CUDA reduction's partial sums)", .afterGradients = true});
  spec.backwardTemps.push_back({.shape = {r.semaphoreBytes}, .type = DType::UInt8,
                                .name = "sum_to semaphores (int per output tile)", .afterGradients = true});
}

ValueId Linear(Tape& t, ValueId x, ValueId weight, ValueId bias, std::int64_t out, TextPart name) {
  const ValueId x16 = t.ForMatmul(x);
  const ValueId w16 = t.ForMatmul(weight);
  const ValueId b16 = bias == kNoValue ? kNoValue : t.ForMatmul(bias);
  const DType type = t.autocast() ? t.computeType() : Promote(t.TypeOf(x16), t.TypeOf(w16));
  // mm's derivatives (derivatives.yaml: self: grad.mm(mat2ᵀ), mat2: selfᵀ.mm(grad)): autograd
  // saves each operand only when the other one's gradient is needed — a frozen weight keeps no
  // copy of its input, an input with no gradient keeps no weight (checked in PyTorch 1.13:
  // MmBackward0._saved_self is None when the weight does not require grad).
  Tape::OpSpec spec{.name = name, .inputs = {{x16}, {w16}}, .shape = WithLast(t.ShapeOf(x), out), .type = type};
  // What op-level selective checkpointing counts as aten.mm: F.linear without a bias runs
  // matmul → mm on the flattened input; with a bias it runs aten.addmm (aten/src/ATen/native/
  // Linear.cpp linear: addmm for 2-D input, _flatten_nd_linear for contiguous 3-D), which
  // torchtitan's _save_list does not name.
  if (b16 == kNoValue) spec.sac = Tape::OpSpec::Sac::Mm;
  if (Grad(t, w16)) spec.saves.push_back(x16);
  if (Grad(t, x16)) spec.saves.push_back(w16);
  if (b16 != kNoValue) spec.inputs.push_back({b16});
  // addmm's bias gradient is the output's gradient summed over its rows (derivatives.yaml
  // addmm self: maybe_multiply(grad, beta), then the engine's sum_to to the bias's shape).
  if (b16 != kNoValue && Grad(t, b16)) SumToScratch(t, spec, spec.shape.Elements() / out, out, type);
  const ValueId y = t.Apply(spec);
  t.Drop(x16);
  t.Drop(w16);
  t.Drop(b16);
  return y;
}

ValueId MatMul(Tape& t, ValueId a, ValueId b, Shape shape, TextPart name) {
  const ValueId a16 = t.ForMatmul(a), b16 = t.ForMatmul(b);
  const DType type = t.autocast() ? t.computeType() : Promote(t.TypeOf(a16), t.TypeOf(b16));
  Tape::OpSpec spec{.name = name, .inputs = {{a16}, {b16}}, .shape = shape, .type = type};
  if (Grad(t, b16)) spec.saves.push_back(a16);  // each operand only if the other needs a gradient
  if (Grad(t, a16)) spec.saves.push_back(b16);
  const ValueId y = t.Apply(spec);
  t.Drop(a16);
  t.Drop(b16);
  return y;
}

ValueId View(Tape& t, ValueId x, Shape shape, TextPart name) {
  return t.Apply({.name = name, .inputs = {{x, In::PassThrough}}, .shape = shape, .type = t.TypeOf(x), .viewOf = x});
}

ValueId Copy(Tape& t, ValueId x, Shape shape, TextPart name, In::Rule rule) {
  return t.Apply({.name = name, .inputs = {{x, rule}}, .shape = shape, .type = t.TypeOf(x)});
}

ValueId To(Tape& t, ValueId x, DType type) {
  if (t.TypeOf(x) == type) return t.Keep(x);
  static constexpr const char* kTo[] = {"to(fp32)", "to(fp16)", "to(bf16)", "to(int64)", "to(bool)"};
  return t.Apply({.name = TextPart::View(kTo[static_cast<int>(type)]), .inputs = {{x}}, .shape = t.ShapeOf(x),
                  .type = type});
}

ValueId Add(Tape& t, ValueId a, ValueId b, TextPart name) {
  return t.Apply({.name = name, .inputs = {{a, In::PassThrough}, {b, In::PassThrough}}, .shape = Larger(t, a, b),
                  .type = Promote(t.TypeOf(a), t.TypeOf(b))});
}

ValueId AddConstant(Tape& t, ValueId a, ValueId constant, TextPart name) {
  const DType type = constant == kNoValue ? t.TypeOf(a) : Promote(t.TypeOf(a), t.TypeOf(constant));
  Tape::OpSpec spec{.name = name, .inputs = {{a, In::PassThrough}}, .shape = t.ShapeOf(a), .type = type};
  if (constant != kNoValue) spec.inputs.push_back({constant, In::NoGrad});
  return t.Apply(spec);
}

ValueId Scale(Tape& t, ValueId a, TextPart name) {
  return t.Apply({.name = name, .inputs = {{a}}, .shape = t.ShapeOf(a), .type = t.TypeOf(a)});
}

ValueId Mul(Tape& t, ValueId a, ValueId b, TextPart name) {
  Tape::OpSpec spec{.name = name, .inputs = {{a}, {b}}, .shape = Larger(t, a, b),
                    .type = Promote(t.TypeOf(a), t.TypeOf(b))};
  if (Grad(t, a)) spec.saves.push_back(b);
  if (Grad(t, b)) spec.saves.push_back(a);
  // mul_tensor_backward(grad, other) is grad * other at the output's size; for an operand
  // broadcast to the output the engine then sums it down (validate_outputs → sum_to), and the
  // full-size product is freed once the sum is made.
  for (ValueId v : {a, b}) {
    const std::int64_t elements = t.Elements(v);
    if (!Grad(t, v) || elements >= spec.shape.Elements()) continue;
    spec.backwardTemps.push_back({.shape = spec.shape, .type = spec.type, .name = "grad * other before sum_to",
                                  .afterGradients = true});
    // Broadcast over leading dimensions only (a [h] weight on [b, s, h]): a sum over rows.
    const Shape& small = t.ShapeOf(v);
    int k = small.rank;
    while (k > 0 && small[small.rank - k] == 1) --k;  // leading ones broadcast too
    bool leading = k <= spec.shape.rank;
    for (int i = 1; leading && i <= k; ++i) leading = small[small.rank - i] == spec.shape[spec.shape.rank - i];
    if (leading) SumToScratch(t, spec, spec.shape.Elements() / elements, elements, spec.type);
  }
  return t.Apply(spec);
}

ValueId SavesInput(Tape& t, ValueId x, TextPart name) {
  return t.Apply({.name = name, .inputs = {{x}}, .shape = t.ShapeOf(x), .type = t.TypeOf(x), .saves = {x}});
}

ValueId SavesOutput(Tape& t, ValueId x, TextPart name, DType type) {
  return t.Apply({.name = name, .inputs = {{x}}, .shape = t.ShapeOf(x), .type = type, .savesOutput = true});
}

ValueId Softmax(Tape& t, ValueId x, TextPart name, DType type) {
  if (!t.softmaxSavesInput()) return SavesOutput(t, x, name, type);
  return t.Apply({.name = name, .inputs = {{x}}, .shape = t.ShapeOf(x), .type = type, .saves = {x}, .savesOutput = true});
}

ValueId Dropout(Tape& t, ValueId x, double p, TextPart name) {
  if (p <= 0.0) return t.Keep(x);  // F.dropout with p = 0 returns its input
  return t.Apply({.name = name, .inputs = {{x}}, .shape = t.ShapeOf(x), .type = t.TypeOf(x),
                  .saveNew = {{t.ShapeOf(x), DType::Bool, "mask"}}});
}

// native_layer_norm saves its input and a mean and rstd per row. On CUDA those are in the
// accumulate type, fp32 for 16-bit inputs (layer_norm.cpp layer_norm_cuda:
// at::empty({M}, X->options().dtype(acc_type))); CPU torch 1.13 keeps them in the input's dtype,
// so the bf16 rows of scripts/validate measure 4 B a row per LayerNorm less than simulated.
ValueId LayerNorm(Tape& t, ValueId x, ValueId weight, ValueId bias, TextPart name) {
  Shape rows = t.ShapeOf(x);
  rows.back() = 1;
  return t.Apply({.name = name, .inputs = {{x}, {weight}, {bias}}, .shape = t.ShapeOf(x), .type = t.TypeOf(x),
                  .saves = {x}, .saveNew = {{rows, DType::FP32, "mean"}, {rows, DType::FP32, "rstd"}}});
}

ValueId Embedding(Tape& t, ValueId ids, ValueId weight, std::int64_t width, TextPart name) {
  Shape shape = t.ShapeOf(ids);
  shape.push_back(width);
  return t.Apply({.name = name, .inputs = {{ids, In::NoGrad}, {weight}}, .shape = shape, .type = t.TypeOf(weight),
                  .saves = {ids}});
}

}  // namespace gpumem::ops
