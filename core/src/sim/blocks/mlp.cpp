// MLPs: the activation, GPT-2/BERT's plain MLP, and the gated (SwiGLU) MLP of the Llama family.
#include "sim/blocks/blocks.hpp"
#include "parallel/sequence_split.hpp"

namespace gpumem::blocks {

ValueId Activation(Model& m, ValueId x, TextPart name) {
  Tape& t = m.t;
  switch (m.a.hiddenAct) {
    case HiddenAct::GELU:
    case HiddenAct::GELUTanh:
    case HiddenAct::SiLU:
      return ops::SavesInput(t, x, name);
    case HiddenAct::GELUNew: {
      // 0.5 * x * (1.0 + tanh(sqrt(2/π) * (x + 0.044715 * x³))), evaluated left to right.
      // Under autocast pow is an fp32 op: it runs on (and saves) an fp32 copy of x, and the
      // rest of the formula is promoted to fp32.
      const Text n = t.T({name});
      const ValueId half = ops::Scale(t, x, t.T({n, " 0.5·x"}));
      const ValueId base = t.autocast() ? ops::To(t, x, DType::FP32) : t.Keep(x);
      const ValueId cube = t.Apply({.name = t.T({n, " x³"}), .inputs = {{base}}, .shape = t.ShapeOf(x),
                                    .type = t.TypeOf(base), .saves = {base}});
      t.Drop(base);
      const ValueId scaled = ops::Scale(t, cube, t.T({n, " 0.044715·x³"}));
      t.Drop(cube);
      const ValueId inner = ops::Add(t, x, scaled, t.T({n, " x + 0.044715·x³"}));
      t.Drop(scaled);
      const ValueId arg = ops::Scale(t, inner, t.T({n, " √(2/π)·(…)"}));
      t.Drop(inner);
      const ValueId th = ops::SavesOutput(t, arg, t.T({n, " tanh"}), t.TypeOf(arg));
      t.Drop(arg);
      const ValueId onePlus = ops::AddConstant(t, th, kNoValue, t.T({n, " 1 + tanh"}));
      t.Drop(th);
      const ValueId y = ops::Mul(t, half, onePlus, t.T({n, " output"}));
      t.Drop(half);
      t.Drop(onePlus);
      return y;
    }
  }
  return t.Keep(x);
}

ValueId PlainMlp(Model& m, ValueId x, const Module& up, const Module& down, const char* label,
                 ValueId* activation) {
  Tape& t = m.t;
  const TextPart l = TextPart::View(label);
  const ValueId wide = Linear(m, x, up, IntermediateSize(m.a), t.T({l, " up"}));
  const ValueId act = Activation(m, wide, t.T({l, " activation"}));
  t.Drop(wide);
  // Tensor parallelism: `up` is column-parallel (IntermediateSize is the rank's 1/t), `down`
  // row-parallel (its whole h output, reduce-scattered to s/t tokens under sequence parallelism).
  ValueId narrow = Linear(m, act, down, m.a.hiddenSize, t.T({l, " down"}));
  if (activation != nullptr) *activation = act;  // the caller's reference now
  else t.Drop(act);
  narrow = sequence_split::RowParallelOutput(m, narrow, t.T({l, " down reduce-scatter (s/t)"}));
  const ValueId dropped = ops::Dropout(t, narrow, m.a.hiddenDropout, t.T({l, " dropout"}));
  t.Drop(narrow);
  return dropped;
}

ValueId GatedMlp(Model& m, ValueId x, const Module& module, std::int64_t inter, const char* gate,
                 const char* up, const char* down, TextPart label) {
  Tape& t = m.t;
  const TextPart g_ = TextPart::View(gate), u_ = TextPart::View(up), d_ = TextPart::View(down);
  const ValueId g = Linear(m, x, m.Child(module, gate), inter, t.T({label, " ", g_}));
  const ValueId act = Activation(m, g, t.T({label, " act_fn"}));
  t.Drop(g);
  const ValueId u = Linear(m, x, m.Child(module, up), inter, t.T({label, " ", u_}));
  const ValueId prod = ops::Mul(t, act, u, t.T({label, " act·up"}));
  t.Drop(act);
  t.Drop(u);
  const ValueId y = Linear(m, prod, m.Child(module, down), m.a.hiddenSize, t.T({label, " ", d_}));
  t.Drop(prod);
  return sequence_split::RowParallelOutput(m, y, t.T({d_, " reduce-scatter (s/t)"}));
}

ValueId FusedGatedMlp(Model& m, ValueId x, const Module& module, std::int64_t inter, TextPart label) {
  Tape& t = m.t;
  // Phi3MLP.forward (transformers models/phi3/modeling_phi3.py): up_states = gate_up_proj(x);
  // gate, up_states = up_states.chunk(2, dim=-1); up_states = up_states * act(gate). The two
  // halves are views of one [b, s, 2·inter] tensor that act and the product keep, and their
  // gradients meet in one full-size tensor (split_backward's cat) before gate_up_proj's backward.
  const ValueId gateUp = Linear(m, x, m.Child(module, "gate_up_proj"), 2 * inter, t.T({label, " gate_up_proj"}));
  const int last = t.ShapeOf(gateUp).rank - 1;
  const SmallVec<ValueId, 8> halves = t.Chunk(t.T({label, " gate_up.chunk(2)"}), gateUp, 2, last);
  t.Drop(gateUp);
  const ValueId act = Activation(m, halves[0], t.T({label, " act_fn(gate)"}));
  const ValueId prod = ops::Mul(t, halves[1], act, t.T({label, " up·act"}));
  t.Drop(halves[0]);
  t.Drop(halves[1]);
  t.Drop(act);
  const ValueId y = Linear(m, prod, m.Child(module, "down_proj"), m.a.hiddenSize, t.T({label, " down_proj"}));
  t.Drop(prod);
  return sequence_split::RowParallelOutput(m, y, t.T({label, " down_proj reduce-scatter (s/t)"}));
}

}  // namespace gpumem::blocks
