// CUDA reductions' scratch (sim/reduction.cpp): the sizes PyTorch's Reduce.cuh takes from the
// caching allocator when a sum over rows is split across thread blocks, checked against the
// allocations of the H100 snapshots in tests/data/cuda/stacks, and where the simulation adds it.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <utility>

#include "sim/reduction.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

const GpuParallelism kH100 = GpuParallelismOf("nvidia-h100-sxm");

// Every (buffer, semaphores) pair a snapshot's trace holds: an allocation followed at once by a
// small one of a multiple of 4 bytes that is freed next (gpu_reduce_kernel's buffer, then its
// semaphores, freed when the launch returns).
std::set<std::pair<std::int64_t, std::int64_t>> MeasuredScratch(const std::string& name) {
  const std::vector<StackTraceEntry> entries = ReadStackTrace(name);
  std::set<std::pair<std::int64_t, std::int64_t>> pairs;
  for (std::size_t i = 0; i + 2 < entries.size(); ++i) {
    const StackTraceEntry &a = entries[i], &b = entries[i + 1], &c = entries[i + 2];
    if (a.action == "alloc" && b.action == "alloc" && b.size <= 1024 && b.size % 4 == 0 &&
        c.action == "free_requested" && c.address == b.address) {
      pairs.insert({a.size, b.size});
    }
  }
  return pairs;
}

std::pair<std::int64_t, std::int64_t> Rule(std::int64_t rows, std::int64_t outputs, std::int64_t elementBytes,
                                           const GpuParallelism& gpu = kH100) {
  const ReductionScratch r = LeadingSumScratch(rows, outputs, elementBytes, gpu);
  return {r.bufferBytes, r.semaphoreBytes};
}

}  // namespace

TEST_CASE("a CUDA sum over rows takes the scratch the H100 snapshots show", "[reduction][cuda]") {
  // BERT-base, 2 layers, 8 × 512 tokens under fp16 autocast: the 768-wide biases (q, k, v, attention
  // output, FFN output) and the 3072-wide FFN input bias.
  const auto bert = MeasuredScratch("bert-base-cls-ampfp16-b32-s512-b8.pickle");
  CHECK(Rule(4096, 768, 2) == std::pair<std::int64_t, std::int64_t>{24 << 20, 24});
  CHECK(Rule(4096, 3072, 2) == std::pair<std::int64_t, std::int64_t>{96 << 20, 96});
  CHECK(bert.contains(Rule(4096, 768, 2)));
  CHECK(bert.contains(Rule(4096, 3072, 2)));
  // GPT-2's Conv1D biases (addmm): 2304-wide c_attn, 768, 3072-wide c_fc. At 8 × 1024 tokens the
  // GPU's 2112 resident blocks bound the split (132 SMs × 2048 / 128 threads), not the rows.
  for (const char* name : {"gpt2-amp-eager-b8-b4.pickle", "gpt2-bf16mixed-eager-nocache-b16-b4.pickle"}) {
    const auto gpt2 = MeasuredScratch(name);
    for (std::int64_t width : {2304, 768, 3072}) CHECK(gpt2.contains(Rule(4096, width, 2)));
  }
  CHECK(MeasuredScratch("gpt2-fp32-sdpa-b4-b4.pickle").contains(Rule(4096, 2304, 4)));
  const auto wide = MeasuredScratch("gpt2-amp-sdpa-b8-b8.pickle");
  CHECK(Rule(8192, 2304, 2).first == 4 * 2304 * 118 * 32 * 4);  // ⌈2112 / 18 tiles⌉ = 118 blocks each
  for (std::int64_t width : {2304, 768, 3072}) CHECK(wide.contains(Rule(8192, width, 2)));
  // Llama 3.2 1B's RMSNorm weights (bf16, 2048 wide) over 2048 tokens: 32 MiB + 64 B.
  CHECK(Rule(2048, 2048, 2) == std::pair<std::int64_t, std::int64_t>{32 << 20, 64});
  CHECK(MeasuredScratch("llama3.2-1b-bf16-sdpa-b4-s2048-b1.pickle").contains(Rule(2048, 2048, 2)));
  // Qwen2.5 1.5B: the q bias and RMSNorm weights (1536 wide), the k and v biases (256 wide).
  const auto qwen = MeasuredScratch("qwen2.5-1.5b-amp-sdpa-b2-s2048-b1.pickle");
  CHECK(qwen.contains(Rule(2048, 1536, 2)));
  CHECK(qwen.contains(Rule(2048, 256, 2)));
}

TEST_CASE("the reduction's launch rules, worked by hand", "[reduction]") {
  // Fewer than 256 values per thread once 4 warps share the rows: no split across blocks.
  CHECK(Rule(1020, 768, 2).first == 0);  // ⌈1020 / 4⌉ = 255
  CHECK(Rule(1024, 768, 2).first == 4 * 768 * 16 * 32 * 4);  // 256 per thread: ⌈256 / 16⌉ blocks
  CHECK(Rule(1, 768, 2).first == 0);
  // A width that 4 does not divide loads 2 outputs per thread: 256 threads, 32 × 8.
  // 4096 rows / 8 warps = 512 per thread; ⌈512 / 16⌉ = 32 blocks; 13 tiles of 32 × 2 outputs.
  CHECK(Rule(4096, 770, 2) == std::pair<std::int64_t, std::int64_t>{4 * 770 * 32 * 32 * 2, 4 * 13});
  // A T4 holds 40 SMs × 1024 / 128 = 320 blocks: ⌈320 / 6⌉ = 54 per output tile, not 64.
  const GpuParallelism t4 = GpuParallelismOf("nvidia-t4");
  CHECK(t4.maxThreadsPerMultiprocessor == 1024);
  CHECK(Rule(4096, 768, 2, t4).first == 4 * 768 * 54 * 32 * 4);
  // Past 32-bit indexing the rows are halved until they fit, and each half has its own scratch.
  CHECK(Rule(std::int64_t{1} << 20, 4096, 2) == Rule(std::int64_t{1} << 17, 4096, 2));
  CHECK(Rule(std::int64_t{1} << 17, 4096, 2).first > 0);
  // A custom GPU sizes it as the default H100 SXM does.
  CHECK(GpuParallelismOf("").multiprocessors == 132);
  CHECK(GpuParallelismOf("amd-mi300x").warpSize == 64);
}

TEST_CASE("the simulation takes the scratch where autograd sums a gradient over rows", "[reduction][transformer]") {
  // GPT-2 small at 4 × 1024 tokens, bf16: each block's four Conv1D biases.
  Setup setup = DefaultSetup();
  setup.model.kind = ModelKind::Transformer;
  setup.model.architecture = DefaultArchitecture(Family::GPT2);
  setup.model.architecture.numLayers = 2;
  setup.training.batchSize = 4;
  setup.training.sequenceLength = 1024;
  setup.training.precision = Precision::BF16;
  const Estimate e = MustEstimateLabelled(setup);
  std::int64_t scratch = 0, count = 0;
  for (const TimelinePoint& p : e.timeline) {
    if (p.step == 1 && p.deltaBytes > 0 && p.label.find("sum_to scratch") != std::string::npos) {
      scratch += p.deltaBytes;
      ++count;
    }
  }
  // c_attn, attn c_proj, c_fc, mlp c_proj per block, then the LayerNorms' own kernel (none).
  CHECK(count == 4 * 2);
  CHECK(scratch == 2 * (Rule(4096, 2304, 2).first + 2 * Rule(4096, 768, 2).first + Rule(4096, 3072, 2).first));
  SECTION("a frozen bias is not summed") {
    Setup frozen = setup;
    frozen.finetune.lora = true;
    frozen.finetune.targetModules = {"c_attn"};
    CHECK(StepAllocBytes(MustEstimateLabelled(frozen), "sum_to scratch") == -1);
  }
  SECTION("the GPU sizes it") {
    Setup t4 = setup;
    t4.gpu.id = "nvidia-t4";
    t4.gpu.memoryGiB = 16;
    CHECK(StepAllocBytes(MustEstimateLabelled(t4), "sum_to scratch") < StepAllocBytes(e, "sum_to scratch"));
  }
}
