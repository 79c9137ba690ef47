// The scratch a CUDA sum allocates through the caching allocator when it splits its input
// across thread blocks: autograd's sum_to of a broadcast gradient (a linear's bias, RMSNorm's
// weight) over many rows is such a sum, and its buffer can be larger than the tensor it reads.
#pragma once

#include <cstdint>

#include "gpumem/device.hpp"

namespace gpumem {

struct ReductionScratch {
  std::int64_t bufferBytes = 0;     // the blocks' partial results (cta_buf), fp32 accumulators
  std::int64_t semaphoreBytes = 0;  // one int per output tile, counting finished blocks
  // How the sizes came about, for the estimate's labels: blocks per output, the config's tile.
  std::int64_t blocksPerOutput = 1;
  std::int64_t outputTiles = 0;
};

// A sum over the leading dimension of a contiguous [rows, outputs] tensor of `elementBytes`
// elements into [outputs] (accumulated in fp32, 4 B, for fp32 / fp16 / bf16 input), as
// aten/src/ATen/native/cuda/Reduce.cuh sizes it: setReduceConfig, global_memory_size and
// semaphore_size. Zero when the sum needs no global memory.
ReductionScratch LeadingSumScratch(std::int64_t rows, std::int64_t outputs, std::int64_t elementBytes,
                                   const GpuParallelism& gpu);

}  // namespace gpumem
