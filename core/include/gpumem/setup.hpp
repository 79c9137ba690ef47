// gpumem — the Setup: everything a person says about one training run.
//
// One struct, one DefaultSetup(), units on every field. The CLI, the JSON schema, the wasm
// bindings and the page all start from DefaultSetup(), so defaults are typed once, here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/dtype.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

// How the model is described.
enum class ModelKind {
  // Quick mode: only the parameter count N is known. Activations come from the published
  // per-token heuristic A = 4.6894e-4·N + 1.8494e6 values per token (see heuristics.hpp).
  ParameterCount,
  // An explicit list of layers; every tensor is counted from its shape.
  LayerList,
  // A transformer described by its architecture, as a Hugging Face config.json does; every
  // parameter tensor is listed and every op of a training step is simulated.
  Transformer,
};

// Transformer families. Each fixes the block's layout; sizes come from ArchitectureDef.
enum class Family {
  GPT2,   // learned positions, pre-LayerNorm with bias, fused QKV with biases, GELU MLP, tied head
  Llama,  // RMSNorm, RoPE, grouped-query attention, SwiGLU MLP or mixture of experts
          // (also Mistral, Qwen2 with attentionBias, Mixtral with numExperts)
  BERT,   // encoder: word + position + token-type embeddings, post-LayerNorm, GELU MLP
  GPTNeoX,  // Pythia, GPT-NeoX: LayerNorm, one query_key_value per head, partial RoPE, GELU MLP,
            // attention and MLP side by side (parallel residual), an untied head
};

// The MLP's activation, as config.json names it ("gelu_new" is GPT-2's tanh formula written
// as separate tensor ops, which keeps four tensors for backward instead of one).
enum class HiddenAct { GELU, GELUTanh, GELUNew, SiLU };

// What a BERT encoder is trained for.
enum class EncoderHead {
  Classification,  // pooler (dense + tanh on the first token) and a numLabels classifier
  MaskedLM,        // transform (dense + act + LayerNorm) and a decoder tied to the word embeddings
};

// How attention is computed.
enum class AttentionImplementation {
  Eager,  // scores b·heads·s·s materialised; softmax output (fp32) and probabilities saved
  SDPA,   // fused flash / memory-efficient kernel: keeps only its output and an fp32 log-sum-exp
};

// Several sequences packed into each row of the batch, their positions restarting at each one
// (HF DataCollatorWithFlattening / position_ids resets; torchtune's PackedDataset): tokens attend
// only within their own sequence. Decoder transformers.
enum class PackedSequences {
  None,
  // A 4D block-causal mask: transformers' masking_utils (find_packed_sequence_indices, then
  // sdpa_mask: a bool [b, 1, s, s]); under SDPA an explicit mask rules out the flash kernel, so
  // PyTorch runs the memory-efficient one on a float copy of the mask made by every layer
  // (convert_boolean_attn_mask) and saved for its backward. Eager attention already holds a
  // [b, 1, s, s] mask in the model's dtype: unchanged.
  BlockCausalMask,
  // Flash-attention varlen (HF attn_implementation="flash_attention_2" with position_ids:
  // flash_attn_varlen_func on cu_seqlens): no s² mask, what the SDPA flash path holds.
  FlashVarlen,
};

// Activation checkpointing (Hugging Face's gradient checkpointing, reentrant).
enum class Checkpointing {
  None,
  EveryBlock,     // each block keeps only its input; recomputed during backward
  EveryKthBlock,  // blocks 0, k, 2k, … checkpointed; the others keep everything
  Selective,      // only the attention core (scores, softmax, dropout, ·V) is recomputed
  // torchtitan's op-level selective AC (ac_mode selective, selective_ac_option op): every block
  // checkpointed, the outputs of every other mm and of SDPA kept, the rest recomputed.
  SelectiveOp,
};

enum class LayerKind { Embedding, Linear, ReLU, GELU, Tanh, Sigmoid, Dropout };

enum class LossKind { CrossEntropy, MSE };

// Numeric regime of the run.
enum class Precision {
  FP32,       // weights, gradients, optimizer states, activations: fp32
  FP16Mixed,  // fp16 weights, gradients and activations; fp32 master weights and states
  BF16Mixed,  // as FP16Mixed with bf16
  BF16,       // pure bf16: weights, gradients, states and activations all bf16, no master
  // torch.autocast: fp32 weights, gradients and states; matmuls run in 16-bit on copies of
  // the weights that autocast makes once per forward and autograd keeps for backward.
  AmpBF16,
  AmpFP16,    // as AmpBF16 in fp16, with GradScaler's loss scaling
};

enum class OptimizerKind {
  SGD, SGDMomentum, Adam, AdamW, Adafactor,
  // bitsandbytes (bitsandbytes/optim/optimizer.py, Optimizer2State.init_state): uint8 exp_avg and
  // exp_avg_sq with an fp32 absmax per block of 256 values, and two shared 256-value fp32
  // quantization maps; tensors under min_8bit_size = 4,096 elements keep fp32 states. One
  // fused kernel per parameter (optimizer_update_8bit_blockwise), no temporaries.
  Adam8bit,        // bnb.optim.Adam8bit
  AdamW8bit,       // bnb.optim.AdamW8bit (optim="adamw_bnb_8bit" in HF TrainingArguments)
  // bnb.optim.PagedAdamW / PagedAdamW8bit: the same states, but every state of a tensor with at
  // least 1e5 elements is allocated by F.get_paged (cudaMallocManaged, get_state_buffer): outside
  // PyTorch's caching allocator, evicted to host memory by the driver under pressure.
  PagedAdamW,      // optim="paged_adamw_32bit"
  PagedAdamW8bit,  // optim="paged_adamw_8bit"
  // Lion (Chen et al. 2023): one state, exp_avg. perParameter / forEach: lucidrains' lion-pytorch
  // update_fn (exp_avg.clone() and .add(grad) make two parameter-sized temporaries); fused:
  // bnb.optim.Lion (32-bit, one kernel per parameter, no temporaries).
  Lion,
};

// How the loss of a language model is computed (transformers, decoders).
enum class LossImplementation {
  Standard,  // the full logits, then cross-entropy (Hugging Face's ForCausalLMLoss)
  // torchtune's CEWithChunkedOutputLoss (torchtune/modules/loss/ce_chunked_output_loss.py) with
  // the decoder's chunked output (TransformerDecoder.chunked_output): the last hidden state is
  // split into lossChunks chunks along the sequence, the output projection runs per chunk, and
  // each chunk's logits are upcast to fp32 and reduced in turn.
  Chunked,
  // Liger's fused linear + cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py,
  // LigerFusedLinearCrossEntropyFunction; HF: use_liger_kernel=True): the full logits never
  // exist; the head's input and weight gradients are made in forward, one token chunk at a time.
  FusedLinearCrossEntropy,
  // Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py
  // _VocabParallelCrossEntropy, called by LanguageModule.compute_language_model_loss): one fp32
  // copy of the rank's [s, b, V/t] logits, softmaxed in place and saved, which backward turns into
  // the logits' gradient in place; set by the Megatron import.
  MegatronVocabParallel,
};

// How the optimizer step is executed; decides its temporaries ("intermediates").
enum class OptimizerImplementation {
  ForEach,       // torch.optim default on CUDA: one multi-tensor op over all parameters
  PerParameter,  // a Python loop over parameters (foreach=False; HF Adafactor)
  Fused,         // one fused kernel (fused=True): no parameter-sized temporaries
};

// A matrix shape, rows × cols, in elements. Used to describe the largest weight matrices in
// quick mode so that Adafactor can factor them (rows + cols second-moment values).
struct MatrixShape {
  std::int64_t rows = 0;  // elements
  std::int64_t cols = 0;  // elements
};

// One layer of a layer-list model. Only the fields of its kind are read.
struct LayerDef {
  LayerKind kind = LayerKind::Linear;
  std::int64_t inFeatures = 0;     // Linear: input features (elements)
  std::int64_t outFeatures = 0;    // Linear: output features (elements)
  bool bias = true;                // Linear: has a bias vector of outFeatures
  std::int64_t numEmbeddings = 0;  // Embedding: vocabulary size (rows)
  std::int64_t embeddingDim = 0;   // Embedding: width of a row (elements)
  double dropoutProbability = 0.1; // Dropout: p in [0, 1); p = 0 is the identity (no mask)
};

// Layer definitions with only the fields of their kind set (the rest keep LayerDef's defaults).
LayerDef LinearLayer(std::int64_t inFeatures, std::int64_t outFeatures, bool bias = true);
LayerDef EmbeddingLayer(std::int64_t numEmbeddings, std::int64_t embeddingDim);
LayerDef ActivationLayer(LayerKind kind);  // ReLU, GELU, Tanh or Sigmoid
LayerDef DropoutLayer(double probability);

// Parameters a layer owns: in·out (+ out with a bias) for Linear, rows·dim for Embedding, 0
// otherwise. In double, so that validation can bound absurd sizes before any int64 product.
double LayerParameterCount(const LayerDef& layer);

// A transformer's architecture, with the names of Hugging Face config.json in the comments.
// Start from DefaultArchitecture(family): zero means "derive it" where a field says so.
struct ArchitectureDef {
  Family family = Family::Llama;
  std::int64_t vocabSize = 32000;           // vocab_size (rows of the token embedding)
  std::int64_t hiddenSize = 4096;           // hidden_size / n_embd (elements)
  std::int64_t numLayers = 32;              // num_hidden_layers / n_layer (blocks)
  std::int64_t numHeads = 32;               // num_attention_heads / n_head
  std::int64_t numKeyValueHeads = 0;        // num_key_value_heads (Llama family); 0 = numHeads
  std::int64_t headDim = 0;                 // head_dim; 0 = hiddenSize / numHeads
  std::int64_t intermediateSize = 0;        // intermediate_size / n_inner; 0 = 4·hiddenSize
  std::int64_t maxPositionEmbeddings = 0;   // GPT-2, BERT: rows of the learned position table
  std::int64_t typeVocabSize = 2;           // BERT: rows of the token-type table
  bool tieWordEmbeddings = false;           // output head shares the token embedding
  bool attentionBias = false;               // Llama family: q/k/v projections have biases (Qwen2)
  bool outputBias = false;                  // Llama family: o_proj has a bias too (LlamaAttention's,
                                            // Gemma's, Qwen3's, OLMo 2's attention_bias; not Qwen2's)
  bool mlpBias = false;                     // Llama family, dense MLP: gate/up/down have biases (mlp_bias)
  bool queryKeyNorm = false;                // Llama family: an RMSNorm over each head of q and k before
                                            // RoPE (Qwen3's q_norm / k_norm, head_dim weights)
  bool rmsNormUnitOffset = false;           // Llama family: RMSNorm scales by 1 + weight in fp32 and
                                            // casts after (GemmaRMSNorm)
  bool embeddingScale = false;              // Llama family: embeddings × √hiddenSize (Gemma's normalizer)
  bool fusedProjections = false;            // Llama family: Phi3DecoderLayer's fused qkv_proj and
                                            // gate_up_proj (sliced and chunked), and its RoPE's cat
  double partialRotaryFactor = 1.0;         // with fusedProjections: the share of each head RoPE
                                            // rotates, in (0, 1] (partial_rotary_factor; Phi-4-mini 0.75)
  // Gemma 2 (Llama family; transformers models/gemma2/modeling_gemma2.py):
  bool sandwichNorms = false;               // RMSNorms on the attention's and the MLP's outputs too
                                            // (post_attention_layernorm, pre_/post_feedforward_layernorm)
  double attentionLogitSoftcap = 0.0;       // attn_logit_softcapping: eager scores become
                                            // cap·tanh(scores / cap); 0 = none (Gemma 2: 50)
  double finalLogitSoftcap = 0.0;           // final_logit_softcapping: the logits the same; 0 = none
                                            // (Gemma 2: 30)
  std::int64_t slidingWindow = 0;           // sliding_window (tokens a sliding layer attends to); 0 = none
  std::int64_t slidingWindowPattern = 0;    // with slidingWindow: layer i attends to all tokens when
                                            // (i + 1) % pattern == 0 (Gemma 2: 2); 0 = every layer slides
  bool parallelResidual = true;             // GPT-NeoX: use_parallel_residual, x + attn(ln1(x)) + mlp(ln2(x))
                                            // (false: the MLP reads x + attn(ln1(x)))
  bool gemma3Layout = false;                // Gemma 3 (transformers models/gemma3/modeling_gemma3.py): q/k
                                            // norms after all three projections, the embedding scaled
                                            // inside its module, a second rotary table for sliding layers
  // OLMo 2 and 3 (Llama family; transformers models/olmo2/modeling_olmo2.py, olmo3):
  bool olmo2Layout = false;                 // with queryKeyNorm: RMSNorms only on the attention's and the
                                            // MLP's outputs (no input norms), q_norm / k_norm over the
                                            // whole projections, each RMSNorm's weight applied in fp32
  bool rotaryFp32 = false;                  // the rotary tables stay fp32 and q, k are rotated in fp32
                                            // and cast back (Olmo2RotaryEmbedding; OLMo 3 casts them)
  std::int64_t noRopeInterval = 0;          // SmolLM3's no_rope_layers: layer i runs without RoPE when
                                            // (i + 1) % interval == 0 (SmolLM3: 4); 0 = every layer rotates
  bool graniteMultipliers = false;          // Granite (models/granite/modeling_granite.py): embeddings ×
                                            // embedding_multiplier, each sub-layer's output ×
                                            // residual_multiplier, logits ÷ logits_scaling: each a new
                                            // tensor (the values change no byte)
  HiddenAct hiddenAct = HiddenAct::SiLU;    // hidden_act / activation_function
  // Mixture of experts (Llama family): 0 experts = a dense MLP.
  std::int64_t numExperts = 0;              // num_local_experts / num_experts
  std::int64_t expertsPerToken = 2;         // num_experts_per_tok (top-k)
  std::int64_t expertIntermediateSize = 0;  // moe_intermediate_size; 0 = intermediateSize
  std::int64_t sharedExpertIntermediateSize = 0;  // shared_expert_intermediate_size; 0 = none
  bool sharedExpertGate = false;            // a sigmoid gate (hidden → 1) on the shared expert
  // norm_topk_prob: the top-k routing weights renormalised to sum to 1 (Mixtral always; Qwen2-MoE
  // and Qwen3-MoE as their config says: Qwen1.5-MoE-A2.7B false, Qwen3-30B-A3B true).
  bool normTopkProb = true;
  double hiddenDropout = 0.0;               // resid/embd_pdrop, hidden_dropout_prob, in [0, 1)
  double attentionDropout = 0.0;            // attn_pdrop, attention_(probs_)dropout(_prob)
  EncoderHead encoderHead = EncoderHead::Classification;  // BERT only
  std::int64_t numLabels = 2;               // BERT classification: classes

  bool operator==(const ArchitectureDef&) const = default;
};

// One field of ArchitectureDef as a form shows it: which families read it, its unit and
// meaning. The page builds its architecture editor from this list (via OptionsJson).
struct ArchitectureField {
  const char* key;        // the JSON key in model.architecture
  const char* label;      // what a person reads
  const char* kind;       // "count" (whole number), "number", "bool" or "select"
  const char* options;    // for "select": the options list of its ids ("hiddenActs"), else ""
  const char* hint;       // unit and meaning ("0 = numHeads")
  bool gpt2, llama, bert, neox;  // the families whose simulation reads it
  const char* whenField;  // "" or another field it depends on…
  const char* whenValue;  // …which must be positive ("positive") or equal this id
};
std::span<const ArchitectureField> ArchitectureFields();

// The family's own defaults (GPT-2 small, Llama-2-7B, BERT-base shapes and flags).
ArchitectureDef DefaultArchitecture(Family family);
// Derived sizes (zero fields resolved).
std::int64_t HeadDim(const ArchitectureDef& a);            // headDim or hiddenSize / numHeads
std::int64_t RotaryDim(const ArchitectureDef& a);          // int(headDim × partialRotaryFactor)
std::int64_t KeyValueHeads(const ArchitectureDef& a);      // numKeyValueHeads or numHeads
std::int64_t IntermediateSize(const ArchitectureDef& a);   // intermediateSize or 4·hiddenSize
std::int64_t ExpertIntermediateSize(const ArchitectureDef& a);

struct ModelDef {
  ModelKind kind = ModelKind::ParameterCount;

  // --- quick mode (ParameterCount) ---
  std::int64_t parameterCount = 0;          // N, parameters (elements)
  std::vector<MatrixShape> largestMatrices; // optional: shapes of the largest weight matrices

  // --- layer list ---
  std::vector<LayerDef> layers;  // in forward order
  LossKind loss = LossKind::CrossEntropy;

  // --- transformer ---
  ArchitectureDef architecture;  // the loss is the family's own (causal LM, MLM, classification)
};

struct TrainingDef {
  std::int64_t batchSize = 1;       // samples per micro-batch
  std::int64_t sequenceLength = 1;  // tokens per sample (1 for a plain MLP on vectors)
  Precision precision = Precision::FP32;
  OptimizerKind optimizer = OptimizerKind::Adam;
  OptimizerImplementation optimizerImplementation = OptimizerImplementation::ForEach;
  bool adafactorBeta1 = false;       // Adafactor keeps a full first moment when β1 is set
  bool zeroGradSetToNone = true;     // zero_grad(set_to_none=True): gradients freed after the step
  // Transformers only:
  AttentionImplementation attention = AttentionImplementation::Eager;
  Checkpointing checkpointing = Checkpointing::None;
  std::int64_t checkpointInterval = 2;  // k for EveryKthBlock (blocks)
  // torch.utils.checkpoint's use_reentrant: true is Hugging Face's default
  // (gradient_checkpointing_enable passes {"use_reentrant": True} when given no kwargs); false is
  // gradient_checkpointing_kwargs={"use_reentrant": False}, and what accelerate's FSDP
  // activation checkpointing, torchtune and torchtitan run (CheckpointImpl.NO_REENTRANT).
  // sim/tape.hpp Checkpoint says what changes.
  bool useReentrant = true;

  // --- memory savers (all off by default; docs/savers.md cites each source) ---
  LossImplementation lossImplementation = LossImplementation::Standard;  // transformers only
  std::int64_t lossChunks = 8;  // chunks of the chunked loss (torchtune's num_output_chunks), 1–8
  // The loss in the model's dtype: no fp32 upcast of the logits (nanoGPT-style
  // F.cross_entropy(logits, targets) in pure bf16). Autocast still runs log_softmax in fp32.
  bool lossInModelDtype = false;
  // Megatron's fused scale-mask-softmax (--masked-softmax-fusion, on in Megatron unless
  // --no-masked-softmax-fusion; megatron/core/fusions/fused_softmax.py FusedScaleMaskSoftmax):
  // GPT-2 family, eager attention. Where is_kernel_available holds, one kernel keeps the 16-bit
  // probabilities instead of the eager ops' fp32 softmax; elsewhere Megatron's unfused fallback.
  bool maskedSoftmaxFusion = false;
  // Optimizer in backward (torchtune optimizer_in_bwd: register_post_accumulate_grad_hook with one
  // optimizer per parameter): each parameter is stepped and its .grad freed as soon as its
  // gradient is complete, so the full set of gradients never exists.
  bool optimizerInBackward = false;
  // Activation offloading (torchtune OffloadActivations, enable_activation_offloading): saved
  // activations of at least 1,024 B are copied to pinned host memory in forward and brought back
  // in backward; the output head and the loss stay on the GPU (transformers only).
  bool activationOffloading = false;
  // Packed sequences (see PackedSequences): what the attention mask costs.
  PackedSequences packedSequences = PackedSequences::None;
  // transformers' KV cache in training (the config's use_cache, True by default). transformers
  // 5.x builds a DynamicCache whenever use_cache holds, in training too, and its first update
  // copies every layer's key and value (cache_utils.py DynamicLayer.update: torch.cat onto an
  // empty tensor); gradient checkpointing turns it off (GPT2Model.forward: use_cache=False with
  // a warning). What it costs depends on the attention (sim/families/gpt2.cpp); false is
  // use_cache=False, what TRL and torchtune-style loops pass.
  bool useCache = true;
  // The Hugging Face Trainer's torch_empty_cache_steps (0 = None, its default): training_step
  // calls torch.cuda.empty_cache() between the forward (the loss) and the backward of every
  // micro-batch whose update's global_step is a multiple of it (transformers trainer.py), which
  // hands the allocator's unsplit cached segments back to CUDA. Simulated steps 1 and 2 are
  // global_step 0 and 1: step 1 always, step 2 when it is 1.
  std::int64_t emptyCacheSteps = 0;
};

struct GpuDef {
  double memoryGiB = 80.0;  // capacity the person trains on, GiB (2^30 bytes)
  std::string id;           // a GPU of Gpus() ("nvidia-h100-sxm"), or empty for a custom size
};

// PYTORCH_CUDA_ALLOC_CONF as the caching allocator reads it (c10/core/AllocatorConfig.cpp);
// the defaults are PyTorch's (docs/device.md).
struct AllocatorDef {
  bool expandableSegments = false;         // expandable_segments:True
  std::int64_t maxSplitSizeMiB = 0;        // max_split_size_mb, MiB; 0 = unlimited, else ≥ 20
  std::int64_t roundupPower2Divisions = 0; // roundup_power2_divisions (every size); 0 = off, else a power of two
  double garbageCollectionThreshold = 0;   // garbage_collection_threshold, fraction in [0, 1); 0 = off
};

// What the process holds on the GPU besides the step's tensors, and how its allocator behaves.
struct RuntimeDef {
  AllocatorDef allocator;
  // CUDA context and kernel images, MiB; 0 = the default by CUDA version and lazy loading
  // (426 MiB with CUDA ≥ 11.7 and CUDA_MODULE_LOADING=LAZY, PyTorch's default; docs/device.md).
  double cudaContextMiB = 0;
  // CUBLAS_WORKSPACE_CONFIG (":4096:8"); empty = PyTorch's default for the GPU.
  std::string cublasWorkspaceConfig;
  // The versions the run uses, "major.minor". They select version-dependent rules, each cited
  // where it is applied: what autograd saves (softmax and log_softmax kept their input before
  // PyTorch 1.11), the cuBLAS workspace default (one 4 MiB workspace before 2.0), the context
  // (lazy module loading needs CUDA ≥ 11.7). docs/device.md lists them.
  std::string pytorchVersion = "2.5";
  std::string cudaVersion = "12.4";
  // DeepSpeed's version, "major.minor[.patch]", for ZeRO-1/2's construction: from 0.18.7 it
  // flattens the trainable parameters on the GPU when NVML's free memory holds the flat
  // (stage_1_and_2.py, DeepSpeed #7828), before that always on the host (with 4-byte stand-ins
  // on the GPU from 0.13.0, #4833). Read by DeepSpeed ZeRO-1/2 only (docs/parallel.md).
  std::string deepspeedVersion = "0.19";
  bool lazyModuleLoading = true;  // CUDA_MODULE_LOADING=LAZY (PyTorch sets it since 1.13)
  // NCCL communicator buffers (outside the allocator), MiB per GPU; 0 = the estimate from the
  // job's communicators (docs/device.md, "NCCL buffers"; nothing on one GPU).
  double ncclBuffersMiB = 0;
  // Host (CPU) memory of one node, GiB (2^30 bytes); 0 = not stated, so not checked. What
  // offloading and activation offloading keep on the host (estimate.host.nodeBytes) must fit in
  // it: the fewest-GPUs search and the cluster layouts skip an offload that does not.
  double hostMemoryGiB = 0;
};

// "major.minor" (a patch part and a local suffix such as "2.5.1+cu124" are allowed and ignored).
// False when the text is not such a version.
bool ParseMajorMinor(std::string_view text, int& major, int& minor);
// "major.minor" or "major.minor.patch" (a local suffix after '+' is ignored; patch 0 if absent).
bool ParseVersion(std::string_view text, int& major, int& minor, int& patch);

// How the base model's linear weights are loaded (bitsandbytes through transformers'
// BitsAndBytesConfig; layouts in finetune.hpp).
enum class Quantization {
  None,  // weights in the precision's dtype
  NF4,   // load_in_4bit, bnb_4bit_quant_type="nf4": 4-bit NormalFloat, fp32 absmax per 64 weights
  FP4,   // load_in_4bit, bnb_4bit_quant_type="fp4": the same layout, another code
  Int8,  // load_in_8bit (LLM.int8()): int8 weights and an fp32 scale per output row
};

// How 4-bit NF4 weights are laid out in memory (finetune.hpp has both layouts and their sources).
enum class QuantLayout {
  Bitsandbytes,  // bitsandbytes Params4bit + QuantState (PEFT / transformers QLoRA)
  TorchaoNf4,    // torchao NF4Tensor (torchtune's qlora_* models: LoRALinear(quantize_base=True))
};

// The dtype LoRA's A and B (and DoRA's magnitude) are kept in.
enum class AdapterDType {
  FP32,     // get_peft_model(autocast_adapter_dtype=True), PEFT's default: 16-bit adapters upcast
  Weights,  // the base weights' dtype (autocast_adapter_dtype=False; torchtune's bf16 recipes)
};

// Fine-tuning: which parameters train, LoRA / DoRA adapters (PEFT's LoraConfig names) and
// quantized base weights (transformers' BitsAndBytesConfig names). The defaults train every
// parameter with no adapter and no quantization, the plain training the rest of the Setup
// describes. Transformer architectures only (finetune.hpp has the rules and their sources).
struct FinetuneDef {
  // --- frozen parameters (requires_grad=False: no gradient, optimizer state or master copy) ---
  bool freezeEmbeddings = false;       // token (and position / token-type) embeddings
  bool freezeHead = false;             // lm_head (untied), BERT's pooler / classifier / MLM head
  std::int64_t freezeFirstBlocks = 0;  // blocks 0 … k−1 frozen (blocks); 0 = none
  // When not empty, only parameters inside these modules train (a module name as HF writes it,
  // matched on whole dotted components: "norm", "lm_head", "self_attn").
  std::vector<std::string> trainOnlyModules;

  // --- LoRA (peft LoraConfig) ---
  bool lora = false;                // get_peft_model(model, LoraConfig(...)): base weights frozen
  std::int64_t r = 8;               // r: rank of A [r, in] and B [out, r] (elements)
  double loraAlpha = 8;             // lora_alpha: scaling = loraAlpha / r
  double loraDropout = 0.0;         // lora_dropout in [0, 1): p = 0 is nn.Identity (no mask)
  // target_modules: module names ("q_proj", "c_attn", "query"), or "all-linear"; empty = PEFT's
  // default for the family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
  std::vector<std::string> targetModules;
  bool useDora = false;             // use_dora: a magnitude vector [out] and a weight norm per forward
  AdapterDType adapterDType = AdapterDType::FP32;

  // --- quantized base weights (bitsandbytes) ---
  Quantization quantization = Quantization::None;
  bool doubleQuant = false;                  // bnb_4bit_use_double_quant: the absmax quantized again
  DType computeDType = DType::FP32;  // bnb_4bit_compute_dtype (fp32, bf16 or fp16): bnb's default fp32
  // peft.prepare_model_for_kbit_training: every other 16-bit parameter upcast to fp32, gradient
  // checkpointing on every block, and the embeddings' output made to require a gradient.
  bool prepareForKbitTraining = false;
  // bnb_4bit_quant_storage (transformers BitsAndBytesConfig): the element type the packed 4-bit
  // codes are stored in; uint8 by default, a float type (bf16) so that FSDP and DeepSpeed ZeRO-3
  // can flatten and shard them with the other parameters (PEFT docs, "FSDP-QLoRA").
  DType quantStorage = DType::UInt8;
  // Which library stores the 4-bit weights: bitsandbytes (default) or torchao's NF4Tensor, as
  // torchtune's QLoRA recipes (single GPU and FSDP2) hold them.
  QuantLayout quantLayout = QuantLayout::Bitsandbytes;
  // torchao's to_nf4 runs quantize_tensor_nearest on 1,048,576 values at a time (CHUNK_SIZE,
  // torchao #196, 2024-05-01, torchao 0.2); false: on the whole weight at once, as torchao 0.1
  // did (an n × 16 difference tensor per weight while loading; sim/loading.cpp).
  bool torchaoQuantizeInChunks = true;

  bool operator==(const FinetuneDef&) const = default;
};

// ---------------------------------------------------------------------------------------------
// Many GPUs (docs/parallel.md). Names as the frameworks spell them; defaults are theirs. The
// default is one GPU, which leaves every estimate as it was.

// FSDP's sharding strategies by their own names (torch/distributed/fsdp/api.py ShardingStrategy),
// and FSDP2's fully_shard (torch/distributed/fsdp/_fully_shard/_fully_shard.py).
enum class FsdpMode {
  Off,          // no FSDP (DDP or DeepSpeed ZeRO, per zeroStage)
  FullShard,    // FULL_SHARD: parameters, gradients, states sharded; reshard after forward
  ShardGradOp,  // SHARD_GRAD_OP: gradients and states sharded; parameters stay gathered from
                // forward to the end of backward
  HybridShard,  // HYBRID_SHARD: FULL_SHARD within groups of fsdpShardGroupSize, replicated across
  FullyShard,   // FSDP2 fully_shard: per-parameter dim-0 shards; reshardAfterForward decides
};

// What ZeRO-Offload / ZeRO-Infinity / FSDP CPUOffload move to host memory.
enum class OffloadKind {
  None,
  Optimizer,               // offload_optimizer: fp32 master weights, states, fp32 gradients
  OptimizerAndParameters,  // + offload_param (ZeRO-3) / CPUOffload(offload_params=True) (FSDP)
};

// Pipeline schedules (Megatron-LM megatron/core/pipeline_parallel/schedules.py; GPipe).
enum class PipelineSchedule {
  OneFOneB,     // 1F1B (PipeDream-flush): stage r holds min(p − r, m) micro-batches in flight
  GPipe,        // all m forwards, then all m backwards: every stage holds m micro-batches
  Interleaved,  // interleaved 1F1B with virtualStages model chunks per rank
};

// DeepSpeed's overlap_comm default depends on the stage (deepspeed/runtime/zero/config.py,
// overlap_comm_valid: None → True for stage 3, False otherwise).
enum class OverlapComm { Default, On, Off };

struct ParallelDef {
  std::int64_t dataParallel = 1;      // data-parallel ranks (GPUs that each see other samples)
  std::int64_t zeroStage = 0;         // DeepSpeed ZeRO stage 0–3 (0 = plain DDP unless fsdp is set)
  FsdpMode fsdp = FsdpMode::Off;
  bool reshardAfterForward = true;    // fully_shard(reshard_after_forward=True)
  std::int64_t fsdpShardGroupSize = 8;  // HYBRID_SHARD: GPUs per shard group (one node)
  bool limitAllGathers = true;        // FSDP limit_all_gathers (≤ 2 units gathered ahead)
  bool forwardPrefetch = false;       // FSDP forward_prefetch
  bool backwardPrefetch = true;       // FSDP backward_prefetch=BACKWARD_PRE (the default)
  // FSDP2 MixedPrecisionPolicy(reduce_dtype=torch.float32): the reduce-scatter input and output in
  // fp32 (torchtitan's default); false = reduce_dtype None, the gradients' (param) dtype.
  bool fsdpReduceInFp32 = false;
  // FSDP2: tok_embeddings and output (lm_head) wrapped as units of their own, resharded after
  // forward (torchtune custom_sharded_layers; torchtitan apply_fsdp); false = in the root unit.
  bool fsdpShardEmbeddingsAndHead = false;
  // FSDP2: the last transformer block keeps its gathered parameters from its forward to its
  // backward (fully_shard(reshard_after_forward=False) on it alone), torchtitan apply_fsdp's
  // default policy without pipeline parallelism ("FSDP would prefetch it immediately"); false =
  // every block follows reshardAfterForward.
  bool fsdpKeepLastBlockGathered = false;
  // FSDP1 with LoRA: PEFT's fsdp_auto_wrap_policy (peft/utils/other.py: _or_policy of
  // lambda_auto_wrap_policy over leaf modules whose weight requires grad, and
  // transformer_auto_wrap_policy over the decoder layer), which HF's Trainer applies to LoRA
  // models under FSDP (transformers Trainer._fsdp_qlora_plugin_updates, later update_fsdp_plugin_peft) and PEFT's FSDP guide
  // uses with fsdp_use_orig_params: false. Every lora_A / lora_B Linear is an FSDP unit of its own
  // (its own small FlatParameter, gradient shard and optimizer state) and the block's
  // FlatParameter holds only frozen weights (no gradient). false = one FlatParameter per block,
  // frozen and trainable together (use_orig_params=True).
  bool fsdpWrapAdaptersApart = false;
  // torch.nn.parallel.DistributedDataParallel
  // Megatron's grad_reduce_in_fp32 (accumulate_allreduce_grads_in_fp32, on for --bf16): its
  // DistributedDataParallel keeps one fp32 gradient buffer for the whole model from init;
  // with the distributed optimizer (zeroStage 1) its ends padded (param_and_grad_buffer.py).
  bool gradReduceInFp32 = false;
  double bucketCapMB = 25;            // bucket_cap_mb, MiB (the first bucket is 1 MiB: dist._DEFAULT_FIRST_BUCKET_BYTES)
  bool gradientAsBucketView = false;  // gradient_as_bucket_view
  // torch.distributed.optim.ZeroRedundancyOptimizer over DDP: each rank keeps optimizer states
  // only for the whole parameters assigned to it (greedy by size, largest first).
  bool zeroRedundancyOptimizer = false;
  // DeepSpeed zero_optimization (deepspeed/runtime/zero/config.py defaults), in elements
  std::int64_t reduceBucketSize = 500'000'000;     // reduce_bucket_size
  std::int64_t allgatherBucketSize = 500'000'000;  // allgather_bucket_size
  OverlapComm overlapComm = OverlapComm::Default;  // overlap_comm
  bool contiguousGradients = true;                 // contiguous_gradients
  std::int64_t stage3PrefetchBucketSize = 50'000'000;        // stage3_prefetch_bucket_size
  std::int64_t stage3MaxLiveParameters = 1'000'000'000;      // stage3_max_live_parameters
  std::int64_t stage3MaxReuseDistance = 1'000'000'000;       // stage3_max_reuse_distance
  std::int64_t subGroupSize = 1'000'000'000;                 // sub_group_size (ZeRO-3's optimizer step tiles)
  std::int64_t stage3ParamPersistenceThreshold = 100'000;    // stage3_param_persistence_threshold
  OffloadKind offload = OffloadKind::None;
  // Megatron-LM
  std::int64_t tensorParallel = 1;    // --tensor-model-parallel-size
  bool sequenceParallel = false;      // --sequence-parallel
  std::int64_t pipelineParallel = 1;  // --pipeline-model-parallel-size
  PipelineSchedule pipelineSchedule = PipelineSchedule::OneFOneB;
  std::int64_t virtualStages = 1;     // --num-layers-per-virtual-pipeline-stage → chunks per rank
  // Which pipeline stage the estimate simulates: -1 (default) = the first or the last, whichever
  // peaks higher (the first holds the embeddings and the most in-flight micro-batches, the last
  // the head, logits and loss); 0 … pipelineParallel − 1 = that stage (docs/parallel.md).
  std::int64_t pipelineStage = -1;
  // Stages of unequal layer counts: Megatron --decoder-first-pipeline-num-layers /
  // --decoder-last-pipeline-num-layers (TransformerConfig num_layers_in_first_pipeline_stage /
  // num_layers_in_last_pipeline_stage), in layers; 0 (default) = not set. The other stages share
  // the rest evenly (docs/parallel.md "Pipeline", PipelineStageLayers).
  std::int64_t pipelineFirstStageLayers = 0;
  std::int64_t pipelineLastStageLayers = 0;
  // Derived, never read from or written to JSON: on the setup PipelineStageSetup makes for one
  // stage, the layer count of each of its chunks (virtual stages) when they differ (torchtitan's
  // split over p·v virtual stages); empty otherwise, the stage's layers then split evenly.
  std::vector<std::int64_t> stageChunkLayers;
  std::int64_t contextParallel = 1;   // --context-parallel-size
  std::int64_t expertParallel = 1;    // --expert-model-parallel-size
  // --expert-tensor-parallel-size: ranks that split each expert's MLP (column/row inside the
  // expert). 0 = the tensor parallel size, as Megatron resolves an unset value
  // (megatron/training/arguments.py and model_parallel_config.py __post_init__).
  std::int64_t expertTensorParallel = 0;
  // Micro-batches per optimizer step (DeepSpeed gradient_accumulation_steps; Megatron's
  // number of micro-batches, m, which the pipeline schedules run).
  std::int64_t gradientAccumulationSteps = 1;
};

struct Setup {
  ModelDef model;
  TrainingDef training;
  GpuDef gpu;
  RuntimeDef runtime;
  FinetuneDef finetune;  // defaults: plain training (every estimate as without the section)
  ParallelDef parallel;  // one GPU by default
};

// The one source of defaults: GPT-2 XL-sized quick mode (1.5e9 parameters), fp16 mixed
// precision, Adam, batch 1 × 1024 tokens, on an 80 GiB GPU.
Setup DefaultSetup();

// The MLP of the classic "why is my 1.5 GB model using 6 GB" example:
// 240000 → 1024 → 512 → 240000 with biases and ReLUs, MSE loss, batch 32, fp32, Adam.
Setup ExampleMlpSetup();

// Upper bounds that reject absurd input before any arithmetic can overflow.
struct Limits {
  static constexpr std::int64_t maxParameterCount = 100'000'000'000'000;  // 1e14
  static constexpr std::int64_t maxFeatures = 1'000'000'000;              // per dimension
  static constexpr std::int64_t maxLayers = 100'000;
  static constexpr std::int64_t maxExperts = 100'000;
  static constexpr std::int64_t maxMatrices = 100'000;
  static constexpr std::int64_t maxBatchSize = 1'000'000;
  static constexpr std::int64_t maxSequenceLength = 100'000'000;
  static constexpr std::int64_t maxTokens = 10'000'000'000;  // batch × sequence
  static constexpr double maxGpuMemoryGiB = 1'000'000.0;
  // The largest number of bytes an estimate may reach: 2^53 (8 PiB), so that every byte count
  // is exact as a JS number and no 64-bit arithmetic can overflow. Setups beyond it are refused.
  static constexpr double maxEstimateBytes = 9007199254740992.0;
};

// Every problem with a setup, each naming its field by JSON path ("training.batchSize",
// "model.layers[2].inFeatures"). Empty when the setup can be estimated. At most
// kMaxReportedErrors are listed, then one "…and N more" (error.hpp). Linear in the setup's size.
std::vector<FieldError> Validate(const Setup& setup);
// The same into a list the caller owns (with its own filter; ParseAndValidate uses it).
void Validate(const Setup& setup, ErrorList& errors);
// Both with a work budget other than the page's kMaxPredictedEvents (a native host's, up to
// kMaxHostPredictedEvents; clamped to [kMaxPredictedEvents, kMaxHostPredictedEvents]).
std::vector<FieldError> Validate(const Setup& setup, double maxPredictedEvents);
void Validate(const Setup& setup, ErrorList& errors, double maxPredictedEvents);

// An upper bound of the bytes the simulation of a setup can reach, in three terms, so that
// absurd combinations are refused before any 64-bit arithmetic can overflow, and so that the
// solvers know how far batch and sequence may go. The terms follow what the simulation keeps:
// eager attention materialises b·heads·s² scores per block, SDPA none; checkpointing keeps one
// block's activations plus each checkpointed block's input. Generous (8 bytes per value and
// more values than any op keeps), never tight: a setup far below it may still not fit a GPU.
struct SizeBound {
  double modelStateBytes = 0;         // independent of batch and sequence
  double bytesPerToken = 0;           // × batchSize × sequenceLength
  double bytesPerTokenPosition = 0;   // × batchSize × sequenceLength² (eager attention scores)
  // What dominates the model-state term, as the field a person would change
  // ("model.architecture.numLayers", "model.parameterCount", "model.layers").
  std::string modelStateField;

  double Total(double batchSize, double sequenceLength) const {
    const double tokens = batchSize * sequenceLength;
    return modelStateBytes + tokens * bytesPerToken + tokens * sequenceLength * bytesPerTokenPosition;
  }
};
// Terms for the setup's model, attention and checkpointing (its batch and sequence are not
// used). Only meaningful for a setup whose model passes validation.
SizeBound EstimateSizeBound(const Setup& setup);

// The work budget (issue 14): how many trace events the simulation of a setup will make,
// predicted from its shape before any work starts, so that a setup the page cannot simulate in
// about a second and 256 MB of wasm memory is refused with a tooLarge error naming the field
// that drives it, instead of freezing or crashing the page. An upper bound (never below
// Estimate::eventCount) and within 2× of it for every preset and checkpointing mode: both
// checked by tests/budget_test.cpp. Counts come from measured events per block (forward,
// backward, checkpoint recomputes, the optimizer's per-tensor work), see docs/budget.md.
struct EventBudget {
  double predictedEvents = 0;  // events of one estimate (both simulated steps)
  // The field a person would change to shrink it: "model.architecture.numLayers",
  // "model.architecture.numExperts", "model.layers", "model.largestMatrices".
  std::string field;
};
// Only meaningful for a setup whose sizes pass validation's range checks.
EventBudget PredictEvents(const Setup& setup);
// The largest prediction Validate accepts by default: each estimate of a search (the solver, the
// views, the layouts, the fewest-GPUs search), which run tens to hundreds of them, and the fuzz
// targets. Measured in wasm (node scripts/bench.mjs): see docs/budget.md for events/s,
// bytes/event and why this keeps a search's estimates near a tenth of a second each.
inline constexpr double kMaxPredictedEvents = 500'000.0;
// The page's and the JS API's single estimates (wasm/bindings.cpp): one estimate at a time, on
// a module whose memory stops at 1 GiB. Measured in wasm under node on the 2-core machine
// (docs/budget.md): Qwen3-30B-A3B (48 layers × 128 experts) with LoRA, 1,258,256 predicted and
// 853,055 simulated events, 0.39 s the first time (70 ms after) and 415 MiB of wasm memory;
// Llama 2 7B's blocks × 2,280, 1,450,272 events, 0.43 s and 658 MiB: at this limit (no more
// events than predicted) the heap stays under 700 MiB.
inline constexpr double kMaxPagePredictedEvents = 1'500'000.0;
// The largest budget a native host may give itself (EstimateOptions::maxPredictedEvents): the
// command-line tool's single estimates. At its limit (Llama 2 7B's blocks × 2,280, every one
// checkpointed: 1,559,716 events) the CLI answers in 1.0 s and 320 MB with --json, 3 s and 610 MB
// printing every event (docs/budget.md): what a desktop process can spend and a browser tab
// should not.
inline constexpr double kMaxHostPredictedEvents = 2'000'000.0;
// The most layers a layer list may have, whatever its events. The page's cost of a list grows
// with its length as well as with its events: the JSON editor's lines, the link that holds it,
// reading it twice. Opening a link, to the frame that shows the answer (Chromium 156 on this
// 2-core machine, tests/browser/bounds.test.js): 4,000 linear layers 1.19–1.34 s; 5,000 took
// 1.35–1.45 s here and up to 2.2 s on CI; 39,000 ReLUs after one linear, within the event budget,
// 1.8–2.1 s here.
inline constexpr std::int64_t kMaxListedLayers = 4'000;
// The most matrices quick mode's largestMatrices may list. Its event prediction is tight (28 real
// events per matrix against 30 predicted, where the other classes simulate about half their
// prediction), so at the event budget it simulated twice the events of any other class at its
// limit: 16,665 matrices, 1.43–1.79 s in the page here. 8,000: 1.22–1.24 s (4,000: 1.19–1.22 s).
inline constexpr std::int64_t kMaxListedMatrices = 8'000;

// Feature width flowing out of layer `index` (and into layer index+1), or 0 when unknown
// (a leading activation with no width yet). Used by validation and by the trace.
std::int64_t OutputWidth(const std::vector<LayerDef>& layers, std::size_t index);

}  // namespace gpumem
