// Optimizer states and the temporaries of optimizer.step(), per implementation.
//
// States (created lazily by the first step, as torch.optim does):
//   SGD: none · SGD with momentum: momentum_buffer (1×) · Adam/AdamW: exp_avg, exp_avg_sq (2×)
//   Adafactor (HF transformers / Shazeer & Stern 2018): for a tensor of shape [..., n, m] a row
//   factor of prod(shape[:-1]) and a column factor of prod(shape[:-2])·m values, a full second
//   moment for vectors, plus a full exp_avg when β1 is set; always fp32.
// Temporaries (intermediates):
//   foreach Adam/AdamW: torch._foreach_sqrt(exp_avg_sqs) makes one state-sized copy of every
//     parameter at once (then divided and ε-added in place, consumed by _foreach_addcdiv_).
//   per-parameter Adam/AdamW: (exp_avg_sq.sqrt() / bias_correction2_sqrt) holds two copies of
//     one parameter for an instant.
//   Adafactor (per parameter): grad², grad²+ε, the factored update and −update: two copies of
//     one parameter at most, plus fp32 copies of a 16-bit parameter and gradient.
//   SGD and momentum (no weight decay): in place, none.
//   fused: the kernel reads and writes in place, none.
//   Mixed precision: the 16-bit gradients are upcast to fp32 for the master update (all at once
//     with foreach, one tensor at a time per parameter, not at all when fused).
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

std::vector<StateTensor> OptimizerStateTensors(const TrainingDef& training, const Regime& regime,
                                               const Tensor& parameter) {
  std::vector<StateTensor> states;
  if (!parameter.trainable) return states;
  const std::int64_t n = parameter.Elements();
  auto full = [&](const char* name, DType type) {
    states.push_back({name, n, type, ShapeFormula(parameter.shape, type)});
  };
  switch (training.optimizer) {
    case OptimizerKind::SGD:
      break;
    case OptimizerKind::SGDMomentum:
      full("momentum_buffer", regime.states);
      break;
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      full("exp_avg", regime.states);
      full("exp_avg_sq", regime.states);
      break;
    case OptimizerKind::Adafactor: {
      const auto& shape = parameter.shape;
      if (shape.size() >= 2) {
        std::vector<std::int64_t> rowShape(shape.begin(), shape.end() - 1);
        std::vector<std::int64_t> colShape(shape.begin(), shape.end() - 2);
        colShape.push_back(shape.back());
        std::int64_t rows = 1, cols = 1;
        for (auto d : rowShape) rows *= d;
        for (auto d : colShape) cols *= d;
        states.push_back({"exp_avg_sq_row", rows, DType::FP32, ShapeFormula(rowShape, DType::FP32)});
        states.push_back({"exp_avg_sq_col", cols, DType::FP32, ShapeFormula(colShape, DType::FP32)});
      } else {
        full("exp_avg_sq", DType::FP32);
      }
      if (training.adafactorBeta1) full("exp_avg", DType::FP32);
      break;
    }
  }
  return states;
}

OptimizerPass::OptimizerPass(const Setup& setup, const Inventory& inventory, const Regime& regime)
    : setup_(setup), inventory_(inventory), regime_(regime) {}

void OptimizerPass::Step(TraceBuilder& b) {
  const TrainingDef& t = setup_.training;
  const std::string name = LabelOf(t.optimizer);

  if (!statesCreated_) {
    for (const Tensor& p : inventory_.parameters) {
      for (const StateTensor& s : OptimizerStateTensors(t, regime_, p)) {
        states_.push_back(b.Alloc(Category::OptimizerStates, s.elements * BytesPerElement(s.type),
                                  p.name + "." + s.name,
                                  "step " + std::to_string(b.step()) + ": " + name + " creates " +
                                      p.name + "." + s.name,
                                  s.formula, p.layer));
      }
    }
    statesCreated_ = true;
  }

  OptimizerImplementation impl = t.optimizerImplementation;
  if (impl == OptimizerImplementation::Fused) return;
  const bool adam = t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW;
  const bool adafactor = t.optimizer == OptimizerKind::Adafactor;
  if (adafactor) impl = OptimizerImplementation::PerParameter;  // HF Adafactor loops
  const bool upcast = regime_.masterWeights;
  const DType stateType = regime_.states;
  const std::int64_t stateBytes = BytesPerElement(stateType);
  auto temp = [&](std::int64_t bytes, const std::string& tensor, const std::string& what,
                  const std::string& formula, int layer = -1) {
    return b.Alloc(Category::OptimizerIntermediates, bytes, tensor, name + " step: " + what,
                   formula, layer);
  };

  if (impl == OptimizerImplementation::ForEach) {
    std::int64_t elements = 0;
    for (const Tensor& p : inventory_.parameters) if (p.trainable) elements += p.Elements();
    TensorHandle grads32 = kNoTensor;
    if (upcast) {
      grads32 = temp(elements * 4, "fp32 gradients (all)", "foreach: gradients upcast to fp32",
                     FormatCount(elements) + " × " + BytesOf(DType::FP32));
    }
    if (adam) {
      TensorHandle denom = temp(elements * stateBytes, "sqrt(exp_avg_sq) (all)",
                                "foreach: _foreach_sqrt(exp_avg_sq) for every parameter",
                                FormatCount(elements) + " × " + BytesOf(stateType));
      b.Release(denom, name + " step: foreach addcdiv done");
    }
    b.Release(grads32, name + " step: fp32 gradients freed");
    return;
  }

  for (const Tensor& p : inventory_.parameters) {
    if (!p.trainable) continue;
    const std::int64_t n = p.Elements();
    TensorHandle grad32 = kNoTensor, param32 = kNoTensor;
    if (upcast || (adafactor && regime_.gradients != DType::FP32)) {
      grad32 = temp(n * 4, p.name + ".grad (fp32)", "gradient of " + p.name + " upcast to fp32",
                    ShapeFormula(p.shape, DType::FP32), p.layer);
    }
    if (adafactor && !upcast && regime_.weights != DType::FP32) {
      param32 = temp(n * 4, p.name + " (fp32)", "fp32 copy of " + p.name,
                     ShapeFormula(p.shape, DType::FP32), p.layer);
    }
    if (adam) {
      const std::string f = ShapeFormula(p.shape, stateType);
      TensorHandle root = temp(n * stateBytes, "sqrt(exp_avg_sq)", "sqrt(exp_avg_sq) of " + p.name, f, p.layer);
      TensorHandle denom = temp(n * stateBytes, "denom", "denominator of " + p.name, f, p.layer);
      b.Release(root, name + " step: sqrt consumed");
      b.Release(denom, name + " step: " + p.name + " updated");
    } else if (adafactor) {
      const std::string f = ShapeFormula(p.shape, DType::FP32);
      TensorHandle square = temp(n * 4, "grad²", "grad² of " + p.name, f, p.layer);
      TensorHandle update = temp(n * 4, "grad² + eps", "grad² + ε of " + p.name, f, p.layer);
      b.Release(square, name + " step: grad² consumed");
      TensorHandle scaled = temp(n * 4, "update", "factored update of " + p.name, f, p.layer);
      b.Release(update, name + " step: grad² + ε consumed");
      TensorHandle negated = temp(n * 4, "-update", "−update applied to " + p.name, f, p.layer);
      b.Release(negated, name + " step: " + p.name + " updated");
      b.Release(scaled, name + " step: update freed");
    }
    b.Release(param32, name + " step: fp32 copy written back");
    b.Release(grad32, name + " step: fp32 gradient freed");
  }
}

}  // namespace gpumem
