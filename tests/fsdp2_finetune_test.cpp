// FSDP2 fully_shard with fine-tuning, as torchtune's lora_finetune_distributed recipe runs it
// (docs/parallel.md, "Fine-tuning on many GPUs"): every parameter, frozen or not, chunked on
// dim 0 and padded to ⌈rows / world⌉ rows (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
// FSDPParam._init_sharded_param); gathered per block with the frozen base; only the adapters get
// a gradient, a reduce-scatter and optimizer states (_fsdp_param_group.py post_backward:
// fsdp_params_with_grad). Each figure is counted by hand on a small Llama.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// hidden 64, 4 heads (4 key/value heads), intermediate 128, 2 blocks, an untied head, and a
// vocabulary of 1,001 so that the embedding and the head are padded on dim 0. LoRA r 8 on q_proj
// and v_proj: lora_A [8, 64], lora_B [64, 8].
Setup TorchtuneLora(std::int64_t world) {
  Setup s = TinyTransformer(Family::Llama, 2, Precision::BF16);  // torchtune: dtype bf16, no MixedPrecisionPolicy
  s.model.architecture.vocabSize = 1001;
  s.finetune.lora = true;
  s.finetune.r = 8;
  s.finetune.adapterDType = AdapterDType::Weights;  // torchtune builds the adapters in the model's dtype
  s.parallel.dataParallel = world;
  s.parallel.fsdp = FsdpMode::FullyShard;
  return s;
}

// Index of the first allocation (or, with frees, any event) at or after `from` whose label
// contains `label`, within the simulated step of the first non-init event from there (init
// events are skipped), or −1.
long FirstIndex(const Estimate& e, const std::string& label, std::size_t from = 0, bool frees = false) {
  int step = -1;
  for (std::size_t i = from; i < e.timeline.size(); ++i) {
    const TimelinePoint& p = e.timeline[i];
    if (p.phase == Phase::Init) continue;
    if (step < 0) step = p.step;
    if (p.step != step) break;
    if ((frees || p.deltaBytes > 0) && p.label.find(label) != std::string::npos) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace

TEST_CASE("FSDP2 LoRA on 2 ranks: frozen base sharded and padded and adapters with their gradients and Adam states", "[fsdp2-finetune]") {
  const Setup s = TorchtuneLora(2);
  REQUIRE(Validate(s).empty());
  // Per block, ⌈rows / 2⌉ rows each: q, k, v, o [64, 64] → 32 × 64 = 2,048; gate, up [128, 64]
  // → 64 × 64 = 4,096; down [64, 128] → 32 × 128 = 4,096; two norms [64] → 32; frozen 20,544.
  // Adapters: lora_A [8, 64] → 4 × 64 = 256, lora_B [64, 8] → 32 × 8 = 256; 2 targets → 1,024.
  // Root: embed_tokens and lm_head [1,001, 64] → ⌈1,001 / 2⌉ = 501 rows × 64 = 32,064 each
  // (one row of padding), final norm 32: 64,160.
  const std::int64_t blockFrozen = 20544, blockAdapters = 1024, root = 64160;
  const std::int64_t shards = root + 2 * (blockFrozen + blockAdapters);  // 107,296
  const std::int64_t trainable = 2 * blockAdapters;                      // 2,048
  const ShardPlan plan = PlanShards(s, BuildInventory(s));
  CHECK(plan.partitionElements == shards);
  CHECK(plan.gradientShardElements == trainable);
  CHECK(plan.trainableShardParts.parameters.size() == 8);  // 4 adapters × 2 blocks

  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == shards * 2);       // bf16 shards: 214,592 B
  CHECK(e.modelStates.masterWeightsBytes == 0);
  CHECK(e.modelStates.gradientsBytes == trainable * 2);      // the adapters' bf16 gradient shards: 4,096 B
  CHECK(e.modelStates.optimizerStatesBytes == 2 * trainable * 2);  // AdamW exp_avg, exp_avg_sq in bf16: 8,192 B
  CHECK(e.modelStates.totalBytes == 214592 + 4096 + 8192);
}

TEST_CASE("FSDP2 LoRA on 4 ranks: the shards by hand", "[fsdp2-finetune]") {
  const Setup s = TorchtuneLora(4);
  REQUIRE(Validate(s).empty());
  // ⌈rows / 4⌉: q, k, v, o → 16 × 64 = 1,024; gate, up → 32 × 64 = 2,048; down → 16 × 128 =
  // 2,048; norms 16: frozen 10,272. lora_A → 2 × 64 = 128, lora_B → 16 × 8 = 128: 512.
  // Root: ⌈1,001 / 4⌉ = 251 rows × 64 = 16,064 twice (3 rows of padding) + 16 = 32,144.
  const std::int64_t blockFrozen = 10272, blockAdapters = 512, root = 32144;
  const std::int64_t shards = root + 2 * (blockFrozen + blockAdapters);  // 53,712
  const std::int64_t trainable = 2 * blockAdapters;                      // 1,024
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == shards * 2);
  CHECK(e.modelStates.gradientsBytes == trainable * 2);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * trainable * 2);

  // With a MixedPrecisionPolicy (bf16 mixed) the shards, their gradients and states are fp32;
  // fp32 adapters are then uniform with the rest.
  Setup mixed = s;
  mixed.training.precision = Precision::BF16Mixed;
  mixed.finetune.adapterDType = AdapterDType::FP32;
  REQUIRE(Validate(mixed).empty());
  const Estimate m = MustEstimate(mixed);
  CHECK(m.modelStates.parametersBytes == shards * 4);
  CHECK(m.modelStates.gradientsBytes == trainable * 4);
  CHECK(m.modelStates.optimizerStatesBytes == 2 * trainable * 4);
}

TEST_CASE("FSDP2 LoRA: one block's all-gather and reduce-scatter in the trace", "[fsdp2-finetune]") {
  const Setup s = TorchtuneLora(2);
  const Estimate e = MustEstimateLabelled(s);
  // The block is gathered whole, frozen base included: 4 × 4,096 + 3 × 8,192 + 128 + 2,048
  // adapter elements = 43,136 × 2 B.
  const long gather = FirstIndex(e, "all-gather of layers.1");
  REQUIRE(gather >= 0);
  CHECK(e.timeline[static_cast<std::size_t>(gather)].deltaBytes == 43136 * 2);
  // Backward: the block gathered again (resharded after forward), each adapter's own unsharded
  // .grad (lora_A 512 elements × 2 B), then the unit's reduce-scatter input: the adapters'
  // gradients padded on dim 0 to a multiple of 2 = 2 × 1,024 elements × 2 B, and the 1,024-element
  // shard; the frozen base weights get no gradient at all.
  const long backwardGather = FirstIndex(e, "all-gather of layers.1", static_cast<std::size_t>(gather) + 1);
  const long grad = FirstIndex(e, "model.layers.1.self_attn.q_proj.lora_A.default.weight.grad");
  const long input = FirstIndex(e, "FSDP2 foreach_reduce: reduce-scatter input of layers.1");
  const long output = FirstIndex(e, "FSDP2 reduce-scatter of layers.1");
  const long nextBlock = FirstIndex(e, "model.layers.0.self_attn.v_proj.lora_B.default.weight.grad");
  REQUIRE(backwardGather >= 0);
  REQUIRE(grad >= 0);
  REQUIRE(input >= 0);
  REQUIRE(output >= 0);
  REQUIRE(nextBlock >= 0);
  const long reshard = FirstIndex(e, "reshard: layers.1 freed", static_cast<std::size_t>(backwardGather), true);
  CHECK(backwardGather < grad);
  CHECK(grad < reshard);
  // The unit's post_backward (reshard, then foreach_reduce) runs before block 0's backward, not at
  // block 0's first adapter gradient.
  CHECK(reshard < input);
  CHECK(input < output);
  CHECK(output < nextBlock);
  CHECK(FirstIndex(e, "layers.0 attention o_proj backward") > output);
  CHECK(e.timeline[static_cast<std::size_t>(grad)].deltaBytes == 512 * 2);
  CHECK(e.timeline[static_cast<std::size_t>(input)].deltaBytes == 2048 * 2);
  CHECK(e.timeline[static_cast<std::size_t>(output)].deltaBytes == 1024 * 2);
  CHECK(FirstIndex(e, "model.layers.1.self_attn.q_proj.base_layer.weight.grad") == -1);
  CHECK(FirstIndex(e, "model.layers.1.mlp.down_proj.weight.grad") == -1);
  // The root (embeddings, final norm, head) is wholly frozen: gathered, never reduced.
  CHECK(FirstIndex(e, "all-gather of root unit") >= 0);
  CHECK(FirstIndex(e, "reduce-scatter input of root unit") == -1);
  // Backward ends in block 0 (no gradient flows into the frozen embedding): the root scope the
  // step returns to afterwards is no forward, so nothing is gathered until the next forward.
  for (const TimelinePoint& p : e.timeline) {
    if (p.phase == Phase::OptimizerStep) CHECK(p.label.find("all-gather") == std::string::npos);
  }

  // reduce_dtype=float32 (torchtitan's MixedPrecisionPolicy): the input and the shard in fp32,
  // then cast to the bf16 shard's dtype.
  Setup fp32Reduce = s;
  fp32Reduce.parallel.fsdpReduceInFp32 = true;
  REQUIRE(Validate(fp32Reduce).empty());
  const Estimate f = MustEstimateLabelled(fp32Reduce);
  CHECK(f.timeline[static_cast<std::size_t>(FirstIndex(f, "reduce-scatter input of layers.1"))].deltaBytes == 2048 * 4);
  CHECK(f.timeline[static_cast<std::size_t>(FirstIndex(f, "FSDP2 reduce-scatter of layers.1"))].deltaBytes == 1024 * 4);
  CHECK(f.modelStates.gradientsBytes == 2048 * 2);  // kept in the shard's dtype

  // reshard_after_forward=False: forward's gather is kept to backward, no second all-gather.
  Setup kept = s;
  kept.parallel.reshardAfterForward = false;
  const Estimate k = MustEstimateLabelled(kept);
  const long first = FirstIndex(k, "all-gather of layers.1");
  REQUIRE(first >= 0);
  CHECK(FirstIndex(k, "all-gather of layers.1", static_cast<std::size_t>(first) + 1) == -1);
}

TEST_CASE("FSDP2 frozen-only fine-tune: frozen blocks and embeddings sharded with no gradient", "[fsdp2-finetune]") {
  Setup s = TorchtuneLora(2);
  s.finetune.lora = false;
  s.finetune.freezeFirstBlocks = 1;
  s.finetune.freezeEmbeddings = true;
  REQUIRE(Validate(s).empty());
  // Block shards (no adapters) 20,544 each; root 64,160. Trainable: block 1 (20,544), the final
  // norm (32) and lm_head (32,064): 52,640.
  const std::int64_t shards = 64160 + 2 * 20544, trainable = 20544 + 32 + 32064;
  const Estimate e = MustEstimateLabelled(s);
  CHECK(e.modelStates.parametersBytes == shards * 2);
  CHECK(e.modelStates.gradientsBytes == trainable * 2);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * trainable * 2);
  // The root's reduce covers the norm and the head (padded: 64 + 1,002 × 64 = 64,192 elements),
  // not the frozen embedding; block 0 is never reduced.
  CHECK(e.timeline[static_cast<std::size_t>(FirstIndex(e, "reduce-scatter input of root unit"))].deltaBytes == 64192 * 2);
  CHECK(e.timeline[static_cast<std::size_t>(FirstIndex(e, "reduce-scatter input of layers.1"))].deltaBytes == 2 * 20544 * 2);
  CHECK(FirstIndex(e, "reduce-scatter input of layers.0") == -1);
}

TEST_CASE("FSDP2 DoRA: the magnitude vectors shard and train with the adapters", "[fsdp2-finetune]") {
  Setup s = TorchtuneLora(2);
  s.finetune.useDora = true;
  REQUIRE(Validate(s).empty());
  // lora_magnitude_vector [64] per target → 32 per rank; 2 targets × 2 blocks = 128 more.
  const std::int64_t trainable = 2048 + 128;
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.gradientsBytes == trainable * 2);
  CHECK(e.modelStates.optimizerStatesBytes == 2 * trainable * 2);
}

TEST_CASE("FSDP2 fine-tuning: what stays refused is refused by its field", "[fsdp2-finetune]") {
  auto errorsOf = [](auto change) {
    Setup s = TorchtuneLora(2);
    change(s);
    return Validate(s);
  };
  CHECK(errorsOf([](Setup&) {}).empty());
  // torchtune's QLoRA keeps torchao NF4Tensor weights: not bitsandbytes' layout.
  CHECK(HasErrorOn(errorsOf([](Setup& s) {
                     s.finetune.quantization = Quantization::NF4;
                     s.finetune.quantStorage = DType::BF16;
                   }),
                   "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.quantization = Quantization::Int8; }), "parallel.fsdp"));
  // fp32 adapters beside bf16 weights (PEFT's default) are not torchtune's one-dtype model.
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.adapterDType = AdapterDType::FP32; }), "parallel.fsdp"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.parallel.offload = OffloadKind::Optimizer; }), "parallel.offload"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.parallel.fsdpShardEmbeddingsAndHead = true; }),
                   "parallel.fsdpShardEmbeddingsAndHead"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.parallel.fsdpWrapAdaptersApart = true; }), "parallel.fsdpWrapAdaptersApart"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.parallel.pipelineParallel = 2; }), "parallel.pipelineParallel"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.parallel.tensorParallel = 2; }), "parallel.tensorParallel"));
}
