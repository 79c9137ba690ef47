// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x,
// read at pytorch/pytorch 001074d2 and checked against current main for
// max_non_split_rounding_size). Each function below carries the name of the PyTorch function
// whose rule it follows; docs/device.md lists them with what is not modelled.
#include "device/caching_allocator.hpp"
#include "gpumem/recycle.hpp"

#include <algorithm>
#include <bit>
#include <limits>

namespace gpumem::device {

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
// FreeBlockIndex

void FreeBlockIndex::Clear() {
  // Every node out, so that EraseBlock of a block cached before the Clear finds nothing.
  ForgetNodesFrom(0);
  for (int bin = NextBin(0); bin >= 0; bin = NextBin(bin + 1)) bins_[static_cast<std::size_t>(bin)].clear();
  binBits_.fill(0);
  binSummary_ = 0;
  freeWaiting_.clear();
  for (std::size_t w = 0; w < waiting_.size(); ++w) {
    waiting_[w].Clear();
    freeWaiting_.push_back(static_cast<int>(w));
  }
  size_ = 0;
}

FreeBlockIndex& FreeBlockIndex::operator=(const FreeBlockIndex& other) {
  if (this == &other) return *this;
  // nodes_ keeps its length: the copy's first `theirs` nodes are other's, and the rest leave the
  // index. (Copied whole, nodes_ took other's shorter length and the copy grew it again by
  // value-initialising nodes, in every estimate: the capacity fork's unlimited model goes on
  // from an early copy; 1.3 % of a Mixtral estimate in wasm, node --cpu-prof.)
  const std::size_t theirs = other.nodes_.size();
  ForgetNodesFrom(theirs);
  for (int w = 0; w < kBinWords; ++w) {
    for (std::uint64_t bits = binBits_[static_cast<std::size_t>(w)] | other.binBits_[static_cast<std::size_t>(w)];
         bits != 0; bits &= bits - 1) {
      const auto bin = static_cast<std::size_t>(w * 64 + std::countr_zero(bits));
      bins_[bin] = other.bins_[bin];
    }
  }
  if (nodes_.size() < theirs) nodes_.resize(theirs);
  std::copy(other.nodes_.begin(), other.nodes_.end(), nodes_.begin());
  binBits_ = other.binBits_;
  binSummary_ = other.binSummary_;
  waiting_ = other.waiting_;
  freeWaiting_ = other.freeWaiting_;
  size_ = other.size_;
  return *this;
}

// Only the blocks in the index have a bin (Node::bin ≥ 0 exactly then): those of id ≥ `from`
// are the nodes to reset, not every node (a few hundred cached blocks against thousands of ids).
void FreeBlockIndex::ForgetNodesFrom(std::size_t from) {
  ForEach([&](const Key& key) {
    const auto block = static_cast<std::size_t>(key.block);
    if (block >= from) nodes_[block].bin = -1;
  });
}

FreeBlockIndex::Entry* FreeBlockIndex::EntryOf(int bin, std::int64_t size) {
  Entry* e = bins_[static_cast<std::size_t>(bin)].data();
  while (e->size != size) ++e;
  return e;
}

const FreeBlockIndex::Entry* FreeBlockIndex::EntryOf(int bin, std::int64_t size) const {
  const Entry* e = bins_[static_cast<std::size_t>(bin)].data();
  while (e->size != size) ++e;
  return e;
}

void FreeBlockIndex::SetBinBit(int bin) {
  binBits_[static_cast<std::size_t>(bin) >> 6] |= std::uint64_t{1} << (bin & 63);
  binSummary_ |= std::uint64_t{1} << (bin >> 6);
}

void FreeBlockIndex::ClearBinBit(int bin) {
  const auto word = static_cast<std::size_t>(bin) >> 6;
  binBits_[word] &= ~(std::uint64_t{1} << (bin & 63));
  if (binBits_[word] == 0) binSummary_ &= ~(std::uint64_t{1} << word);
}

int FreeBlockIndex::NewWaiting() {
  if (freeWaiting_.empty()) {
    waiting_.emplace_back();
    return static_cast<int>(waiting_.size()) - 1;
  }
  const int w = freeWaiting_.back();
  freeWaiting_.pop_back();
  return w;
}

// Into the spare buffer, which then becomes the list's: the two swap at every recentring, so
// that a list that recentres often (Mixtral's expert temporaries: 178 times per estimate) stops
// allocating once both are large enough (a fresh buffer each time was 0.9 % of Mixtral's
// wasm time, node --cpu-prof).
void FreeBlockIndex::Waiting::Recenter() {
  const std::size_t n = (gapLo_ - lo_) + (hi_ - gapHi_);
  std::vector<Dup>& buf = spare_.buffer;
  const std::size_t want = std::max<std::size_t>(16, 2 * n + 8);
  if (buf.size() < want) buf.resize(want);
  const std::size_t lo = (buf.size() - n) / 2;
  const auto at = [this](std::size_t i) { return buf_.begin() + static_cast<std::ptrdiff_t>(i); };
  std::copy(at(gapHi_), at(hi_), std::copy(at(lo_), at(gapLo_), buf.begin() + static_cast<std::ptrdiff_t>(lo)));
  buf_.swap(buf);
  lo_ = lo;
  hi_ = gapLo_ = gapHi_ = lo + n;
}

void FreeBlockIndex::Waiting::Normalize() {
  if (!HasGap()) {
    gapLo_ = gapHi_ = hi_;
  } else if (lo_ == gapLo_) {  // nothing below the gap
    lo_ = gapHi_;
    gapLo_ = gapHi_ = hi_;
  } else if (gapHi_ == hi_) {  // nothing above it
    hi_ = gapLo_;
    gapHi_ = gapLo_;
  }
}

std::size_t FreeBlockIndex::Waiting::Above(std::size_t from, std::size_t to, std::uint64_t ptr) const {
  const Dup* first = buf_.data() + from;
  return from + static_cast<std::size_t>(
                    std::partition_point(first, buf_.data() + to, [ptr](const Dup& x) { return x.ptr < ptr; }) - first);
}

void FreeBlockIndex::Waiting::PushFront(const Dup& d) {
  if (lo_ == 0) Recenter();
  buf_[--lo_] = d;
}

// Between two blocks, the cheapest of: the gap's own place (a store), moving the gap there
// (the blocks between it and the place cross it), or the blocks on one side moving one slot
// into the room at that end. Without a gap, one is opened at the place with half the room of
// the end whose side moves fewer blocks.
void FreeBlockIndex::Waiting::InsertSlow(const Dup& d) {
  if (lo_ == hi_ || d.ptr > back().ptr) {  // above every one
    if (hi_ == buf_.size()) Recenter();
    buf_[hi_++] = d;
    return;
  }
  if (d.ptr < front().ptr) {
    PushFront(d);
    return;
  }
  const auto move = [this](std::size_t from, std::size_t to, std::size_t dest) {
    std::copy(buf_.begin() + static_cast<std::ptrdiff_t>(from), buf_.begin() + static_cast<std::ptrdiff_t>(to),
              buf_.begin() + static_cast<std::ptrdiff_t>(dest));
  };
  const auto moveUp = [this](std::size_t from, std::size_t to, std::size_t destEnd) {
    std::copy_backward(buf_.begin() + static_cast<std::ptrdiff_t>(from), buf_.begin() + static_cast<std::ptrdiff_t>(to),
                       buf_.begin() + static_cast<std::ptrdiff_t>(destEnd));
  };
  if (HasGap()) {
    if (d.ptr < buf_[gapLo_ - 1].ptr) {  // below the gap: buf_[i, gapLo_) lie above d
      const std::size_t i = Above(lo_, gapLo_, d.ptr);
      if (lo_ > 0 && i - lo_ < gapLo_ - i) {  // the lower ones move down
        move(lo_, i, lo_ - 1);
        --lo_;
        buf_[i - 1] = d;
      } else {  // the gap moves down to i
        const std::size_t n = gapLo_ - i;
        moveUp(i, gapLo_, gapHi_);
        gapLo_ = i;
        gapHi_ -= n;
        buf_[gapLo_++] = d;
      }
    } else if (d.ptr > buf_[gapHi_].ptr) {  // above it: buf_[gapHi_, i) lie below d
      const std::size_t i = Above(gapHi_, hi_, d.ptr);
      if (hi_ < buf_.size() && hi_ - i < i - gapHi_) {  // the higher ones move up
        moveUp(i, hi_, hi_ + 1);
        ++hi_;
        buf_[i] = d;
      } else {  // the gap moves up to i
        const std::size_t n = i - gapHi_;
        move(gapHi_, i, gapLo_);
        gapLo_ += n;
        gapHi_ = i;
        buf_[gapLo_++] = d;
      }
    } else {
      buf_[gapLo_++] = d;  // the gap's own place
    }
    Normalize();
    return;
  }
  std::size_t i = Above(lo_, hi_, d.ptr);
  bool low = i - lo_ <= hi_ - i;
  if ((low && lo_ == 0) || (!low && hi_ == buf_.size())) {
    Recenter();
    i = Above(lo_, hi_, d.ptr);
  }
  if (low) {  // buf_[lo_, i) move down by g, leaving a gap of g − 1 after d
    const std::size_t g = std::max<std::size_t>(1, lo_ / 2);
    move(lo_, i, lo_ - g);
    lo_ -= g;
    buf_[i - g] = d;
    gapLo_ = i - g + 1;
    gapHi_ = i;
  } else {  // buf_[i, hi_) move up by g, leaving a gap of g − 1 after d
    const std::size_t g = std::max<std::size_t>(1, (buf_.size() - hi_) / 2);
    moveUp(i, hi_, hi_ + g);
    hi_ += g;
    buf_[i] = d;
    gapLo_ = i + 1;
    gapHi_ = i + g;
  }
  Normalize();
}

// Takes buf_[i] out of the part [from, to): the fewer blocks between it and an end of the part
// move one slot toward it, and that end moves in. Inline: called with references to the list's
// bounds, a call kept them in memory (+0.7 % of a 405B estimate, callgrind).
GPUMEM_EVENT_PATH void FreeBlockIndex::Waiting::RemoveFromPart(std::size_t& from, std::size_t& to,
                                                             std::size_t i) {
  if (i - from < to - 1 - i) {
    for (; i > from; --i) buf_[i] = buf_[i - 1];
    ++from;
  } else {
    for (; i + 1 < to; ++i) buf_[i] = buf_[i + 1];
    --to;
  }
}

// From the part it is in; without a gap, one is opened where it was.
void FreeBlockIndex::Waiting::Erase(std::uint64_t ptr) {
  if (HasGap() && ptr > buf_[gapLo_ - 1].ptr) {  // above the gap
    RemoveFromPart(gapHi_, hi_, Above(gapHi_, hi_, ptr));
  } else if (HasGap()) {  // below it
    RemoveFromPart(lo_, gapLo_, Above(lo_, gapLo_, ptr));
  } else {
    const std::size_t i = Above(lo_, hi_, ptr);
    if (i == lo_) {
      ++lo_;
    } else if (i + 1 == hi_) {
      --hi_;
    } else {
      gapLo_ = i;
      gapHi_ = i + 1;
    }
  }
  Normalize();
}

// Both by binary search: every block of the lower part lies below every one of the upper part
// (without a gap, the two parts are [lo_, gapLo_) and [gapHi_, hi_) all the same).
const FreeBlockIndex::Dup* FreeBlockIndex::Waiting::After(std::uint64_t ptr) const {
  std::size_t i = Above(lo_, gapLo_, ptr + 1);
  if (i < gapLo_) return &buf_[i];
  i = Above(gapHi_, hi_, ptr + 1);
  return i < hi_ ? &buf_[i] : nullptr;
}

const FreeBlockIndex::Dup* FreeBlockIndex::Waiting::Before(std::uint64_t ptr) const {
  std::size_t i = Above(gapHi_, hi_, ptr);
  if (i > gapHi_) return &buf_[i - 1];
  i = Above(lo_, gapLo_, ptr);
  return i > lo_ ? &buf_[i - 1] : nullptr;
}

const FreeBlockIndex::Dup* FreeBlockIndex::Waiting::Find(std::uint64_t ptr) const {
  const bool above = HasGap() && ptr > buf_[gapLo_ - 1].ptr;
  const std::size_t to = above ? hi_ : HasGap() ? gapLo_ : hi_;
  const std::size_t i = Above(above ? gapHi_ : lo_, to, ptr);
  return i < to && buf_[i].ptr == ptr ? &buf_[i] : nullptr;
}

void FreeBlockIndex::EraseBlock(int block, std::int64_t size, std::uint64_t ptr) {
  if (block >= 0 && static_cast<std::size_t>(block) < nodes_.size()) {
    const Node& n = nodes_[static_cast<std::size_t>(block)];
    if (n.bin >= 0 && n.size == size && n.ptr == ptr) {
      EraseNode(block);
      return;
    }
  }
  Erase(size, ptr);
}

void FreeBlockIndex::Erase(std::int64_t size, std::uint64_t ptr) {
  const int bin = BinOf(size);
  for (const Entry& e : bins_[static_cast<std::size_t>(bin)]) {
    if (e.size != size) continue;
    if (e.ptr == ptr) {
      EraseNode(e.block);
      return;
    }
    if (e.more < 0) return;
    if (const Dup* d = waiting_[static_cast<std::size_t>(e.more)].Find(ptr)) EraseNode(d->block);
    return;
  }
  // else not cached (std::set::erase of a missing key)
}


int FreeBlockIndex::PrevBin(int bin) const {
  if (bin < 0) return -1;
  const auto word = static_cast<std::size_t>(bin) >> 6;
  const std::uint64_t here = binBits_[word] & (~std::uint64_t{0} >> (63 - (bin & 63)));
  if (here != 0) return static_cast<int>(word * 64) + 63 - std::countl_zero(here);
  if (word == 0) return -1;
  const std::uint64_t earlier = binSummary_ & ((std::uint64_t{1} << word) - 1);
  if (earlier == 0) return -1;
  const auto w = static_cast<std::size_t>(63 - std::countl_zero(earlier));
  return static_cast<int>(w * 64) + 63 - std::countl_zero(binBits_[w]);
}

int FreeBlockIndex::MaxBlockOf(const Entry& e) const {
  if (e.more < 0) return e.block;
  return waiting_[static_cast<std::size_t>(e.more)].back().block;  // the highest address
}

FreeBlockIndex::Position FreeBlockIndex::First() const {
  const int bin = NextBin(0);
  return {bin < 0 ? -1 : bins_[static_cast<std::size_t>(bin)].front().block};
}

FreeBlockIndex::Position FreeBlockIndex::Last() const {
  const int bin = PrevBin(kBins - 1);
  return {bin < 0 ? -1 : MaxBlockOf(bins_[static_cast<std::size_t>(bin)].back())};
}

// The successor (or predecessor): the next address among the blocks of the same size (a binary
// search of its list: the walks of expandable segments and max_split_size releases; a scan of
// it took 2.8 % of the Mixtral 8x22B solve, whose expandable-segments estimate walks past a
// thousand blocks of one size), else the next size's first.
FreeBlockIndex::Position FreeBlockIndex::Next(Position p) const {
  const Node& n = nodes_[static_cast<std::size_t>(p.node)];
  const Entry* e = EntryOf(n.bin, n.size);
  if (e->more >= 0) {
    if (const Dup* after = waiting_[static_cast<std::size_t>(e->more)].After(n.ptr)) return {after->block};
  }
  const std::vector<Entry>& list = bins_[static_cast<std::size_t>(n.bin)];
  if (e + 1 != list.data() + list.size()) return {(e + 1)->block};
  const int next = NextBin(n.bin + 1);
  return {next < 0 ? -1 : bins_[static_cast<std::size_t>(next)].front().block};
}

FreeBlockIndex::Position FreeBlockIndex::Prev(Position p) const {
  const Node& n = nodes_[static_cast<std::size_t>(p.node)];
  const Entry* e = EntryOf(n.bin, n.size);
  if (e->block != p.node) {  // a waiting block: the entry's block comes before it at least
    const Dup* before = waiting_[static_cast<std::size_t>(e->more)].Before(n.ptr);
    return {before != nullptr ? before->block : e->block};
  }
  const std::vector<Entry>& list = bins_[static_cast<std::size_t>(n.bin)];
  if (e != list.data()) return {MaxBlockOf(*(e - 1))};
  const int before = PrevBin(n.bin - 1);
  return {before < 0 ? -1 : MaxBlockOf(bins_[static_cast<std::size_t>(before)].back())};
}

// ---------------------------------------------------------------------------------------------
// LiveTensors

void LiveTensors::Clear() {
  std::fill(dense_.begin(), dense_.end(), kNotLive);
  sparse_.clear();
}

int LiveTensors::FindSparse(int tensorId) const {
  const auto it = sparse_.find(tensorId);
  return it == sparse_.end() ? kNotLive : it->second;
}

void LiveTensors::SetSlow(int tensorId, int block) {
  if (tensorId >= 0 && tensorId < kDenseIds) {
    const auto id = static_cast<std::size_t>(tensorId);
    dense_.resize(std::max<std::size_t>(id + 1, dense_.size() * 2), kNotLive);
    denseIds_ = static_cast<unsigned>(dense_.size());
    dense_[id] = block;
  } else {
    sparse_[tensorId] = block;
  }
}

void LiveTensors::EraseSparse(int tensorId) { sparse_.erase(tensorId); }

// ---------------------------------------------------------------------------------------------
// BlockPool

void CachingAllocatorModel::BlockPool::Clear(bool small) {
  blocks.Clear();
  unmapped.clear();
  isSmall = small;
  getFreeBlocksCallCount = 0;
}

void CachingAllocatorModel::BlockPool::InsertUnmapped(std::uint64_t ptr, int block) {
  const auto at = std::partition_point(unmapped.begin(), unmapped.end(), [&](const AddressKey& k) { return k.ptr < ptr; });
  unmapped.insert(at, {ptr, block});
}

void CachingAllocatorModel::BlockPool::EraseUnmapped(std::uint64_t ptr) {
  const auto at = std::partition_point(unmapped.begin(), unmapped.end(), [&](const AddressKey& k) { return k.ptr < ptr; });
  if (at != unmapped.end() && at->ptr == ptr) unmapped.erase(at);
}

// ---------------------------------------------------------------------------------------------

CachingAllocatorModel::CachingAllocatorModel(const AllocatorOptions& options, std::int64_t capacityBytes) {
  Reset(options, capacityBytes);
}

void CachingAllocatorModel::Reset(const AllocatorOptions& options, std::int64_t capacityBytes) {
  options_ = options;
  maxSplitSize_ = options.maxSplitSizeMiB > 0 ? options.maxSplitSizeMiB * kMiB : kUnlimited;
  maxNonSplitRounding_ = options.maxNonSplitRoundingMiB * kMiB;
  setFraction_ = options.perProcessMemoryFraction > 0;
  gcEnabled_ = setFraction_ && options.garbageCollectionThreshold > 0;
  roundupDivisions_ = std::any_of(options.roundupPower2Divisions.begin(), options.roundupPower2Divisions.end(),
                                  [](std::int32_t d) { return d > 1; });
  SetCapacity(capacityBytes);
  blocks_.clear();
  gcCountBase_.clear();
  freeSlots_.clear();
  large_.Clear(false);
  small_.Clear(true);
  for (std::size_t k = 0; k < sideStreamsUsed_; ++k) {
    sideStreams_[k].large.Clear(false);
    sideStreams_[k].small.Clear(true);
  }
  sideStreamsUsed_ = 0;
  segments_.clear();
  live_.Clear();
  nextAddress_ = kFirstAddress;
  watchCapacity_ = false;
  reserved_ = allocated_ = requested_ = inactiveSplit_ = 0;
  numAllocRetries_ = numDeviceAllocs_ = numDeviceFrees_ = 0;
  lastOomRounded_ = lastOomAllocSize_ = 0;
}

void CachingAllocatorModel::SetCapacity(std::int64_t capacityBytes) {
  capacity_ = std::max<std::int64_t>(capacityBytes, 0);
  // DeviceCachingAllocator::setMemoryFraction: fraction × total memory.
  allowedMemoryMaximum_ = static_cast<std::int64_t>(options_.perProcessMemoryFraction * static_cast<double>(capacity_));
}

// BlockComparatorSize orders a pool's blocks by stream first, and get_free_block gives up when
// lower_bound lands on another stream's block ("if (it == pool.blocks.end() || (*it)->stream !=
// p.stream()) return false"): each stream's part of a pool is a pool of its own here.
CachingAllocatorModel::BlockPool& CachingAllocatorModel::PoolFor(int stream, bool small) {
  stream = std::clamp(stream, 0, kMaxAllocatorStreams - 1);
  if (stream == 0) return small ? small_ : large_;
  const auto k = static_cast<std::size_t>(stream - 1);
  if (k >= sideStreamsUsed_) {
    if (sideStreams_.size() <= k) sideStreams_.resize(k + 1);
    for (std::size_t j = sideStreamsUsed_; j <= k; ++j) {
      sideStreams_[j].large.Clear(false);
      sideStreams_[j].small.Clear(true);
      sideStreams_[j].large.stream = sideStreams_[j].small.stream = static_cast<std::uint8_t>(j + 1);
    }
    sideStreamsUsed_ = k + 1;
  }
  return small ? sideStreams_[k].small : sideStreams_[k].large;
}

std::int64_t CachingAllocatorModel::GetFreeBlocksCalls(bool small) const {
  std::int64_t calls = (small ? small_ : large_).getFreeBlocksCallCount;
  for (std::size_t k = 0; k < sideStreamsUsed_; ++k) {
    calls += (small ? sideStreams_[k].small : sideStreams_[k].large).getFreeBlocksCallCount;
  }
  return calls;
}

GPUMEM_EVENT_PATH int CachingAllocatorModel::NewBlock(const Block& init) {
  if (!freeSlots_.empty()) {
    const int b = freeSlots_.back();
    freeSlots_.pop_back();
    blocks_[b] = init;
    return b;
  }
  blocks_.push_back(init);
  gcCountBase_.push_back(0);
  return static_cast<int>(blocks_.size()) - 1;
}

void CachingAllocatorModel::DeleteBlock(int b) {
  blocks_[b].size = 0;
  freeSlots_.push_back(b);
}

// BlockPool::insert_into_blocks: stamps the block with the pool's get_free_block call count,
// the clock garbage_collect_cached_blocks measures ages with.
GPUMEM_EVENT_PATH void CachingAllocatorModel::InsertIntoBlocks(BlockPool& pool, int b) {
  if (gcEnabled_) gcCountBase_[b] = GetFreeBlocksCalls(pool.isSmall);
  pool.blocks.Insert({blocks_[b].size, blocks_[b].ptr, b});
}

GPUMEM_EVENT_PATH void CachingAllocatorModel::EraseFromBlocks(BlockPool& pool, int b) {
  pool.blocks.EraseBlock(b, blocks_[b].size, blocks_[b].ptr);
}

// DeviceCachingAllocator::round_size: below 512 B → 512; with roundup_power2_divisions set for
// the request's interval (and the request above 512 × divisions) → the next of `divisions`
// equal steps between two powers of two; otherwise the next multiple of 512.
std::int64_t CachingAllocatorModel::RoundSize(std::int64_t size) const {
  if (!roundupDivisions_) return size < kMinBlockSize ? kMinBlockSize : (size + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
  return RoundAllocationSize(size, options_);
}

// DeviceCachingAllocator::should_split: the small pool (and every expandable segment) splits
// off any remainder of at least 512 B; the large pool only a remainder above 1 MiB, and never
// for a request at or above max_split_size.
GPUMEM_EVENT_PATH bool CachingAllocatorModel::ShouldSplit(int b, std::int64_t size) const {
  const std::int64_t remaining = blocks_[b].size - size;
  if (blocks_[b].small || options_.expandableSegments) return remaining >= kMinBlockSize;
  return size < maxSplitSize_ && remaining > kSmallSize;
}

// DeviceCachingAllocator::get_free_block: the best fit — the smallest cached block at least as
// large as the request, lowest address first among equals — with the oversize rules.
GPUMEM_EVENT_PATH bool CachingAllocatorModel::GetFreeBlock(AllocParams& p) {
  BlockPool& pool = *p.pool;
  // The ages' clock (only the garbage collection reads it, and PyTorch ticks it only while the
  // collection is enabled: unconditional here, one add instead of a test and a branch).
  ++pool.getFreeBlocksCallCount;
  FreeBlockIndex::Position it = pool.blocks.LowerBound(p.size);
  if (FreeBlockIndex::AtEnd(it)) return false;
  // With expandable segments, a block followed by unmapped space counts as the size it can grow
  // to: walk on to the next candidate while it can grow to less. Only such a block can start the
  // walk: any other counts as its own size, and the next candidate is at least as large (the
  // test spared a Next per request: 5 % of a Mixtral 8x22B QLoRA estimate, callgrind). (Only
  // TryAllocateExpandableBlock makes expandable blocks: the option's flag is tested first,
  // without loading the block.)
  auto expandableSize = [&](int b) {
    const Block& blk = blocks_[b];
    return blk.size + (blk.next != kNone && !blocks_[blk.next].mapped ? blocks_[blk.next].size : 0);
  };
  if (options_.expandableSegments && Expandable(pool.blocks.At(it).block) &&
      expandableSize(pool.blocks.At(it).block) != pool.blocks.At(it).size) {
    FreeBlockIndex::Position next = pool.blocks.Next(it);
    while (Expandable(pool.blocks.At(it).block) && !FreeBlockIndex::AtEnd(next) &&
           expandableSize(pool.blocks.At(next).block) < expandableSize(pool.blocks.At(it).block)) {
      it = next;
      next = pool.blocks.Next(next);
    }
  }
  const FreeBlockIndex::Key found = pool.blocks.At(it);
  // Do not return an oversized block for a request below max_split_size.
  if (p.size < maxSplitSize_ && found.size >= maxSplitSize_) return false;
  // An oversize request may take a cached block at most max_non_split_rounding larger.
  if (p.size >= maxSplitSize_ && found.size >= p.size + maxNonSplitRounding_) return false;
  p.block = found.block;
  pool.blocks.EraseAt(it);
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
  // (new Block(p.device(), p.stream(), size, p.pool, ptr): the segment is the request's stream's.)
  const int b = NewBlock({.ptr = nextAddress_, .size = p.allocSize, .small = p.pool->isSmall, .stream = p.pool->stream});
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
  FreeBlockIndex::Position it = pool.blocks.LowerBound(keySize);
  if (FreeBlockIndex::AtEnd(it)) {
    if (pool.blocks.empty()) return false;
    std::int64_t totalReleased = 0;
    it = pool.blocks.Last();  // the largest block
    while (totalReleased < keySize && pool.blocks.At(it).size >= maxSplitSize_) {
      const int b = pool.blocks.At(it).block;
      // The one before, found before releasing b: erasing b leaves positions before it valid.
      const FreeBlockIndex::Position before = pool.blocks.Prev(it);
      // PyTorch would assert on an expandable block here (release_block); they are skipped.
      if (!Expandable(b)) {
        totalReleased += blocks_[b].size;
        ReleaseBlock(b);
      }
      if (FreeBlockIndex::AtEnd(before)) break;
      it = before;
    }
    return totalReleased >= keySize;
  }
  const int b = pool.blocks.At(it).block;
  if (Expandable(b)) return false;
  ReleaseBlock(b);
  return true;
}

// DeviceCachingAllocator::release_cached_blocks → release_blocks on both pools: cudaFree every
// cached block that is a whole segment (not split); with expandable segments, unmap every
// whole free page and drop a segment left with nothing mapped. release_blocks walks the whole
// pool, so every stream's free segments go, not only the request's (the OOM retry of malloc
// frees the side streams' cache too).
bool CachingAllocatorModel::ReleaseCachedBlocks() {
  ReleaseBlocks(large_);
  for (std::size_t k = 0; k < sideStreamsUsed_; ++k) ReleaseBlocks(sideStreams_[k].large);
  ReleaseBlocks(small_);
  for (std::size_t k = 0; k < sideStreamsUsed_; ++k) ReleaseBlocks(sideStreams_[k].small);
  return true;
}

void CachingAllocatorModel::ReleaseBlocks(BlockPool& pool) {
  std::vector<int>& toRelease = toRelease_;
  std::vector<int>& toUnmap = toUnmap_;
  toRelease.clear();
  toUnmap.clear();
  pool.blocks.ForEach([&](const FreeBlockIndex::Key& key) {
    if (Expandable(key.block)) {
      toUnmap.push_back(key.block);
    } else if (!IsSplit(key.block)) {
      toRelease.push_back(key.block);
    }
  });
  for (int b : toRelease) ReleaseBlock(b);
  for (int b : toUnmap) {
    UnmapBlock(b);
    // release_expandable_segment: the whole virtual range is unmapped again.
    if (!blocks_[b].mapped && !IsSplit(b)) {
      pool.EraseUnmapped(blocks_[b].ptr);
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
  // The whole large pool, every stream's blocks (PyTorch walks large_blocks.blocks), aged by
  // the pool's one clock.
  const std::int64_t clock = GetFreeBlocksCalls(false);
  auto age = [&](int b) { return clock - gcCountBase_[b]; };
  auto forEachLarge = [&](auto&& f) {
    large_.blocks.ForEach(f);
    for (std::size_t k = 0; k < sideStreamsUsed_; ++k) sideStreams_[k].large.blocks.ForEach(f);
  };
  forEachLarge([&](const FreeBlockIndex::Key& key) {
    if (!IsSplit(key.block) && !Expandable(key.block)) {
      totalAge += age(key.block);
      ++freeable;
    }
  });
  if (freeable == 0) return;
  bool blockFreed = true;
  while (reclaimed < targetSize && blockFreed && freeable > 0) {
    const double ageThreshold = static_cast<double>(totalAge) / freeable;
    blockFreed = false;
    std::vector<int>& victims = toRelease_;
    victims.clear();
    forEachLarge([&](const FreeBlockIndex::Key& key) {
      if (!IsSplit(key.block) && !Expandable(key.block) && static_cast<double>(age(key.block)) >= ageThreshold) {
        victims.push_back(key.block);
      }
    });
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
GPUMEM_EVENT_PATH int CachingAllocatorModel::AllocFoundBlock(const AllocParams& p, std::int64_t origSize, bool splitRemainder,
                                           int tensorId) {
  int b = p.block;
  const bool alreadySplit = IsSplit(b);
  const bool expandable = options_.expandableSegments && Expandable(b);
  if (splitRemainder) {
    const int remaining = b;
    {
      const Block& rem = blocks_[remaining];  // read before NewBlock may move the blocks
      b = NewBlock({.ptr = rem.ptr, .size = p.size, .prev = rem.prev, .next = remaining, .segment = rem.segment,
                    .small = rem.small, .stream = rem.stream});
    }
    Block& blk = blocks_[b];
    Block& rem = blocks_[remaining];
    if (blk.prev != kNone) blocks_[blk.prev].next = b;
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
CachingAllocatorModel::MallocOutcome CachingAllocatorModel::Malloc(int tensorId, std::int64_t requestedBytes,
                                                                   int stream) {
  // CUDACachingAllocator::allocate: a zero-byte request gets no block.
  if (requestedBytes == 0) {
    live_.Set(tensorId, kNone);
    return MallocOutcome::Allocated;
  }
  AllocParams p;
  p.size = RoundSize(requestedBytes);
  // get_pool, of the request's stream (AllocParams' search_key carries the stream).
  if (stream == 0) [[likely]] {
    p.pool = p.size <= kSmallSize ? &small_ : &large_;
  } else {
    p.pool = &PoolFor(stream, p.size <= kSmallSize);
  }
  bool found = GetFreeBlock(p);
  if (!found) {
    // get_allocation_size: only needed here (most requests find a cached block).
    p.allocSize = SegmentAllocationSize(p.size);
    if (gcEnabled_) GarbageCollectCachedBlocks();
    found = AllocBlock(p, false);
    // Nothing has changed yet (no garbage collection while watching; a failed get_free_block
    // and a refused cudaMalloc leave the model as it was).
    if (!found && watchCapacity_) return MallocOutcome::CapacityMiss;
    found = found || (ReleaseAvailableCachedBlocks(p) && AllocBlock(p, false)) ||
            (ReleaseCachedBlocks() && AllocBlock(p, true));
  }
  if (!found) {
    lastOomRounded_ = p.size;
    lastOomAllocSize_ = p.allocSize;
    return MallocOutcome::OutOfMemory;
  }
  const bool split = ShouldSplit(p.block, p.size);
  live_.Set(tensorId, AllocFoundBlock(p, requestedBytes, split, tensorId));
  return MallocOutcome::Allocated;
}

// DeviceCachingAllocator::free → free_block (no recorded streams: no events). The block goes
// back to its segment's stream's pool whichever stream the tensor was last used on.
bool CachingAllocatorModel::Free(int tensorId) {
  const int b = live_.Find(tensorId);
  if (b == LiveTensors::kNotLive) return false;
  live_.Erase(tensorId);
  if (b == kNone) return true;
  Block& blk = blocks_[b];
  blk.allocated = false;
  allocated_ -= blk.size;
  requested_ -= blk.requestedSize;
  // (requestedSize and tensorId are read only while allocated: Snapshot; alloc sets both.)
  FreeBlock(b);
  return true;
}

// DeviceCachingAllocator::free_block: merge with free neighbours of the same segment, cache.
GPUMEM_EVENT_PATH void CachingAllocatorModel::FreeBlock(int b) {
  BlockPool& pool = PoolOf(b);
  std::int64_t netInactiveSplit = 0;
  const int candidates[2] = {blocks_[b].prev, blocks_[b].next};
  for (int c : candidates) netInactiveSplit -= TryMergeBlocks(b, c, pool);
  InsertIntoBlocks(pool, b);
  if (IsSplit(b)) netInactiveSplit += blocks_[b].size;
  // inactive_split leaves expandable segments out (their free pages can always be released).
  if (!options_.expandableSegments || !Expandable(b)) inactiveSplit_ += netInactiveSplit;
}

// DeviceCachingAllocator::try_merge_blocks: src joins dst when free and in the same mapped
// state; returns the bytes subsumed.
GPUMEM_EVENT_PATH std::int64_t CachingAllocatorModel::TryMergeBlocks(int dst, int src, BlockPool& pool) {
  if (src == kNone || blocks_[src].allocated || blocks_[dst].mapped != blocks_[src].mapped) return 0;
  Block& d = blocks_[dst];
  const Block& s = blocks_[src];  // src ≠ dst, and nothing below writes src before DeleteBlock
  const std::int64_t subsumed = s.size;
  if (d.prev == src) {
    d.ptr = s.ptr;
    d.prev = s.prev;
    if (d.prev != kNone) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNone) blocks_[d.next].prev = dst;
  }
  d.size += subsumed;
  if (s.mapped) {
    pool.blocks.EraseBlock(src, subsumed, s.ptr);
  } else {
    pool.EraseUnmapped(s.ptr);
  }
  DeleteBlock(src);
  return subsumed;
}

// ---------------------------------------------------------------------------------------------
// Expandable segments (Note [Expandable Segments]): one virtual range per pool and stream
// (find_expandable_block only looks at unmapped ranges of the request's stream, and makes
// `new ExpandableSegment(device, stream, …)` otherwise; here each stream's pool keeps its own)
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
  for (const AddressKey& key : pool.unmapped) {  // (find_expandable_block does not change it)
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
  blk.stream = pool.stream;
  blk.mapped = false;
  blk.segment = static_cast<int>(segments_.size()) - 1;
  pool.InsertUnmapped(blk.ptr, b);
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
  pool.EraseUnmapped(blocks_[b].ptr);
  blocks_[b].mapped = true;
  if (mappedBytes < blocks_[b].size) {
    const int rest = NewBlock();
    Block& r = blocks_[rest];
    const Block& blk = blocks_[b];
    r.ptr = blk.ptr + static_cast<std::uint64_t>(mappedBytes);
    r.size = blk.size - mappedBytes;
    r.small = blk.small;
    r.stream = blk.stream;
    r.segment = blk.segment;
    r.mapped = false;
    r.prev = b;
    r.next = blk.next;
    if (r.next != kNone) blocks_[r.next].prev = rest;
    blocks_[b].next = rest;
    blocks_[b].size = mappedBytes;
    pool.InsertUnmapped(r.ptr, rest);
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
    f.stream = blocks_[b].stream;
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
    f.stream = blocks_[b].stream;
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
  pool.InsertUnmapped(blocks_[b].ptr, b);
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
    segment.stream = blocks_[b].stream;  // SegmentInfo::stream (head_block->stream)
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

AllocatorOom CachingAllocatorModel::DescribeOom(int tensorId, std::int64_t requestedBytes, bool withSegments) const {
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
  // Every stream's cached blocks are free memory the message counts (cudaMemGetInfo does not
  // know streams; nor does "reserved but unallocated").
  std::vector<const BlockPool*> pools = {&large_, &small_};
  for (std::size_t k = 0; k < sideStreamsUsed_; ++k) {
    pools.push_back(&sideStreams_[k].large);
    pools.push_back(&sideStreams_[k].small);
  }
  for (const BlockPool* pool : pools) {
    pool->blocks.ForEach([&](const FreeBlockIndex::Key& key) {
      oom.cachedFreeBytes += key.size;
      ++oom.cachedFreeBlocks;
    });
    if (!pool->blocks.empty()) {
      oom.largestCachedFreeBlockBytes = std::max(oom.largestCachedFreeBlockBytes, pool->blocks.At(pool->blocks.Last()).size);
    }
  }
  oom.freeBytes = oom.unreservedBytes + oom.cachedFreeBytes;
  oom.freeFragments = oom.cachedFreeBlocks + (oom.unreservedBytes > 0 ? 1 : 0);
  oom.largestFreeBlockBytes = std::max(oom.largestCachedFreeBlockBytes, oom.unreservedBytes);
  if (withSegments) oom.segments = Snapshot();
  return oom;
}

}  // namespace gpumem::device

// =============================================================================================
// Public API.

namespace gpumem {

using device::kMiB;

AllocatorOptions DefaultAllocatorOptions() { return AllocatorOptions{}; }

std::int64_t RoundAllocationSize(std::int64_t requestedBytes, const AllocatorOptions& options) {
  if (requestedBytes < device::kMinBlockSize) return device::kMinBlockSize;
  const int divisions = device::DivisionsFor(options, requestedBytes);
  if (divisions > 1 && requestedBytes > device::kMinBlockSize * divisions) {
    return device::RoundupPower2NextDivision(requestedBytes, divisions);
  }
  return device::kMinBlockSize * device::CeilDiv(requestedBytes, device::kMinBlockSize);
}

// DeviceCachingAllocator::get_allocation_size.
std::int64_t SegmentAllocationSize(std::int64_t roundedBytes) {
  if (roundedBytes <= device::kSmallSize) return device::kSmallBuffer;
  if (roundedBytes < device::kMinLargeAlloc) return device::kLargeBuffer;
  return device::kRoundLarge * device::CeilDiv(roundedBytes, device::kRoundLarge);
}

namespace {

using Model = device::CachingAllocatorModel;

// The models of this thread, reused so that their buffers keep their capacity (an estimate
// runs the allocator once or twice, and once more up to the reserved peak for its segments; a
// solver hundreds of times): 0 at capacity, 1 without a limit, 2 for the segments at the peak.
Model& ThreadModel(int which) {
  GPUMEM_THREAD_LOCAL Model models[3] = {Model(DefaultAllocatorOptions(), 0), Model(DefaultAllocatorOptions(), 0),
                                  Model(DefaultAllocatorOptions(), 0)};
  return models[which];
}

bool IsAllocEvent(const AllocatorEvent& e) { return e.kind == AllocatorEventKind::Alloc; }
bool IsAllocEvent(const Event& e) { return e.kind == EventKind::Alloc; }
// A trace's own events are allocations and frees only (the device stage places empty_cache
// calls between them as AllocatorEvents), so their loop has no test for it.
bool IsEmptyCacheEvent(const AllocatorEvent& e) { return e.kind == AllocatorEventKind::EmptyCache; }
constexpr bool IsEmptyCacheEvent(const Event&) { return false; }

std::size_t EventCount(AllocatorEventRuns runs) {
  std::size_t n = 0;
  for (const AllocatorEventRun& r : runs) n += r.count;
  return n;
}

// The running peaks of RunEvents, kept in locals by RunSpan and written back once.
struct RunningPeaks {
  std::int64_t reserved = 0, allocated = 0, requested = 0;
};

// Runs events[first, count) of one run, whose event k is allocator event base + k, keeping
// the figures after each event. Returns false at the run's end; true where the run stopped (an
// OOM, or a capacity miss when watching: then `miss` is its index), with `stoppedAt` its index.
// A template on the event type so that the device stage's trace events are read where they
// are (no copy into AllocatorEvents), and on the timeline so that the loop without one has no
// test for it.
template <bool kTimeline, typename E>
bool RunSpan(Model& model, AllocatorResult& result, const E* events, std::size_t count, std::size_t base,
             std::size_t first, RunningPeaks& peaks, const AllocatorRecording& recording, std::size_t& stoppedAt,
             int& miss) {
  std::int64_t peakReserved = peaks.reserved;
  std::int64_t peakAllocated = peaks.allocated;
  std::int64_t peakRequested = peaks.requested;
  bool stopped = false;
  for (std::size_t k = first; k < count; ++k) {
    const E& e = events[k];
    const int index = static_cast<int>(base + k);
    if (IsAllocEvent(e)) {
      if (e.bytes < 0) {
        ++result.invalidEvents;
      } else if (model.IsLive(e.tensorId)) {
        ++result.duplicateAllocs;
      } else {
        const Model::MallocOutcome outcome = model.Malloc(e.tensorId, e.bytes, e.stream);
        if (outcome == Model::MallocOutcome::OutOfMemory) {
          result.oom = model.DescribeOom(e.tensorId, e.bytes, recording.segmentsAtOom);
          result.oom.eventIndex = index;
          stoppedAt = base + k;
          stopped = true;
          break;
        }
        if (outcome == Model::MallocOutcome::CapacityMiss) {
          miss = index;
          stoppedAt = base + k;
          stopped = true;
          break;
        }
      }
      // Reserved, allocated and requested only grow in an allocation (a free caches its block
      // and releases nothing: free_block), so the peaks are checked after allocations only.
      const std::int64_t reserved = model.reserved();
      const std::int64_t allocated = model.allocated();
      if (reserved > peakReserved) {
        peakReserved = reserved;
        result.peakReservedEvent = index;
        result.allocatedAtPeakReservedBytes = allocated;
        result.unallocatedAtPeakReservedBytes = reserved - allocated;
        result.inactiveSplitAtPeakReservedBytes = model.inactiveSplit();
      }
      if (allocated > peakAllocated) {
        peakAllocated = allocated;
        result.peakAllocatedEvent = index;
      }
      peakRequested = std::max(peakRequested, model.requested());
    } else if (IsEmptyCacheEvent(e)) {
      model.EmptyCache();  // reserved only falls: no peak to check
    } else if (!model.Free(e.tensorId)) {
      ++result.unmatchedFrees;
    }
    if (kTimeline) {
      result.reservedBytesAfterEvent.push_back(model.reserved());
      result.allocatedBytesAfterEvent.push_back(model.allocated());
    }
  }
  peaks = {peakReserved, peakAllocated, peakRequested};
  return stopped;
}

// Runs events [from, end) until the end or an OOM; returns the index of a capacity miss (the
// model watching), else −1.
template <bool kTimeline>
int RunEvents(Model& model, AllocatorResult& result, AllocatorEventRuns runs, std::size_t from,
              const AllocatorRecording& recording) {
  const std::size_t total = EventCount(runs);
  if (kTimeline) {
    result.reservedBytesAfterEvent.reserve(total);
    result.allocatedBytesAfterEvent.reserve(total);
  }
  RunningPeaks peaks{result.peakReservedBytes, result.peakAllocatedBytes, result.peakRequestedBytes};
  int miss = -1;
  std::size_t i = total;  // where the run stopped: all events done, or the one it stopped at
  std::size_t base = 0;
  for (const AllocatorEventRun& r : runs) {
    if (from < base + r.count) {
      const std::size_t first = from > base ? from - base : 0;
      const bool stopped =
          r.trace != nullptr
              ? RunSpan<kTimeline>(model, result, r.trace, r.count, base, first, peaks, recording, i, miss)
              : RunSpan<kTimeline>(model, result, r.events, r.count, base, first, peaks, recording, i, miss);
      if (stopped) break;
    }
    base += r.count;
  }
  if (i > from) result.eventsSimulated = static_cast<int>(i);  // the events done: all before i
  result.peakReservedBytes = peaks.reserved;
  result.peakAllocatedBytes = peaks.allocated;
  result.peakRequestedBytes = peaks.requested;
  return miss;
}

int RunFrom(Model& model, AllocatorResult& result, AllocatorEventRuns runs, std::size_t from,
            const AllocatorRecording& recording) {
  return recording.timeline ? RunEvents<true>(model, result, runs, from, recording)
                            : RunEvents<false>(model, result, runs, from, recording);
}

void Finish(const Model& model, AllocatorResult& result) {
  result.numAllocRetries = model.allocRetries();
  result.numDeviceAllocs = model.deviceAllocs();
  result.numDeviceFrees = model.deviceFrees();
  result.finalReservedBytes = model.reserved();
  result.finalAllocatedBytes = model.allocated();
}

// The segments at the reserved peak: a second pass up to the peak event, cheaper than a
// snapshot at every new maximum.
void AddSegmentsAtPeak(AllocatorEventRuns runs, const AllocatorOptions& options, std::int64_t capacityBytes,
                       AllocatorResult& result) {
  if (result.peakReservedEvent < 0) return;
  // A reused model (Reset keeps its buffers): constructing one zeroed its 1,920 bins each time.
  Model& model = ThreadModel(2);
  model.Reset(options, capacityBytes);
  std::size_t left = static_cast<std::size_t>(result.peakReservedEvent) + 1;  // events up to the peak's
  auto replay = [&](const auto* events, std::size_t count) {
    for (std::size_t k = 0; k < count && left > 0; ++k, --left) {
      const auto& e = events[k];
      if (IsAllocEvent(e)) {
        if (e.bytes >= 0 && !model.IsLive(e.tensorId)) model.Malloc(e.tensorId, e.bytes, e.stream);
      } else if (IsEmptyCacheEvent(e)) {
        model.EmptyCache();
      } else {
        model.Free(e.tensorId);
      }
    }
  };
  for (const AllocatorEventRun& r : runs) {
    if (r.trace != nullptr) {
      replay(r.trace, r.count);
    } else {
      replay(r.events, r.count);
    }
  }
  result.segmentsAtPeakReserved = model.Snapshot();
}

}  // namespace

AllocatorResult SimulateCachingAllocator(std::span<const AllocatorEvent> events, const AllocatorOptions& options,
                                         std::int64_t capacityBytes, const AllocatorRecording& recording) {
  const AllocatorEventRun all{.events = events.data(), .count = events.size()};
  const AllocatorEventRuns runs(&all, 1);
  AllocatorResult result;
  Model& model = ThreadModel(0);
  model.Reset(options, capacityBytes);
  RunFrom(model, result, runs, 0, recording);
  Finish(model, result);
  if (recording.segmentsAtPeak) AddSegmentsAtPeak(runs, options, capacityBytes, result);
  return result;
}

AllocatorCapacityRun SimulateCachingAllocatorAtCapacity(std::span<const AllocatorEvent> events,
                                                        const AllocatorOptions& options, std::int64_t capacityBytes,
                                                        const AllocatorRecording& recording) {
  const AllocatorEventRun all{.events = events.data(), .count = events.size()};
  return SimulateCachingAllocatorAtCapacity(AllocatorEventRuns(&all, 1), options, capacityBytes, recording);
}

// Up to the first cudaMalloc the capacity refuses, a run at capacity and a run without a limit
// do exactly the same: the capacity enters the model only in alloc_block's test (and, not
// watched, in expandable segments' virtual size and the garbage collection's threshold). So the
// capacity run watches for that first miss; there a copy of the model, its limit lifted, is
// the unlimited run's state, and it goes on from that event only if the capacity run ends in an
// OOM. Expandable segments and garbage collection take a second run from the start instead.
AllocatorCapacityRun SimulateCachingAllocatorAtCapacity(AllocatorEventRuns events, const AllocatorOptions& options,
                                                        std::int64_t capacityBytes,
                                                        const AllocatorRecording& recording) {
  AllocatorCapacityRun run;
  Model& capped = ThreadModel(0);
  capped.Reset(options, capacityBytes);
  const bool watch = capped.CanWatchCapacity();
  capped.WatchCapacity(watch);
  const int miss = RunFrom(capped, run.atCapacity, events, 0, recording);
  run.capacityReached = miss >= 0 || !watch;
  Model& unlimited = ThreadModel(1);
  if (miss >= 0) {
    unlimited = capped;  // the state before event `miss`, as the unlimited run has it too
    unlimited.SetCapacity(kUnlimitedDeviceBytes);
    unlimited.WatchCapacity(false);
    run.unlimited = run.atCapacity;
    capped.WatchCapacity(false);
    RunFrom(capped, run.atCapacity, events, static_cast<std::size_t>(miss), recording);
    if (run.atCapacity.oom.happened) {
      run.sharedEvents = miss;
      RunFrom(unlimited, run.unlimited, events, static_cast<std::size_t>(miss), recording);
      Finish(unlimited, run.unlimited);
    } else {
      run.unlimited = AllocatorResult{};
    }
  } else if (run.atCapacity.oom.happened) {  // not watched: a second run from the start
    unlimited.Reset(options, kUnlimitedDeviceBytes);
    RunFrom(unlimited, run.unlimited, events, 0, recording);
    Finish(unlimited, run.unlimited);
  }
  Finish(capped, run.atCapacity);
  if (recording.segmentsAtPeak) {
    AddSegmentsAtPeak(events, options, capacityBytes, run.atCapacity);
    if (run.atCapacity.oom.happened) AddSegmentsAtPeak(events, options, kUnlimitedDeviceBytes, run.unlimited);
  }
  return run;
}

}  // namespace gpumem
