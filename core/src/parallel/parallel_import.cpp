// Imports: a DeepSpeed config JSON and Megatron-LM's parallel arguments (docs/parallel.md).
// Offline and exception-free: every value is type-checked before it is read.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/parallel.hpp"

namespace gpumem {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxText = 1 << 20;

bool IsAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Hidden size for "auto" values: the base architecture's (transformers reads
// model.config.hidden_size, or max(hidden_sizes)).
std::int64_t HiddenOf(const Setup& base) {
  return base.model.kind == ModelKind::Transformer ? base.model.architecture.hiddenSize : 0;
}

struct DsReader {
  ParallelImport& out;
  std::int64_t h;

  void Fail(const std::string& field, const std::string& message) {
    out.errors.push_back({ErrorCode::InvalidField, field, message});
  }
  // An element count: a whole number (DeepSpeed configs write 5e8), or "auto" = `autoValue`.
  void Count(const json& obj, const char* key, const std::string& path, std::int64_t& target,
             double autoValue = -1, const char* autoRule = "") {
    auto it = obj.find(key);
    if (it == obj.end()) return;
    const std::string field = path + "." + key;
    if (IsAuto(*it)) {
      if (autoValue < 0) { out.notes.push_back(field + ": \"auto\" keeps " + std::to_string(target)); return; }
      if (h <= 0) { Fail(field, "\"auto\" needs the model's hidden size: choose a transformer architecture first."); return; }
      target = static_cast<std::int64_t>(autoValue);
      out.notes.push_back(field + ": \"auto\" = " + autoRule + " = " + std::to_string(target) + " (h = " + std::to_string(h) + ")");
      return;
    }
    if (!it->is_number()) { Fail(field, "Must be a number of elements or \"auto\"."); return; }
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < 0 || v > 1e12 || v != std::floor(v)) {
      Fail(field, "Must be a whole number of elements from 0 to 1e12.");
      return;
    }
    target = static_cast<std::int64_t>(v);
  }
  void Bool(const json& obj, const char* key, const std::string& path, bool& target) {
    auto it = obj.find(key);
    if (it == obj.end()) return;
    if (IsAuto(*it)) return;
    if (!it->is_boolean()) { Fail(path + "." + key, "Must be true, false or \"auto\"."); return; }
    target = it->get<bool>();
  }
  // offload_optimizer / offload_param: {"device": "cpu" | "nvme" | "none"}.
  bool Offloaded(const json& zero, const char* key) {
    auto it = zero.find(key);
    if (it == zero.end() || it->is_null()) return false;
    const std::string field = std::string("zero_optimization.") + key;
    if (!it->is_object()) { Fail(field, "Must be an object such as {\"device\": \"cpu\"}."); return false; }
    auto device = it->find("device");
    if (device == it->end()) return false;
    if (!device->is_string()) { Fail(field + ".device", "Must be \"cpu\", \"nvme\" or \"none\"."); return false; }
    const std::string d = device->get<std::string>();
    if (d == "none") return false;
    if (d == "nvme") out.notes.push_back(field + ": nvme is counted as host memory (off the GPU either way)");
    else if (d != "cpu") { Fail(field + ".device", "Must be \"cpu\", \"nvme\" or \"none\"."); return false; }
    return true;
  }
};

}  // namespace

ParallelImport ImportDeepSpeedConfig(std::string_view text, const Setup& base) {
  ParallelImport out;
  out.setup = base;
  if (text.size() > kMaxText) {
    out.errors.push_back({ErrorCode::MalformedJson, "", "The DeepSpeed config is larger than 1 MiB."});
    return out;
  }
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    out.errors.push_back({ErrorCode::MalformedJson, "", "The DeepSpeed config is not a JSON object."});
    return out;
  }
  DsReader r{out, HiddenOf(base)};
  ParallelDef& p = out.setup.parallel;
  TrainingDef& t = out.setup.training;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    static const char* kRead[] = {"zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu",
                                  "gradient_accumulation_steps", "train_batch_size"};
    bool read = false;
    for (const char* k : kRead) read = read || it.key() == k;
    if (!read) out.ignoredFields.push_back(it.key());
  }
  if (auto it = doc.find("zero_optimization"); it != doc.end()) {
    if (!it->is_object()) {
      r.Fail("zero_optimization", "Must be an object.");
    } else {
      const json& z = *it;
      const std::string path = "zero_optimization";
      if (auto s = z.find("stage"); s != z.end()) {
        if (!s->is_number_integer() || s->get<std::int64_t>() < 0 || s->get<std::int64_t>() > 3) {
          r.Fail(path + ".stage", "Must be 0, 1, 2 or 3.");
        } else {
          p.zeroStage = s->get<std::int64_t>();
        }
      }
      const double h = static_cast<double>(r.h);
      r.Count(z, "reduce_bucket_size", path, p.reduceBucketSize, h * h, "h²");
      r.Count(z, "allgather_bucket_size", path, p.allgatherBucketSize);
      r.Count(z, "stage3_prefetch_bucket_size", path, p.stage3PrefetchBucketSize, std::floor(0.9 * h * h), "0.9·h²");
      r.Count(z, "stage3_param_persistence_threshold", path, p.stage3ParamPersistenceThreshold, 10 * h, "10·h");
      r.Count(z, "stage3_max_live_parameters", path, p.stage3MaxLiveParameters);
      r.Bool(z, "contiguous_gradients", path, p.contiguousGradients);
      if (auto o = z.find("overlap_comm"); o != z.end() && !IsAuto(*o)) {
        if (!o->is_boolean()) r.Fail(path + ".overlap_comm", "Must be true, false or \"auto\".");
        else p.overlapComm = o->get<bool>() ? OverlapComm::On : OverlapComm::Off;
      }
      const bool optimizer = r.Offloaded(z, "offload_optimizer");
      const bool params = r.Offloaded(z, "offload_param");
      p.offload = params ? OffloadKind::OptimizerAndParameters : optimizer ? OffloadKind::Optimizer : OffloadKind::None;
      if (params && !optimizer) {
        out.notes.push_back("offload_param without offload_optimizer is counted as both offloaded (the setup has no "
                            "parameters-only offload)");
      }
      static const char* kKnown[] = {"stage", "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                                     "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                                     "contiguous_gradients", "overlap_comm", "offload_optimizer", "offload_param"};
      for (auto k = z.begin(); k != z.end(); ++k) {
        bool known = false;
        for (const char* n : kKnown) known = known || k.key() == n;
        if (!known) out.ignoredFields.push_back(path + "." + k.key());
      }
    }
  }
  auto enabled = [&](const char* key) -> int {  // 1 on, 0 off, -1 absent or "auto"
    auto it = doc.find(key);
    if (it == doc.end() || !it->is_object()) return -1;
    auto e = it->find("enabled");
    if (e == it->end() || IsAuto(*e)) return -1;
    if (!e->is_boolean()) { r.Fail(std::string(key) + ".enabled", "Must be true, false or \"auto\"."); return -1; }
    return e->get<bool>() ? 1 : 0;
  };
  const int bf16 = enabled("bf16"), fp16 = enabled("fp16");
  if (bf16 == 1 && fp16 == 1) r.Fail("fp16.enabled", "bf16 and fp16 cannot both be enabled.");
  else if (bf16 == 1) t.precision = Precision::BF16Mixed;
  else if (fp16 == 1) t.precision = Precision::FP16Mixed;
  else if (bf16 == 0 && fp16 == 0) t.precision = Precision::FP32;
  if (auto it = doc.find("train_micro_batch_size_per_gpu"); it != doc.end() && !IsAuto(*it)) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1) r.Fail("train_micro_batch_size_per_gpu", "Must be a whole number ≥ 1.");
    else t.batchSize = it->get<std::int64_t>();
  }
  if (auto it = doc.find("gradient_accumulation_steps"); it != doc.end() && !IsAuto(*it)) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1) r.Fail("gradient_accumulation_steps", "Must be a whole number ≥ 1.");
    else p.gradientAccumulationSteps = it->get<std::int64_t>();
  }
  out.notes.push_back("The data-parallel size is not in a DeepSpeed config (the launcher decides it): it stays " +
                      std::to_string(p.dataParallel) + ".");
  return out;
}

ParallelImport ImportMegatronArguments(std::string_view commandLine, const Setup& base) {
  ParallelImport out;
  out.setup = base;
  if (commandLine.size() > kMaxText) {
    out.errors.push_back({ErrorCode::InvalidField, "", "The command line is longer than 1 MiB."});
    return out;
  }
  std::vector<std::string> words;
  std::string word;
  for (char c : commandLine) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\\') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  ParallelDef& p = out.setup.parallel;
  TrainingDef& t = out.setup.training;
  std::int64_t layersPerVirtualStage = 0;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string flag = words[i];
    if (flag.rfind("--", 0) != 0) continue;
    std::string value;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
      value = words[i + 1];
    }
    auto number = [&](std::int64_t& target) {
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || end == nullptr || *end != '\0' || v < 1 || v > 1'000'000'000) {
        out.errors.push_back({ErrorCode::InvalidField, flag, "Must be followed by a whole number ≥ 1, got \"" + value.substr(0, 40) + "\"."});
        return;
      }
      target = v;
    };
    if (flag == "--tensor-model-parallel-size") number(p.tensorParallel);
    else if (flag == "--pipeline-model-parallel-size") number(p.pipelineParallel);
    else if (flag == "--context-parallel-size") number(p.contextParallel);
    else if (flag == "--expert-model-parallel-size") number(p.expertParallel);
    else if (flag == "--num-layers-per-virtual-pipeline-stage") number(layersPerVirtualStage);
    else if (flag == "--micro-batch-size") number(t.batchSize);
    else if (flag == "--seq-length") number(t.sequenceLength);
    else if (flag == "--sequence-parallel") p.sequenceParallel = true;
    else if (flag == "--bf16") t.precision = Precision::BF16Mixed;
    else if (flag == "--fp16") t.precision = Precision::FP16Mixed;
    else if (flag == "--use-distributed-optimizer") {
      // megatron/core/optimizer/distrib_optimizer.py shards the fp32 main parameters and the
      // optimizer states across data-parallel ranks, as ZeRO-1 does (its gradient buffer
      // stays whole).
      p.zeroStage = 1;
      out.notes.push_back("--use-distributed-optimizer is simulated as ZeRO-1 (sharded fp32 parameters and states)");
    } else {
      out.ignoredFields.push_back(flag);
    }
  }
  if (layersPerVirtualStage > 0) {
    p.pipelineSchedule = PipelineSchedule::Interleaved;
    const std::int64_t perStage = base.model.kind == ModelKind::Transformer && p.pipelineParallel > 0
                                      ? base.model.architecture.numLayers / p.pipelineParallel : 0;
    if (perStage > 0 && perStage % layersPerVirtualStage == 0) {
      p.virtualStages = perStage / layersPerVirtualStage;
    } else {
      out.errors.push_back({ErrorCode::InvalidField, "--num-layers-per-virtual-pipeline-stage",
                            "Must divide the layers per pipeline stage (num_layers / pipeline size)."});
    }
  }
  out.notes.push_back("The data-parallel size follows from the world size, which Megatron's arguments do not give: it "
                      "stays " + std::to_string(p.dataParallel) + ".");
  return out;
}

}  // namespace gpumem
