// DeepSpeed ZeRO-1 and ZeRO-2 gradient handling (parallel_step.cpp ProduceZero2, ProduceZero1; DeepSpeed
// edaa722 runtime/zero/stage_1_and_2.py): the IPG buffer made at the first gradient, the bucket
// reduced when the next gradient would overflow it, gradients above reduce_bucket_size kept to
// that reduction, grads_in_partition made at the first reduction that reaches the simulated
// (last) rank's partition, cpu_offload's gradient transients, and the step's flat 16-bit copy,
// overflow check and norm. Every size below is counted by hand.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// The small Llama of zero3_reduce_test.cpp (vocabulary 1001, hidden 64, 4 heads, 2 k/v heads,
// intermediate 171, two blocks, untied head; bf16 mixed, AdamW, 1 × 32 tokens), ZeRO-2 over 3.
//
// The flat of the trainable parameters, in named_parameters() order (LlamaDecoderLayer registers
// its norms after the MLP): embed_tokens [0, 64,064); block 0: q 4,096, k and v 2,048, o 4,096,
// gate, up and down 10,944 each, input_layernorm and post_attention_layernorm 64 each (45,248);
// block 1 from 109,312, its down_proj at [143,488, 154,432) and its norms to 154,560; the final
// norm [154,560, 154,624); lm_head [154,624, 218,688). 218,688 is a multiple of 2 · 3, so no
// padding: partitions of 72,896. The last rank's, [145,792, 218,688), holds 8,640 elements of
// block 1's down_proj, its two norms, the final norm and lm_head: grads_in_partition is
// 10,944 + 64 + 64 + 64 + 64,064 = 75,200 elements.
Setup SmallLlamaZero2(std::int64_t ranks, std::int64_t reduceBucketSize) {
  Setup s = test::SmallLlama(2);
  s.parallel.dataParallel = ranks;
  s.parallel.zeroStage = 2;
  s.parallel.reduceBucketSize = reduceBucketSize;
  return s;
}

Estimate Labelled(const Setup& s) { return test::MustEstimateLabelled(s); }

std::size_t IndexOf(const Estimate& e, const std::string& text, int step) { return test::TimelineIndexOf(e, text, step); }

std::int64_t BytesAt(const Estimate& e, std::size_t i) { return i < e.timeline.size() ? e.timeline[i].deltaBytes : 0; }

}  // namespace

TEST_CASE("ZeRO-2: the last rank's grads_in_partition comes with the first reduction", "[parallel][zero2]") {
  const Estimate e = Labelled(SmallLlamaZero2(3, 12'000));
  CHECK(e.rank.dataParallelRank == 2);
  for (int step : {1, 2}) {
    // The IPG buffer (reduce_bucket_size elements × 2 B) at the first gradient, lm_head's.
    const std::size_t bucket = IndexOf(e, "setup_buckets, reduce bucket 0", step);
    CHECK(BytesAt(e, bucket) == 12'000 * 2);
    CHECK(bucket > IndexOf(e, "lm_head.weight.grad", step));
    // lm_head's 64,064 elements exceed the bucket: kept as autograd made it. The final norm's
    // gradient overflows the bucket, which is reduced: lm_head is in the partition, so
    // grads_in_partition is made (75,200 × 2 B) and lm_head's gradient copied into it; then
    // the norm's gradient is copied into the bucket.
    const std::size_t normGrad = IndexOf(e, "model.norm.weight.grad", step);
    const std::size_t partition = IndexOf(e, "copy_grads_in_partition makes grads_in_partition", step);
    const std::size_t headFreed = IndexOf(e, "lm_head.weight.grad copied into grads_in_partition", step);
    const std::size_t normCopied = IndexOf(e, "model.norm.weight.grad copied to the reduce bucket", step);
    CHECK(BytesAt(e, partition) == 75'200 * 2);
    CHECK(normGrad < partition);
    CHECK(partition < headFreed);
    CHECK(headFreed < normCopied);
    CHECK(normCopied < e.timeline.size());
    // The epilogue lets the IPG buffer go; the step flattens the partition's gradients into a
    // new 16-bit flat (72,896 × 2 B), makes the fp32 gradient (72,896 × 4 B), frees the flat,
    // then grads_in_partition.
    CHECK(BytesAt(e, IndexOf(e, "ZeRO-2 backward epilogue: _release_ipg_buffers", step)) == -12'000 * 2);
    const std::size_t flat = IndexOf(e, "averaged gradients flattened", step);
    const std::size_t fp32 = IndexOf(e, "ZeRO step: fp32 gradient partition", step);
    const std::size_t flatFreed = IndexOf(e, "del flat_grad_partition", step);
    const std::size_t partitionFreed = IndexOf(e, "grads_in_partition freed", step);
    CHECK(BytesAt(e, flat) == 72'896 * 2);
    CHECK(BytesAt(e, fp32) == 72'896 * 4);
    CHECK(BytesAt(e, flatFreed) == -72'896 * 2);
    CHECK(BytesAt(e, partitionFreed) == -75'200 * 2);
    CHECK(flat < fp32);
    CHECK(fp32 < flatFreed);
    CHECK(flatFreed < partitionFreed);
    // Before the flat: check_overflow's _has_inf_or_nan of each gradient in the partition, the
    // first (in the flat's order) block 1's down_proj slice of 8,640 elements: .float() × 4 B;
    // and the norm's .double() of lm_head's 64,064 elements × 8 B.
    CHECK(BytesAt(e, IndexOf(e, "ZeRO step: model.layers.1.mlp.down_proj.weight gradient .float() (check_overflow)", step)) ==
          8'640 * 4);
    CHECK(BytesAt(e, IndexOf(e, "ZeRO step: lm_head.weight gradient .double() (norm)", step)) == 64'064 * 8);
    CHECK(IndexOf(e, "gradient .double() (norm)", step) < flat);
  }
}

TEST_CASE("ZeRO-2 with cpu_offload: the staging buffer and each gradient's transients", "[parallel][zero2]") {
  // One rank: the partition is the whole flat, so every gradient goes through
  // copy_grads_in_partition's offload branch; no grads_in_partition, no flat at the step.
  Setup s = SmallLlamaZero2(1, 500'000'000);
  s.parallel.offload = OffloadKind::Optimizer;
  const Estimate e = Labelled(s);
  // temp_grad_buffer_for_gpu_offload: the largest parameter (embed_tokens, lm_head: 64,064) × 2 B.
  CHECK(BytesAt(e, IndexOf(e, "GPU staging buffer of the largest parameter", 0)) == 64'064 * 2);
  CHECK(IndexOf(e, "grads_in_partition", 2) == e.timeline.size());
  CHECK(IndexOf(e, "averaged gradients flattened", 2) == e.timeline.size());
  // At the epilogue (the default bucket holds every gradient) lm_head's, in backward's order
  // first: .double() 64,064 × 8 B; _has_inf_or_nan: .float() × 4 B, isnan, isinf, their or
  // (1 B each), .float() × 4 B — 11 B per element live at once; then .to(fp32) × 4 B.
  const std::size_t first = IndexOf(e, "lm_head.weight.grad.double() (norm)", 2);
  REQUIRE(first < e.timeline.size());
  CHECK(BytesAt(e, first) == 64'064 * 8);
  CHECK(BytesAt(e, first + 1) == -64'064 * 8);
  const std::int64_t expected[] = {64'064 * 4, 64'064, 64'064, 64'064, 64'064 * 4};
  std::int64_t live = 0;
  for (std::size_t k = 0; k < 5; ++k) {
    CHECK(BytesAt(e, first + 2 + k) == expected[k]);
    live += BytesAt(e, first + 2 + k);
  }
  CHECK(live == 64'064 * 11);
  CHECK(BytesAt(e, IndexOf(e, "lm_head.weight.grad.to(fp32) (to the host)", 2)) == 64'064 * 4);
}

TEST_CASE("ZeRO-2 with gradient accumulation: later micro-batches add into the first one's partition", "[parallel][zero2]") {
  Setup s = SmallLlamaZero2(3, 500'000'000);
  s.parallel.gradientAccumulationSteps = 2;
  const Estimate e = Labelled(s);
  // Two grads_in_partition a step, the second freed at its own epilogue; the step frees the first.
  int made = 0, added = 0;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step != 2) continue;
    made += p.deltaBytes > 0 && p.label.find("makes grads_in_partition") != std::string::npos;
    added += p.deltaBytes == -75'200 * 2 && p.label.find("added into the first one's") != std::string::npos;
  }
  CHECK(made == 2);
  CHECK(added == 1);
}

TEST_CASE("ZeRO-1: gradients kept whole to the end of backward, then reduced in the parameters' order", "[parallel][zero2]") {
  // Without overlap_comm, ZeRO-1's hook only runs setup_buckets; reduce_gradients then takes each
  // gradient in the flat's order through the bucket. The simulated rank is rank 0, whose
  // partition [0, 72,896) holds embed_tokens, block 0's q, k, v and 640 elements of o_proj:
  // grads_in_partition is 64,064 + 4,096 + 2,048 + 2,048 + 4,096 = 76,352 elements.
  Setup s = SmallLlamaZero2(3, 12'000);
  s.parallel.zeroStage = 1;
  const Estimate e = Labelled(s);
  CHECK(e.rank.dataParallelRank == 0);
  for (int step : {1, 2}) {
    CHECK(BytesAt(e, IndexOf(e, "setup_buckets, reduce bucket 0", step)) == 12'000 * 2);
    // No gradient reaches the bucket before reduce_gradients.
    const std::size_t firstCopy = IndexOf(e, "copied to the reduce bucket", step);
    REQUIRE(firstCopy < e.timeline.size());
    CHECK(e.timeline[firstCopy].label.rfind("ZeRO-1 reduce_gradients", 0) == 0);
    // embed_tokens (64,064 > 12,000) waits in the bucket; block 0's q_proj overflows it:
    // grads_in_partition is made and embed_tokens copied in, then q_proj into the bucket.
    const std::size_t partition = IndexOf(e, "makes grads_in_partition", step);
    const std::size_t embedIn = IndexOf(e, "embed_tokens.weight.grad copied into grads_in_partition", step);
    const std::size_t qCopied = IndexOf(e, "model.layers.0.self_attn.q_proj.weight.grad copied to the reduce bucket", step);
    CHECK(BytesAt(e, partition) == 76'352 * 2);
    CHECK(partition < embedIn);
    CHECK(embedIn < qCopied);
    CHECK(qCopied < e.timeline.size());
    CHECK(BytesAt(e, IndexOf(e, "averaged gradients flattened", step)) == 72'896 * 2);
    // lm_head (64,064 > 12,000, outside rank 0's partition) is not cleared by its reduction:
    // ZeRO-1's _clear_param_grad_only lets it go after _release_ipg_buffers.
    const std::size_t buffers = IndexOf(e, "ZeRO-1 backward epilogue: _release_ipg_buffers", step);
    const std::size_t cleared = IndexOf(e, "ZeRO-1 backward epilogue: _clear_param_grad_only", step);
    CHECK(buffers < cleared);
    CHECK(BytesAt(e, cleared) == -64'064 * 2);
  }
}
