// The setup as a Hugging Face config.json and as a Python script that measures it on a GPU
// (gpumem/measure.hpp). The script is scripts/measure_cuda.py's run of one case (the code that
// measured docs/validation.md's "CUDA truth" rows on an H100), written out for the setup.
#include "gpumem/measure.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/gpus.hpp"
#include "gpumem/import.hpp"
#include "gpumem/json.hpp"
#include "gpumem/names.hpp"
#include "gpumem/parallel.hpp"
#include "io/json_writer.hpp"

namespace gpumem {
namespace {

// The config.json spelling of an activation (the first name ImportHfConfig reads as it).
const char* ActivationName(HiddenAct act) {
  switch (act) {
    case HiddenAct::GELU: return "gelu";
    case HiddenAct::GELUTanh: return "gelu_pytorch_tanh";
    case HiddenAct::GELUNew: return "gelu_new";
    case HiddenAct::SiLU: return "silu";
  }
  return "silu";
}

// The Llama-family model type whose modeling file has these fields (the flags ImportHfConfig
// sets from a model type, read backwards). Fields a type fixes in code are left to it: Qwen2's
// q/k/v biases, Mistral's and Phi-3's bias-free projections, Gemma's norms and scaling.
std::string LlamaModelType(const ArchitectureDef& a) {
  if (a.olmo2Layout) return a.slidingWindow > 0 ? "olmo3" : "olmo2";
  if (a.graniteMultipliers) return "granite";
  if (a.noRopeInterval > 0) return "smollm3";
  if (a.fusedProjections) return "phi3";
  if (a.gemma3Layout) return "gemma3_text";
  if (a.sandwichNorms) return "gemma2";
  if (a.rmsNormUnitOffset || a.embeddingScale) return "gemma";
  if (a.numExperts > 0) {
    if (a.queryKeyNorm) return "qwen3_moe";
    if (a.sharedExpertIntermediateSize > 0 || a.attentionBias) return "qwen2_moe";
    return "mixtral";
  }
  if (a.queryKeyNorm) return "qwen3";
  if (a.attentionBias && !a.outputBias) return "qwen2";
  if (a.slidingWindow > 0) return "mistral";
  return "llama";
}

// layer_types as Gemma 2 / 3 and OLMo 3 configs list them: every pattern-th layer attends to all
// tokens (ReadLayerTypes reads the pattern back).
void LayerTypes(JsonWriter& w, const ArchitectureDef& a) {
  w.BeginArray();
  for (std::int64_t i = 0; i < a.numLayers; ++i) {
    const bool full = a.slidingWindowPattern > 0 && (i + 1) % a.slidingWindowPattern == 0;
    w.String(full ? "full_attention" : "sliding_attention");
  }
  w.EndArray();
}

void NullIfZero(JsonWriter& w, double v) {
  if (v == 0.0) w.Null();
  else w.Double(v);
}

// The sizes every family but GPT-2 names alike (GPT-2's config says n_embd, n_layer, n_head);
// the object is left open for the family's own keys.
void SizedConfig(JsonWriter& w, const char* modelType, const ArchitectureDef& a) {
  w.BeginObject();
  w.Key("model_type").String(modelType);
  w.Key("vocab_size").Int(a.vocabSize);
  w.Key("hidden_size").Int(a.hiddenSize);
  w.Key("num_hidden_layers").Int(a.numLayers);
  w.Key("num_attention_heads").Int(a.numHeads);
  w.Key("intermediate_size").Int(IntermediateSize(a));  // 0 means 4 × hidden here, no MLP at all there
}

void LlamaFamilyConfig(JsonWriter& w, const ArchitectureDef& a, const std::string& type) {
  SizedConfig(w, type.c_str(), a);
  // Always written: the config classes' defaults differ (Gemma's head_dim 256 and 16 key/value
  // heads, Qwen3's head_dim 128), and a key left out would build another model.
  w.Key("num_key_value_heads").Int(KeyValueHeads(a));
  w.Key("head_dim").Int(HeadDim(a));
  w.Key("tie_word_embeddings").Bool(a.tieWordEmbeddings);
  // No padding row (Phi-3's config names 32000, Gemma's 0): padding_idx changes no byte, and a
  // smaller vocabulary than the default's row would not build.
  w.Key("pad_token_id").Null();
  // attention_bias where the config class has it; Qwen2's, Mistral's, Mixtral's, Qwen2-MoE's and
  // Phi-3's attentions fix their biases in code.
  const bool biasKey = type != "qwen2" && type != "qwen2_moe" && type != "mistral" && type != "mixtral" && type != "phi3";
  if (biasKey) w.Key("attention_bias").Bool(a.attentionBias);
  if (type == "llama" || type == "granite" || type == "smollm3") w.Key("mlp_bias").Bool(a.mlpBias);
  const bool gemma = type == "gemma" || type == "gemma2" || type == "gemma3_text";
  w.Key(gemma ? "hidden_activation" : "hidden_act").String(ActivationName(a.hiddenAct));
  w.Key("attention_dropout").Double(a.attentionDropout);
  if ((type == "mistral" || type == "mixtral" || type == "phi3") && a.slidingWindow > 0) {
    w.Key("sliding_window").Int(a.slidingWindow);
  }
  if (type == "mixtral") {
    w.Key("num_local_experts").Int(a.numExperts);
    w.Key("num_experts_per_tok").Int(a.expertsPerToken);
  }
  if (type == "qwen2_moe" || type == "qwen3_moe") {
    w.Key("num_experts").Int(a.numExperts);
    w.Key("num_experts_per_tok").Int(a.expertsPerToken);
    w.Key("moe_intermediate_size").Int(ExpertIntermediateSize(a));
    w.Key("norm_topk_prob").Bool(a.normTopkProb);
    w.Key("decoder_sparse_step").Int(1);  // every layer sparse, as the importer reads them
    w.Key("mlp_only_layers").BeginArray().EndArray();
    if (type == "qwen2_moe") w.Key("shared_expert_intermediate_size").Int(a.sharedExpertIntermediateSize);
  }
  if (type == "gemma2" || type == "gemma3_text") {
    NullIfZero(w.Key("attn_logit_softcapping"), a.attentionLogitSoftcap);
    NullIfZero(w.Key("final_logit_softcapping"), a.finalLogitSoftcap);
  }
  if (type == "gemma2" || type == "gemma3_text" || type == "olmo3") {
    w.Key("sliding_window").Int(a.slidingWindow);
    LayerTypes(w.Key("layer_types"), a);
  }
  if (type == "smollm3") w.Key("no_rope_layer_interval").Int(a.noRopeInterval);
  if (type == "phi3" && a.partialRotaryFactor != 1.0) w.Key("partial_rotary_factor").Double(a.partialRotaryFactor);
}

// The config.json of `a`'s model type, with use_cache; returns the model type.
std::string WriteConfig(JsonWriter& w, const ArchitectureDef& a, bool useCache) {
  std::string type;
  switch (a.family) {
    case Family::GPT2:
      type = "gpt2";
      w.BeginObject();
      w.Key("model_type").String(type);
      w.Key("vocab_size").Int(a.vocabSize);
      w.Key("n_embd").Int(a.hiddenSize);
      w.Key("n_layer").Int(a.numLayers);
      w.Key("n_head").Int(a.numHeads);
      w.Key("n_positions").Int(a.maxPositionEmbeddings);
      if (a.intermediateSize > 0) w.Key("n_inner").Int(a.intermediateSize);
      else w.Key("n_inner").Null();
      w.Key("activation_function").String(ActivationName(a.hiddenAct));
      // The simulation's embedding dropout and residual dropouts take one rate (hiddenDropout).
      w.Key("resid_pdrop").Double(a.hiddenDropout);
      w.Key("embd_pdrop").Double(a.hiddenDropout);
      w.Key("attn_pdrop").Double(a.attentionDropout);
      w.Key("tie_word_embeddings").Bool(a.tieWordEmbeddings);
      break;
    case Family::GPTNeoX:
      type = "gpt_neox";
      SizedConfig(w, type.c_str(), a);
      if (a.maxPositionEmbeddings > 0) w.Key("max_position_embeddings").Int(a.maxPositionEmbeddings);
      w.Key("rotary_pct").Double(a.partialRotaryFactor);
      w.Key("use_parallel_residual").Bool(a.parallelResidual);
      w.Key("attention_bias").Bool(a.attentionBias);
      w.Key("tie_word_embeddings").Bool(a.tieWordEmbeddings);
      w.Key("hidden_act").String(ActivationName(a.hiddenAct));
      w.Key("hidden_dropout").Double(a.hiddenDropout);
      w.Key("attention_dropout").Double(a.attentionDropout);
      break;
    case Family::BERT:
      type = "bert";
      SizedConfig(w, type.c_str(), a);
      w.Key("architectures").BeginArray();
      w.String(a.encoderHead == EncoderHead::MaskedLM ? "BertForMaskedLM" : "BertForSequenceClassification");
      w.EndArray();
      w.Key("max_position_embeddings").Int(a.maxPositionEmbeddings);
      w.Key("type_vocab_size").Int(a.typeVocabSize);
      w.Key("hidden_act").String(ActivationName(a.hiddenAct));
      w.Key("hidden_dropout_prob").Double(a.hiddenDropout);
      w.Key("attention_probs_dropout_prob").Double(a.attentionDropout);
      if (a.encoderHead == EncoderHead::Classification) {
        w.Key("id2label").BeginObject();
        for (std::int64_t i = 0; i < a.numLabels; ++i) w.Key(std::to_string(i)).String("LABEL_" + std::to_string(i));
        w.EndObject();
      }
      break;
    case Family::Llama:
      type = LlamaModelType(a);
      LlamaFamilyConfig(w, a, type);
      break;
  }
  w.Key("use_cache").Bool(useCache);
  w.EndObject();
  return type;
}

// The architecture's JSON keys whose values differ between a and b (the page's field names).
std::vector<std::string> DifferingFields(const ArchitectureDef& a, const ArchitectureDef& b) {
  Setup sa, sb;
  sa.model.kind = sb.model.kind = ModelKind::Transformer;
  sa.model.architecture = a;
  sb.model.architecture = b;
  const nlohmann::json ja = nlohmann::json::parse(SetupToJson(sa), nullptr, false);
  const nlohmann::json jb = nlohmann::json::parse(SetupToJson(sb), nullptr, false);
  std::vector<std::string> keys;
  if (ja.is_discarded() || jb.is_discarded()) return keys;
  const auto& xa = ja["model"]["architecture"];
  const auto& xb = jb["model"]["architecture"];
  for (auto it = xa.begin(); it != xa.end(); ++it) {
    if (!xb.contains(it.key()) || xb[it.key()] != it.value()) keys.push_back(it.key());
  }
  return keys;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

}  // namespace

namespace {

// The architecture as the model has it: sizes the simulation defaults when 0 (head size,
// key/value heads, the MLP's and the experts' widths) spelled out, as the config writes them.
ArchitectureDef Spelled(ArchitectureDef a) {
  if (a.family == Family::Llama) {
    a.headDim = HeadDim(a);
    a.numKeyValueHeads = KeyValueHeads(a);
    if (a.numExperts > 0) a.expertIntermediateSize = ExpertIntermediateSize(a);
  }
  a.intermediateSize = IntermediateSize(a);
  return a;
}

}  // namespace

HfConfigExport HfConfigOf(const ArchitectureDef& architecture, bool useCache) {
  HfConfigExport out;
  JsonWriter w(2);
  out.modelType = WriteConfig(w, architecture, useCache);
  out.text = std::move(w.text());
  // What the importer reads back must be the architecture itself: a field the model type has
  // no key for (or fixes in code) would otherwise be measured as something else.
  const ConfigImport back = ImportHfConfig(out.text);
  if (!back.ok() || !(Spelled(back.architecture) == Spelled(architecture)) || back.useCache != useCache) {
    std::vector<std::string> fields =
        back.ok() ? DifferingFields(Spelled(architecture), Spelled(back.architecture)) : std::vector<std::string>{};
    std::string message = "No Hugging Face model type has this architecture as it is";
    if (!fields.empty()) {
      message += ": " + out.modelType + " (the nearest) differs in " + Join(fields);
    } else if (!back.ok()) {
      message += ": " + back.errors.front().message;
    }
    message += ". The measuring script builds the model from a config.json of a model type.";
    out.errors.push_back({ErrorCode::InvalidField, "model.architecture", message});
  }
  return out;
}

namespace {

// The Python script (scripts/measure_cuda.py's run_case and train_steps for one case). Tokens
// @NAME@ are replaced with the setup's values; everything else is fixed text.
constexpr const char* kScript = R"PY(#!/usr/bin/env python3
# Measures on your GPU the training step gpumem @VERSION@ estimated:
#   @TITLE@
#
# The model is built from the config below with random weights (nothing is downloaded) and
# trained for two steps as the estimate simulates them: the batch to the GPU, forward, backward,
# the optimizer step, zero_grad. The script prints PyTorch's peaks beside gpumem's:
# torch.cuda.max_memory_allocated and max_memory_reserved, and the device total nvidia-smi shows
# (NVML, with pynvml installed; memory other processes hold on the GPU is subtracted).
#
# Needs an NVIDIA GPU, PyTorch 2.x and transformers@NEEDS@.
# Usage: python3 @FILE@ [--snapshot FILE.pickle] [--json]
#   --snapshot FILE  also record the allocator's history and dump a memory snapshot; drop it on
#                    gpumem's page ("Compare with a measurement") to see both timelines.
#   --json           print the figures as one JSON object.
import os

# The environment the estimate assumed, set before torch starts CUDA.
@ENVIRONMENT@
import argparse
import json
import sys
import time

HF_CONFIG = json.loads(@CONFIG@)  # the model's config.json
TASK = "@TASK@"
PRECISION = "@PRECISION@"
ATTENTION = "@ATTENTION@"
BATCH, SEQUENCE = @BATCH@, @SEQUENCE@
CHECKPOINTING = @CHECKPOINTING@
USE_REENTRANT = @REENTRANT@
OPTIMIZER = "@OPTIMIZER@"
IMPLEMENTATION = "@IMPLEMENTATION@"
ADAFACTOR_BETA1 = @ADAFACTOR_BETA1@
IN_BACKWARD = @IN_BACKWARD@  # torchtune's optimizer_in_bwd
EMPTY_CACHE_STEPS = @EMPTY_CACHE_STEPS@  # the Trainer's torch_empty_cache_steps (0: never)
ACCUMULATION = @ACCUMULATION@  # micro-batches per optimizer step
ZERO_GRAD_SET_TO_NONE = @SET_TO_NONE@
LORA = json.loads(@LORA@)  # peft.LoraConfig's arguments
# transformers.BitsAndBytesConfig's arguments (quantized base weights), or None; and whether
# peft.prepare_model_for_kbit_training runs (fp32 copies of the other parameters, checkpointing).
QUANTIZATION = json.loads(@QUANTIZATION@)
PREPARE_FOR_KBIT = @PREPARE@
# get_peft_model(autocast_adapter_dtype=True), PEFT's default, keeps the adapters in fp32 on a
# 16-bit model; False leaves them in the model's dtype.
ADAPTERS_IN_FP32 = @ADAPTERS_FP32@
# gpumem's figures for this setup (bytes), and the setup itself.
PREDICTED = json.loads(@PREDICTED@)
SETUP = json.loads(@SETUP@)
GiB = float(1 << 30)


def nvml_used():
    """Bytes NVML counts as used on GPU 0 (what nvidia-smi shows), or None without pynvml."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    except Exception:  # noqa: BLE001 - no pynvml, no NVML: the device figure is left out
        return None


def versions(torch):
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
         "gpu": torch.cuda.get_device_name(0), "totalMemory": torch.cuda.get_device_properties(0).total_memory}
    for name in ("transformers", "peft"):
        try:
            v[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - a missing package is a fact to report
            v[name] = "missing (%s)" % type(e).__name__
    return v


def build_model(torch):
    import transformers
    cfg = dict(HF_CONFIG)
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16Mixed": torch.bfloat16,
             "fp16Mixed": torch.float16, "ampBf16": torch.float32, "ampFp16": torch.float32}[PRECISION]
    cls = {"causalLm": transformers.AutoModelForCausalLM,
           "sequenceClassification": transformers.AutoModelForSequenceClassification,
           "maskedLm": transformers.AutoModelForMaskedLM}[TASK]
    if QUANTIZATION is None:
        # Built on the GPU, its parameters allocated one by one there (random init is fast there).
        with torch.device("cuda"):
            try:
                return cls.from_config(config, dtype=dtype, attn_implementation=ATTENTION)
            except TypeError:  # transformers before 4.56 calls it torch_dtype
                return cls.from_config(config, torch_dtype=dtype, attn_implementation=ATTENTION)
    # Quantized base weights are made as from_pretrained loads a checkpoint (each weight copied to
    # the GPU in the model's dtype and quantized there, as the estimate's init phase has it): a
    # checkpoint of random weights is written first, which takes the unquantized model's size in
    # CPU memory and on disk for a while.
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        try:
            unquantized = cls.from_config(config, dtype=dtype)
        except TypeError:
            unquantized = cls.from_config(config, torch_dtype=dtype)
        unquantized.save_pretrained(folder)
        del unquantized
        loading = {"quantization_config": transformers.BitsAndBytesConfig(**QUANTIZATION),
                   "device_map": {"": 0}, "attn_implementation": ATTENTION}
        try:
            return cls.from_pretrained(folder, dtype=dtype, **loading)
        except TypeError:
            return cls.from_pretrained(folder, torch_dtype=dtype, **loading)


# bitsandbytes' optimizers by gpumem's names (8-bit states; paged states in CUDA unified memory).
BNB_OPTIMIZERS = {"adam8bit": "Adam8bit", "adamw8bit": "AdamW8bit", "pagedAdamw": "PagedAdamW",
                  "pagedAdamw8bit": "PagedAdamW8bit"}


def make_optimizer(torch, params):
    if OPTIMIZER in BNB_OPTIMIZERS:
        import bitsandbytes as bnb
        return getattr(bnb.optim, BNB_OPTIMIZERS[OPTIMIZER])(params, lr=1e-5)
    if OPTIMIZER == "adafactor":
        # The Trainer's optim="adafactor": a fixed learning rate, no parameter scaling.
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=1e-5, scale_parameter=False, relative_step=False, warmup_init=False,
                         beta1=0.9 if ADAFACTOR_BETA1 else None)
    flavour = {"fused": {"fused": True}, "perParameter": {"foreach": False}}.get(IMPLEMENTATION, {"foreach": True})
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(params, lr=1e-3, **flavour)
    if OPTIMIZER == "sgdMomentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flavour)
    if OPTIMIZER == "adam":
        return torch.optim.Adam(params, lr=1e-5, **flavour)
    return torch.optim.AdamW(params, lr=1e-5, **flavour)


def make_batch(torch, step):
    gen = torch.Generator().manual_seed(step)
    vocab = HF_CONFIG["vocab_size"]
    batch = {"input_ids": torch.randint(0, vocab, (BATCH, SEQUENCE), generator=gen),
             "attention_mask": torch.ones((BATCH, SEQUENCE), dtype=torch.long)}
    if TASK == "sequenceClassification":
        batch["token_type_ids"] = torch.zeros((BATCH, SEQUENCE), dtype=torch.long)
        batch["labels"] = torch.randint(0, len(HF_CONFIG.get("id2label", {0: 0, 1: 1})), (BATCH,), generator=gen)
    elif TASK == "maskedLm":
        batch["token_type_ids"] = torch.zeros((BATCH, SEQUENCE), dtype=torch.long)
        batch["labels"] = torch.randint(0, vocab, (BATCH, SEQUENCE), generator=gen)
    else:
        batch["labels"] = torch.randint(0, vocab, (BATCH, SEQUENCE), generator=gen)
    return {k: v.to("cuda") for k, v in batch.items()}


def main():
    parser = argparse.ArgumentParser(description="Measure the training step gpumem estimated.")
    parser.add_argument("--snapshot", metavar="FILE", help="dump a torch.cuda.memory snapshot here")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    baseline = nvml_used()  # what the GPU holds before this process touches it
    import torch
    if not torch.cuda.is_available():
        sys.exit("PyTorch sees no CUDA GPU here.")
    torch.manual_seed(0)
    context = torch.ones(1, device="cuda")  # the CUDA context first, as the estimate counts it
    if args.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    result = {"versions": versions(torch), "phases": []}

    def phase(label, started):
        torch.cuda.synchronize()
        used = nvml_used()
        result["phases"].append({"phase": label, "seconds": round(time.time() - started, 3),
                                 "maxAllocated": torch.cuda.max_memory_allocated(),
                                 "maxReserved": torch.cuda.max_memory_reserved(),
                                 "nvmlUsed": None if used is None or baseline is None else used - baseline})
        torch.cuda.reset_peak_memory_stats()

    started = time.time()
    model = build_model(torch)
    if PREPARE_FOR_KBIT:
        # Its own checkpointing of every block, and the embeddings' output hook for reentrant ones.
        import peft
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": USE_REENTRANT})
    elif CHECKPOINTING:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": USE_REENTRANT})
    if LORA is not None:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **LORA),
                                    autocast_adapter_dtype=ADAPTERS_IN_FP32)
        if CHECKPOINTING and USE_REENTRANT and not PREPARE_FOR_KBIT:
            # Reentrant checkpoints need an input that requires grad (the frozen embeddings' output).
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    mixed = PRECISION in ("bf16Mixed", "fp16Mixed")
    amp = PRECISION in ("ampBf16", "ampFp16")
    amp_dtype = torch.float16 if PRECISION == "ampFp16" else torch.bfloat16
    # Mixed precision: fp32 master copies the optimizer steps, copied back into the 16-bit weights;
    # one optimizer over all of them, or one per tensor for a per-parameter loop.
    masters = [p.detach().float() for p in params] if mixed else None
    if IN_BACKWARD:
        # An optimizer per parameter, stepped and zeroed as soon as its gradient is accumulated
        # (register_post_accumulate_grad_hook, PyTorch 2.1 and later).
        optimizers = []
        for p in params:
            def step_now(tensor, opt=make_optimizer(torch, [p])):
                opt.step()
                opt.zero_grad(set_to_none=True)
            p.register_post_accumulate_grad_hook(step_now)
    elif mixed and IMPLEMENTATION == "perParameter":
        optimizers = [make_optimizer(torch, [m]) for m in masters]
    else:
        optimizers = [make_optimizer(torch, masters if mixed else params)]
    scaler = None
    if PRECISION == "ampFp16":  # torch.amp.GradScaler from PyTorch 2.3, torch.cuda.amp's before
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
    phase("init", started)
    try:
        for step in (1, 2):
            # Gradient accumulation: a micro-batch before the last lets go of its batch and loss
            # once its backward is done; the last keeps them through the step.
            for micro in range(ACCUMULATION):
                started = time.time()
                batch = make_batch(torch, step * 1000 + micro)
                with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
                    loss = model(**batch).loss
                phase("forward:%d" % step, started)
                started = time.time()
                if EMPTY_CACHE_STEPS and (step - 1) % EMPTY_CACHE_STEPS == 0:
                    torch.cuda.empty_cache()  # the Trainer's: after the loss, before the backward
                (scaler.scale(loss) if scaler else loss).backward()
                phase("backward:%d" % step, started)
                if micro < ACCUMULATION - 1:
                    del loss, batch
            started = time.time()
            if mixed:
                # (fp16Mixed as the estimate simulates it: no loss scaling, which allocates nothing.)
                if len(optimizers) == 1:
                    grads32 = [p.grad.float() for p in params]
                    for m, g in zip(masters, grads32):
                        m.grad = g
                    del grads32, g
                    optimizers[0].step()
                    for m in masters:
                        m.grad = None
                else:
                    for m, p, opt in zip(masters, params, optimizers):
                        m.grad = p.grad.float()
                        opt.step()
                        m.grad = None
                with torch.no_grad():
                    for p, m in zip(params, masters):
                        p.copy_(m)
            elif scaler:
                scaler.step(optimizers[0])
                scaler.update()
            elif not IN_BACKWARD:
                optimizers[0].step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=ZERO_GRAD_SET_TO_NONE)
            if mixed:
                model.zero_grad(set_to_none=ZERO_GRAD_SET_TO_NONE)
            del loss, batch
            phase("optimizerStep:%d" % step, started)
    except torch.cuda.OutOfMemoryError as e:
        result["outOfMemory"] = str(e).split("\n")[0][:600]
        phase("out of memory", started)
    result["maxAllocated"] = max(p["maxAllocated"] for p in result["phases"])
    result["maxReserved"] = max(p["maxReserved"] for p in result["phases"])
    used = [p["nvmlUsed"] for p in result["phases"] if p["nvmlUsed"] is not None]
    result["nvmlUsed"] = max(used) if used else None
    result["predicted"] = PREDICTED
    if args.snapshot:
        torch.cuda.memory._dump_snapshot(args.snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
        result["snapshot"] = args.snapshot
    del context
    report(result, args.json)


def report(result, as_json):
    if as_json:
        print(json.dumps(result))
        return
    p = PREDICTED
    v = result["versions"]
    print("%s, torch %s, CUDA %s, transformers %s" % (v["gpu"], v["torch"], v["cuda"], v["transformers"]))
    if abs(v["totalMemory"] - p["capacityBytes"]) > 0.01 * p["capacityBytes"]:
        print("Note: this GPU has %.2f GiB; the estimate was for %.2f GiB (%s)." %
              (v["totalMemory"] / GiB, p["capacityBytes"] / GiB, p["gpu"]))
    print("%-32s %14s %14s %9s" % ("", "measured", "gpumem", "error"))
    rows = (("max_memory_allocated", result["maxAllocated"], p["peakAllocatedBytes"]),
            ("max_memory_reserved", result["maxReserved"], p["peakReservedBytes"]),
            ("nvidia-smi (NVML, this process)", result["nvmlUsed"], p["peakDeviceBytes"]))
    for name, measured, predicted in rows:
        if measured is None:
            print("%-32s %14s %10.2f GiB %9s" % (name, "-", predicted / GiB, ""))
            continue
        error = (predicted - measured) / measured * 100 if measured else 0.0
        print("%-32s %10.2f GiB %10.2f GiB %+8.1f %%" % (name, measured / GiB, predicted / GiB, error))
    if "outOfMemory" in result:
        print("Out of memory (gpumem said: %s): %s" % ("fits" if p["fits"] else "does not fit", result["outOfMemory"]))
    else:
        print("Trained two steps (gpumem said: %s)." % ("fits" if p["fits"] else "does not fit"))
    if result.get("snapshot"):
        print("Snapshot: %s (drop it on gpumem's page, \"Compare with a measurement\")." % result["snapshot"])


if __name__ == "__main__":
    main()
)PY";

void Replace(std::string& text, const std::string& token, const std::string& value) {
  for (std::size_t at = text.find(token); at != std::string::npos; at = text.find(token, at + value.size())) {
    text.replace(at, token.size(), value);
  }
}

// A Python string literal holding `text` (JSON's escapes are Python's too; non-ASCII stays UTF-8).
std::string PythonString(std::string_view text) {
  std::string out;
  JsonWriter::Quote(out, text);
  return out;
}

// The same, as a raw triple-quoted literal a person can read and edit, where the text allows it
// (the config and the predicted figures are numbers, booleans and fixed names).
std::string ReadablePythonString(std::string_view text) {
  const bool plain = text.find("\"\"\"") == std::string_view::npos && text.find('\\') == std::string_view::npos &&
                     (text.empty() || (text.back() != '"' && text.back() != '\\'));
  return plain ? "r\"\"\"" + std::string(text) + "\"\"\"" : PythonString(text);
}

const char* PythonBool(bool v) { return v ? "True" : "False"; }

// The PYTORCH_CUDA_ALLOC_CONF the setup's allocator options make (c10 AllocatorConfig's keys).
std::string AllocatorConf(const AllocatorDef& a) {
  std::vector<std::string> parts;
  if (a.expandableSegments) parts.push_back("expandable_segments:True");
  if (a.maxSplitSizeMiB > 0) parts.push_back("max_split_size_mb:" + std::to_string(a.maxSplitSizeMiB));
  if (a.roundupPower2Divisions > 0) parts.push_back("roundup_power2_divisions:" + std::to_string(a.roundupPower2Divisions));
  if (a.garbageCollectionThreshold > 0) {
    nlohmann::json n = a.garbageCollectionThreshold;
    parts.push_back("garbage_collection_threshold:" + n.dump());
  }
  std::string conf;
  for (std::size_t i = 0; i < parts.size(); ++i) conf += (i ? "," : "") + parts[i];
  return conf;
}

void Refuse(std::vector<FieldError>& errors, const char* field, const std::string& what) {
  errors.push_back({ErrorCode::InvalidField, field,
                    what + " The measuring script does not run it yet (docs/snapshot.md, \"Measure it on your GPU\")."});
}

// What the script runs as the estimate simulates it; the rest is refused by field.
void CheckScriptable(const Setup& s, std::vector<FieldError>& errors) {
  if (s.model.kind != ModelKind::Transformer) {
    errors.push_back({ErrorCode::InvalidField, "model.kind",
                      "The measuring script builds a Hugging Face model from its config: choose a transformer "
                      "(a preset or an imported config.json), not a layer list or a parameter count."});
    return;
  }
  const TrainingDef& t = s.training;
  const FinetuneDef& f = s.finetune;
  if (IsParallel(s.parallel)) Refuse(errors, "parallel", "It measures one GPU.");
  if (t.optimizer == OptimizerKind::Lion) {
    Refuse(errors, "training.optimizer", "Lion comes from lion-pytorch or bitsandbytes by implementation.");
  }
  if (t.checkpointing != Checkpointing::None && t.checkpointing != Checkpointing::EveryBlock) {
    Refuse(errors, "training.checkpointing",
           "It checkpoints every block (gradient_checkpointing_enable) or none; this mode is another framework's.");
  }
  if (t.lossImplementation != LossImplementation::Standard || t.lossInModelDtype) {
    Refuse(errors, "training.lossImplementation", "It computes the model's own loss (Hugging Face's ForCausalLMLoss).");
  }
  const bool mixed = t.precision == Precision::BF16Mixed || t.precision == Precision::FP16Mixed;
  if (t.optimizerInBackward && (mixed || t.precision == Precision::AmpFP16)) {
    Refuse(errors, "training.optimizerInBackward",
           "The optimizer in backward is scripted without master copies or loss scaling (as torchtune runs it).");
  }
  if (t.activationOffloading) Refuse(errors, "training.activationOffloading", "Activation offloading is torchtune's.");
  if (t.packedSequences != PackedSequences::None) Refuse(errors, "training.packedSequences", "Packed sequences need a collator.");
  if (t.maskedSoftmaxFusion) Refuse(errors, "training.maskedSoftmaxFusion", "The fused masked softmax is Megatron's.");
  const FinetuneDef none;
  if (f.quantization != Quantization::None && f.quantLayout == QuantLayout::TorchaoNf4) {
    Refuse(errors, "finetune.quantLayout", "torchao's NF4 is torchtune's recipe (it builds and loads the model its own way).");
  }
  if (f.freezeEmbeddings || f.freezeHead || f.freezeFirstBlocks > 0 || !f.trainOnlyModules.empty()) {
    Refuse(errors, "finetune.freezeFirstBlocks", "Freezing parts of the model by hand is not scripted.");
  }
  if (f.lora && s.model.architecture.family == Family::BERT) {
    Refuse(errors, "finetune.lora", "PEFT's sequence-classification LoRA also trains a copy of the head.");
  }
  if (!f.lora && (f.useDora || f.targetModules != none.targetModules)) {
    Refuse(errors, "finetune.useDora", "Adapter fields without LoRA.");
  }
}

// The PEFT LoraConfig arguments as a JSON object (None without LoRA).
std::string LoraArguments(const Setup& s) {
  const FinetuneDef& f = s.finetune;
  if (!f.lora) return "null";
  nlohmann::json l;
  l["r"] = f.r;
  l["lora_alpha"] = f.loraAlpha;
  l["lora_dropout"] = f.loraDropout;
  // The modules the estimate adapts, named as the estimate resolved them (PEFT's own default
  // mapping could differ for a model type gpumem reads with Llama's defaults).
  if (f.targetModules.size() == 1 && f.targetModules.front() == "all-linear") {
    l["target_modules"] = "all-linear";
  } else if (!f.targetModules.empty()) {
    l["target_modules"] = f.targetModules;
  } else {
    nlohmann::json names = nlohmann::json::array();
    for (const char* n : DefaultTargetModules(s.model.architecture.family)) names.push_back(n);
    l["target_modules"] = names;
  }
  l["use_dora"] = f.useDora;
  return l.dump();
}

// transformers.BitsAndBytesConfig's arguments for the quantized base weights (None without).
std::string QuantizationArguments(const FinetuneDef& f) {
  if (f.quantization == Quantization::None) return "null";
  auto torchName = [](DType t) {
    return t == DType::BF16 ? "bfloat16" : t == DType::FP16 ? "float16" : t == DType::FP32 ? "float32" : "uint8";
  };
  JsonWriter q;
  q.BeginObject();
  if (f.quantization == Quantization::Int8) {
    q.Key("load_in_8bit").Bool(true);
  } else {
    q.Key("load_in_4bit").Bool(true);
    q.Key("bnb_4bit_quant_type").String(f.quantization == Quantization::FP4 ? "fp4" : "nf4");
    q.Key("bnb_4bit_use_double_quant").Bool(f.doubleQuant);
    q.Key("bnb_4bit_compute_dtype").String(torchName(f.computeDType));
    q.Key("bnb_4bit_quant_storage").String(torchName(f.quantStorage));
  }
  q.EndObject();
  return std::move(q.text());
}

std::string Title(const Setup& s, const std::string& modelType) {
  const TrainingDef& t = s.training;
  std::string title = modelType + " (" + FormatCount(s.model.architecture.numLayers) + " layers, hidden " +
                      FormatCount(s.model.architecture.hiddenSize) + "), " + IdOf(t.precision) + ", " +
                      IdOf(t.attention) + ", batch " + FormatCount(t.batchSize) + " x " + FormatCount(t.sequenceLength);
  if (t.checkpointing != Checkpointing::None) title += ", every block checkpointed";
  if (s.finetune.lora) title += s.finetune.useDora ? ", DoRA r " + FormatCount(s.finetune.r) : ", LoRA r " + FormatCount(s.finetune.r);
  if (s.finetune.quantization != Quantization::None) title += std::string(" on ") + IdOf(s.finetune.quantization) + " base weights";
  return title + ", " + IdOf(t.optimizer) + " (" + IdOf(t.optimizerImplementation) + ")";
}

}  // namespace

MeasureScript MeasureScriptFor(const Setup& setup, const Estimate& estimate) {
  MeasureScript out;
  CheckScriptable(setup, out.errors);
  if (!out.ok()) return out;
  const ArchitectureDef& a = setup.model.architecture;
  const HfConfigExport config = HfConfigOf(a, setup.training.useCache);
  if (!config.ok()) {
    out.errors = config.errors;
    return out;
  }
  const TrainingDef& t = setup.training;
  out.modelType = config.modelType;
  out.fileName = "gpumem_measure_" + config.modelType + ".py";
  std::string script = kScript;
  Replace(script, "@VERSION@", Version());
  Replace(script, "@TITLE@", Title(setup, config.modelType));
  std::string needs = setup.finetune.lora || setup.finetune.prepareForKbitTraining ? ", peft (0.12 or later)" : "";
  if (setup.finetune.quantization != Quantization::None || t.optimizer == OptimizerKind::Adam8bit ||
      t.optimizer == OptimizerKind::AdamW8bit || t.optimizer == OptimizerKind::PagedAdamW ||
      t.optimizer == OptimizerKind::PagedAdamW8bit) {
    needs += ", bitsandbytes";
  }
  if (setup.finetune.quantization != Quantization::None) needs += ", accelerate";  // device_map
  Replace(script, "@NEEDS@", needs);
  Replace(script, "@FILE@", out.fileName);
  std::string environment;
  const std::string conf = AllocatorConf(setup.runtime.allocator);
  environment += conf.empty() ? "os.environ.pop(\"PYTORCH_CUDA_ALLOC_CONF\", None)  # PyTorch's defaults\n"
                              : "os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = " + PythonString(conf) + "\n";
  if (!setup.runtime.cublasWorkspaceConfig.empty()) {
    environment += "os.environ[\"CUBLAS_WORKSPACE_CONFIG\"] = " + PythonString(setup.runtime.cublasWorkspaceConfig) + "\n";
  }
  environment += std::string("os.environ[\"CUDA_MODULE_LOADING\"] = ") +
                 (setup.runtime.lazyModuleLoading ? "\"LAZY\"" : "\"EAGER\"");
  Replace(script, "@ENVIRONMENT@", environment);
  Replace(script, "@CONFIG@", ReadablePythonString(config.text));
  const char* task = a.family != Family::BERT                       ? "causalLm"
                     : a.encoderHead == EncoderHead::MaskedLM ? "maskedLm"
                                                              : "sequenceClassification";
  Replace(script, "@TASK@", task);
  Replace(script, "@PRECISION@", IdOf(t.precision));
  Replace(script, "@ATTENTION@", IdOf(t.attention));
  Replace(script, "@BATCH@", std::to_string(t.batchSize));
  Replace(script, "@SEQUENCE@", std::to_string(t.sequenceLength));
  // prepare_model_for_kbit_training checkpoints every block whatever training.checkpointing says.
  Replace(script, "@CHECKPOINTING@",
          PythonBool(t.checkpointing == Checkpointing::EveryBlock || setup.finetune.prepareForKbitTraining));
  Replace(script, "@QUANTIZATION@", PythonString(QuantizationArguments(setup.finetune)));
  Replace(script, "@PREPARE@", PythonBool(setup.finetune.prepareForKbitTraining));
  Replace(script, "@REENTRANT@", PythonBool(t.useReentrant));
  Replace(script, "@OPTIMIZER@", IdOf(t.optimizer));
  Replace(script, "@IMPLEMENTATION@", IdOf(t.optimizerImplementation));
  Replace(script, "@SET_TO_NONE@", PythonBool(t.zeroGradSetToNone));
  Replace(script, "@ADAFACTOR_BETA1@", PythonBool(t.adafactorBeta1));
  Replace(script, "@IN_BACKWARD@", PythonBool(t.optimizerInBackward));
  Replace(script, "@EMPTY_CACHE_STEPS@", std::to_string(t.emptyCacheSteps));
  Replace(script, "@ACCUMULATION@", std::to_string(std::max<std::int64_t>(1, setup.parallel.gradientAccumulationSteps)));
  Replace(script, "@LORA@", PythonString(LoraArguments(setup)));
  Replace(script, "@ADAPTERS_FP32@", PythonBool(setup.finetune.adapterDType == AdapterDType::FP32));
  const DeviceEstimate& d = estimate.device;
  JsonWriter predicted(2);
  predicted.BeginObject();
  predicted.Key("peakAllocatedBytes").Int(d.peakAllocatedBytes);
  predicted.Key("peakReservedBytes").Int(d.peakReservedBytes);
  predicted.Key("peakDeviceBytes").Int(d.peakDeviceBytes);
  predicted.Key("contextBytes").Int(d.contextBytes);
  predicted.Key("capacityBytes").Int(d.capacityBytes);
  predicted.Key("fits").Bool(d.fits);
  const GpuModel* gpu = setup.gpu.id.empty() ? nullptr : FindGpu(setup.gpu.id);
  predicted.Key("gpu").String(gpu != nullptr ? std::string(gpu->label) : HumanBytes(d.capacityBytes) + " GPU");
  predicted.EndObject();
  Replace(script, "@PREDICTED@", ReadablePythonString(predicted.text()));
  Replace(script, "@SETUP@", PythonString(SetupToJson(setup)));
  out.script = std::move(script);
  return out;
}

std::string MeasureScriptJson(std::string_view setupText, int indent) {
  Setup setup;
  std::vector<FieldError> errors = ParseAndValidate(setupText, setup);
  MeasureScript script;
  if (errors.empty()) {
    // The device figures only: no timeline, no words.
    const EstimateResult r = EstimateMemory(setup, {.timeline = EstimateOptions::Timeline::None, .explain = false});
    if (r.ok()) {
      script = MeasureScriptFor(setup, r.estimate);
      errors = script.errors;
    } else {
      errors = r.errors;
    }
  }
  JsonWriter w(indent);
  w.BeginObject();
  w.Key("ok").Bool(errors.empty());
  if (errors.empty()) {
    w.Key("fileName").String(script.fileName);
    w.Key("modelType").String(script.modelType);
    w.Key("script").String(script.script);
  } else {
    w.Key("errors").Raw(ErrorsToJson(errors));
  }
  w.EndObject();
  return std::move(w.text());
}

}  // namespace gpumem
