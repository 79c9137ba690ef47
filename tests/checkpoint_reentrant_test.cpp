// torch.utils.checkpoint(use_reentrant=False) against the reentrant checkpoint (training.useReentrant;
// sim/tape.hpp Checkpoint): what a block's backward holds, where the recompute stops, and LoRA
// without enable_input_require_grads. scripts/validate measures the same runs under torch 1.13
// (the *-nonreentrant cases).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "gpumem/estimate.hpp"
#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"
#include "gpumem/solve.hpp"
#include "gpumem/trace.hpp"
#include "test_support.hpp"

using namespace gpumem;

namespace {

// Llama 3.2 1B's shapes in miniature: hidden 256, 4 layers; every block checkpointed, pure
// bf16, SGD (no states), 2 × 128 tokens.
Setup CheckpointedLlama(bool reentrant, const char* pytorch = "2.5") {
  Setup s = test::SmallLlama(4);
  s.model.architecture.hiddenSize = 256;
  s.model.architecture.numHeads = 8;
  s.model.architecture.numKeyValueHeads = 2;
  s.model.architecture.intermediateSize = 688;
  s.training.batchSize = 2;
  s.training.sequenceLength = 128;
  s.training.precision = Precision::BF16;
  s.training.optimizer = OptimizerKind::SGD;
  s.training.attention = AttentionImplementation::SDPA;
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.training.useReentrant = reentrant;
  s.runtime.pytorchVersion = pytorch;
  return s;
}

// The same with PEFT's default LoRA (q_proj, v_proj).
Setup CheckpointedLlamaLora(bool reentrant) {
  Setup s = CheckpointedLlama(reentrant);
  s.finetune.lora = true;
  return s;
}

// Whether `e` is in step 1's backward of block `layer`.
bool InBackward(const Event& e, int layer) { return e.step == 1 && e.phase == Phase::Backward && e.layer == layer; }

// The most bytes live while step 1's backward is in block `layer`.
std::int64_t BlockBackwardPeak(const Trace& trace, int layer) {
  std::int64_t live = 0, peak = 0;
  for (const Event& e : trace.events) {
    live += e.kind == EventKind::Alloc ? e.bytes : -e.bytes;
    if (InBackward(e, layer)) peak = std::max(peak, live);
  }
  return peak;
}

// Events of `kind` whose label holds `text` and that `where` accepts.
template <typename Where>
int CountEvents(const Trace& trace, EventKind kind, const std::string& text, Where where) {
  int n = 0;
  for (const Event& e : trace.events) {
    n += e.kind == kind && where(e) && trace.Label(e).find(text) != std::string::npos;
  }
  return n;
}

// Allocations in step 1's backward of block `layer` whose label holds `text`.
int BackwardAllocs(const Trace& trace, int layer, const std::string& text) {
  return CountEvents(trace, EventKind::Alloc, text, [layer](const Event& e) { return InBackward(e, layer); });
}

// A trace with the inventory its labels point into.
struct Built {
  Inventory inventory;
  Trace trace;
};

Built TraceOf(const Setup& s) {
  Built b{BuildInventory(s), {}};
  b.trace = BuildTrace(s, b.inventory);
  return b;
}

}  // namespace

TEST_CASE("use_reentrant=False: the block's backward keeps neither the recompute's output nor the incoming gradient",
          "[checkpoint][reentrant]") {
  const Trace& reentrant = TraceOf(CheckpointedLlama(true)).trace;
  const Trace& plain = TraceOf(CheckpointedLlama(false)).trace;
  const std::int64_t hidden = 2 * 128 * 256 * 2;  // one bf16 hidden state, [2, 128, 256]
  // A middle block's backward: reentrant holds the recomputed block output (residual add) for the
  // whole backward, beside everything else the two runs share. Nothing else differs at the peak.
  CHECK(BlockBackwardPeak(reentrant, 2) - BlockBackwardPeak(plain, 2) == hidden);
  // The forward keeps the same: each block's inputs, and no activation inside.
  CHECK(test::SavedAtForwardEnd(CheckpointedLlama(true)) == test::SavedAtForwardEnd(CheckpointedLlama(false)));
  // Model states are the same; so are the gradients every parameter receives.
  const Estimate a = test::MustEstimate(CheckpointedLlama(true));
  const Estimate b = test::MustEstimate(CheckpointedLlama(false));
  CHECK(a.modelStates.gradientsBytes == b.modelStates.gradientsBytes);
  CHECK(a.modelStates.parametersBytes == b.modelStates.parametersBytes);
}

TEST_CASE("use_reentrant=False: from PyTorch 2.1 the recompute stops at the last saved tensor",
          "[checkpoint][reentrant]") {
  // The block's last ops: down_proj (saves its input and weight, packed before it runs) and the
  // residual add (saves nothing). With early stop neither runs in the recompute; before 2.1 the
  // whole block runs again, as the reentrant checkpoint does.
  // (2.4 and 2.0: neither passes enable_gqa to SDPA, so only the early stop differs.)
  const Built e = TraceOf(CheckpointedLlama(false, "2.4"));
  const Built w = TraceOf(CheckpointedLlama(false, "2.0"));
  const Built r = TraceOf(CheckpointedLlama(true, "2.4"));
  const Trace& early = e.trace;
  const Trace& whole = w.trace;
  const Trace& reentrant = r.trace;
  CHECK(BackwardAllocs(early, 2, "mlp: mlp down_proj") == 0);
  CHECK(BackwardAllocs(early, 2, "mlp: residual add") == 0);
  CHECK(BackwardAllocs(whole, 2, "mlp: mlp down_proj") == 1);
  CHECK(BackwardAllocs(whole, 2, "mlp: residual add") == 1);
  CHECK(BackwardAllocs(reentrant, 2, "mlp: residual add") == 1);
  // Earlier ops run the same in all three: gate_proj's output, for one.
  CHECK(BackwardAllocs(early, 2, "mlp: mlp gate_proj") == 1);
  CHECK(BackwardAllocs(whole, 2, "mlp: mlp gate_proj") == 1);
  // Without early stop the recompute's outputs are freed before the block's backward begins,
  // so the block's peak, later in its backward, is early stop's; reentrant's is one hidden state
  // higher.
  CHECK(BlockBackwardPeak(whole, 2) == BlockBackwardPeak(early, 2));
  CHECK(BlockBackwardPeak(reentrant, 2) - BlockBackwardPeak(early, 2) == 2 * 128 * 256 * 2);
}

TEST_CASE("use_reentrant=False with LoRA: no enable_input_require_grads, the adapters still train",
          "[checkpoint][reentrant][finetune]") {
  auto lora = CheckpointedLlamaLora;
  const Estimate a = test::MustEstimate(lora(true));
  const Estimate b = test::MustEstimate(lora(false));
  // The adapters' gradients in both.
  CHECK(a.modelStates.gradientsBytes > 0);
  CHECK(a.modelStates.gradientsBytes == b.modelStates.gradientsBytes);
  // Reentrant: block 0's input (the embeddings' output, made to require grad) gets a gradient
  // from block 0's backward; without the hook nothing below block 0 needs one.
  const Built builtA = TraceOf(lora(true));
  const Built builtB = TraceOf(lora(false));
  const Trace& ra = builtA.trace;
  const Trace& rb = builtB.trace;
  auto gradientsOfBlock0Input = [](const Trace& t) {
    return CountEvents(t, EventKind::Alloc, "input_layernorm", [](const Event& e) {
      return InBackward(e, 0) && e.category == Category::ActivationGradients;
    });
  };
  CHECK(gradientsOfBlock0Input(ra) > 0);
  CHECK(gradientsOfBlock0Input(rb) == 0);
}

TEST_CASE("enable_input_require_grads: the embeddings' leaf and its .grad live until the loss is let go",
          "[checkpoint][reentrant][finetune]") {
  // The hook makes the embeddings' output a leaf; its AccumulateGrad node holds it and the graph
  // holds that node while the loop's `loss` lives, so the leaf's tensor and its .grad (one
  // hidden state each: 2 × 128 × 256 × 2 B in bf16) are freed at the step's end, after the
  // optimizer step, not when backward finishes (CPU torch: validate's llama-lora-bf16-ckpt).
  auto lora = CheckpointedLlamaLora;
  const std::int64_t hidden = 2 * 128 * 256 * 2;
  const Built reentrant = TraceOf(lora(true));
  const Built plain = TraceOf(lora(false));
  auto leafFrees = [&](const Trace& t) {
    std::int64_t bytes = 0;
    for (const Event& e : t.events) {
      if (e.step == 1 && e.kind == EventKind::Free && t.Label(e).find("its graph's AccumulateGrad") != std::string::npos) {
        CHECK(e.phase == Phase::OptimizerStep);
        bytes += e.bytes;
      }
    }
    return bytes;
  };
  CHECK(leafFrees(reentrant.trace) == 2 * hidden);
  CHECK(leafFrees(plain.trace) == 0);
  // Held through the optimizer step: at its start, the reentrant run holds the two more.
  auto heldAtStep = [](const Trace& t) {
    std::int64_t live = 0;
    for (const Event& e : t.events) {
      if (e.step == 1 && e.phase == Phase::OptimizerStep) return live;
      live += e.kind == EventKind::Alloc ? e.bytes : -e.bytes;
    }
    return live;
  };
  CHECK(heldAtStep(reentrant.trace) - heldAtStep(plain.trace) == 2 * hidden);
}

TEST_CASE("enable_input_require_grads hooks the word embedding: what follows it records and saves",
          "[checkpoint][reentrant][finetune]") {
  // GPT-2 with LoRA under reentrant checkpointing: the hook makes wte's output the leaf, so the
  // embedding dropout (after + wpe) runs with grad and saves its mask through the forward; its
  // backward, and the add's, then run before the leaf's .grad. (CPU torch: a GPT-2 LoRA run read
  // -1.0 % when the leaf was block 0's input.)
  auto lora = [](bool reentrant) {
    Setup s = test::TinyTransformer(Family::GPT2, 2, Precision::FP32);
    s.model.architecture.hiddenDropout = 0.1;
    s.training.checkpointing = Checkpointing::EveryBlock;
    s.training.useReentrant = reentrant;
    s.finetune.lora = true;
    return s;
  };
  auto embeddingMasks = [](const Trace& t) {
    return CountEvents(t, EventKind::Alloc, "embedding dropout: mask (saved)",
                       [](const Event& e) { return e.step == 1 && e.phase == Phase::Forward; });
  };
  auto dropoutBackward = [](const Trace& t) {
    return CountEvents(t, EventKind::Alloc, "embedding dropout backward",
                       [](const Event& e) { return e.step == 1 && e.phase == Phase::Backward; });
  };
  const Built reentrant = TraceOf(lora(true));
  const Built plain = TraceOf(lora(false));
  CHECK(embeddingMasks(reentrant.trace) == 1);
  CHECK(dropoutBackward(reentrant.trace) >= 1);
  CHECK(embeddingMasks(plain.trace) == 0);  // use_reentrant=False: no hook, nothing below block 0 trains
  CHECK(dropoutBackward(plain.trace) == 0);
}

TEST_CASE("Autocast caches the cast of a reentrant recompute's detached input", "[checkpoint][reentrant]") {
  // BERT's query, key and value read the block's fp32 input. The checkpointed forward (no grad,
  // the input no leaf) casts it once per linear; the reentrant recompute's input is a detached
  // leaf that requires grad, whose cast autocast caches: one 16-bit copy for the three.
  Setup s = test::TinyTransformer(Family::BERT, 2, Precision::AmpBF16);
  s.training.checkpointing = Checkpointing::EveryBlock;
  const Built built = TraceOf(s);
  auto inputCasts = [&](Phase phase) {
    return CountEvents(built.trace, EventKind::Alloc, "attention: to(bf16)", [phase](const Event& e) {
      return e.step == 1 && e.phase == phase && e.layer == 1;
    });
  };
  // (Each count also holds the eager softmax's fp32 probabilities cast back to bf16.)
  CHECK(inputCasts(Phase::Forward) == 3 + 1);
  CHECK(inputCasts(Phase::Backward) == 1 + 1);
  // use_reentrant=False recomputes on the original (non-leaf) input: one cast per linear.
  s.training.useReentrant = false;
  const Built plain = TraceOf(s);
  CHECK(CountEvents(plain.trace, EventKind::Alloc, "attention: to(bf16)", [](const Event& e) {
          return e.step == 1 && e.phase == Phase::Backward && e.layer == 1;
        }) == 3 + 1);
}

TEST_CASE("training.useReentrant: read, written back, refused when not a boolean", "[checkpoint][reentrant][json]") {
  Setup s;
  REQUIRE(ParseAndValidate(R"({"model":{"preset":"gpt2"},"training":{"checkpointing":"everyBlock","useReentrant":false}})", s)
              .empty());
  CHECK_FALSE(s.training.useReentrant);
  CHECK(SetupToJson(s).find(R"("useReentrant":false)") != std::string::npos);
  const SetupParseResult back = ParseSetupJson(SetupToJson(s));
  REQUIRE(back.ok());
  CHECK_FALSE(back.setup.training.useReentrant);
  CHECK(DefaultSetup().training.useReentrant);
  Setup bad;
  CHECK(test::HasErrorOn(ParseAndValidate(R"({"model":{"preset":"gpt2"},"training":{"useReentrant":"no"}})", bad),
                         "training.useReentrant"));
}

TEST_CASE("use_reentrant=False under torchtitan's op-level policy: an output the early stop leaves is held to the "
          "block's backward end",
          "[checkpoint][reentrant]") {
  // selectiveOp keeps the outputs of every odd-numbered mm: q, v, gate and down_proj in a Llama
  // block. The recompute stops before down_proj runs, so down_proj's kept output is never taken
  // back; it lives in the checkpoint frame's SAC storage until the block's backward is done.
  Setup s = CheckpointedLlama(false);
  s.training.checkpointing = Checkpointing::SelectiveOp;
  s.training.precision = Precision::BF16Mixed;
  const Built built = TraceOf(s);
  const Trace& t = built.trace;
  std::size_t freed = 0, lastOfBlock = 0;
  std::int64_t freedBytes = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (!InBackward(e, 2)) continue;
    if (e.kind == EventKind::Free && t.Label(e).find("selective checkpoint output freed") != std::string::npos) {
      freed = i;
      freedBytes = e.bytes;
    } else {
      lastOfBlock = i;
    }
  }
  REQUIRE(freed > 0);
  CHECK(freedBytes == 2 * 128 * 256 * 2);  // down_proj's bf16 output, [2, 128, 256]
  CHECK(freed > lastOfBlock);               // after every other event of the block's backward
  // Without early stop (before PyTorch 2.1) the whole block is recomputed and every kept output
  // taken back.
  s.runtime.pytorchVersion = "2.0";
  const Built whole = TraceOf(s);
  CHECK(CountEvents(whole.trace, EventKind::Free, "selective checkpoint output freed", [](const Event&) { return true; }) ==
        0);
  // The op-level policy exists only without reentrancy (torch.utils.checkpoint refuses a
  // context_fn with use_reentrant=True): useReentrant changes nothing under it.
  s.runtime.pytorchVersion = "2.5";
  s.training.useReentrant = true;
  const Estimate asked = test::MustEstimate(s);
  s.training.useReentrant = false;
  CHECK(asked.peak.totalBytes == test::MustEstimate(s).peak.totalBytes);
  CHECK(asked.device.peakReservedBytes == test::MustEstimate(s).device.peakReservedBytes);
}

TEST_CASE("Make it fit offers use_reentrant=False where a block's backward decides the verdict",
          "[checkpoint][reentrant][solve]") {
  // Llama 3.2 1B checkpointed, pure bf16, SGD, the fused loss, 8 × 4,096: a block's backward is
  // the peak. 10.5 GiB lies between the non-reentrant device figure and the reentrant one.
  Setup s;
  REQUIRE(ParseAndValidate(R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":8,"sequenceLength":4096,
      "precision":"bf16","optimizer":"sgd","attention":"sdpa","checkpointing":"everyBlock",
      "lossImplementation":"fusedLinearCrossEntropy"},"gpu":{"id":"nvidia-rtx-4090","memoryGiB":10.5}})",
                           s)
              .empty());
  const Estimate reentrant = test::MustEstimate(s);
  Setup plain = s;
  plain.training.useReentrant = false;
  const Estimate nonReentrant = test::MustEstimate(plain);
  REQUIRE_FALSE(reentrant.device.fits);
  REQUIRE(nonReentrant.device.fits);
  const SolveResult solved = Solve(s);
  const FitSuggestion* f = test::Suggestion(solved, "checkpointing-non-reentrant");
  REQUIRE(f != nullptr);
  CHECK(f->cost == FitCost::Free);
  CHECK(f->fits);
  CHECK(f->peakBytes == nonReentrant.device.peakDeviceBytes);
  CHECK(f->savedBytes == reentrant.device.peakDeviceBytes - nonReentrant.device.peakDeviceBytes);
  CHECK_FALSE(f->setup.training.useReentrant);
  // Not offered when already non-reentrant, nor where the peak is not in a backward (AdamW's
  // step is the peak with the same activations).
  CHECK(test::Suggestion(Solve(plain), "checkpointing-non-reentrant") == nullptr);
  Setup adamw = s;
  adamw.training.optimizer = OptimizerKind::AdamW;
  adamw.training.batchSize = 1;
  REQUIRE(test::MustEstimate(adamw).peak.phase != Phase::Backward);
  CHECK(test::Suggestion(Solve(adamw), "checkpointing-non-reentrant") == nullptr);
}
