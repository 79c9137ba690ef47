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

// MixtralSparseMoeBlock's tail under expert parallelism, after the router (`flat` [T, h], the
// routing `weights` [T, k] and `selected` [T, k], the caller's references, released here):
// with balanced routing every rank sends T·k/e token copies to each rank of the group and
// receives T·k in all, (T·k)/(E/e) per local expert. Returns [b, s, h].
ValueId ExpertParallelTail(Model& m, ValueId flat, ValueId weights, ValueId selected, const Module& block);

}  // namespace gpumem::expert_split
