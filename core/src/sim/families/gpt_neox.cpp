// GPTNeoXForCausalLM (Pythia, GPT-NeoX-20B; transformers models/gpt_neox/modeling_gpt_neox.py):
// LayerNorm blocks whose attention reads one query_key_value projection (each head's q, k and v
// side by side), RoPE on a share of each head, a GELU MLP beside the attention (parallel
// residual), and an untied embed_out head.
#include <tuple>

#include "gpumem/finetune.hpp"
#include "sim/families/family.hpp"

namespace gpumem::families {

ValueId GptNeoXBlock(Model& m, ValueId x, const Context& c, int i) {
  Tape& t = m.t;
  const Module root = m.BlockRoot("gpt_neox.layers.", i);
  const std::int64_t heads = m.a.numHeads, d = HeadDim(m.a), h = heads * d;
  m.Scope(i, "attention");
  const ValueId residual = t.Keep(x);
  const ValueId n1 = blocks::LayerNorm(m, x, m.Child(root, "input_layernorm"));
  // GPTNeoXAttention.forward: qkv = query_key_value(x).view(b, s, heads, 3·d).transpose(1, 2);
  // q, k, v = qkv.chunk(3, dim=-1): three views sharing one SplitBackward, and the local `qkv`
  // referenced until the forward returns.
  const ValueId projected = blocks::Linear(m, n1, m.Child(root, "attention.query_key_value"), 3 * h, "query_key_value");
  t.Drop(n1);
  const ValueId qkv = ops::View(t, projected, {m.b, heads, m.s, 3 * d}, "qkv.view(b, s, heads, 3·d).transpose(1, 2)");
  t.Drop(projected);
  const SmallVec<ValueId, 8> parts = t.Chunk(t.T({"qkv.chunk(3)"}), qkv, 3, 3);
  auto [q, k] = blocks::RopeWithPass(m, parts[0], parts[1], c.cos, c.sin);  // its rotary_pct share
  t.Drop(parts[0]);
  t.Drop(parts[1]);
  ValueId v = parts[2];
  // transformers 5.x's DynamicCache in training: SDPA saves the cache's copies (as Phi-3's).
  if (m.training.useCache && m.training.attention == AttentionImplementation::SDPA &&
      m.training.checkpointing == Checkpointing::None) {
    blocks::DynamicCacheCopies(m, k, v);
  }
  const ValueId attn =
      blocks::AttentionOutput(m, q, k, v, c.mask, true, m.Child(root, "attention.dense"), "dense", m.a.hiddenDropout);
  t.Drop(qkv);
  // GPTNeoXLayer.forward: with use_parallel_residual the MLP reads the block's input, and the
  // output is mlp + attn + x; without, the MLP reads attn + x.
  m.Scope(i, "mlp");
  const ValueId mlpInput = m.a.parallelResidual ? t.Keep(residual) : ops::Add(t, attn, residual, "attn + residual");
  const ValueId n2 = blocks::LayerNorm(m, mlpInput, m.Child(root, "post_attention_layernorm"));
  const ValueId mlp = blocks::PlainMlp(m, n2, m.Child(root, "mlp.dense_h_to_4h"), m.Child(root, "mlp.dense_4h_to_h"), "mlp");
  t.Drop(n2);
  ValueId y = kNoValue;
  if (m.a.parallelResidual) {
    const ValueId sum = ops::Add(t, mlp, attn, "mlp + attn");
    y = ops::Add(t, sum, residual, "+ residual");
    t.Drop(sum);
  } else {
    y = ops::Add(t, mlp, mlpInput, "mlp + (attn + residual)");
  }
  t.Drop(mlp);
  t.Drop(attn);
  t.Drop(mlpInput);
  t.Drop(residual);
  return y;
}

ValueId GptNeoXForward(Model& m, ValueId ids, const RunBlock& block) {
  Tape& t = m.t;
  Context c;
  m.Scope(-1, "embeddings");
  const ValueId inputsEmbeds = blocks::WordEmbedding(m, ids, m.parameters.ByName(t, "gpt_neox.embed_in.weight"),
                                                     "embed_in(input_ids)");
  ValueId x = ops::Dropout(t, inputsEmbeds, m.a.hiddenDropout, "emb_dropout");
  t.Drop(inputsEmbeds);
  m.Scope(-1, "rotary embedding");
  RotaryTables(m, c, t.TypeOf(x));
  x = DecoderBlocks(m, x, c, block);
  m.Scope(-1, "final norm");
  const ValueId normed = blocks::LayerNorm(m, x, RootModule(m, "gpt_neox.final_layer_norm"));
  t.Drop(x);
  // embed_out (untied; a tied config reads embed_in's weight).
  return LmHead(m, normed, "gpt_neox.embed_in.weight", c, OutputModule(Family::GPTNeoX));
}

}  // namespace gpumem::families
