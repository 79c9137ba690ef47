// LlamaForCausalLM and its relatives (Mistral, Qwen2 with QKV biases, Mixtral and Qwen2-MoE):
// RMSNorm, rotary embeddings, grouped-query attention, a SwiGLU MLP or a mixture of experts.
#include "sim/families/family.hpp"
#include "parallel/sequence_split.hpp"

namespace gpumem::families {
namespace {

// Sequence parallelism: y reduce-scattered to s/t tokens, the caller's reference moved to it.
ValueId ScatterOwned(Model& m, ValueId y, const char* name) {
  const ValueId sharded = sequence_split::ScatterSequence(m, y, TextPart::View(name));
  m.t.Drop(y);
  return sharded;
}

}  // namespace

ValueId LlamaBlock(Model& m, ValueId x, const Context& c, int i) {
  Tape& t = m.t;
  const Module root = m.BlockRoot("model.layers.", i);
  const std::int64_t heads = m.a.numHeads, kv = KeyValueHeads(m.a), d = HeadDim(m.a);
  m.Scope(i, "attention");
  const ValueId residual = t.Keep(x);
  const ValueId n1 = blocks::RmsNorm(m, x, m.Child(root, "input_layernorm"));
  const ValueId qp = blocks::Linear(m, n1, m.Child(root, "self_attn.q_proj"), heads * d, "q_proj");
  const ValueId kp = blocks::Linear(m, n1, m.Child(root, "self_attn.k_proj"), kv * d, "k_proj");
  const ValueId vp = blocks::Linear(m, n1, m.Child(root, "self_attn.v_proj"), kv * d, "v_proj");
  t.Drop(n1);
  const ValueId q = blocks::Heads(m, qp, heads, "query");
  const ValueId k = blocks::Heads(m, kp, kv, "key");
  const ValueId v = blocks::Heads(m, vp, kv, "value");
  t.Drop(qp);
  t.Drop(kp);
  t.Drop(vp);
  const ValueId qr = blocks::Rope(m, q, c.cos, c.sin, "q");
  const ValueId kr = blocks::Rope(m, k, c.cos, c.sin, "k");
  t.Drop(q);
  t.Drop(k);
  // Sequence parallelism: AttentionOutput and GatedMlp reduce-scatter their row-parallel output.
  const ValueId o = blocks::AttentionOutput(m, qr, kr, v, c.mask, true, m.Child(root, "self_attn.o_proj"), "o_proj", 0.0);
  const ValueId x2 = ops::Add(t, residual, o, "residual add");
  t.Drop(residual);
  t.Drop(o);
  m.Scope(i, m.a.numExperts > 0 ? "moe" : "mlp");
  const ValueId n2 = blocks::RmsNorm(m, x2, m.Child(root, "post_attention_layernorm"));
  const ValueId mlp = m.a.numExperts > 0
                          ? blocks::MoE(m, n2, root)
                          : blocks::GatedMlp(m, n2, m.Child(root, "mlp."), IntermediateSize(m.a), "gate_proj",
                                             "up_proj", "down_proj", "mlp");
  t.Drop(n2);
  const ValueId y = ops::Add(t, x2, mlp, "residual add");
  t.Drop(x2);
  t.Drop(mlp);
  return y;
}

ValueId LlamaForward(Model& m, ValueId ids, const RunBlock& block) {
  Tape& t = m.t;
  Context c;
  m.Scope(-1, "embeddings");
  ValueId x = blocks::WordEmbedding(m, ids, m.parameters.ByName(t, "model.embed_tokens.weight"),
                                    "embed_tokens(input_ids)");
  if (m.sequenceShards > 1) x = ScatterOwned(m, x, "embeddings reduce-scatter (s/t)");
  // Rotary tables for this forward: cos and sin [1, 1, s, head_dim] in the hidden dtype.
  m.Scope(-1, "rotary embedding");
  c.cos = t.Fresh({1, 1, m.s, HeadDim(m.a)}, t.TypeOf(x), "cos");
  c.sin = t.Fresh({1, 1, m.s, HeadDim(m.a)}, t.TypeOf(x), "sin");
  x = DecoderBlocks(m, x, c, block);
  m.Scope(-1, "final norm");
  const ValueId normed = blocks::RmsNorm(m, x, RootModule(m, "model.norm"));
  t.Drop(x);
  if (m.sequenceShards > 1) return sequence_split::LmHead(m, normed, "model.embed_tokens.weight", c);
  return LmHead(m, normed, "model.embed_tokens.weight", c);
}

}  // namespace gpumem::families
