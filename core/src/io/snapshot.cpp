// A PyTorch memory snapshot (snapshot.hpp) read into a measured timeline. The structure is
// torch/csrc/cuda/memory_snapshot.cpp's _memory_snapshot_pickled (keys, actions, block states),
// pickled again by torch/cuda/memory.py's _dump_snapshot with Python's pickle.dump.
//
// The trace is a window (a ring buffer of max_entries) that ends at the snapshot, so the
// segments give the state at its end and the state at its start is reconstructed backwards:
// start = end − Σ(changes).
// Changes per action, meant to match the allocator's statistics (c10/cuda/CUDACachingAllocator.cpp;
// the free_requested rule is from memory of its free(), not re-read for this change: to verify
// against a real CUDA snapshot and torch.cuda.max_memory_allocated()):
//   alloc          +size allocated  (allocated_bytes grows in malloc)
//   free_requested −size allocated  (free() lowers allocated_bytes at once; the block stays
//                                    "active" until other streams' uses finish)
//   free_completed  no change — except in a trace without any free_requested, where it is
//                   the only free there is
//   segment_alloc / segment_map   +size reserved (cudaMalloc; expandable segments map pages)
//   segment_free  / segment_unmap −size reserved
//   snapshot, oom   no change (oom is counted)
#include "gpumem/snapshot.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "gpumem/estimate.hpp"
#include "gpumem/json.hpp"
#include "io/estimate_json.hpp"
#include "io/json_writer.hpp"
#include "gpumem/pickle.hpp"

namespace gpumem {

namespace {

// Bounds that keep every sum far from int64 overflow: a size of at most 1 TiB (no GPU holds
// more) times at most 2^22 trace entries per device is at most 2^62 bytes.
constexpr std::int64_t kMaxSizeBytes = std::int64_t{1} << 40;
constexpr std::size_t kMaxTraceEntries = std::size_t{1} << 22;

using pickle::Document;
using pickle::Kind;
using pickle::Node;

struct Entry {
  enum class Action { Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, Snapshot, Oom, Other };
  Action action = Action::Other;
  std::int64_t size = 0;
  std::int64_t timeMicros = -1;
};

struct DeviceState {
  SegmentSummary segments;
  std::vector<Entry> trace;
  bool seen = false;
};

class SnapshotReader {
 public:
  explicit SnapshotReader(const Document& doc) : doc_(doc) {
    // Memo references let a list repeat one large value many times for a few bytes each; a
    // walk that follows them is bounded by this budget (PyTorch never repeats a segment).
    budget_ = doc.nodes.size() * 16 + 1024;
    const Node& root = doc.at(doc.root);
    if (root.kind == Kind::Dict) budget_ += root.items.size();
  }

  bool Read(std::map<int, DeviceState>& devices) {
    const Node& root = doc_.at(doc_.root);
    if (root.kind != Kind::Dict) return Fail("snapshot", std::string("the pickle holds a ") + pickle::KindName(root.kind) +
                                                         ", not the dict torch.cuda.memory._snapshot() returns");
    const Node* segments = doc_.Get(root, "segments");
    const Node* traces = doc_.Get(root, "device_traces");
    if (!segments) return Fail("snapshot.segments", "missing: this is not a torch.cuda.memory._dump_snapshot() file");
    if (segments->kind != Kind::List) return Fail("snapshot.segments", "must be a list");
    for (std::size_t i = 0; i < segments->items.size(); ++i) {
      if (!Spend(doc_.at(segments->items[i]))) return false;
      if (!ReadSegment(doc_.at(segments->items[i]), "snapshot.segments[" + std::to_string(i) + "]", devices)) return false;
    }
    if (traces) {  // absent when history was never recorded in some versions: the state alone
      if (traces->kind != Kind::List) return Fail("snapshot.device_traces", "must be a list (one list per device)");
      for (std::size_t d = 0; d < traces->items.size(); ++d) {
        const Node& list = doc_.at(traces->items[d]);
        const std::string where = "snapshot.device_traces[" + std::to_string(d) + "]";
        if (list.kind != Kind::List) return Fail(where, "must be a list of trace entries");
        if (list.items.size() > kMaxTraceEntries)
          return Fail(where, "more than " + std::to_string(kMaxTraceEntries) + " trace entries on one device");
        DeviceState& device = devices[static_cast<int>(d)];
        if (!list.items.empty()) device.seen = true;
        device.trace.reserve(list.items.size());
        for (std::size_t i = 0; i < list.items.size(); ++i) {
          if (!Spend(doc_.at(list.items[i]))) return false;
          Entry e;
          if (!ReadEntry(doc_.at(list.items[i]), where + "[" + std::to_string(i) + "]", e)) return false;
          device.trace.push_back(e);
        }
      }
    }
    return true;
  }

  std::vector<FieldError> errors;

 private:
  bool Fail(std::string field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::move(field), std::move(message)});
    return false;
  }
  // Charges one visit of a value: 1 plus its dict keys (each key lookup scans them), so the
  // whole walk, lookups included, stays linear in the document.
  bool Spend(const Node& visited) {
    const std::size_t cost = 1 + (visited.kind == Kind::Dict ? visited.items.size() : 0);
    if (budget_ < cost) {
      return Fail("snapshot", "the pickle repeats shared values far more than a PyTorch snapshot does; refused");
    }
    budget_ -= cost;
    return true;
  }
  // A non-negative integer field; `required` false accepts absence (value left unchanged).
  bool Int(const Node& dict, const char* key, const std::string& where, std::int64_t& out, bool required = true,
           bool allowNegative = false) {
    const Node* v = doc_.Get(dict, key);
    if (!v) return required ? Fail(where + "." + key, "missing") : true;
    if (v->kind == Kind::BigInt) return Fail(where + "." + key, "an integer beyond 64 bits");
    if (v->kind != Kind::Int) return Fail(where + "." + key, std::string("must be an int, not a ") + pickle::KindName(v->kind));
    if (v->integer < 0 && !allowNegative) return Fail(where + "." + key, "must not be negative");
    out = v->integer;
    return true;
  }
  const std::string_view* Text(const Node& dict, const char* key) {
    const Node* v = doc_.Get(dict, key);
    return v && v->kind == Kind::String ? &v->text : nullptr;
  }

  bool ReadSegment(const Node& seg, const std::string& where, std::map<int, DeviceState>& devices) {
    if (seg.kind != Kind::Dict) return Fail(where, "must be a dict");
    std::int64_t device = 0, total = 0;
    if (!Int(seg, "device", where, device, false) || !Int(seg, "total_size", where, total)) return false;
    if (device > 1 << 20) return Fail(where + ".device", "is not a device index");
    DeviceState& state = devices[static_cast<int>(device)];
    state.seen = true;
    SegmentSummary& s = state.segments;
    if (total > kMaxSizeBytes || s.reservedBytes > (std::int64_t{1} << 56))
      return Fail(where + ".total_size", "is beyond any GPU");
    ++s.count;
    s.reservedBytes += total;
    if (const std::string_view* type = Text(seg, "segment_type"); type && *type == "large") ++s.largeCount;
    const Node* blocks = doc_.Get(seg, "blocks");
    if (!blocks) {  // a snapshot without blocks: the segment's own totals
      std::int64_t allocated = 0, active = 0;
      if (!Int(seg, "allocated_size", where, allocated) || !Int(seg, "active_size", where, active, false)) return false;
      if (allocated > total || active > total) return Fail(where + ".allocated_size", "is more than the segment's total_size");
      s.allocatedBytes += allocated;
      s.activeBytes += std::max(active, allocated);
      return true;
    }
    if (blocks->kind != Kind::List) return Fail(where + ".blocks", "must be a list");
    std::int64_t inSegment = 0;
    for (std::size_t i = 0; i < blocks->items.size(); ++i) {
      if (!Spend(doc_.at(blocks->items[i]))) return false;
      const Node& b = doc_.at(blocks->items[i]);
      const std::string at = where + ".blocks[" + std::to_string(i) + "]";
      if (b.kind != Kind::Dict) return Fail(at, "must be a dict");
      std::int64_t size = 0;
      if (!Int(b, "size", at, size)) return false;
      const std::string_view* state = Text(b, "state");
      if (!state) return Fail(at + ".state", "missing or not a str");
      if (size > total - inSegment) return Fail(at + ".size", "the blocks add up to more than the segment's total_size");
      inSegment += size;
      ++s.blockCount;
      // States of memory_snapshot.cpp; "active_awaiting_free" is the name in memory.py's docs.
      if (*state == "active_allocated") {
        s.allocatedBytes += size;
        s.activeBytes += size;
      } else if (*state == "active_pending_free" || *state == "active_awaiting_free") {
        s.activeBytes += size;
      } else if (*state == "inactive") {
        ++s.inactiveBlockCount;
        s.inactiveBytes += size;
        s.largestInactiveBlockBytes = std::max(s.largestInactiveBlockBytes, size);
      } else {
        return Fail(at + ".state", "not a block state of PyTorch (active_allocated, active_pending_free, inactive)");
      }
    }
    return true;
  }

  bool ReadEntry(const Node& e, const std::string& where, Entry& out) {
    if (e.kind != Kind::Dict) return Fail(where, "must be a dict");
    const std::string_view* action = Text(e, "action");
    if (!action) return Fail(where + ".action", "missing or not a str");
    using A = Entry::Action;
    static const std::pair<const char*, A> kActions[] = {
        {"alloc", A::Alloc},          {"free_requested", A::FreeRequested}, {"free_completed", A::FreeCompleted},
        {"segment_alloc", A::SegmentAlloc}, {"segment_map", A::SegmentAlloc},   {"segment_free", A::SegmentFree},
        {"segment_unmap", A::SegmentFree},  {"snapshot", A::Snapshot},          {"oom", A::Oom}};
    for (const auto& [name, a] : kActions)
      if (*action == name) out.action = a;
    if (out.action != A::Snapshot && out.action != A::Oom && out.action != A::Other) {
      if (!Int(e, "size", where, out.size)) return false;
      if (out.size > kMaxSizeBytes) return Fail(where + ".size", "is beyond any GPU");
    }
    if (!Int(e, "time_us", where, out.timeMicros, false, true)) return false;
    return true;
  }

  const Document& doc_;
  std::size_t budget_ = 0;
};

void Thin(std::vector<MeasuredPoint>& points, std::size_t limit) {
  limit = std::max<std::size_t>(limit, 4);
  if (points.size() <= limit) return;
  // Two points per bucket (the highest allocated, the highest reserved), the last point kept.
  const std::size_t buckets = (limit - 1) / 2;
  const std::size_t per = (points.size() + buckets - 1) / buckets;
  std::vector<MeasuredPoint> out;
  out.reserve(limit);
  for (std::size_t start = 0; start < points.size(); start += per) {
    const std::size_t end = std::min(points.size(), start + per);
    std::size_t a = start, r = start;
    for (std::size_t i = start; i < end; ++i) {
      if (points[i].allocatedBytes > points[a].allocatedBytes) a = i;
      if (points[i].reservedBytes > points[r].reservedBytes) r = i;
    }
    out.push_back(points[std::min(a, r)]);
    if (a != r) out.push_back(points[std::max(a, r)]);
  }
  if (out.back().index != points.back().index) out.push_back(points.back());
  points = std::move(out);
}

// One device's timeline from its end state and its trace.
MeasuredMemory Measure(int device, const DeviceState& state, std::size_t timelineLimit) {
  MeasuredMemory m;
  m.device = device;
  m.segments = state.segments;
  const SegmentSummary& s = m.segments;
  if (s.inactiveBytes > 0) m.segments.fragmentation = 1.0 - double(s.largestInactiveBlockBytes) / double(s.inactiveBytes);
  m.traceEntries = state.trace.size();
  const bool hasFreeRequested = std::any_of(state.trace.begin(), state.trace.end(), [](const Entry& e) {
    return e.action == Entry::Action::FreeRequested;
  });
  auto deltas = [&](const Entry& e, std::int64_t& allocated, std::int64_t& reserved) {
    allocated = reserved = 0;
    switch (e.action) {
      case Entry::Action::Alloc: allocated = e.size; break;
      case Entry::Action::FreeRequested: allocated = -e.size; break;
      case Entry::Action::FreeCompleted: allocated = hasFreeRequested ? 0 : -e.size; break;
      case Entry::Action::SegmentAlloc: reserved = e.size; break;
      case Entry::Action::SegmentFree: reserved = -e.size; break;
      default: break;
    }
  };
  // Net change over the window, and the lowest running change (a valid trace never takes the
  // totals below zero, so the start is at least minus that).
  std::int64_t netAllocated = 0, netReserved = 0, lowestAllocated = 0, lowestReserved = 0;
  for (const Entry& e : state.trace) {
    std::int64_t a = 0, r = 0;
    deltas(e, a, r);
    netAllocated += a;
    netReserved += r;
    lowestAllocated = std::min(lowestAllocated, netAllocated);
    lowestReserved = std::min(lowestReserved, netReserved);
    if (e.action == Entry::Action::Oom) ++m.oomCount;
  }
  m.startAllocatedBytes = s.allocatedBytes - netAllocated;
  m.startReservedBytes = s.reservedBytes - netReserved;
  if (m.startAllocatedBytes < -lowestAllocated || m.startReservedBytes < -lowestReserved) {
    m.notes.push_back("The trace frees more than the segments and the recorded allocations account for (a trace "
                      "from another moment than the segments?); the timeline is raised so that it never goes below zero.");
    m.startAllocatedBytes = std::max(m.startAllocatedBytes, -lowestAllocated);
    m.startReservedBytes = std::max(m.startReservedBytes, -lowestReserved);
  }
  if (state.trace.empty()) {
    m.notes.push_back("The snapshot has no trace entries (record with torch.cuda.memory._record_memory_history() "
                      "before the step): the peaks are the state at the moment of the snapshot.");
  }
  std::vector<MeasuredPoint> points;
  points.reserve(state.trace.size() + 1);
  MeasuredPoint p{0, m.startAllocatedBytes, m.startReservedBytes,
                  state.trace.empty() ? -1 : state.trace.front().timeMicros};
  points.push_back(p);
  m.peakAllocatedBytes = p.allocatedBytes;
  m.peakReservedBytes = p.reservedBytes;
  for (std::size_t i = 0; i < state.trace.size(); ++i) {
    std::int64_t a = 0, r = 0;
    deltas(state.trace[i], a, r);
    p.index = i + 1;
    p.allocatedBytes += a;
    p.reservedBytes += r;
    p.timeMicros = state.trace[i].timeMicros;
    points.push_back(p);
    if (p.allocatedBytes > m.peakAllocatedBytes) {
      m.peakAllocatedBytes = p.allocatedBytes;
      m.peakAllocatedIndex = p.index;
    }
    m.peakReservedBytes = std::max(m.peakReservedBytes, p.reservedBytes);
  }
  Thin(points, timelineLimit);
  m.timeline = std::move(points);
  if (m.oomCount > 0) m.notes.push_back("The trace records " + std::to_string(m.oomCount) + " out-of-memory event(s).");
  return m;
}

void WriteMeasured(JsonWriter& w, const MeasuredMemory& m) {
  const SegmentSummary& s = m.segments;
  w.BeginObject()
      .Key("device").Int(m.device)
      .Key("deviceCount").Int(static_cast<std::int64_t>(m.deviceCount))
      .Key("traceEntries").Int(static_cast<std::int64_t>(m.traceEntries))
      .Key("peakAllocatedBytes").Int(m.peakAllocatedBytes)
      .Key("peakReservedBytes").Int(m.peakReservedBytes)
      .Key("peakAllocatedIndex").Int(static_cast<std::int64_t>(m.peakAllocatedIndex))
      .Key("startAllocatedBytes").Int(m.startAllocatedBytes)
      .Key("startReservedBytes").Int(m.startReservedBytes)
      .Key("oomCount").Int(static_cast<std::int64_t>(m.oomCount))
      .Key("segments").BeginObject()
      .Key("count").Int(static_cast<std::int64_t>(s.count))
      .Key("largeCount").Int(static_cast<std::int64_t>(s.largeCount))
      .Key("blockCount").Int(static_cast<std::int64_t>(s.blockCount))
      .Key("inactiveBlockCount").Int(static_cast<std::int64_t>(s.inactiveBlockCount))
      .Key("reservedBytes").Int(s.reservedBytes)
      .Key("allocatedBytes").Int(s.allocatedBytes)
      .Key("activeBytes").Int(s.activeBytes)
      .Key("inactiveBytes").Int(s.inactiveBytes)
      .Key("largestInactiveBlockBytes").Int(s.largestInactiveBlockBytes)
      .Key("fragmentation").Double(s.fragmentation)
      .EndObject()
      .Key("timeline").BeginArray();
  for (const MeasuredPoint& p : m.timeline) {
    w.BeginObject()
        .Key("index").Int(static_cast<std::int64_t>(p.index))
        .Key("allocatedBytes").Int(p.allocatedBytes)
        .Key("reservedBytes").Int(p.reservedBytes)
        .Key("timeMicros").Int(p.timeMicros)
        .EndObject();
  }
  w.EndArray().Key("notes").Strings(m.notes).EndObject();
}

}  // namespace

MeasuredResult ReadMemorySnapshot(std::string_view pickleBytes, std::size_t timelineLimit) {
  MeasuredResult result;
  const pickle::Result unpickled = pickle::Unpickle(pickleBytes);
  if (!unpickled.ok()) {
    result.errors.push_back({ErrorCode::InvalidField, "snapshot", unpickled.error});
    return result;
  }
  std::map<int, DeviceState> devices;
  SnapshotReader reader(unpickled.document);
  if (!reader.Read(devices)) {
    result.errors = std::move(reader.errors);
    return result;
  }
  // The device with the largest peak reserved (the one that runs out first); the first on ties.
  bool found = false;
  std::size_t seen = 0;
  for (const auto& [id, state] : devices) {
    if (!state.seen) continue;
    ++seen;
    MeasuredMemory m = Measure(id, state, timelineLimit);
    if (!found || m.peakReservedBytes > result.measured.peakReservedBytes) {
      result.measured = std::move(m);
      found = true;
    }
  }
  result.measured.deviceCount = seen;
  if (!found) {
    result.measured.timeline.push_back(MeasuredPoint{});
    result.measured.notes.push_back("The snapshot has no segments and no trace entries: nothing was allocated.");
  }
  return result;
}

std::string CompareSnapshotJson(std::string_view snapshotBytes, std::string_view setupText, int indent) {
  const MeasuredResult measured = ReadMemorySnapshot(snapshotBytes);
  std::vector<FieldError> errors = measured.errors;
  EstimateResult estimate;
  const bool withSetup = !setupText.empty();
  if (withSetup) {
    EstimateOptions options;
    options.timeline = EstimateOptions::Timeline::Points;
    options.explain = false;
    estimate = EstimateFromJson(setupText, options);
    errors.insert(errors.end(), estimate.errors.begin(), estimate.errors.end());
  }
  JsonWriter w(indent);
  if (!errors.empty()) {
    w.BeginObject().Key("ok").Bool(false).Key("errors").BeginArray();
    for (const FieldError& e : errors) {
      w.BeginObject().Key("code").String(ErrorCodeId(e.code)).Key("field").String(e.field)
          .Key("message").String(e.message).EndObject();
    }
    w.EndArray().EndObject();
    return std::move(w.text());
  }
  w.BeginObject().Key("ok").Bool(true).Key("measured");
  WriteMeasured(w, measured.measured);
  w.Key("estimate");
  if (!withSetup) {
    w.Null().Key("comparison").Null();
  } else {
    const Estimate& e = estimate.estimate;
    w.BeginObject()
        .Key("peakBytes").Int(e.peak.totalBytes)
        .Key("peakAllocatedBytes").Int(e.device.peakAllocatedBytes)
        .Key("peakReservedBytes").Int(e.device.peakReservedBytes)
        .Key("gpuCapacityBytes").Int(e.gpuCapacityBytes)
        .Key("timeline").BeginArray();
    for (const TimelinePoint& p : e.timeline) {
      w.BeginObject().Key("index").Int(static_cast<std::int64_t>(p.index)).Key("totalBytes").Int(p.totalBytes).EndObject();
    }
    w.EndArray().EndObject();
    w.Key("comparison").BeginObject()
        // Like for like: the allocator's figures (tensors rounded, workspaces) against the
        // snapshot's, which records every request the allocator served.
        .Key("estimateMinusPeakAllocatedBytes").Int(e.device.peakAllocatedBytes - measured.measured.peakAllocatedBytes)
        .Key("estimateMinusPeakReservedBytes").Int(e.device.peakReservedBytes - measured.measured.peakReservedBytes)
        .EndObject();
  }
  w.EndObject();
  return std::move(w.text());
}

}  // namespace gpumem
