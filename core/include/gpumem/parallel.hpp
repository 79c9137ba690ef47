// gpumem — many GPUs: which rank is simulated, how its model states are sharded, and the closed
// forms people already use (the ZeRO paper, DeepSpeed's estimators, Megatron's theoretical memory),
// pinned by tests/parallel_test.cpp. docs/parallel.md states every rule with its source.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

// GPUs in the job: data × tensor × pipeline × context parallel (expert parallel ranks are taken
// from the data-parallel ones, as Megatron does: expert_model_parallel_size divides dp × cp).
std::int64_t WorldSize(const ParallelDef& p);
// Whether the setup says anything but "one GPU" (every path below is skipped when false, so a
// one-GPU estimate is byte-identical to what it was before this section existed).
bool IsParallel(const ParallelDef& p);

// The expert tensor parallel size in effect: expertTensorParallel, or the tensor parallel size
// when it is 0 (Megatron's default, megatron/core/model_parallel_config.py __post_init__).
std::int64_t ExpertTensorParallelOf(const ParallelDef& p);

// Ranks that hold one copy of the same experts' shards (Megatron's expert data parallel size,
// parallel_state.initialize_model_parallel: world / (etp · ep · pp)), i.e. dp·cp·t / (etp·e).
std::int64_t ExpertDataParallelOf(const ParallelDef& p);

// How the data-parallel ranks hold the model states.
enum class ShardingEngine {
  None,      // one data-parallel rank (nothing to shard, no reducer)
  DDP,       // torch DistributedDataParallel: everything replicated, gradients bucketed
  Zero,      // DeepSpeed ZeRO stage 1–3
  Fsdp,      // FSDP (FlatParameter per wrap unit): FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD
  Fsdp2,     // FSDP2 fully_shard: per-parameter dim-0 shards
};

// The rank the estimate simulates, and why (the one with the most memory).
struct SimulatedRank {
  std::int64_t worldSize = 1;
  std::int64_t dataParallelRank = 0;
  std::int64_t tensorParallelRank = 0;
  std::int64_t pipelineStage = 0;
  // Ranks that split one copy of the sharded states (dataParallel, or the HYBRID_SHARD group).
  std::int64_t shardWorld = 1;
  ShardingEngine engine = ShardingEngine::None;
  std::string engineLabel;   // "DeepSpeed ZeRO-2", "FSDP FULL_SHARD", "DDP"
  std::string why;           // for people: why this rank
  // Where each model state of this rank lives (the page's cluster picture): "replicated" (a
  // whole copy on every data-parallel rank), "sharded" (1/shardWorld on each), "host" (offloaded
  // to CPU memory), "none" (the engine keeps no such state). SimulatedRankOf states the rules.
  std::string parametersHeld = "replicated";
  std::string masterWeightsHeld = "replicated";
  std::string gradientsHeld = "replicated";
  std::string optimizerStatesHeld = "replicated";
};
SimulatedRank SimulatedRankOf(const Setup& setup);
// DeepSpeed ZeRO-1 and ZeRO-2 as stage_1_and_2.py runs them (not Megatron's distributed
// optimizer, which tensor, pipeline, context or expert parallelism or the fp32 gradient buffer
// select): the IPG buckets, grads_in_partition, cpu_offload's gradient transients, the step's
// flat (parallel_step.cpp ProduceZero2, ProduceZero1). ZeRO-2's simulated rank is the last
// data-parallel one, ZeRO-1's the first (SimulatedRankOf). Quick mode has one tensor standing for
// every parameter, so it keeps the plain model.
bool DeepSpeedZeroOneTwo(const Setup& setup);

// Tensor parallelism (Megatron column/row split): the rank's model is the model with the
// attention heads, key/value heads, MLP width, experts' widths and the vocabulary divided by
// `tensorParallel` (ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding in
// megatron/core/tensor_parallel/layers.py); norms, position tables and row-parallel biases stay
// whole. Returns the setup unchanged when tensorParallel is 1.
Setup TensorParallelRankSetup(const Setup& setup);

// The model states one data-parallel rank keeps, tensor by tensor.
struct ShardPlan {
  ShardingEngine engine = ShardingEngine::None;
  int zeroStage = 0;
  std::int64_t shardWorld = 1;
  bool offloadOptimizer = false;   // fp32 master, states (and fp32 gradients) live on the host
  bool offloadParameters = false;  // the parameters' shards live on the host too
  // DeepSpeed ZeRO: the trainable parameters flattened into one group, padded to a multiple of
  // 2 × dataParallel elements (stage_1_and_2.py: nccl_start_alignment_factor = 2, then
  // flatten_dense_tensors_aligned(…, alignment × dp)); each rank's partition is 1/dp of it.
  std::int64_t flatElements = 0;
  std::int64_t paddedFlatElements = 0;
  std::int64_t partitionElements = 0;
  // What the optimizer steps on, as DeepSpeed and FSDP hand it to torch.optim: ZeRO's one fp32
  // flat partition, FSDP's FlatParameter shard per unit, FSDP2's per-parameter shards; for DDP
  // the parameters themselves.
  Inventory optimizerTensors;
  // Elements of each inventory parameter this rank stores (ZeRO-3: ⌈n / dp⌉ unless below
  // stage3_param_persistence_threshold; FSDP: 0, the unit's flat shard holds them; else n).
  std::vector<std::int64_t> parameterElementsHeld;
  // Wrap units (ZeRO-3 / FSDP): full elements of each transformer block (index = block) and of
  // the root module (embeddings, final norm, head), gathered in 16 bits when used.
  std::vector<std::int64_t> unitElements;
  std::int64_t rootUnitElements = 0;
  // DDP: the reducer's buckets in elements of the gradient type, in the order they fill.
  std::vector<std::int64_t> ddpBucketElements;
  std::vector<DType> ddpBucketTypes;
  // FSDP (use_orig_params=True) with frozen parameters (docs/parallel.md, "Fine-tuning on many
  // GPUs"): the shard elements of units that get a gradient (a unit with no trainable parameter
  // gets none), and the parts of trainable parameters inside rank 0's shard, which are what
  // torch.optim steps; without fine-tuning every unit and its whole shard. FSDP2: the trainable
  // parameters' own shards (frozen ones are sharded too but get neither gradient nor state).
  std::int64_t gradientShardElements = 0;
  Inventory trainableShardParts;
  // FSDP with parallel.fsdpWrapAdaptersApart (PEFT's fsdp_auto_wrap_policy): every trainable
  // parameter (a lora_A / lora_B weight) is a unit of its own; rootUnitElements and unitElements
  // then hold only the frozen parameters, which get no gradient.
  bool adaptersApart = false;  // each bucket's gradient dtype (one per dtype: reducer.cpp BucketKey)
  // ZeRO: the contiguous-gradient reduce buckets (ipg_buffer), elements, and how many (2 with
  // overlap_comm).
  std::int64_t reduceBucketElements = 0;
  int reduceBuckets = 0;
  // FSDP2 with torchao NF4Tensor weights (torchtune's QLoRA): the bytes of the rank's shards of
  // their codes, scalers and factors (finetune.hpp TorchaoNf4ShardedBytes / world), held beside
  // partitionElements (which counts the other parameters' shards in their dtype).
  std::int64_t quantShardBytes = 0;
};
ShardPlan PlanShards(const Setup& setup, const Inventory& inventory);

// torch/distributed/optim/zero_redundancy_optimizer.py _partition_parameters: the trainable
// parameters sorted by size, largest first (a stable sort), each given to the rank with the
// fewest elements so far (the first such rank). Returns each parameter's rank (-1 frozen) and
// the rank holding the most elements (the one whose states weigh most).
struct ZeroRedundancyAssignment {
  std::vector<int> rankOf;
  std::int64_t heaviestRank = 0;
  std::vector<std::int64_t> elementsPerRank;
};
ZeroRedundancyAssignment AssignZeroRedundancy(const Inventory& inventory, std::int64_t world);

// ---------------------------------------------------------------------------------------------
// Closed forms (bytes), as their authors wrote them.

// ZeRO paper (Rajbhandari et al. 2019, §3.1 and Figure 1): mixed-precision Adam keeps
// (2 + 2 + K)·Ψ bytes with K = 12; stage 1 shards the K·Ψ, stage 2 also the gradients, stage 3
// also the parameters, over Nd data-parallel ranks.
double ZeroPaperModelStateBytes(double psi, double k, double nd, int stage);

// DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs and
// stage3.py estimate_zero3_model_states_mem_needs: per-GPU bytes (the CPU figure beside them is
// not reproduced).
std::int64_t DeepSpeedZero2GpuBytes(std::int64_t totalParams, std::int64_t gpusPerNode, std::int64_t nodes,
                                    bool cpuOffload);
std::int64_t DeepSpeedZero3GpuBytes(std::int64_t totalParams, std::int64_t largestLayerParams,
                                    std::int64_t gpusPerNode, std::int64_t nodes, bool cpuOffload,
                                    bool cpuOffloadParams);

// Megatron-LM megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory:
// the parameters on the most loaded shard (the first pipeline stage with embeddings) × 18 bytes
// (× (6 + 12/dp) with --use-distributed-optimizer).
struct MegatronWeightAndOptimizer {
  double parametersOnMostLoadedShard = 0;
  double bytes = 0;
};
MegatronWeightAndOptimizer MegatronTheoreticalWeightAndOptimizer(const ArchitectureDef& a, std::int64_t tensorParallel,
                                                                 std::int64_t pipelineParallel,
                                                                 std::int64_t dataParallel,
                                                                 bool distributedOptimizer);

// Validation of the parallel section (called by Validate); errors name parallel.* fields.
void ValidateParallel(const Setup& setup, std::vector<FieldError>& errors);

// One field of the parallel section as the page's panel shows it (OptionsJson "parallelFields").
struct ParallelField {
  const char* key;      // JSON key in "parallel"
  const char* label;    // as people know it
  const char* kind;     // "count", "number", "bool", "select"
  const char* options;  // for "select": the options list ("fsdpModes"), else ""
  const char* hint;     // unit, default and source
};
std::span<const ParallelField> ParallelFields();

}  // namespace gpumem

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// Imports of what people already have: a DeepSpeed config JSON and Megatron-LM's arguments.
// Each starts from `base` (its model gives h for DeepSpeed's "auto" values) and returns the
// setup with what the text says; what it does not model is listed, not refused.
struct ParallelImport {
  Setup setup;
  std::vector<std::string> ignoredFields;  // keys / flags read but not modelled
  std::vector<std::string> notes;          // how values were resolved ("auto" → h²)
  std::vector<FieldError> errors;          // fields named as in the text ("zero_optimization.stage")
  bool ok() const { return errors.empty(); }
};
// zero_optimization (stage, buckets, overlap_comm, contiguous_gradients, stage3_*, offload_*),
// bf16 / fp16, train_micro_batch_size_per_gpu, gradient_accumulation_steps. "auto" values as
// Hugging Face resolves them (transformers/integrations/deepspeed.py trainer_config_finalize):
// reduce_bucket_size = h², stage3_prefetch_bucket_size = 0.9·h², stage3_param_persistence_threshold
// = 10·h; other "auto" values keep the base setup's.
ParallelImport ImportDeepSpeedConfig(std::string_view text, const Setup& base);
// Megatron-LM arguments pasted as a command line (--tensor-model-parallel-size 4 …).
ParallelImport ImportMegatronArguments(std::string_view commandLine, const Setup& base);
// accelerate's config YAML (`accelerate config`): distributed_type, num_processes (→ dataParallel),
// mixed_precision, and fsdp_config (fsdp_sharding_strategy by name or 1–5, fsdp_offload_params,
// fsdp_backward_prefetch, fsdp_forward_prefetch, fsdp_activation_checkpointing, fsdp_version 2 +
// fsdp_reshard_after_forward). A YAML subset: flat keys and one level of nested mappings; anything
// else is refused naming its line; other keys are listed, not refused.
ParallelImport ImportAccelerateConfig(std::string_view text, const Setup& base);

}  // namespace gpumem

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// The fewest GPUs of the setup's type that can train it (issue 12, "solve at scale"): data
// parallel sizes 1, 2, 4, … × the setup's tensor parallel size; at each, the layouts in order of
// what they cost in communication, the first whose device figure fits wins. Per step and rank,
// in parameters (ZeRO paper §7): DDP, ZeRO-1 and ZeRO-2 move 2Ψ (all-reduce, or reduce-scatter
// + all-gather), ZeRO-3 and FSDP FULL_SHARD 3Ψ (an extra all-gather of the parameters in
// backward); offloading adds 2Ψ·(bytes) over PCIe each step (gradients out, parameters back).
struct LayoutCandidate {
  std::string label;                   // "DDP", "ZeRO-2", "ZeRO-3 + optimizer offload"
  double communicationParameters = 0;  // Ψ multiples moved per step and rank (2 or 3)
  bool offload = false;
};
// One answer of the search: the layout, its GPU count and what it needs per rank and node.
struct FewestGpusLayout {
  bool found = false;
  std::int64_t gpus = 0;               // dataParallel × tensorParallel
  Setup layout;                        // the winning setup
  LayoutCandidate candidate;
  std::int64_t peakDeviceBytes = 0;    // the simulated rank's device figure
  std::int64_t hostNodeBytes = 0;      // estimate.host.nodeBytes: host RAM one node needs (0 without offload)
};
struct FewestGpusResult : FewestGpusLayout {
  // When the answer offloads, the fewest GPUs that train it without offloading (not found when
  // none up to maxGpus does): offloading trades GPUs for host memory, PCIe traffic and a CPU
  // optimizer step, so a person sees both.
  FewestGpusLayout withoutOffload;
  std::int64_t estimates = 0;          // how many setups were simulated
  // Layouts whose device figure fit but whose host memory per node exceeded the stated
  // runtime.hostMemoryGiB, so they were skipped.
  std::int64_t hostTooSmall = 0;
  std::vector<FieldError> errors;      // the setup itself is invalid
};
// `allowOffload`: whether layouts that move states to host memory count (they fit on fewer GPUs
// at the cost of PCIe traffic and a CPU optimizer step). An offloading layout counts only if its
// host memory per node fits runtime.hostMemoryGiB, when that is stated.
FewestGpusResult FewestGpus(const Setup& setup, std::int64_t maxGpus = 4096, bool allowOffload = true);

}  // namespace gpumem

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// Layouts for a cluster (issue 12, "solve at scale"; docs/parallel.md, "Layouts for N GPUs"):
// every dp × tp × pp = N of the setup's GPU type (tp ≤ 8, one node; tp and pp as validation
// allows: tp divides heads, key/value heads and widths, pp divides the layers), × sharding (DDP,
// ZeRO-1/2/3, FSDP FULL_SHARD) × offload × activation checkpointing; each simulated, and the ones
// that fit ranked by what they cost. Setups that Validate refuses (what is not simulated yet,
// docs/parallel.md) are skipped and counted.

// What a layout costs per optimizer step and rank. Every figure is a formula of the setup
// (core/src/parallel/layouts.cpp states each with its source); bytes are in the dtypes the
// frameworks move (gradients, 16-bit or fp32 parameters, activations).
struct LayoutCost {
  double dataParallelBytes = 0;    // gradient reduction and parameter gathers over dp ranks (ring)
  double tensorParallelBytes = 0;  // Megatron's all-reduces of b·s·h per layer (ring, t ranks)
  double pipelineBytes = 0;        // p2p sends of b·s·h per micro-batch and stage boundary
  double communicationBytes = 0;   // the three above: what goes over NVLink / the network
  double hostBytes = 0;            // offload: PCIe traffic between the GPU and host memory
  double bubbleFraction = 0;       // (p − 1) / (m·v + p − 1) of the step idle (Narayanan 2021)
  double recomputeFactor = 1;      // step FLOPs relative to no checkpointing (4/3 with full)
  // recomputeFactor / (1 − bubbleFraction): the step's compute time relative to one pass
  // without bubble or recompute.
  double computeFactor = 1;
};

struct LayoutRow {
  std::int64_t dataParallel = 1, tensorParallel = 1, pipelineParallel = 1;
  std::string sharding;   // "DDP", "ZeRO-2", "FSDP FULL_SHARD", "none" (one replica)
  std::string offload;    // "none", "optimizer", "optimizer and parameters"
  bool checkpointing = false;  // every block checkpointed (recomputed in backward)
  std::int64_t peakDeviceBytes = 0;  // the simulated rank's device figure
  std::int64_t capacityBytes = 0;
  std::int64_t hostNodeBytes = 0;    // host RAM one node needs (estimate.host.nodeBytes; 0 without offload)
  LayoutCost cost;
  Setup setup;            // the whole setup of this layout (what the page applies)
};

struct LayoutSearchOptions {
  bool allowOffload = true;
  // At most this many estimates are run (each one a full simulation); candidates beyond are
  // counted in `notEstimated`, not guessed.
  std::int64_t maxEstimates = 256;
};
constexpr std::int64_t kMaxLayoutGpus = 1 << 20;
constexpr std::int64_t kMaxLayoutEstimates = 4096;

struct LayoutsResult {
  std::int64_t gpus = 0;
  std::vector<LayoutRow> layouts;       // the ones that fit, best first (ranking in layouts.cpp)
  std::int64_t candidates = 0;          // layouts enumerated
  std::int64_t refused = 0;             // refused by validation (not simulated yet, tp not dividing…)
  std::int64_t dominated = 0;           // not estimated: a cheaper variant of the same layout fits
  std::int64_t estimates = 0;           // simulated
  std::int64_t notFitting = 0;          // simulated and did not fit
  std::int64_t hostTooSmall = 0;        // fit the GPU, not the stated runtime.hostMemoryGiB per node
  std::int64_t notEstimated = 0;        // beyond maxEstimates
  std::vector<FieldError> errors;       // the setup or the request is invalid
  bool ok() const { return errors.empty(); }
};
LayoutsResult LayoutsForCluster(const Setup& setup, std::int64_t gpus, const LayoutSearchOptions& options = {});

// The cost of one layout (the setup's parallel section and checkpointing), as ranked above.
LayoutCost LayoutCostOf(const Setup& setup);
// Pipeline parallelism (Megatron-LM megatron/core/pipeline_parallel/schedules.py; docs/parallel.md
// "Pipeline"). p stages, m micro-batches (gradientAccumulationSteps), v model chunks per stage
// (interleaved; 1 otherwise).

// The idle share of a step, (p − 1) / (m·v + p − 1): the bubble (p − 1)·t_chunk/v over the step
// (m + (p − 1)/v)·t (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
// Clusters", §2.2.1 and §2.2.2: bubble time fraction (p − 1)/m, with interleaving (p − 1)/(v·m),
// here as a share of the whole step). 0 for p = 1.
double PipelineBubbleFraction(std::int64_t p, std::int64_t m, std::int64_t v);

// One action of a stage's schedule: a forward or backward of one micro-batch through one chunk.
struct PipelineAction {
  bool backward = false;
  std::int64_t microBatch = 0;
  std::int64_t chunk = 0;
};
// Stage r's actions in the order it runs them:
// - GPipe: every forward, then every backward (micro-batch order; torch.distributed.pipelining
//   ScheduleGPipe).
// - 1F1B: min(p − r − 1, m) warm-up forwards, then one forward and one backward each, then the
//   cool-down backwards (schedules.py forward_backward_pipelining_without_interleaving).
// - interleaved: warm-up (p − r − 1)·2 + (v − 1)·p chunk-forwards (all m·v when m = p), capped at
//   m·v; chunk of the k-th forward (k mod p·v) / p, of the k-th backward v − 1 − that
//   (forward_backward_pipelining_with_interleaving, get_model_chunk_id).
std::vector<PipelineAction> PipelineScheduleOf(PipelineSchedule schedule, std::int64_t p, std::int64_t r,
                                               std::int64_t m, std::int64_t v);
// The most chunk-forwards whose activations stage r holds at once, walking its schedule.
std::int64_t PipelinePeakInFlight(PipelineSchedule schedule, std::int64_t p, std::int64_t r, std::int64_t m,
                                  std::int64_t v);
// Megatron theoretical_memory_usage.py compute_activation_memory's in-flight factor for the first
// stage, in micro-batches of the stage's L/p layers: min(m, p) without interleaving (its
// min(1, m/p) × p), p·(1 + (p − 1)/(p·v)) with it (interleaved_schedule_memory_penalty × p).
double MegatronInFlightMicroBatches(std::int64_t p, std::int64_t m, std::int64_t v, bool interleaved);

// Megatron theoretical_memory_usage.py compute_activation_memory (the sequence-parallel,
// selective-recompute estimate, Korthikanti et al. 2022 Table 2), bytes on the first stage:
// s·b·h·(18 + 4·ffn/h) per layer × all L layers, + 8·s·b·p (input ids) + s·b·h·p (embedding
// dropout), × the interleaved penalty 1 + (p − 1)/(p·v) (v > 1) or × min(1, m/p); at p = 1 the
// head and loss s·b·h·4·(1 + V/h); all / t. virtualStages 0 or 1 means no interleaving.
double MegatronTheoreticalActivationBytes(const ArchitectureDef& a, std::int64_t sequenceLength,
                                          std::int64_t microBatch, std::int64_t tensorParallel,
                                          std::int64_t pipelineParallel, std::int64_t virtualStages,
                                          std::int64_t microBatches);

// Layers per pipeline stage, stage 0 first; empty where the setup cannot be split (validation
// says why). In order:
// - pipelineFirstStageLayers / pipelineLastStageLayers set: those stages hold that many, the other
//   stages share the rest evenly (Megatron megatron/core/transformer/transformer_block.py
//   get_num_layers_to_build, which asserts that they divide it);
// - p (p·v interleaved) divides L: L/p each (Megatron, torchtitan);
// - otherwise: torchtitan's generate_split_points (torchtitan/parallelisms/pipelining_utils.py,
//   the version of its December 2024 benchmarks) over the p·v virtual stages: the first L div
//   (p·v), each next one more while the remainder lasts, the last the rest; a rank's stage is the
//   sum of its chunks (PipelineChunkLayers). Llama 3.1 405B's 126 layers over 8 stages: 15, 16,
//   16, 16, 16, 16, 16, 15.
std::vector<std::int64_t> PipelineStageLayers(const ParallelDef& parallel, std::int64_t numLayers);
// The layers of each virtual stage, in virtual-stage order (p·v of them; rank r runs virtual
// stages r, r + p, …, r + (v − 1)·p: Megatron's interleaving and torchtitan's "loop" style,
// stage_ids_this_rank). Empty where PipelineStageLayers is.
std::vector<std::int64_t> PipelineChunkLayers(const ParallelDef& parallel, std::int64_t numLayers);

// The simulated stage's model: the layers of stage `setup.parallel.pipelineStage` (L/p), with the
// embeddings on the first stage and the final norm, head and loss on the last (Megatron
// get_num_layers_to_build / pre_process / post_process). Unchanged when pipelineParallel is 1.
Setup PipelineStageSetup(const Setup& setup);
// The stage's parameters out of the inventory of PipelineStageSetup's model: the embeddings
// only on the first stage, the final norm and head only on the last; a tied head keeps the word
// embeddings on the last stage too (Megatron: a copy, its gradient all-reduced with the first
// stage's, megatron/core/models/common/language_module/language_module.py
// setup_embeddings_and_output_layer).
Inventory PipelineStageInventory(const Inventory& stageModel, const Setup& stageSetup);

}  // namespace gpumem
