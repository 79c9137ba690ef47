// Imports: a DeepSpeed config JSON and Megatron-LM's parallel arguments (docs/parallel.md).
// Offline and exception-free: every value is type-checked before it is read.
#include <cctype>
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
      r.Count(z, "stage3_max_reuse_distance", path, p.stage3MaxReuseDistance);
      r.Count(z, "sub_group_size", path, p.subGroupSize);
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
                                     "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size",
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
  bool fp32GradBuffer = false;
  // Megatron's GPTModel computes its loss with the vocab-parallel cross-entropy
  // (language_module.py compute_language_model_loss → tensor_parallel.vocab_parallel_cross_entropy)
  // on the output layer's bf16/fp16/fp32 logits (parallel_output=True): sim/blocks/loss.cpp.
  // Simulated for decoders; another base model keeps its loss.
  const bool decoder = base.model.kind == ModelKind::Transformer && base.model.architecture.family != Family::BERT;
  if (decoder) t.lossImplementation = LossImplementation::MegatronVocabParallel;
  std::string crossEntropyFusion;  // --cross-entropy-fusion-impl (default "native")
  bool crossEntropyFused = false;
  bool maskedSoftmaxFusion = true;  // TransformerConfig.masked_softmax_fusion; --no-masked-softmax-fusion
  bool groupQueryAttention = false;  // --group-query-attention
  std::int64_t queryGroups = 0;      // --num-query-groups
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
    else if (flag == "--expert-tensor-parallel-size") number(p.expertTensorParallel);
    else if (flag == "--num-layers-per-virtual-pipeline-stage") number(layersPerVirtualStage);
    // megatron/training/arguments.py: the first / last pipeline stage's own layer count
    // (transformer_block.py get_num_layers_to_build gives the other stages the rest evenly).
    else if (flag == "--decoder-first-pipeline-num-layers") number(p.pipelineFirstStageLayers);
    else if (flag == "--decoder-last-pipeline-num-layers") number(p.pipelineLastStageLayers);
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
    } else if (flag == "--accumulate-allreduce-grads-in-fp32") {
      fp32GradBuffer = true;
    } else if (flag == "--group-query-attention") {
      groupQueryAttention = true;
    } else if (flag == "--num-query-groups") {
      number(queryGroups);
    } else if (flag == "--no-masked-softmax-fusion") {
      maskedSoftmaxFusion = false;
    } else if (flag == "--cross-entropy-loss-fusion") {
      crossEntropyFused = true;
    } else if (flag == "--cross-entropy-fusion-impl") {
      crossEntropyFusion = value;
    } else {
      out.ignoredFields.push_back(flag);
    }
  }
  // megatron/training/arguments.py validate_args: "bfloat16 requires gradient accumulation and
  // all-reduce to be done in fp32" (args.accumulate_allreduce_grads_in_fp32 = True with --bf16),
  // passed to DistributedDataParallelConfig as grad_reduce_in_fp32 (training.py get_model): one
  // whole fp32 gradient buffer, with the distributed optimizer (zeroStage 1, padded) or without
  // it (Megatron's DDP with Float16OptimizerWithFloat16Params, unpadded).
  if (fp32GradBuffer || t.precision == Precision::BF16Mixed) {
    p.gradReduceInFp32 = true;
    out.notes.push_back(std::string("Megatron keeps a whole fp32 gradient buffer (grad_reduce_in_fp32, on with --bf16): "
                                    "parallel.gradReduceInFp32") +
                        (p.zeroStage == 1 ? "" : "; without --use-distributed-optimizer, Float16OptimizerWithFloat16Params "
                                                 "keeps whole fp32 main params and Adam states"));
  }
  // megatron/core/fusions/fused_cross_entropy.py (the "native" fusion) keeps the same tensors:
  // the fp32 softmax saved (l.119), its gradient cast to bf16 in backward (l.82). Transformer
  // Engine's Triton kernel ("te") is another loss, not simulated.
  if (crossEntropyFused && crossEntropyFusion == "te") {
    out.notes.push_back("--cross-entropy-fusion-impl te (Transformer Engine's parallel cross-entropy) is not simulated: "
                        "the unfused vocab-parallel cross-entropy's memory is used");
  } else if (crossEntropyFused) {
    out.notes.push_back("--cross-entropy-loss-fusion (native): the fused vocab-parallel cross-entropy keeps the same "
                        "tensors as the unfused one (fp32 softmax saved, bf16 gradient)");
  }
  if (decoder) out.notes.push_back("Megatron's loss: training.lossImplementation megatronVocabParallel (vocab_parallel_cross_entropy)");
  // megatron/training/arguments.py: masked_softmax_fusion on unless --no-masked-softmax-fusion;
  // DotProductAttention's FusedScaleMaskSoftmax (megatron/core/fusions/fused_softmax.py). It acts
  // on materialised scores: simulated for the GPT-2 family's eager attention.
  const bool gpt2Eager = base.model.kind == ModelKind::Transformer && base.model.architecture.family == Family::GPT2 &&
                         t.attention == AttentionImplementation::Eager;
  if (maskedSoftmaxFusion && gpt2Eager) {
    t.maskedSoftmaxFusion = true;
    out.notes.push_back("Megatron's fused scale-mask-softmax (on unless --no-masked-softmax-fusion): "
                        "training.maskedSoftmaxFusion, where FusedScaleMaskSoftmax.is_kernel_available holds");
  } else if (!maskedSoftmaxFusion) {
    t.maskedSoftmaxFusion = false;
  }
  // megatron/training/arguments.py: num_query_groups is read only with --group-query-attention
  // (otherwise one group per head); the model's key/value heads (families/gpt2.cpp, llama).
  if (groupQueryAttention && queryGroups > 0) {
    if (base.model.kind == ModelKind::Transformer && base.model.architecture.family != Family::BERT) {
      out.setup.model.architecture.numKeyValueHeads = queryGroups;
      out.notes.push_back("--group-query-attention --num-query-groups " + std::to_string(queryGroups) +
                          ": model.architecture.numKeyValueHeads");
    } else {
      out.errors.push_back({ErrorCode::InvalidField, "--num-query-groups",
                            "Grouped-query attention needs a GPT-2- or Llama-family transformer as the base model."});
    }
  } else if (queryGroups > 0) {
    out.notes.push_back("--num-query-groups without --group-query-attention: Megatron ignores it (one group per head)");
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

// ---------------------------------------------------------------------------------------------
// accelerate's config (the YAML `accelerate config` writes, accelerate/commands/config/
// config_args.py ClusterConfig; FSDP keys as accelerate/utils/dataclasses.py
// FullyShardedDataParallelPlugin reads them). A small YAML subset: top-level `key: value`
// lines and one level of nested mappings (fsdp_config); comments, quotes, `[]` and `{}` as empty
// values. Anything else (lists, flow collections, anchors, block scalars, deeper nesting, tabs)
// is refused with the line it is on.
namespace gpumem {
namespace {

constexpr std::size_t kMaxYamlText = 64 << 10;
constexpr std::size_t kMaxYamlLines = 2000;

struct YamlEntry {
  std::string section;  // "" at the top level, else the nested mapping's key ("fsdp_config")
  std::string key, value;
  bool quoted = false;
  int line = 0;
};

std::string Trim(std::string_view s) {
  std::size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\r')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\r')) --b;
  return std::string(s.substr(a, b - a));
}

// Parses the subset; on failure adds one error naming the line.
bool ParseYamlSubset(std::string_view text, std::vector<YamlEntry>& entries, std::vector<FieldError>& errors) {
  auto fail = [&](int line, const std::string& message) {
    errors.push_back({ErrorCode::MalformedJson, "line " + std::to_string(line), message});
    return false;
  };
  if (text.size() > kMaxYamlText) return fail(0, "The accelerate config is larger than 64 KiB.");
  std::string section;
  int sectionIndent = -1;
  int lineNumber = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(start, end - start);
    start = end + 1;
    if (++lineNumber > static_cast<int>(kMaxYamlLines)) return fail(lineNumber, "More than 2,000 lines.");
    if (raw.find('\t') != std::string_view::npos) return fail(lineNumber, "Tabs are not allowed in YAML indentation.");
    int indent = 0;
    while (indent < static_cast<int>(raw.size()) && raw[indent] == ' ') ++indent;
    std::string body = Trim(raw);
    if (body.empty() || body[0] == '#' || body == "---" || body == "...") {
      if (end == text.size()) break;
      continue;
    }
    if (body[0] == '-') return fail(lineNumber, "Lists are not read (only key: value mappings).");
    const std::size_t colon = body.find(':');
    if (colon == std::string::npos || colon == 0) return fail(lineNumber, "Expected 'key: value'.");
    YamlEntry e;
    e.key = Trim(std::string_view(body).substr(0, colon));
    std::string value = Trim(std::string_view(body).substr(colon + 1));
    e.line = lineNumber;
    if (!value.empty() && (value[0] == '"' || value[0] == '\'')) {
      const char q = value[0];
      const std::size_t close = value.find(q, 1);
      if (close == std::string::npos) return fail(lineNumber, "Unterminated quoted string.");
      const std::string rest = Trim(std::string_view(value).substr(close + 1));
      if (!rest.empty() && rest[0] != '#') return fail(lineNumber, "Text after a quoted string.");
      e.value = value.substr(1, close - 1);
      e.quoted = true;
    } else {
      if (const std::size_t hash = value.find(" #"); hash != std::string::npos) value = Trim(std::string_view(value).substr(0, hash));
      if (!value.empty() && value[0] == '#') value.clear();
      if (value == "[]" || value == "{}") value.clear();
      else if (!value.empty() && std::string_view("[{|>&*!%@`").find(value[0]) != std::string_view::npos) {
        return fail(lineNumber, "Only plain scalars are read (no flow collections, block scalars, anchors or tags).");
      }
      e.value = value;
    }
    if (indent == 0) {
      section.clear();
      sectionIndent = -1;
      if (e.value.empty() && !e.quoted && body.back() == ':') {
        section = e.key;  // a nested mapping follows (or an empty one)
        continue;
      }
    } else {
      if (section.empty()) return fail(lineNumber, "Indented line outside a nested mapping.");
      if (sectionIndent < 0) sectionIndent = indent;
      if (indent != sectionIndent) return fail(lineNumber, "Only one level of nesting is read.");
      if (e.value.empty() && !e.quoted && body.back() == ':') return fail(lineNumber, "Only one level of nesting is read.");
      e.section = section;
    }
    entries.push_back(std::move(e));
    if (end == text.size()) break;
  }
  return true;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// PyYAML (YAML 1.1) booleans.
int YamlBool(const YamlEntry& e) {
  if (e.quoted) return -1;
  const std::string v = Lower(e.value);
  if (v == "true" || v == "yes" || v == "on") return 1;
  if (v == "false" || v == "no" || v == "off") return 0;
  return -1;
}

}  // namespace

ParallelImport ImportAccelerateConfig(std::string_view text, const Setup& base) {
  ParallelImport out;
  out.setup = base;
  std::vector<YamlEntry> entries;
  if (!ParseYamlSubset(text, entries, out.errors)) return out;
  ParallelDef& p = out.setup.parallel;
  TrainingDef& t = out.setup.training;
  auto fail = [&](const YamlEntry& e, const std::string& message) {
    out.errors.push_back({ErrorCode::InvalidField, e.section.empty() ? e.key : e.section + "." + e.key, message});
  };
  auto boolean = [&](const YamlEntry& e, bool& target) {
    const int b = YamlBool(e);
    if (b < 0) fail(e, "Must be true or false.");
    else target = b == 1;
  };
  std::string distributedType = "FSDP";
  bool offloadParams = false, sawFsdp = false;
  std::int64_t fsdpVersion = 1;
  const YamlEntry* reshard = nullptr;
  const YamlEntry* strategy = nullptr;
  int useOrigParams = -1;  // fsdp_use_orig_params: -1 unstated, 0 false, 1 true
  for (const YamlEntry& e : entries) {
    const std::string name = e.section.empty() ? e.key : e.section + "." + e.key;
    if (e.section.empty()) {
      if (e.key == "distributed_type") distributedType = e.value;
      else if (e.key == "num_processes") {
        char* endp = nullptr;
        const long long n = std::strtoll(e.value.c_str(), &endp, 10);
        if (e.value.empty() || *endp != '\0' || n < 1 || n > (1 << 20)) fail(e, "Must be a whole number of processes from 1 to 2^20.");
        else p.dataParallel = n;
      } else if (e.key == "mixed_precision") {
        // accelerate's choices: no, fp16, bf16, fp8 (PyYAML reads an unquoted no as false).
        const std::string v = Lower(e.value);
        if (v == "no" || v == "false") t.precision = Precision::FP32;
        else if (v == "bf16") t.precision = Precision::BF16Mixed;
        else if (v == "fp16") t.precision = Precision::FP16Mixed;
        else fail(e, "Must be no, fp16 or bf16 (fp8 is not simulated).");
      } else {
        out.ignoredFields.push_back(name);
      }
      continue;
    }
    if (e.section != "fsdp_config") {
      out.ignoredFields.push_back(name);
      continue;
    }
    sawFsdp = true;
    if (e.key == "fsdp_sharding_strategy") strategy = &e;
    else if (e.key == "fsdp_reshard_after_forward") reshard = &e;
    else if (e.key == "fsdp_version") {
      if (e.value == "1" || e.value == "2") fsdpVersion = e.value == "2" ? 2 : 1;
      else fail(e, "Must be 1 or 2.");
    } else if (e.key == "fsdp_offload_params") boolean(e, offloadParams);
    else if (e.key == "fsdp_forward_prefetch") boolean(e, p.forwardPrefetch);
    else if (e.key == "fsdp_backward_prefetch") {
      // accelerate: BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH (FSDP_BACKWARD_PREFETCH).
      if (e.value == "BACKWARD_PRE") p.backwardPrefetch = true;
      else if (e.value == "NO_PREFETCH") p.backwardPrefetch = false;
      else if (e.value == "BACKWARD_POST") {
        p.backwardPrefetch = false;
        out.notes.push_back("fsdp_backward_prefetch: BACKWARD_POST is simulated as no prefetch (the next unit is gathered after the current one's gradient, not alongside).");
      } else fail(e, "Must be BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH.");
    } else if (e.key == "fsdp_activation_checkpointing") {
      bool on = false;
      boolean(e, on);
      // accelerate (Accelerator.prepare_model): apply_activation_checkpointing with
      // checkpoint_wrapper(checkpoint_impl=CheckpointImpl.NO_REENTRANT) on every wrapped block.
      if (on) {
        t.checkpointing = Checkpointing::EveryBlock;
        t.useReentrant = false;
      }
    } else if (e.key == "fsdp_auto_wrap_policy") {
      if (e.value != "TRANSFORMER_BASED_WRAP") {
        out.notes.push_back("fsdp_auto_wrap_policy " + e.value + ": the simulation's wrap unit is the transformer block (TRANSFORMER_BASED_WRAP).");
      }
    } else if (e.key == "fsdp_use_orig_params") {
      useOrigParams = YamlBool(e);
      if (useOrigParams < 0) fail(e, "Must be true or false.");
      // Listed as ignored unless it turns PEFT's wrap policy on (below).
      if (useOrigParams != 0) out.ignoredFields.push_back(name);
    } else {
      // fsdp_state_dict_type, fsdp_cpu_ram_efficient_loading,
      // fsdp_sync_module_states, fsdp_transformer_layer_cls_to_wrap, …: no effect on the step's
      // memory that the simulation models.
      out.ignoredFields.push_back(name);
    }
  }
  if (distributedType == "MULTI_GPU" || distributedType == "NO") {
    p.fsdp = FsdpMode::Off;
    p.zeroStage = 0;
    p.fsdpWrapAdaptersApart = false;  // an FSDP wrap policy
    out.notes.push_back("distributed_type " + distributedType + ": DDP" + (sawFsdp ? " (fsdp_config not used)" : "") + ".");
    return out;
  }
  if (distributedType != "FSDP") {
    out.errors.push_back({ErrorCode::InvalidField, "distributed_type",
                          distributedType + " is not read here (FSDP, MULTI_GPU or NO; DeepSpeed has its own import)."});
    return out;
  }
  p.zeroStage = 0;
  p.fsdp = FsdpMode::FullShard;
  if (fsdpVersion == 2) {
    // FSDP2 (accelerate fsdp_version 2): fully_shard with fsdp_reshard_after_forward (a bool).
    p.fsdp = FsdpMode::FullyShard;
    if (reshard) boolean(*reshard, p.reshardAfterForward);
    if (strategy) out.ignoredFields.push_back("fsdp_config.fsdp_sharding_strategy");
  } else {
    // FSDP1: fsdp_sharding_strategy (newer accelerate also writes it as fsdp_reshard_after_forward),
    // a name or its 1-based index in FSDP_SHARDING_STRATEGY.
    const YamlEntry* s = strategy ? strategy : reshard;
    if (s) {
      static const char* kNames[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};
      std::string v = s->value;
      if (v.size() == 1 && v[0] >= '1' && v[0] <= '5') v = kNames[v[0] - '1'];
      if (v == "FULL_SHARD") p.fsdp = FsdpMode::FullShard;
      else if (v == "SHARD_GRAD_OP") p.fsdp = FsdpMode::ShardGradOp;
      else if (v == "HYBRID_SHARD") p.fsdp = FsdpMode::HybridShard;
      else if (v == "NO_SHARD") {
        p.fsdp = FsdpMode::Off;  // replicated like DDP (FSDP NO_SHARD all-reduces gradients)
        out.notes.push_back("NO_SHARD: simulated as DDP (nothing sharded, gradients all-reduced).");
      } else if (v == "HYBRID_SHARD_ZERO2") fail(*s, "HYBRID_SHARD_ZERO2 is not simulated yet.");
      else fail(*s, "Must be FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or 1-5.");
    }
  }
  if (offloadParams) {
    if (p.fsdp == FsdpMode::Off) out.notes.push_back("fsdp_offload_params with NO_SHARD is not simulated: no offload.");
    else p.offload = OffloadKind::OptimizerAndParameters;  // CPUOffload(offload_params=True)
  }
  // PEFT's wrap policy (parallel.fsdpWrapAdaptersApart). The YAML names no PEFT policy: HF's
  // Trainer installs peft's fsdp_auto_wrap_policy over accelerate's TRANSFORMER_BASED_WRAP for any
  // LoRA model (transformers trainer.py _fsdp_qlora_plugin_updates), and PEFT's FSDP guide pairs
  // it with fsdp_use_orig_params: false, without which a block mixing frozen and trainable
  // parameters is refused by FSDP (_flat_param.py _validate_tensors_to_flatten: uniform
  // requires_grad). So use_orig_params false on a LoRA setup means the adapters are wrapped
  // apart; with true (or unstated) it depends on the training script, and the field is left as it was.
  const bool fsdp1 = p.fsdp == FsdpMode::FullShard || p.fsdp == FsdpMode::ShardGradOp || p.fsdp == FsdpMode::HybridShard;
  const FinetuneDef& f = out.setup.finetune;
  if (fsdp1 && useOrigParams == 0) {
    if (f.lora && !f.useDora && out.setup.model.kind == ModelKind::Transformer) {
      p.fsdpWrapAdaptersApart = true;
      out.notes.push_back("fsdp_use_orig_params: false with LoRA: the adapters are FSDP units of their own, as PEFT's "
                          "fsdp_auto_wrap_policy wraps them (parallel.fsdpWrapAdaptersApart).");
    } else {
      out.ignoredFields.push_back("fsdp_config.fsdp_use_orig_params");
      out.notes.push_back("fsdp_use_orig_params: false: FSDP then needs every unit wholly trainable or wholly frozen; "
                          "with LoRA set (finetune.lora) the adapters are wrapped apart (PEFT's policy).");
    }
  } else if (fsdp1 && f.lora && !p.fsdpWrapAdaptersApart) {
    out.notes.push_back("LoRA under FSDP: HF's Trainer / TRL's SFTTrainer wrap each adapter as an FSDP unit of its own "
                        "(peft's fsdp_auto_wrap_policy); if your script trains with them, set "
                        "parallel.fsdpWrapAdaptersApart.");
  }
  if (!fsdp1) p.fsdpWrapAdaptersApart = false;
  return out;
}

}  // namespace gpumem
