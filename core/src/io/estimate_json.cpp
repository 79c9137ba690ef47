// An Estimate as JSON (docs/schema.md), written directly: this is the text every estimate in
// the page crosses the wasm boundary as, so it is kept small and cheap to write.
#include "io/estimate_json.hpp"

#include <cstdio>

#include "gpumem/names.hpp"
#include "io/json_writer.hpp"

namespace gpumem {
namespace {

void WriteRows(JsonWriter& w, const std::vector<CategoryBytes>& rows) {
  w.BeginArray();
  for (const CategoryBytes& r : rows) {
    w.BeginObject()
        .Key("category").String(IdOf(r.category))
        .Key("label").String(LabelOf(r.category))
        .Key("bytes").Int(r.bytes)
        .Key("formula").String(r.formula)
        .EndObject();
  }
  w.EndArray();
}

void WriteSnapshot(JsonWriter& w, const Snapshot& s) {
  w.BeginObject()
      .Key("totalBytes").Int(s.totalBytes)
      .Key("phase").String(IdOf(s.phase))
      .Key("phaseLabel").String(LabelOf(s.phase))
      .Key("step").Int(s.step)
      .Key("eventIndex").Int(static_cast<std::int64_t>(s.eventIndex))
      .Key("label").String(s.label)
      .Key("byCategory");
  WriteRows(w, s.byCategory);
  w.EndObject();
}

// [{index, phase, step, layer, label?, category, deltaBytes, totalBytes, reservedBytes}…], compact always:
// two thousand points, one per line, would only make the CLI's output longer.
void WriteTimeline(JsonWriter& w, const std::vector<TimelinePoint>& timeline) {
  JsonWriter points;
  points.BeginArray();
  for (const TimelinePoint& p : timeline) {
    points.BeginObject()
        .Key("index").Int(static_cast<std::int64_t>(p.index))
        .Key("phase").String(IdOf(p.phase))
        .Key("step").Int(p.step)
        .Key("layer").Int(p.layer);
    if (!p.label.empty()) points.Key("label").String(p.label);
    points.Key("category").String(IdOf(p.category))
        .Key("deltaBytes").Int(p.deltaBytes)
        .Key("totalBytes").Int(p.totalBytes)
        .Key("reservedBytes").Int(p.reservedBytes)
        .EndObject();
  }
  points.EndArray();
  w.Raw(points.text());
}

// device.segments: null, or {eventIndex, reservedBytes, allocatedBytes, segmentCount,
// omittedSegments, omittedBytes, segments: [{address (hex text), totalBytes, allocatedBytes, pool,
// expandable, omittedBlocks, omittedBlockBytes, omittedAllocatedBlockBytes,
// blocks: [{bytes, requestedBytes, allocated, label}]}]}. Compact, as the timeline.
void WriteSegments(JsonWriter& w, const DeviceSegments& p) {
  if (!p.recorded) {
    w.Null();
    return;
  }
  JsonWriter o;
  o.BeginObject()
      .Key("eventIndex").Int(static_cast<std::int64_t>(p.eventIndex))
      .Key("reservedBytes").Int(p.reservedBytes)
      .Key("allocatedBytes").Int(p.allocatedBytes)
      .Key("segmentCount").Int(p.segmentCount)
      .Key("omittedSegments").Int(p.omittedSegments)
      .Key("omittedBytes").Int(p.omittedBytes)
      .Key("segments").BeginArray();
  for (const DeviceSegment& s : p.segments) {
    // The address as hex text, as memory_viz prints it: expandable segments of a run without a
    // limit reserve their virtual range past 2^53, which a JS number would round.
    char address[24];
    std::snprintf(address, sizeof address, "0x%llx", static_cast<unsigned long long>(s.address));
    o.BeginObject()
        .Key("address").String(address)
        .Key("totalBytes").Int(s.totalBytes)
        .Key("allocatedBytes").Int(s.allocatedBytes)
        .Key("pool").String(s.smallPool ? "small" : "large")
        .Key("expandable").Bool(s.expandable)
        .Key("stream").Int(s.stream)
        .Key("omittedBlocks").Int(s.omittedBlocks)
        .Key("omittedBlockBytes").Int(s.omittedBlockBytes)
        .Key("omittedAllocatedBlockBytes").Int(s.omittedAllocatedBlockBytes)
        .Key("blocks").BeginArray();
    for (const DeviceSegmentBlock& b : s.blocks) {
      o.BeginObject()
          .Key("bytes").Int(b.bytes)
          .Key("requestedBytes").Int(b.requestedBytes)
          .Key("allocated").Bool(b.allocated)
          .Key("label").String(b.label)
          .EndObject();
    }
    o.EndArray().EndObject();
  }
  o.EndArray().EndObject();
  w.Raw(o.text());
}

void WriteDevice(JsonWriter& w, const DeviceEstimate& d) {
  w.BeginObject()
      .Key("peakAllocatedBytes").Int(d.peakAllocatedBytes)
      .Key("peakReservedBytes").Int(d.peakReservedBytes)
      .Key("fragmentationBytes").Int(d.fragmentationBytes)
      .Key("contextBytes").Int(d.contextBytes)
      .Key("workspaceBytes").Int(d.workspaceBytes)
      .Key("communicationBytes").Int(d.communicationBytes)
      .Key("unifiedBytes").Int(d.unifiedBytes)
      .Key("unifiedEvictedBytes").Int(d.unifiedEvictedBytes)
      .Key("peakDeviceBytes").Int(d.peakDeviceBytes)
      .Key("capacityBytes").Int(d.capacityBytes)
      .Key("fits").Bool(d.fits)
      .Key("tight").Bool(d.tight)
      .Key("verdict").String(d.verdict)
      .Key("why").String(d.why)
      .Key("headroomBytes").Int(d.headroomBytes)
      .Key("numAllocRetries").Int(d.numAllocRetries)
      .Key("fragmentationExplanation").String(d.fragmentationExplanation)
      .Key("formulas").BeginObject()
      .Key("peakAllocatedBytes").String(d.peakAllocatedFormula)
      .Key("peakReservedBytes").String(d.peakReservedFormula)
      .Key("fragmentationBytes").String(d.fragmentationFormula)
      .Key("contextBytes").String(d.contextFormula)
      .Key("workspaceBytes").String(d.workspaceFormula)
      .Key("communicationBytes").String(d.communicationFormula)
      .Key("unifiedBytes").String(d.unifiedFormula)
      .Key("peakDeviceBytes").String(d.peakDeviceFormula)
      .Key("headroomBytes").String(d.headroomFormula)
      .EndObject()
      .Key("oom");
  if (!d.oom.happened) {
    w.Null();
  } else {
    w.BeginObject()
        .Key("eventIndex").Int(static_cast<std::int64_t>(d.oom.eventIndex))
        .Key("label").String(d.oom.label)
        .Key("requestedBytes").Int(d.oom.requestedBytes)
        .Key("freeBytes").Int(d.oom.freeBytes)
        .Key("largestFreeBlockBytes").Int(d.oom.largestFreeBlockBytes)
        .Key("freeFragments").Int(d.oom.freeFragments)
        .Key("explanation").String(d.oom.explanation)
        .EndObject();
  }
  w.Key("segments");
  WriteSegments(w, d.segments);
  w.EndObject();
}

}  // namespace

void WriteEstimate(JsonWriter& w, const Estimate& e) {
  const ModelStates& m = e.modelStates;
  w.BeginObject()
      .Key("schemaVersion").Int(kEstimateSchemaVersion)
      .Key("activationsFromHeuristic").Bool(e.activationsFromHeuristic)
      .Key("modelStates").BeginObject()
      .Key("parameterCount").Int(m.parameterCount)
      .Key("parameterFormula").String(m.parameterFormula)
      .Key("preset");
  if (m.presetId.empty()) {
    w.Null();
  } else {
    w.BeginObject()
        .Key("id").String(m.presetId)
        .Key("publishedParameters").Int(m.publishedParameters)
        .Key("differenceFromPublished").Int(m.differenceFromPublished)
        .EndObject();
  }
  w.Key("parametersBytes").Int(m.parametersBytes)
      .Key("masterWeightsBytes").Int(m.masterWeightsBytes)
      .Key("gradientsBytes").Int(m.gradientsBytes)
      .Key("optimizerStatesBytes").Int(m.optimizerStatesBytes)
      .Key("totalBytes").Int(m.totalBytes)
      .Key("rows");
  WriteRows(w, m.rows);
  w.EndObject().Key("peak");
  WriteSnapshot(w, e.peak);
  w.Key("peakExplanation").String(e.peakExplanation)
      .Key("peakDominant").BeginObject()
      .Key("category").String(IdOf(e.peakDominant.category))
      .Key("bytes").Int(e.peakDominant.bytes)
      .Key("sharePercent").Double(e.peakDominant.sharePercent)
      .Key("reason").String(e.peakDominant.reason)
      .EndObject()
      .Key("phasePeaks").BeginArray();
  for (const Snapshot& s : e.phasePeaks) WriteSnapshot(w, s);
  w.EndArray().Key("forwardEnd");
  WriteSnapshot(w, e.forwardEnd);
  w.Key("timelineEventCount").Int(static_cast<std::int64_t>(e.eventCount)).Key("timeline");
  if (e.timeline.empty()) w.Null();
  else WriteTimeline(w, e.timeline);
  w.Key("gpu").BeginObject()
      .Key("capacityBytes").Int(e.gpuCapacityBytes)
      .Key("fits").Bool(e.fits)
      .Key("headroomBytes").Int(e.headroomBytes)
      .EndObject()
      .Key("device");
  WriteDevice(w, e.device);
  if (!e.rank.engineLabel.empty()) {  // many GPUs only (docs/parallel.md): which rank, and why
    w.Key("rank").BeginObject()
        .Key("worldSize").Int(e.rank.worldSize)
        .Key("dataParallelRank").Int(e.rank.dataParallelRank)
        .Key("tensorParallelRank").Int(e.rank.tensorParallelRank)
        .Key("pipelineStage").Int(e.rank.pipelineStage)
        .Key("shardWorld").Int(e.rank.shardWorld)
        .Key("engine").String(e.rank.engineLabel)
        .Key("why").String(e.rank.why)
        .Key("holds").BeginObject()  // where each model state lives (SimulatedRank)
        .Key("parameters").String(e.rank.parametersHeld)
        .Key("masterWeights").String(e.rank.masterWeightsHeld)
        .Key("gradients").String(e.rank.gradientsHeld)
        .Key("optimizerStates").String(e.rank.optimizerStatesHeld)
        .EndObject()
        .EndObject();
  }
  if (!e.host.rows.empty()) {  // only when something lives (or may move) on the host: other estimates keep their JSON
    w.Key("host").BeginObject()
        .Key("rankBytes").Int(e.host.rankBytes)
        .Key("pinnedBytes").Int(e.host.pinnedBytes)
        .Key("ranksPerNode").Int(e.host.ranksPerNode)
        .Key("nodeBytes").Int(e.host.nodeBytes)
        .Key("unifiedBytes").Int(e.host.unifiedBytes);
    if (e.host.capacityBytes > 0) w.Key("capacityBytes").Int(e.host.capacityBytes).Key("fits").Bool(e.host.fits);
    w.Key("rows").BeginArray();
    for (const HostRow& r : e.host.rows) {
      w.BeginObject()
          .Key("label").String(r.label)
          .Key("bytes").Int(r.bytes)
          .Key("formula").String(r.formula)
          .Key("source").String(r.source)
          .Key("memory").String(r.memory)
          .EndObject();
    }
    w.EndArray().EndObject();
  }
  w.Key("notes").Strings(e.notes)
      .EndObject();
}

std::string EstimateEnvelopeJson(const Estimate& e, int indent) {
  JsonWriter w(indent);
  w.BeginObject().Key("ok").Bool(true).Key("estimate");
  WriteEstimate(w, e);
  w.EndObject();
  return std::move(w.text());
}

std::string EstimateOnlyJson(const Estimate& e, int indent) {
  JsonWriter w(indent);
  WriteEstimate(w, e);
  return std::move(w.text());
}

}  // namespace gpumem
