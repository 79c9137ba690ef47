// The caching allocator model behind SimulateCachingAllocator: one device, one stream, the two
// default pools (no CUDA graph private pools). Names follow c10/cuda/CUDACachingAllocator.cpp
// so that each rule can be compared with its source. Built for speed (an estimate runs it over
// 10^4 events, a solver over 10^6): blocks live in one vector and refer to each other by index,
// the cached free blocks of each pool sit in a FreeBlockIndex (a chunked sorted sequence, no
// heap node per block) ordered like BlockComparatorSize, live tensors are found
// through a vector indexed by tensor id, and a model is reused (Reset) so that its buffers keep
// their capacity from one run to the next.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "gpumem/device.hpp"

namespace gpumem::device {

// c10/cuda/CUDACachingAllocator.cpp, top of file.
constexpr std::int64_t kMiB = 1 << 20;
constexpr std::int64_t kMinBlockSize = 512;       // all sizes are rounded to at least 512 B
constexpr std::int64_t kSmallSize = 1 * kMiB;     // largest "small" request
constexpr std::int64_t kSmallBuffer = 2 * kMiB;   // small requests are packed in 2 MiB segments
constexpr std::int64_t kMinLargeAlloc = 10 * kMiB;  // requests in (1, 10) MiB take a kLargeBuffer
constexpr std::int64_t kRoundLarge = 2 * kMiB;    // larger requests round up to 2 MiB
constexpr std::int64_t kLargeBuffer = 20 * kMiB;  // "large" requests may be packed in 20 MiB

// The cached free blocks of one pool in BlockComparatorSize order (size, then address; one
// stream), as PyTorch's std::set<Block*> keeps them, without a heap node per block: a sorted
// sequence cut into chunks of at most kChunk keys (a B-tree of height two). A lookup is a
// binary search over the chunks' last keys and one inside a chunk; an insert or erase moves
// at most kChunk keys. Why not size-class bins (16 per power of two) over sorted vectors: a
// trace caches many blocks of equal or close sizes (Mixtral 8x7B up to 2,300 cached blocks),
// which land in a few bins, and every insert moved kilobytes (measured: 58 % of the
// instructions in memmove).
class FreeBlockIndex {
 public:
  struct Key {
    std::int64_t size;
    std::uint64_t ptr;
    int block;
  };
  // A key's place: chunk and index in it; chunk < 0 is the end.
  struct Position {
    int chunk = -1;
    int index = 0;
  };

  void Clear();
  void Insert(const Key& key);
  void Erase(std::int64_t size, std::uint64_t ptr);
  void EraseAt(Position p);
  // The first key with size ≥ `size` (std::set::lower_bound of {size, 0}), or the end.
  Position LowerBound(std::int64_t size) const;
  Position First() const { return chunks_.empty() ? Position{} : Position{0, 0}; }
  Position Last() const;
  Position Next(Position p) const;
  Position Prev(Position p) const;  // the end when p is First()
  static bool AtEnd(Position p) { return p.chunk < 0; }
  const Key& At(Position p) const { return chunks_[static_cast<std::size_t>(p.chunk)][static_cast<std::size_t>(p.index)]; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Calls f(key) for every key in order; f must not change the index.
  template <typename F>
  void ForEach(F&& f) const {
    for (const std::vector<Key>& chunk : chunks_) {
      for (const Key& key : chunk) f(key);
    }
  }

 private:
  // Measured in WebAssembly (the page), where moving memory is slow (musl's memmove is a word
  // loop): with 48, Mixtral and 405B were 10 % slower than std::set; with 16, 10 % faster but a
  // 2,000-layer list (thousands of cached blocks, so hundreds of chunks to move on a split)
  // 20 % slower; 32 is faster than std::set on every bench case or even with it.
  static constexpr std::size_t kChunk = 32;
  // The first chunk whose last key is not before (size, ptr); chunks_.size() when none.
  std::size_t ChunkFor(std::int64_t size, std::uint64_t ptr) const;
  std::vector<Key> TakeSpare();

  std::vector<std::vector<Key>> chunks_;  // in order, none empty
  std::vector<Key> lastKeys_;             // chunks_[c].back(), side by side for the search
  std::vector<std::vector<Key>> spare_;   // emptied chunks, kept for their capacity
  std::size_t size_ = 0;
};

// Tensor id → its allocated block: a vector for the ids traces use (0, 1, 2, …), a hash map
// for any other id a caller may pass.
class LiveTensors {
 public:
  static constexpr int kNotLive = -2;
  void Clear();
  int Find(int tensorId) const;  // the block, −1 for a 0-byte tensor, kNotLive
  void Set(int tensorId, int block);
  void Erase(int tensorId);

 private:
  static constexpr int kDenseIds = 1 << 22;
  std::vector<int> dense_;
  std::unordered_map<int, int> sparse_;
};

class CachingAllocatorModel {
 public:
  CachingAllocatorModel(const AllocatorOptions& options, std::int64_t capacityBytes);
  // Back to an empty device with these options, keeping the buffers' capacity.
  void Reset(const AllocatorOptions& options, std::int64_t capacityBytes);
  // Another capacity for a model that has never failed a cudaMalloc: the caller copies a
  // model at its first capacity miss and lifts the limit of the copy (see WatchCapacity).
  void SetCapacity(std::int64_t capacityBytes);

  enum class MallocOutcome : std::uint8_t {
    Allocated,
    OutOfMemory,   // failed even after releasing the cache; DescribeOom tells why
    CapacityMiss,  // only while watching: the first cudaMalloc that the limit refused
  };
  // While watching, the first request that finds no cached block and whose cudaMalloc the
  // capacity (or memory fraction) refuses returns CapacityMiss with the model untouched, before
  // any cache release: up to there a model with a larger capacity would have done exactly the
  // same. Only meaningful when the capacity enters nowhere else: CanWatchCapacity().
  void WatchCapacity(bool watch) { watchCapacity_ = watch; }
  bool CanWatchCapacity() const { return !options_.expandableSegments && !gcEnabled_; }

  // DeviceCachingAllocator::malloc.
  MallocOutcome Malloc(int tensorId, std::int64_t requestedBytes);
  // DeviceCachingAllocator::free. False when the tensor is not live.
  bool Free(int tensorId);

  std::int64_t reserved() const { return reserved_; }
  std::int64_t allocated() const { return allocated_; }
  std::int64_t requested() const { return requested_; }
  std::int64_t inactiveSplit() const { return inactiveSplit_; }
  std::int64_t allocRetries() const { return numAllocRetries_; }
  std::int64_t deviceAllocs() const { return numDeviceAllocs_; }
  std::int64_t deviceFrees() const { return numDeviceFrees_; }
  bool IsLive(int tensorId) const { return live_.Find(tensorId) != LiveTensors::kNotLive; }

  std::vector<AllocatorSegmentInfo> Snapshot() const;  // DeviceCachingAllocator::snapshot
  AllocatorOom DescribeOom(int tensorId, std::int64_t requestedBytes, bool withSegments) const;

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
  struct AddressKey {  // BlockComparatorAddress on one stream
    std::uint64_t ptr;
    int block;
  };
  struct BlockPool {
    FreeBlockIndex blocks;
    // Unmapped ranges of expandable segments, in address order (a sorted vector: there are
    // a handful, one per segment and hole).
    std::vector<AddressKey> unmapped;
    bool isSmall = false;
    std::int64_t getFreeBlocksCallCount = 0;
    void Clear(bool small);
    void InsertUnmapped(std::uint64_t ptr, int block);
    void EraseUnmapped(std::uint64_t ptr);
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
  LiveTensors live_;  // tensor id → allocated block (kNone for 0-byte tensors)
  std::uint64_t nextAddress_;
  bool watchCapacity_ = false;
  // Scratch lists of ReleaseBlocks and the garbage collection (kept for their capacity).
  std::vector<int> toRelease_, toUnmap_;

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

}  // namespace gpumem::device
