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

ValueId ExpertParallelTail(Model& m, ValueId flat, ValueId weights, ValueId selected, const Module& block) {
  Tape& t = m.t;
  const ArchitectureDef& a = m.a;
  const std::int64_t h = a.hiddenSize, k = a.expertsPerToken, T = m.b * m.s, TK = T * k;
  const std::int64_t local = a.numExperts / m.expertShards;
  const DType type = t.TypeOf(flat);
  // moe_utils.permute: the token copies sorted by expert (index_select saves its indices).
  const ValueId sortedIndices = t.Fresh({TK}, DType::Int64, "sorted_indices");
  const ValueId permuted = t.Apply({.name = "dispatch: permute (index_select)", .inputs = {{flat}}, .shape = {TK, h},
                                    .type = type, .saves = {sortedIndices}});
  t.Drop(flat);
  // tensor_parallel.all_to_all over the expert-parallel group: a new [T·k, h] of what the
  // group sends this rank's experts (balanced: T·k rows); its backward is the reverse exchange.
  ValueId received = t.Apply({.name = "dispatch: all-to-all (expert parallel)", .inputs = {{permuted}},
                              .shape = {TK, h}, .type = type});
  t.Drop(permuted);
  if (local > 1) {
    // sort_chunks_by_idxs: chunks regrouped by local expert (a torch.cat, a new tensor).
    const ValueId sorted = t.Apply({.name = "dispatch: sort_chunks_by_idxs", .inputs = {{received}},
                                    .shape = {TK, h}, .type = type});
    t.Drop(received);
    received = sorted;
  }
  // The local experts (SequentialMLP), each on its share of the received rows, written into
  // the concatenated output.
  ValueId combined = t.Fresh({TK, h}, type, "expert outputs (torch.cat)");
  const std::int64_t inter = ExpertIntermediateSize(a);
  const Module experts = m.Child(block, "block_sparse_moe.experts.");
  for (std::int64_t e = 0; e < local; ++e) {
    const std::int64_t n = TK / local + (e < TK % local ? 1 : 0);
    if (n == 0) continue;
    const Text label = t.T({"local expert ", TextPart::Int(e)});
    const ValueId rows = t.Apply({.name = t.T({label, " tokens (split)"}), .inputs = {{received}}, .shape = {n, h},
                                  .type = type});
    const ValueId out = blocks::GatedMlp(m, rows, m.Indexed(experts, "", e), inter, "w1", "w3", "w2", label);
    t.Drop(rows);
    const ValueId into = t.Apply({.name = t.T({label, " output into cat"}),
                                  .inputs = {{combined, In::PassThrough}, {out, In::PassThrough}},
                                  .shape = {TK, h}, .type = type, .viewOf = combined});
    t.Drop(combined);
    t.Drop(out);
    combined = into;
  }
  t.Drop(received);
  if (local > 1) {
    const ValueId unsorted = t.Apply({.name = "combine: sort_chunks_by_idxs", .inputs = {{combined}},
                                      .shape = {TK, h}, .type = type});
    t.Drop(combined);
    combined = unsorted;
  }
  const ValueId returned = t.Apply({.name = "combine: all-to-all (expert parallel)", .inputs = {{combined}},
                                    .shape = {TK, h}, .type = type});
  t.Drop(combined);
  // moe_utils.unpermute: the rows × their routing probabilities (both saved: each needs the
  // other's gradient), then scatter_add_ into [T, h] (saves the indices).
  const ValueId probs = t.Apply({.name = "combine: permuted probs", .inputs = {{weights}}, .shape = {TK, 1},
                                 .type = t.TypeOf(weights), .saves = {sortedIndices}});
  t.Drop(weights);
  t.Drop(selected);
  const ValueId scaled = ops::Mul(t, returned, probs, "combine: rows × probs");
  t.Drop(returned);
  t.Drop(probs);
  const ValueId final = t.Apply({.name = "combine: unpermute (scatter_add_)", .inputs = {{scaled}}, .shape = {T, h},
                                 .type = type, .saves = {sortedIndices}});
  t.Drop(scaled);
  t.Drop(sortedIndices);
  const ValueId y = ops::View(t, final, {m.b, m.s, h}, "reshape(b, s, hidden)");
  t.Drop(final);
  return y;
}

}  // namespace gpumem::expert_split
