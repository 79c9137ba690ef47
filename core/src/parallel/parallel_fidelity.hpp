// Rules that published multi-GPU figures showed gpumem had wrong (docs/validation.md, "Many
// GPUs: published figures"): FSDP2's per-parameter gradients and its reduce dtype, Megatron's
// fp32 gradient buffer, and FSDP2 units of their own for the embeddings and the output layer.
#pragma once

#include <cstdint>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

// Refuses the fields of this file where the simulation does not cover them.
void ValidateParallelFidelity(const Setup& setup, std::vector<FieldError>& errors);

// Megatron's gradient buffer (megatron/core/distributed/param_and_grad_buffer.py
// _ParamAndGradBuffer.__init__), one bucket (overlap_grad_reduce off, Megatron's default).
// With the distributed optimizer: the trainable parameters in reverse order, each starting at a
// multiple of 64 elements (_pad_start_of_param_if_needed), the end padded to a multiple of
// lcm(dp, 128) (_pad_end_of_bucket_if_needed; pad_buckets_for_high_nccl_busbw off).
// Without it (Megatron's DDP with Float16OptimizerWithFloat16Params): no padding at all
// (_compute_default_per_buffer_param_layout, Megatron-LM d98e8a6: "No padding is applied"), the
// trainable elements alone.
std::int64_t MegatronGradBufferElements(const Inventory& inventory, std::int64_t dataParallel,
                                        bool distributedOptimizer = true);

// FSDP2 with fsdpShardEmbeddingsAndHead: the word embedding (tok_embeddings / embed_tokens) and the
// output layer (lm_head) are units of their own. Per parameter: 0 = root, 1 + block, and with
// the field 1 + blocks for the embedding, 2 + blocks for the head. `blocks` = transformer blocks.
std::vector<int> Fsdp2UnitOfParameter(const Setup& setup, const Inventory& inventory, int blocks);

}  // namespace gpumem
