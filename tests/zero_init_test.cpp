// DeepSpeed ZeRO's construction, with the torch.cuda.empty_cache() calls the allocator model
// carries out (AllocatorEventKind::EmptyCache):
// - ZeRO-1/2 (parallel_step.cpp FlattenZeroGroup; DeepSpeed edaa722 runtime/zero/stage_1_and_2.py
//   DeepSpeedZeroOptimizer.__init__): the trainable parameters become one padded 16-bit flat,
//   made on the GPU when NVML's free memory holds it (from 0.18.7) or on the host;
// - ZeRO-3 (DefragmentZero3, CreateZero3Fp32Partitions; stage3.py): the trainable partitions
//   defragmented into one flat, and the fp32 partitions converted from it.
// Every size below is counted by hand.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "allocator_reference.hpp"
#include "gpumem/device.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/json.hpp"
#include "gpumem/setup.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

constexpr std::int64_t MiB = 1 << 20;

// Llama 2 7B, bf16 with fp32 masters, ZeRO-2 over 8 ranks. Its parameters in bytes: the
// embeddings and lm_head 32,000 × 4,096 × 2 = 262,144,000 (125 × 2 MiB); per block q, k, v, o
// 33,554,432 (16 × 2 MiB), gate, up, down 90,177,536 (43 × 2 MiB), two norms of 8,192; the
// final norm 8,192. All 6,738,415,616 of them train: 13,476,831,232 B, a multiple of 2 · 8
// elements, so the flat has no pad.
Setup Llama7bZero2() {
  auto parsed = ParseSetupJson(R"({"model":{"preset":"llama-2-7b"},
      "training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","checkpointing":"everyBlock","precision":"bf16Mixed"},
      "gpu":{"id":"nvidia-h100-sxm","memoryGiB":80},"parallel":{"dataParallel":8,"zeroStage":2}})");
  REQUIRE(parsed.errors.empty());
  return parsed.setup;
}

// What the caching allocator reserves for those parameters, each made by its own cudaMalloc:
// the 289 large ones exactly (their sizes are multiples of 2 MiB, so segment = request), the 65
// norms (65 × 8,192 = 532,480 B, ≤ 1 MiB each) packed into one 2 MiB small segment.
constexpr std::int64_t kParameterSegments = 2 * 262'144'000 + 32 * (4 * 33'554'432LL + 3 * 90'177'536LL) + 2 * MiB;
static_assert(kParameterSegments == 13'478'395'904);
constexpr std::int64_t kFlatBytes = 13'476'831'232;
// The flat's own segment: 13,476,831,232 B rounded up to 2 MiB = 6,427 × 2 MiB.
constexpr std::int64_t kFlatSegment = 6'427 * 2 * MiB;
static_assert(kFlatSegment == 13'478'395'904);

const TimelinePoint* First(const Estimate& e, const std::string& text) {
  for (const TimelinePoint& p : e.timeline) {
    if (p.label.find(text) != std::string::npos) return &p;
  }
  return nullptr;
}

const TimelinePoint* Last(const Estimate& e, const std::string& text) {
  const TimelinePoint* found = nullptr;
  for (const TimelinePoint& p : e.timeline) {
    if (p.label.find(text) != std::string::npos) found = &p;
  }
  return found;
}

int Count(const Estimate& e, const std::string& text) {
  int n = 0;
  for (const TimelinePoint& p : e.timeline) n += p.label.find(text) != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("empty_cache releases every cached block that is a whole segment, and no split one", "[allocator][zero2-init]") {
  // Four 30 MiB tensors, each its own 30 MiB segment (requests ≥ 10 MiB: rounded to 2 MiB).
  // A and B are freed, then C freed and a 10 MiB request D splits C's cached block (the
  // 20 MiB rest stays free in C's segment). empty_cache releases A's and B's segments only:
  // C's is split, E's is allocated.
  std::vector<AllocatorEvent> events = {
      {AllocatorEventKind::Alloc, 0, 30 * MiB}, {AllocatorEventKind::Alloc, 1, 30 * MiB},
      {AllocatorEventKind::Alloc, 2, 30 * MiB}, {AllocatorEventKind::Alloc, 3, 30 * MiB},
      {AllocatorEventKind::Free, 0, 0},         {AllocatorEventKind::Free, 1, 0},
      {AllocatorEventKind::Free, 2, 0},         {AllocatorEventKind::Alloc, 4, 10 * MiB},
      {AllocatorEventKind::EmptyCache, -1, 0},
  };
  AllocatorRecording recording;
  recording.timeline = true;
  const AllocatorResult r = SimulateCachingAllocator(events, DefaultAllocatorOptions(), kUnlimitedDeviceBytes, recording);
  REQUIRE(r.reservedBytesAfterEvent.size() == events.size());
  CHECK(r.reservedBytesAfterEvent[7] == 120 * MiB);
  CHECK(r.reservedBytesAfterEvent[8] == 60 * MiB);  // C's (split) and 3's segments
  CHECK(r.finalReservedBytes == 60 * MiB);
  CHECK(r.finalAllocatedBytes == 40 * MiB);
  CHECK(r.numDeviceFrees == 2);
  CHECK(r.peakReservedBytes == 120 * MiB);  // the peak before is kept
  CHECK(r.unmatchedFrees == 0);
  CHECK(r.eventsSimulated == static_cast<int>(events.size()));
  // A later request of A's size needs a new cudaMalloc.
  events.push_back({AllocatorEventKind::Alloc, 5, 30 * MiB});
  const AllocatorResult again = SimulateCachingAllocator(events, DefaultAllocatorOptions(), kUnlimitedDeviceBytes, recording);
  CHECK(again.numDeviceAllocs == 5);
  CHECK(again.finalReservedBytes == 90 * MiB);
}

TEST_CASE("empty_cache events give the reference allocator's every figure", "[allocator][zero2-init]") {
  // Random streams with empty_cache calls between them, against tests/allocator_reference.cpp
  // (std::set pools as PyTorch keeps them), at a capacity that makes some runs fail.
  std::mt19937_64 random(7);
  int compared = 0;
  for (int round = 0; round < 6; ++round) {
    std::vector<AllocatorEvent> events;
    std::vector<int> live;
    for (int i = 0; i < 600; ++i) {
      const std::int64_t sizes[] = {4096, 700 * 1024, 3 * MiB, 12 * MiB, 40 * MiB, 130 * MiB};
      events.push_back({AllocatorEventKind::Alloc, i, sizes[random() % 6] + static_cast<std::int64_t>(random() % 1000)});
      live.push_back(i);
      if (random() % 3 == 0 && !live.empty()) {
        const std::size_t k = random() % live.size();
        events.push_back({AllocatorEventKind::Free, live[k], 0});
        live[k] = live.back();
        live.pop_back();
      }
      if (random() % 40 == 0) events.push_back({AllocatorEventKind::EmptyCache, -1, 0});
    }
    for (const std::int64_t capacity : {kUnlimitedDeviceBytes, 6'000 * MiB}) {
      AllocatorRecording recording;
      recording.timeline = true;
      recording.segmentsAtPeak = true;
      const AllocatorResult model = SimulateCachingAllocator(events, DefaultAllocatorOptions(), capacity, recording);
      const AllocatorResult reference =
          reference::ReferenceSimulateCachingAllocator(events, DefaultAllocatorOptions(), capacity, recording);
      CHECK(model.eventsSimulated == reference.eventsSimulated);
      CHECK(model.peakReservedBytes == reference.peakReservedBytes);
      CHECK(model.peakReservedEvent == reference.peakReservedEvent);
      CHECK(model.peakAllocatedBytes == reference.peakAllocatedBytes);
      CHECK(model.numDeviceAllocs == reference.numDeviceAllocs);
      CHECK(model.numDeviceFrees == reference.numDeviceFrees);
      CHECK(model.oom.happened == reference.oom.happened);
      CHECK(model.reservedBytesAfterEvent == reference.reservedBytesAfterEvent);
      CHECK(model.segmentsAtPeakReserved.size() == reference.segmentsAtPeakReserved.size());
      ++compared;
    }
  }
  CHECK(compared == 12);
}

TEST_CASE("ZeRO-2 from DeepSpeed 0.18.7 flattens on the GPU when the flat fits: the parameters' segments stay cached",
          "[parallel][zero2-init]") {
  const Estimate e = test::MustEstimateLabelled(Llama7bZero2());  // runtime.deepspeedVersion "0.19"
  const TimelinePoint* flat = First(e, "flatten_dense_tensors_aligned on the GPU");
  REQUIRE(flat != nullptr);
  CHECK(flat->step == 0);
  CHECK(flat->deltaBytes == kFlatBytes);
  CHECK(flat->totalBytes == 2 * kFlatBytes);  // the parameters and their flat copy
  // Nothing was cached before (init frees nothing), so the empty_cache before changed nothing:
  // the parameters' segments and the flat's own.
  CHECK(flat->reservedBytes == kParameterSegments + kFlatSegment);
  CHECK(First(e, "align_dense_tensors' zero pad") == nullptr);  // aligned already
  // Every parameter becomes a view of the flat: 291 storages freed, their blocks cached.
  CHECK(Count(e, "_update_model_bit16_weights") == 291);
  const TimelinePoint* lastView = Last(e, "_update_model_bit16_weights");
  REQUIRE(lastView != nullptr);
  CHECK(lastView->totalBytes == kFlatBytes);
  CHECK(lastView->reservedBytes == kParameterSegments + kFlatSegment);
  // Then the fp32 partition: a bf16 clone of the rank's partition (1/8), .to(fp32), the clone
  // let go.
  const std::int64_t partition = 6'738'415'616 / 8;
  CHECK(test::FirstAllocBytes(e, "partition .clone() before .to(fp32)") == partition * 2);
  CHECK(test::FirstAllocBytes(e, "fp32 partition of the flat parameters") == partition * 4);
  CHECK(e.modelStates.parametersBytes == kFlatBytes);
}

TEST_CASE("ZeRO-2 flattens on the host before DeepSpeed 0.18.7, or when the GPU's free memory cannot hold the flat",
          "[parallel][zero2-init]") {
  Setup older = Llama7bZero2();
  older.runtime.deepspeedVersion = "0.18.6";
  Setup small = Llama7bZero2();
  small.gpu.id = "";
  // 24 GiB less the context and NCCL's buffers, less the 12.55 GiB of parameters, is less than
  // the 12.55 GiB flat.
  small.gpu.memoryGiB = 24;
  for (const Setup& s : {older, small}) {
    const Estimate e = test::MustEstimateLabelled(s);
    CHECK(First(e, "flatten_dense_tensors_aligned on the GPU") == nullptr);
    // Per parameter a 4-byte stand-in (torch.empty(1).to(device)) before its storage goes.
    CHECK(Count(e, ".data = torch.empty(1).to(device)") == 291);
    CHECK(Count(e, "copied to the host, its GPU storage freed") == 291);
    const TimelinePoint* flat = First(e, "the flat made on the host");
    REQUIRE(flat != nullptr);
    CHECK(flat->deltaBytes == kFlatBytes);
    CHECK(flat->totalBytes == kFlatBytes + 291 * 4);
    // empty_cache released the 289 large segments; the stand-ins sit in the norms' small one.
    CHECK(flat->reservedBytes == 2 * MiB + kFlatSegment);
    CHECK(Count(e, "_update_model_bit16_weights") == 291);
    CHECK(e.modelStates.parametersBytes == kFlatBytes);
  }
  // Before 0.13.0 move_to_cpu left no stand-ins: the norms' small segment goes too.
  Setup oldest = Llama7bZero2();
  oldest.runtime.deepspeedVersion = "0.12.6";
  const Estimate e = test::MustEstimateLabelled(oldest);
  CHECK(Count(e, "torch.empty(1)") == 0);
  const TimelinePoint* flat = First(e, "the flat made on the host");
  REQUIRE(flat != nullptr);
  CHECK(flat->totalBytes == kFlatBytes);
  CHECK(flat->reservedBytes == kFlatSegment);
}

TEST_CASE("ZeRO-2's flat keeps its alignment pad: n rounded up to a multiple of 2 × dp", "[parallel][zero2-init]") {
  // The small Llama of zero12_reduce_test.cpp: 218,688 trainable elements (bf16). Over 5
  // ranks the flat aligns to 10: 218,690 elements, a pad of 2 (4 B).
  Setup s = test::SmallLlama(2);
  s.parallel.dataParallel = 5;
  s.parallel.zeroStage = 2;
  const Estimate e = test::MustEstimateLabelled(s);
  CHECK(test::FirstAllocBytes(e, "align_dense_tensors' zero pad") == 2 * 2);
  CHECK(test::FirstAllocBytes(e, "flatten_dense_tensors_aligned on the GPU") == 218'690 * 2);
  Setup one = test::SmallLlama(2);
  CHECK(e.modelStates.parametersBytes == test::MustEstimate(one).modelStates.parametersBytes + 2 * 2);
  // The fp32 partition is the flat's fifth: 43,738 elements.
  CHECK(e.modelStates.masterWeightsBytes == 43'738 * 4);
}

TEST_CASE("runtime.deepspeedVersion is read as major.minor[.patch] and refused otherwise", "[parallel][zero2-init]") {
  int major = 0, minor = 0, patch = 0;
  CHECK(ParseVersion("0.18.7", major, minor, patch));
  CHECK((major == 0 && minor == 18 && patch == 7));
  CHECK(ParseVersion("0.19", major, minor, patch));
  CHECK((major == 0 && minor == 19 && patch == 0));
  CHECK(ParseVersion("0.14.4+cu124", major, minor, patch));
  CHECK(patch == 4);
  CHECK_FALSE(ParseVersion("0.18.x", major, minor, patch));
  CHECK_FALSE(ParseVersion("latest", major, minor, patch));
  Setup s = Llama7bZero2();
  s.runtime.deepspeedVersion = "v0.19";
  CHECK(test::HasErrorOn(Validate(s), "runtime.deepspeedVersion"));
  auto parsed = ParseSetupJson(R"({"runtime":{"deepspeedVersion":0.19}})");
  CHECK(test::HasErrorOn(parsed.errors, "runtime.deepspeedVersion"));
  auto good = ParseSetupJson(R"({"runtime":{"deepspeedVersion":"0.16.9"}})");
  CHECK(good.errors.empty());
  CHECK(good.setup.runtime.deepspeedVersion == "0.16.9");
}

namespace {

// Init's allocations whose label holds `text`.
std::vector<std::int64_t> AllocsOf(const Estimate& e, const std::string& text) { return test::AllocsOf(e, text, 0); }

std::size_t IndexOf(const Estimate& e, const std::string& text) { return test::TimelineIndexOf(e, text, 0); }

}  // namespace

TEST_CASE("ZeRO-3 defragments the trainable partitions into one flat after an empty_cache", "[parallel][zero3-init]") {
  // The small Llama over 3 ranks. Every parameter is below stage3_param_persistence_threshold
  // (1e5; the largest, embed_tokens, has 64,064 elements), so each is held whole and as its
  // partition: 21 of each. The partitions (⌈n / 3⌉: embed_tokens and lm_head 21,355, a block
  // 15,086, the final norm 22) sum to 72,904 elements.
  const Estimate e = test::MustEstimateLabelled(test::SmallLlamaZero3());
  CHECK(Count(e, "whole (persistent: below stage3_param_persistence_threshold)") == 21);
  CHECK(Count(e, "ZeRO-3 init: defragment: the partition of") == 21);
  CHECK(AllocsOf(e, "ZeRO-3 init: defragment: the trainable partitions in one flat") == std::vector<std::int64_t>{72'904 * 2});
  // Then per sub-group (one here) `converted` (fp32), its clone (the fp32 partition), and
  // `converted` let go when _create_fp32_partitions returns.
  CHECK(AllocsOf(e, "converted = the 16-bit flat .to(fp32)") == std::vector<std::int64_t>{72'904 * 4});
  CHECK(AllocsOf(e, "ZeRO init: fp32 partition of the flat parameters") == std::vector<std::int64_t>{72'904 * 4});
  const std::size_t flat = IndexOf(e, "trainable partitions in one flat");
  const std::size_t converted = IndexOf(e, "converted = the 16-bit flat");
  const std::size_t master = IndexOf(e, "ZeRO init: fp32 partition of the flat parameters");
  const std::size_t returned = IndexOf(e, "_create_fp32_partitions returns");
  CHECK(flat < converted);
  CHECK(converted < master);
  CHECK(master < returned);
  REQUIRE(returned < e.timeline.size());
  CHECK(e.timeline[returned].deltaBytes == -72'904 * 4);
  // The model states: the partitions once, the persistent parameters whole besides.
  CHECK(e.modelStates.masterWeightsBytes == 72'904 * 4);
}

TEST_CASE("ZeRO-3's fp32 partitions per sub-group: `converted` lives until the next sub-group's is made", "[parallel][zero3-init]") {
  // sub_group_size 30,000 cuts the partition into 32,749 and 40,155 elements (zero3_step_test.cpp).
  Setup s = test::SmallLlamaZero3();
  s.parallel.subGroupSize = 30'000;
  const Estimate e = test::MustEstimateLabelled(s);
  CHECK(AllocsOf(e, "converted = the 16-bit flat .to(fp32), sub-group") == std::vector<std::int64_t>{32'749 * 4, 40'155 * 4});
  const std::size_t second = IndexOf(e, "converted = the 16-bit flat .to(fp32), sub-group 1");
  const std::size_t firstFreed = IndexOf(e, "the previous `converted` let go");
  const std::size_t secondMaster = IndexOf(e, "ZeRO init: fp32 flat partition, sub-group 1");
  CHECK(second < firstFreed);
  CHECK(firstFreed < secondMaster);
  REQUIRE(firstFreed < e.timeline.size());
  CHECK(e.timeline[firstFreed].deltaBytes == -32'749 * 4);
}

TEST_CASE("ZeRO-3 with fp32 weights steps the parameters' own flat: no fp32 copy", "[parallel][zero3-init]") {
  Setup s = test::SmallLlamaZero3();
  s.training.precision = Precision::FP32;
  const Estimate e = test::MustEstimateLabelled(s);
  CHECK(Count(e, "converted = the 16-bit flat") == 0);
  CHECK(Count(e, "ZeRO init: fp32 partition of the flat parameters") == 0);
  CHECK(AllocsOf(e, "trainable partitions in one flat") == std::vector<std::int64_t>{72'904 * 4});
  CHECK(e.modelStates.masterWeightsBytes == 0);
}

TEST_CASE("ZeRO-3's defragment releases the partitions' segments: Llama 2 7B over 8 ranks", "[parallel][zero3-init]") {
  // Every partition is n / 8 exactly (every size is a multiple of 8): 842,301,952 elements,
  // 1,684,603,904 B, one segment of 804 × 2 MiB = 1,686,110,208 B. Only the 65 norms are
  // persistent (4,096 elements < 1e5): their whole copies sit in one 2 MiB small segment, which
  // their freed partitions shared. After the empty_cache the other partitions' segments are
  // gone: reserved is that small segment and the flat's.
  Setup s = Llama7bZero2();
  s.parallel.zeroStage = 3;
  const Estimate e = test::MustEstimateLabelled(s);
  CHECK(Count(e, "ZeRO-3 init: defragment: the partition of") == 291);
  const TimelinePoint* flat = First(e, "trainable partitions in one flat");
  REQUIRE(flat != nullptr);
  CHECK(flat->deltaBytes == 842'301'952LL * 2);
  CHECK(flat->reservedBytes == 2 * MiB + 804 * 2 * MiB);
}
