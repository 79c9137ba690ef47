// Expert parallelism (Megatron --expert-model-parallel-size e) on the simulated rank
// (docs/parallel.md, "Expert parallelism"): the rank holds E/e of every block's experts and runs
// them on the tokens every rank of its expert-parallel group routes to them, through
// MoEAlltoAllTokenDispatcher's permute → all-to-all → sort_chunks → experts → sort_chunks →
// all-to-all → unpermute (megatron/core/transformer/moe/token_dispatcher.py, moe_utils.py).
#pragma once

#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"
#include "sim/model.hpp"

namespace gpumem::expert_split {

// Whether an inventory tensor is one expert's weight ("…block_sparse_moe.experts.<i>.w1.weight").
bool IsExpertTensor(const Tensor& t);

// The rank's inventory: experts 0 … E/e − 1 of each block (expert-parallel rank 0's; every
// rank holds as many, validation requires e to divide E). The router stays whole (E outputs).
void KeepLocalExperts(const Setup& setup, Inventory& inventory);

// MixtralSparseMoeBlock's tail as Megatron's MoE layer runs it, after the router (`flat` [T, h]
// of the rank's T tokens — b·s, or b·s/t under sequence parallelism —, the routing `weights`
// [T, k] and `selected` [T, k], the caller's references, released here; `shared`, the shared
// expert's gated [T, h] output computed before routing, or kNoValue):
// permute → all-to-all over the e expert-parallel ranks (when e > 1) → all-gather over the etp
// expert-tensor-parallel ranks (when etp > 1) → sort_chunks → the E/e local experts, 1/etp wide
// → sort_chunks → reduce-scatter over etp → all-to-all back → unpermute (+ shared). With
// balanced routing each rank receives T·k·etp rows, (T·k·etp)/(E/e) per local expert.
// Returns the rank's output in `outShape` ([b, s, h] or [b, s/t, h]).
ValueId ExpertParallelTail(Model& m, ValueId flat, ValueId weights, ValueId selected, ValueId shared,
                           const Shape& outShape, const Module& block);

}  // namespace gpumem::expert_split
