// Layouts for N GPUs as JSON (docs/schema.md, "Layouts"): one request object in, an {"ok":…}
// envelope out, through the same path as the views (the page's worker runs it). Nothing here
// throws: nlohmann is used in its non-throwing forms, with type checks before every read.
#include <nlohmann/json.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "io/setup_request.hpp"

namespace gpumem {
namespace {

using ojson = nlohmann::ordered_json;

std::string Dump(const ojson& j, int indent) { return j.dump(indent, ' ', false, ojson::error_handler_t::replace); }

std::string ErrorsEnvelope(const std::vector<FieldError>& errors, int indent) {
  ojson list = ojson::array();
  for (const FieldError& e : errors) {
    list.push_back({{"code", ErrorCodeId(e.code)}, {"field", e.field}, {"message", e.message}});
  }
  return Dump({{"ok", false}, {"errors", list}}, indent);
}

struct LayoutsRequest {
  Setup setup = DefaultSetup();
  std::int64_t gpus = 8;
  LayoutSearchOptions options;
};

// Setup errors keep the setup's own paths ("training.batchSize"); the request's own fields are
// named as they are ("gpus").
std::vector<FieldError> ParseLayoutsRequest(std::string_view text, LayoutsRequest& request) {
  return ReadSetupRequest(text, request.setup, [&](const std::string& key, const nlohmann::json& value,
                                                   std::vector<FieldError>& errors) {
    if (key == "gpus" || key == "maxEstimates") {
      std::int64_t& target = key == "gpus" ? request.gpus : request.options.maxEstimates;
      if (!value.is_number_integer()) {
        errors.push_back({ErrorCode::InvalidField, key, "'" + key + "' must be a whole number."});
      } else {
        target = value.get<std::int64_t>();  // ranges checked by LayoutsForCluster
      }
    } else if (key == "allowOffload") {
      if (!value.is_boolean()) errors.push_back({ErrorCode::InvalidField, key, "'allowOffload' must be true or false."});
      else request.options.allowOffload = value.get<bool>();
    } else {
      errors.push_back({ErrorCode::UnknownField, key,
                        "Unknown field '" + key + "' (a layouts request has setup, gpus, allowOffload, maxEstimates)."});
    }
  });
}

}  // namespace

std::string LayoutsJson(std::string_view requestText, int indent) {
  LayoutsRequest request;
  const std::vector<FieldError> errors = ParseLayoutsRequest(requestText, request);
  if (!errors.empty()) return ErrorsEnvelope(errors, indent);
  const LayoutsResult r = LayoutsForCluster(request.setup, request.gpus, request.options);
  if (!r.ok()) return ErrorsEnvelope(r.errors, indent);
  ojson rows = ojson::array();
  for (const LayoutRow& row : r.layouts) {
    const ojson setup = ojson::parse(SetupToJson(row.setup), nullptr, false);
    rows.push_back({{"dataParallel", row.dataParallel},
                    {"tensorParallel", row.tensorParallel},
                    {"pipelineParallel", row.pipelineParallel},
                    {"sharding", row.sharding},
                    {"offload", row.offload},
                    {"checkpointing", row.checkpointing},
                    {"peakDeviceBytes", row.peakDeviceBytes},
                    {"capacityBytes", row.capacityBytes},
                    {"hostNodeBytes", row.hostNodeBytes},
                    {"cost", {{"dataParallelBytes", row.cost.dataParallelBytes},
                              {"tensorParallelBytes", row.cost.tensorParallelBytes},
                              {"pipelineBytes", row.cost.pipelineBytes},
                              {"communicationBytes", row.cost.communicationBytes},
                              {"hostBytes", row.cost.hostBytes},
                              {"bubbleFraction", row.cost.bubbleFraction},
                              {"recomputeFactor", row.cost.recomputeFactor},
                              {"computeFactor", row.cost.computeFactor}}},
                    {"setup", setup}});
  }
  return Dump({{"ok", true},
               {"layouts", {{"gpus", r.gpus},
                            {"rows", rows},
                            {"candidates", r.candidates},
                            {"refused", r.refused},
                            {"dominated", r.dominated},
                            {"estimates", r.estimates},
                            {"notFitting", r.notFitting},
                            {"hostTooSmall", r.hostTooSmall},
                            {"notEstimated", r.notEstimated}}}},
              indent);
}

}  // namespace gpumem
