// Loading a quantized model on one GPU (core/src/sim/loading.cpp): each loader's events for one
// weight with sizes worked out by hand from the sources' formulas, the steps' peaks unchanged,
// and what the transients leave in the caching allocator's reserved memory.
#include <catch2/catch.hpp>

#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/device.hpp"
#include "gpumem/estimate.hpp"
#include "gpumem/finetune.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

struct Ev {
  EventKind kind;
  std::int64_t bytes;
  Category category;
  bool operator==(const Ev&) const = default;
};
constexpr EventKind A = EventKind::Alloc;
constexpr EventKind F = EventKind::Free;
constexpr Category W = Category::WeightCopies;
constexpr Category P = Category::Parameters;

// The init events whose tensor name starts with `tensor` (the parameter's name, and its
// transients "<name> <what>"), from the first to the last.
std::vector<Ev> InitEventsOf(const Trace& trace, const std::string& tensor, std::size_t from = 0,
                             std::size_t* end = nullptr) {
  std::vector<Ev> out;
  for (std::size_t i = from; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.phase != Phase::Init) break;
    const std::string name = trace.text.Render(e.tensor);
    if (name == tensor || name.starts_with(tensor + " ")) {
      out.push_back({e.kind, e.bytes, e.category});
      if (end) *end = i + 1;
    } else if (!out.empty()) {
      break;  // the weight's events are contiguous
    }
  }
  return out;
}

std::size_t FirstInitIndex(const Trace& trace, const std::string& label) {
  for (std::size_t i = 0; i < trace.events.size() && trace.events[i].phase == Phase::Init; ++i) {
    if (trace.text.Render(trace.events[i].label).find(label) != std::string::npos) return i;
  }
  return trace.events.size();
}

// The same trace without the loaders' transients (init events of WeightCopies), tensor ids
// renumbered, in place (the events' words stay in its TextStore): what the plain init (each
// parameter in its stored form) would replay.
Trace WithoutLoading(Trace trace) {
  std::vector<Event> events;
  std::vector<std::uint32_t> allocAt, freeAt;
  std::unordered_map<int, int> id;
  for (const Event& e : trace.events) {
    if (e.phase == Phase::Init && e.category == Category::WeightCopies) continue;
    Event copy = e;
    if (e.kind == EventKind::Alloc) {
      copy.tensorId = static_cast<int>(allocAt.size());
      id[e.tensorId] = copy.tensorId;
      allocAt.push_back(static_cast<std::uint32_t>(events.size()));
      freeAt.push_back(Trace::kNeverFreed);
    } else {
      copy.tensorId = id.at(e.tensorId);
      freeAt[static_cast<std::size_t>(copy.tensorId)] = static_cast<std::uint32_t>(events.size());
    }
    events.push_back(copy);
  }
  trace.events.assign(events.begin(), events.end());
  trace.allocAt.assign(allocAt.begin(), allocAt.end());
  trace.freeAt.assign(freeAt.begin(), freeAt.end());
  return trace;
}

std::int64_t Sum(const std::vector<Ev>& events, EventKind kind, Category category) {
  std::int64_t total = 0;
  for (const Ev& e : events) if (e.kind == kind && e.category == category) total += e.bytes;
  return total;
}

// hidden 64, intermediate 128: up_proj.weight is [128, 64] = 8,192 values, 128 blocks of 64.
Setup BnbQlora(bool doubleQuant) {
  Setup s = TinyTransformer(Family::Llama, 2, Precision::BF16Mixed);
  s.finetune.lora = true;
  s.finetune.r = 4;
  s.finetune.quantization = Quantization::NF4;
  s.finetune.doubleQuant = doubleQuant;
  s.finetune.computeDType = DType::BF16;
  return s;
}

// torchtune's QLoRA on a small Llama (as tests/fsdp2_qlora_test.cpp builds it): hidden 256,
// intermediate 512, so every block linear holds a multiple of 16,384 values.
Setup TorchtuneQlora(bool chunks) {
  Setup s = TorchtuneQloraLlama();
  s.finetune.torchaoQuantizeInChunks = chunks;
  return s;
}

// to_nf4 (NF4Tensor.from_tensor) of q_proj's [256, 256] bf16 weight: n = 65,536 values, B =
// 1,024 blocks of 64, 4 scaler blocks of 256; `stored` the NF4Tensor (kept or the second one).
std::vector<Ev> FromTensorEvents(Category stored, bool chunks) {
  const std::int64_t n = 65536, B = 1024, S = 4;
  const std::int64_t nf4Bytes = n / 2 + B + S * 2 + 17 * 2;  // TorchaoNf4 stored bytes: 33,834
  std::vector<Ev> e = {
      // double_quantize_scalers: get_block_absmax(x, 64): abs, max values and int64 indices
      {A, n * 2, W}, {A, B * 2, W}, {A, B * 8, W}, {F, n * 2, W}, {F, B * 8, W},
      {A, B * 2, W}, {F, B * 2, W},                                 // scalers_1 − mean; old scalers_1 freed
      {A, B * 2, W}, {A, S * 2, W}, {A, S * 8, W}, {F, B * 2, W}, {F, S * 8, W},  // get_block_absmax(scalers_1, 256)
      {A, B * 2, W}, {A, B * 2, W}, {A, B * 2, W}, {F, B * 2, W}, {F, B * 2, W},  // 2 · absmax, its reciprocal, × 256
      {A, B * 2, W}, {A, B * 2, W}, {F, B * 2, W}, {A, B * 2, W}, {F, B * 2, W},  // ×, round, clamp
      {F, B * 2, W}, {F, S * 2, W}, {F, B * 2, W}, {F, B * 2, W},   // locals freed on return
      // convert_to_norm_float_weight: get_block_absmax(x, 64), scaled_blocks
      {A, n * 2, W}, {A, B * 2, W}, {A, B * 8, W}, {F, n * 2, W}, {F, B * 8, W}, {A, n * 2, W},
  };
  // quantize_tensor_nearest on c values: value − nf4 and its abs [c, 16] bf16, min values [c]
  // bf16 and indices [c] int64.
  auto nearest = [&](std::int64_t c) {
    for (Ev x : std::vector<Ev>{{A, c * 32, W}, {A, c * 32, W}, {F, c * 32, W}, {A, c * 2, W}, {A, c * 8, W},
                                {F, c * 2, W}, {F, c * 32, W}}) {
      e.push_back(x);
    }
  };
  if (chunks) {  // one chunk: 65,536 < 1,048,576
    e.push_back({A, n, W});  // quantized_blocks uint8 [n]
    nearest(n);
    for (Ev x : std::vector<Ev>{{A, n, W}, {F, n * 8, W}, {F, n, W},  // .to(uint8), copied in
                                {A, n / 2, W}, {A, nf4Bytes, stored}, {F, n / 2, W},
                                {F, B * 2, W}, {F, n, W}, {F, n * 2, W}}) {  // scalers, quantized_blocks, scaled_blocks
      e.push_back(x);
    }
  } else {  // torchao 0.1: int64 indices, << 4 and | in int64, .to(uint8)
    nearest(n);
    for (Ev x : std::vector<Ev>{{A, n / 2 * 8, W}, {A, n / 2 * 8, W}, {F, n / 2 * 8, W}, {A, nf4Bytes, stored},
                                {F, B * 2, W}, {F, n * 2, W}, {F, n * 8, W}, {F, n / 2 * 8, W}}) {
      e.push_back(x);
    }
  }
  return e;
}

}  // namespace

TEST_CASE("bitsandbytes 4-bit loading: the bf16 copy and the double-quant temporaries around the packed weight", "[loading]") {
  for (const bool doubleQuant : {true, false}) {
    const Setup s = BnbQlora(doubleQuant);
    const Inventory inv = BuildInventory(s);
    const Trace trace = BuildTrace(s, inv);
    const std::string up = "model.layers.0.mlp.up_proj.weight";
    // n = 8,192, 128 blocks: the bf16 copy 16,384 B (Params4bit._quantize w); with double quant
    // the fp32 absmax 512 B and absmax − offset 512 B are transients, the stored form is
    // 4,096 packed + 128 uint8 absmax + 4 offset + 4 nested absmax + 64 code = 4,296 B; without,
    // the stored form keeps the fp32 absmax: 4,096 + 512 + 64 = 4,672 B.
    const std::vector<Ev> expected =
        doubleQuant ? std::vector<Ev>{{A, 16384, W}, {A, 512, W}, {A, 4296, P}, {A, 512, W}, {F, 512, W}, {F, 512, W}, {F, 16384, W}}
                    : std::vector<Ev>{{A, 16384, W}, {A, 4672, P}, {F, 16384, W}};
    CHECK(InitEventsOf(trace, up) == expected);
    const std::size_t at = FirstInitIndex(trace, "quantize_4bit of " + up);
    REQUIRE(at < trace.events.size());
    CHECK(trace.text.Render(trace.events[at].label) == "loading: quantize_4bit of " + up + " (bf16 copy)");
    // PEFT's adapters come after the whole model is loaded (get_peft_model after from_pretrained).
    std::size_t lastBase = 0, firstAdapter = trace.events.size();
    for (std::size_t i = 0; i < trace.events.size() && trace.events[i].phase == Phase::Init; ++i) {
      const std::string name = trace.text.Render(trace.events[i].tensor);
      if (name.find(".lora_") != std::string::npos) firstAdapter = std::min(firstAdapter, i);
      else lastBase = i;
    }
    CHECK(lastBase < firstAdapter);
  }
}

TEST_CASE("bitsandbytes int8 loading: an fp16 copy around int8_vectorwise_quant", "[loading]") {
  Setup s = BnbQlora(false);
  s.finetune.quantization = Quantization::Int8;
  const Inventory inv = BuildInventory(s);  // the trace's names view into it
    const Trace trace = BuildTrace(s, inv);
  // Int8Params._quantize: .to(device, dtype=float16) [128, 64] = 16,384 B; CB int8 8,192 B +
  // SCB fp32 128 rows = 8,704 B kept.
  CHECK(InitEventsOf(trace, "model.layers.1.mlp.up_proj.weight") == std::vector<Ev>{{A, 16384, W}, {A, 8704, P}, {F, 16384, W}});
}

TEST_CASE("prepare_model_for_kbit_training: each 16-bit parameter upcast while it lives then freed", "[loading]") {
  Setup s = BnbQlora(true);
  s.finetune.prepareForKbitTraining = true;
  const Inventory inv = BuildInventory(s);  // the trace's names view into it
    const Trace trace = BuildTrace(s, inv);
  // model.norm.weight [64]: placed in bf16 (128 B) by from_pretrained; later the fp32 256 B is
  // made, then the bf16 data freed (param.data = param.data.to(torch.float32)).
  std::size_t end = 0;
  const std::vector<Ev> placed = InitEventsOf(trace, "model.norm.weight", 0, &end);
  CHECK(placed == std::vector<Ev>{{A, 128, W}});
  CHECK(InitEventsOf(trace, "model.norm.weight", end) == std::vector<Ev>{{A, 256, P}, {F, 128, W}});
  // The embedding table [1,000, 64] likewise: 128,000 B bf16, then 256,000 B fp32.
  const std::vector<Ev> embed = InitEventsOf(trace, "model.embed_tokens.weight");
  CHECK(embed == std::vector<Ev>{{A, 128000, W}});
  const std::size_t cast = FirstInitIndex(trace, "prepare_model_for_kbit_training: fp32 copy of model.embed_tokens.weight");
  REQUIRE(cast < trace.events.size());
  CHECK(trace.events[cast].bytes == 256000);
  CHECK(trace.events[cast].category == Category::Parameters);
  // The casts come after every quantized weight is placed.
  CHECK(cast > FirstInitIndex(trace, "quantize_4bit of model.layers.1.mlp.down_proj.weight"));
}

TEST_CASE("torchtune QLoRA loading: to_nf4 at construction then again in load_state_dict", "[loading]") {
  for (const bool chunks : {true, false}) {
    const Setup s = TorchtuneQlora(chunks);
    const Inventory inv = BuildInventory(s);  // the trace's names view into it
    const Trace trace = BuildTrace(s, inv);
    const std::string q = "model.layers.0.self_attn.q_proj.base_layer.weight";
    // Construction: nn.Linear's bf16 weight [256, 256] (131,072 B), to_nf4 of it (kept), the
    // nn.Linear dropped.
    std::vector<Ev> construct = {{A, 131072, W}};
    for (const Ev& e : FromTensorEvents(P, chunks)) construct.push_back(e);
    construct.push_back({F, 131072, W});
    std::size_t end = 0;
    CHECK(InitEventsOf(trace, q, 0, &end) == construct);
    // load_state_dict: the checkpoint's bf16 copy on the GPU, to_nf4 of it (a second NF4Tensor,
    // copied into the parameter in place and dropped), the copy dropped.
    std::vector<Ev> load = {{A, 131072, W}};
    for (const Ev& e : FromTensorEvents(W, chunks)) load.push_back(e);
    load.push_back({F, 33834, W});
    load.push_back({F, 131072, W});
    CHECK(InitEventsOf(trace, q, end) == load);
    const std::size_t at = FirstInitIndex(trace, "load_state_dict copy_ into NF4Tensor of " + q);
    REQUIRE(at < trace.events.size());
    CHECK(trace.text.Render(trace.events[at].label) ==
          "loading: load_state_dict copy_ into NF4Tensor of " + q + " (bf16 checkpoint copy)");
    // Every transient is freed within the weight's own events.
    const std::vector<Ev> all = InitEventsOf(trace, q, end);
    CHECK(Sum(all, A, W) == Sum(all, F, W));
  }
}

TEST_CASE("torchao to_nf4 in chunks: quantize_tensor_nearest on 1048576 values at a time", "[loading]") {
  // With hidden 2,048 and intermediate 1,024, gate_proj holds 2,097,152 values: two full chunks,
  // the second a repeat of the first (written out once); with intermediate 1,280 (2,621,440
  // values) two full chunks, the second written out once, and a half one.
  for (const std::int64_t intermediate : {1024, 1280}) {
    Setup s = TorchtuneQlora(true);
    s.model.architecture.hiddenSize = 2048;
    s.model.architecture.intermediateSize = intermediate;
    s.model.architecture.numHeads = 16;
    s.model.architecture.numKeyValueHeads = 16;
    const Inventory inv = BuildInventory(s);
    const Trace trace = BuildTrace(s, inv);
    const std::vector<Ev> gate = InitEventsOf(trace, "model.layers.0.mlp.gate_proj.weight");
    const std::int64_t full = (std::int64_t{1} << 20) * 16 * 2, half = full / 2;  // [c, 16] bf16
    std::int64_t fulls = 0, halves = 0, largest = 0;
    for (const Ev& e : gate) {
      fulls += e.kind == A && e.bytes == full;
      halves += e.kind == A && e.bytes == half;
      largest = std::max(largest, e.bytes);
    }
    // The construction's to_nf4 (InitEventsOf reads the weight's first run of events): value −
    // nf4 and its abs of the first chunk, and of the half chunk when there is one.
    CHECK(fulls == 2);
    CHECK(halves == (intermediate == 1280 ? 2 : 0));
    CHECK(largest == full);
    const std::string chunks = intermediate == 1280 ? "3" : "2";
    CHECK(FirstInitIndex(trace, "chunk 1 of " + chunks + " .to(uint8)") < trace.events.size());
    if (intermediate == 1280) CHECK(FirstInitIndex(trace, "chunk 3 of 3 .to(uint8)") < trace.events.size());
  }
}

TEST_CASE("Loading leaves the steps' peaks as they were and raises the init peak and the reserved figure", "[loading]") {
  for (const bool torchao : {true, false}) {
    const Setup s = torchao ? TorchtuneQlora(true) : BnbQlora(true);
    const Inventory inv = BuildInventory(s);
    const Trace loaded = BuildTrace(s, inv);
    const Trace plain = WithoutLoading(BuildTrace(s, inv));
    const Estimate a = Replay(loaded), b = Replay(plain);
    for (const Phase phase : {Phase::Forward, Phase::Backward, Phase::OptimizerStep}) {
      CHECK(a.phasePeaks[static_cast<std::size_t>(phase)].totalBytes == b.phasePeaks[static_cast<std::size_t>(phase)].totalBytes);
    }
    // torchtune's transients (4 MiB of value − nf4 and its abs for gate_proj) raise the init
    // peak; bitsandbytes' (a 16 KiB bf16 copy) do not here: the 128,000 B head is placed after
    // the last quantized weight, so the init peak is its end, as before.
    if (torchao) CHECK(a.phasePeaks[0].totalBytes > b.phasePeaks[0].totalBytes);
    else CHECK(a.phasePeaks[0].totalBytes == b.phasePeaks[0].totalBytes);
    // Live at the end of init: exactly the stored parameters.
    std::int64_t live = 0, stored = 0;
    for (const Event& e : loaded.events) {
      if (e.phase != Phase::Init) break;
      live += e.kind == EventKind::Alloc ? e.bytes : -e.bytes;
    }
    for (const Tensor& p : inv.parameters) stored += StoredBytes(p, DType::BF16);
    CHECK(live == stored);
  }
  // Reserved, torchtune's QLoRA with intermediate 4,096: gate_proj and up_proj are [4,096, 256] =
  // 1,048,576 values, one chunk, so quantize_tensor_nearest holds value − nf4 and its abs,
  // [1,048,576, 16] bf16 = 32 MiB each, at once. A request of 10 MiB or more gets a segment of
  // its own, rounded to 2 MiB (CUDACachingAllocator get_allocation_size), and nothing frees a
  // segment later: loading leaves two 32 MiB segments. The steps then cut their large blocks
  // from those cached segments, where the plain init's run cudaMallocs a 14 MiB segment for
  // them, and the small pool needs one 2 MiB segment more: 64 − 14 + 2 = 52 MiB more reserved
  // (100 MiB against 48 MiB, both at their training-step peaks).
  Setup s = TorchtuneQlora(true);
  s.model.architecture.intermediateSize = 4096;
  const Inventory inv = BuildInventory(s);
  const Trace loaded = BuildTrace(s, inv);
  const Trace plain = WithoutLoading(BuildTrace(s, inv));
  const std::int64_t capacity = std::int64_t{24} << 30, MiB = std::int64_t{1} << 20;
  const DeviceAllocatorInput in = DeviceAllocatorInputOf(s, loaded, capacity);
  const DeviceAllocatorInput inPlain = DeviceAllocatorInputOf(s, plain, capacity);
  AllocatorRecording recording;
  recording.segmentsAtPeak = true;
  const AllocatorResult r = SimulateCachingAllocator(in.events, in.options, in.limitBytes, recording);
  const AllocatorResult rPlain = SimulateCachingAllocator(inPlain.events, inPlain.options, inPlain.limitBytes, recording);
  CHECK(r.peakReservedBytes == 100 * MiB);
  CHECK(rPlain.peakReservedBytes == 48 * MiB);
  int loadingSegments = 0, plainLarge = 0;
  for (const AllocatorSegmentInfo& g : r.segmentsAtPeakReserved) loadingSegments += !g.smallPool && g.totalBytes == 32 * MiB;
  for (const AllocatorSegmentInfo& g : rPlain.segmentsAtPeakReserved) plainLarge += !g.smallPool && g.totalBytes == 14 * MiB;
  CHECK(loadingSegments == 2);
  CHECK(plainLarge == 1);
  // The allocated peak of the steps is the same in both runs (the transients are gone by then).
  CHECK(Replay(loaded).phasePeaks[1].totalBytes == Replay(plain).phasePeaks[1].totalBytes);
}

TEST_CASE("The work budget bounds the loading events of torchtune's QLoRA", "[loading]") {
  // setup.cpp PredictEvents with FinetuneEventsPerBlock stays an upper bound of the events with
  // loading, chunked (up to two chunks written out per to_nf4) or whole, with and without
  // checkpointing.
  for (const bool chunks : {true, false}) {
    for (const std::int64_t intermediate : {512, 1280}) {
      for (const Checkpointing c : {Checkpointing::None, Checkpointing::EveryBlock}) {
        Setup s = TorchtuneQlora(chunks);
        s.model.architecture.hiddenSize = 2048;
        s.model.architecture.intermediateSize = intermediate;
        s.model.architecture.numHeads = 16;
        s.model.architecture.numKeyValueHeads = 16;
        s.finetune.targetModules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        s.training.checkpointing = c;
        const EstimateResult r = EstimateMemory(s, {.timeline = EstimateOptions::Timeline::None, .timelineLimit = 0, .explain = false});
        REQUIRE(r.ok());
        INFO("chunks " << chunks << " intermediate " << intermediate << ": " << r.estimate.eventCount);
        CHECK(PredictEvents(s).predictedEvents >= double(r.estimate.eventCount));
      }
    }
  }
}
