// Many GPUs: Megatron's tensor (and sequence) parallelism for the GPT-2 and BERT families
// (docs/parallel.md, "Tensor parallelism"). The rank's parameters are pinned tensor by tensor
// against Megatron's layers (megatron/core/tensor_parallel/layers.py: ColumnParallelLinear holds
// 1/t of its weight and bias, RowParallelLinear 1/t of its weight and its whole bias, added after
// the all-reduce; VocabParallelEmbedding 1/t of the padded vocabulary; norms, position and
// token-type embeddings, BERT's pooler and MLM transform replicated), and what a block saves
// against Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
// Models", Table 2.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/parallel.hpp"
#include "gpumem/presets.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

Setup PresetRank(const char* name, std::int64_t t) {
  Setup s = DefaultSetup();
  s.model.kind = ModelKind::Transformer;
  s.model.architecture = FindPreset(name)->architecture;
  s.training.precision = Precision::BF16Mixed;
  s.training.batchSize = 2;
  s.training.sequenceLength = 512;
  s.parallel.tensorParallel = t;
  return s;
}

std::vector<std::int64_t> ShapeOf(const Inventory& inventory, const std::string& name) {
  const std::int64_t i = inventory.IndexOf(name);
  if (i < 0) return {};
  return inventory.parameters[static_cast<std::size_t>(i)].shape;
}

using Dims = std::vector<std::int64_t>;

// Megatron's padded vocabulary per rank: ⌈V / (128·t)⌉ · 128
// (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding, then / t).
constexpr std::int64_t RankVocab(std::int64_t v, std::int64_t t) { return (v + 128 * t - 1) / (128 * t) * 128; }

}  // namespace

TEST_CASE("Tensor parallel GPT-2: the rank's tensors are Megatron's column and row shards", "[parallel][tensor]") {
  const std::int64_t h = 768, f = 3072, positions = 1024;
  for (std::int64_t t : {2, 4}) {
    INFO("t = " << t);
    const Inventory rank = BuildInventory(TensorParallelRankSetup(PresetRank("gpt2", t)));
    const std::int64_t v = RankVocab(50257, t);
    CHECK(v == (t == 2 ? 25216 : 12672));
    CHECK(ShapeOf(rank, "transformer.wte.weight") == Dims{v, h});          // VocabParallelEmbedding
    CHECK(ShapeOf(rank, "transformer.wpe.weight") == Dims{positions, h});  // replicated
    const std::string b = "transformer.h.5.";
    CHECK(ShapeOf(rank, b + "ln_1.weight") == Dims{h});                    // norms replicated
    CHECK(ShapeOf(rank, b + "ln_1.bias") == Dims{h});
    CHECK(ShapeOf(rank, b + "attn.c_attn.weight") == Dims{h, 3 * h / t});  // column: Conv1D [in, out/t]
    CHECK(ShapeOf(rank, b + "attn.c_attn.bias") == Dims{3 * h / t});       // column: bias split
    CHECK(ShapeOf(rank, b + "attn.c_proj.weight") == Dims{h / t, h});      // row: [in/t, out]
    CHECK(ShapeOf(rank, b + "attn.c_proj.bias") == Dims{h});               // row: bias whole
    CHECK(ShapeOf(rank, b + "mlp.c_fc.weight") == Dims{h, f / t});
    CHECK(ShapeOf(rank, b + "mlp.c_fc.bias") == Dims{f / t});
    CHECK(ShapeOf(rank, b + "mlp.c_proj.weight") == Dims{f / t, h});
    CHECK(ShapeOf(rank, b + "mlp.c_proj.bias") == Dims{h});
    CHECK(ShapeOf(rank, "transformer.ln_f.weight") == Dims{h});
    CHECK(ShapeOf(rank, "lm_head.weight").empty());  // tied to wte
    // By hand, per block: ln_1 and ln_2 (2·2h), c_attn (h·3h/t + 3h/t), attn.c_proj (h/t·h + h),
    // c_fc (h·f/t + f/t), mlp.c_proj (f/t·h + h); then wte, wpe and ln_f.
    const std::int64_t block = 4 * h + (h * 3 * h / t + 3 * h / t) + (h / t * h + h) + (h * f / t + f / t) + (f / t * h + h);
    const std::int64_t total = v * h + positions * h + 12 * block + 2 * h;
    CHECK(rank.ParameterCount() == total);
    CHECK(total == (t == 2 ? 62'708'736 : 31'825'152));
    // The estimate reports the rank's parameters.
    CHECK(MustEstimate(PresetRank("gpt2", t)).modelStates.parameterCount == total);
  }
  // One GPU is untouched: GPT-2 (124M) as Hugging Face counts it.
  CHECK(MustEstimate(PresetRank("gpt2", 1)).modelStates.parameterCount == 124'439'808);
}

TEST_CASE("Tensor parallel BERT-base: replicated embeddings, pooler and head; split layers", "[parallel][tensor]") {
  const std::int64_t h = 768, f = 3072, t = 2, labels = 2;
  const Setup setup = PresetRank("bert-base-uncased", t);
  REQUIRE(setup.model.architecture.numLabels == labels);
  const Inventory rank = BuildInventory(TensorParallelRankSetup(setup));
  const std::int64_t v = RankVocab(30522, t);
  CHECK(v == 15360);
  CHECK(ShapeOf(rank, "bert.embeddings.word_embeddings.weight") == Dims{v, h});
  CHECK(ShapeOf(rank, "bert.embeddings.position_embeddings.weight") == Dims{512, h});
  CHECK(ShapeOf(rank, "bert.embeddings.token_type_embeddings.weight") == Dims{2, h});
  const std::string b = "bert.encoder.layer.3.";
  for (const char* m : {"query", "key", "value"}) {
    CHECK(ShapeOf(rank, b + "attention.self." + m + ".weight") == Dims{h / t, h});
    CHECK(ShapeOf(rank, b + "attention.self." + m + ".bias") == Dims{h / t});
  }
  CHECK(ShapeOf(rank, b + "attention.output.dense.weight") == Dims{h, h / t});
  CHECK(ShapeOf(rank, b + "attention.output.dense.bias") == Dims{h});
  CHECK(ShapeOf(rank, b + "attention.output.LayerNorm.weight") == Dims{h});
  CHECK(ShapeOf(rank, b + "intermediate.dense.weight") == Dims{f / t, h});
  CHECK(ShapeOf(rank, b + "intermediate.dense.bias") == Dims{f / t});
  CHECK(ShapeOf(rank, b + "output.dense.weight") == Dims{h, f / t});
  CHECK(ShapeOf(rank, b + "output.dense.bias") == Dims{h});
  CHECK(ShapeOf(rank, "bert.pooler.dense.weight") == Dims{h, h});  // Megatron's Pooler: get_linear_layer
  CHECK(ShapeOf(rank, "classifier.weight") == Dims{labels, h});
  // By hand: embeddings (words V/t·h, positions 512·h, token types 2·h, LayerNorm 2h); per layer
  // q/k/v (3·(h/t·h + h/t)), attention output (h·h/t + h), two LayerNorms (2·2h), intermediate
  // (f/t·h + f/t), output (h·f/t + h); pooler (h·h + h) and classifier (labels·h + labels).
  const std::int64_t layer = 3 * (h / t * h + h / t) + (h * h / t + h) + 4 * h + (f / t * h + f / t) + (h * f / t + h);
  const std::int64_t total = v * h + 512 * h + 2 * h + 2 * h + 12 * layer + (h * h + h) + (labels * h + labels);
  CHECK(rank.ParameterCount() == total);
  CHECK(total == 55'339'778);
  CHECK(MustEstimate(setup).modelStates.parameterCount == total);

  // The MLM head: the transform (dense and LayerNorm) is replicated, the decoder's bias is the
  // rank's V/t (megatron/legacy/model/bert_model.py BertLMHead: bias of mpu_vocab_size).
  Setup mlm = setup;
  mlm.model.architecture.encoderHead = EncoderHead::MaskedLM;
  const Inventory mlmRank = BuildInventory(TensorParallelRankSetup(mlm));
  CHECK(ShapeOf(mlmRank, "cls.predictions.transform.dense.weight") == Dims{h, h});
  CHECK(ShapeOf(mlmRank, "cls.predictions.transform.LayerNorm.weight") == Dims{h});
  CHECK(ShapeOf(mlmRank, "cls.predictions.bias") == Dims{v});
}

namespace {

// One block of a family at b × s, eager attention (the paper's 5as/h term is the eager scores).
Setup Blocks(const char* preset, std::int64_t layers, std::int64_t t, bool sequenceParallel) {
  Setup s = PresetRank(preset, t);
  s.model.architecture.numLayers = layers;
  s.training.attention = AttentionImplementation::Eager;
  s.training.batchSize = 1;
  s.training.sequenceLength = 512;
  s.parallel.sequenceParallel = sequenceParallel;
  // GPT-2 as Megatron's GPT at every t, t = 1 included: Megatron's loss (what a block saves is
  // the difference of two depths, so the loss cancels) keeps its fp32 eager softmax, where
  // Hugging Face's GPT-2 runs softmax in the scores' 16-bit dtype (sim/blocks/attention.cpp).
  if (s.model.architecture.family == Family::GPT2) s.training.lossImplementation = LossImplementation::MegatronVocabParallel;
  return s;
}


// What one block saves for backward: the forward-end activations of two blocks less one's.
std::int64_t SavedPerBlock(const char* preset, std::int64_t t, bool sequenceParallel) {
  return SavedAtForwardEnd(Blocks(preset, 2, t, sequenceParallel)) - SavedAtForwardEnd(Blocks(preset, 1, t, sequenceParallel));
}

}  // namespace

TEST_CASE("Tensor parallel GPT-2 and BERT: what a block saves follows Korthikanti et al. Table 2", "[parallel][tensor][sequence]") {
  // Bytes per layer, 16-bit activations and 1-byte dropout masks, eager attention, 1 × 512.
  const std::int64_t b = 1, s = 512, h = 768, a = 12;
  const std::int64_t sbh = s * b * h, as2b = a * s * s * b, sb = s * b;
  // Korthikanti et al. 2022, Table 2: sbh(10 + 24/t + 5as/(ht)) with tensor parallelism alone,
  // sbh/t · (34 + 5as/h) with sequence parallelism. The 10·sbh tensor parallelism leaves whole:
  // the two LayerNorms' inputs (4·sbh), their outputs that the column-parallel linears save
  // (4·sbh) and the two dropout masks after the row-parallel linears (2·sbh).
  const std::int64_t paperKept = 10 * sbh, paperSplit = 24 * sbh + 5 * as2b;
  // What the simulation keeps whole adds the LayerNorms' fp32 mean and rstd rows (2 × 2 × 4·sb)
  // that the paper leaves out.
  const std::int64_t kept = paperKept + 16 * sb;
  struct Family { const char* preset; std::int64_t split; };
  // What the simulation splits over t differs from the paper's 24·sbh + 5·as²b in two places:
  // - the eager scores: the shared attention core keeps softmax's output in fp32 (4·as²b where
  //   the paper counts 2·as²b) besides the 1-byte dropout mask and the 16-bit dropped
  //   probabilities that probs·v saves: 7·as²b;
  // - GPT-2's gelu_new is written as Python ops (NewGELUActivation), which keep 0.5·x, x, tanh,
  //   1 + tanh and the output, 5 × 8·sbh where the paper's fused GeLU keeps input and output
  //   (2 × 8·sbh): +24·sbh. BERT's exact GELU saves only its input, as the paper counts.
  const Family families[] = {{"gpt2", paperSplit + 2 * as2b + 24 * sbh}, {"bert-base-uncased", paperSplit + 2 * as2b}};
  for (const Family& f : families) {
    INFO(f.preset);
    const std::int64_t whole = SavedPerBlock(f.preset, 1, false);
    CHECK(whole == kept + f.split);  // GPT-2: 58·sbh + 7·as²b + 16·sb; BERT: 34·sbh + 7·as²b + 16·sb
    for (std::int64_t t : {2, 4}) {
      INFO("t = " << t);
      const std::int64_t tensorOnly = SavedPerBlock(f.preset, t, false);
      const std::int64_t sequence = SavedPerBlock(f.preset, t, true);
      // Tensor parallelism alone: the kept part whole, the rest 1/t (the paper's
      // sbh(10 + 24/t + 5as/(ht)) with the differences above).
      CHECK(tensorOnly * t == kept * t + f.split);
      // Sequence parallelism: the whole block 1/t (the paper's sbh/t · (34 + 5as/h)), including
      // the column-parallel linears' saved inputs, which stay sharded (the gathered copy is the
      // persistent all-gather buffer).
      CHECK(sequence * t == kept + f.split);
      // Against the paper's two formulas, the same differences.
      CHECK((tensorOnly - (paperKept + paperSplit / t)) * t == 16 * sb * t + (f.split - paperSplit));
      CHECK((sequence - (paperKept + paperSplit) / t) * t == 16 * sb + (f.split - paperSplit));
    }
  }
}

TEST_CASE("Tensor parallel GPT-2 and BERT: sequence parallelism's buffers and heads", "[parallel][tensor][sequence]") {
  const std::int64_t b = 2, s = 512, h = 768;
  for (const char* preset : {"gpt2", "bert-base-uncased"}) {
    INFO(preset);
    Setup sp = PresetRank(preset, 4);
    sp.parallel.sequenceParallel = true;
    EstimateOptions o;
    o.timeline = EstimateOptions::Timeline::Labelled;
    const EstimateResult r = EstimateMemory(sp, o);
    REQUIRE(r.ok());
    std::int64_t buffer = -1, scatters = 0, gatheredGrads = 0;
    for (const TimelinePoint& p : r.estimate.timeline) {
      if (p.step > 1 || p.deltaBytes <= 0) continue;  // init (step 0) and the first step
      // The buffer is made by the first gather, in step 1's forward (GlobalMemoryBuffer.get_tensor).
      if (p.phase == Phase::Forward && p.label.find("all-gather buffer") != std::string::npos) buffer = p.deltaBytes;
      // Each row-parallel output and the embeddings' scatter: a new [b, s/t, h] in bf16.
      if (p.phase == Phase::Forward && p.label.find("(s/t)") != std::string::npos) {
        CHECK(p.deltaBytes == b * s / 4 * h * 2);
        ++scatters;
      }
      if (p.phase == Phase::Backward && p.label.find("before reduce-scatter") != std::string::npos) {
        CHECK(p.deltaBytes == b * s * h * 2);
        ++gatheredGrads;
      }
    }
    CHECK(buffer == b * s * h * 2);  // Megatron's GlobalMemoryBuffer "mpu": b·s·h in bf16
    CHECK(scatters == 1 + 2 * 12);   // the embeddings, then attention and MLP outputs per block
    CHECK(gatheredGrads > 0);
    // Model states do not change with sequence parallelism; the peak drops.
    Setup tp = sp;
    tp.parallel.sequenceParallel = false;
    const Estimate plain = MustEstimate(tp);
    CHECK(r.estimate.modelStates.parametersBytes == plain.modelStates.parametersBytes);
    CHECK(r.estimate.peak.totalBytes < plain.peak.totalBytes);
  }
  // BERT's MLM head under sequence parallelism: the replicated transform on s/t tokens, the
  // decoder's all-gathering product over the rank's V/t.
  Setup mlm = PresetRank("bert-base-uncased", 2);
  mlm.model.architecture.encoderHead = EncoderHead::MaskedLM;
  mlm.parallel.sequenceParallel = true;
  EstimateOptions o;
  o.timeline = EstimateOptions::Timeline::Labelled;
  const EstimateResult r = EstimateMemory(mlm, o);
  REQUIRE(r.ok());
  std::int64_t transform = -1, logits = -1;
  for (const TimelinePoint& p : r.estimate.timeline) {
    if (p.step != 1 || p.phase != Phase::Forward || p.deltaBytes <= 0) continue;
    if (p.label.find("transform dense") != std::string::npos && transform < 0) transform = p.deltaBytes;
    if (p.label.find("logits (all-gathered input)") != std::string::npos) logits = p.deltaBytes;
  }
  CHECK(transform == b * s / 2 * h * 2);
  CHECK(logits == b * s * RankVocab(30522, 2) * 2);
}

TEST_CASE("Tensor parallel GPT-2 and BERT: with data parallelism, pipelines and layouts", "[parallel][tensor]") {
  // Tensor parallel with each data-parallel engine, as for Llama: the sharded states are those of
  // the rank's slimmer inventory.
  const std::int64_t rankParameters = 62'708'736;  // GPT-2 at t = 2 (above)
  for (int engine = 0; engine < 4; ++engine) {
    INFO("engine " << engine);
    Setup s = PresetRank("gpt2", 2);
    s.parallel.dataParallel = 4;
    if (engine == 1) s.parallel.zeroStage = 1;
    if (engine == 2) s.parallel.zeroStage = 3;
    if (engine == 3) s.parallel.fsdp = FsdpMode::FullShard;
    REQUIRE(Validate(s).empty());
    const Estimate e = MustEstimate(s);
    CHECK(e.modelStates.parameterCount == rankParameters);
    // AdamW's fp32 m and v: 8 bytes per parameter, all on the rank under DDP and a quarter
    // (padded) under ZeRO-1 / ZeRO-3 / FSDP.
    if (engine == 0) CHECK(e.modelStates.optimizerStatesBytes == 8 * rankParameters);
    // (each engine pads its partition by at most one element per tensor: 200 tensors here).
    else {
      CHECK(e.modelStates.optimizerStatesBytes >= 8 * (rankParameters / 4));
      CHECK(e.modelStates.optimizerStatesBytes <= 8 * (rankParameters / 4 + 200));
    }
  }
  Setup bert = PresetRank("bert-base-uncased", 2);
  bert.parallel.dataParallel = 2;
  bert.parallel.zeroStage = 2;
  bert.parallel.sequenceParallel = true;
  CHECK(Validate(bert).empty());
  // A GPT-2 pipeline with tensor parallelism: the first stage holds wte's V/t rows.
  Setup pipe = PresetRank("gpt2", 2);
  pipe.parallel.pipelineParallel = 2;
  pipe.parallel.gradientAccumulationSteps = 4;
  REQUIRE(Validate(pipe).empty());
  CHECK(MustEstimate(pipe).modelStates.parameterCount < rankParameters);
  // Refused where the heads or widths do not split: 12 heads over 5; GPT-2 XL's 25 heads over 2.
  CHECK(HasErrorOn(Validate(PresetRank("gpt2", 5)), "parallel.tensorParallel"));
  CHECK(HasErrorOn(Validate(PresetRank("gpt2-xl", 2)), "parallel.tensorParallel"));
  CHECK(HasErrorOn(Validate(PresetRank("bert-base-uncased", 8)), "parallel.tensorParallel"));
  CHECK(Validate(PresetRank("bert-base-uncased", 4)).empty());
  // Layouts on 4 GPUs now offer tensor parallel rows for GPT-2 and BERT, each the estimate of
  // its rank.
  for (const char* preset : {"gpt2", "bert-base-uncased"}) {
    INFO(preset);
    Setup small = PresetRank(preset, 1);
    small.training.sequenceLength = 256;
    const LayoutsResult layouts = LayoutsForCluster(small, 4);
    REQUIRE(layouts.ok());
    int tensorRows = 0;
    for (const LayoutRow& row : layouts.layouts) {
      if (row.tensorParallel == 1) continue;
      ++tensorRows;
      CHECK(MustEstimate(row.setup).device.peakDeviceBytes == row.peakDeviceBytes);
    }
    CHECK(tensorRows >= 2);  // at least tp 4 alone and tp 2 × dp 2
  }
}
