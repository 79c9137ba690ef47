// Pipeline parallelism composed with FSDP2 (torchtitan's PP × FSDP layouts, docs/parallel.md
// "Pipeline with FSDP2"): the stage's sharded model states pinned by hand, the units gathered
// once per step (reshard_after_forward=False, no reshard after backward), the unsharded gradients
// accumulated over the micro-batches and reduce-scattered after the last one, and the refusals.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// A small Llama whose every shape is counted by hand below: vocabulary 1001 and intermediate
// 171 (odd row counts, so FSDP2's dim-0 padding shows), hidden 64, 4 heads of 16, 2 k/v heads,
// 4 blocks; PP 2 (2 blocks per stage) × FSDP2 2, 1F1B over 4 micro-batches.
Setup SmallLlamaPipelineFsdp2() {
  Setup s = test::SmallLlama(4);
  s.parallel.dataParallel = 2;
  s.parallel.fsdp = FsdpMode::FullyShard;
  s.parallel.reshardAfterForward = false;  // torchtitan's "default" policy under PP
  s.parallel.pipelineParallel = 2;
  s.parallel.pipelineSchedule = PipelineSchedule::OneFOneB;
  s.parallel.gradientAccumulationSteps = 4;
  s.parallel.pipelineStage = 0;
  return s;
}

Estimate Labelled(const Setup& s) {
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::Labelled;
  EstimateResult r = EstimateMemory(s, o);
  INFO((r.errors.empty() ? std::string() : r.errors.front().field + ": " + r.errors.front().message));
  REQUIRE(r.ok());
  return r.estimate;
}

// How many allocations of a step carry `label`, and the first one's bytes.
int Allocations(const Estimate& e, const std::string& label, int step, std::int64_t* bytes = nullptr) {
  int n = 0;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step != step || p.deltaBytes <= 0 || p.label.find(label) == std::string::npos) continue;
    if (n++ == 0 && bytes) *bytes = p.deltaBytes;
  }
  return n;
}
int Frees(const Estimate& e, const std::string& label, int step) {
  int n = 0;
  for (const TimelinePoint& p : e.timeline) n += p.step == step && p.deltaBytes < 0 && p.label.find(label) != std::string::npos;
  return n;
}
std::size_t FirstIndex(const Estimate& e, const std::string& label, int step) {
  for (std::size_t i = 0; i < e.timeline.size(); ++i) {
    if (e.timeline[i].step == step && e.timeline[i].label.find(label) != std::string::npos) return i;
  }
  return e.timeline.size();
}
std::size_t LastIndex(const Estimate& e, const std::string& label, int step) {
  std::size_t last = e.timeline.size();
  for (std::size_t i = 0; i < e.timeline.size(); ++i) {
    if (e.timeline[i].step == step && e.timeline[i].label.find(label) != std::string::npos) last = i;
  }
  return last;
}
// Live bytes of a category just before timeline event `end`.
std::int64_t LiveBefore(const Estimate& e, Category c, std::size_t end) {
  std::int64_t live = 0;
  for (std::size_t i = 0; i < end && i < e.timeline.size(); ++i) {
    if (e.timeline[i].category == c) live += e.timeline[i].deltaBytes;
  }
  return live;
}

// By hand. A block: q 64×64, k 32×64, v 32×64, o 64×64, gate and up 171×64, down 64×171, two
// norms of 64: 45,248 elements. FSDP2 chunks each on dim 0 over 2 ranks, padded to the first
// chunk (_fsdp_param.py, _get_dim0_padded_size): 32·64 + 16·64 + 16·64 + 32·64 + 2·86·64 +
// 32·171 + 2·32 = 22,688 per rank (gate and up carry one padding row: 172 = 2·86).
constexpr std::int64_t kBlock = 45'248, kBlockShard = 22'688;
// embed_tokens 1001×64 on stage 0 (501 rows per rank, one of padding); norm and lm_head on stage 1.
constexpr std::int64_t kEmbed = 1001 * 64, kEmbedShard = 501 * 64;
// What an all-gather makes is padded too: world × the padded shard (_fsdp_param.py
// init_all_gather_outputs), 45,376 elements for a block, 1,002 rows for the embedding.
constexpr std::int64_t kBlockGathered = 2 * kBlockShard, kEmbedGathered = 2 * kEmbedShard;

}  // namespace

TEST_CASE("Pipeline FSDP2: the stage's sharded model states by hand", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  const Estimate first = Labelled(s);
  // Stage 0: embed_tokens and blocks 0–1, each tensor's padded shard in fp32 (MixedPrecisionPolicy
  // keeps the sharded parameters in fp32), its fp32 gradient shard, AdamW's two fp32 states.
  const std::int64_t shard0 = kEmbedShard + 2 * kBlockShard;
  REQUIRE(shard0 == 77'440);
  CHECK(first.modelStates.parametersBytes == shard0 * 4);
  CHECK(first.modelStates.masterWeightsBytes == 0);
  CHECK(first.modelStates.gradientsBytes == shard0 * 4);
  CHECK(first.modelStates.optimizerStatesBytes == 2 * shard0 * 4);
  // Stage 1: blocks 2–3, the final norm (32 per rank) and lm_head (501 × 64 per rank).
  s.parallel.pipelineStage = 1;
  const Estimate last = Labelled(s);
  const std::int64_t shard1 = 2 * kBlockShard + 32 + kEmbedShard;
  CHECK(last.modelStates.parametersBytes == shard1 * 4);
  CHECK(last.modelStates.optimizerStatesBytes == 2 * shard1 * 4);
  // The init allocates each shard: gate_proj of block 0, 86 × 64 fp32.
  std::int64_t bytes = 0;
  CHECK(Allocations(first, "FSDP init: model.layers.0.mlp.gate_proj.weight (shard) (1/2, padded)", 0, &bytes) == 1);
  CHECK(bytes == 86 * 64 * 4);
}

TEST_CASE("Pipeline FSDP2: units gathered once and gradients reduced after the last micro-batch", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  const Estimate e = Labelled(s);
  for (int step : {1, 2}) {
    INFO("step " << step);
    // reshard_after_forward=False and set_reshard_after_backward(False) on every backward
    // (pipelining/stage.py backward_maybe_with_nosync): block 0 is all-gathered once per step
    // (bf16, 45,376 padded elements) and resharded once, by the final post_backward.
    std::int64_t gathered = 0;
    CHECK(Allocations(e, "all-gather of layers.0", step, &gathered) == 1);
    CHECK(gathered == kBlockGathered * 2);
    CHECK(Frees(e, "reshard: layers.0 freed", step) == 1);
    // One reduce-scatter per unit and step, not per micro-batch: the padded unit in bf16.
    std::int64_t input = 0;
    CHECK(Allocations(e, "reduce-scatter input of layers.0", step, &input) == 1);
    CHECK(input == 2 * kBlockShard * 2);
    CHECK(Allocations(e, "reduce-scatter input of layers.1", step) == 1);
    // The reduce comes after the stage's fourth (last) backward's gradients.
    const std::size_t reduce = FirstIndex(e, "reduce-scatter input of layers.", step);
    const std::size_t lastGradient = LastIndex(e, "model.layers.0.self_attn.q_proj.weight.grad (unsharded)", step);
    CHECK(lastGradient < reduce);
    // The micro-batches' gradients are added into the first one's .grad (AccumulateGrad): one
    // .grad kept, three added.
    CHECK(Frees(e, "model.layers.0.self_attn.q_proj.weight.grad accumulated", step) == 3);
  }
  // Just before the first reduce-scatter the whole stage's unsharded gradients are live, bf16
  // (reduce dtype = the gradients' dtype): embeddings and two blocks, 154,560 elements.
  const std::size_t reduce = FirstIndex(e, "reduce-scatter input of", 1);
  CHECK(LiveBefore(e, Category::Gradients, reduce) == (kEmbed + 2 * kBlock) * 2);
  // The units stay gathered between micro-batches: at the end of forward every unit of the stage.
  // (The flat all-gather outputs are freed by then: the last one by the stage root's post-forward.)
  CHECK(BytesIn(e.forwardEnd, Category::Parameters) == e.modelStates.parametersBytes + (kEmbedGathered + 2 * kBlockGathered) * 2);
}

TEST_CASE("Pipeline FSDP2: reduce_dtype fp32 accumulates unsharded fp32 gradients", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.fsdpReduceInFp32 = true;  // torchtitan's mixed_precision_reduce = "float32"
  const Estimate e = Labelled(s);
  // _fsdp_param.py to_accumulated_grad_if_needed: after the first micro-batch's backward the
  // bf16 .grad is cast into an fp32 unsharded_accumulated_grad; later ones are added into it
  // (accumulate_unsharded_grad_if_needed) and freed.
  std::int64_t bytes = 0;
  CHECK(Allocations(e, "FSDP2 (no sync): model.layers.0.mlp.gate_proj.weight.grad cast to the reduce dtype", 1, &bytes) == 1);
  CHECK(bytes == 171 * 64 * 4);
  CHECK(Frees(e, "model.layers.0.mlp.gate_proj.weight.grad added into its unsharded accumulated gradient", 1) == 3);
  const std::size_t reduce = FirstIndex(e, "reduce-scatter input of", 1);
  CHECK(LiveBefore(e, Category::Gradients, reduce) == (kEmbed + 2 * kBlock) * 4);
  std::int64_t input = 0;
  CHECK(Allocations(e, "reduce-scatter input of layers.1", 1, &input) == 1);
  CHECK(input == 2 * kBlockShard * 4);
  // Without the pipeline, each micro-batch reduce-scatters (no deferral): four inputs a step.
  Setup flat = s;
  flat.parallel.pipelineParallel = 1;
  flat.parallel.pipelineStage = -1;
  flat.parallel.reshardAfterForward = true;
  CHECK(Allocations(Labelled(flat), "reduce-scatter input of layers.1", 1) == 4);
}

TEST_CASE("Pipeline FSDP2: the simulated stage and the default estimate", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.pipelineStage = -1;
  const EstimateResult r = EstimateMemory(s);
  REQUIRE(r.ok());
  CHECK(r.estimate.rank.why.find("pipeline stage") != std::string::npos);
  // Resharding after forward gathers each unit again per micro-batch: more all-gathers.
  Setup again = SmallLlamaPipelineFsdp2();
  again.parallel.reshardAfterForward = true;
  const Estimate e = Labelled(again);
  CHECK(Allocations(e, "all-gather of layers.0", 1) > 1);
  CHECK(Allocations(e, "reduce-scatter input of layers.0", 1) == 1);
}

TEST_CASE("Pipeline FSDP2: what stays refused", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  // FSDP1: pipelining's backward_maybe_with_nosync defers only DDP and FSDP2 gradient syncs.
  for (FsdpMode mode : {FsdpMode::FullShard, FsdpMode::ShardGradOp, FsdpMode::HybridShard}) {
    s.parallel.fsdp = mode;
    CHECK(HasErrorOn(EstimateMemory(s).errors, "parallel.fsdp"));
  }
  // DeepSpeed's PipelineEngine asserts ZeRO stage < 2.
  s = SmallLlamaPipelineFsdp2();
  s.parallel.fsdp = FsdpMode::Off;
  s.parallel.zeroStage = 2;
  CHECK(HasErrorOn(EstimateMemory(s).errors, "parallel.zeroStage"));
  s.parallel.zeroStage = 3;
  CHECK(HasErrorOn(EstimateMemory(s).errors, "parallel.zeroStage"));
  s.parallel.zeroStage = 1;
  CHECK(EstimateMemory(s).ok());
  // GPipe with FSDP2 is simulated.
  s = SmallLlamaPipelineFsdp2();
  s.parallel.pipelineSchedule = PipelineSchedule::GPipe;
  CHECK(EstimateMemory(s).ok());
}

// ScheduleInterleaved1F1B with FSDP2 (torchtitan: one fully_shard root per model part). Stage 0 of
// PP 2 × v 2 holds two chunks of one block each: block 0 (chunk 0, with the embeddings) and block 1
// (chunk 1). Its order over 4 micro-batches (PipelineScheduleOf; torch's
// _calculate_single_rank_operations gives the same with 4 micro-batches on 2 ranks):
// F0.0 F1.0 F0.1 F1.1 | F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 | B2.1 B3.1 B2.0 B3.0 (micro-batch.chunk),
// so chunk 1's fourth backward (B3.1) comes before chunk 0's last two.
TEST_CASE("Pipeline FSDP2: interleaved, each virtual stage reduces after its own last backward", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.pipelineSchedule = PipelineSchedule::Interleaved;
  s.parallel.virtualStages = 2;
  const Estimate e = Labelled(s);
  // The same sharded states as under 1F1B: the chunks split the stage, not its parameters.
  CHECK(e.modelStates.parametersBytes == (kEmbedShard + 2 * kBlockShard) * 4);
  for (int step : {1, 2}) {
    INFO("step " << step);
    // Each unit gathered once and reduced once a step, as with one root.
    CHECK(Allocations(e, "all-gather of layers.0", step) == 1);
    CHECK(Allocations(e, "all-gather of layers.1", step) == 1);
    CHECK(Allocations(e, "reduce-scatter input of layers.0", step) == 1);
    CHECK(Allocations(e, "reduce-scatter input of layers.1", step) == 1);
    // Chunk 1 (block 1) reshards and reduce-scatters after its last backward, while block 0 still
    // has two micro-batches' gradients to come; chunk 0 (root and block 0) after those.
    const std::size_t lastBlock0Gradient = LastIndex(e, "model.layers.0.self_attn.q_proj.weight.grad (unsharded)", step);
    const std::size_t lastBlock1Gradient = LastIndex(e, "model.layers.1.self_attn.q_proj.weight.grad (unsharded)", step);
    const std::size_t reduce1 = FirstIndex(e, "reduce-scatter input of layers.1", step);
    const std::size_t reduce0 = FirstIndex(e, "reduce-scatter input of layers.0", step);
    CHECK(lastBlock1Gradient < reduce1);
    CHECK(reduce1 < lastBlock0Gradient);
    CHECK(FirstIndex(e, "reshard: layers.1 freed", step) < lastBlock0Gradient);
    CHECK(lastBlock0Gradient < reduce0);
    CHECK(FirstIndex(e, "reshard: layers.0 freed", step) > lastBlock0Gradient);
    // Two micro-batches of block 0 are still added after chunk 1's reduce (B2.0, B3.0): .grad
    // accumulated three times in all, as under 1F1B.
    CHECK(Frees(e, "model.layers.0.self_attn.q_proj.weight.grad accumulated", step) == 3);
  }
  // Just before chunk 1's reduce-scatter every unsharded gradient of the stage is live (bf16):
  // embeddings and both blocks. Just before chunk 0's, block 1's has become its fp32 shard.
  const std::size_t reduce1 = FirstIndex(e, "reduce-scatter input of layers.1", 1);
  CHECK(LiveBefore(e, Category::Gradients, reduce1) == (kEmbed + 2 * kBlock) * 2);
  const std::size_t root0 = FirstIndex(e, "reduce-scatter input of root unit", 1);
  REQUIRE(root0 < e.timeline.size());
  CHECK(root0 > reduce1);
  CHECK(LiveBefore(e, Category::Gradients, root0) == (kEmbed + kBlock) * 2 + kBlockShard * 4);
  // The same stage under 1F1B, one root: every unit reduces after the stage's last backward.
  Setup single = SmallLlamaPipelineFsdp2();
  const Estimate one = Labelled(single);
  CHECK(FirstIndex(one, "reduce-scatter input of layers.1", 1) >
        LastIndex(one, "model.layers.0.self_attn.q_proj.weight.grad (unsharded)", 1));
}

TEST_CASE("Pipeline FSDP2: CPUOffloadPolicy keeps the stage's shards on the host", "[pipeline][fsdp]") {
  // fully_shard(offload_policy=CPUOffloadPolicy()) on each stage: the sharded parameters, their
  // gradients and the optimizer live on the host. Under the pipeline the unsharded gradients still
  // accumulate on the GPU without sync (_fsdp_param_group.py post_backward returns before
  // foreach_reduce), and the final reduce-scatter's output is copied to the host
  // (_fsdp_collectives.py foreach_reduce: .to(cpu) when offload_to_cpu).
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  const Estimate e = Labelled(s);
  CHECK(e.modelStates.parametersBytes == 0);
  CHECK(e.modelStates.gradientsBytes == 0);
  CHECK(e.modelStates.optimizerStatesBytes == 0);
  for (int step : {1, 2}) {
    INFO("step " << step);
    // Gathered once a step (reshard_after_forward=False): the fp32 host shard copied to the device
    // in bf16 (22,688 elements), then the padded all-gather output.
    std::int64_t bytes = 0;
    CHECK(Allocations(e, "all-gather input (shards copied to the device) of layers.0", step, &bytes) == 1);
    CHECK(bytes == kBlockShard * 2);
    CHECK(Allocations(e, "all-gather of layers.0", step) == 1);
    // One reduce-scatter per unit and step, its shard then copied to the host.
    CHECK(Allocations(e, "reduce-scatter input of layers.0", step) == 1);
    CHECK(Frees(e, "gradient shard of layers.0 copied to the host", step) == 1);
    CHECK(Frees(e, "model.layers.0.self_attn.q_proj.weight.grad accumulated", step) == 3);
  }
  // As without offload, the whole stage's unsharded bf16 gradients are live before the reduce.
  CHECK(LiveBefore(e, Category::Gradients, FirstIndex(e, "reduce-scatter input of", 1)) == (kEmbed + 2 * kBlock) * 2);
}

TEST_CASE("Pipeline FSDP2: interleaved with reshard_after_forward, a chunk's forward leaves the other chunk's units", "[pipeline][fsdp]") {
  // Stage 0 of PP 2 × v 2 as above, with reshard_after_forward=True. Block 0 (chunk 0) is
  // gathered and resharded by each of chunk 0's four forwards (F0.0 F1.0 F2.0 F3.0), gathered
  // again by B0.0, and then stays gathered through B1.0 … B3.0 (no reshard after backward) to
  // chunk 0's final reduce: chunk 1's forwards in between (F2.1, F3.1) belong to another
  // fully_shard root and do not reshard it. Five all-gathers and five reshards a step; had chunk
  // 1's forwards resharded it, B1.0 would gather it again.
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.pipelineSchedule = PipelineSchedule::Interleaved;
  s.parallel.virtualStages = 2;
  s.parallel.reshardAfterForward = true;
  const Estimate e = Labelled(s);
  for (int step : {1, 2}) {
    INFO("step " << step);
    CHECK(Allocations(e, "all-gather of layers.0", step) == 5);
    CHECK(Frees(e, "reshard: layers.0 freed", step) == 5);
    CHECK(Allocations(e, "reduce-scatter input of layers.0", step) == 1);
    CHECK(Allocations(e, "reduce-scatter input of layers.1", step) == 1);
  }
}

TEST_CASE("Pipeline FSDP2: interleaved chunks of unequal layer counts reduce their own blocks", "[pipeline][fsdp]") {
  // 6 blocks over PP 2 × v 2: torchtitan's split 1, 2, 2, 1, so stage 0's chunk 0 is block 0 and
  // its chunk 1 blocks 1 and 2 (PipelineChunkLayers). Chunk 1 reduces both of its blocks after its
  // own last backward, before block 0's last gradient; chunk 0 reduces block 0 after it.
  Setup s = SmallLlamaPipelineFsdp2();
  s.model.architecture.numLayers = 6;
  s.parallel.pipelineSchedule = PipelineSchedule::Interleaved;
  s.parallel.virtualStages = 2;
  const Estimate e = Labelled(s);
  CHECK(e.modelStates.parametersBytes == (kEmbedShard + 3 * kBlockShard) * 4);
  const std::size_t lastBlock0Gradient = LastIndex(e, "model.layers.0.self_attn.q_proj.weight.grad (unsharded)", 1);
  for (const char* block : {"layers.1", "layers.2"}) {
    INFO(block);
    const std::size_t reduce = FirstIndex(e, std::string("reduce-scatter input of ") + block, 1);
    REQUIRE(reduce < e.timeline.size());
    CHECK(reduce < lastBlock0Gradient);
  }
  CHECK(FirstIndex(e, "reduce-scatter input of layers.0", 1) > lastBlock0Gradient);
  // Stage 1: chunk 0 is blocks 0 and 1, chunk 1 block 2 with the final norm and head (the root).
  s.parallel.pipelineStage = 1;
  const Estimate last = Labelled(s);
  const std::size_t lastBlock1Gradient = LastIndex(last, "model.layers.1.self_attn.q_proj.weight.grad (unsharded)", 1);
  const std::size_t reduce2 = FirstIndex(last, "reduce-scatter input of layers.2", 1);
  const std::size_t reduce1 = FirstIndex(last, "reduce-scatter input of layers.1", 1);
  REQUIRE(reduce1 < last.timeline.size());
  CHECK(reduce2 < lastBlock1Gradient);
  CHECK(FirstIndex(last, "reduce-scatter input of root unit", 1) < lastBlock1Gradient);
  CHECK(reduce1 > lastBlock1Gradient);
}

TEST_CASE("Pipeline FSDP2: embedding and output units of their own on the first and last stage", "[pipeline][fsdp]") {
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.fsdpShardEmbeddingsAndHead = true;  // torchtitan's newer apply_fsdp: tok_embeddings, [norm, output]
  const Estimate first = Labelled(s);
  std::int64_t bytes = 0;
  CHECK(Allocations(first, "all-gather of embedding unit", 1, &bytes) == 1);
  CHECK(bytes == kEmbedGathered * 2);
  // Padded to 1002 rows, reduced once a step.
  CHECK(Allocations(first, "reduce-scatter input of embedding unit", 1, &bytes) == 1);
  CHECK(bytes == 2 * kEmbedShard * 2);
  s.parallel.pipelineStage = 1;
  const Estimate last = Labelled(s);
  CHECK(Allocations(last, "all-gather of output unit", 1, &bytes) == 1);
  CHECK(bytes == kEmbedGathered * 2);
  CHECK(Allocations(last, "reduce-scatter input of output unit", 1) == 1);
  CHECK(Allocations(last, "all-gather of embedding unit", 1) == 0);
}

// torchtitan's last-block rule (parallelize_llama.py apply_fsdp, no PP: reshard_after_forward =
// int(layer_id) < len(model.layers) - 1), parallel.fsdpKeepLastBlockGathered, on the same small
// Llama without pipeline: FSDP2 × 2, 4 blocks, one micro-batch.
namespace {
Setup SmallLlamaFsdp2NoPipeline() {
  Setup s = SmallLlamaPipelineFsdp2();
  s.parallel.reshardAfterForward = true;
  s.parallel.pipelineParallel = 1;
  s.parallel.pipelineStage = -1;
  s.parallel.gradientAccumulationSteps = 1;
  return s;
}
}  // namespace

TEST_CASE("FSDP2: torchtitan keeps the last block gathered from its forward to its backward", "[fsdp]") {
  Setup off = SmallLlamaFsdp2NoPipeline();
  Setup on = off;
  on.parallel.fsdpKeepLastBlockGathered = true;
  const Estimate a = Labelled(off), b = Labelled(on);
  for (int step : {1, 2}) {
    INFO("step " << step);
    // Every block resharded after forward: layers.3 is gathered by its forward and again by its
    // backward. Kept: gathered once (bf16, 45,376 padded elements), resharded once by its post_backward.
    std::int64_t gathered = 0;
    CHECK(Allocations(a, "all-gather of layers.3", step) == 2);
    CHECK(Frees(a, "reshard: layers.3 freed", step) == 2);
    CHECK(Allocations(b, "all-gather of layers.3", step, &gathered) == 1);
    CHECK(gathered == kBlockGathered * 2);
    CHECK(Frees(b, "reshard: layers.3 freed", step) == 1);
    // Only the last block changes: layers.2 is gathered twice either way.
    CHECK(Allocations(b, "all-gather of layers.2", step) == 2);
    // The one reshard is its post_backward: after layers.3's last gradient (q_proj's), before
    // its reduce-scatter (_fsdp_param_group.py post_backward: reshard, then foreach_reduce).
    const std::size_t freed = FirstIndex(b, "reshard: layers.3 freed", step);
    CHECK(FirstIndex(b, "model.layers.3.self_attn.q_proj.weight.grad", step) < freed);
    CHECK(freed < FirstIndex(b, "reduce-scatter input of layers.3", step));
    CHECK(FirstIndex(b, "all-gather of layers.3", step) < FirstIndex(b, "model.layers.3.mlp.down_proj.weight.grad", step));
  }
  // At the end of forward (the loss computed) the last block's 90,752 B are still gathered.
  CHECK(BytesIn(b.forwardEnd, Category::Parameters) - BytesIn(a.forwardEnd, Category::Parameters) == kBlockGathered * 2);
  CHECK(b.modelStates.parametersBytes == a.modelStates.parametersBytes);
  CHECK(b.peak.totalBytes >= a.peak.totalBytes);
  CHECK(b.peak.totalBytes <= a.peak.totalBytes + kBlockGathered * 2);
}

TEST_CASE("FSDP2: the last-block rule is refused where it says nothing or is not torchtitan's", "[fsdp]") {
  CHECK_FALSE(DefaultSetup().parallel.fsdpKeepLastBlockGathered);
  Setup s = SmallLlamaFsdp2NoPipeline();
  s.parallel.fsdpKeepLastBlockGathered = true;
  CHECK(EstimateMemory(s).ok());
  Setup fsdp1 = s;
  fsdp1.parallel.fsdp = FsdpMode::FullShard;
  CHECK(HasErrorOn(EstimateMemory(fsdp1).errors, "parallel.fsdpKeepLastBlockGathered"));
  Setup never = s;
  never.parallel.reshardAfterForward = false;
  CHECK(HasErrorOn(EstimateMemory(never).errors, "parallel.fsdpKeepLastBlockGathered"));
  Setup pipeline = SmallLlamaPipelineFsdp2();
  pipeline.parallel.reshardAfterForward = true;
  pipeline.parallel.fsdpKeepLastBlockGathered = true;
  CHECK(HasErrorOn(EstimateMemory(pipeline).errors, "parallel.fsdpKeepLastBlockGathered"));
  // JSON: read, written, and a wrong type named by its field.
  const SetupParseResult parsed = ParseSetupJson(R"({"parallel":{"fsdpKeepLastBlockGathered":true}})");
  REQUIRE(parsed.errors.empty());
  CHECK(parsed.setup.parallel.fsdpKeepLastBlockGathered);
  CHECK(SetupToJson(s).find("\"fsdpKeepLastBlockGathered\":true") != std::string::npos);
  CHECK(HasErrorOn(ParseSetupJson(R"({"parallel":{"fsdpKeepLastBlockGathered":3}})").errors,
                   "parallel.fsdpKeepLastBlockGathered"));
}

// FSDP2's all-gather buffers (_fsdp_collectives.py foreach_all_gather / foreach_all_gather_copy_out,
// _fsdp_param_group.py wait_for_unshard), on the small Llama without pipeline (FSDP2 × 2, bf16
// mixed: fp32 shards, bf16 param_dtype).
TEST_CASE("FSDP2: the forward holds the previous unit's flat all-gather output until the next copy-out", "[fsdp]") {
  const Estimate e = Labelled(SmallLlamaFsdp2NoPipeline());
  // The root: embed_tokens and lm_head 1,002 × 64 padded, the final norm 64: 128,320 elements.
  constexpr std::int64_t kRootGathered = 2 * kEmbedGathered + 64;
  for (int step : {1, 2}) {
    INFO("step " << step);
    // The shards cast to bf16 into one staging buffer (_get_param_all_gather_inputs'
    // flat_foreach_copy_input: the padded shard), dropped once the all-gather is issued.
    std::int64_t staging = 0;
    CHECK(Allocations(e, "all-gather input (shards cast) of layers.1", step, &staging) == 2);  // forward, backward
    CHECK(staging == kBlockShard * 2);
    // Forward: block 2's flat output is made, then block 1's (kept since its copy-out) freed,
    // then block 2's per-parameter outputs made.
    const std::size_t flat = FirstIndex(e, "all-gather of layers.2", step);
    const std::size_t copyOut = FirstIndex(e, "all-gather copy-out: layers.2", step);
    std::size_t heldFreed = flat;
    while (heldFreed < e.timeline.size() && e.timeline[heldFreed].label.find("previous all-gather output freed") == std::string::npos) ++heldFreed;
    CHECK(flat < heldFreed);
    CHECK(heldFreed < copyOut);
    CHECK(e.timeline[heldFreed].deltaBytes == -kBlockGathered * 2);
    // The copy-out makes each parameter's own storage (FSDPParam.alloc_all_gather_outputs):
    // gate_proj 171 rows padded to 172 (2 × 86) × 64, in bf16; freed one by one at the reshard.
    std::int64_t gate = 0;
    CHECK(Allocations(e, "all-gather copy-out: layers.2: model.layers.2.mlp.gate_proj.weight", step, &gate) == 2);
    CHECK(gate == 172 * 64 * 2);
    CHECK(Frees(e, "reshard: model.layers.2.mlp.gate_proj.weight freed", step) == 2);
    // Root, blocks 0–3: five flat outputs a forward, each freed once, the last by the root's
    // post-forward before the loss.
    CHECK(Frees(e, "previous all-gather output freed", step) == 5);
    // Backward frees the flat output right after its copy-out.
    const std::size_t backwardCopyOut = LastIndex(e, "all-gather copy-out: layers.2", step);
    CHECK(backwardCopyOut > copyOut);
    CHECK(e.timeline[backwardCopyOut + 1].label.find("copied out: all-gather output of layers.2 freed") != std::string::npos);
  }
  // Step 1's forward, block 2 running: shards + root + block 2's outputs + its flat output.
  const std::size_t reshard = FirstIndex(e, "reshard: layers.2 freed", 1);
  CHECK(LiveBefore(e, Category::Parameters, reshard) ==
        e.modelStates.parametersBytes + (kRootGathered + 2 * kBlockGathered) * 2);
}
