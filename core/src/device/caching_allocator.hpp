// The caching allocator model behind SimulateCachingAllocator: one device, the two default pools
// (no CUDA graph private pools), each kept per stream as PyTorch's BlockComparatorSize orders
// them (stream first: a request only finds cached blocks of its own stream). Names follow c10/cuda/CUDACachingAllocator.cpp
// so that each rule can be compared with its source. Built for speed (an estimate runs it over
// 10^4 events, a solver over 10^6): blocks live in one vector and refer to each other by index,
// the cached free blocks of each pool sit in a FreeBlockIndex (segregated size bins, no heap
// node per block) ordered like BlockComparatorSize, live tensors are found
// through a vector indexed by tensor id, and a model is reused (Reset) so that its buffers keep
// their capacity from one run to the next.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "gpumem/device.hpp"
#include "gpumem/trace.hpp"

// The few functions of every event, inlined into Malloc and Free: a call costs a dozen
// instructions of register saves, an event about a hundred and fifty in all.
// Measured (callgrind per estimate, Llama 2 bench) and kept: EraseNode and NextBin inline
// (−0.9 %, −0.25 %); the ends of a Waiting list inline (−0.1 to −0.3 %). Measured and left out
// line, each slower on some bench case: EraseBlock (two merge sites in Free, +0.5 %), the whole
// Waiting::Insert (+0.2 %), Malloc and Free themselves into the event loop (GPT-2 +0.8 %), the
// merge body out of TryMergeBlocks (+0.1 %).
#if defined(__GNUC__)
#define GPUMEM_EVENT_PATH [[gnu::always_inline]] inline
#else
#define GPUMEM_EVENT_PATH inline
#endif

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
// stream), as PyTorch's std::set<Block*> keeps them, as two-level segregated bins (TLSF):
// thirty-two bins per octave of size, each a short list of the distinct sizes cached in it, in
// order, and a bitmap of the non-empty bins with a summary word over its words. A size's entry
// holds its block of lowest address (the one get_free_block takes); the other blocks of that
// size wait in a list by address. So an insert or erase is one insertion-sort step in a short
// list, and a best-fit search scans the request's bin, then finds the next non-empty bin in
// two bit scans. Cheap because the cached blocks are a few hundred (the 405B bench: 660 at
// most; Mixtral 2,300, a thousand of them of one size) over few distinct sizes per bin, and
// blocks of one size come and go in stack order (see Wait). (The treap this replaced took
// about 160 instructions per insert on the GPT-2 bench, callgrind, most of them walking and
// comparing 128-bit keys; the B-tree before it 375, shifting keys.)
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

  FreeBlockIndex() = default;
  FreeBlockIndex(const FreeBlockIndex&) = default;
  FreeBlockIndex(FreeBlockIndex&&) = default;
  FreeBlockIndex& operator=(FreeBlockIndex&&) = default;
  // Copies only the bins that are not empty here or there (a bin is empty exactly when its bit
  // is clear): the capacity fork copies a model once per estimate, and assigning all 1,920 bins'
  // vectors took about 100,000 instructions of it (callgrind, Llama 2).
  FreeBlockIndex& operator=(const FreeBlockIndex& other);

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
    return {n.size, n.ptr, p.node};
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Calls f(key) for every key in order; f must not change the index.
  template <typename F>
  void ForEach(F&& f) const {
    for (int bin = NextBin(0); bin >= 0; bin = NextBin(bin + 1)) {
      for (const Entry& e : bins_[static_cast<std::size_t>(bin)]) {
        f(Key{e.size, e.ptr, e.block});
        if (e.more < 0) continue;
        waiting_[static_cast<std::size_t>(e.more)].ForEach([&](const Dup& d) { f(Key{e.size, d.ptr, d.block}); });
      }
    }
  }

 private:
  struct Entry {  // one size in its bin
    std::int64_t size;
    std::uint64_t ptr;  // its block of lowest address
    int block;
    int more;  // the list of its other blocks, or −1
  };
  struct Dup {
    std::uint64_t ptr;
    int block;
  };
  // 32 bytes, so that Insert's bounds test (nodes_.size()) and the indexing are shifts, not a
  // multiplication by the inverse of 24.
  struct alignas(32) Node {  // by block id
    std::int64_t size = 0;
    std::uint64_t ptr = 0;
    int bin = -1;  // −1: not in the index
  };
  static constexpr int kSubBins = 32;              // per octave
  static constexpr int kBins = 60 * kSubBins;      // sizes up to 2^63
  static constexpr int kBinWords = kBins / 64;     // ≤ 64: one summary word
  static int BinOf(std::int64_t size);
  Entry* EntryOf(int bin, std::int64_t size);  // the entry of a size that is in the index
  const Entry* EntryOf(int bin, std::int64_t size) const;
  void SetBinBit(int bin);
  void ClearBinBit(int bin);
  int NextBin(int bin) const;  // the first non-empty bin ≥ bin, or −1
  int PrevBin(int bin) const;  // the last non-empty bin ≤ bin, or −1
  int MaxBlockOf(const Entry& e) const;  // its block of highest address
  // The other blocks of one size, by address, in the middle of a buffer with room at both
  // ends: blocks of one size come and go in stack order at either end (the entry's block is
  // taken from the low end; the backward frees from the highest address down or, elsewhere,
  // up), so that an insert or erase there seldom moves anything. Between the ends a gap is
  // left where the last insert or erase in the middle was: the foreach optimizer's thousand
  // same-sized temporaries come back in address order into the middle of the list (Mixtral's
  // bench: 5,400 such inserts per estimate, 92 % within three places of the one before), and
  // with the gap there each is one store instead of moving a hundred entries.
  // The blocks are buf_[lo_, gapLo_) then buf_[gapHi_, hi_). With a gap, both parts hold blocks
  // (so the lowest is buf_[lo_] and the highest buf_[hi_ − 1]); without one, gapLo_ = gapHi_
  // lies anywhere in [lo_, hi_].
  class Waiting {
   public:
    bool empty() const { return lo_ == hi_; }
    const Dup& front() const { return buf_[lo_]; }     // the lowest address
    const Dup& back() const { return buf_[hi_ - 1]; }  // the highest
    void Clear() { lo_ = hi_ = gapLo_ = gapHi_ = buf_.size() / 2; }
    void PushFront(const Dup& d);  // below every one
    void PopFront() {
      // The lower part is gone, and the gap with it (an empty gap may sit at lo_ itself).
      if (++lo_ >= gapLo_) Normalize();
    }
    // Below or above every one with room there (55 % of the inserts, Llama 2 bench) inline;
    // between, or with no room, InsertSlow.
    void Insert(const Dup& d) {
      if (lo_ == hi_ || d.ptr > buf_[hi_ - 1].ptr) {
        if (hi_ < buf_.size()) {
          buf_[hi_++] = d;
          return;
        }
      } else if (d.ptr < buf_[lo_].ptr && lo_ > 0) {
        buf_[--lo_] = d;
        return;
      }
      InsertSlow(d);
    }
    void InsertSlow(const Dup& d);
    void Erase(std::uint64_t ptr);  // a ptr that is there
    const Dup* Find(std::uint64_t ptr) const;  // null when not there
    const Dup* After(std::uint64_t ptr) const;   // the lowest above ptr, or null
    const Dup* Before(std::uint64_t ptr) const;  // the highest below ptr, or null
    // f(block) for every one, by address.
    template <typename F>
    void ForEach(F&& f) const {
      for (std::size_t i = lo_; i < gapLo_; ++i) f(buf_[i]);
      for (std::size_t i = gapHi_; i < hi_; ++i) f(buf_[i]);
    }

   private:
    bool HasGap() const { return gapLo_ != gapHi_; }
    // The first index of [from, to) whose block is not below ptr.
    std::size_t Above(std::size_t from, std::size_t to, std::uint64_t ptr) const;
    void RemoveFromPart(std::size_t& from, std::size_t& to, std::size_t i);
    void Normalize();  // restores the gap's rule after a change at its edge
    void Recenter();   // room at both ends, no gap
    // Recenter's other buffer (what it holds is stale). A copied list does not take it: the
    // capacity fork copies the lists once an estimate.
    struct Spare {
      std::vector<Dup> buffer;
      Spare() = default;
      Spare(Spare&&) = default;
      Spare& operator=(Spare&&) = default;
      Spare(const Spare&) {}
      Spare& operator=(const Spare&) { return *this; }
    };
    std::vector<Dup> buf_;
    Spare spare_;
    std::size_t lo_ = 0, hi_ = 0, gapLo_ = 0, gapHi_ = 0;
  };
  int NewWaiting();
  // Resets the bin of the index's blocks of id ≥ from (their nodes read as not in the index);
  // the bins themselves are left to the caller.
  void ForgetNodesFrom(std::size_t from);
  // Takes block x out.
  void EraseNode(int x);

  std::vector<Node> nodes_;
  std::array<std::vector<Entry>, kBins> bins_;
  std::array<std::uint64_t, kBinWords> binBits_{};  // bit b: bin b is not empty
  std::uint64_t binSummary_ = 0;                    // bit w: binBits_[w] is not zero
  std::vector<Waiting> waiting_;
  std::vector<int> freeWaiting_;
  std::size_t size_ = 0;
};

// The index's operations of every event (see GPUMEM_EVENT_PATH).

// Thirty-two bins per octave: sizes below 32 have a bin each; above, the octave and the next
// five bits. Monotonic in size, so that the bins' order is the sizes' order.
GPUMEM_EVENT_PATH int FreeBlockIndex::BinOf(std::int64_t size) {
  const auto u = static_cast<std::uint64_t>(size);
  if (u < kSubBins) return static_cast<int>(u);
  const int log = 63 - std::countl_zero(u);
  return (log - 4) * kSubBins + static_cast<int>((u >> (log - 5)) & (kSubBins - 1));
}

// Another block of a size in the index waits in its list; a new size is one insertion-sort step
// in its bin.
GPUMEM_EVENT_PATH void FreeBlockIndex::Insert(const Key& key) {
  const auto b = static_cast<std::size_t>(key.block);
  if (b >= nodes_.size()) nodes_.resize(std::max<std::size_t>(b + 1, nodes_.size() * 2));
  const int bin = BinOf(key.size);
  nodes_[b] = {key.size, key.ptr, bin};
  ++size_;
  std::vector<Entry>& list = bins_[static_cast<std::size_t>(bin)];
  Entry* e = list.data();
  Entry* const end = e + list.size();
  while (e != end && e->size < key.size) ++e;
  if (e != end && e->size == key.size) {  // another block of this size: one of the two waits
    if (e->more < 0) e->more = NewWaiting();
    if (key.ptr < e->ptr) {  // the entry's block, below every waiting one, waits last
      waiting_[static_cast<std::size_t>(e->more)].PushFront({e->ptr, e->block});
      e->ptr = key.ptr;
      e->block = key.block;
    } else {
      waiting_[static_cast<std::size_t>(e->more)].Insert({key.ptr, key.block});
    }
    return;
  }
  // A new size in the bin: one insertion-sort step.
  const auto at = static_cast<std::size_t>(e - list.data());
  if (list.empty()) SetBinBit(bin);
  list.push_back({});
  Entry* const first = list.data();
  for (std::size_t i = list.size() - 1; i > at; --i) first[i] = first[i - 1];
  first[at] = {key.size, key.ptr, key.block, -1};
}

GPUMEM_EVENT_PATH void FreeBlockIndex::EraseNode(int x) {
  Node& node = nodes_[static_cast<std::size_t>(x)];
  const int bin = node.bin;
  node.bin = -1;
  --size_;
  Entry* e = EntryOf(bin, node.size);
  if (e->block != x) {  // a waiting block
    waiting_[static_cast<std::size_t>(e->more)].Erase(node.ptr);
  } else if (e->more >= 0) {  // the entry's block: the next address takes its place
    Waiting& waiting = waiting_[static_cast<std::size_t>(e->more)];
    e->ptr = waiting.front().ptr;
    e->block = waiting.front().block;
    waiting.PopFront();
  } else {  // the size's last block
    std::vector<Entry>& list = bins_[static_cast<std::size_t>(bin)];
    Entry* const last = list.data() + list.size() - 1;
    for (; e != last; ++e) *e = *(e + 1);
    list.pop_back();
    if (list.empty()) ClearBinBit(bin);
    return;
  }
  if (waiting_[static_cast<std::size_t>(e->more)].empty()) {
    freeWaiting_.push_back(e->more);
    e->more = -1;
  }
}

// Inline: 42 % of the requests find their own bin empty (Llama 2 bench).
GPUMEM_EVENT_PATH int FreeBlockIndex::NextBin(int bin) const {
  if (bin >= kBins) return -1;
  const auto word = static_cast<std::size_t>(bin) >> 6;
  const std::uint64_t here = binBits_[word] & (~std::uint64_t{0} << (bin & 63));
  if (here != 0) return static_cast<int>(word * 64) + std::countr_zero(here);
  if (word + 1 >= kBinWords) return -1;
  const std::uint64_t later = binSummary_ & (~std::uint64_t{0} << (word + 1));
  if (later == 0) return -1;
  const auto w = static_cast<std::size_t>(std::countr_zero(later));
  return static_cast<int>(w * 64) + std::countr_zero(binBits_[w]);
}

GPUMEM_EVENT_PATH FreeBlockIndex::Position FreeBlockIndex::LowerBound(std::int64_t size) const {
  const int bin = BinOf(size);
  for (const Entry& e : bins_[static_cast<std::size_t>(bin)]) {
    if (e.size >= size) return {e.block};  // the smallest fit, lowest address among equals
  }
  const int next = NextBin(bin + 1);
  return {next < 0 ? -1 : bins_[static_cast<std::size_t>(next)].front().block};
}

// Tensor id → its allocated block: a vector for the ids traces use (0, 1, 2, …), a hash map
// for any other id a caller may pass.
class LiveTensors {
 public:
  static constexpr int kNotLive = -2;
  void Clear();
  // The block, −1 for a 0-byte tensor, kNotLive.
  int Find(int tensorId) const {
    if (static_cast<unsigned>(tensorId) < denseIds_) return dense_[static_cast<std::size_t>(tensorId)];
    return tensorId >= 0 && tensorId < kDenseIds ? kNotLive : FindSparse(tensorId);
  }
  void Set(int tensorId, int block) {
    if (static_cast<unsigned>(tensorId) < denseIds_) {
      dense_[static_cast<std::size_t>(tensorId)] = block;
    } else {
      SetSlow(tensorId, block);
    }
  }
  void Erase(int tensorId) {
    if (static_cast<unsigned>(tensorId) < denseIds_) {
      dense_[static_cast<std::size_t>(tensorId)] = kNotLive;
    } else if (tensorId < 0 || tensorId >= kDenseIds) {
      EraseSparse(tensorId);
    }
  }

 private:
  int FindSparse(int tensorId) const;
  void SetSlow(int tensorId, int block);
  void EraseSparse(int tensorId);
  static constexpr int kDenseIds = 1 << 22;
  std::vector<int> dense_;
  unsigned denseIds_ = 0;  // dense_.size(), kept so that the bounds test of every event is one compare
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
  // `stream` is the request's stream (AllocatorEvent::stream; clamped to kMaxAllocatorStreams − 1).
  MallocOutcome Malloc(int tensorId, std::int64_t requestedBytes, int stream = 0);
  // DeviceCachingAllocator::free. False when the tensor is not live.
  bool Free(int tensorId);
  // DeviceCachingAllocator::emptyCache (torch.cuda.empty_cache): release_cached_blocks.
  void EmptyCache() { ReleaseCachedBlocks(); }

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
    std::uint8_t stream = 0;  // Block::stream: the stream whose request made its segment
  };  // 48 bytes: a block's offset is two instructions (56 took three, on every access)
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
    std::uint8_t stream = 0;  // the stream whose blocks these are
    // get_free_block calls on this stream's part of the pool (PyTorch counts the whole pool:
    // GetFreeBlocksCalls sums the streams).
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

  // A block slot holding `init` (its fields written once, not cleared and then set).
  int NewBlock(const Block& init);
  int NewBlock() { return NewBlock(Block{}); }
  void DeleteBlock(int b);
  bool IsSplit(int b) const { return blocks_[b].prev != kNone || blocks_[b].next != kNone; }
  bool Expandable(int b) const { return blocks_[b].segment != kNone; }
  // The pool a block returns to: its segment's stream's (free_block inserts into
  // block->pool, whose set orders by block->stream first).
  BlockPool& PoolOf(int b) {
    const Block& blk = blocks_[b];
    if (blk.stream == 0) [[likely]] return blk.small ? small_ : large_;
    StreamPools& side = sideStreams_[blk.stream - 1u];
    return blk.small ? side.small : side.large;
  }
  // The pool of a request of `stream` (made on first use).
  BlockPool& PoolFor(int stream, bool small);
  // get_free_blocks_call_count of the whole small or large pool: every stream's calls.
  std::int64_t GetFreeBlocksCalls(bool small) const;
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
  bool roundupDivisions_;  // roundup_power2_divisions set for some interval

  std::vector<Block> blocks_;
  // BlockPool::insert_into_blocks's gc_count_base per block, beside the blocks: only the
  // garbage collection reads it, so only a model with it enabled writes it.
  std::vector<std::int64_t> gcCountBase_;
  std::vector<int> freeSlots_;
  BlockPool large_;
  BlockPool small_;
  // The pools of side streams 1, 2, … (index stream − 1), made when a request of that stream
  // first comes: a single-stream trace never makes one, so its events cost what they did.
  struct StreamPools {
    BlockPool large, small;
  };
  std::vector<StreamPools> sideStreams_;
  std::size_t sideStreamsUsed_ = 0;  // sideStreams_[0, used) are live since the last Reset
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

namespace gpumem {

// Allocator events as consecutive runs, each either trace events read where they are (their
// kind, tensorId and bytes) or AllocatorEvents: the device stage hands the trace's events with
// the few cuBLAS workspaces between them without copying the trace into a second vector
// (device_stage.cpp DeviceEventRuns). Event indices count across the runs.
struct AllocatorEventRun {
  const Event* trace = nullptr;            // when set, the run is trace[0, count)
  const AllocatorEvent* events = nullptr;  // else events[0, count)
  std::size_t count = 0;
};
using AllocatorEventRuns = std::span<const AllocatorEventRun>;

// SimulateCachingAllocatorAtCapacity over the runs' events in order: equal, field by field, to
// the call on the same events in one vector (tests/allocator_identity_test.cpp).
AllocatorCapacityRun SimulateCachingAllocatorAtCapacity(AllocatorEventRuns events, const AllocatorOptions& options,
                                                        std::int64_t capacityBytes,
                                                        const AllocatorRecording& recording = {});

}  // namespace gpumem
