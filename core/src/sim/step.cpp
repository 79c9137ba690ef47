// The step: init, then two iterations of forward → backward → optimizer step → zero_grad.
#include "gpumem/trace.hpp"

#include <memory>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

std::unique_ptr<ModelPass> MakeLayerListPass(const Setup& setup, const Inventory& inventory,
                                             const Regime& regime);
std::unique_ptr<ModelPass> MakeTransformerPass(const Setup& setup, const Inventory& inventory,
                                               const Regime& regime, std::vector<std::string>& notes);
std::unique_ptr<ModelPass> MakeQuickPass(const Setup& setup, const Inventory& inventory,
                                         const Regime& regime, std::vector<std::string>& notes);

TensorHandle TraceBuilder::Alloc(Category category, std::int64_t bytes, std::string tensor,
                                 std::string label, std::string formula, int layer) {
  Event e;
  e.kind = EventKind::Alloc;
  e.tensorId = nextId_++;
  e.bytes = bytes;
  e.category = category;
  e.phase = phase_;
  e.step = step_;
  e.layer = layer;
  e.label = std::move(label);
  e.tensor = std::move(tensor);
  e.formula = std::move(formula);
  live_[e.tensorId] = Live{trace_.events.size(), 1};
  trace_.events.push_back(std::move(e));
  return trace_.events.back().tensorId;
}

TensorHandle TraceBuilder::Retain(TensorHandle handle) {
  if (auto it = live_.find(handle); it != live_.end()) ++it->second.holders;
  return handle;
}

void TraceBuilder::Release(TensorHandle handle, const std::string& label) {
  auto it = live_.find(handle);
  if (it == live_.end()) return;
  if (--it->second.holders > 0) return;
  Event e = trace_.events[it->second.allocEvent];
  e.kind = EventKind::Free;
  e.phase = phase_;
  e.step = step_;
  e.label = label;
  live_.erase(it);
  trace_.events.push_back(std::move(e));
}

Regime RegimeOf(Precision precision) {
  switch (precision) {
    case Precision::FP32:
      return {DType::FP32, DType::FP32, DType::FP32, DType::FP32, false, false, false, DType::FP32};
    case Precision::FP16Mixed:
      return {DType::FP16, DType::FP16, DType::FP32, DType::FP16, true, true, false, DType::FP16};
    case Precision::BF16Mixed:
      return {DType::BF16, DType::BF16, DType::FP32, DType::BF16, true, true, false, DType::BF16};
    case Precision::BF16:
      return {DType::BF16, DType::BF16, DType::BF16, DType::BF16, false, false, false, DType::BF16};
    case Precision::AmpBF16:
      return {DType::FP32, DType::FP32, DType::FP32, DType::BF16, false, true, true, DType::BF16};
    case Precision::AmpFP16:
      return {DType::FP32, DType::FP32, DType::FP32, DType::FP16, false, true, true, DType::FP16};
  }
  return {DType::FP32, DType::FP32, DType::FP32, DType::FP32, false, false, false, DType::FP32};
}

GradientSink::GradientSink(TraceBuilder& builder, const Inventory& inventory, const Regime& regime)
    : builder_(builder), inventory_(inventory), regime_(regime),
      grads_(inventory.parameters.size(), kNoTensor) {}

void GradientSink::Produce(std::size_t index, const std::string& label) {
  const Tensor& p = inventory_.parameters[index];
  if (!p.trainable) return;
  const std::int64_t bytes = p.Elements() * BytesPerElement(regime_.gradients);
  const std::string formula = ShapeFormula(p.shape, regime_.gradients);
  if (grads_[index] == kNoTensor) {
    grads_[index] = builder_.Alloc(Category::Gradients, bytes, p.name + ".grad",
                                   label + ": " + p.name + ".grad", formula, p.layer);
    return;
  }
  // .grad already exists (kept by zero_grad(set_to_none=False)): the new gradient is added
  // into it in place and then freed.
  TensorHandle fresh = builder_.Alloc(Category::Gradients, bytes, p.name + " new gradient",
                                      label + ": new gradient of " + p.name, formula, p.layer);
  builder_.Release(fresh, label + ": accumulated into " + p.name + ".grad");
}

void GradientSink::ReleaseAll(const std::string& label) {
  for (TensorHandle& h : grads_) {
    builder_.Release(h, label);
    h = kNoTensor;
  }
}

Trace BuildTrace(const Setup& setup, const Inventory& inventory) {
  Trace trace;
  TraceBuilder b(trace);
  const Regime regime = RegimeOf(setup.training.precision);

  b.SetPhase(Phase::Init, 0);
  for (const Tensor& p : inventory.parameters) {
    b.Alloc(Category::Parameters, p.Elements() * BytesPerElement(regime.weights), p.name,
            "model init: " + p.name, ShapeFormula(p.shape, regime.weights), p.layer);
  }
  if (regime.masterWeights) {
    for (const Tensor& p : inventory.parameters) {
      if (!p.trainable) continue;
      b.Alloc(Category::MasterWeights, p.Elements() * 4, p.name + " (fp32 master)",
              "optimizer construction: fp32 master copy of " + p.name,
              ShapeFormula(p.shape, DType::FP32), p.layer);
    }
  }

  std::unique_ptr<ModelPass> pass =
      setup.model.kind == ModelKind::ParameterCount ? MakeQuickPass(setup, inventory, regime, trace.notes)
      : setup.model.kind == ModelKind::Transformer  ? MakeTransformerPass(setup, inventory, regime, trace.notes)
                                                    : MakeLayerListPass(setup, inventory, regime);
  GradientSink gradients(b, inventory, regime);
  OptimizerPass optimizer(setup, inventory, regime);

  for (int step = 1; step <= 2; ++step) {
    b.SetPhase(Phase::Forward, step);
    pass->Forward(b);
    b.SetPhase(Phase::Backward, step);
    pass->Backward(b, gradients);
    b.SetPhase(Phase::OptimizerStep, step);
    optimizer.Step(b);
    if (setup.training.zeroGradSetToNone) gradients.ReleaseAll("zero_grad(set_to_none=True)");
    pass->EndStep(b);
  }

  if (regime.masterWeights) {
    trace.notes.push_back(std::string(LabelOf(setup.training.precision)) +
                          ": weights, gradients and activations are 16-bit; the optimizer "
                          "keeps an fp32 master copy and fp32 states (16 B per parameter "
                          "with Adam, before activations).");
  }
  return trace;
}

}  // namespace gpumem
