// Replay's moments (the peak, each phase's peak, the end of forward): with words and without
// them, and for a trace whose tensor ids are not in event order, each moment's rows hold the
// same categories, bytes and (with words) the same four largest tensors.
#include <catch2/catch.hpp>

#include "gpumem/estimate.hpp"
#include "gpumem/presets.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

void SameRows(const Snapshot& a, const Snapshot& b) {
  CHECK(a.eventIndex == b.eventIndex);
  CHECK(a.totalBytes == b.totalBytes);
  REQUIRE(a.byCategory.size() == b.byCategory.size());
  for (std::size_t i = 0; i < a.byCategory.size(); ++i) {
    CHECK(a.byCategory[i].category == b.byCategory[i].category);
    CHECK(a.byCategory[i].bytes == b.byCategory[i].bytes);
  }
}

}  // namespace

TEST_CASE("an estimate without words has the same moments and rows as one with them", "[replay]") {
  int compared = 0;
  for (const char* preset : {"gpt2", "llama-3.2-1b", "bert-base-uncased", "mixtral-8x7b"})
    for (Precision precision : {Precision::FP32, Precision::BF16Mixed, Precision::AmpFP16})
      for (Checkpointing checkpointing : {Checkpointing::None, Checkpointing::EveryBlock}) {
        Setup s = DefaultSetup();
        s.model.kind = ModelKind::Transformer;
        s.model.architecture = FindPreset(preset)->architecture;
        s.training.batchSize = 2;
        s.training.sequenceLength = 256;
        s.training.precision = precision;
        s.training.checkpointing = checkpointing;
        const EstimateResult words = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None});
        const EstimateResult none = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .explain = false});
        REQUIRE(words.ok());
        REQUIRE(none.ok());
        INFO(preset << " precision " << static_cast<int>(precision) << " checkpointing " << static_cast<int>(checkpointing));
        SameRows(words.estimate.peak, none.estimate.peak);
        REQUIRE(words.estimate.phasePeaks.size() == none.estimate.phasePeaks.size());
        for (std::size_t p = 0; p < words.estimate.phasePeaks.size(); ++p) {
          SameRows(words.estimate.phasePeaks[p], none.estimate.phasePeaks[p]);
        }
        SameRows(words.estimate.forwardEnd, none.estimate.forwardEnd);
        ++compared;
      }
  CHECK(compared == 24);
}

TEST_CASE("a trace whose tensor ids are out of event order lists its largest tensors in allocation order", "[replay]") {
  // Tensor 1 is allocated before tensor 0, both of 100 bytes, then tensor 2 of 50: at the peak
  // the activations row reads them in allocation order (as the sweep over events kept them).
  Trace trace;
  auto alloc = [&](int id, std::int64_t bytes, const char* name) {
    Event e;
    e.kind = EventKind::Alloc;
    e.tensorId = id;
    e.bytes = bytes;
    e.category = Category::Activations;
    e.phase = Phase::Forward;
    e.step = 1;
    e.tensor = trace.text.Make({TextPart::View(name)});
    e.formula = trace.text.Make({TextPart::View("f")});
    e.label = trace.text.Make({TextPart::View(name)});
    if (trace.allocAt.size() <= static_cast<std::size_t>(id)) {
      trace.allocAt.resize(static_cast<std::size_t>(id) + 1, 0);
      trace.freeAt.resize(static_cast<std::size_t>(id) + 1, Trace::kNeverFreed);
    }
    trace.allocAt[static_cast<std::size_t>(id)] = static_cast<std::uint32_t>(trace.events.size());
    trace.events.push_back(e);
  };
  alloc(1, 100, "first");
  alloc(0, 100, "second");
  alloc(2, 50, "third");
  const Estimate e = Replay(trace);
  REQUIRE(e.peak.byCategory.size() == 1);
  CHECK(e.peak.totalBytes == 250);
  CHECK(e.peak.byCategory[0].formula == "first (f) + second (f) + third (f)");
}
