// The streams tests' check (fsdp_streams_test.cpp, zero_streams_test.cpp): every Alloc's
// stream against a rule on the tensor's name.
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "gpumem/presets.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

namespace gpumem::test {

// The streams tests' model: Llama 2 7B, bf16 mixed, 1 × 512 tokens, 8 data-parallel ranks.
inline Setup Llama7bOn8Ranks() {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset("llama-2-7b")->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.sequenceLength = 512;
  s.parallel.dataParallel = 8;
  return s;
}

inline bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

struct StreamCounts {
  int allocs[3] = {0, 0, 0};  // Allocs per stream (0 default, 1 gather, 2 reduce)
  int misplaced = 0;          // Allocs on another stream than the rule says
  std::string firstMisplaced;
};

// Every Alloc's stream against the rule `expected(tensor name)`.
template <typename F>
StreamCounts CheckStreams(const Trace& trace, F expected) {
  StreamCounts c;
  for (const Event& e : trace.events) {
    if (e.kind != EventKind::Alloc) continue;
    REQUIRE(e.stream < 3);
    ++c.allocs[e.stream];
    const std::string name = trace.TensorName(e);
    if (e.stream != expected(name)) {
      if (c.misplaced++ == 0) c.firstMisplaced = name + " on stream " + std::to_string(e.stream);
    }
  }
  return c;
}

}  // namespace gpumem::test
