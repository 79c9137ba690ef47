// Grouped-query attention in the GPT-2 family, as Megatron's GPT writes it
// (--group-query-attention --num-query-groups g): linear_qkv (c_attn) h + 2·g·d wide
// (megatron/core/transformer/attention.py SelfAttention), the queries copied by query.reshape,
// k/v repeated for the unfused core attention (dot_product_attention.py repeat_interleave) and
// read as they are by Transformer Engine's (SDPA here); groups split over tensor-parallel ranks.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// gpt3_7b_tp*_memory_speed (tests/data/published-parallel.json): 32 layers, h 4,096, 32 heads,
// 8 query groups, ffn 16,384, untied, learned positions (8,192), vocabulary 131,073.
Setup MegatronGpt7b(std::int64_t layers) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = DefaultArchitecture(Family::GPT2);
  ArchitectureDef& a = s.model.architecture;
  a.vocabSize = 131073;
  a.hiddenSize = 4096;
  a.numLayers = layers;
  a.numHeads = 32;
  a.numKeyValueHeads = 8;
  a.maxPositionEmbeddings = 8192;
  a.intermediateSize = 16384;
  a.tieWordEmbeddings = false;
  s.training.precision = Precision::BF16Mixed;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.optimizerImplementation = OptimizerImplementation::Fused;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.batchSize = 1;
  s.training.sequenceLength = 1024;
  s.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  return s;
}

std::vector<std::int64_t> ShapeOf(const Inventory& inv, const std::string& name) {
  for (const Tensor& t : inv.parameters) if (t.name == name) return {t.shape.begin(), t.shape.end()};
  return {};
}

}  // namespace

TEST_CASE("Megatron GQA: linear_qkv is h + 2gd wide and the 7B model is pinned by hand", "[megatron-gqa]") {
  Setup s = MegatronGpt7b(32);
  s.model.architecture.vocabSize = 131200;  // 131,073 padded to a multiple of 128 (t = 1)
  REQUIRE(Validate(s).empty());
  const Inventory inv = BuildInventory(s);
  // d = 4,096 / 32 = 128: 4,096 + 2 · 8 · 128 = 6,144.
  CHECK(ShapeOf(inv, "transformer.h.0.attn.c_attn.weight") == std::vector<std::int64_t>{4096, 6144});
  CHECK(ShapeOf(inv, "transformer.h.0.attn.c_attn.bias") == std::vector<std::int64_t>{6144});
  // A block: LayerNorms 2 · 8,192; linear_qkv 4,096·6,144 + 6,144 = 25,171,968; linear_proj
  // 4,096² + 4,096 = 16,781,312; fc1 4,096·16,384 + 16,384 = 67,125,248; fc2 16,384·4,096 +
  // 4,096 = 67,112,960: 176,207,872. × 32 = 5,638,651,904; word embeddings and output layer
  // 131,200 · 4,096 = 537,395,200 each; positions 8,192 · 4,096 = 33,554,432; final norm 8,192.
  CHECK(inv.ParameterCount() == 6'747'004'928);
  // Without groups GPT-2 is as before: 3h.
  Setup mha = s;
  mha.model.architecture.numKeyValueHeads = 0;
  CHECK(ShapeOf(BuildInventory(mha), "transformer.h.0.attn.c_attn.weight") == std::vector<std::int64_t>{4096, 12288});
}

TEST_CASE("Megatron GQA: tensor parallelism splits the groups (TP 4, 2 groups a rank)", "[megatron-gqa]") {
  Setup s = MegatronGpt7b(32);
  s.parallel.tensorParallel = 4;
  const Estimate e = MustEstimateLabelled(s);
  // A rank's block: linear_qkv [4,096, 1,024 + 2·2·128 = 1,536] + 1,536; linear_proj [1,024,
  // 4,096] + 4,096 (bias whole); fc1 [4,096, 4,096] + 4,096; fc2 [4,096, 4,096] + 4,096; norms
  // 16,384: 44,070,400. × 32 = 1,410,252,800; vocabulary padded to 131,584 (512 = 128·4), 32,896
  // rows a rank for embeddings and output: 134,742,016 each; positions 33,554,432; final norm 8,192.
  CHECK(e.modelStates.parameterCount == 1'713'299'456);
  // Megatron's query.reshape copies the rank's queries [1, 8, 1,024, 128] (bf16): 2,097,152 B.
  CHECK(FirstAllocBytes(e, "query.reshape (copy") == 2'097'152);
  // Transformer Engine's attention reads the 2 key/value heads as they are: no repeat.
  CHECK(FirstAllocBytes(e, "repeat_kv(key)") == -1);
  // t must divide the groups (Megatron: num_query_groups % tensor size).
  Setup bad = MegatronGpt7b(2);
  bad.parallel.tensorParallel = 16;
  CHECK(HasErrorOn(Validate(bad), "parallel.tensorParallel"));
}

TEST_CASE("Megatron GQA: the unfused core attention repeats k and v; one group a rank copies no queries", "[megatron-gqa]") {
  Setup eager = MegatronGpt7b(2);
  eager.training.attention = AttentionImplementation::Eager;
  const Estimate e = MustEstimateLabelled(eager);
  // repeat_interleave(32 / 8, dim=2): [1, 32, 1,024, 128] bf16 = 8,388,608 B for k and for v.
  CHECK(FirstAllocBytes(e, "repeat_kv(key)") == 8'388'608);
  CHECK(FirstAllocBytes(e, "repeat_kv(value)") == 8'388'608);
  CHECK(FirstAllocBytes(e, "query.reshape (copy") == 8'388'608);
  // TP 8: one group per rank: the reshape is a view.
  Setup one = MegatronGpt7b(2);
  one.parallel.tensorParallel = 8;
  CHECK(FirstAllocBytes(MustEstimateLabelled(one), "query.reshape (copy") == -1);
  // Groups = heads: GPT-2 as before, no copy.
  Setup mha = MegatronGpt7b(2);
  mha.model.architecture.numKeyValueHeads = 32;
  CHECK(FirstAllocBytes(MustEstimateLabelled(mha), "query.reshape (copy") == -1);
  // GQA with fewer groups saves less than MHA (k, v are g·d wide).
  CHECK(MustEstimateLabelled(MegatronGpt7b(2)).peak.totalBytes < MustEstimateLabelled(mha).peak.totalBytes);
}

TEST_CASE("Megatron GQA: validated and imported", "[megatron-gqa]") {
  Setup odd = MegatronGpt7b(2);
  odd.model.architecture.numKeyValueHeads = 5;  // does not divide 32
  CHECK(HasErrorOn(Validate(odd), "model.architecture.numKeyValueHeads"));
  Setup bert = DefaultSetup();
  bert.model.kind = ModelKind::Transformer;
  bert.model.architecture = DefaultArchitecture(Family::BERT);
  bert.model.architecture.numKeyValueHeads = 4;
  CHECK(HasErrorOn(Validate(bert), "model.architecture.numKeyValueHeads"));

  Setup base = MegatronGpt7b(2);
  base.model.architecture.numKeyValueHeads = 0;
  const ParallelImport r = ImportMegatronArguments("--group-query-attention --num-query-groups 8 --bf16", base);
  REQUIRE(r.ok());
  CHECK(r.setup.model.architecture.numKeyValueHeads == 8);
  CHECK(ImportMegatronArguments("--num-query-groups 8", base).setup.model.architecture.numKeyValueHeads == 0);
  CHECK(HasErrorOn(ImportMegatronArguments("--group-query-attention --num-query-groups x", base).errors, "--num-query-groups"));
  CHECK(HasErrorOn(ImportMegatronArguments("--group-query-attention --num-query-groups 4", bert).errors, "--num-query-groups"));
}
