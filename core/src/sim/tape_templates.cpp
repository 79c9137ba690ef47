// Block templates: the backward spans of checkpointed blocks (Tape::RunCheckpointSpan) and
// their forwards (Tape::RunForwardSpan), and plain blocks' forwards (Tape::PlainBlock, nodes
// included) and backward runs of nodes (Tape::RunPlainSpan), copied instead of simulated (the
// rest of the tape is sim/tape.cpp). Its own file: the copies' code kept the hot functions of
// tape.cpp from being inlined.
//
// Plain blocks (speed12): copied only where a block has enough nodes for a copy to cost less
// than simulating it (Tape::kMinPlainForwardNodes, kMinPlainBackwardNodes; speed8 found GPT-2's
// short blocks cost more to record than to simulate). Callgrind per estimate, main -> speed12:
// GPT-2 16.76 -> 16.86 M / 4, Llama-2 39.34 -> 37.23, Llama-3-8B ckpt 53.80 -> 53.31, Mixtral
// 122.88 -> 111.34, 405B ckpt 152.96 -> 151.30 (gpumem_bench 1 runs four estimates).
#include <algorithm>
#include <cstring>
#include <functional>

#include "sim/savers.hpp"
#include "sim/tape.hpp"

namespace gpumem {

namespace {
bool gBlockTemplates = true;  // SetBlockTemplates
std::size_t gForwardCopies = 0;  // ForwardSpansCopied
std::size_t gBackwardCopies = 0;  // BackwardSpansCopied
}  // namespace

std::size_t ForwardSpansCopied() { return gForwardCopies; }
std::size_t BackwardSpansCopied() { return gBackwardCopies; }

void SetBlockTemplates(bool on) { gBlockTemplates = on; }
bool BlockTemplatesOn() { return gBlockTemplates; }

// Block templates. The blocks of a transformer are the same up to their index, so the backward
// of checkpointed block k (the recompute, then the block's backward) makes the same events as
// block k+1's, with every new tensor id, every text position, the layer and the parameters'
// indices moved by a constant. The spans of the last blocks are simulated; once the span
// predicted from two of them matches the third exactly (events, texts, holders, .grads), the
// next blocks' spans are copied from the prediction instead of simulated. Block 0 (the one
// that frees the rotary tables and the mask) is always simulated, and any difference — a
// span that accumulates into .grad, a node between two checkpoints, a prediction that does
// not fit the trace — goes back to simulating.
// What a span's record brackets: where the trace, the text store and the tensor ids stand before
// and after it, the holder changes and .grads it makes, and each of its tensors' holders.
void Tape::BeginSpanRecord(SpanRecord& r) {
  r.eventFrom = b_.trace().events.size();
  r.partFrom = text().partCount();
  r.dimFrom = text().dimCount();
  r.idFrom = static_cast<int>(b_.tensorCount());
  b_.RecordTouches(r.idFrom);
  sink_->RecordGrads(&r.grads);
}

void Tape::EndSpanRecord(SpanRecord& r) {
  r.touches = b_.touches();
  b_.RecordTouches(-1);
  sink_->RecordGrads(nullptr);
  r.eventTo = b_.trace().events.size();
  r.partTo = text().partCount();
  r.dimTo = text().dimCount();
  r.idTo = static_cast<int>(b_.tensorCount());
  r.holders.reserve(static_cast<std::size_t>(r.idTo - r.idFrom));
  for (int id = r.idFrom; id < r.idTo; ++id) r.holders.push_back(b_.Holders(id));
}

void Tape::RunCheckpointSpan(int index) {
  const Node& node = nodes_[static_cast<std::size_t>(index)];
  // An offloaded input (node.packed) is brought back by the span itself: copies redo what the
  // offloader keeps of it (ActivationOffload::CopiedUnpack).
  if (layerSignature_.empty()) ComputeLayerSignatures();
  // Block 0's span, and with a period over one the first block of each of its places: the last
  // to hold what the blocks of its kind share (a Gemma 2 global block's causal mask), which its
  // checkpoint lets go of.
  bool eligible = index != lowestCheckpoint_ &&
                  (period_ == 1 || node.layer >= nodes_[static_cast<std::size_t>(lowestCheckpoint_)].layer + period_);
  bool any = false;
  for (ValueId o : node.outputs) any = any || GradOf(o) != kNoTensor;
  eligible = eligible && any;
  for (ValueId v : node.blockInputs) eligible = eligible && GradOf(v) == kNoTensor;
  if (!eligible) {
    ForgetSpans();
    RunCheckpoint(index);
    return;
  }
  SpanChain& chain = backwardChain_;
  if (!chain.spans.empty() && chain.spans.back().plain) ForgetSpans();  // a plain block before this one
  if (Checked(chain, node.layer)) {
    // The first copy predicts from the two spans of its place in the period before it and notes
    // how far each number moves; the next ones only move those numbers on again.
    SpanTemplate* t = NextTemplate(chain, node.layer, false);
    if (t != nullptr && ApplyPredicted(index, node.blockInputs, *t)) return;
    ForgetSpans();
  }
  if (layerSignature_.empty()) ComputeLayerSignatures();
  SpanRecord r;
  r.unpacked = offload_ != nullptr && nodes_[static_cast<std::size_t>(index)].packed >= 0;
  if (r.unpacked) r.offloadStashBefore = offload_->backwardStash();
  BeginSpanRecord(r);
  RunCheckpoint(index);
  EndSpanRecord(r);
  if (r.unpacked) r.offloadStash = offload_->backwardStash();
  CheckpointOutsideTexts(index, r.inputNames);
  for (ValueId v : nodes_[static_cast<std::size_t>(index)].blockInputs) r.inputGrads.push_back(GradOf(v));
  r.layerAfter = layer_;
  r.layer = nodes_[static_cast<std::size_t>(index)].layer;
  for (const auto& [parameter, grad] : r.grads) r.copyable = r.copyable && grad >= 0;
  if (!r.copyable) {
    ForgetSpans();
    return;
  }
  KeepSpan(chain, std::move(r));
}

const Tape::SpanRecord* Tape::SpanOf(const SpanChain& c, int layer) {
  for (auto it = c.spans.rbegin(); it != c.spans.rend(); ++it) {
    if (it->layer == layer) return &*it;
  }
  return nullptr;
}

Tape::SpanTemplate* Tape::NextTemplate(SpanChain& c, int layer, bool forward) {
  SpanTemplate& t = c.templates[static_cast<std::size_t>(PhaseOf(layer))];  // Checked: in range
  if (t.ready) return AdvanceTemplate(t) ? &t : nullptr;
  // Backward spans run from the last block down, forward spans from the first up.
  const int back = forward ? -period_ : period_;
  const SpanRecord* a = SpanOf(c, layer + 2 * back);
  const SpanRecord* b = SpanOf(c, layer + back);
  return a != nullptr && b != nullptr && BuildTemplate(t, *a, *b) ? &t : nullptr;
}

void Tape::KeepSpan(SpanChain& c, SpanRecord&& r) {
  const int layer = r.layer;
  const int back = r.forward ? -period_ : period_;
  c.spans.push_back(std::move(r));
  if (c.spans.size() > static_cast<std::size_t>(2 * period_ + 1)) c.spans.erase(c.spans.begin());
  const auto phase = static_cast<std::size_t>(PhaseOf(layer));
  if (phase >= c.checked.size() || c.checked[phase] != 0) return;
  const SpanRecord* a = SpanOf(c, layer + 2 * back);
  const SpanRecord* b = SpanOf(c, layer + back);
  if (a == nullptr || b == nullptr) return;
  PredictedSpan predicted;
  c.checked[phase] = Predict(*a, *b, predicted) && SameAsSimulated(predicted, c.spans.back());
}

namespace {
std::int64_t Next(std::int64_t a, std::int64_t b) { return 2 * b - a; }
std::int64_t RawValue(const TextPart& p) {
  std::int64_t v = 0;
  std::memcpy(&v, &p.value, sizeof v);  // the union's bytes, whichever member is set
  return v;
}
bool SameText(Text x, Text y) { return x.begin == y.begin && x.count == y.count; }
// How far a Text's position moves from span x to span y; 0 for an empty one, whose position
// stays as predicted (AdvanceTemplate adds the steps unconditionally).
std::int64_t TextStep(Text x, Text y) { return y.count == 0 ? 0 : static_cast<std::int64_t>(y.begin) - x.begin; }
bool SameEvent(const Event& x, const Event& y) {
  return x.bytes == y.bytes && x.tensorId == y.tensorId && x.layer == y.layer && x.kind == y.kind &&
         x.category == y.category && x.phase == y.phase && x.step == y.step && SameText(x.label, y.label) &&
         SameText(x.tensor, y.tensor) && SameText(x.formula, y.formula);
}
bool SamePart(const TextPart& x, const TextPart& y) {
  if (x.kind != y.kind || x.type != y.type || x.rank != y.rank || x.n != y.n) return false;
  // A string part sets only `str`: where a pointer is 4 bytes (wasm32) the union's other 4 bytes
  // are whatever was there, and comparing all 8 made every prediction fail in the page.
  return x.kind == TextPart::kStr ? x.str == y.str : RawValue(x) == RawValue(y);
}
// The Text at the position two steps predict, or false when their sizes differ.
bool NextText(Text a, Text b, Text& out) {
  if (a.count != b.count) return false;
  if (b.count == 0) {
    out = Text{};
    return true;
  }
  const std::int64_t begin = Next(a.begin, b.begin);
  if (begin < 0 || begin > 0xffffffffLL) return false;
  out = Text{static_cast<std::uint32_t>(begin), b.count};
  return true;
}
}  // namespace

int Tape::ParameterOfName(const char* name) {
  const std::vector<Tensor>& parameters = inventory().parameters;
  if (nameIndex_.empty()) {
    nameIndex_.reserve(parameters.size());
    for (std::size_t i = 0; i < parameters.size(); ++i) nameIndex_.push_back({parameters[i].name.data(), static_cast<int>(i)});
    std::sort(nameIndex_.begin(), nameIndex_.end(),
              [](const auto& x, const auto& y) { return std::less<const char*>()(x.first, y.first); });
  }
  const auto it = std::lower_bound(nameIndex_.begin(), nameIndex_.end(), name,
                                   [](const auto& x, const char* n) { return std::less<const char*>()(x.first, n); });
  return it != nameIndex_.end() && it->first == name ? it->second : -1;
}

bool Tape::Predict(const SpanRecord& a, const SpanRecord& b, PredictedSpan& out) {
  const std::size_t events = b.eventTo - b.eventFrom, parts = b.partTo - b.partFrom, dims = b.dimTo - b.dimFrom;
  if (a.forward != b.forward || a.plain != b.plain || a.nodeTo - a.nodeFrom != b.nodeTo - b.nodeFrom ||
      a.tempTo - a.tempFrom != b.tempTo - b.tempFrom || a.eventTo - a.eventFrom != events || a.partTo - a.partFrom != parts || a.dimTo - a.dimFrom != dims ||
      a.idTo - a.idFrom != b.idTo - b.idFrom || a.holders != b.holders || a.touches.size() != b.touches.size() ||
      a.grads.size() != b.grads.size() || a.inputGrads.size() != b.inputGrads.size() || a.packedOps != b.packedOps ||
      a.unpacked != b.unpacked || a.offloadStash.size() != b.offloadStash.size() ||
      a.offloadStashBefore.size() != b.offloadStashBefore.size()) {
    return false;
  }
  out.record = SpanRecord{};  // `out` may hold an earlier prediction (the template's)
  out.events.clear();
  out.parts.clear();
  out.dims.clear();
  // Backward spans run from the last block down, forward spans from the first up.
  if (b.forward ? !LayerFollows(a.layer, b.layer) || !LayerFollows(b.layer, b.layer + period_)
                : !LayerFollows(b.layer, a.layer) || !LayerFollows(b.layer - period_, b.layer)) {
    return false;
  }
  SpanRecord& r = out.record;
  r.forward = b.forward;
  r.packedOps = b.packedOps;
  r.layer = b.forward ? b.layer + period_ : b.layer - period_;
  const std::int64_t eventFrom = Next(static_cast<std::int64_t>(a.eventFrom), static_cast<std::int64_t>(b.eventFrom));
  const std::int64_t partFrom = Next(static_cast<std::int64_t>(a.partFrom), static_cast<std::int64_t>(b.partFrom));
  const std::int64_t dimFrom = Next(static_cast<std::int64_t>(a.dimFrom), static_cast<std::int64_t>(b.dimFrom));
  if (eventFrom < 0 || partFrom < 0 || dimFrom < 0) return false;
  r.eventFrom = static_cast<std::size_t>(eventFrom);
  r.eventTo = r.eventFrom + events;
  r.partFrom = static_cast<std::size_t>(partFrom);
  r.partTo = r.partFrom + parts;
  r.dimFrom = static_cast<std::size_t>(dimFrom);
  r.dimTo = r.dimFrom + dims;
  r.idFrom = static_cast<int>(Next(a.idFrom, b.idFrom));
  r.idTo = r.idFrom + (b.idTo - b.idFrom);
  r.holders = b.holders;
  r.layerAfter = static_cast<int>(Next(a.layerAfter, b.layerAfter));
  if (b.plain && !b.forward) {  // a plain block's backward: its nodes, as far on again
    r.plain = true;
    r.nodeFrom = static_cast<int>(Next(a.nodeFrom, b.nodeFrom));
    r.nodeTo = r.nodeFrom + (b.nodeTo - b.nodeFrom);
    if (r.nodeFrom < 0) return false;
  }
  if (!b.forward) {  // the texts from outside a backward span its words refer to
    if (a.inputNames.size() != b.inputNames.size()) return false;
    r.inputNames.resize(b.inputNames.size());
    for (std::size_t i = 0; i < b.inputNames.size(); ++i) {
      if (!NextText(a.inputNames[i], b.inputNames[i], r.inputNames[i])) return false;
    }
  }
  r.touches.reserve(b.touches.size());
  for (std::size_t j = 0; j < b.touches.size(); ++j) {
    if (a.touches[j].second != b.touches[j].second) return false;
    r.touches.push_back({static_cast<int>(Next(a.touches[j].first, b.touches[j].first)), b.touches[j].second});
  }
  const auto parameterCount = static_cast<std::int64_t>(parameterCount_);
  r.grads.reserve(b.grads.size());
  for (std::size_t j = 0; j < b.grads.size(); ++j) {
    const std::int64_t parameter = Next(a.grads[j].first, b.grads[j].first);
    if (parameter < 0 || parameter >= parameterCount) return false;
    r.grads.push_back({static_cast<int>(parameter), static_cast<int>(Next(a.grads[j].second, b.grads[j].second))});
  }
  r.unpacked = b.unpacked;
  for (std::size_t j = 0; j < b.offloadStash.size(); ++j) {
    r.offloadStash.push_back({static_cast<int>(Next(a.offloadStash[j].first, b.offloadStash[j].first)),
                              static_cast<TensorHandle>(Next(a.offloadStash[j].second, b.offloadStash[j].second))});
  }
  for (std::size_t j = 0; j < b.offloadStashBefore.size(); ++j) {
    r.offloadStashBefore.push_back(
        {static_cast<int>(Next(a.offloadStashBefore[j].first, b.offloadStashBefore[j].first)),
         static_cast<TensorHandle>(Next(a.offloadStashBefore[j].second, b.offloadStashBefore[j].second))});
  }
  for (int i = 0; i < b.inputGrads.size(); ++i) {
    if ((a.inputGrads[i] == kNoTensor) != (b.inputGrads[i] == kNoTensor)) return false;
    r.inputGrads.push_back(b.inputGrads[i] == kNoTensor ? kNoTensor
                                                        : static_cast<TensorHandle>(Next(a.inputGrads[i], b.inputGrads[i])));
  }
  const std::vector<Event>& trace = b_.trace().events;
  out.events.reserve(events);
  for (std::size_t j = 0; j < events; ++j) {
    const Event& x = trace[a.eventFrom + j];
    const Event& y = trace[b.eventFrom + j];
    if (x.bytes != y.bytes || x.kind != y.kind || x.category != y.category || x.phase != y.phase || x.step != y.step) {
      return false;
    }
    Event e = y;
    e.tensorId = static_cast<int>(Next(x.tensorId, y.tensorId));
    e.layer = static_cast<int>(Next(x.layer, y.layer));
    if (!NextText(x.label, y.label, e.label) || !NextText(x.tensor, y.tensor, e.tensor) ||
        !NextText(x.formula, y.formula, e.formula)) {
      return false;
    }
    out.events.push_back(e);
  }
  const TextStore& store = text();
  const std::vector<Tensor>& parameters = inventory().parameters;
  out.parts.reserve(parts);
  for (std::size_t j = 0; j < parts; ++j) {
    const TextPart& x = store.part(a.partFrom + j);
    const TextPart& y = store.part(b.partFrom + j);
    if (x.kind != y.kind || x.type != y.type || x.rank != y.rank) return false;
    TextPart p = y;
    switch (y.kind) {
      case TextPart::kRef:
      case TextPart::kShape:
      case TextPart::kSize: {  // a position in the parts or the dimensions
        if (x.value != y.value) return false;
        const std::int64_t n = Next(x.n, y.n);
        if (n < 0 || n > 0xffffffffLL) return false;
        p.n = static_cast<std::uint32_t>(n);
        break;
      }
      case TextPart::kInt:
      case TextPart::kCount:  // a layer number, or a constant
        if (x.n != y.n) return false;
        p.value = Next(x.value, y.value);
        break;
      case TextPart::kBytes:
        if (!SamePart(x, y)) return false;
        break;
      case TextPart::kStr:
        if (x.n == y.n && x.str == y.str) break;
        {  // a parameter's name: the parameter as far on again
          const int i = ParameterOfName(x.str), k = ParameterOfName(y.str);
          if (i < 0 || k < 0 || parameters[static_cast<std::size_t>(i)].name.size() != x.n ||
              parameters[static_cast<std::size_t>(k)].name.size() != y.n) {
            return false;
          }
          const std::int64_t next = Next(i, k);
          if (next < 0 || next >= parameterCount) return false;
          const std::string& name = parameters[static_cast<std::size_t>(next)].name;
          p.str = name.data();
          p.n = static_cast<std::uint32_t>(name.size());
        }
        break;
    }
    out.parts.push_back(p);
  }
  out.dims.reserve(dims);
  for (std::size_t j = 0; j < dims; ++j) {
    if (store.dim(a.dimFrom + j) != store.dim(b.dimFrom + j)) return false;
    out.dims.push_back(store.dim(b.dimFrom + j));
  }
  return !b.forward || PredictForward(a, b, out);
}

bool Tape::SameAsSimulated(const PredictedSpan& predicted, const SpanRecord& actual) const {
  const SpanRecord& r = predicted.record;
  if (r.eventFrom != actual.eventFrom || r.eventTo != actual.eventTo || r.partFrom != actual.partFrom ||
      r.partTo != actual.partTo || r.dimFrom != actual.dimFrom || r.dimTo != actual.dimTo || r.idFrom != actual.idFrom ||
      r.idTo != actual.idTo || r.holders != actual.holders || r.touches != actual.touches || r.grads != actual.grads ||
      r.layerAfter != actual.layerAfter || r.inputGrads.size() != actual.inputGrads.size() || r.plain != actual.plain ||
      r.nodeFrom != actual.nodeFrom || r.nodeTo != actual.nodeTo || r.inputNames.size() != actual.inputNames.size() ||
      r.packedOps != actual.packedOps || r.unpacked != actual.unpacked || r.offloadStash != actual.offloadStash ||
      r.offloadStashBefore != actual.offloadStashBefore) {
    return false;
  }
  for (std::size_t i = 0; i < r.inputNames.size(); ++i) if (!SameText(r.inputNames[i], actual.inputNames[i])) return false;
  for (int i = 0; i < r.inputGrads.size(); ++i) if (r.inputGrads[i] != actual.inputGrads[i]) return false;
  const std::vector<Event>& trace = b_.trace().events;
  for (std::size_t j = 0; j < predicted.events.size(); ++j) {
    if (!SameEvent(predicted.events[j], trace[actual.eventFrom + j])) return false;
  }
  const TextStore& store = b_.text();
  for (std::size_t j = 0; j < predicted.parts.size(); ++j) {
    if (!SamePart(predicted.parts[j], store.part(actual.partFrom + j))) return false;
  }
  for (std::size_t j = 0; j < predicted.dims.size(); ++j) {
    if (predicted.dims[j] != store.dim(actual.dimFrom + j)) return false;
  }
  return !actual.forward || SameForwardAsSimulated(predicted, actual);
}

// What may differ between blocks must be visible here or in the spans themselves. Today a block's
// code takes its index only for names and labels (families/*.cpp, blocks/*.cpp), so blocks differ
// only through their parameters (frozen, adapted, quantized: all in the inventory, hashed below).
// A future per-layer behaviour (alternating sliding-window layers, dense first blocks of an MoE)
// that leaves the parameters alike must add itself to this signature, or the span of one block
// would be copied onto another that differs. The prediction check only compares three spans.
void Tape::ComputeLayerSignatures() {
  layerSignature_.clear();
  layerFirstParameter_.clear();
  const std::vector<Tensor>& parameters = inventory().parameters;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    if (p.layer < 0) continue;
    const auto layer = static_cast<std::size_t>(p.layer);
    if (layer >= layerSignature_.size()) {
      layerSignature_.resize(layer + 1, 1469598103934665603ull);
      layerFirstParameter_.resize(layer + 1, -1);
    }
    if (layerFirstParameter_[layer] < 0) layerFirstParameter_[layer] = static_cast<std::int64_t>(i);
    std::uint64_t& h = layerSignature_[layer];
    const auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<std::uint64_t>(i) - static_cast<std::uint64_t>(layerFirstParameter_[layer]));
    mix(p.shape.size());
    for (std::int64_t d : p.shape) mix(static_cast<std::uint64_t>(d));
    mix(p.trainable);
    mix(static_cast<std::uint64_t>(p.storage));
    mix(p.adapter);
    mix(p.quantStorageBytes);
    std::size_t digits = 1;
    for (int l = p.layer; l >= 10; l /= 10) ++digits;
    mix(p.name.size() - digits);
  }
  for (std::size_t layer = 0; layer < layerSignature_.size() && layer < layerKinds_.size(); ++layer) {
    layerSignature_[layer] = (layerSignature_[layer] ^ (layerKinds_[layer] + 1u)) * 1099511628211ull;
  }
  // The blocks' period: the least p with every block's signature that of the block p on (1 when
  // none up to kMaxPeriod is: frozen first blocks, say, then only the equal ones that follow one
  // another are copied, as before there were periods). Gemma 3's five sliding-window blocks to
  // one global make 6.
  constexpr int kMaxPeriod = 8;
  const auto blocks = static_cast<int>(layerSignature_.size());
  int period = 1;
  for (int p = 1; p <= kMaxPeriod && p < blocks; ++p) {
    bool repeats = true;
    for (int layer = 0; layer + p < blocks && repeats; ++layer) {
      repeats = layerSignature_[static_cast<std::size_t>(layer)] == layerSignature_[static_cast<std::size_t>(layer + p)];
    }
    if (repeats) {
      period = p;
      break;
    }
  }
  // Only where it copies more: each place of a period p simulates three spans before its copies,
  // and the backward the first p blocks too (about blocks − 4p + 1 copies), where period 1
  // copies a run of equal blocks after its first three. Gemma 3 1B (26 blocks, runs of five)
  // keeps period 1; Gemma 2 (runs of one) and SmolLM3 (runs of three) take theirs.
  if (period > 1) {
    int runCopies = 0;
    for (int layer = 0, run = 1; layer < blocks; ++layer, ++run) {
      if (layer + 1 == blocks || layerSignature_[static_cast<std::size_t>(layer)] != layerSignature_[static_cast<std::size_t>(layer + 1)]) {
        runCopies += std::max(0, run - 3);
        run = 0;
      }
    }
    if (blocks - 4 * period + 1 <= runCopies) period = 1;
  }
  if (period != period_ || backwardChain_.checked.size() != static_cast<std::size_t>(period)) {
    period_ = period;
    for (SpanChain* c : {&backwardChain_, &forwardChain_}) {
      c->Forget();
      c->templates.resize(static_cast<std::size_t>(period));
      c->checked.assign(static_cast<std::size_t>(period), 0);
    }
  }
}

bool Tape::LayerFollows(int layer, int previous) const {
  const auto known = static_cast<int>(layerSignature_.size());
  if (layer < 0 || previous < 0 || layer >= known || previous >= known || previous - layer != period_) return false;
  if (layerSignature_[static_cast<std::size_t>(layer)] != layerSignature_[static_cast<std::size_t>(previous)]) return false;
  // One stride on: the parameters of blocks a period apart sit at equal distances.
  const std::int64_t stride = layerFirstParameter_[static_cast<std::size_t>(previous)] -
                              layerFirstParameter_[static_cast<std::size_t>(layer)];
  if (stride <= 0) return false;
  if (previous + period_ < known) {
    return layerFirstParameter_[static_cast<std::size_t>(previous + period_)] -
               layerFirstParameter_[static_cast<std::size_t>(previous)] == stride;
  }
  return true;
}

bool Tape::BuildTemplate(SpanTemplate& t, const SpanRecord& a, const SpanRecord& b) {
  t.ready = false;
  if (!Predict(a, b, t.span)) return false;
  // What moves from span b to the predicted one moves as much again at every later span.
  const SpanRecord& c = t.span.record;
  t.eventStep = static_cast<std::int64_t>(c.eventFrom) - static_cast<std::int64_t>(b.eventFrom);
  t.partStep = static_cast<std::int64_t>(c.partFrom) - static_cast<std::int64_t>(b.partFrom);
  t.dimStep = static_cast<std::int64_t>(c.dimFrom) - static_cast<std::int64_t>(b.dimFrom);
  t.idStep = c.idFrom - b.idFrom;
  t.layerStep = c.layerAfter - b.layerAfter;
  t.nodeStep = c.nodeFrom - b.nodeFrom;
  t.inputNameSteps.clear();
  for (std::size_t i = 0; i < c.inputNames.size(); ++i) {
    t.inputNameSteps.push_back(static_cast<std::int64_t>(c.inputNames[i].begin) - b.inputNames[i].begin);
  }
  t.eventSteps.clear();
  const std::vector<Event>& events = b_.trace().events;
  for (std::size_t j = 0; j < t.span.events.size(); ++j) {
    const Event& x = events[b.eventFrom + j];
    const Event& y = t.span.events[j];
    // An empty Text's position does not move (its step 0): AdvanceTemplate adds every step
    // without a test per Text.
    t.eventSteps.push_back({y.tensorId - x.tensorId, y.layer - x.layer, TextStep(x.label, y.label),
                            TextStep(x.tensor, y.tensor), TextStep(x.formula, y.formula)});
  }
  t.partSteps.clear();
  t.positionSteps.clear();
  t.numberSteps.clear();
  const TextStore& store = text();
  for (std::size_t j = 0; j < t.span.parts.size(); ++j) {
    const TextPart& x = store.part(b.partFrom + j);
    const TextPart& y = t.span.parts[j];
    if (SamePart(x, y)) continue;
    PartStep step{static_cast<std::uint32_t>(j), PartStep::kPosition, 0};
    switch (y.kind) {
      case TextPart::kRef:
      case TextPart::kShape:
      case TextPart::kSize:
        step.delta = static_cast<std::int64_t>(y.n) - x.n;
        break;
      case TextPart::kInt:
      case TextPart::kCount:
        step.what = PartStep::kValue;
        step.delta = y.value - x.value;
        break;
      case TextPart::kStr:
        step.what = PartStep::kParameter;
        step.delta = ParameterOfName(y.str);
        step.parameterStep = ParameterOfName(y.str) - ParameterOfName(x.str);
        break;
      default:
        return false;
    }
    if (step.what == PartStep::kPosition) t.positionSteps.push_back({step.index, step.delta});
    else if (step.what == PartStep::kValue) t.numberSteps.push_back({step.index, step.delta});
    else t.partSteps.push_back(step);
  }
  t.touchSteps.clear();
  for (std::size_t j = 0; j < c.touches.size(); ++j) t.touchSteps.push_back(c.touches[j].first - b.touches[j].first);
  t.gradSteps.clear();
  for (std::size_t j = 0; j < c.grads.size(); ++j) {
    t.gradSteps.push_back({c.grads[j].first - b.grads[j].first, c.grads[j].second - b.grads[j].second});
  }
  t.inputGradSteps.clear();
  for (int i = 0; i < c.inputGrads.size(); ++i) {
    t.inputGradSteps.push_back(c.inputGrads[i] == kNoTensor ? 0 : c.inputGrads[i] - b.inputGrads[i]);
  }
  t.offloadStashSteps.clear();
  for (std::size_t j = 0; j < c.offloadStash.size(); ++j) {
    t.offloadStashSteps.push_back({c.offloadStash[j].first - b.offloadStash[j].first,
                                   c.offloadStash[j].second - b.offloadStash[j].second});
  }
  t.offloadStashBeforeSteps.clear();
  for (std::size_t j = 0; j < c.offloadStashBefore.size(); ++j) {
    t.offloadStashBeforeSteps.push_back({c.offloadStashBefore[j].first - b.offloadStashBefore[j].first,
                                         c.offloadStashBefore[j].second - b.offloadStashBefore[j].second});
  }
  if (c.forward) {
    t.valueStep = c.valueFrom - b.valueFrom;
    t.valueSteps.clear();
    for (std::size_t j = 0; j < t.span.values.size(); ++j) {
      const Value& x = b.values[j];
      const Value& y = t.span.values[j];
      t.valueSteps.push_back({y.storage - x.storage, y.parameter - x.parameter, y.producer - x.producer,
                              TextStep(x.name, y.name)});
    }
    const auto steps = [](const std::vector<std::pair<int, int>>& x, const std::vector<std::pair<int, int>>& y,
                          std::vector<std::pair<int, int>>& to) {
      to.clear();
      for (std::size_t j = 0; j < y.size(); ++j) to.push_back({y[j].first - x[j].first, y[j].second - x[j].second});
    };
    steps(b.casts, c.casts, t.castSteps);
    steps(b.leaves, c.leaves, t.leafSteps);
    t.outSteps.clear();
    for (int i = 0; i < c.outs.size(); ++i) t.outSteps.push_back(c.outs[i] - b.outs[i]);
    for (std::size_t i = 0; i < t.scopeSteps.size(); ++i) {
      t.scopeSteps[i] = static_cast<std::int64_t>(c.scopeAfter[i].begin) - b.scopeAfter[i].begin;
    }
    t.nodeSteps.clear();
    if (c.plain) {
      t.nodeSteps.resize(t.span.nodes.size());
      for (std::size_t j = 0; j < t.span.nodes.size(); ++j) {
        const Node& x = nodes_[static_cast<std::size_t>(b.nodeFrom) + j];
        const Node& y = t.span.nodes[j];
        SpanTemplate::NodeStep& d = t.nodeSteps[j];
        d.label = TextStep(x.label, y.label);
        d.layer = y.layer - x.layer;
        d.temps = y.temps - x.temps;
        for (int i = 0; i < y.inputs.size(); ++i) d.inputs[static_cast<std::size_t>(i)] = y.inputs[i].value - x.inputs[i].value;
        for (int i = 0; i < y.outputs.size(); ++i) d.outputs[static_cast<std::size_t>(i)] = y.outputs[i] - x.outputs[i];
        for (int i = 0; i < y.saved.size(); ++i) d.saved[static_cast<std::size_t>(i)] = y.saved[i] - x.saved[i];
      }
      t.tempStep = c.tempFrom - b.tempFrom;
    }
  }
  t.nameParts.clear();
  for (const PartStep& d : t.partSteps) t.nameParts.push_back(d.index);
  t.copies = 0;
  t.series = text().AddSeries(t.span.parts, t.span.dims, t.positionSteps, t.numberSteps, t.nameParts);
  t.ready = true;
  return true;
}

void Tape::CheckpointOutsideTexts(int index, std::vector<Text>& out) const {
  const Node& node = nodes_[static_cast<std::size_t>(index)];
  out.clear();
  out.push_back(node.label);
  for (ValueId v : node.blockInputs) out.push_back(values_[static_cast<std::size_t>(v)].name);
  if (offload_ == nullptr || node.packed < 0) return;
  for (int id : packed_[static_cast<std::size_t>(node.packed)]) {
    if (id >= 0) out.push_back(offload_->PackedName(id));
  }
}

void Tape::AppendCopyText(SpanTemplate& t) {
  t.names.clear();
  for (std::uint32_t j : t.nameParts) t.names.push_back(t.span.parts[j]);
  text().AppendCopy(t.series, t.copies, t.names.data());
}

bool Tape::AdvanceTemplate(SpanTemplate& t) {
  SpanRecord& r = t.span.record;
  const auto move = [](std::size_t& v, std::int64_t d) { v = static_cast<std::size_t>(static_cast<std::int64_t>(v) + d); };
  move(r.eventFrom, t.eventStep);
  move(r.eventTo, t.eventStep);
  move(r.partFrom, t.partStep);
  move(r.partTo, t.partStep);
  move(r.dimFrom, t.dimStep);
  move(r.dimTo, t.dimStep);
  if (r.forward ? !LayerFollows(r.layer, r.layer + period_) : !LayerFollows(r.layer - period_, r.layer)) return false;
  r.layer += r.forward ? period_ : -period_;
  r.idFrom += t.idStep;
  r.idTo += t.idStep;
  r.layerAfter += t.layerStep;
  r.nodeFrom += t.nodeStep;
  r.nodeTo += t.nodeStep;
  for (std::size_t i = 0; i < r.inputNames.size(); ++i) {
    if (r.inputNames[i].count) r.inputNames[i].begin = static_cast<std::uint32_t>(r.inputNames[i].begin + t.inputNameSteps[i]);
  }
  for (std::size_t j = 0; j < t.span.events.size(); ++j) {
    Event& e = t.span.events[j];
    const EventStep& d = t.eventSteps[j];
    e.tensorId += d.id;
    e.layer += d.layer;
    e.label.begin = static_cast<std::uint32_t>(e.label.begin + d.label);  // empty Texts: step 0 (TextStep)
    e.tensor.begin = static_cast<std::uint32_t>(e.tensor.begin + d.tensor);
    e.formula.begin = static_cast<std::uint32_t>(e.formula.begin + d.formula);
  }
  const std::vector<Tensor>& parameters = inventory().parameters;
  // The parts that are positions and numbers move by the store's rule (AppendCopyText); only
  // the parameters' names are made here, copy by copy.
  ++t.copies;
  for (PartStep& d : t.partSteps) {
    TextPart& p = t.span.parts[d.index];
    if (d.what == PartStep::kPosition) {
      p.n = static_cast<std::uint32_t>(p.n + d.delta);
    } else if (d.what == PartStep::kValue) {
      p.value += d.delta;
    } else {
      d.delta += d.parameterStep;  // the parameter index
      if (d.delta < 0 || d.delta >= static_cast<std::int64_t>(parameters.size())) return false;
      const std::string& name = parameters[static_cast<std::size_t>(d.delta)].name;
      p.str = name.data();
      p.n = static_cast<std::uint32_t>(name.size());
    }
  }
  for (std::size_t j = 0; j < r.touches.size(); ++j) r.touches[j].first += t.touchSteps[j];
  for (std::size_t j = 0; j < r.grads.size(); ++j) {
    r.grads[j].first += t.gradSteps[j].first;
    r.grads[j].second += t.gradSteps[j].second;
    if (r.grads[j].first < 0 || r.grads[j].first >= static_cast<int>(parameterCount_)) return false;
  }
  for (int i = 0; i < r.inputGrads.size(); ++i) {
    if (r.inputGrads[i] != kNoTensor) r.inputGrads[i] += t.inputGradSteps[static_cast<std::size_t>(i)];
  }
  for (std::size_t j = 0; j < r.offloadStash.size(); ++j) {
    r.offloadStash[j].first += t.offloadStashSteps[j].first;
    r.offloadStash[j].second += t.offloadStashSteps[j].second;
  }
  for (std::size_t j = 0; j < r.offloadStashBefore.size(); ++j) {
    r.offloadStashBefore[j].first += t.offloadStashBeforeSteps[j].first;
    r.offloadStashBefore[j].second += t.offloadStashBeforeSteps[j].second;
  }
  if (r.forward) {
    r.valueFrom += t.valueStep;
    r.valueTo += t.valueStep;
    for (std::size_t j = 0; j < t.span.values.size(); ++j) {
      Value& v = t.span.values[j];
      const SpanTemplate::ValueStep& d = t.valueSteps[j];
      v.storage += d.storage;
      v.parameter += d.parameter;
      v.producer += d.producer;
      v.name.begin = static_cast<std::uint32_t>(v.name.begin + d.name);  // empty: step 0
    }
    const auto move = [this](std::vector<std::pair<int, int>>& x, const std::vector<std::pair<int, int>>& d) {
      for (std::size_t j = 0; j < x.size(); ++j) {
        x[j].first += d[j].first;
        x[j].second += d[j].second;
        if (x[j].first < 0 || x[j].first >= static_cast<int>(parameterCount_)) return false;
      }
      return true;
    };
    if (!move(r.casts, t.castSteps) || !move(r.leaves, t.leafSteps)) return false;
    for (int i = 0; i < r.outs.size(); ++i) r.outs[i] += t.outSteps[static_cast<std::size_t>(i)];
    for (std::size_t i = 0; i < r.scopeAfter.size(); ++i) {
      if (r.scopeAfter[i].count) r.scopeAfter[i].begin = static_cast<std::uint32_t>(r.scopeAfter[i].begin + t.scopeSteps[i]);
    }
    if (r.plain) {
      r.tempFrom += t.tempStep;
      r.tempTo += t.tempStep;
      for (std::size_t j = 0; j < t.span.nodes.size(); ++j) {
        Node& node = t.span.nodes[j];
        const SpanTemplate::NodeStep& d = t.nodeSteps[j];
        node.label.begin = static_cast<std::uint32_t>(node.label.begin + d.label);  // empty: step 0
        node.layer += d.layer;
        node.temps += d.temps;  // -1 stays: its step is 0
        for (int i = 0; i < node.inputs.size(); ++i) node.inputs[i].value += d.inputs[static_cast<std::size_t>(i)];
        for (int i = 0; i < node.outputs.size(); ++i) node.outputs[i] += d.outputs[static_cast<std::size_t>(i)];
        for (int i = 0; i < node.saved.size(); ++i) node.saved[i] += d.saved[static_cast<std::size_t>(i)];
      }
    }
  }
  return true;
}

bool Tape::ApplyPredicted(int index, const Values& inputs, SpanTemplate& t) {
  const PredictedSpan& predicted = t.span;
  const SpanRecord& r = predicted.record;
  // The prediction must continue the trace exactly where it stands, for the block it predicts
  // (a plain span: from its lowest node, `index`, for as many nodes as the spans it came from).
  if (nodes_[static_cast<std::size_t>(index)].layer != r.layer || !SpanFits(predicted) ||
      (r.plain && r.nodeFrom != index)) {
    return false;
  }
  for (const auto& [parameter, grad] : r.grads) {
    if (!sink_->CanTakeCopied(static_cast<std::size_t>(parameter)) || grad < r.idFrom || grad >= r.idTo) return false;
  }
  if (inputs.size() != r.inputGrads.size()) return false;
  if (r.plain) {
    if (r.inputNames.size() != static_cast<std::size_t>(inputs.size())) return false;
    for (int i = 0; i < inputs.size(); ++i) {
      if (!SameText(values_[static_cast<std::size_t>(inputs[i])].name, r.inputNames[static_cast<std::size_t>(i)])) return false;
    }
  }
  // A plain block's input may take the incoming gradient itself (a residual add passes it
  // through): a tensor of the span before, older than this one. So may a non-reentrant
  // checkpoint's, whose block's own nodes take the incoming gradients from the engine (a
  // reentrant one's backward makes every input gradient anew).
  const bool passesThrough = r.plain || nodes_[static_cast<std::size_t>(index)].packedOps >= 0;
  for (TensorHandle g : r.inputGrads) {
    if (g != kNoTensor && (g < (passesThrough ? 0 : r.idFrom) || g >= r.idTo)) return false;
  }
  if (r.plain && !TouchesConsistent(predicted)) return false;
  // A checkpointed block's words refer to texts its forward made: the copy's must be where the
  // template puts them (they are not where the blocks' forwards are laid out differently: the
  // first blocks' under activation offloading, whose forward stash fills over five packs).
  if (!r.plain) {
    std::vector<Text>& outside = outsideTexts_;
    CheckpointOutsideTexts(index, outside);
    if (outside.size() != r.inputNames.size()) return false;
    for (std::size_t i = 0; i < outside.size(); ++i) if (!SameText(outside[i], r.inputNames[i])) return false;
  }
  // Activation offloading: a checkpointed block brings its offloaded input back, and its
  // post-hook frees what the block before brought back. The offloader's stash must hold what
  // the template's spans found, moved on (the copy's events free those tensors; with a period
  // over one, the block before is of another place); it then holds what the copy brought back,
  // tensors of the copy (CopiedUnpack checks the rest, changing nothing when it refuses, so it
  // comes last).
  const Node& checkpoint = nodes_[static_cast<std::size_t>(index)];
  if ((!r.plain && offload_ != nullptr && checkpoint.packed >= 0) != r.unpacked) return false;
  if (r.unpacked) {
    if (offload_->backwardStash() != r.offloadStashBefore) return false;
    for (const auto& [id, tensor] : r.offloadStash) {
      if (tensor < r.idFrom || tensor >= r.idTo) return false;
    }
    const SmallVec<int, 6>& ids = packed_[static_cast<std::size_t>(checkpoint.packed)];
    if (!offload_->CopiedUnpack(ids.begin(), static_cast<std::size_t>(ids.size()), r.offloadStash)) return false;
  }
  AppendCopyText(t);
  ++gBackwardCopies;
  b_.AppendCopied(predicted.events, r.holders);
  for (const auto& [id, delta] : r.touches) b_.AddHolders(id, delta);
  for (const auto& [parameter, grad] : r.grads) sink_->TakeCopied(static_cast<std::size_t>(parameter), grad);
  if (r.plain) {  // every node's state as Execute leaves it
    for (int n = r.nodeFrom; n < r.nodeTo; ++n) {
      Node& node = nodes_[static_cast<std::size_t>(n)];
      node.done = true;
      node.saved.clear();
      for (ValueId o : node.outputs) GradOf(o) = kNoTensor;
    }
    for (int i = 0; i < inputs.size(); ++i) GradOf(inputs[i]) = r.inputGrads[i];
    layer_ = r.layerAfter;
    return true;
  }
  // The node's own state as RunCheckpoint leaves it.
  Node& node = nodes_[static_cast<std::size_t>(index)];
  node.done = true;
  node.saved.clear();
  for (ValueId o : node.outputs) GradOf(o) = kNoTensor;
  for (int i = 0; i < node.blockInputs.size(); ++i) GradOf(node.blockInputs[i]) = r.inputGrads[i];
  layer_ = r.layerAfter;
  return true;
}


// Plain blocks (not checkpointed; from speed8's a3bba7b): block k's forward recorded its ops as
// a run of nodes of layer k, and backward (reverse creation order, RunBackward) runs that run
// from its last node down to its first with nothing in between. Those runs repeat from block to
// block as the checkpointed spans do, with the node indices moving by a constant too; the same
// records, predictions and checks copy them (RunCheckpointSpan). Their state beside the trace:
// every node done with its saved tensors let go and its outputs' incoming gradients consumed
// (Execute), and the gradients left for the values the block reads from outside (its input).
int Tape::RunPlainSpan(int top) {
  const int layer = nodes_[static_cast<std::size_t>(top)].layer;
  int bottom = top;
  while (bottom > 0) {
    const Node& below = nodes_[static_cast<std::size_t>(bottom) - 1];
    if (below.layer != layer || below.block >= 0) break;
    --bottom;
  }
  const auto simulate = [&] {
    for (int n = top; n >= bottom; --n) {
      if (!nodes_[static_cast<std::size_t>(n)].done) Execute(n);
    }
  };
  // Short blocks cost more to record and check than to simulate (speed8: GPT-2 +8.5 %).
  if (top + 1 - bottom < kMinPlainBackwardNodes) {
    ForgetSpans();
    simulate();
    return bottom;
  }
  bool eligible = true;
  for (int n = bottom; n <= top && eligible; ++n) {
    const Node& node = nodes_[static_cast<std::size_t>(n)];
    eligible = !node.done && node.packed < 0 && node.precomputed < 0;
  }
  Values inputs;
  eligible = eligible && PlainSpanInputs(bottom, top, inputs);
  for (ValueId v : inputs) eligible = eligible && GradOf(v) == kNoTensor;
  if (eligible) {
    bool any = false;  // an incoming gradient: the block is on the way to the loss
    for (ValueId o : nodes_[static_cast<std::size_t>(top)].outputs) any = any || GradOf(o) != kNoTensor;
    eligible = any;
  }
  if (!eligible) {
    ForgetSpans();
    simulate();
    return bottom;
  }
  SpanChain& chain = backwardChain_;
  if (!chain.spans.empty() && !chain.spans.back().plain) ForgetSpans();  // a checkpointed block before this one
  if (Checked(chain, layer)) {
    SpanTemplate* t = NextTemplate(chain, layer, false);
    if (t != nullptr && t->span.record.nodeTo == top + 1 && ApplyPredicted(bottom, inputs, *t)) return bottom;
    ForgetSpans();
  }
  if (layerSignature_.empty()) ComputeLayerSignatures();
  SpanRecord r;
  r.plain = true;
  r.nodeFrom = bottom;
  r.nodeTo = top + 1;
  r.layer = layer;
  BeginSpanRecord(r);
  simulate();
  EndSpanRecord(r);
  for (ValueId v : inputs) {
    r.inputGrads.push_back(GradOf(v));
    r.inputNames.push_back(values_[static_cast<std::size_t>(v)].name);
  }
  r.layerAfter = layer_;
  for (const auto& [parameter, grad] : r.grads) r.copyable = r.copyable && grad >= 0;
  if (!r.copyable) {
    ForgetSpans();
    return bottom;
  }
  KeepSpan(chain, std::move(r));
  return bottom;
}

bool Tape::PlainSpanInputs(int bottom, int top, Values& out) const {
  out.clear();
  for (int n = bottom; n <= top; ++n) {
    for (const In& in : nodes_[static_cast<std::size_t>(n)].inputs) {
      // NeedsGrad, inline (an out-of-line call per input cost 1 % of a Mixtral estimate).
      if (in.rule == In::NoGrad || in.value == kNoValue) continue;
      const Value& v = values_[static_cast<std::size_t>(in.value)];
      if (!v.requiresGrad || v.parameter >= 0 || (v.producer >= bottom && v.producer <= top)) continue;
      if (std::find(out.begin(), out.end(), in.value) != out.end()) continue;
      if (out.size() == 4) return false;
      out.push_back(in.value);
    }
  }
  return true;
}

bool Tape::SameValue(const Value& x, const Value& y) {
  return x.storage == y.storage && x.shape == y.shape && x.type == y.type && x.requiresGrad == y.requiresGrad &&
         x.producer == y.producer && x.parameter == y.parameter && SameText(x.name, y.name);
}

// The forward span's own state (the values, cached casts, parameter leaves, outputs and scope),
// predicted as Predict predicts the rest.
bool Tape::PredictForward(const SpanRecord& a, const SpanRecord& b, PredictedSpan& out) const {
  SpanRecord& r = out.record;
  out.values.clear();
  const int count = b.valueTo - b.valueFrom;
  if (a.valueTo - a.valueFrom != count || a.casts.size() != b.casts.size() || a.leaves.size() != b.leaves.size() ||
      a.outs.size() != b.outs.size()) {
    return false;
  }
  const auto parameterCount = static_cast<std::int64_t>(parameterCount_);
  const auto parameter = [parameterCount](std::int64_t p) { return p >= 0 && p < parameterCount; };
  r.valueFrom = static_cast<int>(Next(a.valueFrom, b.valueFrom));
  r.valueTo = r.valueFrom + count;
  out.values.reserve(static_cast<std::size_t>(count));
  for (int j = 0; j < count; ++j) {
    const Value& x = a.values[static_cast<std::size_t>(j)];
    const Value& y = b.values[static_cast<std::size_t>(j)];
    // Only the outputs have a producer: the checkpoint node Checkpoint makes after the span.
    if (!(x.shape == y.shape) || x.type != y.type || x.requiresGrad != y.requiresGrad ||
        (x.producer < 0) != (y.producer < 0) || (x.storage < 0) != (y.storage < 0) ||
        (x.parameter < 0) != (y.parameter < 0)) {
      return false;
    }
    Value v = y;  // only an output could have a producer (Checkpoint sets it after the span)
    if (y.producer >= 0) v.producer = static_cast<int>(Next(x.producer, y.producer));
    if (y.storage >= 0) v.storage = static_cast<TensorHandle>(Next(x.storage, y.storage));
    if (y.parameter >= 0) {
      const std::int64_t p = Next(x.parameter, y.parameter);
      if (!parameter(p)) return false;
      v.parameter = static_cast<int>(p);
    }
    if (!NextText(x.name, y.name, v.name)) return false;
    out.values.push_back(v);
  }
  const auto pairs = [&](const std::vector<std::pair<int, int>>& x, const std::vector<std::pair<int, int>>& y,
                         std::vector<std::pair<int, int>>& to) {
    to.clear();
    for (std::size_t j = 0; j < y.size(); ++j) {
      const std::int64_t p = Next(x[j].first, y[j].first);
      if (!parameter(p)) return false;
      to.push_back({static_cast<int>(p), static_cast<int>(Next(x[j].second, y[j].second))});
    }
    return true;
  };
  if (!pairs(a.casts, b.casts, r.casts) || !pairs(a.leaves, b.leaves, r.leaves)) return false;
  r.outs.clear();
  for (int i = 0; i < b.outs.size(); ++i) r.outs.push_back(static_cast<ValueId>(Next(a.outs[i], b.outs[i])));
  for (std::size_t i = 0; i < r.scopeAfter.size(); ++i) {
    if (!NextText(a.scopeAfter[i], b.scopeAfter[i], r.scopeAfter[i])) return false;
  }
  out.nodes.clear();
  out.temps.clear();
  r.plain = b.plain;
  if (!b.plain) return true;
  // A plain block's nodes and backward temporaries, and the inputs they were recorded for.
  if (a.inputKinds.size() != b.inputKinds.size()) return false;
  for (int i = 0; i < b.inputKinds.size(); ++i) if (a.inputKinds[i] != b.inputKinds[i]) return false;
  r.inputKinds = b.inputKinds;
  r.nodeFrom = static_cast<int>(Next(a.nodeFrom, b.nodeFrom));
  r.nodeTo = r.nodeFrom + (b.nodeTo - b.nodeFrom);
  r.tempFrom = static_cast<int>(Next(a.tempFrom, b.tempFrom));
  r.tempTo = r.tempFrom + (b.tempTo - b.tempFrom);
  if (r.nodeFrom < 0 || r.tempFrom < 0) return false;
  out.nodes.resize(static_cast<std::size_t>(b.nodeTo - b.nodeFrom));
  for (int j = 0; j < b.nodeTo - b.nodeFrom; ++j) {
    if (!NextNode(nodes_[static_cast<std::size_t>(a.nodeFrom + j)], nodes_[static_cast<std::size_t>(b.nodeFrom + j)],
                  out.nodes[static_cast<std::size_t>(j)])) {
      return false;
    }
  }
  for (int j = 0; j < b.tempTo - b.tempFrom; ++j) {
    const BackwardTemps& x = temps_[static_cast<std::size_t>(a.tempFrom + j)];
    const BackwardTemps& y = temps_[static_cast<std::size_t>(b.tempFrom + j)];
    if (x.size() != y.size()) return false;
    for (int k = 0; k < y.size(); ++k) {
      if (!(x[k].shape == y[k].shape) || x[k].type != y[k].type || std::strcmp(x[k].name, y[k].name) != 0 ||
          x[k].beforeGradients != y[k].beforeGradients || x[k].afterGradients != y[k].afterGradients) {
        return false;
      }
    }
    out.temps.push_back(y);
  }
  return true;
}

// Node y's successor, every number moved on from x to y as much again (false: they differ in
// what does not move: their rules, list sizes, checkpoint or offload parts).
bool Tape::NextNode(const Node& x, const Node& y, Node& out) {
  if (x.inputs.size() != y.inputs.size() || x.outputs.size() != y.outputs.size() || x.saved.size() != y.saved.size() ||
      (x.temps < 0) != (y.temps < 0) || x.block >= 0 || y.block >= 0 || !x.blockInputs.empty() ||
      !y.blockInputs.empty() || x.packed >= 0 || y.packed >= 0 || x.precomputed >= 0 || y.precomputed >= 0 || x.done ||
      y.done || !NextText(x.label, y.label, out.label)) {
    return false;
  }
  out.layer = static_cast<int>(Next(x.layer, y.layer));
  out.inputs.clear();
  for (int i = 0; i < y.inputs.size(); ++i) {
    if (x.inputs[i].rule != y.inputs[i].rule || (x.inputs[i].value < 0) != (y.inputs[i].value < 0)) return false;
    In in = y.inputs[i];
    if (in.value >= 0) in.value = static_cast<ValueId>(Next(x.inputs[i].value, y.inputs[i].value));
    out.inputs.push_back(in);
  }
  out.outputs.clear();
  for (int i = 0; i < y.outputs.size(); ++i) out.outputs.push_back(static_cast<ValueId>(Next(x.outputs[i], y.outputs[i])));
  out.saved.clear();
  for (int i = 0; i < y.saved.size(); ++i) {
    if ((x.saved[i] < 0) != (y.saved[i] < 0)) return false;
    out.saved.push_back(y.saved[i] < 0 ? y.saved[i] : static_cast<TensorHandle>(Next(x.saved[i], y.saved[i])));
  }
  out.temps = y.temps < 0 ? -1 : static_cast<int>(Next(x.temps, y.temps));
  out.block = -1;
  out.blockInputs.clear();
  out.packed = -1;
  out.precomputed = -1;
  out.done = false;
  return true;
}

bool Tape::SameNode(const Node& x, const Node& y) {
  if (!SameText(x.label, y.label) || x.layer != y.layer || x.inputs.size() != y.inputs.size() ||
      x.outputs.size() != y.outputs.size() || x.saved.size() != y.saved.size() || x.temps != y.temps ||
      x.block != y.block || x.blockInputs.size() != y.blockInputs.size() || x.packed != y.packed ||
      x.precomputed != y.precomputed || x.done != y.done) {
    return false;
  }
  for (int i = 0; i < x.inputs.size(); ++i) {
    if (x.inputs[i].value != y.inputs[i].value || x.inputs[i].rule != y.inputs[i].rule) return false;
  }
  for (int i = 0; i < x.outputs.size(); ++i) if (x.outputs[i] != y.outputs[i]) return false;
  for (int i = 0; i < x.saved.size(); ++i) if (x.saved[i] != y.saved[i]) return false;
  return true;
}

bool Tape::SameForwardAsSimulated(const PredictedSpan& predicted, const SpanRecord& actual) const {
  const SpanRecord& r = predicted.record;
  if (r.layer != actual.layer || r.valueFrom != actual.valueFrom || r.valueTo != actual.valueTo ||
      r.casts != actual.casts || r.leaves != actual.leaves || r.outs.size() != actual.outs.size() ||
      predicted.values.size() != static_cast<std::size_t>(actual.valueTo - actual.valueFrom)) {
    return false;
  }
  for (int i = 0; i < r.outs.size(); ++i) if (r.outs[i] != actual.outs[i]) return false;
  for (std::size_t i = 0; i < r.scopeAfter.size(); ++i) {
    if (!SameText(r.scopeAfter[i], actual.scopeAfter[i])) return false;
  }
  for (std::size_t j = 0; j < predicted.values.size(); ++j) {
    if (!SameValue(predicted.values[j], actual.values[j])) return false;
  }
  if (r.plain != actual.plain) return false;
  if (!r.plain) return true;
  if (r.nodeFrom != actual.nodeFrom || r.nodeTo != actual.nodeTo || r.tempFrom != actual.tempFrom ||
      r.tempTo != actual.tempTo || predicted.nodes.size() != static_cast<std::size_t>(actual.nodeTo - actual.nodeFrom) ||
      predicted.temps.size() != static_cast<std::size_t>(actual.tempTo - actual.tempFrom)) {
    return false;
  }
  for (std::size_t j = 0; j < predicted.nodes.size(); ++j) {
    if (!SameNode(predicted.nodes[j], nodes_[static_cast<std::size_t>(actual.nodeFrom) + j])) return false;
  }
  return true;  // the temporaries' contents: equal to span b's, which PredictForward compared
}

// The common checks of a copy: it continues the trace exactly where it stands, its events make
// the next tensor ids in order and touch only tensors that exist, its holder changes are to
// older tensors.
bool Tape::SpanFits(const PredictedSpan& predicted) {
  const SpanRecord& r = predicted.record;
  if (r.eventFrom != b_.trace().events.size() || r.partFrom != text().partCount() || r.dimFrom != text().dimCount() ||
      r.idFrom != static_cast<int>(b_.tensorCount())) {
    return false;
  }
  int nextId = r.idFrom;
  for (const Event& e : predicted.events) {
    if (e.kind == EventKind::Alloc) {
      if (e.tensorId != nextId++) return false;
    } else if (e.tensorId < 0 || e.tensorId >= nextId) {
      return false;
    }
  }
  if (nextId != r.idTo || r.holders.size() != static_cast<std::size_t>(r.idTo - r.idFrom)) return false;
  for (const auto& [id, delta] : r.touches) {
    if (id < 0 || id >= r.idFrom) return false;
  }
  return true;
}

// The copy's holder changes against the live holder counts (from speed8's TouchesConsistent,
// a3bba7b): every older tensor the copy lets go of to none must be one whose Free it copies, and
// no other; none may go below zero.
bool Tape::TouchesConsistent(const PredictedSpan& predicted) const {
  const SpanRecord& r = predicted.record;
  // Summed per tensor in scratch arrays indexed by id (a plain block's backward lets go of
  // hundreds of its forward's tensors: sorting them cost 44 k instructions a copy on Mixtral).
  if (touchDelta_.size() < static_cast<std::size_t>(r.idFrom)) {
    touchDelta_.resize(static_cast<std::size_t>(r.idFrom), 0);
    touchFlags_.resize(static_cast<std::size_t>(r.idFrom), 0);
  }
  touchIds_.clear();
  constexpr std::uint8_t kTouched = 1, kFreed = 2;
  for (const auto& [id, delta] : r.touches) {  // ids in [0, idFrom): SpanFits
    if (touchFlags_[static_cast<std::size_t>(id)] == 0) touchIds_.push_back(id);
    touchFlags_[static_cast<std::size_t>(id)] |= kTouched;
    touchDelta_[static_cast<std::size_t>(id)] += delta;
  }
  bool consistent = true;
  const Trace& trace = b_.trace();
  for (const Event& e : predicted.events) {
    if (e.kind != EventKind::Free || e.tensorId >= r.idFrom) continue;
    // A Free repeats its tensor's allocation (TraceBuilder::Release): an older tensor's was
    // made before the spans the prediction came from, maybe by a block that differs from
    // theirs (block 0's forward, before the first copied one: its texts are elsewhere).
    const Event& alloc = trace.events[trace.allocAt[static_cast<std::size_t>(e.tensorId)]];
    std::uint8_t& flags = touchFlags_[static_cast<std::size_t>(e.tensorId)];
    // An older tensor the copy frees must be one whose holders it lets go of.
    if (e.bytes != alloc.bytes || e.layer != alloc.layer || e.category != alloc.category ||
        !SameText(e.tensor, alloc.tensor) || !SameText(e.formula, alloc.formula) || (flags & kTouched) == 0) {
      consistent = false;
      break;
    }
    flags |= kFreed;
  }
  for (int id : touchIds_) {
    const auto k = static_cast<std::size_t>(id);
    const int holders = b_.Holders(id) + touchDelta_[k];
    if (holders < 0 || (holders == 0) != ((touchFlags_[k] & kFreed) != 0)) consistent = false;
    touchDelta_[k] = 0;
    touchFlags_[k] = 0;
  }
  return consistent;
}

// Forward templates under checkpointing. A checkpointed block's forward runs without recording
// (Tape::Checkpoint): it leaves events, texts, new tensors and their holders, holder changes of
// older tensors (its input, the rotary tables), the values it made (ids, storages, names), the
// parameter leaves it made (Parameters' cache), autocast's cached weight copies, the scope and
// the layer. Block k+1's forward leaves the same with every id, text position, layer and
// parameter index moved by a constant, so the spans are recorded, predicted and checked as the
// backward spans are (RunCheckpointSpan), and copied once a prediction matched a simulated one.
// Refused with a layer hook (sharding engines), op-level selective checkpointing (the kept
// outputs) and in a recompute; a plain block's forward also under activation offloading (its
// ops' saved tensors go through the pack hooks).
Tape::Values Tape::RunForwardSpan(const Values& inputs, const Block& block, int plainLayer) {
  const bool plain = plainLayer >= 0;
  const int blockLayer = plain ? plainLayer : layer_;
  SpanChain& chain = forwardChain_;
  if (!chain.spans.empty() && chain.spans.back().plain != plain) ForgetForwardSpans();
  if (Checked(chain, blockLayer)) {
    SpanTemplate* t = NextTemplate(chain, blockLayer, true);
    Values outs;
    if (t != nullptr && ApplyForward(*t, inputs, blockLayer, outs)) return outs;
    ForgetForwardSpans();
  }
  if (layerSignature_.empty()) ComputeLayerSignatures();
  SpanRecord r;
  r.forward = true;
  r.plain = plain;
  r.layer = blockLayer;
  if (plain) {
    r.nodeFrom = static_cast<int>(nodes_.size());
    r.tempFrom = static_cast<int>(temps_.size());
  }
  for (ValueId v : inputs) r.inputKinds.push_back(InputKind(values_[static_cast<std::size_t>(v)]));
  const Trace& trace = b_.trace();
  r.eventFrom = trace.events.size();
  r.partFrom = text().partCount();
  r.dimFrom = text().dimCount();
  r.idFrom = static_cast<int>(b_.tensorCount());
  r.valueFrom = static_cast<int>(values_.size());
  const std::size_t nodesBefore = nodes_.size(), castFrom = cache().cached.size(), blocksBefore = blocks_.size();
  const int packedBefore = packedOps_;
  b_.RecordTouches(r.idFrom);
  leafLog_ = &r.leaves;
  Values outs = block(*this, inputs);
  leafLog_ = nullptr;
  r.packedOps = packedOps_ - packedBefore;
  r.touches = b_.touches();
  b_.RecordTouches(-1);
  r.eventTo = trace.events.size();
  r.partTo = text().partCount();
  r.dimTo = text().dimCount();
  r.idTo = static_cast<int>(b_.tensorCount());
  r.valueTo = static_cast<int>(values_.size());
  if (plain) {
    r.nodeTo = static_cast<int>(nodes_.size());
    r.tempTo = static_cast<int>(temps_.size());
  }
  r.values.assign(values_.begin() + r.valueFrom, values_.end());  // as the span left them
  r.holders.reserve(static_cast<std::size_t>(r.idTo - r.idFrom));
  for (int id = r.idFrom; id < r.idTo; ++id) r.holders.push_back(b_.Holders(id));
  const CastCache& c = cache();
  for (std::size_t j = castFrom; j < c.cached.size(); ++j) {
    r.casts.push_back({c.cached[j], c.byParameter[static_cast<std::size_t>(c.cached[j])]});
  }
  r.scopeAfter = {scope_, scopeColon_, scopeDot_, scopeSpace_};
  r.layerAfter = layer_;
  r.outs = outs;
  // A kept output, a checkpoint inside the block, an offloaded or precomputed node (and, in a
  // reentrant checkpoint's forward, any node) would be state a copy does not make. A
  // non-reentrant checkpoint's forward records nodes that Checkpoint drops when it ends: a copy
  // makes none, and adds the count of packing ops instead.
  bool copyable = sacBuilding_.empty() && c.cached.size() >= castFrom && blocks_.size() == blocksBefore &&
                  (plain ? r.layerAfter == r.layer : packing_ || nodes_.size() == nodesBefore);
  for (std::size_t n = nodesBefore; n < nodes_.size() && copyable; ++n) {
    copyable = nodes_[n].packed < 0 && nodes_[n].precomputed < 0 && nodes_[n].block < 0;
  }
  if (!copyable) {
    ForgetForwardSpans();
    return outs;
  }
  if (plain && r.nodeTo - r.nodeFrom < kMinPlainForwardNodes) {  // short blocks: simulated from now on
    plainForwardsOff_ = true;
    ForgetForwardSpans();
    return outs;
  }
  KeepSpan(chain, std::move(r));
  return outs;
}

void Tape::ForgetForwardSpans() { forwardChain_.Forget(); }

bool Tape::ApplyForward(SpanTemplate& t, const Values& inputs, int layer, Values& outs) {
  const PredictedSpan& predicted = t.span;
  const SpanRecord& r = predicted.record;
  if (!SpanFits(predicted) || r.layer != layer || r.valueFrom != static_cast<int>(values_.size()) ||
      (r.packedOps > 0 && !packing_) ||
      predicted.values.size() != static_cast<std::size_t>(r.valueTo - r.valueFrom) || !TouchesConsistent(predicted)) {
    return false;
  }
  const auto inRange = [&r](int v) { return v >= r.valueFrom && v < r.valueTo; };
  for (const Value& v : predicted.values) {
    if (v.storage >= r.idTo || v.parameter >= static_cast<int>(parameterCount_)) return false;
  }
  CastCache& c = cache();
  for (const auto& [parameter, value] : r.casts) {
    if (parameter < 0 || static_cast<std::size_t>(parameter) >= c.byParameter.size() || !inRange(value) ||
        c.byParameter[static_cast<std::size_t>(parameter)] != kNoValue) {
      return false;
    }
  }
  for (const auto& [parameter, value] : r.leaves) {
    if (parameter < 0 || static_cast<std::size_t>(parameter) >= leaves_->size() || !inRange(value) ||
        (*leaves_)[static_cast<std::size_t>(parameter)] != kNoValue) {
      return false;
    }
  }
  for (ValueId v : r.outs) if (!inRange(v)) return false;
  if (r.plain) {
    // The nodes continue the tape where it stands, for inputs of the kinds they were recorded
    // for, and point only at values, tensors and temporaries that exist once they are in.
    if (r.nodeFrom != static_cast<int>(nodes_.size()) || r.tempFrom != static_cast<int>(temps_.size()) ||
        inputs.size() != r.inputKinds.size()) {
      return false;
    }
    for (int i = 0; i < inputs.size(); ++i) {
      if (InputKind(values_[static_cast<std::size_t>(inputs[i])]) != r.inputKinds[i]) return false;
    }
    for (const Node& node : predicted.nodes) {
      for (const In& in : node.inputs) if (in.value >= r.valueTo) return false;
      for (ValueId v : node.outputs) if (!inRange(v)) return false;
      for (TensorHandle h : node.saved) if (h < kNoTensor || h >= r.idTo) return false;  // a weight's: none
      if (node.temps >= r.tempTo) return false;
    }
    for (const Value& v : predicted.values) {
      if (v.producer >= r.nodeTo || (v.producer >= 0 && v.producer < r.nodeFrom)) return false;
    }
  }
  AppendCopyText(t);
  b_.AppendCopied(predicted.events, r.holders);
  for (const auto& [id, delta] : r.touches) b_.AddHolders(id, delta);
  values_.insert(values_.end(), predicted.values.begin(), predicted.values.end());
  for (const auto& [parameter, value] : r.casts) {
    c.byParameter[static_cast<std::size_t>(parameter)] = value;
    c.cached.push_back(parameter);
  }
  for (const auto& [parameter, value] : r.leaves) (*leaves_)[static_cast<std::size_t>(parameter)] = value;
  scope_ = r.scopeAfter[0];
  scopeColon_ = r.scopeAfter[1];
  scopeDot_ = r.scopeAfter[2];
  scopeSpace_ = r.scopeAfter[3];
  layer_ = r.layerAfter;
  if (r.plain) {
    nodes_.insert(nodes_.end(), predicted.nodes.begin(), predicted.nodes.end());
    temps_.insert(temps_.end(), predicted.temps.begin(), predicted.temps.end());
  }
  packedOps_ += r.packedOps;
  outs = r.outs;
  ++gForwardCopies;
  return true;
}

}  // namespace gpumem
