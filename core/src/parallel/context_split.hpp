// Context parallelism (Megatron --context-parallel-size c, Transformer Engine's ring attention)
// on the simulated rank (docs/parallel.md, "Context parallelism"). The rank holds s/c tokens of
// every sequence (two chunks of the load-balanced 2c split), so the rank's setup has s/c as its
// sequence length and every op outside attention runs on it; attention exchanges k/v around the
// ring. Hook called from the attention block when Model::contextShards > 1.
#pragma once

#include "sim/model.hpp"

namespace gpumem::context_split {

// transformer_engine/pytorch/attention (dot_product_attention/context_parallel.py)
// AttnFuncWithCPAndKVP2P, bf16/fp16 path, on the rank's q [b, heads, s/c, d] and k, v
// [b, kvHeads, s/c, d] (grouped-query heads are not repeated: the kernels read them directly).
// Forward: p2p_comm_buffers[0] = cat(k, v), and one more k/v buffer received per step (c in all,
// held until the forward returns); out_per_step and softmax_lse_per_step for each of the c steps
// (the last CP rank runs every step on its whole q: the most loaded, simulated); out corrected
// in fp32, then cast. Saves q, kv = p2p_comm_buffers[-1] (the last received chunk, k and v
// sized), out and softmax_lse (fp32 [b, heads, s/c]). Backward: dq_buffer (q-sized), two
// p2p buffers of (2, kv) each (k/v and dk/dv travelling the ring), and one step's dq_, dk_, dv_.
// Returns [b, s/c, heads, d], as the SDPA core does.
ValueId RingAttention(Model& m, ValueId q, ValueId k, ValueId v);

}  // namespace gpumem::context_split
