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
//
// Autocast (torch.autocast, CUDA's op lists; CPU torch 1.13 agrees for these ops): the batch
// and the weights stay fp32. A linear casts its arguments in order — the input (a 16-bit copy
// when it is fp32, saved for the weight gradient), the weight and the bias (copies cached until
// the autocast context ends; the weight copy is also saved for the input gradient) — and
// returns 16-bit. Embedding, activations and dropout run in their input's dtype. log_softmax
// and mse_loss run in fp32 on an fp32 copy (mse saves that copy). In backward each cast is a
// ToCopyBackward node created just before the linear, so it runs right after it: the bias's,
// then the weight's 16-bit gradient becomes the fp32 .grad, then the input copy's gradient is
// cast back to fp32 (aten/src/ATen/autocast_mode.cpp cached_cast; autograd's sequence order).
#include <memory>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/reduction.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

// "layers[3]": a layer's name as parts of the trace's text store, so that no string is built per
// event (a 5,000-layer list makes 200,000 events; with the words off, as in the solver's
// estimates, nothing at all is made).
Text NameOf(TextStore& t, std::size_t i) { return t.Make({"layers[", TextPart::Int(static_cast<std::int64_t>(i)), "]"}); }

class LayerListPass final : public ModelPass {
 public:
  LayerListPass(const Setup& setup, const Inventory& inventory, const Regime& regime)
      : layers_(setup.model.layers), loss_(setup.model.loss), regime_(regime),
        batch_(setup.training.batchSize), sequence_(setup.training.sequenceLength),
        saved_(setup.model.layers.size(), kNoTensor), savedWeight_(setup.model.layers.size(), kNoTensor),
        types_(setup.model.layers.size(), regime.activations), inTypes_(setup.model.layers.size(), regime.activations),
        castInput_(setup.model.layers.size(), false), gpu_(GpuParallelismOf(setup.gpu.id)) {
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
    const bool autocast = regime_.autocast;
    const DType compute = regime_.compute;
    // Under autocast the data loader's features and targets are fp32, as the weights.
    const DType batchType = autocast ? regime_.weights : regime_.activations;
    const std::int64_t tokens = batch_ * sequence_;
    const LayerDef& first = layers_.front();
    if (first.kind == LayerKind::Embedding) {
      input_ = b.Alloc(Category::InputBatch, tokens * 8, "input ids", "batch: token ids",
                       SizeFormula({batch_, sequence_}, DType::Int64));
    } else {
      input_ = b.Alloc(Category::InputBatch, tokens * first.inFeatures * BytesPerElement(batchType),
                       "input features", "batch: input features",
                       SizeFormula({batch_, sequence_, first.inFeatures}, batchType));
    }
    const std::int64_t outWidth = widths_.back();
    if (loss_ == LossKind::CrossEntropy) {
      labels_ = b.Alloc(Category::InputBatch, tokens * 8, "labels", "batch: class labels",
                        SizeFormula({batch_, sequence_}, DType::Int64));
    } else {
      labels_ = b.Alloc(Category::InputBatch, tokens * outWidth * BytesPerElement(batchType), "targets",
                        "batch: regression targets", SizeFormula({batch_, sequence_, outWidth}, batchType));
    }

    TensorHandle current = b.Retain(input_);
    DType currentType = batchType;  // the dtype of `current`
    std::vector<TensorHandle> castCache;  // autocast's cached weight and bias copies
    bool anyParameterBefore = false;      // whether the current input needs a gradient
    TextStore& t = b.text();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const LayerDef& layer = layers_[i];
      const Text name = NameOf(t, i);
      const Text op = t.Make({name, " ", TextPart::View(LabelOf(layer.kind)), " forward"});
      const int index = static_cast<int>(i);
      const std::int64_t width = widths_[i];
      inTypes_[i] = currentType;
      DType outType = currentType;
      auto output = [&](DType type) {
        return b.Alloc(Category::Activations, tokens * width * BytesPerElement(type), t.Make({name, ".output"}),
                       t.Make({op, ": output"}), t.Size({batch_, sequence_, width}, type), index);
      };
      TensorHandle out = kNoTensor;
      const bool inputNeedsGrad = anyParameterBefore;
      anyParameterBefore = anyParameterBefore || !parameterIndices_[i].empty();
      switch (layer.kind) {
        case LayerKind::Linear:
          if (autocast) {
            outType = compute;
            castInput_[i] = currentType != compute;
            saved_[i] = castInput_[i]
                            ? b.Alloc(Category::Activations, tokens * layer.inFeatures * BytesPerElement(compute),
                                      t.Make({name, ".input (16-bit copy)"}),
                                      t.Make({op, ": autocast copies its input to 16-bit (saved)"}),
                                      t.Size({batch_, sequence_, layer.inFeatures}, compute), index)
                            : b.Retain(current);
            const TensorHandle weight = b.Alloc(Category::WeightCopies, layer.inFeatures * layer.outFeatures * BytesPerElement(compute),
                                                t.Make({name, ".weight (16-bit copy)"}),
                                                t.Make({op, ": autocast copies the weight to 16-bit (cached)"}),
                                                t.Size({layer.outFeatures, layer.inFeatures}, compute), index);
            // addmm saves the weight for its input's gradient, only when that input needs one
            // (derivatives.yaml's saves are conditional on should_compute_output).
            if (inputNeedsGrad) savedWeight_[i] = b.Retain(weight);
            castCache.push_back(weight);
            if (layer.bias) {
              castCache.push_back(b.Alloc(Category::WeightCopies, layer.outFeatures * BytesPerElement(compute),
                                          t.Make({name, ".bias (16-bit copy)"}),
                                          t.Make({op, ": autocast copies the bias to 16-bit (cached)"}),
                                          t.Size({layer.outFeatures}, compute), index));
            }
          } else {
            saved_[i] = b.Retain(current);  // saves its input
          }
          out = output(outType);
          break;
        case LayerKind::GELU:
        case LayerKind::Embedding:
          saved_[i] = b.Retain(current);  // saves its input (ids for the embedding)
          if (layer.kind == LayerKind::Embedding) outType = regime_.weights;  // the weight's dtype
          out = output(outType);
          break;
        case LayerKind::ReLU:
        case LayerKind::Tanh:
        case LayerKind::Sigmoid:
          out = output(outType);
          saved_[i] = b.Retain(out);  // saves its output
          break;
        case LayerKind::Dropout:
          if (layer.dropoutProbability == 0.0) {  // identity: same tensor, nothing saved
            types_[i] = currentType;
            continue;
          }
          saved_[i] = b.Alloc(Category::Activations, tokens * width, t.Make({name, ".mask"}), t.Make({op, ": mask (saved)"}),
                              t.Size({batch_, sequence_, width}, DType::Bool), index);
          out = output(outType);
          break;
      }
      types_[i] = outType;
      b.Release(current, t.Make({op, ": input no longer referenced"}));
      current = out;
      currentType = outType;
    }

    // The loss. The loop's variable keeps the output alive to the end of the step.
    output_ = b.Retain(current);
    const std::int64_t classes = outWidth;
    // The loss upcasts a 16-bit output to fp32 (mixed precision's logits.float(), autocast's
    // fp32 list), unless it runs in the model's dtype.
    // (mse: only autocast's, mixed precision's code computes it in the model's dtype).
    lossUpcast_ = currentType != DType::FP32 && (loss_ == LossKind::CrossEntropy ? regime_.lossInFp32 : autocast);
    const DType lossType = lossUpcast_ ? DType::FP32 : currentType;
    if (loss_ == LossKind::CrossEntropy) {
      TensorHandle logits = current;
      if (lossUpcast_) {
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
      if (lossUpcast_) {  // autocast: mse_loss on an fp32 copy, which it saves
        savedInput_ = b.Alloc(Category::Activations, tokens * classes * 4, "output (fp32 copy)",
                              "loss: autocast copies the output to fp32 (saved by mse_loss)",
                              SizeFormula({batch_, sequence_, classes}, DType::FP32));
        b.Release(current, "loss: output held by the loop");
      } else {
        savedInput_ = current;  // mse saves its input: the model output stays alive
      }
      savedTarget_ = b.Retain(labels_);
      // TORCH_META_FUNC(mse_loss) (aten/src/ATen/native/Loss.cpp) sets the output up as the
      // element-wise op's, full size, then resize_({}): the scalar keeps that storage for as
      // long as the loss lives. The implementation then squares into a TensorIterator temporary
      // of its own and mean_out's it into the scalar (CPU torch 1.13 measured: the loss's
      // storage is b · s · out elements; validate's mlp-* MSE rows).
      const std::int64_t full = tokens * classes * BytesPerElement(lossType);
      loss_value_ = b.Alloc(Category::Activations, full, "loss", "loss: scalar (mse_loss's output, resized from full size)",
                            SizeFormula({batch_, sequence_, classes}, lossType));
      TensorHandle squared = b.Alloc(Category::Activations, full, "squared error", "loss: element-wise squared error",
                                     SizeFormula({batch_, sequence_, classes}, lossType));
      b.Release(squared, "loss: reduced to its mean");
    }
    // Leaving the autocast context: the cached weight copies go (the saved ones stay).
    for (TensorHandle h : castCache) b.Release(h, "autocast context exits: cached 16-bit copy released");
  }

  void Backward(TraceBuilder& b, GradientSink& gradients) override {
    const std::int64_t tokens = batch_ * sequence_;
    const std::int64_t classes = widths_.back();
    const DType outType = types_.back();
    const DType lossType = lossUpcast_ ? DType::FP32 : outType;
    TensorHandle gradOut = kNoTensor;
    if (loss_ == LossKind::CrossEntropy) {
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
    } else {
      gradOut = b.Alloc(Category::ActivationGradients, tokens * classes * BytesPerElement(lossType),
                        "grad of output", "loss backward: mse gradient",
                        SizeFormula({batch_, sequence_, classes}, lossType));
      b.Release(savedInput_, lossUpcast_ ? "loss backward: saved fp32 copy freed" : "loss backward: saved output freed");
      b.Release(savedTarget_, "loss backward: targets released by mse");
    }
    if (lossUpcast_) {
      TensorHandle cast = b.Alloc(Category::ActivationGradients, tokens * classes * BytesPerElement(outType),
                                  "grad of logits (16-bit)", "loss backward: gradient cast to 16-bit",
                                  SizeFormula({batch_, sequence_, classes}, outType));
      b.Release(gradOut, "loss backward: fp32 gradient consumed");
      gradOut = cast;
    }

    TextStore& t = b.text();
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const LayerDef& layer = layers_[i];
      if (layer.kind == LayerKind::Dropout && layer.dropoutProbability == 0.0) continue;
      const Text name = NameOf(t, i);
      const Text op = t.Make({name, " ", TextPart::View(LabelOf(layer.kind)), " backward"});
      const int index = static_cast<int>(i);
      // The gradient flowing into this layer's input; layer 0's input is data (no gradient).
      const std::int64_t inWidth = layer.kind == LayerKind::Linear ? layer.inFeatures
                                   : i > 0 ? widths_[i - 1] : 0;
      const bool autocastLinear = regime_.autocast && layer.kind == LayerKind::Linear;
      // A linear under autocast computes the gradient of its 16-bit input copy.
      const DType gradType = autocastLinear ? regime_.compute : inTypes_[i];
      TensorHandle gradIn = kNoTensor;
      if (i > 0 && layer.kind != LayerKind::Embedding) {
        gradIn = b.Alloc(Category::ActivationGradients, tokens * inWidth * BytesPerElement(gradType),
                         t.Make({name, " grad of input"}), t.Make({op, ": gradient of its input"}),
                         t.Size({batch_, sequence_, inWidth}, gradType), index);
      }
      if (autocastLinear) {
        LinearCastsBackward(b, gradients, i, name, op);
      } else {
        for (std::size_t p : parameterIndices_[i]) gradients.Produce(p, op);
      }
      if (layer.kind == LayerKind::Linear && layer.bias) {
        BiasSumScratch(b, tokens, layer.outFeatures, autocastLinear ? regime_.compute : types_[i], name, op, index);
      }
      if (saved_[i] != kNoTensor) b.Release(saved_[i], t.Make({op, ": saved tensor freed"}));
      saved_[i] = kNoTensor;
      if (savedWeight_[i] != kNoTensor) b.Release(savedWeight_[i], t.Make({op, ": saved 16-bit weight freed"}));
      savedWeight_[i] = kNoTensor;
      if (gradOut != kNoTensor) b.Release(gradOut, t.Make({op, ": incoming gradient consumed"}));
      if (autocastLinear) {
        // The casts' ToCopyBackward nodes, latest made first: bias, weight, then the input.
        const Text castText = t.Make({name, " autocast cast backward"});
        for (std::size_t k = parameterIndices_[i].size(); k-- > 0;) {
          gradients.Produce(parameterIndices_[i][k], castText);
          b.Release(castGrads_[k], t.Make({name, ": 16-bit gradient cast to fp32"}));
          gradients.RunReady();
        }
        castGrads_.clear();
        if (castInput_[i] && gradIn != kNoTensor) {
          const TensorHandle grad32 = b.Alloc(Category::ActivationGradients, tokens * inWidth * BytesPerElement(inTypes_[i]),
                                              t.Make({name, " grad of input (fp32)"}),
                                              t.Make({name, " input cast backward: gradient to fp32"}),
                                              t.Size({batch_, sequence_, inWidth}, inTypes_[i]), index);
          b.Release(gradIn, t.Make({name, " input cast backward: 16-bit gradient consumed"}));
          gradIn = grad32;
        }
      }
      gradients.RunReady();  // the parameters' AccumulateGrad (and its hooks) after the op
      gradOut = gradIn;
    }
  }

  // addmm's bias gradient is the output gradient summed over its rows (autograd's sum_to, once
  // the node's gradients are made); on CUDA that sum may split its rows across blocks and take a
  // scratch buffer and semaphores from the caching allocator, freed when it returns
  // (sim/reduction.hpp).
  void BiasSumScratch(TraceBuilder& b, std::int64_t rows, std::int64_t outputs, DType type, Text name, Text op,
                      int layer) {
    const ReductionScratch r = LeadingSumScratch(rows, outputs, BytesPerElement(type), gpu_);
    // Noted whether or not this GPU splits the sum: another one may (Trace::gpuReductions).
    b.GpuReduction({rows, outputs, BytesPerElement(type)}, r.bufferBytes + r.semaphoreBytes);
    if (r.bufferBytes <= 0) return;
    TextStore& t = b.text();
    const TensorHandle buffer = b.Alloc(Category::ActivationGradients, r.bufferBytes, t.Make({name, " sum_to scratch"}),
                                        t.Make({op, ": bias gradient's CUDA sum, partial sums"}),
                                        t.Size({r.bufferBytes / 4}, DType::FP32), layer);
    const TensorHandle semaphores = b.Alloc(Category::ActivationGradients, r.semaphoreBytes,
                                            t.Make({name, " sum_to semaphores"}),
                                            t.Make({op, ": bias gradient's CUDA sum, semaphores"}),
                                            t.Size({r.semaphoreBytes}, DType::UInt8), layer);
    const Text freed = t.Make({op, ": sum scratch freed"});
    b.Release(buffer, freed);
    b.Release(semaphores, freed);
  }

  // Under autocast, addmm's backward makes the 16-bit gradients of the weight and bias copies
  // (weight first, bias second in parameterIndices_), kept in castGrads_ for their casts.
  void LinearCastsBackward(TraceBuilder& b, GradientSink&, std::size_t i, Text name, Text op) {
    const LayerDef& layer = layers_[i];
    const DType compute = regime_.compute;
    const int index = static_cast<int>(i);
    TextStore& t = b.text();
    castGrads_.clear();
    castGrads_.push_back(b.Alloc(Category::ActivationGradients, layer.inFeatures * layer.outFeatures * BytesPerElement(compute),
                                 t.Make({name, " grad of weight (16-bit)"}), t.Make({op, ": gradient of the 16-bit weight"}),
                                 t.Size({layer.outFeatures, layer.inFeatures}, compute), index));
    if (layer.bias) {
      castGrads_.push_back(b.Alloc(Category::ActivationGradients, layer.outFeatures * BytesPerElement(compute),
                                   t.Make({name, " grad of bias (16-bit)"}), t.Make({op, ": gradient of the 16-bit bias"}),
                                   t.Size({layer.outFeatures}, compute), index));
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
  std::vector<TensorHandle> savedWeight_;  // autocast: the 16-bit weight copy a linear saves
  std::vector<DType> types_, inTypes_;     // each layer's output and input dtype
  std::vector<bool> castInput_;            // autocast: the linear copied an fp32 input to 16-bit
  GpuParallelism gpu_;                     // sizes the bias sums' CUDA scratch
  std::vector<TensorHandle> castGrads_;    // autocast: a linear's 16-bit weight and bias gradients
  bool lossUpcast_ = false;
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
