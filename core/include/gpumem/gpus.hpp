// gpumem — GPUs people train on, with their memory, for the page's list and the CLI.
#pragma once

#include <span>
#include <string_view>

namespace gpumem {

struct GpuModel {
  const char* id;      // "nvidia-h100-sxm"
  const char* label;   // "NVIDIA H100 SXM 80 GB"
  double memoryGiB;    // capacity in GiB (2^30 B): CUDA's total for the device, below the size sold
  const char* vendor;  // "NVIDIA", "AMD"
  const char* kind;    // "dataCenter", "workstation", "consumer"
  // Where memoryGiB comes from (CUDA's total_memory, what PyTorch's out-of-memory message calls
  // "total capacity"): a measurement here or PyTorch's printouts in public logs.
  const char* capacitySource = "";
};

std::span<const GpuModel> Gpus();
const GpuModel* FindGpu(std::string_view id);  // nullptr when unknown

}  // namespace gpumem
