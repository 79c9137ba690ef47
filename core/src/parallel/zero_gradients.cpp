// DeepSpeed ZeRO's gradient reductions, as the simulated rank meets them (ParallelStep's
// gradient hook and the backward's epilogue; docs/parallel.md "DeepSpeed ZeRO-1 and ZeRO-2's
// gradients" and "ZeRO-3's gradient reduction"): the IPG buckets, grads_in_partition,
// reduce_scatter_coalesced's flat buffer, cpu_offload's per-gradient transients and the step's.
#include <algorithm>

#include "gpumem/finetune.hpp"
#include "parallel/parallel_step.hpp"
#include "parallel/step_streams.hpp"

namespace gpumem {
namespace {
std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// DeepSpeed's _has_inf_or_nan(x) (stage_1_and_2.py): float_x = x.float() (a copy unless x is
// fp32), isnan and isinf of it and their logical_or (1 B an element each), `.float()` of that
// for `.max()`; all freed when it returns. `temp(elements, bytes, what)` makes one of them.
template <typename Temp>
void HasInfOrNanTransients(TraceBuilder& b, std::int64_t n, bool sixteen, const char* floatWhat, Text freed,
                           const Temp& temp) {
  const TensorHandle floatX = sixteen ? temp(n, 4, floatWhat) : kNoTensor;
  const TensorHandle nan = temp(n, 1, " isnan");
  const TensorHandle inf = temp(n, 1, " isinf");
  const TensorHandle either = temp(n, 1, " isnan | isinf");
  b.Release(temp(n, 4, " (isnan | isinf).float()"), freed);
  b.Release(either, freed);
  b.Release(inf, freed);
  b.Release(nan, freed);
  b.Release(floatX, freed);
}
}  // namespace

// ZeRO-3's gradient hook (DeepSpeed edaa722, stage3.py reduce_independent_p_g_buckets_and_remove_grads,
// called from each parameter's AccumulateGrad hook with its new .grad):
// - `if bucket.elements + param.ds_numel > self.reduce_bucket_size and bucket.elements > 0`, the
//   bucket is reduced first (__reduce_and_partition_ipg_grads), while this .grad is live;
// - __add_grad_to_ipg_bucket copies the .grad into the contiguous buffer only when
//   `bucket.elements + param.grad.numel() <= self.reduce_bucket_size` (contiguous_gradients):
//   `param.grad.data = new_grad_tensor` lets autograd's tensor go. A larger gradient stays where
//   autograd made it, counted in the bucket, until the next reduction sets param.grad = None.
bool ParallelStep::ProduceZero3(TraceBuilder& b, std::size_t index, Text label) {
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[index];
  const std::int64_t g = BytesPerElement(regime_.gradients);
  const std::int64_t n = p.Elements();
  const std::int64_t bucket = setup_.parallel.reduceBucketSize;
  const TensorHandle grad = b.Alloc(Category::Gradients, n * g, text.Make({names_[index], ".grad"}),
                                    text.Make({label, ": ", names_[index], ".grad"}),
                                    text.Shape(Shape(p.shape), regime_.gradients), p.layer);
  if (ipgElements_ + n > bucket && ipgElements_ > 0) ReduceIpgBucket(b, label);
  IpgEntry entry{index, grad};
  if (setup_.parallel.contiguousGradients && ipgElements_ + n <= bucket) {
    b.Release(grad, text.Make({label, ": ", names_[index], ".grad copied to the reduce bucket"}));
    entry.ownGrad = kNoTensor;
  }
  ipgEntries_.push_back(entry);
  ipgElements_ += n;
  return true;
}

// stage3.py __reduce_and_partition_ipg_grads, under `get_accelerator().stream(self.reduce_and_partition_stream)`
// (a side stream with overlap_comm, else default_stream()): __avg_scatter_grads hands the
// bucket's gradients, sorted by ds_id, to reduce_scatter_coalesced (runtime/comm/
// coalesced_collectives.py), which interleaves each rank's ⌈n / world⌉-element chunk of every
// gradient, with torch.empty padding where a chunk is short, into one torch.cat: a new flat
// buffer of Σ world · ⌈n / world⌉ elements, unless the bucket is one gradient whose size the
// world divides (then its own view). Its outputs are views of that buffer; partition_grads
// copies them into grad_partitions_flat_buffer and sets each param.grad = None; the buffer goes
// when the function returns. (communication_data_type and the accumulation dtype default to the
// model's dtype, engine.py get_data_types, so no casts.)
void ParallelStep::ReduceIpgBucket(TraceBuilder& b, Text label) {
  if (ipgEntries_.empty()) return;
  TextStore& text = b.text();
  const std::int64_t g = BytesPerElement(regime_.gradients);
  const std::int64_t world = plan_.shardWorld;
  std::int64_t flat = 0;
  for (const IpgEntry& e : ipgEntries_) flat += world * CeilDiv(inventory_.parameters[e.parameter].Elements(), world);
  const bool inPlace = ipgEntries_.size() == 1 && inventory_.parameters[ipgEntries_[0].parameter].Elements() % world == 0;
  const OnStream onStream(b, ZeroOverlapComm(setup_.parallel, plan_) ? kReduceScatterStream : b.stream());
  TensorHandle buffer = kNoTensor;
  if (!inPlace) {
    buffer = b.Alloc(Category::Gradients, flat * g, text.Make({"reduce_scatter_coalesced flat buffer"}),
                     text.Make({label, ": ZeRO-3 reduces its bucket (", TextPart::Count(static_cast<std::int64_t>(ipgEntries_.size())),
                                TextPart::View(ipgEntries_.size() == 1 ? " gradient" : " gradients"),
                                "): torch.cat of the padded partitions"}),
                     text.Make({TextPart::Count(flat), " × ", TextPart::Bytes(regime_.gradients)}));
  }
  for (const IpgEntry& e : ipgEntries_) {
    if (e.ownGrad != kNoTensor && plan_.zeroStage == 1 && !inPartition_[e.parameter]) {
      // ZeRO-1 clears no gradient outside its partition here (reduce_ipg_grads' stage 1 branch
      // only copies); _clear_param_grad_only at the epilogue's end lets it go.
      heldToEpilogue_.push_back(e.ownGrad);
    } else if (e.ownGrad != kNoTensor) {
      b.Release(e.ownGrad, text.Make({label, ": ", names_[e.parameter], ".grad = None (partition_grads)"}));
    }
  }
  if (buffer != kNoTensor) b.Release(buffer, text.Make({label, ": ZeRO-3 bucket reduced into its gradient partitions"}));
  ipgEntries_.clear();
  ipgElements_ = 0;
}

// DeepSpeed ZeRO-1/2 (edaa722, runtime/zero/stage_1_and_2.py): the simulated rank is ZeRO-2's
// last, ZeRO-1's first (SimulatedRankOf). The flat of the trainable parameters, in order,
// padded to a multiple of 2 · dp, is cut into dp partitions; a parameter is in this rank's
// partition when any of its elements is (params_in_partition), with that many elements there
// (grad_position's num_elements). grads_in_partition holds Σ numel of those parameters
// (copy_grads_in_partition: total_size over params_in_partition); get_flat_partition pads the
// partition's views with zeros up to partition_size.
void ParallelStep::SetUpZeroPartition() {
  const std::int64_t d = plan_.shardWorld;
  const std::int64_t p = plan_.partitionElements;
  const std::int64_t rank = plan_.zeroStage == 2 ? d - 1 : 0;  // SimulatedRankOf
  const std::int64_t lo = rank * p, hi = lo + p;
  inPartition_.assign(inventory_.parameters.size(), 0);
  partitionSlice_.assign(inventory_.parameters.size(), 0);
  std::int64_t offset = 0, slices = 0;
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    const Tensor& t = inventory_.parameters[i];
    if (!t.trainable) continue;
    const std::int64_t n = t.Elements();
    largestTrainable_ = std::max(largestTrainable_, n);
    const std::int64_t slice = std::max<std::int64_t>(0, std::min(offset + n, hi) - std::max(offset, lo));
    if (slice > 0) {
      inPartition_[i] = 1;
      partitionSlice_[i] = slice;
      gradsInPartitionElements_ += n;
      slices += slice;
    }
    offset += n;
  }
  partitionPadElements_ = p - slices;
}

bool ParallelStep::AtAccumulationBoundary() const {
  return backwardsThisStep_ >= std::max<std::int64_t>(1, setup_.parallel.gradientAccumulationSteps);
}

// The gradient hook (create_gradient_handling_hooks → process_gradients), with the new .grad:
// - setup_buckets, at the first gradient of each backward: with contiguous_gradients one IPG
//   buffer of reduce_bucket_size elements, two with overlap_comm, on the default stream;
// - reduce_independent_p_g_buckets_and_remove_grads: `if bucket.elements + param.numel() >
//   self.reduce_bucket_size` the bucket is reduced first (reduce_ipg_grads); then a gradient of
//   at most reduce_bucket_size elements is copied into the buffer (`grad_reduc.data =
//   new_grad_tensor...`: autograd's tensor goes), a larger one is kept as the bucket's
//   extra_large_param_to_reduce, as are all of them without contiguous_gradients.
bool ParallelStep::ProduceZero2(TraceBuilder& b, std::size_t index, Text label) {
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[index];
  const TensorHandle grad = b.Alloc(Category::Gradients, p.Elements() * BytesPerElement(regime_.gradients),
                                    text.Make({names_[index], ".grad"}), text.Make({label, ": ", names_[index], ".grad"}),
                                    text.Shape(Shape(p.shape), regime_.gradients), p.layer);
  SetUpZeroBuckets(b, label);
  AddToZeroBucket(b, index, grad, label);
  return true;
}

// ZeRO-1 (partition_gradients off): the hook still runs setup_buckets, but
// reduce_ready_partitions_and_remove_grads reduces only with overlap_comm at the accumulation
// boundary; otherwise the gradients stay as autograd keeps them (a later micro-batch's added
// into them by AccumulateGrad) until reduce_gradients at the end of the boundary's backward
// (EndBackward).
bool ParallelStep::ProduceZero1(TraceBuilder& b, std::size_t index, Text label) {
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[index];
  TensorHandle grad = b.Alloc(Category::Gradients, p.Elements() * BytesPerElement(regime_.gradients),
                              text.Make({names_[index], ".grad"}), text.Make({label, ": ", names_[index], ".grad"}),
                              text.Shape(Shape(p.shape), regime_.gradients), p.layer);
  if (pendingGrads_.empty()) pendingGrads_.assign(inventory_.parameters.size(), kNoTensor);
  if (pendingGrads_[index] != kNoTensor) {
    b.Release(grad, text.Make({label, ": ", names_[index], ".grad accumulated"}));
    grad = pendingGrads_[index];
    pendingGrads_[index] = kNoTensor;
  }
  SetUpZeroBuckets(b, label);
  if (ZeroOverlapComm(setup_.parallel, plan_) && AtAccumulationBoundary()) {
    AddToZeroBucket(b, index, grad, label);
  } else {
    pendingGrads_[index] = grad;
  }
  return true;
}

void ParallelStep::SetUpZeroBuckets(TraceBuilder& b, Text label) {
  if (bucketsReady_) return;
  bucketsReady_ = true;
  const ParallelDef& def = setup_.parallel;
  if (!def.contiguousGradients) return;
  TextStore& text = b.text();
  const int buffers = ZeroOverlapComm(def, plan_) ? 2 : 1;
  for (int k = 0; k < buffers; ++k) {
    reduceBuckets_.push_back(b.Alloc(Category::Gradients, def.reduceBucketSize * BytesPerElement(regime_.gradients),
                                     text.Make({"ipg_buffer ", TextPart::Int(k)}),
                                     text.Make({label, ": setup_buckets, reduce bucket ", TextPart::Int(k),
                                                TextPart::View(k == 1 ? " (overlap_comm)" : " (reduce_bucket_size)")}),
                                     text.Make({TextPart::Count(def.reduceBucketSize), " × ", TextPart::Bytes(regime_.gradients)})));
  }
}

void ParallelStep::AddToZeroBucket(TraceBuilder& b, std::size_t index, TensorHandle grad, Text label) {
  TextStore& text = b.text();
  const ParallelDef& def = setup_.parallel;
  const std::int64_t n = inventory_.parameters[index].Elements();
  if (ipgElements_ + n > def.reduceBucketSize) ReduceZeroBucket(b, label);
  IpgEntry entry{index, grad};
  if (def.contiguousGradients && n <= def.reduceBucketSize) {
    b.Release(grad, text.Make({label, ": ", names_[index], ".grad copied to the reduce bucket"}));
    entry.ownGrad = kNoTensor;
  }
  ipgEntries_.push_back(entry);
  ipgElements_ += n;
}

// reduce_ipg_grads: the bucket's gradients are averaged in place (average_tensor; without
// contiguous_gradients buffered_reduce_fallback flattens them into a new tensor first,
// allreduce_bucket), then under `get_accelerator().stream(stream)` (the reduction stream with
// overlap_comm) each one in this rank's partition goes through copy_grads_in_partition, whose
// first call makes grads_in_partition (or, with cpu_offload at the accumulation boundary, the
// gradient transients below); the others are cleared (clear_grad_attribute).
void ParallelStep::ReduceZeroBucket(TraceBuilder& b, Text label) {
  if (ipgEntries_.empty()) return;
  TextStore& text = b.text();
  const std::int64_t g = BytesPerElement(regime_.gradients);
  const OnStream onStream(b, ZeroOverlapComm(setup_.parallel, plan_) ? kReduceScatterStream : b.stream());
  if (!setup_.parallel.contiguousGradients) {
    std::int64_t n = 0;
    for (const IpgEntry& e : ipgEntries_) n += inventory_.parameters[e.parameter].Elements();
    const TensorHandle flat = b.Alloc(Category::Gradients, n * g, text.Make({"flat gradient bucket"}),
                                      text.Make({label, ": ", TextPart::View(ZeroName()), " buffered_reduce_fallback flattens the bucket"}),
                                      text.Make({TextPart::Count(n), " × ", TextPart::Bytes(regime_.gradients)}));
    b.Release(flat, text.Make({label, ": ", TextPart::View(ZeroName()), " bucket all-reduced and copied back"}));
  }
  for (const IpgEntry& e : ipgEntries_) {
    if (inPartition_[e.parameter]) {
      if (plan_.offloadOptimizer) {
        if (AtAccumulationBoundary()) OffloadGradientTransients(b, e.parameter, label);
      } else if (gradPartition_ == kNoTensor) {
        gradPartition_ = b.Alloc(Category::Gradients, gradsInPartitionElements_ * g, text.Make({"grads_in_partition"}),
                                 text.Make({label, ": ", TextPart::View(ZeroName()), " copy_grads_in_partition makes grads_in_partition"}),
                                 text.Make({TextPart::Count(gradsInPartitionElements_), " × ", TextPart::Bytes(regime_.gradients)}));
      }
    }
    if (e.ownGrad != kNoTensor && plan_.zeroStage == 1 && !inPartition_[e.parameter]) {
      // ZeRO-1 clears no gradient outside its partition here (reduce_ipg_grads' stage 1 branch
      // only copies); _clear_param_grad_only at the epilogue's end lets it go.
      heldToEpilogue_.push_back(e.ownGrad);
    } else if (e.ownGrad != kNoTensor) {
      b.Release(e.ownGrad, text.Make({label, ": ", names_[e.parameter],
                                      TextPart::View(inPartition_[e.parameter] && !plan_.offloadOptimizer
                                                         ? ".grad copied into grads_in_partition"
                                                         : ".grad cleared after its reduction")}));
    }
  }
  ipgEntries_.clear();
  ipgElements_ = 0;
}

// copy_grads_in_partition with cpu_offload at the accumulation boundary, for one parameter:
// set_norm_for_param_grad_in_gpu's `accumulated_grad...narrow(slice).data.double()`, then
// update_offload_overflow_tracker_for_param_grad → _has_inf_or_nan(whole gradient): float_x =
// x.float() (a copy unless fp32), isnan, isinf and their logical_or (1 B each), `.float()` of
// that, `.max()`; all freed on return; then async_inplace_copy_grad_to_fp32_buffer_from_gpu's
// `src_tensor.to(fp32)` of the slice, copied to the host and dropped.
void ParallelStep::OffloadGradientTransients(TraceBuilder& b, std::size_t index, Text label) {
  TextStore& text = b.text();
  const std::int64_t n = inventory_.parameters[index].Elements();
  const std::int64_t slice = partitionSlice_[index];
  const bool sixteen = regime_.gradients != DType::FP32;
  const auto temp = [&](std::int64_t elements, std::int64_t bytes, const char* what) {
    return b.Alloc(Category::Gradients, elements * bytes, text.Make({names_[index], TextPart::View(what)}),
                   text.Make({label, ": ", TextPart::View(ZeroName()), " offload: ", names_[index], TextPart::View(what)}),
                   text.Make({TextPart::Count(elements), " × ", TextPart::Int(bytes), " B"}));
  };
  const Text freed = text.Make({label, ": ", TextPart::View(ZeroName()), " offload: temporary freed"});
  b.Release(temp(slice, 8, ".grad.double() (norm)"), freed);
  HasInfOrNanTransients(b, n, sixteen, ".grad.float() (overflow check)", freed, temp);
  if (sixteen) b.Release(temp(slice, 4, ".grad.to(fp32) (to the host)"), freed);
}

// independent_gradient_partition_epilogue, after each backward: the rest of the bucket is
// reduced; without cpu_offload the first micro-batch's gradients in the partition are kept as
// all_grad_tensors (views of its grads_in_partition) and a later micro-batch's are added into
// them, its own grads_in_partition let go; at the boundary get_flat_partition's zero padding is
// made beside them (averaged_gradients); _release_ipg_buffers drops the IPG buffers and
// grads_in_partition, and _clear_param_grad_only every .grad.
void ParallelStep::ZeroEpilogue(TraceBuilder& b) {
  TextStore& text = b.text();
  const Text label = text.Make({TextPart::View(ZeroName()), " backward epilogue"});
  ReduceZeroBucket(b, label);
  const std::int64_t g = BytesPerElement(regime_.gradients);
  if (!plan_.offloadOptimizer) {
    if (keptGradPartition_ == kNoTensor) {
      keptGradPartition_ = gradPartition_;
    } else {
      b.Release(gradPartition_, text.Make({label, ": this micro-batch's gradients added into the first one's"}));
    }
    gradPartition_ = kNoTensor;
    if (AtAccumulationBoundary() && partitionPadElements_ > 0 && partitionPad_ == kNoTensor) {
      partitionPad_ = b.Alloc(Category::Gradients, partitionPadElements_ * g, text.Make({"partition padding"}),
                              text.Make({label, ": get_flat_partition pads the partition with zeros"}),
                              text.Make({TextPart::Count(partitionPadElements_), " × ", TextPart::Bytes(regime_.gradients)}));
    }
  }
  for (TensorHandle h : reduceBuckets_) b.Release(h, text.Make({label, ": _release_ipg_buffers"}));
  reduceBuckets_.clear();
  bucketsReady_ = false;
  for (TensorHandle h : heldToEpilogue_) b.Release(h, text.Make({label, ": _clear_param_grad_only"}));
  heldToEpilogue_.clear();
}

// step() before the flat fp32 gradient: check_overflow (when check_grad_overflow: fp16, and bf16
// by default, bf16 config check_grad_overflow = True) runs _has_inf_or_nan on each of
// averaged_gradients (has_overflow_partitioned_grads_serial), and scaled_global_norm takes
// get_grad_norm_direct's `torch.linalg.vector_norm(g.data.double())` of each, one at a time.
void ParallelStep::ZeroStepTransients(TraceBuilder& b) {
  TextStore& text = b.text();
  const Precision precision = setup_.training.precision;
  const bool checkOverflow = precision == Precision::FP16Mixed || precision == Precision::BF16Mixed || precision == Precision::BF16;
  const bool sixteen = regime_.gradients != DType::FP32;
  const Text freed = text.Make({"ZeRO step: temporary freed"});
  const auto temp = [&](std::size_t i, std::int64_t elements, std::int64_t bytes, const char* what) {
    return b.Alloc(Category::Gradients, elements * bytes, text.Make({names_[i], TextPart::View(what)}),
                   text.Make({"ZeRO step: ", names_[i], TextPart::View(what)}),
                   text.Make({TextPart::Count(elements), " × ", TextPart::Int(bytes), " B"}));
  };
  for (std::size_t i = 0; checkOverflow && i < inPartition_.size(); ++i) {
    if (!inPartition_[i]) continue;
    HasInfOrNanTransients(b, partitionSlice_[i], sixteen, " gradient .float() (check_overflow)", freed,
                          [&](std::int64_t elements, std::int64_t bytes, const char* what) { return temp(i, elements, bytes, what); });
  }
  for (std::size_t i = 0; i < inPartition_.size(); ++i) {
    if (inPartition_[i]) b.Release(temp(i, partitionSlice_[i], 8, " gradient .double() (norm)"), freed);
  }
}

// stage3.py step() before each sub-group's fp32 gradient (one sub-group here, as elsewhere):
// has_overflow (check_grad_overflow: fp16, and bf16 by default) runs
// `torch.isinf(self.grad_partitions_flat_buffer).any()` and then isnan's under
// reduce_and_partition_stream, a 1-byte mask of the partition each; _get_norm_groups'
// get_grad_norm_direct takes `g.to(device).double().norm(2)` of each gradient partition, one
// at a time; _prepare_fp32_grad_for_sub_group's `self.flatten(self.averaged_gradients[i])`
// makes a 16-bit flat of each sub-group's gradients, which `.to(fp32)` copies before the flat, a
// temporary, goes (BeforeSubGroupStep).
void ParallelStep::Zero3StepTransients(TraceBuilder& b) {
  TextStore& text = b.text();
  const std::int64_t partition = plan_.partitionElements;
  const Precision precision = setup_.training.precision;
  const Text freed = text.Make({"ZeRO step: temporary freed"});
  if (precision == Precision::FP16Mixed || precision == Precision::BF16Mixed || precision == Precision::BF16) {
    const OnStream onStream(b, ZeroOverlapComm(setup_.parallel, plan_) ? kReduceScatterStream : b.stream());
    for (const char* what : {"isinf", "isnan"}) {
      b.Release(b.Alloc(Category::Gradients, partition, text.Make({"grad_partitions_flat_buffer ", TextPart::View(what)}),
                        text.Make({"ZeRO-3 step: has_overflow: ", TextPart::View(what), "(grad_partitions_flat_buffer)"}),
                        text.Make({TextPart::Count(partition), " × 1 B (bool)"})),
                freed);
    }
  }
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    const Tensor& t = inventory_.parameters[i];
    if (!t.trainable) continue;
    const std::int64_t shard = CeilDiv(t.Elements(), plan_.shardWorld);
    b.Release(b.Alloc(Category::Gradients, shard * 8, text.Make({names_[i], " gradient partition .double() (norm)"}),
                      text.Make({"ZeRO step: ", names_[i], " gradient partition .double() (norm)"}),
                      text.Make({TextPart::Count(shard), " × 8 B"})),
              freed);
  }
}

}  // namespace gpumem
