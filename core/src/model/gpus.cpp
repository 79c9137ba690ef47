// The GPU list. A capacity is CUDA's total memory for the device, what
// torch.cuda.get_device_properties(i).total_memory returns (cudaMemGetInfo's total) and what
// PyTorch's out-of-memory message calls "total capacity": the line the caching allocator really
// runs into. It is below the product's nominal size and below nvidia-smi's total (the driver
// keeps some back): an RTX 4090 sold as 24 GB reports 24,217 MiB = 23.65 GiB, and calling it
// 24 GiB said "fits" for steps up to 0.35 GiB over the real line (issue 10's false green).
// Each figure is Linux's (Windows and WSL report about the whole board) with ECC as the card
// ships, from PyTorch's own printouts in public logs and issues (capacitySource says which);
// where drivers disagree by a few tens of MiB the lower common figure is taken, so that a
// verdict errs towards "does not fit". docs/device.md, "GPU capacities", lists them.
#include "gpumem/gpus.hpp"

namespace gpumem {
namespace {

// total_memory as PyTorch prints it (MiB, 2^20 B, truncated), or in bytes where a log gives
// them, in GiB.
constexpr double MiB(double mib) { return mib / 1024.0; }
constexpr double Bytes(double bytes) { return bytes / 1073741824.0; }

constexpr GpuModel kGpus[] = {
    {"nvidia-b200", "NVIDIA B200 192 GB", MiB(182631), "NVIDIA", "dataCenter",
     "PyTorch's total_memory=182631MB; out-of-memory messages read 178.35 GiB"},
    {"nvidia-h200", "NVIDIA H200 141 GB", MiB(143156), "NVIDIA", "dataCenter",
     "PyTorch's total_memory=143156MB; out-of-memory messages read 139.80-139.81 GiB"},
    {"nvidia-gh200", "NVIDIA GH200 96 GB", Bytes(102005473280), "NVIDIA", "dataCenter",
     "deviceQuery 102,005,473,280 B; an out-of-memory message in NVIDIA's blog reads 95.00 GiB"},
    {"nvidia-h100-nvl", "NVIDIA H100 NVL 94 GB", MiB(95320), "NVIDIA", "dataCenter",
     "95,320 MiB in a device log; out-of-memory messages read 93.09 GiB"},
    // Measured (tests/data/cuda): total_memory 85,017,493,504 B = 79.18 GiB ("H100 80GB HBM3",
    // driver 580.159.04; NVML's total 85,520,809,984 B).
    {"nvidia-h100-sxm", "NVIDIA H100 SXM 80 GB", Bytes(85017493504), "NVIDIA", "dataCenter",
     "CUDA's total memory measured on an H100 80GB HBM3 (driver 580, PyTorch 2.11): 85,017,493,504 B"},
    {"nvidia-h100-pcie", "NVIDIA H100 PCIe 80 GB", MiB(81007), "NVIDIA", "dataCenter",
     "PyTorch's total_memory=81008MB; 84,942,979,072 B in OpenXLA's H100 spec"},
    {"nvidia-a100-80", "NVIDIA A100 80 GB", MiB(81037), "NVIDIA", "dataCenter",
     "deviceQuery 84,974,239,744 B (PCIe), 84,987,740,160 B (SXM4); newer drivers up to 79.26 GiB"},
    {"nvidia-a100-40", "NVIDIA A100 40 GB", MiB(40338), "NVIDIA", "dataCenter",
     "deviceQuery 42,298,834,944 B (PCIe); the SXM4 part reports 39.49-39.56 GiB"},
    {"nvidia-l40s", "NVIDIA L40S 48 GB", MiB(45589), "NVIDIA", "dataCenter",
     "deviceQuery 47,803,596,800 B; PyTorch's total_memory=45589MB (ECC on)"},
    {"nvidia-l40", "NVIDIA L40 48 GB", 44.40, "NVIDIA", "dataCenter",
     "out-of-memory message: 44.40 GiB (QwenLM/Qwen3-VL issue 2097; one source)"},
    {"nvidia-a40", "NVIDIA A40 48 GB", Bytes(47608692736), "NVIDIA", "dataCenter",
     "deviceQuery 47,608,692,736 B; out-of-memory messages read 44.34-44.42 GiB"},
    {"nvidia-a10g", "NVIDIA A10G 24 GB", 21.98, "NVIDIA", "dataCenter",
     "out-of-memory message on an AWS g5: 21.98 GiB (a newer driver: 22.06)"},
    {"nvidia-a10", "NVIDIA A10 24 GB", Bytes(23609475072), "NVIDIA", "dataCenter",
     "deviceQuery 23,609,475,072 B; a newer driver's 23,696,375,808 B"},
    {"nvidia-l4", "NVIDIA L4 24 GB", MiB(22518), "NVIDIA", "dataCenter",
     "deviceQuery 23,612,293,120 B; newer drivers report 22.03 GiB"},
    {"nvidia-v100-32", "NVIDIA V100 32 GB", MiB(32494), "NVIDIA", "dataCenter",
     "deviceQuery 34,072,559,616 B (CUDA 12 drivers); older drivers 31.75 GiB"},
    {"nvidia-v100-16", "NVIDIA V100 16 GB", MiB(16160), "NVIDIA", "dataCenter",
     "PyTorch's total_memory=16160MB; deviceQuery 16,945,512,448 B"},
    {"nvidia-p100-16", "NVIDIA Tesla P100 16 GB", MiB(16280), "NVIDIA", "dataCenter",
     "PyTorch's total_memory=16280MB (Kaggle's GPU); deviceQuery 17,071,734,784 B"},
    {"nvidia-t4", "NVIDIA T4 16 GB", MiB(14917), "NVIDIA", "dataCenter",
     "deviceQuery 15,642,329,088 B; out-of-memory messages read 14.56-14.58 GiB (Colab: 14.74)"},
    {"amd-mi325x", "AMD Instinct MI325X 256 GB", Bytes(274861129728), "AMD", "dataCenter",
     "rocminfo's pool 274,861,129,728 B; an out-of-memory message reads 255.98 GiB (vllm-project/vllm issue 41962)"},
    {"amd-mi300x", "AMD Instinct MI300X 192 GB", MiB(196592), "AMD", "dataCenter",
     "ROCm PyTorch's total_memory=196592MB (ROCm/ROCm issue 4203); cloud VMs 191.69 GiB"},
    // An MI250X is two dies (GCDs), each its own device of 64 GB to PyTorch: one process trains
    // on one of them.
    {"amd-mi250x", "AMD Instinct MI250X, one GCD 64 GB", MiB(65520), "AMD", "dataCenter",
     "ROCm PyTorch's total_memory=65520MB for each of an MI250X's two devices"},
    {"nvidia-rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell 96 GB", MiB(97250), "NVIDIA", "workstation",
     "PyTorch's total_memory=97250MB (Server Edition); out-of-memory messages read 94.97 GiB"},
    {"nvidia-rtx-6000-ada", "NVIDIA RTX 6000 Ada 48 GB", MiB(48622), "NVIDIA", "workstation",
     "PyTorch's total_memory=48622MB, ECC off (44.43 GiB with ECC on)"},
    {"nvidia-rtx-a6000", "NVIDIA RTX A6000 48 GB", MiB(48676), "NVIDIA", "workstation",
     "PyTorch's total_memory=48676MB (pytorch/ao's HQQ README)"},
    {"nvidia-rtx-5090", "NVIDIA GeForce RTX 5090 32 GB", MiB(32109), "NVIDIA", "consumer",
     "33,668,857,856 B on Linux; out-of-memory messages read 31.36 GiB (Windows: 31.84)"},
    {"nvidia-rtx-5080", "NVIDIA GeForce RTX 5080 16 GB", MiB(15840), "NVIDIA", "consumer",
     "15,840 MiB in a Linux device log (one source; Windows: 16,302)"},
    {"nvidia-rtx-4090", "NVIDIA GeForce RTX 4090 24 GB", Bytes(25393692672), "NVIDIA", "consumer",
     "25,393,692,672 B on Linux; out-of-memory messages read 23.64-23.65 GiB (Windows: 23.99)"},
    {"nvidia-rtx-3090-ti", "NVIDIA GeForce RTX 3090 Ti 24 GB", MiB(24114), "NVIDIA", "consumer",
     "PyTorch's total_memory=24114MB on Linux (one source)"},
    {"nvidia-rtx-3090", "NVIDIA GeForce RTX 3090 24 GB", MiB(24259), "NVIDIA", "consumer",
     "PyTorch's total_memory=24259MB and 24268MB; out-of-memory messages read 23.69-23.70 GiB"},
    {"nvidia-rtx-4080", "NVIDIA GeForce RTX 4080 16 GB", MiB(16049), "NVIDIA", "consumer",
     "PyTorch's total_memory=16049MB"},
    {"nvidia-rtx-4070-ti-super", "NVIDIA GeForce RTX 4070 Ti SUPER 16 GB", MiB(15934), "NVIDIA", "consumer",
     "PyTorch's total_memory=15934MB and 15974MB"},
    {"nvidia-rtx-4060-ti-16", "NVIDIA GeForce RTX 4060 Ti 16 GB", 15.55, "NVIDIA", "consumer",
     "out-of-memory message: 15.55 GiB (boson-ai/higgs-audio issue 48)"},
    {"nvidia-rtx-4070", "NVIDIA GeForce RTX 4070 12 GB", MiB(11994), "NVIDIA", "consumer",
     "11,994 MiB in a Linux device log; 12,002 in another"},
    {"nvidia-rtx-3060", "NVIDIA GeForce RTX 3060 12 GB", MiB(12044), "NVIDIA", "consumer",
     "PyTorch's total_memory=12044MB; out-of-memory messages read 11.75-11.76 GiB"},
    {"nvidia-rtx-3080", "NVIDIA GeForce RTX 3080 10 GB", MiB(9872), "NVIDIA", "consumer",
     "10,351,935,488 B on Linux; out-of-memory messages read 9.62-9.65 GiB"},
};

}  // namespace

std::span<const GpuModel> Gpus() { return kGpus; }

const GpuModel* FindGpu(std::string_view id) {
  for (const GpuModel& g : kGpus) if (id == g.id) return &g;
  return nullptr;
}

}  // namespace gpumem
