// The views as JSON (docs/schema.md, "Views"): one request object in, an {"ok":…} envelope out.
// Like the other entry points, nothing here throws: nlohmann is used in its non-throwing forms
// (parse with allow_exceptions = false, type checks before every read), since the wasm build
// has no exceptions and any throw would abort.
#include <nlohmann/json.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/views.hpp"
#include "io/setup_request.hpp"

namespace gpumem {
namespace {

using ojson = nlohmann::ordered_json;

std::string Dump(const ojson& j, int indent) {
  return j.dump(indent, ' ', false, ojson::error_handler_t::replace);
}

ojson ErrorJson(const FieldError& e) {
  return {{"code", ErrorCodeId(e.code)}, {"field", e.field}, {"message", e.message}};
}

std::string ErrorsEnvelope(const std::vector<FieldError>& errors, int indent) {
  ojson list = ojson::array();
  for (const FieldError& e : errors) list.push_back(ErrorJson(e));
  return Dump({{"ok", false}, {"errors", list}}, indent);
}

// A whole number of a request, clamped into int far outside every allowed range (the ranges are
// checked later, with the field's own message).
int ClampedCount(std::int64_t v) { return v < -1000 ? -1000 : v > 1000 ? 1000 : static_cast<int>(v); }

// "part": {"index": i, "count": n} (ViewOptions::partIndex, partCount; ranges checked later).
void ReadPart(const nlohmann::json& value, ViewOptions& options, std::vector<FieldError>& errors) {
  if (!value.is_object()) {
    errors.push_back({ErrorCode::InvalidField, "part", "'part' must be an object {\"index\": i, \"count\": n}."});
    return;
  }
  for (const auto& [key, v] : value.items()) {
    if (key != "index" && key != "count") {
      errors.push_back({ErrorCode::UnknownField, "part." + key, "Unknown field 'part." + key + "' (a part has index and count)."});
      continue;
    }
    if (!v.is_number_integer()) {
      errors.push_back({ErrorCode::InvalidField, "part." + key, "'part." + key + "' must be a whole number."});
      continue;
    }
    (key == "index" ? options.partIndex : options.partCount) = ClampedCount(v.get<std::int64_t>());
  }
}

// Reads {"setup":{…},"axisValues":n,"curvePoints":n,"part":{…}}. Setup errors keep the setup's
// own paths ("training.batchSize"), so the page points at the same controls as for an estimate.
std::vector<FieldError> ParseRequest(std::string_view text, ViewOptions& options) {
  options = ViewOptions{};
  options.setup = DefaultSetup();
  return ReadSetupRequest(text, options.setup, [&](const std::string& key, const nlohmann::json& value,
                                                   std::vector<FieldError>& errors) {
    if (key == "axisValues" || key == "curvePoints") {
      int& target = key == "axisValues" ? options.axisValues : options.curvePoints;
      if (!value.is_number_integer()) {
        errors.push_back({ErrorCode::InvalidField, key, "'" + key + "' must be a whole number."});
      } else {
        target = ClampedCount(value.get<std::int64_t>());
      }
    } else if (key == "part") {
      ReadPart(value, options, errors);
    } else {
      errors.push_back({ErrorCode::UnknownField, key,
                        "Unknown field '" + key + "' (a views request has setup, axisValues, curvePoints, part)."});
    }
  });
}

ojson PointJson(const PeakPoint& p) {
  if (!p.ok) return {{"peakBytes", nullptr}, {"fits", false}, {"error", ErrorJson(p.error)}};
  return {{"peakBytes", p.peakBytes},
          {"fits", p.fits},
          {"dominant", {{"category", IdOf(p.dominant)}, {"label", LabelOf(p.dominant)},
                        {"bytes", p.dominantBytes}, {"sharePercent", p.dominantSharePercent}}}};
}

ojson LimitJson(const AxisLimit& l) { return {{"value", l.value}, {"reason", l.reason}}; }

ojson PartJson(int index, int count) { return {{"index", index}, {"count", count}}; }

// A candidate's changes as a partial setup (only the fields it touches), read back from its
// setup's JSON so the ids are the schema's.
ojson ChangeJson(const SettingsCandidate& c) {
  const nlohmann::json full = nlohmann::json::parse(SetupToJson(c.setup), nullptr, false);
  ojson change = ojson::object();
  if (full.is_discarded()) return change;
  for (const std::string& f : c.changedFields) {
    const std::string key = f.substr(f.find('.') + 1);
    change["training"][key] = full["training"][key];
  }
  return change;
}

ojson CurveJson(const Curve& c) {
  ojson points = ojson::array();
  for (std::size_t i = 0; i < c.values.size(); ++i) {
    ojson p = PointJson(c.points[i]);
    p["value"] = c.values[i];
    points.push_back(p);
  }
  return {{"field", c.field},
          {"points", points},
          {"limit", LimitJson(c.limit)},
          {"largestFitting", c.largestFound ? ojson{{"value", c.largestFitting}, {"peakBytes", c.largestFittingPeakBytes},
                                                    {"beyondRange", c.largestAtEnd}}
                                            : ojson(nullptr)}};
}

}  // namespace

std::string HeatMapJson(std::string_view requestText, int indent) {
  ViewOptions options;
  std::vector<FieldError> errors = ParseRequest(requestText, options);
  if (!errors.empty()) return ErrorsEnvelope(errors, indent);
  const HeatMap h = ComputeHeatMap(options);
  if (!h.ok()) return ErrorsEnvelope(h.errors, indent);
  ojson cells = ojson::array();
  for (std::size_t i = 0; i < h.cells.size(); ++i) {
    ojson r = ojson::array();
    for (std::size_t j = 0; j < h.cells[i].size(); ++j) r.push_back(h.Computed(i, j) ? PointJson(h.cells[i][j]) : ojson(nullptr));
    cells.push_back(r);
  }
  ojson heatMap = {{"capacityBytes", h.capacityBytes},
                   {"batchSizes", h.batchSizes},
                   {"sequenceLengths", h.sequenceLengths},
                   {"current", {{"batchSize", h.currentBatchSize}, {"sequenceLength", h.currentSequenceLength}}},
                   {"batchLimit", LimitJson(h.batchLimit)},
                   {"sequenceLimit", LimitJson(h.sequenceLimit)},
                   {"cells", cells},
                   {"estimates", h.estimates}};
  if (h.partCount > 1) heatMap["part"] = PartJson(h.partIndex, h.partCount);
  return Dump({{"ok", true}, {"heatMap", heatMap}}, indent);
}

std::string GpuMatrixJson(std::string_view requestText, int indent) {
  ViewOptions options;
  std::vector<FieldError> errors = ParseRequest(requestText, options);
  if (!errors.empty()) return ErrorsEnvelope(errors, indent);
  const GpuMatrix m = ComputeGpuMatrix(options);
  if (!m.ok()) return ErrorsEnvelope(m.errors, indent);
  ojson candidates = ojson::array();
  for (const SettingsCandidate& c : m.candidates) {
    ojson point = PointJson(c.peak);
    candidates.push_back({{"id", c.id},
                          {"labels", c.labels},
                          {"tier", ChangeTierId(c.tier)},
                          {"tierLabel", ChangeTierLabel(c.tier)},
                          {"change", ChangeJson(c)},
                          {"peakBytes", point["peakBytes"]},
                          {"dominant", point["dominant"]}});
  }
  ojson gpus = ojson::array();
  for (const GpuFit& g : m.gpus) {
    gpus.push_back({{"id", g.id},
                    {"label", g.label},
                    {"memoryGiB", g.memoryGiB},
                    {"capacityBytes", g.capacityBytes},
                    {"fits", g.fits},
                    {"choice", g.choice >= 0 ? ojson(g.choice) : ojson(nullptr)},
                    {"headroomBytes", g.fits ? ojson(g.headroomBytes) : ojson(nullptr)},
                    {"smallestPeakCandidate", g.smallestPeakCandidate >= 0 ? ojson(g.smallestPeakCandidate) : ojson(nullptr)}});
  }
  return Dump({{"ok", true},
               {"gpuMatrix", {{"currentPeakBytes", m.currentPeakBytes},
                              {"candidates", candidates},
                              {"gpus", gpus},
                              {"estimates", m.estimates}}}},
              indent);
}

std::string CurvesJson(std::string_view requestText, int indent) {
  ViewOptions options;
  std::vector<FieldError> errors = ParseRequest(requestText, options);
  if (!errors.empty()) return ErrorsEnvelope(errors, indent);
  const Curves c = ComputeCurves(options);
  if (!c.ok()) return ErrorsEnvelope(c.errors, indent);
  ojson curves = {{"capacityBytes", c.capacityBytes},
                  {"current", {{"batchSize", c.currentBatchSize}, {"sequenceLength", c.currentSequenceLength},
                               {"peakBytes", c.currentPeakBytes}}},
                  {"batch", c.Computed(0) ? CurveJson(c.batch) : ojson(nullptr)},
                  {"sequence", c.Computed(1) ? CurveJson(c.sequence) : ojson(nullptr)},
                  {"estimates", c.estimates}};
  if (c.partCount > 1) curves["part"] = PartJson(c.partIndex, c.partCount);
  return Dump({{"ok", true}, {"curves", curves}}, indent);
}

}  // namespace gpumem
