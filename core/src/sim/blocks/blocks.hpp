// The shared blocks transformer families are composed of, each written once in the primitive
// ops of sim/ops.hpp and following Hugging Face transformers' eager / SDPA forward code.
#pragma once

#include "sim/model.hpp"

namespace gpumem::blocks {

// --- embeddings (embedding.cpp) ---
// nn.Embedding of the ids; under tensor parallelism Megatron's VocabParallelEmbedding, which
// also zeroes the rows of ids outside the rank's vocabulary in place (keeping the mask).
ValueId WordEmbedding(Model& m, ValueId ids, ValueId weight, TextPart name);

// --- norms (norms.cpp) ---
// LlamaRMSNorm, op by op: x.to(fp32); x.pow(2).mean(-1); x * rsqrt(var + eps); w * x.to(dtype).
ValueId RmsNorm(Model& m, ValueId x, const Module& module);
// nn.LayerNorm with weight and bias; under autocast it runs on an fp32 copy of x.
ValueId LayerNorm(Model& m, ValueId x, const Module& module);

// --- MLPs (mlp.cpp) ---
// The architecture's hidden activation (gelu_new as its separate ops).
ValueId Activation(Model& m, ValueId x, TextPart name);
// x @ Wᵀ + b with the module's weight and optional bias.
ValueId Linear(Model& m, ValueId x, const Module& module, std::int64_t out, TextPart name);
// GPT-2's and BERT's MLP: up-projection, activation, down-projection, dropout.
// `activation`: where the activation's output is handed to the caller instead of dropped after
// the down projection (BERT's feed_forward_chunk holds `intermediate_output` through BertOutput).
ValueId PlainMlp(Model& m, ValueId x, const Module& up, const Module& down, const char* label,
                 ValueId* activation = nullptr);
// SwiGLU: down(act(gate(x)) · up(x)), the projections named as the module names them.
ValueId GatedMlp(Model& m, ValueId x, const Module& module, std::int64_t inter, const char* gate,
                 const char* up, const char* down, TextPart label);

// Phi3MLP: gate_up_proj, chunked into gate and up (views sharing one SplitBackward), then
// down(up · act(gate)).
ValueId FusedGatedMlp(Model& m, ValueId x, const Module& module, std::int64_t inter, TextPart label);

// --- mixture of experts (moe.cpp) ---
// MixtralSparseMoeBlock (with Qwen2-MoE's gated shared expert when the architecture has one).
ValueId MoE(Model& m, ValueId x, const Module& block);

// --- attention (attention.cpp) ---
// Whether Megatron's fused causal scale-mask-softmax kernel runs on [b, heads, sq, sk] scores of
// this dtype (FusedScaleMaskSoftmax.is_kernel_available); otherwise Megatron falls back to
// forward_torch_softmax, simulated as the eager ops. `heads` = the rank's heads.
// Megatron's GPT rather than Hugging Face's GPT-2 (attention.cpp): asked of a model, or of an
// architecture, its training section and its tensor- and context-parallel sizes.
bool MegatronGpt(const Model& m);
bool MegatronGpt(const ArchitectureDef& a, const TrainingDef& t, std::int64_t tensorParallel,
                 std::int64_t contextParallel);
bool MaskedSoftmaxKernelAvailable(std::int64_t b, std::int64_t heads, std::int64_t sq, std::int64_t sk, DType scores);
// [b, s, n·d] → [b, n, s, d] (views).
ValueId Heads(Model& m, ValueId x, std::int64_t n, const char* name);
// norm(x.view(b, s, n, d)).transpose(1, 2): an RMSNorm over each head (Qwen3's q_norm, k_norm).
// Takes the caller's reference to `projected` (the projection's output, released here).
ValueId NormedHeads(Model& m, ValueId projected, std::int64_t n, const Module& norm, const char* name);
// transformers' DynamicCache in training: k and v replaced by the cache's copies (the callers'
// references move to them).
void DynamicCacheCopies(Model& m, ValueId& k, ValueId& v);
// Phi-3's fused projection [b, s, (heads + 2·kv)·d] sliced into q, k, v heads ([b, n, s, d] views);
// the caller keeps its reference to qkv.
struct FusedHeads {
  ValueId q = kNoValue, k = kNoValue, v = kNoValue;
};
FusedHeads FusedQkvHeads(Model& m, ValueId qkv);
// Phi-3's apply_rotary_pos_emb: RoPE on q and k, each then cat with its (empty) pass-through
// slice. Returns the new q and k; the caller keeps its references to q and k.
std::pair<ValueId, ValueId> RopeWithPass(Model& m, ValueId q, ValueId k, ValueId cos, ValueId sin);
// apply_rotary_pos_emb: x·cos + rotate_half(x)·sin.
ValueId Rope(Model& m, ValueId x, ValueId cos, ValueId sin, const char* name);
// Attention on q, k, v (the caller's, released here; eager or SDPA, recomputed under selective
// checkpointing), the heads merged back to [b, s, heads·d], the output projection and dropout.
ValueId AttentionOutput(Model& m, ValueId q, ValueId k, ValueId v, ValueId mask, bool causal,
                        const Module& out, const char* name, double dropout);

// --- loss (loss.cpp) ---
// Cross-entropy on the logits against `labels`: causal LMs shift the labels and upcast the
// logits to fp32; with fp16 autocast, GradScaler scales the loss.
ValueId CrossEntropy(Model& m, ValueId logits, ValueId labels, bool causal);
// torchtune's chunked output and CEWithChunkedOutputLoss: `hidden` [b, s, h] is chunked along
// the sequence, each chunk projected by `weight` to the vocabulary, and each chunk's logits
// upcast to fp32 and reduced (reduction="sum") in turn; the sum is divided by the token count.
// Takes the caller's reference to `hidden` (dropped when the model would return, before the loss).
ValueId ChunkedOutputLoss(Model& m, ValueId hidden, ValueId weight, ValueId labels);
// Liger's fused linear + cross-entropy (loss.cpp): the loss of `hidden` [b, s, h] projected by
// `weight` [V, h], chunk by chunk, with both gradients made in forward.
ValueId FusedLinearCrossEntropyLoss(Model& m, ValueId hidden, ValueId weight);
// Megatron-LM's vocab-parallel cross-entropy on the rank's [b, s, V/t] logits (loss.cpp).
ValueId MegatronVocabParallelCrossEntropy(Model& m, ValueId logits, ValueId labels);

}  // namespace gpumem::blocks
