// Inventory: every parameter tensor, from the model description.
#include "gpumem/inventory.hpp"

#include <string>

namespace gpumem {

std::int64_t Tensor::Elements() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t Inventory::ParameterCount() const {
  std::int64_t n = 0;
  for (const Tensor& t : parameters) n += t.Elements();
  return n;
}

std::int64_t Inventory::TrainableCount() const {
  std::int64_t n = 0;
  for (const Tensor& t : parameters) if (t.trainable) n += t.Elements();
  return n;
}

Inventory BuildInventory(const Setup& setup) {
  Inventory inv;
  const ModelDef& model = setup.model;
  if (model.kind == ModelKind::ParameterCount) {
    std::int64_t listed = 0;
    for (std::size_t i = 0; i < model.largestMatrices.size(); ++i) {
      const MatrixShape& m = model.largestMatrices[i];
      inv.parameters.push_back({"matrix[" + std::to_string(i) + "]", {m.rows, m.cols}, true, -1});
      listed += m.rows * m.cols;
    }
    if (model.parameterCount > listed) {
      inv.parameters.push_back({"other parameters", {model.parameterCount - listed}, true, -1});
    }
    return inv;
  }
  for (std::size_t i = 0; i < model.layers.size(); ++i) {
    const LayerDef& layer = model.layers[i];
    const std::string prefix = "layers[" + std::to_string(i) + "]";
    const int index = static_cast<int>(i);
    if (layer.kind == LayerKind::Linear) {
      inv.parameters.push_back({prefix + ".weight", {layer.outFeatures, layer.inFeatures}, true, index});
      if (layer.bias) inv.parameters.push_back({prefix + ".bias", {layer.outFeatures}, true, index});
    } else if (layer.kind == LayerKind::Embedding) {
      inv.parameters.push_back({prefix + ".weight", {layer.numEmbeddings, layer.embeddingDim}, true, index});
    }
  }
  return inv;
}

}  // namespace gpumem
