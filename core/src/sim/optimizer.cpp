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

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

StateTensors OptimizerStateTensors(const TrainingDef& training, const Regime& regime,
                                               const Tensor& parameter) {
  StateTensors states;
  auto push = [&states](const StateTensor& s) { states.items[states.count++] = s; };
  if (!parameter.trainable) return states;
  const std::int64_t n = parameter.Elements();
  // torch.zeros_like(p): a parameter kept in a dtype of its own (fp32 adapters) keeps its states
  // in that dtype (finetune.hpp StateTypeOf).
  const DType stateType = StateTypeOf(parameter, regime.states);
  auto full = [&](const char* name, DType type) { push({name, n, type, Shape(parameter.shape)}); };
  switch (training.optimizer) {
    case OptimizerKind::SGD:
      break;
    case OptimizerKind::SGDMomentum:
      full("momentum_buffer", stateType);
      break;
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      full("exp_avg", stateType);
      full("exp_avg_sq", stateType);
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
        push({"exp_avg_sq_row", rows, DType::FP32, Shape(rowShape)});
        push({"exp_avg_sq_col", cols, DType::FP32, Shape(colShape)});
      } else {
        full("exp_avg_sq", DType::FP32);
      }
      if (training.adafactorBeta1) full("exp_avg", DType::FP32);
      break;
    }
  }
  return states;
}

OptimizerPass::OptimizerPass(const Setup& setup, const Inventory& inventory,
                             const std::vector<Text>& names, const Regime& regime)
    : setup_(setup), inventory_(inventory), names_(names), regime_(regime) {}

void OptimizerPass::Step(TraceBuilder& b) {
  const TrainingDef& t = setup_.training;
  const TextPart name = TextPart::View(LabelOf(t.optimizer));
  TextStore& text = b.text();

  if (!statesCreated_) {
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
      const Tensor& p = inventory_.parameters[i];
      for (const StateTensor& s : OptimizerStateTensors(t, regime_, p)) {
        const TextPart state = TextPart::View(s.name);  // a literal
        states_.push_back(b.Alloc(Category::OptimizerStates, s.elements * BytesPerElement(s.type),
                                  text.Make({names_[i], ".", state}),
                                  text.Make({"step ", TextPart::Int(b.step()), ": ", name, " creates ",
                                             names_[i], ".", state}),
                                  text.Shape(s.shape, s.type), p.layer));
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
  const Text step = text.Make({name, " step: "});
  auto temp = [&](std::int64_t bytes, Text tensor, Text what, Text formula, int layer = -1) {
    return b.Alloc(Category::OptimizerIntermediates, bytes, tensor, text.Make({step, what}), formula, layer);
  };

  if (impl == OptimizerImplementation::ForEach) {
    std::int64_t elements = 0, stateBytesAll = 0, upcastElements = 0;
    for (const Tensor& p : inventory_.parameters) {
      if (!p.trainable) continue;
      elements += p.Elements();
      stateBytesAll += p.Elements() * BytesPerElement(StateTypeOf(p, stateType));
      if (HasMasterCopy(p, upcast)) upcastElements += p.Elements();
    }
    TensorHandle grads32 = kNoTensor;
    if (upcastElements > 0) {  // the 16-bit parameters with an fp32 master (all but own-dtype ones)
      grads32 = temp(upcastElements * 4, text.Make({"fp32 gradients (all)"}),
                     text.Make({"foreach: gradients upcast to fp32"}),
                     text.Make({TextPart::Count(upcastElements), " × ", TextPart::Bytes(DType::FP32)}));
    }
    if (adam) {
      TensorHandle denom = temp(stateBytesAll, text.Make({"sqrt(exp_avg_sq) (all)"}),
                                text.Make({"foreach: _foreach_sqrt(exp_avg_sq) for every parameter"}),
                                text.Make({TextPart::Count(elements), " × ", TextPart::Bytes(stateType)}));
      b.Release(denom, text.Make({step, "foreach addcdiv done"}));
    }
    b.Release(grads32, text.Make({step, "fp32 gradients freed"}));
    return;
  }

  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    const Tensor& p = inventory_.parameters[i];
    if (!p.trainable) continue;
    const Text pname = names_[i];
    const Shape shape(p.shape);
    const std::int64_t n = p.Elements();
    TensorHandle grad32 = kNoTensor, param32 = kNoTensor;
    if (HasMasterCopy(p, upcast) || (adafactor && GradientTypeOf(p, regime_.gradients) != DType::FP32)) {
      grad32 = temp(n * 4, text.Make({pname, ".grad (fp32)"}),
                    text.Make({"gradient of ", pname, " upcast to fp32"}), text.Shape(shape, DType::FP32), p.layer);
    }
    if (adafactor && !upcast && regime_.weights != DType::FP32) {
      param32 = temp(n * 4, text.Make({pname, " (fp32)"}), text.Make({"fp32 copy of ", pname}),
                     text.Shape(shape, DType::FP32), p.layer);
    }
    if (adam) {
      const DType own = StateTypeOf(p, stateType);
      const Text f = text.Shape(shape, own);
      TensorHandle root = temp(n * BytesPerElement(own), text.Make({"sqrt(exp_avg_sq)"}),
                               text.Make({"sqrt(exp_avg_sq) of ", pname}), f, p.layer);
      TensorHandle denom = temp(n * BytesPerElement(own), text.Make({"denom"}), text.Make({"denominator of ", pname}), f, p.layer);
      b.Release(root, text.Make({step, "sqrt consumed"}));
      b.Release(denom, text.Make({step, pname, " updated"}));
    } else if (adafactor) {
      const Text f = text.Shape(shape, DType::FP32);
      TensorHandle square = temp(n * 4, text.Make({"grad²"}), text.Make({"grad² of ", pname}), f, p.layer);
      TensorHandle update = temp(n * 4, text.Make({"grad² + eps"}), text.Make({"grad² + ε of ", pname}), f, p.layer);
      b.Release(square, text.Make({step, "grad² consumed"}));
      TensorHandle scaled = temp(n * 4, text.Make({"update"}), text.Make({"factored update of ", pname}), f, p.layer);
      b.Release(update, text.Make({step, "grad² + ε consumed"}));
      TensorHandle negated = temp(n * 4, text.Make({"-update"}), text.Make({"−update applied to ", pname}), f, p.layer);
      b.Release(negated, text.Make({step, pname, " updated"}));
      b.Release(scaled, text.Make({step, "update freed"}));
    }
    b.Release(param32, text.Make({step, "fp32 copy written back"}));
    b.Release(grad32, text.Make({step, "fp32 gradient freed"}));
  }
}

}  // namespace gpumem
