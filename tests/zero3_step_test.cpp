// DeepSpeed ZeRO-3's optimizer step by sub-groups (sharding.cpp's sub-groups, parallel_step.cpp
// BeforeSubGroupStep / AfterSubGroupStep, step.cpp's loop): the rank's partition is cut into
// sub-groups of sub_group_size elements, each with an fp32 flat of its own that optimizer.step()
// updates alone, its fp32 gradient made before and freed after (DeepSpeed edaa722,
// runtime/zero/stage3.py _create_fp16_sub_groups, _create_fp32_partitions, step,
// _prepare_fp32_grad_for_sub_group, _optimizer_step, _release_sub_group,
// initialize_optimizer_states). Every size below is counted by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// The small Llama of zero3_reduce_test.cpp (vocabulary 1001, hidden 64, intermediate 171, two
// blocks, untied head; bf16 mixed, AdamW) under ZeRO-3 over 3 ranks. Each parameter's partition
// is ⌈n / 3⌉: embed_tokens and lm_head 21,355; a block's norms 22, q and o 1,366, k and v 683,
// gate, up and down 3,648 (a block 15,086); the final norm 22. The rank's partition: 72,904.
Setup SmallLlamaZero3(std::int64_t subGroupSize) {
  Setup s = test::SmallLlamaZero3();
  s.parallel.subGroupSize = subGroupSize;
  s.training.optimizerImplementation = OptimizerImplementation::ForEach;
  return s;
}

using test::AllocsOf;

}  // namespace

TEST_CASE("ZeRO-3 steps the optimizer one sub-group of the partition at a time", "[parallel][zero3]") {
  // sub_group_size 30,000, in the parameters' order (named_parameters(): LlamaDecoderLayer
  // registers its norms after the MLP): embed_tokens 21,355, then block 0 up to its up_proj
  // (1,366 + 683 + 683 + 1,366 + 3,648 + 3,648) reaches 32,749 ≥ 30,000 and closes sub-group 0;
  // the rest, down_proj 3,648, block 0's norms 22 + 22, block 1's 15,086, the final norm 22 and
  // lm_head 21,355, is sub-group 1 (40,155), closed by the last parameter.
  const Estimate e = test::MustEstimateLabelled(SmallLlamaZero3(30'000));
  // An fp32 flat per sub-group at construction.
  CHECK(AllocsOf(e, "ZeRO init: fp32 flat partition, sub-group 0", 0) == std::vector<std::int64_t>{32'749 * 4});
  CHECK(AllocsOf(e, "ZeRO init: fp32 flat partition, sub-group 1", 0) == std::vector<std::int64_t>{40'155 * 4});
  // initialize_optimizer_states: one zero gradient of the largest sub-group, each sub-group's
  // .grad a view of it.
  CHECK(AllocsOf(e, "initialize_optimizer_states' zero-valued fp32 gradient", 0) == std::vector<std::int64_t>{40'155 * 4});
  for (int step : {1, 2}) {
    // Each sub-group's 16-bit flat and fp32 gradient, the first freed before the second is made.
    CHECK(AllocsOf(e, "ZeRO step: averaged gradients flattened (_prepare_fp32_grad_for_sub_group) of sub-group", step) ==
          std::vector<std::int64_t>{32'749 * 2, 40'155 * 2});
    CHECK(AllocsOf(e, "ZeRO step: fp32 gradient partition of sub-group", step) == std::vector<std::int64_t>{32'749 * 4, 40'155 * 4});
    const std::size_t freed0 = test::TimelineIndexOf(e, "ZeRO step: fp32 gradient partition freed (_release_sub_group 0)", step);
    const std::size_t made1 = test::TimelineIndexOf(e, "ZeRO step: fp32 gradient partition of sub-group 1", step);
    CHECK(freed0 < made1);
    // foreach AdamW's temporaries are one sub-group's: its sqrt(exp_avg_sq) per sub-group.
    CHECK(AllocsOf(e, "_foreach_sqrt", step) == std::vector<std::int64_t>{32'749 * 4, 40'155 * 4});
  }
  // The model states are the partition's whatever the cut: 72,904 × (4 + 8) B of fp32 masters
  // and Adam's states, the same as one sub-group.
  const Estimate whole = test::MustEstimateLabelled(SmallLlamaZero3(1'000'000'000));
  CHECK(AllocsOf(whole, "ZeRO init: fp32 partition of the flat parameters", 0) == std::vector<std::int64_t>{72'904 * 4});
  CHECK(AllocsOf(whole, "_foreach_sqrt", 1) == std::vector<std::int64_t>{72'904 * 4});
  CHECK(e.modelStates.totalBytes == whole.modelStates.totalBytes);
  // The step's peak is lower cut in two: a sub-group's gradient and temporaries at a time.
  auto stepPeak = [](const Estimate& x) {
    std::int64_t most = 0;
    for (const TimelinePoint& p : x.timeline) {
      if (p.step == 1 && p.phase == Phase::OptimizerStep) most = std::max(most, p.totalBytes);
    }
    return most;
  };
  CHECK(stepPeak(e) < stepPeak(whole));
}

TEST_CASE("ZeRO-3's sub_group_size reads from a DeepSpeed config and is checked", "[parallel][zero3]") {
  const ParallelImport r = ImportDeepSpeedConfig(R"({"zero_optimization": {"stage": 3, "sub_group_size": 5e8}})",
                                                 SmallLlamaZero3(1'000'000'000));
  REQUIRE(r.ok());
  CHECK(r.setup.parallel.subGroupSize == 500'000'000);
  Setup bad = SmallLlamaZero3(-1);
  EstimateResult refused = EstimateMemory(bad, {});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.errors.front().field == "parallel.subGroupSize");
}
