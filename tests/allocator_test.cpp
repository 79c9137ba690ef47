// The caching allocator model against hand-worked scenarios. Each case names the rule of
// c10/cuda/CUDACachingAllocator.cpp it checks; every expected number is worked out in a comment.
#include <catch2/catch.hpp>

#include <vector>

#include "gpumem/device.hpp"

using namespace gpumem;

namespace {

constexpr std::int64_t KiB = 1024;
constexpr std::int64_t MiB = 1024 * 1024;

AllocatorEvent Alloc(int id, std::int64_t bytes) { return {AllocatorEventKind::Alloc, id, bytes}; }
AllocatorEvent Free(int id) { return {AllocatorEventKind::Free, id, 0}; }

AllocatorResult Run(const std::vector<AllocatorEvent>& events, std::int64_t capacity,
                    AllocatorOptions options = DefaultAllocatorOptions()) {
  return SimulateCachingAllocator(events, options, capacity);
}

}  // namespace

TEST_CASE("round_size and get_allocation_size", "[allocator]") {
  const AllocatorOptions o = DefaultAllocatorOptions();
  // round_size: below kMinBlockSize (512) → 512; else the next multiple of 512.
  CHECK(RoundAllocationSize(1, o) == 512);
  CHECK(RoundAllocationSize(511, o) == 512);
  CHECK(RoundAllocationSize(512, o) == 512);
  CHECK(RoundAllocationSize(513, o) == 1024);
  // get_allocation_size: ≤ 1 MiB (kSmallSize) → a 2 MiB small segment.
  CHECK(SegmentAllocationSize(RoundAllocationSize(1, o)) == 2 * MiB);
  CHECK(RoundAllocationSize(1 * MiB, o) == 1 * MiB);
  CHECK(SegmentAllocationSize(1 * MiB) == 2 * MiB);
  // 1 MiB + 1 → 1,049,088 (next 512) → large pool, below kMinLargeAlloc → kLargeBuffer 20 MiB.
  CHECK(RoundAllocationSize(1 * MiB + 1, o) == 1049088);
  CHECK(SegmentAllocationSize(1049088) == 20 * MiB);
  // 9.9 MiB = 10,380,902 B → 20,276 × 512 = 10,381,312 → still < 10 MiB → 20 MiB.
  CHECK(RoundAllocationSize(10380902, o) == 10381312);
  CHECK(SegmentAllocationSize(10381312) == 20 * MiB);
  // 10 MiB: not below kMinLargeAlloc → rounded to 2 MiB (kRoundLarge): exactly 10 MiB.
  CHECK(SegmentAllocationSize(RoundAllocationSize(10 * MiB, o)) == 10 * MiB);
  // 30 MiB → 30 MiB; 30 MiB + 1 → 31,457,792 → 16 × 2 MiB = 32 MiB.
  CHECK(SegmentAllocationSize(RoundAllocationSize(30 * MiB, o)) == 30 * MiB);
  CHECK(SegmentAllocationSize(RoundAllocationSize(30 * MiB + 1, o)) == 32 * MiB);
}

TEST_CASE("roundup_power2_divisions rounds to power-of-two steps", "[allocator]") {
  AllocatorOptions o = DefaultAllocatorOptions();
  o.roundupPower2Divisions.fill(4);
  // roundup_power2_next_division with 4 divisions: only above 512 × 4 = 2048 B.
  CHECK(RoundAllocationSize(1200, o) == 1536);           // ≤ 2048: plain 512 rounding
  CHECK(RoundAllocationSize(5000, o) == 5120);           // 4096 + 1024 (steps of 4096 / 4)
  CHECK(RoundAllocationSize(1258291, o) == 1310720);     // 1.2 MiB → 1 MiB + 256 KiB
  CHECK(RoundAllocationSize(4 * MiB, o) == 4 * MiB);     // a power of two stays
  o.roundupPower2Divisions.fill(2);
  CHECK(RoundAllocationSize(3 * MiB + 1, o) == 4 * MiB);  // 2 MiB + 1 MiB steps → 4 MiB
  // Per interval: 64 MiB requests (interval 6) with 8 divisions, the rest unrounded.
  AllocatorOptions per = DefaultAllocatorOptions();
  per.roundupPower2Divisions[6] = 8;
  CHECK(RoundAllocationSize(65 * MiB, per) == 72 * MiB);  // 64 MiB + 8 MiB steps
  CHECK(RoundAllocationSize(33 * MiB, per) == 33 * MiB);  // interval 5: not configured
  // The allocator uses it: a 65 MiB tensor holds 72 MiB.
  const AllocatorResult r = Run({Alloc(1, 65 * MiB)}, 1024 * MiB, per);
  CHECK(r.peakAllocatedBytes == 72 * MiB);
  CHECK(r.peakReservedBytes == 72 * MiB);
}

TEST_CASE("PYTORCH_CUDA_ALLOC_CONF is read like AllocatorConfig::parseArgs", "[allocator]") {
  const AllocatorConfParse p = ParseAllocatorConf(
      "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6,"
      "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]");
  REQUIRE(p.errors.empty());
  CHECK(p.options.expandableSegments);
  CHECK(p.options.maxSplitSizeMiB == 128);
  CHECK(p.options.garbageCollectionThreshold == Approx(0.6));
  // As upstream's AllocatorConfig test: 64 MiB → 8 (the first value fills below), 128 → 8,
  // 256 → 16, 512 → 1, 1024 → 0, 2048 → 8, 4096 → 2 (">" fills after the last named).
  CHECK(p.options.roundupPower2Divisions[6] == 8);
  CHECK(p.options.roundupPower2Divisions[7] == 8);
  CHECK(p.options.roundupPower2Divisions[8] == 16);
  CHECK(p.options.roundupPower2Divisions[9] == 1);
  CHECK(p.options.roundupPower2Divisions[10] == 0);
  CHECK(p.options.roundupPower2Divisions[11] == 8);
  CHECK(p.options.roundupPower2Divisions[12] == 2);
  CHECK(ParseAllocatorConf("roundup_power2_divisions:4").options.roundupPower2Divisions[15] == 4);
  CHECK_FALSE(ParseAllocatorConf("max_split_size_mb:10").errors.empty());  // below 20 MiB
  CHECK_FALSE(ParseAllocatorConf("foo:123").errors.empty());
  CHECK_FALSE(ParseAllocatorConf("backend:cudaMallocAsync").errors.empty());
  CHECK_FALSE(ParseAllocatorConf("roundup_power2_divisions:[64:8").errors.empty());
  CHECK(ValidateAllocatorOptions(DefaultAllocatorOptions()).empty());
  AllocatorOptions bad = DefaultAllocatorOptions();
  bad.maxSplitSizeMiB = 5;
  bad.roundupPower2Divisions[3] = 3;
  CHECK(ValidateAllocatorOptions(bad).size() == 2);
}

TEST_CASE("small tensors share one 2 MiB small-pool segment", "[allocator]") {
  // 2048 tensors of 1 KiB fill one kSmallBuffer exactly (the small pool splits any remainder
  // ≥ 512 B; the last one leaves 0); the 2049th opens a second segment.
  std::vector<AllocatorEvent> events;
  for (int i = 0; i < 2049; ++i) events.push_back(Alloc(i, 1 * KiB));
  const AllocatorResult r = Run(events, 1024 * MiB);
  CHECK(r.peakAllocatedBytes == 2049 * KiB);
  CHECK(r.peakReservedBytes == 4 * MiB);
  CHECK(r.numDeviceAllocs == 2);
  CHECK(r.reservedBytesAfterEvent[2047] == 2 * MiB);
  CHECK(r.reservedBytesAfterEvent[2048] == 4 * MiB);
  REQUIRE(r.segmentsAtPeakReserved.size() == 2);
  CHECK(r.segmentsAtPeakReserved[0].smallPool);
  CHECK(r.segmentsAtPeakReserved[0].blocks.size() == 2048);
  // Second segment: the new tensor at the low address, the rest free: 2 MiB − 1 KiB.
  REQUIRE(r.segmentsAtPeakReserved[1].blocks.size() == 2);
  CHECK(r.segmentsAtPeakReserved[1].blocks[0].tensorId == 2048);
  CHECK(r.segmentsAtPeakReserved[1].blocks[1].bytes == 2 * MiB - 1 * KiB);
  CHECK_FALSE(r.segmentsAtPeakReserved[1].blocks[1].allocated);
}

TEST_CASE("splitting a 20 MiB segment and merging it back", "[allocator]") {
  // A 4 MiB → kLargeBuffer 20 MiB segment, split (remainder 16 MiB > 1 MiB): [A 4 | free 16].
  // B 6 MiB → best fit is the 16 MiB block: [A 4 | B 6 | free 10]; inactive split 10 MiB.
  // Free A: no free neighbour, [free 4 | B 6 | free 10]; inactive split 14 MiB.
  // Free B: merges both neighbours back into one unsplit 20 MiB block; inactive split 0.
  // C 20 MiB takes that cached block: no second cudaMalloc.
  const AllocatorResult r =
      Run({Alloc(1, 4 * MiB), Alloc(2, 6 * MiB), Free(1), Free(2), Alloc(3, 20 * MiB)}, 1024 * MiB);
  CHECK(r.peakReservedBytes == 20 * MiB);
  CHECK(r.peakReservedEvent == 0);
  CHECK(r.inactiveSplitAtPeakReservedBytes == 16 * MiB);  // after event 0: [A 4 | free 16]
  CHECK(r.allocatedBytesAfterEvent == std::vector<std::int64_t>{4 * MiB, 10 * MiB, 6 * MiB, 0, 20 * MiB});
  CHECK(r.reservedBytesAfterEvent == std::vector<std::int64_t>(5, 20 * MiB));
  CHECK(r.numDeviceAllocs == 1);
  REQUIRE(r.segmentsAtPeakReserved.size() == 1);
  const AllocatorSegmentInfo& s = r.segmentsAtPeakReserved[0];
  CHECK(s.totalBytes == 20 * MiB);
  REQUIRE(s.blocks.size() == 2);
  CHECK(s.blocks[0].allocated);
  CHECK(s.blocks[0].bytes == 4 * MiB);
  CHECK(s.blocks[0].tensorId == 1);
  CHECK(s.blocks[1].bytes == 16 * MiB);
}

TEST_CASE("a large-pool remainder of at most 1 MiB is not split off", "[allocator]") {
  // should_split (large pool): remainder > kSmallSize. 19.5 MiB rounds to 20,447,232 B, gets a
  // 20 MiB segment; the 0.5 MiB left stays in the block, so allocated counts all 20 MiB.
  const AllocatorResult r = Run({Alloc(1, 20447232)}, 1024 * MiB);
  CHECK(r.peakAllocatedBytes == 20 * MiB);
  CHECK(r.peakRequestedBytes == 20447232);
  // 19 MiB: a 20 MiB segment (2 MiB rounding) with exactly 1 MiB left — not above kSmallSize,
  // so not split either: 20 MiB allocated.
  CHECK(Run({Alloc(1, 19 * MiB)}, 1024 * MiB).peakAllocatedBytes == 20 * MiB);
  // 18 MiB: 2 MiB left → split: 18 MiB allocated of the 20 MiB segment.
  CHECK(Run({Alloc(1, 18 * MiB)}, 1024 * MiB).peakAllocatedBytes == 18 * MiB);
}

TEST_CASE("a freed 20 MiB segment reused by a smaller request with and without max_split_size", "[allocator]") {
  const std::vector<AllocatorEvent> events = {Alloc(1, 20 * MiB), Free(1), Alloc(2, 12 * MiB)};
  // Unlimited max_split_size: the cached 20 MiB block serves 12 MiB and is split (8 MiB > 1 MiB
  // left): still one segment, 20 MiB reserved, 12 MiB allocated.
  const AllocatorResult plain = Run(events, 1024 * MiB);
  CHECK(plain.finalReservedBytes == 20 * MiB);
  CHECK(plain.finalAllocatedBytes == 12 * MiB);
  CHECK(plain.numDeviceAllocs == 1);
  // max_split_size_mb:20 — the 20 MiB block is oversize (≥ max_split_size) and get_free_block
  // refuses it to a request below max_split_size: a new 12 MiB segment, 32 MiB reserved.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.maxSplitSizeMiB = 20;
  const AllocatorResult capped = Run(events, 1024 * MiB, o);
  CHECK(capped.finalReservedBytes == 32 * MiB);
  CHECK(capped.finalAllocatedBytes == 12 * MiB);
  CHECK(capped.numDeviceAllocs == 2);
}

TEST_CASE("max_non_split_rounding lets an oversize request take a slightly larger block", "[allocator]") {
  // max_split_size 20 MiB, a cached 40 MiB block. get_free_block: an oversize request may
  // take it only when 40 < request + max_non_split_rounding (default 20 MiB), unsplit.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.maxSplitSizeMiB = 20;
  // 21 MiB + 20 = 41 > 40: taken whole → allocated 40 MiB, no new segment.
  const AllocatorResult taken = Run({Alloc(1, 40 * MiB), Free(1), Alloc(2, 21 * MiB)}, 1024 * MiB, o);
  CHECK(taken.finalAllocatedBytes == 40 * MiB);
  CHECK(taken.finalReservedBytes == 40 * MiB);
  // 20 MiB + 20 = 40, not above 40: refused → a new 20 MiB segment.
  const AllocatorResult refused = Run({Alloc(1, 40 * MiB), Free(1), Alloc(2, 20 * MiB)}, 1024 * MiB, o);
  CHECK(refused.finalAllocatedBytes == 20 * MiB);
  CHECK(refused.finalReservedBytes == 60 * MiB);
  // max_non_split_rounding_mb:30: 20 + 30 = 50 > 40 → taken.
  o.maxNonSplitRoundingMiB = 30;
  const AllocatorResult wider = Run({Alloc(1, 40 * MiB), Free(1), Alloc(2, 20 * MiB)}, 1024 * MiB, o);
  CHECK(wider.finalReservedBytes == 40 * MiB);
}

TEST_CASE("a failed cudaMalloc releases cached segments and retries", "[allocator]") {
  // Capacity 64 MiB. Five 12 MiB tensors: five 12 MiB segments, 60 MiB reserved. Free A, C, E:
  // 36 MiB cached in three unsplit segments. F 20 MiB: no cached block ≥ 20 MiB; cudaMalloc
  // 60 + 20 > 64 fails; release_cached_blocks frees the three (24 MiB reserved) and the retry
  // (num_alloc_retries 1) succeeds: 44 MiB reserved = B + D + F allocated.
  const AllocatorResult r = Run({Alloc(1, 12 * MiB), Alloc(2, 12 * MiB), Alloc(3, 12 * MiB), Alloc(4, 12 * MiB),
                                 Alloc(5, 12 * MiB), Free(1), Free(3), Free(5), Alloc(6, 20 * MiB)},
                                64 * MiB);
  CHECK_FALSE(r.oom.happened);
  CHECK(r.numAllocRetries == 1);
  CHECK(r.numDeviceFrees == 3);
  CHECK(r.finalReservedBytes == 44 * MiB);
  CHECK(r.finalAllocatedBytes == 44 * MiB);
  CHECK(r.peakReservedBytes == 60 * MiB);
  CHECK(r.peakReservedEvent == 4);
}

TEST_CASE("release_available_cached_blocks frees oversize blocks first", "[allocator]") {
  // max_split_size 20 MiB, capacity 64 MiB. A 24 + B 24 MiB: 48 reserved; free A. C 30 MiB:
  // no cached block fits; 48 + 30 > 64. release_available_cached_blocks frees A (24 < 30, so
  // it reports failure), release_cached_blocks has nothing left, the retry fits: 24 + 30 = 54.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.maxSplitSizeMiB = 20;
  const AllocatorResult r = Run({Alloc(1, 24 * MiB), Alloc(2, 24 * MiB), Free(1), Alloc(3, 30 * MiB)}, 64 * MiB, o);
  CHECK_FALSE(r.oom.happened);
  CHECK(r.numAllocRetries == 1);
  CHECK(r.finalReservedBytes == 54 * MiB);
}

namespace {
// t1, t2 of 30 MiB (two 30 MiB segments, 60 MiB = capacity), both freed; then 16 MiB tensors.
const std::vector<AllocatorEvent> kFragmenting = {Alloc(1, 30 * MiB), Alloc(2, 30 * MiB), Free(1), Free(2),
                                                  Alloc(3, 16 * MiB), Alloc(4, 16 * MiB), Alloc(5, 16 * MiB)};
}  // namespace

TEST_CASE("fragmentation makes an OOM below allocated plus free", "[allocator]") {
  // u1 16 MiB: best fit is the lower 30 MiB block, split → [u1 16 | free 14]; u2 likewise in
  // the second segment. u3 16 MiB: two free 14 MiB blocks, none fits; cudaMalloc 60 + 16 > 60
  // fails; both segments are split so release_cached_blocks frees nothing; the retry fails.
  // 32 MiB allocated + 16 requested = 48 MiB < 60 MiB, yet: OOM, with 28 MiB free in 2 pieces.
  const AllocatorResult r = Run(kFragmenting, 60 * MiB);
  REQUIRE(r.oom.happened);
  CHECK(r.oom.eventIndex == 6);
  CHECK(r.eventsSimulated == 6);
  CHECK(r.oom.requestedBytes == 16 * MiB);
  CHECK(r.oom.roundedBytes == 16 * MiB);
  CHECK(r.oom.allocationBytes == 16 * MiB);
  CHECK(r.oom.reservedBytes == 60 * MiB);
  CHECK(r.oom.allocatedBytes == 32 * MiB);
  CHECK(r.oom.unreservedBytes == 0);
  CHECK(r.oom.cachedFreeBytes == 28 * MiB);
  CHECK(r.oom.cachedFreeBlocks == 2);
  CHECK(r.oom.freeBytes == 28 * MiB);
  CHECK(r.oom.freeFragments == 2);
  CHECK(r.oom.largestFreeBlockBytes == 14 * MiB);
  CHECK(r.numAllocRetries == 1);
  CHECK(r.peakAllocatedBytes == 60 * MiB);
  CHECK(r.peakAllocatedEvent == 1);
  REQUIRE(r.oom.segments.size() == 2);
  CHECK(r.oom.segments[0].blocks.size() == 2);
  CHECK(r.oom.segments[0].blocks[0].tensorId == 3);
  CHECK(r.oom.segments[1].blocks[0].tensorId == 4);
}

TEST_CASE("expandable segments avoid that OOM", "[allocator]") {
  // One virtual segment for the large pool, mapped in 20 MiB pages. t1 30 MiB maps pages 0-1
  // (40 MiB): [t1 30 | free 10]. t2 30 MiB: the free 10 MiB plus unmapped space after it fit;
  // map one more page (60 MiB) → [t1 30 | t2 30]. Freed, they merge into one 60 MiB block.
  // u1, u2, u3 of 16 MiB tile it: [16 | 16 | 16 | free 12]. No OOM, still 60 MiB reserved.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.expandableSegments = true;
  const AllocatorResult r = Run(kFragmenting, 60 * MiB, o);
  CHECK_FALSE(r.oom.happened);
  CHECK(r.reservedBytesAfterEvent[0] == 40 * MiB);
  CHECK(r.peakReservedBytes == 60 * MiB);
  CHECK(r.finalAllocatedBytes == 48 * MiB);
  CHECK(r.numAllocRetries == 0);
  REQUIRE(r.segmentsAtPeakReserved.size() == 1);
  CHECK(r.segmentsAtPeakReserved[0].expandable);
  CHECK(r.segmentsAtPeakReserved[0].totalBytes == 60 * MiB);
}

TEST_CASE("expandable segments unmap whole free pages only when memory must be released", "[allocator]") {
  // Capacity 60 MiB, 20 MiB pages. t1 50 MiB maps 3 pages (60 MiB) → [t1 50 | free 10].
  // Freed: one free 60 MiB block, still 60 MiB reserved (a free does not unmap). t2 and t3 of
  // 30 MiB tile it; t3 is freed again: [t2 30 | free 30], 60 MiB reserved. A 1000 B tensor
  // needs the small pool's first 2 MiB page: 60 + 2 > 60, so release_cached_blocks unmaps the
  // whole free pages of the large pool: of [30, 60) only the page [40, 60) (20 MiB; [30, 40)
  // stays mapped and free). The retry maps 2 MiB: 42 MiB reserved.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.expandableSegments = true;
  const AllocatorResult r =
      Run({Alloc(1, 50 * MiB), Free(1), Alloc(2, 30 * MiB), Alloc(3, 30 * MiB), Free(3), Alloc(4, 1000)}, 60 * MiB, o);
  CHECK_FALSE(r.oom.happened);
  CHECK(r.reservedBytesAfterEvent[1] == 60 * MiB);
  CHECK(r.reservedBytesAfterEvent[4] == 60 * MiB);
  CHECK(r.numAllocRetries == 1);
  CHECK(r.finalReservedBytes == 42 * MiB);
  CHECK(r.finalAllocatedBytes == 30 * MiB + 1024);
}

TEST_CASE("garbage_collection_threshold frees aged cached segments", "[allocator]") {
  // set_per_process_memory_fraction(1.0) on 100 MiB, threshold 0.5 → GC above 50 MiB reserved.
  // A 30 MiB, B 30 MiB (60 reserved); free both. C 40 MiB: get_free_block finds no 40 MiB
  // block; GC runs: 60 > 50, target 10 MiB; both unsplit blocks have age 1 (one get_free_block
  // call since they were cached) ≥ average 1: both released → 0 reserved; then C's segment:
  // 40 MiB. Without GC the cached 60 MiB stay: 100 MiB reserved.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.perProcessMemoryFraction = 1.0;
  o.garbageCollectionThreshold = 0.5;
  const std::vector<AllocatorEvent> events = {Alloc(1, 30 * MiB), Alloc(2, 30 * MiB), Free(1), Free(2),
                                              Alloc(3, 40 * MiB)};
  const AllocatorResult gc = Run(events, 100 * MiB, o);
  CHECK(gc.finalReservedBytes == 40 * MiB);
  CHECK(gc.numDeviceFrees == 2);
  CHECK(gc.numAllocRetries == 0);
  // PyTorch runs the collection only with a memory fraction set.
  o.perProcessMemoryFraction = 0;
  const AllocatorResult off = Run(events, 100 * MiB, o);
  CHECK(off.finalReservedBytes == 100 * MiB);
}

TEST_CASE("a memory fraction caps reserved memory", "[allocator]") {
  // fraction 0.5 of 100 MiB: a 60 MiB request exceeds the 50 MiB allowed → OOM.
  AllocatorOptions o = DefaultAllocatorOptions();
  o.perProcessMemoryFraction = 0.5;
  const AllocatorResult r = Run({Alloc(1, 40 * MiB), Alloc(2, 20 * MiB)}, 100 * MiB, o);
  REQUIRE(r.oom.happened);
  CHECK(r.oom.eventIndex == 1);
  CHECK(r.oom.limitBytes == 50 * MiB);
  CHECK(r.oom.unreservedBytes == 10 * MiB);
}

TEST_CASE("zero-byte tensors and unmatched events", "[allocator]") {
  // CUDACachingAllocator::allocate gives a 0-byte request no block.
  const AllocatorResult r = Run({Alloc(1, 0), Free(1), Free(7), Alloc(2, 100), Alloc(2, 100), Alloc(3, -5)}, 1 * MiB * 8);
  CHECK(r.peakAllocatedBytes == 512);
  CHECK(r.unmatchedFrees == 1);
  CHECK(r.duplicateAllocs == 1);
  CHECK(r.invalidEvents == 1);
}

TEST_CASE("the allocator model stays fast on 10^5 events", "[allocator]") {
  // 50,000 tensors of varied sizes in a stack-like pattern with interleaved frees; checks the
  // invariants reserved ≥ allocated and allocated ≥ requested at every event.
  std::vector<AllocatorEvent> events;
  std::uint64_t x = 12345;
  std::vector<int> live;
  for (int i = 0; i < 50000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::int64_t bytes = static_cast<std::int64_t>((x >> 33) % (64 * MiB)) >> ((x >> 20) % 16);
    events.push_back(Alloc(i, bytes));
    live.push_back(i);
    if ((x >> 40) % 3 != 0 && !live.empty()) {
      const std::size_t k = (x >> 45) % live.size();
      events.push_back(Free(live[k]));
      live[k] = live.back();
      live.pop_back();
    }
  }
  const AllocatorResult r = SimulateCachingAllocator(events, DefaultAllocatorOptions(), 1LL << 50);
  CHECK_FALSE(r.oom.happened);
  CHECK(r.eventsSimulated == static_cast<int>(events.size()));
  bool ordered = true;
  for (std::size_t i = 0; i < r.reservedBytesAfterEvent.size(); ++i) {
    ordered = ordered && r.reservedBytesAfterEvent[i] >= r.allocatedBytesAfterEvent[i];
  }
  CHECK(ordered);
  CHECK(r.peakAllocatedBytes >= r.peakRequestedBytes);
  CHECK(r.peakReservedBytes >= r.peakAllocatedBytes);
}
