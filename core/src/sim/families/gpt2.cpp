// GPT2LMHeadModel: learned positions, pre-LayerNorm blocks with a fused QKV (Conv1D), GELU MLP,
// the head tied to the token embedding.
#include "sim/families/family.hpp"
#include "sim/savers.hpp"
#include "parallel/sequence_split.hpp"

namespace gpumem::families {

namespace {

// Whether transformers' DynamicCache costs the GPT-2 family memory in this step. transformers 5.x
// builds the cache in training whenever use_cache holds (GPT2Model.forward: DynamicCache() when
// use_cache and past_key_values is None), and DynamicLayer.update's first call copies the key and
// the value (cache_utils.py: torch.cat onto the empty tensor of lazy_initialization); the
// attention then takes those copies. Under SDPA the kernels read the views of c_attn's output as
// they are, so the copies are two b·s·kv-width tensors more per layer, saved for backward
// (measured on an H100, torch 2.11, transformers 5.17: GPT-2 8 × 1024 under autocast 303 MB
// more than with use_cache=False, and GPT-2 fp32 4 × 1024 the same, both −2 … −3.5 % without
// this; tests/data/cuda/measured-h100-torch2.11.jsonl). Under eager attention the copies replace
// the ones matmul makes anyway of the non-contiguous views (its reshape to 3-D), and the measured
// eager run is exact without them. Gradient checkpointing turns the cache off (GPT2Model.forward:
// "use_cache=True is incompatible with gradient checkpointing"). Megatron's GPT (tensor,
// sequence or context parallel, its loss or its softmax fusion) has no such cache.
bool KeepsDynamicCache(const ArchitectureDef& a, const TrainingDef& t, std::int64_t tensorParallel,
                       std::int64_t contextParallel) {
  return a.family == Family::GPT2 && t.useCache && t.attention == AttentionImplementation::SDPA &&
         t.checkpointing == Checkpointing::None && !blocks::MegatronGpt(a, t, tensorParallel, contextParallel);
}

}  // namespace

bool KeepsDynamicCache(const Model& m) { return KeepsDynamicCache(m.a, m.training, m.vocabShards, m.contextShards); }
bool KeepsDynamicCache(const Setup& setup) {
  return KeepsDynamicCache(setup.model.architecture, EffectiveTraining(setup), setup.parallel.tensorParallel,
                           setup.parallel.contextParallel);
}

ValueId Gpt2Block(Model& m, ValueId x, const Context& c, int i) {
  Tape& t = m.t;
  const Module root = m.BlockRoot("transformer.h.", i);
  // c_attn's width per part: heads · head_dim, h on one GPU and h/t on a tensor-parallel rank
  // (Megatron's ColumnParallelLinear linear_qkv); c_proj and the MLP are the shared blocks'.
  // With grouped-query attention (Megatron --num-query-groups g, g/t on a rank) k and v are g·d
  // wide each: c_attn is h + 2·g·d (Megatron's linear_qkv).
  const std::int64_t w = m.a.numHeads * HeadDim(m.a);
  const std::int64_t groups = KeyValueHeads(m.a), kvw = groups * HeadDim(m.a);
  m.Scope(i, "attention");
  const ValueId residual = t.Keep(x);
  const ValueId n1 = blocks::LayerNorm(m, x, m.Child(root, "ln_1"));
  const ValueId qkv = blocks::Linear(m, n1, m.Child(root, "attn.c_attn"), w + 2 * kvw, "c_attn (qkv)");
  t.Drop(n1);
  const auto parts = t.Split("qkv.split", qkv, {{m.b, m.s, w}, {m.b, m.s, kvw}, {m.b, m.s, kvw}});
  t.Drop(qkv);
  ValueId q = blocks::Heads(m, parts[0], m.a.numHeads, "query");
  if (groups < m.a.numHeads && groups > 1) {
    // Megatron's SelfAttention.get_query_key_value_tensors views linear_qkv's output as
    // [s, b, g, (heads/g + 2)·d] (each group's queries, then its key and value), splits it, and
    // query.reshape(s, b, -1, d) cannot merge the group dimension (stride (heads/g + 2)·d) with
    // the heads in it (stride d): a copy of the queries. One group per rank, or one query head
    // per group, reshapes a view.
    const ValueId copied = ops::Copy(t, q, t.ShapeOf(q), "query.reshape (copy: Megatron's grouped qkv layout)");
    t.Drop(q);
    q = copied;
  }
  ValueId k = blocks::Heads(m, parts[1], groups, "key");
  ValueId v = blocks::Heads(m, parts[2], groups, "value");
  for (ValueId p : parts) t.Drop(p);
  if (KeepsDynamicCache(m)) blocks::DynamicCacheCopies(m, k, v);
  const ValueId dropped =
      blocks::AttentionOutput(m, q, k, v, c.mask, true, m.Child(root, "attn.c_proj"), "c_proj", m.a.hiddenDropout);
  const ValueId x2 = ops::Add(t, dropped, residual, "residual add");
  t.Drop(dropped);
  t.Drop(residual);
  m.Scope(i, "mlp");
  const ValueId n2 = blocks::LayerNorm(m, x2, m.Child(root, "ln_2"));
  const ValueId mlp = blocks::PlainMlp(m, n2, m.Child(root, "mlp.c_fc"), m.Child(root, "mlp.c_proj"), "mlp");
  t.Drop(n2);
  const ValueId y = ops::Add(t, x2, mlp, "residual add");
  t.Drop(x2);
  t.Drop(mlp);
  return y;
}

ValueId Gpt2Forward(Model& m, ValueId ids, const RunBlock& block) {
  Tape& t = m.t;
  Context c;
  m.Scope(-1, "embeddings");
  const ValueId tokens = blocks::WordEmbedding(m, ids, m.parameters.ByName(t, "transformer.wte.weight"),
                                               "wte(input_ids)");
  const ValueId positions = t.Fresh({1, m.s}, DType::Int64, "position_ids");
  const ValueId pos = ops::Embedding(t, positions, m.parameters.ByName(t, "transformer.wpe.weight"), m.a.hiddenSize,
                                     "wpe(position_ids)");
  t.Drop(positions);
  ValueId sum = ops::Add(t, tokens, pos, "inputs_embeds + position_embeds");
  t.Drop(tokens);
  t.Drop(pos);
  // Sequence parallelism: Megatron's LanguageModelEmbedding.forward (learned positions, so no
  // reduce_scatter_embeddings) all-reduces the word embeddings, adds the positions on all s
  // tokens, then scatter_to_sequence_parallel_region keeps this rank's s/t (a view, cloned by
  // clone_scatter_output_in_embedding, default on: a new tensor) and the dropout runs on them.
  sum = sequence_split::RowParallelOutput(m, sum, "embeddings scatter (s/t)");
  ValueId x = ops::Dropout(t, sum, m.a.hiddenDropout, "embedding dropout");
  t.Drop(sum);
  x = DecoderBlocks(m, x, c, block);
  m.Scope(-1, "final norm");
  const ValueId normed = blocks::LayerNorm(m, x, RootModule(m, "transformer.ln_f"));
  t.Drop(x);
  // The head is a column-parallel linear over the rank's vocabulary (wte is a VocabParallelEmbedding).
  if (m.sequenceShards > 1) return sequence_split::LmHead(m, normed, "transformer.wte.weight", c);
  return LmHead(m, normed, "transformer.wte.weight", c);
}

ValueId DecoderBlocks(Model& m, ValueId x, Context& c, const RunBlock& block) {
  Tape& t = m.t;
  // Sliding layers get a mask of their own (transformers masking_utils
  // create_sliding_window_causal_mask). Gemma 2 and 3 make it after the full one, both into
  // causal_mask_mapping; Mistral (every layer sliding: slidingWindowPattern 0) makes only it
  // (MistralModel.forward: mask_function = create_sliding_window_causal_mask when
  // config.sliding_window is set). Eager adds it to the scores like the causal one. SDPA drops
  // it only while the sequence is shorter than the window (_ignore_causal_mask_sdpa: kv_length <
  // local_attention_size) and nothing is packed; else sdpa_mask materialises a bool
  // [b, 1, s, s], which the kernel takes as an explicit mask.
  const bool sliding = m.a.slidingWindow > 0;
  const bool full = !sliding || m.a.slidingWindowPattern > 0;
  const bool packed = m.training.packedSequences == PackedSequences::BlockCausalMask;
  if (m.training.attention == AttentionImplementation::Eager) {
    m.Scope(-1, "causal mask");
    if (full) c.mask = t.Fresh({m.b, 1, m.s, m.s}, t.TypeOf(x), "causal mask (b, 1, s, s)");
    if (sliding) c.slidingMask = t.Fresh({m.b, 1, m.s, m.s}, t.TypeOf(x), "sliding-window mask (b, 1, s, s)");
  } else {
    if (packed && full) {
      // transformers masking_utils.create_causal_mask with packed position_ids under sdpa: sdpa_mask
      // returns a bool [b, 1, s, s] (True: attend), made once and passed to every layer. (Eager
      // makes the dtype's mask above: packing changes its values, not its size.)
      m.Scope(-1, "causal mask");
      c.mask = t.Fresh({m.b, 1, m.s, m.s}, DType::Bool, "block-causal mask, packed (b, 1, s, s) bool");
    }
    if (sliding && (packed || m.s >= m.a.slidingWindow)) {
      m.Scope(-1, "causal mask");
      c.slidingMask = t.Fresh({m.b, 1, m.s, m.s}, DType::Bool, "sliding-window mask (b, 1, s, s) bool");
    }
  }
  for (int i = 0; i < static_cast<int>(m.a.numLayers); ++i) {
    const ValueId y = block(x, c, i);
    t.Drop(x);
    x = y;
  }
  return x;
}

Module RootModule(Model& m, const char* path) {
  const Module none;
  return m.Child(none, path);
}

ValueId LmHead(Model& m, ValueId normed, const char* tiedEmbedding, Context& c, std::string_view head) {
  Tape& t = m.t;
  t.Drop(c.mask);
  t.Drop(c.slidingMask);
  t.Drop(c.cos);
  t.Drop(c.sin);
  t.Drop(c.slidingCos);
  t.Drop(c.slidingSin);
  m.Scope(-1, "lm_head");
  // torchtune get_act_offloading_ctx_manager: NoOpManager hooks around the output head, whose
  // activations the loss needs at once (what follows is the head and, outside the context, the loss).
  if (ActivationOffload* offload = t.offload()) offload->SetActive(false);
  const std::string headWeight = std::string(head) + ".weight";
  if (m.parameters.Has(std::string(head) + ".base_layer.weight")) {  // LoRA on the head (PEFT renames its weight)
    const ValueId logits = blocks::Linear(m, normed, RootModule(m, std::string(head).c_str()), m.a.vocabSize, "logits");
    m.headInput = normed;  // held to the end of the loss (Model::headInput)
    return logits;
  }
  const ValueId weight = m.parameters.Has(headWeight) ? m.parameters.ByName(t, headWeight)
                                                      : m.parameters.ByName(t, tiedEmbedding);
  if (m.training.lossImplementation == LossImplementation::Chunked) {
    // torchtune: the output projection runs per chunk and the loss follows (loss.cpp), which
    // takes `normed` (TransformerDecoder.forward returns before the recipe's loss).
    m.loss = blocks::ChunkedOutputLoss(m, normed, weight, m.labels);
    return kNoValue;
  }
  if (m.training.lossImplementation == LossImplementation::FusedLinearCrossEntropy) {
    m.loss = blocks::FusedLinearCrossEntropyLoss(m, normed, weight);  // Liger: no logits (loss.cpp)
    t.Drop(normed);
    return kNoValue;
  }
  const ValueId logits = ops::Linear(t, normed, weight, kNoValue, m.a.vocabSize, "logits");
  m.headInput = normed;  // held to the end of the loss (Model::headInput)
  return logits;
}

}  // namespace gpumem::families
