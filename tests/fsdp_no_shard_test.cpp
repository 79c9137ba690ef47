// FSDP1 over one rank (parallel_step.cpp Fsdp1NoShard): torch's _init_core_state switches every
// sharding strategy to NO_SHARD when the world size is 1. The FlatParameter is then whole and
// never all-gathered: with parameter mixed precision each unit computes with a 16-bit copy made
// at its unshard and freed at every reshard (after forward too); without it, with the
// FlatParameter itself. The gradient is all-reduced in place, then cast to the parameter's dtype.
// Sizes by hand below.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// The small Llama of zero3_reduce_test.cpp: vocabulary 1001, hidden 64, 4 heads, 2 k/v heads,
// intermediate 171, two blocks, untied; 1 × 32 tokens. A block holds 45,248 elements: q 4,096,
// k and v 2,048 each, o 4,096, gate, up and down 10,944 each, two norms of 64.
constexpr std::int64_t kBlock = 45'248;

Setup SmallLlamaFsdp(FsdpMode mode, Precision precision, std::int64_t ranks) {
  Setup s = test::SmallLlama(2);
  s.training.precision = precision;
  s.parallel.dataParallel = ranks;
  s.parallel.fsdp = mode;
  return s;
}

Estimate Labelled(const Setup& s) { return test::MustEstimateLabelled(s); }

// Allocations of step 2 whose label contains `text`, and their bytes.
std::vector<std::int64_t> Allocations(const Estimate& e, const std::string& text) {
  std::vector<std::int64_t> out;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step == 2 && p.deltaBytes > 0 && p.label.find(text) != std::string::npos) out.push_back(p.deltaBytes);
  }
  return out;
}

}  // namespace

TEST_CASE("FSDP over one rank: a bf16 FlatParameter is used as it is, nothing gathered", "[parallel][fsdp]") {
  // Pure bf16: the FlatParameter is in the compute dtype, so NO_SHARD has no copy to make.
  const Estimate one = Labelled(SmallLlamaFsdp(FsdpMode::FullShard, Precision::BF16, 1));
  CHECK(Allocations(one, "all-gather of").empty());
  // The gradient is all-reduced in place: no reduce-scatter output, and already bf16.
  CHECK(Allocations(one, "FSDP reduce-scatter of").empty());
  CHECK(Allocations(one, "in fp32").empty());
  // Over two ranks both blocks are all-gathered in forward and backward, and reduce-scattered.
  const Estimate two = Labelled(SmallLlamaFsdp(FsdpMode::FullShard, Precision::BF16, 2));
  CHECK(Allocations(two, "all-gather of layers.1").size() == 2);
  CHECK(Allocations(two, "FSDP reduce-scatter of layers.1") == std::vector<std::int64_t>{kBlock / 2 * 2});
}

TEST_CASE("FSDP over one rank with mixed precision: the 16-bit copy, freed after forward whatever the strategy",
          "[parallel][fsdp]") {
  // bf16 mixed: the FlatParameter is fp32 and each unit computes with a bf16 copy of all of it
  // (45,248 × 2 B for a block), made at its forward and again at its backward.
  for (FsdpMode mode : {FsdpMode::FullShard, FsdpMode::ShardGradOp, FsdpMode::HybridShard}) {
    Setup s = SmallLlamaFsdp(mode, Precision::BF16Mixed, 1);
    s.parallel.fsdpShardGroupSize = 1;
    const Estimate e = Labelled(s);
    CHECK(Allocations(e, "all-gather of layers.1") == std::vector<std::int64_t>{kBlock * 2, kBlock * 2});
    CHECK(Allocations(e, "FSDP reduce-scatter of").empty());
    // The bf16 gradient cast to fp32 and kept: the whole block, 45,248 × 4 B.
    CHECK(Allocations(e, "FSDP: gradient shard of layers.1 in fp32") == std::vector<std::int64_t>{kBlock * 4});
  }
  // SHARD_GRAD_OP over two ranks keeps forward's gathered block to its backward: one all-gather.
  const Estimate two = Labelled(SmallLlamaFsdp(FsdpMode::ShardGradOp, Precision::BF16Mixed, 2));
  CHECK(Allocations(two, "all-gather of layers.1").size() == 1);
}
