// TextStore: parts rendered on demand, and the copies of a block template stored as a rule
// (TextStore::AddSeries / AppendCopy) that must read back exactly as the parts a copy would
// have written.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gpumem/text.hpp"

using gpumem::Text;
using gpumem::TextPart;
using gpumem::TextStore;

TEST_CASE("TextStore renders literals, numbers, shapes and references", "[text]") {
  TextStore store;
  const Text name = store.Make({"layers.", TextPart::Int(3), ".mlp"});
  const Text shape = store.Shape(gpumem::Shape{2, 1024, 768}, gpumem::DType::BF16);
  const Text label = store.Make({name, ": output ", shape});
  CHECK(store.Render(name) == "layers.3.mlp");
  CHECK(store.Render(label) == "layers.3.mlp: output " + store.Render(shape));
  CHECK(store.Render(shape).find("1,572,864") != std::string::npos);  // 2 × 1024 × 768 elements
}

// Copy k of a series reads as the series' parts with k steps: a position (a reference into the
// copy's own parts, a shape's dimensions) and a number move; a parameter's name is the copy's.
TEST_CASE("A template's copies read back as the parts they stand for", "[text][templates]") {
  TextStore store;
  const Text before = store.Make({"embed"});  // materialized before any copy
  // The first copy's parts, as the tape would have written them at position `from`.
  const std::size_t from = store.partCount();
  const std::size_t dimFrom = store.dimCount();
  const Text layerName = store.Make({"layers.", TextPart::Int(0)});  // parts from, from + 1
  const Text shape = store.Shape(gpumem::Shape{4, 8}, gpumem::DType::FP32);  // part from + 2
  const Text label = store.Make({layerName, ": ", TextPart::View("w0"), " ", shape});  // from + 3 ...
  const std::size_t count = store.partCount() - from;
  const std::size_t dimCount = store.dimCount() - dimFrom;
  std::vector<TextPart> parts;
  for (std::size_t i = from; i < from + count; ++i) parts.push_back(store.part(i));
  std::vector<std::int64_t> dims;
  for (std::size_t i = dimFrom; i < dimFrom + dimCount; ++i) dims.push_back(store.dim(i));
  REQUIRE(store.Render(label) == "layers.0: w0 " + store.Render(shape));
  // Two parts are written after each copy (and after the first), so each copy lies count + 2
  // parts and dimCount dimensions further on.
  const Text first = store.Make({"after copy ", TextPart::Int(0)});
  const std::size_t stride = count + 2;
  std::vector<TextStore::PartStepRule> positions, numbers;
  std::vector<std::uint32_t> names;
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const TextPart& p = parts[j];
    if (p.kind == TextPart::kRef) positions.push_back({static_cast<std::uint32_t>(j), static_cast<std::int64_t>(stride)});
    if (p.kind == TextPart::kShape) positions.push_back({static_cast<std::uint32_t>(j), static_cast<std::int64_t>(dimCount)});
    if (p.kind == TextPart::kInt) numbers.push_back({static_cast<std::uint32_t>(j), 1});
    if (p.kind == TextPart::kStr && p.n == 2 && std::string(p.str, 2) == "w0") names.push_back(static_cast<std::uint32_t>(j));
  }
  REQUIRE(names.size() == 1);
  const int series = store.AddSeries(parts, dims, positions, numbers, names);
  REQUIRE(series >= 0);
  const std::vector<std::string> weight = {"w1", "w2", "w3"};
  for (std::int64_t k = 1; k <= 3; ++k) {
    const TextPart name = TextPart::View(weight[static_cast<std::size_t>(k - 1)]);
    store.AppendCopy(series, k, &name);
    const Text between = store.Make({"after copy ", TextPart::Int(k)});  // written between copies
    CHECK(store.Render(between) == "after copy " + std::to_string(k));
  }
  for (std::int64_t k = 1; k <= 3; ++k) {
    const std::size_t at = from + static_cast<std::size_t>(k) * stride;
    const Text copyLabel{static_cast<std::uint32_t>(at + (label.begin - from)), label.count};
    const Text copyShape{static_cast<std::uint32_t>(at + (shape.begin - from)), shape.count};
    CHECK(store.Render(copyLabel) == "layers." + std::to_string(k) + ": " + weight[static_cast<std::size_t>(k - 1)] + " " +
                                         store.Render(shape));
    CHECK(store.Render(copyShape) == store.Render(shape));
    // A reference to a single part of a copy is that part, copied (TextStore::Add).
    const Text again = store.Make({Text{static_cast<std::uint32_t>(at + 1), 1}});
    CHECK(store.Render(again) == std::to_string(k));
  }
  CHECK(store.Render(before) == "embed");
  CHECK(store.Render(first) == "after copy 0");
  // A store that keeps no words makes no series and no copies.
  TextStore off;
  off.SetEnabled(false);
  CHECK(off.AddSeries(parts, dims, positions, numbers, names) == -1);
  off.AppendCopy(-1, 1, nullptr);
  CHECK(off.partCount() == 0);
}
