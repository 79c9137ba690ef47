// Fine-tuning: frozen parameters, LoRA / DoRA adapters, bitsandbytes layouts (finetune.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>
#include <utility>

#include "gpumem/finetune.hpp"
#include "gpumem/import.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// A small Llama: hidden 64, 4 heads, intermediate 128, untied head.
Setup TinyLlama(int layers = 2, Precision precision = Precision::BF16) {
  return TinyTransformer(Family::Llama, layers, precision);
}

const Tensor* Find(const Inventory& inv, const std::string& name) {
  const std::int64_t i = inv.IndexOf(name);
  return i < 0 ? nullptr : &inv.parameters[static_cast<std::size_t>(i)];
}

std::int64_t MaxAlloc(const Trace& trace, Category category, Phase phase) {
  std::int64_t best = 0;
  for (const Event& e : trace.events) {
    if (e.kind == EventKind::Alloc && e.category == category && e.phase == phase) best = std::max(best, e.bytes);
  }
  return best;
}

// LoRA r 8 on the small Llama (q_proj and v_proj, PEFT's default): the head stays frozen.
Setup TinyLlamaLora() {
  Setup s = TinyLlama();
  s.finetune.lora = true;
  s.finetune.r = 8;
  return s;
}

// The index of step `step`'s release of the final norm's output (model.norm's weight * x), which
// must be there and free `bytes`.
std::size_t FinalNormReleased(const Estimate& e, int step, std::int64_t bytes) {
  const std::size_t freed = TimelineIndexOf(e, "model.norm weight * x no longer referenced", step);
  REQUIRE(freed < e.timeline.size());
  CHECK(e.timeline[freed].deltaBytes == -bytes);
  return freed;
}

}  // namespace

TEST_CASE("bitsandbytes 4-bit layout: packed codes and fp32 absmax per 64 and the code table", "[finetune]") {
  // functional.py quantize_4bit: uint8 [(n+1)//2], absmax fp32 [⌈n/64⌉], code fp32 [16].
  CHECK(Nf4WeightBytes(4096 * 4096, false) == 8'388'608 + 262'144 * 4 + 64);
  CHECK(Nf4WeightBytes(100, false) == 50 + 2 * 4 + 64);
  CHECK(Nf4WeightBytes(101, false) == 51 + 2 * 4 + 64);
  // compress_statistics: uint8 absmax, an fp32 offset, fp32 absmax per 256 blocks.
  CHECK(Nf4WeightBytes(4096 * 4096, true) == 8'388'608 + 262'144 + 4 + 1024 * 4 + 64);
  CHECK(Nf4WeightBytes(100, true) == 50 + 2 + 4 + 4 + 64);
  // 0.5 B per weight plus 0.127 bit of statistics with double quant (the QLoRA paper's figure)
  const double n = 4096.0 * 14336.0;
  const double statisticsBits = (double(Nf4WeightBytes(4096 * 14336, true)) - n / 2) * 8 / n;
  CHECK(statisticsBits == Approx(0.127).epsilon(0.01));
}

TEST_CASE("LLM.int8 layout: int8 weights and an fp32 scale per output row", "[finetune]") {
  CHECK(Int8WeightBytes(4096, 4096) == 16'777'216 + 4096 * 4);
  CHECK(Int8WeightBytes(1, 3) == 3 + 4);
}

TEST_CASE("Defaults leave the inventory as plain training", "[finetune]") {
  const Setup s = TinyLlama();
  CHECK_FALSE(FinetuneActive(s.finetune));
  const Inventory inv = BuildInventory(s);
  for (const Tensor& p : inv.parameters) {
    CHECK(p.trainable);
    CHECK(p.storage == Tensor::Storage::Regime);
    CHECK_FALSE(p.adapter);
  }
}

TEST_CASE("LoRA adds A and B under PEFT's names and freezes the base", "[finetune]") {
  const Setup s = TinyLlamaLora();  // default targets for Llama: q_proj, v_proj
  const Inventory inv = BuildInventory(s);
  REQUIRE(Find(inv, "model.layers.0.self_attn.q_proj.weight") == nullptr);
  const Tensor* base = Find(inv, "model.layers.0.self_attn.q_proj.base_layer.weight");
  REQUIRE(base != nullptr);
  CHECK_FALSE(base->trainable);
  const Tensor* a = Find(inv, "model.layers.0.self_attn.q_proj.lora_A.default.weight");
  const Tensor* b = Find(inv, "model.layers.1.self_attn.v_proj.lora_B.default.weight");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a->shape == std::vector<std::int64_t>{8, 64});
  CHECK(b->shape == std::vector<std::int64_t>{64, 8});
  CHECK(Find(inv, "model.layers.0.self_attn.k_proj.weight") != nullptr);  // not a target
  // 2 layers × 2 targets × r·(in + out) = 4 × 8 · 128
  CHECK(inv.TrainableCount() == 4096);

  const ModelStates m = MustEstimate(s).modelStates;
  CHECK(m.gradientsBytes == 4096 * 4);           // fp32 adapters: fp32 gradients
  CHECK(m.optimizerStatesBytes == 2 * 4096 * 4);  // AdamW: exp_avg and exp_avg_sq in fp32
  CHECK(m.masterWeightsBytes == 0);
  // bf16 base (every base tensor) + fp32 adapters
  CHECK(m.parametersBytes == (inv.ParameterCount() - 4096) * 2 + 4096 * 4);
}

TEST_CASE("LoRA targets: all-linear skips the output layer and DoRA adds a magnitude", "[finetune]") {
  Setup s = TinyLlama(1);
  s.finetune.lora = true;
  s.finetune.r = 4;
  s.finetune.targetModules = {"all-linear"};
  s.finetune.useDora = true;
  const Inventory inv = BuildInventory(s);
  CHECK(Find(inv, "lm_head.weight") != nullptr);
  CHECK(Find(inv, "model.layers.0.mlp.down_proj.lora_A.default.weight")->shape == std::vector<std::int64_t>{4, 128});
  CHECK(Find(inv, "model.layers.0.mlp.down_proj.lora_magnitude_vector.default.weight")->shape ==
        std::vector<std::int64_t>{64});
  // 7 linears: q k v o (64→64) gate up (64→128) down (128→64)
  const std::int64_t lora = 4 * (4 * 128 + 2 * 192 + 192);
  const std::int64_t magnitude = 4 * 64 + 2 * 128 + 64;
  CHECK(inv.TrainableCount() == lora + magnitude);
}

TEST_CASE("Frozen layers save nothing: a frozen prefix adds no activations", "[finetune]") {
  // Only the head trains: no block keeps anything for backward, whatever their number.
  auto headOnly = [](int layers) {
    Setup s = TinyLlama(layers);
    s.finetune.trainOnlyModules = {"lm_head"};
    return BytesIn(MustEstimate(s).forwardEnd, Category::Activations);
  };
  CHECK(headOnly(2) == headOnly(6));
  // Frozen first blocks: 4 of 6 frozen keeps what 2 of 4 frozen keeps.
  auto frozenPrefix = [](int layers, int frozen) {
    Setup s = TinyLlama(layers);
    s.finetune.freezeEmbeddings = true;
    s.finetune.freezeFirstBlocks = frozen;
    return BytesIn(MustEstimate(s).forwardEnd, Category::Activations);
  };
  CHECK(frozenPrefix(6, 4) == frozenPrefix(4, 2));
  // …and less than the full model, which saves every block.
  CHECK(frozenPrefix(4, 2) < BytesIn(MustEstimate(TinyLlama(4)).forwardEnd, Category::Activations));
  // Frozen parameters: no gradient, state or master copy (bf16 mixed keeps masters for the rest).
  Setup s = TinyLlama(4, Precision::BF16Mixed);
  s.finetune.freezeFirstBlocks = 2;
  const Inventory inv = BuildInventory(s);
  const ModelStates m = MustEstimate(s).modelStates;
  CHECK(m.masterWeightsBytes == inv.TrainableCount() * 4);
  CHECK(m.gradientsBytes == inv.TrainableCount() * 2);
  CHECK(m.optimizerStatesBytes == inv.TrainableCount() * 8);
  CHECK(inv.TrainableCount() < inv.ParameterCount());
}

TEST_CASE("QLoRA: 4-bit base weights and the transient dequantized weight", "[finetune]") {
  Setup s = TinyLlama(2, Precision::BF16);
  s.finetune.lora = true;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.computeDType = DType::BF16;
  const Inventory inv = BuildInventory(s);
  const Tensor* base = Find(inv, "model.layers.0.self_attn.q_proj.base_layer.weight");
  REQUIRE(base != nullptr);
  CHECK(base->storage == Tensor::Storage::NF4);
  CHECK(Find(inv, "model.layers.0.mlp.gate_proj.weight")->storage == Tensor::Storage::NF4);
  CHECK(Find(inv, "lm_head.weight")->storage == Tensor::Storage::Regime);  // modules_to_not_convert
  CHECK(Find(inv, "model.embed_tokens.weight")->storage == Tensor::Storage::Regime);
  CHECK(Find(inv, "model.norm.weight")->storage == Tensor::Storage::Regime);
  // Parameters: per linear 64×64 → 2048 + 64·4 + 64 B; 64×128 → 4096 + 128·4 + 64 B.
  const std::int64_t square = 2048 + 256 + 64, wide = 4096 + 512 + 64;
  const std::int64_t quantized = 2 * (4 * square + 3 * wide);
  std::int64_t other = 0, adapters = 0;
  for (const Tensor& p : inv.parameters) {
    if (p.adapter) adapters += p.Elements();
    else if (p.storage == Tensor::Storage::Regime) other += p.Elements();
  }
  const Estimate e = MustEstimate(s);
  CHECK(e.modelStates.parametersBytes == quantized + other * 2 + adapters * 4);
  // F.linear(A, dequantize_4bit(B).to(A.dtype).t()): a bf16 [128, 64] weight in forward, and
  // again in backward for the input's gradient.
  const Trace trace = BuildTrace(s, inv, false);
  CHECK(MaxAlloc(trace, Category::WeightCopies, Phase::Forward) == 128 * 64 * 2);
  CHECK(MaxAlloc(trace, Category::ActivationGradients, Phase::Backward) >= 128 * 64 * 2);
  // Double quant is smaller.
  s.finetune.doubleQuant = true;
  CHECK(MustEstimate(s).modelStates.parametersBytes < e.modelStates.parametersBytes);
}

TEST_CASE("prepare_model_for_kbit_training upcasts the rest to fp32 and checkpoints", "[finetune]") {
  Setup s = TinyLlama(2, Precision::BF16);
  s.finetune.lora = true;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.prepareForKbitTraining = true;
  const Inventory inv = BuildInventory(s);
  CHECK(Find(inv, "model.embed_tokens.weight")->storage == Tensor::Storage::FP32);
  CHECK(Find(inv, "lm_head.weight")->storage == Tensor::Storage::FP32);
  CHECK(Find(inv, "model.layers.0.input_layernorm.weight")->storage == Tensor::Storage::FP32);
  // Checkpointing every block keeps less than the same setup without it.
  Setup plain = s;
  plain.finetune.prepareForKbitTraining = false;
  CHECK(MustEstimate(s).forwardEnd.totalBytes > 0);
  CHECK(BytesIn(MustEstimate(s).forwardEnd, Category::Activations) <
        BytesIn(MustEstimate(plain).forwardEnd, Category::Activations) * 2);
}

TEST_CASE("DoRA keeps the recomputed base projection and the LoRA product per adapted layer", "[finetune]") {
  Setup s = TinyLlama(2, Precision::FP32);
  s.finetune.lora = true;
  const std::int64_t lora = BytesIn(MustEstimate(s).forwardEnd, Category::Activations);
  s.finetune.useDora = true;
  const std::int64_t dora = BytesIn(MustEstimate(s).forwardEnd, Category::Activations);
  // (mag_norm_scale − 1) · F.linear(x, weight) saves F.linear's output and mag_norm_scale ·
  // lora_result saves lora_result: two fp32 [2, 16, 64] tensors per adapted layer (2 layers ×
  // q_proj, v_proj), plus [64]-sized norms. The x_eye branch is used detached and keeps nothing.
  const std::int64_t products = 4 * 2 * (2 * 16 * 64 * 4);
  CHECK(dora - lora >= products);
  CHECK(dora - lora < products + 4 * 64 * 64 * 4);  // less than one x_eye per layer more
}

TEST_CASE("DoRA's init: each adapted linear's weight norm is made from three [out, in] temporaries", "[finetune]") {
  // PEFT dora_init → update_layer: lora_weight = lora_B @ lora_A, then get_weight_norm's
  // scaling * lora_weight and weight + scaling * lora_weight, all fp32 [64, 64] here, before
  // the norm [64] becomes the magnitude (CPU torch: validate's llama-dora-qv).
  auto initPeak = [](const Setup& s) {
    const Inventory inv = BuildInventory(s);
    const Trace trace = BuildTrace(s, inv, false);
    std::int64_t live = 0, peak = 0, copies = 0;
    for (const Event& e : trace.events) {
      if (e.phase != Phase::Init) continue;
      live += e.kind == EventKind::Alloc ? e.bytes : -e.bytes;
      peak = std::max(peak, live);
      if (e.category == Category::WeightCopies) copies += e.kind == EventKind::Alloc ? e.bytes : -e.bytes;
    }
    CHECK(copies == 0);  // every temporary freed before training
    return std::make_pair(peak, live);
  };
  Setup s = TinyLlama(2, Precision::FP32);
  s.finetune.lora = true;
  s.finetune.useDora = true;
  const auto [peak, loaded] = initPeak(s);
  // The last adapted linear (layers.1 v_proj, [64, 64]): everything but its magnitude, and
  // the three temporaries.
  CHECK(peak == loaded - 64 * 4 + 3 * 64 * 64 * 4);
  // QLoRA + DoRA: a deep copy of the 4-bit layer (2,048 + 256 + 64 B) and the weight
  // dequantized to bf16 come first; lora_weight and the scaled product are fp32, and so is the
  // sum (bf16 + fp32).
  s.training.precision = Precision::BF16;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.computeDType = DType::BF16;
  const auto [qpeak, qloaded] = initPeak(s);
  CHECK(qpeak == qloaded - 64 * 4 + (2048 + 256 + 64) + 64 * 64 * 2 + 3 * 64 * 64 * 4);
}

TEST_CASE("BERT's intermediate output lives through BertOutput (feed_forward_chunk's local)", "[finetune]") {
  // With LoRA on query and value, output.dense is frozen and saves no input: the activation's
  // output is held only by feed_forward_chunk's `intermediate_output`, until after the output
  // LayerNorm (CPU torch: validate's bert-lora-ckpt-ampbf16, -0.6 % -> -0.1 %).
  Setup s = TinyTransformer(Family::BERT, 2, Precision::FP32);
  s.finetune.lora = true;
  const Inventory inv = BuildInventory(s);
  const Trace trace = BuildTrace(s, inv, true);
  std::size_t norm = 0, freed = 0;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.step != 1 || e.phase != Phase::Forward || e.layer != 0) continue;
    const std::string label = trace.Label(e);
    if (e.kind == EventKind::Alloc && norm == 0 && label.find("output.LayerNorm") != std::string::npos &&
        label.find("attention.output") == std::string::npos) {
      norm = i;
    }
    if (e.kind == EventKind::Free && label.find("mlp activation no longer referenced") != std::string::npos) freed = i;
  }
  REQUIRE(norm > 0);
  REQUIRE(freed > 0);
  CHECK(freed > norm);
}

TEST_CASE("Fine-tuning validation names each field", "[finetune]") {
  auto errorsOf = [](const std::function<void(Setup&)>& change) {
    Setup s = TinyLlama();
    change(s);
    return Validate(s);
  };
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.r = 0; }), "finetune.r"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.r = -3; }), "finetune.r"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.loraAlpha = std::nan(""); }),
                   "finetune.loraAlpha"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.loraAlpha = 0; }), "finetune.loraAlpha"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.loraDropout = 1; }),
                   "finetune.loraDropout"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.targetModules = {"nothing_here"}; }),
                   "finetune.targetModules"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.lora = true; s.finetune.targetModules = {"embed_tokens"}; }),
                   "finetune.targetModules"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.quantization = Quantization::NF4; }), "finetune.quantization"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.doubleQuant = true; }), "finetune.doubleQuant"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.freezeFirstBlocks = 3; }), "finetune.freezeFirstBlocks"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.freezeFirstBlocks = -1; }), "finetune.freezeFirstBlocks"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.trainOnlyModules = {"no_such_module"}; }), "finetune"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.useDora = true; }), "finetune.lora"));
  CHECK(HasErrorOn(errorsOf([](Setup& s) { s.finetune.prepareForKbitTraining = true; }),
                   "finetune.prepareForKbitTraining"));
  Setup quick = DefaultSetup();
  quick.finetune.lora = true;
  CHECK(HasErrorOn(Validate(quick), "finetune"));
  CHECK(errorsOf([](Setup& s) { s.finetune.lora = true; }).empty());
}

TEST_CASE("Fine-tuning JSON round trip and errors", "[finetune]") {
  Setup s = TinyLlama();
  s.finetune.lora = true;
  s.finetune.r = 16;
  s.finetune.loraAlpha = 32;
  s.finetune.targetModules = {"q_proj", "k_proj"};
  s.finetune.quantization = Quantization::NF4;
  s.finetune.doubleQuant = true;
  s.finetune.computeDType = DType::BF16;
  Setup back;
  REQUIRE(ParseAndValidate(SetupToJson(s), back).empty());
  CHECK(back.finetune == s.finetune);
  Setup bad;
  const auto errors = ParseAndValidate(R"({"finetune": {"quantization": "nf3", "computeDType": 7, "r": "x"}})", bad);
  CHECK(HasErrorOn(errors, "finetune.quantization"));
  CHECK(HasErrorOn(errors, "finetune.computeDType"));
  CHECK(HasErrorOn(errors, "finetune.r"));
  CHECK(HasErrorOn(ParseAndValidate(R"({"finetune": {"lroa": true}})", bad), "finetune.lroa"));
}

TEST_CASE("Import: a PEFT adapter_config.json and a config's quantization_config", "[finetune]") {
  const AdapterImport a = ImportAdapterConfig(R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
      "target_modules": ["q_proj", "v_proj"], "use_dora": false, "bias": "none", "task_type": "CAUSAL_LM",
      "base_model_name_or_path": "meta-llama/Meta-Llama-3-8B", "fan_in_fan_out": false})");
  REQUIRE(a.ok());
  CHECK(a.finetune.lora);
  CHECK(a.finetune.r == 16);
  CHECK(a.finetune.loraAlpha == 32);
  CHECK(a.finetune.loraDropout == 0.05);
  CHECK(a.finetune.targetModules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(a.ignoredFields == std::vector<std::string>{"base_model_name_or_path", "fan_in_fan_out"});
  CHECK(ImportAdapterConfig(R"({"target_modules": "all-linear"})").finetune.targetModules ==
        std::vector<std::string>{"all-linear"});
  CHECK(HasErrorOn(ImportAdapterConfig(R"({"peft_type": "IA3"})").errors, "adapter.peft_type"));
  CHECK(HasErrorOn(ImportAdapterConfig(R"({"r": "eight"})").errors, "adapter.r"));
  CHECK(HasErrorOn(ImportAdapterConfig(R"({"target_modules": ".*proj"})").errors, "adapter.target_modules"));
  CHECK_FALSE(ImportAdapterConfig("[1]").ok());

  const QuantizationImport q = ImportQuantizationConfig(R"({"model_type": "llama", "quantization_config": {
      "quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "bfloat16"}})");
  REQUIRE(q.errors.empty());
  CHECK(q.found);
  CHECK(q.finetune.quantization == Quantization::NF4);
  CHECK(q.finetune.doubleQuant);
  CHECK(q.finetune.computeDType == DType::BF16);
  CHECK(ImportQuantizationConfig(R"({"quantization_config": {"load_in_8bit": true}})").finetune.quantization ==
        Quantization::Int8);
  CHECK_FALSE(ImportQuantizationConfig(R"({"model_type": "llama"})").found);
  CHECK(HasErrorOn(ImportQuantizationConfig(R"({"quantization_config": {"load_in_4bit": true, "load_in_8bit": true}})").errors,
                   "config.quantization_config"));
  CHECK(HasErrorOn(ImportQuantizationConfig(R"({"quantization_config": {"quant_method": "gptq"}})").errors,
                   "config.quantization_config.quant_method"));
  CHECK(HasErrorOn(ImportQuantizationConfig(R"({"quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf3"}})").errors,
                   "config.quantization_config.bnb_4bit_quant_type"));
  // Through the JSON API: the finetune fields come with the architecture.
  const std::string out = ImportConfigJson(R"({"model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}})");
  CHECK(out.find(R"("finetune":{"quantization":"nf4")") != std::string::npos);
}

TEST_CASE("The work budget bounds fine-tuning setups", "[finetune]") {
  // Adapters add events per linear: the prediction (setup.cpp PredictEvents with
  // FinetuneEventsPerBlock) must stay an upper bound for LoRA, DoRA and quantized weights.
  const std::vector<std::vector<std::string>> targetSets = {{"all-linear"}, {"q_proj", "v_proj"}, {"w1", "w3"}};
  for (const char* id : {"llama-3-8b", "gpt2", "bert-base-uncased", "mixtral-8x7b"}) {
    for (int variant = 0; variant < 4; ++variant) {
      for (Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock})
      for (const std::vector<std::string>& targets : targetSets) {
        // q_proj / v_proj name Llama-family modules, w1 / w3 a mixture of experts' (GPT-2 and
        // BERT take all-linear alone).
        const ArchitectureDef& a = FindPreset(id)->architecture;
        if (targets.front() != "all-linear" && a.family != Family::Llama) continue;
        if (targets.front() == "w1" && a.numExperts == 0) continue;
        Setup s = DefaultSetup();
        s.model.kind = ModelKind::Transformer;
        s.model.architecture = FindPreset(id)->architecture;
        s.model.architecture.numLayers = 2;
        s.training.sequenceLength = 32;
        s.training.precision = Precision::BF16;
        s.training.checkpointing = c;
        s.finetune.lora = true;
        s.finetune.targetModules = targets;
        s.finetune.useDora = variant == 1 || variant == 3;
        s.finetune.loraDropout = variant >= 2 ? 0.1 : 0.0;
        if (variant >= 2) s.finetune.quantization = Quantization::NF4;
        if (variant == 3) s.finetune.prepareForKbitTraining = true;
        const EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .timelineLimit = 0, .explain = false});
        REQUIRE(r.ok());
        INFO(id << " variant " << variant << " checkpointing " << int(c) << " targets " << targets.front() << ": "
                << r.estimate.eventCount);
        CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
      }
    }
  }
  SECTION("adapters on the attention of a mixture of experts are counted as that, not on every expert") {
    Setup s = DefaultSetup();
    s.model.kind = ModelKind::Transformer;
    s.model.architecture = FindPreset("mixtral-8x7b")->architecture;
    s.model.architecture.numLayers = 2;
    s.finetune.lora = true;
    s.finetune.targetModules = {"q_proj", "v_proj"};
    const double attention = PredictEvents(s).predictedEvents;
    s.finetune.targetModules = {"q_proj", "v_proj", "w1", "w2", "w3"};
    const double everyExpert = PredictEvents(s).predictedEvents;
    // The experts' share, per block: 2 (recomputation margin) × 8 experts × 3 linears × 50 events,
    // and the optimizer's 8 events for each of their 8 × 3 × 2 adapter tensors (lora_A, lora_B).
    CHECK(everyExpert - attention == 2 * (2 * 8 * 3 * 50 + 8 * 3 * 2 * 8));
  }
  SECTION("adapters on experts under autocast with every block recomputed, and frozen experts") {
    // Autocast casts each adapter's A and B, and DoRA's forward (the weight's norm) runs again in
    // the recompute: LoRA on w1, w2, w3 of a Qwen3-MoE shape with 24 layers × 60 experts made
    // 841,555 events against 820,922 predicted, DoRA up to a third more than predicted, until the
    // adapters' constants grew (docs/budget.md). Here Qwen1.5-MoE's experts, 2 blocks.
    Setup s = DefaultSetup();
    s.model.kind = ModelKind::Transformer;
    s.model.architecture = FindPreset("qwen1.5-moe-a2.7b")->architecture;
    s.model.architecture.numLayers = 2;
    s.training.sequenceLength = 512;
    s.training.precision = Precision::AmpBF16;
    s.finetune.lora = true;
    for (Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock, Checkpointing::SelectiveOp})
    for (bool dora : {false, true})
    for (OptimizerImplementation impl : {OptimizerImplementation::ForEach, OptimizerImplementation::PerParameter}) {
      s.training.checkpointing = c;
      s.training.optimizerImplementation = impl;
      s.finetune.useDora = dora;
      s.finetune.targetModules = {"q_proj", "w1", "w2", "w3"};
      const EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .timelineLimit = 0, .explain = false});
      REQUIRE(r.ok());
      INFO("checkpointing " << int(c) << " dora " << dora << " implementation " << int(impl) << ": " << r.estimate.eventCount);
      CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
    }
    // Experts whose weights LoRA freezes take no gradient and no optimizer work: predicted as
    // such (kFrozenExpert), still above what is simulated.
    s.training.checkpointing = Checkpointing::EveryBlock;
    s.finetune.useDora = false;
    s.finetune.targetModules = {"q_proj", "v_proj"};
    const double frozen = PredictEvents(s).predictedEvents;
    const EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .timelineLimit = 0, .explain = false});
    REQUIRE(r.ok());
    CHECK(frozen >= double(r.estimate.eventCount));
    s.finetune = FinetuneDef{};
    CHECK(PredictEvents(s).predictedEvents > frozen + 2 * 60 * (155 - 130) * 1.45);
  }
}

TEST_CASE("all-linear adapts linears only: norms and BERT's decoder bias keep their names", "[finetune]") {
  for (const char* id : {"gpt2", "bert-base-uncased"}) {
    Setup s = DefaultSetup();
    s.model.kind = ModelKind::Transformer;
    s.model.architecture = FindPreset(id)->architecture;
    s.model.architecture.numLayers = 1;
    s.training.sequenceLength = 128;
    s.finetune.lora = true;
    s.finetune.targetModules = {"all-linear"};
    const Inventory inv = BuildInventory(s);
    for (const Tensor& p : inv.parameters) {
      INFO(p.name);
      if (p.name.find("base_layer") != std::string::npos) {
        // only weights and biases of linear modules are wrapped
        CHECK(p.name.find("ln_") == std::string::npos);
        CHECK(p.name.find("LayerNorm") == std::string::npos);
      }
    }
    CHECK(MustEstimate(s).peak.totalBytes > 0);
  }
}

TEST_CASE("Autocast keeps no weight copy for a frozen prefix", "[finetune]") {
  // autocast caches casts of leaves that require grad only; a frozen weight's copy is freed
  // after its op unless saved, and a frozen prefix saves nothing.
  auto copies = [](int layers, int frozen) {
    Setup s = TinyLlama(layers, Precision::AmpBF16);
    s.finetune.freezeEmbeddings = frozen > 0;
    s.finetune.freezeFirstBlocks = frozen;
    return BytesIn(MustEstimate(s).forwardEnd, Category::WeightCopies);
  };
  CHECK(copies(4, 2) == copies(2, 0));
  CHECK(copies(4, 2) < copies(4, 0));
}

TEST_CASE("The head's input lives to the end of the loss: the ForCausalLM forward's hidden_states", "[finetune]") {
  // LlamaForCausalLM.forward keeps `hidden_states` (and outputs.last_hidden_state) until it
  // returns, after self.loss_function(logits, labels); scripts/validate_parallel.py's LoRA cases
  // measured it (forward −1 MiB before). With LoRA the head is frozen and saves no input, so this
  // reference alone holds the final norm's output through the loss: b·s·h in the weights' dtype.
  const Estimate e = MustEstimateLabelled(TinyLlamaLora());
  for (int step : {1, 2}) {
    const std::size_t freed = FinalNormReleased(e, step, 2 * 16 * 64 * 2);
    CHECK(TimelineIndexOf(e, "loss: nll_loss", step) < freed);                 // held through the loss
    CHECK(freed < TimelineIndexOf(e, "loss: logits no longer referenced", step));  // gone before the logits
  }
  // Under autocast a trainable head saves its bf16 cast, not the fp32 output the norm made: the
  // reference holds that fp32 tensor through the loss too (b·s·h·4).
  const Estimate amp = MustEstimateLabelled(TinyLlama(2, Precision::AmpBF16));
  CHECK(TimelineIndexOf(amp, "loss: nll_loss", 1) < FinalNormReleased(amp, 1, 2 * 16 * 64 * 4));
}

TEST_CASE("torchtune's chunked output: the decoder's h goes before the recipe's loss", "[finetune]") {
  // TransformerDecoder.unembed keeps h = self.norm(h) only until the model returns its chunk
  // logits; the recipe's _loss_step then shifts the labels (torch.hstack) and runs
  // CEWithChunkedOutputLoss. A frozen head saves no chunk of h, so nothing holds it by then.
  Setup s = TinyLlamaLora();
  s.training.lossImplementation = LossImplementation::Chunked;
  s.training.lossChunks = 4;
  const Estimate e = MustEstimateLabelled(s);
  for (int step : {1, 2}) {
    const std::size_t freed = FinalNormReleased(e, step, 2 * 16 * 64 * 2);
    CHECK(TimelineIndexOf(e, "output (chunk 3)", step) < freed);
    CHECK(freed < TimelineIndexOf(e, "labels shifted (torch.hstack)", step));
  }
}
