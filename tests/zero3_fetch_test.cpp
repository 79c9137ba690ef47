// ZeRO-3's parameter fetching by step (parallel_step.cpp PlanZeroReuse, Enter, Gather): the first
// step records DeepSpeed's trace and neither prefetches nor keeps anything; from the second on
// the coordinator prefetches within stage3_prefetch_bucket_size, in forward and backward alike,
// and keeps a parameter used again within stage3_max_reuse_distance elements from its forward to
// its backward (DeepSpeed edaa722, runtime/zero/partitioned_param_coordinator.py
// fetch_sub_module, release_sub_module, __params_to_release; parameter_offload.py reset_step at
// every forward's start). Every size below is counted by hand.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/setup.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// The small Llama of zero3_reduce_test.cpp (vocabulary 1001, hidden 64, 4 heads of 16, 2 k/v
// heads, intermediate 171, two blocks, untied head; bf16 mixed, AdamW, 1 × 32 tokens) under
// ZeRO-3 over 3 ranks, every parameter partitioned (persistence threshold 0).
// A block in forward order: input_layernorm 64, q 4,096, k 2,048, v 2,048, o 4,096,
// post_attention_layernorm 64, gate, up, down 10,944 each: 45,248 elements, gathered as
// 90,496 B. After the blocks: the final norm 64 and lm_head 64,064 (T = 64,128).
Setup SmallLlamaZero3(std::int64_t maxReuseDistance, std::int64_t prefetchBucket = 50'000'000) {
  Setup s = test::SmallLlamaZero3();
  s.parallel.stage3ParamPersistenceThreshold = 0;
  s.parallel.stage3MaxReuseDistance = maxReuseDistance;
  s.parallel.stage3PrefetchBucketSize = prefetchBucket;
  return s;
}

struct Gathering {
  Phase phase;
  std::int64_t bytes;
  std::string label;
};

// The gathers and releases of the blocks' parameters in one step, in order.
std::vector<Gathering> BlockGathers(const Estimate& e, int step) {
  std::vector<Gathering> out;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step != step || p.category != Category::Parameters || p.label.find("layers.") == std::string::npos) continue;
    if (p.label.find("all-gather of") == std::string::npos && p.label.find("freed") == std::string::npos) continue;
    out.push_back({p.phase, p.deltaBytes, p.label});
  }
  return out;
}

bool Has(const std::vector<Gathering>& events, const std::string& text) {
  for (const Gathering& e : events) if (e.label.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("ZeRO-3's first step records the trace: each block gathered whole, nothing prefetched or kept",
          "[parallel][zero3]") {
  const Estimate e = test::MustEstimateLabelled(SmallLlamaZero3(1'000'000'000));
  const std::vector<Gathering> step1 = BlockGathers(e, 1);
  // Forward: layers.0 gathered, freed when layers.1 is entered, layers.1 gathered and freed at the
  // head; backward: layers.1, then layers.0, each gathered and freed. No prefetch although the
  // bucket (5e7) holds the whole model.
  REQUIRE(step1.size() == 8);
  for (std::size_t k = 0; k < step1.size(); ++k) {
    CHECK(step1[k].bytes == (k % 2 == 0 ? 90'496 : -90'496));
  }
  CHECK_FALSE(Has(step1, "prefetch"));
  CHECK_FALSE(Has(step1, "stage3_max_reuse_distance"));
}

TEST_CASE("ZeRO-3 keeps what is used again within stage3_max_reuse_distance from forward to backward",
          "[parallel][zero3]") {
  SECTION("the default 1e9 keeps both blocks whole") {
    // Every distance is under 1e9 (the model has 218,752 elements): layers.0 and layers.1 are
    // prefetched with the embeddings at the forward's start (both fit the 5e7 bucket) and first
    // freed after their own backward, without a gather in backward.
    const std::vector<Gathering> step2 = BlockGathers(test::MustEstimateLabelled(SmallLlamaZero3(1'000'000'000)), 2);
    REQUIRE(step2.size() == 4);
    CHECK(step2[0].phase == Phase::Forward);
    CHECK(step2[0].label == "prefetch: all-gather of layers.0");
    CHECK(step2[1].label == "prefetch: all-gather of layers.1");
    CHECK(step2[1].bytes == 90'496);
    CHECK(step2[2].phase == Phase::Backward);
    CHECK(step2[2].label == "reshard: layers.1 freed");
    CHECK(step2[3].phase == Phase::Backward);
    CHECK(step2[3].label == "reshard: layers.0 freed");
  }
  SECTION("a limit of 180,000 keeps layers.1's MLP only") {
    // Without checkpointing a parameter of block u is next used in its backward, after
    // 2 × (A + S + T) elements: A the sub-modules after it in its block, S the later blocks.
    // layers.1 (S = 0): down 2 × (0 + 64,128) = 128,256, up 150,144, gate 172,032 < 180,000;
    // post_attention_layernorm 193,920 and the rest above. layers.0 (S = 45,248): 218,752 or more.
    // Kept: gate, up, down = 32,832 elements (65,664 B); the other 12,416 (24,832 B) are released
    // after the forward and gathered again in backward.
    const std::vector<Gathering> step2 = BlockGathers(test::MustEstimateLabelled(SmallLlamaZero3(180'000)), 2);
    REQUIRE(step2.size() == 10);
    CHECK(step2[0].label == "prefetch: all-gather of layers.0");
    CHECK(step2[0].bytes == 90'496);
    CHECK(step2[1].label == "prefetch: all-gather of layers.1");
    CHECK(step2[1].bytes == 24'832);
    CHECK(step2[2].label == "prefetch: all-gather of layers.1 (the part used again within stage3_max_reuse_distance)");
    CHECK(step2[2].bytes == 65'664);
    CHECK(step2[3].label == "reshard: layers.0 freed");
    CHECK(step2[4].phase == Phase::Forward);
    CHECK(step2[4].label == "release: layers.1 freed but the part used again within stage3_max_reuse_distance");
    CHECK(step2[4].bytes == -24'832);
    CHECK(step2[5].phase == Phase::Backward);
    CHECK(step2[5].label == "all-gather of layers.1");
    CHECK(step2[5].bytes == 24'832);
    CHECK(step2[6].label == "prefetch: all-gather of layers.0");
    CHECK(step2[7].label == "release: layers.1 (reused part) freed");
    CHECK(step2[7].bytes == -65'664);
    CHECK(step2[8].label == "reshard: layers.1 freed");
    CHECK(step2[8].bytes == -24'832);
    CHECK(step2[9].label == "reshard: layers.0 freed");
  }
  SECTION("with every block checkpointed the next use is the block's recompute") {
    // layers.1's parameter of n elements: the sub-modules after it in forward (A), the head and
    // norm twice (2T = 128,256), then the recompute of those before it (B): A + B = 45,248 − n.
    // Under 170,000: q and o (169,408), gate, up, down (162,560); k and v (171,456) and the
    // norms (173,440) are not. Kept 2 × 4,096 + 3 × 10,944 = 41,024 elements (82,048 B).
    // layers.0 adds layers.1 once in forward and twice in backward: 309,248 − n, none kept.
    Setup s = SmallLlamaZero3(170'000);
    s.training.checkpointing = Checkpointing::EveryBlock;
    const std::vector<Gathering> step2 = BlockGathers(test::MustEstimateLabelled(s), 2);
    REQUIRE(step2.size() >= 5);
    CHECK(step2[1].bytes == 8'448);
    CHECK(step2[2].label == "prefetch: all-gather of layers.1 (the part used again within stage3_max_reuse_distance)");
    CHECK(step2[2].bytes == 82'048);
    CHECK(step2[4].bytes == -8'448);
  }
  SECTION("a limit of 0 keeps nothing") {
    const std::vector<Gathering> step2 = BlockGathers(test::MustEstimateLabelled(SmallLlamaZero3(0)), 2);
    CHECK_FALSE(Has(step2, "stage3_max_reuse_distance"));
    CHECK(step2.size() == 8);  // gathers with the forward's prefetch of layers.1 and the backward's of layers.0
  }
}

TEST_CASE("ZeRO-3 prefetches in backward only what fits stage3_prefetch_bucket_size", "[parallel][zero3]") {
  // Nothing kept (limit 0), so step 2's backward gathers layers.1 and then, with a bucket of
  // 50,000 ≥ 45,248, prefetches layers.0 alongside; with 40,000 it does not, and layers.0 is
  // gathered when its backward begins. The forward prefetches layers.1 by the same rule.
  const std::vector<Gathering> fits = BlockGathers(test::MustEstimateLabelled(SmallLlamaZero3(0, 50'000)), 2);
  REQUIRE(fits.size() == 8);
  CHECK(fits[1].label == "prefetch: all-gather of layers.1");
  CHECK(fits[4].phase == Phase::Backward);
  CHECK(fits[4].label == "all-gather of layers.1");
  CHECK(fits[5].label == "prefetch: all-gather of layers.0");
  CHECK(fits[6].label == "reshard: layers.1 freed");

  const std::vector<Gathering> not_fits = BlockGathers(test::MustEstimateLabelled(SmallLlamaZero3(0, 40'000)), 2);
  CHECK_FALSE(Has(not_fits, "prefetch"));
  REQUIRE(not_fits.size() == 8);
  CHECK(not_fits[4].label == "all-gather of layers.1");
  CHECK(not_fits[5].label == "reshard: layers.1 freed");
  CHECK(not_fits[6].label == "all-gather of layers.0");
  // The peak of step 2 is then lower by the prefetched block's 90,496 B or not at all, never higher.
  CHECK(test::MustEstimateLabelled(SmallLlamaZero3(0, 40'000)).peak.totalBytes <=
        test::MustEstimateLabelled(SmallLlamaZero3(0, 50'000)).peak.totalBytes);
}

namespace {

// The root's gathers and releases in one step: the embeddings (embed_tokens, 64,064 elements,
// 128,128 B) and the final norm and head (64 + 64,064 elements, 128,256 B).
std::vector<Gathering> RootGathers(const Estimate& e, int step) {
  std::vector<Gathering> out;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step != step || p.category != Category::Parameters) continue;
    if (p.label.find("embeddings") == std::string::npos && p.label.find("final norm and head") == std::string::npos) continue;
    out.push_back({p.phase, p.deltaBytes, p.label});
  }
  return out;
}

}  // namespace

TEST_CASE("ZeRO-3 fetches the embeddings and the head where they run", "[parallel][zero3]") {
  SECTION("the first step releases each after its forward and fetches it again for its backward") {
    const Estimate e = test::MustEstimateLabelled(SmallLlamaZero3(1'000'000'000));
    const std::vector<Gathering> root = RootGathers(e, 1);
    REQUIRE(root.size() == 8);
    CHECK(root[0].label == "all-gather of the embeddings");
    CHECK(root[0].bytes == 128'128);
    CHECK(root[1].label == "release: embeddings freed");
    CHECK(root[1].phase == Phase::Forward);
    CHECK(root[2].label == "all-gather of final norm and head");
    CHECK(root[2].bytes == 128'256);
    CHECK(root[3].label == "release: final norm and head freed");
    CHECK(root[3].phase == Phase::Forward);
    CHECK(root[4].label == "all-gather of final norm and head");
    CHECK(root[4].phase == Phase::Backward);
    CHECK(root[5].label == "release: final norm and head freed");
    CHECK(root[6].label == "all-gather of the embeddings");
    CHECK(root[6].phase == Phase::Backward);
    CHECK(root[7].label == "release: embeddings freed");
    // The embeddings go before layers.0 is gathered; the head comes back before layers.1's
    // backward and goes when it begins.
    CHECK(test::TimelineIndexOf(e, "release: embeddings freed", 1) < test::TimelineIndexOf(e, "all-gather of layers.0", 1));
    const std::size_t headBack = test::TimelineIndexOf(e, "release: final norm and head freed", 1);
    CHECK(e.timeline[headBack].phase == Phase::Forward);
  }
  SECTION("from the second step on both stay from forward to backward when reused within the limit") {
    // The head's backward follows its forward with no parameter between (distance 0); the
    // embeddings' comes last: 2 × 45,248 (forward) + 2 × 64,128 + 2 × 45,248 (backward) = 309,248.
    // Under 1e9 both stay: gathered once each in step 2, released after their backward.
    const std::vector<Gathering> kept = RootGathers(test::MustEstimateLabelled(SmallLlamaZero3(1'000'000'000)), 2);
    REQUIRE(kept.size() == 4);
    CHECK(kept[0].label == "all-gather of the embeddings");
    CHECK(kept[1].label == "all-gather of final norm and head");
    CHECK(kept[1].phase == Phase::Forward);
    CHECK(kept[2].label == "release: final norm and head freed");
    CHECK(kept[2].phase == Phase::Backward);
    CHECK(kept[3].label == "release: embeddings freed");
    CHECK(kept[3].phase == Phase::Backward);
    // Under 180,000 the embeddings go after their forward and come back for their backward.
    const std::vector<Gathering> released = RootGathers(test::MustEstimateLabelled(SmallLlamaZero3(180'000)), 2);
    REQUIRE(released.size() == 6);
    CHECK(released[1].label == "release: embeddings freed");
    CHECK(released[1].phase == Phase::Forward);
    CHECK(released[3].label == "release: final norm and head freed");
    CHECK(released[3].phase == Phase::Backward);
    CHECK(released[4].label == "all-gather of the embeddings");
    CHECK(released[4].phase == Phase::Backward);
  }
}

TEST_CASE("ZeRO-3 prefetches no more than stage3_max_live_parameters leaves room for", "[parallel][zero3]") {
  // Nothing kept (limit 0). max_params_to_prefetch = min(max_live − gathered now, bucket):
  // - at the forward's start the embeddings (64,064) are gathered: with max_live 100,000 the room
  //   is 35,936 < 45,248, so layers.0 is not prefetched with them;
  // - entering layers.0 the embeddings are gone and layers.0 (45,248) is gathered: the room is
  //   54,752, so layers.1 is prefetched; with max_live 90,000 it is 44,752, so it is not.
  Setup s = SmallLlamaZero3(0);
  s.parallel.stage3MaxLiveParameters = 100'000;
  const std::vector<Gathering> room = BlockGathers(test::MustEstimateLabelled(s), 2);
  REQUIRE(room.size() >= 2);
  CHECK(room[0].label == "all-gather of layers.0");
  CHECK(room[1].label == "prefetch: all-gather of layers.1");
  s.parallel.stage3MaxLiveParameters = 90'000;
  const std::vector<Gathering> tight = BlockGathers(test::MustEstimateLabelled(s), 2);
  REQUIRE(tight.size() >= 3);
  CHECK(tight[0].label == "all-gather of layers.0");
  CHECK(tight[1].label == "reshard: layers.0 freed");
  CHECK(tight[2].label == "all-gather of layers.1");
}

TEST_CASE("ZeRO-3 keeps only what the recorded backward uses again", "[parallel][zero3]") {
  // The embeddings and block 0 frozen: the first backward stops in block 1, so the trace has no
  // backward fetch of block 0 or of the embeddings. From the second step on they are released
  // after their forward although the limit (1e9) holds the whole model; block 1 stays whole.
  Setup s = SmallLlamaZero3(1'000'000'000);
  s.finetune.freezeEmbeddings = true;
  s.finetune.freezeFirstBlocks = 1;
  const Estimate e = test::MustEstimateLabelled(s);
  const std::vector<Gathering> blocks = BlockGathers(e, 2);
  bool layer0FreedInForward = false, layer1FreedInForward = false;
  for (const Gathering& g : blocks) {
    layer0FreedInForward = layer0FreedInForward || (g.phase == Phase::Forward && g.label == "reshard: layers.0 freed");
    layer1FreedInForward = layer1FreedInForward || (g.phase == Phase::Forward && g.bytes < 0 && g.label.find("layers.1") != std::string::npos);
  }
  CHECK(layer0FreedInForward);
  CHECK_FALSE(layer1FreedInForward);
  const std::vector<Gathering> root = RootGathers(e, 2);
  REQUIRE(root.size() >= 2);
  CHECK(root[1].label == "release: embeddings freed");
  CHECK(root[1].phase == Phase::Forward);
  for (const Gathering& g : root) CHECK_FALSE((g.phase == Phase::Backward && g.label == "all-gather of the embeddings"));
}

TEST_CASE("A ZeRO-3 estimate's notes say how it fetches and that NCCL's buffers are counted", "[parallel][zero3]") {
  const Estimate e = test::MustEstimateLabelled(SmallLlamaZero3(180'000));
  auto has = [&](const std::string& text) {
    for (const std::string& n : e.notes) if (n.find(text) != std::string::npos) return true;
    return false;
  };
  CHECK(has("stage3_max_reuse_distance (180000 elements)"));
  CHECK(has("stage3_prefetch_bucket_size (50000000)"));
  CHECK(has("NCCL's communicator buffers are counted"));
  CHECK_FALSE(has("not modelled yet"));
  CHECK(e.device.communicationBytes > 0);  // the note's figure: one data-parallel communicator of 3 ranks
}
