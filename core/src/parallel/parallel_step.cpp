// The simulated rank's sharded model states and communication buffers (docs/parallel.md).
#include "parallel/parallel_step.hpp"
#include "parallel/step_streams.hpp"
#include "parallel/parallel_fidelity.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/sequence_split.hpp"
#include "device/device_stage.hpp"

#include <algorithm>
#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

bool ShardsFp32(const ShardPlan& plan) {
  return plan.engine == ShardingEngine::Zero || plan.engine == ShardingEngine::Fsdp ||
         plan.engine == ShardingEngine::Fsdp2;
}

// Bytes of parameter `t` this rank holds when it keeps `held` of its storage elements: a whole
// parameter as on one GPU (its own dtype or bitsandbytes layout: finetune.hpp StoredBytes), a
// ZeRO-3 partition in the regime's dtype, plus a quantized weight's statistics, which are no
// parameter and stay whole on every rank (its QuantState).
std::int64_t HeldBytes(const Tensor& t, std::int64_t held, DType weights) {
  if (held == StorageElements(t)) return StoredBytes(t, weights);
  return held * BytesPerElement(weights) + QuantStatisticsBytes(t, weights);
}

// FSDP (use_orig_params=True) or FSDP2 with frozen parameters: torch.optim sees the trainable
// parts (FSDP) or the trainable parameters' shards (FSDP2) only.
bool UsesTrainableParts(const Setup& setup, const ShardPlan& plan) {
  return (plan.engine == ShardingEngine::Fsdp || plan.engine == ShardingEngine::Fsdp2) && FinetuneActive(setup.finetune);
}

// A quantized weight's statistics the GPU keeps whole beside the sharded codes: bitsandbytes'
// QuantState (no parameter: FSDP and ZeRO-3 never move it), or torchao NF4Tensor's scaler_mean
// and table, which are attributes of the sharded NF4Tensor itself and go to the host with it
// under FSDP2's CPUOffloadPolicy (nf4tensor.py function_to_dtype moves every inner tensor of
// __tensor_flatten__).
std::int64_t OnDeviceStatisticsBytes(const Tensor& t, const ShardPlan& plan, DType weights) {
  if (t.storage == Tensor::Storage::TorchaoNF4 && plan.offloadParameters) return 0;
  return QuantStatisticsBytes(t, weights);
}

// FSDP unit of a parameter: 0 = root, 1 + block.
int UnitOf(const Tensor& t) { return t.layer < 0 ? 0 : t.layer + 1; }

// ZeroParamGather1Rank. DeepSpeed's all_gather_coalesced (partition_parameters.py, edaa722)
// returns _no_gather_coalesced when every parameter's partition world is 1: NoGatherHandle /
// NoGatherCoalescedHandle set `param.data = param.ds_tensor.data.to(device).view(ds_shape)`, and
// with the partitions on the GPU that .to() is the tensor itself: a view, no allocation. (With
// offload_param the partitions are on the host and .to() copies each to the GPU, as a gather.)
bool ZeroGathersInPlace(const ShardPlan& plan) {
  return plan.engine == ShardingEngine::Zero && plan.zeroStage == 3 && plan.shardWorld == 1 && !plan.offloadParameters;
}

// FSDP1 over a shard group of one rank. torch/distributed/fsdp/_init_utils.py _init_core_state:
// "FSDP is switching to use `NO_SHARD` instead of {sharding_strategy} since the world size is 1"
// (FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD alike). Under NO_SHARD (_flat_param.py) the
// FlatParameter is whole and never all-gathered: with parameter mixed precision pre_unshard's
// _use_low_precision_shard makes the 16-bit copy (_mp_shard) that the unit computes with, and
// post_reshard frees it at every reshard, after forward too ("For `NO_SHARD`, `_mp_shard` is not
// freed in the post-unshard ... we delay the free until the reshard"); without it the unit
// computes with the FlatParameter itself. The gradient is all-reduced in place
// (_runtime_utils.py _reduce_grad_no_shard) and then cast to the parameter's dtype
// (_cast_grad_to_param_dtype): no reduce-scatter output.
bool Fsdp1NoShard(const ShardPlan& plan) { return plan.engine == ShardingEngine::Fsdp && plan.shardWorld == 1; }

}  // namespace

// The regime torch.optim sees. ZeRO hands it the fp32 flat partition with an fp32 gradient;
// FSDP with MixedPrecision keeps the sharded parameters (and their gradients) in fp32 and
// casts to param_dtype only for the gathered copy (torch/distributed/fsdp/_flat_param.py
// _use_low_precision_shard). No further upcast happens in the step.
Regime OptimizerRegimeOf(const ShardPlan& plan, const Regime& regime) {
  if (!ShardsFp32(plan) || !regime.masterWeights) return regime;
  Regime r = regime;
  r.weights = DType::FP32;
  r.gradients = DType::FP32;
  r.masterWeights = false;
  return r;
}

ParallelStep::ParallelStep(const Setup& setup, const Inventory& inventory, const std::vector<Text>& names,
                           const Regime& regime, TextStore& text)
    : setup_(setup), inventory_(inventory), names_(names), regime_(regime), plan_(PlanShards(setup, inventory)) {
  optimizerRegime_ = OptimizerRegimeOf(plan_, regime_);
  deepSpeedZero12_ = plan_.engine == ShardingEngine::Zero && DeepSpeedZeroOneTwo(setup_);
  if (deepSpeedZero12_) SetUpZeroPartition();
  if (setup_.parallel.gradReduceInFp32 && plan_.engine != ShardingEngine::Zero && regime_.masterWeights) {
    // Megatron's Float16OptimizerWithFloat16Params (megatron/core/optimizer/optimizer.py): the
    // fp32 main params (param.detach().clone().float(), made at construction) get
    // main_param.grad = model_param.main_grad.float(), an fp32 view of the buffer, no copy
    // (_copy_model_grads_to_main_grads): the optimizer runs on fp32 tensors, nothing is upcast.
    optimizerRegime_.weights = DType::FP32;
    optimizerRegime_.gradients = DType::FP32;
    optimizerRegime_.masterWeights = false;
  }
  if (!plan_.offloadOptimizer) {
    if ((plan_.engine == ShardingEngine::None || plan_.engine == ShardingEngine::DDP) &&
        !setup_.parallel.zeroRedundancyOptimizer) {
      optimizerNames_ = names_;
      optimizerInventory_ = inventory_;
    } else {
      // FSDP with frozen parameters: the trainable parts of the rank's shard (sharding.cpp).
      optimizerInventory_ = UsesTrainableParts(setup_, plan_) ? plan_.trainableShardParts : plan_.optimizerTensors;
      for (const Tensor& t : optimizerInventory_.parameters) optimizerNames_.push_back(text.Own(t.name));
    }
  }
  const int blocks = static_cast<int>(plan_.unitElements.size());
  // FSDP2 with the embedding and the output layer as units of their own: two more units.
  const std::size_t units = 1 + plan_.unitElements.size() +
                            (plan_.engine == ShardingEngine::Fsdp2 && setup_.parallel.fsdpShardEmbeddingsAndHead ? 2 : 0);
  for (const Tensor& t : inventory_.parameters) unitOf_.push_back(UnitOf(t));
  if (plan_.engine == ShardingEngine::Fsdp2) {
    unitOf_ = Fsdp2UnitOfParameter(setup_, inventory_, blocks);
    // _fsdp_collectives.py foreach_reduce: each gradient padded on dim 0 to a multiple of the
    // world (_get_dim0_padded_size), i.e. the parameter's padded shard (sharding.cpp) × world.
    // Only parameters with a gradient enter it (_fsdp_param_group.py post_backward:
    // fsdp_params_with_grad): a frozen base weight is gathered with its unit but never reduced.
    fsdp2PaddedElements_.assign(units, 0);
    fsdp2ShardElements_.assign(units, 0);
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
      if (!inventory_.parameters[i].trainable) continue;
      const std::int64_t shard = plan_.optimizerTensors.parameters[i].Elements();
      fsdp2ShardElements_[static_cast<std::size_t>(unitOf_[i])] += shard;
      fsdp2PaddedElements_[static_cast<std::size_t>(unitOf_[i])] += shard * plan_.shardWorld;
    }
    parameterGrads_.assign(units, {});
  }
  unsharded_.assign(units, kNoTensor);
  sharded_.assign(units, kNoTensor);
  const ParallelDef& p = setup_.parallel;
  gathers_ = (plan_.engine == ShardingEngine::Zero && plan_.zeroStage == 3) || plan_.engine == ShardingEngine::Fsdp ||
             plan_.engine == ShardingEngine::Fsdp2;
  // SHARD_GRAD_OP and fully_shard(reshard_after_forward=False) keep forward's gathered
  // parameters to the unit's backward (FSDP ShardingStrategy docs; _fully_shard.py).
  reshardAfterForward_ = !(p.fsdp == FsdpMode::ShardGradOp || (p.fsdp == FsdpMode::FullyShard && !p.reshardAfterForward)) ||
                        Fsdp1NoShard(plan_);
  // torchtitan parallelize_llama.py apply_fsdp (no PP): fully_shard(block, reshard_after_forward=
  // int(layer_id) < len(model.layers) - 1), "since FSDP would prefetch it immediately".
  keepLastBlock_ = plan_.engine == ShardingEngine::Fsdp2 && p.fsdpKeepLastBlockGathered;
  gatherElements_.assign(units, 0);
  gatherExtraBytes_.assign(units, 0);
  gathered_.assign(units, kNoTensor);
  // FSDP2 with the finetune section (no pipeline: refused with fine-tuning): the block's reduce at
  // the next block's backward. Without fine-tuning every block's first gradient comes at once.
  reduceOnNextBlock_ = plan_.engine == ShardingEngine::Fsdp2 && FinetuneActive(setup_.finetune);
  if (plan_.engine == ShardingEngine::Fsdp2 && p.pipelineParallel > 1) {
    // torch.distributed.pipelining: one backward per micro-batch (and chunk) of the stage's
    // schedule; the last one of the step is followed by the gradient sync.
    pipelineNoSync_ = true;
    // Every virtual stage runs one backward per micro-batch (PipelineScheduleOf).
    backwardsPerChunk_ = p.gradientAccumulationSteps;
    const std::vector<std::int64_t> chunkLayers = StageChunkLayers(setup_);
    const int v = static_cast<int>(chunkLayers.size());
    chunkBackwardsSeen_.assign(chunkLayers.size(), 0);
    // torchtitan (parallelize_llama.py: parallelize_fn per model part, each apply_fsdp ending in
    // fully_shard(model_part)) and pipelining's ScheduleInterleaved1F1B: each virtual stage's
    // blocks (StageChunkLayers, as PipelineChunkOf runs them), and its root. The root's own
    // parameters are the embeddings on the first stage (chunk 0) and the final norm and head on
    // the last (chunk v − 1), as are the embedding and output units.
    chunkOfUnit_.assign(units, 0);
    chunkOfUnit_[0] = p.pipelineStage == 0 ? 0 : v - 1;
    int u = 1;
    for (std::size_t c = 0; c < chunkLayers.size(); ++c) {
      for (std::int64_t k = 0; k < chunkLayers[c] && u <= blocks; ++k) chunkOfUnit_[static_cast<std::size_t>(u++)] = static_cast<int>(c);
    }
    if (units > static_cast<std::size_t>(blocks) + 2) chunkOfUnit_[static_cast<std::size_t>(blocks) + 2] = v - 1;
    accumulatedGrad_.assign(inventory_.parameters.size(), kNoTensor);
  }
  pendingAllGather_.assign(units, kNoTensor);
  if (plan_.engine == ShardingEngine::Fsdp2) {
    unitParameters_.assign(units, {});
    parameterOutputs_.assign(units, {});
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) unitParameters_[static_cast<std::size_t>(unitOf_[i])].push_back(i);
  }
  std::vector<std::int64_t> gatheredOfParameter(inventory_.parameters.size(), 0);
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    const Tensor& t = inventory_.parameters[i];
    // ZeRO-3 gathers only what it partitioned: persistent parameters are already whole. Over one
    // rank nothing is gathered (ZeroParamGather1Rank).
    const bool whole = plan_.engine == ShardingEngine::Zero && !plan_.offloadParameters &&
                       (StorageElements(t) < p.stage3ParamPersistenceThreshold || ZeroGathersInPlace(plan_));
    if (whole) continue;
    // FSDP2 all-gathers a torchao NF4Tensor's codes, scalers and factors (fsdp_pre_all_gather),
    // inputs of mixed dtypes viewed as uint8 (_fsdp_collectives.py foreach_all_gather): bytes,
    // split evenly (nf4_split), so unpadded.
    if (t.storage == Tensor::Storage::TorchaoNF4) {
      gatherExtraBytes_[static_cast<std::size_t>(unitOf_[i])] += StorageElements(t);
      continue;
    }
    // FSDP1 over one rank (NO_SHARD) with the FlatParameter in the compute dtype uses it as it is.
    if (Fsdp1NoShard(plan_) && !regime_.masterWeights) continue;
    // FSDP2 gathers every other parameter's padded shard from every rank: the all-gather output
    // and each parameter's all_gather_outputs hold world × padded_sharded_size elements
    // (_fsdp_param.py init_all_gather_outputs; the unsharded parameter is a view of its first
    // numel, init_unsharded_param).
    gatheredOfParameter[i] = plan_.engine == ShardingEngine::Fsdp2
                                 ? plan_.optimizerTensors.parameters[i].Elements() * plan_.shardWorld
                                 : StorageElements(t);
    gatherElements_[static_cast<std::size_t>(unitOf_[i])] += gatheredOfParameter[i];
  }
  if (gathers_ && plan_.engine == ShardingEngine::Zero) {
    gatheredOfParameter_ = std::move(gatheredOfParameter);
    reuseKeptElements_.assign(units, 0);
    keptPart_.assign(units, kNoTensor);
    keptWhole_.assign(units, 0);
    backwardUse_.assign(units, 0);
    // The root's parameters are the embeddings (listed before the blocks) and the final norm and
    // head (after them), fetched by sub-modules of their own at either end of the forward. Apart
    // only with an untied head: a tied one is the embedding's weight, used at both ends.
    if (setup_.model.kind == ModelKind::Transformer && !setup_.model.architecture.tieWordEmbeddings && blocks > 0) {
      for (std::size_t i = 0; i < inventory_.parameters.size() && inventory_.parameters[i].layer < 0; ++i) {
        zeroEmbeddingElements_ += gatheredOfParameter_[i];
      }
      gatherElements_[0] -= zeroEmbeddingElements_;  // unit 0 now stands for the final norm and head
      zeroRootApart_ = true;
    }
  }
}

// ZeRO-3 from the second forward on (DeepSpeed partitioned_param_coordinator.py at edaa722). The
// first forward's reset_step sets the trace to RECORD; the next one's freezes the recorded
// sub-module order and sets it COMPLETE. Only with a complete trace does fetch_sub_module
// prefetch, and does release_sub_module ask __params_to_release, which keeps a parameter
// gathered when it is used again within stage3_max_reuse_distance elements: it walks
// __submodule_order from the next fetch on, summing each sub-module's ds_numel, and stops once
// the sum reaches the limit; parameters of the sub-modules it reaches are not released. Without
// a complete trace every parameter is released after its sub-module.
//
// The recorded trace is the first backward's (EndBackward calls this once): which blocks and
// whether the embeddings were fetched in it (Enter). A forward parameter's next use is its
// backward (or, in a checkpointed block, the block's recompute); a block or embeddings that
// backward never reached (frozen ones before the first that trains) have none, and are released
// after their forward. The sub-modules between, for a parameter p of block u:
//   forward:  the sub-modules after p's in block u (A), the later blocks (S), the final norm and
//             the head (T: with a tied head, the token embedding is the head's weight);
//   backward: the head and norm again (T), each later block that backward reached once, or
//             twice when it is checkpointed (its recompute, then its backward: S'), then in
//             block u the sub-modules after p's (A; checkpointed: the recompute of those before
//             it, B).
// p stays gathered iff A + S + T + T + S' + (A or B) < stage3_max_reuse_distance. The
// tensors' forward order within a block (ForwardOrder: a decoder layer registers its norms after
// the MLP but runs them first) stands for the sub-modules' order, one sub-module per tensor.
// With the default 1e9 a model under about 5e8 parameters keeps every block from its forward
// to its backward; Llama 2 7B (2.0e8 per block, the head 1.3e8) keeps its last block and
// 1.7e8 elements of the one before, or with every block checkpointed its last block only.
void ParallelStep::PlanZeroReuse() {
  const std::vector<Tensor>& params = inventory_.parameters;
  const std::vector<std::int64_t>& gatheredOfParameter = gatheredOfParameter_;
  const int blocks = static_cast<int>(plan_.unitElements.size());
  auto reached = [&](int block) { return backwardUse_[static_cast<std::size_t>(block) + 1] != 0; };
  std::size_t lastBlockParameter = 0;
  for (std::size_t i = 0; i < params.size(); ++i) if (params[i].layer >= 0) lastBlockParameter = i;
  std::int64_t tail = 0;
  for (std::size_t i = lastBlockParameter + 1; i < params.size(); ++i) if (params[i].layer < 0) tail += StorageElements(params[i]);
  const bool transformer = setup_.model.kind == ModelKind::Transformer;
  if (transformer && setup_.model.architecture.tieWordEmbeddings && !params.empty()) tail += StorageElements(params.front());
  const TrainingDef& t = setup_.training;
  auto checkpointed = [&](int block) {
    return transformer && (t.checkpointing == Checkpointing::EveryBlock || t.checkpointing == Checkpointing::SelectiveOp ||
                           (t.checkpointing == Checkpointing::EveryKthBlock && block % t.checkpointInterval == 0));
  };
  // later[b]: Σ numel of the blocks after block b; laterInBackward[b]: those backward reached,
  // each checkpointed one counted twice.
  std::vector<std::int64_t> later(static_cast<std::size_t>(blocks) + 1, 0), laterInBackward(later);
  for (int b = blocks - 1; b > 0; --b) {
    const std::int64_t n = plan_.unitElements[static_cast<std::size_t>(b)];
    later[static_cast<std::size_t>(b - 1)] = later[static_cast<std::size_t>(b)] + n;
    laterInBackward[static_cast<std::size_t>(b - 1)] =
        laterInBackward[static_cast<std::size_t>(b)] + (!reached(b) ? 0 : checkpointed(b) ? 2 * n : n);
  }
  std::vector<std::int64_t> after(static_cast<std::size_t>(blocks), 0);  // A, filled from the block's end
  const std::int64_t limit = setup_.parallel.stage3MaxReuseDistance;
  if (zeroRootApart_) {
    // The embeddings' next use is their backward, the last sub-module: every block in forward,
    // the tail twice, every block backward reached (checkpointed ones twice).
    const std::int64_t first = plan_.unitElements[0];
    const std::int64_t all = later[0] + first;
    const std::int64_t allInBackward = laterInBackward[0] + (!reached(0) ? 0 : checkpointed(0) ? 2 * first : first);
    zeroEmbeddingsKept_ = embeddingsBackward_ && all + 2 * tail + allInBackward < limit;
  }
  const std::vector<std::size_t> forward = ForwardOrder(inventory_);
  for (std::size_t j = forward.size(); j-- > 0;) {
    const std::size_t i = forward[j];
    const int b = params[i].layer;
    if (b < 0 || b >= blocks) continue;
    const std::size_t k = static_cast<std::size_t>(b);
    const std::int64_t n = StorageElements(params[i]);
    const std::int64_t a = after[k];
    const std::int64_t before = plan_.unitElements[k] - a - n;
    const std::int64_t distance = a + later[k] + 2 * tail + laterInBackward[k] + (checkpointed(b) ? before : a);
    if (reached(b) && distance < limit) reuseKeptElements_[k + 1] += gatheredOfParameter[i];
    after[k] += n;
  }
}

bool ParallelStep::ZeroTraceComplete() const { return backwardsEnded_ > 0; }

// ZeRO-3's prefetch after a fetch (partitioned_param_coordinator.py _fetch_sub_module_impl),
// only with a complete trace: the parameters next in the trace while their numel stays within
// max_params_to_prefetch = min(stage3_max_live_parameters − those gathered now,
// stage3_prefetch_bucket_size), counting only those not gathered yet (do_prefetch). Whole units
// here, from `from` in the direction `step` (backward runs the blocks last to first); a unit is
// prefetched only whole, so up to a unit's worth fewer elements than DeepSpeed's.
void ParallelStep::PrefetchZeroUnits(TraceBuilder& b, int from, int step) {
  if (!ZeroTraceComplete()) return;
  const int blocks = static_cast<int>(plan_.unitElements.size());
  std::int64_t available = zeroEmbeddings_ != kNoTensor ? zeroEmbeddingElements_ : 0;
  for (std::size_t u = 0; u < gathered_.size(); ++u) {
    if (gathered_[u] != kNoTensor) available += ZeroMainElements(static_cast<int>(u));
    if (keptPart_[u] != kNoTensor) available += reuseKeptElements_[u];
  }
  const std::int64_t cap = std::min(setup_.parallel.stage3PrefetchBucketSize, setup_.parallel.stage3MaxLiveParameters - available);
  std::int64_t ahead = 0;
  for (int u = from; u >= 1 && u <= blocks; u += step) {
    if (gathered_[static_cast<std::size_t>(u)] == kNoTensor && !KeptForBackward(u)) ahead += gatherElements_[static_cast<std::size_t>(u)];
    if (ahead > cap) break;
    Gather(b, u, true);
  }
}

// A ZeRO-3 unit's gathered tensor: the unit, less the part kept as a tensor of its own.
std::int64_t ParallelStep::ZeroMainElements(int unit) const {
  const std::size_t u = static_cast<std::size_t>(unit);
  return gatherElements_[u] - (keptPart_[u] != kNoTensor ? reuseKeptElements_[u] : 0);
}

bool ParallelStep::KeptForBackward(int unit) const {
  if (keptWhole_.empty()) return false;
  const std::size_t u = static_cast<std::size_t>(unit);
  return keptWhole_[u] != 0 || keptPart_[u] != kNoTensor;
}

// ZeRO-3's embeddings, gathered at the forward's start and for their backward (PlanZeroReuse).
void ParallelStep::GatherZeroEmbeddings(TraceBuilder& b) {
  if (zeroEmbeddings_ != kNoTensor || zeroEmbeddingElements_ == 0) return;
  TextStore& text = b.text();
  const OnStream onStream(b, ZeroOverlapComm(setup_.parallel, plan_) ? kAllGatherStream : b.stream());
  zeroEmbeddings_ = b.Alloc(Category::Parameters, zeroEmbeddingElements_ * BytesPerElement(regime_.weights),
                            text.Make({"gathered embeddings"}), text.Make({"all-gather of the embeddings"}),
                            text.Make({TextPart::Count(zeroEmbeddingElements_), " × ", TextPart::Bytes(regime_.weights)}));
}

// Released after their forward unless used again within stage3_max_reuse_distance (a complete
// trace; afterForward), or for good (a reshard of the root).
void ParallelStep::ReleaseZeroEmbeddings(TraceBuilder& b, bool afterForward) {
  if (zeroEmbeddings_ == kNoTensor) return;
  if (afterForward && ZeroTraceComplete() && zeroEmbeddingsKept_) return;
  b.Release(zeroEmbeddings_, b.text().Make({"release: embeddings freed"}));
  zeroEmbeddings_ = kNoTensor;
}

void ParallelStep::ReleaseZeroTail(TraceBuilder& b) {
  TensorHandle& h = gathered_[0];
  if (h == kNoTensor) return;
  b.Release(h, b.text().Make({"release: final norm and head freed"}));
  h = kNoTensor;
}

// A unit's release after its forward: all of it, or with a complete ZeRO-3 trace the part not
// used again within stage3_max_reuse_distance (PlanZeroReuse).
void ParallelStep::FreeAfterForward(TraceBuilder& b, int unit) {
  if (!KeptForBackward(unit)) {
    Free(b, unit);
    return;
  }
  if (keptWhole_[static_cast<std::size_t>(unit)]) return;
  TensorHandle& h = gathered_[static_cast<std::size_t>(unit)];
  if (h == kNoTensor) return;
  b.Release(h, b.text().Make({"release: layers.", TextPart::Int(unit - 1),
                              " freed but the part used again within stage3_max_reuse_distance"}));
  h = kNoTensor;
}

void ParallelStep::Gather(TraceBuilder& b, int unit, bool prefetch) {
  if (plan_.engine == ShardingEngine::Fsdp2) {
    GatherFsdp2(b, unit, prefetch);
    return;
  }
  if (unit < 0 || static_cast<std::size_t>(unit) >= gathered_.size()) return;
  // (A torchao NF4Tensor is gathered by FSDP2 only, GatherFsdp2.)
  TensorHandle& h = gathered_[static_cast<std::size_t>(unit)];
  std::int64_t n = gatherElements_[static_cast<std::size_t>(unit)];
  if (h != kNoTensor || n == 0) return;
  TextStore& text = b.text();
  const Text what = UnitName(text, unit);
  // ZeRO-3 with a complete trace (PlanZeroReuse): what a forward gathers and will use again
  // within stage3_max_reuse_distance stays to the backward; part of a unit is a tensor of its own.
  std::int64_t kept = 0;
  if (!keptWhole_.empty()) {
    const std::size_t u = static_cast<std::size_t>(unit);
    if (keptPart_[u] != kNoTensor) {
      n = ZeroMainElements(unit);  // the rest of a partly kept unit, gathered again
    } else if (inForward_ && ZeroTraceComplete() && reuseKeptElements_[u] > 0) {
      if (reuseKeptElements_[u] >= n) keptWhole_[u] = 1;
      else kept = reuseKeptElements_[u];
    }
  }
  // FSDP1: _runtime_utils.py _unshard runs handle.unshard() under
  // `state._device_handle.stream(unshard_stream)` (state._unshard_stream, from the pre-forward
  // and the pre-backward alike), and _flat_param.py _alloc_padded_unsharded_flat_param allocates
  // the padded unsharded flat parameter there.
  // ZeRO-3 (DeepSpeed partitioned_param_coordinator.py): fetch_sub_module's
  // __all_gather_params_ calls all_gather_coalesced under
  // `get_accelerator().stream(self.__allgather_stream)`, for prefetches too, and there
  // partition_parameters.py _all_gather_dtype makes the flat output (torch.empty of world × the
  // coalesced partitions; _all_gather_sequential's param_buffer for a single parameter, of which
  // param.data is a view). The wait runs under the same stream context, so
  // AllGatherCoalescedHandle.wait's per-parameter `param.data = torch.cat(partitions)` is that
  // stream's as well. The simulation's gathered unit stands for both: on the all-gather stream
  // with overlap_comm (a side stream, parameter_offload.py), on the default stream without.
  // free_param frees param.data from the default stream (record_stream only delays the reuse,
  // not modelled): the block goes back to the all-gather stream's pool.
  const bool sideStream = plan_.engine == ShardingEngine::Fsdp || ZeroOverlapComm(setup_.parallel, plan_);
  OnStream onStream(b, sideStream ? kAllGatherStream : b.stream());
  h = b.Alloc(Category::Parameters, (n - kept) * BytesPerElement(regime_.weights), text.Make({"gathered ", what}),
              text.Make({TextPart::View(prefetch ? "prefetch: all-gather of " : "all-gather of "), what}),
              text.Make({TextPart::Count(n - kept), " × ", TextPart::Bytes(regime_.weights)}), unit - 1);
  if (kept > 0) {
    keptPart_[static_cast<std::size_t>(unit)] =
        b.Alloc(Category::Parameters, kept * BytesPerElement(regime_.weights), text.Make({"gathered ", what, " (reused)"}),
                text.Make({TextPart::View(prefetch ? "prefetch: all-gather of " : "all-gather of "), what,
                           " (the part used again within stage3_max_reuse_distance)"}),
                text.Make({TextPart::Count(kept), " × ", TextPart::Bytes(regime_.weights)}), unit - 1);
  }
}

Text ParallelStep::UnitName(TextStore& text, int unit) const {
  const int blocks = static_cast<int>(plan_.unitElements.size());
  return unit == 0             ? (zeroRootApart_ ? text.Make({"final norm and head"}) : text.Make({"root unit (embeddings, final norm, head)"}))
         : unit == blocks + 1 ? text.Make({"embedding unit"})
         : unit == blocks + 2 ? text.Make({"output unit"})
                              : text.Make({"layers.", TextPart::Int(unit - 1)});
}

// FSDP2's unshard and its copy-out (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
// unshard / wait_for_unshard; _fsdp_collectives.py foreach_all_gather and
// foreach_all_gather_copy_out):
// - unshard (a unit's pre-forward or pre-backward, or a prefetch of it): the shards are staged
//   in the gathered dtype when they must be cast or copied to the device first
//   (_get_param_all_gather_inputs: one flat_foreach_copy_input under a MixedPrecisionPolicy;
//   FSDPParam.all_gather_inputs' device copies with CPU offload), then one flat all-gather output
//   of world × the unit's padded shard elements is made (all_gather_copy_in) and the staging is
//   dropped when foreach_all_gather returns;
// - wait_for_unshard: each parameter's all_gather_outputs are made and filled from the flat
//   output (split_with_sizes_copy). In forward the flat output is kept until the next unit's
//   copy-out frees it ("Defer free to allow for overlap of this copy-out with next all-gather",
//   comm_ctx.all_gather_state), or until the root's post-forward (_fsdp_state.py _post_forward);
//   in backward it is freed at once.
// Streams: foreach_all_gather makes the staging and the flat output under
// `device_handle.stream(all_gather_copy_in_stream)`, the stream FSDPCommContext.get_all_gather_streams
// gives an unshard that is not async_op in FORWARD or PRE_BACKWARD (every unshard here: the
// pre-forward, the pre-backward and both prefetches, _prefetch_unshard setting that state);
// wait_for_unshard's copy-out (init_all_gather_outputs / alloc_all_gather_outputs) runs on the
// current, default stream. So the flat outputs are cached for the copy-in stream alone.
void ParallelStep::GatherFsdp2(TraceBuilder& b, int unit, bool prefetch) {
  if (unit < 0 || static_cast<std::size_t>(unit) >= gathered_.size()) return;
  TensorHandle& outputs = gathered_[static_cast<std::size_t>(unit)];
  const std::int64_t n = gatherElements_[static_cast<std::size_t>(unit)];
  const std::int64_t nf4 = gatherExtraBytes_[static_cast<std::size_t>(unit)];
  if (outputs != kNoTensor || (n == 0 && nf4 == 0)) return;
  TextStore& text = b.text();
  const Text what = UnitName(text, unit);
  const std::int64_t bytes = BytesPerElement(regime_.weights);
  const std::int64_t d = plan_.shardWorld;
  TensorHandle& flat = pendingAllGather_[static_cast<std::size_t>(unit)];
  // A torchao NF4Tensor's codes, scalers and factors join the unit's values as bytes (the
  // all-gather of mixed dtypes runs on uint8 views) and are split evenly, so unpadded.
  const std::int64_t total = n * bytes + nf4;
  auto formula = [&](std::int64_t elements, bool perRank) {
    const std::int64_t extra = perRank ? nf4 / d : nf4;
    if (extra == 0) return text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(regime_.weights)});
    return text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(regime_.weights), " + ", TextPart::Count(extra),
                      " B of NF4 codes, scalers and factors"});
  };
  if (flat == kNoTensor) {
    const OnStream onStream(b, kAllGatherStream);
    TensorHandle staging = kNoTensor;
    if (regime_.masterWeights || plan_.offloadParameters) {
      staging = b.Alloc(Category::Parameters, total / d, text.Make({"all-gather input of ", what}),
                        text.Make({TextPart::View(plan_.offloadParameters ? "all-gather input (shards copied to the device) of "
                                                                          : "all-gather input (shards cast) of "),
                                   what}),
                        formula(n / d, true), unit - 1);
    }
    flat = b.Alloc(Category::Parameters, total, text.Make({"all-gather output of ", what}),
                   text.Make({TextPart::View(prefetch ? "prefetch: all-gather of " : "all-gather of "), what}),
                   formula(n, false), unit - 1);
    if (staging != kNoTensor) b.Release(staging, text.Make({"all-gather issued: input of ", what, " freed"}));
  }
  if (prefetch) return;
  if (inForward_) ReleaseHeldAllGather(b);
  // Each parameter's own all_gather_outputs: world × its padded shard (an NF4Tensor's inner
  // tensors, its bytes), filled from the flat output by split_with_sizes_copy.
  std::vector<ParameterOutput>& perParameter = parameterOutputs_[static_cast<std::size_t>(unit)];
  for (std::size_t i : unitParameters_[static_cast<std::size_t>(unit)]) {
    const Tensor& t = inventory_.parameters[i];
    const bool nf4Weight = t.storage == Tensor::Storage::TorchaoNF4;
    const std::int64_t elements = nf4Weight ? StorageElements(t) : plan_.optimizerTensors.parameters[i].Elements() * d;
    if (elements == 0) continue;
    perParameter.push_back({b.Alloc(Category::Parameters, nf4Weight ? elements : elements * bytes,
                                   text.Make({names_[i], " (gathered)"}),
                                   text.Make({TextPart::View("all-gather copy-out: "), what, ": ", names_[i]}),
                                   nf4Weight ? text.Make({TextPart::Count(elements), " B of NF4 codes, scalers and factors"})
                                             : text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(regime_.weights),
                                                          " (padded)"}),
                                   unit - 1),
                            i});
  }
  outputs = perParameter.empty() ? kNoTensor : perParameter.front().handle;
  if (inForward_) {
    heldAllGather_ = flat;
  } else {
    b.Release(flat, text.Make({"copied out: all-gather output of ", what, " freed"}));
  }
  flat = kNoTensor;
}

void ParallelStep::ReleaseHeldAllGather(TraceBuilder& b) {
  if (heldAllGather_ == kNoTensor) return;
  b.Release(heldAllGather_, b.text().Make({"previous all-gather output freed (all_gather_state)"}));
  heldAllGather_ = kNoTensor;
}

void ParallelStep::Free(TraceBuilder& b, int unit) {
  if (unit < 0 || static_cast<std::size_t>(unit) >= gathered_.size()) return;
  TensorHandle& h = gathered_[static_cast<std::size_t>(unit)];
  TextStore& text = b.text();
  if (unit == 0 && zeroRootApart_) ReleaseZeroEmbeddings(b, false);
  if (!keptWhole_.empty()) {  // ZeRO-3: the part kept from the forward (PlanZeroReuse)
    const std::size_t u = static_cast<std::size_t>(unit);
    keptWhole_[u] = 0;
    if (keptPart_[u] != kNoTensor) {
      b.Release(keptPart_[u], text.Make({"release: layers.", TextPart::Int(unit - 1), " (reused part) freed"}));
      keptPart_[u] = kNoTensor;
    }
  }
  if (h == kNoTensor) return;
  const int blocks = static_cast<int>(plan_.unitElements.size());

  b.Release(h, unit == 0             ? text.Make({"reshard: root unit freed"})
               : unit == blocks + 1 ? text.Make({"reshard: embedding unit freed"})
               : unit == blocks + 2 ? text.Make({"reshard: output unit freed"})
                                    : text.Make({"reshard: layers.", TextPart::Int(unit - 1), " freed"}));
  h = kNoTensor;
  if (plan_.engine == ShardingEngine::Fsdp2) {
    // FSDPParam.free_unsharded_param: each parameter's storage in turn; the first one's event
    // (above) carries the unit's reshard.
    std::vector<ParameterOutput>& perParameter = parameterOutputs_[static_cast<std::size_t>(unit)];
    for (std::size_t k = 1; k < perParameter.size(); ++k) {
      b.Release(perParameter[k].handle, text.Make({"reshard: ", names_[perParameter[k].parameter], " freed"}));
    }
    perParameter.clear();
  }
}

// DistributedDataParallel's construction syncs the module states from rank 0 before it builds
// its reducer (distributed.py _sync_module_states → torch/distributed/utils.py
// _sync_params_and_buffers → dist._broadcast_coalesced; torch/csrc/distributed/c10d/comm.cpp
// broadcast_coalesced): every parameter, frozen or not, in the module's order, bucketed by
// compute_bucket_assignment_by_size with the one limit broadcast_bucket_size (250 MiB; a bucket
// per dtype closes once its bytes reach it; buckets in the order of their first tensor), each
// flattened into a new tensor (BroadcastWork's flat_tensor_, torch::utils::flatten_dense_tensors:
// at::cat of the flattened tensors) and broadcast, at most two in flight; a bucket's flat copy is
// freed once it has been copied back. A bucket of one tensor (one parameter of 250 MiB or more,
// such as Llama 3 8B's 1 GiB bf16 embedding, or a lone last one) makes no copy: flatten_dense_tensors
// returns `t.contiguous().view({-1})` for a single tensor, a view broadcast in place. Megatron's DDP
// (gradReduceInFp32) broadcasts each parameter in place (broadcast_params): no copy.
void ParallelStep::BroadcastModuleStates(TraceBuilder& b) {
  constexpr std::int64_t kBroadcastBucketBytes = 250LL * 1024 * 1024;
  struct Bucket {
    std::int64_t elementBytes = 0;  // the dtype's size, the bucket's key
    std::size_t first = 0;          // its first parameter's index
    std::int64_t bytes = 0;
    int tensors = 0;
  };
  std::vector<Bucket> closed, open;
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    const Tensor& p = inventory_.parameters[i];
    const std::int64_t elements = StorageElements(p);
    const std::int64_t bytes = StoredBytes(p, regime_.weights) - QuantStatisticsBytes(p, regime_.weights);
    if (elements <= 0 || bytes <= 0) continue;
    const std::int64_t elementBytes = bytes / elements;
    auto it = std::find_if(open.begin(), open.end(), [&](const Bucket& o) { return o.elementBytes == elementBytes; });
    if (it == open.end()) it = open.insert(open.end(), Bucket{elementBytes, i, 0});
    it->bytes += bytes;
    ++it->tensors;
    if (it->bytes >= kBroadcastBucketBytes) {
      closed.push_back(*it);
      open.erase(it);
    }
  }
  closed.insert(closed.end(), open.begin(), open.end());
  std::stable_sort(closed.begin(), closed.end(), [](const Bucket& x, const Bucket& y) { return x.first < y.first; });
  TextStore& text = b.text();
  // One entry per BroadcastWork in the deque; a bucket broadcast in place takes a place too
  // (kNoTensor), so the flat copy before it is freed when PyTorch frees it.
  std::vector<TensorHandle> inFlight;
  const auto finishFront = [&] {
    if (inFlight.front() != kNoTensor) {
      b.Release(inFlight.front(), text.Make({"DDP init: broadcast bucket copied back, flat copy freed"}));
    }
    inFlight.erase(inFlight.begin());
  };
  for (std::size_t k = 0; k < closed.size(); ++k) {
    if (inFlight.size() >= 2) finishFront();
    if (closed[k].tensors == 1) {
      inFlight.push_back(kNoTensor);
      continue;
    }
    inFlight.push_back(b.Alloc(Category::Parameters, closed[k].bytes,
                               text.Make({"DDP init: module states broadcast bucket ", TextPart::Int(static_cast<std::int64_t>(k))}),
                               text.Make({"DDP init: _broadcast_coalesced flattens bucket ", TextPart::Int(static_cast<std::int64_t>(k)),
                                          " of the module states (every parameter)"}),
                               text.Make({TextPart::Count(closed[k].bytes), " B"})));
  }
  while (!inFlight.empty()) finishFront();
}

bool ParallelStep::ReshardsAfterForward(int unit) const {
  const int blocks = static_cast<int>(plan_.unitElements.size());
  return reshardAfterForward_ && !(keepLastBlock_ && unit == blocks);
}

void ParallelStep::Enter(TraceBuilder& b, int layer, bool backward) {
  if (!gathers_) return;
  // With frozen weights backward can end inside a block (no gradient flows into a frozen
  // embedding), so the tape's return to the root scope at the end of the step is no forward:
  // FSDP (1 and 2) and ZeRO-3 gather only in a module's pre-forward / pre-backward hooks, so
  // nothing is gathered between the end of backward and the next forward.
  if (!backward && backwardEnded_) return;
  inForward_ = !backward;
  const int unit = layer < 0 ? 0 : layer + 1;
  const int units = static_cast<int>(gathered_.size());
  const int blocks = static_cast<int>(plan_.unitElements.size());
  const bool apart = units > blocks + 1;  // FSDP2 embedding and output units
  if (!backward) {
    if (layer >= 0) forwardSawBlock_ = true;
    // The output unit's pre-forward: the final norm and head run after the last block.
    if (apart && layer < 0 && forwardSawBlock_) {
      for (int u = 1; u <= blocks; ++u) if (ReshardsAfterForward(u) && OfRunningChunk(u)) Free(b, u);
      Gather(b, blocks + 2, false);
      return;
    }
    // Forward: the root is gathered first and (as FSDP's root) kept to the end of backward;
    // a block's unit is freed when the next one is entered, unless it stays gathered. Under the
    // interleaved schedule only the running chunk's root and units: the other chunks are
    // fully_shard roots of their own, untouched by this chunk's hooks.
    // ZeRO-3 with the root apart (PlanZeroReuse): the embeddings come at ForwardStart and go
    // once a block is entered; the final norm and head are gathered when the tail runs.
    if (OfRunningChunk(0) && (!zeroRootApart_ || (layer < 0 && forwardSawBlock_))) Gather(b, 0, false);
    if (zeroRootApart_ && layer >= 0) ReleaseZeroEmbeddings(b, true);
    // On a pipeline stage the units ahead may still be gathered from the previous micro-batch's
    // backward (no reshard after backward): each is resharded by its own post-forward.
    if (reshardAfterForward_) {
      for (int u = 1; u < units; ++u) {
        // ZeRO-3 releases only what has run: a block prefetched ahead waits for its use.
        if (plan_.engine == ShardingEngine::Zero && unit > 0 && u > unit) break;
        if (u != unit && ReshardsAfterForward(u) && OfRunningChunk(u) &&
            (!pipelineNoSync_ || unit == 0 || u < unit || u > blocks)) {
          FreeAfterForward(b, u);
        }
      }
    }
    if (!OfRunningChunk(unit)) return;
    Gather(b, unit, false);
    if (plan_.engine == ShardingEngine::Zero) {
      if (unit > 0) PrefetchZeroUnits(b, unit + 1, +1);
    } else if (setup_.parallel.forwardPrefetch && unit > 0 && unit + 1 <= blocks && OfRunningChunk(unit + 1)) {
      Gather(b, unit + 1, true);
    }
    return;
  }
  // Backward: blocks run last to first. The unit just finished is freed (reshard after
  // backward), the entered one gathered, and with BACKWARD_PRE the one before it prefetched.
  // On a pipeline stage FSDP2 runs every backward with set_reshard_after_backward(False)
  // (pipelining/stage.py backward_maybe_with_nosync): the units stay gathered to the final reduce.
  // A last block kept gathered after forward is freed by its own post-backward, i.e. when the
  // next block's backward begins, not by the head's backward before it.
  if (layer >= 0) backwardSawBlock_ = true;
  if (!backwardUse_.empty() && !ZeroTraceComplete()) {  // ZeRO-3's first backward: the trace recorded
    if (layer >= 0) backwardUse_[static_cast<std::size_t>(unit)] = 1;
    else if (backwardSawBlock_) embeddingsBackward_ = true;
  }
  if (!pipelineNoSync_) {
    for (int u = unit + 1; u <= blocks; ++u) {
      if (backwardSawBlock_ || (ReshardsAfterForward(u) && !KeptForBackward(u))) Free(b, u);
    }
  }
  if (reduceOnNextBlock_ && unit > 0 && openUnit_ > 0 && openUnit_ != unit) {
    // FSDP2 with frozen weights: the finished block's post_backward (reshard, then foreach_reduce)
    // runs when its forward inputs' gradients are ready (_fsdp_param_group.py
    // _register_post_backward_hook: RegisterPostBackwardFunction on the inputs that require grad),
    // i.e. before this block's backward, not at this block's first trainable gradient, which with
    // adapters on q/v only comes late (or never, in a frozen block). A block whose inputs need no
    // gradient (block 0 under a frozen embedding) is reduced by _root_post_backward_final_callback
    // (EndBackward).
    ReduceScatterUnit(b, openUnit_);
    openUnit_ = -2;
  }
  if (zeroRootApart_) {
    // The head's and final norm's parameters are released after their backward, before the
    // last block's; the embeddings are gathered again for theirs, after the first block's.
    if (layer >= 0) ReleaseZeroTail(b);
    else if (backwardSawBlock_) {
      GatherZeroEmbeddings(b);
      return;
    }
  }
  if (unit == 0 && apart) return;  // the output and embedding units are gathered at their gradients
  if (!OfRunningChunk(unit)) return;  // another virtual stage's root (interleaved schedule)
  Gather(b, unit, false);
  if (plan_.engine == ShardingEngine::Zero) {
    if (unit > 0) PrefetchZeroUnits(b, unit - 1, -1);  // backward: the blocks before are next
    return;
  }
  if (setup_.parallel.backwardPrefetch && unit > 1 && OfRunningChunk(unit - 1)) Gather(b, unit - 1, true);
}

namespace {

// What the caching allocator holds for these live tensors once empty_cache has released its
// cache (init allocates each parameter once and frees nothing before): each request rounded
// (RoundAllocationSize), those ≤ 1 MiB packed into 2 MiB segments and those under 10 MiB into
// 20 MiB ones, larger ones a segment each (SegmentAllocationSize). An estimate of the segments'
// sum: the packing of the smaller pools is taken as perfect.
std::int64_t ReservedForLive(const std::vector<std::int64_t>& liveBytes, const AllocatorOptions& options) {
  constexpr std::int64_t kMiB = 1 << 20;
  std::int64_t small = 0, mid = 0, large = 0;
  for (const std::int64_t bytes : liveBytes) {
    const std::int64_t rounded = RoundAllocationSize(bytes, options);
    if (rounded <= kMiB) small += rounded;
    else if (rounded < 10 * kMiB) mid += rounded;
    else large += SegmentAllocationSize(rounded);
  }
  return CeilDiv(small, 2 * kMiB) * 2 * kMiB + CeilDiv(mid, 20 * kMiB) * 20 * kMiB + large;
}

// flatten_on_accelerator (stage_1_and_2.py, DeepSpeed ≥ 0.18.7): NVML's free memory — the
// allocator's room less what it reserves after the empty_cache — holds the flat.
// DeepSpeed's version (runtime.deepspeedVersion, validated by ValidateRuntime) is at least M.m.p.
bool DeepSpeedAtLeast(const Setup& setup, int M, int m, int p) {
  int major = 0, minor = 19, patch = 0;
  ParseVersion(setup.runtime.deepspeedVersion, major, minor, patch);
  return major != M ? major > M : minor != m ? minor > m : patch >= p;
}

// The trainable parameters' 16-bit flat as stage_1_and_2.py makes it (padded to 2 × dp), and
// every parameter's held bytes, as Init holds them.
struct ZeroFlat {
  std::int64_t elements = 0;      // the trainable parameters'
  std::int64_t padded = 0;        // ⌈elements / (2·dp)⌉·2·dp
  std::int64_t elementBytes = 0;  // one dtype (parallel_setup.cpp refuses mixed groups)
  std::int64_t flatBytes = 0;     // padded × elementBytes
  std::vector<std::int64_t> liveBytes;
};
ZeroFlat ZeroFlatOf(const Inventory& inventory, const ShardPlan& plan, DType weights) {
  ZeroFlat z;
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
    const Tensor& p = inventory.parameters[i];
    const std::int64_t held = HeldBytes(p, plan.parameterElementsHeld[i], weights);
    if (held <= 0) continue;
    z.liveBytes.push_back(held);
    if (!p.trainable) continue;
    z.elements += StorageElements(p);
    bytes += held;
  }
  if (z.elements == 0) return z;
  const std::int64_t alignment = 2 * plan.shardWorld;
  z.padded = CeilDiv(z.elements, alignment) * alignment;
  z.elementBytes = bytes / z.elements;
  z.flatBytes = z.padded * z.elementBytes;
  return z;
}

// flatten_on_accelerator (stage_1_and_2.py, DeepSpeed ≥ 0.18.7): NVML's free memory — the
// allocator's room less what it reserves after the empty_cache — holds the flat.
bool FlattensOnDevice(const Setup& setup, const ZeroFlat& z) {
  return z.flatBytes > 0 && DeepSpeedAtLeast(setup, 0, 18, 7) &&
         AllocatorLimitOf(setup) - ReservedForLive(z.liveBytes, AllocatorOptionsOf(setup.runtime)) >= z.flatBytes;
}

}  // namespace

bool DeepSpeedFlattensOnDevice(const Setup& setup, const Inventory& inventory) {
  if (setup.parallel.zeroStage == 0 || !DeepSpeedZeroOneTwo(setup)) return false;
  return FlattensOnDevice(setup, ZeroFlatOf(inventory, PlanShards(setup, inventory), RegimeOf(setup.training.precision).weights));
}

// DeepSpeedZeroOptimizer.__init__ (stage_1_and_2.py), for its one param group
// (DeepSpeedZeroOneTwo: no expert groups), before the fp32 partition is cloned from the flat.
// The trainable parameters (bit16_groups keep `param.requires_grad`), in order
// (round_robin_gradients is off by default), become one 16-bit flat of the aligned numel
// ⌈n / (2·dp)⌉·2·dp (nccl_start_alignment_factor 2), where they then live as views. Where the
// flat is made depends on DeepSpeed's version (runtime.deepspeedVersion):
//  - from 0.18.7 (#7828, DeepSpeed edaa722 read): empty_cache() (runtime/utils.py: also
//    reset_peak_memory_stats), then flatten_on_accelerator = available_memory() >=
//    flat_buffer_bytes, where available_memory is NVML's free memory
//    (accelerator/cuda_accelerator.py with pynvml, which DeepSpeed requires): the allocator's
//    room (capacity less the context and NCCL's buffers) less what it reserves after the
//    empty_cache (ReservedForLive). On the GPU: flatten_dense_tensors_aligned →
//    align_dense_tensors appends torch.zeros(pad) when n is not aligned, _flatten_dense_tensors
//    (torch.cat) makes the flat, and the padded list with its pad goes when it returns;
//    _update_model_bit16_weights then sets each parameter's .data to a view of the flat, in
//    order, which frees its own storage. The freed storages stay cached: the flat's memory is
//    reserved twice from here on, unless later tensors reuse those blocks;
//  - otherwise, and always before 0.18.7, on the host: per parameter cpu_data = data.cpu() and
//    data = torch.empty(1).to(device), a 4-byte fp32 stand-in made before its own storage goes
//    (from 0.13.0, #4833; before, move_to_cpu's data = data.cpu() left nothing on the GPU);
//    empty_cache(); the flat made on the host and moved to the GPU; _update_model_bit16_weights
//    frees the stand-ins.
// A model loaded in fp32 and cast by the engine caches its fp32 copies until an empty_cache
// here releases them, so the trace need not load them.
void ParallelStep::FlattenZeroGroup(TraceBuilder& b, const std::vector<TensorHandle>& parameters) {
  TextStore& text = b.text();
  const ZeroFlat z = ZeroFlatOf(inventory_, plan_, regime_.weights);
  if (z.elements == 0) return;
  std::vector<std::size_t> members;  // the trainable parameters Init allocated, in order
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    if (inventory_.parameters[i].trainable && parameters[i] != kNoTensor) members.push_back(i);
  }
  const std::int64_t elements = z.elements, padded = z.padded, w = z.elementBytes, flatBytes = z.flatBytes;
  const auto atLeast = [&](int M, int m, int p) { return DeepSpeedAtLeast(setup_, M, m, p); };
  const char* zero = ZeroName();
  const Text flatName = text.Make({"bit16 flat"});
  const Text flatFormula = text.Make({TextPart::Count(padded), " (", TextPart::Count(elements), " + ",
                                      TextPart::Count(padded - elements), " pad to 2 × ", TextPart::Int(plan_.shardWorld),
                                      ") × ", TextPart::Int(w), " B"});
  const bool onDevice = FlattensOnDevice(setup_, z);  // the choice the GPU matrix reads (DeepSpeedFlattensOnDevice)
  if (atLeast(0, 18, 7)) b.EmptyCache();
  if (onDevice) {
    const TensorHandle pad =
        padded > elements
            ? b.Alloc(Category::Parameters, (padded - elements) * w, text.Make({"alignment pad"}),
                      text.Make({TextPart::View(zero), " init: align_dense_tensors' zero pad"}),
                      text.Make({TextPart::Count(padded - elements), " × ", TextPart::Int(w), " B"}))
            : kNoTensor;
    b.Alloc(Category::Parameters, flatBytes, flatName,
            text.Make({TextPart::View(zero), " init: flatten_dense_tensors_aligned on the GPU (the trainable parameters, padded)"}),
            flatFormula);
    if (pad != kNoTensor) b.Release(pad, text.Make({TextPart::View(zero), " init: the pad let go"}));
    for (const std::size_t i : members) {
      b.Release(parameters[i], text.Make({TextPart::View(zero), " init: _update_model_bit16_weights: ", names_[i],
                                          ".data = a view of the flat; its own storage freed"}));
    }
    b.Note(std::string(zero) + ": DeepSpeed " + setup_.runtime.deepspeedVersion +
           " flattens the trainable parameters on the GPU at construction (from 0.18.7, when NVML's free memory holds "
           "the flat): for a moment they are held twice (" + HumanBytes(flatBytes) +
           " more), and their own storages, freed, stay in the allocator's cache (reserved) unless later tensors "
           "reuse them. Earlier versions flatten on the host (runtime.deepspeedVersion).");
    return;
  }
  const bool standIns = atLeast(0, 13, 0);
  std::vector<TensorHandle> held;
  held.reserve(members.size());
  for (const std::size_t i : members) {
    if (standIns) {
      held.push_back(b.Alloc(Category::Parameters, 4, text.Make({names_[i], " stand-in"}),
                             text.Make({TextPart::View(zero), " init: flattening on the host: ", names_[i],
                                        ".data = torch.empty(1).to(device)"}),
                             text.Make({"1 × 4 B (fp32)"})));
    }
    b.Release(parameters[i], text.Make({TextPart::View(zero), " init: ", names_[i], " copied to the host, its GPU storage freed"}));
  }
  b.EmptyCache();
  b.Alloc(Category::Parameters, flatBytes, flatName,
          text.Make({TextPart::View(zero), " init: the flat made on the host (flatten_dense_tensors_aligned), moved to the GPU"}),
          flatFormula);
  for (std::size_t k = 0; k < held.size(); ++k) {
    b.Release(held[k], text.Make({TextPart::View(zero), " init: _update_model_bit16_weights: ", names_[members[k]],
                                  ".data = a view of the flat"}));
  }
  b.Note(std::string(zero) + ": DeepSpeed " + setup_.runtime.deepspeedVersion + " flattens the trainable parameters on the host at "
         "construction and empties the allocator's cache before moving the flat to the GPU" +
         (atLeast(0, 18, 7) ? std::string(" (NVML's free memory could not hold a second copy on the GPU)") : std::string(" (from 0.18.7 it does so on the GPU when there is room)")) +
         ".");
}

// stage3.py _create_fp16_partitions_with_defragmentation, without offload_param: the trainable
// parameters' partitions (fp16_groups: the sub-groups in order) move into one contiguous flat,
// lp_param_buffer = defragment(partitions) (runtime/zero/utils.py): each partition copied into a
// host buffer and dropped (tensor.data = torch.empty(0): nothing on the GPU), gc.collect(),
// empty_cache(), then the host buffer moved to the GPU, every partition a view of it. Frozen
// partitions (not in any param group) stay where they are.
void ParallelStep::DefragmentZero3(TraceBuilder& b, const std::vector<TensorHandle>& partitions) {
  TextStore& text = b.text();
  std::int64_t elements = 0, bytes = 0;
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    const Tensor& p = inventory_.parameters[i];
    if (!p.trainable || partitions[i] == kNoTensor) continue;
    const std::int64_t shard = CeilDiv(StorageElements(p), plan_.shardWorld);
    elements += shard;
    bytes += HeldBytes(p, shard, regime_.weights);
    b.Release(partitions[i], text.Make({"ZeRO-3 init: defragment: the partition of ", names_[i], " copied to the host"}));
  }
  if (elements == 0) return;
  b.EmptyCache();
  b.Alloc(Category::Parameters, bytes, text.Make({"lp_param_buffer"}),
          text.Make({"ZeRO-3 init: defragment: the trainable partitions in one flat, moved back to the GPU"}),
          text.Make({TextPart::Count(elements), " × ", TextPart::Int(bytes / elements), " B"}));
}

// stage3.py _create_fp32_partitions, optimizer on the GPU: per sub-group (one when the partition
// is no larger than sub_group_size; sharding.cpp), `converted = fp16_flat.to(device, fp32)` and
// fp32_partitioned_groups_flat.append(converted.clone().detach()): two fp32 copies, the first
// (`converted`) freed when the next sub-group's rebinds it and the last when the function
// returns. With fp32 weights the 16-bit flat is already fp32 on the device and is used as it is
// ("weights ... are already in and updated using fp32"): no copy at all.
void ParallelStep::CreateZero3Fp32Partitions(TraceBuilder& b) {
  if (regime_.weights == DType::FP32) return;
  TextStore& text = b.text();
  const std::int64_t d = plan_.shardWorld;
  const std::vector<Tensor>& groups = plan_.optimizerTensors.parameters;
  const bool several = groups.size() > 1;
  TensorHandle converted = kNoTensor;
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const std::int64_t n = several ? groups[k].Elements() : plan_.partitionElements;
    const Text formula = text.Make({TextPart::Count(n), " × ", TextPart::Bytes(DType::FP32)});
    const TensorHandle next = b.Alloc(Category::MasterWeights, n * 4, text.Make({"converted"}),
                                      text.Make({"ZeRO-3 init: _create_fp32_partitions: converted = the 16-bit flat .to(fp32)",
                                                 several ? TextPart::View(", sub-group ") : TextPart::View(""),
                                                 several ? TextPart::Int(static_cast<std::int64_t>(k)) : TextPart::View("")}),
                                      formula);
    if (converted != kNoTensor) b.Release(converted, text.Make({"ZeRO-3 init: the previous `converted` let go"}));
    converted = next;
    if (several) {
      b.Alloc(Category::MasterWeights, n * 4, text.Own(groups[k].name),
              text.Make({"ZeRO init: ", text.Own(groups[k].name), " (1/", TextPart::Int(d), ")"}), formula);
    } else {
      b.Alloc(Category::MasterWeights, n * 4, text.Make({"fp32 flat partition"}),
              text.Make({"ZeRO init: fp32 partition of the flat parameters (1/", TextPart::Int(d), ")"}), formula);
    }
  }
  if (converted != kNoTensor) b.Release(converted, text.Make({"ZeRO-3 init: _create_fp32_partitions returns: `converted` let go"}));
}

void ParallelStep::Init(TraceBuilder& b) {
  TextStore& text = b.text();
  const std::int64_t g = BytesPerElement(regime_.gradients);
  const std::int64_t d = plan_.shardWorld;
  const bool fsdp = plan_.engine == ShardingEngine::Fsdp || plan_.engine == ShardingEngine::Fsdp2;
  if (fsdp) {
    if (!plan_.offloadParameters) {
      const DType type = regime_.masterWeights ? DType::FP32 : regime_.weights;
      for (const Tensor& s : plan_.optimizerTensors.parameters) {
        if (s.storage == Tensor::Storage::TorchaoNF4) {
          // A torchao NF4Tensor's shard: 1/world of its codes, scalers and factors (sharding.cpp).
          b.Alloc(Category::Parameters, s.Elements(), text.Own(s.name),
                  text.Make({"FSDP2 init: ", text.Own(s.name), " (NF4Tensor: 1/", TextPart::Int(d), " of codes, scalers, factors)"}),
                  text.Make({TextPart::Count(s.Elements()), " B"}), s.layer);
          continue;
        }
        b.Alloc(Category::Parameters, s.Elements() * BytesPerElement(type), text.Own(s.name),
                text.Make({"FSDP init: ", text.Own(s.name), " (1/", TextPart::Int(d), ", padded)"}),
                text.Shape(Shape(s.shape), type), s.layer);
      }
    }
    // A 4-bit weight's QuantState (absmax, code) is no parameter: FSDP flattens the packed codes
    // only, and every rank keeps the statistics whole (PEFT "FSDP-QLoRA").
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
      const Tensor& p = inventory_.parameters[i];
      const std::int64_t statistics = OnDeviceStatisticsBytes(p, plan_, regime_.weights);
      if (statistics == 0) continue;
      b.Alloc(Category::Parameters, statistics, text.Make({names_[i], " quantization statistics"}),
              text.Make({"model init: QuantState of ", names_[i], " (whole on every rank)"}),
              text.Make({TextPart::Count(statistics), " B"}), p.layer);
    }
  } else {
    std::vector<TensorHandle> parameters(inventory_.parameters.size(), kNoTensor);
    const bool zero3 = plan_.engine == ShardingEngine::Zero && plan_.zeroStage == 3;
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
      const Tensor& p = inventory_.parameters[i];
      std::int64_t held = plan_.parameterElementsHeld[i];
      if (HeldBytes(p, held, regime_.weights) <= 0) continue;  // offload_param keeps only 4-bit statistics
      const std::int64_t elements = StorageElements(p), shard = CeilDiv(elements, d);
      if (zero3 && d > 1 && held == elements + shard) {
        // A persistent parameter (below stage3_param_persistence_threshold, sharding.cpp) is
        // held whole (param.data, gathered once and never released) beside its partition
        // (ds_tensor): two tensors, the partition the one defragment moves.
        b.Alloc(Category::Parameters, StoredBytes(p, regime_.weights), names_[i],
                text.Make({"ZeRO-3 init: ", names_[i], " whole (persistent: below stage3_param_persistence_threshold)"}),
                StorageFormula(text, p, regime_.weights), p.layer);
        held = shard;
      }
      const bool partitioned = held != StorageElements(p);
      // A whole parameter is stored as on one GPU: its own dtype or bitsandbytes layout
      // (finetune.hpp StoredBytes; N × the regime's bytes without fine-tuning).
      parameters[i] = b.Alloc(Category::Parameters, HeldBytes(p, held, regime_.weights), names_[i],
              partitioned ? text.Make({"ZeRO-3 init: partition of ", names_[i], " (⌈n / ", TextPart::Int(d), "⌉)"})
                          : text.Make({"model init: ", names_[i]}),
              partitioned ? text.Make({TextPart::Count(held), " × ", TextPart::Bytes(regime_.weights)})
                          : StorageFormula(text, p, regime_.weights),
              p.layer);
    }
    if (deepSpeedZero12_) FlattenZeroGroup(b, parameters);
    if (zero3 && !plan_.offloadParameters) DefragmentZero3(b, parameters);
  }
  if (plan_.engine == ShardingEngine::DDP && !setup_.parallel.gradReduceInFp32) BroadcastModuleStates(b);
  if (plan_.engine == ShardingEngine::Zero) {
    // stage_1_and_2.py: single_partition_of_fp32_groups = the rank's partition .clone().float()
    // (made in fp32 training too); stage3.py _create_fp32_partitions likewise.
    if (!plan_.offloadOptimizer) {
      if (plan_.zeroStage == 3) {
        CreateZero3Fp32Partitions(b);
      } else {
        // stage_1_and_2.py: weights_partition = partition.detach().clone().to(device, dtype=fp32):
        // the clone is a 16-bit copy of the partition, freed once .to has made the fp32 one (in
        // fp32 training .to returns the clone itself).
        const bool cloneFirst = deepSpeedZero12_ && regime_.weights != DType::FP32;
        const TensorHandle clone =
            cloneFirst ? b.Alloc(Category::MasterWeights, plan_.partitionElements * BytesPerElement(regime_.weights),
                                 text.Make({"partition clone"}),
                                 text.Make({TextPart::View(ZeroName()), " init: the rank's 16-bit partition .clone() before .to(fp32)"}),
                                 text.Make({TextPart::Count(plan_.partitionElements), " × ", TextPart::Bytes(regime_.weights)}))
                       : kNoTensor;
        b.Alloc(Category::MasterWeights, plan_.partitionElements * 4, text.Make({"fp32 flat partition"}),
                text.Make({"ZeRO init: fp32 partition of the flat parameters (1/", TextPart::Int(d), ")"}),
                text.Make({TextPart::Count(plan_.partitionElements), " × ", TextPart::Bytes(DType::FP32)}));
        if (clone != kNoTensor) b.Release(clone, text.Make({TextPart::View(ZeroName()), " init: the partition clone let go"}));
      }
    } else if (deepSpeedZero12_ && regime_.weights != DType::FP32) {
      // With cpu_offload the clone is still made on the GPU, then .to(cpu, fp32) moves it out.
      const TensorHandle clone = b.Alloc(
          Category::MasterWeights, plan_.partitionElements * BytesPerElement(regime_.weights), text.Make({"partition clone"}),
          text.Make({TextPart::View(ZeroName()), " init (cpu_offload): the rank's 16-bit partition .clone() before .to(cpu, fp32)"}),
          text.Make({TextPart::Count(plan_.partitionElements), " × ", TextPart::Bytes(regime_.weights)}));
      b.Release(clone, text.Make({TextPart::View(ZeroName()), " init: the partition clone let go"}));
    }
    if (deepSpeedZero12_ && plan_.offloadOptimizer) {
      // stage_1_and_2.py __init__ with cpu_offload: temp_grad_buffer_for_gpu_offload =
      // torch.zeros(largest_param_numel, dtype=self.dtype) on the GPU, kept for the run
      // (async_accumulate_grad_in_cpu_via_gpu's staging).
      b.Alloc(Category::Gradients, largestTrainable_ * g, text.Make({"temp_grad_buffer_for_gpu_offload"}),
              text.Make({TextPart::View(ZeroName()), " init (cpu_offload): GPU staging buffer of the largest parameter"}),
              text.Make({TextPart::Count(largestTrainable_), " × ", TextPart::Bytes(regime_.gradients)}));
    }
    if (plan_.zeroStage == 3 && plan_.reduceBuckets > 0) {
      // stage3.py: __ipg_bucket_flat_buffer, reduce_bucket_size elements, made at construction.
      // On the default stream: DeepSpeedZeroOptimizer_Stage3.__init__ makes each IPGBucketZ3's
      // buffer (torch.empty) outside any stream context; __add_grad_to_ipg_bucket only copies
      // into it under reduce_and_partition_stream.
      reduceBuckets_.push_back(b.Alloc(Category::Gradients, plan_.reduceBucketElements * g, text.Make({"ipg bucket"}),
                                       text.Make({"ZeRO-3 init: reduce bucket (reduce_bucket_size)"}),
                                       text.Make({TextPart::Count(plan_.reduceBucketElements), " × ",
                                                  TextPart::Bytes(regime_.gradients)})));
    }
    if (plan_.zeroStage == 3 && !plan_.offloadOptimizer) {
      // stage3.py _setup_for_real_optimizer, right after the IPG buffer: grad_partitions_flat_buffer
      // = torch.zeros(Σ partition_numel, gradient_accumulation_dtype, self.device), on the default
      // stream, kept for the whole run (each partition's gradient is a narrow() view of it,
      // __param_id_to_grad_partition). With offload_optimizer it is on the host (host_memory.cpp).
      gradPartition_ = b.Alloc(Category::Gradients, plan_.partitionElements * g, text.Make({"grad_partitions_flat_buffer"}),
                               text.Make({"ZeRO-3 init: gradient partitions (grad_partitions_flat_buffer)"}),
                               text.Make({TextPart::Count(plan_.partitionElements), " × ", TextPart::Bytes(regime_.gradients)}));
    }
  } else if (!fsdp && regime_.masterWeights) {
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
      const Tensor& p = inventory_.parameters[i];
      if (!p.trainable || !HasMasterCopy(p, regime_.masterWeights)) continue;  // fp32 adapters need none
      b.Alloc(Category::MasterWeights, p.Elements() * 4, text.Make({names_[i], " (fp32 master)"}),
              text.Make({"optimizer construction: fp32 master copy of ", names_[i]}),
              text.Shape(Shape(p.shape), DType::FP32), p.layer);
    }
  }
  if (setup_.parallel.gradReduceInFp32) {
    // Megatron DistributedDataParallel (distributed_data_parallel.py): grad_dtype = float32 when
    // grad_reduce_in_fp32; _ParamAndGradBuffer allocates grad_data = torch.zeros(numel, fp32) for
    // the whole model at construction (param_and_grad_buffer.py).
    const std::int64_t n = MegatronGradBufferElements(inventory_, plan_.shardWorld, plan_.engine == ShardingEngine::Zero);
    gradBuffer_ = b.Alloc(Category::Gradients, n * 4, text.Make({"Megatron grad buffer (fp32)"}),
                          text.Make({"Megatron DDP init: fp32 gradient buffer (grad_reduce_in_fp32), padded"}),
                          text.Make({TextPart::Count(n), " × ", TextPart::Bytes(DType::FP32)}));
  }
  // DDP's reducer allocates every bucket at construction (reducer.cpp initialize_buckets:
  // bucket.gradients = at::empty({total numel})); they live as long as the model.
  for (std::size_t k = 0; k < plan_.ddpBucketElements.size(); ++k) {
    const std::int64_t n = plan_.ddpBucketElements[k];
    const DType type = plan_.ddpBucketTypes[k];  // fp32 adapters' buckets are fp32 (sharding.cpp)
    b.Alloc(Category::Gradients, n * BytesPerElement(type), text.Make({"DDP bucket ", TextPart::Int(static_cast<std::int64_t>(k))}),
            text.Make({"DDP init: reducer bucket ", TextPart::Int(static_cast<std::int64_t>(k)),
                       TextPart::View(k == 0 ? " (first bucket: 1 MiB)" : " (bucket_cap_mb)")}),
            text.Make({TextPart::Count(n), " × ", TextPart::Bytes(type)}));
  }
}

void ParallelStep::StartBackward(TraceBuilder& b) {
  if (pipelineNoSync_) ++chunkBackwardsSeen_[static_cast<std::size_t>(chunk_)];
  if (zeroRootApart_) {
    // ZeRO-3: the head's pre-backward fetch, when ForwardEnd released it (a first trace). The
    // tape reports no change of layer between the loss and the head, so this comes with the
    // backward's start, before the loss's backward rather than after it.
    inForward_ = false;
    Gather(b, 0, false);
  }
  if (deepSpeedZero12_) {  // the buckets come with the first gradient (ProduceZero2)
    ++backwardsThisStep_;
    return;
  }
  if (plan_.engine != ShardingEngine::Zero || plan_.zeroStage != 2 || plan_.reduceBuckets == 0) return;
  // stage_1_and_2.py backward(): with contiguous_gradients, ipg_buffer = [empty(reduce_bucket_size)]
  // and a second one with overlap_comm; released by _release_ipg_buffers in step(). On the default
  // stream: setup_buckets makes them from process_gradients (the gradient hook), outside any
  // stream context; the reduction stream only reads them (average_tensor).
  TextStore& text = b.text();
  // A later micro-batch's backward replaces the list: the old buffers go first.
  for (TensorHandle h : reduceBuckets_) b.Release(h, text.Make({"ZeRO-2 backward: previous reduce buckets let go"}));
  reduceBuckets_.clear();
  for (int k = 0; k < plan_.reduceBuckets; ++k) {
    reduceBuckets_.push_back(b.Alloc(Category::Gradients, plan_.reduceBucketElements * BytesPerElement(regime_.gradients),
                                     text.Make({"ipg_buffer ", TextPart::Int(k)}),
                                     text.Make({"ZeRO-2 backward: reduce bucket ", TextPart::Int(k),
                                                TextPart::View(k == 1 ? " (overlap_comm)" : " (reduce_bucket_size)")}),
                                     text.Make({TextPart::Count(plan_.reduceBucketElements), " × ",
                                                TextPart::Bytes(regime_.gradients)})));
  }
}

bool ParallelStep::Produce(TraceBuilder& b, std::size_t index, Text label) {
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[index];
  const std::int64_t g = BytesPerElement(regime_.gradients);
  if (setup_.parallel.gradReduceInFp32) {
    // Megatron's DDP: the parameter's gradient is added into its main_grad, a view of the fp32
    // buffer, and let go (distributed_data_parallel.py _make_backward_post_hook:
    // param.main_grad.add_(param.grad.data); param.grad = None), with or without the
    // distributed optimizer.
    const TensorHandle grad = b.Alloc(Category::Gradients, p.Elements() * g, text.Make({names_[index], ".grad"}),
                                      text.Make({label, ": ", names_[index], ".grad"}),
                                      text.Shape(Shape(p.shape), regime_.gradients), p.layer);
    b.Release(grad, text.Make({label, ": ", names_[index], ".grad added into main_grad (fp32 buffer)"}));
    return true;
  }
  switch (plan_.engine) {
    case ShardingEngine::None: return false;
    case ShardingEngine::DDP: {
      if (!setup_.parallel.gradientAsBucketView) return false;
      // gradient_as_bucket_view=True: AccumulateGrad still makes .grad from the incoming
      // gradient (it was None after zero_grad(set_to_none=True)); the reducer's hook copies it
      // into its bucket view and makes .grad that view (reducer.cpp mark_variable_ready_dense:
      // bucket_view.copy_(grad); grad = bucket_view), so the gradient lives for an instant.
      const DType type = GradientTypeOf(p, regime_.gradients);  // a parameter's own dtype (finetune.hpp)
      const TensorHandle grad = b.Alloc(Category::Gradients, p.Elements() * BytesPerElement(type),
                                        text.Make({names_[index], ".grad"}), text.Make({label, ": ", names_[index], ".grad"}),
                                        text.Shape(Shape(p.shape), type), p.layer);
      b.Release(grad, text.Make({label, ": ", names_[index], ".grad copied into its DDP bucket (now a view)"}));
      return true;
    }
    case ShardingEngine::Zero: {
      if (deepSpeedZero12_) return plan_.zeroStage == 2 ? ProduceZero2(b, index, label) : ProduceZero1(b, index, label);
      if (plan_.zeroStage < 2) return false;
      if (plan_.zeroStage == 3) return ProduceZero3(b, index, label);
      // The gradient is copied into the reduce bucket and freed (reduce_independent_p_g_buckets_
      // and_remove_grads); after the reduce-scatter this rank's part lands in grads_in_partition.
      const TensorHandle grad = b.Alloc(Category::Gradients, p.Elements() * g, text.Make({names_[index], ".grad"}),
                                        text.Make({label, ": ", names_[index], ".grad"}),
                                        text.Shape(Shape(p.shape), regime_.gradients), p.layer);
      if (gradPartition_ == kNoTensor && !plan_.offloadOptimizer) {
        // ZeRO-1/2: copy_grads_in_partition makes grads_in_partition (torch.empty) at the first
        // copy, which reduce_ipg_grads runs under `get_accelerator().stream(stream)`, stream =
        // self.reduction_stream with overlap_comm (stage_1_and_2.py). ZeRO-3's
        // grad_partitions_flat_buffer exists from construction (Init).
        const OnStream onStream(b, plan_.zeroStage < 3 && ZeroOverlapComm(setup_.parallel, plan_) ? kReduceScatterStream
                                                                                                 : b.stream());
        gradPartition_ = b.Alloc(Category::Gradients, plan_.partitionElements * g, text.Make({"grads_in_partition"}),
                                 text.Make({"ZeRO: gradient partition (first reduce)"}),
                                 text.Make({TextPart::Count(plan_.partitionElements), " × ", TextPart::Bytes(regime_.gradients)}));
      }
      b.Release(grad, text.Make({label, ": ", names_[index], ".grad copied to the reduce bucket"}));
      return true;
    }
    case ShardingEngine::Fsdp2: return ProduceFsdp2(b, index, label);
    case ShardingEngine::Fsdp: {
      if (plan_.adaptersApart) return ProduceAdapterUnit(b, index, label);
      const int unit = UnitOf(p);
      if (unit != 0 && unit != openUnit_) {
        if (openUnit_ > 0) ReduceScatterUnit(b, openUnit_);
        openUnit_ = unit;
      }
      if (unsharded_[static_cast<std::size_t>(unit)] == kNoTensor) {
        const std::int64_t elements = unit == 0 ? plan_.rootUnitElements : plan_.unitElements[static_cast<std::size_t>(unit - 1)];
        unsharded_[static_cast<std::size_t>(unit)] =
            b.Alloc(Category::Gradients, elements * g, text.Make({"unsharded gradient"}),
                    text.Make({label, ": unsharded gradient of its FSDP unit"}),
                    text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(regime_.gradients)}), p.layer);
      }
      return true;
    }
  }
  return false;
}

bool ParallelStep::ProduceFsdp2(TraceBuilder& b, std::size_t index, Text label) {
  // FSDP2 keeps no flat gradient: each unsharded parameter gets its own .grad when its gradient
  // is produced (AccumulateGrad on FSDPParam's unsharded param; _fsdp_param.py
  // unsharded_grad_data), a second gradient (a tied weight) is added into it.
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[index];
  const std::int64_t g = BytesPerElement(regime_.gradients);
  const int unit = unitOf_[index];
  const int blocks = static_cast<int>(plan_.unitElements.size());
  // The embedding and output units' pre-backward all-gather (their output's gradient arrived).
  if (unit > blocks) Gather(b, unit, false);
  if (unit != 0 && unit != openUnit_) {
    if (openUnit_ > 0 && pipelineNoSync_) PostBackwardNoSync(b, openUnit_);
    else if (openUnit_ > 0) ReduceScatterUnit(b, openUnit_);
    openUnit_ = unit;
  }
  const TensorHandle grad = b.Alloc(Category::Gradients, p.Elements() * g, text.Make({names_[index], ".grad"}),
                                    text.Make({label, ": ", names_[index], ".grad (unsharded)"}),
                                    text.Shape(Shape(p.shape), regime_.gradients), p.layer);
  if (gradOfParameter_.empty()) gradOfParameter_.assign(inventory_.parameters.size(), kNoTensor);
  if (gradOfParameter_[index] != kNoTensor) {
    b.Release(grad, text.Make({label, ": ", names_[index], ".grad accumulated"}));
  } else {
    gradOfParameter_[index] = grad;
    // A parameter with a reduce-dtype accumulation from an earlier micro-batch is listed already.
    if (accumulatedGrad_.empty() || accumulatedGrad_[index] == kNoTensor) {
      parameterGrads_[static_cast<std::size_t>(unit)].push_back(index);
    }
  }
  return true;
}

void ParallelStep::PostBackwardNoSync(TraceBuilder& b, int unit) {
  // _fsdp_param_group.py post_backward with reduce_grads False (set_requires_gradient_sync(False)):
  // accumulate_unsharded_grad_if_needed (a new .grad beside a reduce-dtype accumulation is added
  // into it and freed), no reshard (reshard_after_backward False), then to_accumulated_grad_if_needed
  // (_fsdp_param.py: the .grad cast to reduce_dtype into unsharded_accumulated_grad when the dtypes
  // differ; with equal dtypes the .grad stays and AccumulateGrad adds the next micro-batch's into it).
  if (unit < 0 || static_cast<std::size_t>(unit) >= parameterGrads_.size()) return;
  TextStore& text = b.text();
  const DType reduce = setup_.parallel.fsdpReduceInFp32 ? DType::FP32 : regime_.gradients;
  for (std::size_t i : parameterGrads_[static_cast<std::size_t>(unit)]) {
    TensorHandle& grad = gradOfParameter_[i];
    if (grad == kNoTensor) continue;
    if (accumulatedGrad_[i] != kNoTensor) {
      b.Release(grad, text.Make({"FSDP2 (no sync): ", names_[i], ".grad added into its unsharded accumulated gradient"}));
      grad = kNoTensor;
      continue;
    }
    if (reduce == regime_.gradients) continue;
    const Tensor& p = inventory_.parameters[i];
    accumulatedGrad_[i] = b.Alloc(Category::Gradients, p.Elements() * BytesPerElement(reduce),
                                  text.Make({names_[i], " unsharded_accumulated_grad"}),
                                  text.Make({"FSDP2 (no sync): ", names_[i], ".grad cast to the reduce dtype and kept"}),
                                  text.Shape(Shape(p.shape), reduce), p.layer);
    b.Release(grad, text.Make({"FSDP2 (no sync): ", names_[i], ".grad freed (cast)"}));
    grad = kNoTensor;
  }
}

void ParallelStep::PipelineFinalReduce(TraceBuilder& b, int chunk) {
  // After the stage's last backward (torch/distributed/pipelining/stage.py: run_post_backward in
  // backward_maybe_with_nosync, perform_reduce_grad in newer torch): set_requires_gradient_sync(True)
  // and set_reshard_after_backward(True), then every FSDP state's post_backward in
  // _state_ctx.all_states order (the root first, then the modules in module order: embeddings,
  // blocks, output), each one resharding and reduce-scattering (foreach_reduce); then
  // _root_post_backward_final_callback lets go of the last reduce-scatter input. Under the
  // interleaved schedule this runs per virtual stage, over that chunk's root and units, at the
  // chunk's own last backward.
  const int blocks = static_cast<int>(plan_.unitElements.size());
  const int units = static_cast<int>(gathered_.size());
  std::vector<int> order = {0};
  if (units > blocks + 1) order.push_back(blocks + 1);
  for (int u = 1; u <= blocks; ++u) order.push_back(u);
  if (units > blocks + 2) order.push_back(blocks + 2);
  for (int unit : order) {
    if (chunkOfUnit_[static_cast<std::size_t>(unit)] != chunk) continue;
    PostBackwardNoSync(b, unit);  // accumulate_unsharded_grad_if_needed (nothing left after the no-sync ones)
    Free(b, unit);
    ReduceScatterFsdp2(b, unit);
  }
  ReleaseHeldReduceInput(b);
}

void ParallelStep::ReleaseHeldReduceInput(TraceBuilder& b) {
  b.Release(heldReduceInput_, b.text().Make({"FSDP2: previous reduce-scatter input freed"}));
  heldReduceInput_ = kNoTensor;
}

void ParallelStep::ReduceScatterFsdp2(TraceBuilder& b, int unit) {
  // torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce: one reduce-scatter
  // input of the unit's padded gradients in reduce_dtype (reduce_dtype or the gradients' dtype),
  // the gradients copied in and freed (unsharded_grads.clear()), the output (1/world) in
  // reduce_dtype, cast to the sharded parameter's dtype when it differs (_to_dtype_if_needed)
  // and kept as the shard's .grad, or added into it. The input is held until the next unit's
  // reduce (_fsdp_param_group.py post_backward: comm_ctx.reduce_scatter_state) or the end of
  // backward (_root_post_backward_final_callback).
  std::vector<std::size_t>& grads = parameterGrads_[static_cast<std::size_t>(unit)];
  if (grads.empty()) return;
  TextStore& text = b.text();
  const int blocks = static_cast<int>(plan_.unitElements.size());
  const int layer = unit >= 1 && unit <= blocks ? unit - 1 : -1;
  const Text what = unit == 0             ? text.Make({"root unit"})
                    : unit == blocks + 1 ? text.Make({"embedding unit"})
                    : unit == blocks + 2 ? text.Make({"output unit"})
                                         : text.Make({"layers.", TextPart::Int(layer)});
  const DType reduce = setup_.parallel.fsdpReduceInFp32 ? DType::FP32 : regime_.gradients;
  const std::int64_t padded = fsdp2PaddedElements_[static_cast<std::size_t>(unit)];
  const std::int64_t shard = fsdp2ShardElements_[static_cast<std::size_t>(unit)];
  // post_backward: reshard (reshard_after_backward) first, then the previous reduce's input is
  // let go and foreach_reduce runs.
  if (unit > blocks) Free(b, unit);
  ReleaseHeldReduceInput(b);
  const TensorHandle input = b.Alloc(Category::Gradients, padded * BytesPerElement(reduce), text.Make({"reduce-scatter input"}),
                                     text.Make({"FSDP2 foreach_reduce: reduce-scatter input of ", what}),
                                     text.Make({TextPart::Count(padded), " × ", TextPart::Bytes(reduce)}), layer);
  for (std::size_t i : grads) {
    b.Release(gradOfParameter_[i], text.Make({"FSDP2: ", names_[i], ".grad copied into the reduce-scatter input"}));
    gradOfParameter_[i] = kNoTensor;
    // On a pipeline stage: the reduce-dtype accumulation is the reduce's input instead.
    if (!accumulatedGrad_.empty() && accumulatedGrad_[i] != kNoTensor) {
      b.Release(accumulatedGrad_[i], text.Make({"FSDP2: ", names_[i], " accumulated gradient copied into the reduce-scatter input"}));
      accumulatedGrad_[i] = kNoTensor;
    }
  }
  grads.clear();
  // The input above is allocated before `with device_handle.stream(reduce_scatter_stream)`: on
  // the default stream. The output (reduce_scatter_comm.allocate) and its cast to the
  // parameter's dtype (_to_dtype_if_needed, under post_reduce_stream, which is the
  // reduce-scatter stream without HSDP) are made on the reduce-scatter stream; the sharded
  // .grad is a view of them, so their blocks return to that stream's pool when the optimizer's
  // zero_grad lets go.
  const OnStream onStream(b, kReduceScatterStream);
  TensorHandle out = b.Alloc(Category::Gradients, shard * BytesPerElement(reduce), text.Make({"gradient shard"}),
                             text.Make({"FSDP2 reduce-scatter of ", what}),
                             text.Make({TextPart::Count(shard), " × ", TextPart::Bytes(reduce)}), layer);
  heldReduceInput_ = input;
  if (plan_.offloadOptimizer) {
    b.Release(out, text.Make({"FSDP2: gradient shard of ", what, " copied to the host"}));
    return;
  }
  if (optimizerRegime_.gradients != reduce) {
    const TensorHandle cast = b.Alloc(Category::Gradients, shard * BytesPerElement(optimizerRegime_.gradients),
                                      text.Make({"gradient shard (cast)"}), text.Make({"FSDP2: gradient shard of ", what, " cast to the parameter dtype"}),
                                      text.Make({TextPart::Count(shard), " × ", TextPart::Bytes(optimizerRegime_.gradients)}), layer);
    b.Release(out, text.Make({"FSDP2: reduce-dtype gradient shard freed"}));
    out = cast;
  }
  TensorHandle& kept = sharded_[static_cast<std::size_t>(unit)];
  if (kept == kNoTensor) kept = out;
  else b.Release(out, text.Make({"FSDP2: gradient shard accumulated"}));
}

void ParallelStep::ForwardStart(TraceBuilder& b) {
  forwardSawBlock_ = false;
  backwardSawBlock_ = false;
  backwardEnded_ = false;
  inForward_ = true;
  const int blocks = static_cast<int>(plan_.unitElements.size());
  // The embedding unit (chunk 0's, under the interleaved schedule).
  if (static_cast<int>(gathered_.size()) > blocks + 1 && OfRunningChunk(blocks + 1)) Gather(b, blocks + 1, false);
  if (zeroRootApart_) {
    GatherZeroEmbeddings(b);
    PrefetchZeroUnits(b, 1, +1);  // the embeddings' fetch prefetches block 0 onwards
  }
}

void ParallelStep::ForwardEnd(TraceBuilder& b) {
  // The output unit's post-forward reshard (reshard_after_forward), before the loss.
  const int blocks = static_cast<int>(plan_.unitElements.size());
  if (static_cast<int>(gathered_.size()) > blocks + 2 && reshardAfterForward_) Free(b, blocks + 2);
  // FSDP2: the root's post-forward frees the last unit's deferred all-gather output
  // (_fsdp_state.py _post_forward, iter_forward_root: comm_ctx.all_gather_state = None).
  ReleaseHeldAllGather(b);
  // ZeRO-3: the head's post-forward release, unless its backward (next, with no parameter
  // between) is within stage3_max_reuse_distance of a complete trace.
  if (zeroRootApart_ && !(ZeroTraceComplete() && setup_.parallel.stage3MaxReuseDistance > 0)) ReleaseZeroTail(b);
  inForward_ = false;
}

void ParallelStep::ReduceScatterUnit(TraceBuilder& b, int unit) {
  if (plan_.engine == ShardingEngine::Fsdp2) {
    ReduceScatterFsdp2(b, unit);
    return;
  }
  // _runtime_utils.py _post_backward_hook → _reduce_grad: reduce-scatter into a new shard,
  // the unsharded gradient freed, the shard cast to the parameter's dtype and kept (or added to
  // the kept one) in _saved_grad_shard / .grad; with CPU offload copied to the host.
  TextStore& text = b.text();
  TensorHandle& full = unsharded_[static_cast<std::size_t>(unit)];
  if (full == kNoTensor) return;
  const std::int64_t elements = unit == 0 ? plan_.rootUnitElements : plan_.unitElements[static_cast<std::size_t>(unit - 1)];
  const int layer = unit - 1;
  const Text what = unit == 0 ? text.Make({"root unit"}) : text.Make({"layers.", TextPart::Int(layer)});
  ReduceScatterFlat(b, full, elements, layer, what, sharded_[static_cast<std::size_t>(unit)]);
}

// PEFT's fsdp_auto_wrap_policy (parallel.fsdpWrapAdaptersApart, sharding.cpp
// PlanFsdpAdapterUnits): the adapter is a unit of its own, so its gradient is its FlatParameter's
// (the unpadded n elements, _flat_param.py _use_unpadded_unsharded_flat_param), and FSDP's
// post-backward hook on that FlatParameter's AccumulateGrad (_runtime_utils.py
// _register_post_backward_hook) reduce-scatters it as soon as it is produced.
bool ParallelStep::ProduceAdapterUnit(TraceBuilder& b, std::size_t index, Text label) {
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[index];
  const std::int64_t elements = StorageElements(p);
  TensorHandle full = b.Alloc(Category::Gradients, elements * BytesPerElement(regime_.gradients),
                              text.Make({"unsharded gradient"}),
                              text.Make({label, ": unsharded gradient of ", names_[index], "'s FSDP unit"}),
                              text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(regime_.gradients)}), p.layer);
  if (adapterShards_.empty()) adapterShards_.assign(inventory_.parameters.size(), kNoTensor);
  ReduceScatterFlat(b, full, elements, p.layer, names_[index], adapterShards_[index]);
  return true;
}

void ParallelStep::ReduceScatterFlat(TraceBuilder& b, TensorHandle& full, std::int64_t elements, int layer, Text what,
                                     TensorHandle& kept) {
  TextStore& text = b.text();
  const std::int64_t shard = CeilDiv(elements, plan_.shardWorld);
  // _runtime_utils.py _post_backward_hook runs _reduce_grad under
  // `state._device_handle.stream(state._post_backward_stream)`: the new sharded gradient
  // (_get_reduce_scatter_tensors' torch.empty_like) and its cast (_cast_grad_to_param_dtype)
  // are that stream's.
  const OnStream onStream(b, kReduceScatterStream);
  TensorHandle out = full;  // NO_SHARD (Fsdp1NoShard): all-reduced in place
  if (!Fsdp1NoShard(plan_)) {
    out = b.Alloc(Category::Gradients, shard * BytesPerElement(regime_.gradients), text.Make({"gradient shard"}),
                  text.Make({"FSDP reduce-scatter of ", what}),
                  text.Make({TextPart::Count(shard), " × ", TextPart::Bytes(regime_.gradients)}), layer);
    b.Release(full, text.Make({"FSDP: unsharded gradient of ", what, " freed"}));
  }
  full = kNoTensor;
  if (plan_.offloadOptimizer) {
    b.Release(out, text.Make({"FSDP: gradient shard of ", what, " copied to the host"}));
    return;
  }
  if (optimizerRegime_.gradients != regime_.gradients) {
    TensorHandle cast = b.Alloc(Category::Gradients, shard * BytesPerElement(optimizerRegime_.gradients),
                                text.Make({"gradient shard (fp32)"}), text.Make({"FSDP: gradient shard of ", what, " in fp32"}),
                                text.Make({TextPart::Count(shard), " × ", TextPart::Bytes(optimizerRegime_.gradients)}), layer);
    b.Release(out, text.Make({"FSDP: 16-bit gradient shard freed"}));
    out = cast;
  }
  if (kept == kNoTensor) kept = out;
  else b.Release(out, text.Make({"FSDP: gradient shard accumulated"}));
}

void ParallelStep::EndBackward(TraceBuilder& b) {
  TextStore& text = b.text();
  backwardEnded_ = true;
  if (backwardsEnded_++ == 0 && !backwardUse_.empty()) PlanZeroReuse();  // the trace is complete
  if (pipelineNoSync_) {
    // The micro-batch's remaining post_backwards (the open unit, then the root), without sync;
    // after the stage's last backward the deferred reshard and reduce-scatter.
    if (openUnit_ > 0) PostBackwardNoSync(b, openUnit_);
    PostBackwardNoSync(b, 0);
    openUnit_ = -2;
    std::int64_t& seen = chunkBackwardsSeen_[static_cast<std::size_t>(chunk_)];
    if (seen >= backwardsPerChunk_) {
      PipelineFinalReduce(b, chunk_);
      seen = 0;
    }
    return;
  }
  for (int u = static_cast<int>(gathered_.size()) - 1; u >= 0; --u) Free(b, u);
  if (plan_.engine == ShardingEngine::Fsdp || plan_.engine == ShardingEngine::Fsdp2) {
    if (openUnit_ > 0) ReduceScatterUnit(b, openUnit_);
    ReduceScatterUnit(b, 0);  // the root's post-backward runs last
    openUnit_ = -2;
    ReleaseHeldReduceInput(b);
  }
  // ZeRO-3: the engine's backward ends in overlapping_partition_gradients_reduce_epilogue →
  // independent_gradient_partition_epilogue, which reduces what is left in the bucket.
  if (plan_.engine == ShardingEngine::Zero && plan_.zeroStage == 3) {
    ReduceIpgBucket(b, text.Make({"ZeRO-3 backward epilogue"}));
  }
  if (deepSpeedZero12_ && plan_.zeroStage == 2) ZeroEpilogue(b);
  if (deepSpeedZero12_ && plan_.zeroStage == 1 && AtAccumulationBoundary()) {
    // engine.py allreduce_gradients at the boundary → reduce_gradients: without overlap_comm each
    // parameter's gradient, in the parameters' order, through the bucket; then the epilogue.
    const Text label = text.Make({"ZeRO-1 reduce_gradients"});
    for (std::size_t i = 0; i < pendingGrads_.size(); ++i) {
      if (pendingGrads_[i] == kNoTensor) continue;
      AddToZeroBucket(b, i, pendingGrads_[i], label);
      pendingGrads_[i] = kNoTensor;
    }
    ZeroEpilogue(b);
  }
  // Megatron reduce-scatters its fp32 buffer in place (param_and_grad_buffer.py
  // start_grad_sync: reduce_scatter_tensor into a view of bucket.grad_data): no flat bucket.
  if (plan_.engine == ShardingEngine::Zero && plan_.zeroStage == 1 && plan_.reduceBuckets > 0 &&
      !setup_.parallel.gradReduceInFp32 && !deepSpeedZero12_) {
    // stage_1_and_2.py reduce_gradients → buffered_reduce_fallback: gradients flattened into a
    // new tensor of at most reduce_bucket_size elements, all-reduced, copied back, freed. The
    // flattening is allreduce_bucket's self.flatten, which allreduce_and_copy runs under
    // `get_accelerator().stream(stream)`, stream = self.reduction_stream with overlap_comm.
    const OnStream onStream(b, ZeroOverlapComm(setup_.parallel, plan_) ? kReduceScatterStream : b.stream());
    const TensorHandle flat = b.Alloc(Category::Gradients, plan_.reduceBucketElements * BytesPerElement(regime_.gradients),
                                      text.Make({"flat gradient bucket"}), text.Make({"ZeRO-1: gradients flattened for all-reduce"}),
                                      text.Make({TextPart::Count(plan_.reduceBucketElements), " × ",
                                                 TextPart::Bytes(regime_.gradients)}));
    b.Release(flat, text.Make({"ZeRO-1: gradients all-reduced"}));
  }
}

void ParallelStep::BeforeOptimizerStep(TraceBuilder& b) {
  if (plan_.engine != ShardingEngine::Zero) return;
  TextStore& text = b.text();
  if (deepSpeedZero12_) {
    backwardsThisStep_ = 0;
    if (plan_.offloadOptimizer) return;  // the fp32 gradients are on the host already
    // stage_1_and_2.py step(): check_overflow and scaled_global_norm's transients, then
    // flatten_dense_tensors_aligned(averaged_gradients) — a new 16-bit flat of the partition —
    // .to(fp32) as the fp32 partition's .grad, `del flat_grad_partition`, and
    // free_grad_in_param_list + averaged_gradients = None let grads_in_partition go.
    ZeroStepTransients(b);
    const std::int64_t g = BytesPerElement(regime_.gradients);
    const std::int64_t n = plan_.partitionElements;
    const TensorHandle flat = b.Alloc(Category::Gradients, n * g, text.Make({"flat gradient partition"}),
                                      text.Make({"ZeRO step: averaged gradients flattened (flatten_dense_tensors_aligned)"}),
                                      text.Make({TextPart::Count(n), " × ", TextPart::Bytes(regime_.gradients)}));
    fp32GradPartition_ = b.Alloc(Category::Gradients, n * 4, text.Make({"fp32 gradient partition"}),
                                 text.Make({"ZeRO step: fp32 gradient partition"}),
                                 text.Make({TextPart::Count(n), " × ", TextPart::Bytes(DType::FP32)}));
    b.Release(flat, text.Make({"ZeRO step: del flat_grad_partition"}));
    b.Release(keptGradPartition_, text.Make({"ZeRO step: grads_in_partition freed (free_grad_in_param_list)"}));
    keptGradPartition_ = kNoTensor;
    b.Release(partitionPad_, text.Make({"ZeRO step: averaged_gradients = None"}));
    partitionPad_ = kNoTensor;
    return;
  }
  // stage_1_and_2.py step(): the rank's gradients flattened and cast to fp32 (the fused fp32
  // gradient buffer, single_grad_partition), then the 16-bit ones and the buckets let go.
  // Megatron: the fp32 main grads are views of the fp32 buffer (distrib_optimizer.py
  // _copy_model_grads_to_main_grads: shard_main_param.grad = shard_model_grad.float(), no copy).
  if (OptimizerSubGroups() > 0) {
    Zero3StepTransients(b);  // then each sub-group's gradients (BeforeSubGroupStep)
    return;
  }
  if (!plan_.offloadOptimizer && !setup_.parallel.gradReduceInFp32) {
    fp32GradPartition_ = b.Alloc(Category::Gradients, plan_.partitionElements * 4, text.Make({"fp32 gradient partition"}),
                                 text.Make({"ZeRO step: fp32 gradient partition"}),
                                 text.Make({TextPart::Count(plan_.partitionElements), " × ", TextPart::Bytes(DType::FP32)}));
  }
  // ZeRO-1/2: _release_ipg_buffers lets grads_in_partition go (stage_1_and_2.py step); ZeRO-3's
  // flat gradient buffer stays.
  if (plan_.zeroStage < 3) {
    b.Release(gradPartition_, text.Make({"ZeRO step: 16-bit gradient partition freed"}));
    gradPartition_ = kNoTensor;
  }
  if (plan_.zeroStage == 2) {
    for (TensorHandle h : reduceBuckets_) b.Release(h, text.Make({"ZeRO step: _release_ipg_buffers"}));
    reduceBuckets_.clear();
  }
}

bool ParallelStep::InitializesOptimizerStates() const {
  const ParallelDef& p = setup_.parallel;
  const bool megatron = p.tensorParallel > 1 || p.pipelineParallel > 1 || p.contextParallel > 1 ||
                        p.expertParallel > 1 || p.gradReduceInFp32;
  return plan_.engine == ShardingEngine::Zero && !plan_.offloadOptimizer && !megatron &&
         !optimizerInventory_.parameters.empty();
}

void ParallelStep::BeforeInitialOptimizerStep(TraceBuilder& b) {
  TextStore& text = b.text();
  // stage_1_and_2.py: single_grad_partition = torch.zeros(partition_size, fp32) as the fp32
  // partition's .grad; stage3.py: gradient_buffer = torch.zeros(largest sub-group, fp32), each
  // sub-group's .grad a narrow() of it (the optimizer inventory holds the sub-groups).
  std::int64_t elements = 0;
  for (const Tensor& t : optimizerInventory_.parameters) elements = std::max(elements, t.Elements());
  initialGradient_ = b.Alloc(Category::Gradients, elements * 4, text.Make({"initial zero gradient (fp32)"}),
                             text.Make({"ZeRO init: initialize_optimizer_states' zero-valued fp32 gradient"}),
                             text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(DType::FP32)}));
}

std::size_t ParallelStep::OptimizerSubGroups() const {
  const bool zero3 = plan_.engine == ShardingEngine::Zero && plan_.zeroStage == 3;
  return zero3 && !plan_.offloadOptimizer && !setup_.parallel.gradReduceInFp32 ? optimizerInventory_.parameters.size() : 0;
}

// stage3.py _prepare_fp32_grad_for_sub_group: `self.flatten(self.averaged_gradients[i])` (a
// 16-bit flat of the sub-group's gradient partitions) `.to(fp32)` as the sub-group's fp32 .grad;
// the flat is a temporary. _release_sub_group sets the .grad to None after the step.
void ParallelStep::BeforeSubGroupStep(TraceBuilder& b, std::size_t k) {
  TextStore& text = b.text();
  const std::int64_t n = optimizerInventory_.parameters[k].Elements();
  const Text which = optimizerInventory_.parameters.size() == 1
                        ? text.Make({""})
                        : text.Make({" of sub-group ", TextPart::Int(static_cast<std::int64_t>(k))});
  const TensorHandle flat = b.Alloc(Category::Gradients, n * BytesPerElement(regime_.gradients), text.Make({"flat gradient partition"}),
                                    text.Make({"ZeRO step: averaged gradients flattened (_prepare_fp32_grad_for_sub_group)", which}),
                                    text.Make({TextPart::Count(n), " × ", TextPart::Bytes(regime_.gradients)}));
  fp32GradPartition_ = b.Alloc(Category::Gradients, n * 4, text.Make({"fp32 gradient partition"}),
                               text.Make({"ZeRO step: fp32 gradient partition", which}),
                               text.Make({TextPart::Count(n), " × ", TextPart::Bytes(DType::FP32)}));
  b.Release(flat, text.Make({"ZeRO step: the 16-bit flat freed"}));
}

void ParallelStep::AfterSubGroupStep(TraceBuilder& b, std::size_t k) {
  b.Release(fp32GradPartition_, b.text().Make({"ZeRO step: fp32 gradient partition freed (_release_sub_group ",
                                                TextPart::Int(static_cast<std::int64_t>(k)), ")"}));
  fp32GradPartition_ = kNoTensor;
}

void ParallelStep::AfterInitialOptimizerStep(TraceBuilder& b) {
  b.Release(initialGradient_, b.text().Make({"ZeRO init: the zero gradient let go (.grad = None)"}));
  initialGradient_ = kNoTensor;
}

void ParallelStep::AfterOptimizerStep(TraceBuilder& b) {
  b.Release(fp32GradPartition_, b.text().Make({"ZeRO step: fp32 gradient partition freed"}));
  fp32GradPartition_ = kNoTensor;
}

void ParallelStep::ReleaseAll(TraceBuilder& b, Text label) {
  for (TensorHandle& h : sharded_) {
    b.Release(h, label);
    h = kNoTensor;
  }
  for (TensorHandle& h : adapterShards_) {
    b.Release(h, label);
    h = kNoTensor;
  }
  // zero_grad(set_to_none=True) sets each parameter's .grad to None; ZeRO-3's flat gradient
  // buffer stays (stage3.py zero_grad only drops the views).
  if (plan_.engine == ShardingEngine::Zero && plan_.zeroStage == 3) return;
  b.Release(gradPartition_, label);
  gradPartition_ = kNoTensor;
}

std::vector<std::string> ParallelNotes(const Setup& setup) {
  std::vector<std::string> notes;
  const SimulatedRank rank = SimulatedRankOf(setup);
  notes.push_back("Many GPUs: " + std::to_string(rank.worldSize) + " GPUs, " + rank.engineLabel +
                  "; the estimate is one rank's (" + rank.why + ").");
  for (std::string& note : PipelineNotes(setup)) notes.push_back(std::move(note));  // parallel/pipeline.cpp
  const ParallelDef& p = setup.parallel;
  const bool gathers = p.zeroStage == 3 || p.fsdp != FsdpMode::Off;
  if (gathers && setup.model.kind != ModelKind::Transformer) {
    notes.push_back("ZeRO-3 / FSDP: this model has no transformer blocks to gather one at a time, so gathered "
                    "parameters are not simulated; the sharded states and gradient buffers are.");
  }
  if (rank.shardWorld == 1 && rank.engine == ShardingEngine::Fsdp) {
    notes.push_back("FSDP over one rank: PyTorch switches to NO_SHARD (\"FSDP is switching to use `NO_SHARD` ... since "
                    "the world size is 1\"): each unit computes with a 16-bit copy of its FlatParameter under mixed "
                    "precision, with the FlatParameter itself otherwise, and its gradient is all-reduced in place.");
  }
  if (rank.shardWorld == 1 && rank.engine == ShardingEngine::Zero && p.zeroStage == 3 &&
      p.offload != OffloadKind::OptimizerAndParameters) {
    notes.push_back("ZeRO-3 over one rank: each partition is the whole parameter and DeepSpeed fetches it as a view "
                    "(no all-gather), so nothing is gathered.");
  }
  if (rank.engine == ShardingEngine::Fsdp && !p.limitAllGathers && rank.shardWorld > 1) {
    // FullyShardedDataParallel's limit_all_gathers: _runtime_utils.py _unshard waits on the
    // rate limiter's free events (at most two in flight) before issuing an all-gather. Without it
    // the CPU thread may issue the next units' all-gathers while the GPU still computes with the
    // earlier ones, whose freed blocks the allocator cannot reuse until then (record_stream).
    notes.push_back("FSDP limit_all_gathers off: the CPU may issue all-gathers several units ahead of the GPU, and "
                    "their memory adds to what the simulation shows (the current unit and the prefetched one, as "
                    "with the rate limiter on); how far ahead depends on timing, so this estimate is a floor.");
  }
  if (p.zeroStage >= 2 && p.contiguousGradients) {
    notes.push_back("ZeRO: the reduce bucket holds reduce_bucket_size elements (" + std::to_string(p.reduceBucketSize) +
                    ") whatever the model's size; lower it for small models.");
  }
  if (p.tensorParallel > 1) {
    notes.push_back("Tensor parallel: the rank runs the model with heads, MLP width and vocabulary divided by " +
                    std::to_string(p.tensorParallel) +
                    (p.sequenceParallel ? "; sequence parallel: norms, residuals and the hidden states between blocks hold "
                                          "s/t tokens, each column-parallel linear all-gathers its input into Megatron's "
                                          "b·s·h buffer and saves the sharded one."
                                        : "; hidden states between blocks are whole (no sequence parallelism)."));
  }
  if (p.contextParallel > 1) {
    notes.push_back("Context parallel: the rank holds s/" + std::to_string(p.contextParallel) +
                    " tokens of each sequence; attention is Transformer Engine's ring (k/v chunks passed around the "
                    "context-parallel ranks, per-step outputs kept until the forward returns); gradients are reduced "
                    "over data × context parallel ranks.");
  }
  if (p.expertParallel > 1) {
    notes.push_back("Expert parallel: the rank holds " +
                    std::to_string(setup.model.architecture.numExperts / p.expertParallel) +
                    " experts per block and exchanges tokens with all-to-alls; tokens are taken as routed evenly (each "
                    "rank's experts receive b·s·k rows in all, as on one GPU; b·s·k·etp/t under sequence parallelism); expert states are sharded over " +
                    std::to_string(ExpertDataParallelOf(p)) + " expert-data-parallel ranks" +
                    (ExpertTensorParallelOf(p) > 1 ? ", each expert's MLP split over " +
                                                         std::to_string(ExpertTensorParallelOf(p)) +
                                                         " expert-tensor-parallel ranks (its rows all-gathered and reduce-scattered over them)." : "."));
  }
  if (p.expertParallel == 1 && p.sequenceParallel && p.tensorParallel > 1 && setup.model.kind == ModelKind::Transformer &&
      setup.model.architecture.numExperts > 0) {
    // docs/parallel.md, "Expert parallelism": the same dispatcher with an expert-parallel group of one.
    notes.push_back("Sequence parallel with experts: each MoE layer runs Megatron's all-to-all token dispatcher on "
                    "the rank's s/t tokens (no all-to-all with one expert-parallel rank), its rows all-gathered and "
                    "reduce-scattered over " + std::to_string(ExpertTensorParallelOf(p)) +
                    " expert-tensor-parallel ranks; tokens are taken as routed evenly.");
  }
  if (FinetuneActive(setup.finetune)) {
    // docs/parallel.md, "Fine-tuning on many GPUs".
    notes.push_back(
        p.fsdp == FsdpMode::FullyShard
            ? "Fine-tuning under FSDP2 (fully_shard, as torchtune's LoRA recipe runs it): every parameter, frozen or "
              "not, is sharded on dim 0 (padded to a multiple of the ranks) and gathered with its block; only the "
              "trainable ones get a gradient, are reduce-scattered and have optimizer states."
        : p.fsdp != FsdpMode::Off && p.fsdpWrapAdaptersApart
            ? "Fine-tuning under FSDP with PEFT's fsdp_auto_wrap_policy (use_orig_params=False): each lora_A / lora_B is "
              "an FSDP unit of its own with its own padded shard, gradient shard and optimizer state; the blocks' and the "
              "root's FlatParameters hold the frozen weights only and get no gradient; an adapter's gathered copy is "
              "counted with its block's; 4-bit statistics stay whole on every rank."
        : p.fsdp != FsdpMode::Off
            ? "Fine-tuning under FSDP (use_orig_params=True): each block's frozen and trainable parameters share one "
              "FlatParameter, a block with a trainable parameter gets a gradient for all of it and a wholly frozen unit "
              "none; optimizer states are those of the trainable parts in rank 0's shard (another rank's share of the "
              "adapters can differ by a few tensors); 4-bit statistics stay whole on every rank."
        : p.zeroStage == 3
            ? "Fine-tuning under ZeRO-3: every parameter, frozen or 4-bit, is partitioned and gathered per block; the "
              "fp32 partition, gradients and optimizer states cover the trainable parameters only; 4-bit statistics "
              "stay whole on every rank."
            : "Fine-tuning on many GPUs: frozen and quantized weights are replicated whole on every rank; only the "
              "trainable parameters have gradients, reducer buckets or ZeRO partitions.");
  }
  if (rank.engine == ShardingEngine::Zero && p.zeroStage == 3 && rank.shardWorld > 1) {
    // docs/parallel.md, "Gathered parameters": DeepSpeed's coordinator by step.
    notes.push_back("ZeRO-3: the first step records DeepSpeed's trace of sub-modules and prefetches nothing; from the "
                    "second forward on, blocks are prefetched within stage3_prefetch_bucket_size (" +
                    std::to_string(p.stage3PrefetchBucketSize) + ") and what is used again within "
                    "stage3_max_reuse_distance (" + std::to_string(p.stage3MaxReuseDistance) +
                    " elements) stays gathered from forward to backward; parameters are gathered a block at a time "
                    "where DeepSpeed fetches each sub-module.");
  }
  // The device figure's communication line (device/overheads.cpp NcclCommunicatorsOf).
  notes.push_back("NCCL's communicator buffers are counted outside PyTorch's allocator, per communicator of more than "
                  "one rank (runtime.ncclBuffersMiB replaces the estimate with a measured figure).");
  return notes;
}

namespace {
std::vector<std::int64_t> StorageElementsOf(const Inventory& inventory) {
  std::vector<std::int64_t> out;
  for (const Tensor& t : inventory.parameters) out.push_back(StorageElements(t));
  return out;
}
}  // namespace

ModelStates ParallelModelStates(const Setup& setup, const Inventory& inventory) {
  ModelStates m;
  const Regime regime = RegimeOf(setup.training.precision);
  const ShardPlan plan = PlanShards(setup, inventory);
  const Regime optimizer = OptimizerRegimeOf(plan, regime);
  const std::int64_t d = plan.shardWorld;
  const std::string per = " (1/" + std::to_string(d) + ")";
  m.parameterCount = inventory.ParameterCount();
  const std::int64_t trainable = inventory.TrainableCount();
  auto count = [](std::int64_t n, DType t) { return FormatCount(n) + " × " + BytesOf(t); };
  std::string params, master, grads;
  switch (plan.engine) {
    case ShardingEngine::None:
    case ShardingEngine::DDP:
    case ShardingEngine::Zero: {
      std::int64_t held = 0;
      for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
        const std::int64_t n = plan.parameterElementsHeld[i];
        held += n;
        // Whole parameters as on one GPU (their own dtype or bitsandbytes layout), partitions
        // in the regime's dtype (ZeRO-3).
        m.parametersBytes += HeldBytes(inventory.parameters[i], n, regime.weights);
      }
      params = FinetuneActive(setup.finetune) && plan.parameterElementsHeld == StorageElementsOf(inventory)
                   ? FinetuneParameterFormula(setup, inventory) + " (whole on every rank)"
                   : count(held, regime.weights) + (held != m.parameterCount ? " (ZeRO-3 partitions" + per + " and persistent parameters)" : "");
      if (plan.engine == ShardingEngine::Zero && DeepSpeedZeroOneTwo(setup) && plan.paddedFlatElements > plan.flatElements) {
        // The trainable parameters live in DeepSpeed's bit16 flat, padded to a multiple of 2 × dp
        // (ParallelStep::FlattenZeroGroup): the pad is held too.
        std::int64_t trainableBytes = 0;
        for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
          if (inventory.parameters[i].trainable) trainableBytes += HeldBytes(inventory.parameters[i], plan.parameterElementsHeld[i], regime.weights);
        }
        const std::int64_t pad = plan.paddedFlatElements - plan.flatElements;
        m.parametersBytes += pad * (trainableBytes / plan.flatElements);
        params += " + " + FormatCount(pad) + " elements of the flat's alignment pad";
      }
      if (plan.engine == ShardingEngine::Zero) {
        // ZeRO-3 with fp32 weights steps the parameters' own flat (CreateZero3Fp32Partitions).
        const bool ownFlat = plan.zeroStage == 3 && regime.weights == DType::FP32;
        m.masterWeightsBytes = plan.offloadOptimizer || ownFlat ? 0 : plan.partitionElements * 4;
        master = plan.offloadOptimizer ? "offloaded to the host"
                 : ownFlat             ? "none: the fp32 partitions are the parameters' flat (lp_param_buffer)"
                                       : count(plan.partitionElements, DType::FP32) + " flat partition" + per;
        const bool partitioned = plan.zeroStage >= 2;
        const std::int64_t n = partitioned ? (plan.offloadOptimizer ? 0 : plan.partitionElements) : trainable;
        m.gradientsBytes = n * BytesPerElement(regime.gradients);
        grads = count(n, regime.gradients) + (partitioned ? " gradient partition" + per : "");
        if (setup.parallel.gradReduceInFp32) {  // Megatron's whole fp32 buffer (parallel_fidelity.hpp)
          const std::int64_t buffer = MegatronGradBufferElements(inventory, plan.shardWorld, true);
          m.gradientsBytes = buffer * 4;
          grads = count(buffer, DType::FP32) + " Megatron gradient buffer (whole model, padded)";
        }
      } else {
        // Per tensor, as the trace allocates them: fp32 adapters keep their own gradients and
        // no master copy (finetune.hpp); without fine-tuning N × the regime's bytes.
        std::int64_t masterElements = 0, gradientBytes = 0;
        for (const Tensor& t : inventory.parameters) {
          if (!t.trainable) continue;
          if (HasMasterCopy(t, regime.masterWeights)) masterElements += t.Elements();
          gradientBytes += t.Elements() * BytesPerElement(GradientTypeOf(t, regime.gradients));
        }
        m.masterWeightsBytes = masterElements * 4;
        master = count(masterElements, DType::FP32);
        std::int64_t buckets = 0, bucketBytes = 0;
        for (std::size_t k = 0; k < plan.ddpBucketElements.size(); ++k) {
          buckets += plan.ddpBucketElements[k];
          bucketBytes += plan.ddpBucketElements[k] * BytesPerElement(plan.ddpBucketTypes[k]);
        }
        const bool views = setup.parallel.gradientAsBucketView && plan.engine == ShardingEngine::DDP;
        const std::int64_t n = (views ? 0 : trainable) + buckets;
        m.gradientsBytes = (views ? 0 : gradientBytes) + bucketBytes;
        grads = (FinetuneActive(setup.finetune) ? FormatCount(n) + " trainable values in their own dtypes"
                                                : count(n, regime.gradients)) +
                (buckets > 0 ? " (DDP buckets " + FormatCount(buckets) +
                                   (setup.parallel.gradientAsBucketView ? ", .grad views of them)" : " + .grad)")
                             : "");
        if (setup.parallel.gradReduceInFp32) {  // Megatron's DDP: one unpadded fp32 buffer (parallel_fidelity.hpp)
          const std::int64_t buffer = MegatronGradBufferElements(inventory, plan.shardWorld, false);
          m.gradientsBytes = buffer * 4;
          grads = count(buffer, DType::FP32) + " Megatron gradient buffer (whole model)";
        }
      }
      break;
    }
    case ShardingEngine::Fsdp:
    case ShardingEngine::Fsdp2: {
      const std::int64_t shards = plan.partitionElements;
      const DType type = regime.masterWeights ? DType::FP32 : regime.weights;
      std::int64_t statistics = 0;  // 4-bit QuantState, whole on every rank
      for (const Tensor& t : inventory.parameters) statistics += OnDeviceStatisticsBytes(t, plan, regime.weights);
      m.parametersBytes = (plan.offloadParameters ? 0 : shards * BytesPerElement(type) + plan.quantShardBytes) + statistics;
      params = plan.offloadParameters ? "offloaded to the host" : count(shards, type) + " sharded" + per + ", padded";
      if (plan.quantShardBytes > 0 && !plan.offloadParameters) {
        // FSDP2 with torchao NF4Tensor weights: their shards, and scaler_mean + nf4 whole (statistics).
        params += " + " + FormatCount(plan.quantShardBytes) + " B NF4Tensor shards + " + FormatCount(statistics) +
                  " B scaler means and tables (whole)";
      }
      m.masterWeightsBytes = 0;
      master = "the fp32 shards are the parameters";
      // Units with no trainable parameter get no gradient (FSDP with frozen parameters); FSDP2:
      // the trainable parameters' shards only (all of them without fine-tuning).
      const std::int64_t gradShards = plan.gradientShardElements;
      m.gradientsBytes = plan.offloadOptimizer ? 0 : gradShards * BytesPerElement(optimizer.gradients);
      grads = plan.offloadOptimizer ? "offloaded to the host" : count(gradShards, optimizer.gradients) + " sharded" + per;
      break;
    }
  }
  std::int64_t values = 0;
  if (!plan.offloadOptimizer || plan.engine == ShardingEngine::None || plan.engine == ShardingEngine::DDP) {
    // The parameters themselves for DDP; FSDP with frozen parameters: the trainable parts.
    const Inventory& seen = UsesTrainableParts(setup, plan) ? plan.trainableShardParts : plan.optimizerTensors;
    for (const Tensor& t : seen.parameters) {
      for (const StateTensor& s : OptimizerStateTensors(setup.training, optimizer, t)) {
        m.optimizerStatesBytes += s.elements * BytesPerElement(s.type);
        values += s.elements;
      }
    }
  }
  m.totalBytes = m.parametersBytes + m.masterWeightsBytes + m.gradientsBytes + m.optimizerStatesBytes;
  m.rows.push_back({Category::Parameters, m.parametersBytes, params});
  m.rows.push_back({Category::MasterWeights, m.masterWeightsBytes, master});
  m.rows.push_back({Category::Gradients, m.gradientsBytes, grads});
  m.rows.push_back({Category::OptimizerStates, m.optimizerStatesBytes,
                    plan.offloadOptimizer ? "offloaded to the host"
                                          : FormatCount(values) + " values on this rank" +
                                                (setup.parallel.zeroRedundancyOptimizer ? " (its ZeroRedundancyOptimizer share)"
                                                 : plan.engine == ShardingEngine::None || plan.engine == ShardingEngine::DDP ? "" : per)});
  return m;
}

}  // namespace gpumem
