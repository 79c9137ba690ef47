// Reading Hugging Face config.json files and safetensors headers / indexes. Built without
// exceptions for wasm: every value is type-checked before it is read.
#include "gpumem/import.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "gpumem/format.hpp"
#include "io/json_text.hpp"

namespace gpumem {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxTextBytes = kMaxJsonTextBytes;

// Parses `text` as one JSON object, or records why not under `what`.
bool ParseObject(std::string_view text, const char* what, json& doc, std::vector<FieldError>& errors) {
  if (text.size() > kMaxTextBytes) {
    errors.push_back({ErrorCode::MalformedJson, "", std::string("The ") + what + " is larger than 16 MiB."});
    return false;
  }
  if (!NestingWithin(text, kMaxJsonDepth)) {
    errors.push_back({ErrorCode::MalformedJson, "", std::string("The ") + what + " is nested more than 64 levels deep."});
    return false;
  }
  doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    errors.push_back({ErrorCode::MalformedJson, "", std::string("The ") + what + " is not valid JSON."});
    return false;
  }
  if (!doc.is_object()) {
    errors.push_back({ErrorCode::MalformedJson, "", std::string("The ") + what + " must be a JSON object."});
    return false;
  }
  return true;
}

class ConfigReader {
 public:
  ConfigReader(const json& doc, ConfigImport& out) : doc_(doc), out_(out) {}

  // The first of `keys` present (config names differ by family: n_embd / hidden_size).
  const json* Find(std::initializer_list<const char*> keys) {
    for (const char* k : keys) {
      auto it = doc_.find(k);
      if (it != doc_.end() && !it->is_null()) {
        used_.push_back(k);
        return &*it;
      }
      if (it != doc_.end()) used_.push_back(k);  // null: "use the default"
    }
    return nullptr;
  }

  void Int(std::initializer_list<const char*> keys, std::int64_t& target, bool required) {
    const json* v = Find(keys);
    const std::string field = std::string("config.") + *keys.begin();
    if (!v) {
      if (required) out_.errors.push_back({ErrorCode::MissingField, field, "config.json has no " + std::string(*keys.begin()) + "."});
      return;
    }
    if (v->is_number_integer() && !(v->is_number_unsigned() && v->get<std::uint64_t>() > 1'000'000'000'000ull)) {
      target = v->get<std::int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
               std::fabs(v->get<double>()) < 1e12) {
      target = static_cast<std::int64_t>(v->get<double>());
    } else {
      out_.errors.push_back({ErrorCode::InvalidField, field, "Must be a whole number."});
    }
  }

  void Number(std::initializer_list<const char*> keys, double& target) {
    const json* v = Find(keys);
    if (!v) return;
    if (v->is_number()) target = v->get<double>();
    else out_.errors.push_back({ErrorCode::InvalidField, std::string("config.") + *keys.begin(), "Must be a number."});
  }

  void Bool(std::initializer_list<const char*> keys, bool& target) {
    const json* v = Find(keys);
    if (!v) return;
    if (v->is_boolean()) target = v->get<bool>();
    else out_.errors.push_back({ErrorCode::InvalidField, std::string("config.") + *keys.begin(), "Must be true or false."});
  }

  void Activation(std::initializer_list<const char*> keys, HiddenAct& target) {
    const json* v = Find(keys);
    if (!v) return;
    const std::string field = std::string("config.") + *keys.begin();
    if (!v->is_string()) {
      out_.errors.push_back({ErrorCode::InvalidField, field, "Must be an activation name."});
      return;
    }
    const std::string& name = v->get_ref<const std::string&>();
    if (name == "gelu") target = HiddenAct::GELU;
    else if (name == "gelu_new" || name == "gelu_fast") target = HiddenAct::GELUNew;
    else if (name == "gelu_pytorch_tanh" || name == "gelu_tanh") target = HiddenAct::GELUTanh;
    else if (name == "silu" || name == "swish") target = HiddenAct::SiLU;
    else out_.errors.push_back({ErrorCode::InvalidField, field, "Activation \"" + name.substr(0, 40) + "\" is not simulated (gelu, gelu_new, gelu_pytorch_tanh, silu)."});
  }

  // The fields not read, listed up to kMaxReportedErrors (a config with a million keys names
  // a hundred and counts the rest in a note).
  void ListIgnored() {
    std::size_t unlisted = 0;
    for (auto it = doc_.begin(); it != doc_.end(); ++it) {
      if (std::find(used_.begin(), used_.end(), it.key()) != used_.end()) continue;
      if (out_.ignoredFields.size() >= kMaxReportedErrors) { ++unlisted; continue; }
      out_.ignoredFields.push_back(it.key().size() > 100 ? it.key().substr(0, 100) + "..." : it.key());
    }
    if (unlisted > 0) {
      out_.notes.push_back("…and " + FormatCount(static_cast<std::int64_t>(unlisted)) +
                           " more fields ignored, not listed.");
    }
  }

  void Use(const char* key) { used_.push_back(key); }

 private:
  const json& doc_;
  ConfigImport& out_;
  std::vector<std::string> used_;
};

bool ArchitecturesContain(const json& doc, const char* name) {
  auto it = doc.find("architectures");
  if (it == doc.end() || !it->is_array()) return false;
  for (const json& a : *it) if (a.is_string() && a.get_ref<const std::string&>() == name) return true;
  return false;
}

// A per-layer list read as "every n-th entry is `marked`, the others `other`": n is the first
// marked entry's index + 1 (0 when none is marked). `regular` says whether the whole list follows
// that one pattern.
std::int64_t EveryNth(const json& list, const json& marked, const json& other, bool& regular) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < list.size() && n == 0; ++i) {
    if (list[i] == marked) n = static_cast<std::int64_t>(i) + 1;
  }
  regular = true;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const bool isMarked = n > 0 && (static_cast<std::int64_t>(i) + 1) % n == 0;
    regular = regular && list[i] == (isMarked ? marked : other);
  }
  return n;
}

// layer_types (Gemma 2/3, OLMo 3): read as "every n-th layer attends to all tokens" (n = the first
// full layer's index + 1, or every layer sliding); a list that does not follow one such pattern
// is noted.
void ReadLayerTypes(const json& doc, ConfigReader& r, ArchitectureDef& a, ConfigImport& out, const char* who) {
  auto types = doc.find("layer_types");
  if (types == doc.end() || !types->is_array()) return;
  r.Use("layer_types");
  bool regular = true;
  a.slidingWindowPattern = EveryNth(*types, "full_attention", "sliding_attention", regular);
  if (!regular) {
    out.notes.push_back(std::string(who) + ": layer_types does not repeat one pattern; taken as a full-attention layer every " +
                        FormatCount(a.slidingWindowPattern) + " (the first full one's position).");
  }
}

// Gemma2Config (transformers models/gemma2/configuration_gemma2.py) and Gemma3TextConfig: norms
// after attention and the MLP, soft caps (Gemma 2's default 50 on the scores and 30 on the logits;
// none for Gemma 3) unless the config sets them (null: none), a 4,096-token window on the layers
// layer_types calls sliding (by default every layer but each pattern-th).
void ReadGemma2(const json& doc, ConfigReader& r, ArchitectureDef& a, ConfigImport& out, double attentionCap,
                double logitCap, std::int64_t window, std::int64_t pattern) {
  a.sandwichNorms = true;
  a.slidingWindowPattern = pattern;
  auto cap = [&](const char* key, double fallback, double& target) {
    target = fallback;
    if (auto it = doc.find(key); it != doc.end() && it->is_null()) {
      r.Use(key);
      target = 0.0;  // None: no capping
      return;
    }
    r.Number({key}, target);
  };
  cap("attn_logit_softcapping", attentionCap, a.attentionLogitSoftcap);
  cap("final_logit_softcapping", logitCap, a.finalLogitSoftcap);
  a.slidingWindow = window;
  r.Int({"sliding_window"}, a.slidingWindow, false);
  r.Use("query_pre_attn_scalar");  // the scores' scale: no memory of its own
  ReadLayerTypes(doc, r, a, out, "Gemma");
}

// OLMo 2 and 3 (Olmo2Config, Olmo3Config; transformers models/olmo2, models/olmo3): Llama's
// fields with q_norm / k_norm over the whole projections and norms after each sub-layer. OLMo 2's
// rotary tables stay fp32; OLMo 3 casts them and lets three layers of four slide (layer_types,
// sliding_window 4096 by default).
void ReadOlmo(const json& doc, ConfigReader& r, ArchitectureDef& a, ConfigImport& out, bool olmo3) {
  a.queryKeyNorm = a.olmo2Layout = true;
  a.rotaryFp32 = !olmo3;
  if (!olmo3) return;
  a.slidingWindow = 4096;
  a.slidingWindowPattern = 4;
  r.Int({"sliding_window"}, a.slidingWindow, false);
  ReadLayerTypes(doc, r, a, out, "OLMo 3");
  if (doc.contains("rope_scaling") && !doc["rope_scaling"].is_null()) {
    // transformers 4.57 scales RoPE (YaRN) on the full-attention layers only, with a table of
    // their own; 5.2 built one shared table. One is simulated: a pair of [s, head_dim] tables less.
    out.notes.push_back("OLMo 3: the full-attention layers' own scaled rotary table (transformers 4.57 and later) is "
                        "not simulated; one cos/sin pair of sequence × head_dim serves every layer.");
  }
}

// GraniteConfig (transformers models/granite/configuration_granite.py): Llama's fields (with
// attention_bias on all four projections and mlp_bias) and three multipliers whose values change
// no byte.
void ReadGranite(ConfigReader& r, ArchitectureDef& a) {
  a.graniteMultipliers = true;
  for (const char* key : {"embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"}) {
    r.Use(key);
  }
}

// SmolLM3Config (transformers models/smollm3/configuration_smollm3.py): Llama's fields, a tied head
// by default, and no_rope_layers (1: RoPE, 0: none; by default 0 on every
// no_rope_layer_interval-th layer, 4), read as "every n-th layer without RoPE". Its sliding window
// (use_sliding_window, off in the released model) is noted, not simulated.
void ReadSmolLM3(const json& doc, ConfigReader& r, ArchitectureDef& a, ConfigImport& out) {
  a.noRopeInterval = 4;
  r.Int({"no_rope_layer_interval"}, a.noRopeInterval, false);
  if (auto list = doc.find("no_rope_layers"); list != doc.end() && list->is_array()) {
    r.Use("no_rope_layers");
    bool regular = true;
    a.noRopeInterval = EveryNth(*list, 0, 1, regular);  // 0: no RoPE on that layer
    if (!regular) {
      out.notes.push_back("SmolLM3: no_rope_layers does not repeat one pattern; taken as a layer without RoPE every " +
                          FormatCount(a.noRopeInterval) + " (the first one's position).");
    }
  }
  r.Use("use_sliding_window");
  r.Use("sliding_window");
  r.Use("layer_types");
  if (auto w = doc.find("use_sliding_window"); w != doc.end() && *w == true) {
    out.notes.push_back("use_sliding_window is not simulated: every layer is taken as attending to all tokens.");
  }
}

}  // namespace

ConfigImport ImportHfConfig(std::string_view text) {
  ConfigImport out;
  json doc;
  if (!ParseObject(text, "config", doc, out.errors)) return out;
  auto type = doc.find("model_type");
  if (type == doc.end() || !type->is_string()) {
    out.errors.push_back({ErrorCode::MissingField, "config.model_type",
                          "config.json needs a model_type (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma, "
                          "gemma2, gemma3_text, phi3, olmo2, olmo3, granite, smollm3, gpt_neox, bert)."});
    return out;
  }
  out.modelType = type->get<std::string>();
  const std::string& t = out.modelType;
  ConfigReader r(doc, out);
  r.Use("model_type");
  r.Use("architectures");
  r.Use("quantization_config");  // read by ImportQuantizationConfig
  r.Bool({"use_cache"}, out.useCache);  // training.useCache
  ArchitectureDef& a = out.architecture;

  if (t == "gpt2") {
    a = DefaultArchitecture(Family::GPT2);
    r.Int({"vocab_size"}, a.vocabSize, true);
    r.Int({"n_embd", "hidden_size"}, a.hiddenSize, true);
    r.Int({"n_layer", "num_hidden_layers"}, a.numLayers, true);
    r.Int({"n_head", "num_attention_heads"}, a.numHeads, true);
    r.Int({"n_positions", "max_position_embeddings"}, a.maxPositionEmbeddings, true);
    a.intermediateSize = 0;
    r.Int({"n_inner"}, a.intermediateSize, false);
    r.Activation({"activation_function"}, a.hiddenAct);
    r.Number({"resid_pdrop"}, a.hiddenDropout);
    r.Number({"attn_pdrop"}, a.attentionDropout);
    r.Bool({"tie_word_embeddings"}, a.tieWordEmbeddings);
  } else if (t == "llama" || t == "mistral" || t == "qwen2" || t == "mixtral" || t == "qwen2_moe" ||
             t == "gemma" || t == "gemma2" || t == "gemma3_text" || t == "phi3" || t == "qwen3" || t == "qwen3_moe" ||
             t == "olmo2" || t == "olmo3" || t == "granite" || t == "smollm3") {
    a = DefaultArchitecture(Family::Llama);
    a.numKeyValueHeads = 0;
    const bool gemma = t == "gemma" || t == "gemma2" || t == "gemma3_text";
    a.tieWordEmbeddings = gemma || t == "smollm3";  // each config class's default
    a.attentionBias = t == "qwen2" || t == "qwen2_moe";
    a.hiddenAct = gemma ? HiddenAct::GELUTanh : HiddenAct::SiLU;
    a.queryKeyNorm = t == "qwen3" || t == "qwen3_moe" || t == "gemma3_text";  // q_norm, k_norm
    a.rmsNormUnitOffset = a.embeddingScale = gemma;     // GemmaRMSNorm, GemmaModel's normalizer
    r.Int({"vocab_size"}, a.vocabSize, true);
    r.Int({"hidden_size"}, a.hiddenSize, true);
    r.Int({"num_hidden_layers"}, a.numLayers, true);
    r.Int({"num_attention_heads"}, a.numHeads, true);
    r.Int({"num_key_value_heads"}, a.numKeyValueHeads, false);
    r.Int({"head_dim"}, a.headDim, false);
    r.Int({"intermediate_size"}, a.intermediateSize, true);
    r.Bool({"tie_word_embeddings"}, a.tieWordEmbeddings);
    r.Bool({"attention_bias"}, a.attentionBias);
    // attention_bias puts a bias on o_proj as well in LlamaAttention and the attentions written
    // like it (Gemma's, Qwen3's, OLMo's, Granite's, SmolLM3's); Qwen2's q/k/v biases are fixed and
    // its o_proj has none; Mistral's and Phi-3's attentions take no biases.
    a.outputBias = a.attentionBias && t != "qwen2" && t != "qwen2_moe";
    if (t == "llama" || t == "granite" || t == "smollm3") {
      r.Bool({"mlp_bias"}, a.mlpBias);  // LlamaMLP's (GraniteMLP's) gate/up/down
    }
    r.Activation({"hidden_act", "hidden_activation"}, a.hiddenAct);
    r.Number({"attention_dropout"}, a.attentionDropout);
    if (t == "mistral" || t == "mixtral" || t == "phi3") {
      // MistralConfig / MixtralConfig / Phi3Config sliding_window (Mistral 7B v0.1: 4096, later
      // ones null; Phi-3 mini 4k: 2047, the 128k ones and Phi-4-mini: 262144): every layer attends
      // through it, with the mask create_sliding_window_causal_mask makes (MistralModel.forward,
      // Phi3Model.forward).
      r.Int({"sliding_window"}, a.slidingWindow, false);
      a.slidingWindowPattern = 0;
    } else if ((t == "qwen2" || t == "qwen2_moe" || t == "qwen3" || t == "qwen3_moe") &&
               doc.contains("use_sliding_window")) {
      // Qwen2Config keeps sliding_window only with use_sliding_window (off in released models).
      r.Use("use_sliding_window");
      r.Use("sliding_window");
      r.Use("max_window_layers");
      if (doc["use_sliding_window"] == true) {
        out.notes.push_back("use_sliding_window is not simulated: every layer is taken as attending to all tokens.");
      }
    }
    if (t == "mixtral") {
      r.Int({"num_local_experts"}, a.numExperts, true);
      r.Int({"num_experts_per_tok"}, a.expertsPerToken, true);
    } else if (t == "qwen3_moe") {
      // Qwen3MoeSparseMoeBlock: routed experts only (no shared expert), top-k renormalised when
      // norm_topk_prob (Qwen3-30B-A3B, 235B-A22B).
      r.Int({"num_experts"}, a.numExperts, true);
      r.Int({"num_experts_per_tok"}, a.expertsPerToken, true);
      r.Int({"moe_intermediate_size"}, a.expertIntermediateSize, true);
      a.normTopkProb = false;  // Qwen3MoeConfig's default; the released configs set true
      r.Bool({"norm_topk_prob"}, a.normTopkProb);
      out.notes.push_back("Qwen3-MoE: every layer is taken as sparse (decoder_sparse_step 1, no mlp_only_layers).");
    } else if (t == "qwen2_moe") {
      r.Int({"num_experts"}, a.numExperts, true);
      r.Int({"num_experts_per_tok"}, a.expertsPerToken, true);
      r.Int({"moe_intermediate_size"}, a.expertIntermediateSize, true);
      r.Int({"shared_expert_intermediate_size"}, a.sharedExpertIntermediateSize, false);
      a.sharedExpertGate = a.sharedExpertIntermediateSize > 0;
      a.normTopkProb = false;  // Qwen2MoeConfig's default (Qwen1.5-MoE-A2.7B: false)
      r.Bool({"norm_topk_prob"}, a.normTopkProb);
      out.notes.push_back("Qwen2-MoE: every layer is taken as sparse (decoder_sparse_step 1, no mlp_only_layers).");
    }
    if (t == "gemma2") ReadGemma2(doc, r, a, out, 50.0, 30.0, 4096, 2);
    if (t == "gemma3_text") {
      // Gemma3TextConfig: no soft caps by default, a full layer every 6, its own layout.
      ReadGemma2(doc, r, a, out, 0.0, 0.0, 4096, 6);
      r.Use("sliding_window_pattern");
      if (auto p = doc.find("sliding_window_pattern"); p != doc.end() && p->is_number_integer() &&
          doc.find("layer_types") == doc.end()) {
        a.slidingWindowPattern = p->get<std::int64_t>();
      }
      a.gemma3Layout = true;
      r.Use("rope_local_base_freq");  // the sliding layers' table: its size, not its base, matters
    }
    if (t == "olmo2" || t == "olmo3") ReadOlmo(doc, r, a, out, t == "olmo3");
    if (t == "granite") ReadGranite(r, a);
    if (t == "smollm3") ReadSmolLM3(doc, r, a, out);
    if (t == "phi3") {
      a.fusedProjections = true;  // Phi3Attention.qkv_proj, Phi3MLP.gate_up_proj
      r.Number({"partial_rotary_factor"}, a.partialRotaryFactor);  // Phi-4-mini: 0.75
    }
  } else if (t == "gpt_neox") {
    // GPTNeoXConfig: rotary_pct (partial_rotary_factor in newer configs), use_parallel_residual,
    // attention_bias (default true), an untied embed_out by default.
    a = DefaultArchitecture(Family::GPTNeoX);
    a.tieWordEmbeddings = false;
    r.Int({"vocab_size"}, a.vocabSize, true);
    r.Int({"hidden_size"}, a.hiddenSize, true);
    r.Int({"num_hidden_layers"}, a.numLayers, true);
    r.Int({"num_attention_heads"}, a.numHeads, true);
    r.Int({"intermediate_size"}, a.intermediateSize, true);
    r.Int({"max_position_embeddings"}, a.maxPositionEmbeddings, false);
    r.Number({"rotary_pct", "partial_rotary_factor"}, a.partialRotaryFactor);
    r.Bool({"use_parallel_residual"}, a.parallelResidual);
    r.Bool({"attention_bias"}, a.attentionBias);
    r.Bool({"tie_word_embeddings"}, a.tieWordEmbeddings);
    r.Activation({"hidden_act"}, a.hiddenAct);
    r.Number({"hidden_dropout"}, a.hiddenDropout);
    r.Number({"attention_dropout"}, a.attentionDropout);
  } else if (t == "bert") {
    a = DefaultArchitecture(Family::BERT);
    r.Int({"vocab_size"}, a.vocabSize, true);
    r.Int({"hidden_size"}, a.hiddenSize, true);
    r.Int({"num_hidden_layers"}, a.numLayers, true);
    r.Int({"num_attention_heads"}, a.numHeads, true);
    r.Int({"intermediate_size"}, a.intermediateSize, true);
    r.Int({"max_position_embeddings"}, a.maxPositionEmbeddings, true);
    r.Int({"type_vocab_size"}, a.typeVocabSize, false);
    r.Activation({"hidden_act"}, a.hiddenAct);
    r.Number({"hidden_dropout_prob"}, a.hiddenDropout);
    r.Number({"attention_probs_dropout_prob"}, a.attentionDropout);
    a.encoderHead = ArchitecturesContain(doc, "BertForMaskedLM") || ArchitecturesContain(doc, "BertForPreTraining")
                        ? EncoderHead::MaskedLM
                        : EncoderHead::Classification;
    if (auto labels = doc.find("id2label"); labels != doc.end() && labels->is_object() && !labels->empty()) {
      a.numLabels = static_cast<std::int64_t>(labels->size());
      r.Use("id2label");
      r.Use("label2id");
    }
  } else if (t == "gemma3") {
    // Gemma3ForConditionalGeneration (Gemma 3 4B, 12B, 27B): a SigLIP vision tower and projector
    // beside the language model, whose config is text_config (model_type gemma3_text).
    out.errors.push_back({ErrorCode::InvalidField, "config.model_type",
                          "Gemma 3 4B, 12B and 27B are multimodal (a SigLIP vision tower beside the language "
                          "model), which is not simulated. Its language model alone is gemma3_text: import the "
                          "config's text_config with \"model_type\": \"gemma3_text\" (Gemma3ForCausalLM)."});
    return out;
  } else {
    out.errors.push_back({ErrorCode::InvalidField, "config.model_type",
                          "model_type \"" + t.substr(0, 40) + "\" is not simulated yet; supported: gpt2, llama, "
                          "mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma, gemma2, gemma3_text, phi3, olmo2, olmo3, granite, smollm3, gpt_neox, bert."});
    return out;
  }
  r.ListIgnored();
  return out;
}

QuantizationImport ImportQuantizationConfig(std::string_view configText) {
  QuantizationImport out;
  json doc;
  if (!ParseObject(configText, "config", doc, out.errors)) return out;
  auto block = doc.find("quantization_config");
  if (block == doc.end() || block->is_null()) return out;
  const std::string path = "config.quantization_config";
  if (!block->is_object()) {
    out.errors.push_back({ErrorCode::InvalidField, path, "Must be an object (BitsAndBytesConfig.to_dict())."});
    return out;
  }
  out.found = true;
  auto flag = [&](const char* key) {
    auto it = block->find(key);
    if (it == block->end() || it->is_null()) return false;
    if (!it->is_boolean()) {
      out.errors.push_back({ErrorCode::InvalidField, path + "." + key, "Must be true or false."});
      return false;
    }
    return it->get<bool>();
  };
  auto text = [&](const char* key) -> std::string {
    auto it = block->find(key);
    if (it == block->end() || it->is_null()) return "";
    if (!it->is_string()) {
      out.errors.push_back({ErrorCode::InvalidField, path + "." + key, "Must be a string."});
      return "";
    }
    return it->get<std::string>();
  };
  const std::string method = text("quant_method");
  if (!method.empty() && method != "bitsandbytes") {
    out.errors.push_back({ErrorCode::InvalidField, path + ".quant_method",
                          "Only bitsandbytes quantization is simulated (got \"" + method.substr(0, 40) + "\")."});
    return out;
  }
  const bool four = flag("load_in_4bit"), eight = flag("load_in_8bit");
  if (four && eight) {
    out.errors.push_back({ErrorCode::InvalidField, path, "load_in_4bit and load_in_8bit cannot both be true."});
    return out;
  }
  FinetuneDef& f = out.finetune;
  if (eight) f.quantization = Quantization::Int8;
  if (four) {
    const std::string type = text("bnb_4bit_quant_type");
    if (type.empty() || type == "fp4") f.quantization = Quantization::FP4;  // BitsAndBytesConfig's default
    else if (type == "nf4") f.quantization = Quantization::NF4;
    else out.errors.push_back({ErrorCode::InvalidField, path + ".bnb_4bit_quant_type", "Must be nf4 or fp4."});
    f.doubleQuant = flag("bnb_4bit_use_double_quant");
    const std::string compute = text("bnb_4bit_compute_dtype");
    if (compute.empty() || compute == "float32") f.computeDType = DType::FP32;
    else if (compute == "bfloat16") f.computeDType = DType::BF16;
    else if (compute == "float16") f.computeDType = DType::FP16;
    else out.errors.push_back({ErrorCode::InvalidField, path + ".bnb_4bit_compute_dtype",
                               "Must be float32, bfloat16 or float16."});
    // bnb_4bit_quant_storage (BitsAndBytesConfig, default "uint8"): what FSDP-QLoRA sets to bf16.
    const std::string storage = text("bnb_4bit_quant_storage");
    if (storage.empty() || storage == "uint8") f.quantStorage = DType::UInt8;
    else if (storage == "bfloat16") f.quantStorage = DType::BF16;
    else if (storage == "float16") f.quantStorage = DType::FP16;
    else if (storage == "float32") f.quantStorage = DType::FP32;
    else out.errors.push_back({ErrorCode::InvalidField, path + ".bnb_4bit_quant_storage",
                               "Must be uint8, bfloat16, float16 or float32."});
  }
  if (!four && !eight) out.notes.push_back("quantization_config loads neither 4-bit nor 8-bit weights: nothing quantized.");
  if (auto it = block->find("llm_int8_skip_modules"); it != block->end() && !it->is_null()) {
    out.notes.push_back("llm_int8_skip_modules is not read: every linear but the output layer is quantized.");
  }
  return out;
}

AdapterImport ImportAdapterConfig(std::string_view text) {
  AdapterImport out;
  json doc;
  if (!ParseObject(text, "adapter config", doc, out.errors)) return out;
  FinetuneDef& f = out.finetune;
  f.lora = true;
  auto fail = [&](const std::string& key, const std::string& message) {
    out.errors.push_back({ErrorCode::InvalidField, "adapter." + key, message});
  };
  static constexpr const char* kUsed[] = {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "use_dora",
                                          "bias", "modules_to_save", "task_type"};
  if (auto it = doc.find("peft_type"); it != doc.end() && !(it->is_string() && it->get<std::string>() == "LORA")) {
    fail("peft_type", "Only LoRA adapters (peft_type \"LORA\") are simulated.");
    return out;
  }
  if (auto it = doc.find("r"); it != doc.end()) {
    if (it->is_number_integer()) f.r = it->get<std::int64_t>();
    else fail("r", "Must be a whole number.");
  }
  auto number = [&](const char* key, double& target) {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) return;
    if (it->is_number()) target = it->get<double>();
    else fail(key, "Must be a number.");
  };
  number("lora_alpha", f.loraAlpha);
  number("lora_dropout", f.loraDropout);
  if (auto it = doc.find("use_dora"); it != doc.end() && !it->is_null()) {
    if (it->is_boolean()) f.useDora = it->get<bool>();
    else fail("use_dora", "Must be true or false.");
  }
  if (auto it = doc.find("target_modules"); it != doc.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string t = it->get<std::string>();
      if (t == "all-linear") f.targetModules = {t};
      else fail("target_modules", "A regular expression is not read; list the module names instead (or \"all-linear\").");
    } else if (it->is_array() && it->size() <= 64) {
      for (const json& m : *it) {
        if (m.is_string()) f.targetModules.push_back(m.get<std::string>());
        else fail("target_modules", "Module names must be strings.");
      }
    } else {
      fail("target_modules", "Must be a list of at most 64 module names or \"all-linear\".");
    }
  }
  if (auto it = doc.find("bias"); it != doc.end() && it->is_string() && it->get<std::string>() != "none") {
    out.notes.push_back("bias = \"" + it->get<std::string>().substr(0, 20) + "\": trained biases are not simulated (taken as \"none\").");
  }
  if (auto it = doc.find("modules_to_save"); it != doc.end() && it->is_array() && !it->empty()) {
    out.notes.push_back("modules_to_save: the fully trained copies of those modules are not simulated.");
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    bool used = false;
    for (const char* k : kUsed) used = used || it.key() == k;
    if (!used && out.ignoredFields.size() < 64) out.ignoredFields.push_back(it.key().substr(0, 60));
  }
  return out;
}

SafetensorsImport ImportSafetensors(std::string_view text) {
  SafetensorsImport out;
  json doc;
  // A sharded checkpoint: an array of its shards' headers, counted together.
  const bool shards = text.find_first_not_of(" \t\r\n") != std::string_view::npos &&
                      text[text.find_first_not_of(" \t\r\n")] == '[';
  if (shards) {
    if (text.size() > kMaxTextBytes || !NestingWithin(text, kMaxJsonDepth)) {
      out.errors.push_back({ErrorCode::MalformedJson, "", "The headers are larger than 16 MiB or nested too deeply."});
      return out;
    }
    const json list = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (list.is_discarded() || !list.is_array() || list.empty()) {
      out.errors.push_back({ErrorCode::MalformedJson, "", "Expected a JSON array of safetensors headers."});
      return out;
    }
    doc = json::object();
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_object() || list[i].contains("weight_map")) {
        out.errors.push_back({ErrorCode::InvalidField, "headers[" + std::to_string(i) + "]",
                              "Each shard must be a safetensors header object."});
        return out;
      }
      for (auto it = list[i].begin(); it != list[i].end(); ++it) {
        if (it.key() == "__metadata__") continue;
        if (doc.contains(it.key())) {
          out.errors.push_back({ErrorCode::InvalidField, "headers[" + std::to_string(i) + "]",
                                "Tensor \"" + it.key().substr(0, 80) + "\" appears in two shards."});
          return out;
        }
        doc[it.key()] = it.value();
      }
    }
    out.notes.push_back(std::to_string(list.size()) + " shards counted together.");
  } else if (!ParseObject(text, "safetensors header or index", doc, out.errors)) {
    return out;
  }
  auto layerOf = [](const std::string& name) -> std::int64_t {
    // "model.layers.31.mlp…", "transformer.h.11.…" or GPT-2's bare "h.11.…",
    // "bert.encoder.layer.23.…": a marker at the start of the name or after a dot.
    for (const char* marker : {"layers.", "h.", "layer.", "blocks."}) {
      const std::size_t length = std::char_traits<char>::length(marker);
      std::size_t at = name.rfind(marker, 0) == 0 ? 0 : std::string::npos;
      for (std::size_t from = 0; at == std::string::npos;) {
        const std::size_t dot = name.find(std::string(".") + marker, from);
        if (dot == std::string::npos) break;
        at = dot + 1;
      }
      if (at == std::string::npos) continue;
      std::size_t i = at + length;
      std::int64_t n = -1;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 1'000'000) {
        n = (n < 0 ? 0 : n * 10) + (name[i] - '0');
        ++i;
      }
      if (n >= 0) return n;
    }
    return -1;
  };
  std::map<std::string, std::int64_t> dtypes;
  if (auto map = doc.find("weight_map"); map != doc.end()) {
    // model.safetensors.index.json: {"metadata": {"total_size": bytes}, "weight_map": {name: file}}
    if (!map->is_object()) {
      out.errors.push_back({ErrorCode::InvalidField, "index.weight_map", "Must map tensor names to files."});
      return out;
    }
    auto meta = doc.find("metadata");
    if (meta != doc.end() && meta->is_object()) {
      auto size = meta->find("total_size");
      if (size != meta->end() && size->is_number() && size->get<double>() >= 0 && size->get<double>() < 9e15) {
        out.totalSizeBytes = static_cast<std::int64_t>(size->get<double>());
      }
    }
    out.tensorCount = static_cast<std::int64_t>(map->size());
    for (auto it = map->begin(); it != map->end(); ++it) out.numLayers = std::max(out.numLayers, layerOf(it.key()) + 1);
    out.notes.push_back("An index lists tensor names and the checkpoint's total bytes, not shapes or dtypes: " +
                        FormatCount(out.totalSizeBytes) + " B is " + FormatCount(out.totalSizeBytes / 2) +
                        " parameters if stored in bf16/fp16 (2 B each). Drop a .safetensors file for the exact count.");
    return out;
  }
  // A safetensors header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {…}}.
  out.fromHeader = true;
  std::int64_t total = 0;
  struct Matrix { std::int64_t elements; MatrixShape shape; std::string name; };
  std::vector<Matrix> matrices;
  // Every bad tensor counted, the first kMaxReportedErrors listed.
  ErrorList errors;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string field = "header." + (it.key().size() > 100 ? it.key().substr(0, 100) + "..." : it.key());
    const json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t["dtype"].is_string() || !t["shape"].is_array()) {
      errors.push_back({ErrorCode::InvalidField, field, "Each tensor needs a dtype and a shape."});
      continue;
    }
    static const std::map<std::string, int> kBytes = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U8", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    const std::string& dtype = t["dtype"].get_ref<const std::string&>();
    auto bytes = kBytes.find(dtype);
    if (bytes == kBytes.end()) {
      errors.push_back({ErrorCode::InvalidField, field + ".dtype", "Unknown dtype \"" + dtype.substr(0, 20) + "\"."});
      continue;
    }
    std::int64_t elements = 1;
    bool valid = true;
    std::vector<std::int64_t> dims;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > 1'000'000'000ull) { valid = false; break; }
      dims.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
      if (elements > 0 && dims.back() > 0 && elements > (std::int64_t{1} << 50) / dims.back()) { valid = false; break; }
      elements *= dims.back();
    }
    if (!valid) {
      errors.push_back({ErrorCode::InvalidField, field + ".shape", "The shape must be whole numbers of a sane size."});
      continue;
    }
    if (auto off = t.find("data_offsets"); off != t.end() && off->is_array() && off->size() == 2 &&
                                            (*off)[0].is_number_unsigned() && (*off)[1].is_number_unsigned()) {
      const auto begin = (*off)[0].get<std::uint64_t>(), end = (*off)[1].get<std::uint64_t>();
      if (end < begin || end - begin != static_cast<std::uint64_t>(elements * bytes->second)) {
        errors.push_back({ErrorCode::InvalidField, field + ".data_offsets",
                              "The byte range does not match shape × dtype size."});
        continue;
      }
    }
    total += elements;
    out.totalSizeBytes += elements * bytes->second;
    ++out.tensorCount;
    ++dtypes[dtype];
    out.numLayers = std::max(out.numLayers, layerOf(it.key()) + 1);
    if (dims.size() == 2) matrices.push_back({elements, {dims[0], dims[1]}, it.key()});
    if (total > (std::int64_t{1} << 52)) {
      errors.push_back({ErrorCode::TooLarge, "header", "The header lists more than 2^52 parameters."});
      out.errors = errors.Report();
      return out;
    }
  }
  out.errors = errors.Report();
  if (!out.errors.empty()) return out;
  if (out.tensorCount == 0) {
    out.errors.push_back({ErrorCode::InvalidField, "header", "The header lists no tensors."});
    return out;
  }
  out.parameterCount = total;
  for (const auto& [dtype, count] : dtypes) out.dtypes.emplace_back(dtype, count);
  std::stable_sort(matrices.begin(), matrices.end(), [](const Matrix& x, const Matrix& y) { return x.elements > y.elements; });
  for (std::size_t i = 0; i < matrices.size() && i < 8; ++i) {
    out.largestMatrices.push_back(matrices[i].shape);
    out.largestNames.push_back(matrices[i].name);
  }
  return out;
}

}  // namespace gpumem
