// The one table of enum identifiers (JSON, URLs) and labels (what people read).
#include "gpumem/names.hpp"

#include "gpumem/dtype.hpp"
#include "gpumem/error.hpp"

namespace gpumem {
namespace {

constexpr Named<ModelKind> kModelKinds[] = {
    {ModelKind::ParameterCount, "parameterCount", "Parameter count (quick, heuristic activations)"},
    {ModelKind::LayerList, "layers", "Layer list (exact)"},
    {ModelKind::Transformer, "transformer", "Transformer architecture (exact)"},
};
constexpr Named<Family> kFamilies[] = {
    {Family::GPT2, "gpt2", "GPT-2"},
    {Family::Llama, "llama", "Llama / Mistral / Qwen / Gemma / Phi-3 / Mixtral"},
    {Family::BERT, "bert", "BERT (encoder)"},
    {Family::GPTNeoX, "gptNeox", "GPT-NeoX / Pythia"},
};
constexpr Named<HiddenAct> kHiddenActs[] = {
    {HiddenAct::GELU, "gelu", "GELU (erf)"},
    {HiddenAct::GELUTanh, "geluTanh", "GELU (tanh approximation, one kernel)"},
    {HiddenAct::GELUNew, "geluNew", "GELU new (tanh formula as separate ops, GPT-2)"},
    {HiddenAct::SiLU, "silu", "SiLU (SwiGLU MLP)"},
};
constexpr Named<EncoderHead> kEncoderHeads[] = {
    {EncoderHead::Classification, "classification", "Sequence classification (pooler + classifier)"},
    {EncoderHead::MaskedLM, "maskedLm", "Masked language modelling"},
};
constexpr Named<AttentionImplementation> kAttentions[] = {
    {AttentionImplementation::Eager, "eager", "eager (scores materialised)"},
    {AttentionImplementation::SDPA, "sdpa", "fused SDPA / flash"},
};
// Checkpointing can RAISE the peak, and PyTorch does the same (docs/validation.md, "Checkpointing
// can raise the peak"; tests/property_test.cpp kKnownViolations): the labels say so where the
// option is offered. Selective with SDPA under autocast keeps the core's inputs q, k in fp32
// (RoPE promotes them) where the kernel alone keeps bf16 copies (llama-ampbf16-sdpa-selective);
// a peak at layer 0's backward sees that block recomputed plus its checkpoint input and an
// out-of-place input gradient (moe8-v256-sgd-every).
constexpr Named<Checkpointing> kCheckpointings[] = {
    {Checkpointing::None, "none", "none"},
    {Checkpointing::EveryBlock, "everyBlock", "every block (a peak at layer 0's backward can rise)"},
    {Checkpointing::EveryKthBlock, "everyKthBlock", "every k-th block (a peak at layer 0's backward can rise)"},
    {Checkpointing::Selective, "selective",
     "selective (attention core; with SDPA under autocast it keeps q, k in fp32 and can cost more)"},
    {Checkpointing::SelectiveOp, "selectiveOp",
     "op-level selective (torchtitan: every block, the outputs of every other matmul and of SDPA kept)"},
};
constexpr Named<LayerKind> kLayerKinds[] = {
    {LayerKind::Embedding, "embedding", "Embedding"}, {LayerKind::Linear, "linear", "Linear"},
    {LayerKind::ReLU, "relu", "ReLU"},                {LayerKind::GELU, "gelu", "GELU"},
    {LayerKind::Tanh, "tanh", "Tanh"},                {LayerKind::Sigmoid, "sigmoid", "Sigmoid"},
    {LayerKind::Dropout, "dropout", "Dropout"},
};
constexpr Named<LossKind> kLosses[] = {
    {LossKind::CrossEntropy, "crossEntropy", "Cross-entropy"},
    {LossKind::MSE, "mse", "Mean squared error"},
};
constexpr Named<Precision> kPrecisions[] = {
    {Precision::FP32, "fp32", "fp32"},
    {Precision::FP16Mixed, "fp16Mixed", "fp16 mixed precision (fp32 master weights)"},
    {Precision::BF16Mixed, "bf16Mixed", "bf16 mixed precision (fp32 master weights)"},
    {Precision::BF16, "bf16", "pure bf16"},
    {Precision::AmpBF16, "ampBf16", "autocast bf16 (fp32 weights)"},
    {Precision::AmpFP16, "ampFp16", "autocast fp16 with loss scaling (fp32 weights)"},
};
constexpr Named<OptimizerKind> kOptimizers[] = {
    {OptimizerKind::SGD, "sgd", "SGD"},
    {OptimizerKind::SGDMomentum, "sgdMomentum", "SGD with momentum"},
    {OptimizerKind::Adam, "adam", "Adam"},
    {OptimizerKind::AdamW, "adamw", "AdamW"},
    {OptimizerKind::Adafactor, "adafactor", "Adafactor"},
    {OptimizerKind::Adam8bit, "adam8bit", "Adam 8-bit (bitsandbytes Adam8bit)"},
    {OptimizerKind::AdamW8bit, "adamw8bit", "AdamW 8-bit (bitsandbytes AdamW8bit, adamw_bnb_8bit)"},
    {OptimizerKind::PagedAdamW, "pagedAdamw", "paged AdamW 32-bit (bitsandbytes PagedAdamW, paged_adamw_32bit)"},
    {OptimizerKind::PagedAdamW8bit, "pagedAdamw8bit", "paged AdamW 8-bit (bitsandbytes PagedAdamW8bit, paged_adamw_8bit)"},
    {OptimizerKind::Lion, "lion", "Lion (lion-pytorch; fused: bitsandbytes Lion)"},
};
constexpr Named<LossImplementation> kLossImplementations[] = {
    {LossImplementation::Standard, "standard", "full logits (Hugging Face ForCausalLMLoss)"},
    {LossImplementation::Chunked, "chunked",
     "chunked output and cross-entropy (torchtune CEWithChunkedOutputLoss, num_output_chunks)"},
    {LossImplementation::FusedLinearCrossEntropy, "fusedLinearCrossEntropy",
     "fused linear + cross-entropy (Liger LigerFusedLinearCrossEntropyLoss, use_liger_kernel)"},
    {LossImplementation::MegatronVocabParallel, "megatronVocabParallel",
     "Megatron's vocab-parallel cross-entropy (tensor_parallel.vocab_parallel_cross_entropy, in place)"},
};
constexpr Named<PackedSequences> kPackedSequences[] = {
    {PackedSequences::None, "none", "one sequence per row (no packing)"},
    {PackedSequences::BlockCausalMask, "blockCausalMask",
     "packed, 4D block-causal mask (transformers masking_utils from position_ids; SDPA runs its memory-efficient kernel)"},
    {PackedSequences::FlashVarlen, "flashVarlen",
     "packed, flash-attention varlen (attn_implementation=flash_attention_2 with DataCollatorWithFlattening)"},
};
constexpr Named<OptimizerImplementation> kImplementations[] = {
    {OptimizerImplementation::ForEach, "forEach", "foreach (multi-tensor, PyTorch default)"},
    {OptimizerImplementation::PerParameter, "perParameter", "per parameter (for-loop)"},
    {OptimizerImplementation::Fused, "fused", "fused kernel"},
};
constexpr Named<Phase> kPhases[] = {
    {Phase::Init, "init", "Model init"},
    {Phase::Forward, "forward", "Forward"},
    {Phase::Backward, "backward", "Backward"},
    {Phase::OptimizerStep, "optimizerStep", "Optimizer step"},
};
constexpr Named<Category> kCategories[] = {
    {Category::Parameters, "parameters", "Parameters"},
    {Category::MasterWeights, "masterWeights", "fp32 master weights"},
    {Category::Gradients, "gradients", "Gradients"},
    {Category::OptimizerStates, "optimizerStates", "Optimizer states"},
    {Category::OptimizerIntermediates, "optimizerIntermediates", "Optimizer intermediates"},
    {Category::Activations, "activations", "Activations"},
    {Category::ActivationGradients, "activationGradients", "Activation gradients"},
    {Category::InputBatch, "inputBatch", "Input batch"},
    {Category::WeightCopies, "weightCopies", "16-bit weight copies (autocast)"},
};
static_assert(std::size(kCategories) == kCategoryCount);

}  // namespace

std::span<const Named<ModelKind>> NamesOf(ModelKind) { return kModelKinds; }
std::span<const Named<LayerKind>> NamesOf(LayerKind) { return kLayerKinds; }
std::span<const Named<LossKind>> NamesOf(LossKind) { return kLosses; }
std::span<const Named<Precision>> NamesOf(Precision) { return kPrecisions; }
std::span<const Named<OptimizerKind>> NamesOf(OptimizerKind) { return kOptimizers; }
std::span<const Named<OptimizerImplementation>> NamesOf(OptimizerImplementation) {
  return kImplementations;
}
std::span<const Named<Phase>> NamesOf(Phase) { return kPhases; }
std::span<const Named<LossImplementation>> NamesOf(LossImplementation) { return kLossImplementations; }
std::span<const Named<Family>> NamesOf(Family) { return kFamilies; }
std::span<const Named<HiddenAct>> NamesOf(HiddenAct) { return kHiddenActs; }
std::span<const Named<EncoderHead>> NamesOf(EncoderHead) { return kEncoderHeads; }
std::span<const Named<AttentionImplementation>> NamesOf(AttentionImplementation) { return kAttentions; }
std::span<const Named<Checkpointing>> NamesOf(Checkpointing) { return kCheckpointings; }
std::span<const Named<PackedSequences>> NamesOf(PackedSequences) { return kPackedSequences; }
std::span<const Named<Category>> NamesOf(Category) { return kCategories; }

const char* DTypeId(DType type) {
  switch (type) {
    case DType::FP32: return "fp32";
    case DType::FP16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
  }
  return "";
}

const char* ErrorCodeId(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidField: return "invalidField";
    case ErrorCode::MissingField: return "missingField";
    case ErrorCode::UnknownField: return "unknownField";
    case ErrorCode::MalformedJson: return "malformedJson";
    case ErrorCode::TooLarge: return "tooLarge";
    case ErrorCode::TooManyErrors: return "tooManyErrors";
  }
  return "";
}

}  // namespace gpumem
