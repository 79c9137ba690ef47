// LoRA under tensor parallelism as PEFT's LoraParallelLinear writes it over Megatron's layers
// (peft src/peft/tuners/lora/tp_layer.py): on a ColumnParallelLinear base lora_A is whole [r, in]
// and lora_B column-split [out/t, r]; on a RowParallelLinear base lora_A is row-split [r, in/t]
// (input_is_parallel) and lora_B whole [out, r]. Pinned by hand on a small Llama
// (docs/parallel.md, "Fine-tuning on many GPUs").
#include <catch2/catch.hpp>

#include "gpumem/inventory.hpp"
#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// hidden 64, 4 heads of 16, 2 key/value heads, MLP 128, vocabulary 1,000, 2 blocks; pure bf16;
// LoRA r 8 on all seven projections, no dropout.
Setup SmallLlamaLoraTp(std::int64_t t, bool allTargets = true) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  ArchitectureDef& a = s.model.architecture;
  a.family = Family::Llama;
  a.vocabSize = 1000;
  a.hiddenSize = 64;
  a.numLayers = 2;
  a.numHeads = 4;
  a.numKeyValueHeads = 2;
  a.intermediateSize = 128;
  a.tieWordEmbeddings = false;
  s.training.precision = Precision::BF16;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.batchSize = 1;
  s.training.sequenceLength = 32;
  s.finetune.lora = true;
  s.finetune.r = 8;
  s.finetune.targetModules = allTargets ? std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
                                        : std::vector<std::string>{"q_proj"};
  s.parallel.tensorParallel = t;
  return s;
}

}  // namespace

TEST_CASE("Tensor-parallel LoRA: the adapters of a rank count by hand", "[finetune-parallel][tensor]") {
  // t = 2, head_dim 16: q out 32, k / v out 16, MLP 64 per rank.
  //   q     A [8, 64] + B [32, 8] =   768     (column: A whole, B split)
  //   k, v  A [8, 64] + B [16, 8] =   640 each
  //   o     A [8, 32] + B [64, 8] =   768     (row: A split, B whole)
  //   gate, up  A [8, 64] + B [64, 8] = 1,024 each
  //   down  A [8, 64] + B [64, 8] = 1,024     (row: in 128 / 2)
  // 5,888 a block, 11,776 for two.
  const Setup s = SmallLlamaLoraTp(2);
  REQUIRE(Validate(s).empty());
  CHECK(BuildInventory(TensorParallelRankSetup(s)).TrainableCount() == 11'776);
  // One GPU: q 1,024, k / v 768, o 1,024, gate / up / down 1,536: 8,192 a block.
  CHECK(BuildInventory(SmallLlamaLoraTp(1)).TrainableCount() == 16'384);

  const Estimate e = MustEstimate(s);
  // The frozen base is the rank's Megatron shard: embed and lm_head 512 × 64 (the vocabulary
  // padded to 128 · t = 256, 1,024 rows over 2), per block q 2,048, k / v 1,024, o 2,048,
  // gate / up / down 4,096, two norms 128 (18,560), the final norm 64: 102,720 bf16 values;
  // the adapters in fp32 (PEFT's autocast_adapter_dtype).
  CHECK(e.modelStates.parametersBytes == 102'720 * 2 + 11'776 * 4);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * 11'776 * 4);  // AdamW's two states
}

TEST_CASE("Tensor-parallel LoRA: the adapters' activations split as their layers do", "[finetune-parallel][tensor]") {
  // Batch 1 × 32 tokens, fp32 adapters (tp_layer.py forces them). lora_A's output, the r-wide
  // hidden, is whole on every rank (a row-parallel base's lora_A output all-reduced in place);
  // lora_B's output has the base's output width: split behind a column-parallel base (q 64 / t,
  // gate 128 / t), whole behind a row-parallel one (o, down: 64).
  for (std::int64_t t : {1, 2}) {
    INFO("t = " << t);
    const Estimate e = MustEstimateLabelled(SmallLlamaLoraTp(t));
    CHECK(FirstAllocBytes(e, "layers.0 attention: q_proj lora_A.default") == 32 * 8 * 4);
    CHECK(FirstAllocBytes(e, "layers.0 attention: q_proj lora_B.default") == 32 * (64 / t) * 4);
    CHECK(FirstAllocBytes(e, "layers.0 attention: o_proj lora_A.default") == 32 * 8 * 4);
    CHECK(FirstAllocBytes(e, "layers.0 attention: o_proj lora_B.default") == 32 * 64 * 4);
    CHECK(FirstAllocBytes(e, "layers.0 mlp: mlp gate_proj lora_B.default") == 32 * (128 / t) * 4);
    CHECK(FirstAllocBytes(e, "layers.0 mlp: mlp down_proj lora_B.default") == 32 * 64 * 4);
  }
}

TEST_CASE("Tensor-parallel fine-tuning: what stays refused", "[finetune-parallel][tensor]") {
  Setup s = SmallLlamaLoraTp(2);
  s.finetune.useDora = true;  // tp_layer.py: "LoraParallelLinear does not support DoRA yet"
  CHECK(HasErrorOn(Validate(s), "parallel.tensorParallel"));
  s = SmallLlamaLoraTp(2);
  s.finetune.quantization = Quantization::NF4;
  CHECK(HasErrorOn(Validate(s), "parallel.tensorParallel"));
  s = SmallLlamaLoraTp(2);
  s.parallel.dataParallel = 2;
  s.parallel.fsdp = FsdpMode::FullShard;
  CHECK(HasErrorOn(Validate(s), "parallel.tensorParallel"));
  s.parallel.fsdp = FsdpMode::Off;
  s.parallel.zeroStage = 1;  // fp32 training: ZeRO-1 with the fp32 adapters
  s.training.precision = Precision::FP32;
  CHECK(Validate(s).empty());
  // tp_layer.py forces the adapters to fp32 (megatron_config.params_dtype = torch.float32).
  s = SmallLlamaLoraTp(2);
  s.finetune.adapterDType = AdapterDType::Weights;
  CHECK(HasErrorOn(Validate(s), "parallel.tensorParallel"));
  s = SmallLlamaLoraTp(2);
  s.parallel.sequenceParallel = true;
  CHECK(HasErrorOn(Validate(s), "parallel.sequenceParallel"));
  // Frozen blocks without adapters run as the frozen Megatron shards.
  s = SmallLlamaLoraTp(2);
  s.finetune.lora = false;
  s.finetune.targetModules.clear();
  s.finetune.freezeFirstBlocks = 1;
  CHECK(Validate(s).empty());
}
