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
    std::size_t tensors = 0;
    for (const Event& e : trace.events) {
      if (e.kind == EventKind::Alloc) tensors = std::max(tensors, static_cast<std::size_t>(e.tensorId) + 1);
    }
    alloc.assign(tensors, kNever);
    free.assign(tensors, kNever);
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const Event& e = trace.events[i];
      const auto id = static_cast<std::size_t>(e.tensorId);
      if (id >= tensors) continue;
      (e.kind == EventKind::Alloc ? alloc : free)[id] = static_cast<std::uint32_t>(i);
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
    if (trace.text.enabled()) s.label = trace.Label(trace.events[last]);
  }
  for (int c = 0; c < kCategoryCount; ++c) {
    auto& tensors = byCategory[c];
    if (tensors.empty()) continue;
    CategoryBytes row;
    row.category = static_cast<Category>(c);
    for (const Event* e : tensors) row.bytes += e->bytes;
    if (!trace.text.enabled()) {
      s.totalBytes += row.bytes;
      s.byCategory.push_back(std::move(row));
      continue;
    }
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

// Collects the timeline's points, thinned to runs' first, highest and lowest totals when
// there are more events than the limit.
class TimelineWriter {
 public:
  TimelineWriter(const Trace& trace, const EstimateOptions& options, std::vector<TimelinePoint>& out)
      : trace_(trace), out_(out), labelled_(options.timeline == EstimateOptions::Timeline::Labelled) {
    const std::size_t n = trace.events.size();
    const std::size_t limit = options.timelineLimit;
    bucket_ = limit > 0 && n > limit ? (2 * n + limit - 1) / limit : 1;
    out_.reserve(std::min(n, limit > 0 ? limit + limit / 2 : n));
  }
  void Add(const TimelinePoint& p) {
    if (bucket_ == 1) {
      Emit(p);
      return;
    }
    if (length_ == 0 || length_ == bucket_ || p.phase != start_.phase || p.step != start_.step) {
      Flush();
      start_ = hi_ = lo_ = p;
      length_ = 1;
      return;
    }
    if (p.totalBytes > hi_.totalBytes) hi_ = p;
    if (p.totalBytes < lo_.totalBytes) lo_ = p;
    ++length_;
  }
  void Flush() {
    if (length_ == 0) return;
    Emit(start_);
    const TimelinePoint& first = lo_.index < hi_.index ? lo_ : hi_;
    const TimelinePoint& second = lo_.index < hi_.index ? hi_ : lo_;
    if (first.index != start_.index) Emit(first);
    if (second.index != start_.index && second.index != first.index) Emit(second);
    length_ = 0;
  }

 private:
  void Emit(const TimelinePoint& p) {
    out_.push_back(p);
    if (labelled_) out_.back().label = trace_.Label(trace_.events[p.index]);
  }
  const Trace& trace_;
  std::vector<TimelinePoint>& out_;
  bool labelled_;
  std::size_t bucket_ = 1, length_ = 0;
  TimelinePoint start_, hi_, lo_;
};

}  // namespace

Estimate Replay(const Trace& trace, const EstimateOptions& options) {
  Estimate est;
  const std::size_t n = trace.events.size();
  est.eventCount = n;
  const bool points = options.timeline != EstimateOptions::Timeline::None;
  TimelineWriter timeline(trace, options, est.timeline);
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
      TimelinePoint p;
      p.index = i;
      p.phase = e.phase;
      p.step = e.step;
      p.layer = e.layer;
      p.category = e.category;
      p.deltaBytes = Signed(e);
      p.totalBytes = total;
      timeline.Add(p);
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
  if (points) timeline.Flush();
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
