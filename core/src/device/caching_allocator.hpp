// The caching allocator model behind SimulateCachingAllocator: one device, one stream, the two
// default pools (no CUDA graph private pools). Names follow c10/cuda/CUDACachingAllocator.cpp
// so that each rule can be compared with its source; blocks live in a vector and refer to each
// other by index, and the cached free blocks of each pool sit in an ordered set keyed like
// BlockComparatorSize (size, then address; one stream), so every step is O(log n).
#pragma once

#include <cstdint>
#include <set>
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

class CachingAllocatorModel {
 public:
  CachingAllocatorModel(const AllocatorOptions& options, std::int64_t capacityBytes);

  // DeviceCachingAllocator::malloc. False on OOM (then LastOom() describes it).
  bool Malloc(int tensorId, std::int64_t requestedBytes);
  // DeviceCachingAllocator::free. False when the tensor is not live.
  bool Free(int tensorId);

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

}  // namespace gpumem::device
