// Layouts for a cluster of N GPUs (docs/parallel.md, "Layouts for N GPUs"): enumerate
// dp × tp × pp = N × sharding × offload × checkpointing, simulate each candidate's rank with the
// same estimate as everything else, and rank the ones that fit by formulas of what they cost.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "gpumem/estimate.hpp"
#include "gpumem/parallel.hpp"

namespace gpumem {
namespace {

// A ring collective over g ranks moves (g − 1)/g of the buffer per rank for a reduce-scatter or
// an all-gather, twice that for an all-reduce (Patarasuk & Yuan 2009; NCCL's ring algorithm,
// docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html). The ZeRO paper §7
// rounds (g − 1)/g to 1: "2Ψ" for an all-reduce.
double RingShare(std::int64_t g) { return g <= 1 ? 0.0 : static_cast<double>(g - 1) / static_cast<double>(g); }

// Bytes per element of what each collective moves, by precision (setup.hpp Precision): mixed and
// pure 16-bit training move 16-bit gradients and parameters; fp32 and autocast keep fp32 weights
// and gradients; activations are 16-bit except in fp32.
struct ElementBytes {
  double gradient, parameter, activation;
};
ElementBytes ElementBytesOf(Precision p) {
  switch (p) {
    case Precision::FP32: return {4, 4, 4};
    case Precision::AmpBF16:
    case Precision::AmpFP16: return {4, 4, 2};
    default: return {2, 2, 2};
  }
}

const char* OffloadLabel(OffloadKind k) {
  switch (k) {
    case OffloadKind::None: return "none";
    case OffloadKind::Optimizer: return "optimizer";
    case OffloadKind::OptimizerAndParameters: return "optimizer and parameters";
  }
  return "none";
}

// One sharding choice of the data-parallel ranks.
struct Sharding {
  const char* label;
  std::int64_t zeroStage;
  FsdpMode fsdp;
  OffloadKind offload;
  bool needsDataParallel;  // only meaningful with more than one data-parallel rank
};
// In order of communication (ZeRO paper §7: 2Ψ, then 3Ψ) and then of host traffic. With one
// data-parallel rank only the plain layout and the offloading ones remain (ZeRO-Offload on one
// GPU, as FewestGpus finds for 7B on 40 GiB).
const Sharding kShardings[] = {
    {"DDP", 0, FsdpMode::Off, OffloadKind::None, true},
    {"ZeRO-1", 1, FsdpMode::Off, OffloadKind::None, true},
    {"ZeRO-2", 2, FsdpMode::Off, OffloadKind::None, true},
    {"ZeRO-3", 3, FsdpMode::Off, OffloadKind::None, true},
    {"FSDP FULL_SHARD", 0, FsdpMode::FullShard, OffloadKind::None, true},
    {"ZeRO-2", 2, FsdpMode::Off, OffloadKind::Optimizer, false},
    {"ZeRO-3", 3, FsdpMode::Off, OffloadKind::Optimizer, false},
    {"ZeRO-3", 3, FsdpMode::Off, OffloadKind::OptimizerAndParameters, false},
    {"FSDP FULL_SHARD", 0, FsdpMode::FullShard, OffloadKind::OptimizerAndParameters, true},
};

std::vector<std::int64_t> DivisorsUpTo(std::int64_t n, std::int64_t most) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= most && d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// The ranking: layouts without host offload first (offload adds PCIe traffic and a CPU optimizer
// step, ZeRO-Offload paper §4); then the compute factor (bubble and recompute stretch every step);
// then the bytes communicated; then the smaller device figure; then enumeration order.
bool RanksBefore(const LayoutRow& a, const LayoutRow& b) {
  const bool aHost = a.cost.hostBytes > 0, bHost = b.cost.hostBytes > 0;
  if (aHost != bHost) return !aHost;
  constexpr double kTolerance = 1e-9;
  if (std::abs(a.cost.computeFactor - b.cost.computeFactor) > kTolerance) return a.cost.computeFactor < b.cost.computeFactor;
  if (a.cost.communicationBytes != b.cost.communicationBytes) return a.cost.communicationBytes < b.cost.communicationBytes;
  if (a.cost.hostBytes != b.cost.hostBytes) return a.cost.hostBytes < b.cost.hostBytes;
  return a.peakDeviceBytes < b.peakDeviceBytes;
}

}  // namespace

LayoutCost LayoutCostOf(const Setup& setup) {
  LayoutCost c;
  const ParallelDef& par = setup.parallel;
  const ElementBytes e = ElementBytesOf(setup.training.precision);
  const std::int64_t d = par.dataParallel, t = par.tensorParallel, p = par.pipelineParallel;
  const double m = static_cast<double>(std::max<std::int64_t>(par.gradientAccumulationSteps, 1));
  const double v = static_cast<double>(std::max<std::int64_t>(par.virtualStages, 1));

  // Ψ: the parameters of this rank's model (the tensor-parallel slice), over the pipeline stages
  // (an even split; the first stage's embeddings are not singled out here).
  const Inventory rank = BuildInventory(TensorParallelRankSetup(setup));
  const double psi = static_cast<double>(rank.ParameterCount()) / static_cast<double>(p);
  const double psiTrainable = static_cast<double>(rank.TrainableCount()) / static_cast<double>(p);

  // Data parallel, per optimizer step (ZeRO paper §7.1–7.2, with the ring's (d − 1)/d):
  // - DDP: one all-reduce of the gradients, 2Ψ (no_sync on the first m − 1 micro-batches, as
  //   accelerate / transformers accumulate: torch/nn/parallel/distributed.py no_sync);
  // - ZeRO-1: reduce-scatter of the gradients at the accumulation boundary, all-gather of the
  //   updated 16-bit parameters after the step: 2Ψ (stage_1_and_2.py: stage 1 reduces only at the
  //   boundary);
  // - ZeRO-2: the reduce-scatter on every micro-batch (stage_1_and_2.py reduces in each backward
  //   into grads_in_partition), the all-gather once: (m + 1)Ψ;
  // - ZeRO-3 / FSDP FULL_SHARD: parameters all-gathered in every forward and backward and the
  //   gradients reduce-scattered in every backward: 3Ψ per micro-batch (ZeRO paper §7.2.2;
  //   torch/distributed/fsdp/_runtime_utils.py _pre_forward_unshard, _pre_backward_hook,
  //   _post_backward_hook).
  const double ring = RingShare(d);
  const bool fsdp = par.fsdp != FsdpMode::Off;
  if (d > 1) {
    if (fsdp || par.zeroStage == 3) {
      c.dataParallelBytes = ring * m * (psiTrainable * e.gradient + 2 * psi * e.parameter);
    } else if (par.zeroStage == 2) {
      c.dataParallelBytes = ring * (m * psiTrainable * e.gradient + psiTrainable * e.parameter);
    } else if (par.zeroStage == 1) {
      c.dataParallelBytes = ring * psiTrainable * (e.gradient + e.parameter);
    } else {
      c.dataParallelBytes = ring * 2 * psiTrainable * e.gradient;
    }
  }

  // Tensor and pipeline parallel act on the activations b·s·h of a transformer.
  if (setup.model.kind == ModelKind::Transformer) {
    const ArchitectureDef& a = setup.model.architecture;
    const double bsh = static_cast<double>(setup.training.batchSize) * static_cast<double>(setup.training.sequenceLength) *
                       static_cast<double>(a.hiddenSize) * e.activation;
    const double layersOnRank = static_cast<double>(a.numLayers) / static_cast<double>(p);
    const bool fullRecompute = setup.training.checkpointing == Checkpointing::EveryBlock;
    // Megatron tensor parallel (Shoeybi et al. 2019 §3, Figure 4; Narayanan et al. 2021 §3.3):
    // per layer and micro-batch, two all-reduces of b·s·h in forward (after attention's and the
    // MLP's row-parallel linears, the g operator) and two in backward (the f operator); with
    // full recomputation the forward runs again: six. Sequence parallelism replaces each
    // all-reduce by an all-gather plus a reduce-scatter: the same volume (Korthikanti et al.
    // 2022 §4.2.2). The vocabulary-parallel embedding's and loss's collectives are left out.
    if (t > 1) {
      const double allReduces = fullRecompute ? 6 : 4;
      c.tensorParallelBytes = layersOnRank * m * allReduces * 2 * RingShare(t) * bsh;
    }
    // Pipeline parallel: each micro-batch sends its activation b·s·h to the next stage in
    // forward and its gradient back in backward, once per model chunk (the interleaved schedule
    // multiplies the p2p traffic by v, Narayanan et al. 2021 §2.2.2). With context and sequence
    // parallelism the boundary tensor is the rank's s/(c·t) tokens (Megatron schedules.py
    // get_tensor_shapes: seq_length // context_parallel_size // tensor_model_parallel_size).
    const double tokenShards = static_cast<double>(std::max<std::int64_t>(par.contextParallel, 1)) *
                               static_cast<double>(par.sequenceParallel ? t : 1);
    if (p > 1) c.pipelineBytes = 2 * m * v * bsh / tokenShards;
    // Full recomputation runs every forward once more: 3 passes become 4 (Narayanan et al. 2021
    // §5.1, the FLOPs 96·B·s·l·h² with recomputation against 72 without; selective recompute
    // and every k-th block are partial and counted as none here).
    if (fullRecompute) c.recomputeFactor = 4.0 / 3.0;
  }
  c.communicationBytes = c.dataParallelBytes + c.tensorParallelBytes + c.pipelineBytes;

  // Offload over PCIe (ZeRO-Offload, Ren et al. 2021 §4.1–4.2): the rank's 16-bit gradient
  // partition goes to the host (every micro-batch: DeepSpeed copies each reduced partition out)
  // and its updated 16-bit parameters come back after the CPU step; with the parameters
  // offloaded too (ZeRO-Infinity; FSDP CPUOffload(offload_params=True)) the parameter shards
  // come to the GPU for every forward and backward.
  const double shard = d > 1 && (fsdp || par.zeroStage > 0) ? 1.0 / static_cast<double>(d) : 1.0;
  if (par.offload != OffloadKind::None) {
    c.hostBytes = shard * (m * psiTrainable * e.gradient + psiTrainable * e.parameter);
    if (par.offload == OffloadKind::OptimizerAndParameters) c.hostBytes += shard * 2 * m * psi * e.parameter;
  }

  // The pipeline bubble (Narayanan et al. 2021 §2.2; PipelineBubbleFraction in pipeline.cpp).
  c.bubbleFraction = PipelineBubbleFraction(p, par.gradientAccumulationSteps, par.virtualStages);
  c.computeFactor = c.recomputeFactor / (1 - c.bubbleFraction);
  return c;
}

LayoutsResult LayoutsForCluster(const Setup& setup, std::int64_t gpus, const LayoutSearchOptions& options) {
  LayoutsResult r;
  r.gpus = gpus;
  r.errors = Validate(setup);
  if (gpus < 1 || gpus > kMaxLayoutGpus) {
    r.errors.push_back({ErrorCode::InvalidField, "gpus",
                        "The number of GPUs must be between 1 and " + std::to_string(kMaxLayoutGpus) + "."});
  }
  if (options.maxEstimates < 1 || options.maxEstimates > kMaxLayoutEstimates) {
    r.errors.push_back({ErrorCode::InvalidField, "maxEstimates",
                        "The estimates to run must be between 1 and " + std::to_string(kMaxLayoutEstimates) + "."});
  }
  if (!r.ok()) return r;

  const EstimateOptions quiet{.timeline = EstimateOptions::Timeline::None, .explain = false};
  const bool transformer = setup.model.kind == ModelKind::Transformer;
  const std::int64_t layers = transformer ? setup.model.architecture.numLayers : 1;
  // Checkpointing is a transformer choice (every block); other kinds keep the setup's.
  std::vector<Checkpointing> checkpointings = {setup.training.checkpointing};
  if (transformer) checkpointings = {Checkpointing::None, Checkpointing::EveryBlock};

  // tp within one node (≤ 8, NVLink), pp dividing the layers, dp the rest; context and expert
  // parallel stay as the setup has them (1 unless given; not enumerated), so the context-parallel
  // ranks take their share of the GPUs first: dp × tp × pp × cp = N.
  const std::int64_t cp = std::max<std::int64_t>(1, setup.parallel.contextParallel);
  if (gpus % cp != 0) return r;  // no layout: the context parallel size does not divide N
  for (std::int64_t tp : DivisorsUpTo(gpus / cp, 8)) {
    for (std::int64_t pp : DivisorsUpTo(gpus / cp / tp, layers)) {
      if (layers % pp != 0) continue;
      const std::int64_t dp = gpus / cp / tp / pp;
      // Within one (dp, tp, pp): a layout that fits without offload makes the offloading ones
      // pointless (they rank after every layout without host traffic), and a layout that fits
      // without checkpointing makes its checkpointed twin pointless (more compute, as much or
      // more communication). Those are counted as dominated, not estimated.
      bool fitsWithoutOffload = false;
      for (const Sharding& s : kShardings) {
        if (s.needsDataParallel && dp == 1 && !(s.zeroStage == 0 && s.fsdp == FsdpMode::Off)) continue;
        if (s.offload != OffloadKind::None && !options.allowOffload) continue;
        bool fitsPlain = false;
        for (Checkpointing ckpt : checkpointings) {
          ++r.candidates;
          Setup candidate = setup;
          candidate.parallel.dataParallel = dp;
          candidate.parallel.tensorParallel = tp;
          candidate.parallel.pipelineParallel = pp;
          candidate.parallel.zeroStage = s.zeroStage;
          candidate.parallel.fsdp = s.fsdp;
          candidate.parallel.offload = s.offload;
          candidate.training.checkpointing = ckpt;
          if (!Validate(candidate).empty()) {
            ++r.refused;
            continue;
          }
          if (fitsPlain || (s.offload != OffloadKind::None && fitsWithoutOffload)) {
            ++r.dominated;
            continue;
          }
          if (r.estimates >= options.maxEstimates) {
            ++r.notEstimated;
            continue;
          }
          const EstimateResult e = EstimateMemory(candidate, quiet);
          ++r.estimates;
          if (!e.ok() || !e.estimate.fits) {
            ++r.notFitting;
            continue;
          }
          if (!e.estimate.host.fits) {  // the device fits, the stated host memory does not
            ++r.hostTooSmall;
            continue;
          }
          fitsPlain = true;
          if (s.offload == OffloadKind::None) fitsWithoutOffload = true;
          LayoutRow row;
          row.dataParallel = dp;
          row.tensorParallel = tp;
          row.pipelineParallel = pp;
          row.sharding = dp == 1 && s.zeroStage == 0 && s.fsdp == FsdpMode::Off ? "none" : s.label;
          row.offload = OffloadLabel(s.offload);
          row.checkpointing = ckpt == Checkpointing::EveryBlock;
          row.peakDeviceBytes = e.estimate.device.peakDeviceBytes;
          row.capacityBytes = e.estimate.device.capacityBytes;
          row.hostNodeBytes = e.estimate.host.nodeBytes;
          row.cost = LayoutCostOf(candidate);
          row.setup = std::move(candidate);
          r.layouts.push_back(std::move(row));
        }
      }
    }
  }
  std::stable_sort(r.layouts.begin(), r.layouts.end(), RanksBefore);
  return r;
}

}  // namespace gpumem
