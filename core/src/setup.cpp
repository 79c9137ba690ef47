// Defaults (typed once, here) and validation of a Setup.
#include "gpumem/setup.hpp"

#include <cmath>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/heuristics.hpp"

namespace gpumem {
namespace {

std::vector<LayerDef> MlpLayers() {
  return {LinearLayer(240000, 1024), ActivationLayer(LayerKind::ReLU), LinearLayer(1024, 512),
          ActivationLayer(LayerKind::ReLU), LinearLayer(512, 240000)};
}

std::string LayerPath(std::size_t i) { return "model.layers[" + std::to_string(i) + "]"; }

// Appends an error when `value` is outside [1, max].
void CheckCount(std::vector<FieldError>& errors, const std::string& field, std::int64_t value,
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

void ValidateLayers(const ModelDef& model, std::vector<FieldError>& errors) {
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

// A generous upper bound of the bytes the simulation can reach, in double, so that absurd
// combinations are refused before any 64-bit arithmetic can overflow.
double RoughUpperBoundBytes(const Setup& setup) {
  const double tokens = static_cast<double>(setup.training.batchSize) *
                        static_cast<double>(setup.training.sequenceLength);
  if (setup.model.kind == ModelKind::ParameterCount) {
    const double n = static_cast<double>(setup.model.parameterCount);
    return 32.0 * n + 8.0 * tokens * HeuristicActivationValuesPerToken(setup.model.parameterCount);
  }
  double params = 0, widths = 0;
  for (std::size_t i = 0; i < setup.model.layers.size(); ++i) {
    const LayerDef& l = setup.model.layers[i];
    params += LayerParameterCount(l);
    widths += double(OutputWidth(setup.model.layers, i)) + (l.kind == LayerKind::Linear ? double(l.inFeatures) : 0.0);
  }
  return 32.0 * params + 32.0 * tokens * (widths + 2.0);
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

Setup DefaultSetup() {
  Setup s;
  s.model.kind = ModelKind::ParameterCount;
  s.model.parameterCount = 1'500'000'000;
  s.model.layers = MlpLayers();  // what the layer editor starts from
  s.model.loss = LossKind::CrossEntropy;
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

std::vector<FieldError> Validate(const Setup& setup) {
  std::vector<FieldError> errors;
  const TrainingDef& t = setup.training;
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
  } else {
    ValidateLayers(m, errors);
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
  if (!std::isfinite(setup.gpu.memoryGiB) || setup.gpu.memoryGiB <= 0.0 ||
      setup.gpu.memoryGiB > Limits::maxGpuMemoryGiB) {
    errors.push_back({ErrorCode::InvalidField, "gpu.memoryGiB",
                      "GPU memory must be a positive number of GiB, at most 1e6."});
  }

  if (errors.empty()) {
    const double bound = RoughUpperBoundBytes(setup);
    if (!(bound < Limits::maxEstimateBytes)) {
      errors.push_back({ErrorCode::TooLarge, "training.batchSize",
                        "This setup would need on the order of " + FormatScientific(bound) +
                            " bytes, beyond what the estimator represents (2^53 ≈ 9e15); reduce the "
                            "batch size, sequence length or model."});
    }
  }
  return errors;
}

}  // namespace gpumem
