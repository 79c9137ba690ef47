// gpumem — Text: the words of a trace, stored as parts and rendered only when shown.
//
// A simulated step makes tens of thousands of events, and each has a label ("layers.3
// attention: q_proj backward: gradient of …"), a tensor name and a size formula. Building those
// strings was most of an estimate's cost, yet only the peak's, the phase peaks' and the
// hovered events' are ever read. So an event keeps a Text: a range of parts in a TextStore
// (literals, integers, shapes, references to other Texts), and Render() concatenates them on
// demand. Rendering gives exactly the string the old eager code built.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpumem/dtype.hpp"

namespace gpumem {

// A range of parts in one TextStore. The empty Text renders as "".
struct Text {
  std::uint32_t begin = 0;
  std::uint32_t count = 0;
  bool empty() const { return count == 0; }
};

// Up to six dimensions (elements per dimension, PyTorch order).
struct Shape {
  static constexpr int kMaxRank = 6;
  std::int64_t dims[kMaxRank];  // only the first `rank` are meaningful (left uninitialised: ops
  int rank = 0;                 // make millions of shapes, and zeroing them showed in profiles)

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> list);
  explicit Shape(const std::vector<std::int64_t>& list);
  std::int64_t Elements() const;
  std::int64_t& back() { return dims[rank - 1]; }
  std::int64_t back() const { return dims[rank - 1]; }
  std::int64_t operator[](int i) const { return dims[i]; }
  void push_back(std::int64_t d) { if (rank < kMaxRank) dims[rank++] = d; }
  bool operator==(const Shape& o) const;
};

// One part of a Text. Literals and views must outlive the store (string literals, or views
// returned by TextStore::Keep).
struct TextPart {
  enum Kind : std::uint8_t { kStr, kInt, kCount, kRef, kShape, kSize, kBytes };
  Kind kind = kStr;
  DType type = DType::FP32;
  std::uint16_t rank = 0;
  std::uint32_t n = 0;           // Str: length; Ref: begin; ShapeFormula/SizeFormula: dims offset
  union {
    const char* str;
    std::int64_t value;          // Int, Count; Ref: count
  };

  template <std::size_t N>
  TextPart(const char (&literal)[N]) : kind(kStr), n(N - 1), str(literal) {}  // NOLINT: implicit
  TextPart(Text text) : kind(kRef), n(text.begin), value(text.count) {}     // NOLINT: implicit
  static TextPart View(std::string_view s);          // a view that outlives the store
  static TextPart Int(std::int64_t v);              // std::to_string(v)
  static TextPart Count(std::int64_t v);            // FormatCount(v): "1,024"
  static TextPart Bytes(DType type);                // BytesOf(type): "2 B (bf16)"

 private:
  TextPart() : value(0) {}
  friend class TextStore;
};

class TextStore {
 public:
  TextStore();
  TextStore(const TextStore&) = delete;
  TextStore& operator=(const TextStore&) = delete;
  TextStore(TextStore&& o) noexcept;
  TextStore& operator=(TextStore&& o) noexcept;
  ~TextStore();
  // Room for about `parts` parts without growing.
  void Reserve(std::size_t parts);
  // Off: every Make, Shape, Size and Own returns the empty Text and stores nothing (a run whose
  // words nobody reads: the solver's and the page's views' many estimates).
  void SetEnabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  Text Make(std::initializer_list<TextPart> parts) { return Add(parts.begin(), parts.size()); }
  // "[2, 128, 768] = 196,608 × 2 B (bf16)" (ShapeFormula of format.hpp).
  Text Shape(const gpumem::Shape& shape, DType type);
  // "2 × 128 × 768 × 2 B (bf16)" (SizeFormula of format.hpp).
  Text Size(std::initializer_list<std::int64_t> dims, DType type);
  // A string owned by the store; the view stays valid as long as the store.
  std::string_view Keep(std::string s);
  Text Own(std::string s) { return enabled_ ? Make({TextPart::View(Keep(std::move(s)))}) : Text{}; }

  // Raw access for block templates (core/src/sim/tape_templates.cpp): how many parts and shape
  // dimensions are stored, and one of each (a copy's computed from its series).
  std::size_t partCount() const { return size_; }
  std::size_t dimCount() const { return dimSize_; }
  TextPart part(std::size_t i) const {
    return i < copiedParts_.first || i >= copiedParts_.second ? parts_[i] : CopiedPart(i);
  }
  std::int64_t dim(std::size_t i) const {
    return i < copiedDims_.first || i >= copiedDims_.second ? dims_[i] : CopiedDim(i);
  }

  // A block template's copies, stored as a rule instead of as parts. A series is the parts
  // and dimensions of a template's first copy (`parts`, `dims`) and how each part moves from
  // one copy to the next: `positionSteps` and `numberSteps` give (part index, step) for the
  // parts that are positions (references, shape offsets) and numbers; `names` lists the parts
  // that name a parameter, which AppendCopy is given copy by copy. Copy k of a series takes
  // as many positions in the parts and in the dimensions as the first, written nowhere: part
  // j reads as the first copy's with k times its step, and the dimensions as the first's. A
  // 405B estimate's copies were 5 MB of parts written and never read (only shown events are
  // rendered). Returns the series' number, or −1 when the store is off.
  struct PartStepRule {
    std::uint32_t index;
    std::int64_t delta;
  };
  int AddSeries(std::vector<TextPart> parts, std::vector<std::int64_t> dims,
                const std::vector<PartStepRule>& positionSteps, const std::vector<PartStepRule>& numberSteps,
                std::vector<std::uint32_t> names);
  // Copy `k` of `series` at the end of the store; `names` holds the parts listed in the
  // series' `names`, in that order, as this copy has them.
  void AppendCopy(int series, std::int64_t k, const TextPart* names);

  std::string Render(Text text) const;
  void RenderTo(Text text, std::string& out) const;

 private:
  // Inline: Make is the hottest call of a simulation, and its callers pass a handful of parts.
  Text Add(const TextPart* parts, std::size_t count) {
    if (!enabled_) return {};
    if (size_ + count > capacity_) Grow(size_ + count);
    Text t{static_cast<std::uint32_t>(size_), 0};
    TextPart* out = parts_ + size_;
    for (std::size_t i = 0; i < count; ++i) {
      const TextPart& p = parts[i];
      if (p.kind == TextPart::kRef) {
        if (p.value == 0) continue;
        // A reference to a single part is that part, copied: one indirection less to render.
        *out++ = p.value == 1 ? part(p.n) : p;
      } else if (p.kind != TextPart::kStr || p.n != 0) {
        *out++ = p;
      }
    }
    t.count = static_cast<std::uint32_t>(out - (parts_ + size_));
    size_ += t.count;
    return t;
  }
  void Grow(std::size_t needed);
  // Room for `count` more dimensions, returned to be written: a shape's few numbers are stored
  // in place, without vector::insert's range insert and memcpy call (Shape is called for most
  // events; that was three quarters of its cost, callgrind).
  std::int64_t* AppendDims(std::size_t count) {
    if (dimSize_ + count > dimCapacity_) GrowDims(dimSize_ + count);
    std::int64_t* out = dims_ + dimSize_;
    dimSize_ += count;
    return out;
  }
  void GrowDims(std::size_t needed);
  TextPart CopiedPart(std::size_t i) const;
  std::int64_t CopiedDim(std::size_t i) const;
  struct Series {
    std::vector<TextPart> parts;
    std::vector<std::int64_t> dims;
    std::vector<std::int64_t> positionStep, numberStep;  // per part, 0 for none
    std::vector<std::int32_t> nameSlot;                   // per part, −1 for none
    std::size_t nameCount = 0;
    std::vector<TextPart> names;  // each copy's nameCount names, from its Copy::names on
  };
  struct Copy {
    std::size_t partFrom, dimFrom;
    int series;
    std::int64_t k;
    std::size_t names;  // where its names start in the series' `names`
  };
  // A plain growable array: TextPart is trivially copyable, and Make is the hottest call of a
  // simulation (std::vector's per-element push_back cost a quarter of an estimate).
  TextPart* parts_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
  bool enabled_ = true;
  // The dimensions of shapes and sizes, dims_[0, dimSize_): a plain growable array too.
  std::int64_t* dims_ = nullptr;
  std::size_t dimSize_ = 0, dimCapacity_ = 0;
  std::vector<Series> series_;
  std::vector<Copy> copies_;  // by position, in both the parts and the dimensions
  // From the first copy's first position to the last one's end: outside, part() and dim()
  // read the arrays without a search.
  std::pair<std::size_t, std::size_t> copiedParts_{0, 0}, copiedDims_{0, 0};
  std::deque<std::string> owned_;
};

}  // namespace gpumem
