// The golden estimates: a fixed matrix of setups and a one-line summary of each estimate.
//
// tests/data/golden-estimates.jsonl was written by gpumem_golden (tests/golden_tool.cpp) from
// the simulation as it stood before the engine was rewritten for speed; golden_test.cpp
// recomputes every line and requires it byte for byte. A line holds the peak (total, phase,
// step, event index and label), every category's bytes at the peak, each phase's peak, what
// forward leaves for backward, the model states, the event count and a hash of the whole
// event sequence (kind, bytes, category, phase, step, layer of every event), so a change in
// any event, not only at the peak, is caught.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/presets.hpp"

namespace gpumem::golden {

// Every preset × precision × attention × checkpointing × optimizer implementation × two
// batch/sequence sizes, then each optimizer kind, quick mode and layer lists.
inline std::vector<std::string> Setups() {
  std::vector<std::string> out;
  const char* precisions[] = {"fp32", "fp16Mixed", "bf16Mixed", "bf16", "ampBf16", "ampFp16"};
  const char* attentions[] = {"eager", "sdpa"};
  const char* checkpointings[] = {"none", "everyBlock", "everyKthBlock", "selective"};
  const char* implementations[] = {"forEach", "perParameter", "fused"};
  const std::int64_t sizes[][2] = {{1, 512}, {2, 2048}};
  // A sequence length the preset's learned position table allows.
  auto sequenceFor = [](const Preset& p, std::int64_t length) {
    const std::int64_t positions = p.architecture.maxPositionEmbeddings;
    return positions > 0 && length > positions ? positions : length;
  };
  for (const Preset& p : Presets()) {
    for (const auto& size : sizes) {
      const std::int64_t sequence = sequenceFor(p, size[1]);
      for (const char* precision : precisions)
        for (const char* attention : attentions)
          for (const char* checkpointing : checkpointings)
            for (const char* implementation : implementations) {
              out.push_back(std::string("{\"model\":{\"preset\":\"") + p.id +
                            "\"},\"training\":{\"batchSize\":" + std::to_string(size[0]) +
                            ",\"sequenceLength\":" + std::to_string(sequence) + ",\"precision\":\"" +
                            precision + "\",\"attention\":\"" + attention + "\",\"checkpointing\":\"" +
                            checkpointing + "\",\"optimizer\":\"adamw\",\"optimizerImplementation\":\"" +
                            implementation + "\"}}");
            }
    }
  }
  const char* optimizers[] = {"sgd", "sgdMomentum", "adam", "adamw", "adafactor"};
  for (const char* preset : {"gpt2", "llama-3.2-1b", "bert-base-uncased"})
    for (const char* optimizer : optimizers)
      for (const char* precision : {"fp32", "bf16Mixed", "bf16"})
        for (const char* implementation : {"forEach", "perParameter"}) {
          out.push_back(std::string("{\"model\":{\"preset\":\"") + preset +
                        "\"},\"training\":{\"batchSize\":2,\"sequenceLength\":256,\"precision\":\"" +
                        precision + "\",\"optimizer\":\"" + optimizer +
                        "\",\"optimizerImplementation\":\"" + implementation +
                        "\",\"adafactorBeta1\":true}}");
        }
  for (const char* precision : precisions)
    for (const char* optimizer : optimizers) {
      out.push_back(std::string("{\"model\":{\"kind\":\"parameterCount\",\"parameterCount\":1500000000},"
                                "\"training\":{\"batchSize\":4,\"sequenceLength\":1024,\"precision\":\"") +
                    precision + "\",\"optimizer\":\"" + optimizer + "\"}}");
    }
  const char* layerLists[] = {
      // The MLP of the classic "1.5 GB model using 6 GB" question, MSE loss.
      R"("layers":[{"type":"linear","inFeatures":240000,"outFeatures":1024},{"type":"relu"},)"
      R"({"type":"linear","inFeatures":1024,"outFeatures":512},{"type":"relu"},)"
      R"({"type":"linear","inFeatures":512,"outFeatures":240000}],"loss":"mse")",
      // A small language model as a layer list, cross-entropy loss, every layer kind.
      R"("layers":[{"type":"embedding","numEmbeddings":50000,"embeddingDim":512},)"
      R"({"type":"linear","inFeatures":512,"outFeatures":2048},{"type":"gelu"},{"type":"dropout","p":0.1},)"
      R"({"type":"linear","inFeatures":2048,"outFeatures":512,"bias":false},{"type":"tanh"},{"type":"sigmoid"},)"
      R"({"type":"dropout","p":0},{"type":"linear","inFeatures":512,"outFeatures":50000}],"loss":"crossEntropy")",
  };
  for (const char* layers : layerLists)
    for (const char* precision : {"fp32", "fp16Mixed", "bf16Mixed", "bf16"})
      for (const char* optimizer : optimizers) {
        out.push_back(std::string("{\"model\":{\"kind\":\"layers\",") + layers +
                      "},\"training\":{\"batchSize\":8,\"sequenceLength\":16,\"precision\":\"" + precision +
                      "\",\"optimizer\":\"" + optimizer + "\"}}");
      }
  // Non-reentrant checkpointing (training.useReentrant false, added 2026-11-29 after the
  // simulation it models): every preset, each checkpointing mode, eager and SDPA, with and
  // without early stop (PyTorch 2.4 and 2.0: neither passes enable_gqa, so only that differs).
  for (const Preset& p : Presets())
    for (const char* checkpointing : {"everyBlock", "everyKthBlock", "selective", "selectiveOp"})
      for (const char* attention : attentions)
        for (const char* pytorch : {"2.4", "2.0"}) {
          out.push_back(std::string("{\"model\":{\"preset\":\"") + p.id +
                        "\"},\"training\":{\"batchSize\":2,\"sequenceLength\":" + std::to_string(sequenceFor(p, 1024)) +
                        ",\"precision\":\"bf16Mixed\",\"attention\":\"" + attention + "\",\"checkpointing\":\"" +
                        checkpointing + "\",\"useReentrant\":false},\"runtime\":{\"pytorchVersion\":\"" + pytorch +
                        "\"}}");
        }
  return out;
}

// FNV-1a over the fields of every event that decide memory.
inline std::uint64_t EventHash(const std::vector<TimelinePoint>& timeline) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<std::uint64_t>(v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const TimelinePoint& p : timeline) {
    mix(p.deltaBytes);
    mix(static_cast<std::int64_t>(p.category));
    mix(static_cast<std::int64_t>(p.phase));
    mix(p.step);
    mix(p.layer);
  }
  return h;
}

// The summary of one setup's estimate, or its errors, as one JSON line.
inline std::string Line(const std::string& setupText) {
  const EstimateResult r = EstimateFromJson(setupText);
  std::string line = "{\"setup\":" + setupText;
  if (!r.ok()) {
    line += ",\"errors\":" + ErrorsToJson(r.errors) + "}";
    return line;
  }
  const Estimate& e = r.estimate;
  auto q = [](const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o + "\"";
  };
  std::int64_t categories[kCategoryCount] = {};
  for (const CategoryBytes& row : e.peak.byCategory) categories[static_cast<int>(row.category)] = row.bytes;
  line += ",\"peak\":" + std::to_string(e.peak.totalBytes) + ",\"phase\":\"" + IdOf(e.peak.phase) +
          "\",\"step\":" + std::to_string(e.peak.step) + ",\"eventIndex\":" + std::to_string(e.peak.eventIndex) +
          ",\"label\":" + q(e.peak.label) + ",\"categories\":[";
  for (int c = 0; c < kCategoryCount; ++c) line += (c ? "," : "") + std::to_string(categories[c]);
  line += "],\"phasePeaks\":[";
  for (std::size_t i = 0; i < e.phasePeaks.size(); ++i) {
    line += (i ? "," : "") + std::to_string(e.phasePeaks[i].totalBytes);
  }
  line += "],\"forwardEnd\":" + std::to_string(e.forwardEnd.totalBytes) +
          ",\"modelStates\":" + std::to_string(e.modelStates.totalBytes) +
          ",\"events\":" + std::to_string(e.timeline.size()) +
          ",\"eventHash\":\"" + std::to_string(EventHash(e.timeline)) + "\"}";
  return line;
}

}  // namespace gpumem::golden
