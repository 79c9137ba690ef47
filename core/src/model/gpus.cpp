// The GPU list. Capacities are the nominal memory of each product (its data sheet's figure,
// read as GiB as nvidia-smi and rocm-smi report it); a few hundred MiB of it is not usable.
// Where a GPU was measured, its capacity is what CUDA reports (torch.cuda.get_device_properties
// total_memory = cudaMemGetInfo's total, the "total capacity" of PyTorch's out-of-memory
// message): the line the caching allocator really runs into.
#include "gpumem/gpus.hpp"

namespace gpumem {
namespace {

constexpr GpuModel kGpus[] = {
    {"nvidia-b200", "NVIDIA B200 192 GB", 192, "NVIDIA", "dataCenter"},
    {"nvidia-h200", "NVIDIA H200 141 GB", 141, "NVIDIA", "dataCenter"},
    {"nvidia-h100-nvl", "NVIDIA H100 NVL 94 GB", 94, "NVIDIA", "dataCenter"},
    // Measured (tests/data/cuda): total_memory 85,017,493,504 B = 79.18 GiB ("H100 80GB HBM3",
    // driver 580.159.04; NVML's total 85,520,809,984 B).
    {"nvidia-h100-sxm", "NVIDIA H100 SXM 80 GB", 85017493504.0 / 1073741824.0, "NVIDIA", "dataCenter",
     "CUDA's total memory measured on an H100 80GB HBM3 (driver 580, PyTorch 2.11): 85,017,493,504 B"},
    {"nvidia-h100-pcie", "NVIDIA H100 PCIe 80 GB", 80, "NVIDIA", "dataCenter"},
    {"nvidia-a100-80", "NVIDIA A100 80 GB", 80, "NVIDIA", "dataCenter"},
    {"nvidia-a100-40", "NVIDIA A100 40 GB", 40, "NVIDIA", "dataCenter"},
    {"nvidia-l40s", "NVIDIA L40S 48 GB", 48, "NVIDIA", "dataCenter"},
    {"nvidia-a10g", "NVIDIA A10G 24 GB", 24, "NVIDIA", "dataCenter"},
    {"nvidia-l4", "NVIDIA L4 24 GB", 24, "NVIDIA", "dataCenter"},
    {"nvidia-v100-32", "NVIDIA V100 32 GB", 32, "NVIDIA", "dataCenter"},
    {"nvidia-v100-16", "NVIDIA V100 16 GB", 16, "NVIDIA", "dataCenter"},
    {"nvidia-t4", "NVIDIA T4 16 GB", 16, "NVIDIA", "dataCenter"},
    {"amd-mi300x", "AMD Instinct MI300X 192 GB", 192, "AMD", "dataCenter"},
    {"amd-mi250x", "AMD Instinct MI250X 128 GB", 128, "AMD", "dataCenter"},
    {"nvidia-rtx-6000-ada", "NVIDIA RTX 6000 Ada 48 GB", 48, "NVIDIA", "workstation"},
    {"nvidia-rtx-a6000", "NVIDIA RTX A6000 48 GB", 48, "NVIDIA", "workstation"},
    {"nvidia-rtx-5090", "NVIDIA GeForce RTX 5090 32 GB", 32, "NVIDIA", "consumer"},
    {"nvidia-rtx-4090", "NVIDIA GeForce RTX 4090 24 GB", 24, "NVIDIA", "consumer"},
    {"nvidia-rtx-3090", "NVIDIA GeForce RTX 3090 24 GB", 24, "NVIDIA", "consumer"},
    {"nvidia-rtx-4080", "NVIDIA GeForce RTX 4080 16 GB", 16, "NVIDIA", "consumer"},
    {"nvidia-rtx-4060-ti-16", "NVIDIA GeForce RTX 4060 Ti 16 GB", 16, "NVIDIA", "consumer"},
    {"nvidia-rtx-3060", "NVIDIA GeForce RTX 3060 12 GB", 12, "NVIDIA", "consumer"},
    {"nvidia-rtx-3080", "NVIDIA GeForce RTX 3080 10 GB", 10, "NVIDIA", "consumer"},
};

}  // namespace

std::span<const GpuModel> Gpus() { return kGpus; }

const GpuModel* FindGpu(std::string_view id) {
  for (const GpuModel& g : kGpus) if (id == g.id) return &g;
  return nullptr;
}

}  // namespace gpumem
