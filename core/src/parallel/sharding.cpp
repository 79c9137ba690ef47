// Which rank is simulated, the tensor-parallel rank's model, and how one data-parallel rank
// holds the model states (docs/parallel.md).
#include <algorithm>
#include <vector>
#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/names.hpp"
#include "gpumem/parallel.hpp"
#include "parallel/expert_split.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

ShardingEngine EngineOf(const ParallelDef& p) {
  if (p.zeroStage > 0) return ShardingEngine::Zero;
  if (p.fsdp == FsdpMode::FullyShard) return ShardingEngine::Fsdp2;
  if (p.fsdp != FsdpMode::Off) return ShardingEngine::Fsdp;
  return p.dataParallel * p.contextParallel > 1 ? ShardingEngine::DDP : ShardingEngine::None;
}

std::int64_t ShardWorldOf(const ParallelDef& p) {
  switch (EngineOf(p)) {
    case ShardingEngine::None:
    case ShardingEngine::DDP: return 1;
    // Context-parallel ranks see other tokens of the same samples: their gradients are reduced,
    // and Megatron's distributed optimizer shards, over dp × cp
    // (parallel_state.get_data_parallel_group(with_context_parallel=True)); torchtitan's FSDP
    // shards over its dp_shard_cp mesh likewise.
    case ShardingEngine::Zero:
    case ShardingEngine::Fsdp2: return p.dataParallel * p.contextParallel;
    case ShardingEngine::Fsdp:
      return p.fsdp == FsdpMode::HybridShard ? std::min(p.fsdpShardGroupSize, p.dataParallel * p.contextParallel)
                                             : p.dataParallel * p.contextParallel;
  }
  return 1;
}

// FSDP with use_orig_params=True (what PEFT and accelerate require for LoRA: without it
// _flat_param.py _validate_tensors_to_flatten refuses "FlatParameter requires uniform
// requires_grad"): a unit's frozen and trainable parameters share one FlatParameter. Its
// requires_grad is that of any of them, so a unit with a trainable parameter gets a gradient for
// the whole FlatParameter (the parameters are views into it and autograd accumulates into the
// flat tensor: frozen parts receive zeros), reduce-scattered to a whole shard; a wholly frozen
// unit gets none. torch.optim sees the original parameters as views into the rank's shard
// (_use_sharded_views), so its states cover the trainable parameters' parts inside the shard.
// The FlatParameter lists the unit's parameters in module order (the inventory's order); rank 0
// holds elements [0, ⌈n / world⌉).
void PlanFsdpTrainableParts(const Inventory& inventory, ShardPlan& plan) {
  const std::int64_t d = plan.shardWorld;
  const std::size_t units = 1 + plan.unitElements.size();
  std::vector<std::int64_t> offset(units, 0);
  std::vector<bool> trains(units, false);
  for (const Tensor& t : inventory.parameters) {
    const std::size_t u = t.layer < 0 ? 0 : static_cast<std::size_t>(t.layer) + 1;
    const std::int64_t n = StorageElements(t);
    const std::int64_t unitElements = u == 0 ? plan.rootUnitElements : plan.unitElements[u - 1];
    const std::int64_t shardEnd = CeilDiv(unitElements, d);
    if (t.trainable) {
      trains[u] = true;
      const std::int64_t inside = std::max<std::int64_t>(0, std::min(offset[u] + n, shardEnd) - offset[u]);
      if (inside > 0) {
        Tensor part;
        part.name = t.name + " (part in rank 0's shard)";
        part.shape = {inside};
        part.layer = t.layer;
        plan.trainableShardParts.parameters.push_back(part);
      }
    }
    offset[u] += n;
  }
  for (std::size_t u = 0; u < units; ++u) {
    const std::int64_t unitElements = u == 0 ? plan.rootUnitElements : plan.unitElements[u - 1];
    if (trains[u] && unitElements > 0) plan.gradientShardElements += CeilDiv(unitElements, d);
  }
}

// FSDP with PEFT's fsdp_auto_wrap_policy (parallel.fsdpWrapAdaptersApart): peft/utils/other.py
// fsdp_auto_wrap_policy's lambda_policy_fn wraps every leaf module whose weight requires grad (the
// lora_A / lora_B nn.Linear) beside transformer_auto_wrap_policy over the decoder layer
// (torch/distributed/fsdp/wrap.py _or_policy). FSDP wraps bottom-up, so each adapter gets a
// FlatParameter of its own, padded to a multiple of the world (_flat_param.py _get_shard: chunk,
// then pad: ⌈n / world⌉ on every rank), and the block's FlatParameter keeps what is left: frozen
// weights only, flat_param.requires_grad False, no gradient. With use_orig_params=False
// torch.optim sees the adapters' FlatParameters, each rank its padded shard.
void PlanFsdpAdapterUnits(const Inventory& inventory, ShardPlan& plan) {
  const std::int64_t d = plan.shardWorld;
  for (const Tensor& t : inventory.parameters) {
    if (!t.trainable) continue;
    Tensor part;
    part.name = t.name + " FlatParameter shard";
    part.shape = {CeilDiv(StorageElements(t), d)};
    part.layer = t.layer;
    plan.trainableShardParts.parameters.push_back(part);
    plan.gradientShardElements += part.shape[0];
  }
}

}  // namespace

ZeroRedundancyAssignment AssignZeroRedundancy(const Inventory& inventory, std::int64_t world) {
  ZeroRedundancyAssignment a;
  const std::size_t n = inventory.parameters.size();
  a.rankOf.assign(n, -1);
  a.elementsPerRank.assign(static_cast<std::size_t>(world), 0);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i) if (inventory.parameters[i].trainable) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return inventory.parameters[x].Elements() > inventory.parameters[y].Elements();
  });
  for (std::size_t i : order) {
    const auto least = std::min_element(a.elementsPerRank.begin(), a.elementsPerRank.end());
    a.rankOf[i] = static_cast<int>(least - a.elementsPerRank.begin());
    *least += inventory.parameters[i].Elements();
  }
  a.heaviestRank = std::max_element(a.elementsPerRank.begin(), a.elementsPerRank.end()) - a.elementsPerRank.begin();
  return a;
}

bool DeepSpeedZeroOneTwo(const Setup& setup) {
  const ParallelDef& p = setup.parallel;
  return setup.model.kind != ModelKind::ParameterCount && (p.zeroStage == 1 || p.zeroStage == 2) && p.tensorParallel == 1 && p.pipelineParallel == 1 && p.contextParallel == 1 &&
         p.expertParallel == 1 && !p.gradReduceInFp32;
}

SimulatedRank SimulatedRankOf(const Setup& setup) {
  const ParallelDef& p = setup.parallel;
  SimulatedRank r;
  r.worldSize = WorldSize(p);
  r.engine = EngineOf(p);
  r.shardWorld = ShardWorldOf(p);
  switch (r.engine) {
    case ShardingEngine::None: r.engineLabel = "one data-parallel rank"; break;
    case ShardingEngine::DDP: r.engineLabel = "DDP"; break;
    case ShardingEngine::Zero: r.engineLabel = "DeepSpeed ZeRO-" + std::to_string(p.zeroStage); break;
    case ShardingEngine::Fsdp: r.engineLabel = std::string(LabelOf(p.fsdp)); break;
    case ShardingEngine::Fsdp2:
      r.engineLabel = std::string("FSDP2 fully_shard(reshard_after_forward=") + (p.reshardAfterForward ? "True" : "False") + ")";
      break;
  }
  if (p.offload != OffloadKind::None) r.engineLabel += std::string(", offload: ") + LabelOf(p.offload);
  // Where each state lives, by the same rules as ParallelModelStates (parallel_step.cpp) and
  // docs/parallel.md's engine table: ZeRO stage s shards the fp32 master and the optimizer states
  // (s ≥ 1), the gradients (s ≥ 2) and the parameters (s = 3) (the ZeRO paper §5; DeepSpeed
  // stage_1_and_2.py / stage3.py); FSDP and FSDP2 shard parameters, gradients and states and keep
  // no separate master (the fp32 shards are the parameters: torch/distributed/fsdp/_flat_param.py);
  // offload_optimizer / CPUOffload put the master, the states and the gradient partition on the
  // host, offload_param the parameter shards too; ZeroRedundancyOptimizer shards only the states.
  const bool hostStates = p.offload != OffloadKind::None;
  const bool hostParameters = p.offload == OffloadKind::OptimizerAndParameters;
  const char* sharded = "sharded";
  switch (r.engine) {
    case ShardingEngine::None:
    case ShardingEngine::DDP:
      if (p.zeroRedundancyOptimizer && r.engine == ShardingEngine::DDP) r.optimizerStatesHeld = sharded;
      break;
    case ShardingEngine::Zero:
      r.masterWeightsHeld = hostStates ? "host" : sharded;
      r.optimizerStatesHeld = hostStates ? "host" : sharded;
      if (p.zeroStage >= 2) r.gradientsHeld = hostStates ? "host" : sharded;
      if (p.zeroStage >= 3) r.parametersHeld = hostParameters ? "host" : sharded;
      break;
    case ShardingEngine::Fsdp:
    case ShardingEngine::Fsdp2:
      r.parametersHeld = hostParameters ? "host" : sharded;
      r.masterWeightsHeld = "none";
      r.gradientsHeld = hostStates ? "host" : sharded;
      r.optimizerStatesHeld = hostStates ? "host" : sharded;
      break;
  }
  // Rank 0 of every group: data-parallel ranks hold equal shards (the flat buffers are padded so
  // that every partition has the same size), tensor-parallel ranks equal slices (the sizes must
  // divide evenly), so the first rank is as loaded as any.
  r.why = "data-parallel rank 0, tensor-parallel rank 0: every data-parallel rank holds a partition of the same "
          "(padded) size and every tensor-parallel rank a slice of the same size, so rank 0 is as loaded as any";
  if (p.pipelineParallel > 1) {
    // The stage PipelineStageSetup simulates (parallel/pipeline.cpp); −1 is resolved by
    // EstimateHigherPipelineStage, which puts its reason in front of this one.
    r.pipelineStage = std::max<std::int64_t>(0, p.pipelineStage);
    if (p.pipelineStage >= 0) {
      r.why = "pipeline stage " + std::to_string(p.pipelineStage) + " of " + std::to_string(p.pipelineParallel) + "; " + r.why;
    }
  }
  if (p.contextParallel > 1) {
    // Transformer Engine's causal ring attention (AttnFuncWithCPAndKVP2P): context-parallel rank
    // i computes its whole q against every k/v chunk only for steps ≤ i, so the last rank keeps
    // a full-size out_per_step at every step and in backward a full-size dq_ per step.
    r.why += "; context-parallel rank " + std::to_string(p.contextParallel - 1) +
             " (the last): its ring attention runs every step on its whole query, the most per-step memory";
  }
  if (p.expertParallel > 1) {
    // Every expert-parallel rank holds E/e experts and, with balanced routing, receives T·k rows.
    r.why += "; expert-parallel rank 0 holds experts 0 to " +
             std::to_string(setup.model.architecture.numExperts / p.expertParallel - 1) +
             " of each block, and every expert-parallel rank as many experts and (routing balanced) as many tokens";
    if (ExpertTensorParallelOf(p) > 1) {
      r.why += "; expert-tensor-parallel rank 0 holds 1/" + std::to_string(ExpertTensorParallelOf(p)) +
               " of each of its experts' widths, as every expert-tensor-parallel rank";
    }
  }
  if (DeepSpeedZeroOneTwo(setup) && p.zeroStage == 2 && r.shardWorld > 1) {
    // stage_1_and_2.py partitions the flat of the trainable parameters in order, so the last
    // rank holds the head and the last blocks, whose gradients backward makes first: its
    // grads_in_partition is made at the first bucket reduction (copy_grads_in_partition) and,
    // with cpu_offload, its gradient transients come while the activations are still held.
    r.dataParallelRank = r.shardWorld - 1;
    r.why = "data-parallel rank " + std::to_string(r.shardWorld - 1) + " (the last): ZeRO-2 gives it the end of the "
            "flattened parameters, whose gradients come first in backward, so its gradient partition is made at the "
            "first bucket reduction; every partition has the same (padded) size";
  }
  if (p.zeroRedundancyOptimizer && r.engine == ShardingEngine::DDP) {
    r.engineLabel = "DDP + ZeroRedundancyOptimizer";
    const ZeroRedundancyAssignment a = AssignZeroRedundancy(BuildInventory(TensorParallelRankSetup(setup)), p.dataParallel);
    r.dataParallelRank = a.heaviestRank;
    r.why = "data-parallel rank " + std::to_string(a.heaviestRank) + ": ZeroRedundancyOptimizer gives whole parameters to "
            "ranks, and this one holds the most elements (" + std::to_string(a.elementsPerRank[static_cast<std::size_t>(a.heaviestRank)]) +
            "), so the most optimizer state";
  }
  return r;
}

namespace {

Setup TensorSlices(const Setup& setup) {
  const std::int64_t t = setup.parallel.tensorParallel;
  // Each expert's MLP is split over the expert tensor parallel ranks (etp, t unless set):
  // ColumnParallelLinear fc1 / RowParallelLinear fc2 over the expert tensor parallel group
  // (megatron/core/transformer/moe/experts.py; parallel_state's expt_tp group).
  const std::int64_t etp = ExpertTensorParallelOf(setup.parallel);
  if ((t <= 1 && etp <= 1) || setup.model.kind != ModelKind::Transformer) return setup;
  Setup rank = setup;
  ArchitectureDef& a = rank.model.architecture;
  const ArchitectureDef& full = setup.model.architecture;
  if (full.numExperts > 0 && etp > 1) a.expertIntermediateSize = ExpertIntermediateSize(full) / etp;
  if (t <= 1) return rank;
  // The head width must not change with the head count (HeadDim derives it from hidden/heads).
  a.headDim = HeadDim(full);
  a.numHeads = full.numHeads / t;                  // ColumnParallelLinear over q (and k, v)
  a.numKeyValueHeads = KeyValueHeads(full) / t;
  a.intermediateSize = IntermediateSize(full) / t;  // ColumnParallelLinear fc1 / RowParallelLinear fc2
  a.sharedExpertIntermediateSize = full.sharedExpertIntermediateSize / t;
  // VocabParallelEmbedding: each rank a contiguous 1/t of the (padded) vocabulary; Megatron pads
  // the vocabulary to a multiple of make-vocab-size-divisible-by (128) × t
  // (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding).
  a.vocabSize = CeilDiv(full.vocabSize, 128 * t) * 128;
  return rank;
}

}  // namespace

Setup TensorParallelRankSetup(const Setup& setup) {
  Setup rank = TensorSlices(setup);
  // Context parallelism: the rank holds s/c tokens of every sequence (validation requires 2c to
  // divide s: Transformer Engine's load-balanced split in two chunks per rank).
  if (setup.parallel.contextParallel > 1) rank.training.sequenceLength /= setup.parallel.contextParallel;
  return rank;
}

namespace {

// DDP (and one GPU): whole parameters, the reducer's buckets; ZeroRedundancyOptimizer's rank.
void PlanDdp(const Setup& setup, const Inventory& inventory, ShardPlan& plan) {
  const ParallelDef& p = setup.parallel;
  const std::size_t n = inventory.parameters.size();
  plan.optimizerTensors = inventory;
  // Megatron's DDP (gradReduceInFp32) has no reducer buckets: its one gradient buffer is made
  // by parallel_step.cpp (distributed_data_parallel.py, param_and_grad_buffer.py).
  if (plan.engine == ShardingEngine::DDP && !p.gradReduceInFp32) {
    // torch/nn/parallel/distributed.py: _compute_bucket_assignment_by_size over the
    // parameters in reverse order with limits [dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB),
    // bucket_cap_mb × 2^20]; a bucket closes once its bytes reach its limit
    // (torch/csrc/distributed/c10d/reducer.cpp compute_bucket_assignment_by_size).
    // Only parameters with requires_grad reach the reducer (distributed.py
    // _build_params_for_reducer keeps `param.requires_grad`), so frozen and quantized base
    // weights have no bucket; and tensors of different dtypes never share one (reducer.cpp
    // compute_bucket_assignment_by_size keys its open buckets by BucketKey(dtype, device),
    // each key with its own walk through the limits), e.g. fp32 adapters beside bf16 norms.
    const DType regimeGradients = RegimeOf(setup.training.precision).gradients;
    const std::int64_t firstLimit = 1 << 20;
    const auto capLimit = static_cast<std::int64_t>(p.bucketCapMB * 1048576.0);
    struct OpenBucket { DType type; std::int64_t limit; std::int64_t elements; };
    std::vector<OpenBucket> open;
    for (std::size_t i = n; i-- > 0;) {
      const Tensor& t = inventory.parameters[i];
      if (!t.trainable) continue;
      const DType type = GradientTypeOf(t, regimeGradients);
      auto it = std::find_if(open.begin(), open.end(), [&](const OpenBucket& o) { return o.type == type; });
      if (it == open.end()) it = open.insert(open.end(), OpenBucket{type, firstLimit, 0});
      it->elements += t.Elements();
      if (it->elements * BytesPerElement(type) >= it->limit) {
        plan.ddpBucketElements.push_back(it->elements);
        plan.ddpBucketTypes.push_back(type);
        it->elements = 0;
        it->limit = capLimit;
      }
    }
    for (const OpenBucket& o : open) {
      if (o.elements == 0) continue;
      plan.ddpBucketElements.push_back(o.elements);
      plan.ddpBucketTypes.push_back(o.type);
    }
    if (p.zeroRedundancyOptimizer) {
      // The local optimizer of the heaviest rank sees only its parameters.
      const ZeroRedundancyAssignment a = AssignZeroRedundancy(inventory, p.dataParallel);
      plan.optimizerTensors.parameters.clear();
      for (std::size_t i = 0; i < n; ++i) {
        if (a.rankOf[i] == a.heaviestRank) plan.optimizerTensors.parameters.push_back(inventory.parameters[i]);
      }
    }
  }
}

// DeepSpeed ZeRO 1–3: the flat (or per-parameter) partitions, ZeRO-3's sub-groups, the reduce bucket.
void PlanZero(const Setup& setup, const Inventory& inventory, ShardPlan& plan) {
  const ParallelDef& p = setup.parallel;
  const std::int64_t d = plan.shardWorld;
  const std::size_t n = inventory.parameters.size();
  if (plan.zeroStage <= 2 && (p.expertParallel > 1 || ExpertTensorParallelOf(p) != p.tensorParallel)) {
    // Expert parallelism: the experts' parameters are their own group, sharded over the
    // expert-data-parallel ranks (dp·cp / e) and the rest over dp·cp, each flattened and
    // padded on its own (DeepSpeed's MoE param groups, stage_1_and_2.py
    // real_dp_process_group; Megatron's distributed optimizer per expert_data_parallel_group).
    // Expert data parallel: dp·cp·t / (etp·e) (ExpertDataParallelOf; d / e when etp = t).
    const std::int64_t de = d * p.tensorParallel / (ExpertTensorParallelOf(p) * p.expertParallel);
    std::int64_t expertElements = 0;
    for (const Tensor& t : inventory.parameters) {
      if (t.trainable && expert_split::IsExpertTensor(t)) expertElements += t.Elements();
    }
    const std::int64_t dense = CeilDiv(plan.flatElements - expertElements, 2 * d) * 2 * d;
    const std::int64_t expert = CeilDiv(expertElements, 2 * de) * 2 * de;
    plan.paddedFlatElements = dense + expert;
    plan.partitionElements = dense / d + expert / de;
  } else if (plan.zeroStage <= 2) {
    // stage_1_and_2.py: flatten_dense_tensors_aligned(group, nccl_start_alignment_factor (2) × dp)
    // over bit16_groups, which hold only parameters with requires_grad (DeepSpeedZeroOptimizer
    // __init__: trainable_parameters): frozen and quantized weights stay whole, outside it.
    plan.paddedFlatElements = CeilDiv(plan.flatElements, 2 * d) * 2 * d;
    plan.partitionElements = plan.paddedFlatElements / d;
  } else {
    // partition_parameters.py _partition_param: each parameter padded to a multiple of the
    // world (_padding_size) and split, ds_tensor = ⌈n / dp⌉; the fp32 partition is the flat
    // of this rank's ds_tensors (stage3.py _create_fp32_partitions).
    // Frozen parameters are partitioned too (zero.Init / _convert_to_zero_parameters take
    // every module parameter), but only trainable ones enter the fp32 partition (stage3.py
    // _get_trainable_parameter_groups keeps `p.requires_grad`). A 4-bit weight is partitioned
    // as its packed codes in the quant storage type (bnb_4bit_quant_storage = the weights'
    // dtype, which validation requires); its QuantState statistics stay whole.
    for (std::size_t i = 0; i < n; ++i) {
      const Tensor& t = inventory.parameters[i];
      const std::int64_t elements = StorageElements(t);
      const std::int64_t shard = CeilDiv(elements, d);
      if (t.trainable) plan.partitionElements += shard;
      plan.paddedFlatElements += shard * d;
      // stage3_param_persistence_threshold: small parameters stay whole on every rank
      // (parameter_offload.py persistent_parameters) besides their partition. Over one rank
      // the partition is the whole parameter and fetching it makes no copy (ZeroParamGather1Rank
      // in parallel_step.cpp): param.data is a view of it, persistent or not.
      const bool persistentCopy = elements < p.stage3ParamPersistenceThreshold && d > 1;
      plan.parameterElementsHeld[i] = plan.offloadParameters ? 0 : (persistentCopy ? elements + shard : shard);
    }
  }
  Tensor flat;
  flat.name = "fp32 flat partition";
  flat.shape = {plan.partitionElements};
  if (plan.zeroStage == 3) {
    // stage3.py _create_fp16_sub_groups: the trainable parameters' partitions in order, a
    // sub-group closed once it holds sub_group_size elements or more (or at the last), each
    // with an fp32 flat of its own (_create_fp32_partitions) that optimizer.step() updates
    // alone (_optimizer_step). One sub-group when the partition is no larger.
    std::vector<std::int64_t> groups;
    std::int64_t open = 0;
    std::size_t last = n;
    for (std::size_t i = 0; i < n; ++i) if (inventory.parameters[i].trainable) last = i;
    for (std::size_t i = 0; i < n && plan.partitionElements > p.subGroupSize; ++i) {
      if (!inventory.parameters[i].trainable) continue;
      open += CeilDiv(StorageElements(inventory.parameters[i]), d);
      if (open >= p.subGroupSize || i == last) {
        groups.push_back(open);
        open = 0;
      }
    }
    for (std::size_t k = 0; groups.size() > 1 && k < groups.size(); ++k) {  // one is the whole flat
      Tensor sub;
      sub.name = "fp32 flat partition, sub-group " + std::to_string(k);
      sub.shape = {groups[k]};
      plan.optimizerTensors.parameters.push_back(sub);
    }
  }
  if (plan.optimizerTensors.parameters.empty()) plan.optimizerTensors.parameters.push_back(flat);
  // The contiguous-gradient reduce bucket (ipg_buffer): reduce_bucket_size elements, two
  // with overlap_comm (stage_1_and_2.py backward(); stage3.py __ipg_bucket_flat_buffer,
  // one buffer).
  const bool overlap = p.overlapComm == OverlapComm::On || (p.overlapComm == OverlapComm::Default && plan.zeroStage == 3);
  if (plan.zeroStage >= 2 && p.contiguousGradients) {
    plan.reduceBucketElements = p.reduceBucketSize;
    plan.reduceBuckets = plan.zeroStage == 2 && overlap ? 2 : 1;
  } else if (plan.zeroStage == 1) {
    // buffered_reduce_fallback flattens at most reduce_bucket_size elements at a time.
    plan.reduceBucketElements = std::min(p.reduceBucketSize, plan.flatElements);
    plan.reduceBuckets = 1;
  }
}

// FSDP1: one FlatParameter per unit (and per adapter with fsdpWrapAdaptersApart).
void PlanFsdp(const Setup& setup, const Inventory& inventory, ShardPlan& plan) {
  const ParallelDef& p = setup.parallel;
  const std::int64_t d = plan.shardWorld;
  // torch/distributed/fsdp/_flat_param.py: one FlatParameter per unit, padded to a multiple
  // of the world (_get_shard: chunk, then pad) so every rank holds ⌈numel / world⌉.
  auto unit = [&](std::int64_t elements, int layer, std::string name) {
    Tensor shard;
    shard.name = std::move(name);
    shard.shape = {CeilDiv(elements, d)};
    shard.layer = layer;
    plan.optimizerTensors.parameters.push_back(shard);
    plan.partitionElements += shard.shape[0];
    plan.paddedFlatElements += shard.shape[0] * d;
  };
  plan.adaptersApart = p.fsdpWrapAdaptersApart;
  if (plan.adaptersApart) {
    // The adapters leave their block's (or the root's) FlatParameter for units of their own.
    for (const Tensor& t : inventory.parameters) {
      if (!t.trainable) continue;
      (t.layer < 0 ? plan.rootUnitElements : plan.unitElements[static_cast<std::size_t>(t.layer)]) -= StorageElements(t);
    }
  }
  // Each adapter unit of `layer` (-1 = the root's), after its parent's unit.
  auto adapters = [&](int layer) {
    if (!plan.adaptersApart) return;
    for (const Tensor& t : inventory.parameters) {
      if (t.trainable && t.layer == layer) unit(StorageElements(t), layer, t.name + " FlatParameter shard");
    }
  };
  if (plan.rootUnitElements > 0) unit(plan.rootUnitElements, -1, "root FlatParameter shard");
  adapters(-1);
  for (std::size_t l = 0; l < plan.unitElements.size(); ++l) {
    if (plan.unitElements[l] > 0) unit(plan.unitElements[l], static_cast<int>(l), "layers." + std::to_string(l) + " FlatParameter shard");
    adapters(static_cast<int>(l));
  }
  std::fill(plan.parameterElementsHeld.begin(), plan.parameterElementsHeld.end(), 0);
  if (plan.adaptersApart) PlanFsdpAdapterUnits(inventory, plan);
  else PlanFsdpTrainableParts(inventory, plan);
}

// FSDP2 fully_shard: each parameter its own dim-0 shard.
void PlanFsdp2(const Inventory& inventory, ShardPlan& plan) {
  const std::int64_t d = plan.shardWorld;
  const std::size_t n = inventory.parameters.size();
  // torch/distributed/fsdp/_fully_shard/_fsdp_param.py: each parameter chunked on dim 0
  // and padded to the first chunk's size (padded_sharded_param_size). Frozen parameters are
  // FSDPParams too (fully_shard shards every parameter of the module, requires_grad or not:
  // FSDPParam._init_sharded_param keeps requires_grad on the sharded DTensor), so every rank
  // holds its shard of the frozen base; only the trainable ones get a gradient shard
  // (_fsdp_param_group.py post_backward: fsdp_params_with_grad) and optimizer states.
  for (std::size_t i = 0; i < n; ++i) {
    const Tensor& t = inventory.parameters[i];
    Tensor shard = t;
    shard.name = t.name + " (shard)";
    plan.parameterElementsHeld[i] = 0;
    if (t.storage == Tensor::Storage::TorchaoNF4) {
      // torchao nf4_split (what torch.chunk in _init_sharded_param dispatches to): each of
      // quantized_scalers, quantization_factor and quantized_data cut into `world` equal
      // parts (validation requires an even split, so no padding); scaler_mean and the nf4
      // table are shared by every chunk (construct_nf4_args keeps them), whole on every rank.
      // Frozen: no gradient or state. Held as bytes.
      shard.shape = {StorageElements(t) / d};
      plan.optimizerTensors.parameters.push_back(shard);
      plan.quantShardBytes += shard.shape[0];
      continue;
    }
    if (!shard.shape.empty()) shard.shape[0] = CeilDiv(shard.shape[0], d);
    plan.optimizerTensors.parameters.push_back(shard);
    plan.partitionElements += shard.Elements();
    if (t.trainable) {
      plan.gradientShardElements += shard.Elements();
      plan.trainableShardParts.parameters.push_back(shard);
    }
    plan.paddedFlatElements += shard.Elements() * d;
  }
}

}  // namespace

ShardPlan PlanShards(const Setup& setup, const Inventory& inventory) {
  const ParallelDef& p = setup.parallel;
  ShardPlan plan;
  plan.engine = EngineOf(p);
  plan.zeroStage = static_cast<int>(p.zeroStage);
  plan.shardWorld = ShardWorldOf(p);
  plan.offloadOptimizer = p.offload != OffloadKind::None;
  plan.offloadParameters = p.offload == OffloadKind::OptimizerAndParameters;
  const std::size_t n = inventory.parameters.size();
  plan.parameterElementsHeld.resize(n);
  // In the elements torch holds (a 4-bit weight's packed codes in its quant storage type).
  for (std::size_t i = 0; i < n; ++i) plan.parameterElementsHeld[i] = StorageElements(inventory.parameters[i]);

  // Wrap units: one per transformer block, the rest in the root (transformer_auto_wrap_policy
  // over the decoder layer class, as accelerate and HF Trainer configure FSDP).
  // In the elements torch flattens (a 4-bit weight's packed codes in its quant storage type).
  for (const Tensor& t : inventory.parameters) {
    if (t.layer < 0) { plan.rootUnitElements += StorageElements(t); continue; }
    if (plan.unitElements.size() <= static_cast<std::size_t>(t.layer)) plan.unitElements.resize(static_cast<std::size_t>(t.layer) + 1, 0);
    plan.unitElements[static_cast<std::size_t>(t.layer)] += StorageElements(t);
  }

  for (const Tensor& t : inventory.parameters) if (t.trainable) plan.flatElements += t.Elements();

  switch (plan.engine) {
    case ShardingEngine::None:
    case ShardingEngine::DDP: PlanDdp(setup, inventory, plan); break;
    case ShardingEngine::Zero: PlanZero(setup, inventory, plan); break;
    case ShardingEngine::Fsdp: PlanFsdp(setup, inventory, plan); break;
    case ShardingEngine::Fsdp2: PlanFsdp2(inventory, plan); break;
  }
  return plan;
}

}  // namespace gpumem
