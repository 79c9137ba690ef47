// Replay: the running total of a trace, its peaks, and what is live at each.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

constexpr std::uint32_t kNever = std::numeric_limits<std::uint32_t>::max();

std::int64_t Signed(const Event& e) { return e.kind == EventKind::Alloc ? e.bytes : -e.bytes; }

// When each tensor (by id, ids being handed out in order) is allocated and freed.
struct Lifetimes {
  std::vector<std::uint32_t> alloc, free;
  explicit Lifetimes(const Trace& trace) {
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const Event& e = trace.events[i];
      const auto id = static_cast<std::size_t>(e.tensorId);
      if (e.kind == EventKind::Alloc) {
        if (alloc.size() <= id) {
          alloc.resize(id + 1, kNever);
          free.resize(id + 1, kNever);
        }
        alloc[id] = static_cast<std::uint32_t>(i);
      } else if (id < free.size()) {
        free[id] = static_cast<std::uint32_t>(i);
      }
    }
  }
};

// What is live after event `last` (inclusive), by category, each with the sum of its largest
// tensors' formulas. `phase` describes the moment.
Snapshot TakeSnapshot(const Trace& trace, const Lifetimes& life, std::size_t last, Phase phase) {
  std::array<std::vector<const Event*>, kCategoryCount> byCategory;
  const auto at = static_cast<std::uint32_t>(last);
  for (std::size_t id = 0; id < life.alloc.size(); ++id) {  // in tensor order
    if (life.alloc[id] > at || (life.free[id] != kNever && life.free[id] <= at)) continue;
    const Event& e = trace.events[life.alloc[id]];
    byCategory[static_cast<int>(e.category)].push_back(&e);
  }
  Snapshot s;
  s.phase = phase;
  s.eventIndex = last;
  if (last < trace.events.size()) {
    s.step = trace.events[last].step;
    s.label = trace.Label(trace.events[last]);
  }
  for (int c = 0; c < kCategoryCount; ++c) {
    auto& tensors = byCategory[c];
    if (tensors.empty()) continue;
    CategoryBytes row;
    row.category = static_cast<Category>(c);
    for (const Event* e : tensors) row.bytes += e->bytes;
    // The largest four, ties in tensor order (a stable sort by size, largest first).
    constexpr std::size_t kShown = 4;
    const std::size_t shown = std::min(kShown, tensors.size());
    std::partial_sort(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(shown), tensors.end(),
                      [](const Event* a, const Event* b) {
                        return a->bytes != b->bytes ? a->bytes > b->bytes : a->tensorId < b->tensorId;
                      });
    std::int64_t rest = row.bytes;
    for (std::size_t k = 0; k < shown; ++k) {
      if (k) row.formula += " + ";
      trace.text.RenderTo(tensors[k]->tensor, row.formula);
      row.formula += " (";
      trace.text.RenderTo(tensors[k]->formula, row.formula);
      row.formula += ")";
      rest -= tensors[k]->bytes;
    }
    if (tensors.size() > kShown) {
      row.formula += " + " + FormatCount(static_cast<std::int64_t>(tensors.size() - kShown)) + " more tensors (" +
                     FormatCount(rest) + " B)";
    }
    s.totalBytes += row.bytes;
    s.byCategory.push_back(std::move(row));
  }
  return s;
}

}  // namespace

Estimate Replay(const Trace& trace, const EstimateOptions& options) {
  Estimate est;
  const std::size_t n = trace.events.size();
  est.eventCount = n;
  const bool points = options.timeline != EstimateOptions::Timeline::None;
  const bool labelled = options.timeline == EstimateOptions::Timeline::Labelled;
  if (points) est.timeline.resize(n);
  std::int64_t total = 0;
  std::int64_t peakTotal = -1;
  std::size_t peakIndex = 0;
  // Per phase: the largest total reached, counting the total on entry (a phase made only of
  // frees peaks at its start).
  constexpr int kPhases = 4;
  std::array<std::int64_t, kPhases> phaseMax;
  std::array<std::size_t, kPhases> phaseIndex{};
  phaseMax.fill(-1);
  std::size_t lastForward = n;  // the end of step 1's forward pass
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = trace.events[i];
    const int phase = static_cast<int>(e.phase);
    if (i > 0 && total > phaseMax[phase]) {  // total before this event
      phaseMax[phase] = total;
      phaseIndex[phase] = i - 1;
    }
    total += Signed(e);
    if (points) {
      TimelinePoint& p = est.timeline[i];
      p.phase = e.phase;
      p.step = e.step;
      p.layer = e.layer;
      p.category = e.category;
      p.deltaBytes = Signed(e);
      p.totalBytes = total;
      if (labelled) p.label = trace.Label(e);
    }
    if (total > peakTotal) {
      peakTotal = total;
      peakIndex = i;
    }
    if (total > phaseMax[phase]) {
      phaseMax[phase] = total;
      phaseIndex[phase] = i;
    }
    if (e.step == 1 && e.phase == Phase::Forward) lastForward = i;
  }
  const Lifetimes life(trace);
  if (n > 0) est.peak = TakeSnapshot(trace, life, peakIndex, trace.events[peakIndex].phase);
  for (int p = 0; p < kPhases; ++p) {
    if (phaseMax[p] < 0) {
      Snapshot empty;
      empty.phase = static_cast<Phase>(p);
      est.phasePeaks.push_back(empty);
    } else {
      est.phasePeaks.push_back(TakeSnapshot(trace, life, phaseIndex[p], static_cast<Phase>(p)));
    }
  }
  if (lastForward < n) est.forwardEnd = TakeSnapshot(trace, life, lastForward, Phase::Forward);
  est.notes = trace.notes;
  return est;
}

}  // namespace gpumem
