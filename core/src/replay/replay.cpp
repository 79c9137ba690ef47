// Replay: the running total of a trace, its peaks, and what is live at each.
#include <algorithm>
#include <array>
#include <map>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

std::int64_t Signed(const Event& e) { return e.kind == EventKind::Alloc ? e.bytes : -e.bytes; }

// What is live after event `last` (inclusive), by category, each with the sum of its tensors'
// formulas. `phase`/`step`/`label` describe the moment.
Snapshot TakeSnapshot(const Trace& trace, std::size_t last, Phase phase) {
  std::map<int, std::size_t> live;  // tensor id → its alloc event
  for (std::size_t i = 0; i <= last && i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.kind == EventKind::Alloc) live[e.tensorId] = i;
    else live.erase(e.tensorId);
  }
  std::array<std::vector<const Event*>, kCategoryCount> byCategory;
  for (const auto& [id, index] : live) {
    const Event& e = trace.events[index];
    byCategory[static_cast<int>(e.category)].push_back(&e);
  }
  Snapshot s;
  s.phase = phase;
  s.eventIndex = last;
  if (last < trace.events.size()) {
    s.step = trace.events[last].step;
    s.label = trace.events[last].label;
  }
  for (int c = 0; c < kCategoryCount; ++c) {
    auto& tensors = byCategory[c];
    if (tensors.empty()) continue;
    std::stable_sort(tensors.begin(), tensors.end(),
                     [](const Event* a, const Event* b) { return a->bytes > b->bytes; });
    CategoryBytes row;
    row.category = static_cast<Category>(c);
    constexpr std::size_t kShown = 4;
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      row.bytes += tensors[k]->bytes;
      if (k < kShown) {
        row.formula += (k ? " + " : "") + tensors[k]->tensor + " (" + tensors[k]->formula + ")";
      }
    }
    if (tensors.size() > kShown) {
      std::int64_t rest = 0;
      for (std::size_t k = kShown; k < tensors.size(); ++k) rest += tensors[k]->bytes;
      row.formula += " + " + FormatCount(static_cast<std::int64_t>(tensors.size() - kShown)) +
                     " more tensors (" + FormatCount(rest) + " B)";
    }
    s.totalBytes += row.bytes;
    s.byCategory.push_back(std::move(row));
  }
  return s;
}

}  // namespace

Estimate Replay(const Trace& trace) {
  Estimate est;
  est.timeline.reserve(trace.events.size());
  std::int64_t total = 0;
  std::int64_t peakTotal = -1;
  std::size_t peakIndex = 0;
  // Per phase: the largest total reached, counting the total on entry (a phase made only of
  // frees peaks at its start).
  constexpr int kPhases = 4;
  std::array<std::int64_t, kPhases> phaseMax;
  std::array<std::size_t, kPhases> phaseIndex{};
  phaseMax.fill(-1);
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    const int phase = static_cast<int>(e.phase);
    if (i > 0 && total > phaseMax[phase]) {  // total before this event
      phaseMax[phase] = total;
      phaseIndex[phase] = i - 1;
    }
    total += Signed(e);
    est.timeline.push_back({e.phase, e.step, e.layer, e.label, e.category, Signed(e), total});
    if (total > peakTotal) {
      peakTotal = total;
      peakIndex = i;
    }
    if (total > phaseMax[phase]) {
      phaseMax[phase] = total;
      phaseIndex[phase] = i;
    }
  }
  if (!trace.events.empty()) {
    est.peak = TakeSnapshot(trace, peakIndex, trace.events[peakIndex].phase);
  }
  for (int p = 0; p < kPhases; ++p) {
    if (phaseMax[p] < 0) {
      Snapshot empty;
      empty.phase = static_cast<Phase>(p);
      est.phasePeaks.push_back(empty);
    } else {
      est.phasePeaks.push_back(TakeSnapshot(trace, phaseIndex[p], static_cast<Phase>(p)));
    }
  }
  // The end of step 1's forward pass: what forward leaves for backward.
  std::size_t lastForward = trace.events.size();
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    if (trace.events[i].step == 1 && trace.events[i].phase == Phase::Forward) lastForward = i;
  }
  if (lastForward < trace.events.size()) est.forwardEnd = TakeSnapshot(trace, lastForward, Phase::Forward);
  est.notes = trace.notes;
  return est;
}

}  // namespace gpumem
