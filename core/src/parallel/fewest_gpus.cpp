// The fewest GPUs of a type that can train a setup (docs/parallel.md, "Fewest GPUs"): the same
// estimate re-run over data-parallel sizes and sharding layouts, cheapest communication first.
#include "gpumem/estimate.hpp"
#include "gpumem/parallel.hpp"

namespace gpumem {
namespace {

struct Layout {
  LayoutCandidate candidate;
  std::int64_t zeroStage;
  OffloadKind offload;
};

// In order of communication per step (ZeRO paper §7: 2Ψ for DDP / P_os / P_os+g, 3Ψ for P_os+g+p),
// then offload, which adds host traffic and a CPU optimizer step.
const Layout kLayouts[] = {
    {{"DDP", 2, false}, 0, OffloadKind::None},
    {{"ZeRO-1", 2, false}, 1, OffloadKind::None},
    {{"ZeRO-2", 2, false}, 2, OffloadKind::None},
    {{"ZeRO-3", 3, false}, 3, OffloadKind::None},
    {{"ZeRO-2 + optimizer offload", 2, true}, 2, OffloadKind::Optimizer},
    {{"ZeRO-3 + optimizer offload", 3, true}, 3, OffloadKind::Optimizer},
    {{"ZeRO-3 + optimizer and parameter offload", 3, true}, 3, OffloadKind::OptimizerAndParameters},
};

}  // namespace

FewestGpusResult FewestGpus(const Setup& setup, std::int64_t maxGpus, bool allowOffload) {
  FewestGpusResult r;
  r.errors = Validate(setup);
  if (!r.errors.empty()) return r;
  const EstimateOptions quiet{.timeline = EstimateOptions::Timeline::None, .explain = false};
  // GPUs per data-parallel rank: tensor × pipeline × context parallel (WorldSize at dp = 1).
  Setup one = setup;
  one.parallel.dataParallel = 1;
  const std::int64_t tp = WorldSize(one.parallel);
  for (std::int64_t dp = 1; dp * tp <= maxGpus; dp *= 2) {
    for (const Layout& layout : kLayouts) {
      if (layout.candidate.offload && !allowOffload) continue;
      Setup candidate = setup;
      candidate.parallel.dataParallel = dp;
      candidate.parallel.zeroStage = layout.zeroStage;
      candidate.parallel.fsdp = FsdpMode::Off;
      candidate.parallel.offload = layout.offload;
      if (!Validate(candidate).empty()) continue;
      const EstimateResult e = EstimateMemory(candidate, quiet);
      ++r.estimates;
      if (!e.ok() || !e.estimate.fits) continue;
      r.found = true;
      r.gpus = dp * tp;
      r.layout = candidate;
      r.candidate = layout.candidate;
      r.peakDeviceBytes = e.estimate.device.peakDeviceBytes;
      return r;
    }
  }
  return r;
}

}  // namespace gpumem
