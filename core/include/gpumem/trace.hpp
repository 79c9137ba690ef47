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

namespace gpumem {

enum class Phase { Init, Forward, Backward, OptimizerStep };

enum class Category {
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

enum class EventKind { Alloc, Free };

struct Event {
  EventKind kind = EventKind::Alloc;
  int tensorId = 0;         // pairs an Alloc with its Free
  std::int64_t bytes = 0;   // size of the tensor, bytes (positive for both kinds)
  Category category = Category::Activations;
  Phase phase = Phase::Init;
  int step = 0;             // 0 during init, then 1, 2
  int layer = -1;           // layer-list index or transformer block, -1 when not tied to one
  std::string label;        // what happens: "layers[0] Linear forward: output"
  std::string tensor;       // which tensor: "layers[0].output"
  std::string formula;      // its size: "32 × 1024 × 4 B"
};

struct Trace {
  std::vector<Event> events;
  std::vector<std::string> notes;  // assumptions a person should know about
};

// Simulates init and two training steps of a validated setup over its inventory.
// Step 2 differs from step 1: optimizer states exist before its forward pass.
Trace BuildTrace(const Setup& setup, const Inventory& inventory);

}  // namespace gpumem
