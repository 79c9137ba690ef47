// Rules the published multi-GPU figures showed off (docs/validation.md, "Many GPUs: published
// figures"): FSDP2's per-parameter gradients and reduce dtype, Megatron's fp32 gradient buffer,
// FSDP2 units of their own for the embedding and the output layer (docs/parallel.md).
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "parallel/parallel_fidelity.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// Llama 3 8B's shapes with two blocks: every tensor as in the model, quick to simulate.
Setup SmallLlama3() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-3-8b")->architecture;
  s.model.architecture.numLayers = 2;
  s.training.precision = Precision::BF16Mixed;
  s.training.optimizer = OptimizerKind::AdamW;
  s.training.batchSize = 1;
  s.training.sequenceLength = 256;
  s.parallel.dataParallel = 8;
  return s;
}

// Block 1's parameters padded on dim 0 to a multiple of 8 (FSDP2's _get_dim0_padded_size), and
// its shard.
std::int64_t Block1Padded(const Inventory& inv, std::int64_t d) {
  std::int64_t n = 0;
  for (const Tensor& t : inv.parameters) {
    if (t.layer != 1) continue;
    std::int64_t rest = 1;
    for (std::size_t k = 1; k < t.shape.size(); ++k) rest *= t.shape[k];
    n += (t.shape[0] + d - 1) / d * d * rest;
  }
  return n;
}

}  // namespace

TEST_CASE("Parallel fidelity: FSDP2 gradients are per parameter and reduced in reduce_dtype", "[parallel][fidelity]") {
  Setup s = SmallLlama3();
  s.parallel.fsdp = FsdpMode::FullyShard;
  const Inventory inv = BuildInventory(s);
  const std::int64_t padded = Block1Padded(inv, 8);
  // Every Llama 3 8B tensor of a block has rows divisible by 8: no padding, 218,112,000 elements.
  CHECK(padded == 218'112'000);
  const Estimate bf16 = MustEstimateLabelled(s);
  // Each parameter's own unsharded .grad (bf16), not one flat unit gradient (FSDP1).
  CHECK(FirstAllocBytes(bf16, "model.layers.1.mlp.down_proj.weight.grad (unsharded)") == 4096LL * 14336 * 2);
  CHECK(FirstAllocBytes(bf16, "unsharded gradient of its FSDP unit") == -1);
  // foreach_reduce: the reduce-scatter input in the gradients' dtype (reduce_dtype None), the
  // output shard in it, then cast to the fp32 sharded parameter's dtype.
  CHECK(FirstAllocBytes(bf16, "reduce-scatter input of layers.1") == padded * 2);
  CHECK(FirstAllocBytes(bf16, "FSDP2 reduce-scatter of layers.1") == padded / 8 * 2);
  CHECK(FirstAllocBytes(bf16, "FSDP2: gradient shard of layers.1 cast") == padded / 8 * 4);
  // MixedPrecisionPolicy(reduce_dtype=torch.float32): fp32 input and output, no cast.
  s.parallel.fsdpReduceInFp32 = true;
  const Estimate fp32 = MustEstimateLabelled(s);
  CHECK(FirstAllocBytes(fp32, "reduce-scatter input of layers.1") == padded * 4);
  CHECK(FirstAllocBytes(fp32, "FSDP2 reduce-scatter of layers.1") == padded / 8 * 4);
  CHECK(FirstAllocBytes(fp32, "FSDP2: gradient shard of layers.1 cast") == -1);
  // The held fp32 input (one unit's gradients, twice the bf16 bytes) raises the backward peak.
  CHECK(fp32.peak.totalBytes > bf16.peak.totalBytes);
  // Model states do not change: the kept shards are fp32 either way.
  CHECK(fp32.modelStates.totalBytes == bf16.modelStates.totalBytes);
}

TEST_CASE("Parallel fidelity: Megatron's fp32 gradient buffer with the distributed optimizer", "[parallel][fidelity]") {
  // Reverse order, starts at multiples of 64, the end at a multiple of lcm(dp, 128).
  Inventory inv;
  Tensor a, b;
  a.shape = {100};
  b.shape = {10};
  inv.parameters = {a, b};
  CHECK(MegatronGradBufferElements(inv, 8) == 256);    // 10 → 64 + 100 = 164 → 256
  CHECK(MegatronGradBufferElements(inv, 3) == 384);    // lcm(3, 128) = 384
  CHECK(MegatronGradBufferElements(inv, 256) == 256);  // lcm(256, 128) = 256

  Setup s = SmallLlama3();
  s.parallel.zeroStage = 1;
  const Estimate zero1 = MustEstimateLabelled(s);
  s.parallel.gradReduceInFp32 = true;
  const Estimate megatron = MustEstimateLabelled(s);
  const std::int64_t buffer = MegatronGradBufferElements(BuildInventory(s), 8);
  CHECK(buffer >= BuildInventory(s).TrainableCount());
  CHECK(buffer % 128 == 0);
  CHECK(megatron.modelStates.gradientsBytes == buffer * 4);
  CHECK(zero1.modelStates.gradientsBytes == BuildInventory(s).TrainableCount() * 2);
  CHECK(FirstAllocBytes(megatron, "fp32 gradient buffer (grad_reduce_in_fp32)") == buffer * 4);
  // Main grads are views of the buffer: no fp32 gradient partition in the step, no flat bucket.
  CHECK(FirstAllocBytes(megatron, "ZeRO step: fp32 gradient partition") == -1);
  CHECK(FirstAllocBytes(zero1, "ZeRO step: fp32 gradient partition") > 0);
  CHECK(FirstAllocBytes(megatron, "ZeRO-1: gradients flattened") == -1);
  // The import sets it with --bf16 and the distributed optimizer, and not without them.
  const ParallelImport bf16 = ImportMegatronArguments("--use-distributed-optimizer --bf16", SmallLlama3());
  CHECK(bf16.setup.parallel.gradReduceInFp32);
  CHECK(ImportMegatronArguments("--use-distributed-optimizer --fp16", SmallLlama3()).setup.parallel.gradReduceInFp32 == false);
  CHECK(ImportMegatronArguments("--use-distributed-optimizer --fp16 --accumulate-allreduce-grads-in-fp32", SmallLlama3())
            .setup.parallel.gradReduceInFp32);
}

TEST_CASE("Parallel fidelity: FSDP2 embedding and output units gathered around their use", "[parallel][fidelity]") {
  Setup s = SmallLlama3();
  s.parallel.fsdp = FsdpMode::FullyShard;
  const Estimate root = MustEstimateLabelled(s);
  s.parallel.fsdpShardEmbeddingsAndHead = true;
  const Estimate apart = MustEstimateLabelled(s);
  const std::int64_t vh = 128256LL * 4096, h = 4096;
  const std::int64_t shards = root.modelStates.parametersBytes;
  // Root unit: embeddings, final norm and head gathered (bf16) through the loss.
  CHECK(BytesIn(root.forwardEnd, Category::Parameters) == shards + 2 * (2 * vh + h));
  // Units of their own: the embedding freed after its forward, the head before the loss; only
  // the final norm (the root) stays gathered.
  CHECK(BytesIn(apart.forwardEnd, Category::Parameters) == shards + 2 * h);
  CHECK(FirstAllocBytes(apart, "all-gather of embedding unit") == 2 * vh);
  CHECK(FirstAllocBytes(apart, "all-gather of output unit") == 2 * vh);
  CHECK(FirstAllocBytes(apart, "reduce-scatter input of output unit") == 2 * vh);
  CHECK(apart.peak.totalBytes < root.peak.totalBytes);
  // post_backward reshards the output unit before its foreach_reduce allocates the input.
  std::size_t freed = 0, reduced = 0;
  for (std::size_t i = 0; i < apart.timeline.size(); ++i) {
    const TimelinePoint& p = apart.timeline[i];
    if (p.phase != Phase::Backward) continue;
    if (freed == 0 && p.label.find("reshard: output unit freed") != std::string::npos) freed = i;
    if (reduced == 0 && p.label.find("reduce-scatter input of output unit") != std::string::npos) reduced = i;
  }
  CHECK(freed > 0);
  CHECK(reduced > freed);
}

TEST_CASE("Parallel fidelity: the new fields are refused where they are not simulated", "[parallel][fidelity]") {
  Setup s = SmallLlama3();
  s.parallel.fsdp = FsdpMode::FullShard;
  s.parallel.fsdpReduceInFp32 = true;
  CHECK(HasErrorOn(EstimateMemory(s).errors, "parallel.fsdpReduceInFp32"));
  s = SmallLlama3();
  s.parallel.fsdp = FsdpMode::FullyShard;
  s.model.architecture.tieWordEmbeddings = true;
  s.parallel.fsdpShardEmbeddingsAndHead = true;
  CHECK(HasErrorOn(EstimateMemory(s).errors, "parallel.fsdpShardEmbeddingsAndHead"));
  s = SmallLlama3();
  s.parallel.zeroStage = 2;
  s.parallel.gradReduceInFp32 = true;
  CHECK(HasErrorOn(EstimateMemory(s).errors, "parallel.gradReduceInFp32"));
  s.parallel.zeroStage = 1;
  CHECK(EstimateMemory(s).ok());
  CHECK_FALSE(DefaultSetup().parallel.gradReduceInFp32);
  CHECK_FALSE(DefaultSetup().parallel.fsdpReduceInFp32);
  CHECK_FALSE(DefaultSetup().parallel.fsdpShardEmbeddingsAndHead);
}

TEST_CASE("Parallel fidelity: op-level selective checkpointing keeps every other mm and SDPA", "[parallel][fidelity]") {
  Setup s = SmallLlama3();
  s.parallel.dataParallel = 1;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.checkpointing = Checkpointing::EveryBlock;
  const Estimate every = MustEstimateLabelled(s);
  s.training.checkpointing = Checkpointing::SelectiveOp;
  const Estimate op = MustEstimateLabelled(s);
  s.training.checkpointing = Checkpointing::None;
  const Estimate none = MustEstimate(s);
  // Per token and block, besides the checkpoint's input: q_proj (1st mm, 4096), v_proj (3rd,
  // 1024), gate_proj (5th, 14336), down_proj (7th, 4096) and SDPA's output (4096) in bf16 and
  // its fp32 logsumexp (32 heads); k_proj, o_proj and up_proj (even mms) are recomputed.
  const std::int64_t tokens = 256, perToken = (4096 + 1024 + 14336 + 4096 + 4096) * 2 + 32 * 4;
  CHECK(op.forwardEnd.totalBytes - every.forwardEnd.totalBytes == 2 * tokens * perToken);
  CHECK(op.forwardEnd.totalBytes < none.forwardEnd.totalBytes);
  // The recompute takes the kept outputs back: backward allocates k_proj's output again but not
  // q_proj's.
  auto allocatedInBackward = [](const Estimate& e, const std::string& op) {
    const std::string suffix = ": " + op;  // an op's output ("layers.0 attention: q_proj")
    for (const TimelinePoint& p : e.timeline) {
      if (p.phase == Phase::Backward && p.deltaBytes > 0 && p.category == Category::Activations &&
          p.label.size() >= suffix.size() && p.label.compare(p.label.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return true;
      }
    }
    return false;
  };
  CHECK(allocatedInBackward(every, "q_proj"));
  CHECK(allocatedInBackward(every, "scaled_dot_product_attention (saved)"));
  CHECK(allocatedInBackward(every, "mlp gate_proj"));
  CHECK(allocatedInBackward(every, "mlp down_proj"));
  CHECK(allocatedInBackward(every, "v_proj"));
  CHECK(allocatedInBackward(op, "k_proj"));
  CHECK(allocatedInBackward(op, "o_proj"));
  CHECK(allocatedInBackward(op, "mlp up_proj"));
  CHECK_FALSE(allocatedInBackward(op, "mlp gate_proj"));
  CHECK_FALSE(allocatedInBackward(op, "mlp down_proj"));
  CHECK_FALSE(allocatedInBackward(op, "q_proj"));
  CHECK_FALSE(allocatedInBackward(op, "v_proj"));
  CHECK_FALSE(allocatedInBackward(op, "scaled_dot_product_attention (saved)"));
  // Refused where it is not simulated.
  s.training.checkpointing = Checkpointing::SelectiveOp;
  s.training.activationOffloading = true;
  CHECK(HasErrorOn(EstimateMemory(s).errors, "training.checkpointing"));
}

TEST_CASE("Parallel fidelity: the new fields read and write as JSON", "[parallel][fidelity]") {
  const SetupParseResult r = ParseSetupJson(
      R"({"parallel": {"dataParallel": 8, "fsdp": "fully_shard", "fsdpReduceInFp32": true,
          "fsdpShardEmbeddingsAndHead": true, "gradReduceInFp32": false},
          "training": {"checkpointing": "selectiveOp"}})");
  REQUIRE(r.errors.empty());
  CHECK(r.setup.parallel.fsdpReduceInFp32);
  CHECK(r.setup.parallel.fsdpShardEmbeddingsAndHead);
  CHECK_FALSE(r.setup.parallel.gradReduceInFp32);
  CHECK(r.setup.training.checkpointing == Checkpointing::SelectiveOp);
  const std::string written = SetupToJson(r.setup);
  CHECK(written.find(R"("fsdpReduceInFp32":true)") != std::string::npos);
  CHECK(written.find(R"("fsdpShardEmbeddingsAndHead":true)") != std::string::npos);
  CHECK(written.find(R"("gradReduceInFp32":false)") != std::string::npos);
  CHECK(written.find(R"("checkpointing":"selectiveOp")") != std::string::npos);
  // A wrong type is refused naming the field.
  CHECK(HasErrorOn(ParseSetupJson(R"({"parallel": {"gradReduceInFp32": 1}})").errors, "parallel.gradReduceInFp32"));
}

TEST_CASE("Parallel fidelity: the panel's fields follow the parallel section's JSON key order", "[parallel][fidelity]") {
  // web/parallel-panel.js opens the Many GPUs fold when the form's values, read in
  // ParallelFields() order, differ as JSON text from the default parallel section.
  const std::string json = SetupToJson(DefaultSetup());
  const std::size_t section = json.find(R"("parallel":{)");
  REQUIRE(section != std::string::npos);
  std::size_t last = section;
  for (const ParallelField& f : ParallelFields()) {
    const std::size_t at = json.find("\"" + std::string(f.key) + "\":", section);
    INFO(f.key);
    REQUIRE(at != std::string::npos);
    CHECK(at > last);
    last = at;
  }
}
