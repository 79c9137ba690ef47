// Forward and backward of a layer-list model, op by op, with what autograd saves.
//
// Saved-for-backward rules (PyTorch's derivatives.yaml / CUDA kernels):
//   linear: its input (for the weight gradient)        relu, tanh, sigmoid: their output
//   gelu: its input                                     dropout (0<p<1): a 1-byte bool mask
//   embedding: the token ids (already held by the batch)
//   cross-entropy = log_softmax (saves its output) + nll_loss (saves the labels and a scalar
//     total_weight)
//   mse: its input and the target; ATen first materialises the element-wise squared error
//     (one output-sized temporary, CPU and CUDA alike) and then reduces it
// A dropout with p = 0 returns its input unchanged and keeps nothing.
// The training loop holds the model's output (`out = model(x)`, or a Hugging Face model's
// `outputs.logits`) until the end of the step, so it outlives the loss and backward.
#include <memory>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

class LayerListPass final : public ModelPass {
 public:
  LayerListPass(const Setup& setup, const Inventory& inventory, const Regime& regime)
      : layers_(setup.model.layers), loss_(setup.model.loss), regime_(regime),
        batch_(setup.training.batchSize), sequence_(setup.training.sequenceLength),
        saved_(setup.model.layers.size(), kNoTensor) {
    // Each layer's output width, in one pass: OutputWidth(layers, i) walks layers 0..i, so
    // calling it per layer made long lists quadratic (issue 14).
    widths_.resize(layers_.size());
    std::int64_t width = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].kind == LayerKind::Linear) width = layers_[i].outFeatures;
      if (layers_[i].kind == LayerKind::Embedding) width = layers_[i].embeddingDim;
      widths_[i] = width;
    }
    // Map each layer to its parameters' inventory indices (weight first, then bias).
    parameterIndices_.resize(layers_.size());
    for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
      const int layer = inventory.parameters[i].layer;
      if (layer >= 0) parameterIndices_[static_cast<std::size_t>(layer)].push_back(i);
    }
  }

  void Forward(TraceBuilder& b) override {
    const DType act = regime_.activations;
    const std::int64_t tokens = batch_ * sequence_;
    const LayerDef& first = layers_.front();
    if (first.kind == LayerKind::Embedding) {
      input_ = b.Alloc(Category::InputBatch, tokens * 8, "input ids", "batch: token ids",
                       SizeFormula({batch_, sequence_}, DType::Int64));
    } else {
      input_ = b.Alloc(Category::InputBatch, tokens * first.inFeatures * BytesPerElement(act),
                       "input features", "batch: input features",
                       SizeFormula({batch_, sequence_, first.inFeatures}, act));
    }
    const std::int64_t outWidth = widths_.back();
    if (loss_ == LossKind::CrossEntropy) {
      labels_ = b.Alloc(Category::InputBatch, tokens * 8, "labels", "batch: class labels",
                        SizeFormula({batch_, sequence_}, DType::Int64));
    } else {
      labels_ = b.Alloc(Category::InputBatch, tokens * outWidth * BytesPerElement(act), "targets",
                        "batch: regression targets", SizeFormula({batch_, sequence_, outWidth}, act));
    }

    TensorHandle current = b.Retain(input_);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const LayerDef& layer = layers_[i];
      const std::string name = "layers[" + std::to_string(i) + "]";
      const std::string op = name + " " + LabelOf(layer.kind) + " forward";
      const int index = static_cast<int>(i);
      const std::int64_t width = widths_[i];
      auto output = [&](const char* what = "output") {
        return b.Alloc(Category::Activations, tokens * width * BytesPerElement(act),
                       name + "." + what, op + ": " + what, SizeFormula({batch_, sequence_, width}, act),
                       index);
      };
      TensorHandle out = kNoTensor;
      switch (layer.kind) {
        case LayerKind::Linear:
        case LayerKind::GELU:
        case LayerKind::Embedding:
          saved_[i] = b.Retain(current);  // saves its input (ids for the embedding)
          out = output();
          break;
        case LayerKind::ReLU:
        case LayerKind::Tanh:
        case LayerKind::Sigmoid:
          out = output();
          saved_[i] = b.Retain(out);  // saves its output
          break;
        case LayerKind::Dropout:
          if (layer.dropoutProbability == 0.0) continue;  // identity: same tensor, nothing saved
          saved_[i] = b.Alloc(Category::Activations, tokens * width, name + ".mask",
                              op + ": mask (saved)", SizeFormula({batch_, sequence_, width}, DType::Bool),
                              index);
          out = output();
          break;
      }
      b.Release(current, op + ": input no longer referenced");
      current = out;
    }

    // The loss. The loop's variable keeps the output alive to the end of the step.
    output_ = b.Retain(current);
    const std::int64_t classes = outWidth;
    if (loss_ == LossKind::CrossEntropy) {
      const DType lossType = regime_.lossInFp32 ? DType::FP32 : act;
      TensorHandle logits = current;
      if (regime_.lossInFp32) {
        logits = b.Alloc(Category::Activations, tokens * classes * 4, "logits (fp32)",
                         "loss: logits upcast to fp32", SizeFormula({batch_, sequence_, classes}, DType::FP32));
        b.Release(current, "loss: 16-bit logits no longer referenced");
      }
      logSoftmax_ = b.Alloc(Category::Activations, tokens * classes * BytesPerElement(lossType),
                            "log_softmax output", "loss: log_softmax output (saved)",
                            SizeFormula({batch_, sequence_, classes}, lossType));
      b.Release(logits, "loss: logits no longer referenced");
      savedTarget_ = b.Retain(labels_);
      totalWeight_ = b.Alloc(Category::Activations, BytesPerElement(lossType), "nll_loss total_weight",
                             "loss: nll_loss total_weight (saved)", SizeFormula({1}, lossType));
      loss_value_ = b.Alloc(Category::Activations, BytesPerElement(lossType), "loss", "loss: scalar",
                            SizeFormula({1}, lossType));
    } else {
      savedInput_ = current;  // mse saves its input: the model output stays alive
      savedTarget_ = b.Retain(labels_);
      TensorHandle squared = b.Alloc(Category::Activations, tokens * classes * BytesPerElement(act),
                                     "squared error", "loss: element-wise squared error",
                                     SizeFormula({batch_, sequence_, classes}, act));
      loss_value_ = b.Alloc(Category::Activations, BytesPerElement(act), "loss", "loss: scalar",
                            SizeFormula({1}, act));
      b.Release(squared, "loss: reduced to its mean");
    }
  }

  void Backward(TraceBuilder& b, GradientSink& gradients) override {
    const DType act = regime_.activations;
    const std::int64_t tokens = batch_ * sequence_;
    const std::int64_t classes = widths_.back();
    TensorHandle gradOut = kNoTensor;
    if (loss_ == LossKind::CrossEntropy) {
      const DType lossType = regime_.lossInFp32 ? DType::FP32 : act;
      const std::int64_t bytes = tokens * classes * BytesPerElement(lossType);
      const std::string formula = SizeFormula({batch_, sequence_, classes}, lossType);
      TensorHandle gradLogSoftmax = b.Alloc(Category::ActivationGradients, bytes,
                                            "grad of log_softmax output",
                                            "loss backward: nll_loss gradient", formula);
      b.Release(savedTarget_, "loss backward: labels released by nll_loss");
      b.Release(totalWeight_, "loss backward: total_weight released by nll_loss");
      gradOut = b.Alloc(Category::ActivationGradients, bytes, "grad of logits",
                        "loss backward: log_softmax gradient", formula);
      b.Release(gradLogSoftmax, "loss backward: nll_loss gradient consumed");
      b.Release(logSoftmax_, "loss backward: saved log_softmax output freed");
      if (regime_.lossInFp32) {
        TensorHandle cast = b.Alloc(Category::ActivationGradients, tokens * classes * BytesPerElement(act),
                                    "grad of logits (16-bit)", "loss backward: gradient cast to 16-bit",
                                    SizeFormula({batch_, sequence_, classes}, act));
        b.Release(gradOut, "loss backward: fp32 gradient consumed");
        gradOut = cast;
      }
    } else {
      gradOut = b.Alloc(Category::ActivationGradients, tokens * classes * BytesPerElement(act),
                        "grad of output", "loss backward: mse gradient",
                        SizeFormula({batch_, sequence_, classes}, act));
      b.Release(savedInput_, "loss backward: saved output freed");
      b.Release(savedTarget_, "loss backward: targets released by mse");
    }

    for (std::size_t i = layers_.size(); i-- > 0;) {
      const LayerDef& layer = layers_[i];
      const std::string name = "layers[" + std::to_string(i) + "]";
      const std::string op = name + " " + LabelOf(layer.kind) + " backward";
      const int index = static_cast<int>(i);
      if (layer.kind == LayerKind::Dropout && layer.dropoutProbability == 0.0) continue;
      // The gradient flowing into this layer's input; layer 0's input is data (no gradient).
      const std::int64_t inWidth = layer.kind == LayerKind::Linear ? layer.inFeatures
                                   : i > 0 ? widths_[i - 1] : 0;
      TensorHandle gradIn = kNoTensor;
      if (i > 0 && layer.kind != LayerKind::Embedding) {
        gradIn = b.Alloc(Category::ActivationGradients, tokens * inWidth * BytesPerElement(act),
                         name + " grad of input", op + ": gradient of its input",
                         SizeFormula({batch_, sequence_, inWidth}, act), index);
      }
      if (!parameterIndices_[i].empty()) {
        const Text opText = b.text().Own(op);
        for (std::size_t p : parameterIndices_[i]) gradients.Produce(p, opText);
      }
      b.Release(saved_[i], op + ": saved tensor freed");
      saved_[i] = kNoTensor;
      b.Release(gradOut, op + ": incoming gradient consumed");
      gradients.RunReady();  // the parameters' AccumulateGrad (and its hooks) after the op
      gradOut = gradIn;
    }
  }

  void EndStep(TraceBuilder& b) override {
    b.Release(output_, "end of step: model output released");
    b.Release(loss_value_, "end of step: loss released");
    b.Release(input_, "end of step: batch released");
    b.Release(labels_, "end of step: batch released");
  }

 private:
  const std::vector<LayerDef>& layers_;
  LossKind loss_;
  Regime regime_;
  std::int64_t batch_, sequence_;
  std::vector<TensorHandle> saved_;
  std::vector<std::int64_t> widths_;  // widths_[i] == OutputWidth(layers_, i), features
  std::vector<std::vector<std::size_t>> parameterIndices_;
  TensorHandle input_ = kNoTensor, labels_ = kNoTensor, logSoftmax_ = kNoTensor;
  TensorHandle savedTarget_ = kNoTensor, savedInput_ = kNoTensor, loss_value_ = kNoTensor;
  TensorHandle totalWeight_ = kNoTensor, output_ = kNoTensor;
};

}  // namespace

std::unique_ptr<ModelPass> MakeLayerListPass(const Setup& setup, const Inventory& inventory,
                                             const Regime& regime) {
  return std::make_unique<LayerListPass>(setup, inventory, regime);
}

}  // namespace gpumem
