// Fine-tuning rules for the inventory: frozen parameters, LoRA / DoRA tensors, bitsandbytes
// storage (finetune.hpp lists the sources).
#include "gpumem/finetune.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <unordered_set>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

bool EndsWithComponent(std::string_view path, std::string_view name) {
  if (path == name) return true;
  return path.size() > name.size() && path.ends_with(name) && path[path.size() - name.size() - 1] == '.';
}

// Whether a dotted path contains `name` as whole components ("model.norm" in "model.norm.weight").
bool HasComponents(std::string_view path, std::string_view name) {
  for (std::size_t at = path.find(name); at != std::string_view::npos; at = path.find(name, at + 1)) {
    const bool startOk = at == 0 || path[at - 1] == '.';
    const std::size_t end = at + name.size();
    const bool endOk = end == path.size() || path[end] == '.';
    if (startOk && endOk) return true;
  }
  return false;
}

// The model's output layer and heads outside the base model (what freezeHead means).
bool IsHead(std::string_view name) {
  return name.starts_with("lm_head.") || name.starts_with("classifier.") || name.starts_with("bert.pooler.") ||
         name.starts_with("cls.") || name.starts_with("embed_out.");  // embed_out: GPT-NeoX's head
}

// The output layer: never quantized (transformers get_keys_to_not_convert) nor an "all-linear"
// target (PEFT _maybe_include_all_linear_layers removes the output embedding layer).
bool IsOutputLayer(std::string_view module) {
  return module == OutputModule(Family::Llama) || module == OutputModule(Family::GPTNeoX) || module == "classifier";
}

// A linear module's weight: a 2-D weight that is not an embedding table.
bool IsLinearWeight(const Tensor& p) {
  return p.shape.size() == 2 && p.name.ends_with(".weight") && !IsEmbedding(p.name);
}

std::string_view ModuleOf(std::string_view tensorName) {
  const std::size_t dot = tensorName.rfind('.');
  return dot == std::string_view::npos ? std::string_view{} : tensorName.substr(0, dot);
}

constexpr const char* kLlamaTargets[] = {"q_proj", "v_proj"};
constexpr const char* kGpt2Targets[] = {"c_attn"};
constexpr const char* kBertTargets[] = {"query", "value"};
constexpr const char* kGptNeoXTargets[] = {"query_key_value"};  // PEFT's mapping for gpt_neox

}  // namespace

bool FinetuneActive(const FinetuneDef& f) { return !(f == FinetuneDef{}); }

const char* OutputModule(Family family) { return family == Family::GPTNeoX ? "embed_out" : "lm_head"; }

std::span<const char* const> DefaultTargetModules(Family family) {
  switch (family) {
    case Family::GPT2: return kGpt2Targets;
    case Family::BERT: return kBertTargets;
    case Family::Llama: return kLlamaTargets;
    case Family::GPTNeoX: return kGptNeoXTargets;
  }
  return kLlamaTargets;
}

bool IsLoraTarget(const FinetuneDef& f, Family family, std::string_view module) {
  if (!f.lora) return false;
  // PEFT tuners_utils.check_target_module_exists: the key equals a target or ends with "." + it.
  if (f.targetModules.empty()) {
    for (const char* target : DefaultTargetModules(family)) if (EndsWithComponent(module, target)) return true;
    return false;
  }
  for (const std::string& target : f.targetModules) {
    if (target == "all-linear") {
      if (!IsOutputLayer(module)) return true;
      continue;
    }
    if (EndsWithComponent(module, target)) return true;
  }
  return false;
}

std::int64_t Nf4WeightBytes(std::int64_t elements, bool doubleQuant, std::int64_t storageBytes) {
  // bitsandbytes functional.py quantize_4bit: out = uint8 [(n + 1) // 2, 1] (two 4-bit codes per
  // byte), or quant_storage [(n + 1) // (2 · itemsize), 1]; code = get_4bit_type(quant_type) — a
  // new 16-entry fp32 tensor in every QuantState.
  const std::int64_t packed = (elements + 1) / (2 * storageBytes) * storageBytes;
  const std::int64_t blocks = (elements + kBnb4BitBlockSize - 1) / kBnb4BitBlockSize;
  const std::int64_t code = kBnb4BitCodeEntries * 4;
  if (!doubleQuant) return packed + blocks * 4 + code;  // absmax: fp32 [blocks]
  // compress_statistics: offset = absmax.mean() (an fp32 scalar); qabsmax, state2 =
  // quantize_blockwise(absmax − offset, blocksize=256): uint8 [blocks] and state2.absmax fp32
  // [⌈blocks/256⌉]. state2.code is the dynamic map quantize_blockwise caches once per device
  // (name2qmap["dynamic"]), shared by every weight: not counted per weight.
  const std::int64_t nested = (blocks + kBnbNestedBlockSize - 1) / kBnbNestedBlockSize;
  return packed + blocks + 4 + nested * 4 + code;
}

std::int64_t Int8WeightBytes(std::int64_t rows, std::int64_t cols) { return rows * cols + rows * 4; }

std::int64_t TorchaoNf4ShardedBytes(std::int64_t elements, std::int64_t weightBytes) {
  // torchao/dtypes/nf4tensor.py NF4Tensor.from_tensor: convert_to_norm_float_weight packs two
  // codes a byte (combined_blocks = quantized_blocks[::2] << 4 | quantized_blocks[1::2], uint8);
  // double_quantize_scalers returns quantized_scalers .to(torch.int8), one per block of 64, and
  // quantization_factor, one per 256 scalers in the input's dtype (256 / (2 · scaler_absmax)).
  const std::int64_t scalers = elements / kTorchaoNf4BlockSize;
  return elements / 2 + scalers + scalers / kTorchaoNf4ScalerBlockSize * weightBytes;
}

std::int64_t TorchaoNf4MetadataBytes(std::int64_t weightBytes) {
  // scaler_mean (a 0-d tensor, scalers_1.mean()) and the nf4 lookup table of 16 values, both in
  // the input's dtype; fsdp_pre_all_gather passes them as metadata, not as all-gather inputs.
  return (1 + kTorchaoNf4TableEntries) * weightBytes;
}

namespace {
// Rows of a quantized linear: its output features (GPT-2's Conv1D stores [in, out]).
std::int64_t OutputRows(const Tensor& p) {
  return p.name.starts_with("transformer.h.") ? p.shape.back() : p.shape.front();
}
DType OwnType(Tensor::Storage s, DType fallback) {
  switch (s) {
    case Tensor::Storage::FP32: return DType::FP32;
    case Tensor::Storage::BF16: return DType::BF16;
    case Tensor::Storage::FP16: return DType::FP16;
    default: return fallback;
  }
}
bool Quantized(Tensor::Storage s) {
  return s == Tensor::Storage::NF4 || s == Tensor::Storage::NF4Double || s == Tensor::Storage::Int8 ||
         s == Tensor::Storage::TorchaoNF4;
}
}  // namespace

bool IsEmbedding(std::string_view name) {
  return name.find("embed_tokens") != std::string_view::npos || name.starts_with("transformer.wte") ||
         name.starts_with("transformer.wpe") || name.starts_with("bert.embeddings.") ||
         name.starts_with("gpt_neox.embed_in.");
}

std::int64_t StoredBytes(const Tensor& p, DType regimeWeights) {
  switch (p.storage) {
    case Tensor::Storage::NF4: return Nf4WeightBytes(p.Elements(), false, p.quantStorageBytes);
    case Tensor::Storage::NF4Double: return Nf4WeightBytes(p.Elements(), true, p.quantStorageBytes);
    case Tensor::Storage::Int8: {
      const std::int64_t rows = OutputRows(p);
      return Int8WeightBytes(rows, p.Elements() / std::max<std::int64_t>(1, rows));
    }
    case Tensor::Storage::TorchaoNF4:
      return TorchaoNf4ShardedBytes(p.Elements(), p.quantStorageBytes) + TorchaoNf4MetadataBytes(p.quantStorageBytes);
    default: return p.Elements() * BytesPerElement(OwnType(p.storage, regimeWeights));
  }
}

bool IsQuantized(const Tensor& p) { return Quantized(p.storage); }

std::int64_t StorageElements(const Tensor& p) {
  if (p.storage == Tensor::Storage::NF4 || p.storage == Tensor::Storage::NF4Double) {
    return (p.Elements() + 1) / (2 * p.quantStorageBytes);
  }
  if (p.storage == Tensor::Storage::TorchaoNF4) return TorchaoNf4ShardedBytes(p.Elements(), p.quantStorageBytes);
  return p.Elements();
}

std::int64_t QuantStatisticsBytes(const Tensor& p, DType regimeWeights) {
  if (!Quantized(p.storage)) return 0;
  // TorchaoNF4: StorageElements counts bytes, so what is left is scaler_mean and the nf4 table.
  const std::int64_t element = p.storage == Tensor::Storage::Int8 || p.storage == Tensor::Storage::TorchaoNF4 ? 1 : p.quantStorageBytes;
  return StoredBytes(p, regimeWeights) - StorageElements(p) * element;
}

DType ParameterType(const Tensor& p, DType regimeWeights, DType quantCompute) {
  // LinearNF4.forward dequantizes to the input's dtype (weight.to(input.dtype)); torchtune's
  // input is in the model's dtype, the NF4Tensor's own.
  if (p.storage == Tensor::Storage::TorchaoNF4) return regimeWeights;
  if (Quantized(p.storage)) return quantCompute;
  return OwnType(p.storage, regimeWeights);
}

DType GradientTypeOf(const Tensor& p, DType regimeGradients) { return OwnType(p.storage, regimeGradients); }
DType StateTypeOf(const Tensor& p, DType regimeStates) { return OwnType(p.storage, regimeStates); }
bool HasMasterCopy(const Tensor& p, bool regimeMaster) { return regimeMaster && p.storage == Tensor::Storage::Regime; }

Text StorageFormula(TextStore& text, const Tensor& p, DType regimeWeights) {
  const std::int64_t n = p.Elements();
  switch (p.storage) {
    case Tensor::Storage::NF4:
      return text.Make({"4-bit: ", TextPart::Count(n), " × 0.5 B + fp32 absmax per 64"});
    case Tensor::Storage::NF4Double:
      return text.Make({"4-bit, double quant: ", TextPart::Count(n), " × 0.5 B + uint8 absmax per 64 + fp32 per 256 blocks + code"});
    case Tensor::Storage::Int8:
      return text.Make({"int8: ", TextPart::Count(n), " × 1 B + fp32 scale per row"});
    case Tensor::Storage::TorchaoNF4:
      return text.Make({"torchao NF4Tensor: ", TextPart::Count(n), " × 0.5 B + int8 scaler per 64 + factor per 16,384 + mean + 16-entry table"});
    default:
      return text.Shape(Shape(p.shape), OwnType(p.storage, regimeWeights));
  }
}

std::string FinetuneParameterFormula(const Setup& setup, const Inventory& inventory) {
  const DType weights = [&] {
    switch (setup.training.precision) {
      case Precision::FP16Mixed: return DType::FP16;
      case Precision::BF16Mixed:
      case Precision::BF16: return DType::BF16;
      default: return DType::FP32;
    }
  }();
  std::int64_t quantized = 0, adapters = 0, own32 = 0, regime = 0;
  for (const Tensor& p : inventory.parameters) {
    if (Quantized(p.storage)) quantized += p.Elements();
    else if (p.adapter) adapters += p.Elements();
    else if (p.storage == Tensor::Storage::Regime) regime += p.Elements();
    else own32 += p.Elements();
  }
  std::string out;
  auto add = [&out](std::int64_t n, const std::string& what) {
    if (n == 0) return;
    out += (out.empty() ? "" : " + ") + FormatCount(n) + " " + what;
  };
  const char* q = setup.finetune.quantization == Quantization::Int8 ? "int8 (+ fp32 row scales)"
                  : setup.finetune.quantLayout == QuantLayout::TorchaoNf4 ? "4-bit torchao NF4Tensor (+ int8 scalers per 64)"
                  : setup.finetune.doubleQuant ? "4-bit (+ 8-bit absmax, double quant)"
                                               : "4-bit (+ fp32 absmax per 64)";
  add(quantized, std::string("quantized × ") + q);
  add(regime, std::string("× ") + BytesOf(weights));
  add(own32, "upcast × 4 B (fp32)");
  add(adapters, std::string("adapter values × ") + (setup.finetune.adapterDType == AdapterDType::FP32 ? "4 B (fp32)" : BytesOf(weights)));
  return out;
}

void ApplyFinetune(const Setup& setup, Inventory& inventory) {
  const FinetuneDef& f = setup.finetune;
  if (!FinetuneActive(f) || setup.model.kind != ModelKind::Transformer) return;
  const Family family = setup.model.architecture.family;
  // The dtype the model is built in (bf16 for pure bf16, as torchtune's recipes load it).
  const DType weightDType = setup.training.precision == Precision::FP16Mixed ? DType::FP16
                            : setup.training.precision == Precision::BF16Mixed || setup.training.precision == Precision::BF16
                                ? DType::BF16
                                : DType::FP32;
  const bool sixteenBit = setup.training.precision == Precision::FP16Mixed ||
                          setup.training.precision == Precision::BF16Mixed ||
                          setup.training.precision == Precision::BF16;
  // The linear modules (a module is adapted, weight and bias, only if it is a linear target): a
  // linear weight's module is one by definition; a bias asks this set, made at the first bias
  // (Llama's linears have none, and sorting 405B's 1,137 names cost more than the rest).
  std::unordered_set<std::string_view> linears;
  bool linearsMade = false;
  auto isLinearModule = [&](std::string_view module) {
    if (!linearsMade) {
      for (const Tensor& p : inventory.parameters) if (IsLinearWeight(p)) linears.insert(ModuleOf(p.name));
      linearsMade = true;
    }
    return linears.contains(module);
  };
  std::vector<Tensor> out;
  out.reserve(inventory.parameters.size() * 2);
  // Two passes, so that no tensor is copied: the first decides in place (module names stay views
  // into the names, which `linears` also views, so nothing is renamed or moved yet); the second
  // moves each tensor out and renames the adapted ones (an inventory of 405B's 1,137 tensors is
  // rebuilt for every solver candidate).
  std::vector<std::uint8_t> adaptedAt(inventory.parameters.size(), 0);
  for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
    Tensor& p = inventory.parameters[i];
    const std::string_view module = ModuleOf(p.name);
    // Frozen by the person's choices (requires_grad_(False) on those modules).
    if (f.freezeEmbeddings && IsEmbedding(p.name)) p.trainable = false;
    if (f.freezeHead && IsHead(p.name)) p.trainable = false;
    if (p.layer >= 0 && p.layer < f.freezeFirstBlocks) p.trainable = false;
    if (!f.trainOnlyModules.empty()) {
      bool inside = false;
      for (const std::string& m : f.trainOnlyModules) inside = inside || HasComponents(p.name, m);
      if (!inside) p.trainable = false;
    }
    // get_peft_model and prepare_model_for_kbit_training freeze every base parameter.
    if (f.lora || f.prepareForKbitTraining) p.trainable = false;

    const bool linear = IsLinearWeight(p);
    const bool quantize = f.quantization != Quantization::None && linear && !IsOutputLayer(module);
    if (quantize) {
      p.storage = f.quantization == Quantization::Int8           ? Tensor::Storage::Int8
                  : f.quantLayout == QuantLayout::TorchaoNf4   ? Tensor::Storage::TorchaoNF4
                  : f.doubleQuant                              ? Tensor::Storage::NF4Double
                                                               : Tensor::Storage::NF4;
      p.trainable = false;  // Params4bit / Int8Params: requires_grad=False; torchtune: nn.Parameter(to_nf4(w), requires_grad=False)
      if (p.storage == Tensor::Storage::TorchaoNF4) {
        // to_nf4(self.weight): the NF4Tensor keeps the dtype the model was built in.
        p.quantStorageBytes = static_cast<std::uint8_t>(BytesPerElement(weightDType));
      } else if (f.quantization != Quantization::Int8) {
        p.quantStorageBytes = static_cast<std::uint8_t>(BytesPerElement(f.quantStorage));
      }
    } else if (f.prepareForKbitTraining && sixteenBit) {
      // prepare_model_for_kbit_training: fp16 / bf16 parameters (not Params4bit) → fp32.
      p.storage = Tensor::Storage::FP32;
    }
    adaptedAt[i] = f.lora && (linear || p.name.ends_with(".bias")) && IsLoraTarget(f, family, module) &&
                   (linear || isLinearModule(module));
  }
  for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
    Tensor& p = inventory.parameters[i];
    if (!adaptedAt[i]) {
      out.push_back(std::move(p));
      continue;
    }
    const bool bias = p.name.ends_with(".bias");
    const std::string moduleName(ModuleOf(p.name));
    p.name = moduleName + (bias ? ".base_layer.bias" : ".base_layer.weight");
    const int layer = p.layer;
    out.push_back(std::move(p));
    if (bias) continue;
    const std::vector<std::int64_t>& shape = out.back().shape;
    // LoraLayer.update_layer: lora_A = nn.Linear(in, r), lora_B = nn.Linear(r, out), no biases.
    const bool conv1d = family == Family::GPT2 && moduleName.starts_with("transformer.h.");
    const std::int64_t in = conv1d ? shape[0] : shape[1], outFeatures = conv1d ? shape[1] : shape[0];
    const Tensor::Storage own = f.adapterDType == AdapterDType::FP32 ? Tensor::Storage::FP32 : Tensor::Storage::Regime;
    out.push_back({moduleName + ".lora_A.default.weight", {f.r, in}, true, layer, own, true});
    out.push_back({moduleName + ".lora_B.default.weight", {outFeatures, f.r}, true, layer, own, true});
    if (f.useDora) {
      // DoraLinearLayer.weight: the magnitude, one value per output feature (the weight norm).
      out.push_back({moduleName + ".lora_magnitude_vector.default.weight", {outFeatures}, true, layer, own, true});
    }
  }
  inventory.parameters = std::move(out);
}

namespace {
// Linears of a block with an adapter: the 7 dense ones and the lm_head's share (8, an upper bound
// whatever the targets), and an expert's w1, w2 or w3 only when a target names it (PEFT's suffix
// match, IsLoraTarget), so that LoRA on the attention of a mixture of 128 experts is not counted
// as 392 adapters a block.
double AdaptedLinearsPerBlock(const Setup& setup) {
  const FinetuneDef& f = setup.finetune;
  if (!f.lora) return 0;
  const ArchitectureDef& a = setup.model.architecture;
  double adaptedPerExpert = 0;
  if (a.numExperts > 0) {
    for (const char* w : kExpertProjections) {
      if (IsLoraTarget(f, a.family, std::string("model.layers.0.") + kExpertsModule + "0." + w)) ++adaptedPerExpert;
    }
  }
  return 8 + adaptedPerExpert * double(std::max<std::int64_t>(0, a.numExperts));
}
}  // namespace

bool ExpertWeightsTrain(const FinetuneDef& f) { return !f.lora && f.quantization == Quantization::None; }

double AdapterTensorsPerBlock(const Setup& setup) {
  return AdaptedLinearsPerBlock(setup) * (setup.finetune.useDora ? 3 : 2);
}

double FinetuneEventsPerBlock(const Setup& setup) {
  const FinetuneDef& f = setup.finetune;
  if (!FinetuneActive(f)) return 0;
  // Per linear of a block (at most 7 dense, or 3 per expert), counted with its backward and
  // margin: the quantized path (casts, the dequantized weight, the clone) up to 14 events, LoRA
  // up to 50 (under autocast its A and B are cast too: 48 measured on an expert's w1, w2, w3 with
  // every block checkpointed), DoRA up to 95 (150 where blocks are recomputed); × 2 for
  // recomputation under checkpointing. The adapters' optimizer work is counted per tensor with the
  // others' (AdapterTensorsPerBlock). An upper bound, checked by tests/finetune_test.cpp ("The
  // work budget bounds fine-tuning setups") and docs/budget.md's sweep.
  const ArchitectureDef& a = setup.model.architecture;
  const double experts = double(std::max<std::int64_t>(0, a.numExperts));
  const double linears = 8 + 3 * experts;
  // torchao's NF4Tensor dequantizes through get_original_weight's locals: up to 34 events more.
  const double quantized = f.quantLayout == QuantLayout::TorchaoNf4 ? 48 : 14;
  const double perQuantized = f.quantization != Quantization::None ? quantized : 0;
  // DoRA's forward is the heavy part (the weight's norm, its casts under autocast), done again by
  // a recompute: 276 events per adapted expert linear measured with every block checkpointed
  // under autocast, 91 without checkpointing. (prepare_model_for_kbit_training's checkpointing
  // is already in setup.training here: PredictEventsOf sets it.)
  const bool recomputes = setup.training.checkpointing != Checkpointing::None &&
                          setup.training.checkpointing != Checkpointing::Selective;
  const double perDora = recomputes ? 150 : 95;
  const double perAdapted = f.lora ? (f.useDora ? perDora : 50) : 0;
  // Loading (sim/loading.cpp), once per weight: bitsandbytes up to 7 events; torchao's to_nf4
  // twice (construction and load_state_dict), about 60 events each with at most two chunks
  // written out, so 130; prepare_model_for_kbit_training 3 per upcast parameter (a block's norms).
  const double loading = f.quantization == Quantization::None ? 0 : f.quantLayout == QuantLayout::TorchaoNf4 ? 130 : 8;
  return 2 * (linears * perQuantized + AdaptedLinearsPerBlock(setup) * perAdapted) + linears * loading +
         (f.prepareForKbitTraining ? 8 : 0);
}

namespace {
// torchtune's QLoRA (torchao NF4Tensor): what it runs, and what is refused as not simulated.
void ValidateTorchaoNf4(const Setup& setup, std::vector<FieldError>& errors) {
  const FinetuneDef& f = setup.finetune;
  auto fail = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, field, std::move(message)});
  };
  if (f.quantization != Quantization::NF4) {
    fail("finetune.quantLayout", "torchao's NF4Tensor holds NF4 weights only: set the quantization to nf4, or the "
                                 "layout to bitsandbytes.");
    return;
  }
  if (f.doubleQuant) {
    fail("finetune.doubleQuant", "torchao's NF4Tensor always quantizes its scalers (int8 per 64 values, a factor per 256 "
                                 "scalers); bnb_4bit_use_double_quant is bitsandbytes': leave it off.");
  }
  if (f.quantStorage != DType::UInt8) {
    fail("finetune.quantStorage", "bnb_4bit_quant_storage is bitsandbytes'; torchao packs its codes in uint8: keep uint8.");
  }
  const Precision precision = setup.training.precision;
  if (precision != Precision::BF16 && precision != Precision::FP32) {
    fail("finetune.quantLayout", "torchtune's QLoRA keeps the whole model in one dtype (dtype: bf16, or fp32): mixed "
                                 "precision and autocast are not simulated with torchao's NF4Tensor.");
  } else if (f.computeDType != (precision == Precision::BF16 ? DType::BF16 : DType::FP32)) {
    // LinearNF4.forward: weight.to(input.dtype), the model's dtype.
    fail("finetune.computeDType", std::string("torchao's LinearNF4 dequantizes to the input's dtype, the model's: set the "
                                              "compute dtype to ") + (precision == Precision::BF16 ? "bf16." : "fp32."));
  }
  if (f.useDora) fail("finetune.useDora", "DoRA over torchao's NF4Tensor is not simulated yet: turn useDora off.");
  if (f.prepareForKbitTraining) {
    fail("finetune.prepareForKbitTraining", "prepare_model_for_kbit_training is PEFT's; torchtune's QLoRA does not run "
                                            "it: turn it off with the torchao layout.");
  }
  if (setup.model.architecture.family != Family::Llama) {
    fail("finetune.quantLayout", "torchtune's QLoRA models (qlora_llama2 / qlora_llama3 …) are Llama-family: choose the "
                                 "Llama family, or the bitsandbytes layout.");
  }
}
}  // namespace

void ValidateFinetune(const Setup& setup, std::vector<FieldError>& errors, bool modelValid) {
  const FinetuneDef& f = setup.finetune;
  if (!FinetuneActive(f)) return;
  auto fail = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, field, std::move(message)});
  };
  if (setup.model.kind != ModelKind::Transformer) {
    fail("finetune", "Fine-tuning (frozen parameters, LoRA, quantized weights) is simulated for transformer "
                     "architectures; choose model kind transformer or leave the fine-tuning section at its defaults.");
    return;
  }
  const ArchitectureDef& a = setup.model.architecture;
  if (f.freezeFirstBlocks < 0 || f.freezeFirstBlocks > a.numLayers) {
    fail("finetune.freezeFirstBlocks", "Frozen first blocks must be between 0 and the number of blocks (" +
                                           FormatCount(a.numLayers) + ").");
  }
  if (f.trainOnlyModules.size() > 64) fail("finetune.trainOnlyModules", "At most 64 module names.");
  for (const std::string& m : f.trainOnlyModules) {
    if (m.empty() || m.size() > 120) fail("finetune.trainOnlyModules", "Module names must be 1 to 120 characters.");
  }
  if (f.lora) {
    if (f.r < 1 || f.r > 65536) fail("finetune.r", "The LoRA rank r must be a whole number from 1 to 65536.");
    if (!std::isfinite(f.loraAlpha) || f.loraAlpha <= 0 || f.loraAlpha > 1e6) {
      fail("finetune.loraAlpha", "lora_alpha must be a positive number (at most 1e6).");
    }
    if (!std::isfinite(f.loraDropout) || f.loraDropout < 0 || f.loraDropout >= 1) {
      fail("finetune.loraDropout", "lora_dropout must be in [0, 1).");
    }
    if (f.targetModules.size() > 64) fail("finetune.targetModules", "At most 64 target modules.");
    for (const std::string& m : f.targetModules) {
      if (m.empty() || m.size() > 120) {
        fail("finetune.targetModules", "Target module names must be 1 to 120 characters.");
      } else if (m == "embed_tokens" || m == "wte" || m == "word_embeddings") {
        fail("finetune.targetModules", "LoRA on embeddings (lora_embedding_A/B) is not simulated yet; target linear modules.");
      } else if (m == "lm_head" && a.tieWordEmbeddings) {
        fail("finetune.targetModules", "lm_head is tied to the token embedding in this architecture; it is no separate linear to adapt.");
      }
    }
  } else if (f.useDora || !f.targetModules.empty()) {
    fail("finetune.lora", "Adapter settings (targetModules, useDora) need lora switched on.");
  }
  if (f.quantStorage != DType::UInt8 && f.quantStorage != DType::BF16 && f.quantStorage != DType::FP16 &&
      f.quantStorage != DType::FP32) {
    fail("finetune.quantStorage", "bnb_4bit_quant_storage must be uint8, bf16, fp16 or fp32.");
  } else if (f.quantStorage != DType::UInt8 && f.quantization != Quantization::NF4 && f.quantization != Quantization::FP4) {
    fail("finetune.quantStorage", "bnb_4bit_quant_storage applies to 4-bit weights (load_in_4bit): keep uint8.");
  }
  if (f.quantization == Quantization::None) {
    if (f.doubleQuant) fail("finetune.doubleQuant", "Double quantization needs 4-bit weights (load_in_4bit).");
  } else {
    if (f.doubleQuant && f.quantization == Quantization::Int8) {
      fail("finetune.doubleQuant", "Double quantization applies to 4-bit weights, not load_in_8bit.");
    }
    if (f.computeDType != DType::FP32 && f.computeDType != DType::BF16 && f.computeDType != DType::FP16) {
      fail("finetune.computeDType", "The compute dtype must be fp32, bf16 or fp16.");
    }
    if (!f.lora && !f.prepareForKbitTraining) {
      fail("finetune.quantization", "Quantized weights cannot be trained (bitsandbytes keeps them frozen): add LoRA "
                                    "adapters, or freeze the model with prepareForKbitTraining.");
    }
  }
  if (f.quantLayout == QuantLayout::TorchaoNf4) ValidateTorchaoNf4(setup, errors);
  // What the inventory then holds: every target must name a linear the model has, and something
  // must train (torch.optim refuses an empty parameter list). Only for an architecture that
  // passed validation (the inventory is built here).
  if (modelValid && errors.empty()) {
    const std::shared_ptr<const Inventory> shared = SharedInventory(setup);
    const Inventory& inv = *shared;
    bool adapters = false;
    for (const Tensor& p : inv.parameters) adapters = adapters || p.adapter;
    // torchao NF4Tensor.from_tensor asserts numel % block_size (64) == 0 and
    // double_quantize_scalers that the scalers divide by scaler_block_size (256): n % 16,384.
    for (const Tensor& p : inv.parameters) {
      if (p.storage != Tensor::Storage::TorchaoNF4 || p.Elements() % (kTorchaoNf4BlockSize * kTorchaoNf4ScalerBlockSize) == 0) continue;
      fail("finetune.quantLayout", "torchao's to_nf4 needs every quantized weight to hold a multiple of 16,384 values "
                                   "(64 per block, 256 scalers per factor): " + p.name + " has " + FormatCount(p.Elements()) + ".");
      break;
    }
    // FSDP2 fully_shard chunks every parameter on dim 0 (_fsdp_param.py _init_sharded_param:
    // _chunk_with_empty → torch.chunk → aten.split), and torchao's nf4_split cuts each inner
    // tensor (quantized_scalers, quantization_factor, quantized_data) into size(0) // split_size
    // equal parts, asserting numel % chunks == 0: with rows not divisible by the ranks fewer chunks
    // come out than ranks. Simulated where every quantized weight splits evenly.
    const std::int64_t ranks = setup.parallel.dataParallel * setup.parallel.contextParallel;
    if (setup.parallel.fsdp == FsdpMode::FullyShard && ranks > 1) {
      for (const Tensor& p : inv.parameters) {
        if (p.storage != Tensor::Storage::TorchaoNF4 || p.shape.empty()) continue;
        const std::int64_t factors = p.Elements() / (kTorchaoNf4BlockSize * kTorchaoNf4ScalerBlockSize);
        if (p.shape[0] % ranks == 0 && factors % ranks == 0) continue;
        fail("parallel.dataParallel", "torchao's NF4Tensor is sharded by FSDP2 only in equal parts (nf4_split): " + p.name +
                                          " (" + FormatCount(p.shape[0]) + " rows, " + FormatCount(factors) +
                                          " quantization factors) does not split evenly over " + FormatCount(ranks) + " ranks.");
        break;
      }
    }
    if (f.lora && !adapters) {
      fail("finetune.targetModules", "No linear module of this model matches the target modules (names as "
                                     "Hugging Face writes them: q_proj, v_proj, c_attn, query, all-linear …).");
    } else if (inv.TrainableCount() == 0) {
      fail("finetune", "Every parameter is frozen: nothing would train (torch.optim refuses an empty parameter list).");
    }
  }
  if (f.prepareForKbitTraining && !f.lora) {
    fail("finetune.prepareForKbitTraining", "prepare_model_for_kbit_training freezes every base parameter: add LoRA "
                                            "adapters so that something trains.");
  }
}

namespace {
constexpr Named<Quantization> kQuantizations[] = {
    {Quantization::None, "none", "none (weights in the precision's dtype)"},
    {Quantization::NF4, "nf4", "4-bit NF4 (load_in_4bit, QLoRA)"},
    {Quantization::FP4, "fp4", "4-bit FP4 (load_in_4bit, bnb_4bit_quant_type=fp4)"},
    {Quantization::Int8, "int8", "8-bit LLM.int8() (load_in_8bit)"},
};
constexpr Named<AdapterDType> kAdapterDTypes[] = {
    {AdapterDType::FP32, "fp32", "fp32 (PEFT's default: autocast_adapter_dtype=True)"},
    {AdapterDType::Weights, "weights", "the base weights' dtype (autocast_adapter_dtype=False)"},
};
constexpr Named<QuantLayout> kQuantLayouts[] = {
    {QuantLayout::Bitsandbytes, "bitsandbytes", "bitsandbytes Params4bit (transformers / PEFT QLoRA)"},
    {QuantLayout::TorchaoNf4, "torchaoNf4", "torchao NF4Tensor (torchtune's QLoRA)"},
};
}  // namespace

std::span<const Named<Quantization>> NamesOf(Quantization) { return kQuantizations; }
std::span<const Named<AdapterDType>> NamesOf(AdapterDType) { return kAdapterDTypes; }
std::span<const Named<QuantLayout>> NamesOf(QuantLayout) { return kQuantLayouts; }

}  // namespace gpumem
