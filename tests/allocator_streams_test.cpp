// Streams in the caching allocator model: hand-worked scenarios, each naming the rule of
// c10/cuda/CUDACachingAllocator.cpp (PyTorch main) it checks.
// - BlockComparatorSize orders a pool by stream first, and get_free_block returns false when
//   lower_bound lands on a block of another stream: a cached block serves its own stream only.
// - alloc_block makes `new Block(p.device(), p.stream(), size, p.pool, ptr)`: a segment, and
//   every block split from it (alloc_found_block) or merged into it (try_merge_blocks), stays
//   the stream's; free_block returns a block to block->pool under block->stream.
// - release_cached_blocks → release_blocks walks the whole pool: every stream's whole free
//   segments are cudaFree'd by malloc's last retry.
// - find_expandable_block only grows a segment of the request's stream.
#include <catch2/catch.hpp>

#include <vector>

#include "gpumem/device.hpp"

using namespace gpumem;

namespace {

constexpr std::int64_t MiB = 1024 * 1024;

AllocatorEvent Alloc(int id, std::int64_t bytes, std::uint8_t stream = 0) {
  return {AllocatorEventKind::Alloc, id, bytes, stream};
}
AllocatorEvent Free(int id) { return {AllocatorEventKind::Free, id, 0}; }

AllocatorResult Run(const std::vector<AllocatorEvent>& events, std::int64_t capacity,
                    AllocatorOptions options = DefaultAllocatorOptions()) {
  return SimulateCachingAllocator(events, options, capacity);
}

// The same events on the default stream only.
std::vector<AllocatorEvent> OneStream(std::vector<AllocatorEvent> events) {
  for (AllocatorEvent& e : events) e.stream = 0;
  return events;
}

}  // namespace

TEST_CASE("a block freed on a side stream is not reused by a default-stream request", "[allocator][streams]") {
  // 30 MiB (≥ kMinLargeAlloc) rounds to a 30 MiB segment. Freed, it is cached under stream 1;
  // the stream-0 request of the same size finds nothing of its stream and cudaMallocs another
  // 30 MiB (reserved 60 MiB). The second stream-1 request reuses stream 1's block.
  const std::vector<AllocatorEvent> events = {Alloc(1, 30 * MiB, 1), Free(1), Alloc(2, 30 * MiB, 0),
                                              Alloc(3, 30 * MiB, 1)};
  const AllocatorResult r = Run(events, 1024 * MiB);
  CHECK(r.peakReservedBytes == 60 * MiB);
  CHECK(r.numDeviceAllocs == 2);
  CHECK(r.finalAllocatedBytes == 60 * MiB);
  // With id 2 freed before id 3: one stream serves all three from one 30 MiB segment; two
  // streams still hold one segment each (60 MiB).
  const std::vector<AllocatorEvent> reuse = {Alloc(1, 30 * MiB, 1), Free(1), Alloc(2, 30 * MiB, 0), Free(2),
                                             Alloc(3, 30 * MiB, 1)};
  CHECK(Run(reuse, 1024 * MiB).peakReservedBytes == 60 * MiB);
  CHECK(Run(OneStream(reuse), 1024 * MiB).peakReservedBytes == 30 * MiB);
  // Small pool too: a 1 KiB stream-2 request cannot take space in stream 0's 2 MiB segment.
  const std::vector<AllocatorEvent> small = {Alloc(1, 1024, 0), Alloc(2, 1024, 2)};
  CHECK(Run(small, 1024 * MiB).peakReservedBytes == 4 * MiB);
  CHECK(Run(OneStream(small), 1024 * MiB).peakReservedBytes == 2 * MiB);
}

TEST_CASE("the OOM retry releases every stream's free segments", "[allocator][streams]") {
  // Capacity 100 MiB. Streams 1 and 2 each cache one whole 40 MiB segment (reserved 80 MiB).
  // The stream-0 request of 50 MiB finds no block of its stream; cudaMalloc(50 MiB) would pass
  // 100 MiB; release_available_cached_blocks does nothing (no max_split_size); the retry after
  // release_cached_blocks frees both side streams' segments (2 cudaFrees) and gets its 50 MiB.
  const std::vector<AllocatorEvent> events = {Alloc(1, 40 * MiB, 1), Free(1), Alloc(2, 40 * MiB, 2), Free(2),
                                              Alloc(3, 50 * MiB, 0)};
  const AllocatorResult r = Run(events, 100 * MiB);
  CHECK_FALSE(r.oom.happened);
  CHECK(r.numDeviceFrees == 2);
  CHECK(r.numAllocRetries == 1);
  CHECK(r.peakReservedBytes == 80 * MiB);
  CHECK(r.finalReservedBytes == 50 * MiB);
}

TEST_CASE("the OOM message counts every stream's cached free bytes", "[allocator][streams]") {
  // A 2 MiB request on stream 1 takes a 20 MiB segment (kLargeBuffer) and splits off 18 MiB,
  // cached under stream 1 and not releasable (split). The stream-0 request of 85 MiB needs an
  // 86 MiB segment (2 MiB rounding): 20 + 86 > 100 MiB, nothing whole to release → OOM.
  // Free at the failure: 80 MiB never reserved + stream 1's 18 MiB cached = 98 MiB.
  const std::vector<AllocatorEvent> events = {Alloc(1, 2 * MiB, 1), Alloc(2, 85 * MiB, 0)};
  const AllocatorResult r = Run(events, 100 * MiB);
  REQUIRE(r.oom.happened);
  CHECK(r.oom.reservedBytes == 20 * MiB);
  CHECK(r.oom.cachedFreeBytes == 18 * MiB);
  CHECK(r.oom.cachedFreeBlocks == 1);
  CHECK(r.oom.freeBytes == 98 * MiB);
  CHECK(r.oom.largestCachedFreeBlockBytes == 18 * MiB);
}

TEST_CASE("split blocks merge within their segment and stay their stream's", "[allocator][streams]") {
  // Two 2 MiB requests on stream 1 split one 20 MiB segment (2 + 2 + 16 MiB). Freed, they merge
  // back into one whole 20 MiB block (try_merge_blocks: neighbours of one segment), cached under
  // stream 1: a 20 MiB stream-1 request reuses it, a 20 MiB stream-0 request cannot.
  const std::vector<AllocatorEvent> events = {Alloc(1, 2 * MiB, 1), Alloc(2, 2 * MiB, 1), Free(1), Free(2),
                                              Alloc(3, 20 * MiB, 1), Alloc(4, 20 * MiB, 0)};
  AllocatorRecording recording;
  const AllocatorResult r = SimulateCachingAllocator(events, DefaultAllocatorOptions(), 1024 * MiB, recording);
  CHECK(r.peakReservedBytes == 40 * MiB);
  CHECK(r.numDeviceAllocs == 2);
  REQUIRE(r.segmentsAtPeakReserved.size() == 2);
  // Address order: stream 1's segment was made first.
  CHECK(r.segmentsAtPeakReserved[0].stream == 1);
  CHECK(r.segmentsAtPeakReserved[0].blocks.size() == 1);  // merged whole, then reused whole
  CHECK(r.segmentsAtPeakReserved[0].allocatedBytes == 20 * MiB);
  CHECK(r.segmentsAtPeakReserved[1].stream == 0);
  CHECK(r.segmentsAtPeakReserved[1].allocatedBytes == 20 * MiB);
  // With stream 1's requests done before stream 0's comes, one stream would hand the merged
  // 20 MiB block over (20 MiB reserved); two streams keep two segments (40 MiB).
  const std::vector<AllocatorEvent> handOver = {Alloc(1, 2 * MiB, 1), Alloc(2, 2 * MiB, 1), Free(1), Free(2),
                                                Alloc(4, 20 * MiB, 0)};
  CHECK(Run(handOver, 1024 * MiB).peakReservedBytes == 40 * MiB);
  CHECK(Run(OneStream(handOver), 1024 * MiB).peakReservedBytes == 20 * MiB);
}

TEST_CASE("expandable segments: one per pool and stream", "[allocator][streams]") {
  // 20 MiB pages in the large pool. One stream: 30 MiB maps 2 pages (40 MiB), the second 30 MiB
  // grows the same segment by one page from the 10 MiB free tail (60 MiB). Two streams: each
  // has its own segment, 2 pages each (80 MiB).
  AllocatorOptions o = DefaultAllocatorOptions();
  o.expandableSegments = true;
  const std::vector<AllocatorEvent> events = {Alloc(1, 30 * MiB, 0), Alloc(2, 30 * MiB, 1)};
  const AllocatorResult two = Run(events, 1024 * MiB, o);
  CHECK(two.peakReservedBytes == 80 * MiB);
  REQUIRE(two.segmentsAtPeakReserved.size() == 2);
  CHECK(two.segmentsAtPeakReserved[0].stream == 0);
  CHECK(two.segmentsAtPeakReserved[1].stream == 1);
  CHECK(two.segmentsAtPeakReserved[1].expandable);
  CHECK(Run(OneStream(events), 1024 * MiB, o).peakReservedBytes == 60 * MiB);
}

TEST_CASE("streams at capacity: the fork without a limit keeps the side pools", "[allocator][streams]") {
  // SimulateCachingAllocatorAtCapacity copies the model at its first capacity miss: the copy
  // must carry stream 1's cached block. Capacity 50 MiB: stream 1 caches 30 MiB; stream 0's
  // 30 MiB cannot take it, cudaMalloc is refused (60 > 50), the retry frees stream 1's segment
  // and succeeds (30 MiB); stream 1's next 30 MiB then fails (60 > 50, nothing to release).
  // Without a limit stream 1's block is still cached when id 3 comes: 60 MiB, two cudaMallocs.
  const std::vector<AllocatorEvent> events = {Alloc(1, 30 * MiB, 1), Free(1), Alloc(2, 30 * MiB, 0),
                                              Alloc(3, 30 * MiB, 1)};
  const AllocatorCapacityRun run = SimulateCachingAllocatorAtCapacity(events, DefaultAllocatorOptions(), 50 * MiB);
  REQUIRE(run.atCapacity.oom.happened);
  CHECK(run.atCapacity.oom.eventIndex == 3);
  CHECK(run.unlimited.peakReservedBytes == 60 * MiB);
  CHECK(run.unlimited.numDeviceAllocs == 2);
}
