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
#include "replay/replay.hpp"

namespace gpumem {
namespace {


std::int64_t Signed(const Event& e) { return e.kind == EventKind::Alloc ? e.bytes : -e.bytes; }

// One moment to describe (the peak, each phase's peak, the end of forward): per category the
// bytes live, how many tensors, and the four largest (ties in tensor order, as a stable sort
// by size would leave them).
struct Moment {
  std::size_t at = 0;
  Phase phase = Phase::Init;
  struct Row {
    std::int64_t bytes = 0;
    std::int64_t tensors = 0;
    const Event* largest[4] = {};
  };
  std::array<Row, kCategoryCount> rows;

  void Add(const Event* e) {
    Row& r = rows[static_cast<int>(e->category)];
    r.bytes += e->bytes;
    const int held = static_cast<int>(std::min<std::int64_t>(r.tensors, 4));
    ++r.tensors;
    // Tensors arrive in id order: a later one only displaces strictly smaller ones.
    int k = held;
    while (k > 0 && r.largest[k - 1]->bytes < e->bytes) --k;
    if (k >= 4) return;
    for (int j = std::min(held, 3); j > k; --j) r.largest[j] = r.largest[j - 1];
    r.largest[k] = e;
  }
};

// Fills every moment (sorted by event) in allocation order: one sweep over the events keeps
// the live tensors in a list (appended on allocation, unlinked on free), and each moment reads
// the list as it stands. Used only for a trace whose ids are not in event order.
void DescribeBySweep(const Trace& trace, std::vector<Moment*>& moments) {
  const std::size_t tensors = trace.allocAt.size();
  constexpr int kNone = -1;
  std::vector<int> next(tensors, kNone), prev(tensors, kNone);
  int head = kNone, tail = kNone;
  std::size_t m = 0;
  std::size_t nextAt = moments.front()->at;
  const std::size_t last = std::min(moments.back()->at + 1, trace.events.size());
  for (std::size_t i = 0; i < last; ++i) {
    const Event& e = trace.events[i];
    const int id = e.tensorId;
    if (e.kind == EventKind::Alloc) {
      prev[static_cast<std::size_t>(id)] = tail;
      if (tail != kNone) next[static_cast<std::size_t>(tail)] = id;
      else head = id;
      tail = id;
    } else {
      const int p = prev[static_cast<std::size_t>(id)], n = next[static_cast<std::size_t>(id)];
      if (p != kNone) next[static_cast<std::size_t>(p)] = n;
      else head = n;
      if (n != kNone) prev[static_cast<std::size_t>(n)] = p;
      else tail = p;
    }
    if (i != nextAt) continue;
    // Moments at the same event (the peak is always one phase's peak) read the list once.
    Moment& first = *moments[m];
    for (int t = head; t != kNone; t = next[static_cast<std::size_t>(t)]) {
      first.Add(&trace.events[trace.allocAt[static_cast<std::size_t>(t)]]);
    }
    for (++m; m < moments.size() && moments[m]->at == i; ++m) moments[m]->rows = first.rows;
    if (m < moments.size()) nextAt = moments[m]->at;
  }
}

// Fills every moment with the tensors live at it, in tensor order. Tensor ids are handed out
// in event order (TraceBuilder::Alloc and Repeat), so allocAt rises with the id: the tensors
// live at event `at` are those with allocAt ≤ at < freeAt, read by one scan over the ids
// allocated by then. A handful of moments (at most six, fewer distinct) each scan a prefix of
// the tensors: about two loads and two compares per tensor, where a sweep over every event
// keeping a linked list of the live tensors cost about 30 instructions per event.
// Without words (the solver's and the views' estimates) a moment needs only each category's
// bytes and tensor count, not its largest tensors: running sums over one sweep of the events up
// to the last moment give them (a few instructions per event, where the scans below read every
// live tensor at every moment).
void DescribeTotals(const Trace& trace, std::vector<Moment*>& moments) {
  std::array<Moment::Row, kCategoryCount> rows{};
  std::size_t m = 0;
  const std::size_t last = std::min(moments.back()->at + 1, trace.events.size());
  for (std::size_t i = 0; i < last; ++i) {
    const Event& e = trace.events[i];
    Moment::Row& r = rows[static_cast<int>(e.category)];
    if (e.kind == EventKind::Alloc) {
      r.bytes += e.bytes;
      ++r.tensors;
    } else {
      r.bytes -= e.bytes;
      --r.tensors;
    }
    for (; m < moments.size() && moments[m]->at == i; ++m) moments[m]->rows = rows;
  }
}

void Describe(const Trace& trace, std::vector<Moment*>& moments) {
  if (moments.empty()) return;
  std::sort(moments.begin(), moments.end(), [](const Moment* a, const Moment* b) { return a->at < b->at; });
  if (!trace.text.enabled()) {
    DescribeTotals(trace, moments);
    return;
  }
  const std::size_t tensors = trace.allocAt.size();
  const std::uint32_t* allocAt = trace.allocAt.data();
  const std::uint32_t* freeAt = trace.freeAt.data();
  // A trace built elsewhere could hand ids out of event order: then the sweep below, which
  // keeps allocation order, is the one that is right.
  // Without an early exit, so that the compiler vectorizes it (an eighth of Describe's scans).
  // Compared as signed after flipping the top bit (the same order): SSE2 has no unsigned
  // compare, and the unsigned loop stayed scalar (180 k -> 45 k instructions per Mixtral
  // estimate, callgrind).
  // An int accumulator: GCC leaves a bool `|=` reduction scalar.
  int disordered = 0;
  for (std::size_t t = 1; t < tensors; ++t) {
    disordered |= static_cast<std::int32_t>(allocAt[t - 1] ^ 0x80000000u) >= static_cast<std::int32_t>(allocAt[t] ^ 0x80000000u) ? 1 : 0;
  }
  if (disordered != 0) {
    DescribeBySweep(trace, moments);
    return;
  }
  // The tensors held from the start to the last moment (the parameters and master weights
  // that init allocates and nothing frees: two fifths of what is live at a Mixtral moment) are
  // the same first ids at every moment from the last one's allocation on: added once and
  // copied, the later moments' scans start after them (Add keeps tensor order either way).
  const std::size_t lastAt = moments.back()->at;
  std::size_t held = 0;
  while (held < tensors && freeAt[held] > lastAt && allocAt[held] <= moments.front()->at) ++held;
  Moment prefix;
  for (std::size_t t = 0; t < held; ++t) prefix.Add(&trace.events[allocAt[t]]);
  for (std::size_t m = 0; m < moments.size();) {
    Moment& first = *moments[m];
    const std::size_t at = first.at;
    if (at < trace.events.size()) {
      // The tensors allocated by `at`: a prefix of the ids, found by a binary search.
      const std::size_t end = static_cast<std::size_t>(
          std::upper_bound(allocAt, allocAt + tensors, static_cast<std::uint32_t>(at)) - allocAt);
      first.rows = prefix.rows;
      for (std::size_t t = held; t < end; ++t) {
        if (freeAt[t] > at) first.Add(&trace.events[allocAt[t]]);
      }
    }
    // Moments at the same event (the peak is always one phase's peak) read the scan once.
    for (++m; m < moments.size() && moments[m]->at == at; ++m) moments[m]->rows = first.rows;
  }
}

// Whether `known` (the model states' rows) holds this row: EstimateMemory then replaces its
// formula with the model state's (UseModelStateFormulas), so the tensor list is not rendered.
bool Replaced(std::span<const CategoryBytes> known, Category category, std::int64_t bytes) {
  for (const CategoryBytes& row : known) {
    if (row.category == category && row.bytes == bytes) return true;
  }
  return false;
}

Snapshot ToSnapshot(const Trace& trace, const Moment& m, std::span<const CategoryBytes> known) {
  Snapshot s;
  s.phase = m.phase;
  s.eventIndex = m.at;
  if (m.at < trace.events.size()) {
    s.step = trace.events[m.at].step;
    if (trace.text.enabled()) s.label = trace.Label(trace.events[m.at]);
  }
  for (int c = 0; c < kCategoryCount; ++c) {
    const Moment::Row& r = m.rows[c];
    if (r.tensors == 0) continue;
    CategoryBytes row;
    row.category = static_cast<Category>(c);
    row.bytes = r.bytes;
    if (trace.text.enabled() && !Replaced(known, row.category, row.bytes)) {
      std::int64_t rest = r.bytes;
      const int shown = static_cast<int>(std::min<std::int64_t>(r.tensors, 4));
      // Room for four tensors' names and shapes at once (growing by doubling was 1.4 % of a
      // GPT-2 estimate in wasm, node --cpu-prof).
      row.formula.reserve(384);
      for (int k = 0; k < shown; ++k) {
        if (k) row.formula += " + ";
        trace.text.RenderTo(r.largest[k]->tensor, row.formula);
        row.formula += " (";
        trace.text.RenderTo(r.largest[k]->formula, row.formula);
        row.formula += ")";
        rest -= r.largest[k]->bytes;
      }
      if (r.tensors > 4) {
        row.formula += " + ";
        row.formula += FormatCount(r.tensors - 4);
        row.formula += " more tensors (";
        row.formula += FormatCount(rest);
        row.formula += " B)";
      }
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

Estimate Replay(const Trace& trace, const EstimateOptions& options) { return Replay(trace, options, {}); }

Estimate Replay(const Trace& trace, const EstimateOptions& options, std::span<const CategoryBytes> known) {
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
  int previousPhase = -1;
  // With timeline points, every event in turn.
  auto run = [&]<bool kPoints>() {
    for (std::size_t i = 0; i < n; ++i) {
      const Event& e = trace.events[i];
      const int phase = static_cast<int>(e.phase);
      // The total before this event counts for its phase only on entering the phase: after an
      // event of the same phase, that phase's maximum already holds the total.
      if (phase != previousPhase) {
        if (i > 0 && total > phaseMax[phase]) {
          phaseMax[phase] = total;
          phaseIndex[phase] = i - 1;
        }
        previousPhase = phase;
      }
      total += Signed(e);
      if constexpr (kPoints) {
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
  };
  // Without points, by runs of one phase: the phase's maximum stays in a register, the overall
  // peak (never below a phase's maximum) is tested only when the phase's maximum rises, and the
  // end of step 1's forward is looked for once per forward run, from its end.
  auto runByPhase = [&] {
    const Event* events = trace.events.data();
    for (std::size_t i = 0; i < n;) {
      const Phase runPhase = events[i].phase;
      const int phase = static_cast<int>(runPhase);
      std::int64_t phasePeak = phaseMax[phase];
      std::size_t phasePeakAt = phaseIndex[phase];
      if (i > 0 && total > phasePeak) {  // the total on entry counts for the phase
        phasePeak = total;
        phasePeakAt = i - 1;
      }
      std::size_t j = i;
      for (; j < n && events[j].phase == runPhase; ++j) {
        total += Signed(events[j]);
        if (total > phasePeak) {
          phasePeak = total;
          phasePeakAt = j;
          if (total > peakTotal) {
            peakTotal = total;
            peakIndex = j;
          }
        }
      }
      phaseMax[phase] = phasePeak;
      phaseIndex[phase] = phasePeakAt;
      if (runPhase == Phase::Forward) {
        for (std::size_t k = j; k > i; --k) {
          if (events[k - 1].step == 1) {
            lastForward = k - 1;
            break;
          }
        }
      }
      i = j;
    }
  };
  if (points) {
    run.template operator()<true>();
  } else {
    runByPhase();
  }
  if (points) timeline.Flush();
  // The moments to describe: the peak, each phase's peak, the end of step 1's forward.
  Moment peak, phases[kPhases], forwardEnd;
  std::vector<Moment*> moments;
  if (n > 0) {
    peak.at = peakIndex;
    peak.phase = trace.events[peakIndex].phase;
    moments.push_back(&peak);
  }
  for (int p = 0; p < kPhases; ++p) {
    phases[p].phase = static_cast<Phase>(p);
    if (phaseMax[p] < 0) continue;
    phases[p].at = phaseIndex[p];
    moments.push_back(&phases[p]);
  }
  if (lastForward < n) {
    forwardEnd.at = lastForward;
    forwardEnd.phase = Phase::Forward;
    moments.push_back(&forwardEnd);
  }
  Describe(trace, moments);
  if (n > 0) est.peak = ToSnapshot(trace, peak, known);
  for (int p = 0; p < kPhases; ++p) {
    if (phaseMax[p] < 0) {
      Snapshot empty;
      empty.phase = static_cast<Phase>(p);
      est.phasePeaks.push_back(empty);
    } else {
      est.phasePeaks.push_back(ToSnapshot(trace, phases[p], known));
    }
  }
  if (lastForward < n) est.forwardEnd = ToSnapshot(trace, forwardEnd, known);
  est.notes = trace.notes;
  return est;
}

}  // namespace gpumem
