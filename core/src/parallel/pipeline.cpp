// Pipeline parallelism (issue 12): the schedules as Megatron-LM runs them, the simulated stage's
// model, its micro-batches in flight, and which stage the estimate shows. docs/parallel.md
// "Pipeline" states each rule with its source.
#include "parallel/pipeline.hpp"

#include <algorithm>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "parallel/parallel_step.hpp"

namespace gpumem {

double PipelineBubbleFraction(std::int64_t p, std::int64_t m, std::int64_t v) {
  if (p <= 1 || m < 1 || v < 1) return 0.0;
  const double idle = static_cast<double>(p - 1);
  return idle / (static_cast<double>(m) * static_cast<double>(v) + idle);
}

std::vector<PipelineAction> PipelineScheduleOf(PipelineSchedule schedule, std::int64_t p, std::int64_t r,
                                               std::int64_t m, std::int64_t v) {
  std::vector<PipelineAction> actions;
  if (p < 1 || r < 0 || r >= p || m < 1 || v < 1) return actions;
  if (schedule == PipelineSchedule::GPipe) {
    for (std::int64_t k = 0; k < m; ++k) actions.push_back({false, k, 0});
    for (std::int64_t k = 0; k < m; ++k) actions.push_back({true, k, 0});
    return actions;
  }
  if (schedule == PipelineSchedule::OneFOneB) {
    // forward_backward_pipelining_without_interleaving: num_warmup_microbatches =
    // min(p − r − 1, m); then 1F1B for the remaining; then the cool-down backwards.
    const std::int64_t warmup = std::min(p - r - 1, m), remaining = m - warmup;
    for (std::int64_t k = 0; k < warmup; ++k) actions.push_back({false, k, 0});
    for (std::int64_t k = 0; k < remaining; ++k) {
      actions.push_back({false, warmup + k, 0});
      actions.push_back({true, k, 0});
    }
    for (std::int64_t k = remaining; k < m; ++k) actions.push_back({true, k, 0});
    return actions;
  }
  // forward_backward_pipelining_with_interleaving: m·v chunk-steps; warm-up (p − r − 1)·2 +
  // (v − 1)·N, capped at m·v, with N = microbatch_group_size_per_vp_stage = p by default
  // (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, Megatron-LM
  // d98e8a6; releases before it put every step in the warm-up when m = p, a rule it dropped).
  // get_model_chunk_id: k mod (p·v) / p (backward: v − 1 − that); the micro-batch is the
  // group's (k / (p·v))·p + k mod p (get_schedule_table with N = p).
  const std::int64_t total = m * v, group = p * v;
  const std::int64_t warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  auto at = [&](std::int64_t k, bool backward) {
    const std::int64_t inGroup = k % group;
    const std::int64_t chunk = inGroup / p;
    return PipelineAction{backward, (k / group) * p + inGroup % p, backward ? v - 1 - chunk : chunk};
  };
  for (std::int64_t k = 0; k < warmup; ++k) actions.push_back(at(k, false));
  for (std::int64_t k = 0; k < total - warmup; ++k) {
    actions.push_back(at(warmup + k, false));
    actions.push_back(at(k, true));
  }
  for (std::int64_t k = total - warmup; k < total; ++k) actions.push_back(at(k, true));
  return actions;
}

std::int64_t PipelinePeakInFlight(PipelineSchedule schedule, std::int64_t p, std::int64_t r, std::int64_t m,
                                  std::int64_t v) {
  std::int64_t live = 0, peak = 0;
  for (const PipelineAction& a : PipelineScheduleOf(schedule, p, r, m, v)) {
    live += a.backward ? -1 : 1;
    peak = std::max(peak, live);
  }
  return peak;
}

double MegatronInFlightMicroBatches(std::int64_t p, std::int64_t m, std::int64_t v, bool interleaved) {
  const double pd = static_cast<double>(p);
  if (interleaved) return pd * (1.0 + (pd - 1.0) / (pd * static_cast<double>(v)));
  return pd * std::min(1.0, static_cast<double>(m) / pd);
}

double MegatronTheoreticalActivationBytes(const ArchitectureDef& a, std::int64_t sequenceLength,
                                          std::int64_t microBatch, std::int64_t tensorParallel,
                                          std::int64_t pipelineParallel, std::int64_t virtualStages,
                                          std::int64_t microBatches) {
  const double s = static_cast<double>(sequenceLength), b = static_cast<double>(microBatch);
  const double h = static_cast<double>(a.hiddenSize), p = static_cast<double>(pipelineParallel);
  const double ffn = static_cast<double>(IntermediateSize(a));
  double bytes = s * b * h * (18.0 + 4.0 * ffn / h) * static_cast<double>(a.numLayers);
  bytes += 8.0 * s * b * p;  // input to embedding, p micro-batches in flight
  bytes += s * b * h * p;    // embedding dropout mask
  if (virtualStages > 1) {
    bytes *= 1.0 + (p - 1.0) / (p * static_cast<double>(virtualStages));
  } else if (pipelineParallel > 1) {
    bytes *= std::min(1.0, static_cast<double>(microBatches) / p);
  }
  if (pipelineParallel == 1) {
    // padded_vocab_size: a multiple of 128 × t (tokenizer.py _vocab_size_with_padding).
    const std::int64_t unit = 128 * tensorParallel;
    const double vocab = static_cast<double>((a.vocabSize + unit - 1) / unit * unit);
    bytes += s * b * h * 4.0 * (1.0 + vocab / h);
  }
  return bytes / static_cast<double>(tensorParallel);
}

namespace {
// torchtitan/parallelisms/pipelining_utils.py generate_split_points over n stages (the version of
// its December 2024 benchmarks, used by pipeline_llama.py when no pipeline_parallel_split_points
// are given; n = pp·2 for its multi-stage schedules): base_interval = L // n, extra_layers = L % n;
// the split after stage 0 comes base_interval layers in, after each middle stage base_interval + 1
// while extra_layers last; the last stage holds the rest ("layers." split points).
std::vector<std::int64_t> TorchtitanSplit(std::int64_t L, std::int64_t n) {
  std::vector<std::int64_t> layers;
  std::int64_t extra = L % n, placed = 0;
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    std::int64_t count = L / n;
    if (i > 0 && extra > 0) {
      ++count;
      --extra;
    }
    layers.push_back(count);
    placed += count;
  }
  layers.push_back(L - placed);
  return layers;
}

// Rank r's chunks out of the virtual stages' layer counts: virtual stages r, r + p, ….
std::vector<std::int64_t> RankChunks(const std::vector<std::int64_t>& chunks, std::int64_t p, std::int64_t r) {
  std::vector<std::int64_t> own;
  for (std::size_t s = static_cast<std::size_t>(r); s < chunks.size(); s += static_cast<std::size_t>(p)) own.push_back(chunks[s]);
  return own;
}
}  // namespace

std::vector<std::int64_t> PipelineChunkLayers(const ParallelDef& par, std::int64_t numLayers) {
  const std::int64_t p = par.pipelineParallel, L = numLayers;
  const bool interleaved = par.pipelineSchedule == PipelineSchedule::Interleaved;
  const std::int64_t v = interleaved ? par.virtualStages : 1;
  const std::int64_t first = par.pipelineFirstStageLayers, last = par.pipelineLastStageLayers;
  if (p < 1 || p > 4096 || L < 1 || v < 1 || v > 1024 || first < 0 || last < 0) return {};
  if (first > 0 || last > 0) {
    // megatron/core/transformer/transformer_block.py get_num_layers_to_build: the layers left
    // after the first and the last stage's go evenly to the stages left (it asserts that they
    // divide); the first and last stage take theirs. Not with virtual stages here.
    if (interleaved || p < 2) return {};
    const std::int64_t stagesLeft = p - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
    const std::int64_t rest = L - first - last;
    if (rest < 0 || (stagesLeft == 0 && rest != 0)) return {};
    if (stagesLeft > 0 && (rest % stagesLeft != 0 || rest / stagesLeft == 0)) return {};
    const std::int64_t each = stagesLeft > 0 ? rest / stagesLeft : 0;
    std::vector<std::int64_t> layers(static_cast<std::size_t>(p), each);
    if (first > 0) layers.front() = first;
    if (last > 0) layers.back() = last;
    return layers;
  }
  // Megatron get_num_layers_to_build: num_layers / pipeline_model_parallel_size (and per virtual
  // stage / v); torchtitan's split gives the same when p·v divides L.
  const std::int64_t n = p * v;
  if (L % n == 0) return std::vector<std::int64_t>(static_cast<std::size_t>(n), L / n);
  // torchtitan: "Total stages cannot be greater than the number of layers".
  if (n > L) return {};
  return TorchtitanSplit(L, n);
}

std::vector<std::int64_t> PipelineStageLayers(const ParallelDef& par, std::int64_t numLayers) {
  const std::vector<std::int64_t> chunks = PipelineChunkLayers(par, numLayers);
  if (chunks.empty()) return {};
  // Rank r runs virtual stages r, r + p, …: its layers are theirs together.
  const std::size_t p = static_cast<std::size_t>(par.pipelineParallel);
  std::vector<std::int64_t> stages(p, 0);
  for (std::size_t s = 0; s < chunks.size(); ++s) stages[s % p] += chunks[s];
  return stages;
}

Setup PipelineStageSetup(const Setup& setup) {
  const std::int64_t p = setup.parallel.pipelineParallel;
  if (p <= 1 || setup.model.kind != ModelKind::Transformer) return setup;
  Setup stage = setup;
  // The stage's own layer count (PipelineStageLayers: Megatron get_num_layers_to_build, or
  // torchtitan's split); validation refuses a setup with no split.
  const std::int64_t r = std::max<std::int64_t>(0, setup.parallel.pipelineStage);
  const std::vector<std::int64_t> layers = PipelineStageLayers(setup.parallel, setup.model.architecture.numLayers);
  stage.model.architecture.numLayers =
      r < static_cast<std::int64_t>(layers.size()) ? layers[static_cast<std::size_t>(r)] : setup.model.architecture.numLayers / p;
  stage.parallel.pipelineStage = r;
  // Chunks of unequal layer counts (torchtitan's split over the virtual stages): the stage keeps
  // its own, in chunk order, for PipelineChunkOf.
  stage.parallel.stageChunkLayers.clear();
  if (setup.parallel.pipelineSchedule == PipelineSchedule::Interleaved) {
    std::vector<std::int64_t> own =
        RankChunks(PipelineChunkLayers(setup.parallel, setup.model.architecture.numLayers), p, r);
    bool equal = true;
    for (std::int64_t count : own) equal &= count == own.front();
    if (!equal) stage.parallel.stageChunkLayers = std::move(own);
  }
  return stage;
}

namespace {
bool IsEmbedding(const std::string& name) {
  return name.find("embed_tokens") != std::string::npos || name.find(".wte.") != std::string::npos ||
         name.find(".wpe.") != std::string::npos;
}
bool IsWordEmbedding(const std::string& name) {
  return name.find("embed_tokens") != std::string::npos || name.find(".wte.") != std::string::npos;
}
}  // namespace

Inventory PipelineStageInventory(const Inventory& stageModel, const Setup& stageSetup) {
  const ParallelDef& par = stageSetup.parallel;
  if (par.pipelineParallel <= 1 || stageSetup.model.kind != ModelKind::Transformer) return stageModel;
  const bool first = par.pipelineStage == 0, last = par.pipelineStage == par.pipelineParallel - 1;
  const bool tiedHead = stageModel.IndexOf("lm_head.weight") < 0;
  Inventory stage;
  for (const Tensor& t : stageModel.parameters) {
    bool keep = t.layer >= 0;                          // the stage's blocks
    if (t.layer < 0 && IsEmbedding(t.name)) keep = first || (last && tiedHead && IsWordEmbedding(t.name));
    else if (t.layer < 0) keep = last;                 // final norm, lm_head
    if (keep) stage.parameters.push_back(t);
  }
  return stage;
}

std::vector<std::int64_t> StageChunkLayers(const Setup& stageSetup) {
  const ParallelDef& par = stageSetup.parallel;
  if (!par.stageChunkLayers.empty()) return par.stageChunkLayers;
  const std::int64_t v = par.pipelineSchedule == PipelineSchedule::Interleaved ? par.virtualStages : 1;
  return std::vector<std::int64_t>(static_cast<std::size_t>(v), stageSetup.model.architecture.numLayers / v);
}

PipelineChunk PipelineChunkOf(const Setup& stageSetup, std::int64_t chunk) {
  const ParallelDef& par = stageSetup.parallel;
  const std::vector<std::int64_t> layers = StageChunkLayers(stageSetup);
  const std::int64_t v = static_cast<std::int64_t>(layers.size());
  std::int64_t first = 0;
  for (std::int64_t c = 0; c < chunk && c < v; ++c) first += layers[static_cast<std::size_t>(c)];
  PipelineChunk c;
  c.active = true;
  c.embeddings = par.pipelineStage == 0 && chunk == 0;
  c.head = par.pipelineStage == par.pipelineParallel - 1 && chunk == v - 1;
  c.firstLayer = static_cast<int>(first);
  c.layers = chunk < v ? static_cast<int>(layers[static_cast<std::size_t>(chunk)]) : 0;
  return c;
}

PipelineRun::PipelineRun(const Setup& stageSetup, const Inventory& inventory, const std::vector<Text>& names,
                         const Regime& regime)
    : setup_(stageSetup), inventory_(inventory), names_(names), regime_(regime) {
  const ParallelDef& par = stageSetup.parallel;
  const std::int64_t v = par.pipelineSchedule == PipelineSchedule::Interleaved ? par.virtualStages : 1;
  actions_ = PipelineScheduleOf(par.pipelineSchedule, par.pipelineParallel, par.pipelineStage,
                                par.gradientAccumulationSteps, v);
}

void PipelineRun::Run(TraceBuilder& b, int step, GradientSink& gradients, ParallelStep* parallel) {
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction& a = actions_[i];
    if (!a.backward) {
      // A free pass of this chunk, or a new one: one per chunk-forward in flight.
      auto free = std::find_if(slots_.begin(), slots_.end(),
                               [&](const Slot& s) { return s.microBatch < 0 && s.chunk == a.chunk; });
      if (free == slots_.end()) {
        slots_.push_back({MakeTransformerChunkPass(setup_, inventory_, names_, regime_, PipelineChunkOf(setup_, a.chunk)),
                          a.chunk, -1});
        free = slots_.end() - 1;
      }
      free->microBatch = a.microBatch;
      if (parallel) parallel->SetPipelineChunk(static_cast<int>(a.chunk));
      // FSDP2 per stage: its units are gathered around each chunk-forward and backward as on
      // one pass (ParallelStep::Enter), so every micro-batch's pass reports its blocks.
      if (parallel && parallel->gathers()) free->pass->SetLayerHook(parallel);
      b.SetPhase(Phase::Forward, step);
      free->pass->Forward(b);
      continue;
    }
    auto busy = std::find_if(slots_.begin(), slots_.end(),
                             [&](const Slot& s) { return s.microBatch == a.microBatch && s.chunk == a.chunk; });
    if (busy == slots_.end()) continue;  // a schedule always runs a forward before its backward
    b.SetPhase(Phase::Backward, step);
    if (parallel) parallel->SetPipelineChunk(static_cast<int>(a.chunk));
    if (parallel) parallel->StartBackward(b);
    busy->pass->Backward(b, gradients);
    if (parallel && i + 1 < actions_.size()) parallel->EndBackward(b);
    // The micro-batch's batch, loss and graph go with its backward (Megatron's forward_step
    // locals and the output/input tensor lists' entries, popped by backward_step).
    busy->pass->EndStep(b);
    busy->microBatch = -1;
  }
}

std::optional<EstimateResult> EstimateHigherPipelineStage(const Setup& setup, const EstimateOptions& options) {
  const ParallelDef& par = setup.parallel;
  if (par.pipelineParallel <= 1 || par.pipelineStage >= 0) return std::nullopt;
  Setup first = setup, last = setup;
  first.parallel.pipelineStage = 0;
  last.parallel.pipelineStage = par.pipelineParallel - 1;
  EstimateResult a = EstimateMemory(first, options);
  if (!a.ok()) return a;
  EstimateResult z = EstimateMemory(last, options);
  if (!z.ok()) return z;
  const std::int64_t firstPeak = a.estimate.peak.totalBytes, lastPeak = z.estimate.peak.totalBytes;
  const bool firstWins = firstPeak >= lastPeak;
  // Unequal stages: a middle stage with more layers than the first or the last can peak above
  // both. Of the middle stages with the most layers, the lowest holds the most micro-batches in
  // flight (min(p − r, m) under 1F1B), so it is the one to simulate as well.
  const std::vector<std::int64_t> layers = PipelineStageLayers(par, setup.model.architecture.numLayers);
  std::int64_t middle = -1;
  for (std::int64_t r = 1; r + 1 < static_cast<std::int64_t>(layers.size()); ++r) {
    const std::int64_t n = layers[static_cast<std::size_t>(r)];
    if (n > std::min(layers.front(), layers.back()) && (middle < 0 || n > layers[static_cast<std::size_t>(middle)])) middle = r;
  }
  if (middle > 0) {
    Setup mid = setup;
    mid.parallel.pipelineStage = middle;
    EstimateResult m = EstimateMemory(mid, options);
    if (!m.ok()) return m;
    const std::int64_t midPeak = m.estimate.peak.totalBytes;
    if (midPeak > std::max(firstPeak, lastPeak)) {
      m.estimate.rank.why = "pipeline stage " + std::to_string(middle) + " (a middle stage of " +
                            std::to_string(layers[static_cast<std::size_t>(middle)]) + " layers, against the first's " +
                            std::to_string(layers.front()) + " and the last's " + std::to_string(layers.back()) +
                            "): its peak (" + FormatCount(midPeak) + " B) is above the first stage's (" +
                            FormatCount(firstPeak) + " B) and the last stage's (" + FormatCount(lastPeak) + " B); " +
                            SimulatedRankOf(setup).why;
      return m;
    }
  }
  EstimateResult& chosen = firstWins ? a : z;
  const std::string why =
      firstWins ? "pipeline stage 0 (the first): it holds the embeddings and the most micro-batches in flight, and its "
                  "peak (" + FormatCount(firstPeak) + " B) is at least the last stage's (" + FormatCount(lastPeak) +
                  " B, with the final norm, head, logits and loss)"
                : "pipeline stage " + std::to_string(par.pipelineParallel - 1) +
                      " (the last): its final norm, head, logits and loss peak higher (" + FormatCount(lastPeak) +
                      " B) than the first stage with the embeddings and the most micro-batches in flight (" +
                      FormatCount(firstPeak) + " B)";
  chosen.estimate.rank.why = why + "; " + SimulatedRankOf(setup).why;
  return std::move(chosen);
}

void ValidatePipeline(const Setup& setup, std::vector<FieldError>& errors) {
  const ParallelDef& p = setup.parallel;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, std::string("parallel.") + field, std::move(message)});
  };
  if (p.pipelineStage < -1 || (p.pipelineParallel >= 1 && p.pipelineStage >= p.pipelineParallel)) {
    bad("pipelineStage", "The simulated pipeline stage is −1 (the first or the last, whichever peaks higher) or a "
                         "stage from 0 to pipelineParallel − 1, got " + std::to_string(p.pipelineStage) + ".");
  }
  struct StageField { const char* field; const char* which; std::int64_t value; };
  for (const StageField& f : {StageField{"pipelineFirstStageLayers", "first", p.pipelineFirstStageLayers},
                              StageField{"pipelineLastStageLayers", "last", p.pipelineLastStageLayers}}) {
    const char* field = f.field;
    const std::int64_t value = f.value;
    if (value < 0 || value > 1'000'000) {
      bad(field, std::string("The layers of the ") + f.which +
                     " pipeline stage are 0 (not set) or a whole number of layers, got " + std::to_string(value) + ".");
    } else if (value > 0 && p.pipelineParallel <= 1) {
      bad(field, "A stage's layer count needs pipeline parallelism: set pipeline parallel above 1 or this field to 0.");
    }
  }
  if (p.pipelineParallel <= 1) return;
  if (setup.model.kind != ModelKind::Transformer) {
    bad("pipelineParallel", "Pipeline parallelism splits transformer blocks over stages: quick mode and layer lists "
                            "have no blocks to split. Choose a transformer architecture or pipeline parallel 1.");
    return;
  }
  const ArchitectureDef& a = setup.model.architecture;
  if (a.family == Family::BERT) {
    bad("pipelineParallel", "Pipeline parallelism is simulated for the decoders (GPT-2 and the Llama family) so far.");
  }
  const bool interleaved = p.pipelineSchedule == PipelineSchedule::Interleaved;
  const std::int64_t v = interleaved ? p.virtualStages : 1;
  const std::int64_t first = p.pipelineFirstStageLayers, last = p.pipelineLastStageLayers;
  const bool unequal = first > 0 || last > 0;
  if (v >= 1 && p.pipelineParallel <= 4096 && first >= 0 && last >= 0 && first <= 1'000'000 && last <= 1'000'000 &&
      PipelineStageLayers(p, a.numLayers).empty()) {
    const std::string L = std::to_string(a.numLayers), P = std::to_string(p.pipelineParallel);
    const char* field = first > 0 ? "pipelineFirstStageLayers" : "pipelineLastStageLayers";
    if (unequal && interleaved) {
      bad(field, "Stages of unequal layer counts are simulated with the 1F1B and GPipe schedules: with the interleaved "
                 "schedule set pipelineFirstStageLayers and pipelineLastStageLayers to 0.");
    } else if (unequal) {
      // megatron/core/transformer/transformer_block.py get_num_layers_to_build asserts that the
      // layers left after the first and last stage divide evenly over the other stages.
      const std::int64_t stagesLeft = p.pipelineParallel - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
      bad(field, "Megatron gives the layers left after the first and the last stage (" + L + " − " +
                     std::to_string(first) + " − " + std::to_string(last) + ") evenly to the other " +
                     std::to_string(stagesLeft) + " stage" + (stagesLeft == 1 ? "" : "s") +
                     (stagesLeft == 0 ? ": with both set they must add up to the " + L + " layers."
                                      : ", at least one each: they must divide them."));
    } else if (interleaved) {
      // torchtitan generate_split_points: "Total stages cannot be greater than the number of
      // layers" (p·v virtual stages).
      bad("pipelineParallel", "The interleaved schedule's " + std::to_string(p.pipelineParallel * v) +
                              " virtual stages (pipeline parallel × virtual stages) are more than the " + L +
                              " layers: every virtual stage needs at least one.");
    } else {
      // torchtitan generate_split_points: "Total stages cannot be greater than the number of layers".
      bad("pipelineParallel", "The pipeline parallel size (" + P + ") is larger than the " + L +
                              " layers: every stage needs at least one.");
    }
  }
  if (interleaved && p.gradientAccumulationSteps % p.pipelineParallel != 0) {
    // schedules.py forward_backward_pipelining_with_interleaving: "number of microbatches is not
    // divisible by pipeline-model-parallel-size when using interleaved schedule".
    bad("gradientAccumulationSteps", "The interleaved schedule needs the micro-batches (" +
                                         std::to_string(p.gradientAccumulationSteps) +
                                         ") to be a multiple of the pipeline parallel size (" +
                                         std::to_string(p.pipelineParallel) + ").");
  }
  if (p.zeroStage >= 2) {
    // deepspeed/runtime/pipe/engine.py PipelineEngine.__init__: assert
    // self.zero_optimization_stage() < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline
    // parallelism" (tests/pipeline_fsdp_test.cpp).
    bad("zeroStage", "DeepSpeed refuses ZeRO-2 and ZeRO-3 with pipeline parallelism: use ZeRO-1 (or Megatron's "
                     "distributed optimizer) or pipeline parallel 1.");
  }
  if (p.fsdp != FsdpMode::Off && p.fsdp != FsdpMode::FullyShard) {
    // torch/distributed/pipelining/stage.py backward_maybe_with_nosync defers the gradient sync
    // of a DistributedDataParallel or an FSDPModule (FSDP2 fully_shard) only; an FSDP1
    // FlatParameter module would reduce-scatter at every micro-batch. torchtitan composes
    // pipelines with FSDP2 (parallelize_llama.py apply_fsdp).
    bad("fsdp", "Pipeline parallelism composes with FSDP2 fully_shard (torch.distributed.pipelining, torchtitan); "
                "FSDP1 (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD) per stage is not simulated: choose fully_shard, "
                "DDP or ZeRO-1.");
  }
  if (setup.training.activationOffloading) {
    bad("pipelineParallel", "Activation offloading with pipeline parallelism is not simulated yet.");
  }
}

std::vector<std::string> PipelineNotes(const Setup& setup) {
  const ParallelDef& p = setup.parallel;
  std::vector<std::string> notes;
  if (p.pipelineParallel <= 1) return notes;
  const bool interleaved = p.pipelineSchedule == PipelineSchedule::Interleaved;
  const std::int64_t v = interleaved ? p.virtualStages : 1, stage = std::max<std::int64_t>(0, p.pipelineStage);
  const std::int64_t inFlight = PipelinePeakInFlight(p.pipelineSchedule, p.pipelineParallel, stage,
                                                     p.gradientAccumulationSteps, v);
  const std::vector<std::int64_t> layers = PipelineStageLayers(p, setup.model.architecture.numLayers);
  const std::int64_t stageLayers = stage < static_cast<std::int64_t>(layers.size())
                                       ? layers[static_cast<std::size_t>(stage)]
                                       : setup.model.architecture.numLayers / p.pipelineParallel;
  const std::int64_t tokenShards = p.sequenceParallel ? p.tensorParallel : 1;
  std::string n = "Pipeline: stage " + std::to_string(stage) + " of " + std::to_string(p.pipelineParallel) + " runs " +
                  std::to_string(stageLayers) + " of " +
                  std::to_string(setup.model.architecture.numLayers) + " layers" +
                  (stage == 0 ? " and the embeddings" : "") +
                  (stage == p.pipelineParallel - 1 ? " and the final norm, head and loss" : "") + "; under " +
                  std::string(LabelOf(p.pipelineSchedule)) + " with " + std::to_string(p.gradientAccumulationSteps) +
                  " micro-batches it holds at most " + std::to_string(inFlight) +
                  (interleaved ? " chunk-forwards" : " micro-batches") +
                  "' activations at once; the p2p exchange receives [" +
                  (tokenShards > 1 || p.contextParallel > 1
                       ? "s/" + std::to_string(tokenShards * p.contextParallel) + " (the rank's tokens" +
                             (p.contextParallel > 1 ? ", context parallel" : "") +
                             (tokenShards > 1 ? ", sequence parallel" : "") + ")"
                       : std::string("s")) +
                  ", b, h] tensors in the parameters' dtype (inputs on every stage but the first, output gradients on "
                  "every stage but the last; Megatron get_tensor_shapes). The bubble is " +
                  FormatScientific(PipelineBubbleFraction(p.pipelineParallel, p.gradientAccumulationSteps, v)) +
                  " of the step, (p − 1)/(m·v + p − 1).";
  notes.push_back(std::move(n));
  bool unequal = false;
  for (std::int64_t count : layers) unequal |= count != layers.front();
  const std::vector<std::int64_t> chunks = interleaved ? PipelineChunkLayers(p, setup.model.architecture.numLayers)
                                                       : std::vector<std::int64_t>{};
  bool unequalChunks = false;
  for (std::int64_t count : chunks) unequalChunks |= count != chunks.front();
  if (unequalChunks) {
    std::string split, own;
    for (std::int64_t count : chunks) split += (split.empty() ? "" : ", ") + std::to_string(count);
    for (std::int64_t count : RankChunks(chunks, p.pipelineParallel, stage)) own += (own.empty() ? "" : " and ") + std::to_string(count);
    notes.push_back("Virtual stages of unequal layer counts (" + split + "): p × v (" +
                    std::to_string(p.pipelineParallel * v) + ") does not divide the " +
                    std::to_string(setup.model.architecture.numLayers) +
                    " layers, so they are split as torchtitan's generate_split_points splits its virtual stages (the "
                    "first L div (p·v), the next ones one more while the remainder lasts, the last the rest), and "
                    "rank r runs virtual stages r, r + p, …: stage " + std::to_string(stage) + "'s chunks hold " + own +
                    " layers. Megatron would refuse this size.");
  } else if (unequal) {
    std::string split;
    for (std::int64_t count : layers) split += (split.empty() ? "" : ", ") + std::to_string(count);
    notes.push_back("Pipeline stages of unequal layer counts (" + split + ")" +
                    (p.pipelineFirstStageLayers > 0 || p.pipelineLastStageLayers > 0
                         ? ": Megatron's --decoder-first/last-pipeline-num-layers, the other stages sharing the rest "
                           "evenly (transformer_block.py get_num_layers_to_build)."
                         : ": the pipeline size does not divide the layers, so they are split as torchtitan's "
                           "generate_split_points splits them (the first stage L div p, the middle stages one more "
                           "while the remainder lasts, the last the rest); Megatron would refuse this size unless "
                           "pipelineFirstStageLayers / pipelineLastStageLayers are set."));
  }
  if (p.fsdp == FsdpMode::FullyShard) {
    // torch/distributed/pipelining/stage.py backward_maybe_with_nosync (torch 2.5) /
    // perform_reduce_grad (2.6+); torchtitan parallelize_llama.py apply_fsdp.
    notes.push_back(std::string("Pipeline with FSDP2 (torch.distributed.pipelining, torchtitan): every micro-batch's "
                                "backward runs with set_requires_gradient_sync(False) and "
                                "set_reshard_after_backward(False), so the stage's gathered units stay gathered and "
                                "its unsharded gradients accumulate (") +
                    (p.fsdpReduceInFp32 ? "in fp32, reduce_dtype" : "in the gradients' dtype") +
                    ") until the last backward, after which each unit reshards and reduce-scatters once. " +
                    (p.reshardAfterForward ? "reshard_after_forward=True gathers each unit again in every micro-batch's forward."
                                           : "reshard_after_forward=False (torchtitan's default under PP): each unit is gathered once a step.") +
                    (interleaved ? " Under the interleaved schedule each of the " + std::to_string(v) +
                                       " virtual stages is a fully_shard root of its own: its units reshard and "
                                       "reduce-scatter after its own last backward (pipelining schedules.py: last_backward "
                                       "per stage), so the later chunks, whose backwards finish first, let go of their "
                                       "gathered parameters and unsharded gradients before the earlier ones."
                                 : ""));
  }
  if (setup.model.architecture.tieWordEmbeddings) {
    notes.push_back("Tied embeddings: Megatron keeps a copy of the word embeddings on the last stage for the head and "
                    "all-reduces its gradient with the first stage's; both stages count it.");
  }
  return notes;
}

}  // namespace gpumem
