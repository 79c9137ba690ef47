// The JS surface of the estimator: strings in, JSON envelopes out. All logic is in the core;
// wasm/gpumem.js turns the envelopes into objects and errors.
#include <emscripten/bind.h>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/snapshot.hpp"
#include "gpumem/views.hpp"

namespace {

// embind binds std::string, not std::string_view, and cannot pass default arguments.
// timeline: "none" (the figures only: what views and solvers need), "points", or "labelled".
std::string EstimateJs(const std::string& setup, const std::string& timeline) {
  gpumem::EstimateOptions options;
  options.timeline = timeline == "labelled" ? gpumem::EstimateOptions::Timeline::Labelled
                     : timeline == "points" ? gpumem::EstimateOptions::Timeline::Points
                                            : gpumem::EstimateOptions::Timeline::None;
  return gpumem::EstimateJson(setup, -1, options);
}
std::string ValidateJs(const std::string& setup) { return gpumem::ValidateJson(setup); }
std::string OptionsJs() { return gpumem::OptionsJson(); }
std::string VersionJs() { return gpumem::Version(); }
std::string ImportConfigJs(const std::string& text) { return gpumem::ImportConfigJson(text); }
std::string ImportSafetensorsJs(const std::string& text, const std::string& setup) {
  return gpumem::ImportSafetensorsJson(text, setup);
}
std::string SolveJs(const std::string& setup) { return gpumem::SolveJson(setup); }
std::string HeatMapJs(const std::string& request) { return gpumem::HeatMapJson(request); }
std::string GpuMatrixJs(const std::string& request) { return gpumem::GpuMatrixJson(request); }
std::string CurvesJs(const std::string& request) { return gpumem::CurvesJson(request); }
// The snapshot's bytes arrive as a JS Uint8Array, which embind copies into std::string byte for
// byte (a JS string would be UTF-8 encoded and corrupt the pickle). An empty setup: measure only.
std::string CompareSnapshotJs(const std::string& snapshotBytes, const std::string& setup) {
  return gpumem::CompareSnapshotJson(snapshotBytes, setup);
}

// Many GPUs (docs/parallel.md): a DeepSpeed config or Megatron's arguments read onto a setup
// (empty = the defaults), and the fewest GPUs of the setup's type (offload layouts allowed, as
// FewestGpusJson's default: one text argument, so the worker runs it like the other long calls).
std::string ImportDeepSpeedJs(const std::string& config, const std::string& setup) {
  return gpumem::ImportDeepSpeedJson(config, setup);
}
std::string ImportMegatronJs(const std::string& commandLine, const std::string& setup) {
  return gpumem::ImportMegatronJson(commandLine, setup);
}
std::string FewestGpusJs(const std::string& setup) { return gpumem::FewestGpusJson(setup); }
std::string ImportAccelerateJs(const std::string& config, const std::string& setup) {
  return gpumem::ImportAccelerateJson(config, setup);
}
std::string LayoutsJs(const std::string& request) { return gpumem::LayoutsJson(request); }

}  // namespace

EMSCRIPTEN_BINDINGS(gpumem) {
  emscripten::function("estimateJson", &EstimateJs);
  emscripten::function("validateJson", &ValidateJs);
  emscripten::function("optionsJson", &OptionsJs);
  emscripten::function("version", &VersionJs);
  emscripten::function("importConfigJson", &ImportConfigJs);
  emscripten::function("importSafetensorsJson", &ImportSafetensorsJs);
  emscripten::function("solveJson", &SolveJs);
  emscripten::function("heatMapJson", &HeatMapJs);
  emscripten::function("gpuMatrixJson", &GpuMatrixJs);
  emscripten::function("curvesJson", &CurvesJs);
  emscripten::function("compareSnapshotJson", &CompareSnapshotJs);
  emscripten::function("importDeepSpeedJson", &ImportDeepSpeedJs);
  emscripten::function("importMegatronJson", &ImportMegatronJs);
  emscripten::function("fewestGpusJson", &FewestGpusJs);
  emscripten::function("importAccelerateJson", &ImportAccelerateJs);
  emscripten::function("layoutsJson", &LayoutsJs);
}
