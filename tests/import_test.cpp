// Reading what people have: Hugging Face config.json files and safetensors headers / indexes,
// including malformed and hostile ones.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/import.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

std::int64_t CountOf(const ArchitectureDef& a) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = a;
  return BuildInventory(s).ParameterCount();
}

}  // namespace

TEST_CASE("a config.json becomes the architecture it describes", "[import][config]") {
  SECTION("Mistral 7B: grouped-query attention, fields the estimator does not need are listed") {
    const ConfigImport c = ImportHfConfig(R"({
      "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
      "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 8, "vocab_size": 32000, "rope_theta": 10000.0, "sliding_window": 4096,
      "torch_dtype": "bfloat16", "tie_word_embeddings": false, "hidden_act": "silu"})");
    REQUIRE(c.ok());
    CHECK(c.modelType == "mistral");
    CHECK(CountOf(c.architecture) == FindPreset("mistral-7b-v0.1")->publishedParameters);
    CHECK(std::find(c.ignoredFields.begin(), c.ignoredFields.end(), "rope_theta") != c.ignoredFields.end());
    CHECK(std::find(c.ignoredFields.begin(), c.ignoredFields.end(), "hidden_size") == c.ignoredFields.end());
    // sliding_window: every layer attends through a 4,096-token window (the preset's too).
    CHECK(c.architecture.slidingWindow == 4096);
    CHECK(c.architecture.slidingWindowPattern == 0);
    CHECK(FindPreset("mistral-7b-v0.1")->architecture.slidingWindow == 4096);
    // Mistral v0.2 and later: null, no window.
    const ConfigImport later = ImportHfConfig(R"({"model_type": "mistral", "hidden_size": 4096,
      "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "vocab_size": 32768, "sliding_window": null})");
    REQUIRE(later.ok());
    CHECK(later.architecture.slidingWindow == 0);
  }
  SECTION("GPT-2 names its fields differently; n_inner null means 4 × hidden") {
    const ConfigImport c = ImportHfConfig(R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
      "n_positions": 1024, "n_inner": null, "vocab_size": 50257, "activation_function": "gelu_new"})");
    REQUIRE(c.ok());
    CHECK(c.architecture.hiddenAct == HiddenAct::GELUNew);
    CHECK(CountOf(c.architecture) == 124'439'808);
  }
  SECTION("Qwen2 has q/k/v biases by its class's rule; Gemma ties its head by default") {
    const ConfigImport q = ImportHfConfig(R"({"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
      "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2, "vocab_size": 151936,
      "tie_word_embeddings": true})");
    REQUIRE(q.ok());
    CHECK(q.architecture.attentionBias);
    CHECK_FALSE(q.architecture.outputBias);  // Qwen2Attention: o_proj has none
    CHECK(CountOf(q.architecture) == 1'543'714'304);
    // LlamaAttention's attention_bias reaches o_proj; LlamaMLP's mlp_bias gate, up and down.
    const ConfigImport l = ImportHfConfig(R"({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "attention_bias": true,
      "mlp_bias": true})");
    REQUIRE(l.ok());
    CHECK(l.architecture.outputBias);
    CHECK(l.architecture.mlpBias);
    CHECK(l.ignoredFields.empty());
    const ConfigImport g = ImportHfConfig(R"({"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384,
      "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1, "head_dim": 256,
      "vocab_size": 256000, "hidden_act": "gelu_pytorch_tanh"})");
    REQUIRE(g.ok());
    CHECK(CountOf(g.architecture) == 2'506'172'416);
    // GemmaRMSNorm's fp32 (1 + weight) and the √hidden normaliser are simulated: no caveat left.
    CHECK(g.architecture.rmsNormUnitOffset);
    CHECK(g.architecture.embeddingScale);
    CHECK_FALSE(g.architecture.queryKeyNorm);
    CHECK(g.notes.empty());
  }
  SECTION("Qwen3 normalises each query and key head: 2 × head_dim parameters a layer") {
    // Qwen/Qwen3-0.6B's config.json; its model card: 0.6B parameters, 0.44B without embeddings.
    const ConfigImport q = ImportHfConfig(R"({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128,
      "vocab_size": 151936, "tie_word_embeddings": true, "attention_bias": false})");
    REQUIRE(q.ok());
    CHECK(q.architecture.queryKeyNorm);
    CHECK_FALSE(q.architecture.attentionBias);
    CHECK_FALSE(q.architecture.rmsNormUnitOffset);
    CHECK(CountOf(q.architecture) == 596'049'920);
    CHECK(CountOf(q.architecture) - 151'936 * 1024 == 440'467'456);  // the card's 0.44B
    CHECK(q.notes.empty());
  }
  SECTION("Qwen3 14B and 32B: untied heads, as their model cards' totals need") {
    // Qwen/Qwen3-14B's and Qwen/Qwen3-32B's config.json. Cards: 14.8B (13.2B without embeddings),
    // 32.8B (31.2B). The presets hold the configs' exact counts.
    const ConfigImport q14 = ImportHfConfig(R"({"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
      "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8, "head_dim": 128,
      "vocab_size": 151936, "tie_word_embeddings": false, "attention_bias": false})");
    const ConfigImport q32 = ImportHfConfig(R"({"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
      "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8, "head_dim": 128,
      "vocab_size": 151936, "tie_word_embeddings": false, "attention_bias": false})");
    REQUIRE(q14.ok());
    REQUIRE(q32.ok());
    const std::int64_t embeddings = 2 * std::int64_t{151'936} * 5120;  // embed_tokens and lm_head
    CHECK(CountOf(q14.architecture) == FindPreset("qwen3-14b")->publishedParameters);
    CHECK(CountOf(q32.architecture) == FindPreset("qwen3-32b")->publishedParameters);
    CHECK((CountOf(q14.architecture) + 50'000'000) / 100'000'000 == 148);                // 14.8B
    CHECK((CountOf(q14.architecture) - embeddings + 50'000'000) / 100'000'000 == 132);   // 13.2B
    CHECK((CountOf(q32.architecture) + 50'000'000) / 100'000'000 == 328);                // 32.8B
    CHECK((CountOf(q32.architecture) - embeddings + 50'000'000) / 100'000'000 == 312);   // 31.2B
  }
  SECTION("Gemma 2: sandwich norms, both soft caps and the sliding window of every other layer") {
    // google/gemma-2-9b's config.json (9.24B on its model card).
    const ConfigImport g = ImportHfConfig(R"({"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
      "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8, "head_dim": 256,
      "vocab_size": 256000, "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
      "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
      "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "cache_implementation": "hybrid"})");
    REQUIRE(g.ok());
    const ArchitectureDef& a = g.architecture;
    CHECK(a.sandwichNorms);
    CHECK(a.rmsNormUnitOffset);
    CHECK(a.embeddingScale);
    CHECK(a.tieWordEmbeddings);
    CHECK(a.attentionLogitSoftcap == 50.0);
    CHECK(a.finalLogitSoftcap == 30.0);
    CHECK(a.slidingWindow == 4096);
    CHECK(a.slidingWindowPattern == 2);
    CHECK(CountOf(a) == FindPreset("gemma-2-9b")->publishedParameters);
    CHECK(CountOf(a) == 9'241'705'984);
    CHECK(g.notes.empty());
    // A config that switches the caps off (null) and lists layer_types: a full layer every 3.
    const ConfigImport n = ImportHfConfig(R"({"model_type": "gemma2", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 4, "num_hidden_layers": 6, "num_key_value_heads": 2, "head_dim": 64,
      "vocab_size": 1000, "attn_logit_softcapping": null, "final_logit_softcapping": null,
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "sliding_attention", "full_attention"]})");
    REQUIRE(n.ok());
    CHECK(n.architecture.attentionLogitSoftcap == 0.0);
    CHECK(n.architecture.finalLogitSoftcap == 0.0);
    CHECK(n.architecture.slidingWindowPattern == 3);
    CHECK(n.notes.empty());
    CHECK(n.ignoredFields.empty());
  }
  SECTION("OLMo 2: norms after the sub-layers, q/k norms over the projections, fp32 rotary tables") {
    // allenai/OLMo-2-1124-7B's config.json (7.30B on its model card).
    const ConfigImport o = ImportHfConfig(R"({"architectures": ["Olmo2ForCausalLM"], "attention_bias": false,
      "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
      "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 32, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 500000,
      "tie_word_embeddings": false, "vocab_size": 100352})");
    REQUIRE(o.ok());
    const ArchitectureDef& a = o.architecture;
    CHECK(a.olmo2Layout);
    CHECK(a.queryKeyNorm);
    CHECK(a.rotaryFp32);
    CHECK_FALSE(a.sandwichNorms);
    CHECK_FALSE(a.tieWordEmbeddings);
    CHECK(a.slidingWindow == 0);
    CHECK(CountOf(a) == FindPreset("olmo-2-7b")->publishedParameters);
    CHECK(CountOf(a) == 7'298'617'344);
    CHECK(o.notes.empty());
    Setup s = DefaultSetup();
    s.model.kind = ModelKind::Transformer;
    s.model.architecture = a;
    s.training.sequenceLength = 512;
    CHECK(Validate(s).empty());
  }
  SECTION("OLMo 3: OLMo 2's layout with 16-bit rotary tables and three sliding layers of four") {
    const ConfigImport o = ImportHfConfig(R"({"model_type": "olmo3", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 4, "num_hidden_layers": 8, "num_key_value_heads": 4, "vocab_size": 1000,
      "sliding_window": 4096, "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
      "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]})");
    REQUIRE(o.ok());
    CHECK(o.architecture.olmo2Layout);
    CHECK_FALSE(o.architecture.rotaryFp32);
    CHECK(o.architecture.slidingWindow == 4096);
    CHECK(o.architecture.slidingWindowPattern == 4);
    CHECK(o.notes.empty());
    CHECK(o.ignoredFields.empty());
  }
  SECTION("Granite: Llama's fields, a tied head and three multipliers; its biases as Llama's") {
    // ibm-granite/granite-3.1-2b-base's config.json (2.53B).
    const ConfigImport g = ImportHfConfig(R"({"model_type": "granite", "architectures": ["GraniteForCausalLM"],
      "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32,
      "num_key_value_heads": 8, "vocab_size": 49155, "rope_theta": 5000000.0, "tie_word_embeddings": true,
      "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
      "logits_scaling": 8.0, "attention_bias": false, "mlp_bias": false, "hidden_act": "silu"})");
    REQUIRE(g.ok());
    CHECK(g.architecture.graniteMultipliers);
    CHECK(g.architecture.tieWordEmbeddings);
    CHECK(CountOf(g.architecture) == FindPreset("granite-3.1-2b")->publishedParameters);
    CHECK(g.notes.empty());
    const ConfigImport biased = ImportHfConfig(R"({"model_type": "granite", "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
      "mlp_bias": true})");
    REQUIRE(biased.ok());
    CHECK(biased.architecture.mlpBias);
    CHECK_FALSE(biased.architecture.outputBias);
  }
  SECTION("SmolLM3: Llama's fields, a tied head by default, every fourth layer without RoPE") {
    // HuggingFaceTB/SmolLM3-3B's config.json (its index: total_parameters 3,075,098,624).
    std::string layers;
    for (int i = 0; i < 36; ++i) layers += std::string(i ? ", " : "") + ((i + 1) % 4 == 0 ? "0" : "1");
    const ConfigImport g = ImportHfConfig(R"({"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
      "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
      "num_key_value_heads": 4, "vocab_size": 128256, "use_sliding_window": false,
      "sliding_window": null, "no_rope_layer_interval": 4, "no_rope_layers": [)" + layers + "]}");
    REQUIRE(g.ok());
    CHECK(g.architecture.noRopeInterval == 4);
    CHECK(g.architecture.tieWordEmbeddings);
    CHECK(CountOf(g.architecture) == FindPreset("smollm3-3b")->publishedParameters);
    CHECK(CountOf(g.architecture) == 3'075'098'624);
    CHECK(g.notes.empty());
    CHECK(g.ignoredFields.empty());
    // A list with no single period is read by its first layer without RoPE, and noted.
    const ConfigImport odd = ImportHfConfig(R"({"model_type": "smollm3", "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 1000,
      "no_rope_layers": [1, 0, 0, 1]})");
    REQUIRE(odd.ok());
    CHECK(odd.architecture.noRopeInterval == 2);
    CHECK(odd.notes.size() == 1);
  }
  SECTION("Gemma 3 (text): q/k norms in its own layout, no soft caps, a full layer every 6") {
    // google/gemma-3-1b-pt's config.json (1B on its model card).
    const ConfigImport g = ImportHfConfig(R"({"model_type": "gemma3_text", "hidden_size": 1152,
      "intermediate_size": 6912, "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
      "head_dim": 256, "vocab_size": 262144, "hidden_activation": "gelu_pytorch_tanh",
      "attn_logit_softcapping": null, "final_logit_softcapping": null, "query_pre_attn_scalar": 256,
      "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 1000000, "rope_local_base_freq": 10000,
      "max_position_embeddings": 32768})");
    REQUIRE(g.ok());
    const ArchitectureDef& a = g.architecture;
    CHECK(a.gemma3Layout);
    CHECK(a.queryKeyNorm);
    CHECK(a.sandwichNorms);
    CHECK(a.attentionLogitSoftcap == 0.0);
    CHECK(a.finalLogitSoftcap == 0.0);
    CHECK(a.slidingWindow == 512);
    CHECK(a.slidingWindowPattern == 6);
    CHECK(CountOf(a) == 999'885'952);
    CHECK(CountOf(a) == FindPreset("gemma-3-1b")->publishedParameters);
    CHECK(g.notes.empty());
  }
  SECTION("GPT-NeoX (Pythia): rotary_pct, parallel residual, an untied embed_out") {
    // EleutherAI/pythia-160m's config.json (162,322,944 parameters in the Pythia suite's table).
    const ConfigImport p = ImportHfConfig(R"({"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0,
      "eos_token_id": 0, "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02,
      "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
      "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12, "rotary_emb_base": 10000,
      "rotary_pct": 0.25, "tie_word_embeddings": false, "torch_dtype": "float16", "use_cache": true,
      "use_parallel_residual": true, "vocab_size": 50304})");
    REQUIRE(p.ok());
    const ArchitectureDef& a = p.architecture;
    CHECK(a.family == Family::GPTNeoX);
    CHECK(a.partialRotaryFactor == 0.25);
    CHECK(RotaryDim(a) == 16);  // of 64
    CHECK(a.parallelResidual);
    CHECK_FALSE(a.tieWordEmbeddings);
    CHECK(CountOf(a) == 162'322'944);
    CHECK(a == FindPreset("pythia-160m")->architecture);
    CHECK(p.notes.empty());
    // EleutherAI/gpt-neox-20b (20,554,567,680 parameters).
    const ConfigImport big = ImportHfConfig(R"({"model_type": "gpt_neox", "hidden_size": 6144,
      "intermediate_size": 24576, "num_attention_heads": 64, "num_hidden_layers": 44, "rotary_pct": 0.25,
      "vocab_size": 50432, "use_parallel_residual": true, "tie_word_embeddings": false})");
    REQUIRE(big.ok());
    CHECK(CountOf(big.architecture) == 20'554'567'680);
  }
  SECTION("multimodal Gemma 3 is refused, pointing at its language model's config") {
    const ConfigImport g = ImportHfConfig(R"({"model_type": "gemma3", "text_config": {"hidden_size": 2560}})");
    REQUIRE_FALSE(g.ok());
    CHECK(g.errors.front().field == "config.model_type");
    CHECK(g.errors.front().message.find("gemma3_text") != std::string::npos);
  }
  SECTION("Phi-3's fused projections, and Phi-4-mini's partial rotary factor") {
    const ConfigImport p = ImportHfConfig(R"({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
      "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32064,
      "tie_word_embeddings": false, "sliding_window": 2047})");
    REQUIRE(p.ok());
    CHECK(p.architecture.fusedProjections);
    CHECK(p.architecture.slidingWindow == 2047);  // every layer (Phi3Model's one sliding mask)
    CHECK(p.architecture.slidingWindowPattern == 0);
    CHECK(p.architecture == FindPreset("phi-3-mini-4k")->architecture);
    CHECK(CountOf(p.architecture) == FindPreset("phi-3-mini-4k")->publishedParameters);
    CHECK(p.notes.empty());
    // microsoft/Phi-4-mini-instruct's config.json (3.84B on its model card).
    const ConfigImport four = ImportHfConfig(R"({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
      "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 200064,
      "tie_word_embeddings": true, "partial_rotary_factor": 0.75})");
    REQUIRE(four.ok());
    CHECK(CountOf(four.architecture) == 3'836'021'760);
    CHECK(four.architecture.partialRotaryFactor == 0.75);
    CHECK(RotaryDim(four.architecture) == 96);  // of 128
    CHECK(four.notes.empty());
  }
  SECTION("Qwen3-MoE: the q/k norms and 128 routed experts without a shared one") {
    // Qwen/Qwen3-30B-A3B's config.json; its model card: 30.5B parameters, 29.9B without embeddings.
    const ConfigImport q = ImportHfConfig(R"({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
      "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128,
      "vocab_size": 151936, "tie_word_embeddings": false, "num_experts": 128, "num_experts_per_tok": 8,
      "moe_intermediate_size": 768, "norm_topk_prob": true})");
    REQUIRE(q.ok());
    CHECK(q.architecture.queryKeyNorm);
    CHECK(q.architecture.numExperts == 128);
    CHECK(q.architecture.expertsPerToken == 8);
    CHECK(q.architecture.sharedExpertIntermediateSize == 0);
    CHECK(q.architecture.normTopkProb);  // its config sets norm_topk_prob; Qwen3MoeConfig's default is false
    CHECK(CountOf(q.architecture) == 30'532'122'624);
    CHECK(CountOf(q.architecture) - 2 * 151'936 * 2048 == 29'909'792'768);
  }
  SECTION("Qwen2-MoE: a shared expert with its gate, and norm_topk_prob as the config says") {
    // Qwen/Qwen1.5-MoE-A2.7B's config.json ("norm_topk_prob": false; Qwen2MoeConfig's default too).
    const std::string config = R"({"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
      "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
      "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
      "vocab_size": 151936, "tie_word_embeddings": false, "norm_topk_prob": false})";
    const ConfigImport q = ImportHfConfig(config);
    REQUIRE(q.ok());
    CHECK(q.architecture.sharedExpertGate);
    CHECK_FALSE(q.architecture.normTopkProb);
    CHECK(CountOf(q.architecture) == FindPreset("qwen1.5-moe-a2.7b")->publishedParameters);
    std::string renormalised = config;
    const std::string unnormed = "\"norm_topk_prob\": false";
    renormalised.replace(renormalised.find(unnormed), unnormed.size(), "\"norm_topk_prob\": true");
    const ConfigImport r = ImportHfConfig(renormalised);
    REQUIRE(r.ok());
    CHECK(r.architecture.normTopkProb);
    std::string unstated = config;
    unstated.replace(unstated.find(", " + unnormed), unnormed.size() + 2, "");
    const ConfigImport d = ImportHfConfig(unstated);
    REQUIRE(d.ok());
    CHECK_FALSE(d.architecture.normTopkProb);  // Qwen2MoeConfig's default
  }
  SECTION("a BERT checkpoint for masked LM gets the MLM head") {
    const ConfigImport b = ImportHfConfig(R"({"model_type": "bert", "architectures": ["BertForMaskedLM"],
      "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
      "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522})");
    REQUIRE(b.ok());
    CHECK(b.architecture.encoderHead == EncoderHead::MaskedLM);
  }
}

TEST_CASE("bad config.json files are refused naming the field", "[import][config]") {
  CHECK(HasErrorOn(ImportHfConfig(R"({"model_type": "llama", "num_hidden_layers": 2})").errors, "config.hidden_size"));
  CHECK(HasErrorOn(ImportHfConfig(R"({"hidden_size": 8})").errors, "config.model_type"));
  CHECK(HasErrorOn(ImportHfConfig(R"({"model_type": "phi"})").errors, "config.model_type"));
  CHECK(HasErrorOn(ImportHfConfig(R"({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2,
      "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 10})").errors, "config.hidden_size"));
  CHECK(HasErrorOn(ImportHfConfig(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 10, "hidden_act": "relu2"})").errors, "config.hidden_act"));
  SECTION("malformed and hostile text") {
    for (const std::string text : {std::string("{\"model_type\": "), std::string("[1, 2]"), std::string("null"),
                                   std::string(100000, '[') + std::string(100000, ']'), std::string("\xff\xfe")}) {
      const ConfigImport c = ImportHfConfig(text);
      REQUIRE_FALSE(c.ok());
      CHECK(c.errors.front().code == ErrorCode::MalformedJson);
    }
  }
  SECTION("the JSON envelope carries the count, or the errors") {
    const std::string ok = ImportConfigJson(R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
      "n_positions": 1024, "vocab_size": 50257})");
    CHECK(ok.find("\"parameterCount\":124439808") != std::string::npos);
    CHECK(ImportConfigJson("{").find("\"ok\":false") != std::string::npos);
  }
}

TEST_CASE("a safetensors header counts the checkpoint exactly", "[import][safetensors]") {
  const SafetensorsImport t = ImportSafetensors(R"({
    "__metadata__": {"format": "pt"},
    "model.embed_tokens.weight": {"dtype": "BF16", "shape": [1000, 64], "data_offsets": [0, 128000]},
    "model.layers.0.mlp.up_proj.weight": {"dtype": "BF16", "shape": [256, 64], "data_offsets": [128000, 160768]},
    "model.layers.1.input_layernorm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [160768, 161024]}})");
  REQUIRE(t.ok());
  CHECK(t.fromHeader);
  REQUIRE(t.parameterCount.has_value());
  CHECK(*t.parameterCount == 64000 + 16384 + 64);
  CHECK(t.totalSizeBytes == 161024);
  CHECK(t.numLayers == 2);
  CHECK(t.tensorCount == 3);
  REQUIRE(t.largestMatrices.size() == 2);
  CHECK(t.largestMatrices[0].rows == 1000);

  SECTION("the header's count against an architecture's, in the core") {
    const std::string header = R"({"w": {"dtype": "F32", "shape": [10, 10]}})";
    const std::string compared = ImportSafetensorsJson(header, R"({"model":{"preset":"gpt2"},"training":{"sequenceLength":8}})");
    CHECK(compared.find("\"architectureParameterCount\":124439808") != std::string::npos);
    CHECK(compared.find("\"differenceFromArchitecture\":-124439708") != std::string::npos);
    CHECK(ImportSafetensorsJson(header).find("\"differenceFromArchitecture\":null") != std::string::npos);
  }
  SECTION("the headers of a sharded checkpoint are counted together") {
    const SafetensorsImport both = ImportSafetensors(R"([{"a.weight": {"dtype": "BF16", "shape": [4, 4]}},
      {"__metadata__": {"format": "pt"}, "b.weight": {"dtype": "BF16", "shape": [2, 3]}}])");
    REQUIRE(both.ok());
    CHECK(*both.parameterCount == 16 + 6);
    CHECK(both.tensorCount == 2);
    CHECK(HasErrorOn(ImportSafetensors(R"([{"a": {"dtype": "F32", "shape": [1]}}, {"a": {"dtype": "F32", "shape": [1]}}])").errors,
                     "headers[1]"));
    CHECK_FALSE(ImportSafetensors("[]").ok());
  }
  SECTION("GPT-2's checkpoint names its blocks h.N with no prefix") {
    const SafetensorsImport g = ImportSafetensors(R"({"h.0.attn.c_attn.weight": {"dtype": "F32", "shape": [4, 12]},
      "h.11.mlp.c_fc.bias": {"dtype": "F32", "shape": [16]}, "wte.weight": {"dtype": "F32", "shape": [10, 4]}})");
    REQUIRE(g.ok());
    CHECK(g.numLayers == 12);
  }
  SECTION("byte ranges that disagree with the shape are refused") {
    const SafetensorsImport bad = ImportSafetensors(
        R"({"w": {"dtype": "F32", "shape": [10, 10], "data_offsets": [0, 10]}})");
    CHECK(HasErrorOn(bad.errors, "header.w.data_offsets"));
    CHECK(HasErrorOn(ImportSafetensors(R"({"w": {"dtype": "F99", "shape": [1]}})").errors, "header.w.dtype"));
    CHECK(HasErrorOn(ImportSafetensors(R"({"w": {"dtype": "F32", "shape": [-1]}})").errors, "header.w.shape"));
    CHECK(HasErrorOn(ImportSafetensors(R"({"w": {"dtype": "F32", "shape": [1000000000, 1000000000]}})").errors, "header.w.shape"));
  }
  SECTION("an index gives names and total bytes, not an exact count") {
    const SafetensorsImport index = ImportSafetensors(R"({"metadata": {"total_size": 13476839424},
      "weight_map": {"model.layers.0.mlp.up_proj.weight": "a.safetensors",
                     "model.layers.31.mlp.up_proj.weight": "b.safetensors", "lm_head.weight": "b.safetensors"}})");
    REQUIRE(index.ok());
    CHECK_FALSE(index.fromHeader);
    CHECK_FALSE(index.parameterCount.has_value());
    CHECK(index.totalSizeBytes == 13'476'839'424);
    CHECK(index.numLayers == 32);
    CHECK(index.tensorCount == 3);
  }
}
