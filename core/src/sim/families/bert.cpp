// BertForSequenceClassification / BertForMaskedLM: word + token-type + position embeddings,
// post-LayerNorm layers with a GELU MLP, and the task head.
#include "sim/families/family.hpp"
#include "parallel/sequence_split.hpp"

namespace gpumem::families {

ValueId BertLayer(Model& m, ValueId x, const Context& c, int i) {
  Tape& t = m.t;
  const Module root = m.BlockRoot("bert.encoder.layer.", i);
  // The query / key / value width: heads · head_dim, h on one GPU and h/t on a tensor-parallel
  // rank (column-parallel; the attention output dense and output.dense are row-parallel).
  const std::int64_t h = m.a.numHeads * HeadDim(m.a);
  m.Scope(i, "attention");
  const ValueId qp = blocks::Linear(m, x, m.Child(root, "attention.self.query"), h, "query");
  const ValueId q = blocks::Heads(m, qp, m.a.numHeads, "query");
  t.Drop(qp);
  const ValueId kp = blocks::Linear(m, x, m.Child(root, "attention.self.key"), h, "key");
  const ValueId k = blocks::Heads(m, kp, m.a.numHeads, "key");
  t.Drop(kp);
  const ValueId vp = blocks::Linear(m, x, m.Child(root, "attention.self.value"), h, "value");
  const ValueId v = blocks::Heads(m, vp, m.a.numHeads, "value");
  t.Drop(vp);
  const ValueId dropped = blocks::AttentionOutput(m, q, k, v, c.mask, false, m.Child(root, "attention.output.dense"),
                                                  "attention output dense", m.a.hiddenDropout);
  // BertSelfOutput / BertOutput: `hidden_states = self.LayerNorm(hidden_states + input_tensor)`
  // (modeling_bert.py): the dropout's output stays bound to `hidden_states` until the LayerNorm
  // returns, so it is let go after the norm, not after the add (measured on CPU torch: the
  // forward peak of bert-cls-fp32 is at the last output.LayerNorm with it held).
  const ValueId sum = ops::Add(t, dropped, x, "residual add");
  const ValueId attnOut = blocks::LayerNorm(m, sum, m.Child(root, "attention.output.LayerNorm"));
  t.Drop(dropped);
  t.Drop(sum);
  m.Scope(i, "mlp");
  // BertLayer.feed_forward_chunk: `intermediate_output = self.intermediate(attention_output)`
  // is held until self.output(intermediate_output, attention_output) returns, through the
  // output dense, dropout, add and LayerNorm (measured on CPU torch, bert-lora-ckpt-ampbf16:
  // the recompute's peak is that LayerNorm with the activation's output held, which nothing
  // saves when output.dense is frozen).
  ValueId intermediate = kNoValue;
  const ValueId dropped2 = blocks::PlainMlp(m, attnOut, m.Child(root, "intermediate.dense"),
                                            m.Child(root, "output.dense"), "mlp", &intermediate);
  const ValueId sum2 = ops::Add(t, dropped2, attnOut, "residual add");
  const ValueId y = blocks::LayerNorm(m, sum2, m.Child(root, "output.LayerNorm"));
  t.Drop(dropped2);
  t.Drop(intermediate);
  t.Drop(attnOut);
  t.Drop(sum2);
  return y;
}

namespace {

// The pooler (dense + tanh on the first token) and the classifier on its dropout.
ValueId ClassificationHead(Model& m, ValueId x) {
  Tape& t = m.t;
  const std::int64_t h = m.a.hiddenSize;
  m.Scope(-1, "pooler");
  if (m.sequenceShards > 1) {
    // Sequence parallelism: Megatron's Pooler (megatron/legacy/model/language_model.py) first
    // gathers the whole sequence (gather_from_sequence_parallel_region, a new [b, s, h]) and
    // takes its first token; the replicated dense sees a view of that gathered tensor.
    const ValueId gathered = t.Apply({.name = "pooler all-gather (s)", .inputs = {{x}}, .shape = {m.b, m.s, h},
                                      .type = t.TypeOf(x)});
    t.Drop(x);
    x = gathered;
  }
  const ValueId first = t.Apply({.name = "hidden_states[:, 0]", .inputs = {{x}}, .shape = {m.b, h},
                                 .type = t.TypeOf(x), .viewOf = x});
  const ValueId dense = blocks::Linear(m, first, RootModule(m, "bert.pooler.dense"), h, "pooler dense");
  t.Drop(first);
  const ValueId pooled = ops::SavesOutput(t, dense, "pooler tanh", t.TypeOf(dense));
  t.Drop(dense);
  t.Drop(x);  // the model returns the pooled output; the sequence output goes
  m.Scope(-1, "classifier");
  const ValueId dropped = ops::Dropout(t, pooled, m.a.hiddenDropout, "classifier dropout");
  t.Drop(pooled);
  const ValueId logits = blocks::Linear(m, dropped, RootModule(m, "classifier"), m.a.numLabels, "logits");
  t.Drop(dropped);
  return logits;
}

// The MLM head: transform (dense + activation + LayerNorm), then a decoder tied to the word
// embeddings with its own bias.
ValueId MaskedLmHead(Model& m, ValueId x) {
  Tape& t = m.t;
  m.Scope(-1, "mlm head");
  // The transform is replicated on every tensor-parallel rank (Megatron's BertLMHead: a plain
  // get_linear_layer dense and a LayerNorm, run on the s/t tokens under sequence parallelism,
  // megatron/legacy/model/bert_model.py), so its dense never gathers its input.
  const Module transform = RootModule(m, "cls.predictions.transform.dense");
  const ValueId dense = m.sequenceShards > 1
                            ? ops::Linear(t, x, m.P(transform), m.POptional(transform), m.a.hiddenSize, "transform dense")
                            : blocks::Linear(m, x, transform, m.a.hiddenSize, "transform dense");
  t.Drop(x);
  const ValueId act = blocks::Activation(m, dense, "transform activation");
  t.Drop(dense);
  const ValueId normed = blocks::LayerNorm(m, act, RootModule(m, "cls.predictions.transform.LayerNorm"));
  t.Drop(act);
  const ValueId weight = m.parameters.ByName(t, "bert.embeddings.word_embeddings.weight");
  // The decoder is a column-parallel product over the rank's vocabulary with its bias of V/t
  // (BertLMHead's bias is mpu_vocab_size long; parallel_lm_logits all-gathers the s/t input
  // under sequence parallelism).
  const ValueId bias = m.parameters.ByName(t, "cls.predictions.bias");
  const ValueId logits = m.sequenceShards > 1
                             ? sequence_split::GatherLinear(m, normed, weight, bias, m.a.vocabSize, "logits (all-gathered input)")
                             : ops::Linear(t, normed, weight, bias, m.a.vocabSize, "logits");
  t.Drop(normed);
  return logits;
}

}  // namespace

ValueId BertForward(Model& m, ValueId ids, ValueId tokenTypes, const RunBlock& block) {
  Tape& t = m.t;
  const std::int64_t h = m.a.hiddenSize;
  Context c;
  m.Scope(-1, "embeddings");
  const ValueId words = blocks::WordEmbedding(m, ids, m.parameters.ByName(t, "bert.embeddings.word_embeddings.weight"),
                                              "word_embeddings");
  const ValueId types = ops::Embedding(t, tokenTypes, m.parameters.ByName(t, "bert.embeddings.token_type_embeddings.weight"),
                                       h, "token_type_embeddings");
  const ValueId sum = ops::Add(t, words, types, "words + token types");
  t.Drop(words);
  t.Drop(types);
  const ValueId positions = t.Fresh({1, m.s}, DType::Int64, "position_ids");
  const ValueId pos = ops::Embedding(t, positions, m.parameters.ByName(t, "bert.embeddings.position_embeddings.weight"),
                                     h, "position_embeddings");
  t.Drop(positions);
  ValueId sum2 = ops::Add(t, sum, pos, "+ positions");
  t.Drop(sum);
  t.Drop(pos);
  // Sequence parallelism: the summed embeddings (word embeddings all-reduced, token types and
  // positions replicated) are scattered to s/t tokens before the LayerNorm and dropout, as
  // Megatron's LanguageModelEmbedding scatters before its dropout (num_tokentypes > 0: no
  // reduce_scatter_embeddings). HF BERT's embedding LayerNorm, which Megatron's pre-LN BERT
  // does not have, runs in that sharded region like every other norm.
  sum2 = sequence_split::RowParallelOutput(m, sum2, "embeddings scatter (s/t)");
  const ValueId normed = blocks::LayerNorm(m, sum2, RootModule(m, "bert.embeddings.LayerNorm"));
  t.Drop(sum2);
  ValueId x = ops::Dropout(t, normed, m.a.hiddenDropout, "embedding dropout");
  t.Drop(normed);
  if (m.training.attention == AttentionImplementation::Eager) {
    m.Scope(-1, "attention mask");
    c.mask = t.Fresh({m.b, 1, 1, m.s}, t.TypeOf(x), "extended attention mask (b, 1, 1, s)");
  }
  for (int i = 0; i < static_cast<int>(m.a.numLayers); ++i) {
    const ValueId y = block(x, c, i);
    t.Drop(x);
    x = y;
  }
  t.Drop(c.mask);
  return m.a.encoderHead == EncoderHead::Classification ? ClassificationHead(m, x) : MaskedLmHead(m, x);
}

}  // namespace gpumem::families
