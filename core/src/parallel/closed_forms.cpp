// Closed forms people already use for many GPUs, written as their authors wrote them so that
// tests/parallel_test.cpp can pin them and compare them with the simulation (docs/parallel.md
// says where and why the two differ).
#include "gpumem/parallel.hpp"

namespace gpumem {

double ZeroPaperModelStateBytes(double psi, double k, double nd, int stage) {
  // ZeRO (arXiv:1910.02054) Figure 1: baseline (2 + 2 + K)Ψ; P_os 2Ψ + 2Ψ + KΨ/Nd;
  // P_os+g 2Ψ + (2 + K)Ψ/Nd; P_os+g+p (2 + 2 + K)Ψ/Nd.
  switch (stage) {
    case 0: return (2 + 2 + k) * psi;
    case 1: return 2 * psi + 2 * psi + k * psi / nd;
    case 2: return 2 * psi + (2 + k) * psi / nd;
    default: return (2 + 2 + k) * psi / nd;
  }
}

std::int64_t DeepSpeedZero2GpuBytes(std::int64_t totalParams, std::int64_t gpusPerNode, std::int64_t nodes,
                                    bool cpuOffload) {
  // deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs:
  //   offload: gpu_mem = 2 · total_params; else 4 · total_params + int(16 · total_params / total_gpus)
  const std::int64_t totalGpus = gpusPerNode * nodes;
  if (cpuOffload) return 2 * totalParams;
  return 4 * totalParams + static_cast<std::int64_t>(16.0 * static_cast<double>(totalParams) / static_cast<double>(totalGpus));
}

std::int64_t DeepSpeedZero3GpuBytes(std::int64_t totalParams, std::int64_t largestLayerParams,
                                    std::int64_t gpusPerNode, std::int64_t nodes, bool cpuOffload,
                                    bool cpuOffloadParams) {
  // deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs:
  //   largest_layer_memory = 4 · largest_layer_params
  //   offload optimizer and params: largest_layer_memory
  //   offload optimizer only:       largest_layer_memory + int(2 · total_params / total_gpus)
  //   no offload:                   largest_layer_memory + int(18 · total_params / total_gpus)
  const double totalGpus = static_cast<double>(gpusPerNode * nodes);
  const std::int64_t largest = 4 * largestLayerParams;
  if (cpuOffload && cpuOffloadParams) return largest;
  if (cpuOffload) return largest + static_cast<std::int64_t>(2.0 * static_cast<double>(totalParams) / totalGpus);
  return largest + static_cast<std::int64_t>(18.0 * static_cast<double>(totalParams) / totalGpus);
}

MegatronWeightAndOptimizer MegatronTheoreticalWeightAndOptimizer(const ArchitectureDef& a, std::int64_t tensorParallel,
                                                                 std::int64_t pipelineParallel,
                                                                 std::int64_t dataParallel,
                                                                 bool distributedOptimizer) {
  // megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory, with
  // kv_channels = head_dim, num_query_groups = key/value heads, ffn_hidden_size = the MLP width,
  // swiglu for the Llama family (gated_linear_multiplier 3/2), padded_vocab_size = vocab_size.
  const double h = static_cast<double>(a.hiddenSize), layers = static_cast<double>(a.numLayers);
  const double heads = static_cast<double>(a.numHeads);
  const double queryProjection = static_cast<double>(HeadDim(a)) * heads;
  const double queryRatio = queryProjection / h;
  const double groups = static_cast<double>(KeyValueHeads(a));
  const double experts = a.numExperts > 0 ? static_cast<double>(a.numExperts) : 1.0;
  const double ffn = static_cast<double>(a.numExperts > 0 ? ExpertIntermediateSize(a) : IntermediateSize(a));
  const double gated = a.family == Family::Llama ? 1.5 : 1.0;
  const double inLayers = 2 * layers * h * h *
                          ((1 + groups / heads) * queryRatio + (ffn / h) * experts * gated + 2 / h + 1 / (layers * h));
  const double embedding = h * static_cast<double>(a.vocabSize);
  const double tp = static_cast<double>(tensorParallel), pp = static_cast<double>(pipelineParallel);
  MegatronWeightAndOptimizer r;
  r.parametersOnMostLoadedShard = (inLayers / pp + embedding) / tp;
  if (!a.tieWordEmbeddings && pipelineParallel == 1) r.parametersOnMostLoadedShard += embedding / tp;
  const double bytesPerParameter = distributedOptimizer ? 6 + 12 / static_cast<double>(dataParallel) : 18;
  r.bytes = r.parametersOnMostLoadedShard * bytesPerParameter;
  return r;
}

}  // namespace gpumem
