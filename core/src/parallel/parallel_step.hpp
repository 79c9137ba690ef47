// The simulated rank's part of the step that only many GPUs have: model states as the sharding
// engine holds them, the reducer's buckets, ZeRO's reduce buckets and fp32 gradient partition,
// FSDP's unsharded and sharded gradients, and gathered parameters (docs/parallel.md). step.cpp
// calls these hooks only when IsParallel(setup.parallel), so one GPU stays as it was.
#pragma once

#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/parallel.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

class ParallelStep final : public GradientHook, public LayerHook {
 public:
  ParallelStep(const Setup& setup, const Inventory& inventory, const std::vector<Text>& names, const Regime& regime,
               TextStore& text);

  // Model init: parameters and master weights as this rank holds them, and the buffers that
  // live as long as the model (DDP buckets, ZeRO-3's reduce bucket).
  void Init(TraceBuilder& b);
  // What torch.optim sees (ZeRO's flat fp32 partition, FSDP's shards, or the parameters), its
  // names, and its regime (fp32 gradients and weights when the engine keeps fp32 shards). Empty
  // when the optimizer runs on the host (offload).
  const Inventory& optimizerInventory() const { return optimizerInventory_; }
  const std::vector<Text>& optimizerNames() const { return optimizerNames_; }
  Regime optimizerRegime() const { return optimizerRegime_; }

  void StartBackward(TraceBuilder& b);
  void EndBackward(TraceBuilder& b);
  // The interleaved pipeline schedule: the virtual stage (model chunk) whose forward or backward
  // runs next (PipelineRun). FSDP2 makes each chunk a fully_shard root of its own.
  void SetPipelineChunk(int chunk) { chunk_ = chunk; }
  void BeforeOptimizerStep(TraceBuilder& b);
  void AfterOptimizerStep(TraceBuilder& b);
  // DeepSpeed ZeRO-3 steps the optimizer one sub-group of its partition at a time (stage3.py
  // step: _prepare_sub_group, _optimizer_step, _release_sub_group): how many (the optimizer
  // inventory's tensors), or 0 when the optimizer steps everything at once. The caller runs
  // optimizer.step() on tensor k between the two calls.
  std::size_t OptimizerSubGroups() const;
  void BeforeSubGroupStep(TraceBuilder& b, std::size_t k);
  void AfterSubGroupStep(TraceBuilder& b, std::size_t k);
  // DeepSpeed ZeRO (stage_1_and_2.py and stage3.py initialize_optimizer_states, called from the
  // optimizer's construction): one optimizer step on zero-valued fp32 gradients "to allocate
  // internal optimizer state ... at the beginning of training instead of after activations have
  // been allocated". True for ZeRO without optimizer offload, not for Megatron's distributed
  // optimizer (tensor, pipeline, context or expert parallel, or its fp32 gradient buffer), whose
  // torch optimizer makes its states in the first step. The caller runs the optimizer's step
  // between the two calls, in the init phase.
  bool InitializesOptimizerStates() const;
  void BeforeInitialOptimizerStep(TraceBuilder& b);  // the zero-valued fp32 gradient
  void AfterInitialOptimizerStep(TraceBuilder& b);   // .grad = None

  // GradientHook
  bool Produce(TraceBuilder& b, std::size_t index, Text label) override;
  void ReleaseAll(TraceBuilder& b, Text label) override;
  // LayerHook: ZeRO-3 and FSDP gather a unit's parameters when it is entered and free them
  // after it (forward: unless the unit stays gathered; backward: always).
  void Enter(TraceBuilder& b, int layer, bool backward) override;
  void ForwardStart(TraceBuilder& b) override;
  void ForwardEnd(TraceBuilder& b) override;
  bool gathers() const { return gathers_; }
  // Whether the second step's events can be the first's again: not under ZeRO-3, whose
  // coordinator prefetches and keeps parameters only once its trace is complete (PlanZeroReuse).
  bool SameEveryStep() const { return !(gathers_ && plan_.engine == ShardingEngine::Zero); }

 private:
  void ReduceScatterUnit(TraceBuilder& b, int unit);  // FSDP: a unit's gradients are complete
  // FSDP: reduce-scatter an unsharded flat gradient of `elements` into a kept shard.
  void ReduceScatterFlat(TraceBuilder& b, TensorHandle& full, std::int64_t elements, int layer, Text what,
                         TensorHandle& kept);
  bool ProduceAdapterUnit(TraceBuilder& b, std::size_t index, Text label);  // fsdpWrapAdaptersApart
  void Gather(TraceBuilder& b, int unit, bool prefetch);
  void GatherFsdp2(TraceBuilder& b, int unit, bool prefetch);
  void BroadcastModuleStates(TraceBuilder& b);  // DDP's initial _broadcast_coalesced
  Text UnitName(TextStore& text, int unit) const;  // "layers.3", "root unit (…)", …
  void ReleaseHeldAllGather(TraceBuilder& b);
  void Free(TraceBuilder& b, int unit);
  // FSDP2 (fully_shard): per-parameter gradients and foreach_reduce (parallel_fidelity.hpp).
  bool ProduceFsdp2(TraceBuilder& b, std::size_t index, Text label);
  void ReduceScatterFsdp2(TraceBuilder& b, int unit);
  void ReleaseHeldReduceInput(TraceBuilder& b);

  const Setup& setup_;
  const Inventory& inventory_;
  const std::vector<Text>& names_;
  Regime regime_;
  ShardPlan plan_;
  Inventory optimizerInventory_;
  std::vector<Text> optimizerNames_;
  Regime optimizerRegime_;
  std::vector<TensorHandle> reduceBuckets_;   // ZeRO ipg_buffer(s)
  TensorHandle initialGradient_ = kNoTensor;  // initialize_optimizer_states' zero gradient
  TensorHandle gradPartition_ = kNoTensor;    // ZeRO-2/3 grads_in_partition (16-bit)
  TensorHandle fp32GradPartition_ = kNoTensor;
  // FSDP: per unit (index 0 = root, 1 + block), the unsharded gradient during backward and the
  // sharded fp32 gradient kept to zero_grad.
  std::vector<TensorHandle> unsharded_, sharded_;
  std::vector<TensorHandle> adapterShards_;  // fsdpWrapAdaptersApart: each adapter unit's gradient shard
  int openUnit_ = -2;  // the non-root unit whose gradients are arriving
  bool reduceOnNextBlock_ = false;
  bool backwardEnded_ = false;  // between EndBackward and the next ForwardStart  // FSDP2 fine-tuning: a block's reduce when the next block's backward starts
  // Gathering (ZeRO-3, FSDP): per unit (0 = root, 1 + block) its gathered elements and handle.
  bool gathers_ = false;
  bool reshardAfterForward_ = true;
  // fsdpKeepLastBlockGathered (torchtitan apply_fsdp): the last block's unit is not resharded by
  // its post-forward; its post-backward reshards it. backwardSawBlock_: a block's backward has
  // begun since the last forward (before it, the head's backward must not free that block).
  bool keepLastBlock_ = false;
  bool backwardSawBlock_ = false;
  bool ReshardsAfterForward(int unit) const;
  // ZeRO-3's trace (DeepSpeed partitioned_param_coordinator.py; PlanZeroReuse): complete after
  // the first backward. Per unit, the gathered elements its forward keeps to its backward
  // (stage3_max_reuse_distance), and while kept either the whole gathered unit or that part as
  // a tensor of its own.
  int backwardsEnded_ = 0;
  std::vector<std::int64_t> reuseKeptElements_;
  std::vector<TensorHandle> keptPart_;
  std::vector<char> keptWhole_;
  void PlanZeroReuse();
  // Per parameter its gathered elements; per unit whether the recorded backward fetched it, and
  // whether it fetched the embeddings.
  std::vector<std::int64_t> gatheredOfParameter_;
  std::vector<char> backwardUse_;
  bool embeddingsBackward_ = false;
  bool ZeroTraceComplete() const;
  void PrefetchZeroUnits(TraceBuilder& b, int from, int step);
  bool KeptForBackward(int unit) const;
  std::int64_t ZeroMainElements(int unit) const;
  void FreeAfterForward(TraceBuilder& b, int unit);
  // ZeRO-3 with an untied head: the root's embeddings apart from its final norm and head
  // (unit 0), each fetched where its sub-modules run; whether the embeddings stay from their
  // forward to their backward (stage3_max_reuse_distance).
  bool zeroRootApart_ = false;
  bool zeroEmbeddingsKept_ = false;
  std::int64_t zeroEmbeddingElements_ = 0;
  TensorHandle zeroEmbeddings_ = kNoTensor;
  void GatherZeroEmbeddings(TraceBuilder& b);
  void ReleaseZeroEmbeddings(TraceBuilder& b, bool afterForward);
  void ReleaseZeroTail(TraceBuilder& b);
  std::vector<std::int64_t> gatherElements_;
  // FSDP2: bytes of each unit's torchao NF4Tensor codes, scalers and factors gathered with it.
  std::vector<std::int64_t> gatherExtraBytes_;
  std::vector<TensorHandle> gathered_;
  // FSDP2: each parameter's unit (Fsdp2UnitOfParameter); per unit its padded unsharded and
  // sharded elements and the live per-parameter gradients; the last reduce-scatter input, held
  // until the next unit's reduce (FSDPParamGroup comm_ctx.reduce_scatter_state).
  std::vector<int> unitOf_;
  std::vector<std::int64_t> fsdp2PaddedElements_, fsdp2ShardElements_;
  std::vector<std::vector<std::size_t>> parameterGrads_;  // parameter indices with a live .grad
  std::vector<TensorHandle> gradOfParameter_;
  TensorHandle heldReduceInput_ = kNoTensor;
  // FSDP2's all-gather (_fsdp_collectives.py foreach_all_gather / foreach_all_gather_copy_out):
  // per unit, the flat all-gather output of an unshard not yet copied out (a prefetch), and the
  // last forward copy-out's flat output, held until the next unit's copy-out or the root's
  // post-forward (FSDPCommContext.all_gather_state).
  std::vector<TensorHandle> pendingAllGather_;
  // Per unit, its parameters (inventory indices) and, while gathered, each one's
  // all_gather_outputs (FSDPParam.alloc_all_gather_outputs / free_unsharded_param: one storage
  // per parameter, made at the copy-out and freed at the reshard).
  std::vector<std::vector<std::size_t>> unitParameters_;
  struct ParameterOutput {
    TensorHandle handle;
    std::size_t parameter;
  };
  std::vector<std::vector<ParameterOutput>> parameterOutputs_;
  TensorHandle heldAllGather_ = kNoTensor;
  bool inForward_ = false;
  bool forwardSawBlock_ = false;
  // FSDP2 on a pipeline stage (torch.distributed.pipelining stage.py backward_maybe_with_nosync):
  // every micro-batch's backward runs without gradient sync and without reshard after backward;
  // after the stage's last backward each unit's post_backward reshards and reduce-scatters.
  void PostBackwardNoSync(TraceBuilder& b, int unit);  // a unit's post_backward, no sync
  // stage.py run_post_backward / perform_reduce_grad for one virtual stage's units.
  void PipelineFinalReduce(TraceBuilder& b, int chunk);
  bool pipelineNoSync_ = false;
  // Under the interleaved schedule each virtual stage is its own fully_shard root with its own
  // last backward (schedules.py _step_microbatches: last_backward when the stage's
  // backward_counter reaches n_microbatches). Per unit its virtual stage (0 with one chunk), per
  // chunk the backwards seen this step; chunk_ is the chunk running now.
  std::vector<int> chunkOfUnit_;
  std::vector<std::int64_t> chunkBackwardsSeen_;
  std::int64_t backwardsPerChunk_ = 0;
  int chunk_ = 0;
  bool OfRunningChunk(int unit) const { return chunkOfUnit_.empty() || chunkOfUnit_[static_cast<std::size_t>(unit)] == chunk_; }
  // Per parameter: FSDPParam.unsharded_accumulated_grad, the reduce-dtype accumulation of the
  // unsharded gradient between backwards without sync (_fsdp_param.py to_accumulated_grad_if_needed).
  std::vector<TensorHandle> accumulatedGrad_;
  // Megatron grad_reduce_in_fp32: the whole fp32 gradient buffer, from init on.
  TensorHandle gradBuffer_ = kNoTensor;
  // ZeRO-3's IPG bucket between reductions (stage3.py reduce_independent_p_g_buckets_and_remove_grads):
  // the elements of the gradients in it and, per gradient, its parameter and its own .grad when
  // it did not fit the contiguous buffer (__add_grad_to_ipg_bucket leaves it where autograd made
  // it); __reduce_and_partition_ipg_grads empties it (ReduceIpgBucket).
  struct IpgEntry {
    std::size_t parameter;
    TensorHandle ownGrad;
  };
  std::vector<IpgEntry> ipgEntries_;
  std::int64_t ipgElements_ = 0;
  bool ProduceZero3(TraceBuilder& b, std::size_t index, Text label);
  void ReduceIpgBucket(TraceBuilder& b, Text label);
  // DeepSpeed ZeRO-1/2 (stage_1_and_2.py; not Megatron's distributed optimizer): the simulated
  // rank's partition of the flat (ZeRO-2: the last rank's, whose parameters' gradients come
  // first in backward; ZeRO-1: rank 0's, reduced first at the end of backward), per parameter whether it lies in it and how many of its
  // elements, Σ numel of those parameters (grads_in_partition), get_flat_partition's zero
  // padding, the largest trainable parameter (cpu_offload's temp_grad_buffer_for_gpu_offload).
  bool deepSpeedZero12_ = false;
  std::vector<char> inPartition_;
  std::vector<std::int64_t> partitionSlice_;
  std::int64_t gradsInPartitionElements_ = 0;
  std::int64_t partitionPadElements_ = 0;
  std::int64_t largestTrainable_ = 0;
  bool bucketsReady_ = false;   // setup_buckets' ready_for_gradients
  int backwardsThisStep_ = 0;   // micro-batches since the last step (the boundary is the last)
  // The first micro-batch's grads_in_partition, which its epilogue's all_grad_tensors /
  // averaged_gradients keep (views) to the step; later micro-batches add into it.
  TensorHandle keptGradPartition_ = kNoTensor;
  TensorHandle partitionPad_ = kNoTensor;
  void SetUpZeroPartition();
  // stage3.py's construction: the trainable partitions defragmented into one flat, and the fp32
  // partitions made from it (Init).
  void DefragmentZero3(TraceBuilder& b, const std::vector<TensorHandle>& partitions);
  void CreateZero3Fp32Partitions(TraceBuilder& b);
  // stage_1_and_2.py's construction: the trainable parameters flattened into one padded 16-bit
  // flat, on the GPU when NVML's free memory allows, else on the host (Init).
  void FlattenZeroGroup(TraceBuilder& b, const std::vector<TensorHandle>& parameters);
  bool ProduceZero2(TraceBuilder& b, std::size_t index, Text label);
  // ZeRO-1: each parameter's .grad as autograd keeps it until the reduction (at the end of the
  // boundary's backward, or in its hook with overlap_comm), by inventory index.
  std::vector<TensorHandle> pendingGrads_;
  std::vector<TensorHandle> heldToEpilogue_;  // ZeRO-1: larger gradients outside the partition
  bool ProduceZero1(TraceBuilder& b, std::size_t index, Text label);
  void SetUpZeroBuckets(TraceBuilder& b, Text label);  // setup_buckets
  void AddToZeroBucket(TraceBuilder& b, std::size_t index, TensorHandle grad, Text label);
  void ReduceZeroBucket(TraceBuilder& b, Text label);
  void OffloadGradientTransients(TraceBuilder& b, std::size_t index, Text label);
  void ZeroEpilogue(TraceBuilder& b);
  void ZeroStepTransients(TraceBuilder& b);
  void Zero3StepTransients(TraceBuilder& b);  // has_overflow's masks and the norm's .double()s
  bool AtAccumulationBoundary() const;
  const char* ZeroName() const { return plan_.zeroStage == 1 ? "ZeRO-1" : "ZeRO-2"; }
};

// The regime torch.optim sees on the simulated rank: ZeRO's fp32 flat partition and FSDP's fp32
// shards under mixed precision, with fp32 gradients; else the training's own regime.
Regime OptimizerRegimeOf(const ShardPlan& plan, const Regime& regime);

// Whether DeepSpeed ZeRO-1/2's construction flattens the trainable parameters on the GPU for
// this setup (its DeepSpeed version and GPU; ParallelStep::FlattenZeroGroup); false for any other
// engine. The GPU × settings matrix asks it per GPU (views.cpp).
bool DeepSpeedFlattensOnDevice(const Setup& setup, const Inventory& inventory);

// What a person should know about the simulated rank's estimate (Estimate::notes).
std::vector<std::string> ParallelNotes(const Setup& setup);

// Model states of the simulated rank (the same rules as ParallelStep), for Estimate::modelStates.
ModelStates ParallelModelStates(const Setup& setup, const Inventory& inventory);

}  // namespace gpumem
