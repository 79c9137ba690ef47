// ZeRO-3's gradient reduction (parallel_step.cpp ProduceZero3 / ReduceIpgBucket): the IPG
// bucket fills in backward's gradient order, is reduced when the next gradient would overflow
// reduce_bucket_size and at the backward's epilogue, and each reduction's
// reduce_scatter_coalesced makes a flat buffer of the padded partitions (DeepSpeed edaa722,
// runtime/zero/stage3.py, runtime/comm/coalesced_collectives.py). Every size below is counted by
// hand.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// A small Llama: vocabulary 1001, hidden 64, 4 heads of 16, 2 k/v heads, intermediate 171, two
// blocks, untied head; bf16 mixed, AdamW, 1 × 32 tokens; ZeRO-3 over 3 ranks (odd sizes pad).
Setup SmallLlamaZero3(std::int64_t reduceBucketSize) {
  Setup s = test::SmallLlamaZero3();
  s.parallel.reduceBucketSize = reduceBucketSize;
  return s;
}

Estimate Labelled(const Setup& s) { return test::MustEstimateLabelled(s); }

bool Has(const TimelinePoint& p, const std::string& text) { return p.label.find(text) != std::string::npos; }

// The flat buffers' sizes of one step, in order.
std::vector<std::int64_t> FlatBuffers(const Estimate& e, int step) {
  std::vector<std::int64_t> out;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step == step && p.deltaBytes > 0 && Has(p, "torch.cat of the padded partitions")) out.push_back(p.deltaBytes);
  }
  return out;
}

std::size_t IndexOf(const Estimate& e, const std::string& text, int step) { return test::TimelineIndexOf(e, text, step); }

}  // namespace

TEST_CASE("ZeRO-3 reduces a bucket that holds every gradient once, at the backward's epilogue", "[parallel][zero3]") {
  // reduce_bucket_size 500M (the default): nothing overflows, so
  // independent_gradient_partition_epilogue reduces all of them at once. Each gradient of n
  // elements takes 3 · ⌈n / 3⌉ in the torch.cat:
  //   a block: q 4,096 → 4,098, k and v 2,048 → 2,049, o 4,098, gate, up and down 10,944 each
  //            (3 divides them), two norms 64 → 66: 45,258;
  //   embed_tokens and lm_head 64,064 → 64,065 each; the final norm 66.
  // 2 × 45,258 + 2 × 64,065 + 66 = 218,712 elements × 2 B (bf16).
  const Estimate e = Labelled(SmallLlamaZero3(500'000'000));
  for (int step : {1, 2}) {
    const std::vector<std::int64_t> flats = FlatBuffers(e, step);
    REQUIRE(flats.size() == 1);
    CHECK(flats[0] == 218'712 * 2);
    // It comes after the last gradient (embed_tokens) is made.
    CHECK(IndexOf(e, "ZeRO-3 backward epilogue: ZeRO-3 reduces its bucket (21 gradients)", step) >
          IndexOf(e, "model.embed_tokens.weight.grad", step));
  }
}

TEST_CASE("ZeRO-3 reduces when the next gradient would overflow the bucket", "[parallel][zero3]") {
  // reduce_bucket_size 12,000. Backward's gradients come as lm_head (64,064), the final norm
  // (64), then block 1's down_proj (10,944), up_proj (10,944), …
  // - lm_head: the bucket is empty, so no reduction; 64,064 > 12,000, so it is not copied into
  //   the contiguous buffer and stays where autograd made it.
  // - the final norm: 64,064 + 64 > 12,000 → reduce lm_head alone (64,064 is not a multiple of
  //   3: a flat of 64,065 elements); partition_grads frees lm_head.grad; the norm is copied.
  // - down_proj: 64 + 10,944 = 11,008 fits, copied.
  // - up_proj: 11,008 + 10,944 > 12,000 → reduce the norm and down_proj: 66 + 10,944 = 11,010.
  const Estimate e = Labelled(SmallLlamaZero3(12'000));
  for (int step : {1, 2}) {
    const std::vector<std::int64_t> flats = FlatBuffers(e, step);
    REQUIRE(flats.size() >= 2);
    CHECK(flats[0] == 64'065 * 2);
    CHECK(flats[1] == 11'010 * 2);
    // lm_head's gradient lives until the final norm's hook reduces it, after the norm's .grad
    // is made; the norm's is copied into the bucket after that reduction.
    const std::size_t normGrad = IndexOf(e, "model.norm.weight.grad", step);
    const std::size_t headFreed = IndexOf(e, "lm_head.weight.grad = None (partition_grads)", step);
    const std::size_t normCopied = IndexOf(e, "model.norm.weight.grad copied to the reduce bucket", step);
    CHECK(normGrad < headFreed);
    CHECK(headFreed < normCopied);
    CHECK(normCopied < e.timeline.size());
    CHECK(IndexOf(e, "lm_head.weight.grad copied to the reduce bucket", step) == e.timeline.size());
  }
}

TEST_CASE("ZeRO-3: a lone gradient the world divides is reduced in place", "[parallel][zero3]") {
  // Over 2 ranks, lm_head's 64,064 elements divide evenly: reduce_scatter_coalesced reduces its
  // own view, no torch.cat. The next bucket (final norm 64 + down_proj 10,944, both even) is a
  // flat of 11,008 elements.
  Setup s = SmallLlamaZero3(12'000);
  s.parallel.dataParallel = 2;
  const Estimate e = Labelled(s);
  const std::vector<std::int64_t> flats = FlatBuffers(e, 2);
  REQUIRE(!flats.empty());
  CHECK(flats[0] == 11'008 * 2);
  CHECK(IndexOf(e, "ZeRO-3 reduces its bucket (1 gradient)", 2) == e.timeline.size());
}

TEST_CASE("ZeRO-3 without contiguous_gradients keeps every .grad to its bucket's reduction", "[parallel][zero3]") {
  // __add_grad_to_ipg_bucket copies only with contiguous_gradients; otherwise each .grad stays
  // until partition_grads, so with the default bucket all of them live to the epilogue.
  Setup s = SmallLlamaZero3(500'000'000);
  s.parallel.contiguousGradients = false;
  const Estimate e = Labelled(s);
  CHECK(IndexOf(e, "copied to the reduce bucket", 2) == e.timeline.size());
  const std::size_t epilogue = IndexOf(e, "ZeRO-3 backward epilogue: ZeRO-3 reduces its bucket", 2);
  REQUIRE(epilogue < e.timeline.size());
  // Just before the epilogue every bf16 gradient is live: 2 × 45,248 + 2 × 64,064 + 64 elements.
  std::int64_t live = 0;
  for (std::size_t i = 0; i < epilogue; ++i) {
    const TimelinePoint& p = e.timeline[i];
    if (p.step == 2 && p.category == Category::Gradients && p.label.find(".grad") != std::string::npos &&
        p.label.find("(partition_grads)") == std::string::npos) {
      live += p.deltaBytes;
    }
  }
  CHECK(live == (2 * 45'248 + 2 * 64'064 + 64) * 2);
}

TEST_CASE("ZeRO-3 over one rank gathers nothing: parameters are views of their partitions", "[parallel][zero3]") {
  // partition_parameters.py all_gather_coalesced: every partition world 1 → _no_gather_coalesced,
  // param.data = ds_tensor.data.to(device).view(ds_shape), the partition itself on the GPU. The
  // parameters are held once, persistent ones (below stage3_param_persistence_threshold, here
  // every one) too: 2 × 45,248 + 2 × 64,064 + 64 = 218,688 elements × 2 B.
  Setup s = SmallLlamaZero3(500'000'000);
  s.parallel.dataParallel = 1;
  const Estimate e = Labelled(s);
  CHECK(e.modelStates.parametersBytes == 218'688 * 2);
  // No parameter persistent (threshold 0): over many ranks every block is gathered, over one
  // none is.
  s.parallel.stage3ParamPersistenceThreshold = 0;
  const Estimate none = Labelled(s);
  CHECK(IndexOf(none, "all-gather of", 1) == none.timeline.size());
  CHECK(IndexOf(none, "all-gather of", 2) == none.timeline.size());
  CHECK(none.modelStates.parametersBytes == 218'688 * 2);
  s.parallel.dataParallel = 2;
  const Estimate two = Labelled(s);
  CHECK(IndexOf(two, "all-gather of", 2) < two.timeline.size());
  s.parallel.dataParallel = 1;
  // The reduction still concatenates a bucket of several gradients (3 divides nothing here:
  // world 1 pads nothing): 218,688 elements at the epilogue.
  const std::vector<std::int64_t> flats = FlatBuffers(e, 2);
  REQUIRE(flats.size() == 1);
  CHECK(flats[0] == 218'688 * 2);

  // With the parameters offloaded the partitions are on the host, and .to(device) copies each
  // fetched parameter to the GPU: gathered as over many ranks.
  s.parallel.offload = OffloadKind::OptimizerAndParameters;
  const Estimate offloaded = Labelled(s);
  CHECK(IndexOf(offloaded, "all-gather of", 2) < offloaded.timeline.size());

  // Over two ranks the persistent parameters are held twice (the whole one and the partition):
  // 218,688 / 2 shards (every size is even) + 218,688 whole.
  s = SmallLlamaZero3(500'000'000);
  s.parallel.dataParallel = 2;
  CHECK(Labelled(s).modelStates.parametersBytes == (218'688 / 2 + 218'688) * 2);
}

TEST_CASE("ZeRO-3's step: has_overflow's masks, the norm's doubles, then the 16-bit flat before the fp32 gradient",
          "[parallel][zero3]") {
  // Over 3 ranks the trainable partition is Σ ⌈n / 3⌉ = 218,712 / 3 = 72,904 elements (the
  // padded sizes of the first test case, divided by the world).
  const Estimate e = Labelled(SmallLlamaZero3(500'000'000));
  for (int step : {1, 2}) {
    const std::size_t isinf = IndexOf(e, "has_overflow: isinf(grad_partitions_flat_buffer)", step);
    const std::size_t isnan = IndexOf(e, "has_overflow: isnan(grad_partitions_flat_buffer)", step);
    const std::size_t norm = IndexOf(e, "lm_head.weight gradient partition .double() (norm)", step);
    const std::size_t flat = IndexOf(e, "averaged gradients flattened (_prepare_fp32_grad_for_sub_group)", step);
    const std::size_t fp32 = IndexOf(e, "ZeRO step: fp32 gradient partition", step);
    const std::size_t flatFreed = IndexOf(e, "ZeRO step: the 16-bit flat freed", step);
    REQUIRE(flatFreed < e.timeline.size());
    CHECK(e.timeline[isinf].deltaBytes == 72'904);
    CHECK(e.timeline[isnan].deltaBytes == 72'904);
    CHECK(e.timeline[norm].deltaBytes == 21'355 * 8);  // lm_head: ⌈64,064 / 3⌉
    CHECK(e.timeline[flat].deltaBytes == 72'904 * 2);
    CHECK(e.timeline[fp32].deltaBytes == 72'904 * 4);
    CHECK(e.timeline[flatFreed].deltaBytes == -72'904 * 2);
    CHECK(isinf < isnan);
    CHECK(isnan < norm);
    CHECK(norm < flat);
    CHECK(flat < fp32);
    CHECK(fp32 < flatFreed);
  }
}
