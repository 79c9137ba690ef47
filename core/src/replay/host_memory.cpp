// Host (CPU) memory of the simulated rank. Every row is a size the GPU side of the estimate has
// moved off the GPU (the rank's ShardPlan, core/src/parallel/sharding.cpp PlanShards) or a count
// the simulation kept (the offloaded activations' peak); nothing here is a second model of the
// step. docs/device.md "Host memory" states each rule with its source.
#include "replay/host_memory.hpp"

#include <algorithm>
#include <cmath>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/parallel.hpp"
#include "parallel/parallel_step.hpp"
#include "sim/savers.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

constexpr const char* kPinned = "pinned";
constexpr const char* kPageable = "pageable";
constexpr const char* kUnified = "unified";

std::string Times(std::int64_t elements, DType type) { return FormatCount(elements) + " × " + BytesOf(type); }

std::int64_t StateBytes(const Setup& simulated, const Regime& regime, const Inventory& tensors, std::int64_t& values) {
  std::int64_t bytes = 0;
  for (const Tensor& t : tensors.parameters) {
    for (const StateTensor& s : OptimizerStateTensors(simulated.training, regime, t)) {
      bytes += s.elements * BytesPerElement(s.type);
      values += s.elements;
    }
  }
  return bytes;
}

// stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu: with gradient accumulation each
// parameter of the rank's partition gets accumulated_grads_in_cpu[param_id] =
// torch.zeros(param.numel(), dtype=param.dtype) on the host (the whole parameter, also one that
// only starts in the partition). Rank 0's partition is [0, partition) of the flat trainable
// parameters in order.
std::int64_t AccumulatedGradElements(const Inventory& inventory, std::int64_t partitionElements) {
  std::int64_t start = 0, elements = 0;
  for (const Tensor& t : inventory.parameters) {
    if (!t.trainable) continue;
    if (start < partitionElements) elements += t.Elements();
    start += t.Elements();
  }
  return elements;
}

void ZeroRows(const Setup& simulated, const Inventory& inventory, const ShardPlan& plan, HostMemory& host) {
  const Regime regime = RegimeOf(simulated.training.precision);
  const std::int64_t n = plan.partitionElements;
  const std::string per = " (1/" + std::to_string(plan.shardWorld) + ", padded)";
  // offload_optimizer.pin_memory and offload_param.pin_memory default to False
  // (deepspeed/runtime/zero/offload_config.py); the setup has no field for them.
  host.rows.push_back({"fp32 master partition", n * 4, Times(n, DType::FP32) + per,
                       plan.zeroStage == 3 ? "DeepSpeed stage3.py _create_fp32_partitions (on the host with offload_optimizer)"
                                           : "DeepSpeed stage_1_and_2.py single_partition_of_fp32_groups (.to(self.device), the "
                                             "host with offload_optimizer)",
                       kPageable});
  std::int64_t values = 0;
  const std::int64_t states = StateBytes(simulated, OptimizerRegimeOf(plan, regime), plan.optimizerTensors, values);
  if (states > 0) {
    host.rows.push_back({"optimizer states", states, FormatCount(values) + " values on the fp32 partition = " + FormatCount(states) + " B",
                         "DeepSpeedCPUAdam (deepspeed/ops/adam/cpu_adam.py) steps the host partition; its states are "
                         "made on the host beside it",
                         kPageable});
  }
  host.rows.push_back({"fp32 gradient partition", n * 4, Times(n, DType::FP32) + per,
                       plan.zeroStage == 3 ? "DeepSpeed stage3.py initialize_optimizer_states: fp32_partitioned_groups_flat[i].grad "
                                             "on the host (sub_group_size 1e9: one buffer per sub-group)"
                                           : "DeepSpeed stage_1_and_2.py initialize_optimizer_states: "
                                             "single_partition_of_fp32_groups[i].grad = torch.zeros(partition_size, device=cpu)",
                       kPageable});
  if (plan.zeroStage == 3) {
    // stage3.py _setup_for_real_optimizer: grad_partitions_flat_buffer, Σ partition_numel of the
    // trainable parameters in gradient_accumulation_dtype (the model's 16-bit type by default), on
    // self.device = the host with offload_optimizer; __partition_grads copies each reduced
    // partition there before the fp32 copy.
    host.rows.push_back({"gradient partitions (grad_partitions_flat_buffer)", n * BytesPerElement(regime.gradients),
                         Times(n, regime.gradients) + per,
                         "DeepSpeed stage3.py _setup_for_real_optimizer grad_partitions_flat_buffer (device = host with "
                         "offload_optimizer)",
                         kPageable});
  } else if (simulated.parallel.gradientAccumulationSteps > 1 && simulated.parallel.expertParallel == 1) {
    const std::int64_t e = AccumulatedGradElements(inventory, n);
    host.rows.push_back({"accumulated gradients (accumulated_grads_in_cpu)", e * BytesPerElement(regime.weights),
                         Times(e, regime.weights) + ": every parameter that starts in the partition, whole",
                         "DeepSpeed stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu, buffer_to_accumulate_to_in_cpu",
                         kPageable});
  }
  if (plan.offloadParameters) {
    // partition_parameters.py _partition_param: ds_tensor of ⌈n / dp⌉ elements on the host
    // (remote_device cpu with offload_param); every parameter, frozen ones too.
    const std::int64_t shards = plan.paddedFlatElements / plan.shardWorld;
    host.rows.push_back({"parameter partitions", shards * BytesPerElement(regime.weights),
                         Times(shards, regime.weights) + " (⌈n / " + std::to_string(plan.shardWorld) + "⌉ per parameter)",
                         "DeepSpeed partition_parameters.py _partition_param (ds_tensor on the host with offload_param)",
                         kPageable});
  }
}

void FsdpRows(const Setup& simulated, const Inventory& inventory, const ShardPlan& plan, HostMemory& host) {
  const Regime regime = RegimeOf(simulated.training.precision);
  const Regime optimizer = OptimizerRegimeOf(plan, regime);
  const std::int64_t n = plan.partitionElements;
  // FSDP2 with frozen parameters (docs/parallel.md, "Fine-tuning on many GPUs"): every shard goes
  // to the host, but only the trainable ones have a gradient (foreach_reduce copies each reduced
  // gradient to the host) and optimizer states; torchao NF4Tensor shards go whole (codes,
  // scalers, factors, and the scaler mean and table every shard keeps).
  const bool fsdp2Finetune = plan.engine == ShardingEngine::Fsdp2 && FinetuneActive(simulated.finetune);
  const bool fsdp2 = plan.engine == ShardingEngine::Fsdp2;
  const std::string per = " (1/" + std::to_string(plan.shardWorld) + ", padded)";
  // FSDP: _flat_param.py init_flat_param_attributes pins the offloaded shard
  // (_local_shard.pin_memory()) and pre-allocates flat_param._cpu_grad pinned. FSDP2:
  // CPUOffloadPolicy(pin_memory=True) by default (_fully_shard/_fsdp_api.py), _fsdp_param.py
  // pins the sharded parameter and copies gradients to the host non-blocking into pinned memory.
  if (plan.offloadParameters && plan.quantShardBytes > 0) {
    std::int64_t metadata = 0;
    for (const Tensor& t : inventory.parameters) {
      if (t.storage == Tensor::Storage::TorchaoNF4) metadata += QuantStatisticsBytes(t, regime.weights);
    }
    host.rows.push_back({"NF4Tensor shards", plan.quantShardBytes + metadata,
                         FormatCount(plan.quantShardBytes) + " B of codes, scalers and factors (1/" +
                             std::to_string(plan.shardWorld) + ") + " + FormatCount(metadata) + " B of scaler means and tables",
                         "torch fully_shard CPUOffloadPolicy on torchao NF4Tensor shards (nf4tensor.py nf4_split, "
                         "function_to_dtype: every inner tensor moved; _fsdp_param.py pins the sharded parameter)",
                         kPinned});
  }
  if (plan.offloadParameters) {
    host.rows.push_back({"parameter shards", n * BytesPerElement(optimizer.weights), Times(n, optimizer.weights) + per,
                         fsdp2 ? "torch fully_shard CPUOffloadPolicy (_fsdp_param.py: sharded parameter pinned on the host)"
                               : "torch FSDP CPUOffload(offload_params=True): _flat_param.py init_flat_param_attributes, "
                                 "_local_shard.pin_memory()",
                         kPinned});
  }
  const std::int64_t g = fsdp2Finetune ? plan.gradientShardElements : n;
  host.rows.push_back({"gradient shards", g * BytesPerElement(optimizer.gradients),
                       Times(g, optimizer.gradients) + per + (fsdp2Finetune ? ", trainable parameters only" : ""),
                       fsdp2 ? "torch fully_shard CPUOffloadPolicy (_fsdp_collectives.py foreach_reduce: reduce-scattered gradient copied "
                               "to the host, pinned)"
                             : "torch FSDP _flat_param.py init_flat_param_attributes: flat_param._cpu_grad = "
                               "zeros_like(_local_shard).pin_memory()",
                       kPinned});
  std::int64_t values = 0;
  const std::int64_t states =
      StateBytes(simulated, optimizer, fsdp2Finetune ? plan.trainableShardParts : plan.optimizerTensors, values);
  if (states > 0) {
    host.rows.push_back({"optimizer states", states, FormatCount(values) + " values on the host shards = " + FormatCount(states) + " B",
                         "torch.optim on host parameters: states made with torch.zeros_like on the host (ordinary memory)",
                         kPageable});
  }
}

}  // namespace

std::int64_t RanksPerNode(const ParallelDef& p) {
  const std::int64_t world = WorldSize(p);
  const std::int64_t node = p.fsdp == FsdpMode::HybridShard ? p.fsdpShardGroupSize : 8;
  return std::max<std::int64_t>(1, std::min(node, world));
}

HostMemory ComputeHostMemory(const Setup& setup, const Setup& simulated, const Inventory& inventory,
                             std::int64_t offloadedActivationsPeakBytes) {
  HostMemory host;
  const bool parallel = IsParallel(setup.parallel);
  host.ranksPerNode = parallel ? RanksPerNode(setup.parallel) : 1;
  // What torch.optim steps on this rank (ZeRO's flat partition, FSDP's shards, the parameters).
  ShardPlan plan;
  if (parallel) plan = PlanShards(simulated, inventory);
  if (setup.parallel.offload != OffloadKind::None) {
    if (plan.engine == ShardingEngine::Zero) ZeroRows(simulated, inventory, plan, host);
    if (plan.engine == ShardingEngine::Fsdp || plan.engine == ShardingEngine::Fsdp2) FsdpRows(simulated, inventory, plan, host);
  }
  if (offloadedActivationsPeakBytes > 0) {
    host.rows.push_back({"offloaded activations (peak)", offloadedActivationsPeakBytes,
                         "the most bytes of saved activations whose pinned copies are held at once (packed in forward, "
                         "let go when backward unpacks them)",
                         "torchtune training/_activation_offloading.py OffloadActivations: pack_tensor "
                         "torch.empty_like(…, pin_memory=True), del self.tracker[id] in unpack",
                         kPinned});
  }
  // Paged states are where the optimizer runs: on the GPU unless the optimizer is offloaded.
  const std::int64_t paged = !parallel ? PagedOptimizerStateBytes(simulated, inventory)
                             : plan.offloadOptimizer ? 0
                                                     : PagedOptimizerStateBytes(simulated, plan.optimizerTensors);
  if (paged > 0) {
    host.rows.push_back({"paged optimizer states (may move to the host)", paged,
                         "state1 and state2 of every trainable tensor with at least 100,000 elements; on the GPU unless "
                         "the driver evicts them",
                         "bitsandbytes optim/optimizer.py get_state_buffer → F.get_paged (cudaMallocManaged)", kUnified});
  }
  for (const HostRow& row : host.rows) {
    if (row.memory == kUnified) {
      host.unifiedBytes += row.bytes;
      continue;
    }
    host.rankBytes += row.bytes;
    if (row.memory == kPinned) host.pinnedBytes += row.bytes;
  }
  host.nodeBytes = host.rankBytes * host.ranksPerNode;
  host.capacityBytes = static_cast<std::int64_t>(std::llround(setup.runtime.hostMemoryGiB * 1073741824.0));
  host.fits = host.capacityBytes == 0 || host.nodeBytes <= host.capacityBytes;
  return host;
}

std::int64_t DeepSpeedZero2CpuBytes(std::int64_t totalParams, std::int64_t gpusPerNode, std::int64_t nodes,
                                    bool cpuOffload, double additionalBufferFactor) {
  const double total = static_cast<double>(totalParams);
  const std::int64_t totalGpus = gpusPerNode * nodes;
  const double perParam = cpuOffload ? static_cast<double>(std::max<std::int64_t>(4 * totalGpus, 16))
                                     : 4.0 * static_cast<double>(gpusPerNode);
  return static_cast<std::int64_t>(total * perParam * additionalBufferFactor);
}

std::int64_t DeepSpeedZero3CpuBytes(std::int64_t totalParams, std::int64_t largestLayerParams,
                                    std::int64_t gpusPerNode, std::int64_t nodes, bool cpuOffload,
                                    bool cpuOffloadParams, bool zeroInit, double additionalBufferFactor) {
  const double total = static_cast<double>(totalParams);
  const double gpusFactor = 1.0 / static_cast<double>(nodes);
  const double perNodeGpus = 4.0 * static_cast<double>(gpusPerNode);
  double cpu = 0;
  if (cpuOffload) {
    const double bytesPerParam = cpuOffloadParams ? 18.0 : 16.0;
    cpu = zeroInit ? total * bytesPerParam * gpusFactor * additionalBufferFactor
                   : total * std::max(perNodeGpus, bytesPerParam * gpusFactor) * additionalBufferFactor;
  } else {
    cpu = zeroInit ? static_cast<double>(largestLayerParams) * perNodeGpus * additionalBufferFactor
                   : total * perNodeGpus * additionalBufferFactor;
  }
  return static_cast<std::int64_t>(cpu);
}

}  // namespace gpumem
