// The word embedding, and what Megatron's VocabParallelEmbedding adds to it under tensor
// parallelism.
#include "sim/blocks/blocks.hpp"
#include "sim/ops.hpp"

namespace gpumem::blocks {

// megatron/core/tensor_parallel/layers.py VocabParallelEmbedding.forward, with t > 1: the ids
// outside the rank's slice of the vocabulary are masked (input_mask, a bool [b, s]), looked up
// as id 0, and their rows zeroed in place, `output_parallel[input_mask, :] = 0.0`. That in-place
// index_put_ keeps the mask for backward, and its backward (derivatives.yaml index_put_: self
// `grad.index_put(indices, zeros_like(values), accumulate)`) makes a new [b, s, h] gradient
// before the embedding's own. Measured: scripts/validate_tensor.py's first pipeline stages.
ValueId WordEmbedding(Model& m, ValueId ids, ValueId weight, TextPart name) {
  Tape& t = m.t;
  ValueId out = ops::Embedding(t, ids, weight, m.a.hiddenSize, name);
  if (m.vocabShards > 1) {
    const ValueId looked = out;
    out = t.Apply({.name = "output_parallel[input_mask, :] = 0.0 (VocabParallelEmbedding)",
                   .inputs = {{looked}},
                   .shape = t.ShapeOf(looked),
                   .type = t.TypeOf(looked),
                   .saveNew = {{t.ShapeOf(ids), DType::Bool, "input_mask"}},
                   .viewOf = looked});
    t.Drop(looked);
  }
  // enable_input_require_grads' hook sees the module's output.
  if (m.embeddingsRequireGrad) t.RequireGrad(out, m.embeddingsHeldByGraph);
  return out;
}

}  // namespace gpumem::blocks
