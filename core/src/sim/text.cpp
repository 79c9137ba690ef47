// Text parts and their rendering; each kind renders exactly as format.hpp's eager functions.
#include "gpumem/text.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <type_traits>

#include "gpumem/format.hpp"
#include "gpumem/recycle.hpp"

namespace gpumem {

static_assert(std::is_trivially_copyable_v<TextPart>);

Shape::Shape(std::initializer_list<std::int64_t> list) {
  for (std::int64_t d : list) push_back(d);
}

Shape::Shape(const std::vector<std::int64_t>& list) {
  for (std::int64_t d : list) push_back(d);
}

std::int64_t Shape::Elements() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i) if (dims[i] != o.dims[i]) return false;
  return true;
}

TextPart TextPart::View(std::string_view s) {
  TextPart p;
  p.kind = kStr;
  p.n = static_cast<std::uint32_t>(s.size());
  p.str = s.data();
  return p;
}

TextPart TextPart::Int(std::int64_t v) {
  TextPart p;
  p.kind = kInt;
  p.value = v;
  return p;
}

TextPart TextPart::Count(std::int64_t v) {
  TextPart p;
  p.kind = kCount;
  p.value = v;
  return p;
}

TextPart TextPart::Bytes(DType type) {
  TextPart p;
  p.kind = kBytes;
  p.type = type;
  return p;
}

TextStore::TextStore(TextStore&& o) noexcept
    : parts_(std::exchange(o.parts_, nullptr)), size_(std::exchange(o.size_, 0)),
      capacity_(std::exchange(o.capacity_, 0)), dims_(std::exchange(o.dims_, nullptr)),
      dimSize_(std::exchange(o.dimSize_, 0)), dimCapacity_(std::exchange(o.dimCapacity_, 0)),
      series_(std::move(o.series_)), copies_(std::move(o.copies_)),
      copiedParts_(std::exchange(o.copiedParts_, {})), copiedDims_(std::exchange(o.copiedDims_, {})),
      owned_(std::move(o.owned_)) {}

TextStore& TextStore::operator=(TextStore&& o) noexcept {
  if (this != &o) {
    std::free(parts_);
    parts_ = std::exchange(o.parts_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    std::free(dims_);
    dims_ = std::exchange(o.dims_, nullptr);
    dimSize_ = std::exchange(o.dimSize_, 0);
    dimCapacity_ = std::exchange(o.dimCapacity_, 0);
    series_ = std::move(o.series_);
    copies_ = std::move(o.copies_);
    copiedParts_ = std::exchange(o.copiedParts_, {});
    copiedDims_ = std::exchange(o.copiedDims_, {});
    owned_ = std::move(o.owned_);
  }
  return *this;
}

namespace {
// The parts and dimension buffers of the last store on this thread, kept for the next (see
// recycle.hpp).
template <typename T>
struct SpareBuffer {
  T* data = nullptr;
  std::size_t capacity = 0;
  ~SpareBuffer() { std::free(data); }
  void Take(T*& into, std::size_t& capacityInto) {
    into = std::exchange(data, nullptr);
    capacityInto = std::exchange(capacity, 0);
  }
  void Give(T*& from, std::size_t capacityFrom) {
    if (capacityFrom > capacity) {
      std::free(data);
      data = std::exchange(from, nullptr);
      capacity = capacityFrom;
    }
    std::free(from);
    from = nullptr;
  }
};
SpareBuffer<TextPart>& SpareParts() {
  GPUMEM_THREAD_LOCAL SpareBuffer<TextPart> spare;
  return spare;
}
SpareBuffer<std::int64_t>& SpareDims() {
  GPUMEM_THREAD_LOCAL SpareBuffer<std::int64_t> spare;
  return spare;
}
}  // namespace

TextStore::TextStore() {
  SpareParts().Take(parts_, capacity_);
  SpareDims().Take(dims_, dimCapacity_);
}

TextStore::~TextStore() {
  SpareParts().Give(parts_, capacity_);
  SpareDims().Give(dims_, dimCapacity_);
}

// A plain buffer like parts_: a std::vector zeroed what it grew by (a quarter of a million
// instructions per estimate in memset, callgrind counting its stores).
void TextStore::GrowDims(std::size_t needed) {
  std::size_t capacity = dimCapacity_ ? dimCapacity_ : 4096;
  while (capacity < needed) capacity *= 2;
  void* grown = std::realloc(dims_, capacity * sizeof(std::int64_t));
  if (!grown) std::abort();  // out of memory: nothing sensible is left to do
  dims_ = static_cast<std::int64_t*>(grown);
  dimCapacity_ = capacity;
}

void TextStore::Reserve(std::size_t parts) {
  if (parts > capacity_) Grow(parts);
}

void TextStore::Grow(std::size_t needed) {
  std::size_t capacity = capacity_ ? capacity_ : 1024;
  while (capacity < needed) capacity *= 2;
  void* grown = std::realloc(parts_, capacity * sizeof(TextPart));
  if (!grown) std::abort();  // out of memory: nothing sensible is left to do
  parts_ = static_cast<TextPart*>(grown);
  capacity_ = capacity;
}


Text TextStore::Shape(const gpumem::Shape& shape, DType type) {
  if (!enabled_) return {};
  if (size_ + 1 > capacity_) Grow(size_ + 1);
  TextPart& p = parts_[size_];
  p.kind = TextPart::kShape;
  p.type = type;
  p.rank = static_cast<std::uint16_t>(shape.rank);
  p.n = static_cast<std::uint32_t>(dimSize_);
  p.value = 0;
  // All kMaxRank dimensions are copied (three vector moves, where a loop of `rank` took
  // eighteen instructions); only `rank` of them are kept.
  if (dimSize_ + gpumem::Shape::kMaxRank > dimCapacity_) GrowDims(dimSize_ + gpumem::Shape::kMaxRank);
  std::memcpy(dims_ + dimSize_, shape.dims, sizeof shape.dims);
  dimSize_ += static_cast<std::size_t>(shape.rank);
  return Text{static_cast<std::uint32_t>(size_++), 1};
}

Text TextStore::Size(std::initializer_list<std::int64_t> dims, DType type) {
  if (!enabled_) return {};
  TextPart p = TextPart::Int(0);
  p.kind = TextPart::kSize;
  p.type = type;
  p.rank = static_cast<std::uint16_t>(dims.size());
  p.n = static_cast<std::uint32_t>(dimSize_);
  std::int64_t* out = AppendDims(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) out[i] = dims.begin()[i];
  return Add(&p, 1);
}

int TextStore::AddSeries(std::vector<TextPart> parts, std::vector<std::int64_t> dims,
                         const std::vector<PartStepRule>& positionSteps, const std::vector<PartStepRule>& numberSteps,
                         std::vector<std::uint32_t> names) {
  if (!enabled_) return -1;
  Series s;
  const std::size_t n = parts.size();
  s.positionStep.assign(n, 0);
  s.numberStep.assign(n, 0);
  s.nameSlot.assign(n, -1);
  for (const PartStepRule& r : positionSteps) s.positionStep[r.index] = r.delta;
  for (const PartStepRule& r : numberSteps) s.numberStep[r.index] = r.delta;
  for (std::size_t slot = 0; slot < names.size(); ++slot) s.nameSlot[names[slot]] = static_cast<std::int32_t>(slot);
  s.nameCount = names.size();
  s.parts = std::move(parts);
  s.dims = std::move(dims);
  series_.push_back(std::move(s));
  return static_cast<int>(series_.size()) - 1;
}

void TextStore::AppendCopy(int series, std::int64_t k, const TextPart* names) {
  if (!enabled_ || series < 0) return;
  Series& s = series_[static_cast<std::size_t>(series)];
  if (s.parts.empty() && s.dims.empty()) return;
  if (copies_.empty()) {
    copiedParts_.first = size_;
    copiedDims_.first = dimSize_;
  }
  copies_.push_back({size_, dimSize_, series, k, s.names.size()});
  s.names.insert(s.names.end(), names, names + s.nameCount);
  // Positions only: what lies there is never read (part() and dim() compute it).
  if (size_ + s.parts.size() > capacity_) Grow(size_ + s.parts.size());
  size_ += s.parts.size();
  AppendDims(s.dims.size());
  copiedParts_.second = size_;
  copiedDims_.second = dimSize_;
}

TextPart TextStore::CopiedPart(std::size_t i) const {
  // The last copy that starts at or before i (copies are appended in position order).
  auto it = std::upper_bound(copies_.begin(), copies_.end(), i,
                             [](std::size_t x, const Copy& c) { return x < c.partFrom; });
  const Copy& c = *(it - 1);
  const Series& s = series_[static_cast<std::size_t>(c.series)];
  const std::size_t j = i - c.partFrom;
  if (j >= s.parts.size()) return parts_[i];  // written after that copy
  TextPart p = s.parts[j];
  if (s.nameSlot[j] >= 0) return s.names[c.names + static_cast<std::size_t>(s.nameSlot[j])];
  p.n = static_cast<std::uint32_t>(p.n + c.k * s.positionStep[j]);
  p.value += c.k * s.numberStep[j];
  return p;
}

std::int64_t TextStore::CopiedDim(std::size_t i) const {
  auto it = std::upper_bound(copies_.begin(), copies_.end(), i,
                             [](std::size_t x, const Copy& c) { return x < c.dimFrom; });
  const Copy& c = *(it - 1);
  const Series& s = series_[static_cast<std::size_t>(c.series)];
  const std::size_t j = i - c.dimFrom;
  return j < s.dims.size() ? s.dims[j] : dims_[i];
}

std::string_view TextStore::Keep(std::string s) {
  owned_.push_back(std::move(s));
  return owned_.back();
}

std::string TextStore::Render(Text text) const {
  std::string out;
  RenderTo(text, out);
  return out;
}

void TextStore::RenderTo(Text text, std::string& out) const {
  for (std::uint32_t i = text.begin; i < text.begin + text.count; ++i) {
    const TextPart p = part(i);
    switch (p.kind) {
      case TextPart::kStr: out.append(p.str, p.n); break;
      case TextPart::kInt: out += std::to_string(p.value); break;
      case TextPart::kCount: out += FormatCount(p.value); break;
      case TextPart::kRef: RenderTo(Text{p.n, static_cast<std::uint32_t>(p.value)}, out); break;
      case TextPart::kBytes: out += BytesOf(p.type); break;
      case TextPart::kShape: {
        std::vector<std::int64_t> dims(p.rank);
        for (std::uint32_t k = 0; k < p.rank; ++k) dims[k] = dim(p.n + k);
        out += ShapeFormula(dims, p.type);
        break;
      }
      case TextPart::kSize: {
        for (std::uint32_t k = 0; k < p.rank; ++k) out += FormatCount(dim(p.n + k)) + " × ";
        out += BytesOf(p.type);
        break;
      }
    }
  }
}

}  // namespace gpumem
