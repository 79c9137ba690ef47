// MixtralSparseMoeBlock, with tokens routed evenly: expert e receives ⌊T·k/E⌋ tokens, the first
// (T·k mod E) experts one more. Saved activations depend only on the total T·k, so imbalance
// changes the transients, not the saved total. Qwen2-MoE adds a shared expert with a sigmoid gate;
// Qwen2-MoE and Qwen3-MoE renormalise the top-k weights only under norm_topk_prob.
#include "sim/blocks/blocks.hpp"
#include "parallel/expert_split.hpp"

namespace gpumem::blocks {

namespace {

// Qwen2-MoE's shared expert (Qwen2MoeSparseMoeBlock: shared_expert, then
// sigmoid(shared_expert_gate(x)) × its output), Megatron's SharedExpertMLP.forward
// (megatron/core/transformer/moe/shared_experts.py): the MLP on `input`, the gate's linear on
// `gateInput` (the rank's tokens, flat: Megatron's gate_weight [1, h] multiplies the unsplit,
// sequence-sharded hidden states). Returns the gated output, shaped as `gateInput`'s rows × h.
ValueId SharedExpert(Model& m, ValueId input, ValueId gateInput, const Module& block) {
  Tape& t = m.t;
  const ArchitectureDef& a = m.a;
  ValueId shared = GatedMlp(m, input, m.Child(block, "mlp.shared_expert."), a.sharedExpertIntermediateSize,
                            "gate_proj", "up_proj", "down_proj", "shared expert");
  if (t.ShapeOf(shared).rank != t.ShapeOf(gateInput).rank) {
    const ValueId flat = ops::View(t, shared, {t.ShapeOf(gateInput)[0], a.hiddenSize}, "shared expert view(-1, hidden)");
    t.Drop(shared);
    shared = flat;
  }
  if (a.sharedExpertGate) {
    const ValueId g = Linear(m, gateInput, m.Child(block, "mlp.shared_expert_gate"), 1, "shared_expert_gate");
    const ValueId sg = ops::SavesOutput(t, g, "sigmoid(shared_expert_gate)", t.TypeOf(g));
    t.Drop(g);
    const ValueId gated = ops::Mul(t, sg, shared, "gate × shared expert");
    t.Drop(sg);
    t.Drop(shared);
    shared = gated;
  }
  return shared;
}

}  // namespace

ValueId MoE(Model& m, ValueId x, const Module& block) {
  Tape& t = m.t;
  const ArchitectureDef& a = m.a;
  // The rank's tokens: b·s, or b·s/t under sequence parallelism.
  const std::int64_t h = a.hiddenSize, E = a.numExperts, k = a.expertsPerToken,
                     T = t.ShapeOf(x)[0] * t.ShapeOf(x)[1];
  const ValueId flat = ops::View(t, x, {T, h}, "view(-1, hidden)");
  // Megatron's MoE layer (expert or sequence parallelism: expert_split.hpp) computes the shared
  // expert before routing (moe_layer.py MoELayer.forward: shared_experts_compute, then route);
  // under sequence parallelism its column-parallel linears all-gather the s/t tokens of x.
  const bool dispatcher = m.expertShards > 1 || m.sequenceShards > 1;
  const ValueId sharedFirst = dispatcher && a.sharedExpertIntermediateSize > 0 ? SharedExpert(m, x, flat, block) : kNoValue;
  const ValueId router = Linear(m, flat, m.Child(block, "block_sparse_moe.gate"), E, "router logits");
  const ValueId probs = ops::Softmax(t, router, "router softmax (fp32)", DType::FP32);
  t.Drop(router);
  const ValueId selected = t.Fresh({T, k}, DType::Int64, "selected_experts");
  const ValueId top = t.Apply({.name = "topk weights", .inputs = {{probs}}, .shape = {T, k},
                               .type = DType::FP32, .saves = {selected}});
  t.Drop(probs);
  // norm_topk_prob: `routing_weights /= routing_weights.sum(dim=-1, keepdim=True)` (Mixtral's
  // block always; Qwen2MoeSparseMoeBlock and Qwen3MoeSparseMoeBlock only when the config says so).
  ValueId routed = top;
  if (a.normTopkProb) {
    const ValueId sum = t.Apply({.name = "routing sum", .inputs = {{top}}, .shape = {T, 1}, .type = DType::FP32});
    routed = t.Apply({.name = "routing /= sum", .inputs = {{top}, {sum}}, .shape = {T, k}, .type = DType::FP32,
                      .saves = {top, sum}});
    t.Drop(sum);
    t.Drop(top);
  }
  const ValueId weights = ops::To(t, routed, t.TypeOf(flat));
  t.Drop(routed);
  // Expert parallelism: Megatron's all-to-all dispatcher and the rank's E/e experts.
  if (dispatcher) {
    return expert_split::ExpertParallelTail(m, flat, weights, selected, sharedFirst, t.ShapeOf(x), block);
  }
  ValueId final = t.Fresh({T, h}, t.TypeOf(flat), "final_hidden_states (zeros)");
  const ValueId expertMask = t.Fresh({E, k, T}, DType::Int64, "expert_mask (one_hot)");
  const std::int64_t inter = ExpertIntermediateSize(a);
  const Module experts = m.Child(block, kExpertsModule);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t n = (T * k) / E + (e < (T * k) % E ? 1 : 0);
    if (n == 0) continue;
    const Module expert = m.Indexed(experts, "", e);
    const Text label = t.T({"expert ", TextPart::Int(e)});
    const ValueId idx = t.Fresh({n}, DType::Int64, t.T({label, " idx"}));
    const ValueId topX = t.Fresh({n}, DType::Int64, t.T({label, " top_x"}));
    const ValueId state = t.Apply({.name = t.T({label, " hidden_states[top_x]"}), .inputs = {{flat}},
                                   .shape = {n, h}, .type = t.TypeOf(flat), .saves = {topX}});
    const ValueId out = GatedMlp(m, state, expert, inter, "w1", "w3", "w2", label);
    t.Drop(state);
    const ValueId w = t.Apply({.name = t.T({label, " routing_weights[top_x, idx]"}), .inputs = {{weights}},
                               .shape = {n, 1}, .type = t.TypeOf(weights), .saves = {topX, idx}});
    const ValueId scaled = ops::Mul(t, out, w, t.T({label, " output × routing weight"}));
    t.Drop(out);
    t.Drop(w);
    const ValueId cast = ops::To(t, scaled, t.TypeOf(flat));
    t.Drop(scaled);
    // index_add_'s backward expands the gradient "as source": it keeps the source tensor.
    const ValueId added = t.Apply({.name = t.T({label, " index_add_"}),
                                   .inputs = {{final, In::PassThrough}, {cast}},
                                   .shape = {T, h}, .type = t.TypeOf(final), .saves = {topX, cast},
                                   .viewOf = final});
    t.Drop(final);
    final = added;
    t.Drop(cast);
    t.Drop(idx);
    t.Drop(topX);
  }
  t.Drop(expertMask);
  t.Drop(weights);
  t.Drop(selected);
  if (a.sharedExpertIntermediateSize > 0) {
    const ValueId shared = SharedExpert(m, flat, flat, block);
    const ValueId sum2 = ops::Add(t, final, shared, "routed + shared");
    t.Drop(final);
    t.Drop(shared);
    final = sum2;
  }
  t.Drop(flat);
  const ValueId y = ops::View(t, final, {m.b, m.s, h}, "reshape(b, s, hidden)");
  t.Drop(final);
  return y;
}

}  // namespace gpumem::blocks
