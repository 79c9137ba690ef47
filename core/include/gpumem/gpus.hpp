// gpumem — GPUs people train on, with their memory, for the page's list and the CLI.
#pragma once

#include <span>
#include <string_view>

namespace gpumem {

struct GpuModel {
  const char* id;      // "nvidia-h100-sxm"
  const char* label;   // "NVIDIA H100 SXM 80 GB"
  double memoryGiB;    // nominal capacity as sold, in GiB (2^30 B); the driver keeps a little back
  const char* vendor;  // "NVIDIA", "AMD"
  const char* kind;    // "dataCenter", "workstation", "consumer"
};

std::span<const GpuModel> Gpus();
const GpuModel* FindGpu(std::string_view id);  // nullptr when unknown

}  // namespace gpumem
