// Many GPUs: Megatron's sequence parallelism, context parallelism (Transformer Engine's ring
// attention) and expert parallelism on the simulated rank (docs/parallel.md), each pinned
// against hand formulas of what the rank saves and holds.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// Llama 2 7B's block (h 4096, 32 heads, SwiGLU 11008), bf16 with fp32 masters, SDPA, 1 × 512.
Setup LlamaBlocks(std::int64_t layers) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;
  s.model.architecture.numLayers = layers;
  s.training.precision = Precision::BF16Mixed;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.batchSize = 1;
  s.training.sequenceLength = 512;
  return s;
}

std::int64_t EventBytes(const Estimate& e, Phase phase, const std::string& label) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.phase == phase && p.deltaBytes > 0 && p.label.find(label) != std::string::npos) return p.deltaBytes;
  }
  return -1;
}

}  // namespace

TEST_CASE("Sequence parallel: what a block saves is divided by the tensor parallel size", "[parallel][sequence]") {
  const std::int64_t b = 1, s = 512, h = 4096;
  const std::int64_t whole = SavedPerBlock(LlamaBlocks(2));
  const std::int64_t ffn = 11008, a = 32;
  // The block by hand: two RMSNorms (8·bsh + 4·bs each: fp32 x, rsqrt, bf16 cast, output), q, k,
  // v and the attention output (8·bsh), the fp32 log-sum-exp (4·a·bs), SwiGLU's SiLU input, SiLU
  // output, up output and product (8·bs·ffn).
  CHECK(whole == 24 * b * s * h + 8 * b * s * ffn + (8 + 4 * a) * b * s);
  // Megatron's theoretical_memory_usage.py compute_activation_memory: sbh·(18 + 4·ffn/h) per
  // layer (then / t, as it assumes sequence parallelism). Hugging Face's ops keep 6·sbh +
  // 4·sb·ffn + 136·sb more: RMSNorm's fp32 x and bf16 cast (+4·sbh per norm), no dropout masks
  // in Llama (−2·sbh), SwiGLU's four ffn-wide tensors against the formula's two, the fp32
  // log-sum-exp and rsqrt rows (docs/parallel.md).
  const std::int64_t megatron = s * b * h * 18 + 4 * s * b * ffn;
  CHECK(whole - megatron == 6 * b * s * h + 4 * b * s * ffn + 136 * b * s);
  for (std::int64_t t : {2, 4, 8}) {
    Setup tp = LlamaBlocks(2);
    tp.parallel.tensorParallel = t;
    Setup sp = tp;
    sp.parallel.sequenceParallel = true;
    const std::int64_t tensorOnly = SavedPerBlock(tp);
    const std::int64_t sequence = SavedPerBlock(sp);
    // Korthikanti et al. 2022 (Table 2): tensor parallelism leaves the norms, dropout and
    // residual parts whole; sequence parallelism splits them too, so everything is 1/t
    // (their sbh(10 + 24/t) → 34·sbh/t). Here: the block's whole saved bytes over t.
    CHECK(sequence * t == whole);
    // What tensor parallelism alone keeps whole: per RMSNorm (two per block) the fp32 copy of x
    // (4·bsh), its rsqrt (4·bs), the bf16 cast (2·bsh) and the norm's output that the linears
    // save (2·bsh): 2 · (8·bsh + 4·bs) · (1 − 1/t) more than with sequence parallelism.
    CHECK((tensorOnly - sequence) * t == 2 * (8 * b * s * h + 4 * b * s) * (t - 1));
  }
}

TEST_CASE("Sequence parallel: the all-gather buffer and backward's full grad_input", "[parallel][sequence]") {
  const std::int64_t b = 4, s = 4096, h = 4096;
  Setup sp = LlamaBlocks(2);
  sp.training.batchSize = b;
  sp.training.sequenceLength = s;
  sp.parallel.tensorParallel = 4;
  sp.parallel.sequenceParallel = true;
  const Estimate e = MustEstimateLabelled(sp);
  // Megatron's GlobalMemoryBuffer "mpu": b·s·h in bf16, made by the first gather (step 1's
  // forward, not at init) and kept: one allocation in the whole run.
  CHECK(EventBytes(e, Phase::Init, "all-gather buffer") == -1);
  CHECK(EventBytes(e, Phase::Forward, "all-gather buffer") == b * s * h * 2);
  int made = 0;
  for (const TimelinePoint& p : e.timeline) made += p.deltaBytes > 0 && p.label.find("all-gather buffer") != std::string::npos;
  CHECK(made == 1);
  // LinearWithGradAccumulationAndAsyncCommunication.backward: grad_input [b, s, h] before its
  // reduce-scatter (bf16).
  CHECK(EventBytes(e, Phase::Backward, "before reduce-scatter") == b * s * h * 2);
  // Model states do not change with sequence parallelism.
  Setup tp = sp;
  tp.parallel.sequenceParallel = false;
  const Estimate plain = MustEstimateLabelled(tp);
  CHECK(e.modelStates.parametersBytes == plain.modelStates.parametersBytes);
  CHECK(e.modelStates.optimizerStatesBytes == plain.modelStates.optimizerStatesBytes);
  CHECK(e.peak.totalBytes < plain.peak.totalBytes);
}

TEST_CASE("Sequence parallel: refused where it is not simulated or does not split", "[parallel][sequence]") {
  Setup odd = LlamaBlocks(2);
  odd.parallel.tensorParallel = 4;
  odd.parallel.sequenceParallel = true;
  odd.training.sequenceLength = 510;
  CHECK(HasErrorOn(Validate(odd), "parallel.sequenceParallel"));
  Setup alone = LlamaBlocks(2);
  alone.parallel.sequenceParallel = true;
  CHECK(HasErrorOn(Validate(alone), "parallel.sequenceParallel"));
  Setup chunked = LlamaBlocks(2);
  chunked.parallel.tensorParallel = 2;
  chunked.parallel.sequenceParallel = true;
  chunked.training.lossImplementation = LossImplementation::Chunked;
  CHECK(HasErrorOn(Validate(chunked), "parallel.sequenceParallel"));
  Setup fine = LlamaBlocks(2);
  fine.parallel.tensorParallel = 2;
  fine.parallel.sequenceParallel = true;
  CHECK(Validate(fine).empty());
}

TEST_CASE("Context parallel: a block saves what one GPU saves on s/c tokens", "[parallel][context]") {
  for (std::int64_t c : {2, 4}) {
    Setup cp = LlamaBlocks(2);
    cp.training.sequenceLength = 4096;
    cp.parallel.contextParallel = c;
    Setup local = LlamaBlocks(2);
    local.training.sequenceLength = 4096 / c;
    // Transformer Engine saves q, the last received k/v chunk (k and v sized), out and an fp32
    // log-sum-exp: the bytes the SDPA kernel saves on the rank's own s/c tokens; the norms, MLP
    // and projections run on s/c tokens.
    CHECK(SavedPerBlock(cp) == SavedPerBlock(local));
  }
}

TEST_CASE("Context parallel: the ring's k/v buffers and per-step outputs", "[parallel][context]") {
  const std::int64_t b = 2, s = 8192, c = 4, heads = 32, d = 128, local = s / c;
  Setup cp = LlamaBlocks(2);
  cp.training.batchSize = b;
  cp.training.sequenceLength = s;
  cp.parallel.contextParallel = c;
  const Estimate e = MustEstimateLabelled(cp);
  const std::int64_t q = b * heads * local * d * 2;   // bf16
  const std::int64_t kv = 2 * b * heads * local * d * 2;  // k and v of one chunk (no GQA in 7B)
  // AttnFuncWithCPAndKVP2P.forward: c k/v buffers (the last one saved), c per-step outputs, c
  // fp32 log-sum-exps, the fp32 corrected output.
  CHECK(EventBytes(e, Phase::Forward, "p2p_comm_buffers[:-1]") == (c - 1) * kv);
  CHECK(EventBytes(e, Phase::Forward, "out_per_step") == c * q);
  CHECK(EventBytes(e, Phase::Forward, "softmax_lse_per_step") == c * b * heads * local * 4);
  CHECK(EventBytes(e, Phase::Forward, "out (fp32, corrected)") == 2 * q);
  CHECK(EventBytes(e, Phase::Forward, "kv = p2p_comm_buffers[-1]") == kv);
  // backward: dq_buffer and a step's dq_; two (2, kv) p2p buffers and a step's dk_, dv_.
  CHECK(EventBytes(e, Phase::Backward, "dq_buffer") == 2 * q);
  CHECK(EventBytes(e, Phase::Backward, "p2p_comm_buffers 2") == 5 * kv);
  CHECK(e.rank.why.find("context-parallel rank 3") != std::string::npos);
}

TEST_CASE("Context parallel: gradients and sharded states span dp × cp", "[parallel][context]") {
  Setup cp = LlamaBlocks(2);
  cp.parallel.dataParallel = 2;
  cp.parallel.contextParallel = 4;
  cp.parallel.zeroStage = 1;
  Setup dp = LlamaBlocks(2);
  dp.parallel.dataParallel = 8;
  dp.parallel.zeroStage = 1;
  const Estimate withContext = MustEstimate(cp);
  const Estimate dataOnly = MustEstimate(dp);
  CHECK(withContext.rank.shardWorld == 8);
  CHECK(withContext.rank.worldSize == 8);
  CHECK(withContext.modelStates.optimizerStatesBytes == dataOnly.modelStates.optimizerStatesBytes);
  CHECK(withContext.modelStates.masterWeightsBytes == dataOnly.modelStates.masterWeightsBytes);
  // dp = 1: the context-parallel ranks still all-reduce gradients (DDP's buckets).
  Setup alone = LlamaBlocks(2);
  alone.parallel.contextParallel = 2;
  CHECK(MustEstimate(alone).rank.engine == ShardingEngine::DDP);
}

TEST_CASE("Context parallel: refused where the ring does not split or is not simulated", "[parallel][context]") {
  Setup odd = LlamaBlocks(2);
  odd.parallel.contextParallel = 3;  // 512 is not a multiple of 6
  CHECK(HasErrorOn(Validate(odd), "parallel.contextParallel"));
  Setup eager = LlamaBlocks(2);
  eager.parallel.contextParallel = 2;
  eager.training.attention = AttentionImplementation::Eager;
  CHECK(HasErrorOn(Validate(eager), "parallel.contextParallel"));
  Setup gpt2 = DefaultSetup();
  gpt2.parallel.contextParallel = 2;
  CHECK(HasErrorOn(Validate(gpt2), "parallel.contextParallel"));
  Setup both = LlamaBlocks(2);
  both.training.sequenceLength = 1024;
  both.parallel.contextParallel = 4;  // 256 tokens per rank
  both.parallel.tensorParallel = 32;  // heads split in 32, but 256 / 32 = 8 tokens: fine
  both.parallel.sequenceParallel = true;
  CHECK(Validate(both).empty());
  both.training.sequenceLength = 8 * 24;  // 48 per rank, not a multiple of 32
  CHECK(HasErrorOn(Validate(both), "parallel.sequenceParallel"));
  Setup fine = LlamaBlocks(2);
  fine.parallel.contextParallel = 2;
  CHECK(Validate(fine).empty());
  Setup sliding = fine;  // the ring simulated is the causal one (Gemma 2's, Mistral's windows are not)
  sliding.model.architecture.slidingWindow = 128;
  CHECK(HasErrorOn(Validate(sliding), "parallel.contextParallel"));
}

namespace {

// Mixtral 8x7B's blocks (h 4096, 8 experts of 14336, top-2), bf16 mixed, SDPA, 1 × 512.
Setup MixtralBlocks(std::int64_t layers) {
  Setup s = LlamaBlocks(layers);
  s.model.architecture = FindPreset("mixtral-8x7b")->architecture;
  s.model.architecture.numLayers = layers;
  return s;
}

}  // namespace

TEST_CASE("Expert parallel: the rank holds E/e experts and the router stays whole", "[parallel][expert]") {
  const std::int64_t h = 4096, inter = 14336, E = 8, layers = 2;
  const Setup one = MixtralBlocks(layers);
  for (std::int64_t e : {2, 4, 8}) {
    Setup ep = one;
    ep.parallel.dataParallel = 8;
    ep.parallel.expertParallel = e;
    const Estimate est = MustEstimate(ep);
    CHECK(est.modelStates.parameterCount ==
          MustEstimate(one).modelStates.parameterCount - layers * (E - E / e) * 3 * h * inter);
    CHECK(est.rank.why.find("holds experts 0 to " + std::to_string(E / e - 1)) != std::string::npos);
  }
}

TEST_CASE("Expert parallel: a block saves the single-GPU experts' activations and the dispatcher's", "[parallel][expert]") {
  const std::int64_t h = 4096, T = 512, k = 2, TK = T * k;
  Setup ep = MixtralBlocks(2);
  ep.parallel.dataParallel = 4;
  ep.parallel.expertParallel = 4;
  // Balanced routing: the rank's experts get T·k rows in all, as the 8 experts do on one GPU,
  // so the experts' MLPs save the same bytes. Hugging Face's loop also keeps per row its
  // top_x and idx (int64), the expert output and the scaled output (bf16 [·, h]) and the
  // routing weight (bf16); Megatron's unpermute keeps the sorted indices (int64), the returned
  // rows (bf16 [·, h]) and their probabilities (bf16): T·k·(2h + 8) bytes fewer per block.
  CHECK(SavedPerBlock(MixtralBlocks(2)) - SavedPerBlock(ep) == TK * (2 * h + 8));
  const Estimate e = MustEstimateLabelled(ep);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: all-to-all") == TK * h * 2);
  CHECK(EventBytes(e, Phase::Forward, "dispatch: sort_chunks_by_idxs") == TK * h * 2);
  CHECK(EventBytes(e, Phase::Forward, "combine: all-to-all") == TK * h * 2);
}

TEST_CASE("Expert parallel: expert states are sharded over the expert-data-parallel ranks", "[parallel][expert]") {
  Setup ep = MixtralBlocks(2);
  ep.parallel.dataParallel = 8;
  ep.parallel.expertParallel = 4;
  ep.parallel.zeroStage = 1;
  const Estimate est = MustEstimate(ep);
  const std::int64_t h = 4096, inter = 14336, layers = 2;
  const std::int64_t localExperts = layers * 2 * 3 * h * inter;  // E/e = 2 experts per block
  const std::int64_t dense = est.modelStates.parameterCount - localExperts;
  auto padded = [](std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; };
  // Dense parameters over dp = 8 (padded to 2 × 8), the rank's experts over dp / e = 2 (to 2 × 2).
  const std::int64_t partition = padded(dense, 16) / 8 + padded(localExperts, 4) / 2;
  CHECK(est.modelStates.masterWeightsBytes == partition * 4);
  CHECK(est.modelStates.optimizerStatesBytes == partition * 8);
}

TEST_CASE("Expert parallel: refused where it does not split or is not simulated", "[parallel][expert]") {
  Setup dense = LlamaBlocks(2);
  dense.parallel.dataParallel = 2;
  dense.parallel.expertParallel = 2;
  CHECK(HasErrorOn(Validate(dense), "parallel.expertParallel"));
  Setup three = MixtralBlocks(2);
  three.parallel.dataParallel = 3;
  three.parallel.expertParallel = 3;  // 8 experts do not split in 3
  CHECK(HasErrorOn(Validate(three), "parallel.expertParallel"));
  Setup ranks = MixtralBlocks(2);
  ranks.parallel.dataParallel = 2;
  ranks.parallel.expertParallel = 4;  // 4 does not divide dp × cp = 2
  CHECK(HasErrorOn(Validate(ranks), "parallel.expertParallel"));
  Setup zero3 = MixtralBlocks(2);
  zero3.parallel.dataParallel = 4;
  zero3.parallel.expertParallel = 4;
  zero3.parallel.zeroStage = 3;
  CHECK(HasErrorOn(Validate(zero3), "parallel.expertParallel"));
  Setup zro = MixtralBlocks(2);
  zro.parallel.dataParallel = 4;
  zro.parallel.expertParallel = 4;
  zro.parallel.zeroRedundancyOptimizer = true;
  zro.training.precision = Precision::BF16;
  CHECK(HasErrorOn(Validate(zro), "parallel.expertParallel"));
  Setup tensor = MixtralBlocks(2);
  tensor.parallel.dataParallel = 4;
  tensor.parallel.expertParallel = 4;
  tensor.parallel.tensorParallel = 2;
  // Megatron's MoE layer trains with tensor parallelism only under sequence parallelism
  // (moe_layer.py MoELayer.forward); with it, expert x tensor parallel estimates
  // (tests/expert_compose_test.cpp).
  CHECK(HasErrorOn(Validate(tensor), "parallel.sequenceParallel"));
  tensor.parallel.sequenceParallel = true;
  CHECK(Validate(tensor).empty());
  Setup fine = MixtralBlocks(2);
  fine.parallel.dataParallel = 2;
  fine.parallel.contextParallel = 2;
  fine.parallel.expertParallel = 4;  // divides dp × cp = 4
  CHECK(Validate(fine).empty());
}

TEST_CASE("Sequence context and expert parallel: checkpointed blocks keep the rank's share of their input", "[parallel][sequence][context][expert]") {
  const std::int64_t b = 1, s = 512, h = 4096;
  Setup sp = LlamaBlocks(2);
  sp.training.checkpointing = Checkpointing::EveryBlock;
  sp.parallel.tensorParallel = 4;
  sp.parallel.sequenceParallel = true;
  // A checkpointed block keeps its input only: the hidden states between blocks, s/t tokens.
  CHECK(SavedPerBlock(sp) == b * (s / 4) * h * 2);
  Setup cp = LlamaBlocks(2);
  cp.training.checkpointing = Checkpointing::EveryBlock;
  cp.parallel.contextParallel = 4;
  CHECK(SavedPerBlock(cp) == b * (s / 4) * h * 2);
  Setup ep = MixtralBlocks(2);
  ep.training.checkpointing = Checkpointing::EveryBlock;
  ep.parallel.dataParallel = 2;
  ep.parallel.expertParallel = 2;
  CHECK(SavedPerBlock(ep) == b * s * h * 2);
  // Selective recomputation and every combination estimate.
  for (Checkpointing mode : {Checkpointing::None, Checkpointing::Selective, Checkpointing::EveryBlock}) {
    Setup all = MixtralBlocks(2);
    all.training.checkpointing = mode;
    all.parallel.dataParallel = 2;
    all.parallel.contextParallel = 2;
    all.parallel.expertParallel = 4;
    all.parallel.zeroStage = 2;
    all.parallel.gradientAccumulationSteps = 2;
    CHECK(MustEstimate(all).peak.totalBytes > 0);
    Setup dense = LlamaBlocks(2);
    dense.training.checkpointing = mode;
    dense.parallel.dataParallel = 2;
    dense.parallel.tensorParallel = 2;
    dense.parallel.sequenceParallel = true;
    dense.parallel.contextParallel = 2;
    dense.parallel.zeroStage = 3;
    CHECK(MustEstimate(dense).peak.totalBytes > 0);
  }
}

TEST_CASE("Sequence context and expert parallel: a pasted Megatron command line estimates", "[parallel][sequence][context][expert]") {
  const ParallelImport dense = ImportMegatronArguments(
      "--tensor-model-parallel-size 2 --sequence-parallel --context-parallel-size 2 --use-distributed-optimizer "
      "--micro-batch-size 1 --seq-length 4096 --bf16",
      LlamaBlocks(2));
  REQUIRE(dense.ok());
  Setup s = dense.setup;
  s.parallel.dataParallel = 2;
  const Estimate e = MustEstimate(s);
  CHECK(e.rank.worldSize == 8);
  CHECK(e.rank.shardWorld == 4);  // the distributed optimizer over dp × cp
  const ParallelImport moe = ImportMegatronArguments(
      "--expert-model-parallel-size 4 --use-distributed-optimizer --micro-batch-size 1 --seq-length 2048 --bf16",
      MixtralBlocks(2));
  REQUIRE(moe.ok());
  Setup m = moe.setup;
  CHECK(HasErrorOn(Validate(m), "parallel.expertParallel"));  // dp × cp = 1: no ranks to take experts from
  m.parallel.dataParallel = 8;
  CHECK(MustEstimate(m).modelStates.parameterCount < MustEstimate(MixtralBlocks(2)).modelStates.parameterCount);
}
