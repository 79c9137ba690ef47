// Quick mode: only N is known. Activations come from the published per-token heuristic,
// held as one block from the forward pass until backward has produced every gradient.
#include <cmath>
#include <memory>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/heuristics.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

class QuickPass final : public ModelPass {
 public:
  QuickPass(const Setup& setup, const Inventory& inventory, const Regime& regime)
      : setup_(setup), inventory_(inventory), regime_(regime) {}

  void Forward(TraceBuilder& b) override {
    const std::int64_t batch = setup_.training.batchSize, sequence = setup_.training.sequenceLength;
    // Token ids and labels, int64 each.
    batch_ = b.Alloc(Category::InputBatch, batch * sequence * 8 * 2, "token ids and labels",
                     "batch: token ids and labels",
                     "2 × " + SizeFormula({batch, sequence}, DType::Int64));
    if (regime_.autocast) {
      // Autocast copies every weight to 16-bit once per forward; backward keeps them.
      copies_ = b.Alloc(Category::WeightCopies,
                        setup_.model.parameterCount * BytesPerElement(regime_.compute),
                        "16-bit weight copies", "forward: autocast copies the weights to 16-bit",
                        FormatCount(setup_.model.parameterCount) + " parameters × " +
                            BytesOf(regime_.compute));
    }
    const double perToken = HeuristicActivationValuesPerToken(setup_.model.parameterCount);
    const auto values = static_cast<std::int64_t>(std::llround(perToken));
    const DType act = regime_.activations;
    activations_ = b.Alloc(
        Category::Activations, values * batch * sequence * BytesPerElement(act),
        "activations (heuristic)", "forward: activations saved for backward (per-token heuristic)",
        "heuristic A = 4.6894e-4 × " + FormatCount(setup_.model.parameterCount) + " + 1.8494e6 = " +
            FormatCount(values) + " values/token × " + SizeFormula({batch, sequence}, act));
  }

  void Backward(TraceBuilder& b, GradientSink& gradients) override {
    // Without layers the order of frees is unknown; all gradients appear before the saved
    // activations are released, an upper bound on the backward peak.
    const Text label = b.text().Make({"backward"});
    for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
      gradients.Produce(i, label);
    }
    b.Release(activations_, "backward: saved activations freed");
    b.Release(copies_, "backward: 16-bit weight copies freed");
  }

  void EndStep(TraceBuilder& b) override { b.Release(batch_, "end of step: batch released"); }

 private:
  const Setup& setup_;
  const Inventory& inventory_;
  Regime regime_;
  TensorHandle batch_ = kNoTensor, activations_ = kNoTensor, copies_ = kNoTensor;
};

}  // namespace

std::unique_ptr<ModelPass> MakeQuickPass(const Setup& setup, const Inventory& inventory,
                                         const Regime& regime, std::vector<std::string>& notes) {
  notes.push_back(
      "Quick mode: activations use the published per-token heuristic A = 4.6894e-4·N + 1.8494e6 "
      "values per token (a fit over transformer models, not a count of this model's tensors). "
      "Backward is taken as an upper bound: all gradients exist before activations are freed.");
  if (setup.model.largestMatrices.empty() &&
      (setup.training.optimizer == OptimizerKind::Adafactor ||
       setup.training.optimizerImplementation == OptimizerImplementation::PerParameter)) {
    notes.push_back(
        "No matrix shapes were given: all N parameters are treated as one tensor, so Adafactor "
        "cannot factor them and per-parameter temporaries are an upper bound. List the largest "
        "matrices for a tighter figure.");
  }
  return std::make_unique<QuickPass>(setup, inventory, regime);
}

}  // namespace gpumem
