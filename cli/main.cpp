// gpumem — command-line front end. Reads a setup (schema: docs/schema.md) from a file or
// stdin and prints the Estimate as a table, or as JSON with --json.
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include "gpumem/estimate.hpp"
#include "gpumem/format.hpp"
#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/snapshot.hpp"
#include "gpumem/pickle.hpp"
#include <nlohmann/json.hpp>

#include "gpumem/measure.hpp"
#include "gpumem/solve.hpp"

namespace {

using gpumem::FormatCount;
using gpumem::HumanBytes;

constexpr const char* kUsage =
    "usage: gpumem [--json] [--timeline] [--solve] [SETUP.json | - | --preset ID]\n"
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
    "                                    (with its quantization_config as finetune fields)\n"
    "  --import-adapter-config FILE      print the finetune section a PEFT adapter_config.json describes\n"
    "  --import-deepspeed ds_config.json print the setup with a DeepSpeed config applied (to SETUP.json if given)\n"
    "  --import-accelerate config.yaml  the same with accelerate's config (FSDP; docs/parallel.md)\n"
    "  --import-megatron 'ARGS'         the same with Megatron-LM's arguments as one quoted string\n"
    "  --layouts N                      the layouts of N GPUs of the setup's type that fit, ranked (JSON)\n"
    "  --measure-script                  a Python script that measures the setup on a GPU (PyTorch,\n"
    "                                    transformers) and prints its peaks beside the estimate's\n"
    "  --fewest-gpus                     the fewest GPUs of the setup's type that train it (docs/parallel.md)\n"
    "  --import-safetensors FILE         count the tensors of a safetensors header or index JSON\n"
    "  --compare-snapshot FILE.pickle    a torch.cuda.memory._dump_snapshot() file measured: peak\n"
    "                                    allocated and reserved, beside the setup's estimate if given\n"
    "Inputs are read up to 16 MiB. --json --solve prints one document {\"ok\",\"estimate\",\"solve\"}.\n"
    "Exit status: 0 estimated, 1 the setup (or imported file) has errors, 2 usage or a path\n"
    "that cannot be read (missing, a directory).\n";

// A whole file or stdin, read in chunks and refused as soon as it passes the core's 16 MiB
// limit (`gpumem --json /dev/zero` stops at 16 MiB instead of growing without end).
enum class ReadStatus { Ok, TooLarge, Unreadable, Directory };

ReadStatus ReadCapped(const char* path, std::string& text, std::size_t kLimit = 16u << 20 /* kMaxJsonTextBytes */) {
  std::error_code ec;
  if (path && std::filesystem::is_directory(path, ec)) return ReadStatus::Directory;
  std::FILE* file = path ? std::fopen(path, "rb") : stdin;
  if (!file) return ReadStatus::Unreadable;
  char buffer[1 << 16];
  ReadStatus status = ReadStatus::Ok;
  while (true) {
    const std::size_t n = std::fread(buffer, 1, sizeof buffer, file);
    if (n == 0) break;
    if (text.size() + n > kLimit) {
      status = ReadStatus::TooLarge;
      break;
    }
    text.append(buffer, n);
  }
  if (status == ReadStatus::Ok && std::ferror(file)) status = ReadStatus::Unreadable;
  if (path) std::fclose(file);
  return status;
}

// Reads the input or says why not. Returns the exit status to use on failure, 0 on success:
// 2 for a path that cannot be read (usage), 1 for an input over the limit (a bad setup, with the
// same error envelope as any other under --json).
int ReadInput(const char* path, bool json, const char* what, std::string& text) {
  const char* name = path ? path : "stdin";
  switch (ReadCapped(path, text)) {
    case ReadStatus::Ok: return 0;
    case ReadStatus::Directory:
      std::cerr << "gpumem: " << name << " is a directory; give the " << what << " file\n";
      return 2;
    case ReadStatus::Unreadable:
      std::cerr << "gpumem: cannot read " << name << ": " << std::strerror(errno) << "\n";
      return 2;
    case ReadStatus::TooLarge: {
      const std::string message = std::string("The ") + what + " is larger than 16 MiB (read stopped there).";
      if (json) {
        gpumem::EstimateResult refused;
        refused.errors.push_back({gpumem::ErrorCode::MalformedJson, "", message});
        std::cout << gpumem::EstimateResultToJson(refused, 2) << "\n";
      } else {
        std::cerr << "error: " << name << ": " << message << " [malformedJson]\n";
      }
      return 1;
    }
  }
  return 2;
}

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
  // The verdict is the device figure's (allocator segments + context), not the allocated peak.
  const DeviceEstimate& d = e.device;
  std::printf("GPU:  %s — %s, %s %s\n", HumanBytes(e.gpuCapacityBytes).c_str(),
              !e.fits ? "DOES NOT FIT" : d.tight ? "tight" : "fits", e.fits ? "headroom" : "short by",
              HumanBytes(e.headroomBytes < 0 ? -e.headroomBytes : e.headroomBytes).c_str());
  std::printf("      %s\n", d.why.c_str());
  std::printf("Device (what nvidia-smi shows at the peak):\n");
  std::printf("  %-26s %12s  %s\n", "Allocated (allocator)", HumanBytes(d.peakAllocatedBytes).c_str(), d.peakAllocatedFormula.c_str());
  std::printf("  %-26s %12s  %s\n", "Reserved (segments)", HumanBytes(d.peakReservedBytes).c_str(), d.peakReservedFormula.c_str());
  std::printf("  %-26s %12s  %s\n", "  of it allocator cache", HumanBytes(d.fragmentationBytes).c_str(), d.fragmentationFormula.c_str());
  std::printf("  %-26s %12s  %s\n", "  of it cuBLAS workspaces", HumanBytes(d.workspaceBytes).c_str(), d.workspaceFormula.c_str());
  std::printf("  %-26s %12s  %s\n", "CUDA context", HumanBytes(d.contextBytes).c_str(), d.contextFormula.c_str());
  if (d.unifiedBytes + d.unifiedEvictedBytes > 0) {
    std::printf("  %-26s %12s  %s\n", "Paged optimizer states", HumanBytes(d.unifiedBytes).c_str(), d.unifiedFormula.c_str());
  }
  std::printf("  %-26s %12s  %s\n", "Device total", HumanBytes(d.peakDeviceBytes).c_str(), d.peakDeviceFormula.c_str());
  if (!e.host.rows.empty()) {  // only when offloading or paging puts (or may put) bytes there
    const HostMemory& h = e.host;
    std::printf("\nHost memory (CPU RAM, per rank):\n");
    for (const HostRow& r : h.rows) {
      std::printf("  %-48s %12s  %-8s  %s\n", r.label.c_str(), HumanBytes(r.bytes).c_str(), r.memory.c_str(), r.formula.c_str());
      std::printf("  %-48s %12s            source: %s\n", "", "", r.source.c_str());
    }
    std::printf("  %-48s %12s  (%s pinned)\n", "Host total per rank", HumanBytes(h.rankBytes).c_str(),
                HumanBytes(h.pinnedBytes).c_str());
    std::printf("  %-48s %12s  (%lld %s per node)\n", "Host total per node", HumanBytes(h.nodeBytes).c_str(),
                static_cast<long long>(h.ranksPerNode), h.ranksPerNode == 1 ? "rank" : "ranks");
    if (h.capacityBytes > 0) {
      std::printf("  %-48s %12s  %s\n", "Host memory stated per node", HumanBytes(h.capacityBytes).c_str(),
                  h.fits ? "fits" : "DOES NOT FIT: the processes would run out of CPU memory");
    }
    if (h.unifiedBytes > 0) {
      std::printf("  %-48s %12s  outside the allocator: resident on the GPU while there is room (device figure), else on the host\n", "Paged (unified memory)",
                  HumanBytes(h.unifiedBytes).c_str());
    }
  }
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
    // An unsimulated change (its model states alone pass the capacity): a floor and a ceiling.
    const char* atMost = s.peakIsLowerBound ? "≤" : " ";
    const char* atLeast = s.peakIsLowerBound ? "≥" : " ";
    std::printf("    %-4s %s%12s saved → peak %s%12s  %s (%s)\n", s.fits ? "fits" : "", atMost, HumanBytes(s.savedBytes).c_str(),
                atLeast, HumanBytes(s.peakBytes).c_str(), s.label.c_str(), s.tradeoff.c_str());
  }
}

// --compare-snapshot: the measured peaks of a PyTorch snapshot, and the estimate beside them.
int CompareSnapshot(const char* snapshotPath, const std::string& setupText, bool json) {
  using namespace gpumem;
  std::string bytes;
  switch (ReadCapped(snapshotPath, bytes, pickle::kMaxPickleBytes)) {
    case ReadStatus::Ok: break;
    case ReadStatus::TooLarge:
      std::cerr << "error: " << snapshotPath << ": larger than " << (pickle::kMaxPickleBytes >> 20) << " MiB\n";
      return 1;
    case ReadStatus::Directory:
      std::cerr << "gpumem: " << snapshotPath << " is a directory; give the snapshot file\n";
      return 2;
    case ReadStatus::Unreadable:
      std::cerr << "gpumem: cannot read " << snapshotPath << ": " << std::strerror(errno) << "\n";
      return 2;
  }
  if (json) {
    const std::string out = CompareSnapshotJson(bytes, setupText, 2);
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }
  const MeasuredResult measured = ReadMemorySnapshot(bytes);
  EstimateResult estimate;
  if (!setupText.empty()) estimate = EstimateFromJson(setupText, {.timeline = EstimateOptions::Timeline::None, .explain = false});
  if (!measured.ok() || !estimate.ok()) {
    std::vector<FieldError> errors = measured.errors;
    errors.insert(errors.end(), estimate.errors.begin(), estimate.errors.end());
    for (const auto& e : errors) std::cerr << "error: " << e.field << ": " << e.message << "\n";
    return 1;
  }
  const MeasuredMemory& m = measured.measured;
  std::printf("Snapshot %s: device %d of %zu, %s trace entries\n", snapshotPath, m.device, m.deviceCount,
              FormatCount(static_cast<std::int64_t>(m.traceEntries)).c_str());
  auto row = [](const char* what, std::int64_t bytes) {
    std::printf("  %-34s %12s %22s B\n", what, HumanBytes(bytes).c_str(), FormatCount(bytes).c_str());
  };
  row("Measured peak allocated", m.peakAllocatedBytes);
  row("Measured peak reserved", m.peakReservedBytes);
  if (!setupText.empty()) {
    const DeviceEstimate& d = estimate.estimate.device;
    row("Estimated peak allocated", d.peakAllocatedBytes);
    row("Estimated peak reserved", d.peakReservedBytes);
    row("Estimate minus measured allocated", d.peakAllocatedBytes - m.peakAllocatedBytes);
    row("Estimate minus measured reserved", d.peakReservedBytes - m.peakReservedBytes);
  }
  const SegmentSummary& s = m.segments;
  std::printf("At the snapshot: %zu segments, %s reserved, %s allocated, %s cached in %zu free blocks "
              "(largest %s, fragmentation %.2f)\n", s.count, HumanBytes(s.reservedBytes).c_str(),
              HumanBytes(s.allocatedBytes).c_str(), HumanBytes(s.inactiveBytes).c_str(), s.inactiveBlockCount,
              HumanBytes(s.largestInactiveBlockBytes).c_str(), s.fragmentation);
  for (const auto& n : m.notes) std::printf("  - %s\n", n.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, timeline = false, solve = false;
  const char* path = nullptr;
  const char* importConfig = nullptr;
  const char* importSafetensors = nullptr;
  const char* importAdapter = nullptr;
  const char* compareSnapshot = nullptr;
  const char* importDeepSpeed = nullptr;
  const char* importAccelerate = nullptr;
  const char* importMegatron = nullptr;
  const char* layoutsFor = nullptr;
  bool fewestGpus = false;
  bool measureScript = false;
  std::string presetSetup;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") json = true;
    else if (arg == "--timeline") timeline = true;
    else if (arg == "--solve") solve = true;
    else if (arg == "--import-config" && i + 1 < argc) importConfig = argv[++i];
    else if (arg == "--import-safetensors" && i + 1 < argc) importSafetensors = argv[++i];
    else if (arg == "--import-adapter-config" && i + 1 < argc) importAdapter = argv[++i];
    else if (arg == "--compare-snapshot" && i + 1 < argc) compareSnapshot = argv[++i];
    else if (arg == "--import-deepspeed" && i + 1 < argc) importDeepSpeed = argv[++i];
    else if (arg == "--fewest-gpus") fewestGpus = true;
    else if (arg == "--measure-script") measureScript = true;
    else if (arg == "--import-accelerate" && i + 1 < argc) importAccelerate = argv[++i];
    else if (arg == "--import-megatron" && i + 1 < argc) importMegatron = argv[++i];
    else if (arg == "--layouts" && i + 1 < argc) layoutsFor = argv[++i];
    else if (arg == "--defaults") { std::cout << gpumem::SetupToJson(gpumem::DefaultSetup(), 2) << "\n"; return 0; }
    else if (arg == "--options") { std::cout << gpumem::OptionsJson(2) << "\n"; return 0; }
    else if (arg == "--presets") {
      for (const auto& p : gpumem::Presets()) {
        std::printf("  %-20s %-44s %20s parameters, %6s tokens by default (%s)\n", p.id, p.label,
                    FormatCount(p.publishedParameters).c_str(), FormatCount(p.defaultSequenceLength).c_str(),
                    p.source);
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
      if (path) { std::cerr << "gpumem: more than one setup given\n" << kUsage; return 2; }
      path = argv[i];
    } else { std::cerr << "gpumem: unknown option or missing argument: " << arg << "\n" << kUsage; return 2; }
  }

  if (importAdapter) {
    if (path || !presetSetup.empty() || importConfig || importSafetensors) {
      std::cerr << "gpumem: an import takes one file and no setup\n" << kUsage;
      return 2;
    }
    std::string content;
    if (const int status = ReadInput(importAdapter, true, "adapter config", content)) return status;
    const std::string out = gpumem::ImportAdapterConfigJson(content, 2);
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }
  if (importConfig || importSafetensors) {
    if (path || !presetSetup.empty() || (importConfig && importSafetensors)) {
      std::cerr << "gpumem: an import takes one file and no setup\n" << kUsage;
      return 2;
    }
    std::string content;
    const bool config = importConfig != nullptr;
    if (const int status = ReadInput(config ? importConfig : importSafetensors, true,
                                     config ? "config" : "safetensors header", content)) {
      return status;
    }
    const std::string out = config ? gpumem::ImportConfigJson(content, 2) : gpumem::ImportSafetensorsJson(content, {}, 2);
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }

  if (importDeepSpeed || importAccelerate || importMegatron) {  // applied to the setup given (or the defaults)
    std::string config, base;
    if (importMegatron) config = importMegatron;  // the arguments themselves, one quoted string
    else if (const int status = ReadInput(importDeepSpeed ? importDeepSpeed : importAccelerate, true,
                                          importDeepSpeed ? "DeepSpeed config" : "accelerate config", config)) {
      return status;
    }
    if (!presetSetup.empty()) base = presetSetup;
    else if (path) {
      if (const int status = ReadInput(std::strcmp(path, "-") != 0 ? path : nullptr, true, "setup", base)) return status;
    }
    const std::string out = importDeepSpeed    ? gpumem::ImportDeepSpeedJson(config, base, 2)
                            : importAccelerate ? gpumem::ImportAccelerateJson(config, base, 2)
                                               : gpumem::ImportMegatronJson(config, base, 2);
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }

  std::string text;
  if (compareSnapshot) {  // the setup is optional here: a file, a preset, or none
    if (!presetSetup.empty()) text = presetSetup;
    else if (path) {
      if (const int status = ReadInput(std::strcmp(path, "-") != 0 ? path : nullptr, json, "setup", text)) return status;
    }
    return CompareSnapshot(compareSnapshot, text, json);
  }
  if (!presetSetup.empty()) {
    if (path) { std::cerr << "gpumem: --preset and a setup file are exclusive\n" << kUsage; return 2; }
    text = presetSetup;
  } else if (const int status = ReadInput(path && std::strcmp(path, "-") != 0 ? path : nullptr, json, "setup", text)) {
    return status;
  }

  if (layoutsFor) {  // JSON either way: the layouts of N GPUs of the setup's type
    char* end = nullptr;
    const long long gpus = std::strtoll(layoutsFor, &end, 10);
    if (*layoutsFor == '\0' || *end != '\0') { std::cerr << "gpumem: --layouts takes a number of GPUs\n"; return 2; }
    const std::string out = gpumem::LayoutsJson("{\"setup\":" + text + ",\"gpus\":" + std::to_string(gpus) + "}", 2);
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }
  if (fewestGpus) {  // JSON either way: one small document
    const std::string out = gpumem::FewestGpusJson(text, true, 2);
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }
  if (measureScript) {  // the Python script that measures the setup on a GPU (or, --json, its envelope)
    const std::string out = gpumem::MeasureScriptJson(text, json ? 2 : -1);
    if (json) {
      std::cout << out << "\n";
      return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
    }
    const nlohmann::json doc = nlohmann::json::parse(out, nullptr, false);
    if (doc.is_discarded() || !doc.value("ok", false)) {
      for (const auto& e : doc.is_discarded() ? nlohmann::json::array() : doc["errors"]) {
        std::cerr << "gpumem: " << e.value("field", "") << ": " << e.value("message", "") << "\n";
      }
      return 1;
    }
    std::cout << doc["script"].get<std::string>();
    return 0;
  }
  // A single estimate takes the native host's work budget (setup.hpp kMaxHostPredictedEvents:
  // Qwen3-30B-A3B's 128 experts × 48 layers, which the page refuses); the solver, which runs many,
  // keeps the page's.
  const double budget = solve ? gpumem::kMaxPredictedEvents : gpumem::kMaxHostPredictedEvents;
  if (json) {
    // One document: the estimate, and with --solve the solver's answer beside it.
    const std::string out =
        solve ? gpumem::EstimateAndSolveJson(text, 2)
              : gpumem::EstimateJson(text, 2, {.timeline = gpumem::EstimateOptions::Timeline::Labelled,
                                               .maxPredictedEvents = budget});
    std::cout << out << "\n";
    return out.find("\"ok\": true") != std::string::npos ? 0 : 1;
  }
  gpumem::Setup setup;
  gpumem::EstimateResult result;
  result.errors = gpumem::ParseAndValidate(text, setup, budget);
  // The table's --timeline lists every event, labelled (without it no event's words are kept).
  if (result.ok()) {
    result = gpumem::EstimateMemory(setup, {.timeline = timeline ? gpumem::EstimateOptions::Timeline::Labelled
                                                                 : gpumem::EstimateOptions::Timeline::None,
                                            .maxPredictedEvents = budget});
  }
  if (!result.ok()) {
    for (const auto& e : result.errors) {
      std::cerr << "error: " << (e.field.empty() ? "setup" : e.field) << ": " << e.message << " ["
                << gpumem::ErrorCodeId(e.code) << "]\n";
    }
    return 1;
  }
  PrintTable(setup, result.estimate, timeline);
  if (solve) PrintSolve(gpumem::Solve(setup, result.estimate));
  return 0;
}
