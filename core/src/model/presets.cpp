// The presets, transcribed from each model's config.json (the Hugging Face repository named
// in `source`). Only fields that differ from DefaultArchitecture(family) are set.
#include "gpumem/presets.hpp"

#include <string>
#include <vector>

#include "gpumem/inventory.hpp"

namespace gpumem {
namespace {

std::vector<Preset> MakePresets() {
  std::vector<Preset> out;
  // The default sequence: the position table for GPT-2 and BERT (1024 and 512), else 4096
  // (Llama 2's context; the cap for longer ones) unless set after adding (TinyLlama: 2048).
  auto add = [&](const char* id, const char* label, const char* source, ArchitectureDef a,
                 std::int64_t published, const char* countedAs = "all parameters (tied head counted once)",
                 const char* note = "") {
    const std::int64_t sequence = a.family == Family::Llama ? 4096 : a.maxPositionEmbeddings;
    out.push_back({id, label, source, a, published, countedAs, note, sequence});
  };
  // The Llama family's shapes in one call: vocabulary, hidden, layers, heads, key/value heads,
  // MLP width.
  auto llama = [](std::int64_t V, std::int64_t h, std::int64_t L, std::int64_t heads, std::int64_t kv,
                  std::int64_t inter) {
    ArchitectureDef a = DefaultArchitecture(Family::Llama);
    a.vocabSize = V; a.hiddenSize = h; a.numLayers = L; a.numHeads = heads; a.numKeyValueHeads = kv;
    a.intermediateSize = inter;
    return a;
  };

  ArchitectureDef gpt2 = DefaultArchitecture(Family::GPT2);
  add("gpt2", "GPT-2 (124M)", "openai-community/gpt2", gpt2, 124'439'808);

  ArchitectureDef gpt2medium = gpt2;
  gpt2medium.hiddenSize = 1024; gpt2medium.numLayers = 24; gpt2medium.numHeads = 16;
  add("gpt2-medium", "GPT-2 Medium (355M)", "openai-community/gpt2-medium", gpt2medium, 354'823'168);

  ArchitectureDef gpt2large = gpt2;
  gpt2large.hiddenSize = 1280; gpt2large.numLayers = 36; gpt2large.numHeads = 20;
  add("gpt2-large", "GPT-2 Large (774M)", "openai-community/gpt2-large", gpt2large, 774'030'080);

  ArchitectureDef gpt2xl = gpt2;
  gpt2xl.hiddenSize = 1600; gpt2xl.numLayers = 48; gpt2xl.numHeads = 25;
  add("gpt2-xl", "GPT-2 XL (1.5B)", "openai-community/gpt2-xl", gpt2xl, 1'557'611'200);

  // Pythia (GPT-NeoX): rotary_pct 0.25, use_parallel_residual, an untied embed_out; counts from
  // the Pythia suite's table (total parameters).
  auto pythia = [](std::int64_t V, std::int64_t h, std::int64_t L, std::int64_t heads) {
    ArchitectureDef a = DefaultArchitecture(Family::GPTNeoX);
    a.vocabSize = V; a.hiddenSize = h; a.numLayers = L; a.numHeads = heads; a.intermediateSize = 4 * h;
    return a;
  };
  add("pythia-160m", "Pythia 160M", "EleutherAI/pythia-160m", pythia(50304, 768, 12, 12), 162'322'944);
  add("pythia-1b", "Pythia 1B", "EleutherAI/pythia-1b", pythia(50304, 2048, 16, 8), 1'011'781'632);
  add("pythia-6.9b", "Pythia 6.9B", "EleutherAI/pythia-6.9b", pythia(50432, 4096, 32, 32), 6'857'302'016);

  add("bert-base-uncased", "BERT-base uncased (110M), classification", "google-bert/bert-base-uncased",
      DefaultArchitecture(Family::BERT), 109'482'240, "BertModel with its pooler, without the classifier");

  ArchitectureDef bertLarge = DefaultArchitecture(Family::BERT);
  bertLarge.hiddenSize = 1024; bertLarge.numLayers = 24; bertLarge.numHeads = 16;
  bertLarge.intermediateSize = 4096;
  add("bert-large-uncased", "BERT-large uncased (335M), classification",
      "google-bert/bert-large-uncased", bertLarge, 335'141'888,
      "BertModel with its pooler, without the classifier");

  // Modifiers of a Llama-family shape: a tied head, Qwen's q/k/v biases, Gemma's explicit head
  // dimension and GELU, a mixture of experts.
  auto tied = [](ArchitectureDef a) { a.tieWordEmbeddings = true; return a; };
  auto qwen = [](ArchitectureDef a) { a.attentionBias = true; return a; };
  auto gemma = [](ArchitectureDef a) {
    a.headDim = 256; a.tieWordEmbeddings = true; a.hiddenAct = HiddenAct::GELUTanh;
    a.rmsNormUnitOffset = true; a.embeddingScale = true;
    return a;
  };
  // Gemma 2 (Gemma2Config defaults): Gemma's norms and embeddings, norms after attention and the
  // MLP too, tanh soft caps on the scores (50) and the logits (30), every other layer (the even
  // ones) attending through a 4,096-token window.
  auto gemma2 = [&gemma](ArchitectureDef a, std::int64_t headDim) {
    a = gemma(a);
    a.headDim = headDim; a.sandwichNorms = true; a.attentionLogitSoftcap = 50.0; a.finalLogitSoftcap = 30.0;
    a.slidingWindow = 4096; a.slidingWindowPattern = 2;
    return a;
  };
  // Qwen3: q_norm / k_norm on each head, head_dim 128 whatever the hidden size.
  auto qwen3 = [](ArchitectureDef a) { a.queryKeyNorm = true; a.headDim = 128; return a; };
  auto experts = [](ArchitectureDef a, std::int64_t count, std::int64_t perToken) {
    a.numExperts = count; a.expertsPerToken = perToken;
    return a;
  };

  add("llama-2-7b", "Llama 2 7B", "meta-llama/Llama-2-7b-hf", llama(32000, 4096, 32, 32, 32, 11008), 6'738'415'616);
  add("llama-2-13b", "Llama 2 13B", "meta-llama/Llama-2-13b-hf", llama(32000, 5120, 40, 40, 40, 13824), 13'015'864'320);
  add("llama-2-70b", "Llama 2 70B", "meta-llama/Llama-2-70b-hf", llama(32000, 8192, 80, 64, 8, 28672), 68'976'648'192);
  add("tinyllama-1.1b", "TinyLlama 1.1B", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
      llama(32000, 2048, 22, 32, 4, 5632), 1'100'048'384);
  out.back().defaultSequenceLength = 2048;  // max_position_embeddings 2048 (trained at 2048)
  // Its config.json sets sliding_window 4096 (every layer; v0.2 and later set null).
  ArchitectureDef mistral = llama(32000, 4096, 32, 32, 8, 14336);
  mistral.slidingWindow = 4096;
  add("mistral-7b-v0.1", "Mistral 7B v0.1", "mistralai/Mistral-7B-v0.1", mistral, 7'241'732'096);
  add("llama-3-8b", "Llama 3 / 3.1 8B", "meta-llama/Meta-Llama-3-8B", llama(128256, 4096, 32, 32, 8, 14336), 8'030'261'248);
  add("llama-3-70b", "Llama 3 / 3.1 70B", "meta-llama/Meta-Llama-3-70B", llama(128256, 8192, 80, 64, 8, 28672),
      70'553'706'496);
  add("llama-3.1-405b", "Llama 3.1 405B", "meta-llama/Llama-3.1-405B", llama(128256, 16384, 126, 128, 8, 53248),
      405'853'388'800);
  add("llama-3.2-1b", "Llama 3.2 1B", "meta-llama/Llama-3.2-1B", tied(llama(128256, 2048, 16, 32, 8, 8192)),
      1'235'814'400);
  add("llama-3.2-3b", "Llama 3.2 3B", "meta-llama/Llama-3.2-3B", tied(llama(128256, 3072, 28, 24, 8, 8192)),
      3'212'749'824);
  add("mistral-7b-v0.3", "Mistral 7B v0.3", "mistralai/Mistral-7B-v0.3", llama(32768, 4096, 32, 32, 8, 14336),
      7'248'023'552);

  add("qwen2.5-0.5b", "Qwen2.5 0.5B", "Qwen/Qwen2.5-0.5B", tied(qwen(llama(151936, 896, 24, 14, 2, 4864))), 494'032'768);
  add("qwen2.5-1.5b", "Qwen2.5 1.5B", "Qwen/Qwen2.5-1.5B", tied(qwen(llama(151936, 1536, 28, 12, 2, 8960))),
      1'543'714'304);
  add("qwen2.5-7b", "Qwen2.5 7B (and Qwen2 7B)", "Qwen/Qwen2.5-7B", qwen(llama(152064, 3584, 28, 28, 4, 18944)),
      7'615'616'512);
  add("qwen2.5-14b", "Qwen2.5 14B", "Qwen/Qwen2.5-14B", qwen(llama(152064, 5120, 48, 40, 8, 13824)), 14'770'033'664);
  add("qwen2.5-72b", "Qwen2.5 72B", "Qwen/Qwen2.5-72B", qwen(llama(152064, 8192, 80, 64, 8, 29568)), 72'706'203'648);

  // Qwen3 model cards: 0.6B (0.44B non-embedding), 1.7B (1.4B), 4.0B (3.6B), 8.2B (6.95B); the
  // counts below are the configs' exact ones, which round to those.
  add("qwen3-0.6b", "Qwen3 0.6B", "Qwen/Qwen3-0.6B", tied(qwen3(llama(151936, 1024, 28, 16, 8, 3072))), 596'049'920);
  add("qwen3-1.7b", "Qwen3 1.7B", "Qwen/Qwen3-1.7B", tied(qwen3(llama(151936, 2048, 28, 16, 8, 6144))),
      1'720'574'976);
  add("qwen3-4b", "Qwen3 4B", "Qwen/Qwen3-4B", tied(qwen3(llama(151936, 2560, 36, 32, 8, 9728))), 4'022'468'096);
  add("qwen3-8b", "Qwen3 8B", "Qwen/Qwen3-8B", qwen3(llama(151936, 4096, 36, 32, 8, 12288)), 8'190'735'360);
  // Model cards: 14.8B (13.2B non-embedding) and 32.8B (31.2B); both untie the head, which is
  // what makes the totals round to those (tied, they would be 14.0B and 32.0B).
  add("qwen3-14b", "Qwen3 14B", "Qwen/Qwen3-14B", qwen3(llama(151936, 5120, 40, 40, 8, 17408)), 14'768'307'200);
  add("qwen3-32b", "Qwen3 32B", "Qwen/Qwen3-32B", qwen3(llama(151936, 5120, 64, 64, 8, 25600)), 32'762'123'264);

  add("gemma-2b", "Gemma 2B", "google/gemma-2b", gemma(llama(256000, 2048, 18, 8, 1, 16384)), 2'506'172'416);
  add("gemma-7b", "Gemma 7B", "google/gemma-7b", gemma(llama(256000, 3072, 28, 16, 16, 24576)), 8'537'680'896);
  add("gemma-2-2b", "Gemma 2 2B", "google/gemma-2-2b", gemma2(llama(256000, 2304, 26, 8, 4, 9216), 256),
      2'614'341'888);
  add("gemma-2-9b", "Gemma 2 9B", "google/gemma-2-9b", gemma2(llama(256000, 3584, 42, 16, 8, 14336), 256),
      9'241'705'984);
  add("gemma-2-27b", "Gemma 2 27B", "google/gemma-2-27b", gemma2(llama(256000, 4608, 46, 32, 16, 36864), 128),
      27'227'128'320);
  // google/gemma-3-1b-pt (Gemma3ForCausalLM): q/k norms, no soft caps, a 512-token window on five
  // layers of every six.
  ArchitectureDef gemma3 = gemma2(llama(262144, 1152, 26, 4, 1, 6912), 256);
  gemma3.queryKeyNorm = gemma3.gemma3Layout = true;
  gemma3.attentionLogitSoftcap = gemma3.finalLogitSoftcap = 0.0;
  gemma3.slidingWindow = 512; gemma3.slidingWindowPattern = 6;
  add("gemma-3-1b", "Gemma 3 1B", "google/gemma-3-1b-pt", gemma3, 999'885'952);
  ArchitectureDef phi3 = llama(32064, 3072, 32, 32, 32, 8192);
  phi3.fusedProjections = true;  // qkv_proj, gate_up_proj
  phi3.slidingWindow = 2047;     // its config.json's sliding_window
  add("phi-3-mini-4k", "Phi-3 mini 4k (3.8B)", "microsoft/Phi-3-mini-4k-instruct", phi3, 3'821'079'552,
      "all parameters");

  // OLMo 2 (Olmo2Config): q/k norms over the whole projections, norms after each sub-layer, fp32
  // rotary tables, an untied head; the model cards' 1.48B / 7.30B / 13.7B, exactly as the configs
  // count them.
  auto olmo2 = [](ArchitectureDef a) {
    a.queryKeyNorm = a.olmo2Layout = a.rotaryFp32 = true;
    return a;
  };
  add("olmo-2-1b", "OLMo 2 1B", "allenai/OLMo-2-0425-1B", olmo2(llama(100352, 2048, 16, 16, 16, 8192)), 1'484'916'736);
  add("olmo-2-7b", "OLMo 2 7B", "allenai/OLMo-2-1124-7B", olmo2(llama(100352, 4096, 32, 32, 32, 11008)),
      7'298'617'344);
  add("olmo-2-13b", "OLMo 2 13B", "allenai/OLMo-2-1124-13B", olmo2(llama(100352, 5120, 40, 40, 40, 13824)),
      13'716'198'400);

  // Granite 3.1 (GraniteConfig): Llama's blocks, a tied head, scalar multipliers on the
  // embeddings, each sub-layer's output and the logits; 2.53B and 8.17B as the configs count them.
  auto granite = [](ArchitectureDef a) {
    a.tieWordEmbeddings = a.graniteMultipliers = true;
    return a;
  };
  add("granite-3.1-2b", "Granite 3.1 2B", "ibm-granite/granite-3.1-2b-base", granite(llama(49155, 2048, 40, 32, 8, 8192)),
      2'533'531'648);
  add("granite-3.1-8b", "Granite 3.1 8B", "ibm-granite/granite-3.1-8b-base", granite(llama(49155, 4096, 40, 32, 8, 12800)),
      8'170'848'256);

  // SmolLM3 (SmolLM3Config): Llama's blocks, a tied head, every fourth layer without RoPE; its
  // safetensors index's total_parameters.
  ArchitectureDef smollm3 = tied(llama(128256, 2048, 36, 16, 4, 11008));
  smollm3.noRopeInterval = 4;
  add("smollm3-3b", "SmolLM3 3B", "HuggingFaceTB/SmolLM3-3B", smollm3, 3'075'098'624);

  add("mixtral-8x7b", "Mixtral 8x7B", "mistralai/Mixtral-8x7B-v0.1", experts(llama(32000, 4096, 32, 32, 8, 14336), 8, 2),
      46'702'792'704);
  add("mixtral-8x22b", "Mixtral 8x22B", "mistralai/Mixtral-8x22B-v0.1",
      experts(llama(32000, 6144, 56, 48, 8, 16384), 8, 2), 140'620'634'112);
  ArchitectureDef qwenMoe = experts(qwen(llama(151936, 2048, 24, 16, 16, 5632)), 60, 4);
  qwenMoe.expertIntermediateSize = 1408; qwenMoe.sharedExpertIntermediateSize = 5632; qwenMoe.sharedExpertGate = true;
  qwenMoe.normTopkProb = false;  // its config.json: "norm_topk_prob": false
  add("qwen1.5-moe-a2.7b", "Qwen1.5-MoE A2.7B", "Qwen/Qwen1.5-MoE-A2.7B", qwenMoe, 14'315'784'192);
  return out;
}

}  // namespace

std::span<const Preset> Presets() {
  static const std::vector<Preset> presets = MakePresets();
  return presets;
}

const Preset* FindPreset(std::string_view id) {
  for (const Preset& p : Presets()) if (id == p.id) return &p;
  return nullptr;
}

std::int64_t PublishedScopeParameterCount(const Setup& setup) {
  std::int64_t n = 0;
  for (const Tensor& t : BuildInventory(setup).parameters) {
    if (t.name.starts_with("classifier.") || t.name.starts_with("cls.")) continue;
    n += t.Elements();
  }
  return n;
}

}  // namespace gpumem
