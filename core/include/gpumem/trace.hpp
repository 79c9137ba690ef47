// gpumem — Trace: one training step (twice) as an ordered list of allocation and free events.
//
// Why a trace and not a sum of formulas: the peak comes from overlaps (activations still held
// while gradients appear, the loss's fp32 copies, the optimizer's temporaries on top of its
// states). Replaying events gets them by construction. Each event's size is one formula of the
// inputs, carried in `formula` so that "explain" can show it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"
#include "gpumem/text.hpp"

namespace gpumem {

enum class Phase : std::uint8_t { Init, Forward, Backward, OptimizerStep };

enum class Category : std::uint8_t {
  Parameters,              // the weights the model computes with (working dtype)
  MasterWeights,           // fp32 copy kept by the optimizer under mixed precision
  Gradients,               // parameter gradients (.grad)
  OptimizerStates,         // momentum, Adam's exp_avg/exp_avg_sq, Adafactor's factors
  OptimizerIntermediates,  // temporaries allocated and freed inside optimizer.step()
  Activations,             // forward outputs and tensors saved for backward
  ActivationGradients,     // gradients flowing backward through activations (transient)
  InputBatch,              // token ids / features and labels of one micro-batch
  WeightCopies,            // autocast's 16-bit copies of fp32 weights, kept for backward
};
constexpr int kCategoryCount = 9;

enum class EventKind : std::uint8_t { Alloc, Free };

// One allocation or free. Plain numbers; the words (label, tensor, formula) are Texts in the
// trace's TextStore, rendered only for the events that are shown.
struct Event {
  std::int64_t bytes = 0;   // size of the tensor, bytes (positive for both kinds)
  int tensorId = 0;         // pairs an Alloc with its Free
  int layer = -1;           // layer-list index or transformer block, -1 when not tied to one
  EventKind kind = EventKind::Alloc;
  Category category = Category::Activations;
  Phase phase = Phase::Init;
  std::uint8_t step = 0;    // 0 during init, then 1, 2
  // The CUDA stream an Alloc is made on: 0 the default stream; a side stream of a wrapper's
  // collectives otherwise (parallel_step.cpp; the allocator keeps each stream's blocks apart:
  // device.hpp AllocatorEvent::stream). Sits in the padding before `label`.
  std::uint8_t stream = 0;
  Text label;               // what happens: "layers[0] Linear forward: output"
  Text tensor;              // which tensor: "layers[0].output"
  Text formula;             // its size: "32 × 1024 × 4 B"
};

// The stream byte took the padding of the 48-byte event (the trace is ~10^5 of them).
static_assert(sizeof(Event) == 48, "Event grew: keep new fields in its padding");

// A sum over the leading dimension of a contiguous [rows, outputs] tensor on the GPU (autograd's
// sum_to of a bias or norm weight gradient), as sim/reduction.hpp LeadingSumScratch sizes it.
struct ReductionShape {
  std::int64_t rows = 0, outputs = 0, elementBytes = 0;
  bool operator==(const ReductionShape&) const = default;
};

struct Trace {
  Trace();
  ~Trace();
  Trace(Trace&&) noexcept = default;
  Trace& operator=(Trace&&) noexcept = default;
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  std::vector<Event> events;
  std::vector<std::string> notes;  // assumptions a person should know about
  TextStore text;                  // the words of every event
  // Per tensor id: the index of its Alloc event and of its Free event (kNeverFreed while held
  // to the end), kept by the builder so replay needs no search.
  static constexpr std::uint32_t kNeverFreed = 0xffffffffu;
  std::vector<std::uint32_t> allocAt, freeAt;
  // Activation offloading (sim/savers.hpp ActivationOffload): the most bytes of saved
  // activations held at once in pinned host memory over the simulation (0 without it). Host
  // memory is no event of the GPU trace; the estimate's `host` section reports it.
  std::int64_t offloadedActivationsPeakBytes = 0;
  // CUDA unified memory (cudaMallocManaged) the step makes outside PyTorch's caching allocator:
  // bitsandbytes' paged optimizer states (optim/optimizer.py get_state_buffer → F.get_paged).
  // Not events: torch.cuda.memory_allocated / memory_reserved never see them. Made in step 1's
  // optimizer step and kept; the device stage counts what stays resident on the GPU.
  std::int64_t unifiedBytes = 0;
  // The CUDA sums whose scratch (partial sums and semaphores, sim/reduction.hpp) the step may
  // take: the only tensors whose sizes depend on the GPU (its SM count). Each distinct shape
  // once; two GPUs whose LeadingSumScratch agrees on every one make the same trace (the GPU
  // matrix compares them: solve/views.cpp). The largest scratch one op takes here, each freed
  // before the next op's: on any GPU the trace's live bytes reach at least its peak less this
  // (Estimate::gpuIndependentPeakBytes).
  std::vector<ReductionShape> gpuReductions;
  std::int64_t gpuScratchMaxBytes = 0;
  // torch.cuda.empty_cache() calls, each by the index of the event it comes before (in order;
  // events.size() after the last): not events, since replay's running total never sees them;
  // the device stage hands each to the caching allocator model between the events: DeepSpeed
  // ZeRO's construction (parallel_step.cpp) and the Trainer's training.emptyCacheSteps
  // (step.cpp, which then simulates step 2 rather than repeating step 1's events).
  std::vector<std::size_t> emptyCacheBefore;

  std::string Label(const Event& e) const { return text.Render(e.label); }
  std::string TensorName(const Event& e) const { return text.Render(e.tensor); }
  std::string Formula(const Event& e) const { return text.Render(e.formula); }
};

// Simulates init and two training steps of a validated setup over its inventory.
// Step 2 differs from step 1: optimizer states exist before its forward pass.
// The trace's texts refer to the inventory's names: keep the inventory while reading them.
// With `explain` false, no text is made (every Text is empty).
Trace BuildTrace(const Setup& setup, const Inventory& inventory, bool explain = true);
// BuildTrace's events up to the end of step 1's forward pass (its last forward, after the
// earlier micro-batches' forwards and backwards), without words: the same events as the whole
// trace's up to there, since each event is made once and in order. What the solver's
// forward-end floor reads (Estimate::forwardEnd); a setup with pipeline stages is built whole.
Trace BuildTraceToForwardEnd(const Setup& setup, const Inventory& inventory);

}  // namespace gpumem
