// Pipeline parallelism inside the simulation: which part of the model one chunk-forward of the
// simulated stage runs, the schedule's forwards and backwards with a pass per micro-batch in
// flight, the choice between the first and the last stage, and validation (docs/parallel.md
// "Pipeline"). The public rules (schedules, bubble, the stage's model) are in gpumem/parallel.hpp.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "gpumem/estimate.hpp"
#include "gpumem/parallel.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

class ParallelStep;

// What one chunk-forward of the simulated stage runs (Megatron: one model chunk of
// get_model(); pre_process on the first chunk of the first stage, post_process on the last chunk
// of the last stage, megatron/training/training.py get_model).
struct PipelineChunk {
  bool active = false;      // false: the whole model, no pipeline
  bool embeddings = false;  // the first stage's first chunk: input_ids → embeddings
  bool head = false;        // the last stage's last chunk: final norm, head, loss
  int firstLayer = 0;       // the stage's own block indices [firstLayer, firstLayer + layers)
  int layers = 0;
};
// The layers of each chunk of the stage PipelineStageSetup made, in chunk order: its own
// stageChunkLayers when they differ, else its numLayers split evenly over its v chunks.
std::vector<std::int64_t> StageChunkLayers(const Setup& stageSetup);
// Chunk `chunk` of the stage PipelineStageSetup made.
PipelineChunk PipelineChunkOf(const Setup& stageSetup, std::int64_t chunk);

// The transformer pass of one chunk (core/src/sim/families/transformer.cpp).
std::unique_ptr<ModelPass> MakeTransformerChunkPass(const Setup& setup, const Inventory& inventory,
                                                    const std::vector<Text>& names, const Regime& regime,
                                                    const PipelineChunk& chunk);

// The stage's micro-batches in schedule order, each with its own pass (its own tape, batch and
// saved activations) from its forward to its backward, so what is in flight comes out of the
// trace. Passes are reused once their micro-batch's backward has run.
class PipelineRun {
 public:
  PipelineRun(const Setup& stageSetup, const Inventory& inventory, const std::vector<Text>& names,
              const Regime& regime);
  // Every action of one step; the sharding engine's backward hooks run around each backward,
  // except the last backward's EndBackward, which the step calls after it (as without pipeline).
  void Run(TraceBuilder& b, int step, GradientSink& gradients, ParallelStep* parallel);

 private:
  struct Slot {
    std::unique_ptr<ModelPass> pass;
    std::int64_t chunk = 0;
    std::int64_t microBatch = -1;  // -1: free
  };
  const Setup& setup_;
  const Inventory& inventory_;
  const std::vector<Text>& names_;
  Regime regime_;
  std::vector<PipelineAction> actions_;
  std::vector<Slot> slots_;
};

// pipelineStage = −1: simulates the first and the last stage and returns the estimate with the
// higher peak, saying why in estimate.rank.why; nullopt when the setup names a stage or has no
// pipeline. Called by EstimateMemory after validation.
std::optional<EstimateResult> EstimateHigherPipelineStage(const Setup& setup, const EstimateOptions& options);

// Refusals and checks of the pipeline fields (called by ValidateParallel).
void ValidatePipeline(const Setup& setup, std::vector<FieldError>& errors);

// What a person should know about a pipeline estimate (added to ParallelNotes).
std::vector<std::string> PipelineNotes(const Setup& setup);

}  // namespace gpumem
