// gpumem — command-line front end. Reads a setup (schema: docs/schema.md) from a file or
// stdin and prints the Estimate as a table, or as JSON with --json.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/format.hpp"
#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"

namespace {

using gpumem::FormatCount;
using gpumem::HumanBytes;

constexpr const char* kUsage =
    "usage: gpumem [--json] [--timeline] [SETUP.json | - | --preset ID]\n"
    "       gpumem --defaults | --example mlp | --options | --presets\n"
    "\n"
    "Estimates the GPU memory of one training step. SETUP.json follows docs/schema.md; fields\n"
    "left out take the defaults (gpumem --defaults). Without a file, the setup is read from stdin.\n"
    "  --json       print {\"ok\":true,\"estimate\":…} or {\"ok\":false,\"errors\":[…]}\n"
    "  --timeline   also print every allocation and free of the simulated steps\n"
    "  --preset ID  estimate a published architecture with the default training setup\n"
    "  --presets    list the presets and their published parameter counts\n"
    "  --solve      also find the largest batch and sequence that fit, and what would make it fit\n"
    "  --import-config config.json       print the setup a Hugging Face config.json describes\n"
    "  --import-safetensors FILE         count the tensors of a safetensors header or index JSON\n"
    "Exit status: 0 estimated, 1 the setup has errors, 2 usage or unreadable file.\n";

void PrintRows(const std::vector<gpumem::CategoryBytes>& rows) {
  for (const auto& r : rows) {
    std::printf("  %-26s %12s  %20s B  %s\n", gpumem::LabelOf(r.category), HumanBytes(r.bytes).c_str(),
                FormatCount(r.bytes).c_str(), r.formula.c_str());
  }
}

void PrintTable(const gpumem::Setup& setup, const gpumem::Estimate& e, bool timeline) {
  using namespace gpumem;
  std::printf("Model: %s parameters — %s\n       %s\n", FormatCount(e.modelStates.parameterCount).c_str(),
              LabelOf(setup.model.kind), e.modelStates.parameterFormula.c_str());
  if (setup.model.kind == ModelKind::Transformer) {
    const ArchitectureDef& a = setup.model.architecture;
    std::printf("Architecture: %s, %lld layers, hidden %lld, %lld heads (%lld key/value) of %lld, "
                "MLP %lld%s, vocabulary %lld\n",
                LabelOf(a.family), static_cast<long long>(a.numLayers), static_cast<long long>(a.hiddenSize),
                static_cast<long long>(a.numHeads), static_cast<long long>(KeyValueHeads(a)),
                static_cast<long long>(HeadDim(a)), static_cast<long long>(IntermediateSize(a)),
                a.numExperts > 0 ? (", " + std::to_string(a.numExperts) + " experts, top-" +
                                    std::to_string(a.expertsPerToken)).c_str() : "",
                static_cast<long long>(a.vocabSize));
    std::printf("Attention: %s; checkpointing: %s\n", LabelOf(setup.training.attention),
                LabelOf(setup.training.checkpointing));
  }
  std::printf("Training: batch %lld × sequence %lld, %s, %s (%s)\n",
              static_cast<long long>(setup.training.batchSize),
              static_cast<long long>(setup.training.sequenceLength), LabelOf(setup.training.precision),
              LabelOf(setup.training.optimizer), LabelOf(setup.training.optimizerImplementation));
  std::printf("\nPeak: %s (%s B) — %s, step %d: %s\n", HumanBytes(e.peak.totalBytes).c_str(),
              FormatCount(e.peak.totalBytes).c_str(), LabelOf(e.peak.phase), e.peak.step, e.peak.label.c_str());
  if (!e.peakExplanation.empty()) std::printf("Why:  %s\n", e.peakExplanation.c_str());
  std::printf("GPU:  %s — %s, %s %s\n", HumanBytes(e.gpuCapacityBytes).c_str(),
              e.fits ? "fits" : "DOES NOT FIT", e.fits ? "headroom" : "short by",
              HumanBytes(e.headroomBytes < 0 ? -e.headroomBytes : e.headroomBytes).c_str());
  std::printf("\nModel states (persistent):\n");
  PrintRows(e.modelStates.rows);
  std::printf("  %-26s %12s  %20s B\n", "Total", HumanBytes(e.modelStates.totalBytes).c_str(),
              FormatCount(e.modelStates.totalBytes).c_str());
  std::printf("\nAt the peak%s:\n", e.activationsFromHeuristic ? " (activations: per-token heuristic)" : "");
  PrintRows(e.peak.byCategory);
  if (!e.forwardEnd.byCategory.empty()) {
    std::printf("\nHeld at the end of the forward pass (step 1): %s\n", HumanBytes(e.forwardEnd.totalBytes).c_str());
    PrintRows(e.forwardEnd.byCategory);
  }
  std::printf("\nPeak of each phase:\n");
  for (const auto& s : e.phasePeaks) {
    std::printf("  %-16s %12s  step %d  %s\n", LabelOf(s.phase), HumanBytes(s.totalBytes).c_str(), s.step,
                s.label.c_str());
  }
  // Which category is live in which phase: bytes of each at each phase's peak.
  std::printf("\nWhat each phase's peak holds:\n  %-26s", "");
  for (const auto& s : e.phasePeaks) std::printf(" %14s", LabelOf(s.phase));
  std::printf("\n");
  for (const auto& c : NamesOf(Category{})) {
    bool any = false;
    std::string line;
    for (const auto& s : e.phasePeaks) {
      std::int64_t bytes = 0;
      for (const auto& r : s.byCategory) if (r.category == c.value) bytes = r.bytes;
      any = any || bytes > 0;
      char cellText[32];
      std::snprintf(cellText, sizeof cellText, " %14s", bytes > 0 ? HumanBytes(bytes).c_str() : "-");
      line += cellText;
    }
    if (any) std::printf("  %-26s%s\n", c.label, line.c_str());
  }
  if (timeline) {
    std::printf("\nTimeline (every allocation and free):\n");
    for (std::size_t i = 0; i < e.timeline.size(); ++i) {
      const auto& p = e.timeline[i];
      std::printf("  %5zu %-14s s%d L%-3d %16s B  %12s  %-24s %s\n", i, IdOf(p.phase), p.step, p.layer,
                  (p.deltaBytes > 0 ? std::string("+").append(FormatCount(p.deltaBytes)) : FormatCount(p.deltaBytes)).c_str(), HumanBytes(p.totalBytes).c_str(), LabelOf(p.category),
                  p.label.c_str());
    }
  }
  if (!e.notes.empty()) {
    std::printf("\nNotes:\n");
    for (const auto& n : e.notes) std::printf("  - %s\n", n.c_str());
  }
}

void PrintSolve(const gpumem::SolveResult& r) {
  using namespace gpumem;
  std::printf("\nSolve (GPU %s):\n", HumanBytes(r.capacityBytes).c_str());
  auto limit = [](const char* what, const SolvedLimit& l, const char* unit) {
    if (!l.found) std::printf("  %-24s none fits, even 1\n", what);
    else std::printf("  %-24s %s %s (peak %s; allowed up to %s)\n", what, FormatCount(l.value).c_str(), unit,
                     HumanBytes(l.peakBytes).c_str(), FormatCount(l.limit).c_str());
  };
  limit("Largest micro-batch:", r.maxBatchSize, "samples");
  limit("Longest sequence:", r.maxSequenceLength, "tokens");
  std::printf("  Changes, by memory saved:\n");
  for (const FitSuggestion& s : r.suggestions) {
    std::printf("    %-4s %12s saved → peak %12s  %s (%s)\n", s.fits ? "fits" : "", HumanBytes(s.savedBytes).c_str(),
                HumanBytes(s.peakBytes).c_str(), s.label.c_str(), s.tradeoff.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, timeline = false, solve = false;
  const char* path = nullptr;
  std::string presetSetup;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") json = true;
    else if (arg == "--timeline") timeline = true;
    else if (arg == "--solve") solve = true;
    else if ((arg == "--import-config" || arg == "--import-safetensors") && i + 1 < argc) {
      std::ifstream file(argv[i + 1], std::ios::binary);
      if (!file) { std::cerr << "gpumem: cannot read " << argv[i + 1] << "\n"; return 2; }
      std::stringstream content;
      content << file.rdbuf();
      const std::string out = arg == "--import-config" ? gpumem::ImportConfigJson(content.str(), 2)
                                                       : gpumem::ImportSafetensorsJson(content.str(), {}, 2);
      std::cout << out << "\n";
      return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
    }
    else if (arg == "--defaults") { std::cout << gpumem::SetupToJson(gpumem::DefaultSetup(), 2) << "\n"; return 0; }
    else if (arg == "--options") { std::cout << gpumem::OptionsJson(2) << "\n"; return 0; }
    else if (arg == "--presets") {
      for (const auto& p : gpumem::Presets()) {
        std::printf("  %-20s %-44s %20s parameters (%s)\n", p.id, p.label,
                    FormatCount(p.publishedParameters).c_str(), p.source);
      }
      return 0;
    } else if (arg == "--preset" && i + 1 < argc) {
      if (!gpumem::FindPreset(argv[i + 1])) {
        std::cerr << "gpumem: unknown preset " << argv[i + 1] << " (see gpumem --presets)\n";
        return 2;
      }
      presetSetup = std::string("{\"model\":{\"preset\":\"") + argv[++i] + "\"}}";
    }
    else if (arg == "--example" && i + 1 < argc && std::strcmp(argv[i + 1], "mlp") == 0) {
      std::cout << gpumem::SetupToJson(gpumem::ExampleMlpSetup(), 2) << "\n";
      return 0;
    } else if (arg == "-h" || arg == "--help") { std::cout << kUsage; return 0; }
    else if (arg == "-" || (!arg.empty() && arg[0] != '-')) {
      if (path) { std::cerr << kUsage; return 2; }
      path = argv[i];
    } else { std::cerr << "gpumem: unknown option " << arg << "\n" << kUsage; return 2; }
  }

  std::stringstream text;
  if (!presetSetup.empty()) {
    if (path) { std::cerr << kUsage; return 2; }
    text << presetSetup;
  } else if (path && std::strcmp(path, "-") != 0) {
    std::ifstream file(path, std::ios::binary);
    if (!file) { std::cerr << "gpumem: cannot read " << path << "\n"; return 2; }
    text << file.rdbuf();
  } else {
    text << std::cin.rdbuf();
  }

  gpumem::Setup setup;
  gpumem::EstimateResult result;
  result.errors = gpumem::ParseAndValidate(text.str(), setup);
  // The table's --timeline lists every event; the JSON thins long timelines as the page does.
  const gpumem::EstimateOptions options{.timeline = gpumem::EstimateOptions::Timeline::Labelled,
                                        .timelineLimit = json ? std::size_t{2000} : std::size_t{0}};
  if (result.ok()) result = gpumem::EstimateMemory(setup, options);
  if (json) {
    std::cout << gpumem::EstimateResultToJson(result, 2) << "\n";
    if (solve && result.ok()) std::cout << gpumem::SolveJson(text.str(), 2) << "\n";
    return result.ok() ? 0 : 1;
  }
  if (!result.ok()) {
    for (const auto& e : result.errors) {
      std::cerr << "error: " << (e.field.empty() ? "setup" : e.field) << ": " << e.message << " ["
                << gpumem::ErrorCodeId(e.code) << "]\n";
    }
    return 1;
  }
  PrintTable(setup, result.estimate, timeline);
  if (solve) PrintSolve(gpumem::Solve(setup));
  return 0;
}
