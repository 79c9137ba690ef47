// LlamaForCausalLM and its relatives (Mistral, Qwen2 with QKV biases, Mixtral and Qwen2-MoE):
// RMSNorm, rotary embeddings, grouped-query attention, a SwiGLU MLP or a mixture of experts.
#include <tuple>
#include <utility>

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

// Gemma2DecoderLayer's norms on a sub-layer's output (post_attention_layernorm after the
// attention, post_feedforward_layernorm after the MLP): the caller's reference moves to the
// normalised tensor.
ValueId NormedOwned(Model& m, ValueId x, const Module& norm) {
  const ValueId y = blocks::RmsNorm(m, x, norm);
  m.t.Drop(x);
  return y;
}

// residual + out, or Granite's residual + out * residual_multiplier (GraniteDecoderLayer.forward):
// the product is a new tensor, alive with `out` until the sum is made; it saves nothing (a
// Python scalar). The caller still holds both operands.
ValueId ResidualAdd(Model& m, ValueId residual, ValueId out) {
  Tape& t = m.t;
  if (!m.a.graniteMultipliers) return ops::Add(t, residual, out, "residual add");
  const ValueId scaled = ops::Scale(t, out, "output * residual_multiplier");
  const ValueId y = ops::Add(t, residual, scaled, "residual add");
  t.Drop(scaled);
  return y;
}

}  // namespace

bool RopeLayer(const ArchitectureDef& a, int i) {
  // SmolLM3Attention: self.use_rope = config.no_rope_layers[layer_idx], by default 0 (no RoPE) on
  // every no_rope_layer_interval-th layer (SmolLM3Config); the q and k views go to attention as
  // they are there.
  return a.noRopeInterval <= 0 || (i + 1) % a.noRopeInterval != 0;
}

bool SlidingLayer(const ArchitectureDef& a, int i) {
  // Gemma2Config.layer_types: "sliding_attention" if bool((i + 1) % sliding_window_pattern) else
  // "full_attention" (Gemma 2: the even layers slide).
  return a.slidingWindow > 0 && (a.slidingWindowPattern == 0 || (i + 1) % a.slidingWindowPattern != 0);
}

// apply_rotary_pos_emb on q and k; the caller's references move. OLMo's (modeling_olmo2.py,
// modeling_olmo3.py) ends in q_embed.to(q_type): where the tables are fp32 (Olmo2RotaryEmbedding
// returns them uncast; any under autocast) the fp32 products are cast back. Llama's keeps them.
std::pair<ValueId, ValueId> RotatedQueryKey(Model& m, ValueId q, ValueId k, ValueId cos, ValueId sin) {
  Tape& t = m.t;
  const DType qType = t.TypeOf(q), kType = t.TypeOf(k);
  ValueId qr = blocks::Rope(m, q, cos, sin, "q");
  ValueId kr = blocks::Rope(m, k, cos, sin, "k");
  t.Drop(q);
  t.Drop(k);
  if (!m.a.olmo2Layout) return {qr, kr};
  auto castBack = [&t](ValueId v, DType type) {  // the reference moves to the cast
    if (t.TypeOf(v) == type) return v;
    const ValueId cast = ops::To(t, v, type);
    t.Drop(v);
    return cast;
  };
  qr = castBack(qr, qType);  // q_embed.to(q_type), then k_embed.to(k_type)
  kr = castBack(kr, kType);
  return {qr, kr};
}

// Olmo2DecoderLayer.forward (transformers models/olmo2/modeling_olmo2.py; OLMo 3 the same with
// its sliding layers): no norm before the sub-layers; q_norm(q_proj(x)) and k_norm(k_proj(x))
// over the whole projections, then v_proj, each viewed as heads; each sub-layer's output is
// normalised before its residual add.
ValueId Olmo2Block(Model& m, ValueId x, const Context& c, int i) {
  Tape& t = m.t;
  const Module root = m.BlockRoot("model.layers.", i);
  const std::int64_t heads = m.a.numHeads, kv = KeyValueHeads(m.a), d = HeadDim(m.a);
  m.Scope(i, "attention");
  const ValueId qp = blocks::Linear(m, x, m.Child(root, "self_attn.q_proj"), heads * d, "q_proj");
  const ValueId qn = NormedOwned(m, qp, m.Child(root, "self_attn.q_norm"));
  const ValueId kp = blocks::Linear(m, x, m.Child(root, "self_attn.k_proj"), kv * d, "k_proj");
  const ValueId kn = NormedOwned(m, kp, m.Child(root, "self_attn.k_norm"));
  const ValueId vp = blocks::Linear(m, x, m.Child(root, "self_attn.v_proj"), kv * d, "v_proj");
  const ValueId q = blocks::Heads(m, qn, heads, "query");
  const ValueId k = blocks::Heads(m, kn, kv, "key");
  const ValueId v = blocks::Heads(m, vp, kv, "value");
  t.Drop(qn);
  t.Drop(kn);
  t.Drop(vp);
  // (TransformerPass::Block hands a sliding layer its mask in c.mask.)
  const auto [qr, kr] = RotatedQueryKey(m, q, k, c.cos, c.sin);
  ValueId o = blocks::AttentionOutput(m, qr, kr, v, c.mask, true, m.Child(root, "self_attn.o_proj"), "o_proj", 0.0);
  o = NormedOwned(m, o, m.Child(root, "post_attention_layernorm"));
  const ValueId x2 = ops::Add(t, x, o, "residual add");
  t.Drop(o);
  m.Scope(i, "mlp");
  ValueId mlp = blocks::GatedMlp(m, x2, m.Child(root, "mlp."), IntermediateSize(m.a), "gate_proj", "up_proj",
                                 "down_proj", "mlp");
  mlp = NormedOwned(m, mlp, m.Child(root, "post_feedforward_layernorm"));
  const ValueId y = ops::Add(t, x2, mlp, "residual add");
  t.Drop(x2);
  t.Drop(mlp);
  return y;
}

ValueId LlamaBlock(Model& m, ValueId x, const Context& c, int i) {
  if (m.a.olmo2Layout) return Olmo2Block(m, x, c, i);
  Tape& t = m.t;
  const Module root = m.BlockRoot("model.layers.", i);
  const std::int64_t heads = m.a.numHeads, kv = KeyValueHeads(m.a), d = HeadDim(m.a);
  m.Scope(i, "attention");
  const ValueId residual = t.Keep(x);
  const ValueId n1 = blocks::RmsNorm(m, x, m.Child(root, "input_layernorm"));
  ValueId q = kNoValue, k = kNoValue, v = kNoValue, qkvLocal = kNoValue;
  if (m.a.fusedProjections) {
    // Phi3Attention: one qkv_proj, sliced; its RoPE ends in a cat with the pass-through part.
    const ValueId qkv = blocks::Linear(m, n1, m.Child(root, "self_attn.qkv_proj"), (heads + 2 * kv) * d, "qkv_proj");
    t.Drop(n1);
    const blocks::FusedHeads fused = blocks::FusedQkvHeads(m, qkv);
    qkvLocal = qkv;  // Phi3Attention.forward's local `qkv`: referenced until it returns
    v = fused.v;
    std::tie(q, k) = blocks::RopeWithPass(m, fused.q, fused.k, c.cos, c.sin);
    t.Drop(fused.q);
    t.Drop(fused.k);
    // transformers 5.x's DynamicCache in training (as the GPT-2 family's): SDPA saves the
    // cache's copies. For separate projections they weigh what the views kept; here they let
    // the whole qkv go once the forward returns.
    if (m.training.useCache && m.training.attention == AttentionImplementation::SDPA &&
        m.training.checkpointing == Checkpointing::None) {
      blocks::DynamicCacheCopies(m, k, v);
    }
  } else if (m.a.queryKeyNorm && m.a.gemma3Layout) {
    // Gemma3Attention: q_proj, k_proj and v_proj (each viewed as heads and transposed), then
    // q_norm and k_norm (transformers models/gemma3/modeling_gemma3.py).
    const ValueId qp = blocks::Linear(m, n1, m.Child(root, "self_attn.q_proj"), heads * d, "q_proj");
    const ValueId kp = blocks::Linear(m, n1, m.Child(root, "self_attn.k_proj"), kv * d, "k_proj");
    const ValueId vp = blocks::Linear(m, n1, m.Child(root, "self_attn.v_proj"), kv * d, "v_proj");
    t.Drop(n1);
    v = blocks::Heads(m, vp, kv, "value");
    t.Drop(vp);
    q = blocks::NormedHeads(m, qp, heads, m.Child(root, "self_attn.q_norm"), "query");
    k = blocks::NormedHeads(m, kp, kv, m.Child(root, "self_attn.k_norm"), "key");
  } else if (m.a.queryKeyNorm) {
    // Qwen3Attention: q_norm(q_proj(x).view(b, s, heads, d)).transpose(1, 2), then k the same,
    // then v (transformers models/qwen3/modeling_qwen3.py): each projection is normalised before
    // the next one runs.
    q = blocks::NormedHeads(m, blocks::Linear(m, n1, m.Child(root, "self_attn.q_proj"), heads * d, "q_proj"), heads,
                            m.Child(root, "self_attn.q_norm"), "query");
    k = blocks::NormedHeads(m, blocks::Linear(m, n1, m.Child(root, "self_attn.k_proj"), kv * d, "k_proj"), kv,
                            m.Child(root, "self_attn.k_norm"), "key");
    const ValueId vp = blocks::Linear(m, n1, m.Child(root, "self_attn.v_proj"), kv * d, "v_proj");
    t.Drop(n1);
    v = blocks::Heads(m, vp, kv, "value");
    t.Drop(vp);
  } else {
    const ValueId qp = blocks::Linear(m, n1, m.Child(root, "self_attn.q_proj"), heads * d, "q_proj");
    const ValueId kp = blocks::Linear(m, n1, m.Child(root, "self_attn.k_proj"), kv * d, "k_proj");
    const ValueId vp = blocks::Linear(m, n1, m.Child(root, "self_attn.v_proj"), kv * d, "v_proj");
    t.Drop(n1);
    q = blocks::Heads(m, qp, heads, "query");
    k = blocks::Heads(m, kp, kv, "key");
    v = blocks::Heads(m, vp, kv, "value");
    t.Drop(qp);
    t.Drop(kp);
    t.Drop(vp);
  }
  ValueId qr = q, kr = k;  // Phi-3's are rotated already
  if (!m.a.fusedProjections && RopeLayer(m.a, i)) std::tie(qr, kr) = RotatedQueryKey(m, q, k, c.cos, c.sin);
  // Sequence parallelism: AttentionOutput and GatedMlp reduce-scatter their row-parallel output.
  ValueId o = blocks::AttentionOutput(m, qr, kr, v, c.mask, true, m.Child(root, "self_attn.o_proj"), "o_proj", 0.0);
  t.Drop(qkvLocal);
  if (m.a.sandwichNorms) o = NormedOwned(m, o, m.Child(root, "post_attention_layernorm"));
  const ValueId x2 = ResidualAdd(m, residual, o);
  t.Drop(residual);
  t.Drop(o);
  m.Scope(i, m.a.numExperts > 0 ? "moe" : "mlp");
  const ValueId n2 = blocks::RmsNorm(
      m, x2, m.Child(root, m.a.sandwichNorms ? "pre_feedforward_layernorm" : "post_attention_layernorm"));
  ValueId mlp = m.a.numExperts > 0       ? blocks::MoE(m, n2, root)
                : m.a.fusedProjections ? blocks::FusedGatedMlp(m, n2, m.Child(root, "mlp."), IntermediateSize(m.a), "mlp")
                                       : blocks::GatedMlp(m, n2, m.Child(root, "mlp."), IntermediateSize(m.a),
                                                          "gate_proj", "up_proj", "down_proj", "mlp");
  t.Drop(n2);
  if (m.a.sandwichNorms) mlp = NormedOwned(m, mlp, m.Child(root, "post_feedforward_layernorm"));
  const ValueId y = ResidualAdd(m, x2, mlp);
  t.Drop(x2);
  t.Drop(mlp);
  return y;
}

bool EmbeddingsScaledAtOnce(const ArchitectureDef& a) { return a.gemma3Layout || a.graniteMultipliers; }

ValueId ScaledEmbeddings(Model& m, ValueId inputsEmbeds) {
  // GemmaModel.forward: hidden_states = inputs_embeds * normalizer, a 0-dim tensor of
  // hidden_size ** 0.5 in the embeddings' dtype, made after the rotary tables
  // (transformers models/gemma/modeling_gemma.py). The product is a new tensor and saves
  // nothing (the normalizer needs no gradient). Granite's embedding_multiplier is a Python float.
  if (m.a.graniteMultipliers) return ops::Scale(m.t, inputsEmbeds, "inputs_embeds * embedding_multiplier");
  return ops::Scale(m.t, inputsEmbeds, "inputs_embeds * normalizer (√hidden)");
}

void RotaryTables(Model& m, Context& c, DType type) {
  Tape& t = m.t;
  // Gemma3TextModel.forward: position_embeddings[layer_type] = rotary_emb(…, layer_type) for each
  // entry of layer_types, each type with its own RoPE base; layer 0 slides, so its table comes
  // first (the later calls replace a type's table with an equal one).
  if (m.a.gemma3Layout && m.a.slidingWindow > 0) {
    c.slidingCos = t.Fresh({1, 1, m.s, RotaryDim(m.a)}, type, "cos (sliding layers)");
    c.slidingSin = t.Fresh({1, 1, m.s, RotaryDim(m.a)}, type, "sin (sliding layers)");
  }
  // Olmo2RotaryEmbedding.forward returns cos and sin as computed, in fp32 (Llama's casts them to
  // the hidden states' dtype).
  if (m.a.rotaryFp32) type = DType::FP32;
  c.cos = t.Fresh({1, 1, m.s, RotaryDim(m.a)}, type, "cos");
  c.sin = t.Fresh({1, 1, m.s, RotaryDim(m.a)}, type, "sin");
}

ValueId LlamaForward(Model& m, ValueId ids, const RunBlock& block) {
  Tape& t = m.t;
  Context c;
  m.Scope(-1, "embeddings");
  // The model's forward holds inputs_embeds until it returns; with Gemma's scaling that is a
  // tensor of its own (`held`), released after the last block.
  ValueId inputsEmbeds = blocks::WordEmbedding(m, ids, m.parameters.ByName(t, "model.embed_tokens.weight"),
                                               "embed_tokens(input_ids)");
  if (EmbeddingsScaledAtOnce(m.a)) {
    // Gemma3TextScaledWordEmbedding: the module returns the scaled rows, and the unscaled ones go;
    // GraniteModel.forward: inputs_embeds = inputs_embeds * embedding_multiplier, the same.
    const ValueId scaled = ScaledEmbeddings(m, inputsEmbeds);
    t.Drop(inputsEmbeds);
    inputsEmbeds = scaled;
  }
  const bool scaleLater = m.a.embeddingScale && !m.a.gemma3Layout;
  ValueId x = scaleLater ? kNoValue : inputsEmbeds;
  const ValueId held = scaleLater ? inputsEmbeds : kNoValue;
  if (x != kNoValue && m.sequenceShards > 1) x = ScatterOwned(m, x, "embeddings reduce-scatter (s/t)");
  // Rotary tables for this forward: cos and sin [1, 1, s, rotary dim] in the hidden dtype.
  m.Scope(-1, "rotary embedding");
  RotaryTables(m, c, t.TypeOf(inputsEmbeds));
  if (held != kNoValue) {
    m.Scope(-1, "embeddings");
    x = ScaledEmbeddings(m, held);
    if (m.sequenceShards > 1) x = ScatterOwned(m, x, "embeddings reduce-scatter (s/t)");
  }
  x = DecoderBlocks(m, x, c, block);
  t.Drop(held);
  m.Scope(-1, "final norm");
  const ValueId normed = blocks::RmsNorm(m, x, RootModule(m, "model.norm"));
  t.Drop(x);
  if (m.sequenceShards > 1) return sequence_split::LmHead(m, normed, "model.embed_tokens.weight", c);
  return LmHead(m, normed, "model.embed_tokens.weight", c);
}

}  // namespace gpumem::families
