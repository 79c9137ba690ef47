// Defaults (typed once, here) and validation of a Setup.
#include "gpumem/setup.hpp"
#include "gpumem/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "device/device_stage.hpp"
#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/gpus.hpp"
#include "gpumem/heuristics.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/names.hpp"

namespace gpumem {
namespace {

std::vector<LayerDef> MlpLayers() {
  return {LinearLayer(240000, 1024), ActivationLayer(LayerKind::ReLU), LinearLayer(1024, 512),
          ActivationLayer(LayerKind::ReLU), LinearLayer(512, 240000)};
}

std::string LayerPath(std::size_t i) { return "model.layers[" + std::to_string(i) + "]"; }

// Appends an error when `value` is outside [1, max].
void CheckCount(ErrorList& errors, const std::string& field, std::int64_t value,
                std::int64_t max, const char* what) {
  if (value < 1) {
    errors.push_back({ErrorCode::InvalidField, field,
                      std::string(what) + " must be at least 1 (got " + std::to_string(value) + ")."});
  } else if (value > max) {
    errors.push_back({ErrorCode::InvalidField, field,
                      std::string(what) + " must be at most " + FormatCount(max) + " (got " +
                          FormatCount(value) + ")."});
  }
}

void ValidateLayers(const ModelDef& model, ErrorList& errors) {
  const auto& layers = model.layers;
  if (layers.empty()) {
    errors.push_back({ErrorCode::InvalidField, "model.layers",
                      "A layer-list model needs at least one layer."});
    return;
  }
  if (static_cast<std::int64_t>(layers.size()) > Limits::maxLayers) {
    errors.push_back({ErrorCode::InvalidField, "model.layers",
                      "At most " + FormatCount(Limits::maxLayers) + " layers are supported."});
    return;
  }
  std::int64_t width = 0;  // features flowing into the current layer; 0 = not fixed yet
  double parameters = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerDef& layer = layers[i];
    const std::string path = LayerPath(i);
    parameters += LayerParameterCount(layer);
    switch (layer.kind) {
      case LayerKind::Embedding:
        if (i != 0) {
          errors.push_back({ErrorCode::InvalidField, path + ".type",
                            "An embedding takes token ids, so it can only be the first layer."});
        }
        CheckCount(errors, path + ".numEmbeddings", layer.numEmbeddings, Limits::maxFeatures,
                   "The number of embeddings");
        CheckCount(errors, path + ".embeddingDim", layer.embeddingDim, Limits::maxFeatures,
                   "The embedding width");
        width = layer.embeddingDim;
        break;
      case LayerKind::Linear:
        CheckCount(errors, path + ".inFeatures", layer.inFeatures, Limits::maxFeatures,
                   "Input features");
        CheckCount(errors, path + ".outFeatures", layer.outFeatures, Limits::maxFeatures,
                   "Output features");
        if (width > 0 && layer.inFeatures != width) {
          errors.push_back({ErrorCode::InvalidField, path + ".inFeatures",
                            "Input features must equal the width flowing in: " +
                                FormatCount(width) + " (from " + LayerPath(i - 1) + "), got " +
                                FormatCount(layer.inFeatures) + "."});
        }
        width = layer.outFeatures;
        break;
      case LayerKind::Dropout:
        if (!std::isfinite(layer.dropoutProbability) || layer.dropoutProbability < 0.0 ||
            layer.dropoutProbability >= 1.0) {
          errors.push_back({ErrorCode::InvalidField, path + ".p",
                            "Dropout probability must be in [0, 1)."});
        }
        [[fallthrough]];
      case LayerKind::ReLU:
      case LayerKind::GELU:
      case LayerKind::Tanh:
      case LayerKind::Sigmoid:
        if (width == 0 && i == 0) {
          errors.push_back({ErrorCode::InvalidField, path + ".type",
                            "The first layer must be linear or embedding: it fixes the input width."});
        }
        break;
    }
  }
  if (parameters > static_cast<double>(Limits::maxParameterCount)) {
    errors.push_back({ErrorCode::TooLarge, "model.layers",
                      "The layers hold about " + FormatScientific(parameters) +
                          " parameters, more than the supported 1e14."});
  }
}

// Appends an error when `value` is outside [min, max] (min may be 0 for "derive it").
void CheckRange(ErrorList& errors, const std::string& field, std::int64_t value,
                std::int64_t min, std::int64_t max, const char* what) {
  if (value < min || value > max) {
    errors.push_back({ErrorCode::InvalidField, field,
                      std::string(what) + " must be between " + FormatCount(min) + " and " +
                          FormatCount(max) + " (got " + FormatCount(value) + ")."});
  }
}

void CheckProbability(ErrorList& errors, const std::string& field, double p) {
  if (!std::isfinite(p) || p < 0.0 || p >= 1.0) {
    errors.push_back({ErrorCode::InvalidField, field, "A dropout probability must be in [0, 1)."});
  }
}

// Bounds that keep every tensor's element count far inside int64 and the inventory small.
constexpr std::int64_t kMaxHidden = 1'000'000;
constexpr std::int64_t kMaxVocab = 100'000'000;
constexpr std::int64_t kMaxIntermediate = 10'000'000;
constexpr std::int64_t kMaxTensors = 2'000'000;

// The parameters of a transformer's inventory, split by what a person would change to shrink
// them: the blocks (numLayers), the experts inside them (numExperts), or the embeddings and head
// (vocabSize).
using ParameterSplit = ParameterCounts;

// The parameters by where they sit, without listing the inventory's names.
ParameterSplit SplitParameters(const Setup& setup) { return CountParameters(setup); }

// Validates the architecture; `parameters` receives its split when the sizes are sane enough
// to list the inventory.
void ValidateArchitecture(const Setup& setup, ErrorList& errors, std::optional<ParameterSplit>& parameters) {
  const ArchitectureDef& a = setup.model.architecture;
  const std::string p = "model.architecture.";
  const std::size_t before = errors.size();
  CheckCount(errors, p + "vocabSize", a.vocabSize, kMaxVocab, "The vocabulary size");
  CheckCount(errors, p + "hiddenSize", a.hiddenSize, kMaxHidden, "The hidden size");
  CheckCount(errors, p + "numLayers", a.numLayers, Limits::maxLayers, "The number of layers");
  CheckCount(errors, p + "numHeads", a.numHeads, kMaxHidden, "The number of heads");
  CheckRange(errors, p + "headDim", a.headDim, 0, kMaxHidden, "headDim (0 = hiddenSize / numHeads)");
  CheckRange(errors, p + "numKeyValueHeads", a.numKeyValueHeads, 0, kMaxHidden,
             "numKeyValueHeads (0 = numHeads)");
  CheckRange(errors, p + "intermediateSize", a.intermediateSize, 0, kMaxIntermediate,
             "intermediateSize (0 = 4 × hiddenSize)");
  CheckRange(errors, p + "numExperts", a.numExperts, 0, Limits::maxExperts, "numExperts (0 = dense)");
  CheckRange(errors, p + "expertIntermediateSize", a.expertIntermediateSize, 0, kMaxIntermediate,
             "expertIntermediateSize (0 = intermediateSize)");
  CheckRange(errors, p + "sharedExpertIntermediateSize", a.sharedExpertIntermediateSize, 0,
             kMaxIntermediate, "sharedExpertIntermediateSize (0 = none)");
  CheckProbability(errors, p + "hiddenDropout", a.hiddenDropout);
  CheckProbability(errors, p + "attentionDropout", a.attentionDropout);
  if (a.family != Family::Llama) {
    if (a.numExperts > 0) {
      errors.push_back({ErrorCode::InvalidField, p + "numExperts",
                        "Mixture of experts is supported in the llama family (Mixtral, Qwen2-MoE)."});
    }
    // GPT-2's family takes grouped-query attention as Megatron's GPT writes it
    // (--group-query-attention --num-query-groups; families/gpt2.cpp); BERT has none.
    if ((a.family == Family::BERT || a.family == Family::GPTNeoX) && a.numKeyValueHeads != 0 &&
        a.numKeyValueHeads != a.numHeads) {
      errors.push_back({ErrorCode::InvalidField, p + "numKeyValueHeads",
                        std::string(LabelOf(a.family)) + " has one key/value head per query head."});
    }
    if (a.family != Family::GPTNeoX) {  // RoPE: no position table
      CheckCount(errors, p + "maxPositionEmbeddings", a.maxPositionEmbeddings, Limits::maxSequenceLength,
                 "maxPositionEmbeddings (rows of the learned position table)");
    }
  }
  if (!std::isfinite(a.partialRotaryFactor) || a.partialRotaryFactor <= 0.0 || a.partialRotaryFactor > 1.0) {
    errors.push_back({ErrorCode::InvalidField, p + "partialRotaryFactor",
                      "The rotary share of a head must be in (0, 1] (1 rotates the whole head)."});
  } else if (a.partialRotaryFactor < 1.0 && !(a.family == Family::Llama && a.fusedProjections) &&
             a.family != Family::GPTNeoX) {
    errors.push_back({ErrorCode::InvalidField, p + "partialRotaryFactor",
                      "A partial rotary share is simulated with Phi-3's RoPE (fusedProjections) and GPT-NeoX's "
                      "(rotary_pct); Llama's apply_rotary_pos_emb rotates whole heads."});
  }
  if ((a.outputBias || a.mlpBias) && !(a.family == Family::Llama && !a.fusedProjections)) {
    errors.push_back({ErrorCode::InvalidField, p + (a.outputBias ? "outputBias" : "mlpBias"),
                      "The o_proj and MLP biases (attention_bias, mlp_bias) are simulated in the llama family with "
                      "separate projections."});
  }
  if (a.mlpBias && a.numExperts > 0) {
    errors.push_back({ErrorCode::InvalidField, p + "mlpBias",
                      "MLP biases are simulated on a dense MLP; the experts' biases are not."});
  }
  if (a.family == Family::Llama && a.fusedProjections && (a.numExperts > 0 || a.attentionBias || a.queryKeyNorm)) {
    // Phi3DecoderLayer: one bias-free qkv_proj and a dense gate_up_proj, nothing else.
    errors.push_back({ErrorCode::InvalidField, p + "fusedProjections",
                      "Fused projections (Phi-3) go with a dense MLP, no q/k/v biases and no q/k norms."});
  }
  // Gemma 2's fields: a cap is a positive number or 0 (none); the window a count or 0 (none).
  for (const auto& [key, cap] : {std::pair<const char*, double>{"attentionLogitSoftcap", a.attentionLogitSoftcap},
                                 std::pair<const char*, double>{"finalLogitSoftcap", a.finalLogitSoftcap}}) {
    if (!std::isfinite(cap) || cap < 0.0 || cap > 1e9) {
      errors.push_back({ErrorCode::InvalidField, p + key,
                        "A soft cap must be a positive number of logits (cap · tanh(x / cap)), or 0 for none."});
    }
  }
  CheckRange(errors, p + "slidingWindow", a.slidingWindow, 0, Limits::maxSequenceLength,
             "slidingWindow (tokens; 0 = none)");
  CheckRange(errors, p + "slidingWindowPattern", a.slidingWindowPattern, 0, Limits::maxLayers,
             "slidingWindowPattern (0 = every layer slides)");
  if (a.family != Family::Llama &&
      (a.sandwichNorms || a.attentionLogitSoftcap != 0.0 || a.finalLogitSoftcap != 0.0 || a.slidingWindow != 0)) {
    errors.push_back({ErrorCode::InvalidField,
                      p + (a.sandwichNorms                        ? "sandwichNorms"
                           : a.attentionLogitSoftcap != 0.0       ? "attentionLogitSoftcap"
                           : a.finalLogitSoftcap != 0.0           ? "finalLogitSoftcap"
                                                                  : "slidingWindow"),
                      "Sandwich norms, soft caps and sliding windows (Gemma 2) are simulated in the llama family."});
  }
  if (a.gemma3Layout && !(a.family == Family::Llama && a.queryKeyNorm && a.sandwichNorms && a.embeddingScale)) {
    // Gemma3DecoderLayer: the layout changes where Gemma 3's q/k norms, scaled embeddings and
    // sliding layers' rotary table sit; without them it has nothing to place.
    errors.push_back({ErrorCode::InvalidField, p + "gemma3Layout",
                      "Gemma 3's layout goes with q/k norms, sandwich norms and scaled embeddings (llama family)."});
  }
  if (a.olmo2Layout && !(a.family == Family::Llama && a.queryKeyNorm && !a.sandwichNorms && !a.gemma3Layout &&
                         !a.fusedProjections && !a.rmsNormUnitOffset && !a.embeddingScale && a.numExperts == 0)) {
    // Olmo2DecoderLayer: separate projections with q_norm / k_norm over them, a dense MLP, its
    // own RMSNorm (weight × fp32 rows), no other family's norms or scaling.
    errors.push_back({ErrorCode::InvalidField, p + "olmo2Layout",
                      "OLMo 2's layout goes with q/k norms, separate projections and a dense MLP (llama family), "
                      "without sandwich norms, Gemma's norms or scaled embeddings."});
  }
  if (a.rotaryFp32 && !(a.family == Family::Llama && !a.fusedProjections)) {
    errors.push_back({ErrorCode::InvalidField, p + "rotaryFp32",
                      "fp32 rotary tables (Olmo2RotaryEmbedding) are simulated in the llama family with separate "
                      "projections."});
  }
  CheckRange(errors, p + "noRopeInterval", a.noRopeInterval, 0, Limits::maxLayers,
             "noRopeInterval (layers; 0 = every layer uses RoPE)");
  if (a.noRopeInterval != 0 && !(a.family == Family::Llama && !a.fusedProjections && !a.olmo2Layout)) {
    // SmolLM3Attention (a LlamaAttention that skips apply_rotary_pos_emb where no_rope_layers is 0).
    errors.push_back({ErrorCode::InvalidField, p + "noRopeInterval",
                      "Layers without RoPE (SmolLM3) are simulated in the llama family with Llama's attention, "
                      "not with fused projections or OLMo 2's layout."});
  }
  if (a.graniteMultipliers && !(a.family == Family::Llama && !a.fusedProjections && !a.embeddingScale &&
                                !a.olmo2Layout && !a.sandwichNorms)) {
    // GraniteModel / GraniteDecoderLayer: Llama's blocks with three scalar multipliers.
    errors.push_back({ErrorCode::InvalidField, p + "graniteMultipliers",
                      "Granite's multipliers go with Llama's layout (llama family, separate projections), not with "
                      "Gemma's scaled embeddings, sandwich norms or OLMo 2's layout."});
  }
  if (a.family == Family::Llama && a.sandwichNorms && (a.fusedProjections || a.numExperts > 0)) {
    // Gemma2DecoderLayer: separate projections and a dense MLP.
    errors.push_back({ErrorCode::InvalidField, p + "sandwichNorms",
                      "Sandwich norms (Gemma 2) go with separate q/k/v projections and a dense MLP."});
  }
  if (a.family == Family::BERT) {
    CheckCount(errors, p + "typeVocabSize", a.typeVocabSize, kMaxVocab, "typeVocabSize");
    if (a.encoderHead == EncoderHead::Classification) {
      CheckCount(errors, p + "numLabels", a.numLabels, kMaxVocab, "numLabels");
    }
  }
  if (a.numExperts > 0) {
    CheckRange(errors, p + "expertsPerToken", a.expertsPerToken, 1, a.numExperts,
               "expertsPerToken (top-k)");
  }
  if (errors.size() != before) return;  // the relations below need sane sizes

  if (a.partialRotaryFactor < 1.0 && (RotaryDim(a) < 2 || RotaryDim(a) % 2 != 0)) {
    // rotate_half splits the rotary part in two halves.
    errors.push_back({ErrorCode::InvalidField, p + "partialRotaryFactor",
                      "The rotary part of a head (" + FormatCount(RotaryDim(a)) + " of " + FormatCount(HeadDim(a)) +
                          " values) must be a positive even number."});
  }
  if (a.headDim == 0 && a.hiddenSize % a.numHeads != 0) {
    // Only the Llama family has a head_dim of its own (Gemma, Qwen3 set it); GPT-2 and BERT
    // split the hidden size across the heads.
    errors.push_back({ErrorCode::InvalidField, p + "numHeads",
                      "numHeads (" + FormatCount(a.numHeads) + ") must divide hiddenSize (" +
                          FormatCount(a.hiddenSize) + ")" +
                          (a.family == Family::Llama ? ", or set headDim." : ".")});
  }
  const std::int64_t kv = KeyValueHeads(a);
  if (kv > a.numHeads || a.numHeads % kv != 0) {
    errors.push_back({ErrorCode::InvalidField, p + "numKeyValueHeads",
                      "numKeyValueHeads (" + FormatCount(kv) + ") must divide numHeads (" +
                          FormatCount(a.numHeads) + "): each key/value head serves a whole group of "
                          "query heads."});
  }
  if (a.family == Family::Llama && a.headDim == 0 && a.hiddenSize % a.numHeads == 0 &&
      HeadDim(a) % 2 != 0) {
    errors.push_back({ErrorCode::InvalidField, p + "numHeads",
                      "RoPE needs an even head dimension (hiddenSize / numHeads)."});
  } else if (a.family == Family::Llama && a.headDim % 2 != 0) {
    errors.push_back({ErrorCode::InvalidField, p + "headDim", "RoPE needs an even head dimension."});
  }
  if (a.family == Family::GPTNeoX && a.headDim != 0 && a.headDim * a.numHeads != a.hiddenSize) {
    // GPTNeoXAttention: head_size = hidden_size // num_attention_heads.
    errors.push_back({ErrorCode::InvalidField, p + "headDim", "GPT-NeoX's heads split the hidden size: leave headDim at 0."});
  }
  if ((a.family == Family::GPT2 || a.family == Family::BERT) && setup.training.sequenceLength > a.maxPositionEmbeddings) {
    errors.push_back({ErrorCode::InvalidField, "training.sequenceLength",
                      "The sequence (" + FormatCount(setup.training.sequenceLength) +
                          " tokens) is longer than the position table: maxPositionEmbeddings (" +
                          FormatCount(a.maxPositionEmbeddings) + ")."});
  }
  const double tensors = double(a.numLayers) * double(3 * a.numExperts + 20);
  if (tensors > double(kMaxTensors)) {
    errors.push_back({ErrorCode::TooLarge, p + "numLayers",
                      "numLayers × numExperts is too large: the model would list " +
                          FormatScientific(tensors) + " tensors."});
    return;
  }
  if (errors.size() != before) return;
  parameters = SplitParameters(setup);
  if (parameters->total > double(Limits::maxParameterCount)) {
    errors.push_back({ErrorCode::TooLarge, "model.architecture",
                      "The architecture holds about " + FormatScientific(parameters->total) +
                          " parameters, more than the supported 1e14."});
  }
}

// The terms of SizeBound (setup.hpp) for a model whose parameters are already split.
SizeBound SizeBoundOf(const Setup& setup, const std::optional<ParameterSplit>& split) {
  SizeBound bound;
  constexpr double kBytesPerValue = 8.0;  // every value counted as 8 bytes: fp32 and its copy
  if (setup.model.kind == ModelKind::ParameterCount) {
    const double n = static_cast<double>(setup.model.parameterCount);
    bound.modelStateBytes = 32.0 * n;
    bound.bytesPerToken = kBytesPerValue * HeuristicActivationValuesPerToken(setup.model.parameterCount);
    bound.modelStateField = "model.parameterCount";
    return bound;
  }
  if (setup.model.kind == ModelKind::Transformer) {
    const ArchitectureDef& a = setup.model.architecture;
    const TrainingDef& t = setup.training;
    const ParameterSplit p = split ? *split : SplitParameters(setup);
    bound.modelStateBytes = 40.0 * p.total;
    bound.modelStateField = p.outside > p.blocks ? "model.architecture.vocabSize"
                            : p.experts > p.blocks / 2 ? "model.architecture.numExperts"
                                                       : "model.architecture.numLayers";
    // Values one block keeps per token, generously: hidden-sized tensors (norms, residuals,
    // projections' inputs and outputs), the MLP's or the routed experts' widths, q/k/v and
    // the attention output (heads · headDim, k and v repeated for grouped-query attention),
    // the router's logits.
    const double experts = a.numExperts > 0 ? double(a.expertsPerToken) : 1.0;
    const double blockValues = 64.0 * double(a.hiddenSize) + 16.0 * experts * double(ExpertIntermediateSize(a)) +
                               16.0 * double(IntermediateSize(a)) + 16.0 * double(a.sharedExpertIntermediateSize) +
                               16.0 * double(a.numHeads) * double(HeadDim(a)) + 8.0 * double(a.numExperts);
    // Eager attention keeps scores, their fp32 softmax, probabilities and a dropout mask of
    // b·heads·s² per block (16 values per score is generous); SDPA keeps none (its log-sum-exp
    // is b·heads·s, inside blockValues). The causal mask (b·s²) is smaller than one block's.
    const double scoreValues = t.attention == AttentionImplementation::Eager ? 16.0 * double(a.numHeads) : 0.0;
    // A checkpointed block keeps only its input (hidden-sized; 4 values is generous) until
    // backward recomputes it; one block at a time is then live in full.
    const double inputValues = 4.0 * double(a.hiddenSize);
    const double L = double(a.numLayers);
    double fullBlocks = L, scoreBlocks = L, inputBlocks = 0;
    switch (t.checkpointing) {
      case Checkpointing::None: break;
      case Checkpointing::Selective: scoreBlocks = 1; break;  // the attention core is recomputed
      case Checkpointing::EveryBlock: fullBlocks = 1; scoreBlocks = 1; inputBlocks = L; break;
      // Keeps its inputs and a subset of every block's outputs: no more than without checkpointing.
      case Checkpointing::SelectiveOp: scoreBlocks = 1; inputBlocks = L; break;
      case Checkpointing::EveryKthBlock: {
        const double k = double(std::max<std::int64_t>(1, t.checkpointInterval));
        inputBlocks = std::ceil(L / k);  // blocks 0, k, 2k, …
        fullBlocks = std::min(L, L - inputBlocks + 1);
        scoreBlocks = fullBlocks;
        break;
      }
    }
    // Outside the blocks: embeddings, the logits with their fp32 copies and log-softmax.
    const double outsideValues = 32.0 * double(a.vocabSize) + 64.0;
    bound.bytesPerToken = kBytesPerValue * (fullBlocks * blockValues + inputBlocks * inputValues + outsideValues);
    bound.bytesPerTokenPosition = kBytesPerValue * scoreBlocks * scoreValues;
    return bound;
  }
  // A layer list: every layer's output and input widths, linear in the layers (one pass).
  double params = 0, widths = 0;
  std::int64_t width = 0;
  for (const LayerDef& l : setup.model.layers) {
    params += LayerParameterCount(l);
    if (l.kind == LayerKind::Linear) width = l.outFeatures;
    if (l.kind == LayerKind::Embedding) width = l.embeddingDim;
    widths += double(width) + (l.kind == LayerKind::Linear ? double(l.inFeatures) : 0.0);
  }
  bound.modelStateBytes = 32.0 * params;
  bound.bytesPerToken = 32.0 * (widths + 2.0);
  bound.modelStateField = "model.layers";
  return bound;
}

// Events per unit of a setup's shape, measured with the native build over every preset at
// 1-3 blocks × precision × optimizer × implementation × attention × checkpointing (the
// largest slope seen, rounded up; docs/budget.md). Both simulated steps are included.
namespace events {
// A transformer block without checkpointing, the most any precision or attention makes. Each
// trained bias and RMSNorm weight adds 4 events a step for its CUDA sum's scratch, and each
// broadcast product 2 (sim/ops.cpp SumToScratch, Mul).
constexpr double kGpt2Block = 480, kBertBlock = 510, kLlamaBlock = 555, kGptNeoXBlock = 560;
constexpr double kAttentionBias = 95;   // Qwen2's q/k/v biases
constexpr double kOutputBias = 35, kMlpBias = 100;  // o_proj's bias; gate/up/down's (measured +76 for both)
constexpr double kQueryKeyNorm = 170;   // Qwen3's q_norm and k_norm (two RMSNorms on the heads)
constexpr double kUnitOffsetNorm = 40;  // Gemma's norms: weight.float(), 1 + weight, the fp32 product (two a block)
constexpr double kSandwichNorms = 190;  // (measured 182) Gemma 2's two more norms a block (each as Gemma's, unit offset)
constexpr double kAttentionSoftcap = 30; // ÷ cap, tanh, × cap on the eager scores (measured 24)
constexpr double kRotaryFp32 = 40;      // OLMo 2's casts of q and k back from the fp32 rotation
constexpr double kOlmo2Layout = 30;     // OLMo 2's norms in fp32 (measured 11 over Qwen3's with biases)
constexpr double kGraniteMultipliers = 30;  // Granite's residual multipliers, two products a block (measured 16)
constexpr double kExpert = 155;         // one routed expert's ops (gate, up, down, act, index, routing weight)
// The same with the expert's weights frozen (LoRA, quantized): no weight gradients, which leave a
// quarter of its backward (measured 91–119 a block without checkpointing, 131–179 with every block
// checkpointed, against 121–197 and 161–257 trained; 2 blocks × 32 and 64 experts, every
// precision × checkpointing × optimizer and implementation).
constexpr double kFrozenExpert = 130;
constexpr double kSharedExpert = 160;   // Qwen2-MoE's shared expert and its gate
// Recomputing blocks during backward: the whole block (every/every-kth) or its attention core.
constexpr double kRecomputeFactor = 1.45, kSelectiveFactor = 1.1;
// Activation offloading brings saved tensors back in backward: an alloc and a free each, at most
// once per saved tensor (measured: ×1.26 GPT-2, ×1.27 Llama without checkpointing; with every
// block checkpointed only the blocks' inputs are packed: ×1.02–1.04).
constexpr double kOffloadFactor = 1.4, kOffloadCheckpointedFactor = 1.1;
constexpr double kAdafactorPerTensor = 24;  // factored second moments: row, column, update
constexpr double kPerParameterPerTensor = 8;  // a step's temporaries per tensor (a loop's, or foreach lists'), 2 steps
constexpr double kTransformerConstant = 500;  // embeddings, head, loss, step bookkeeping
// Layer lists: a linear (or embedding) layer with its parameters; any other layer.
constexpr double kParameterLayer = 80, kOtherLayer = 12, kLayerListConstant = 100;
// Quick mode: a fixed handful, plus Adafactor's work per listed matrix.
constexpr double kQuickConstant = 40, kQuickMatrix = 30;
}  // namespace events

EventBudget PredictEventsOf(const Setup& setup) {
  // prepare_model_for_kbit_training checkpoints every block whatever training.checkpointing says.
  if (setup.finetune.prepareForKbitTraining && setup.training.checkpointing != Checkpointing::EveryBlock) {
    Setup checkpointed = setup;
    checkpointed.training.checkpointing = Checkpointing::EveryBlock;
    return PredictEventsOf(checkpointed);
  }
  EventBudget budget;
  const ModelDef& m = setup.model;
  if (m.kind == ModelKind::ParameterCount) {
    budget.predictedEvents = events::kQuickConstant + events::kQuickMatrix * double(m.largestMatrices.size());
    budget.field = "model.largestMatrices";
    return budget;
  }
  if (m.kind == ModelKind::LayerList) {
    double n = events::kLayerListConstant;
    for (const LayerDef& l : m.layers) {
      n += (l.kind == LayerKind::Linear || l.kind == LayerKind::Embedding) ? events::kParameterLayer
                                                                           : events::kOtherLayer;
    }
    budget.predictedEvents = n;
    budget.field = "model.layers";
    return budget;
  }
  const ArchitectureDef& a = m.architecture;
  const TrainingDef& t = setup.training;
  const double experts = a.numExperts > 0 ? double(a.numExperts) : 0.0;
  const bool expertsTrain = ExpertWeightsTrain(setup.finetune);
  const double expertEvents = expertsTrain ? events::kExpert : events::kFrozenExpert;
  double block = 0, tensors = 0;  // events and trained parameter tensors per block (dense ones always counted)
  switch (a.family) {
    case Family::GPT2: block = events::kGpt2Block; tensors = 12; break;
    case Family::BERT: block = events::kBertBlock; tensors = 16; break;
    case Family::GPTNeoX: block = events::kGptNeoXBlock; tensors = 12; break;
    case Family::Llama:
      block = events::kLlamaBlock + (a.attentionBias ? events::kAttentionBias : 0.0) +
              (a.queryKeyNorm ? events::kQueryKeyNorm : 0.0) + (a.rmsNormUnitOffset ? events::kUnitOffsetNorm : 0.0) +
              (a.sandwichNorms ? events::kSandwichNorms : 0.0) +
              (a.attentionLogitSoftcap > 0.0 ? events::kAttentionSoftcap : 0.0) +
              (a.rotaryFp32 ? events::kRotaryFp32 : 0.0) + (a.olmo2Layout ? events::kOlmo2Layout : 0.0) +
              (a.outputBias ? events::kOutputBias : 0.0) + (a.mlpBias ? events::kMlpBias : 0.0) +
              (a.graniteMultipliers ? events::kGraniteMultipliers : 0.0) + expertEvents * experts +
              (a.sharedExpertIntermediateSize > 0 ? events::kSharedExpert : 0.0);
      tensors = 9 + (a.attentionBias ? 3 : 0) + (a.outputBias ? 1 : 0) + (a.mlpBias ? 3 : 0) + (a.queryKeyNorm ? 2 : 0) + (a.sandwichNorms ? 2 : 0) +
                (experts > 0 ? 1 + (expertsTrain ? 3 * experts : 0) : 0) + (a.sharedExpertIntermediateSize > 0 ? 4 : 0);
      break;
  }
  tensors += AdapterTensorsPerBlock(setup);
  switch (t.checkpointing) {
    case Checkpointing::None: break;
    case Checkpointing::Selective: block *= events::kSelectiveFactor; break;
    case Checkpointing::EveryBlock:
    case Checkpointing::SelectiveOp:
    case Checkpointing::EveryKthBlock: block *= events::kRecomputeFactor; break;
  }
  if (t.activationOffloading) {
    block *= t.checkpointing == Checkpointing::EveryBlock ? events::kOffloadCheckpointedFactor : events::kOffloadFactor;
  }
  if (t.optimizer == OptimizerKind::Adafactor) {
    block += events::kAdafactorPerTensor * tensors;
  } else if (t.optimizerImplementation != OptimizerImplementation::Fused) {
    // foreach lists are one allocation per tensor too (sim/optimizer.cpp UpcastGradients).
    block += events::kPerParameterPerTensor * tensors;
  }
  budget.predictedEvents = events::kTransformerConstant + double(a.numLayers) * (block + FinetuneEventsPerBlock(setup));
  // The experts drive it when they make most of a block's events.
  budget.field = expertEvents * experts > block / 2 ? "model.architecture.numExperts"
                                                       : "model.architecture.numLayers";
  if (t.lossImplementation == LossImplementation::FusedLinearCrossEntropy && a.hiddenSize > 0) {
    // Liger's token chunks (sim/blocks/loss.cpp): at most cdiv(V, H) of them, and never more than
    // the tokens; each makes at most 4 events, in each of the 2 steps.
    const double chunks = std::min(double((a.vocabSize + a.hiddenSize - 1) / a.hiddenSize),
                                   double(t.batchSize) * double(t.sequenceLength));
    const double loss = 2 * 4 * chunks;
    if (loss > budget.predictedEvents) budget.field = "model.architecture.vocabSize";
    budget.predictedEvents += loss;
  }
  return budget;
}

// A layer list or quick mode's matrix list past its length limit (setup.hpp: kMaxListedLayers,
// kMaxListedMatrices), whatever its events; nullopt otherwise.
std::optional<FieldError> ListTooLong(const ModelDef& m) {
  const auto count = [](std::size_t n) { return FormatCount(static_cast<std::int64_t>(n)); };
  if (m.kind == ModelKind::LayerList && m.layers.size() > static_cast<std::size_t>(kMaxListedLayers)) {
    return FieldError{ErrorCode::TooLarge, "model.layers",
                      "The list has " + count(m.layers.size()) + " layers, more than the " + FormatCount(kMaxListedLayers) +
                          " a layer list may have (the page opens, estimates and shows one that long within 2 s). "
                          "Describe a repeated stack as a transformer architecture, or merge layers."};
  }
  if (m.kind == ModelKind::ParameterCount && m.largestMatrices.size() > static_cast<std::size_t>(kMaxListedMatrices)) {
    return FieldError{ErrorCode::TooLarge, "model.largestMatrices",
                      count(m.largestMatrices.size()) + " matrices are listed, more than the " +
                          FormatCount(kMaxListedMatrices) +
                          " quick mode takes. List the largest: they decide Adafactor's factored states and the "
                          "per-parameter optimizer's largest temporary."};
  }
  return std::nullopt;
}

// A count of events in digits while they fit (just past the budget, "about 5e05 memory events,
// more than the 5e05" said nothing).
std::string EventsText(double events) {
  return events < 1e15 ? FormatCount(std::llround(events)) : FormatScientific(events);
}

// Why the budget is what it is, and where a larger one is (the page's single estimate, the
// command-line tool's) when that one would take the setup.
std::string WorkBudgetWhy(double limit, double predicted) {
  if (limit >= kMaxHostPredictedEvents) return " an estimate may take (about a second and 320 MB natively). ";
  const std::string cli =
      "the command-line tool (gpumem SETUP.json) takes up to " + EventsText(kMaxHostPredictedEvents) + ". ";
  if (limit >= kMaxPagePredictedEvents) {
    return predicted <= kMaxHostPredictedEvents
               ? " an estimate may take in the page (about half a second and 700 MB); " + cli
               : " an estimate may take (about half a second and 700 MB in the page). ";
  }
  const std::string search = " each estimate of a search may take (the solver, the views and the layouts run many); ";
  if (predicted <= kMaxPagePredictedEvents) {
    return search + "a single estimate takes up to " + EventsText(kMaxPagePredictedEvents) +
           " in the page, and " + cli;
  }
  return predicted <= kMaxHostPredictedEvents ? search + cli : search;
}

FieldError TooManyEventsError(const EventBudget& budget, double limit) {
  const std::string events = EventsText(budget.predictedEvents);
  const char* change = budget.field == "model.layers"             ? "Use fewer layers."
                       : budget.field == "model.largestMatrices"  ? "List fewer matrices."
                       : budget.field == "model.architecture.numExperts" ? "Use fewer experts or layers."
                       : budget.field == "model.architecture.vocabSize"
                           ? "The fused loss's token chunks (about vocabulary / hidden size of them) are too many: use a "
                             "larger hidden size, fewer tokens or the chunked loss."
                                                                  : "Use fewer layers.";
  return {ErrorCode::TooLarge, budget.field,
          "This setup would simulate about " + events + " memory events, more than the " + EventsText(limit) +
              WorkBudgetWhy(limit, budget.predictedEvents) + change};
}

// The field that drives a bound's excess, and what to say about it.
FieldError TooLargeError(const Setup& setup, const SizeBound& bound) {
  const TrainingDef& t = setup.training;
  const double b = double(t.batchSize), s = double(t.sequenceLength);
  const double states = bound.modelStateBytes, tokens = b * s * bound.bytesPerToken,
               scores = b * s * s * bound.bytesPerTokenPosition;
  const double total = states + tokens + scores;
  const std::string head = "This setup would need on the order of " + FormatScientific(total) +
                           " bytes, beyond what the estimator represents (2^53 ≈ 9.0e15): ";
  if (scores >= states && scores >= tokens) {
    return {ErrorCode::TooLarge, "training.sequenceLength",
            head + "eager attention keeps batch × heads × sequence² scores in every block (" +
                FormatScientific(scores) + " bytes). Use a shorter sequence, sdpa attention, or "
                "checkpointing."};
  }
  if (tokens >= states) {
    const bool batch = t.batchSize > 1;
    return {ErrorCode::TooLarge, batch ? "training.batchSize" : "training.sequenceLength",
            head + "activations grow with batch × sequence (" + FormatCount(t.batchSize) + " × " +
                FormatCount(t.sequenceLength) + " tokens: " + FormatScientific(tokens) + " bytes). Use a " +
                (batch ? "smaller batch" : "shorter sequence") + " or checkpointing."};
  }
  return {ErrorCode::TooLarge, bound.modelStateField,
          head + "the model states alone (weights, gradients, optimizer states) are " +
              FormatScientific(states) + " bytes. Use a smaller model."};
}

}  // namespace

LayerDef LinearLayer(std::int64_t inFeatures, std::int64_t outFeatures, bool bias) {
  LayerDef d;
  d.kind = LayerKind::Linear;
  d.inFeatures = inFeatures;
  d.outFeatures = outFeatures;
  d.bias = bias;
  return d;
}

LayerDef EmbeddingLayer(std::int64_t numEmbeddings, std::int64_t embeddingDim) {
  LayerDef d;
  d.kind = LayerKind::Embedding;
  d.numEmbeddings = numEmbeddings;
  d.embeddingDim = embeddingDim;
  return d;
}

LayerDef ActivationLayer(LayerKind kind) {
  LayerDef d;
  d.kind = kind;
  return d;
}

LayerDef DropoutLayer(double probability) {
  LayerDef d;
  d.kind = LayerKind::Dropout;
  d.dropoutProbability = probability;
  return d;
}

double LayerParameterCount(const LayerDef& layer) {
  switch (layer.kind) {
    case LayerKind::Linear:
      return double(layer.inFeatures) * double(layer.outFeatures) + (layer.bias ? double(layer.outFeatures) : 0.0);
    case LayerKind::Embedding:
      return double(layer.numEmbeddings) * double(layer.embeddingDim);
    default:
      return 0.0;
  }
}

std::span<const ArchitectureField> ArchitectureFields() {
  // gpt2, llama, bert: which family's forward reads the field (trace_transformer.cpp).
  static constexpr ArchitectureField kFields[] = {
      {"vocabSize", "Vocabulary", "count", "", "tokens (embedding rows)", true, true, true, true, "", ""},
      {"hiddenSize", "Hidden size", "count", "", "elements per token", true, true, true, true, "", ""},
      {"numLayers", "Blocks", "count", "", "transformer layers", true, true, true, true, "", ""},
      {"numHeads", "Attention heads", "count", "", "query heads", true, true, true, true, "", ""},
      {"numKeyValueHeads", "Key/value heads", "count", "", "0 = numHeads (grouped-query attention when fewer)", false, true, false, false, "", ""},
      {"headDim", "Head dimension", "count", "", "elements; 0 = hiddenSize / numHeads", false, true, false, false, "", ""},
      {"intermediateSize", "MLP width", "count", "", "elements; 0 = 4 × hiddenSize", true, true, true, true, "", ""},
      {"maxPositionEmbeddings", "Position table", "count", "", "positions (rows); at least the sequence length", true, false, true, false, "", ""},
      {"typeVocabSize", "Token types", "count", "", "rows of the token-type table", false, false, true, false, "", ""},
      {"hiddenAct", "Activation", "select", "hiddenActs", "", true, true, true, true, "", ""},
      {"hiddenDropout", "Hidden dropout", "number", "", "probability, 0 ≤ p < 1; 0 keeps no mask", true, false, true, true, "", ""},
      {"attentionDropout", "Attention dropout", "number", "", "probability, 0 ≤ p < 1", true, true, true, true, "", ""},
      {"encoderHead", "Training head", "select", "encoderHeads", "", false, false, true, false, "", ""},
      {"numLabels", "Classes", "count", "", "outputs of the classifier", false, false, true, false, "encoderHead", "classification"},
      {"tieWordEmbeddings", "Output head shares the token embedding (tied)", "bool", "", "", true, true, false, true, "", ""},
      {"attentionBias", "q/k/v projections have biases (Qwen2; GPT-NeoX: its projections)", "bool", "", "", false, true, false, true, "", ""},
      {"outputBias", "o_proj has a bias (attention_bias of Llama, Gemma, Qwen3, OLMo 2)", "bool", "", "", false, true, false, false, "", ""},
      {"mlpBias", "MLP projections have biases (mlp_bias)", "bool", "", "", false, true, false, false, "", ""},
      {"queryKeyNorm", "RMSNorm on each query and key head (Qwen3)", "bool", "", "", false, true, false, false, "", ""},
      {"rmsNormUnitOffset", "RMSNorm scales by 1 + weight in fp32 (Gemma)", "bool", "", "", false, true, false, false, "", ""},
      {"embeddingScale", "Embeddings scaled by √hidden size (Gemma)", "bool", "", "", false, true, false, false, "", ""},
      {"fusedProjections", "Fused qkv and gate/up projections (Phi-3)", "bool", "", "", false, true, false, false, "", ""},
      {"partialRotaryFactor", "Rotary share of a head", "number", "", "0 < f ≤ 1 (Phi-4-mini 0.75, Pythia 0.25); Llama family: fused projections only", false, true, false, true, "", ""},
      {"sandwichNorms", "Norms after attention and MLP too (Gemma 2)", "bool", "", "", false, true, false, false, "", ""},
      {"attentionLogitSoftcap", "Attention score soft cap", "number", "", "cap · tanh(s / cap) on eager scores; 0 = none (Gemma 2: 50)", false, true, false, false, "", ""},
      {"finalLogitSoftcap", "Logit soft cap", "number", "", "cap · tanh(x / cap) on the logits; 0 = none (Gemma 2: 30)", false, true, false, false, "", ""},
      {"slidingWindow", "Sliding window", "count", "", "tokens a sliding layer attends to; 0 = none (Gemma 2: 4096)", false, true, false, false, "", ""},
      {"slidingWindowPattern", "Full-attention layer every", "count", "", "layers; 0 = every layer slides (Gemma 2: 2)", false, true, false, false, "slidingWindow", "positive"},
      {"gemma3Layout", "Gemma 3 layout", "bool", "", "q/k norms after all projections, embedding scaled in its module, a rotary table for sliding layers", false, true, false, false, "", ""},
      {"olmo2Layout", "OLMo 2 layout", "bool", "", "norms only after attention and MLP, q/k norms over whole projections, norm weight in fp32", false, true, false, false, "", ""},
      {"rotaryFp32", "Rotary tables in fp32", "bool", "", "q and k rotated in fp32, then cast back (OLMo 2)", false, true, false, false, "", ""},
      {"noRopeInterval", "Layer without RoPE every", "count", "", "layers; 0 = every layer uses RoPE (SmolLM3: 4)", false, true, false, false, "", ""},
      {"graniteMultipliers", "Granite multipliers", "bool", "", "embeddings ×, sub-layer outputs × and logits ÷ a scalar, each a new tensor (Granite 3)", false, true, false, false, "", ""},
      {"parallelResidual", "Attention and MLP side by side (parallel residual)", "bool", "", "use_parallel_residual (GPT-NeoX)", false, false, false, true, "", ""},
      {"numExperts", "Experts", "count", "", "0 = dense MLP (mixture of experts when more)", false, true, false, false, "", ""},
      {"expertsPerToken", "Experts per token", "count", "", "top-k routing", false, true, false, false, "numExperts", "positive"},
      {"expertIntermediateSize", "Expert MLP width", "count", "", "elements; 0 = intermediateSize", false, true, false, false, "numExperts", "positive"},
      {"sharedExpertIntermediateSize", "Shared expert width", "count", "", "elements; 0 = no shared expert", false, true, false, false, "numExperts", "positive"},
      {"sharedExpertGate", "Sigmoid gate on the shared expert", "bool", "", "", false, true, false, false, "sharedExpertIntermediateSize", "positive"},
      {"normTopkProb", "Top-k routing weights renormalised (norm_topk_prob)", "bool", "", "Mixtral always; Qwen1.5-MoE off, Qwen3-MoE on", false, true, false, false, "numExperts", "positive"},
  };
  return kFields;
}

ArchitectureDef DefaultArchitecture(Family family) {
  ArchitectureDef a;
  a.family = family;
  switch (family) {
    case Family::GPT2:  // openai-community/gpt2
      a.vocabSize = 50257; a.hiddenSize = 768; a.numLayers = 12; a.numHeads = 12;
      a.maxPositionEmbeddings = 1024; a.tieWordEmbeddings = true;
      a.hiddenAct = HiddenAct::GELUNew; a.hiddenDropout = 0.1; a.attentionDropout = 0.1;
      break;
    case Family::Llama:  // meta-llama/Llama-2-7b-hf
      a.vocabSize = 32000; a.hiddenSize = 4096; a.numLayers = 32; a.numHeads = 32;
      a.numKeyValueHeads = 32; a.intermediateSize = 11008; a.hiddenAct = HiddenAct::SiLU;
      break;
    case Family::BERT:  // google-bert/bert-base-uncased
      a.vocabSize = 30522; a.hiddenSize = 768; a.numLayers = 12; a.numHeads = 12;
      a.intermediateSize = 3072; a.maxPositionEmbeddings = 512; a.typeVocabSize = 2;
      a.tieWordEmbeddings = true; a.hiddenAct = HiddenAct::GELU;
      a.hiddenDropout = 0.1; a.attentionDropout = 0.1;
      break;
    case Family::GPTNeoX:  // EleutherAI/pythia-160m
      a.vocabSize = 50304; a.hiddenSize = 768; a.numLayers = 12; a.numHeads = 12;
      a.intermediateSize = 3072; a.maxPositionEmbeddings = 2048; a.hiddenAct = HiddenAct::GELU;
      a.partialRotaryFactor = 0.25; a.attentionBias = true; a.parallelResidual = true;
      break;
  }
  return a;
}

std::int64_t HeadDim(const ArchitectureDef& a) {
  return a.headDim > 0 ? a.headDim : a.numHeads > 0 ? a.hiddenSize / a.numHeads : 0;
}
std::int64_t RotaryDim(const ArchitectureDef& a) {
  // Phi3RotaryEmbedding: dim = int(head_dim * partial_rotary_factor).
  return a.partialRotaryFactor >= 1.0 ? HeadDim(a) : static_cast<std::int64_t>(double(HeadDim(a)) * a.partialRotaryFactor);
}
std::int64_t KeyValueHeads(const ArchitectureDef& a) {
  return a.numKeyValueHeads > 0 ? a.numKeyValueHeads : a.numHeads;
}
std::int64_t IntermediateSize(const ArchitectureDef& a) {
  return a.intermediateSize > 0 ? a.intermediateSize : 4 * a.hiddenSize;
}
std::int64_t ExpertIntermediateSize(const ArchitectureDef& a) {
  return a.expertIntermediateSize > 0 ? a.expertIntermediateSize : IntermediateSize(a);
}

Setup DefaultSetup() {
  Setup s;
  s.model.kind = ModelKind::ParameterCount;
  s.model.parameterCount = 1'500'000'000;
  s.model.layers = MlpLayers();  // what the layer editor starts from
  s.model.loss = LossKind::CrossEntropy;
  s.model.architecture = DefaultArchitecture(Family::Llama);
  s.training.batchSize = 1;
  s.training.sequenceLength = 1024;
  s.training.precision = Precision::FP16Mixed;
  s.training.optimizer = OptimizerKind::Adam;
  s.training.optimizerImplementation = OptimizerImplementation::ForEach;
  s.training.adafactorBeta1 = false;
  s.training.zeroGradSetToNone = true;
  s.gpu.memoryGiB = 80.0;
  return s;
}

Setup ExampleMlpSetup() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::LayerList;
  s.model.layers = MlpLayers();
  s.model.loss = LossKind::MSE;
  s.training.batchSize = 32;
  s.training.sequenceLength = 1;
  s.training.precision = Precision::FP32;
  s.training.optimizer = OptimizerKind::Adam;
  s.gpu.memoryGiB = 8.0;
  return s;
}

std::int64_t OutputWidth(const std::vector<LayerDef>& layers, std::size_t index) {
  std::int64_t width = 0;
  for (std::size_t i = 0; i <= index && i < layers.size(); ++i) {
    if (layers[i].kind == LayerKind::Linear) width = layers[i].outFeatures;
    if (layers[i].kind == LayerKind::Embedding) width = layers[i].embeddingDim;
  }
  return width;
}

bool ParseMajorMinor(std::string_view text, int& major, int& minor) {
  // "2.5", "2.5.1", "2.5.1+cu124", "1.10": two numbers of at most four digits, then anything
  // after a '.' or '+' (a patch, a local version).
  auto number = [&](std::size_t& i, int& out) {
    const std::size_t start = i;
    int value = 0;
    while (i < text.size() && i - start < 4 && text[i] >= '0' && text[i] <= '9') value = value * 10 + (text[i++] - '0');
    if (i == start || (i < text.size() && text[i] >= '0' && text[i] <= '9')) return false;
    out = value;
    return true;
  };
  std::size_t i = 0;
  int ma = 0;
  int mi = 0;
  if (!number(i, ma) || i >= text.size() || text[i] != '.') return false;
  ++i;
  if (!number(i, mi)) return false;
  if (i < text.size() && text[i] != '.' && text[i] != '+') return false;
  major = ma;
  minor = mi;
  return true;
}

bool ParseVersion(std::string_view text, int& major, int& minor, int& patch) {
  if (!ParseMajorMinor(text, major, minor)) return false;
  patch = 0;
  const std::size_t second = text.find('.', text.find('.') + 1);
  const std::size_t plus = text.find('+');
  if (second == std::string_view::npos || (plus != std::string_view::npos && plus < second)) return true;
  std::size_t i = second + 1;
  int value = 0;
  const std::size_t start = i;
  while (i < text.size() && i - start < 4 && text[i] >= '0' && text[i] <= '9') value = value * 10 + (text[i++] - '0');
  if (i == start || (i < text.size() && text[i] != '+')) return false;
  patch = value;
  return true;
}

std::vector<FieldError> Validate(const Setup& setup) { return Validate(setup, kMaxPredictedEvents); }

std::vector<FieldError> Validate(const Setup& setup, double maxPredictedEvents) {
  ErrorList errors;
  Validate(setup, errors, maxPredictedEvents);
  return errors.Report();
}

void Validate(const Setup& setup, ErrorList& errors) { Validate(setup, errors, kMaxPredictedEvents); }

SizeBound EstimateSizeBound(const Setup& setup) { return SizeBoundOf(setup, std::nullopt); }

EventBudget PredictEvents(const Setup& setup) { return PredictEventsOf(setup); }

// The memory savers (TrainingDef): each is simulated only where its framework offers it.
static void ValidateSavers(const Setup& setup, ErrorList& errors) {
  const TrainingDef& t = setup.training;
  const ModelDef& m = setup.model;
  const bool decoder = m.kind == ModelKind::Transformer && m.architecture.family != Family::BERT;
  if (t.emptyCacheSteps < 0 || t.emptyCacheSteps > (std::int64_t{1} << 31)) {
    errors.push_back({ErrorCode::InvalidField, "training.emptyCacheSteps",
                      "Empty the CUDA cache every N steps takes 0 (never, the Trainer's default) or a whole number of "
                      "steps up to 2^31, got " + FormatCount(t.emptyCacheSteps) + "."});
  } else if (t.emptyCacheSteps > 0 && setup.parallel.pipelineParallel > 1) {
    errors.push_back({ErrorCode::InvalidField, "training.emptyCacheSteps",
                      "torch_empty_cache_steps is the Hugging Face Trainer's; a pipeline-parallel run follows Megatron's "
                      "schedule, which has no such call: set it to 0 or pipelineParallel to 1."});
  }
  if (t.lossChunks < 1 || t.lossChunks > 8) {
    errors.push_back({ErrorCode::InvalidField, "training.lossChunks",
                      "Loss chunks must be a whole number from 1 to 8 (torchtune's default is 8), got " +
                          FormatCount(t.lossChunks) + "."});
  }
  // Op-level selective checkpointing is simulated on transformer blocks, without the saved-tensor
  // hooks of activation offloading (the two are not combined in torchtitan or torchtune).
  if (t.checkpointing == Checkpointing::SelectiveOp && (m.kind != ModelKind::Transformer || t.activationOffloading)) {
    errors.push_back({ErrorCode::InvalidField, "training.checkpointing",
                      "Op-level selective checkpointing (torchtitan's) is simulated for transformer blocks "
                      "without activation offloading."});
  }
  if (t.activationOffloading && m.kind != ModelKind::Transformer) {
    errors.push_back({ErrorCode::InvalidField, "training.activationOffloading",
                      "Activation offloading (torchtune OffloadActivations) is simulated for transformer "
                      "architectures; switch it off for this model."});
  }
  if (t.lossImplementation == LossImplementation::Chunked && !decoder) {
    errors.push_back({ErrorCode::InvalidField, "training.lossImplementation",
                      "The chunked loss (torchtune's CEWithChunkedOutputLoss) is simulated for decoder "
                      "transformers (GPT-2, Llama family); choose standard."});
  }
  if (m.kind == ModelKind::Transformer && m.architecture.graniteMultipliers &&
      t.lossImplementation != LossImplementation::Standard) {
    // GraniteForCausalLM divides the whole logits tensor by logits_scaling before the loss; the
    // chunked, fused and vocabulary-parallel losses make no such tensor.
    errors.push_back({ErrorCode::InvalidField, "training.lossImplementation",
                      "Granite's logits_scaling is simulated with the standard loss; choose standard."});
  }
  if (m.kind == ModelKind::Transformer && m.architecture.finalLogitSoftcap > 0.0 &&
      (t.lossImplementation == LossImplementation::Chunked ||
       t.lossImplementation == LossImplementation::FusedLinearCrossEntropy)) {
    // Gemma2ForCausalLM caps the whole logits tensor before the loss; the chunked and fused
    // losses make no such tensor, and their own capping is not simulated.
    errors.push_back({ErrorCode::InvalidField, "training.lossImplementation",
                      "A logit soft cap (Gemma 2's final_logit_softcapping) is simulated with the standard loss; "
                      "choose standard, or set finalLogitSoftcap to 0."});
  }
  if (t.lossImplementation == LossImplementation::FusedLinearCrossEntropy) {
    // Liger patches the causal-LM forward of decoders (liger_kernel/transformers/monkey_patch.py);
    // under autocast its amp_custom_fwd casts and mm(out=) paths are not simulated; with a LoRA
    // adapter on lm_head the head is no plain weight for it to read (lm_head.weight).
    const Precision p = t.precision;
    std::string why;
    if (!decoder) why = "is simulated for decoder transformers (GPT-2, Llama family)";
    else if (p == Precision::AmpBF16 || p == Precision::AmpFP16) why = "is not simulated under autocast; choose a 16-bit or fp32 precision";
    else if (setup.finetune.lora && !m.architecture.tieWordEmbeddings &&
             IsLoraTarget(setup.finetune, m.architecture.family, OutputModule(m.architecture.family)))
      why = "reads lm_head.weight, which a LoRA adapter on lm_head replaces; drop lm_head from the target modules";
    if (!why.empty()) {
      errors.push_back({ErrorCode::InvalidField, "training.lossImplementation",
                        "The fused linear + cross-entropy loss (Liger) " + why + "."});
    }
  }
  if (t.lossImplementation == LossImplementation::MegatronVocabParallel) {
    // Megatron's GPTModel computes the loss in LanguageModule.compute_language_model_loss; its
    // models run in bf16/fp16 (Float16Module) or fp32, never under torch.autocast.
    const Precision p = t.precision;
    std::string why;
    if (!decoder) why = "is simulated for decoder transformers (GPT-2, Llama family)";
    else if (p == Precision::AmpBF16 || p == Precision::AmpFP16)
      why = "runs without autocast in Megatron (--bf16 / --fp16 cast the model: Float16Module); choose a 16-bit mixed or fp32 precision";
    if (!why.empty()) {
      errors.push_back({ErrorCode::InvalidField, "training.lossImplementation",
                        "Megatron's vocab-parallel cross-entropy " + why + "."});
    }
  }
  if (t.packedSequences != PackedSequences::None) {
    // Packing with position_ids resets is what transformers' decoders and torchtune's
    // PackedDataset do (masking_utils.find_packed_sequence_indices); the varlen path is the flash
    // kernel, which gpumem simulates as its SDPA attention.
    if (!decoder) {
      errors.push_back({ErrorCode::InvalidField, "training.packedSequences",
                        "Packed sequences are simulated for decoder transformers (GPT-2, Llama family); choose none."});
    } else if (t.packedSequences == PackedSequences::FlashVarlen && t.attention != AttentionImplementation::SDPA) {
      errors.push_back({ErrorCode::InvalidField, "training.packedSequences",
                        "Flash-attention varlen is the flash kernel: set attention to SDPA (or choose blockCausalMask "
                        "for eager attention)."});
    }
  }
  if (t.lossInModelDtype && (m.kind == ModelKind::ParameterCount ||
                             (m.kind == ModelKind::LayerList && m.loss != LossKind::CrossEntropy))) {
    errors.push_back({ErrorCode::InvalidField, "training.lossInModelDtype",
                      m.kind == ModelKind::ParameterCount
                          ? "Quick mode does not simulate the loss; the loss dtype needs a layer list or a transformer."
                          : "Only a cross-entropy loss upcasts its logits; with mse this option changes nothing."});
  }
  if (t.maskedSoftmaxFusion && (m.kind != ModelKind::Transformer || m.architecture.family != Family::GPT2 ||
                                t.attention != AttentionImplementation::Eager)) {
    errors.push_back({ErrorCode::InvalidField, "training.maskedSoftmaxFusion",
                      "Megatron's fused scale-mask-softmax is simulated for the GPT-2 family's eager attention only "
                      "(with SDPA there are no materialised scores to fuse)."});
  }
  if (t.optimizerInBackward && !t.zeroGradSetToNone) {
    errors.push_back({ErrorCode::InvalidField, "training.optimizerInBackward",
                      "The optimizer in backward frees each gradient in its hook (zero_grad(set_to_none=True)), "
                      "so it cannot keep gradients: set zeroGradSetToNone to true."});
  }
}

void Validate(const Setup& setup, ErrorList& errors, double maxPredictedEvents) {
  // (NaN fails both tests and is the page's budget.)
  const double limit = maxPredictedEvents > kMaxPredictedEvents
                           ? std::min(maxPredictedEvents, kMaxHostPredictedEvents)
                           : kMaxPredictedEvents;
  const TrainingDef& t = setup.training;
  std::optional<ParameterSplit> parameters;
  const ModelDef& m = setup.model;

  if (m.kind == ModelKind::ParameterCount) {
    CheckCount(errors, "model.parameterCount", m.parameterCount, Limits::maxParameterCount,
               "The parameter count");
    if (static_cast<std::int64_t>(m.largestMatrices.size()) > Limits::maxMatrices) {
      errors.push_back({ErrorCode::InvalidField, "model.largestMatrices", "Too many matrices listed."});
    } else {
      double matrixElements = 0;
      for (std::size_t i = 0; i < m.largestMatrices.size(); ++i) {
        const std::string path = "model.largestMatrices[" + std::to_string(i) + "]";
        CheckCount(errors, path + ".rows", m.largestMatrices[i].rows, Limits::maxFeatures, "Rows");
        CheckCount(errors, path + ".cols", m.largestMatrices[i].cols, Limits::maxFeatures, "Columns");
        matrixElements += double(m.largestMatrices[i].rows) * double(m.largestMatrices[i].cols);
      }
      if (m.parameterCount >= 1 && matrixElements > static_cast<double>(m.parameterCount)) {
        errors.push_back({ErrorCode::InvalidField, "model.largestMatrices",
                          "The listed matrices hold " + FormatScientific(matrixElements) +
                              " elements, more than the parameter count " +
                              FormatCount(m.parameterCount) + "."});
      }
    }
  } else if (m.kind == ModelKind::LayerList) {
    ValidateLayers(m, errors);  // autocast included (issue 11: layer_list.cpp follows its op lists)
  } else {
    ValidateArchitecture(setup, errors, parameters);
    if (t.checkpointing == Checkpointing::EveryKthBlock) {
      CheckCount(errors, "training.checkpointInterval", t.checkpointInterval, Limits::maxLayers,
                 "The checkpoint interval");
    }
  }

  CheckCount(errors, "training.batchSize", t.batchSize, Limits::maxBatchSize, "The batch size");
  CheckCount(errors, "training.sequenceLength", t.sequenceLength, Limits::maxSequenceLength,
             "The sequence length");
  if (t.batchSize >= 1 && t.sequenceLength >= 1 &&
      double(t.batchSize) * double(t.sequenceLength) > double(Limits::maxTokens)) {
    errors.push_back({ErrorCode::InvalidField, "training.sequenceLength",
                      "Batch size × sequence length must be at most " +
                          FormatScientific(double(Limits::maxTokens)) + " tokens."});
  }
  if (t.optimizer == OptimizerKind::Adafactor &&
      t.optimizerImplementation == OptimizerImplementation::Fused) {
    errors.push_back({ErrorCode::InvalidField, "training.optimizerImplementation",
                      "Adafactor has no fused implementation; choose forEach or perParameter."});
  }
  ValidateSavers(setup, errors);
  if (!std::isfinite(setup.gpu.memoryGiB) || setup.gpu.memoryGiB <= 0.0 ||
      setup.gpu.memoryGiB > Limits::maxGpuMemoryGiB) {
    errors.push_back({ErrorCode::InvalidField, "gpu.memoryGiB",
                      "GPU memory must be a positive number of GiB, at most 1e6."});
  }
  // The JSON reader refuses an unknown id; a setup built in C++ is held to the same list (an
  // unknown id would otherwise get no CUDA context and no workspaces: DeviceOverheads).
  if (!setup.gpu.id.empty() && FindGpu(setup.gpu.id) == nullptr) {
    errors.push_back({ErrorCode::InvalidField, "gpu.id",
                      "Unknown GPU id (see the gpus list in the options)."});  // not echoed: any bytes
  }
  {
    std::vector<FieldError> runtime;
    ValidateRuntime(setup, runtime);
    ValidateParallel(setup, runtime);  // the parallel section (core/src/parallel/parallel_setup.cpp)
    for (FieldError& e : runtime) errors.push_back(std::move(e));
  }
  {
    std::vector<FieldError> finetune;  // finetune.hpp: frozen parameters, adapters, quantization
    ValidateFinetune(setup, finetune, errors.empty());
    for (FieldError& e : finetune) errors.push_back(std::move(e));
  }

  if (errors.empty()) {
    // The work budget first: it is cheap and bounds time and memory before any simulation.
    if (std::optional<FieldError> tooLong = ListTooLong(m)) {
      errors.push_back(std::move(*tooLong));
      return;
    }
    const EventBudget budget = PredictEventsOf(setup);
    if (budget.predictedEvents > limit) {
      errors.push_back(TooManyEventsError(budget, limit));
      return;
    }
    // Every accumulated micro-batch is simulated (docs/parallel.md): the budget grows with them.
    double microBatches = static_cast<double>(setup.parallel.gradientAccumulationSteps);
    // A pipeline stage runs only its own blocks (parallel/pipeline.cpp): the largest stage's
    // share of the model's events per micro-batch.
    if (setup.parallel.pipelineParallel > 1 && setup.model.kind == ModelKind::Transformer) {
      const std::vector<std::int64_t> stages = PipelineStageLayers(setup.parallel, setup.model.architecture.numLayers);
      if (!stages.empty()) {
        microBatches *= static_cast<double>(*std::max_element(stages.begin(), stages.end())) /
                        static_cast<double>(setup.model.architecture.numLayers);
      }
    }
    if (budget.predictedEvents * microBatches > limit) {
      errors.push_back({ErrorCode::TooLarge, "parallel.gradientAccumulationSteps",
                        "Simulating " + FormatCount(setup.parallel.gradientAccumulationSteps) +
                            " micro-batches" + (setup.parallel.pipelineParallel > 1 ? " of the largest stage" : "") +
                            " would take about " + EventsText(budget.predictedEvents * microBatches) +
                            " events, more than " + EventsText(limit) +
                            (setup.parallel.pipelineParallel <= 1
                                 ? ": fewer micro-batches show the same peak (from the second on, the gradients "
                                   "exist)."
                             // GPipe keeps every micro-batch's activations until its backwards; 1F1B (and
                             // interleaved) hold min(p − r, m) in flight on stage r, so the first stage's
                             // peak grows with m until m reaches p.
                             : setup.parallel.pipelineSchedule == PipelineSchedule::GPipe
                                 ? ": under GPipe every micro-batch's activations are held at once, so the peak "
                                   "grows with their number; a 1F1B schedule holds at most the pipeline size."
                                 : ": with a pipeline the first stage's peak stops growing once the micro-batches "
                                   "reach the pipeline size (" + FormatCount(setup.parallel.pipelineParallel) +
                                   "); fewer than that show a lower peak.")});
      return;
    }
    const SizeBound bound = SizeBoundOf(setup, parameters);
    if (!(bound.Total(double(t.batchSize), double(t.sequenceLength)) < Limits::maxEstimateBytes)) {
      errors.push_back(TooLargeError(setup, bound));
    }
  }
}

std::vector<FieldError> ErrorList::Report(const std::string& note) const {
  std::vector<FieldError> out = kept_;
  if (total_ > kept_.size()) {
    out.push_back({ErrorCode::TooManyErrors, "",
                   "…and " + FormatCount(static_cast<std::int64_t>(total_ - kept_.size())) +
                       " more errors, not listed (the first " + FormatCount(static_cast<std::int64_t>(kept_.size())) +
                       " are above)." + (note.empty() ? "" : " " + note)});
  }
  return out;
}

std::vector<FieldError> CapErrors(std::vector<FieldError> errors) {
  ErrorList list;
  for (FieldError& e : errors) list.push_back(std::move(e));
  return list.Report();
}

}  // namespace gpumem
