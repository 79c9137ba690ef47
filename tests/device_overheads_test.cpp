// Device overheads: each default against its source (docs/device.md).
#include <catch2/catch.hpp>

#include "gpumem/device.hpp"
#include "gpumem/gpus.hpp"

#include <string>

using namespace gpumem;

namespace {
constexpr std::int64_t KiB = 1024;
constexpr std::int64_t MiB = 1024 * 1024;
}  // namespace

TEST_CASE("every listed GPU has a compute capability or a ROCm target", "[device]") {
  for (const GpuModel& gpu : Gpus()) {
    const ComputeCapability cc = GpuComputeCapability(gpu.id);
    INFO(gpu.id);
    CHECK(std::string(cc.architecture).size() > 0);
  }
  CHECK(GpuComputeCapability("nvidia-h100-sxm").major == 9);
  CHECK(GpuComputeCapability("nvidia-a100-80").major == 8);
  CHECK(GpuComputeCapability("nvidia-rtx-4090").minor == 9);
  CHECK(GpuComputeCapability("no-such-gpu").major == 0);
}

TEST_CASE("every listed GPU's capacity is CUDA's total, with its source", "[device]") {
  // Below the size the product is sold as (the label's last figure) and within 10 % of it: CUDA
  // keeps some memory back, never this much (B200 178.35 GiB of 192, the furthest).
  for (const GpuModel& gpu : Gpus()) {
    INFO(gpu.id);
    const std::string label = gpu.label;
    const std::size_t gb = label.rfind(" GB");
    REQUIRE(gb != std::string::npos);
    const double sold = std::stod(label.substr(label.rfind(' ', gb - 1) + 1));
    CHECK(gpu.memoryGiB < sold);
    CHECK(gpu.memoryGiB > 0.9 * sold);
    CHECK(std::string(gpu.capacitySource).size() > 20);
  }
  // As PyTorch reports them (docs/device.md, "GPU capacities"): total_memory in bytes or MiB.
  const auto bytes = [](const char* id) { return FindGpu(id)->memoryGiB * double(1 << 30); };
  CHECK(bytes("nvidia-h100-sxm") == 85017493504.0);  // measured (tests/data/cuda)
  CHECK(bytes("nvidia-rtx-4090") == 25393692672.0);
  CHECK(bytes("nvidia-h200") == 143156.0 * MiB);
  CHECK(bytes("nvidia-a100-80") == 81037.0 * MiB);
  CHECK(bytes("amd-mi250x") == 65520.0 * MiB);  // one of its two dies: PyTorch's device
  CHECK(bytes("nvidia-p100-16") == 16280.0 * MiB);  // Kaggle's GPU
  CHECK(bytes("nvidia-gh200") == 102005473280.0);
  CHECK(GpuComputeCapability("nvidia-p100-16").major == 6);
  CHECK(GpuParallelismOf("nvidia-p100-16").maxThreadsPerMultiprocessor == 2048);
  CHECK(GpuParallelismOf("nvidia-rtx-pro-6000").maxThreadsPerMultiprocessor == 1536);
}

TEST_CASE("cuBLAS workspaces by architecture and handle", "[device]") {
  const RuntimeOptions o = DefaultRuntimeOptions();
  // Before Hopper: ":4096:2:16:8" = 4096 KiB × 2 + 16 KiB × 8 = 8,519,680 B per handle, plus the
  // cuBLASLt 1024 KiB; two handles (forward thread, autograd's backward thread):
  // 2 × (8,519,680 + 1,048,576) = 19,136,512 B.
  const DeviceOverheadsResult a100 = DeviceOverheads("nvidia-a100-80", o);
  REQUIRE(a100.errors.empty());
  CHECK(a100.workspace.bytes == 2 * (4096 * KiB * 2 + 16 * KiB * 8 + 1024 * KiB));
  CHECK(a100.workspace.bytes == 19136512);
  CHECK(a100.workspaceAllocations == std::vector<std::int64_t>{8519680, 1048576, 8519680, 1048576});
  // Hopper: ":4096:8" = 32 MiB per handle: 2 × (32 MiB + 1 MiB) = 66 MiB.
  const DeviceOverheadsResult h100 = DeviceOverheads("nvidia-h100-sxm", o);
  CHECK(h100.workspace.bytes == 66 * MiB);
  // CUBLAS_WORKSPACE_CONFIG=":4096:8" on an A100, Lt unified: 2 × 32 MiB.
  RuntimeOptions custom = o;
  custom.cublasWorkspaceConfig = ":4096:8";
  custom.cublasLtUnifiedWorkspace = true;
  CHECK(DeviceOverheads("nvidia-a100-80", custom).workspace.bytes == 64 * MiB);
  // ":16:8" (the deterministic-mode setting): 128 KiB per handle; one handle; Lt 0 KiB.
  custom.cublasWorkspaceConfig = ":16:8";
  custom.cublasHandles = 1;
  CHECK(DeviceOverheads("nvidia-a100-80", custom).workspace.bytes == 128 * KiB);
  // PyTorch 1.13: one 4096 KiB workspace.
  RuntimeOptions old = o;
  old.pytorchMajor = 1;
  old.pytorchMinor = 13;
  CHECK(DeviceOverheads("nvidia-h100-sxm", old).workspace.bytes == 2 * (4 * MiB + 1 * MiB));
  // A text without a :SIZE:COUNT pair is an error naming the field.
  custom.cublasWorkspaceConfig = "4096";
  const DeviceOverheadsResult bad = DeviceOverheads("nvidia-a100-80", custom);
  REQUIRE(bad.errors.size() == 1);
  CHECK(bad.errors[0].field == "runtime.cublasWorkspaceConfig");
}

TEST_CASE("CUDA context by loading mode and version with an override", "[device]") {
  RuntimeOptions o = DefaultRuntimeOptions();
  // Hopper, measured (tests/data/cuda): lazy 619 + 148 MiB, eager 1,259 + 604 MiB.
  CHECK(DeviceOverheads("nvidia-h100-sxm", o).context.bytes == 767 * MiB);
  CHECK(DeviceOverheads("nvidia-a100-80", o).context.bytes == 574 * MiB);  // 426 + 148 MiB
  o.lazyModuleLoading = false;
  CHECK(DeviceOverheads("nvidia-h100-sxm", o).context.bytes == 1863 * MiB);
  CHECK(DeviceOverheads("nvidia-a100-80", o).context.bytes == 1220 * MiB);  // 616 + 604 MiB
  o.cudaMajor = 11;
  o.cudaMinor = 6;
  CHECK(DeviceOverheads("nvidia-h100-sxm", o).context.bytes == 1024 * MiB);
  o.cudaContextMiB = 512;
  const DeviceOverheadsResult r = DeviceOverheads("nvidia-h100-sxm", o);
  CHECK(r.context.bytes == 512 * MiB);
  CHECK(r.context.source == "runtime.cudaContextMiB");
}

TEST_CASE("communication buffers are zero on one GPU", "[device]") {
  RuntimeOptions o = DefaultRuntimeOptions();
  CHECK(DeviceOverheads("nvidia-a100-80", o).communication.bytes == 0);
  o.worldSize = 8;
  o.ncclBuffersMiB = 100;
  CHECK(DeviceOverheads("nvidia-a100-80", o).communication.bytes == 100 * MiB);
}

TEST_CASE("workspaces through the allocator take a 20 MiB segment each", "[device]") {
  // An 8,519,680 B cuBLAS workspace is a large-pool request below 10 MiB: a 20 MiB segment,
  // split; the 1 MiB Lt workspace (≤ 1 MiB: small pool) a 2 MiB segment. The second handle's
  // 8.125 MiB fits the first segment's 11.875 MiB remainder; its Lt workspace the small
  // segment's remaining 1 MiB. Reserved: 20 + 2 = 22 MiB for 19,136,512 B allocated.
  const DeviceOverheadsResult w = DeviceOverheads("nvidia-a100-80", DefaultRuntimeOptions());
  std::vector<AllocatorEvent> events;
  int id = 0;
  for (std::int64_t bytes : w.workspaceAllocations) events.push_back({AllocatorEventKind::Alloc, id++, bytes});
  const AllocatorResult r = SimulateCachingAllocator(events, DefaultAllocatorOptions(), 80LL << 30);
  CHECK(r.peakAllocatedBytes == 19136512);
  CHECK(r.peakReservedBytes == 22 * MiB);
}
