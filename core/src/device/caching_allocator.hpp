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
// stream), as PyTorch's std::set<Block*> keeps them, without a heap node per block: a treap
// (a binary search tree that is also a heap on a pseudo-random priority per node, so that its
// expected depth is about 2 ln n whatever the order of inserts) whose nodes sit in a vector
// indexed by the allocator's block id. A search or an insert walks one root-to-leaf path; the
// erase of a known block walks none (parent links); no operation moves keys. Why not sorted sequences: a cached block comes and goes on nearly every event (the
// 405B bench: 200,000 inserts, 197,000 erases and 154,000 best-fit searches over about 220
// cached blocks, 1,000 in Mixtral), and the previous index (sorted chunks of 32 keys, the
// B-tree of height two that replaced std::set) spent 375 instructions per insert shifting keys
// (callgrind; in WebAssembly such moves are slower still). Why not size-class bins: a trace
// caches many blocks of equal or close sizes, which land in a few bins.
class FreeBlockIndex {
 public:
  struct Key {
    std::int64_t size;
    std::uint64_t ptr;
    int block;
  };
  // A key's place: its block, or −1 for the end. Stays valid until that key is erased.
  struct Position {
    int node = -1;
  };

  void Clear();
  // Keys are unique by (size, ptr), and a block is in at most one index at a time.
  void Insert(const Key& key);
  void Erase(std::int64_t size, std::uint64_t ptr);  // a missing key is ignored
  // Erase(size, ptr) for the key of `block`: without a search when that block is in the
  // index under this key (the usual case), else as Erase(size, ptr).
  void EraseBlock(int block, std::int64_t size, std::uint64_t ptr);
  void EraseAt(Position p) { EraseNode(p.node); }
  // The first key with size ≥ `size` (std::set::lower_bound of {size, 0}), or the end.
  Position LowerBound(std::int64_t size) const;
  Position First() const;
  Position Last() const;
  Position Next(Position p) const;  // the end after Last()
  Position Prev(Position p) const;  // the end when p is First()
  static bool AtEnd(Position p) { return p.node < 0; }
  Key At(Position p) const {
    const Node& n = nodes_[static_cast<std::size_t>(p.node)];
    return {n.size(), n.ptr(), p.node};
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Calls f(key) for every key in order; f must not change the index.
  template <typename F>
  void ForEach(F&& f) const {
    // An in-order walk with an explicit stack (kept for its capacity).
    std::vector<int>& stack = walk_;
    stack.clear();
    int t = root_;
    while (t >= 0 || !stack.empty()) {
      while (t >= 0) {
        stack.push_back(t);
        t = nodes_[static_cast<std::size_t>(t)].child[0];
      }
      t = stack.back();
      stack.pop_back();
      f(At({t}));
      t = nodes_[static_cast<std::size_t>(t)].child[1];
    }
  }

 private:
  // (size, ptr) as one unsigned 128-bit number, so that the key order is one comparison
  // (sizes are positive).
  __extension__ using Packed = unsigned __int128;
  static Packed Pack(std::int64_t size, std::uint64_t ptr) {
    return (static_cast<Packed>(static_cast<std::uint64_t>(size)) << 64) | ptr;
  }
  struct Node {
    Packed key = 0;
    std::int64_t size() const { return static_cast<std::int64_t>(key >> 64); }
    std::uint64_t ptr() const { return static_cast<std::uint64_t>(key); }
    int child[2] = {-1, -1};  // [0] keys before this one, [1] keys after
    int parent = kOut;           // −1 for the root
    std::uint32_t priority = 0;  // a parent's is above its children's
  };
  static constexpr int kOut = -2;  // Node::parent of a block not in the index
  // Takes node x out: its place goes to the merge of its two subtrees.
  void EraseNode(int x);
  Node& N(int i) { return nodes_[static_cast<std::size_t>(i)]; }
  const Node& N(int i) const { return nodes_[static_cast<std::size_t>(i)]; }

  std::vector<Node> nodes_;  // by block id; only those in the tree are meaningful
  int root_ = -1;
  std::size_t size_ = 0;
  mutable std::vector<int> walk_;  // ForEach's stack
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
