// docs/parallel.md: FSDP2 gradients, Megatron's fp32 gradient buffer, FSDP2 embedding and
// output units.
#include "parallel/parallel_fidelity.hpp"

#include <numeric>
#include <string>

namespace gpumem {
namespace {

std::int64_t PadTo(std::int64_t n, std::int64_t divisor) { return (n + divisor - 1) / divisor * divisor; }

bool IsWordEmbedding(const Tensor& t) { return t.layer < 0 && t.name.find("embed_tokens") != std::string::npos; }
bool IsOutputLayer(const Tensor& t) { return t.layer < 0 && t.name.rfind("lm_head", 0) == 0; }

}  // namespace

void ValidateParallelFidelity(const Setup& setup, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  if (p.fsdpReduceInFp32 && p.fsdp != FsdpMode::FullyShard) {
    bad("fsdpReduceInFp32", "reduce_dtype=float32 is simulated for FSDP2 (fsdp = fully_shard) only.");
  }
  if (p.fsdpShardEmbeddingsAndHead) {
    if (p.fsdp != FsdpMode::FullyShard) {
      bad("fsdpShardEmbeddingsAndHead", "Embedding and output units of their own are simulated for FSDP2 (fsdp = "
                                        "fully_shard) only.");
    } else if (setup.model.kind != ModelKind::Transformer || setup.model.architecture.family != Family::Llama ||
               setup.model.architecture.tieWordEmbeddings) {
      // A tied head shares its weight with the embedding: one parameter cannot be in two units.
      bad("fsdpShardEmbeddingsAndHead", "Embedding and output units of their own need a Llama-family transformer "
                                        "with an untied output layer (tieWordEmbeddings off).");
    }
  }
  // torchtitan parallelize_llama.py apply_fsdp, reshard_after_forward_policy "default" without PP:
  // `reshard_after_forward = int(layer_id) < len(model.layers) - 1`. Under PP torchtitan sets it
  // False on every block (parallel.reshardAfterForward = false); with every block already kept
  // gathered the field would say nothing, so both are refused as inconsistent.
  if (p.fsdpKeepLastBlockGathered) {
    if (p.fsdp != FsdpMode::FullyShard) {
      bad("fsdpKeepLastBlockGathered", "Keeping the last block gathered after forward is simulated for FSDP2 (fsdp = "
                                       "fully_shard) only.");
    } else if (!p.reshardAfterForward) {
      bad("fsdpKeepLastBlockGathered", "With reshard_after_forward off every block already stays gathered after "
                                       "forward: turn one of the two off.");
    } else if (p.pipelineParallel > 1) {
      bad("fsdpKeepLastBlockGathered", "Under pipeline parallelism torchtitan keeps every block gathered "
                                       "(reshard_after_forward off), not the last one alone: turn this off.");
    } else if (setup.model.kind != ModelKind::Transformer) {
      bad("fsdpKeepLastBlockGathered", "The last transformer block needs a transformer model.");
    }
  }
  // Megatron's DDP (megatron/core/distributed/distributed_data_parallel.py) with its optimizers:
  // the distributed optimizer (zeroStage 1) or Float16OptimizerWithFloat16Params (zeroStage 0,
  // megatron/core/optimizer/optimizer.py). Not with DeepSpeed's other stages, FSDP, torch's
  // ZeroRedundancyOptimizer or offload, which are other engines.
  if (p.gradReduceInFp32 && (p.zeroStage > 1 || p.fsdp != FsdpMode::Off || p.zeroRedundancyOptimizer ||
                             p.offload != OffloadKind::None)) {
    bad("gradReduceInFp32", "Megatron's fp32 gradient buffer is simulated with Megatron's DDP and its optimizers: "
                            "zeroStage 0 (Float16OptimizerWithFloat16Params) or 1 (the distributed optimizer), no "
                            "FSDP, ZeroRedundancyOptimizer or offload.");
  }
}

std::int64_t MegatronGradBufferElements(const Inventory& inventory, std::int64_t dataParallel,
                                        bool distributedOptimizer) {
  std::int64_t index = 0;
  for (std::size_t i = inventory.parameters.size(); i-- > 0;) {
    const Tensor& t = inventory.parameters[i];
    if (!t.trainable) continue;
    index = (distributedOptimizer ? PadTo(index, 64) : index) + t.Elements();
  }
  if (!distributedOptimizer) return index;
  return PadTo(index, std::lcm(dataParallel, std::int64_t{128}));
}

std::vector<int> Fsdp2UnitOfParameter(const Setup& setup, const Inventory& inventory, int blocks) {
  std::vector<int> unit;
  unit.reserve(inventory.parameters.size());
  const bool apart = setup.parallel.fsdpShardEmbeddingsAndHead;
  for (const Tensor& t : inventory.parameters) {
    if (t.layer >= 0) unit.push_back(t.layer + 1);
    else if (apart && IsWordEmbedding(t)) unit.push_back(1 + blocks);
    else if (apart && IsOutputLayer(t)) unit.push_back(2 + blocks);
    else unit.push_back(0);
  }
  return unit;
}

}  // namespace gpumem
