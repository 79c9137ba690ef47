// A transformer family: its block and its forward (embeddings → blocks → head), each a short
// composition of the shared blocks in sim/blocks. The driver (transformer.cpp) owns the batch,
// checkpointing, the loss and backward.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "sim/blocks/blocks.hpp"

namespace gpumem::families {

// Runs block i on x (wrapped by the driver in a checkpoint when the setup says so).
using RunBlock = std::function<ValueId(ValueId x, const Context& c, int i)>;

// Decoders (GPT-2, the Llama family): embeddings, blocks, final norm; returns the logits.
ValueId Gpt2Forward(Model& m, ValueId ids, const RunBlock& block);
ValueId Gpt2Block(Model& m, ValueId x, const Context& c, int i);
ValueId LlamaForward(Model& m, ValueId ids, const RunBlock& block);
// Gemma's (embeddingScale) hidden states: inputs_embeds * √hidden, a new tensor; the caller
// keeps its reference to inputs_embeds.
ValueId ScaledEmbeddings(Model& m, ValueId inputsEmbeds);
// Whether the scaled embeddings replace the unscaled ones at once (Gemma 3's module, Granite's
// multiplier) rather than after the blocks (Gemma 1/2's normalizer).
bool EmbeddingsScaledAtOnce(const ArchitectureDef& a);
// Whether block i rotates q and k (SmolLM3's layers without RoPE do not).
bool RopeLayer(const ArchitectureDef& a, int i);
ValueId LlamaBlock(Model& m, ValueId x, const Context& c, int i);
// The rotary tables of a forward: cos and sin [1, 1, s, rotary dim] in `type`, and Gemma 3's
// sliding layers' own pair.
void RotaryTables(Model& m, Context& c, DType type);
// Whether block i attends through the sliding window (Gemma 2's layer_types).
bool SlidingLayer(const ArchitectureDef& a, int i);
// GPT-NeoX (Pythia): LayerNorm blocks with one query_key_value, partial RoPE, parallel residual.
ValueId GptNeoXForward(Model& m, ValueId ids, const RunBlock& block);
ValueId GptNeoXBlock(Model& m, ValueId x, const Context& c, int i);
// BERT: embeddings (with token types), post-norm layers, a classification or masked-LM head.
ValueId BertForward(Model& m, ValueId ids, ValueId tokenTypes, const RunBlock& block);
ValueId BertLayer(Model& m, ValueId x, const Context& c, int i);

// The decoders' stack: the 4-D causal mask under eager attention (SDPA's kernels mask by
// themselves), then every block on the embeddings `x`; returns the last block's output.
ValueId DecoderBlocks(Model& m, ValueId x, Context& c, const RunBlock& block);

// The decoders' shared tail: the base model returns (its mask and rotary tables go) and the
// LM head projects onto the vocabulary.
// `head` is the output layer's module (GPT-NeoX: embed_out).
ValueId LmHead(Model& m, ValueId normed, const char* tiedEmbedding, Context& c, std::string_view head = "lm_head");

// A module path from the model's root ("transformer.ln_f").
Module RootModule(Model& m, const char* path);

// The training section as the model runs it (transformer.cpp): peft's
// prepare_model_for_kbit_training turns gradient checkpointing on.
TrainingDef EffectiveTraining(const Setup& setup);

// Whether transformers' DynamicCache costs the step memory (gpt2.cpp, with its sources): asked
// of the model being simulated, or of a setup (the solver's use_cache=False, the estimate's note).
bool KeepsDynamicCache(const Model& m);
bool KeepsDynamicCache(const Setup& setup);

}  // namespace gpumem::families
