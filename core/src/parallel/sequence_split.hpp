// Megatron's sequence parallelism, as the simulated rank's ops (docs/parallel.md, "Sequence
// parallelism"). With --sequence-parallel and tensor parallel t, what sits outside the column /
// row linears (norms, residual adds, dropout, the hidden states between blocks) holds s/t tokens
// per rank; a column-parallel linear all-gathers its input, a row-parallel one reduce-scatters
// its output. Hooks called from the families (embeddings, head), blocks::Linear and the
// attention / MLP blocks (RowParallelOutput) when Model::sequenceShards > 1.
#pragma once

#include "sim/families/family.hpp"

namespace gpumem::sequence_split {

// Whether x is a sequence-sharded activation ([b, s/t, …]) that a linear must all-gather first.
bool IsSequenceSharded(const Model& m, ValueId x);

// megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication with
// sequence_parallel=True: forward all-gathers the [b, s/t, h] input into the persistent global
// memory buffer "mpu" (megatron/core/utils.py GlobalMemoryBuffer, allocated by the rank's init
// here: ParallelStep::Init), multiplies, and saves the *sharded* input (ctx.save_for_backward(
// input, weight)); backward all-gathers it again into the same buffer, computes the full
// grad_input [b, s, h] (a temporary) and reduce-scatters it into a new [b, s/t, h] gradient.
ValueId GatherLinear(Model& m, ValueId x, ValueId weight, ValueId bias, std::int64_t out, TextPart name);

// mappings.py reduce_scatter_to_sequence_parallel_region after a row-parallel linear (and after
// VocabParallelEmbedding with reduce_scatter_embeddings): [b, s, h] → a new [b, s/t, h]; its
// backward (_gather_along_first_dim) allocates a new [b, s, h] gradient.
ValueId ScatterSequence(Model& m, ValueId y, TextPart name);

// A row-parallel linear's output in the shared blocks (attention output, MLP down projection):
// with sequence parallelism reduce-scattered to s/t tokens before its dropout and residual add
// (Megatron's bias-dropout-add runs on the sharded tensor), the caller's reference moved to the
// sharded one; without it (or on one GPU) y itself, all-reduced in place.
ValueId RowParallelOutput(Model& m, ValueId y, TextPart name);

// The output layer (a ColumnParallelLinear over the vocabulary) on the sequence-sharded final
// norm: LmHead's work with the all-gathering linear; the rotary tables and the mask go first.
ValueId LmHead(Model& m, ValueId normed, const char* tiedEmbedding, Context& c);

// The global memory buffer's bytes: b · s · h in the dtype the linears read (Init allocates it).
std::int64_t GatherBufferBytes(const Setup& rankSetup, const Regime& regime);

}  // namespace gpumem::sequence_split
