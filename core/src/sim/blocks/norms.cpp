// Normalisations: RMSNorm as LlamaRMSNorm writes it, LayerNorm as one native kernel.
#include "sim/blocks/blocks.hpp"

namespace gpumem::blocks {

ValueId RmsNorm(Model& m, ValueId x, const Module& module) {
  Tape& t = m.t;
  const DType inputType = t.TypeOf(x);
  Shape rows = t.ShapeOf(x);
  rows.back() = 1;
  const Text name = module.text;
  const ValueId x32 = ops::To(t, x, DType::FP32);
  const ValueId square = t.Apply({.name = t.T({name, " pow(2)"}), .inputs = {{x32}}, .shape = t.ShapeOf(x),
                                  .type = DType::FP32, .saves = {x32}});
  const ValueId variance = t.Apply({.name = t.T({name, " mean"}), .inputs = {{square}}, .shape = rows,
                                    .type = DType::FP32});
  t.Drop(square);
  const ValueId shifted = ops::AddConstant(t, variance, kNoValue, t.T({name, " variance + eps"}));
  t.Drop(variance);
  const ValueId rstd = ops::SavesOutput(t, shifted, t.T({name, " rsqrt"}), DType::FP32);
  t.Drop(shifted);
  const ValueId normed = ops::Mul(t, x32, rstd, t.T({name, " x * rsqrt"}));
  t.Drop(x32);
  t.Drop(rstd);
  if (m.a.rmsNormUnitOffset) {
    // GemmaRMSNorm (transformers models/gemma/modeling_gemma.py): output * (1.0 +
    // self.weight.float()), then output.type_as(x). The scale is applied in fp32, so the product
    // saves the fp32 normalised rows where Llama's saves their 16-bit cast; weight.float() and
    // 1 + weight are [hidden] temporaries.
    const ValueId weight32 = ops::To(t, m.P(module), DType::FP32);
    const ValueId scale = ops::AddConstant(t, weight32, kNoValue, t.T({name, " 1 + weight"}));
    t.Drop(weight32);
    const ValueId scaled = ops::Mul(t, normed, scale, t.T({name, " x * (1 + weight)"}));
    t.Drop(normed);
    t.Drop(scale);
    const ValueId y = ops::To(t, scaled, inputType);
    t.Drop(scaled);
    return y;
  }
  if (m.a.olmo2Layout) {
    // Olmo2RMSNorm (transformers models/olmo2/modeling_olmo2.py): (self.weight * hidden_states)
    // .to(input_dtype). The weight multiplies the fp32 rows, so the product saves them where
    // Llama's saves their 16-bit cast, and the product is fp32 until the cast.
    const ValueId scaled = ops::Mul(t, m.P(module), normed, t.T({name, " weight * x (fp32)"}));
    t.Drop(normed);
    const ValueId y = ops::To(t, scaled, inputType);
    t.Drop(scaled);
    return y;
  }
  const ValueId cast = ops::To(t, normed, inputType);
  t.Drop(normed);
  const ValueId y = ops::Mul(t, m.P(module), cast, t.T({name, " weight * x"}));
  t.Drop(cast);
  return y;
}

ValueId LayerNorm(Model& m, ValueId x, const Module& module) {
  Tape& t = m.t;
  // Under autocast layer_norm is an fp32 op: a 16-bit input is copied to fp32 first.
  const ValueId in = t.autocast() ? ops::To(t, x, DType::FP32) : t.Keep(x);
  const ValueId weight = m.P(module, "weight");
  const ValueId bias = m.P(module, "bias");
  const ValueId y = ops::LayerNorm(t, in, weight, bias, module.text);
  t.Drop(in);
  return y;
}

}  // namespace gpumem::blocks
