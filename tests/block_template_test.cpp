// Block templates (sim/tape.cpp Tape::RunCheckpointSpan): the backward spans of checkpointed
// blocks copied from a prediction must give the very trace that simulating every block gives —
// every event's numbers and every rendered word.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"
#include "gpumem/trace.hpp"
#include "sim/tape.hpp"

namespace {

gpumem::Trace Build(const std::string& json, bool templates, bool explain, const gpumem::Inventory& inventory,
                    const gpumem::Setup& setup) {
  gpumem::SetBlockTemplates(templates);
  gpumem::Trace trace = gpumem::BuildTrace(setup, inventory, explain);
  gpumem::SetBlockTemplates(true);
  (void)json;
  return trace;
}

// The first difference between two traces, or "" when they are the same.
std::string FirstDifference(const gpumem::Trace& a, const gpumem::Trace& b) {
  for (std::size_t i = 0; i < std::min(a.events.size(), b.events.size()); ++i) {
    const gpumem::Event& x = a.events[i];
    const gpumem::Event& y = b.events[i];
    const bool same = x.bytes == y.bytes && x.tensorId == y.tensorId && x.layer == y.layer && x.kind == y.kind &&
                      x.category == y.category && x.phase == y.phase && x.step == y.step &&
                      a.Label(x) == b.Label(y) && a.TensorName(x) == b.TensorName(y) && a.Formula(x) == b.Formula(y);
    if (!same) {
      return "event " + std::to_string(i) + ": " + a.Label(x) + " [" + a.TensorName(x) + "] id " +
             std::to_string(x.tensorId) + " layer " + std::to_string(x.layer) + " vs " + b.Label(y) + " [" +
             b.TensorName(y) + "] id " + std::to_string(y.tensorId) + " layer " + std::to_string(y.layer);
    }
  }
  if (a.events.size() != b.events.size()) {
    return "event count " + std::to_string(a.events.size()) + " vs " + std::to_string(b.events.size());
  }
  if (a.allocAt != b.allocAt || a.freeAt != b.freeAt) return "allocAt / freeAt";
  return "";
}

// Builds the setup's trace with templates on and off (words included): `expected` backward
// spans copied (step 2 repeats step 1's events, so one step's copies unless step 2 is
// simulated), every event and word the same, and the offloaded and unified bytes too.
void CheckBackwardCopies(const char* json, std::size_t expected) {
  INFO(json);
  gpumem::Setup setup;
  REQUIRE(gpumem::ParseAndValidate(json, setup).empty());
  const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
  const std::size_t before = gpumem::BackwardSpansCopied();
  const gpumem::Trace copied = Build("", true, true, inventory, setup);
  CHECK(gpumem::BackwardSpansCopied() - before == expected);
  const gpumem::Trace simulated = Build("", false, true, inventory, setup);
  CHECK(FirstDifference(simulated, copied) == "");
  CHECK(copied.offloadedActivationsPeakBytes == simulated.offloadedActivationsPeakBytes);
  CHECK(copied.unifiedBytes == simulated.unifiedBytes);
}

}  // namespace

TEST_CASE("Block templates: copied backward spans equal simulated ones", "[trace][templates]") {
  const std::vector<std::string> setups = {
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":512,"attention":"eager","checkpointing":"everyBlock"}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock","precision":"ampFp16"}})",
      R"({"model":{"preset":"llama-3-8b"},"training":{"batchSize":1,"sequenceLength":1024,"attention":"sdpa","checkpointing":"everyBlock","precision":"ampBf16"}})",
      R"({"model":{"preset":"llama-2-7b"},"training":{"batchSize":1,"sequenceLength":512,"attention":"eager","checkpointing":"everyBlock","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","checkpointing":"everyBlock","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyKthBlock","checkpointInterval":2}})",
      R"({"model":{"preset":"bert-base-uncased"},"training":{"batchSize":2,"sequenceLength":128,"checkpointing":"everyBlock"}})",
      // Autocast's cached cast of the recompute's detached input (BERT's q, k and v read it).
      R"({"model":{"preset":"bert-base-uncased"},"training":{"batchSize":2,"sequenceLength":128,"checkpointing":"everyBlock","precision":"ampBf16"}})",
      // Blocks that differ from the ones a template is made from: frozen first blocks, one
      // block trained alone, LoRA (frozen base, adapters), gradient accumulation.
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock"},"finetune":{"freezeFirstBlocks":6}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock"},"finetune":{"trainOnlyModules":["model.layers.7"]}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"bf16Mixed"},"finetune":{"lora":true}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock"},"parallel":{"gradientAccumulationSteps":3}})",
      // The attention core checkpointed inside recorded blocks (its forward copied, not its
      // block's), eager and SDPA.
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"selective","attention":"eager"}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"selective","attention":"sdpa","precision":"ampBf16"}})",
      // Checkpointed forwards under activation offloading (copied: the pack hooks see only the
      // checkpoint's saved inputs, packed after the span), reentrant and not, and under the
      // solver's QLoRA combination (optimizer in backward, paged AdamW, fused loss).
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","activationOffloading":true}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","activationOffloading":true,"useReentrant":false,"precision":"ampBf16"}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128,"checkpointing":"everyBlock","activationOffloading":true,"precision":"bf16Mixed"}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock","activationOffloading":true,"optimizerInBackward":true,"optimizerImplementation":"fused","lossImplementation":"fusedLinearCrossEntropy","optimizer":"pagedAdamw"},"runtime":{"allocator":{"expandableSegments":true}},"finetune":{"lora":true,"quantization":"nf4","doubleQuant":true,"computeDType":"bf16","targetModules":["all-linear"]}})",
      // Forward templates refused: op-level selective checkpointing;
      // QLoRA (frozen nf4 base, dequantized in every block's forward): copied like any other.
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"selectiveOp","attention":"sdpa","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16"},"finetune":{"lora":true,"quantization":"nf4"}})",
      // Plain (not checkpointed) blocks: their forwards, nodes included, copied (Tape::PlainBlock).
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":256,"attention":"eager","precision":"ampBf16"}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":512,"attention":"eager"}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","precision":"ampFp16"}})",
      R"({"model":{"preset":"llama-2-7b"},"training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"bert-base-uncased"},"training":{"batchSize":2,"sequenceLength":128}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":256},"parallel":{"gradientAccumulationSteps":3}})",
      // Plain blocks that must fall back: frozen first blocks, one block trained alone, LoRA,
      // QLoRA, activation offloading, a sharding engine's layer hook (ZeRO-3, FSDP).
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256},"finetune":{"freezeFirstBlocks":6}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256},"finetune":{"trainOnlyModules":["model.layers.7"]}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"precision":"bf16Mixed"},"finetune":{"lora":true}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"precision":"ampBf16"},"finetune":{"lora":true,"quantization":"nf4"}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"activationOffloading":true}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256},"parallel":{"dataParallel":4,"zeroStage":3}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256},"parallel":{"dataParallel":4,"fsdp":"FULL_SHARD"}})",
      // The same with blocks long enough for their backward to be copied too (Mixtral).
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128},"finetune":{"freezeFirstBlocks":6}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128},"finetune":{"trainOnlyModules":["model.layers.7"]}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128,"precision":"bf16Mixed"},"finetune":{"lora":true}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128,"activationOffloading":true}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128},"parallel":{"dataParallel":4,"zeroStage":3}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128,"checkpointing":"everyKthBlock","checkpointInterval":2}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":2,"sequenceLength":128},"parallel":{"gradientAccumulationSteps":2}})",
      // Blocks of equal parameters that run differently: Gemma 3's full-attention layer after
      // five sliding ones, SmolLM3's layers without RoPE every fourth (Tape::SetLayerKinds;
      // copied from the sliding / RoPE layers before them, these ran as those until 2026-11-29).
      R"({"model":{"preset":"gemma-3-1b"},"training":{"batchSize":1,"sequenceLength":512,"attention":"sdpa","checkpointing":"everyBlock","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"gemma-3-1b"},"training":{"batchSize":1,"sequenceLength":512,"attention":"eager","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"smollm3-3b"},"training":{"batchSize":1,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock"}})",
      R"({"model":{"preset":"smollm3-3b"},"training":{"batchSize":1,"sequenceLength":256,"attention":"eager","precision":"bf16Mixed"}})",
      R"({"model":{"preset":"smollm3-3b"},"training":{"batchSize":1,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock","useReentrant":false}})",
      // Non-reentrant checkpoints (forwards and backward spans copied), with and without early
      // stop, under LoRA and under op-level selective checkpointing.
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","useReentrant":false}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","useReentrant":false},"runtime":{"pytorchVersion":"2.0"}})",
      R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyKthBlock","attention":"eager","useReentrant":false}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"bf16Mixed","useReentrant":false},"finetune":{"lora":true,"targetModules":["all-linear"]}})",
      R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"selectiveOp","attention":"sdpa","precision":"bf16Mixed","useReentrant":false}})",
      R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":128,"checkpointing":"everyBlock","precision":"bf16Mixed","useReentrant":false}})",
  };
  for (const std::string& json : setups) {
    gpumem::Setup setup;
    REQUIRE(gpumem::ParseAndValidate(json, setup).empty());
    const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
    for (const bool explain : {true, false}) {
      INFO(json << (explain ? " (explained)" : " (no words)"));
      const gpumem::Trace simulated = Build(json, false, explain, inventory, setup);
      const gpumem::Trace copied = Build(json, true, explain, inventory, setup);
      CHECK(FirstDifference(simulated, copied) == "");
    }
  }
}

TEST_CASE("Block templates: checkpointed blocks' forwards are copied", "[trace][templates]") {
  gpumem::Setup setup;
  REQUIRE(gpumem::ParseAndValidate(
              R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16"}})",
              setup)
              .empty());
  const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
  const std::size_t before = gpumem::ForwardSpansCopied();
  const gpumem::Trace copied = Build("", true, false, inventory, setup);
  // 16 blocks: blocks 0-3 are simulated (the prediction of block 2 from blocks 0 and 1 fails:
  // block 0's span differs from the others'; block 3's passes), 4-15 copied. Step 2 is step 1
  // repeated (TraceBuilder::Repeat), so it runs no forward.
  CHECK(gpumem::ForwardSpansCopied() - before == 16 - 4);
  const std::size_t simulatedBefore = gpumem::ForwardSpansCopied();
  const gpumem::Trace simulated = Build("", false, false, inventory, setup);
  CHECK(gpumem::ForwardSpansCopied() == simulatedBefore);
  CHECK(FirstDifference(simulated, copied) == "");
}

TEST_CASE("Block templates: checkpointed forwards are copied under activation offloading", "[trace][templates]") {
  // OffloadActivations' pack hook sees the checkpoint's saved inputs, packed by Tape::Checkpoint
  // after the block's forward, not the forward itself (reentrant: nothing recorded; non-reentrant:
  // the checkpoint's own hooks are the innermost and pack every op).
  for (const char* json :
       {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","activationOffloading":true}})",
        R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","activationOffloading":true,"useReentrant":false}})"}) {
    INFO(json);
    gpumem::Setup setup;
    REQUIRE(gpumem::ParseAndValidate(json, setup).empty());
    const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
    const std::size_t before = gpumem::ForwardSpansCopied();
    const gpumem::Trace copied = Build("", true, false, inventory, setup);
    CHECK(gpumem::ForwardSpansCopied() - before == 16 - 4);  // as without offloading
    CHECK(FirstDifference(Build("", false, false, inventory, setup), copied) == "");
  }
}

TEST_CASE("Block templates: checkpointed backward spans are copied when non-reentrant and under activation offloading", "[trace][templates]") {
  // Non-reentrant: the block's own nodes take the incoming gradient, and a residual add passes
  // it on to the block's input, a tensor of the span before. Offloading: each block's backward
  // brings its offloaded input back and frees what the block above brought back; a copy redoes
  // the offloader's part (ActivationOffload::CopiedUnpack). The top blocks differ (the forward
  // stash still holds the last inputs; the first brought-back tensor has no block above it to
  // free it), and so do the bottom ones, whose forwards were laid out differently while the
  // forward stash filled (their texts are not where a copy would put them:
  // CheckpointOutsideTexts); block 0 is always simulated.
  const std::pair<const char*, std::size_t> cases[] = {
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","useReentrant":false}})", 12},
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","activationOffloading":true}})", 10},
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","activationOffloading":true,"useReentrant":false}})", 10},
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"bf16","activationOffloading":true},"finetune":{"lora":true}})", 9}};
  for (const auto& [json, expected] : cases) CheckBackwardCopies(json, expected);
}

TEST_CASE("Block templates: backward spans are copied with the optimizer in backward", "[trace][templates]") {
  // Each parameter's step runs inside its block's backward span (its .grad made, stepped by the
  // hook, freed); a copy's events hold those steps, and the optimizer is told which parameters
  // it stepped (OptimizerPass::AdoptCopiedStep). With torch_empty_cache_steps step 2 is
  // simulated, not repeated: states made by copies in step 1 must not be made again there.
  const std::pair<const char*, std::size_t> cases[] = {
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"bf16","optimizerInBackward":true}})", 11},
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"bf16","optimizerInBackward":true,"emptyCacheSteps":1}})", 22},
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"precision":"bf16","optimizerInBackward":true,"optimizer":"pagedAdamw"}})", 12},
      {R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"bf16","optimizerInBackward":true,"activationOffloading":true,"useReentrant":false}})", 10}};
  for (const auto& [json, expected] : cases) CheckBackwardCopies(json, expected);
}

TEST_CASE("Block templates: non-reentrant checkpoints' forwards are copied, packs counted", "[trace][templates]") {
  // The forward records nodes that Checkpoint drops; a copy makes none and adds the span's count
  // of packing ops, which the recompute's early stop reads (PyTorch >= 2.1 here, by default).
  gpumem::Setup setup;
  REQUIRE(gpumem::ParseAndValidate(
              R"({"model":{"preset":"llama-3.2-1b"},"training":{"batchSize":1,"sequenceLength":256,"checkpointing":"everyBlock","precision":"ampBf16","useReentrant":false}})",
              setup)
              .empty());
  const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
  const std::size_t before = gpumem::ForwardSpansCopied();
  const gpumem::Trace copied = Build("", true, false, inventory, setup);
  CHECK(gpumem::ForwardSpansCopied() - before == 16 - 4);  // as the reentrant forwards above
  CHECK(FirstDifference(Build("", false, false, inventory, setup), copied) == "");
}

TEST_CASE("Block templates: plain blocks' forwards are copied where blocks are long", "[trace][templates]") {
  const auto copies = [](const char* json) {
    gpumem::Setup setup;
    REQUIRE(gpumem::ParseAndValidate(json, setup).empty());
    const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
    const std::size_t before = gpumem::ForwardSpansCopied();
    (void)Build("", true, false, inventory, setup);
    return gpumem::ForwardSpansCopied() - before;
  };
  // Mixtral (126 nodes a block), 32 blocks: 0-3 simulated (as the checkpointed forwards above).
  CHECK(copies(R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":256,"attention":"sdpa","precision":"bf16Mixed"}})") ==
        32 - 4);
  // GPT-2 (36 nodes a block, under Tape::kMinPlainForwardNodes): all simulated.
  CHECK(copies(R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":256}})") == 0);
}

TEST_CASE("Block templates: blocks that repeat every few blocks are copied from blocks of their kind", "[trace][templates]") {
  // Gemma 2 alternates sliding-window and global attention (each kind reads its own mask),
  // SmolLM3 leaves RoPE out of every fourth block: consecutive blocks differ, so a span is
  // predicted from the two of its place in the period before it (Tape::SpanChain). Gemma 2 2B,
  // 26 blocks, period 2, checkpointed: each place's first three forwards are simulated (blocks
  // 0-5), 20 copied; backward from block 25 down, the top block's span differs from the ones
  // below, so its place simulates four (25, 23, 21, 19) and the other three (24, 22, 20), and
  // blocks 0 and 1 are always simulated (each the last to hold its kind's mask): 17 copied.
  // Under activation offloading a copy frees what the block above brought back, a block of the
  // other place: the stash it finds is predicted as the rest (SpanRecord::offloadStashBefore).
  // Gemma 3 1B (26 blocks, five sliding-window to one global) keeps period 1: runs of five
  // equal blocks copy more than places of period 6 would.
  struct Case {
    const char* json;
    std::size_t forwards, backwards;
  };
  const Case cases[] = {
      {R"({"model":{"preset":"gemma-2-2b"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock"}})", 20, 17},
      {R"({"model":{"preset":"gemma-2-2b"},"training":{"batchSize":2,"sequenceLength":256,"attention":"eager"},"finetune":{"lora":true,"targetModules":["all-linear"]}})", 19, 18},
      {R"({"model":{"preset":"gemma-2-2b"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock","useReentrant":false,"precision":"bf16","optimizerInBackward":true}})", 20, 18},
      {R"({"model":{"preset":"gemma-2-2b"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock","activationOffloading":true,"precision":"bf16"}})", 18, 16},
      {R"({"model":{"preset":"smollm3-3b"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock"}})", 23, 19},
      {R"({"model":{"preset":"gemma-3-1b"},"training":{"batchSize":2,"sequenceLength":256,"attention":"sdpa","checkpointing":"everyBlock"}})", 7, 6}};
  for (const Case& c : cases) {
    INFO(c.json);
    gpumem::Setup setup;
    REQUIRE(gpumem::ParseAndValidate(c.json, setup).empty());
    const gpumem::Inventory inventory = gpumem::BuildInventory(setup);
    const std::size_t forwards = gpumem::ForwardSpansCopied(), backwards = gpumem::BackwardSpansCopied();
    const gpumem::Trace copied = Build("", true, true, inventory, setup);
    CHECK(gpumem::ForwardSpansCopied() - forwards == c.forwards);
    CHECK(gpumem::BackwardSpansCopied() - backwards == c.backwards);
    CHECK(FirstDifference(Build("", false, true, inventory, setup), copied) == "");
  }
}
