// The fast caching allocator model against the one it replaced (tests/allocator_reference.cpp,
// std::set based): every field of every result equal, on random event streams under every
// allocator option and on the device stage's events for every preset. And the one-pass
// SimulateCachingAllocatorAtCapacity against the two SimulateCachingAllocator runs it stands
// for (at capacity, then without a limit when that fails).
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "allocator_reference.hpp"
#include "device/caching_allocator.hpp"
#include "gpumem/device.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

using namespace gpumem;

namespace {

constexpr std::int64_t MiB = 1024 * 1024;
constexpr std::int64_t GiB = 1024 * MiB;

// Counts the first differing field; INFO names it.
struct Differences {
  int count = 0;
  std::string first;
  void Note(bool same, const std::string& what) {
    if (!same && count++ == 0) first = what;
  }
};

void CompareSegments(const std::vector<AllocatorSegmentInfo>& a, const std::vector<AllocatorSegmentInfo>& b,
                     const std::string& what, Differences& d) {
  d.Note(a.size() == b.size(), what + " count");
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const AllocatorSegmentInfo &x = a[i], &y = b[i];
    d.Note(x.address == y.address && x.totalBytes == y.totalBytes && x.allocatedBytes == y.allocatedBytes &&
               x.smallPool == y.smallPool && x.expandable == y.expandable && x.blocks.size() == y.blocks.size(),
           what + " segment " + std::to_string(i));
    for (std::size_t k = 0; k < std::min(x.blocks.size(), y.blocks.size()); ++k) {
      const AllocatorBlockInfo &p = x.blocks[k], &q = y.blocks[k];
      d.Note(p.bytes == q.bytes && p.requestedBytes == q.requestedBytes && p.allocated == q.allocated &&
                 p.tensorId == q.tensorId,
             what + " segment " + std::to_string(i) + " block " + std::to_string(k));
    }
  }
}

Differences Compare(const AllocatorResult& a, const AllocatorResult& b) {
  Differences d;
  d.Note(a.eventsSimulated == b.eventsSimulated, "eventsSimulated");
  d.Note(a.peakAllocatedBytes == b.peakAllocatedBytes, "peakAllocatedBytes");
  d.Note(a.peakAllocatedEvent == b.peakAllocatedEvent, "peakAllocatedEvent");
  d.Note(a.peakReservedBytes == b.peakReservedBytes, "peakReservedBytes");
  d.Note(a.peakReservedEvent == b.peakReservedEvent, "peakReservedEvent");
  d.Note(a.peakRequestedBytes == b.peakRequestedBytes, "peakRequestedBytes");
  d.Note(a.allocatedAtPeakReservedBytes == b.allocatedAtPeakReservedBytes, "allocatedAtPeakReservedBytes");
  d.Note(a.unallocatedAtPeakReservedBytes == b.unallocatedAtPeakReservedBytes, "unallocatedAtPeakReservedBytes");
  d.Note(a.inactiveSplitAtPeakReservedBytes == b.inactiveSplitAtPeakReservedBytes, "inactiveSplitAtPeakReservedBytes");
  d.Note(a.numAllocRetries == b.numAllocRetries, "numAllocRetries");
  d.Note(a.numDeviceAllocs == b.numDeviceAllocs, "numDeviceAllocs");
  d.Note(a.numDeviceFrees == b.numDeviceFrees, "numDeviceFrees");
  d.Note(a.finalReservedBytes == b.finalReservedBytes, "finalReservedBytes");
  d.Note(a.finalAllocatedBytes == b.finalAllocatedBytes, "finalAllocatedBytes");
  d.Note(a.unmatchedFrees == b.unmatchedFrees, "unmatchedFrees");
  d.Note(a.duplicateAllocs == b.duplicateAllocs, "duplicateAllocs");
  d.Note(a.invalidEvents == b.invalidEvents, "invalidEvents");
  d.Note(a.reservedBytesAfterEvent == b.reservedBytesAfterEvent, "reservedBytesAfterEvent");
  d.Note(a.allocatedBytesAfterEvent == b.allocatedBytesAfterEvent, "allocatedBytesAfterEvent");
  CompareSegments(a.segmentsAtPeakReserved, b.segmentsAtPeakReserved, "segmentsAtPeakReserved", d);
  const AllocatorOom &o = a.oom, &p = b.oom;
  d.Note(o.happened == p.happened && o.eventIndex == p.eventIndex && o.tensorId == p.tensorId, "oom event");
  d.Note(o.requestedBytes == p.requestedBytes && o.roundedBytes == p.roundedBytes &&
             o.allocationBytes == p.allocationBytes && o.limitBytes == p.limitBytes,
         "oom request");
  d.Note(o.reservedBytes == p.reservedBytes && o.allocatedBytes == p.allocatedBytes &&
             o.unreservedBytes == p.unreservedBytes,
         "oom reserved");
  d.Note(o.cachedFreeBytes == p.cachedFreeBytes && o.cachedFreeBlocks == p.cachedFreeBlocks &&
             o.largestCachedFreeBlockBytes == p.largestCachedFreeBlockBytes,
         "oom cached");
  d.Note(o.freeBytes == p.freeBytes && o.freeFragments == p.freeFragments &&
             o.largestFreeBlockBytes == p.largestFreeBlockBytes,
         "oom free");
  CompareSegments(o.segments, p.segments, "oom.segments", d);
  return d;
}

// A stream with every kind of request: small-pool, (1, 10) MiB, large, oversize, zero-byte,
// negative, duplicate allocations and frees of tensors that are not live; tensors freed in a
// stack-like or random order, some ids large or negative (the model's sparse id map).
std::vector<AllocatorEvent> RandomEvents(std::uint64_t seed, int tensors) {
  std::vector<AllocatorEvent> events;
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 17;
  };
  std::vector<int> live;
  for (int i = 0; i < tensors; ++i) {
    std::int64_t bytes = 0;
    switch (next() % 8) {
      case 0: bytes = static_cast<std::int64_t>(next() % (64 * 1024)); break;        // small
      case 1: bytes = static_cast<std::int64_t>(next() % MiB) + 1; break;            // ≤ 1 MiB
      case 2: bytes = MiB + static_cast<std::int64_t>(next() % (9 * MiB)); break;    // (1, 10) MiB
      case 3: bytes = static_cast<std::int64_t>(next() % (200 * MiB)); break;        // large
      case 4: bytes = static_cast<std::int64_t>(next() % (4 * 20)) * 512 * 1024; break;  // repeated sizes
      case 5: bytes = 8 * MiB; break;                                                  // one size, many times
      case 6: bytes = (next() % 50 == 0) ? 0 : static_cast<std::int64_t>(next() % (2 * GiB)); break;
      default: bytes = (next() % 200 == 0) ? -5 : static_cast<std::int64_t>(next() % (32 * MiB)); break;
    }
    const int id = next() % 97 == 0 ? (next() % 2 == 0 ? -1000 - i : (1 << 28) + i) : i;
    events.push_back({AllocatorEventKind::Alloc, id, bytes});
    if (next() % 61 == 0) events.push_back({AllocatorEventKind::Alloc, id, 4096});  // duplicate
    if (next() % 53 == 0) events.push_back({AllocatorEventKind::Free, 7 * tensors + i, 0});  // not live
    live.push_back(id);
    const int frees = static_cast<int>(next() % 3);
    for (int f = 0; f < frees && !live.empty(); ++f) {
      const std::size_t k = next() % 2 == 0 ? live.size() - 1 : next() % live.size();
      events.push_back({AllocatorEventKind::Free, live[k], 0});
      live[k] = live.back();
      live.pop_back();
    }
  }
  return events;
}

std::vector<std::pair<std::string, AllocatorOptions>> OptionVariants() {
  std::vector<std::pair<std::string, AllocatorOptions>> variants;
  const AllocatorOptions base = DefaultAllocatorOptions();
  variants.push_back({"default", base});
  AllocatorOptions o = base;
  o.maxSplitSizeMiB = 20;
  variants.push_back({"max_split_size_mb:20", o});
  o = base;
  o.maxSplitSizeMiB = 128;
  o.maxNonSplitRoundingMiB = 64;
  variants.push_back({"max_split_size_mb:128,max_non_split_rounding_mb:64", o});
  o = base;
  o.roundupPower2Divisions.fill(4);
  o.roundupPower2Divisions[3] = 1;
  variants.push_back({"roundup_power2_divisions", o});
  o = base;
  o.expandableSegments = true;
  variants.push_back({"expandable_segments", o});
  o.maxSplitSizeMiB = 40;
  variants.push_back({"expandable_segments,max_split_size_mb:40", o});
  o = base;
  o.perProcessMemoryFraction = 0.7;
  variants.push_back({"fraction 0.7", o});
  o.garbageCollectionThreshold = 0.6;
  variants.push_back({"fraction 0.7,garbage_collection_threshold:0.6", o});
  o.maxSplitSizeMiB = 64;
  variants.push_back({"fraction 0.7,garbage_collection_threshold:0.6,max_split_size_mb:64", o});
  return variants;
}

// The reference always pictures the segments at an OOM; the fast model only when asked.
AllocatorResult Reference(std::span<const AllocatorEvent> events, const AllocatorOptions& options,
                          std::int64_t capacity, const AllocatorRecording& recording = {}) {
  AllocatorResult r = reference::ReferenceSimulateCachingAllocator(events, options, capacity, recording);
  if (!recording.segmentsAtOom) r.oom.segments.clear();
  return r;
}

}  // namespace

TEST_CASE("the free block index keeps std::set's order under every operation", "[allocator][identity]") {
  // FreeBlockIndex against the std::set<(size, ptr)> PyTorch keeps: random inserts and erases
  // over a few sizes with many blocks each (the heaps of equal sizes), over many sizes (the
  // bins' lists), and sizes that fill one bin; after each step the best fit for a random
  // request, the first and last keys, and (now and then) the whole order walked by ForEach,
  // Next and Prev.
  using Index = device::FreeBlockIndex;
  using Tuple = std::tuple<std::int64_t, std::uint64_t, int>;
  for (const int sizes : {1, 3, 40, 5000}) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(sizes) * 7919);
    Index index;
    std::set<Tuple> reference;
    std::vector<Tuple> in;  // the same keys, for picking one at random
    auto sizeOf = [&](std::uint64_t r) -> std::int64_t {
      // 512-byte steps near 1 MiB: 40 sizes share a few bins; 5,000 spread over many.
      return sizes == 1 ? 4096 : (std::int64_t{1} << 20) + 512 * static_cast<std::int64_t>(r % static_cast<std::uint64_t>(sizes));
    };
    int nextBlock = 0;
    int checks = 0;
    for (int step = 0; step < 6000; ++step) {
      const std::uint64_t r = rng();
      if (in.empty() || (r % 100) < (step < 3000 ? 60u : 40u)) {
        const std::int64_t size = sizeOf(rng());
        const std::uint64_t ptr = (rng() % 1000000) * 512;
        if (reference.count({size, ptr, 0}) != 0) continue;
        const int block = nextBlock++;
        index.Insert({size, ptr, block});
        reference.insert({size, ptr, 0});
        in.emplace_back(size, ptr, block);
      } else {
        const std::size_t k = static_cast<std::size_t>(rng() % in.size());
        const auto [size, ptr, block] = in[k];
        switch (r % 3) {
          case 0: index.EraseBlock(block, size, ptr); break;
          case 1: index.Erase(size, ptr); break;
          default: index.EraseAt({block}); break;
        }
        reference.erase({size, ptr, 0});
        in[k] = in.back();
        in.pop_back();
        index.Erase(size, ptr + 1);  // a key not in the index (addresses step by 512): nothing happens
      }
      REQUIRE(index.size() == reference.size());
      const std::int64_t want = sizeOf(rng()) - 256;
      const auto fit = reference.lower_bound({want, 0, 0});
      const Index::Position found = index.LowerBound(want);
      REQUIRE(Index::AtEnd(found) == (fit == reference.end()));
      if (fit != reference.end()) {
        CHECK(index.At(found).size == std::get<0>(*fit));
        CHECK(index.At(found).ptr == std::get<1>(*fit));
      }
      if (!reference.empty()) {
        CHECK(index.At(index.First()).ptr == std::get<1>(*reference.begin()));
        CHECK(index.At(index.Last()).ptr == std::get<1>(*reference.rbegin()));
      }
      if (step % 500 == 0) {
        std::vector<Tuple> walked, forward, backward;
        index.ForEach([&](const Index::Key& key) { walked.emplace_back(key.size, key.ptr, 0); });
        for (Index::Position p = index.First(); !Index::AtEnd(p); p = index.Next(p)) {
          forward.emplace_back(index.At(p).size, index.At(p).ptr, 0);
        }
        for (Index::Position p = index.Last(); !Index::AtEnd(p); p = index.Prev(p)) {
          backward.emplace_back(index.At(p).size, index.At(p).ptr, 0);
        }
        const std::vector<Tuple> expected(reference.begin(), reference.end());
        CHECK(walked == expected);
        CHECK(forward == expected);
        CHECK(std::vector<Tuple>(backward.rbegin(), backward.rend()) == expected);
        ++checks;
      }
    }
    CHECK(checks == 12);
    index.Clear();
    CHECK(index.empty());
    CHECK(Index::AtEnd(index.LowerBound(1)));
  }
}

TEST_CASE("a free block index copied or cleared forgets the blocks it held", "[allocator][identity]") {
  // Copied onto an index that held more blocks (the capacity fork's unlimited model, reused from
  // one estimate to the next), and cleared: a block id the index held before, asked for with the
  // key another block now has there, must find that key as std::set::erase would, not a stale
  // node of its own (FreeBlockIndex keeps its node array's length across a copy and resets only
  // the nodes of its cached blocks). Keys are walked and compared after every change.
  using Index = device::FreeBlockIndex;
  using Tuple = std::tuple<std::int64_t, std::uint64_t>;
  auto keysOf = [](const Index& index) {
    std::vector<Tuple> keys;
    index.ForEach([&](const Index::Key& key) { keys.emplace_back(key.size, key.ptr); });
    return keys;
  };
  auto keyOf = [](int block) -> Tuple {  // four sizes, several blocks of each (waiting lists)
    return {std::int64_t{1} << (20 + block % 4), static_cast<std::uint64_t>(block) * 4096};
  };
  for (const bool copy : {true, false}) {
    Index index;
    for (int block = 0; block < 400; ++block) index.Insert({std::get<0>(keyOf(block)), std::get<1>(keyOf(block)), block});
    REQUIRE(index.size() == 400);
    // The new contents: blocks 0..9 under the keys blocks 300..309 had, copied in from an index
    // of ten blocks or inserted after a Clear.
    Index source;
    if (!copy) index.Clear();
    std::set<Tuple> reference;
    for (int block = 0; block < 10; ++block) {
      const auto [size, ptr] = keyOf(300 + block);
      (copy ? source : index).Insert({size, ptr, block});
      reference.insert({size, ptr});
    }
    if (copy) index = source;
    REQUIRE(index.size() == 10);
    CHECK(keysOf(index) == std::vector<Tuple>(reference.begin(), reference.end()));
    // Blocks 300..309 asked for by their old ids: each erases the key by value.
    for (int block = 300; block < 310; ++block) {
      const auto [size, ptr] = keyOf(block);
      index.EraseBlock(block, size, ptr);
      reference.erase({size, ptr});
      REQUIRE(index.size() == reference.size());
      CHECK(keysOf(index) == std::vector<Tuple>(reference.begin(), reference.end()));
    }
    // Other old ids, with their old keys: none is there.
    for (int block = 10; block < 400; block += 7) {
      const auto [size, ptr] = keyOf(block);
      index.EraseBlock(block, size, ptr);
    }
    CHECK(index.empty());
    // New blocks under old ids and keys are cached and taken again as usual.
    for (int block = 390; block < 400; ++block) index.Insert({std::get<0>(keyOf(block)), std::get<1>(keyOf(block)), block});
    CHECK(index.size() == 10);
    const Index::Position best = index.LowerBound(1);
    REQUIRE_FALSE(Index::AtEnd(best));
    CHECK(index.At(best).size == std::int64_t{1} << 20);
    CHECK(index.At(best).ptr == std::get<1>(keyOf(392)));
  }
}

TEST_CASE("the free block index keeps std::set's order for runs of neighbouring addresses", "[allocator][identity]") {
  // The list of same-sized blocks keeps a gap where its last insert or erase in the middle was
  // (caching_allocator.hpp, Waiting): runs of inserts and erases going up or down from a random
  // place in the list, beside single ones anywhere, at the low and high ends, and emptying the
  // list, checked against std::set after every step: the whole order, the best fit, the first
  // and last keys, and a lookup of a key that is not there; every sixteenth step, the walks by
  // Next and Prev.
  using Index = device::FreeBlockIndex;
  using Tuple = std::tuple<std::int64_t, std::uint64_t, int>;
  constexpr std::int64_t kSize = 8192;  // one size: every block but the lowest waits in the list
  std::mt19937_64 rng(20261129);
  Index index;
  std::set<std::uint64_t> reference;
  std::map<std::uint64_t, int> blockOf;
  int nextBlock = 0;
  auto insert = [&](std::uint64_t ptr) {
    if (reference.count(ptr) != 0) return;
    const int block = nextBlock++;
    index.Insert({kSize, ptr, block});
    reference.insert(ptr);
    blockOf[ptr] = block;
  };
  auto erase = [&](std::uint64_t ptr, std::uint64_t how) {
    if (reference.count(ptr) == 0) return;
    switch (how % 3) {
      case 0: index.EraseBlock(blockOf[ptr], kSize, ptr); break;
      case 1: index.Erase(kSize, ptr); break;
      default: index.EraseAt({blockOf[ptr]}); break;
    }
    reference.erase(ptr);
    blockOf.erase(ptr);
  };
  int steps = 0;
  for (int round = 0; round < 400; ++round) {
    const std::uint64_t r = rng();
    const std::uint64_t at = (rng() % 4000) * 512 * 4;  // room for runs between existing blocks
    const int length = 1 + static_cast<int>(rng() % 40);
    const bool up = (r & 1) != 0;
    for (int k = 0; k < length; ++k) {
      const std::uint64_t ptr = up ? at + 512 * static_cast<std::uint64_t>(k) : at + 512 * static_cast<std::uint64_t>(length - k);
      switch ((r >> 1) % 6) {
        case 0: case 1: case 2: insert(ptr); break;
        case 3: erase(ptr, rng()); break;  // a run of erases (most of them hit nothing)
        case 4: {  // erase the neighbours of a random block
          if (reference.empty()) break;
          auto it = reference.lower_bound(rng() % (4000ull * 2048));
          if (it == reference.end()) --it;
          erase(*it, rng());
          break;
        }
        default:  // the low end, the high end, or anywhere
          if (!reference.empty() && k % 3 == 0) erase(*reference.begin(), rng());
          else if (!reference.empty() && k % 3 == 1) erase(*reference.rbegin(), rng());
          else insert((rng() % 4000) * 512 * 4);
          break;
      }
      ++steps;
      REQUIRE(index.size() == reference.size());
      std::vector<std::uint64_t> walked;
      index.ForEach([&](const Index::Key& key) { walked.push_back(key.ptr); });
      REQUIRE(walked == std::vector<std::uint64_t>(reference.begin(), reference.end()));
      if (!reference.empty()) {
        CHECK(index.At(index.LowerBound(kSize)).ptr == *reference.begin());
        CHECK(index.At(index.First()).ptr == *reference.begin());
        CHECK(index.At(index.Last()).ptr == *reference.rbegin());
        index.Erase(kSize, *reference.begin() + 1);  // not there: nothing happens
        REQUIRE(index.size() == reference.size());
      }
      if (steps % 16 == 0) {  // the walks by Next and Prev (binary searches of the gapped list)
        std::vector<std::uint64_t> forward, backward;
        for (Index::Position p = index.First(); !Index::AtEnd(p); p = index.Next(p)) forward.push_back(index.At(p).ptr);
        for (Index::Position p = index.Last(); !Index::AtEnd(p); p = index.Prev(p)) backward.push_back(index.At(p).ptr);
        REQUIRE(forward == walked);
        REQUIRE(std::vector<std::uint64_t>(backward.rbegin(), backward.rend()) == walked);
      }
    }
    if (round % 100 == 99) {  // empty it from the middle out, then start again
      while (!reference.empty()) {
        auto it = reference.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(reference.size() / 2));
        erase(*it, rng());
        REQUIRE(index.size() == reference.size());
      }
      CHECK(Index::AtEnd(index.LowerBound(1)));
    }
  }
  CHECK(steps > 4000);
}

TEST_CASE("the fast allocator model equals the reference on random streams", "[allocator][identity]") {
  const std::int64_t capacities[] = {48 * MiB, 300 * MiB, 2 * GiB, 12 * GiB, kUnlimitedDeviceBytes};
  int runs = 0, ooms = 0, retried = 0;
  for (const auto& [name, options] : OptionVariants()) {
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      const std::vector<AllocatorEvent> events = RandomEvents(seed, 1500);
      for (const std::int64_t capacity : capacities) {
        const AllocatorResult expected = Reference(events, options, capacity);
        const AllocatorResult got = SimulateCachingAllocator(events, options, capacity);
        const Differences d = Compare(got, expected);
        INFO(name << ", seed " << seed << ", capacity " << capacity << ": first difference " << d.first);
        CHECK(d.count == 0);
        ++runs;
        ooms += expected.oom.happened;
        retried += expected.numAllocRetries > 0;
      }
    }
  }
  // The streams reach every path: failures, cache releases that recovered, clean runs.
  CHECK(runs == 9 * 6 * 5);
  CHECK(ooms > 50);
  CHECK(retried > 20);
}

TEST_CASE("one pass at capacity equals the two runs it stands for on random streams", "[allocator][identity]") {
  const std::int64_t capacities[] = {48 * MiB, 300 * MiB, 2 * GiB, 12 * GiB};
  int forked = 0, failed = 0;
  for (const auto& [name, options] : OptionVariants()) {
    for (std::uint64_t seed = 11; seed <= 15; ++seed) {
      const std::vector<AllocatorEvent> events = RandomEvents(seed, 1200);
      for (const std::int64_t capacity : capacities) {
        for (const bool timeline : {true, false}) {
          const AllocatorRecording recording{.timeline = timeline, .segmentsAtPeak = timeline, .segmentsAtOom = timeline};
          const AllocatorCapacityRun run = SimulateCachingAllocatorAtCapacity(events, options, capacity, recording);
          const AllocatorResult capped = Reference(events, options, capacity, recording);
          INFO(name << ", seed " << seed << ", capacity " << capacity << ", timeline " << timeline);
          const Differences d = Compare(run.atCapacity, capped);
          INFO("at capacity, first difference: " << d.first);
          CHECK(d.count == 0);
          if (capped.oom.happened) {
            ++failed;
            const AllocatorResult unlimited =
                Reference(events, options, kUnlimitedDeviceBytes, recording);
            const Differences u = Compare(run.unlimited, unlimited);
            INFO("unlimited, first difference: " << u.first);
            CHECK(u.count == 0);
            forked += run.sharedEvents > 0;
          } else {
            CHECK(run.unlimited.eventsSimulated == 0);
          }
        }
      }
    }
  }
  CHECK(failed > 50);
  CHECK(forked > 30);  // the unlimited run went on from a shared prefix, not from the start
}

TEST_CASE("events in runs of trace events and allocator events equal the same events in one vector", "[allocator][identity]") {
  // The device stage hands the allocator the trace's events where they are, with the cuBLAS
  // workspaces between them (AllocatorEventRuns): the same stream cut into runs of random
  // lengths, alternately Events and AllocatorEvents, must give every field of the one-vector
  // run, including the fork at the first capacity miss, which falls inside some run.
  const std::int64_t capacities[] = {48 * MiB, 300 * MiB, 2 * GiB};
  int compared = 0, forked = 0;
  for (const auto& [name, options] : OptionVariants()) {
    for (std::uint64_t seed = 21; seed <= 23; ++seed) {
      const std::vector<AllocatorEvent> events = RandomEvents(seed, 1000);
      std::vector<Event> asTrace(events.size());
      for (std::size_t i = 0; i < events.size(); ++i) {
        asTrace[i].bytes = events[i].bytes;
        asTrace[i].tensorId = events[i].tensorId;
        asTrace[i].kind = events[i].kind == AllocatorEventKind::Alloc ? EventKind::Alloc : EventKind::Free;
      }
      std::vector<AllocatorEventRun> runs;
      std::mt19937_64 random(seed);
      for (std::size_t at = 0; at < events.size();) {
        const std::size_t count = std::min<std::size_t>(events.size() - at, random() % 300);  // 0: an empty run
        if (runs.size() % 2 == 0) {
          runs.push_back({.trace = asTrace.data() + at, .count = count});
        } else {
          runs.push_back({.events = events.data() + at, .count = count});
        }
        at += count;
      }
      for (const std::int64_t capacity : capacities) {
        for (const bool timeline : {true, false}) {
          const AllocatorRecording recording{.timeline = timeline, .segmentsAtPeak = timeline, .segmentsAtOom = timeline};
          const AllocatorCapacityRun one = SimulateCachingAllocatorAtCapacity(events, options, capacity, recording);
          const AllocatorCapacityRun cut =
              SimulateCachingAllocatorAtCapacity(AllocatorEventRuns(runs), options, capacity, recording);
          INFO(name << ", seed " << seed << ", capacity " << capacity << ", timeline " << timeline);
          const Differences d = Compare(cut.atCapacity, one.atCapacity);
          INFO("at capacity, first difference: " << d.first);
          CHECK(d.count == 0);
          const Differences u = Compare(cut.unlimited, one.unlimited);
          INFO("unlimited, first difference: " << u.first);
          CHECK(u.count == 0);
          CHECK(cut.sharedEvents == one.sharedEvents);
          forked += one.sharedEvents > 0;
          ++compared;
        }
      }
    }
  }
  CHECK(compared == 9 * 3 * 3 * 2);
  CHECK(forked > 10);
}

TEST_CASE("one pass at capacity equals the two runs on every preset's device events", "[allocator][identity]") {
  // Every preset at two sizes, on GPUs from 8 to 80 GiB, with and without expandable segments
  // and max_split_size: the events ComputeDeviceEstimate hands the allocator.
  int cases = 0, failed = 0, forked = 0;
  for (const Preset& preset : Presets()) {
    for (const std::int64_t tokens : {std::int64_t{512}, std::int64_t{4096}}) {
      Setup s = DefaultSetup();
      s.model.kind = ModelKind::Transformer;
      s.model.architecture = preset.architecture;
      s.training.batchSize = 1;
      s.training.sequenceLength = tokens;
      s.training.precision = Precision::BF16Mixed;
      s.training.attention = AttentionImplementation::SDPA;
      if (!Validate(s).empty()) continue;
      const Inventory inventory = BuildInventory(s);
      const Trace trace = BuildTrace(s, inventory, false);
      for (const double gib : {8.0, 24.0, 80.0}) {
        for (const int variant : {0, 1, 2}) {
          s.runtime.allocator.expandableSegments = variant == 1;
          s.runtime.allocator.maxSplitSizeMiB = variant == 2 ? 256 : 0;
          const DeviceAllocatorInput input = DeviceAllocatorInputOf(s, trace, static_cast<std::int64_t>(gib * GiB));
          const AllocatorRecording recording{.timeline = true, .segmentsAtPeak = false, .segmentsAtOom = false};
          const AllocatorCapacityRun run =
              SimulateCachingAllocatorAtCapacity(input.events, input.options, input.limitBytes, recording);
          const AllocatorResult capped =
              Reference(input.events, input.options, input.limitBytes, recording);
          INFO(preset.id << ", " << tokens << " tokens, " << gib << " GiB, variant " << variant);
          const Differences d = Compare(run.atCapacity, capped);
          INFO("at capacity, first difference: " << d.first);
          CHECK(d.count == 0);
          if (capped.oom.happened) {
            ++failed;
            forked += run.sharedEvents > 0;
            const AllocatorResult unlimited = Reference(
                input.events, input.options, kUnlimitedDeviceBytes, recording);
            const Differences u = Compare(run.unlimited, unlimited);
            INFO("unlimited, first difference: " << u.first);
            CHECK(u.count == 0);
          }
          ++cases;
        }
      }
    }
  }
  CHECK(cases > 100);
  CHECK(failed > 20);
  CHECK(forked > 10);
}

TEST_CASE("the device figure and its timeline come from the right run", "[allocator][identity][device]") {
  // Estimate::device against the reference runs of the same events: the verdict and the OOM
  // from the run at capacity, the figures from the unlimited run when that failed, and the
  // reserved bytes of every timeline point from the allocator event of its trace event.
  int failed = 0, points = 0;
  for (const Preset& preset : Presets()) {
    Setup s = DefaultSetup();
    s.model.kind = ModelKind::Transformer;
    s.model.architecture = preset.architecture;
    s.training.sequenceLength = 2048;
    s.training.precision = Precision::BF16Mixed;
    s.gpu.memoryGiB = 24;
    if (!Validate(s).empty()) continue;
    const EstimateResult r = EstimateMemory(s);
    REQUIRE(r.ok());
    const DeviceEstimate& d = r.estimate.device;
    const Inventory inventory = BuildInventory(s);
    const Trace trace = BuildTrace(s, inventory, false);
    const DeviceAllocatorInput input = DeviceAllocatorInputOf(s, trace, r.estimate.gpuCapacityBytes);
    const AllocatorRecording recording{.timeline = true, .segmentsAtPeak = false, .segmentsAtOom = false};
    const AllocatorResult capped = Reference(input.events, input.options, input.limitBytes, recording);
    const AllocatorResult figures =
        capped.oom.happened ? Reference(input.events, input.options, kUnlimitedDeviceBytes, recording) : capped;
    INFO(preset.id);
    CHECK(d.fits == !capped.oom.happened);
    CHECK(d.numAllocRetries == capped.numAllocRetries);
    CHECK(d.oom.freeBytes == capped.oom.freeBytes);
    CHECK(d.oom.largestFreeBlockBytes == capped.oom.largestFreeBlockBytes);
    CHECK(d.oom.freeFragments == capped.oom.freeFragments);
    CHECK(d.oom.requestedBytes == capped.oom.requestedBytes);
    CHECK(d.peakReservedBytes == figures.peakReservedBytes);
    CHECK(d.peakAllocatedBytes == figures.peakAllocatedBytes);
    CHECK(d.fragmentationBytes == figures.peakReservedBytes - figures.peakAllocatedBytes);
    failed += capped.oom.happened;
    // Trace event i → its allocator event: the workspaces are the ids past the trace's.
    int maxTraceId = -1;
    for (const Event& e : trace.events) maxTraceId = std::max(maxTraceId, e.tensorId);
    std::vector<std::size_t> allocatorIndexOf;
    for (std::size_t a = 0; a < input.events.size(); ++a) {
      if (input.events[a].tensorId <= maxTraceId) allocatorIndexOf.push_back(a);
    }
    REQUIRE(allocatorIndexOf.size() == trace.events.size());
    bool same = true;
    for (const TimelinePoint& p : r.estimate.timeline) {
      same = same && p.reservedBytes == figures.reservedBytesAfterEvent[allocatorIndexOf[p.index]];
      ++points;
    }
    CHECK(same);
  }
  CHECK(failed > 5);
  CHECK(points > 100000);
}
