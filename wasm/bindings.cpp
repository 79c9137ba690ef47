// The JS surface of the estimator: strings in, JSON envelopes out (as UTF-8 bytes, see Out). All
// logic is in the core; wasm/gpumem.js turns the envelopes into objects and errors.
#include <emscripten/bind.h>
#include <emscripten/val.h>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/measure.hpp"
#include "gpumem/snapshot.hpp"
#include "gpumem/views.hpp"

namespace {

// The envelope of the last call, kept until the next one: JS gets a Uint8Array view of these
// bytes and decodes them with TextDecoder at once (wasm/gpumem.js, callCore). Returned as a
// std::string, embind walked the bytes twice in JS (for NULs, then for the end) before its
// decode: about a tenth of a GPT-2 estimate (node --cpu-prof).
emscripten::val Out(std::string text) {
  static std::string last;
  last = std::move(text);
  return emscripten::val(
      emscripten::typed_memory_view(last.size(), reinterpret_cast<const unsigned char*>(last.data())));
}

// embind binds std::string, not std::string_view, and cannot pass default arguments.
// timeline: "none" (the figures only: what views and solvers need), "points", or "labelled".
emscripten::val EstimateJs(const std::string& setup, const std::string& timeline) {
  gpumem::EstimateOptions options;
  options.timeline = timeline == "labelled" ? gpumem::EstimateOptions::Timeline::Labelled
                     : timeline == "points" ? gpumem::EstimateOptions::Timeline::Points
                                            : gpumem::EstimateOptions::Timeline::None;
  // One estimate at a time: the page's budget (setup.hpp kMaxPagePredictedEvents); searches keep
  // the default.
  options.maxPredictedEvents = gpumem::kMaxPagePredictedEvents;
  return Out(gpumem::EstimateJson(setup, -1, options));
}
emscripten::val ValidateJs(const std::string& setup) {
  return Out(gpumem::ValidateJson(setup, -1, gpumem::kMaxPagePredictedEvents));
}
emscripten::val OptionsJs() { return Out(gpumem::OptionsJson()); }
std::string VersionJs() { return gpumem::Version(); }
emscripten::val ImportConfigJs(const std::string& text) { return Out(gpumem::ImportConfigJson(text)); }
emscripten::val ImportSafetensorsJs(const std::string& text, const std::string& setup) {
  return Out(gpumem::ImportSafetensorsJson(text, setup));
}
emscripten::val SolveJs(const std::string& setup) { return Out(gpumem::SolveJson(setup)); }
emscripten::val MeasureScriptJs(const std::string& setup) { return Out(gpumem::MeasureScriptJson(setup)); }
emscripten::val HeatMapJs(const std::string& request) { return Out(gpumem::HeatMapJson(request)); }
emscripten::val GpuMatrixJs(const std::string& request) { return Out(gpumem::GpuMatrixJson(request)); }
emscripten::val CurvesJs(const std::string& request) { return Out(gpumem::CurvesJson(request)); }
// The snapshot's bytes arrive as a JS Uint8Array, which embind copies into std::string byte for
// byte (a JS string would be UTF-8 encoded and corrupt the pickle). An empty setup: measure only.
emscripten::val CompareSnapshotJs(const std::string& snapshotBytes, const std::string& setup) {
  return Out(gpumem::CompareSnapshotJson(snapshotBytes, setup));
}

// Many GPUs (docs/parallel.md): a DeepSpeed config or Megatron's arguments read onto a setup
// (empty = the defaults), and the fewest GPUs of the setup's type (offload layouts allowed, as
// FewestGpusJson's default: one text argument, so the worker runs it like the other long calls).
emscripten::val ImportDeepSpeedJs(const std::string& config, const std::string& setup) {
  return Out(gpumem::ImportDeepSpeedJson(config, setup));
}
emscripten::val ImportMegatronJs(const std::string& commandLine, const std::string& setup) {
  return Out(gpumem::ImportMegatronJson(commandLine, setup));
}
emscripten::val FewestGpusJs(const std::string& setup) { return Out(gpumem::FewestGpusJson(setup)); }
emscripten::val ImportAccelerateJs(const std::string& config, const std::string& setup) {
  return Out(gpumem::ImportAccelerateJson(config, setup));
}
emscripten::val LayoutsJs(const std::string& request) { return Out(gpumem::LayoutsJson(request)); }

}  // namespace

EMSCRIPTEN_BINDINGS(gpumem) {
  emscripten::function("estimateJson", &EstimateJs);
  emscripten::function("validateJson", &ValidateJs);
  emscripten::function("optionsJson", &OptionsJs);
  emscripten::function("version", &VersionJs);
  emscripten::function("importConfigJson", &ImportConfigJs);
  emscripten::function("importSafetensorsJson", &ImportSafetensorsJs);
  emscripten::function("solveJson", &SolveJs);
  emscripten::function("measureScriptJson", &MeasureScriptJs);
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
