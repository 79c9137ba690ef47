// The caching allocator model as it was before the flat rewrite (std::set free lists, an
// unordered_map of live tensors, commit fd1e34e of core/src/device/caching_allocator.cpp): kept
// verbatim as a slow, plainly readable oracle. tests/allocator_identity_test.cpp checks that the
// fast model gives the same result, field by field, on random event streams and on the traces
// of every preset. Rules and their PyTorch sources: core/src/device/caching_allocator.cpp.
#include "allocator_reference.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <set>
#include <unordered_map>

namespace gpumem::reference {

constexpr std::int64_t kMiB = 1 << 20;
constexpr std::int64_t kMinBlockSize = 512;       // all sizes are rounded to at least 512 B
constexpr std::int64_t kSmallSize = 1 * kMiB;     // largest "small" request
constexpr std::int64_t kSmallBuffer = 2 * kMiB;   // small requests are packed in 2 MiB segments
constexpr std::int64_t kMinLargeAlloc = 10 * kMiB;  // requests in (1, 10) MiB take a kLargeBuffer
constexpr std::int64_t kRoundLarge = 2 * kMiB;    // larger requests round up to 2 MiB
constexpr std::int64_t kLargeBuffer = 20 * kMiB;  // "large" requests may be packed in 20 MiB

class CachingAllocatorModel {
 public:
  CachingAllocatorModel(const AllocatorOptions& options, std::int64_t capacityBytes);

  // DeviceCachingAllocator::malloc. False on OOM (then LastOom() describes it).
  bool Malloc(int tensorId, std::int64_t requestedBytes);
  // DeviceCachingAllocator::free. False when the tensor is not live.
  bool Free(int tensorId);
  // torch.cuda.empty_cache: release_cached_blocks.
  void EmptyCache() { ReleaseCachedBlocks(); }

  std::int64_t reserved() const { return reserved_; }
  std::int64_t allocated() const { return allocated_; }
  std::int64_t requested() const { return requested_; }
  std::int64_t inactiveSplit() const { return inactiveSplit_; }
  std::int64_t allocRetries() const { return numAllocRetries_; }
  std::int64_t deviceAllocs() const { return numDeviceAllocs_; }
  std::int64_t deviceFrees() const { return numDeviceFrees_; }
  bool IsLive(int tensorId) const { return live_.count(tensorId) != 0; }

  std::vector<AllocatorSegmentInfo> Snapshot() const;  // DeviceCachingAllocator::snapshot
  AllocatorOom DescribeOom(int tensorId, std::int64_t requestedBytes) const;

 private:
  static constexpr int kNone = -1;

  struct Block {
    std::uint64_t ptr = 0;
    std::int64_t size = 0;
    std::int64_t requestedSize = 0;
    int prev = kNone;
    int next = kNone;
    int segment = kNone;  // the expandable segment, or kNone for a cudaMalloc segment
    int tensorId = -1;
    bool small = false;
    bool allocated = false;
    bool mapped = true;
    std::int64_t gcCountBase = 0;
  };
  struct SizeKey {  // BlockComparatorSize on one stream: size, then address
    std::int64_t size;
    std::uint64_t ptr;
    int block;
    bool operator<(const SizeKey& o) const { return size != o.size ? size < o.size : ptr < o.ptr; }
  };
  struct AddressKey {  // BlockComparatorAddress on one stream
    std::uint64_t ptr;
    int block;
    bool operator<(const AddressKey& o) const { return ptr < o.ptr; }
  };
  struct BlockPool {
    std::set<SizeKey> blocks;
    std::set<AddressKey> unmapped;
    bool isSmall = false;
    std::int64_t getFreeBlocksCallCount = 0;
  };
  struct ExpandableSegment {
    std::uint64_t base = 0;
    std::int64_t pageBytes = 0;  // kSmallBuffer for the small pool, kLargeBuffer for the large
  };
  struct AllocParams {
    std::int64_t size = 0;       // rounded request
    std::int64_t allocSize = 0;  // get_allocation_size
    BlockPool* pool = nullptr;
    int block = kNone;
  };

  int NewBlock();
  void DeleteBlock(int b);
  bool IsSplit(int b) const { return blocks_[b].prev != kNone || blocks_[b].next != kNone; }
  bool Expandable(int b) const { return blocks_[b].segment != kNone; }
  BlockPool& PoolOf(int b) { return blocks_[b].small ? small_ : large_; }
  void InsertIntoBlocks(BlockPool& pool, int b);
  void EraseFromBlocks(BlockPool& pool, int b);

  std::int64_t RoundSize(std::int64_t size) const;
  bool ShouldSplit(int b, std::int64_t size) const;
  bool GetFreeBlock(AllocParams& p);
  bool AllocBlock(AllocParams& p, bool isRetry);
  bool ReleaseAvailableCachedBlocks(const AllocParams& p);
  bool ReleaseCachedBlocks();
  void ReleaseBlocks(BlockPool& pool);
  void ReleaseBlock(int b);
  void GarbageCollectCachedBlocks();
  int AllocFoundBlock(const AllocParams& p, std::int64_t origSize, bool splitRemainder, int tensorId);
  void FreeBlock(int b);
  std::int64_t TryMergeBlocks(int dst, int src, BlockPool& pool);
  // Expandable segments.
  int FindExpandableBlock(BlockPool& pool, std::int64_t size);
  bool MapBlock(int b, std::int64_t size);
  int TryAllocateExpandableBlock(BlockPool& pool, std::int64_t size);
  void UnmapBlock(int b);

  AllocatorOptions options_;
  std::int64_t capacity_;
  std::int64_t maxSplitSize_;        // INT64_MAX when unlimited
  std::int64_t maxNonSplitRounding_;
  bool setFraction_;
  std::int64_t allowedMemoryMaximum_;
  bool gcEnabled_;

  std::vector<Block> blocks_;
  std::vector<int> freeSlots_;
  BlockPool large_;
  BlockPool small_;
  std::vector<ExpandableSegment> segments_;
  std::unordered_map<int, int> live_;  // tensor id → allocated block (kNone for 0-byte tensors)
  std::uint64_t nextAddress_;

  std::int64_t reserved_ = 0;  // total_allocated_memory / reserved_bytes
  std::int64_t allocated_ = 0;
  std::int64_t requested_ = 0;
  std::int64_t inactiveSplit_ = 0;
  std::int64_t numAllocRetries_ = 0;
  std::int64_t numDeviceAllocs_ = 0;
  std::int64_t numDeviceFrees_ = 0;
  // The failed request of the last Malloc that returned false.
  std::int64_t lastOomRounded_ = 0;
  std::int64_t lastOomAllocSize_ = 0;
};


namespace {

constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();
// Simulated virtual addresses start here; cudaMalloc segments take increasing addresses
// (real addresses are the driver's; they only break ties between equal-sized free blocks).
constexpr std::uint64_t kFirstAddress = std::uint64_t{1} << 40;

// AllocatorConfig::roundup_power2_divisions(size): intervals from 1 MiB to 64 GiB.
int DivisionsFor(const AllocatorOptions& options, std::int64_t size) {
  const int logSize = 63 - std::countl_zero(static_cast<std::uint64_t>(size));
  const int index = std::clamp(logSize - 20, 0, kRoundupPower2Intervals - 1);
  return options.roundupPower2Divisions[index];
}

// DeviceCachingAllocator::roundup_power2_next_division.
std::int64_t RoundupPower2NextDivision(std::int64_t size, std::int64_t divisions) {
  const auto usize = static_cast<std::uint64_t>(size);
  if (std::has_single_bit(usize)) return size;
  const std::uint64_t floor = std::bit_floor(usize);
  const std::uint64_t step = floor >> (63 - std::countl_zero(static_cast<std::uint64_t>(divisions)));
  if (step == 0) return static_cast<std::int64_t>(floor << 1);
  const std::uint64_t roundedFloor = usize & ~(step - 1);
  return static_cast<std::int64_t>(roundedFloor == usize ? usize : roundedFloor + step);
}

std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ---------------------------------------------------------------------------------------------

CachingAllocatorModel::CachingAllocatorModel(const AllocatorOptions& options, std::int64_t capacityBytes)
    : options_(options),
      capacity_(std::max<std::int64_t>(capacityBytes, 0)),
      maxSplitSize_(options.maxSplitSizeMiB > 0 ? options.maxSplitSizeMiB * kMiB : kUnlimited),
      maxNonSplitRounding_(options.maxNonSplitRoundingMiB * kMiB),
      setFraction_(options.perProcessMemoryFraction > 0),
      // DeviceCachingAllocator::setMemoryFraction: fraction × total memory.
      allowedMemoryMaximum_(static_cast<std::int64_t>(options.perProcessMemoryFraction *
                                                      static_cast<double>(capacity_))),
      gcEnabled_(setFraction_ && options.garbageCollectionThreshold > 0),
      nextAddress_(kFirstAddress) {
  small_.isSmall = true;
  large_.isSmall = false;
}

int CachingAllocatorModel::NewBlock() {
  if (!freeSlots_.empty()) {
    const int b = freeSlots_.back();
    freeSlots_.pop_back();
    blocks_[b] = Block{};
    return b;
  }
  blocks_.emplace_back();
  return static_cast<int>(blocks_.size()) - 1;
}

void CachingAllocatorModel::DeleteBlock(int b) {
  blocks_[b].size = 0;
  freeSlots_.push_back(b);
}

// BlockPool::insert_into_blocks: stamps the block with the pool's get_free_block call count,
// the clock garbage_collect_cached_blocks measures ages with.
void CachingAllocatorModel::InsertIntoBlocks(BlockPool& pool, int b) {
  blocks_[b].gcCountBase = pool.getFreeBlocksCallCount;
  pool.blocks.insert({blocks_[b].size, blocks_[b].ptr, b});
}

void CachingAllocatorModel::EraseFromBlocks(BlockPool& pool, int b) {
  pool.blocks.erase({blocks_[b].size, blocks_[b].ptr, b});
}

// DeviceCachingAllocator::round_size: below 512 B → 512; with roundup_power2_divisions set for
// the request's interval (and the request above 512 × divisions) → the next of `divisions`
// equal steps between two powers of two; otherwise the next multiple of 512.
std::int64_t CachingAllocatorModel::RoundSize(std::int64_t size) const {
  return RoundAllocationSize(size, options_);
}

// DeviceCachingAllocator::should_split: the small pool (and every expandable segment) splits
// off any remainder of at least 512 B; the large pool only a remainder above 1 MiB, and never
// for a request at or above max_split_size.
bool CachingAllocatorModel::ShouldSplit(int b, std::int64_t size) const {
  const std::int64_t remaining = blocks_[b].size - size;
  if (blocks_[b].small || options_.expandableSegments) return remaining >= kMinBlockSize;
  return size < maxSplitSize_ && remaining > kSmallSize;
}

// DeviceCachingAllocator::get_free_block: the best fit — the smallest cached block at least as
// large as the request, lowest address first among equals — with the oversize rules.
bool CachingAllocatorModel::GetFreeBlock(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (gcEnabled_) ++pool.getFreeBlocksCallCount;  // ages only tick while GC is enabled
  auto it = pool.blocks.lower_bound({p.size, 0, kNone});
  if (it == pool.blocks.end()) return false;
  if (Expandable(it->block)) {
    // With expandable segments, a block followed by unmapped space counts as the size it can
    // grow to: walk on to the next candidate while it can grow to less.
    auto expandableSize = [&](int b) {
      const Block& blk = blocks_[b];
      return blk.size + (blk.next != kNone && !blocks_[blk.next].mapped ? blocks_[blk.next].size : 0);
    };
    auto next = std::next(it);
    while (Expandable(it->block) && next != pool.blocks.end() &&
           expandableSize(next->block) < expandableSize(it->block)) {
      it = next++;
    }
  }
  // Do not return an oversized block for a request below max_split_size.
  if (p.size < maxSplitSize_ && it->size >= maxSplitSize_) return false;
  // An oversize request may take a cached block at most max_non_split_rounding larger.
  if (p.size >= maxSplitSize_ && it->size >= p.size + maxNonSplitRounding_) return false;
  p.block = it->block;
  pool.blocks.erase(it);
  return true;
}

// DeviceCachingAllocator::alloc_block: a new segment of get_allocation_size bytes by
// cudaMalloc, which fails when the device has no room (here: capacity − reserved), or, with
// expandable segments, more pages mapped into the pool's segment.
bool CachingAllocatorModel::AllocBlock(AllocParams& p, bool isRetry) {
  if (isRetry) ++numAllocRetries_;
  if (setFraction_ && reserved_ + p.allocSize > allowedMemoryMaximum_) return false;
  if (options_.expandableSegments) {
    p.block = TryAllocateExpandableBlock(*p.pool, p.size);
    return p.block != kNone;
  }
  if (reserved_ + p.allocSize > capacity_) return false;  // cudaMalloc: cudaErrorMemoryAllocation
  const int b = NewBlock();
  Block& blk = blocks_[b];
  blk.ptr = nextAddress_;
  blk.size = p.allocSize;
  blk.small = p.pool->isSmall;
  nextAddress_ += static_cast<std::uint64_t>(p.allocSize);
  reserved_ += p.allocSize;
  ++numDeviceAllocs_;
  p.block = b;
  return true;
}

// DeviceCachingAllocator::release_available_cached_blocks: with max_split_size set, free the
// smallest unsplit oversize block that covers the request, or else oversize blocks from the
// largest down until enough bytes were released.
bool CachingAllocatorModel::ReleaseAvailableCachedBlocks(const AllocParams& p) {
  if (maxSplitSize_ == kUnlimited) return false;
  BlockPool& pool = *p.pool;
  const std::int64_t keySize = std::max(p.size, maxSplitSize_);
  auto it = pool.blocks.lower_bound({keySize, 0, kNone});
  if (it == pool.blocks.end()) {
    if (it == pool.blocks.begin()) return false;
    std::int64_t totalReleased = 0;
    --it;  // the largest block
    while (totalReleased < keySize && it->size >= maxSplitSize_) {
      const int b = it->block;
      const bool first = it == pool.blocks.begin();
      if (!first) --it;
      // PyTorch would assert on an expandable block here (release_block); they are skipped.
      if (!Expandable(b)) {
        totalReleased += blocks_[b].size;
        ReleaseBlock(b);
      }
      if (first) break;
    }
    return totalReleased >= keySize;
  }
  if (Expandable(it->block)) return false;
  ReleaseBlock(it->block);
  return true;
}

// DeviceCachingAllocator::release_cached_blocks → release_blocks on both pools: cudaFree every
// cached block that is a whole segment (not split); with expandable segments, unmap every
// whole free page and drop a segment left with nothing mapped.
bool CachingAllocatorModel::ReleaseCachedBlocks() {
  ReleaseBlocks(large_);
  ReleaseBlocks(small_);
  return true;
}

void CachingAllocatorModel::ReleaseBlocks(BlockPool& pool) {
  std::vector<int> toRelease;
  std::vector<int> toUnmap;
  for (const SizeKey& key : pool.blocks) {
    if (Expandable(key.block)) {
      toUnmap.push_back(key.block);
    } else if (!IsSplit(key.block)) {
      toRelease.push_back(key.block);
    }
  }
  for (int b : toRelease) ReleaseBlock(b);
  for (int b : toUnmap) {
    UnmapBlock(b);
    // release_expandable_segment: the whole virtual range is unmapped again.
    if (!blocks_[b].mapped && !IsSplit(b)) {
      pool.unmapped.erase({blocks_[b].ptr, b});
      DeleteBlock(b);
    }
  }
}

// DeviceCachingAllocator::release_block: cudaFree of a whole cached segment.
void CachingAllocatorModel::ReleaseBlock(int b) {
  BlockPool& pool = PoolOf(b);
  EraseFromBlocks(pool, b);
  reserved_ -= blocks_[b].size;
  ++numDeviceFrees_;
  DeleteBlock(b);
}

// DeviceCachingAllocator::garbage_collect_cached_blocks: when reserved exceeds
// garbage_collection_threshold × the allowed maximum, free unsplit large-pool cached blocks
// whose age (get_free_block calls since they were cached) is at least the average, repeating
// until the excess is reclaimed or nothing more can be freed.
void CachingAllocatorModel::GarbageCollectCachedBlocks() {
  const auto gcThreshold = static_cast<std::int64_t>(options_.garbageCollectionThreshold *
                                                      static_cast<double>(allowedMemoryMaximum_));
  if (reserved_ <= gcThreshold) return;
  const std::int64_t targetSize = reserved_ - gcThreshold;
  std::int64_t reclaimed = 0;
  std::int64_t totalAge = 0;
  int freeable = 0;
  auto age = [&](int b) { return large_.getFreeBlocksCallCount - blocks_[b].gcCountBase; };
  for (const SizeKey& key : large_.blocks) {
    if (!IsSplit(key.block) && !Expandable(key.block)) {
      totalAge += age(key.block);
      ++freeable;
    }
  }
  if (freeable == 0) return;
  bool blockFreed = true;
  while (reclaimed < targetSize && blockFreed && freeable > 0) {
    const double ageThreshold = static_cast<double>(totalAge) / freeable;
    blockFreed = false;
    std::vector<int> victims;
    for (const SizeKey& key : large_.blocks) {
      if (!IsSplit(key.block) && !Expandable(key.block) && static_cast<double>(age(key.block)) >= ageThreshold) {
        victims.push_back(key.block);
      }
    }
    for (int b : victims) {
      blockFreed = true;
      reclaimed += blocks_[b].size;
      totalAge -= age(b);
      --freeable;
      ReleaseBlock(b);
    }
  }
}

// DeviceCachingAllocator::alloc_found_block: split off the remainder when should_split says so
// (the request takes the low addresses) and keep inactive_split_bytes as PyTorch does.
int CachingAllocatorModel::AllocFoundBlock(const AllocParams& p, std::int64_t origSize, bool splitRemainder,
                                           int tensorId) {
  int b = p.block;
  const bool alreadySplit = IsSplit(b);
  const bool expandable = Expandable(b);
  if (splitRemainder) {
    const int remaining = b;
    b = NewBlock();
    Block& blk = blocks_[b];
    Block& rem = blocks_[remaining];
    blk.ptr = rem.ptr;
    blk.size = p.size;
    blk.small = rem.small;
    blk.segment = rem.segment;
    blk.prev = rem.prev;
    if (blk.prev != kNone) blocks_[blk.prev].next = b;
    blk.next = remaining;
    rem.prev = b;
    rem.ptr += static_cast<std::uint64_t>(p.size);
    rem.size -= p.size;
    InsertIntoBlocks(*p.pool, remaining);
    if (alreadySplit && !expandable) {
      inactiveSplit_ -= blocks_[b].size;
    } else if (!expandable) {
      inactiveSplit_ += blocks_[remaining].size;
    }
  } else if (alreadySplit && !expandable) {
    inactiveSplit_ -= blocks_[b].size;
  }
  Block& blk = blocks_[b];
  blk.allocated = true;
  blk.requestedSize = origSize;
  blk.tensorId = tensorId;
  allocated_ += blk.size;
  requested_ += origSize;
  return b;
}

// DeviceCachingAllocator::malloc.
bool CachingAllocatorModel::Malloc(int tensorId, std::int64_t requestedBytes) {
  // CUDACachingAllocator::allocate: a zero-byte request gets no block.
  if (requestedBytes == 0) {
    live_[tensorId] = kNone;
    return true;
  }
  AllocParams p;
  p.size = RoundSize(requestedBytes);
  p.pool = p.size <= kSmallSize ? &small_ : &large_;  // get_pool
  p.allocSize = SegmentAllocationSize(p.size);
  bool found = GetFreeBlock(p);
  if (!found) {
    if (gcEnabled_) GarbageCollectCachedBlocks();
    found = AllocBlock(p, false) || (ReleaseAvailableCachedBlocks(p) && AllocBlock(p, false)) ||
            (ReleaseCachedBlocks() && AllocBlock(p, true));
  }
  if (!found) {
    lastOomRounded_ = p.size;
    lastOomAllocSize_ = p.allocSize;
    return false;
  }
  const bool split = ShouldSplit(p.block, p.size);
  live_[tensorId] = AllocFoundBlock(p, requestedBytes, split, tensorId);
  return true;
}

// DeviceCachingAllocator::free → free_block (one stream, no recorded streams: no events).
bool CachingAllocatorModel::Free(int tensorId) {
  auto it = live_.find(tensorId);
  if (it == live_.end()) return false;
  const int b = it->second;
  live_.erase(it);
  if (b == kNone) return true;
  Block& blk = blocks_[b];
  blk.allocated = false;
  allocated_ -= blk.size;
  requested_ -= blk.requestedSize;
  blk.requestedSize = 0;
  blk.tensorId = -1;
  FreeBlock(b);
  return true;
}

// DeviceCachingAllocator::free_block: merge with free neighbours of the same segment, cache.
void CachingAllocatorModel::FreeBlock(int b) {
  BlockPool& pool = PoolOf(b);
  std::int64_t netInactiveSplit = 0;
  const int candidates[2] = {blocks_[b].prev, blocks_[b].next};
  for (int c : candidates) netInactiveSplit -= TryMergeBlocks(b, c, pool);
  InsertIntoBlocks(pool, b);
  if (IsSplit(b)) netInactiveSplit += blocks_[b].size;
  // inactive_split leaves expandable segments out (their free pages can always be released).
  if (!Expandable(b)) inactiveSplit_ += netInactiveSplit;
}

// DeviceCachingAllocator::try_merge_blocks: src joins dst when free and in the same mapped
// state; returns the bytes subsumed.
std::int64_t CachingAllocatorModel::TryMergeBlocks(int dst, int src, BlockPool& pool) {
  if (src == kNone || blocks_[src].allocated || blocks_[dst].mapped != blocks_[src].mapped) return 0;
  Block& d = blocks_[dst];
  const Block s = blocks_[src];
  if (d.prev == src) {
    d.ptr = s.ptr;
    d.prev = s.prev;
    if (d.prev != kNone) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNone) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  if (s.mapped) {
    pool.blocks.erase({s.size, s.ptr, src});
  } else {
    pool.unmapped.erase({s.ptr, src});
  }
  DeleteBlock(src);
  return s.size;
}

// ---------------------------------------------------------------------------------------------
// Expandable segments (Note [Expandable Segments]): one virtual range per pool (per stream)
// reserved for 1⅛ × the device memory, mapped page by page: 2 MiB pages for the small pool,
// 20 MiB (kLargeBuffer) for the large one (find_expandable_block).

// DeviceCachingAllocator::find_expandable_block: the lowest address where free and unmapped
// space together can hold `size`, else a new segment.
int CachingAllocatorModel::FindExpandableBlock(BlockPool& pool, std::int64_t size) {
  auto allocatable = [&](int b) { return b != kNone && !blocks_[b].allocated; };
  auto hasAvailableAddressSpace = [&](int b) {
    std::int64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += blocks_[b].size;
      b = blocks_[b].next;
    }
    return bytes >= size;
  };
  for (const AddressKey& key : pool.unmapped) {
    int c = key.block;
    if (allocatable(blocks_[c].prev)) c = blocks_[c].prev;
    if (hasAvailableAddressSpace(c)) return c;
  }
  ExpandableSegment segment;
  segment.pageBytes = pool.isSmall ? kSmallBuffer : kLargeBuffer;
  const std::int64_t addressSpace = capacity_ + capacity_ / 8;
  const std::int64_t virtualBytes = std::max<std::int64_t>(1, CeilDiv(addressSpace, segment.pageBytes)) *
                                    segment.pageBytes;
  const auto page = static_cast<std::uint64_t>(segment.pageBytes);
  segment.base = (nextAddress_ + page - 1) / page * page;
  nextAddress_ = segment.base + static_cast<std::uint64_t>(virtualBytes);
  segments_.push_back(segment);
  const int b = NewBlock();
  Block& blk = blocks_[b];
  blk.ptr = segment.base;
  blk.size = virtualBytes;
  blk.small = pool.isSmall;
  blk.mapped = false;
  blk.segment = static_cast<int>(segments_.size()) - 1;
  pool.unmapped.insert({blk.ptr, b});
  return b;
}

// DeviceCachingAllocator::map_block → ExpandableSegment::map: back [ptr, ptr + size) with whole
// pages (cuMemCreate fails when the device is full), split off the rest of the unmapped range,
// merge with free mapped neighbours and cache the result.
bool CachingAllocatorModel::MapBlock(int b, std::int64_t size) {
  const ExpandableSegment& segment = segments_[blocks_[b].segment];
  const std::int64_t offset = static_cast<std::int64_t>(blocks_[b].ptr - segment.base);
  const std::int64_t first = offset / segment.pageBytes;
  const std::int64_t last = CeilDiv(offset + size, segment.pageBytes);
  const std::int64_t mappedBytes = (last - first) * segment.pageBytes;
  if (reserved_ + mappedBytes > capacity_) return false;
  BlockPool& pool = PoolOf(b);
  pool.unmapped.erase({blocks_[b].ptr, b});
  blocks_[b].mapped = true;
  if (mappedBytes < blocks_[b].size) {
    const int rest = NewBlock();
    Block& r = blocks_[rest];
    const Block& blk = blocks_[b];
    r.ptr = blk.ptr + static_cast<std::uint64_t>(mappedBytes);
    r.size = blk.size - mappedBytes;
    r.small = blk.small;
    r.segment = blk.segment;
    r.mapped = false;
    r.prev = b;
    r.next = blk.next;
    if (r.next != kNone) blocks_[r.next].prev = rest;
    blocks_[b].next = rest;
    blocks_[b].size = mappedBytes;
    pool.unmapped.insert({r.ptr, rest});
  }
  TryMergeBlocks(b, blocks_[b].prev, pool);
  TryMergeBlocks(b, blocks_[b].next, pool);
  InsertIntoBlocks(pool, b);
  reserved_ += mappedBytes;
  ++numDeviceAllocs_;
  return true;
}

// DeviceCachingAllocator::try_allocate_expandable_block.
int CachingAllocatorModel::TryAllocateExpandableBlock(BlockPool& pool, std::int64_t size) {
  int candidate = FindExpandableBlock(pool, size);
  if (!blocks_[candidate].mapped && !MapBlock(candidate, std::min(blocks_[candidate].size, size))) return kNone;
  while (blocks_[candidate].size < size) {
    const int next = blocks_[candidate].next;
    if (!MapBlock(next, std::min(size - blocks_[candidate].size, blocks_[next].size))) return kNone;
    candidate = next;  // map_block merged the candidate into it
  }
  EraseFromBlocks(pool, candidate);
  return candidate;
}

// DeviceCachingAllocator::unmap_block → ExpandableSegment::unmap: release the whole pages
// inside a free block; the partial pages at either end stay mapped as free blocks.
void CachingAllocatorModel::UnmapBlock(int b) {
  const ExpandableSegment& segment = segments_[blocks_[b].segment];
  const std::int64_t start = static_cast<std::int64_t>(blocks_[b].ptr - segment.base);
  const std::int64_t firstPage = CeilDiv(start, segment.pageBytes);
  const std::int64_t endPage = (start + blocks_[b].size) / segment.pageBytes;
  if (firstPage >= endPage) return;
  BlockPool& pool = PoolOf(b);
  EraseFromBlocks(pool, b);
  const std::uint64_t unmappedPtr = segment.base + static_cast<std::uint64_t>(firstPage * segment.pageBytes);
  const std::int64_t unmappedBytes = (endPage - firstPage) * segment.pageBytes;
  const std::int64_t beforeBytes = static_cast<std::int64_t>(unmappedPtr - blocks_[b].ptr);
  const std::int64_t afterBytes = blocks_[b].size - beforeBytes - unmappedBytes;
  if (beforeBytes > 0) {
    const int before = NewBlock();
    Block& f = blocks_[before];
    f.ptr = blocks_[b].ptr;
    f.size = beforeBytes;
    f.small = blocks_[b].small;
    f.segment = blocks_[b].segment;
    f.prev = blocks_[b].prev;
    f.next = b;
    if (f.prev != kNone) blocks_[f.prev].next = before;
    blocks_[b].prev = before;
    InsertIntoBlocks(pool, before);
  }
  if (afterBytes > 0) {
    const int after = NewBlock();
    Block& f = blocks_[after];
    f.ptr = unmappedPtr + static_cast<std::uint64_t>(unmappedBytes);
    f.size = afterBytes;
    f.small = blocks_[b].small;
    f.segment = blocks_[b].segment;
    f.prev = b;
    f.next = blocks_[b].next;
    if (f.next != kNone) blocks_[f.next].prev = after;
    blocks_[b].next = after;
    InsertIntoBlocks(pool, after);
  }
  blocks_[b].ptr = unmappedPtr;
  blocks_[b].size = unmappedBytes;
  blocks_[b].mapped = false;
  TryMergeBlocks(b, blocks_[b].prev, pool);
  TryMergeBlocks(b, blocks_[b].next, pool);
  pool.unmapped.insert({blocks_[b].ptr, b});
  reserved_ -= unmappedBytes;
  ++numDeviceFrees_;
}

// ---------------------------------------------------------------------------------------------

// DeviceCachingAllocator::snapshot: one segment per cudaMalloc, and one per contiguous mapped
// range of an expandable segment; address order.
std::vector<AllocatorSegmentInfo> CachingAllocatorModel::Snapshot() const {
  std::vector<bool> isFreeSlot(blocks_.size(), false);
  for (int s : freeSlots_) isFreeSlot[s] = true;
  std::vector<AllocatorSegmentInfo> segments;
  for (int b = 0; b < static_cast<int>(blocks_.size()); ++b) {
    if (isFreeSlot[b] || !blocks_[b].mapped) continue;
    const int prev = blocks_[b].prev;
    if (prev != kNone && blocks_[prev].mapped) continue;  // not the head of a mapped run
    AllocatorSegmentInfo segment;
    segment.address = blocks_[b].ptr;
    segment.smallPool = blocks_[b].small;
    segment.expandable = blocks_[b].segment != kNone;
    for (int c = b; c != kNone && blocks_[c].mapped; c = blocks_[c].next) {
      const Block& blk = blocks_[c];
      segment.blocks.push_back({blk.size, blk.allocated ? blk.requestedSize : 0, blk.allocated,
                                blk.allocated ? blk.tensorId : -1});
      segment.totalBytes += blk.size;
      if (blk.allocated) segment.allocatedBytes += blk.size;
    }
    segments.push_back(std::move(segment));
  }
  std::sort(segments.begin(), segments.end(),
            [](const AllocatorSegmentInfo& a, const AllocatorSegmentInfo& b) { return a.address < b.address; });
  return segments;
}

AllocatorOom CachingAllocatorModel::DescribeOom(int tensorId, std::int64_t requestedBytes) const {
  AllocatorOom oom;
  oom.happened = true;
  oom.tensorId = tensorId;
  oom.requestedBytes = requestedBytes;
  oom.roundedBytes = lastOomRounded_;
  oom.allocationBytes = lastOomAllocSize_;
  oom.limitBytes = setFraction_ ? std::min(capacity_, allowedMemoryMaximum_) : capacity_;
  oom.reservedBytes = reserved_;
  oom.allocatedBytes = allocated_;
  oom.unreservedBytes = std::max<std::int64_t>(0, oom.limitBytes - reserved_);
  for (const BlockPool* pool : {&large_, &small_}) {
    for (const SizeKey& key : pool->blocks) {
      oom.cachedFreeBytes += key.size;
      ++oom.cachedFreeBlocks;
    }
    if (!pool->blocks.empty()) {
      oom.largestCachedFreeBlockBytes = std::max(oom.largestCachedFreeBlockBytes, pool->blocks.rbegin()->size);
    }
  }
  oom.freeBytes = oom.unreservedBytes + oom.cachedFreeBytes;
  oom.freeFragments = oom.cachedFreeBlocks + (oom.unreservedBytes > 0 ? 1 : 0);
  oom.largestFreeBlockBytes = std::max(oom.largestCachedFreeBlockBytes, oom.unreservedBytes);
  oom.segments = Snapshot();
  return oom;
}


namespace {

AllocatorResult Simulate(std::span<const AllocatorEvent> events, const AllocatorOptions& options,
                         std::int64_t capacityBytes, const AllocatorRecording& recording) {
  AllocatorResult result;
  CachingAllocatorModel model(options, capacityBytes);
  if (recording.timeline) {
    result.reservedBytesAfterEvent.reserve(events.size());
    result.allocatedBytesAfterEvent.reserve(events.size());
  }
  for (std::size_t i = 0; i < events.size(); ++i) {
    const AllocatorEvent& e = events[i];
    const int index = static_cast<int>(i);
    if (e.kind == AllocatorEventKind::Alloc) {
      if (e.bytes < 0) {
        ++result.invalidEvents;
      } else if (model.IsLive(e.tensorId)) {
        ++result.duplicateAllocs;
      } else if (!model.Malloc(e.tensorId, e.bytes)) {
        result.oom = model.DescribeOom(e.tensorId, e.bytes);
        result.oom.eventIndex = index;
        break;
      }
    } else if (e.kind == AllocatorEventKind::EmptyCache) {
      model.EmptyCache();
    } else if (!model.Free(e.tensorId)) {
      ++result.unmatchedFrees;
    }
    result.eventsSimulated = index + 1;
    if (model.reserved() > result.peakReservedBytes) {
      result.peakReservedBytes = model.reserved();
      result.peakReservedEvent = index;
      result.allocatedAtPeakReservedBytes = model.allocated();
      result.unallocatedAtPeakReservedBytes = model.reserved() - model.allocated();
      result.inactiveSplitAtPeakReservedBytes = model.inactiveSplit();
    }
    if (model.allocated() > result.peakAllocatedBytes) {
      result.peakAllocatedBytes = model.allocated();
      result.peakAllocatedEvent = index;
    }
    result.peakRequestedBytes = std::max(result.peakRequestedBytes, model.requested());
    if (recording.timeline) {
      result.reservedBytesAfterEvent.push_back(model.reserved());
      result.allocatedBytesAfterEvent.push_back(model.allocated());
    }
  }
  result.numAllocRetries = model.allocRetries();
  result.numDeviceAllocs = model.deviceAllocs();
  result.numDeviceFrees = model.deviceFrees();
  result.finalReservedBytes = model.reserved();
  result.finalAllocatedBytes = model.allocated();
  return result;
}

}  // namespace

AllocatorResult ReferenceSimulateCachingAllocator(std::span<const AllocatorEvent> events,
                                                  const AllocatorOptions& options, std::int64_t capacityBytes,
                                                  const AllocatorRecording& recording) {
  AllocatorResult result = Simulate(events, options, capacityBytes, recording);
  if (recording.segmentsAtPeak && result.peakReservedEvent >= 0) {
    // A second pass up to the peak: cheaper than a snapshot at every new maximum.
    const auto upTo = events.first(static_cast<std::size_t>(result.peakReservedEvent) + 1);
    CachingAllocatorModel model(options, capacityBytes);
    for (const AllocatorEvent& e : upTo) {
      if (e.kind == AllocatorEventKind::Alloc) {
        if (e.bytes >= 0 && !model.IsLive(e.tensorId)) model.Malloc(e.tensorId, e.bytes);
      } else if (e.kind == AllocatorEventKind::EmptyCache) {
        model.EmptyCache();
      } else {
        model.Free(e.tensorId);
      }
    }
    result.segmentsAtPeakReserved = model.Snapshot();
  }
  return result;
}

}  // namespace gpumem::reference
