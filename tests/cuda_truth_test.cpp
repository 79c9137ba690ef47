// The estimate against what an H100 measured (tests/data/cuda; scripts/measure_cuda.py ran there,
// scripts/cuda_compare.py prints the same comparison): PyTorch 2.11 + CUDA 13.0, transformers
// 5.17, peft 0.21, models built from their configs, two training steps each.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpumem/device.hpp"
#include "gpumem/json.hpp"
#include "test_support.hpp"

#ifndef GPUMEM_TEST_DATA
#define GPUMEM_TEST_DATA "tests/data"
#endif

namespace {

using nlohmann::json;

std::vector<json> Lines(const char* name) {
  std::ifstream in(std::string(GPUMEM_TEST_DATA "/cuda/") + name);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

std::map<std::string, json> Cases() {
  std::ifstream in(GPUMEM_TEST_DATA "/cuda/cases.json");
  std::map<std::string, json> cases;
  const json document = json::parse(in);  // kept: a range over a temporary's member would dangle
  for (const json& c : document["cases"]) cases[c["name"].get<std::string>()] = c;
  return cases;
}

// The case's setup with what the run changed: its batch size, allocator or module loading.
json SetupOf(const json& c, const json& run) {
  json s = c["setup"];
  const json env = run.value("jobEnv", json::object());
  if (env.value("PYTORCH_CUDA_ALLOC_CONF", "") == "expandable_segments:True") {
    s["runtime"]["allocator"] = {{"expandableSegments", true}};
  }
  if (env.value("CUDA_MODULE_LOADING", "") == "EAGER") s["runtime"]["lazyModuleLoading"] = false;
  const json overrides = run.value("overrides", json::object());
  if (overrides.contains("batchSize")) s["training"]["batchSize"] = overrides["batchSize"];
  if (overrides.contains("sequenceLength")) s["training"]["sequenceLength"] = overrides["sequenceLength"];
  // A run of a model with use_cache=False: the importer reads the config's use_cache too.
  if (overrides.value("hfConfig", json::object()).value("use_cache", true) == false) s["training"]["useCache"] = false;
  if (overrides.contains("allocatorLimitBytes")) {
    // set_per_process_memory_fraction caps what the allocator may reserve; the estimate's
    // allocator gets capacity − context, so the capacity is the limit + the estimate's own context.
    const gpumem::EstimateResult r = gpumem::EstimateFromJson(s.dump());
    REQUIRE(r.ok());
    s["gpu"]["memoryGiB"] = double(overrides["allocatorLimitBytes"].get<std::int64_t>() + r.estimate.device.contextBytes) /
                            double(1 << 30);
  }
  return s;
}

gpumem::DeviceEstimate Device(const json& setup) {
  const gpumem::EstimateResult r = gpumem::EstimateFromJson(setup.dump());
  REQUIRE(r.ok());
  return r.estimate.device;
}

double Percent(std::int64_t estimate, std::int64_t measured) {
  return 100.0 * (double(estimate) / double(measured) - 1.0);
}

}  // namespace

TEST_CASE("allocated, reserved and the device total against an H100", "[cuda]") {
  const auto cases = Cases();
  int compared = 0;
  std::vector<double> device;
  for (const char* file : {"measured-h100-torch2.11.jsonl", "measured-h100-torch2.11-oom-line.jsonl",
                           "measured-h100-torch2.11-no-cache.jsonl", "measured-h100-torch2.11-breadth.jsonl"}) {
    for (const json& run : Lines(file)) {
      if (!run.contains("peakAllocated") || !cases.contains(run.value("case", ""))) continue;
      if (run.value("overrides", json::object()).contains("batchSize")) continue;  // the OOM line, below
      const gpumem::DeviceEstimate d = Device(SetupOf(cases.at(run["case"]), run));
      const double allocated = Percent(d.peakAllocatedBytes, run["peakAllocated"]);
      const double reserved = Percent(d.peakReservedBytes, run["peakReserved"]);
      const double total = Percent(d.peakDeviceBytes, run["nvmlUsedEnd"]);
      INFO(run["case"] << " " << run.value("jobEnv", json::object()).dump() << ": allocated " << allocated
                       << " %, reserved " << reserved << " %, device " << total << " %");
      // Measured 2026-11-24: every allocated peak within 0.05 %. GPT-2 under SDPA was −2.2 / −3.5 %
      // before transformers' DynamicCache was simulated (training.useCache), the Llama family's
      // grouped-query runs under SDPA +1.3 … +2.3 % before enable_gqa was (no repeat_kv copies),
      // BERT −1.2 % (fp16) and −0.8 % (fp32) before the bias gradients' CUDA sums took their
      // scratch (sim/reduction.cpp): docs/validation.md, "CUDA truth".
      CHECK(std::abs(allocated) < 0.05);
      // Under by less than 4 %; over by less than 8 %: the worst is Qwen2.5 1.5B under autocast
      // with eager attention, +7.8 % reserved with its allocated peak exact (docs/validation.md).
      CHECK(reserved > -4.0);
      CHECK(reserved < 8.0);
      CHECK(total > -4.0);
      CHECK(total < 8.0);
      ++compared;
      device.push_back(std::abs(total));
    }
  }
  CHECK(compared == 25);
  REQUIRE_FALSE(device.empty());
  std::sort(device.begin(), device.end());
  CHECK(device[device.size() / 2] < 1.0);  // the median device total within 1 %
}

TEST_CASE("the out-of-memory line on an H100: every batch tried at capacity called right", "[cuda]") {
  // Batch sizes around the solver's answer, each in a fresh process at the GPU's whole capacity
  // (CUDA's total, 79.18 GiB): Llama 3.2 1B checkpointed runs out at 17, fits at 18 and runs out
  // at 19 (the allocator's segments, not the allocated peak, decide it), and the estimate, which
  // simulates the allocator at capacity, calls each one.
  const auto cases = Cases();
  int tried = 0;
  for (const json& run : Lines("measured-h100-torch2.11-oom-line.jsonl")) {
    if (!run.value("overrides", json::object()).contains("batchSize")) continue;
    const gpumem::DeviceEstimate d = Device(SetupOf(cases.at(run["case"]), run));
    const bool measuredFits = !run.contains("oom") || run["oom"].is_null();
    INFO(run["case"] << " batch " << run["overrides"]["batchSize"]);
    CHECK(d.capacityBytes == 85'017'493'504);
    CHECK(d.fits == measuredFits);
    ++tried;
  }
  CHECK(tried == 13);
  // A smaller GPU: the allocator capped at 24 GiB, Llama 3.2 1B checkpointed under autocast at
  // batch 1. Its allocated peak is 23.09 GiB at every length, yet it runs out from 4,608 tokens:
  // the segments decide, and the simulation, which frees and retries as the allocator does,
  // calls 3,072 and 4,096 fits and 4,608 / 5,120 / 6,144 out of memory.
  int limited = 0;
  for (const json& run : Lines("measured-h100-torch2.11-limit-24gib.jsonl")) {
    if (!run.value("overrides", json::object()).contains("allocatorLimitBytes")) continue;
    const gpumem::DeviceEstimate d = Device(SetupOf(cases.at(run["case"]), run));
    INFO("sequence " << run["overrides"]["sequenceLength"]);
    CHECK(d.fits == (!run.contains("oom") || run["oom"].is_null()));
    ++limited;
  }
  CHECK(limited == 5);
}

namespace {

// A measured trace (the stack-labelled snapshots in tests/data/cuda/stacks) as the allocator
// model's events, and the reserved peak PyTorch's own segment events reached.
struct MeasuredTrace {
  std::vector<gpumem::AllocatorEvent> events;
  std::int64_t peakReservedBytes = 0;
};

MeasuredTrace ReadTrace(const std::string& name) {
  MeasuredTrace t;
  std::map<std::int64_t, int> live;  // address → tensor id
  std::int64_t reserved = 0;
  for (const gpumem::test::StackTraceEntry& e : gpumem::test::ReadStackTrace(name)) {
    if (e.action == "segment_alloc") reserved += e.size;
    if (e.action == "segment_free") reserved -= e.size;
    t.peakReservedBytes = std::max(t.peakReservedBytes, reserved);
    if (e.action == "alloc") {
      const int tensor = static_cast<int>(t.events.size());
      live[e.address] = tensor;
      t.events.push_back({gpumem::AllocatorEventKind::Alloc, tensor, e.size, 0});
    } else if (e.action == "free_completed") {  // the block is reusable from here
      const auto it = live.find(e.address);
      REQUIRE(it != live.end());
      t.events.push_back({gpumem::AllocatorEventKind::Free, it->second, 0, 0});
      live.erase(it);
    }
  }
  return t;
}

}  // namespace

TEST_CASE("the allocator model replays the H100's own traces to the segments PyTorch reserved", "[cuda][allocator]") {
  // The same alloc / free sequence PyTorch's allocator saw, through the model: what is left is
  // the allocator model alone (no simulation of the step). Each trace lacks the segments made
  // before recording began (a 2 MiB one for the first tensors), so the model may be that much over.
  const gpumem::AllocatorRecording peaksOnly{false, false, false};
  for (const char* name : {"bert-base-cls-ampfp16-b32-s512-b8.pickle", "gpt2-amp-eager-b8-b4.pickle",
                           "gpt2-amp-sdpa-b8-b8.pickle", "gpt2-bf16mixed-eager-nocache-b16-b4.pickle",
                           "gpt2-fp32-sdpa-b4-b4.pickle", "llama3.2-1b-bf16-sdpa-b4-s2048-b1.pickle",
                           "qwen2.5-1.5b-amp-sdpa-b2-s2048-b1.pickle"}) {
    const MeasuredTrace t = ReadTrace(name);
    const gpumem::AllocatorResult r = gpumem::SimulateCachingAllocator(
        t.events, gpumem::DefaultAllocatorOptions(), gpumem::kUnlimitedDeviceBytes, peaksOnly);
    INFO(name << ": model " << r.peakReservedBytes << " B, measured " << t.peakReservedBytes << " B");
    CHECK(r.peakReservedBytes >= t.peakReservedBytes);
    CHECK(r.peakReservedBytes <= t.peakReservedBytes + (2 << 20));
  }
  // Qwen2.5 1.5B under autocast with eager attention (28 layers, 20,807 events) is the exception:
  // the model reserves 41.35 GiB where PyTorch reserved 39.30. The driver's addresses decide it:
  // best fit takes the lowest address among equal-sized free blocks, and CUDA hands out segments
  // above 20 MiB downwards (355 of this trace's 408 landed below the one before), where the model
  // gives every segment a higher address than the last. With the trace's own segment addresses,
  // or with larger segments placed downwards, the model reserves 39.31 GiB; that placement moved
  // the simulated runs' reserved peaks both ways (Qwen2.5 under SDPA −2.4 % → +2.1 %, this one
  // +7.8 % → +7.5 %) and so is not taken (docs/validation.md, "CUDA truth").
  const MeasuredTrace qwen = ReadTrace("qwen2.5-1.5b-amp-eager-nocache-b1-s2048-b1.pickle");
  const gpumem::AllocatorResult r = gpumem::SimulateCachingAllocator(
      qwen.events, gpumem::DefaultAllocatorOptions(), gpumem::kUnlimitedDeviceBytes, peaksOnly);
  CHECK(double(r.peakReservedBytes) / double(qwen.peakReservedBytes) == Approx(1.052).margin(0.005));
}

