// gpumem — the JSON schema (version 1) for a Setup and an Estimate. Documented in docs/schema.md.
// The CLI, the page's URL state and its export/import all use these functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

constexpr int kSchemaVersion = 1;

struct SetupParseResult {
  Setup setup;                     // DefaultSetup() with every field the text gave applied
  std::vector<FieldError> errors;  // malformed JSON, wrong types, unknown fields
  bool ok() const { return errors.empty(); }
};

// Reads a setup. Absent fields keep DefaultSetup()'s values, so a partial document works —
// except that a transformer with no training.sequenceLength takes its preset's
// defaultSequenceLength, and a GPT-2 or BERT architecture at most its position table. Unknown
// fields are errors (usually typos). Never throws, never aborts, on any input; linear in the
// text; at most kMaxReportedErrors errors listed, then "…and N more".
SetupParseResult ParseSetupJson(std::string_view text);

std::string SetupToJson(const Setup& setup, int indent = -1);
std::string EstimateToJson(const Estimate& estimate, int indent = -1);
std::string ErrorsToJson(const std::vector<FieldError>& errors, int indent = -1);

// Parse + validate (every problem, parse and range errors together) → the setup's errors, with
// `setup` filled with what could be read. `maxPredictedEvents`: the work budget
// (EstimateOptions::maxPredictedEvents).
std::vector<FieldError> ParseAndValidate(std::string_view text, Setup& setup,
                                         double maxPredictedEvents = kMaxPredictedEvents);

// Parse + validate + estimate.
EstimateResult EstimateFromJson(std::string_view setupText, const EstimateOptions& options = {});
std::string EstimateResultToJson(const EstimateResult& result, int indent = -1);

// Parse + validate + estimate in one call: {"ok":true,"estimate":{…}} or
// {"ok":false,"errors":[{"code","field","message"}]}. The wasm boundary uses this envelope.
// The timeline (per `options`) is written as "timeline": [{index, phase, step, layer, label?,
// category, deltaBytes, totalBytes}…] (thinned beyond 2,000 events), or null when not asked.
std::string EstimateJson(std::string_view setupText, int indent = -1,
                         EstimateOptions options = {.timeline = EstimateOptions::Timeline::Labelled});

// Parse + validate: {"ok":true,"setup":{…normalised…}} or {"ok":false,"errors":[…]}.
std::string ValidateJson(std::string_view setupText, int indent = -1, double maxPredictedEvents = kMaxPredictedEvents);

// Every enum's ids and labels, the defaults and the examples, for the page's controls:
// {"schemaVersion":1,"defaultSetup":{…},"examples":[{"id","label","setup"}],"precisions":[{"id","label"}],…}
std::string OptionsJson(int indent = -1);

// A Hugging Face config.json read into an architecture:
// {"ok":true,"modelType","setup":{"model":{"kind":"transformer","architecture":{…}}},
//  "ignoredFields":[…],"notes":[…]} or {"ok":false,"errors":[…]} (fields "config.hidden_size").
// With a quantization_config block the setup also has "finetune":{"quantization","doubleQuant",
// "computeDType"} (config errors then name "config.quantization_config.<key>").
std::string ImportConfigJson(std::string_view configText, int indent = -1);

// A PEFT adapter_config.json: {"ok":true,"setup":{"finetune":{"lora":true,"r","loraAlpha",
// "loraDropout","targetModules","useDora"}},"ignoredFields":[…],"notes":[…]} or
// {"ok":false,"errors":[…]} (fields "adapter.r").
std::string ImportAdapterConfigJson(std::string_view text, int indent = -1);

// A safetensors header or model.safetensors.index.json:
// {"ok":true,"source":"header"|"index","parameterCount"(header) | null,"totalSizeBytes",
//  "tensorCount","dtypes":{…},"largestMatrices":[{rows,cols,name}],"numLayers",
//  "setup":{"model":{"kind":"parameterCount",…}} (header),"notes":[…]}.
// With `setupText` naming a valid transformer, also "architectureParameterCount" and
// "differenceFromArchitecture" (header count − architecture count); null otherwise.
std::string ImportSafetensorsJson(std::string_view text, std::string_view setupText = {}, int indent = -1);

// The solvers on a setup: {"ok":true,"solve":{"currentPeakBytes","capacityBytes",
//  "maxBatchSize":{value,peakBytes,limit,limitReason}|null,"maxSequenceLength":{…}|null,
//  "suggestions":[{id,label,tradeoff,change:{training:{…}},peakBytes,savedBytes,fits}],
//  "estimatesRun"}}.
std::string SolveJson(std::string_view setupText, int indent = -1);

// Both in one document (the CLI's --json --solve): {"ok":true,"estimate":{…},"solve":{…}} or
// {"ok":false,"errors":[…]}. The solver reuses the estimate of the setup itself.
std::string EstimateAndSolveJson(std::string_view setupText, int indent = -1);

// Many GPUs (docs/parallel.md). Each starts from `setupText` (empty = the defaults; its model gives
// h for DeepSpeed's "auto" values) and returns {"ok":true,"setup":{…},"ignoredFields":[…],
// "notes":[…]} or {"ok":false,"errors":[…]}.
std::string ImportDeepSpeedJson(std::string_view configText, std::string_view setupText = {}, int indent = -1);
std::string ImportMegatronJson(std::string_view commandLine, std::string_view setupText = {}, int indent = -1);
std::string ImportAccelerateJson(std::string_view configText, std::string_view setupText = {}, int indent = -1);
// The fewest GPUs of the setup's type that train it: {"ok":true,"fewestGpus":{"found","gpus",
// "layout","communicationParameters","offload","peakDeviceBytes","estimatesRun","setup"}}.
std::string FewestGpusJson(std::string_view setupText, bool allowOffload = true, int indent = -1);
// Layouts for N GPUs (LayoutsForCluster): the request {"setup":{…},"gpus":N,"allowOffload":bool,
// "maxEstimates":n} → {"ok":true,"layouts":{"gpus","rows":[…],"candidates","refused","dominated",
// "estimates","notFitting","notEstimated"}} (docs/schema.md, "Layouts").
std::string LayoutsJson(std::string_view requestText, int indent = -1);

// The estimator's version, "MAJOR.MINOR.PATCH" (CMake's PROJECT_VERSION).
const char* Version();

}  // namespace gpumem
