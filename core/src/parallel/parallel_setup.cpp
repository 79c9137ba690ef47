// The parallel section: its names, its validation and the fields the page builds a panel from.
// Defaults are the frameworks' own (setup.hpp cites each); docs/parallel.md lists them.
#include "gpumem/finetune.hpp"
#include <cmath>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "gpumem/parallel.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/parallel_fidelity.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

constexpr Named<FsdpMode> kFsdpModes[] = {
    {FsdpMode::Off, "off", "off (DDP or DeepSpeed ZeRO)"},
    {FsdpMode::FullShard, "FULL_SHARD", "FSDP FULL_SHARD"},
    {FsdpMode::ShardGradOp, "SHARD_GRAD_OP", "FSDP SHARD_GRAD_OP"},
    {FsdpMode::HybridShard, "HYBRID_SHARD", "FSDP HYBRID_SHARD"},
    {FsdpMode::FullyShard, "fully_shard", "FSDP2 fully_shard"},
};
constexpr Named<OffloadKind> kOffloads[] = {
    {OffloadKind::None, "none", "none"},
    {OffloadKind::Optimizer, "optimizer", "optimizer states to CPU (ZeRO-Offload)"},
    {OffloadKind::OptimizerAndParameters, "optimizerAndParameters", "optimizer states and parameters to CPU"},
};
constexpr Named<PipelineSchedule> kSchedules[] = {
    {PipelineSchedule::OneFOneB, "1f1b", "1F1B"},
    {PipelineSchedule::GPipe, "gpipe", "GPipe (all forwards, then all backwards)"},
    {PipelineSchedule::Interleaved, "interleaved", "interleaved 1F1B (virtual stages)"},
};
constexpr Named<OverlapComm> kOverlaps[] = {
    {OverlapComm::Default, "default", "DeepSpeed's default (on for stage 3, off otherwise)"},
    {OverlapComm::On, "true", "on"},
    {OverlapComm::Off, "false", "off"},
};

// In ParallelJson's key order (core/src/io/json.cpp): the page compares the form's values with
// the default parallel section as JSON text (web/parallel-panel.js fillParallel).
constexpr ParallelField kFields[] = {
    {"dataParallel", "data parallel size", "count", "", "GPUs that each see other samples; 1 = one GPU"},
    {"zeroStage", "ZeRO stage", "count", "", "DeepSpeed zero_optimization.stage 0–3; 0 = DDP"},
    {"fsdp", "FSDP", "select", "fsdpModes", "torch FSDP ShardingStrategy or FSDP2 fully_shard"},
    {"reshardAfterForward", "reshard_after_forward", "bool", "", "fully_shard: free gathered parameters after forward (default true)"},
    {"fsdpShardGroupSize", "HYBRID_SHARD group", "count", "", "GPUs that shard one copy (a node, default 8)"},
    {"limitAllGathers", "limit_all_gathers", "bool", "", "FSDP: at most two units gathered ahead (default true)"},
    {"forwardPrefetch", "forward_prefetch", "bool", "", "FSDP: gather the next unit during forward (default false)"},
    {"backwardPrefetch", "backward_prefetch", "bool", "", "FSDP BACKWARD_PRE: gather the next unit before the current one's backward (default true)"},
    {"bucketCapMB", "bucket_cap_mb", "number", "", "DDP gradient bucket, MiB (default 25; the first bucket is 1 MiB)"},
    {"gradientAsBucketView", "gradient_as_bucket_view", "bool", "", "DDP: .grad are views of the buckets (default false: gradients twice)"},
    {"zeroRedundancyOptimizer", "ZeroRedundancyOptimizer", "bool", "", "torch's ZeRO-1 over DDP: states of whole parameters split across ranks (default false)"},
    {"reduceBucketSize", "reduce_bucket_size", "count", "", "ZeRO: elements per reduce bucket (default 5e8)"},
    {"allgatherBucketSize", "allgather_bucket_size", "count", "", "ZeRO 1/2: elements per all-gather bucket (default 5e8); the step's all-gather writes into the flat parameters, so it takes no memory"},
    {"overlapComm", "overlap_comm", "select", "overlapComms", "ZeRO: two reduce buckets when on"},
    {"contiguousGradients", "contiguous_gradients", "bool", "", "ZeRO: gradients copied into the reduce bucket (default true)"},
    {"stage3PrefetchBucketSize", "stage3_prefetch_bucket_size", "count", "", "ZeRO-3: elements gathered ahead (default 5e7)"},
    {"stage3MaxLiveParameters", "stage3_max_live_parameters", "count", "", "ZeRO-3: gathered elements at most (default 1e9)"},
    {"stage3MaxReuseDistance", "stage3_max_reuse_distance", "count", "", "ZeRO-3: a parameter used again within this many elements stays gathered (default 1e9)"},
    {"subGroupSize", "sub_group_size", "count", "", "ZeRO-3: the optimizer steps sub-groups of this many elements of the partition (default 1e9)"},
    {"stage3ParamPersistenceThreshold", "stage3_param_persistence_threshold", "count", "", "ZeRO-3: parameters below it stay whole (default 1e5)"},
    {"offload", "offload", "select", "offloads", "ZeRO-Offload / ZeRO-Infinity / FSDP CPUOffload"},
    {"tensorParallel", "tensor parallel size", "count", "", "Megatron --tensor-model-parallel-size"},
    {"sequenceParallel", "sequence parallel", "bool", "", "Megatron --sequence-parallel (needs tensor parallel > 1)"},
    {"pipelineParallel", "pipeline parallel size", "count", "", "Megatron --pipeline-model-parallel-size"},
    {"pipelineSchedule", "pipeline schedule", "select", "pipelineSchedules", "1F1B, GPipe or interleaved"},
    {"virtualStages", "virtual stages", "count", "", "interleaved: model chunks per pipeline rank"},
    {"pipelineStage", "simulated pipeline stage", "number", "", "-1 = the first or the last, whichever peaks higher; else 0 … p − 1"},
    {"pipelineFirstStageLayers", "layers in the first stage", "number", "", "Megatron --decoder-first-pipeline-num-layers; 0 = not set (an even split, or torchtitan's when p does not divide the layers)"},
    {"pipelineLastStageLayers", "layers in the last stage", "number", "", "Megatron --decoder-last-pipeline-num-layers; 0 = not set"},
    {"contextParallel", "context parallel size", "count", "", "Megatron --context-parallel-size"},
    {"expertParallel", "expert parallel size", "count", "", "Megatron --expert-model-parallel-size"},
    {"expertTensorParallel", "expert tensor parallel size", "number", "", "Megatron --expert-tensor-parallel-size: ranks splitting each expert's MLP; 0 = the tensor parallel size (Megatron's default)"},
    {"gradientAccumulationSteps", "gradient accumulation steps", "count", "", "micro-batches per optimizer step (the pipeline's m)"},
    {"fsdpReduceInFp32", "reduce_dtype=float32", "bool", "", "FSDP2 MixedPrecisionPolicy: reduce-scatter gradients in fp32 (default false: the param dtype)"},
    {"fsdpShardEmbeddingsAndHead", "shard embeddings and output apart", "bool", "", "FSDP2: tok_embeddings and output as units of their own (torchtune custom_sharded_layers; default false)"},
    {"gradReduceInFp32", "grad_reduce_in_fp32", "bool", "", "Megatron: one fp32 gradient buffer for the whole model (on with --bf16; default false)"},
    {"fsdpWrapAdaptersApart", "PEFT wrap: adapters in FSDP units of their own", "bool", "", "FSDP with LoRA: peft's fsdp_auto_wrap_policy (use_orig_params=False), each lora_A / lora_B an FSDP unit, the blocks' frozen weights get no gradient (default false)"},
    {"fsdpKeepLastBlockGathered", "last block: reshard_after_forward=False", "bool", "", "FSDP2: the last transformer block stays gathered from its forward to its backward (torchtitan apply_fsdp without PP; default false)"},
};

constexpr std::int64_t kMaxRanks = 1'000'000;  // GPUs in one job, far above any cluster

// Fine-tuning on many GPUs (docs/parallel.md, "Fine-tuning on many GPUs"): data parallelism with
// DDP (the reducer's buckets cover the trainable parameters only) and ZeRO 1–2 (the flat fp32
// partition holds them only; frozen and quantized weights stay whole on every rank) are
// simulated. What is not yet is refused by the field that asks for it.
// FSDP2 fully_shard with frozen weights and adapters, as torchtune's lora_finetune_distributed
// recipe runs it (training/_distributed.py shard_model: fully_shard per layer, then the root; the
// whole model in one dtype, adapters trained, base frozen): simulated with per-parameter shards
// (docs/parallel.md, "Fine-tuning on many GPUs"). What is not is refused here.
void ValidateFsdp2Finetune(const Setup& setup, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  const FinetuneDef& f = setup.finetune;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  const Regime regime = RegimeOf(setup.training.precision);
  // The sharded parameters' dtype: fp32 under a MixedPrecisionPolicy (the model is fp32 and
  // param_dtype is the gathered copy's), else the weights' dtype.
  const DType sharded = regime.masterWeights ? DType::FP32 : regime.weights;
  if (f.quantization == Quantization::Int8) {
    bad("fsdp", "FSDP2 fully_shard with 8-bit (LLM.int8) weights is not simulated.");
  } else if (f.quantization != Quantization::None && f.quantLayout != QuantLayout::TorchaoNf4) {
    // bitsandbytes' Params4bit under fully_shard is what no recipe runs (torchtune's QLoRA keeps
    // the base as torchao NF4Tensor; PEFT / accelerate's FSDP-QLoRA is FSDP1): not simulated.
    bad("fsdp", "FSDP2 fully_shard with bitsandbytes 4-bit weights is not simulated: torchtune's QLoRA stores them as "
                "torchao NF4Tensor (set finetune.quantLayout to torchaoNf4); use FSDP (FULL_SHARD) for PEFT's "
                "FSDP-QLoRA.");
  }
  // The even split of each NF4Tensor over the ranks (torchao nf4_split) is checked with the
  // inventory, by ValidateFinetune (finetune.cpp), once the model is valid.
  if (f.lora && f.adapterDType == AdapterDType::FP32 && sharded != DType::FP32) {
    bad("fsdp", std::string("FSDP2 fine-tuning is simulated with the whole model in one dtype, as torchtune loads it: "
                            "fp32 adapters beside ") +
                    DTypeId(sharded) + " weights are not; set the adapters' dtype to the weights' (finetune.adapterDType).");
  }
  if (f.prepareForKbitTraining && sharded != DType::FP32) {
    bad("fsdp", "FSDP2 fine-tuning is simulated with the whole model in one dtype: prepare_model_for_kbit_training's "
                "fp32 upcasts beside 16-bit weights are not; turn finetune.prepareForKbitTraining off.");
  }
  if (p.offload == OffloadKind::Optimizer) {
    // fully_shard(offload_policy=CPUOffloadPolicy()) moves the sharded parameters, their
    // gradients and so the optimizer step to the host together (_fsdp_param.py offload_to_cpu);
    // torchtune's fsdp_cpu_offload: True is that policy. The optimizer alone is no FSDP2 option.
    bad("offload", "FSDP2's CPUOffloadPolicy offloads the parameter shards, their gradients and the optimizer "
                   "together: choose optimizer and parameters (torchtune's fsdp_cpu_offload: True).");
  }
  if (p.fsdpShardEmbeddingsAndHead) {
    // A frozen output layer of its own would still be gathered in backward for its input's
    // gradient, with no gradient to reduce: not simulated.
    bad("fsdpShardEmbeddingsAndHead", "Embedding and output units of their own (custom_sharded_layers) are not "
                                      "simulated with the finetune section: turn it off (torchtune's LoRA configs "
                                      "leave it unset).");
  }
}

// Fine-tuning with tensor parallelism as PEFT's LoraParallelLinear writes it over Megatron's
// layers (peft src/peft/tuners/lora/tp_layer.py, LoraParallelLinear.update_layer): on a
// RowParallelLinear base lora_A is a RowParallelLinear (input_is_parallel, its rows split: [r, in/t])
// and lora_B a whole nn.Linear [out, r]; on a ColumnParallelLinear base lora_A is a whole
// nn.Linear [r, in] and lora_B a ColumnParallelLinear ([out/t, r], gather_output=False). Both are
// the shapes an adapter takes on the rank's slimmer layers (sharding.cpp TensorSlices), so the
// rank's inventory and blocks::Linear give them; the base weights are frozen Megatron shards.
void ValidateTensorParallelFinetune(const Setup& setup, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  const FinetuneDef& f = setup.finetune;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  if (f.quantization != Quantization::None) {
    // bitsandbytes' Linear4bit / Linear8bitLt replace nn.Linear; Megatron's parallel layers are
    // not quantized by them, and PEFT's LoraParallelLinear wraps only Megatron's layers.
    bad("tensorParallel", "Tensor parallelism with quantized base weights (QLoRA) is not simulated: bitsandbytes "
                          "quantizes nn.Linear, not Megatron's parallel layers. Use 16-bit weights, or data parallelism.");
  }
  if (f.lora && f.adapterDType == AdapterDType::Weights && RegimeOf(setup.training.precision).weights != DType::FP32) {
    // tp_layer.py update_layer: "lora needs to be forced to upgrade to 32-bit precision"
    // (megatron_config.params_dtype = torch.float32; the nn.Linear halves dtype=torch.float32).
    bad("tensorParallel", "PEFT's LoraParallelLinear makes the adapters fp32 under tensor parallelism: set the "
                          "adapters' dtype to fp32 (finetune.adapterDType).");
  }
  if (f.lora && f.useDora) {
    // tp_layer.py LoraParallelLinear.__init__: "LoraParallelLinear does not support DoRA yet" (ValueError).
    bad("tensorParallel", "PEFT's LoraParallelLinear refuses DoRA under tensor parallelism: turn DoRA off.");
  }
  if (p.fsdp != FsdpMode::Off || p.zeroStage == 3) {
    // PEFT's LoraParallelLinear is written for Megatron's layers and Megatron's DDP or
    // distributed optimizer; FSDP / ZeRO-3 over tensor-parallel adapters is not simulated.
    bad("tensorParallel", "Tensor parallelism with the finetune section is simulated with DDP or ZeRO 1–2 (Megatron's "
                          "distributed optimizer), not with FSDP or ZeRO-3.");
  }
  if (p.sequenceParallel) {
    // With sequence parallelism lora_A of a column-parallel base runs on the sequence shard and
    // lora_B gathers it; a row-parallel base reduce-scatters before the adapter's sum: not yet.
    bad("sequenceParallel", "Sequence parallelism with the finetune section is not simulated yet: turn sequence "
                            "parallelism off (tensor parallelism alone is simulated).");
  }
}

void ValidateParallelFinetune(const Setup& setup, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  const FinetuneDef& f = setup.finetune;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  const char* notYet = " with frozen weights, adapters or quantized weights (the finetune section) is not simulated "
                       "yet: use data parallelism (DDP or ZeRO 1–2), or estimate one GPU.";
  if (p.fsdp == FsdpMode::FullyShard) ValidateFsdp2Finetune(setup, errors);
  if (f.quantization != Quantization::None && f.quantLayout == QuantLayout::TorchaoNf4 && p.fsdp != FsdpMode::FullyShard) {
    // torchtune's distributed QLoRA (lora_finetune_distributed.py) shards with FSDP2 only.
    bad("fsdp", "torchao's NF4Tensor on many GPUs is simulated under FSDP2 fully_shard (torchtune's "
                "lora_finetune_distributed); choose fully_shard, or the bitsandbytes layout.");
  }
  if (p.fsdp != FsdpMode::Off && p.fsdp != FsdpMode::FullyShard) {
    // FSDP (use_orig_params=True) flattens a unit's parameters, frozen and trainable, into one
    // FlatParameter of one dtype (_flat_param.py _validate_tensors_to_flatten: "Must flatten
    // tensors with uniform dtype"): the model's fp32 copy under MixedPrecision (the regime's fp32
    // shards), else the weights' dtype.
    const Regime regime = RegimeOf(setup.training.precision);
    const DType flat = regime.masterWeights ? DType::FP32 : regime.weights;
    if (f.lora && f.adapterDType == AdapterDType::FP32 && flat != DType::FP32) {
      bad("fsdp", std::string("FSDP flattens a block's parameters into one FlatParameter of one dtype: fp32 adapters beside ") +
                      DTypeId(flat) + " weights are refused by FSDP; set the adapters' dtype to the weights' (finetune.adapterDType).");
    }
    if (f.prepareForKbitTraining && flat != DType::FP32) {
      bad("fsdp", "FSDP flattens a block's parameters into one FlatParameter of one dtype: prepare_model_for_kbit_training's "
                  "fp32 upcasts beside 16-bit weights are refused by FSDP; turn finetune.prepareForKbitTraining off.");
    }
    if (f.quantization == Quantization::Int8) {
      bad("fsdp", "FSDP with 8-bit (LLM.int8) weights is not simulated: use 4-bit weights with a float quant storage.");
    } else if (f.quantization != Quantization::None) {
      if (regime.masterWeights) {
        // MixedPrecision casts the FlatParameter to param_dtype at each all-gather; packed codes
        // stored as fp32 would not survive the cast. FSDP-QLoRA keeps the model in bf16.
        bad("fsdp", "FSDP with 4-bit weights is simulated with the model kept in 16 bits (precision bf16 or fp16, "
                    "quant storage the same), as FSDP-QLoRA runs it: MixedPrecision would cast the packed codes.");
      } else if (f.quantStorage != flat) {
        bad("fsdp", std::string("FSDP flattens the 4-bit weights with the others: set bnb_4bit_quant_storage ") +
                        "(finetune.quantStorage) to " + DTypeId(flat) + " (PEFT's FSDP-QLoRA guide).");
      }
    }
  }
  if (p.tensorParallel > 1) ValidateTensorParallelFinetune(setup, errors);
  // Pipeline parallelism composes as it is: a stage holds its layers' frozen weights and adapters,
  // and its received input requires its gradient as a block's input does on one GPU
  // (tests/pipeline_compose_test.cpp; scripts/validate_tensor.py llama-pp2-tp2-lora-m2). Not with
  // FSDP2 per stage: its no-sync backwards with frozen units are not simulated.
  if (p.pipelineParallel > 1 && p.fsdp == FsdpMode::FullyShard) {
    bad("pipelineParallel", std::string("Pipeline parallelism with FSDP2") + notYet);
  }
  // Context parallelism composes as it is: the rank runs its blocks, adapters included, on s/c
  // tokens, with Transformer Engine's ring attention (tests/pipeline_compose_test.cpp).
  if (p.expertParallel > 1) bad("expertParallel", std::string("Expert parallelism") + notYet);
  if (p.zeroStage >= 1) {
    // DeepSpeed casts the whole module to the training dtype before it builds its groups
    // (deepspeed/runtime/engine.py _configure_distributed_model: module.half() / module.bfloat16()),
    // so fp32 adapters or prepare_model_for_kbit_training's fp32 upcasts do not survive, and its
    // flat groups hold one dtype (stage_1_and_2.py flattens each bit16 group into one tensor).
    // Simulated where the trainable parameters are already in the weights' dtype.
    const bool sixteenBit = RegimeOf(setup.training.precision).weights != DType::FP32;
    if (sixteenBit && f.lora && f.adapterDType == AdapterDType::FP32) {
      bad("zeroStage", "DeepSpeed casts the module to 16 bits (engine.py module.bfloat16()/half()), so fp32 adapters "
                       "become 16-bit: set the adapters' dtype to the weights' dtype (finetune.adapterDType) to simulate it.");
    }
    if (sixteenBit && f.prepareForKbitTraining) {
      bad("zeroStage", "DeepSpeed casts the module to 16 bits (engine.py module.bfloat16()/half()), undoing "
                       "prepare_model_for_kbit_training's fp32 upcasts: turn finetune.prepareForKbitTraining off to "
                       "simulate it.");
    }
  }
  if (p.zeroStage == 3 && f.quantization != Quantization::None) {
    // ZeRO-3 partitions every parameter, the quantized ones too, and gathers a block's in one
    // flat buffer of the weights' dtype: PEFT's "DeepSpeed ZeRO-3 + QLoRA" guide sets
    // bnb_4bit_quant_storage to that dtype so the packed codes travel as its elements.
    const DType weights = RegimeOf(setup.training.precision).weights;
    if (f.quantization == Quantization::Int8) {
      bad("zeroStage", "ZeRO-3 with 8-bit (LLM.int8) weights is not simulated: use 4-bit weights with a float quant storage.");
    } else if (f.quantStorage != weights) {
      bad("zeroStage", std::string("ZeRO-3 partitions the 4-bit weights with the others: set bnb_4bit_quant_storage ") +
                           "(finetune.quantStorage) to the weights' dtype, " + DTypeId(weights) + " (PEFT's ZeRO-3 QLoRA guide).");
    }
  }
}

// Expert parallelism and expert tensor parallelism (docs/parallel.md, "Expert parallelism").
// Megatron lays a second grid over the same ranks for the experts: expert tensor parallel (etp,
// default t) × expert parallel (e) × expert data parallel (parallel_state.initialize_model_
// parallel's expert_decoder_rank_generator), and runs MoE layers through the all-to-all token
// dispatcher (megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher).
void ValidateExpertParallel(const Setup& setup, bool sizesOk, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  if (p.expertTensorParallel < 0 || p.expertTensorParallel > 1024) {
    bad("expertTensorParallel", "The expert tensor parallel size must be 0 (the tensor parallel size, Megatron's default) "
                                "or a whole number from 1 to 1,024, got " + std::to_string(p.expertTensorParallel) + ".");
    return;
  }
  if (!sizesOk) return;
  const ArchitectureDef& a = setup.model.architecture;
  const bool moe = setup.model.kind == ModelKind::Transformer && a.numExperts > 0;
  const std::int64_t e = p.expertParallel, t = p.tensorParallel, etp = ExpertTensorParallelOf(p);
  const bool explicitEtp = p.expertTensorParallel > 0;
  if (explicitEtp && !moe) {
    bad("expertTensorParallel", "Expert tensor parallelism splits each expert's MLP: the model has no experts.");
    return;
  }
  if (moe && etp > 1 && ExpertIntermediateSize(a) % etp != 0) {
    // ColumnParallelLinear fc1 / RowParallelLinear fc2 inside each expert (experts.py
    // SequentialMLP / TEGroupedMLP over the expert tensor parallel group) split the width evenly.
    bad(explicitEtp ? "expertTensorParallel" : "tensorParallel",
        "Megatron splits each expert's width (" + std::to_string(ExpertIntermediateSize(a)) +
            ") evenly over the expert tensor parallel ranks (" + std::to_string(etp) + "): it must divide it.");
  }
  // The simulation runs Megatron's dispatcher with expert parallelism, and with sequence
  // parallelism (whose s/t tokens Hugging Face's per-expert loop does not split); elsewhere the
  // experts run Hugging Face's loop on the rank's 1/t slices.
  const bool dispatcher = moe && (e > 1 || (p.sequenceParallel && t > 1));
  if (moe && explicitEtp && etp != t && !dispatcher) {
    bad("expertTensorParallel", "An expert tensor parallel size other than the tensor parallel size is simulated with "
                                "Megatron's all-to-all token dispatcher: set expertParallel > 1 or sequence parallelism.");
  }
  if (dispatcher && (p.dataParallel * p.contextParallel * t) % (etp * e) != 0) {
    bad("expertParallel", "Megatron lays the experts' grid over the same ranks as data × context × tensor parallel (" +
                              std::to_string(p.dataParallel * p.contextParallel * t) +
                              "): expert tensor parallel × expert parallel (" + std::to_string(etp * e) +
                              ") must divide it (parallel_state.initialize_model_parallel).");
  }
  if (e <= 1) return;
  if (!moe) {
    bad("expertParallel", "Expert parallelism splits a mixture of experts: the model has no experts.");
    return;
  }
  if (a.numExperts % e != 0) {
    bad("expertParallel", "Each expert-parallel rank holds whole experts: the expert parallel size must divide the "
                          "number of experts (" + std::to_string(a.numExperts) + ").");
  }
  if (p.fsdp == FsdpMode::FullyShard) {
    // torchtitan runs MoE under FSDP2 with rules of its own, not simulated yet: each block one
    // fully_shard unit whose routed experts (GroupedExperts, one [E/e, …] tensor per weight) are
    // sharded over the efsdp mesh of dp_shard·cp·t / e ranks (Shard(0) on the expert dimension,
    // Shard(1) when efsdp·e > E) and the rest over dp_shard·cp (torchtitan/distributed/fsdp.py
    // apply_fsdp's shard_placement_fn; parallel_dims.py build_mesh), and its own all-to-all
    // dispatcher (torchtitan/distributed/expert_parallel.py).
    bad("expertParallel", "Expert parallelism with FSDP2 is not simulated yet: torchtitan shards the routed experts "
                          "over dp_shard × cp × t / e ranks (its efsdp mesh) and the rest over dp_shard × cp, with "
                          "its own token dispatcher (docs/parallel.md). Use DDP or ZeRO 1–2 (Megatron's distributed "
                          "optimizer).");
  } else if (p.zeroStage == 3) {
    // deepspeed/runtime/engine.py _configure_zero_optimizer, stage 3: assert not
    // self.has_moe_layers, "MoE not supported with Stage 3".
    bad("expertParallel", "DeepSpeed refuses ZeRO-3 with experts (engine.py: \"MoE not supported with Stage 3\"): use "
                          "ZeRO 1–2, or Megatron's distributed optimizer (ZeRO-1 here).");
  } else if (p.fsdp != FsdpMode::Off) {
    // FSDP1's FlatParameter units have one process group; neither Megatron (DDP or its
    // distributed optimizer over expert_data_parallel_group) nor DeepSpeed (MoE param groups
    // under ZeRO 1–2) runs expert parallelism through it.
    bad("expertParallel", "Expert parallelism with FSDP1 (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD) is not simulated: "
                          "its units shard over one group, and Megatron and DeepSpeed run experts with DDP or ZeRO 1–2. "
                          "Use DDP or ZeRO 1–2.");
  }
  if (p.zeroRedundancyOptimizer) {
    bad("expertParallel", "Expert parallelism with ZeroRedundancyOptimizer is not simulated: use ZeRO 1–2.");
  }
  if (t > 1 && !p.sequenceParallel) {
    // megatron/core/transformer/moe/moe_layer.py MoELayer.forward: "During training, performance
    // may degrade if MoE and tensor parallelism are enabled without also enabling sequence
    // parallelism." (a ValueError).
    bad("sequenceParallel", "Megatron's MoE layer refuses to train with tensor parallelism but no sequence parallelism "
                            "(moe_layer.py MoELayer.forward raises): turn sequence parallelism on.");
  }
}

}  // namespace

std::span<const Named<FsdpMode>> NamesOf(FsdpMode) { return kFsdpModes; }
std::span<const Named<OffloadKind>> NamesOf(OffloadKind) { return kOffloads; }
std::span<const Named<PipelineSchedule>> NamesOf(PipelineSchedule) { return kSchedules; }
std::span<const Named<OverlapComm>> NamesOf(OverlapComm) { return kOverlaps; }
std::span<const ParallelField> ParallelFields() { return kFields; }

std::int64_t WorldSize(const ParallelDef& p) {
  return p.dataParallel * p.tensorParallel * p.pipelineParallel * p.contextParallel;
}

std::int64_t ExpertTensorParallelOf(const ParallelDef& p) {
  return p.expertTensorParallel > 0 ? p.expertTensorParallel : p.tensorParallel;
}

std::int64_t ExpertDataParallelOf(const ParallelDef& p) {
  // megatron/core/parallel_state.py initialize_model_parallel: expert_data_parallel_size =
  // world_size // (expert_tensor_parallel_size · expert_model_parallel_size · pp); the
  // non-expert grid's world is tp · cp · dp · pp, so the pp factors cancel.
  const std::int64_t ranks = ExpertTensorParallelOf(p) * p.expertParallel;
  return ranks > 0 ? p.dataParallel * p.contextParallel * p.tensorParallel / ranks : 1;
}

bool IsParallel(const ParallelDef& p) {
  return p.dataParallel != 1 || p.tensorParallel != 1 || p.pipelineParallel != 1 || p.contextParallel != 1 ||
         p.expertParallel != 1 || p.zeroStage != 0 || p.fsdp != FsdpMode::Off || p.offload != OffloadKind::None ||
         p.zeroRedundancyOptimizer ||
         p.gradReduceInFp32;  // Megatron's DDP wraps the model with its buffer on one GPU too
}

void ValidateParallel(const Setup& setup, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  auto count = [&](const char* field, std::int64_t value, std::int64_t max, const char* what) {
    if (value < 1 || value > max) {
      bad(field, std::string(what) + " must be a whole number from 1 to " + FormatCount(max) + ", got " +
                     std::to_string(value) + ".");
      return false;
    }
    return true;
  };
  bool sizesOk = count("dataParallel", p.dataParallel, kMaxRanks, "The data parallel size");
  sizesOk &= count("tensorParallel", p.tensorParallel, 1024, "The tensor parallel size");
  sizesOk &= count("pipelineParallel", p.pipelineParallel, 4096, "The pipeline parallel size");
  sizesOk &= count("contextParallel", p.contextParallel, 4096, "The context parallel size");
  sizesOk &= count("expertParallel", p.expertParallel, kMaxRanks, "The expert parallel size");
  count("virtualStages", p.virtualStages, 1024, "The number of virtual stages");
  count("gradientAccumulationSteps", p.gradientAccumulationSteps, 1'000'000, "Gradient accumulation steps");
  count("fsdpShardGroupSize", p.fsdpShardGroupSize, kMaxRanks, "The HYBRID_SHARD group size");
  count("reduceBucketSize", p.reduceBucketSize, 1'000'000'000'000, "reduce_bucket_size");
  count("allgatherBucketSize", p.allgatherBucketSize, 1'000'000'000'000, "allgather_bucket_size");
  count("stage3PrefetchBucketSize", p.stage3PrefetchBucketSize, 1'000'000'000'000, "stage3_prefetch_bucket_size");
  count("stage3MaxLiveParameters", p.stage3MaxLiveParameters, 1'000'000'000'000, "stage3_max_live_parameters");
  if (p.stage3MaxReuseDistance < 0 || p.stage3MaxReuseDistance > 1'000'000'000'000) {
    bad("stage3MaxReuseDistance", "stage3_max_reuse_distance must be from 0 to 1e12 elements.");
  }
  if (p.subGroupSize < 0 || p.subGroupSize > 1'000'000'000'000) {
    bad("subGroupSize", "sub_group_size must be from 0 to 1e12 elements.");
  }
  if (p.stage3ParamPersistenceThreshold < 0 || p.stage3ParamPersistenceThreshold > 1'000'000'000'000) {
    bad("stage3ParamPersistenceThreshold", "stage3_param_persistence_threshold must be from 0 to 1e12 elements.");
  }
  if (!std::isfinite(p.bucketCapMB) || p.bucketCapMB <= 0 || p.bucketCapMB > 1'048'576) {
    bad("bucketCapMB", "bucket_cap_mb must be a positive number of MiB up to 1 TiB.");
  }
  if (p.zeroStage < 0 || p.zeroStage > 3) bad("zeroStage", "The ZeRO stage is 0, 1, 2 or 3.");
  if (sizesOk && WorldSize(p) > kMaxRanks) {
    bad("dataParallel", "Data × tensor × pipeline × context parallel is " +
                            FormatScientific(double(p.dataParallel) * double(p.tensorParallel) *
                                             double(p.pipelineParallel) * double(p.contextParallel)) +
                            " GPUs, more than 1e6.");
  }
  // Combinations the sharded step does not simulate yet: refused by name rather than estimated
  // with one GPU's rules (the sharding code assumes every parameter trains in the regime's dtype,
  // and its gradient hooks replace the optimizer-in-backward's).
  if (IsParallel(p) && FinetuneActive(setup.finetune)) ValidateParallelFinetune(setup, errors);
  if (IsParallel(p) && setup.training.optimizerInBackward) {
    bad("dataParallel", "Many GPUs with the optimizer step in backward are not simulated yet: estimate one GPU, or "
                        "turn the optimizer in backward off.");
  }
  if (p.gradientAccumulationSteps > 1 && setup.training.optimizerInBackward) {
    bad("gradientAccumulationSteps", "The optimizer step in backward frees each gradient at once, so gradients cannot "
                                     "accumulate over micro-batches (torchtune refuses it too): set 1 step or turn it off.");
  }
  if (p.zeroRedundancyOptimizer) {
    if (p.zeroStage != 0 || p.fsdp != FsdpMode::Off) {
      bad("zeroRedundancyOptimizer", "ZeroRedundancyOptimizer wraps a torch optimizer under DDP: not with a ZeRO stage or FSDP.");
    } else if (p.dataParallel < 2) {
      bad("zeroRedundancyOptimizer", "ZeroRedundancyOptimizer needs data parallel > 1.");
    }
    if (RegimeOf(setup.training.precision).masterWeights) {
      bad("zeroRedundancyOptimizer", "ZeroRedundancyOptimizer is simulated without fp32 master copies: choose fp32, bf16 or autocast.");
    }
  }
  ValidateParallelFidelity(setup, errors);
  if (p.fsdpWrapAdaptersApart) {
    // PEFT's fsdp_auto_wrap_policy (peft/utils/other.py) is an FSDP1 auto_wrap_policy over a LoRA
    // model: FSDP2's fully_shard takes no such policy, and without LoRA there is no adapter to wrap.
    const FinetuneDef& f = setup.finetune;
    if (p.fsdp != FsdpMode::FullShard && p.fsdp != FsdpMode::ShardGradOp && p.fsdp != FsdpMode::HybridShard) {
      bad("fsdpWrapAdaptersApart", "PEFT's FSDP wrap policy (adapters in units of their own) applies to FSDP "
                                   "(FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD) only.");
    } else if (setup.model.kind != ModelKind::Transformer || !f.lora) {
      bad("fsdpWrapAdaptersApart", "PEFT's FSDP wrap policy wraps LoRA adapters: it needs a transformer with LoRA "
                                   "(finetune.lora).");
    } else if (f.useDora) {
      // With use_orig_params=False a FlatParameter needs uniform requires_grad
      // (_flat_param.py _validate_tensors_to_flatten): a trainable parameter outside a leaf
      // Linear (DoRA's lora_magnitude_vector, a ParameterDict) would share its block's
      // FlatParameter with frozen weights, which FSDP refuses.
      bad("fsdpWrapAdaptersApart", "With PEFT's FSDP wrap policy only lora_A / lora_B may train: DoRA's magnitude "
                                   "vectors would share a block's FlatParameter with frozen weights, which FSDP refuses "
                                   "without use_orig_params (turn finetune.useDora off).");
    }
  }
  if (p.fsdp != FsdpMode::Off && p.zeroStage != 0) {
    bad("fsdp", "FSDP and DeepSpeed ZeRO shard the same states: choose one (zeroStage 0 with FSDP).");
  }
  if (p.offload != OffloadKind::None && p.zeroStage == 0 && p.fsdp == FsdpMode::Off) {
    bad("offload", "Offload needs ZeRO (stage ≥ 1 for the optimizer, 3 for parameters) or FSDP.");
  }
  if (p.offload == OffloadKind::OptimizerAndParameters && p.zeroStage != 0 && p.zeroStage != 3) {
    bad("offload", "DeepSpeed offloads parameters only with ZeRO stage 3 (offload_param).");
  }
  if (p.fsdp == FsdpMode::HybridShard && sizesOk && p.dataParallel % p.fsdpShardGroupSize != 0 &&
      p.fsdpShardGroupSize < p.dataParallel) {
    bad("fsdpShardGroupSize", "HYBRID_SHARD needs the data parallel size to be a multiple of its group size.");
  }
  if (p.sequenceParallel && p.tensorParallel == 1) {
    bad("sequenceParallel", "Sequence parallelism splits what tensor parallelism leaves whole: it needs tensor parallel > 1.");
  }
  if (p.pipelineSchedule != PipelineSchedule::Interleaved && p.virtualStages != 1) {
    bad("virtualStages", "Virtual stages exist only with the interleaved schedule.");
  }
  // What the simulation covers so far (docs/parallel.md, "Not yet simulated"): refused, not guessed.
  ValidatePipeline(setup, errors);  // parallel/pipeline.cpp
  if (p.contextParallel > 1 && sizesOk) {
    // Transformer Engine splits each sequence into 2c chunks, two per rank (load balancing of
    // the causal mask; AttnFuncWithCPAndKVP2P asserts "Sequence length per GPU needs to be
    // divisible by 2"), and runs attention on its flash / fused kernels.
    const std::int64_t c = p.contextParallel;
    if (setup.training.sequenceLength % (2 * c) != 0) {
      bad("contextParallel", "Context parallelism splits each sequence into 2 × " + std::to_string(c) +
                                 " chunks: 2 × the context parallel size must divide the sequence length (" +
                                 std::to_string(setup.training.sequenceLength) + ").");
    } else if (p.sequenceParallel && p.tensorParallel > 1 && (setup.training.sequenceLength / c) % p.tensorParallel != 0) {
      bad("sequenceParallel", "With context parallelism each rank holds s / c tokens, and sequence parallelism splits "
                              "them again: the tensor parallel size must divide s / c.");
    }
    if (setup.model.kind != ModelKind::Transformer || setup.model.architecture.family != Family::Llama) {
      bad("contextParallel", "Context parallelism is simulated for the Llama family's attention so far.");
    } else if (setup.training.attention != AttentionImplementation::SDPA) {
      bad("contextParallel", "Context parallelism runs Transformer Engine's ring attention on fused kernels: choose "
                             "the fused attention (SDPA), not eager.");
    } else if (setup.model.architecture.slidingWindow > 0) {
      // The simulated ring attention (context_split.cpp) is the causal one: no window, no mask.
      bad("contextParallel", "Context parallelism is simulated with causal ring attention, without a sliding "
                             "window: set slidingWindow to 0, or the context parallel size to 1.");
    }
  }
  ValidateExpertParallel(setup, sizesOk, errors);
  if (p.sequenceParallel && p.tensorParallel > 1 && sizesOk) {
    // Megatron splits the sequence evenly (mappings.py _split_along_first_dim asserts it); the
    // shared blocks and each family's embeddings and head write the split.
    if (setup.training.sequenceLength % p.tensorParallel != 0) {
      bad("sequenceParallel", "Sequence parallelism splits the sequence length (" +
                                  std::to_string(setup.training.sequenceLength) +
                                  ") evenly over the tensor-parallel ranks: the tensor parallel size must divide it.");
    }
    if (setup.training.lossImplementation == LossImplementation::Chunked) {
      bad("sequenceParallel", "Sequence parallelism with the chunked output loss is not simulated yet: choose the plain loss.");
    }
  }
  // Gradient accumulation's work budget is checked with the rest of the budget (setup.cpp).
  if (setup.model.kind == ModelKind::Transformer && setup.model.architecture.family == Family::GPTNeoX) {
    // Megatron's layers are simulated on the GPT-2 and Llama families' blocks.
    for (const auto& [field, size] : {std::pair<const char*, std::int64_t>{"tensorParallel", p.tensorParallel},
                                      {"pipelineParallel", p.pipelineParallel}}) {
      if (size > 1) {
        bad(field, "GPT-NeoX is simulated on data-parallel ranks (DDP, ZeRO, FSDP); tensor and pipeline parallelism "
                   "are simulated for the GPT-2 and Llama families.");
      }
    }
  }
  if (p.tensorParallel > 1 && sizesOk) {
    if (setup.model.kind != ModelKind::Transformer) {
      bad("tensorParallel", "Tensor parallelism splits attention heads and MLP widths: it needs a transformer architecture.");
    } else {
      const ArchitectureDef& a = setup.model.architecture;
      const std::int64_t t = p.tensorParallel;
      auto divides = [&](std::int64_t n, const char* what) {
        if (n % t != 0) bad("tensorParallel", std::string("Megatron splits ") + what + " (" + std::to_string(n) +
                                                  ") evenly: the tensor parallel size must divide it.");
      };
      if (a.olmo2Layout) {
        // Olmo2Attention's q_norm / k_norm run over the whole projection, which Megatron's
        // column-parallel q/k/v would leave split across the ranks: not simulated.
        bad("tensorParallel", "OLMo 2's q/k norms run over whole projections, which tensor parallelism splits: "
                              "not simulated; use data parallelism (DDP, ZeRO, FSDP).");
      }
      divides(a.numHeads, "the attention heads");
      divides(KeyValueHeads(a), "the key/value heads");
      divides(IntermediateSize(a), "the MLP width");
      // Each expert's width is split by the expert tensor parallel size (ValidateExpertParallel).
      if (a.sharedExpertIntermediateSize > 0) divides(a.sharedExpertIntermediateSize, "the shared expert's width");
      // Every family splits the same way (TensorSlices, parallel/sharding.cpp): GPT-2's fused
      // c_attn and BERT's query/key/value read their width from heads · head_dim, so the rank's
      // slimmer architecture gives Megatron's column/row shards.
    }
  }
}

}  // namespace gpumem
