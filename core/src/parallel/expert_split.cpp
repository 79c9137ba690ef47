// Megatron's all-to-all token dispatcher on the simulated expert-parallel rank (expert_split.hpp).
#include "parallel/expert_split.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "sim/blocks/blocks.hpp"

namespace gpumem::expert_split {
namespace {

constexpr std::string_view kExperts = ".experts.";

// The expert index in "…experts.<i>.…", or -1.
std::int64_t ExpertIndex(const std::string& name) {
  const std::size_t at = name.find(kExperts);
  if (at == std::string::npos) return -1;
  return std::strtoll(name.c_str() + at + kExperts.size(), nullptr, 10);
}

}  // namespace

bool IsExpertTensor(const Tensor& t) { return ExpertIndex(t.name) >= 0; }

void KeepLocalExperts(const Setup& setup, Inventory& inventory) {
  const std::int64_t e = setup.parallel.expertParallel;
  const ArchitectureDef& a = setup.model.architecture;
  if (e <= 1 || setup.model.kind != ModelKind::Transformer || a.numExperts == 0) return;
  const std::int64_t local = a.numExperts / e;
  auto& p = inventory.parameters;
  p.erase(std::remove_if(p.begin(), p.end(), [&](const Tensor& t) { return ExpertIndex(t.name) >= local; }), p.end());
}

ValueId ExpertParallelTail(Model& m, ValueId flat, ValueId weights, ValueId selected, ValueId shared,
                           const Shape& outShape, const Module& block) {
  Tape& t = m.t;
  const ArchitectureDef& a = m.a;
  const std::int64_t h = a.hiddenSize, k = a.expertsPerToken, T = t.ShapeOf(flat)[0], TK = T * k;
  const std::int64_t e = m.expertShards, etp = m.expertTensorShards;
  const std::int64_t local = a.numExperts / e;
  // Rows the rank's experts see: T·k from the expert-parallel group, times etp after the
  // expert-tensor-parallel all-gather.
  const std::int64_t rows = TK * etp;
  const DType type = t.TypeOf(flat);
  // moe_utils.permute: the token copies sorted by expert (index_select saves its indices).
  const ValueId sortedIndices = t.Fresh({TK}, DType::Int64, "sorted_indices");
  ValueId received = t.Apply({.name = "dispatch: permute (index_select)", .inputs = {{flat}}, .shape = {TK, h},
                              .type = type, .saves = {sortedIndices}});
  t.Drop(flat);
  if (e > 1) {
    // token_dispatch: tensor_parallel.all_to_all over the expert-parallel group, a new [T·k, h]
    // of what the group sends this rank's experts (balanced: T·k rows); its backward is the
    // reverse exchange. With one rank (_AllToAll.forward, mappings.py) the input passes through.
    const ValueId exchanged = t.Apply({.name = "dispatch: all-to-all (expert parallel)", .inputs = {{received}},
                                       .shape = {TK, h}, .type = type});
    t.Drop(received);
    received = exchanged;
  }
  if (etp > 1) {
    // dispatch_postprocess with tp_size > 1 (the expert tensor parallel group): the rows of
    // the etp ranks gathered, gather_from_sequence_parallel_region → a new [T·k·etp, h]; its
    // backward (_reduce_scatter_along_first_dim) makes the [T·k, h] gradient.
    const ValueId gathered = t.Apply({.name = "dispatch: all-gather (expert tensor parallel)", .inputs = {{received}},
                                      .shape = {rows, h}, .type = type});
    t.Drop(received);
    received = gathered;
  }
  if (local > 1) {
    // sort_chunks_by_idxs: chunks regrouped by local expert (a torch.cat, a new tensor).
    const ValueId sorted = t.Apply({.name = "dispatch: sort_chunks_by_idxs", .inputs = {{received}},
                                    .shape = {rows, h}, .type = type});
    t.Drop(received);
    received = sorted;
  }
  // The local experts (SequentialMLP), each on its share of the received rows, written into
  // the concatenated output. Each expert's fc1 is column- and fc2 row-parallel over the expert
  // tensor parallel group (its width is the rank's 1/etp) with no communication of their own:
  // the dispatcher gathers and scatters the rows, so no sequence-parallel hooks run in them.
  const std::int64_t sequenceShards = m.sequenceShards;
  m.sequenceShards = 1;
  ValueId combined = t.Fresh({rows, h}, type, "expert outputs (torch.cat)");
  const std::int64_t inter = ExpertIntermediateSize(a);
  const Module experts = m.Child(block, kExpertsModule);
  for (std::int64_t i = 0; i < local; ++i) {
    const std::int64_t n = rows / local + (i < rows % local ? 1 : 0);
    if (n == 0) continue;
    const Text label = t.T({"local expert ", TextPart::Int(i)});
    const ValueId share = t.Apply({.name = t.T({label, " tokens (split)"}), .inputs = {{received}}, .shape = {n, h},
                                   .type = type});
    const ValueId out = blocks::GatedMlp(m, share, m.Indexed(experts, "", i), inter, "w1", "w3", "w2", label);
    t.Drop(share);
    const ValueId into = t.Apply({.name = t.T({label, " output into cat"}),
                                  .inputs = {{combined, In::PassThrough}, {out, In::PassThrough}},
                                  .shape = {rows, h}, .type = type, .viewOf = combined});
    t.Drop(combined);
    t.Drop(out);
    combined = into;
  }
  m.sequenceShards = sequenceShards;
  t.Drop(received);
  if (local > 1) {
    const ValueId unsorted = t.Apply({.name = "combine: sort_chunks_by_idxs", .inputs = {{combined}},
                                      .shape = {rows, h}, .type = type});
    t.Drop(combined);
    combined = unsorted;
  }
  if (etp > 1) {
    // combine_preprocess: reduce_scatter_to_sequence_parallel_region over the expert tensor
    // parallel group sums the row-parallel fc2's partial outputs and keeps the rank's T·k rows
    // (a new [T·k, h]; its backward all-gathers a [T·k·etp, h] gradient). Megatron casts to the
    // probabilities' dtype around it; here the routing weights are in the activations' dtype.
    const ValueId scattered = t.Apply({.name = "combine: reduce-scatter (expert tensor parallel)",
                                       .inputs = {{combined}}, .shape = {TK, h}, .type = type});
    t.Drop(combined);
    combined = scattered;
  }
  if (e > 1) {
    const ValueId returned = t.Apply({.name = "combine: all-to-all (expert parallel)", .inputs = {{combined}},
                                      .shape = {TK, h}, .type = type});
    t.Drop(combined);
    combined = returned;
  }
  // moe_utils.unpermute: the rows × their routing probabilities (both saved: each needs the
  // other's gradient), then scatter_add_ into [T, h] (saves the indices).
  const ValueId probs = t.Apply({.name = "combine: permuted probs", .inputs = {{weights}}, .shape = {TK, 1},
                                 .type = t.TypeOf(weights), .saves = {sortedIndices}});
  t.Drop(weights);
  t.Drop(selected);
  const ValueId scaled = ops::Mul(t, combined, probs, "combine: rows × probs");
  t.Drop(combined);
  t.Drop(probs);
  ValueId final = t.Apply({.name = "combine: unpermute (scatter_add_)", .inputs = {{scaled}}, .shape = {T, h},
                           .type = type, .saves = {sortedIndices}});
  t.Drop(scaled);
  t.Drop(sortedIndices);
  if (shared != kNoValue) {
    // MoELayer.postprocess: output + shared_expert_output.
    const ValueId sum = ops::Add(t, final, shared, "routed + shared");
    t.Drop(final);
    t.Drop(shared);
    final = sum;
  }
  const ValueId y = ops::View(t, final, outShape, "reshape(b, s, hidden)");
  t.Drop(final);
  return y;
}

}  // namespace gpumem::expert_split
