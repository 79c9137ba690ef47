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

// The first layout, from `dp` data-parallel ranks up, whose device figure fits and whose host
// memory per node fits the stated runtime.hostMemoryGiB.
FewestGpusLayout Search(const Setup& setup, std::int64_t tp, std::int64_t dp, std::int64_t maxGpus, bool allowOffload,
                        FewestGpusResult& counts) {
  const EstimateOptions quiet{.timeline = EstimateOptions::Timeline::None, .explain = false};
  FewestGpusLayout found;
  for (; dp * tp <= maxGpus; dp *= 2) {
    for (const Layout& layout : kLayouts) {
      if (layout.candidate.offload && !allowOffload) continue;
      Setup candidate = setup;
      candidate.parallel.dataParallel = dp;
      candidate.parallel.zeroStage = layout.zeroStage;
      candidate.parallel.fsdp = FsdpMode::Off;
      candidate.parallel.offload = layout.offload;
      if (!Validate(candidate).empty()) continue;
      const EstimateResult e = EstimateMemory(candidate, quiet);
      ++counts.estimates;
      if (!e.ok() || !e.estimate.fits) continue;
      if (!e.estimate.host.fits) {
        ++counts.hostTooSmall;
        continue;
      }
      found.found = true;
      found.gpus = dp * tp;
      found.layout = candidate;
      found.candidate = layout.candidate;
      found.peakDeviceBytes = e.estimate.device.peakDeviceBytes;
      found.hostNodeBytes = e.estimate.host.nodeBytes;
      return found;
    }
  }
  return found;
}

}  // namespace

FewestGpusResult FewestGpus(const Setup& setup, std::int64_t maxGpus, bool allowOffload) {
  FewestGpusResult r;
  r.errors = Validate(setup);
  if (!r.errors.empty()) return r;
  // GPUs per data-parallel rank: tensor × pipeline × context parallel (WorldSize at dp = 1).
  Setup one = setup;
  one.parallel.dataParallel = 1;
  const std::int64_t tp = WorldSize(one.parallel);
  static_cast<FewestGpusLayout&>(r) = Search(setup, tp, 1, maxGpus, allowOffload, r);
  // At the winner's size every layout without offload was tried first and did not fit: the
  // search without offload goes on from twice as many.
  if (r.found && r.candidate.offload) r.withoutOffload = Search(setup, tp, 2 * r.gpus / tp, maxGpus, false, r);
  return r;
}

}  // namespace gpumem
