// The JSON schema (docs/schema.md). Built without exceptions for wasm, so every value is
// type-checked before it is read: no nlohmann call here may throw on any input.
#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "io/estimate_json.hpp"
#include "io/json_text.hpp"
#include "gpumem/gpus.hpp"
#include "gpumem/import.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/solve.hpp"
#include "gpumem/training_modes.hpp"

namespace gpumem {
namespace {

using nlohmann::json;
// Output keeps insertion order so that documents read top-down (schemaVersion, model, …).
using ojson = nlohmann::ordered_json;

constexpr std::size_t kMaxTextBytes = kMaxJsonTextBytes;
constexpr int kMaxDepth = kMaxJsonDepth;

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string KindOf(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// A value quoted back in a message: invalid UTF-8 replaced, long text cut.
std::string Echo(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

// What the text itself set, so that errors about values it did not set can say where those
// values came from (a preset, a family's defaults, the default setup).
struct Given {
  std::string presetId;                        // model.preset, when it named a known preset
  bool familyReset = false;  // model.architecture.family named another family: its defaults apply
  std::vector<std::string> architectureKeys;   // keys present in model.architecture
  std::vector<std::string> trainingKeys;       // keys present in training

  bool Architecture(std::string_view key) const {
    return std::find(architectureKeys.begin(), architectureKeys.end(), key) != architectureKeys.end();
  }
  bool Training(std::string_view key) const {
    return std::find(trainingKeys.begin(), trainingKeys.end(), key) != trainingKeys.end();
  }
};

class Reader {
 public:
  explicit Reader(ErrorList& errors) : errors_(errors) {}

  void Fail(ErrorCode code, const std::string& field, const std::string& message) {
    errors_.push_back({code, field, message});
  }
  bool Full() const { return errors_.Full(); }

  // True when `v` is an object; otherwise records an error.
  bool ExpectObject(const json& v, const std::string& path) {
    if (v.is_object()) return true;
    Fail(ErrorCode::InvalidField, path, "Expected an object, got " + KindOf(v) + ".");
    return false;
  }

  void RejectUnknown(const json& object, std::initializer_list<const char*> known,
                     const std::string& path) {
    for (auto it = object.begin(); it != object.end(); ++it) {
      bool ok = false;
      for (const char* k : known) ok = ok || it.key() == k;
      if (!ok && errors_.Full()) {
        errors_.CountOne();  // past the cap: count it, build no message
      } else if (!ok) {
        // A hostile document may use megabyte-long keys; echo at most 100 characters.
        const std::string key = it.key().size() > 100 ? it.key().substr(0, 100) + "..." : it.key();
        Fail(ErrorCode::UnknownField, Join(path, key),
             "Unknown field \"" + key + "\" (check the spelling; see docs/schema.md).");
      }
    }
  }

  void Int(const json& object, const char* key, const std::string& path, std::int64_t& out) {
    auto it = object.find(key);
    if (it == object.end()) return;
    const json& v = *it;
    if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))) {
      out = v.get<std::int64_t>();
      return;
    }
    // The field's name is built only for an error: a 5,000-layer list reads 10,000 of these.
    const std::string field = Join(path, key);
    if (v.is_number_integer()) {
      Fail(ErrorCode::InvalidField, field, "The value is far too large.");
      return;
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || std::fabs(d) > 9.0e18) {
        Fail(ErrorCode::InvalidField, field, "The value is far too large.");
      } else if (d != std::floor(d)) {
        Fail(ErrorCode::InvalidField, field, "Must be a whole number (got " + Echo(v) + ").");
      } else {
        out = static_cast<std::int64_t>(d);
      }
      return;
    }
    Fail(ErrorCode::InvalidField, field, "Must be a number, got " + KindOf(v) + ".");
  }

  void Number(const json& object, const char* key, const std::string& path, double& out) {
    auto it = object.find(key);
    if (it == object.end()) return;
    if (!it->is_number()) {
      Fail(ErrorCode::InvalidField, Join(path, key), "Must be a number, got " + KindOf(*it) + ".");
      return;
    }
    out = it->get<double>();
  }

  void Bool(const json& object, const char* key, const std::string& path, bool& out) {
    auto it = object.find(key);
    if (it == object.end()) return;
    if (!it->is_boolean()) {
      Fail(ErrorCode::InvalidField, Join(path, key), "Must be true or false, got " + KindOf(*it) + ".");
      return;
    }
    out = it->get<bool>();
  }

  // False when the field is present but not one of the enum's ids.
  template <class E>
  bool Enum(const json& object, const char* key, const std::string& path, E& out) {
    auto it = object.find(key);
    if (it == object.end()) return true;
    if (it->is_string() && FromId(it->get_ref<const std::string&>(), out)) return true;
    // The message (every id of the enum) is built only for an error.
    std::string allowed;
    for (const auto& n : NamesOf(E{})) allowed += (allowed.empty() ? "" : ", ") + std::string(n.id);
    Fail(ErrorCode::InvalidField, Join(path, key), "Must be one of " + allowed + " (got " + Echo(*it) + ").");
    return false;
  }

 private:
  ErrorList& errors_;
};

void ReadLayer(Reader& r, const json& v, const std::string& path, LayerDef& layer) {
  if (!r.ExpectObject(v, path)) return;
  auto type = v.find("type");
  if (type == v.end()) {
    r.Fail(ErrorCode::MissingField, path + ".type", "Each layer needs a \"type\".");
    return;
  }
  if (!r.Enum(v, "type", path, layer.kind)) return;  // the other fields depend on the type
  switch (layer.kind) {
    case LayerKind::Linear:
      r.RejectUnknown(v, {"type", "inFeatures", "outFeatures", "bias"}, path);
      if (!v.contains("inFeatures")) r.Fail(ErrorCode::MissingField, path + ".inFeatures", "A linear layer needs inFeatures.");
      if (!v.contains("outFeatures")) r.Fail(ErrorCode::MissingField, path + ".outFeatures", "A linear layer needs outFeatures.");
      r.Int(v, "inFeatures", path, layer.inFeatures);
      r.Int(v, "outFeatures", path, layer.outFeatures);
      r.Bool(v, "bias", path, layer.bias);
      break;
    case LayerKind::Embedding:
      r.RejectUnknown(v, {"type", "numEmbeddings", "embeddingDim"}, path);
      if (!v.contains("numEmbeddings")) r.Fail(ErrorCode::MissingField, path + ".numEmbeddings", "An embedding needs numEmbeddings.");
      if (!v.contains("embeddingDim")) r.Fail(ErrorCode::MissingField, path + ".embeddingDim", "An embedding needs embeddingDim.");
      r.Int(v, "numEmbeddings", path, layer.numEmbeddings);
      r.Int(v, "embeddingDim", path, layer.embeddingDim);
      break;
    case LayerKind::Dropout:
      r.RejectUnknown(v, {"type", "p"}, path);
      r.Number(v, "p", path, layer.dropoutProbability);
      break;
    default:
      r.RejectUnknown(v, {"type"}, path);
      break;
  }
}

// Fields override the family's defaults; naming another family starts from its defaults.
void ReadArchitecture(Reader& r, const json& v, ArchitectureDef& a, Given& given) {
  const std::string path = "model.architecture";
  if (!r.ExpectObject(v, path)) return;
  for (const ArchitectureField& f : ArchitectureFields()) {
    if (v.contains(f.key)) given.architectureKeys.push_back(f.key);
  }

  r.RejectUnknown(v, {"family", "vocabSize", "hiddenSize", "numLayers", "numHeads", "numKeyValueHeads",
                      "headDim", "intermediateSize", "maxPositionEmbeddings", "typeVocabSize",
                      "tieWordEmbeddings", "attentionBias", "outputBias", "mlpBias", "queryKeyNorm", "rmsNormUnitOffset",
                      "embeddingScale", "fusedProjections", "partialRotaryFactor", "sandwichNorms",
                      "attentionLogitSoftcap", "finalLogitSoftcap", "slidingWindow", "slidingWindowPattern", "gemma3Layout", "olmo2Layout", "rotaryFp32", "noRopeInterval", "graniteMultipliers", "parallelResidual", "hiddenAct", "numExperts", "expertsPerToken",
                      "expertIntermediateSize", "sharedExpertIntermediateSize", "sharedExpertGate", "normTopkProb",
                      "hiddenDropout", "attentionDropout", "encoderHead", "numLabels"},
                  path);
  Family family = a.family;
  if (r.Enum(v, "family", path, family) && family != a.family) {
    a = DefaultArchitecture(family);
    given.familyReset = true;
  }
  r.Int(v, "vocabSize", path, a.vocabSize);
  r.Int(v, "hiddenSize", path, a.hiddenSize);
  r.Int(v, "numLayers", path, a.numLayers);
  r.Int(v, "numHeads", path, a.numHeads);
  r.Int(v, "numKeyValueHeads", path, a.numKeyValueHeads);
  r.Int(v, "headDim", path, a.headDim);
  r.Int(v, "intermediateSize", path, a.intermediateSize);
  r.Int(v, "maxPositionEmbeddings", path, a.maxPositionEmbeddings);
  r.Int(v, "typeVocabSize", path, a.typeVocabSize);
  r.Bool(v, "tieWordEmbeddings", path, a.tieWordEmbeddings);
  r.Bool(v, "attentionBias", path, a.attentionBias);
  r.Bool(v, "outputBias", path, a.outputBias);
  r.Bool(v, "mlpBias", path, a.mlpBias);
  r.Bool(v, "queryKeyNorm", path, a.queryKeyNorm);
  r.Bool(v, "rmsNormUnitOffset", path, a.rmsNormUnitOffset);
  r.Bool(v, "embeddingScale", path, a.embeddingScale);
  r.Bool(v, "fusedProjections", path, a.fusedProjections);
  r.Number(v, "partialRotaryFactor", path, a.partialRotaryFactor);
  r.Bool(v, "sandwichNorms", path, a.sandwichNorms);
  r.Number(v, "attentionLogitSoftcap", path, a.attentionLogitSoftcap);
  r.Number(v, "finalLogitSoftcap", path, a.finalLogitSoftcap);
  r.Int(v, "slidingWindow", path, a.slidingWindow);
  r.Int(v, "slidingWindowPattern", path, a.slidingWindowPattern);
  r.Bool(v, "gemma3Layout", path, a.gemma3Layout);
  r.Bool(v, "olmo2Layout", path, a.olmo2Layout);
  r.Bool(v, "rotaryFp32", path, a.rotaryFp32);
  r.Bool(v, "graniteMultipliers", path, a.graniteMultipliers);
  r.Int(v, "noRopeInterval", path, a.noRopeInterval);
  r.Bool(v, "parallelResidual", path, a.parallelResidual);
  r.Enum(v, "hiddenAct", path, a.hiddenAct);
  r.Int(v, "numExperts", path, a.numExperts);
  r.Int(v, "expertsPerToken", path, a.expertsPerToken);
  r.Int(v, "expertIntermediateSize", path, a.expertIntermediateSize);
  r.Int(v, "sharedExpertIntermediateSize", path, a.sharedExpertIntermediateSize);
  r.Bool(v, "sharedExpertGate", path, a.sharedExpertGate);
  r.Bool(v, "normTopkProb", path, a.normTopkProb);
  r.Number(v, "hiddenDropout", path, a.hiddenDropout);
  r.Number(v, "attentionDropout", path, a.attentionDropout);
  r.Enum(v, "encoderHead", path, a.encoderHead);
  r.Int(v, "numLabels", path, a.numLabels);
}

void ReadModel(Reader& r, const json& v, ModelDef& model, Given& given) {
  const std::string path = "model";
  if (!r.ExpectObject(v, path)) return;
  r.RejectUnknown(v, {"kind", "parameterCount", "largestMatrices", "layers", "loss", "preset", "architecture"}, path);
  r.Enum(v, "kind", path, model.kind);
  if (auto it = v.find("preset"); it != v.end()) {
    const Preset* preset = it->is_string() ? FindPreset(it->get_ref<const std::string&>()) : nullptr;
    if (preset == nullptr) {
      std::string ids;
      for (const Preset& p : Presets()) ids += (ids.empty() ? "" : ", ") + std::string(p.id);
      r.Fail(ErrorCode::InvalidField, "model.preset", "Unknown preset " + Echo(*it) + "; known: " + ids + ".");
    } else {
      model.architecture = preset->architecture;
      given.presetId = preset->id;
      if (!v.contains("kind")) model.kind = ModelKind::Transformer;
    }
  }
  if (auto it = v.find("architecture"); it != v.end()) ReadArchitecture(r, *it, model.architecture, given);
  r.Int(v, "parameterCount", path, model.parameterCount);
  r.Enum(v, "loss", path, model.loss);
  if (auto it = v.find("largestMatrices"); it != v.end()) {
    if (!it->is_array()) {
      r.Fail(ErrorCode::InvalidField, "model.largestMatrices", "Must be an array of {rows, cols}.");
    } else if (it->size() > static_cast<std::size_t>(Limits::maxMatrices)) {
      r.Fail(ErrorCode::InvalidField, "model.largestMatrices", "Too many matrices listed.");
    } else {
      model.largestMatrices.clear();
      for (std::size_t i = 0; i < it->size(); ++i) {
        const std::string p = "model.largestMatrices[" + std::to_string(i) + "]";
        MatrixShape m;
        const json& e = (*it)[i];
        if (r.ExpectObject(e, p)) {
          r.RejectUnknown(e, {"rows", "cols"}, p);
          if (!e.contains("rows")) r.Fail(ErrorCode::MissingField, p + ".rows", "A matrix needs rows.");
          if (!e.contains("cols")) r.Fail(ErrorCode::MissingField, p + ".cols", "A matrix needs cols.");
          r.Int(e, "rows", p, m.rows);
          r.Int(e, "cols", p, m.cols);
        }
        model.largestMatrices.push_back(m);
      }
    }
  }
  if (auto it = v.find("layers"); it != v.end()) {
    if (!it->is_array()) {
      r.Fail(ErrorCode::InvalidField, "model.layers", "Must be an array of layers.");
    } else if (it->size() > static_cast<std::size_t>(Limits::maxLayers)) {
      r.Fail(ErrorCode::InvalidField, "model.layers", "Too many layers.");
    } else {
      model.layers.clear();
      for (std::size_t i = 0; i < it->size(); ++i) {
        LayerDef layer;
        ReadLayer(r, (*it)[i], "model.layers[" + std::to_string(i) + "]", layer);
        model.layers.push_back(layer);
      }
    }
  }
}

void ReadTraining(Reader& r, const json& v, TrainingDef& t, Given& given) {
  const std::string path = "training";
  if (!r.ExpectObject(v, path)) return;
  static constexpr const char* kKeys[] = {"batchSize", "sequenceLength", "precision", "optimizer",
                                          "optimizerImplementation", "adafactorBeta1", "zeroGradSetToNone",
                                          "attention", "checkpointing", "checkpointInterval",
                                          "lossImplementation", "lossChunks", "lossInModelDtype",
                                          "optimizerInBackward", "activationOffloading", "packedSequences",
                                          "maskedSoftmaxFusion", "useCache", "emptyCacheSteps", "useReentrant"};
  for (const char* key : kKeys) if (v.contains(key)) given.trainingKeys.push_back(key);
  r.RejectUnknown(v, {"batchSize", "sequenceLength", "precision", "optimizer",
                      "optimizerImplementation", "adafactorBeta1", "zeroGradSetToNone",
                      "attention", "checkpointing", "checkpointInterval", "lossImplementation",
                      "lossChunks", "lossInModelDtype", "optimizerInBackward", "activationOffloading",
                      "packedSequences", "maskedSoftmaxFusion", "useCache", "emptyCacheSteps", "useReentrant"}, path);
  r.Enum(v, "attention", path, t.attention);
  r.Enum(v, "checkpointing", path, t.checkpointing);
  r.Int(v, "checkpointInterval", path, t.checkpointInterval);
  r.Int(v, "batchSize", path, t.batchSize);
  r.Int(v, "sequenceLength", path, t.sequenceLength);
  r.Enum(v, "precision", path, t.precision);
  r.Enum(v, "optimizer", path, t.optimizer);
  r.Enum(v, "optimizerImplementation", path, t.optimizerImplementation);
  r.Bool(v, "adafactorBeta1", path, t.adafactorBeta1);
  r.Bool(v, "zeroGradSetToNone", path, t.zeroGradSetToNone);
  r.Enum(v, "lossImplementation", path, t.lossImplementation);
  r.Int(v, "lossChunks", path, t.lossChunks);
  r.Bool(v, "lossInModelDtype", path, t.lossInModelDtype);
  r.Bool(v, "maskedSoftmaxFusion", path, t.maskedSoftmaxFusion);
  r.Bool(v, "optimizerInBackward", path, t.optimizerInBackward);
  r.Bool(v, "activationOffloading", path, t.activationOffloading);
  r.Enum(v, "packedSequences", path, t.packedSequences);
  r.Bool(v, "useCache", path, t.useCache);
  r.Int(v, "emptyCacheSteps", path, t.emptyCacheSteps);
  r.Bool(v, "useReentrant", path, t.useReentrant);
}

void ReadRuntime(Reader& r, const json& v, RuntimeDef& runtime) {
  const std::string path = "runtime";
  if (!r.ExpectObject(v, path)) return;
  r.RejectUnknown(v, {"allocator", "cudaContextMiB", "cublasWorkspaceConfig", "pytorchVersion", "cudaVersion", "deepspeedVersion", "lazyModuleLoading", "ncclBuffersMiB", "hostMemoryGiB"}, path);
  if (auto it = v.find("allocator"); it != v.end() && r.ExpectObject(*it, "runtime.allocator")) {
    const std::string a = "runtime.allocator";
    r.RejectUnknown(*it, {"expandableSegments", "maxSplitSizeMiB", "roundupPower2Divisions", "garbageCollectionThreshold"}, a);
    r.Bool(*it, "expandableSegments", a, runtime.allocator.expandableSegments);
    r.Int(*it, "maxSplitSizeMiB", a, runtime.allocator.maxSplitSizeMiB);
    r.Int(*it, "roundupPower2Divisions", a, runtime.allocator.roundupPower2Divisions);
    r.Number(*it, "garbageCollectionThreshold", a, runtime.allocator.garbageCollectionThreshold);
  }
  r.Number(v, "cudaContextMiB", path, runtime.cudaContextMiB);
  r.Number(v, "ncclBuffersMiB", path, runtime.ncclBuffersMiB);
  r.Number(v, "hostMemoryGiB", path, runtime.hostMemoryGiB);
  if (auto it = v.find("cublasWorkspaceConfig"); it != v.end()) {
    if (!it->is_string()) {
      r.Fail(ErrorCode::InvalidField, "runtime.cublasWorkspaceConfig", "Must be a string such as \":4096:8\", got " + KindOf(*it) + ".");
    } else {
      runtime.cublasWorkspaceConfig = it->get<std::string>();
    }
  }
  // Versions are strings: as a JSON number 1.10 would read as 1.1.
  auto version = [&](const char* key, const char* example, std::string& out) {
    auto it = v.find(key);
    if (it == v.end()) return;
    if (!it->is_string() || it->get_ref<const std::string&>().size() > 64) {
      r.Fail(ErrorCode::InvalidField, path + "." + key,
             std::string("Must be a version string such as \"") + example + "\", got " + KindOf(*it) + ".");
    } else {
      out = it->get<std::string>();
    }
  };
  version("pytorchVersion", "2.5", runtime.pytorchVersion);
  version("cudaVersion", "12.4", runtime.cudaVersion);
  version("deepspeedVersion", "0.19.5", runtime.deepspeedVersion);
  r.Bool(v, "lazyModuleLoading", path, runtime.lazyModuleLoading);
}

// A list of module names (finetune.targetModules, finetune.trainOnlyModules).
void ReadNames(Reader& r, const json& v, const char* key, const std::string& path, std::vector<std::string>& out) {
  auto it = v.find(key);
  if (it == v.end()) return;
  const std::string field = path + "." + key;
  if (!it->is_array() || it->size() > 64) {
    r.Fail(ErrorCode::InvalidField, field, "Must be an array of at most 64 module names (strings).");
    return;
  }
  out.clear();
  for (const json& name : *it) {
    if (!name.is_string()) {
      r.Fail(ErrorCode::InvalidField, field, "Module names must be strings, got " + KindOf(name) + ".");
      return;
    }
    out.push_back(name.get<std::string>());
  }
}

// The fine-tuning section (finetune.hpp; PEFT's and bitsandbytes' option names).
void ReadFinetune(Reader& r, const json& v, FinetuneDef& f) {
  const std::string path = "finetune";
  if (!r.ExpectObject(v, path)) return;
  r.RejectUnknown(v, {"freezeEmbeddings", "freezeHead", "freezeFirstBlocks", "trainOnlyModules", "lora", "r",
                      "loraAlpha", "loraDropout", "targetModules", "useDora", "adapterDType", "quantization",
                      "doubleQuant", "computeDType", "prepareForKbitTraining", "quantStorage", "quantLayout",
                      "torchaoQuantizeInChunks"}, path);
  r.Bool(v, "freezeEmbeddings", path, f.freezeEmbeddings);
  r.Bool(v, "freezeHead", path, f.freezeHead);
  r.Int(v, "freezeFirstBlocks", path, f.freezeFirstBlocks);
  ReadNames(r, v, "trainOnlyModules", path, f.trainOnlyModules);
  r.Bool(v, "lora", path, f.lora);
  r.Int(v, "r", path, f.r);
  r.Number(v, "loraAlpha", path, f.loraAlpha);
  r.Number(v, "loraDropout", path, f.loraDropout);
  ReadNames(r, v, "targetModules", path, f.targetModules);
  r.Bool(v, "useDora", path, f.useDora);
  r.Enum(v, "adapterDType", path, f.adapterDType);
  r.Enum(v, "quantization", path, f.quantization);
  r.Bool(v, "doubleQuant", path, f.doubleQuant);
  if (auto it = v.find("computeDType"); it != v.end()) {
    const std::string id = it->is_string() ? it->get<std::string>() : "";
    if (id == "fp32") f.computeDType = DType::FP32;
    else if (id == "bf16") f.computeDType = DType::BF16;
    else if (id == "fp16") f.computeDType = DType::FP16;
    else r.Fail(ErrorCode::InvalidField, "finetune.computeDType", "Must be one of fp32, bf16, fp16 (got " + Echo(*it) + ").");
  }
  r.Bool(v, "prepareForKbitTraining", path, f.prepareForKbitTraining);
  if (auto it = v.find("quantStorage"); it != v.end()) {
    const std::string id = it->is_string() ? it->get<std::string>() : "";
    if (id == "uint8") f.quantStorage = DType::UInt8;
    else if (id == "bf16") f.quantStorage = DType::BF16;
    else if (id == "fp16") f.quantStorage = DType::FP16;
    else if (id == "fp32") f.quantStorage = DType::FP32;
    else r.Fail(ErrorCode::InvalidField, "finetune.quantStorage", "Must be one of uint8, bf16, fp16, fp32 (got " + Echo(*it) + ").");
  }
  r.Enum(v, "quantLayout", path, f.quantLayout);
  r.Bool(v, "torchaoQuantizeInChunks", path, f.torchaoQuantizeInChunks);
}

ojson FinetuneJson(const FinetuneDef& f) {
  return {{"freezeEmbeddings", f.freezeEmbeddings}, {"freezeHead", f.freezeHead},
          {"freezeFirstBlocks", f.freezeFirstBlocks}, {"trainOnlyModules", f.trainOnlyModules},
          {"lora", f.lora}, {"r", f.r}, {"loraAlpha", f.loraAlpha}, {"loraDropout", f.loraDropout},
          {"targetModules", f.targetModules}, {"useDora", f.useDora}, {"adapterDType", IdOf(f.adapterDType)},
          {"quantization", IdOf(f.quantization)}, {"doubleQuant", f.doubleQuant},
          {"computeDType", DTypeId(f.computeDType)}, {"quantStorage", DTypeId(f.quantStorage)},
          {"prepareForKbitTraining", f.prepareForKbitTraining}, {"quantLayout", IdOf(f.quantLayout)},
          {"torchaoQuantizeInChunks", f.torchaoQuantizeInChunks}};  // the order of the page's fields
}

// The parallel section (docs/parallel.md); every key optional, defaults from DefaultSetup().
void ReadParallel(Reader& r, const json& v, ParallelDef& p) {
  const std::string path = "parallel";
  if (!r.ExpectObject(v, path)) return;
  r.RejectUnknown(v, {"dataParallel", "zeroStage", "fsdp", "reshardAfterForward", "fsdpShardGroupSize",
                      "limitAllGathers", "forwardPrefetch", "backwardPrefetch", "bucketCapMB",
                      "gradientAsBucketView", "zeroRedundancyOptimizer", "reduceBucketSize", "allgatherBucketSize", "overlapComm",
                      "contiguousGradients", "stage3PrefetchBucketSize", "stage3MaxLiveParameters", "stage3MaxReuseDistance", "subGroupSize",
                      "stage3ParamPersistenceThreshold", "offload", "tensorParallel", "sequenceParallel",
                      "pipelineParallel", "pipelineSchedule", "virtualStages", "pipelineStage", "pipelineFirstStageLayers",
                      "pipelineLastStageLayers", "contextParallel",
                      "expertParallel", "expertTensorParallel", "gradientAccumulationSteps", "fsdpReduceInFp32",
                      "fsdpShardEmbeddingsAndHead", "gradReduceInFp32", "fsdpWrapAdaptersApart",
                      "fsdpKeepLastBlockGathered"}, path);
  r.Int(v, "dataParallel", path, p.dataParallel);
  r.Int(v, "zeroStage", path, p.zeroStage);
  r.Enum(v, "fsdp", path, p.fsdp);
  r.Bool(v, "reshardAfterForward", path, p.reshardAfterForward);
  r.Int(v, "fsdpShardGroupSize", path, p.fsdpShardGroupSize);
  r.Bool(v, "limitAllGathers", path, p.limitAllGathers);
  r.Bool(v, "forwardPrefetch", path, p.forwardPrefetch);
  r.Bool(v, "backwardPrefetch", path, p.backwardPrefetch);
  r.Number(v, "bucketCapMB", path, p.bucketCapMB);
  r.Bool(v, "gradientAsBucketView", path, p.gradientAsBucketView);
  r.Bool(v, "zeroRedundancyOptimizer", path, p.zeroRedundancyOptimizer);
  r.Int(v, "reduceBucketSize", path, p.reduceBucketSize);
  r.Int(v, "allgatherBucketSize", path, p.allgatherBucketSize);
  r.Enum(v, "overlapComm", path, p.overlapComm);
  r.Bool(v, "contiguousGradients", path, p.contiguousGradients);
  r.Int(v, "stage3PrefetchBucketSize", path, p.stage3PrefetchBucketSize);
  r.Int(v, "stage3MaxLiveParameters", path, p.stage3MaxLiveParameters);
  r.Int(v, "stage3MaxReuseDistance", path, p.stage3MaxReuseDistance);
  r.Int(v, "subGroupSize", path, p.subGroupSize);
  r.Int(v, "stage3ParamPersistenceThreshold", path, p.stage3ParamPersistenceThreshold);
  r.Enum(v, "offload", path, p.offload);
  r.Int(v, "tensorParallel", path, p.tensorParallel);
  r.Bool(v, "sequenceParallel", path, p.sequenceParallel);
  r.Int(v, "pipelineParallel", path, p.pipelineParallel);
  r.Enum(v, "pipelineSchedule", path, p.pipelineSchedule);
  r.Int(v, "virtualStages", path, p.virtualStages);
  r.Int(v, "pipelineStage", path, p.pipelineStage);
  r.Int(v, "pipelineFirstStageLayers", path, p.pipelineFirstStageLayers);
  r.Int(v, "pipelineLastStageLayers", path, p.pipelineLastStageLayers);
  r.Int(v, "contextParallel", path, p.contextParallel);
  r.Int(v, "expertParallel", path, p.expertParallel);
  r.Int(v, "expertTensorParallel", path, p.expertTensorParallel);
  r.Int(v, "gradientAccumulationSteps", path, p.gradientAccumulationSteps);
  r.Bool(v, "fsdpReduceInFp32", path, p.fsdpReduceInFp32);
  r.Bool(v, "fsdpShardEmbeddingsAndHead", path, p.fsdpShardEmbeddingsAndHead);
  r.Bool(v, "gradReduceInFp32", path, p.gradReduceInFp32);
  r.Bool(v, "fsdpWrapAdaptersApart", path, p.fsdpWrapAdaptersApart);
  r.Bool(v, "fsdpKeepLastBlockGathered", path, p.fsdpKeepLastBlockGathered);
}

ojson ParallelJson(const ParallelDef& p) {
  return {{"dataParallel", p.dataParallel}, {"zeroStage", p.zeroStage}, {"fsdp", IdOf(p.fsdp)},
          {"reshardAfterForward", p.reshardAfterForward}, {"fsdpShardGroupSize", p.fsdpShardGroupSize},
          {"limitAllGathers", p.limitAllGathers}, {"forwardPrefetch", p.forwardPrefetch},
          {"backwardPrefetch", p.backwardPrefetch}, {"bucketCapMB", p.bucketCapMB},
          {"gradientAsBucketView", p.gradientAsBucketView}, {"zeroRedundancyOptimizer", p.zeroRedundancyOptimizer},
          {"reduceBucketSize", p.reduceBucketSize},
          {"allgatherBucketSize", p.allgatherBucketSize}, {"overlapComm", IdOf(p.overlapComm)},
          {"contiguousGradients", p.contiguousGradients}, {"stage3PrefetchBucketSize", p.stage3PrefetchBucketSize},
          {"stage3MaxLiveParameters", p.stage3MaxLiveParameters}, {"stage3MaxReuseDistance", p.stage3MaxReuseDistance},
          {"subGroupSize", p.subGroupSize},
          {"stage3ParamPersistenceThreshold", p.stage3ParamPersistenceThreshold}, {"offload", IdOf(p.offload)},
          {"tensorParallel", p.tensorParallel}, {"sequenceParallel", p.sequenceParallel},
          {"pipelineParallel", p.pipelineParallel}, {"pipelineSchedule", IdOf(p.pipelineSchedule)},
          {"virtualStages", p.virtualStages}, {"pipelineStage", p.pipelineStage},
          {"pipelineFirstStageLayers", p.pipelineFirstStageLayers}, {"pipelineLastStageLayers", p.pipelineLastStageLayers},
          {"contextParallel", p.contextParallel},
          {"expertParallel", p.expertParallel}, {"expertTensorParallel", p.expertTensorParallel},
          {"gradientAccumulationSteps", p.gradientAccumulationSteps},
          {"fsdpReduceInFp32", p.fsdpReduceInFp32}, {"fsdpShardEmbeddingsAndHead", p.fsdpShardEmbeddingsAndHead},
          {"gradReduceInFp32", p.gradReduceInFp32}, {"fsdpWrapAdaptersApart", p.fsdpWrapAdaptersApart},
          {"fsdpKeepLastBlockGathered", p.fsdpKeepLastBlockGathered}};
}

ojson LayerToJson(const LayerDef& l) {
  ojson j = {{"type", IdOf(l.kind)}};
  if (l.kind == LayerKind::Linear) {
    j["inFeatures"] = l.inFeatures;
    j["outFeatures"] = l.outFeatures;
    j["bias"] = l.bias;
  } else if (l.kind == LayerKind::Embedding) {
    j["numEmbeddings"] = l.numEmbeddings;
    j["embeddingDim"] = l.embeddingDim;
  } else if (l.kind == LayerKind::Dropout) {
    j["p"] = l.dropoutProbability;
  }
  return j;
}

ojson ArchitectureJson(const ArchitectureDef& a) {
  return {{"family", IdOf(a.family)}, {"vocabSize", a.vocabSize}, {"hiddenSize", a.hiddenSize},
          {"numLayers", a.numLayers}, {"numHeads", a.numHeads}, {"numKeyValueHeads", a.numKeyValueHeads},
          {"headDim", a.headDim}, {"intermediateSize", a.intermediateSize},
          {"maxPositionEmbeddings", a.maxPositionEmbeddings}, {"typeVocabSize", a.typeVocabSize},
          {"tieWordEmbeddings", a.tieWordEmbeddings}, {"attentionBias", a.attentionBias},
          {"outputBias", a.outputBias}, {"mlpBias", a.mlpBias},
          {"queryKeyNorm", a.queryKeyNorm}, {"rmsNormUnitOffset", a.rmsNormUnitOffset},
          {"embeddingScale", a.embeddingScale}, {"fusedProjections", a.fusedProjections},
          {"partialRotaryFactor", a.partialRotaryFactor}, {"sandwichNorms", a.sandwichNorms},
          {"attentionLogitSoftcap", a.attentionLogitSoftcap}, {"finalLogitSoftcap", a.finalLogitSoftcap},
          {"slidingWindow", a.slidingWindow}, {"slidingWindowPattern", a.slidingWindowPattern},
          {"gemma3Layout", a.gemma3Layout}, {"olmo2Layout", a.olmo2Layout},
          {"rotaryFp32", a.rotaryFp32}, {"graniteMultipliers", a.graniteMultipliers},
          {"noRopeInterval", a.noRopeInterval},
          {"parallelResidual", a.parallelResidual},
          {"hiddenAct", IdOf(a.hiddenAct)}, {"numExperts", a.numExperts},
          {"expertsPerToken", a.expertsPerToken}, {"expertIntermediateSize", a.expertIntermediateSize},
          {"sharedExpertIntermediateSize", a.sharedExpertIntermediateSize},
          {"sharedExpertGate", a.sharedExpertGate}, {"normTopkProb", a.normTopkProb},
          {"hiddenDropout", a.hiddenDropout},
          {"attentionDropout", a.attentionDropout}, {"encoderHead", IdOf(a.encoderHead)},
          {"numLabels", a.numLabels}};
}

ojson TrainingJson(const TrainingDef& t) {
  return ojson{{"batchSize", t.batchSize},
               {"sequenceLength", t.sequenceLength},
               {"precision", IdOf(t.precision)},
               {"optimizer", IdOf(t.optimizer)},
               {"optimizerImplementation", IdOf(t.optimizerImplementation)},
               {"adafactorBeta1", t.adafactorBeta1},
               {"zeroGradSetToNone", t.zeroGradSetToNone},
               {"attention", IdOf(t.attention)},
               {"checkpointing", IdOf(t.checkpointing)},
               {"checkpointInterval", t.checkpointInterval},
               {"lossImplementation", IdOf(t.lossImplementation)},
               {"lossChunks", t.lossChunks},
               {"lossInModelDtype", t.lossInModelDtype},
               {"optimizerInBackward", t.optimizerInBackward},
               {"activationOffloading", t.activationOffloading},
               {"packedSequences", IdOf(t.packedSequences)},
               {"maskedSoftmaxFusion", t.maskedSoftmaxFusion},
               {"useCache", t.useCache},
               {"emptyCacheSteps", t.emptyCacheSteps},
               {"useReentrant", t.useReentrant}};
}

ojson RuntimeJson(const RuntimeDef& r) {
  return ojson{{"allocator", {{"expandableSegments", r.allocator.expandableSegments},
                              {"maxSplitSizeMiB", r.allocator.maxSplitSizeMiB},
                              {"roundupPower2Divisions", r.allocator.roundupPower2Divisions},
                              {"garbageCollectionThreshold", r.allocator.garbageCollectionThreshold}}},
               {"cudaContextMiB", r.cudaContextMiB},
               {"cublasWorkspaceConfig", r.cublasWorkspaceConfig},
               {"pytorchVersion", r.pytorchVersion},
               {"cudaVersion", r.cudaVersion},
               {"deepspeedVersion", r.deepspeedVersion},
               {"lazyModuleLoading", r.lazyModuleLoading},
               {"ncclBuffersMiB", r.ncclBuffersMiB},
               {"hostMemoryGiB", r.hostMemoryGiB}};
}

ojson SetupJson(const Setup& s) {
  ojson layers = ojson::array();
  for (const LayerDef& l : s.model.layers) layers.push_back(LayerToJson(l));
  ojson matrices = ojson::array();
  for (const MatrixShape& m : s.model.largestMatrices) matrices.push_back({{"rows", m.rows}, {"cols", m.cols}});
  return {
      {"schemaVersion", kSchemaVersion},
      {"model", {{"kind", IdOf(s.model.kind)}, {"parameterCount", s.model.parameterCount},
                 {"largestMatrices", matrices}, {"layers", layers}, {"loss", IdOf(s.model.loss)},
                 {"architecture", ArchitectureJson(s.model.architecture)}}},
      {"training", TrainingJson(s.training)},
      {"gpu", s.gpu.id.empty() ? ojson{{"memoryGiB", s.gpu.memoryGiB}}
                               : ojson{{"memoryGiB", s.gpu.memoryGiB}, {"id", s.gpu.id}}},
      {"runtime", RuntimeJson(s.runtime)},
      {"finetune", FinetuneJson(s.finetune)},
      {"parallel", ParallelJson(s.parallel)},
  };
}

ojson ErrorsArray(const std::vector<FieldError>& errors) {
  ojson out = ojson::array();
  for (const FieldError& e : errors) {
    out.push_back({{"code", ErrorCodeId(e.code)}, {"field", e.field}, {"message", e.message}});
  }
  return out;
}

template <class E>
ojson NameList() {
  ojson out = ojson::array();
  for (const auto& n : NamesOf(E{})) out.push_back({{"id", n.id}, {"label", n.label}});
  return out;
}

// Invalid UTF-8 in a message (echoed input) must not make dump() throw or abort.
std::string Dump(const ojson& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace

namespace {

// Reads a setup into `setup` (which starts as DefaultSetup()), errors into `errors`, and what
// the text gave into `given`. Linear in the text.
void ParseInto(std::string_view text, Setup& setup, ErrorList& errors, Given& given) {
  setup = DefaultSetup();
  Reader r(errors);
  if (text.size() > kMaxTextBytes) {
    r.Fail(ErrorCode::MalformedJson, "", "The setup is larger than 16 MiB.");
    return;
  }
  if (!NestingWithin(text, kMaxDepth)) {
    r.Fail(ErrorCode::MalformedJson, "", "The setup is nested more than 64 levels deep.");
    return;
  }
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    r.Fail(ErrorCode::MalformedJson, "", "The setup is not valid JSON.");
    return;
  }
  if (!r.ExpectObject(doc, "")) return;
  r.RejectUnknown(doc, {"schemaVersion", "model", "training", "gpu", "runtime", "finetune", "parallel"}, "");
  if (auto it = doc.find("schemaVersion"); it != doc.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() != kSchemaVersion) {
      r.Fail(ErrorCode::InvalidField, "schemaVersion", "Only schema version 1 is understood.");
    }
  }
  if (auto it = doc.find("model"); it != doc.end()) ReadModel(r, *it, setup.model, given);
  if (auto it = doc.find("training"); it != doc.end()) ReadTraining(r, *it, setup.training, given);
  if (auto it = doc.find("runtime"); it != doc.end()) ReadRuntime(r, *it, setup.runtime);
  if (auto it = doc.find("finetune"); it != doc.end()) ReadFinetune(r, *it, setup.finetune);
  if (auto it = doc.find("parallel"); it != doc.end()) ReadParallel(r, *it, setup.parallel);
  if (auto it = doc.find("gpu"); it != doc.end()) {
    if (r.ExpectObject(*it, "gpu")) {
      r.RejectUnknown(*it, {"memoryGiB", "id"}, "gpu");
      // A GPU of the list sets the capacity; an explicit memoryGiB still wins.
      if (auto id = it->find("id"); id != it->end()) {
        const GpuModel* gpu = id->is_string() ? FindGpu(id->get_ref<const std::string&>()) : nullptr;
        if (gpu == nullptr) {
          r.Fail(ErrorCode::InvalidField, "gpu.id", "Unknown GPU " + Echo(*id) + " (see the gpus list in the options).");
        } else {
          setup.gpu.id = gpu->id;
          setup.gpu.memoryGiB = gpu->memoryGiB;
        }
      }
      r.Number(*it, "memoryGiB", "gpu", setup.gpu.memoryGiB);
    }
  }
  // No sequence given: a preset's own working length (its published context, capped; see
  // presets.hpp), and for GPT-2 / BERT never longer than the position table, so that
  // {"model":{"preset":"bert-base-uncased"}} estimates as it stands.
  if (!given.Training("sequenceLength") && setup.model.kind == ModelKind::Transformer) {
    const ArchitectureDef& a = setup.model.architecture;
    if (const Preset* preset = FindPreset(given.presetId)) setup.training.sequenceLength = preset->defaultSequenceLength;
    if (a.family != Family::Llama && a.maxPositionEmbeddings >= 1) {
      setup.training.sequenceLength = std::min(setup.training.sequenceLength, a.maxPositionEmbeddings);
    }
  }
}

// Where a value the text did not set comes from, for messages.
std::string SourceOf(const Given& given, const Setup& setup) {
  if (!given.presetId.empty() && !given.familyReset) return "preset " + given.presetId;
  return std::string("the ") + IdOf(setup.model.architecture.family) + " family's defaults";
}

// Validation errors speak of what the person typed. A relation between two architecture fields
// (messages quote values as "key (value)") where the text set only one is restated in terms of
// the one it set; a quoted value it did not set says where it came from.
void Attribute(FieldError& e, const Given& given, const Setup& setup) {
  const std::string arch = "model.architecture.";
  const ArchitectureDef& a = setup.model.architecture;
  if (e.field == arch + "numKeyValueHeads" && !given.Architecture("numKeyValueHeads") &&
      given.Architecture("numHeads")) {
    e.field = arch + "numHeads";
    e.message = "numHeads (" + FormatCount(a.numHeads) + ") must be a multiple of the key/value heads: "
                "numKeyValueHeads is " + FormatCount(KeyValueHeads(a)) + " here, from " + SourceOf(given, setup) +
                " (this setup does not set it). Set numKeyValueHeads to a divisor of " + FormatCount(a.numHeads) +
                ", or 0 for one per query head.";
    return;
  }
  if (e.code == ErrorCode::TooLarge) return;
  std::string notes;
  for (const ArchitectureField& f : ArchitectureFields()) {
    if (given.Architecture(f.key) || e.message.find(std::string(f.key) + " (") == std::string::npos) continue;
    notes += (notes.empty() ? "" : ", ") + std::string(f.key);
  }
  if (!notes.empty()) {
    notes += std::string(notes.find(',') == std::string::npos ? " comes" : " come") + " from " + SourceOf(given, setup) +
             "; this setup does not set " + (notes.find(',') == std::string::npos ? "it" : "them");
  }
  if (e.field.starts_with("training.") && !given.Training(e.field.substr(9))) {
    notes += (notes.empty() ? "" : "; ") + e.field.substr(9) + " is the default here; this setup does not set it";
  }
  if (notes.empty()) return;
  if (e.message.ends_with(".")) e.message.pop_back();
  e.message += " (" + notes + ").";
}

// Parse errors, then — when they all fit in the report — validation errors, skipping a field
// already named (and everything inside it: a layer whose type is unknown is not then told that
// its features are missing). Linear: the named fields are looked up in a hash set, each
// validation error by its own path and its parents'.
std::vector<FieldError> ParseAndValidateInto(std::string_view text, Setup& setup, Given& given,
                                             double maxPredictedEvents = kMaxPredictedEvents) {
  ErrorList errors;
  ParseInto(text, setup, errors, given);
  if (!errors.empty() && errors.Kept().front().code == ErrorCode::MalformedJson) return errors.Report();
  if (errors.size() > kMaxReportedErrors) {
    // Too many to list already: the values are checked once the text reads cleanly.
    return errors.Report("These are errors in the text; the values are checked once it reads cleanly.");
  }
  std::unordered_set<std::string> named;
  for (const FieldError& p : errors.Kept()) {
    std::string field = p.field;
    if (field.ends_with(".type")) field.resize(field.size() - 5);
    named.insert(std::move(field));
  }
  errors.SetFilter([&named](const FieldError& e) {
    if (named.count(e.field)) return true;
    for (std::size_t i = e.field.size(); i-- > 0;) {
      if ((e.field[i] == '.' || e.field[i] == '[') && named.count(e.field.substr(0, i))) return true;
    }
    return false;
  });
  const std::size_t parseErrors = errors.size();
  Validate(setup, errors, maxPredictedEvents);
  std::vector<FieldError> out = errors.Report();
  for (std::size_t i = parseErrors; i < out.size(); ++i) {
    if (out[i].code != ErrorCode::TooManyErrors) Attribute(out[i], given, setup);
  }
  return out;
}

}  // namespace

SetupParseResult ParseSetupJson(std::string_view text) {
  SetupParseResult result;
  ErrorList errors;
  Given given;
  ParseInto(text, result.setup, errors, given);
  result.errors = errors.Report();
  return result;
}

std::string SetupToJson(const Setup& setup, int indent) { return Dump(SetupJson(setup), indent); }

std::string EstimateToJson(const Estimate& estimate, int indent) {
  return EstimateOnlyJson(estimate, indent);
}

std::string ErrorsToJson(const std::vector<FieldError>& errors, int indent) {
  return Dump(ErrorsArray(errors), indent);
}

std::vector<FieldError> ParseAndValidate(std::string_view text, Setup& setup, double maxPredictedEvents) {
  Given given;
  return ParseAndValidateInto(text, setup, given, maxPredictedEvents);
}

std::string EstimateResultToJson(const EstimateResult& result, int indent) {
  if (!result.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(result.errors)}}, indent);
  return EstimateEnvelopeJson(result.estimate, indent);
}

EstimateResult EstimateFromJson(std::string_view setupText, const EstimateOptions& options) {
  Setup setup;
  EstimateResult result;
  result.errors = ParseAndValidate(setupText, setup, options.maxPredictedEvents);
  if (result.ok()) result = EstimateMemory(setup, options);
  return result;
}

// The JSON timeline's most points (EstimateOptions::timelineLimit); the CLI's --timeline
// prints every event.
constexpr std::size_t kTimelineLimit = 2000;

std::string EstimateJson(std::string_view setupText, int indent, EstimateOptions options) {
  if (options.timelineLimit == 0) options.timelineLimit = kTimelineLimit;
  return EstimateResultToJson(EstimateFromJson(setupText, options), indent);
}

std::string ValidateJson(std::string_view setupText, int indent, double maxPredictedEvents) {
  Setup setup;
  const std::vector<FieldError> errors = ParseAndValidate(setupText, setup, maxPredictedEvents);
  if (!errors.empty()) return Dump({{"ok", false}, {"errors", ErrorsArray(errors)}}, indent);
  return Dump({{"ok", true}, {"setup", SetupJson(setup)}}, indent);
}

std::string ImportConfigJson(std::string_view configText, int indent) {
  const ConfigImport c = ImportHfConfig(configText);
  if (!c.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(c.errors)}}, indent);
  Setup imported = DefaultSetup();
  imported.model.kind = ModelKind::Transformer;
  imported.model.architecture = c.architecture;
  // The count, when the architecture is valid at all (its own errors show once it is estimated).
  // (The count needs the inventory only: the largest work budget, so that a model the page
  // estimates within its own is counted too.)
  std::vector<FieldError> problems;
  for (const FieldError& e : Validate(imported, kMaxHostPredictedEvents)) if (e.field.starts_with("model.")) problems.push_back(e);
  const ojson count = problems.empty() ? ojson(BuildInventory(imported).ParameterCount()) : ojson(nullptr);
  ojson setup = {{"model", {{"kind", IdOf(ModelKind::Transformer)}, {"architecture", ArchitectureJson(c.architecture)}}}};
  std::vector<std::string> notes = c.notes;
  if (!c.useCache) {
    setup["training"] = {{"useCache", false}};
    notes.push_back("use_cache is false: transformers keeps no KV cache in training (training.useCache).");
  }
  // A quantized checkpoint's quantization_config: the finetune section's quantization fields.
  const QuantizationImport q = ImportQuantizationConfig(configText);
  if (!q.errors.empty()) return Dump({{"ok", false}, {"errors", ErrorsArray(q.errors)}}, indent);
  if (q.found) {
    const ojson f = FinetuneJson(q.finetune);
    setup["finetune"] = {{"quantization", f["quantization"]}, {"doubleQuant", f["doubleQuant"]},
                         {"computeDType", f["computeDType"]}};
    if (q.finetune.quantStorage != DType::UInt8) setup["finetune"]["quantStorage"] = f["quantStorage"];
    notes.insert(notes.end(), q.notes.begin(), q.notes.end());
    notes.push_back("quantization_config read: bitsandbytes weights cannot be trained, so add LoRA adapters "
                    "(and prepare_model_for_kbit_training) before estimating.");
  }
  return Dump({{"ok", true},
               {"modelType", c.modelType},
               {"parameterCount", count},
               {"setup", setup},
               {"ignoredFields", c.ignoredFields},
               {"notes", notes}},
              indent);
}

std::string ImportAdapterConfigJson(std::string_view text, int indent) {
  const AdapterImport a = ImportAdapterConfig(text);
  if (!a.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(a.errors)}}, indent);
  const ojson f = FinetuneJson(a.finetune);
  ojson finetune = ojson::object();
  for (const char* key : {"lora", "r", "loraAlpha", "loraDropout", "targetModules", "useDora"}) finetune[key] = f[key];
  return Dump({{"ok", true}, {"setup", {{"finetune", finetune}}}, {"ignoredFields", a.ignoredFields}, {"notes", a.notes}},
              indent);
}

namespace {
// The base setup of an import: the defaults, or the given setup when it is valid.
bool BaseSetup(std::string_view setupText, Setup& base, std::vector<FieldError>& errors) {
  base = DefaultSetup();
  if (setupText.empty()) return true;
  errors = ParseAndValidate(setupText, base);
  return errors.empty();
}

std::string ParallelImportJson(const ParallelImport& r, int indent) {
  if (!r.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(r.errors)}}, indent);
  return Dump({{"ok", true}, {"setup", SetupJson(r.setup)}, {"ignoredFields", r.ignoredFields}, {"notes", r.notes}},
              indent);
}
}  // namespace

std::string ImportDeepSpeedJson(std::string_view configText, std::string_view setupText, int indent) {
  Setup base;
  std::vector<FieldError> errors;
  if (!BaseSetup(setupText, base, errors)) return Dump({{"ok", false}, {"errors", ErrorsArray(errors)}}, indent);
  return ParallelImportJson(ImportDeepSpeedConfig(configText, base), indent);
}

std::string ImportMegatronJson(std::string_view commandLine, std::string_view setupText, int indent) {
  Setup base;
  std::vector<FieldError> errors;
  if (!BaseSetup(setupText, base, errors)) return Dump({{"ok", false}, {"errors", ErrorsArray(errors)}}, indent);
  return ParallelImportJson(ImportMegatronArguments(commandLine, base), indent);
}

std::string ImportAccelerateJson(std::string_view configText, std::string_view setupText, int indent) {
  Setup base;
  std::vector<FieldError> errors;
  if (!BaseSetup(setupText, base, errors)) return Dump({{"ok", false}, {"errors", ErrorsArray(errors)}}, indent);
  return ParallelImportJson(ImportAccelerateConfig(configText, base), indent);
}

std::string FewestGpusJson(std::string_view setupText, bool allowOffload, int indent) {
  Setup setup;
  const std::vector<FieldError> errors = ParseAndValidate(setupText, setup);
  if (!errors.empty()) return Dump({{"ok", false}, {"errors", ErrorsArray(errors)}}, indent);
  const FewestGpusResult r = FewestGpus(setup, 4096, allowOffload);
  ojson out = {{"found", r.found}, {"gpus", r.found ? ojson(r.gpus) : ojson(nullptr)},
               {"estimatesRun", r.estimates}};
  auto describe = [](ojson& o, const FewestGpusLayout& l) {
    o["layout"] = l.candidate.label;
    o["communicationParameters"] = l.candidate.communicationParameters;
    o["offload"] = l.candidate.offload;
    o["peakDeviceBytes"] = l.peakDeviceBytes;
    o["hostNodeBytes"] = l.hostNodeBytes;
    o["setup"] = SetupJson(l.layout);
  };
  if (r.found) describe(out, r);
  out["hostTooSmall"] = r.hostTooSmall;
  if (r.found && r.candidate.offload) {
    // The fewest without offloading, or null when none up to the search's limit fits.
    ojson alt = nullptr;
    if (r.withoutOffload.found) {
      alt = {{"gpus", r.withoutOffload.gpus}};
      describe(alt, r.withoutOffload);
    }
    out["withoutOffload"] = alt;
  }
  return Dump({{"ok", true}, {"fewestGpus", out}}, indent);
}

std::string ImportSafetensorsJson(std::string_view text, std::string_view setupText, int indent) {
  const SafetensorsImport t = ImportSafetensors(text);
  if (!t.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(t.errors)}}, indent);
  ojson dtypes = ojson::object();
  for (const auto& [name, count] : t.dtypes) dtypes[name] = count;
  ojson matrices = ojson::array();
  for (std::size_t i = 0; i < t.largestMatrices.size(); ++i) {
    matrices.push_back({{"rows", t.largestMatrices[i].rows}, {"cols", t.largestMatrices[i].cols},
                        {"name", t.largestNames[i]}});
  }
  ojson out = {{"ok", true}, {"source", t.fromHeader ? "header" : "index"}};
  out["parameterCount"] = t.parameterCount ? ojson(*t.parameterCount) : ojson(nullptr);
  out["totalSizeBytes"] = t.totalSizeBytes;
  out["tensorCount"] = t.tensorCount;
  out["dtypes"] = dtypes;
  out["largestMatrices"] = matrices;
  out["numLayers"] = t.numLayers;
  if (t.parameterCount) {
    ojson shapes = ojson::array();
    for (const MatrixShape& m : t.largestMatrices) shapes.push_back({{"rows", m.rows}, {"cols", m.cols}});
    out["setup"] = {{"model", {{"kind", IdOf(ModelKind::ParameterCount)}, {"parameterCount", *t.parameterCount},
                               {"largestMatrices", shapes}}}};
  } else {
    out["setup"] = nullptr;
  }
  out["architectureParameterCount"] = nullptr;
  out["differenceFromArchitecture"] = nullptr;
  Setup setup;
  if (t.parameterCount && !setupText.empty() && ParseAndValidate(setupText, setup).empty() &&
      setup.model.kind == ModelKind::Transformer) {
    const std::int64_t architecture = BuildInventory(setup).ParameterCount();
    out["architectureParameterCount"] = architecture;
    out["differenceFromArchitecture"] = *t.parameterCount - architecture;
  }
  out["notes"] = t.notes;
  return Dump(out, indent);
}

namespace {

ojson SolveObject(const SolveResult& r) {
  auto limit = [](const SolvedLimit& l) {
    return l.found ? ojson{{"value", l.value}, {"peakBytes", l.peakBytes}, {"limit", l.limit}, {"limitReason", l.limitReason}}
                   : ojson(nullptr);
  };
  ojson suggestions = ojson::array();
  for (const FitSuggestion& s : r.suggestions) {
    // The change as a partial setup: only the fields it touches, read back from its setup's
    // sections as SetupJson writes them (each section made once, and only the sections touched:
    // the whole setup for each of a solve's dozen suggestions was 4 % of a Mixtral 8x22B solve).
    ojson sections = ojson::object();
    auto section = [&](const std::string& name) -> ojson& {
      if (!sections.contains(name)) {
        sections[name] = name == "training"   ? TrainingJson(s.setup.training)
                         : name == "runtime"  ? RuntimeJson(s.setup.runtime)
                         : name == "finetune" ? FinetuneJson(s.setup.finetune)
                         : name == "parallel" ? ParallelJson(s.setup.parallel)
                                              : SetupJson(s.setup)[name];
      }
      return sections[name];
    };
    ojson change = ojson::object();
    for (const std::string& f : s.changedFields) {
      if (f.rfind("runtime.allocator.", 0) == 0) {
        const std::string key = f.substr(std::string("runtime.allocator.").size());
        change["runtime"]["allocator"][key] = section("runtime")["allocator"][key];
        continue;
      }
      const std::string name = f.substr(0, f.find('.'));  // "training", "finetune"
      const std::string key = f.substr(f.find('.') + 1);
      change[name][key] = section(name)[key];
    }
    suggestions.push_back({{"id", s.id}, {"label", s.label}, {"tradeoff", s.tradeoff},
                           {"cost", FitCostId(s.cost)}, {"change", change},
                           {"peakBytes", s.peakBytes}, {"savedBytes", s.savedBytes}, {"fits", s.fits},
                           {"peakIsLowerBound", s.peakIsLowerBound}, {"lowerBoundBasis", s.lowerBoundBasis}});
  }
  return {{"currentPeakBytes", r.currentPeakBytes}, {"capacityBytes", r.capacityBytes},
          {"maxBatchSize", limit(r.maxBatchSize)}, {"maxSequenceLength", limit(r.maxSequenceLength)},
          {"suggestions", suggestions}, {"estimatesRun", r.estimatesRun}};
}

}  // namespace

std::string SolveJson(std::string_view setupText, int indent) {
  Setup setup;
  const std::vector<FieldError> errors = ParseAndValidate(setupText, setup);
  if (!errors.empty()) return Dump({{"ok", false}, {"errors", ErrorsArray(errors)}}, indent);
  const SolveResult r = Solve(setup);
  if (!r.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(r.errors)}}, indent);
  return Dump({{"ok", true}, {"solve", SolveObject(r)}}, indent);
}

std::string EstimateAndSolveJson(std::string_view setupText, int indent) {
  Setup setup;
  EstimateResult estimated;
  estimated.errors = ParseAndValidate(setupText, setup);
  if (estimated.ok()) {
    estimated = EstimateMemory(setup, {.timeline = EstimateOptions::Timeline::Labelled, .timelineLimit = kTimelineLimit});
  }
  if (!estimated.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(estimated.errors)}}, indent);
  const SolveResult r = Solve(setup, estimated.estimate);
  if (!r.ok()) return Dump({{"ok", false}, {"errors", ErrorsArray(r.errors)}}, indent);
  // The estimate's own writer, read back so the two parts print alike (a CLI path: its cost is
  // no concern).
  const ojson estimate = ojson::parse(EstimateOnlyJson(estimated.estimate, -1), nullptr, false);
  return Dump({{"ok", true}, {"estimate", estimate}, {"solve", SolveObject(r)}}, indent);
}

const char* Version() { return GPUMEM_VERSION; }

namespace {
// The fine-tuning form: each field of setup.finetune with its kind, unit and the framework
// option it is (the page builds its form from this list).
ojson FinetuneFieldsJson() {
  struct Field { const char* key; const char* label; const char* kind; const char* options; const char* hint; const char* when; };
  static constexpr Field kFields[] = {
      {"freezeEmbeddings", "Freeze embeddings", "bool", "", "requires_grad_(False) on the token / position embeddings", ""},
      {"freezeHead", "Freeze head", "bool", "", "lm_head (untied), pooler, classifier", ""},
      {"freezeFirstBlocks", "Freeze first blocks", "count", "", "blocks 0 … k−1 frozen; layers below the lowest trainable parameter run no backward", ""},
      {"trainOnlyModules", "Train only modules", "names", "", "only parameters inside these modules train (\"norm\", \"lm_head\")", ""},
      {"lora", "LoRA adapters", "bool", "", "peft get_peft_model(LoraConfig): base weights frozen", ""},
      {"r", "Rank r", "count", "", "r: A is [r, in], B is [out, r]", "lora"},
      {"loraAlpha", "lora_alpha", "number", "", "scaling = lora_alpha / r", "lora"},
      {"loraDropout", "lora_dropout", "number", "", "probability in [0, 1); 0 = no mask", "lora"},
      {"targetModules", "target_modules", "names", "", "q_proj, v_proj, c_attn, query, all-linear …; empty = PEFT's default for the family", "lora"},
      {"useDora", "use_dora (DoRA)", "bool", "", "a magnitude per output feature; W + s·B·A and its norm every forward", "lora"},
      {"adapterDType", "Adapter dtype", "select", "adapterDTypes", "fp32 = PEFT's autocast_adapter_dtype=True", "lora"},
      {"quantization", "Quantized base weights", "select", "quantizations", "bitsandbytes load_in_4bit (nf4 / fp4) or load_in_8bit", ""},
      {"doubleQuant", "Double quantization", "bool", "", "bnb_4bit_use_double_quant: 8-bit absmax + fp32 per 256 blocks", "quantization"},
      {"computeDType", "Compute dtype", "select", "computeDTypes", "bnb_4bit_compute_dtype: the dequantized weight's dtype", "quantization"},
      {"quantStorage", "Quant storage", "select", "quantStorages", "bnb_4bit_quant_storage: the packed codes' element type (bf16 for FSDP / ZeRO-3)", "quantization"},
      {"prepareForKbitTraining", "prepare_model_for_kbit_training", "bool", "", "other 16-bit parameters upcast to fp32, checkpointing on every block, input gradients", ""},
      {"quantLayout", "4-bit layout", "select", "quantLayouts", "bitsandbytes Params4bit, or torchao NF4Tensor (torchtune's QLoRA, single GPU or FSDP2)", "quantization"},
      {"torchaoQuantizeInChunks", "to_nf4 in chunks", "bool", "", "torchao ≥ 0.2 quantizes 1,048,576 values at a time while loading; off = torchao 0.1 (whole weight)", "quantization"},
  };
  ojson out = ojson::array();
  for (const Field& f : kFields) {
    ojson field = {{"key", f.key}, {"label", f.label}, {"kind", f.kind}, {"hint", f.hint}};
    if (*f.options) field["options"] = f.options;
    if (*f.when) field["when"] = {{"field", f.when}, {"value", f.when == std::string("lora") ? "true" : "notNone"}};
    out.push_back(field);
  }
  return out;
}

// The memory savers of training (TrainingDef), each with the framework option it is, so the
// page builds their controls from here and says where each comes from.
ojson SaverFields() {
  struct Saver { const char* key; const char* label; const char* kind; const char* options;
                 const char* framework; const char* hint; };
  static constexpr Saver kSavers[] = {
      {"lossImplementation", "Loss", "select", "lossImplementations",
       "torchtune: loss=CEWithChunkedOutputLoss (model.set_num_output_chunks); Liger: use_liger_kernel=True "
       "(LigerFusedLinearCrossEntropyLoss); Megatron-LM: tensor_parallel.vocab_parallel_cross_entropy",
       "chunked: logits made and upcast to fp32 one chunk at a time in the forward; fused linear + cross-entropy: "
       "no full logits, the head's gradients made in forward; Megatron: one fp32 copy of the rank's logits, "
       "softmaxed in place and reused as their gradient; transformer decoders only"},
      {"lossChunks", "Loss chunks", "count", "",
       "torchtune: CEWithChunkedOutputLoss(num_output_chunks=8)",
       "chunks along the sequence, 1–8 (torch.chunk: ceil(s / n) tokens each)"},
      {"lossInModelDtype", "Loss in the model dtype (no fp32 upcast)", "bool", "",
       "nanoGPT: F.cross_entropy(logits.view(-1, V), targets.view(-1)) without logits.float()",
       "log_softmax in bf16/fp16; under autocast log_softmax still runs in fp32"},
      {"optimizerInBackward", "Optimizer step in backward", "bool", "",
       "torchtune: optimizer_in_bwd=True (register_post_accumulate_grad_hook)",
       "each parameter stepped and its gradient freed as soon as it is complete; no gradient accumulation"},
      {"activationOffloading", "Offload activations to host memory", "bool", "",
       "torchtune: enable_activation_offloading=True (OffloadActivations); TRL: activation_offloading=True",
       "saved activations ≥ 1 KiB copied to pinned host memory in forward (the last 5 kept while the copy runs) "
       "and brought back one backward op at a time; the output head and the loss stay on the GPU"},
      {"packedSequences", "Packed sequences", "select", "packedSequences",
       "transformers: DataCollatorWithFlattening (position_ids); torchtune: dataset.packed=True",
       "blockCausalMask: a bool [b, 1, s, s] mask, and under SDPA the memory-efficient kernel with a float copy "
       "of it saved by every layer; flashVarlen: no mask (needs SDPA here, as the flash kernel)"},
      {"maskedSoftmaxFusion", "Megatron's fused scale-mask-softmax", "bool", "",
       "Megatron-LM: --masked-softmax-fusion (on unless --no-masked-softmax-fusion; FusedScaleMaskSoftmax)",
       "one kernel scales, masks and softmaxes the 16-bit scores and keeps only its 16-bit output; used where "
       "is_kernel_available holds (16 < s ≤ 4096, s, b·heads multiples of 4); GPT-2 family, eager attention"},
      {"useCache", "Keep transformers' KV cache in training (use_cache)", "bool", "",
       "transformers: the config's use_cache (True by default); model(..., use_cache=False) or "
       "config.use_cache = False turns it off, gradient checkpointing turns it off by itself",
       "transformers 5.x copies every layer's key and value into a DynamicCache; under SDPA the GPT-2 family's "
       "attention then keeps those copies (2 · b · s · h per layer) instead of views of c_attn's output"},
      {"useReentrant", "Reentrant activation checkpointing (use_reentrant)", "bool", "",
       "transformers: gradient_checkpointing_kwargs={\"use_reentrant\": False} turns it off (on by default); "
       "accelerate's FSDP activation checkpointing, torchtune and torchtitan run it off",
       "off: the checkpoint's forward records its graph and packs what it saves; the recompute keeps no outputs, "
       "holds no incoming gradient, and from PyTorch 2.1 stops after the last tensor backward needs; no "
       "enable_input_require_grads for LoRA; only with checkpointing on (op-level selective checkpointing is always "
       "non-reentrant)"},
      {"emptyCacheSteps", "Empty the CUDA cache every N steps", "number", "",
       "transformers: TrainingArguments(torch_empty_cache_steps=N); 0 = None, the default",
       "torch.cuda.empty_cache() between each micro-batch's forward and backward in every N-th update: the "
       "allocator's unsplit cached segments go back to CUDA (less reserved, slower steps); the allocated "
       "figures do not move"},
  };
  ojson out = ojson::array();
  for (const Saver& f : kSavers) {
    ojson field = {{"key", f.key}, {"label", f.label}, {"kind", f.kind}, {"framework", f.framework}, {"hint", f.hint}};
    if (*f.options) field["options"] = f.options;
    out.push_back(field);
  }
  return out;
}
}  // namespace

// The training modes of "What you will do" (model/training_modes.cpp), each with the whole
// finetune section it sets for every family (the recipe's targets depend on the family).
static ojson TrainingModesJson() {
  ojson out = ojson::array();
  for (const TrainingMode& m : TrainingModes()) {
    ojson byFamily = ojson::object();
    for (const auto& family : NamesOf(Family{})) byFamily[family.id] = FinetuneJson(TrainingModeFinetune(m, family.value));
    out.push_back({{"id", m.id}, {"label", m.label}, {"source", m.source}, {"finetuneByFamily", byFamily}});
  }
  return out;
}

std::string OptionsJson(int indent) {
  ojson examples = ojson::array();
  examples.push_back({{"id", "quick-1.5b"}, {"label", "1.5B parameters, quick mode (fp16 mixed, Adam)"},
                      {"setup", SetupJson(DefaultSetup())}});
  examples.push_back({{"id", "mlp"}, {"label", "MLP 240000 → 1024 → 512 → 240000 (fp32, Adam)"},
                      {"setup", SetupJson(ExampleMlpSetup())}});
  ojson presets = ojson::array();
  for (const Preset& p : Presets()) {
    presets.push_back({{"id", p.id}, {"label", p.label}, {"source", p.source},
                       {"publishedParameters", p.publishedParameters}, {"countedAs", p.countedAs},
                       {"note", p.note}, {"defaultSequenceLength", p.defaultSequenceLength},
                       {"architecture", ArchitectureJson(p.architecture)}});
  }
  ojson gpus = ojson::array();
  for (const GpuModel& g : Gpus()) {
    gpus.push_back({{"id", g.id}, {"label", g.label}, {"memoryGiB", g.memoryGiB}, {"vendor", g.vendor}, {"kind", g.kind},
                    {"capacitySource", g.capacitySource}});
  }
  ojson fields = ojson::array();
  for (const ArchitectureField& f : ArchitectureFields()) {
    ojson families = ojson::array();
    if (f.gpt2) families.push_back(IdOf(Family::GPT2));
    if (f.llama) families.push_back(IdOf(Family::Llama));
    if (f.bert) families.push_back(IdOf(Family::BERT));
    if (f.neox) families.push_back(IdOf(Family::GPTNeoX));
    ojson field = {{"key", f.key}, {"label", f.label}, {"kind", f.kind}, {"hint", f.hint}, {"families", families}};
    if (*f.options) field["options"] = f.options;
    if (*f.whenField) field["when"] = {{"field", f.whenField}, {"value", f.whenValue}};
    fields.push_back(field);
  }
  ojson parallelFields = ojson::array();
  for (const ParallelField& f : ParallelFields()) {
    ojson field = {{"key", f.key}, {"label", f.label}, {"kind", f.kind}, {"hint", f.hint}};
    if (*f.options) field["options"] = f.options;
    parallelFields.push_back(field);
  }
  ojson familyDefaults = ojson::object();
  for (const auto& n : NamesOf(Family{})) familyDefaults[n.id] = ArchitectureJson(DefaultArchitecture(n.value));
  return Dump({{"schemaVersion", kSchemaVersion},
               {"version", GPUMEM_VERSION},
               {"presets", presets},
               {"gpus", gpus},
               {"familyDefaults", familyDefaults},
               {"architectureFields", fields},
               {"families", NameList<Family>()},
               {"hiddenActs", NameList<HiddenAct>()},
               {"encoderHeads", NameList<EncoderHead>()},
               {"attentions", NameList<AttentionImplementation>()},
               {"checkpointings", NameList<Checkpointing>()},
               {"quantizations", NameList<Quantization>()},
               {"adapterDTypes", NameList<AdapterDType>()},
               {"quantLayouts", NameList<QuantLayout>()},
               {"computeDTypes", ojson::array({{{"id", "fp32"}, {"label", "fp32 (bitsandbytes' default)"}},
                                               {{"id", "bf16"}, {"label", "bf16"}},
                                               {{"id", "fp16"}, {"label", "fp16"}}})},
               {"quantStorages", ojson::array({{{"id", "uint8"}, {"label", "uint8 (bitsandbytes' default)"}},
                                               {{"id", "bf16"}, {"label", "bf16 (FSDP / ZeRO-3 QLoRA)"}},
                                               {{"id", "fp16"}, {"label", "fp16"}},
                                               {{"id", "fp32"}, {"label", "fp32"}}})},
               {"finetuneFields", FinetuneFieldsJson()},
               {"defaultSetup", SetupJson(DefaultSetup())},
               {"examples", examples},
               {"modelKinds", NameList<ModelKind>()},
               {"layerTypes", NameList<LayerKind>()},
               {"losses", NameList<LossKind>()},
               {"precisions", NameList<Precision>()},
               {"optimizers", NameList<OptimizerKind>()},
               {"optimizerImplementations", NameList<OptimizerImplementation>()},
               {"lossImplementations", NameList<LossImplementation>()},
               {"packedSequences", NameList<PackedSequences>()},
               {"trainingModes", TrainingModesJson()},
               {"savers", SaverFields()},
               {"phases", NameList<Phase>()},
               {"categories", NameList<Category>()},
               {"parallelFields", parallelFields},
               {"fsdpModes", NameList<FsdpMode>()},
               {"offloads", NameList<OffloadKind>()},
               {"pipelineSchedules", NameList<PipelineSchedule>()},
               {"overlapComms", NameList<OverlapComm>()}},
              indent);
}

}  // namespace gpumem
