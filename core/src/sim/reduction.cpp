// PyTorch's CUDA reduction launch config (aten/src/ATen/native/cuda/Reduce.cuh, 2.x), for the
// one shape autograd's sum_to makes: a contiguous [rows, outputs] tensor summed over rows. The
// reduced dimension is not the fastest-moving one, so this is setReduceConfig's "vectorize along
// output" case (no block_x_reduce). Checked against the H100 snapshots in tests/data/cuda/stacks:
// BERT-base's 768- and 3072-wide bias gradients over 4096 rows allocate 24 MiB + 24 B and
// 96 MiB + 96 B; Llama 3.2 1B's RMSNorm weight over 2048 rows, 32 MiB + 64 B.
#include "sim/reduction.hpp"

#include <algorithm>
#include <limits>

namespace gpumem {
namespace {

constexpr std::int64_t kMaxNumThreads = 512;  // mnt_wrapper<scalar_t>::MAX_NUM_THREADS
constexpr std::int64_t kMinValuesPerThread = 16;
constexpr std::int64_t kMaxValuesPerThread = 256;
constexpr std::int64_t kAccumulatorBytes = 4;  // arg_t: float for fp32, fp16 and bf16 sums

std::int64_t DivUp(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// last_pow2: the largest power of two not above n (at least 1).
std::int64_t LastPow2(std::int64_t n) {
  std::int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

ReductionScratch OneKernel(std::int64_t rows, std::int64_t outputs, const GpuParallelism& gpu) {
  ReductionScratch r;
  // get_output_vec_size: 4, halved until it divides the output width (and the row stride, the
  // same number here; the caching allocator's 512-byte alignment satisfies the address test).
  std::int64_t vec = 4;
  while (outputs % vec != 0) vec /= 2;
  // set_block_dimension(dim0 = outputs / vec, dim1 = rows) with MAX_NUM_THREADS / vec threads.
  const std::int64_t maxThreads = kMaxNumThreads / vec;
  const std::int64_t dim0 = outputs / vec;
  const std::int64_t dim0Pow2 = dim0 < maxThreads ? LastPow2(dim0) : maxThreads;
  const std::int64_t dim1Pow2 = rows < maxThreads ? LastPow2(rows) : maxThreads;
  std::int64_t width = std::min<std::int64_t>(dim0Pow2, gpu.warpSize);
  const std::int64_t height = std::min(dim1Pow2, maxThreads / width);
  width = std::min(dim0Pow2, maxThreads / height);
  const std::int64_t threads = width * height;
  // Lanes split the outputs (split_output(block_width)); warps split the rows when each thread
  // still sums at least 16 values, or 256.
  std::int64_t stepOutput = width;
  std::int64_t stepInput = 1;
  bool warpsSplitRows = false;
  if (rows >= height * 16 || rows >= kMaxValuesPerThread) {
    stepInput = height;
    warpsSplitRows = true;
  } else {
    stepOutput *= height;
  }
  const std::int64_t grid = DivUp(outputs / vec, stepOutput);
  const std::int64_t valuesPerThread = DivUp(rows, stepInput);
  const std::int64_t target = gpu.multiprocessors * (gpu.maxThreadsPerMultiprocessor / threads);
  if (!warpsSplitRows || valuesPerThread < kMaxValuesPerThread || grid > target) return r;
  // Blocks split the rows too: enough blocks to fill the GPU, but at least 16 values each, and
  // no more than 256 values per thread.
  const std::int64_t ctas = std::max(std::min(DivUp(target, grid), DivUp(valuesPerThread, kMinValuesPerThread)),
                                     DivUp(valuesPerThread, kMaxValuesPerThread));
  if (ctas <= 1) return r;
  r.blocksPerOutput = ctas;
  r.outputTiles = grid;
  // global_memory_size: accumulators × outputs × blocks per output × block.x × output_vec_size.
  r.bufferBytes = kAccumulatorBytes * outputs * ctas * width * vec;
  r.semaphoreBytes = 4 * grid;  // semaphore_size: sizeof(int) × grid.x
  return r;
}

}  // namespace

ReductionScratch LeadingSumScratch(std::int64_t rows, std::int64_t outputs, std::int64_t elementBytes,
                                   const GpuParallelism& gpu) {
  if (rows <= 1 || outputs <= 0 || elementBytes <= 0) return {};
  // gpu_reduce_kernel: an input past 32-bit indexing (TensorIterator::can_use_32bit_indexing,
  // byte offsets up to INT32_MAX) is run as sub-iterators, each with half the rows of the one it
  // splits (with_32bit_indexing halves the dimension with the largest byte extent: the rows),
  // one after another, each with its own scratch; the largest is the first.
  constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
  while (rows > 1 && rows * outputs * elementBytes > kInt32Max) rows = DivUp(rows, 2);
  if (outputs * elementBytes > kInt32Max) return {};  // one row past 32 bits: not modelled
  return OneKernel(rows, outputs, gpu);
}

}  // namespace gpumem
