// Text parts and their rendering; each kind renders exactly as format.hpp's eager functions.
#include "gpumem/text.hpp"

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
      capacity_(std::exchange(o.capacity_, 0)), dims_(std::move(o.dims_)), owned_(std::move(o.owned_)) {}

TextStore& TextStore::operator=(TextStore&& o) noexcept {
  if (this != &o) {
    std::free(parts_);
    parts_ = std::exchange(o.parts_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    dims_ = std::move(o.dims_);
    owned_ = std::move(o.owned_);
  }
  return *this;
}

namespace {
// The parts buffer of the last store on this thread, kept for the next (see recycle.hpp).
struct SpareParts {
  TextPart* parts = nullptr;
  std::size_t capacity = 0;
  ~SpareParts() { std::free(parts); }
};
SpareParts& Spare() {
  thread_local SpareParts spare;
  return spare;
}
}  // namespace

TextStore::TextStore() : dims_(Recycled<std::int64_t>::Take()) {
  SpareParts& spare = Spare();
  parts_ = std::exchange(spare.parts, nullptr);
  capacity_ = std::exchange(spare.capacity, 0);
}

TextStore::~TextStore() {
  SpareParts& spare = Spare();
  if (capacity_ > spare.capacity) {
    std::free(spare.parts);
    spare.parts = std::exchange(parts_, nullptr);
    spare.capacity = capacity_;
  }
  std::free(parts_);
  Recycled<std::int64_t>::Give(std::move(dims_));
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
  p.n = static_cast<std::uint32_t>(dims_.size());
  p.value = 0;
  dims_.insert(dims_.end(), shape.dims, shape.dims + shape.rank);
  return Text{static_cast<std::uint32_t>(size_++), 1};
}

Text TextStore::Size(std::initializer_list<std::int64_t> dims, DType type) {
  if (!enabled_) return {};
  TextPart p = TextPart::Int(0);
  p.kind = TextPart::kSize;
  p.type = type;
  p.rank = static_cast<std::uint16_t>(dims.size());
  p.n = static_cast<std::uint32_t>(dims_.size());
  dims_.insert(dims_.end(), dims.begin(), dims.end());
  return Add(&p, 1);
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
    const TextPart& p = parts_[i];
    switch (p.kind) {
      case TextPart::kStr: out.append(p.str, p.n); break;
      case TextPart::kInt: out += std::to_string(p.value); break;
      case TextPart::kCount: out += FormatCount(p.value); break;
      case TextPart::kRef: RenderTo(Text{p.n, static_cast<std::uint32_t>(p.value)}, out); break;
      case TextPart::kBytes: out += BytesOf(p.type); break;
      case TextPart::kShape:
        out += ShapeFormula(std::vector<std::int64_t>(dims_.begin() + p.n, dims_.begin() + p.n + p.rank), p.type);
        break;
      case TextPart::kSize: {
        for (std::uint32_t k = 0; k < p.rank; ++k) out += FormatCount(dims_[p.n + k]) + " × ";
        out += BytesOf(p.type);
        break;
      }
    }
  }
}

}  // namespace gpumem
