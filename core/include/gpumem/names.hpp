// gpumem — the one table of identifiers and labels for every enum. JSON uses the ids, people
// read the labels; the page receives both through OptionsJson(), never re-typing them.
#pragma once

#include <span>
#include <string_view>

#include "gpumem/setup.hpp"
#include "gpumem/trace.hpp"

namespace gpumem {

template <class E>
struct Named {
  E value;
  const char* id;     // stable identifier used in JSON and URLs
  const char* label;  // what a person reads
};

std::span<const Named<ModelKind>> NamesOf(ModelKind);
std::span<const Named<LayerKind>> NamesOf(LayerKind);
std::span<const Named<LossKind>> NamesOf(LossKind);
std::span<const Named<Precision>> NamesOf(Precision);
std::span<const Named<OptimizerKind>> NamesOf(OptimizerKind);
std::span<const Named<OptimizerImplementation>> NamesOf(OptimizerImplementation);
std::span<const Named<Phase>> NamesOf(Phase);
std::span<const Named<LossImplementation>> NamesOf(LossImplementation);
std::span<const Named<Category>> NamesOf(Category);
std::span<const Named<Family>> NamesOf(Family);
std::span<const Named<HiddenAct>> NamesOf(HiddenAct);
std::span<const Named<EncoderHead>> NamesOf(EncoderHead);
std::span<const Named<AttentionImplementation>> NamesOf(AttentionImplementation);
std::span<const Named<Checkpointing>> NamesOf(Checkpointing);
std::span<const Named<PackedSequences>> NamesOf(PackedSequences);
std::span<const Named<Quantization>> NamesOf(Quantization);   // finetune.cpp
std::span<const Named<AdapterDType>> NamesOf(AdapterDType);   // finetune.cpp
std::span<const Named<QuantLayout>> NamesOf(QuantLayout);     // finetune.cpp
// The parallel section's enums (core/src/parallel/parallel_setup.cpp).
std::span<const Named<FsdpMode>> NamesOf(FsdpMode);
std::span<const Named<OffloadKind>> NamesOf(OffloadKind);
std::span<const Named<PipelineSchedule>> NamesOf(PipelineSchedule);
std::span<const Named<OverlapComm>> NamesOf(OverlapComm);

template <class E>
const char* IdOf(E value) {
  for (const auto& n : NamesOf(E{})) if (n.value == value) return n.id;
  return "";
}

template <class E>
const char* LabelOf(E value) {
  for (const auto& n : NamesOf(E{})) if (n.value == value) return n.label;
  return "";
}

// Finds the enum value whose id is `id`; false when none matches.
template <class E>
bool FromId(std::string_view id, E& out) {
  for (const auto& n : NamesOf(E{})) {
    if (id == n.id) { out = n.value; return true; }
  }
  return false;
}

}  // namespace gpumem
