// The transformer driver: the batch, the family's forward (a composition of shared blocks, see
// families/gpt2.cpp, llama.cpp, bert.cpp), activation checkpointing around each block, the
// loss, and backward through the Tape. It runs as Hugging Face transformers' eager / SDPA code
// runs under the Trainer: the model returns logits and loss, and compute_loss keeps only the
// loss, so the logits are dropped before backward. The simulation follows the CUDA kernels;
// docs/validation.md lists where CPU PyTorch keeps something else.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "gpumem/names.hpp"
#include "gpumem/parallel.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/sequence_split.hpp"
#include "sim/families/family.hpp"
#include "sim/savers.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

// Whether the setup's PyTorch is at least major.minor (an unreadable version, refused by
// validation, reads as the default 2.5).
bool PyTorchAtLeast(const RuntimeDef& runtime, int major, int minor) {
  int have = 2;
  int haveMinor = 5;
  if (!ParseMajorMinor(runtime.pytorchVersion, have, haveMinor)) {
    have = 2;
    haveMinor = 5;
  }
  return have > major || (have == major && haveMinor >= minor);
}

// PyTorch before 1.11 kept softmax's and log_softmax's input for backward (pytorch/pytorch#64000;
// PR #65242 first released in 1.11 passes only the input's dtype to the backward).
bool SoftmaxSavesInput(const RuntimeDef& runtime) { return !PyTorchAtLeast(runtime, 1, 11); }

// scaled_dot_product_attention's enable_gqa first shipped in PyTorch 2.5, and transformers'
// use_gqa_in_sdpa (integrations/sdpa_attention.py) asks for that version.
bool SdpaEnableGqa(const RuntimeDef& runtime) { return PyTorchAtLeast(runtime, 2, 5); }

// Non-reentrant checkpointing stops its recompute early from PyTorch 2.1, where the nested
// checkpoint rewrite (torch/utils/checkpoint.py _recomputation_hook, set_checkpoint_early_stop;
// pytorch/pytorch#90105) first shipped; before, _checkpoint_without_reentrant reran the whole
// function.
bool CheckpointEarlyStop(const RuntimeDef& runtime) { return PyTorchAtLeast(runtime, 2, 1); }

class TransformerPass final : public ModelPass {
 public:
  TransformerPass(const Setup& setup, const Inventory& inventory, const std::vector<Text>& names,
                  const Regime& regime, const PipelineChunk& chunk = {})
      : chunk_(chunk), inventory_(inventory), a_(setup.model.architecture), t_(families::EffectiveTraining(setup)), regime_(regime), b_(setup.training.batchSize),
        s_(setup.training.sequenceLength),
        parameters_(inventory, names, regime.weights, setup.finetune.computeDType),
        parameterCount_(inventory.parameters.size()),
        inputRequiresGrad_(InputRequiresGrad(setup)), finetune_(setup.finetune),
        softmaxSavesInput_(SoftmaxSavesInput(setup.runtime)), sdpaEnableGqa_(SdpaEnableGqa(setup.runtime)),
        checkpointEarlyStop_(CheckpointEarlyStop(setup.runtime)),
        gpu_(GpuParallelismOf(setup.gpu.id)),
        vocabShards_(std::max<std::int64_t>(1, setup.parallel.tensorParallel)),
        sequenceShards_(setup.parallel.sequenceParallel ? setup.parallel.tensorParallel : 1),
        contextShards_(setup.parallel.contextParallel), expertShards_(setup.parallel.expertParallel),
        expertTensorShards_(ExpertTensorParallelOf(setup.parallel)) {}

  void Forward(TraceBuilder& b) override {
    tape_.emplace(b, regime_.compute, regime_.autocast, parameterCount_);
    tape_->SetLayerHook(layerHook_);
    tape_->SetSoftmaxSavesInput(softmaxSavesInput_);
    tape_->SetSdpaEnableGqa(sdpaEnableGqa_);
    tape_->SetCheckpointReentrant(t_.useReentrant);
    tape_->SetCheckpointEarlyStop(checkpointEarlyStop_);
    tape_->SetGpu(gpu_);
    // About 70 values per block and 25 per expert, two thirds as many nodes.
    const auto blocks = static_cast<std::size_t>(a_.numLayers);
    const auto experts = static_cast<std::size_t>(std::max<std::int64_t>(0, a_.numExperts));
    const std::size_t values = std::min<std::size_t>(blocks * (80 + 30 * experts) + 256, std::size_t{1} << 20);
    tape_->Reserve(values, values * 2 / 3);
    // torchtune: `with self.activations_handling_ctx:` around the model's forward; one
    // OffloadActivations for the whole run (its ids and stashes span steps).
    if (t_.activationOffloading) {
      if (!offload_) offload_.emplace(b);
      offload_->SetActive(true);
      tape_->SetOffload(&*offload_);
    }
    parameters_.Reset();
    tape_->SetForwardTemplates(&inventory_, &parameters_.leaves());
    std::vector<std::uint8_t> kinds(blocks);
    for (std::size_t i = 0; i < blocks; ++i) {
      const int layer = static_cast<int>(i);
      kinds[i] = static_cast<std::uint8_t>((families::SlidingLayer(a_, layer) ? 1 : 0) |
                                           (families::RopeLayer(a_, layer) ? 2 : 0));
    }
    tape_->SetLayerKinds(std::move(kinds));
    model_.emplace(Model{*tape_, a_, t_, parameters_, b_, s_, &finetune_});
    model_->sequenceShards = sequenceShards_;
    model_->vocabShards = vocabShards_;
    model_->contextShards = contextShards_;
    model_->expertShards = expertShards_;
    model_->expertTensorShards = expertTensorShards_;
    model_->embeddingsRequireGrad = inputRequiresGrad_;
    model_->embeddingsHeldByGraph = !chunk_.active;
    Tape& t = *tape_;
    Model& m = *model_;
    m.Scope(-1, "batch");
    const DType i64 = DType::Int64;
    const bool bert = a_.family == Family::BERT;
    const bool classification = bert && a_.encoderHead == EncoderHead::Classification;
    auto input = [&](std::int64_t elements, const Shape& shape, const char* name, const char* label) {
      batch_.push_back(b.Alloc(Category::InputBatch, elements * 8, t.T({TextPart::View(name)}),
                               t.T({TextPart::View(label)}), t.text().Shape(shape, i64)));
    };
    // A pipeline stage loads what its chunk reads: input_ids on the first, labels on the last
    // (Megatron pretrain_gpt.py get_batch: the middle stages load nothing).
    const bool loadsIds = !chunk_.active || chunk_.embeddings, loadsLabels = !chunk_.active || chunk_.head;
    if (loadsIds) input(b_ * s_, {b_, s_}, "input_ids", "batch: input_ids");
    if (loadsIds || loadsLabels) input(b_ * s_, {b_, s_}, "attention_mask", "batch: attention_mask");
    if (bert) input(b_ * s_, {b_, s_}, "token_type_ids", "batch: token_type_ids");
    const Shape labelShape = classification ? Shape{b_} : Shape{b_, s_};
    if (loadsLabels) input(classification ? b_ : b_ * s_, labelShape, "labels", "batch: labels");
    ids_ = loadsIds ? t.External(batch_[0], {b_, s_}, i64, "input_ids") : kNoValue;
    labels_ = loadsLabels ? t.External(batch_.back(), labelShape, i64, "labels") : kNoValue;
    tokenTypes_ = bert ? t.External(batch_[2], {b_, s_}, i64, "token_type_ids") : kNoValue;
    m.labels = labels_;

    if (layerHook_) layerHook_->ForwardStart(b);  // Many GPUs: FSDP2 embedding unit
    const families::RunBlock block = [this](ValueId x, const Context& c, int i) { return Block(x, c, i); };
    ValueId logits = kNoValue;
    if (chunk_.active) {
      logits = ChunkForward(m, block);
      if (!chunk_.head) {  // no loss here: backward starts from the received output gradient
        if (layerHook_) layerHook_->ForwardEnd(b);  // the stage module's post-forward
        loss_ = sent_;
        t.EndAutocast();
        return;
      }
    } else switch (a_.family) {
      case Family::GPT2: logits = families::Gpt2Forward(m, ids_, block); break;
      case Family::Llama: logits = families::LlamaForward(m, ids_, block); break;
      case Family::BERT: logits = families::BertForward(m, ids_, tokenTypes_, block); break;
      case Family::GPTNeoX: logits = families::GptNeoXForward(m, ids_, block); break;
    }
    if (logits != kNoValue && a_.finalLogitSoftcap > 0.0) logits = SoftcappedLogits(m, logits);
    if (logits != kNoValue && a_.graniteMultipliers) {
      // GraniteForCausalLM.forward: logits = logits / self.config.logits_scaling, a new tensor;
      // the unscaled logits go once it is made (nothing saved them).
      m.Scope(-1, "lm_head");
      const ValueId scaled = ops::Scale(t, logits, "logits / logits_scaling");
      t.Drop(logits);
      logits = scaled;
    }
    if (layerHook_) layerHook_->ForwardEnd(b);  // Many GPUs: FSDP2 output unit resharded
    m.Scope(-1, "loss");
    if (offload_) offload_->SetActive(false);  // the loss runs outside the context
    loss_ = m.loss != kNoValue ? m.loss : blocks::CrossEntropy(m, logits, labels_, !bert);
    // The forward returns: its `hidden_states` go, then compute_loss returns the loss only and
    // the model output (the logits) goes.
    t.Drop(m.headInput);
    t.Drop(logits);
    t.EndAutocast();
  }

  // Gemma2ForCausalLM.forward's final_logit_softcapping: logits / cap, tanh, × cap before the
  // loss, each a new logits-sized tensor in the logits' dtype; tanh saves its output. The
  // caller's reference moves to the capped logits.
  static ValueId SoftcappedLogits(Model& m, ValueId logits) {
    Tape& t = m.t;
    m.Scope(-1, "lm_head");
    const ValueId divided = ops::Scale(t, logits, "logits / final_logit_softcapping");
    t.Drop(logits);
    const ValueId capped = ops::SavesOutput(t, divided, "tanh(logits / softcap)", t.TypeOf(divided));
    t.Drop(divided);
    const ValueId out = ops::Scale(t, capped, "logits × final_logit_softcapping");
    t.Drop(capped);
    return out;
  }

  // Pipeline parallelism: one chunk of the stage (parallel/pipeline.hpp). The first chunk of the
  // first stage embeds input_ids; the others start from the tensor received from the previous
  // stage (p2p_communication.py: torch.empty(tensor_shape, dtype=pipeline_dtype, requires_grad=True),
  // pipeline_dtype = params_dtype). The last chunk of the last stage ends with the final norm and
  // the head (the driver adds the loss); the others send their output, which Megatron frees after
  // the send (deallocate_pipeline_outputs=True, megatron/training/arguments.py), and start
  // backward from the received output gradient (backward_step: torch.autograd.backward(
  // output_tensor, grad_tensors=output_tensor_grad)). That gradient is modelled as the gradient a
  // one-element "send" node computes for the output: the tensor recv_backward allocates.
  ValueId ChunkForward(Model& m, const families::RunBlock& block) {
    Tape& t = m.t;
    Context c;
    ValueId x = kNoValue;
    ValueId inputsEmbeds = kNoValue;  // Gemma's unscaled embeddings, held to the last block
    const bool gpt2 = a_.family == Family::GPT2;
    if (chunk_.embeddings) {
      m.Scope(-1, "embeddings");
      if (gpt2) {  // as families::Gpt2Forward
        const ValueId tokens = blocks::WordEmbedding(m, ids_, m.parameters.ByName(t, "transformer.wte.weight"),
                                                     "wte(input_ids)");
        const ValueId positions = t.Fresh({1, s_}, DType::Int64, "position_ids");
        const ValueId pos = ops::Embedding(t, positions, m.parameters.ByName(t, "transformer.wpe.weight"), a_.hiddenSize,
                                           "wpe(position_ids)");
        t.Drop(positions);
        ValueId sum = ops::Add(t, tokens, pos, "inputs_embeds + position_embeds");
        t.Drop(tokens);
        t.Drop(pos);
        sum = sequence_split::RowParallelOutput(m, sum, "embeddings scatter (s/t)");  // as Gpt2Forward
        x = ops::Dropout(t, sum, a_.hiddenDropout, "embedding dropout");
        t.Drop(sum);
      } else {  // as families::LlamaForward
        inputsEmbeds = blocks::WordEmbedding(m, ids_, m.parameters.ByName(t, "model.embed_tokens.weight"),
                                             "embed_tokens(input_ids)");
        if (families::EmbeddingsScaledAtOnce(a_)) {  // scaled at once, as LlamaForward
          const ValueId scaled = families::ScaledEmbeddings(m, inputsEmbeds);
          t.Drop(inputsEmbeds);
          inputsEmbeds = scaled;
        }
        if (a_.embeddingScale && !a_.gemma3Layout) {
          x = t.Keep(inputsEmbeds);  // scaled after the rotary tables, as LlamaForward
        } else {
          x = sequence_split::RowParallelOutput(m, inputsEmbeds, "embeddings reduce-scatter (s/t)");
          inputsEmbeds = kNoValue;
        }
      }
    } else {
      // With sequence parallelism the stage boundary carries the rank's s/t tokens (Megatron
      // schedules.py get_tensor_shapes: seq_length // tensor_model_parallel_size when
      // sequence_parallel; s is already s/c with context parallelism, // cp_size there).
      m.Scope(-1, "pipeline recv");
      x = t.Fresh({b_, s_ / sequenceShards_, a_.hiddenSize}, regime_.weights,
                  "input_tensor (received from the previous stage)");
      t.RequireGrad(x);
      // forward_step's input_tensor stays in the schedule's input_tensors list until its
      // backward_step pops it (schedules.py), so it lives from the receive to the backward.
      received_ = t.Keep(x);
    }
    if (!gpt2) {
      m.Scope(-1, "rotary embedding");
      families::RotaryTables(m, c, t.TypeOf(x));
    }
    if (inputsEmbeds != kNoValue) {
      m.Scope(-1, "embeddings");
      t.Drop(x);
      x = sequence_split::RowParallelOutput(m, families::ScaledEmbeddings(m, inputsEmbeds),
                                            "embeddings reduce-scatter (s/t)");
    }
    x = families::DecoderBlocks(m, x, c, block);
    t.Drop(inputsEmbeds);
    if (chunk_.head) {
      m.Scope(-1, "final norm");
      const ValueId normed = gpt2 ? blocks::LayerNorm(m, x, families::RootModule(m, "transformer.ln_f"))
                                  : blocks::RmsNorm(m, x, families::RootModule(m, "model.norm"));
      t.Drop(x);
      const char* tied = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
      if (m.sequenceShards > 1) return sequence_split::LmHead(m, normed, tied, c);
      return families::LmHead(m, normed, tied, c);
    }
    t.Drop(c.mask);
    t.Drop(c.slidingMask);
    t.Drop(c.cos);
    t.Drop(c.sin);
    t.Drop(c.slidingCos);
    t.Drop(c.slidingSin);
    m.Scope(-1, "pipeline send");
    Tape::OpSpec send;
    send.name = "send output_tensor";
    send.inputs = {In{x, In::Compute}};
    send.shape = Shape{1};
    send.type = t.TypeOf(x);
    sent_ = t.Apply(send);
    t.Drop(x);
    return kNoValue;
  }

  void Backward(TraceBuilder&, GradientSink& gradients) override { tape_->Backward(loss_, gradients); }
  void SetLayerHook(LayerHook* hook) override { layerHook_ = hook; }

  void EndStep(TraceBuilder& b) override {
    Tape& t = *tape_;
    model_->Scope(-1, "end of step");
    t.ReleaseGraph();  // `del loss`: the graph goes first, then the loss's own storage
    t.Drop(loss_);
    t.Drop(ids_);
    t.Drop(labels_);
    t.Drop(tokenTypes_);
    t.Drop(received_);
    received_ = kNoValue;
    const Text released = t.T({"end of step: batch released"});
    for (TensorHandle h : batch_) b.Release(h, released);
    batch_.clear();
    model_.reset();
    tape_.reset();
  }

 private:
  // Runs block i, wrapped in a checkpoint when the setup says so.
  ValueId Block(ValueId x, const Context& shared, int i) {
    Model& m = *model_;
    // The block's own mask: Gemma 2's sliding layers take the sliding-window one
    // (decoder_layer(…, attention_mask=causal_mask_mapping[decoder_layer.attention_type])).
    Context c = shared;
    if (families::SlidingLayer(a_, i)) {
      if (c.slidingMask != kNoValue) c.mask = c.slidingMask;
      if (c.slidingCos != kNoValue) c.cos = c.slidingCos;
      if (c.slidingSin != kNoValue) c.sin = c.slidingSin;
    }
    c.slidingMask = c.slidingCos = c.slidingSin = kNoValue;
    // A pipeline chunk runs only its own blocks; the others pass x through untouched.
    if (chunk_.active && (i < chunk_.firstLayer || i >= chunk_.firstLayer + chunk_.layers)) return m.t.Keep(x);
    auto run = [&m, i, family = a_.family](ValueId in, const Context& ctx) {
      switch (family) {
        case Family::GPT2: return families::Gpt2Block(m, in, ctx, i);
        case Family::Llama: return families::LlamaBlock(m, in, ctx, i);
        case Family::BERT: return families::BertLayer(m, in, ctx, i);
        case Family::GPTNeoX: return families::GptNeoXBlock(m, in, ctx, i);
      }
      return m.t.Keep(in);
    };
    const bool selectiveOps = t_.checkpointing == Checkpointing::SelectiveOp;
    const bool checkpoint =
        t_.checkpointing == Checkpointing::EveryBlock || selectiveOps ||
        (t_.checkpointing == Checkpointing::EveryKthBlock && i % t_.checkpointInterval == 0);
    Tape::Values inputs = {x};
    for (ValueId v : {c.mask, c.cos, c.sin}) if (v != kNoValue) inputs.push_back(v);
    // A plain block: its forward may be copied from the blocks before it (Tape::PlainBlock);
    // the context goes in `inputs` too, so that a copy checks it is read as it was recorded.
    if (!checkpoint) {
      return m.t.PlainBlock(i, inputs, [&run, &c](Tape&, const Tape::Values& in) { return Tape::Values{run(in[0], c)}; })
          .front();
    }
    m.t.SetScope(m.t.T({"layers.", TextPart::Int(i)}), i);
    const Tape::Values outs = m.t.Checkpoint("block", inputs, [run, c](Tape&, const Tape::Values& in) {
      // Inputs after the first are the context in the order it was packed.
      Context local = c;
      int next = 1;
      if (c.mask != kNoValue) local.mask = in[next++];
      if (c.cos != kNoValue) local.cos = in[next++];
      if (c.sin != kNoValue) local.sin = in[next++];
      return Tape::Values{run(in[0], local)};
    }, selectiveOps);
    return outs.front();
  }

  // enable_input_require_grads(): a forward hook makes the embeddings' output require a
  // gradient, so that reentrant checkpointing passes gradients to the adapters of frozen blocks.
  // prepare_model_for_kbit_training calls it; so does transformers' gradient_checkpointing_enable
  // on a PEFT model (modeling_utils.py, _hf_peft_config_loaded).
  // Not with use_reentrant=False, which needs no such hook: prepare_model_for_kbit_training
  // calls it only when use_reentrant is on (peft/utils/other.py), and so does TRL
  // (trainer/sft_trainer.py, "For backward compatibility").
  static bool InputRequiresGrad(const Setup& setup) {
    const FinetuneDef& f = setup.finetune;
    const TrainingDef t = families::EffectiveTraining(setup);
    if (!t.useReentrant && t.checkpointing != Checkpointing::None) return false;
    return f.prepareForKbitTraining || (f.lora && t.checkpointing != Checkpointing::None);
  }

  PipelineChunk chunk_;
  const Inventory& inventory_;  // the blocks' parameters, for forward templates
  ValueId sent_ = kNoValue;  // a pipeline chunk's send node (its backward receives the gradient)
  ValueId received_ = kNoValue;  // a pipeline chunk's received input_tensor, held to its backward
  std::optional<ActivationOffload> offload_;  // declared first: the tape points at it
  const ArchitectureDef& a_;
  const TrainingDef t_;
  Regime regime_;
  std::int64_t b_, s_;
  Parameters parameters_;
  std::size_t parameterCount_;
  bool inputRequiresGrad_;
  const FinetuneDef& finetune_;
  std::optional<Tape> tape_;
  bool softmaxSavesInput_ = false;
  bool sdpaEnableGqa_ = true;
  bool checkpointEarlyStop_ = true;
  GpuParallelism gpu_;
  std::optional<Model> model_;
  std::vector<TensorHandle> batch_;
  ValueId ids_ = kNoValue, labels_ = kNoValue, tokenTypes_ = kNoValue, loss_ = kNoValue;
  LayerHook* layerHook_ = nullptr;
  std::int64_t vocabShards_ = 1;      // Megatron tensor parallel t (blocks::WordEmbedding)
  std::int64_t sequenceShards_ = 1;  // Megatron --sequence-parallel (core/src/parallel/sequence_split.hpp)
  std::int64_t contextShards_ = 1;   // Megatron --context-parallel-size (core/src/parallel/context_split.hpp)
  std::int64_t expertShards_ = 1;    // Megatron --expert-model-parallel-size (core/src/parallel/expert_split.hpp)
  std::int64_t expertTensorShards_ = 1;  // Megatron --expert-tensor-parallel-size (expert_split.hpp)
};

}  // namespace

// peft prepare_model_for_kbit_training (utils/other.py) calls gradient_checkpointing_enable():
// every block is checkpointed whatever the training section says. Op-level selective
// checkpointing is non-reentrant whatever useReentrant says: torch.utils.checkpoint takes a
// context_fn only with use_reentrant=False ("Passing `context_fn` or `debug` is only supported
// when use_reentrant=False"), and torchtitan's ptd_checkpoint_wrapper passes it so.
TrainingDef families::EffectiveTraining(const Setup& setup) {
  TrainingDef t = setup.training;
  if (setup.finetune.prepareForKbitTraining) t.checkpointing = Checkpointing::EveryBlock;
  if (t.checkpointing == Checkpointing::SelectiveOp) t.useReentrant = false;
  return t;
}

std::unique_ptr<ModelPass> MakeTransformerPass(const Setup& setup, const Inventory& inventory,
                                               const std::vector<Text>& names, const Regime& regime,
                                               std::vector<std::string>& notes) {
  const ArchitectureDef& a = setup.model.architecture;
  if (a.numExperts > 0 && setup.parallel.expertParallel == 1) {
    notes.push_back("Mixture of experts: tokens are taken as routed evenly (each expert gets b·s·k/E "
                    "of them); all expert weights are held. Saved activations depend only on the "
                    "total b·s·k, so imbalance changes the transients, not the saved total.");
  }
  if (setup.training.attention == AttentionImplementation::SDPA) {
    notes.push_back("Fused attention (SDPA): the kernel keeps its output and an fp32 log-sum-exp per "
                    "row; its backward holds an fp32 dq accumulator (FlashAttention-2).");
  }
  if (setup.training.maskedSoftmaxFusion) {
    // The rank's scores (the setup here is the rank's: heads already / t; context parallelism
    // needs SDPA, so the whole sequence).
    const std::int64_t heads = a.numHeads;
    const DType scores = regime.compute;
    const std::int64_t s = setup.training.sequenceLength, b = setup.training.batchSize;
    notes.push_back(blocks::MaskedSoftmaxKernelAvailable(b, heads, s, s, scores)
                        ? "Megatron's fused scale-mask-softmax: one kernel keeps the 16-bit probabilities of each layer."
                        : "Megatron's fused scale-mask-softmax is not available here (FusedScaleMaskSoftmax."
                          "is_kernel_available: 16-bit scores, 16 < s ≤ 4096, s and b·heads multiples of 4 and of "
                          "the kernel's rows per block): Megatron falls back to the unfused softmax, simulated as "
                          "the eager ops.");
  }
  if (families::KeepsDynamicCache(setup)) {
    notes.push_back("transformers' DynamicCache (use_cache): each layer's key and value are copied into the "
                    "cache and attention saves the copies for backward; use_cache=False "
                    "(training.useCache false) leaves them out.");
  }
  if (setup.training.precision == Precision::AmpFP16) {
    notes.push_back("fp16 autocast with GradScaler: the loss is scaled before backward and the "
                    "gradients are unscaled in place before the step (only scalars are added).");
  }
  return std::make_unique<TransformerPass>(setup, inventory, names, regime);
}

}  // namespace gpumem

namespace gpumem {

std::unique_ptr<ModelPass> MakeTransformerChunkPass(const Setup& setup, const Inventory& inventory,
                                                    const std::vector<Text>& names, const Regime& regime,
                                                    const PipelineChunk& chunk) {
  return std::make_unique<TransformerPass>(setup, inventory, names, regime, chunk);
}

}  // namespace gpumem
