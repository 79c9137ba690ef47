// Host (CPU) memory: what ZeRO-Offload / FSDP CPU offload keep on the host, the pinned copies of
// offloaded activations, paged optimizer states (core/src/replay/host_memory.cpp; docs/device.md
// "Host memory").
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"
#include "replay/host_memory.hpp"
#include "sim/savers.hpp"
#include "sim/trace_builder.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup Zero(std::int64_t psi, std::int64_t dp, int stage, OffloadKind offload) {
  Setup s = QuickSetup(psi, Precision::FP16Mixed, OptimizerKind::Adam);
  s.parallel.dataParallel = dp;
  s.parallel.zeroStage = stage;
  s.parallel.offload = offload;
  return s;
}

const HostRow* RowOf(const HostMemory& h, const std::string& label) {
  for (const HostRow& r : h.rows) if (r.label == label) return &r;
  return nullptr;
}

std::int64_t RowBytes(const HostMemory& h, const std::string& label) {
  const HostRow* r = RowOf(h, label);
  return r ? r->bytes : -1;
}

}  // namespace

TEST_CASE("host memory: ZeRO-2 with the optimizer offloaded holds the padded fp32 partition three times over", "[host]") {
  // Ψ = 1,500,000,001: the flat group is padded to a multiple of 2 × 8 = 16 elements
  // (stage_1_and_2.py nccl_start_alignment_factor × dp): 1,500,000,016, so 187,500,002 per rank.
  const std::int64_t psi = 1'500'000'001;
  const Estimate e = MustEstimate(Zero(psi, 8, 2, OffloadKind::Optimizer));
  REQUIRE(e.modelStates.parameterCount == psi);
  const std::int64_t partition = 187'500'002;
  const HostMemory& h = e.host;
  CHECK(RowBytes(h, "fp32 master partition") == partition * 4);
  CHECK(RowBytes(h, "optimizer states") == partition * 8);  // Adam: exp_avg + exp_avg_sq in fp32
  CHECK(RowBytes(h, "fp32 gradient partition") == partition * 4);
  // No 16-bit gradient partition on the host for stage 1/2 (copy_grads_in_partition copies into
  // the fp32 buffer directly with cpu_offload) and no accumulation buffers at one micro-batch.
  CHECK(h.rows.size() == 3);
  CHECK(h.rankBytes == 16 * partition);
  CHECK(h.rankBytes == 3'000'000'032);
  CHECK(h.pinnedBytes == 0);  // offload_optimizer.pin_memory defaults to False
  CHECK(h.unifiedBytes == 0);
  CHECK(h.ranksPerNode == 8);
  CHECK(h.nodeBytes == 8 * h.rankBytes);
  for (const HostRow& r : h.rows) {
    CHECK(r.memory == "pageable");
    CHECK_FALSE(r.source.empty());
    CHECK_FALSE(r.formula.empty());
  }
  // What moved to the host is what the GPU no longer holds.
  CHECK(e.modelStates.masterWeightsBytes == 0);
  CHECK(e.modelStates.optimizerStatesBytes == 0);
  CHECK(e.rank.optimizerStatesHeld == "host");
}

TEST_CASE("host memory: DeepSpeed's CPU estimators as written and where they agree", "[host]") {
  const std::int64_t psi = 1'500'000'000;
  // estimate_zero2_model_states_mem_needs: Ψ × max(4 × total_gpus, 16) × 1.5 per node.
  CHECK(DeepSpeedZero2CpuBytes(psi, 8, 1, true) == 72'000'000'000);
  CHECK(DeepSpeedZero2CpuBytes(psi, 1, 1, true) == 36'000'000'000);
  CHECK(DeepSpeedZero2CpuBytes(psi, 8, 1, false) == 72'000'000'000);  // Ψ × 4 × 8 × 1.5
  // estimate_zero3_model_states_mem_needs with zero_init: Ψ × 16 (18 with offload_param) / nodes × 1.5.
  CHECK(DeepSpeedZero3CpuBytes(psi, 0, 8, 1, true, false) == 36'000'000'000);
  CHECK(DeepSpeedZero3CpuBytes(psi, 0, 8, 2, true, true) == 20'250'000'000);
  CHECK(DeepSpeedZero3CpuBytes(psi, 100, 8, 1, false, false) == 4'800);
  CHECK(DeepSpeedZero3CpuBytes(psi, 0, 8, 1, true, false, false) == 72'000'000'000);  // max(4 × 8, 16) × 1.5

  // ZeRO-2 on one GPU: DeepSpeed's max(4·1, 16) = 16 B per parameter is master + states + fp32
  // gradients, the simulated rank's host bytes, once its 1.5 buffer factor is taken out.
  const Estimate one = MustEstimate(Zero(psi, 1, 2, OffloadKind::Optimizer));
  CHECK(one.host.nodeBytes == DeepSpeedZero2CpuBytes(psi, 1, 1, true, 1.0));
  // On 8 GPUs they part: DeepSpeed's 4 × total_gpus counts every process loading the whole fp32
  // model on the host at start-up (32 B per parameter per node); the training step holds 16 B
  // per parameter per node (2 B per parameter on each of 8 ranks × 8).
  const Estimate eight = MustEstimate(Zero(psi, 8, 2, OffloadKind::Optimizer));
  CHECK(eight.host.nodeBytes == 16 * psi);
  CHECK(DeepSpeedZero2CpuBytes(psi, 8, 1, true, 1.0) == 32 * psi);

  // ZeRO-3: DeepSpeed's 16 B per parameter per node is master + states + fp32 gradients; the rank
  // also keeps grad_partitions_flat_buffer (the 16-bit gradient partition, 2 B) on the host.
  const Estimate z3 = MustEstimate(Zero(psi, 8, 3, OffloadKind::Optimizer));
  const std::int64_t partition = psi / 8;  // one tensor of Ψ, ⌈Ψ / 8⌉ = Ψ / 8
  CHECK(RowBytes(z3.host, "gradient partitions (grad_partitions_flat_buffer)") == partition * 2);
  CHECK(z3.host.rankBytes == 18 * partition);
  CHECK(z3.host.nodeBytes - 8 * partition * 2 == DeepSpeedZero3CpuBytes(psi, 0, 8, 1, true, false, true, 1.0));
  // With offload_param the 16-bit partitions come along: DeepSpeed's 18.
  const Estimate z3p = MustEstimate(Zero(psi, 8, 3, OffloadKind::OptimizerAndParameters));
  CHECK(RowBytes(z3p.host, "parameter partitions") == partition * 2);
  CHECK(z3p.host.nodeBytes - 8 * partition * 2 == DeepSpeedZero3CpuBytes(psi, 0, 8, 1, true, true, true, 1.0));
  CHECK(z3p.modelStates.parametersBytes == 0);
}

TEST_CASE("host memory: ZeRO-1 with gradient accumulation keeps whole parameters' gradients on the host", "[host]") {
  // Two tensors: 1,000 and 3,000 elements (a matrix and the rest); 4 ranks pad to 4,000 → 1,000
  // per rank. Rank 0's partition [0, 1,000) holds the first tensor only; with accumulation each
  // of its parameters gets a whole-sized 16-bit buffer (accumulated_grads_in_cpu).
  Setup s = Zero(4000, 4, 1, OffloadKind::Optimizer);
  s.model.largestMatrices = {{10, 100}};
  s.parallel.gradientAccumulationSteps = 2;
  const Estimate e = MustEstimate(s);
  CHECK(RowBytes(e.host, "accumulated gradients (accumulated_grads_in_cpu)") == 1000 * 2);
  // A partition that ends inside the second tensor takes it whole: 3 ranks, 4,002 padded (÷ 6),
  // 1,334 each.
  s.parallel.dataParallel = 3;
  const Estimate three = MustEstimate(s);
  CHECK(RowBytes(three.host, "fp32 master partition") == 1334 * 4);
  CHECK(RowBytes(three.host, "accumulated gradients (accumulated_grads_in_cpu)") == 4000 * 2);
}

TEST_CASE("host memory: FSDP CPU offload pins the shards and the gradient shards", "[host]") {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 512;
  s.parallel.dataParallel = 16;
  s.parallel.fsdp = FsdpMode::HybridShard;
  s.parallel.fsdpShardGroupSize = 4;
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  const Estimate e = MustEstimate(s);
  const HostMemory& h = e.host;
  REQUIRE(e.rank.shardWorld == 4);
  REQUIRE(RowOf(h, "parameter shards") != nullptr);
  const std::int64_t shards = RowBytes(h, "parameter shards") / 4;  // fp32 shards under mixed precision
  CHECK(shards * 4 == RowBytes(h, "parameter shards"));
  CHECK(RowBytes(h, "gradient shards") == shards * 4);  // fp32 (the sharded FlatParameter's dtype)
  CHECK(RowBytes(h, "optimizer states") == shards * 8);  // AdamW on the fp32 shards, pageable
  CHECK(RowOf(h, "parameter shards")->memory == "pinned");
  CHECK(RowOf(h, "gradient shards")->memory == "pinned");
  CHECK(RowOf(h, "optimizer states")->memory == "pageable");
  CHECK(h.pinnedBytes == shards * 8);
  CHECK(h.rankBytes == shards * 16);
  // Each unit padded to a multiple of 4: 7B's shards are a quarter of its count, rounded up per unit.
  CHECK(shards >= (e.modelStates.parameterCount + 3) / 4);
  CHECK(shards < e.modelStates.parameterCount / 4 + 4 * 40);
  // A node is the HYBRID_SHARD group.
  CHECK(h.ranksPerNode == 4);
  CHECK(h.nodeBytes == 4 * h.rankBytes);
  CHECK(e.modelStates.parametersBytes == 0);
}

TEST_CASE("host memory: nothing offloaded means no host section and unchanged JSON", "[host]") {
  const Estimate plain = MustEstimate(DefaultSetup());
  CHECK(plain.host.rows.empty());
  CHECK(plain.host.rankBytes == 0);
  CHECK(plain.host.nodeBytes == 0);
  CHECK(EstimateToJson(plain).find("\"host\"") == std::string::npos);
  Setup ddp = DefaultSetup();
  ddp.parallel.dataParallel = 8;
  CHECK(MustEstimate(ddp).host.rows.empty());
  Setup zero = Zero(1'000'000, 8, 2, OffloadKind::None);
  CHECK(MustEstimate(zero).host.rows.empty());
  // With offload the JSON carries it.
  const std::string json = EstimateToJson(MustEstimate(Zero(1'000'000, 8, 2, OffloadKind::Optimizer)));
  CHECK(json.find("\"host\"") != std::string::npos);
  CHECK(json.find("\"rankBytes\"") != std::string::npos);
  CHECK(json.find("\"ranksPerNode\"") != std::string::npos);
}

TEST_CASE("host memory: ranks per node", "[host]") {
  ParallelDef p;
  CHECK(RanksPerNode(p) == 1);
  p.dataParallel = 4;
  CHECK(RanksPerNode(p) == 4);
  p.dataParallel = 64;
  CHECK(RanksPerNode(p) == 8);
  p.fsdp = FsdpMode::HybridShard;
  p.fsdpShardGroupSize = 16;
  CHECK(RanksPerNode(p) == 16);
  p.dataParallel = 2;
  p.tensorParallel = 4;
  p.fsdp = FsdpMode::Off;
  CHECK(RanksPerNode(p) == 8);
}

TEST_CASE("host memory: paged optimizer states are unified memory and not host bytes", "[host]") {
  Setup s = QuickSetup(10'000'000, Precision::BF16Mixed, OptimizerKind::PagedAdamW);
  const Estimate e = MustEstimate(s);
  // One trainable tensor of 1e7 ≥ 1e5 elements: state1 and state2 in fp32 (optim_bits 32).
  CHECK(e.host.unifiedBytes == 10'000'000 * 8);
  CHECK(e.host.rankBytes == 0);
  CHECK(e.host.nodeBytes == 0);
  REQUIRE(e.host.rows.size() == 1);
  CHECK(e.host.rows[0].memory == "unified");
  // They are model states, but no allocation: the device figure holds them while resident.
  CHECK(e.modelStates.optimizerStatesBytes == 10'000'000 * 8);
  CHECK(e.device.unifiedBytes == 10'000'000 * 8);
}

TEST_CASE("host memory: offloaded activations peak between their pack and their unpack", "[host]") {
  Trace trace;
  TraceBuilder b(trace);
  TextStore& text = b.text();
  ActivationOffload offload(b);
  auto alloc = [&](std::int64_t bytes) { return b.Alloc(Category::Activations, bytes, text.Make({"x"}), text.Make({"x"}), Text{}); };
  const Text name = text.Make({"saved"});
  offload.SetActive(true);
  // Forward 1, by hand: 1,023 B (under min_offload_size) and a parameter stay on the GPU; 2,048,
  // 4,096 and 8,192 B get pinned host copies: 14,336 B on the host once all are packed.
  CHECK(offload.Pack(alloc(1023), 1023, false, name) == -1);
  CHECK(offload.Pack(alloc(8192), 8192, true, name) == -1);
  const int a = offload.Pack(alloc(2048), 2048, false, name);
  const int c = offload.Pack(alloc(4096), 4096, false, name);
  const int d = offload.Pack(alloc(8192), 8192, false, name);
  CHECK(trace.offloadedActivationsPeakBytes == 14'336);
  offload.SetActive(false);
  // Backward unpacks (del self.tracker[id]) let the copies go, one by one.
  offload.BeginOp();
  offload.Unpack(d, name, -1);
  offload.AfterOp(name);
  offload.BeginOp();
  offload.Unpack(c, name, -1);
  offload.Unpack(a, name, -1);
  offload.AfterOp(name);
  offload.EndBackward(name);
  // Forward 2 packs 3 × 4,096 B: 12,288 on the host, under the first forward's peak.
  offload.SetActive(true);
  std::vector<int> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(offload.Pack(alloc(4096), 4096, false, name));
  CHECK(trace.offloadedActivationsPeakBytes == 14'336);
  // A fourth and fifth take the second forward above it: 20,480.
  ids.push_back(offload.Pack(alloc(4096), 4096, false, name));
  ids.push_back(offload.Pack(alloc(4096), 4096, false, name));
  CHECK(trace.offloadedActivationsPeakBytes == 20'480);
}

TEST_CASE("host memory: a GPT-2's offloaded activations counted by hand", "[host]") {
  // GPT-2, h 64, 4 heads, fp32, SDPA, dropout 0.1, batch 4 × 128 tokens: u = b·s·h·4 B = 131,072.
  // Everything packed under the context of at least 1,024 B gets a pinned copy; each is held
  // from its pack to its unpack in backward, so the peak is every pack of the forward:
  //   per block: ln_1 x, mean, rstd (u + 2·b·s·4) · c_attn input (u) · SDPA q, k, v, out (4u) and
  //   the fp32 logsumexp (b·heads·s·4 = u/16) · c_proj input (u) · dropout mask (b·s·h bool = u/4)
  //   · ln_2 (u + 2·b·s·4) · c_fc input (u) · gelu_new: pow's input, tanh's output, 0.5·x and
  //   1 + tanh (4 × 4u) · mlp c_proj input (4u) · dropout mask (u/4) = 29.625 u = 3,883,008 B;
  //   outside: input_ids (b·s·8 = 4,096 B) and position_ids (s·8 = 1,024 B) saved by the
  //   embeddings, the embedding dropout mask (u/4), ln_f (u + 2·b·s·4); the head and loss run
  //   outside the context. Parameters and tensors under 1,024 B (SDPA's seeds) stay on the GPU.
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  ArchitectureDef a = DefaultArchitecture(Family::GPT2);
  a.vocabSize = 1000;
  a.hiddenSize = 64;
  a.numLayers = 2;
  a.numHeads = 4;
  a.maxPositionEmbeddings = 128;
  a.tieWordEmbeddings = true;
  s.model.architecture = a;
  s.training.batchSize = 4;
  s.training.sequenceLength = 128;
  s.training.precision = Precision::FP32;
  s.training.optimizer = OptimizerKind::SGD;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.activationOffloading = true;
  const std::int64_t u = 4 * 128 * 64 * 4, rows = 2 * 4 * 128 * 4;
  const std::int64_t block = (u + rows) + u + 4 * u + u / 16 + u + u / 4 + (u + rows) + u + 4 * 4 * u + 4 * u + u / 4;
  CHECK(block == 3'883'008);
  const std::int64_t outside = 4 * 128 * 8 + 128 * 8 + u / 4 + (u + rows);
  const Estimate e = MustEstimate(s);
  CHECK(RowBytes(e.host, "offloaded activations (peak)") == 2 * block + outside);
  CHECK(RowOf(e.host, "offloaded activations (peak)")->memory == "pinned");
  CHECK(e.host.pinnedBytes == 2 * block + outside);
  CHECK(e.host.rankBytes == e.host.pinnedBytes);
  CHECK(e.host.ranksPerNode == 1);
  CHECK(e.host.nodeBytes == e.host.rankBytes);
  // One block more adds one block's packs.
  s.model.architecture.numLayers = 3;
  CHECK(RowBytes(MustEstimate(s).host, "offloaded activations (peak)") == 3 * block + outside);
  // Off, nothing is on the host.
  s.training.activationOffloading = false;
  CHECK(MustEstimate(s).host.rows.empty());
}

TEST_CASE("host memory: a paged optimizer under ZeRO pages the rank's fp32 partition", "[host]") {
  // ZeRO-2 over 4 ranks hands bitsandbytes the fp32 flat partition: 2,500,000 elements (≥ 1e5),
  // state1 and state2 in fp32 — the bytes the rank's GPU states count.
  Setup s = QuickSetup(10'000'000, Precision::BF16Mixed, OptimizerKind::PagedAdamW);
  s.parallel.dataParallel = 4;
  s.parallel.zeroStage = 2;
  const Estimate e = MustEstimate(s);
  CHECK(e.host.unifiedBytes == 2'500'000 * 8);
  CHECK(e.host.unifiedBytes == e.modelStates.optimizerStatesBytes);
  CHECK(e.host.rankBytes == 0);
  CHECK(e.host.ranksPerNode == 4);
}
