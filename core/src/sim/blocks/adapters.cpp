// A linear layer as fine-tuning finds it: plain (nn.Linear), with a quantized weight
// (bitsandbytes Linear4bit / Linear8bitLt), and wrapped by PEFT's LoRA or DoRA layer. Every
// projection of every family goes through blocks::Linear, so each kind of layer is written once.
//
// Sources (read, not copied):
//   peft src/peft/tuners/lora/layer.py Linear.forward (0.11 era, commit 0a6cd5a of dora.py):
//     result = base_layer(x); x = x.to(lora_A.weight.dtype);
//     LoRA: result = result + lora_B(lora_A(dropout(x))) * scaling
//     DoRA: x = dropout(x); result = result + lora_magnitude_vector(x, ...)
//     result = result.to(torch_result_dtype)
//   peft src/peft/tuners/lora/dora.py DoraLinearLayer.forward: lora_B(lora_A(x)); x_eye =
//     torch.eye(in); lora_weight = lora_B(lora_A(x_eye)).T; weight = dequantize(base).to(x.dtype);
//     weight_norm = ‖weight + scaling·lora_weight.detach()‖ per row, detached; mag_norm_scale =
//     (magnitude / weight_norm).view(1, −1); (mag_norm_scale − 1)·F.linear(x, weight) +
//     mag_norm_scale·lora_result·scaling.
//   bitsandbytes nn/modules.py Linear4bit.forward: x.to(compute_dtype), bias.to(compute_dtype),
//     matmul_4bit, out.to(inp_dtype); autograd/_functions.py MatMul4Bit: forward F.linear(A,
//     dequantize_4bit(B).to(A.dtype).t(), bias) and saves only B (ctx.tensors = (None, B));
//     backward grad_A = grad_output @ dequantize_4bit(B).to(grad_output.dtype) — the dequantized
//     16-bit weight exists once in forward and again in backward. MatMul8bitLt (int8): the input
//     row-quantized to int8 (CA, CAt) with fp32 scales, CAt and A saved, and in backward
//     CB.to(dtype_A) · SCB/127 as the dequantized weight.
#include "gpumem/finetune.hpp"
#include "sim/blocks/blocks.hpp"
#include "parallel/sequence_split.hpp"

namespace gpumem::blocks {
namespace {

bool IsQuantized(const Tensor* p) {
  return p != nullptr && (p->storage == Tensor::Storage::NF4 || p->storage == Tensor::Storage::NF4Double ||
                          p->storage == Tensor::Storage::Int8);
}

// The weight's shape as nn.Linear holds it, [out, in].
Shape WeightShape(std::int64_t out, std::int64_t in) { return Shape{out, in}; }

// bitsandbytes' quantized linear (Linear4bit, or Linear8bitLt with has_fp16_weights=False).
ValueId QuantizedLinear(Model& m, ValueId x, const Module& module, const Tensor& weightTensor, std::int64_t out,
                        TextPart name) {
  Tape& t = m.t;
  const ValueId weight = m.P(module, "weight");  // frozen; its type is the compute dtype
  const ValueId bias = m.POptional(module, "bias");
  const DType inputType = t.TypeOf(x);
  const std::int64_t in = t.ShapeOf(x).back();
  const bool int8 = weightTensor.storage == Tensor::Storage::Int8;
  // Linear4bit: x.to(compute_dtype); Linear8bitLt casts to fp16 inside the quantization.
  const DType compute = int8 ? DType::FP16 : t.TypeOf(weight);
  const ValueId xc = ops::To(t, x, compute);
  const ValueId bc = bias == kNoValue ? kNoValue : ops::To(t, bias, compute);
  const Text n = t.T({name});
  Shape outShape = t.ShapeOf(x);
  outShape.back() = out;
  std::int64_t rows = 1;
  for (int i = 0; i + 1 < t.ShapeOf(x).rank; ++i) rows *= t.ShapeOf(x)[i];
  ValueId y = kNoValue;
  if (!int8) {
    // F.linear(A, dequantize_4bit(B).to(A.dtype).t()): the 16-bit weight lives for the matmul.
    const ValueId dequantized = t.Fresh(WeightShape(out, in), compute, t.T({n, " dequantized weight"}),
                                        Category::WeightCopies);
    Tape::OpSpec spec{.name = n, .inputs = {{xc}, {weight}}, .shape = outShape, .type = compute,
                      .backwardTemps = {{WeightShape(out, in), compute, "dequantize_4bit(weight) (backward)"}}};
    if (bc != kNoValue) spec.inputs.push_back({bc});
    y = t.Apply(spec);
    t.Drop(dequantized);
  } else {
    // MatMul8bitLt: CA and CAt (int8, 1 B) with fp32 row / column scales; CAt, SCAt and A saved.
    const ValueId ca = t.Fresh({rows, in}, DType::Bool, t.T({n, " CA (int8 input)"}));
    Tape::OpSpec spec{.name = n, .inputs = {{xc}, {weight}}, .shape = outShape, .type = compute,
                      .saves = {xc},
                      .saveNew = {{Shape{rows, in}, DType::Bool, "CAt (int8 input, transposed)"},
                                  {Shape{in}, DType::FP32, "SCAt"}},
                      .backwardTemps = {{WeightShape(out, in), compute, "CB · SCB / 127 (backward)"},
                                        {Shape{rows, out}, DType::Bool, "Cgrad (int8 gradient)"}}};
    if (bc != kNoValue) spec.inputs.push_back({bc});
    y = t.Apply(spec);
    t.Drop(ca);
  }
  t.Drop(xc);
  t.Drop(bc);
  const ValueId result = ops::To(t, y, inputType);  // out.to(inp_dtype)
  t.Drop(y);
  return result;
}

// torchao's LinearNF4 (torchao/dtypes/nf4tensor.py), what torchtune's LoRALinear and
// FrozenNF4Linear run with quantize_base=True (linear_nf4(input=x, weight=self.weight)):
// forward F.linear(input, weight.to(input.dtype)) and ctx.save_for_backward(weight) — the NF4Tensor
// itself, the parameter's storage, so nothing new is saved; backward grad_output @
// weight.to(grad_output.dtype), the weight dequantized again. weight.to(dtype) is
// function_to_dtype → get_original_weight(), whose locals all live until it returns:
//   first_elements  = (quantized_data >> 4).to(torch.long)     int64 [n/2] (a uint8 [n/2] on the way)
//   second_elements = (quantized_data & 0b1111).to(torch.long) int64 [n/2] (likewise)
//   dequantized_first / _second = nf4[...]                      w [n/2] each
//   scalers = dequantize_scalers(...): int8 / factor, + scaler_mean   w [n/64] (one of each on the way)
//   scaled_first / _second = dequantized_* × repeated.flatten()   w [n/2] each (the expand copied for each)
//   torch.stack([...], dim=-1).reshape(shape)                    w [n]: the dequantized weight
// so the dequantization peaks at 8n + 3·w·n + w·n/64 bytes for n weights (14n + n/32 in bf16).
ValueId TorchaoNf4Linear(Model& m, ValueId x, const Module& module, std::int64_t out, TextPart name) {
  Tape& t = m.t;
  const ValueId weight = m.P(module, "weight");  // frozen (requires_grad=False), the model's dtype
  const DType type = t.TypeOf(x);                // weight.to(input.dtype): validation keeps it the NF4Tensor's
  const std::int64_t in = t.ShapeOf(x).back();
  const std::int64_t half = out * in / 2, scalers = out * in / kTorchaoNf4BlockSize;
  const Text n = t.T({name});
  constexpr Category kCopies = Category::WeightCopies;
  auto unpack = [&](const char* shift, const char* codes) {
    const ValueId packed = t.Fresh(Shape{half}, DType::UInt8, t.T({n, TextPart::View(shift)}), kCopies);
    const ValueId wide = t.Fresh(Shape{half}, DType::Int64, t.T({n, TextPart::View(codes)}), kCopies);
    t.Drop(packed);
    return wide;
  };
  const ValueId first = unpack(" quantized_data >> 4", " first_elements (int64)");
  const ValueId second = unpack(" quantized_data & 0b1111", " second_elements (int64)");
  const ValueId firstValues = t.Fresh(Shape{half}, type, t.T({n, " nf4[first_elements]"}), kCopies);
  const ValueId secondValues = t.Fresh(Shape{half}, type, t.T({n, " nf4[second_elements]"}), kCopies);
  const ValueId divided = t.Fresh(Shape{scalers}, type, t.T({n, " quantized_scalers / quantization_factor"}), kCopies);
  const ValueId scalerValues = t.Fresh(Shape{scalers}, type, t.T({n, " scalers (+ scaler_mean)"}), kCopies);
  t.Drop(divided);
  auto scale = [&](const char* what) {
    const ValueId repeated = t.Fresh(Shape{half}, type, t.T({n, " repeated.flatten()"}), kCopies);
    const ValueId scaled = t.Fresh(Shape{half}, type, t.T({n, TextPart::View(what)}), kCopies);
    t.Drop(repeated);
    return scaled;
  };
  const ValueId scaledFirst = scale(" scaled_first");    // dequantized_first × repeated.flatten()
  const ValueId scaledSecond = scale(" scaled_second");  // dequantized_second × repeated.flatten()
  const ValueId dequantized = t.Fresh(WeightShape(out, in), type, t.T({n, " dequantized weight (torch.stack)"}), kCopies);
  for (ValueId local : {first, second, firstValues, secondValues, scalerValues, scaledFirst, scaledSecond}) t.Drop(local);
  Shape outShape = t.ShapeOf(x);
  outShape.back() = out;
  const std::int64_t w = BytesPerElement(type);
  const std::int64_t localsBytes = 2 * half * 8 + 4 * half * w + scalers * w;
  Tape::OpSpec spec{.name = n, .inputs = {{x}, {weight}}, .shape = outShape, .type = type,
                    .backwardTemps = {{Shape{localsBytes}, DType::UInt8, "get_original_weight locals (backward)", true},
                                      {WeightShape(out, in), type, "weight.to(grad_output.dtype) (backward)"}}};
  const ValueId y = t.Apply(spec);
  t.Drop(dequantized);
  return y;
}

// The base layer: nn.Linear or a quantized one.
ValueId BaseLinear(Model& m, ValueId x, const Module& module, std::int64_t out, TextPart name) {
  const Tensor* w = m.parameters.TensorOf(module, "weight");
  if (w != nullptr && w->storage == Tensor::Storage::TorchaoNF4) return TorchaoNf4Linear(m, x, module, out, name);
  if (IsQuantized(w)) return QuantizedLinear(m, x, module, *w, out, name);
  return ops::Linear(m.t, x, m.P(module, "weight"), m.POptional(module, "bias"), out, name);
}

// DoraLinearLayer.forward on x (already in the adapters' dtype and through dropout).
ValueId DoraDelta(Model& m, ValueId x, const Module& module, const Module& base, ValueId a, ValueId b,
                  std::int64_t out, const Text& n) {
  Tape& t = m.t;
  const std::int64_t in = t.ShapeOf(x).back(), r = m.Finetune().r;
  const DType type = t.TypeOf(x);
  const ValueId hidden = ops::Linear(t, x, a, kNoValue, r, t.T({n, " lora_A.default"}));
  const ValueId loraResult = ops::Linear(t, hidden, b, kNoValue, out, t.T({n, " lora_B.default"}));
  t.Drop(hidden);
  // lora_weight = lora_B(lora_A(eye(in))).T is only used detached: its graph (which would keep
  // x_eye and lora_A(x_eye)) is reachable from no loss and dies when forward returns, with the
  // locals x_eye and lora_weight that hold it. So it is recorded as no history, and its
  // tensors are held to the end of this forward (validated: scripts/validate llama-dora-*).
  const bool recording = t.SetRecording(false);
  const ValueId eye = t.Fresh({in, in}, type, t.T({n, " x_eye = eye(in)"}));
  const ValueId eyeA = ops::Linear(t, eye, a, kNoValue, r, t.T({n, " lora_A(x_eye)"}));
  const ValueId product = ops::Linear(t, eyeA, b, kNoValue, out, t.T({n, " lora_B(lora_A(x_eye))"}));
  t.SetRecording(recording);
  // weight = dequantize_module_weight(base_layer).to(x.dtype): a copy unless already that dtype.
  const Tensor* w = m.parameters.TensorOf(base, "weight");
  ValueId weight = m.P(base, "weight");
  ValueId dense = kNoValue;
  if (IsQuantized(w)) {
    dense = t.Fresh(WeightShape(out, in), type, t.T({n, " dequantize(weight).to(x.dtype)"}), Category::WeightCopies);
  } else if (t.TypeOf(weight) != type) {
    dense = t.Fresh(WeightShape(out, in), type, t.T({n, " weight.to(x.dtype)"}), Category::WeightCopies);
  }
  const ValueId denseWeight = dense != kNoValue ? dense : weight;
  // get_weight_norm under .detach(): scaling·lora_weight and weight + that, then the row norms.
  const ValueId scaled = t.Fresh(WeightShape(out, in), type, t.T({n, " scaling · lora_weight"}));
  const ValueId summed = t.Fresh(WeightShape(out, in), type, t.T({n, " weight + scaling · lora_weight"}));
  t.Drop(scaled);
  const ValueId norm = t.Fresh({out}, type, t.T({n, " weight_norm"}));
  t.Drop(summed);
  // magnitude / weight_norm (the division keeps the norm for the magnitude's gradient).
  const ValueId magnitude = m.P(m.Child(module, ".lora_magnitude_vector.default"), "weight");
  const ValueId ratio = t.Apply({.name = t.T({n, " magnitude / weight_norm"}), .inputs = {{magnitude}, {norm, In::NoGrad}},
                                 .shape = {out}, .type = Promote(t.TypeOf(magnitude), type), .saves = {norm}});
  t.Drop(norm);
  const ValueId scale = ops::View(t, ratio, {1, out}, t.T({n, " mag_norm_scale"}));
  t.Drop(ratio);
  const ValueId minusOne = ops::AddConstant(t, scale, kNoValue, t.T({n, " mag_norm_scale − 1"}));
  // F.linear(x, weight) again: the base projection recomputed on the adapters' input.
  const ValueId again = ops::Linear(t, x, denseWeight, kNoValue, out, t.T({n, " F.linear(x, weight)"}));
  const ValueId left = ops::Mul(t, minusOne, again, t.T({n, " (mag_norm_scale − 1) · base"}));
  t.Drop(minusOne);
  t.Drop(again);
  const ValueId right = ops::Mul(t, scale, loraResult, t.T({n, " mag_norm_scale · lora_result"}));
  t.Drop(scale);
  t.Drop(loraResult);
  const ValueId rightScaled = ops::Scale(t, right, t.T({n, " × scaling"}));
  t.Drop(right);
  const ValueId delta = ops::Add(t, left, rightScaled, t.T({n, " result_dora"}));
  t.Drop(left);
  t.Drop(rightScaled);
  // The forward's locals go when it returns: x_eye, lora_A(x_eye) (held by lora_B's node),
  // lora_weight and the dense weight copy (which lives on where F.linear saved it for x's
  // gradient).
  t.Drop(eye);
  t.Drop(eyeA);
  t.Drop(product);
  t.Drop(dense);
  return delta;
}

}  // namespace

ValueId Linear(Model& m, ValueId x, const Module& module, std::int64_t out, TextPart name) {
  // Megatron --sequence-parallel: a column-parallel linear on a sequence-sharded input gathers it.
  if (sequence_split::IsSequenceSharded(m, x)) {
    return sequence_split::GatherLinear(m, x, m.P(module), m.POptional(module), out, name);
  }
  // A module PEFT wrapped has no "<module>.weight": its weight is "<module>.base_layer.weight".
  if (m.parameters.TensorOf(module, "weight") != nullptr) return BaseLinear(m, x, module, out, name);
  Tape& t = m.t;
  const Module base = m.Child(module, ".base_layer");
  const Text n = t.T({name});
  const Tensor* baseWeight = m.parameters.TensorOf(base, "weight");
  const bool quantized = IsQuantized(baseWeight);
  ValueId result = BaseLinear(m, x, base, out, name);
  const DType resultType = t.TypeOf(result);
  if (quantized && baseWeight->storage != Tensor::Storage::Int8) {
    // peft lora/bnb.py Linear4bit.forward: result = result.clone() ("defensively", for 4-bit).
    const ValueId cloned = ops::Copy(t, result, t.ShapeOf(result), t.T({n, " result.clone()"}));
    t.Drop(result);
    result = cloned;
  }
  const ValueId a = m.P(m.Child(module, ".lora_A.default"), "weight");
  const ValueId b = m.P(m.Child(module, ".lora_B.default"), "weight");
  const ValueId xa = ops::To(t, x, t.TypeOf(a));  // x = x.to(lora_A.weight.dtype)
  const ValueId dropped = ops::Dropout(t, xa, m.Finetune().loraDropout, t.T({n, " lora_dropout"}));
  t.Drop(xa);
  ValueId delta = kNoValue;
  if (m.Finetune().useDora) {
    delta = DoraDelta(m, dropped, module, base, a, b, out, n);
  } else {
    const ValueId hidden = ops::Linear(t, dropped, a, kNoValue, m.Finetune().r, t.T({n, " lora_A.default"}));
    const ValueId projected = ops::Linear(t, hidden, b, kNoValue, out, t.T({n, " lora_B.default"}));
    t.Drop(hidden);
    delta = ops::Scale(t, projected, t.T({n, " × scaling"}));  // a Python float: nothing saved
    t.Drop(projected);
  }
  t.Drop(dropped);
  if (quantized) {
    // lora/bnb.py (Linear4bit, Linear8bitLt): output.to(expected_dtype), then result + output.
    const ValueId cast = ops::To(t, delta, resultType);
    t.Drop(delta);
    const ValueId sum = ops::Add(t, result, cast, t.T({n, " result + lora"}));
    t.Drop(result);
    t.Drop(cast);
    return sum;
  }
  const ValueId sum = ops::Add(t, result, delta, t.T({n, " result + lora"}));
  t.Drop(result);
  t.Drop(delta);
  const ValueId y = ops::To(t, sum, resultType);  // result.to(torch_result_dtype)
  t.Drop(sum);
  return y;
}

}  // namespace gpumem::blocks
