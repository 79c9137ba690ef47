// What the process holds on the GPU besides the step's tensors, each default with its source,
// and the allocator options' validation and PYTORCH_CUDA_ALLOC_CONF reader.
#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <string>

#include "device/caching_allocator.hpp"
#include "gpumem/device.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

namespace {

constexpr std::int64_t kMiB = 1 << 20;
constexpr std::int64_t kKiB = 1 << 10;

bool PowerOfTwo(std::int64_t v) { return v > 0 && std::has_single_bit(static_cast<std::uint64_t>(v)); }

std::string Str(std::int64_t v) { return std::to_string(v); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Allocator options.

std::vector<FieldError> ValidateAllocatorOptions(const AllocatorOptions& o) {
  std::vector<FieldError> errors;
  auto bad = [&](const char* field, std::string message) {
    errors.push_back({ErrorCode::InvalidField, field, std::move(message)});
  };
  // AllocatorConfig::parseMaxSplitSize / parseMaxNonSplitRoundingSize: at least kLargeBuffer.
  if (o.maxSplitSizeMiB != 0 && o.maxSplitSizeMiB < 20) {
    bad("allocator.maxSplitSizeMiB", "max_split_size_mb must be at least 20 (MiB), or 0 for unlimited.");
  }
  if (o.maxNonSplitRoundingMiB < 20) {
    bad("allocator.maxNonSplitRoundingMiB", "max_non_split_rounding_mb must be at least 20 (MiB).");
  }
  if (o.maxSplitSizeMiB > (std::int64_t{1} << 40) || o.maxNonSplitRoundingMiB > (std::int64_t{1} << 40)) {
    bad("allocator.maxSplitSizeMiB", "Sizes above 2^40 MiB are not meaningful.");
  }
  // parseGarbageCollectionThreshold: a fraction in (0, 1).
  if (!(o.garbageCollectionThreshold >= 0 && o.garbageCollectionThreshold < 1)) {
    bad("allocator.garbageCollectionThreshold", "garbage_collection_threshold must be in (0, 1), or 0 for off.");
  }
  if (!(o.perProcessMemoryFraction >= 0 && o.perProcessMemoryFraction <= 1)) {
    bad("allocator.perProcessMemoryFraction", "The memory fraction must be in (0, 1], or 0 for not set.");
  }
  // parseRoundUpPower2Divisions: 0 or a power of two.
  for (int i = 0; i < kRoundupPower2Intervals; ++i) {
    const std::int32_t d = o.roundupPower2Divisions[i];
    if (d != 0 && !PowerOfTwo(d)) {
      bad("allocator.roundupPower2Divisions",
          "Divisions must be 0 or a power of two (interval " + std::to_string(i) + " has " + std::to_string(d) + ").");
      break;
    }
  }
  return errors;
}

// AllocatorConfig::lexArgs + parseArgs: tokens split at , : [ ] with spaces dropped.
AllocatorConfParse ParseAllocatorConf(std::string_view text) {
  AllocatorConfParse out;
  out.options = DefaultAllocatorOptions();
  std::vector<std::string> tokens;
  std::string buffer;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!buffer.empty()) tokens.push_back(std::move(buffer));
      buffer.clear();
      tokens.emplace_back(1, c);
    } else if (c != ' ') {
      buffer.push_back(c);
    }
  }
  if (!buffer.empty()) tokens.push_back(buffer);

  const char* field = "PYTORCH_CUDA_ALLOC_CONF";
  auto fail = [&](std::string message) {
    out.errors.push_back({ErrorCode::InvalidField, field, std::move(message)});
  };
  auto number = [](const std::string& s, std::int64_t& v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
  };
  auto at = [&](std::size_t i) -> const std::string& {
    static const std::string empty;
    return i < tokens.size() ? tokens[i] : empty;
  };
  std::size_t i = 0;
  while (i < tokens.size() && out.errors.empty()) {
    const std::string key = tokens[i];
    if (at(i + 1) != ":") {
      fail("Expected ':' after " + key + ".");
      break;
    }
    i += 2;
    const std::string& value = at(i);
    std::int64_t v = 0;
    if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
      if (!number(value, v)) {
        fail(key + " needs a whole number of MiB.");
      } else if (v < 20) {
        fail(key + " must be at least 20 (MiB).");
      } else {
        (key == "max_split_size_mb" ? out.options.maxSplitSizeMiB : out.options.maxNonSplitRoundingMiB) = v;
      }
    } else if (key == "garbage_collection_threshold") {
      // (strtod, not from_chars: the wasm toolchain's libc++ has no floating-point from_chars.)
      const std::string text(value);
      char* end = nullptr;
      const double d = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !(d > 0 && d < 1)) {
        fail("garbage_collection_threshold must be a number in (0, 1).");
      } else {
        out.options.garbageCollectionThreshold = d;
      }
    } else if (key == "expandable_segments") {
      if (value != "True" && value != "False") fail("expandable_segments takes True or False.");
      out.options.expandableSegments = value == "True";
    } else if (key == "roundup_power2_divisions") {
      auto& divisions = out.options.roundupPower2Divisions;
      if (value == "[") {
        // "[64:8,256:4,>:1]": an interval start in MiB (a power of two) or '>' for all the rest.
        std::size_t lastIndex = 0;
        bool firstValue = true;
        ++i;
        while (i < tokens.size() && tokens[i] != "]" && out.errors.empty()) {
          const std::string start = tokens[i];
          std::int64_t d = 0;
          if (at(i + 1) != ":" || !number(at(i + 2), d) || (d != 0 && !PowerOfTwo(d))) {
            fail("roundup_power2_divisions entries are SIZE_MB:DIVISIONS with a power-of-two division count.");
            break;
          }
          if (start == ">") {
            // Every interval after the last one named (c10/test/core/AllocatorConfig_test.cpp:
            // "[128:8,256:16,512:1,2048:8,>:2]" keeps 8 at 2048 MiB, 0 at 1024, 2 from 4096).
            const std::size_t from = firstValue ? 0 : lastIndex + 1;
            std::fill(divisions.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(from, kRoundupPower2Intervals)),
                      divisions.end(),
                      static_cast<std::int32_t>(d));
          } else {
            std::int64_t startMiB = 0;
            if (!number(start, startMiB) || !PowerOfTwo(startMiB)) {
              fail("roundup_power2_divisions interval starts must be powers of two (MiB).");
              break;
            }
            std::size_t index = static_cast<std::size_t>(63 - std::countl_zero(static_cast<std::uint64_t>(startMiB)));
            index = std::min<std::size_t>(index, kRoundupPower2Intervals - 1);
            if (firstValue) {
              std::fill(divisions.begin(), divisions.begin() + static_cast<std::ptrdiff_t>(index),
                        static_cast<std::int32_t>(d));
              firstValue = false;
            }
            divisions[index] = static_cast<std::int32_t>(d);
            lastIndex = index;
          }
          i += 3;
          if (at(i) == ",") ++i;
        }
        if (at(i) != "]" && out.errors.empty()) fail("roundup_power2_divisions: missing ']'.");
      } else if (!number(value, v) || !PowerOfTwo(v)) {
        fail("roundup_power2_divisions must be a power of two or a [SIZE_MB:DIVISIONS,...] list.");
      } else {
        divisions.fill(static_cast<std::int32_t>(v));
      }
    } else if (key == "backend") {
      if (value != "native") fail("Only the native caching allocator is modelled (backend:" + value + ").");
    } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_use_background_threads") {
      // Locking and pinned host memory: no effect on device memory.
    } else {
      fail("Unrecognized CachingAllocator option: " + key + ".");
    }
    ++i;
    if (i < tokens.size()) {
      if (tokens[i] != ",") fail("Expected ',' between options.");
      ++i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// GPUs: compute capability by the ids of Gpus() (NVIDIA's CUDA GPUs list,
// developer.nvidia.com/cuda-gpus; AMD's gfx targets from the ROCm GPU support matrix), and the
// multiprocessor count each product's data sheet gives (NVIDIA's architecture whitepapers: H100
// SXM 132 SMs, H100 PCIe 114, A100 108, B200 148; the GeForce and RTX cards' CUDA cores / 128 per
// SM, Pascal's / 64: RTX PRO 6000 Blackwell 188, P100 56; AMD's CDNA 3 whitepaper: MI300X and
// MI325X 304 CUs; the MI250X's 220 CUs are two GCDs, and PyTorch sees each GCD, 110 CUs, as a
// device).

namespace {

struct CapabilityRow {
  const char* id;
  ComputeCapability capability;
  int multiprocessors;  // cudaDeviceProp::multiProcessorCount (AMD: compute units of one GCD)
};

constexpr CapabilityRow kCapabilities[] = {
    {"nvidia-b200", {10, 0, "Blackwell"}, 148},
    {"nvidia-h200", {9, 0, "Hopper"}, 132},
    {"nvidia-gh200", {9, 0, "Hopper"}, 132},
    {"nvidia-h100-nvl", {9, 0, "Hopper"}, 132},
    {"nvidia-h100-sxm", {9, 0, "Hopper"}, 132},
    {"nvidia-h100-pcie", {9, 0, "Hopper"}, 114},
    {"nvidia-a100-80", {8, 0, "Ampere"}, 108},
    {"nvidia-a100-40", {8, 0, "Ampere"}, 108},
    {"nvidia-l40s", {8, 9, "Ada Lovelace"}, 142},
    {"nvidia-l40", {8, 9, "Ada Lovelace"}, 142},
    {"nvidia-a40", {8, 6, "Ampere"}, 84},
    {"nvidia-a10g", {8, 6, "Ampere"}, 80},
    {"nvidia-a10", {8, 6, "Ampere"}, 72},
    {"nvidia-l4", {8, 9, "Ada Lovelace"}, 58},
    {"nvidia-v100-32", {7, 0, "Volta"}, 80},
    {"nvidia-v100-16", {7, 0, "Volta"}, 80},
    {"nvidia-p100-16", {6, 0, "Pascal"}, 56},
    {"nvidia-t4", {7, 5, "Turing"}, 40},
    {"amd-mi300x", {0, 0, "gfx942"}, 304},
    {"amd-mi325x", {0, 0, "gfx942"}, 304},
    {"amd-mi250x", {0, 0, "gfx90a"}, 110},
    {"nvidia-rtx-6000-ada", {8, 9, "Ada Lovelace"}, 142},
    {"nvidia-rtx-pro-6000", {12, 0, "Blackwell"}, 188},
    {"nvidia-rtx-a6000", {8, 6, "Ampere"}, 84},
    {"nvidia-rtx-5090", {12, 0, "Blackwell"}, 170},
    {"nvidia-rtx-5080", {12, 0, "Blackwell"}, 84},
    {"nvidia-rtx-4090", {8, 9, "Ada Lovelace"}, 128},
    {"nvidia-rtx-3090-ti", {8, 6, "Ampere"}, 84},
    {"nvidia-rtx-3090", {8, 6, "Ampere"}, 82},
    {"nvidia-rtx-4080", {8, 9, "Ada Lovelace"}, 76},
    {"nvidia-rtx-4070-ti-super", {8, 9, "Ada Lovelace"}, 66},
    {"nvidia-rtx-4060-ti-16", {8, 9, "Ada Lovelace"}, 34},
    {"nvidia-rtx-4070", {8, 9, "Ada Lovelace"}, 46},
    {"nvidia-rtx-3060", {8, 6, "Ampere"}, 28},
    {"nvidia-rtx-3080", {8, 6, "Ampere"}, 68},
};

bool AtLeast(const RuntimeOptions& o, int major, int minor) {
  return o.pytorchMajor > major || (o.pytorchMajor == major && o.pytorchMinor >= minor);
}

// CUBLAS_WORKSPACE_CONFIG as parseChosenWorkspaceSize reads it: every ":SIZE_KIB:COUNT" pair
// adds SIZE × 1024 × COUNT bytes. Returns -1 when no pair is found (PyTorch then warns and
// uses the default).
std::int64_t ParseCublasWorkspaceConfig(std::string_view text, std::string& formula) {
  std::int64_t total = -1;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != ':') {
      ++i;
      continue;
    }
    std::int64_t size = 0;
    std::int64_t count = 0;
    const char* p = text.data() + i + 1;
    const char* end = text.data() + text.size();
    auto r1 = std::from_chars(p, end, size);
    if (r1.ec != std::errc() || r1.ptr == p || r1.ptr == end || *r1.ptr != ':') {
      ++i;
      continue;
    }
    auto r2 = std::from_chars(r1.ptr + 1, end, count);
    if (r2.ec != std::errc() || r2.ptr == r1.ptr + 1) {
      ++i;
      continue;
    }
    if (size > (std::int64_t{1} << 30) || count > (std::int64_t{1} << 20)) return -2;
    total = std::max<std::int64_t>(total, 0) + size * kKiB * count;
    formula += (formula.empty() ? "" : " + ") + Str(size) + " KiB × " + Str(count);
    i = static_cast<std::size_t>(r2.ptr - text.data());
  }
  return total;
}

}  // namespace

RuntimeOptions DefaultRuntimeOptions() { return RuntimeOptions{}; }

ComputeCapability GpuComputeCapability(std::string_view gpuId) {
  for (const CapabilityRow& row : kCapabilities) {
    if (gpuId == row.id) return row.capability;
  }
  return {};
}

GpuParallelism GpuParallelismOf(std::string_view gpuId) {
  GpuParallelism p;
  for (const CapabilityRow& row : kCapabilities) {
    if (gpuId != row.id) continue;
    p.multiprocessors = row.multiprocessors;
    const ComputeCapability& c = row.capability;
    if (gpuId.starts_with("amd-")) {
      // CDNA: 64-wide wavefronts, 2048 threads per compute unit (hipDeviceProp_t).
      p.warpSize = 64;
      p.maxThreadsPerMultiprocessor = 2048;
    } else {
      // CUDA C Programming Guide, "Technical Specifications per Compute Capability": maximum
      // resident threads per SM, 1024 on 7.5, 1536 on 8.6 / 8.9 / 12.x, 2048 on 6.0 / 7.0 / 8.0 / 9.0 / 10.0.
      const bool fewer = c.major == 12 || (c.major == 8 && c.minor >= 6);
      p.maxThreadsPerMultiprocessor = c.major == 7 && c.minor == 5 ? 1024 : fewer ? 1536 : 2048;
    }
    return p;
  }
  return p;
}

DeviceOverheadsResult DeviceOverheads(std::string_view gpuId, const RuntimeOptions& o) {
  DeviceOverheadsResult r;
  r.computeCapability = GpuComputeCapability(gpuId);
  const bool amd = gpuId.starts_with("amd-");
  auto bad = [&](const char* field, std::string message) {
    r.errors.push_back({ErrorCode::InvalidField, field, std::move(message)});
  };
  if (o.cublasHandles < 0 || o.cublasHandles > 64) bad("runtime.cublasHandles", "Between 0 and 64 handles.");
  if (o.worldSize < 1) bad("runtime.worldSize", "At least one GPU.");
  if (o.cudaContextMiB > 1 << 20) bad("runtime.cudaContextMiB", "A context above 1 TiB is not meaningful.");
  if (o.cublasLtWorkspaceKiB > (std::int64_t{1} << 30)) bad("runtime.cublasLtWorkspaceKiB", "Too large.");
  if (o.ncclBuffersMiB > 1 << 20) bad("runtime.ncclBuffersMiB", "Buffers above 1 TiB are not meaningful.");
  if (!r.errors.empty()) return r;

  // --- CUDA context and kernel images: outside the caching allocator (nvidia-smi sees them,
  // torch.cuda.memory_reserved does not). Hopper is measured (tests/data/cuda); other generations
  // take a public measurement of total − free after the first CUDA call plus the kernels a
  // training step loads, measured on Hopper.
  if (o.cudaContextMiB >= 0) {
    r.context.bytes = static_cast<std::int64_t>(std::llround(o.cudaContextMiB * static_cast<double>(kMiB)));
    r.context.formula = "given: " + std::to_string(o.cudaContextMiB) + " MiB";
    r.context.source = "runtime.cudaContextMiB";
  } else {
    const bool lazyAvailable = o.cudaMajor > 11 || (o.cudaMajor == 11 && o.cudaMinor >= 7);
    if (lazyAvailable) {
      // The context at the first CUDA call plus what a training step loads after it. Measured on
      // an H100 SXM (tests/data/cuda, PyTorch 2.11 + CUDA 13.0, driver 580): NVML used less the
      // 2 MiB segment after torch.ones(1, device="cuda"), then NVML used − max_memory_reserved
      // after two training steps. Lazy: 619 → 751 MiB (eager attention) to 767 MiB (SDPA's flash
      // kernels too). Eager: every image at the first call, the libraries' own (cuBLAS, cuBLASLt)
      // when their handles are made: 1,259 → 1,863 MiB. Other generations take a published
      // first-call figure and the step's share measured on Hopper.
      struct ContextRule {
        std::int64_t firstCallMiB, stepMiB;
        const char* what;
        const char* source;
      };
      constexpr const char* kMeasured =
          "measured on an H100 SXM, PyTorch 2.11 + CUDA 13.0, driver 580.159.04: NVML used − max_memory_reserved "
          "after two training steps (tests/data/cuda)";
      const bool hopper = r.computeCapability.major >= 9 && !amd;
      const ContextRule rule =
          o.lazyModuleLoading
              ? (hopper ? ContextRule{619, 148, "Hopper and later, CUDA_MODULE_LOADING=LAZY", kMeasured}
                        : ContextRule{426, 148, "CUDA ≥ 11.7, CUDA_MODULE_LOADING=LAZY",
                                      "unslothai/unsloth-zoo PR #1053: 426 MiB in nvidia-smi after torch.cuda.mem_get_info, "
                                      "PyTorch 2.10 + CUDA 13.0, RTX 6000 Ada (ptrblck in pytorch/pytorch#109888: around 400 MB "
                                      "with CUDA >= 11.7 and lazy loading); the 148 MiB a training step adds measured on an H100 "
                                      "(tests/data/cuda)"})
              : (hopper ? ContextRule{1259, 604, "Hopper and later, CUDA_MODULE_LOADING=EAGER", kMeasured}
                        : ContextRule{616, 604, "CUDA ≥ 11.7, CUDA_MODULE_LOADING=EAGER",
                                      "pytorch/pytorch PR #86509 (1.13): total − free 666,632,192 B eager (vs 287,047,680 B lazy) "
                                      "with one 6.4 MB tensor, less its 20 MiB segment; the 604 MiB a training step adds "
                                      "measured on an H100 (tests/data/cuda)"});
      r.context.bytes = (rule.firstCallMiB + rule.stepMiB) * kMiB;
      r.context.formula = std::to_string(rule.firstCallMiB + rule.stepMiB) + " MiB (" + rule.what + ": " +
                          std::to_string(rule.firstCallMiB) + " MiB at the first CUDA call + " +
                          std::to_string(rule.stepMiB) + " MiB a training step loads)";
      r.context.source = rule.source;
    } else {
      r.context.bytes = 1024 * kMiB;
      r.context.formula = "1024 MiB (CUDA < 11.7: every kernel image loaded at start)";
      r.context.source = "ptrblck in pytorch/pytorch#107667: before CUDA 11.7 all kernels were loaded, >1000 MB";
    }
    if (amd) r.context.formula += "; ROCm: no public measurement, the CUDA figure is used";
  }

  // --- cuBLAS workspace: allocated through the caching allocator, one per (handle, stream)
  // (aten/src/ATen/cuda/CublasHandlePool.cpp, getCurrentCUDABlasHandle / setWorkspaceForHandle,
  // size from parseChosenWorkspaceSize).
  std::int64_t cublasBytes = 0;
  std::string cublasFormula;
  if (!o.cublasWorkspaceConfig.empty()) {
    cublasBytes = ParseCublasWorkspaceConfig(o.cublasWorkspaceConfig, cublasFormula);
    if (cublasBytes == -2) {
      bad("runtime.cublasWorkspaceConfig", "Workspace sizes this large are not meaningful.");
      return r;
    }
    if (cublasBytes < 0) {
      bad("runtime.cublasWorkspaceConfig",
          "CUBLAS_WORKSPACE_CONFIG has no :SIZE_KIB:COUNT pair (e.g. \":4096:8\"); PyTorch would warn and use its default.");
      return r;
    }
  } else if (amd) {
    // ROCm: 32 MiB, 128 MiB on gfx942/gfx950 (MI300X, MI355X).
    const bool big = std::string_view(r.computeCapability.architecture) == "gfx942";
    cublasBytes = (big ? 128 : 32) * kMiB;
    cublasFormula = big ? "131072 KiB × 1 (hipBLAS on gfx942)" : "32768 KiB × 1 (hipBLAS)";
  } else if (!AtLeast(o, 2, 0)) {
    // PyTorch 1.13 (PR #86167): one 4096 KiB workspace.
    cublasBytes = 4096 * kKiB;
    cublasFormula = "4096 KiB × 1";
  } else if (r.computeCapability.major >= 9) {
    // ":4096:8" on Hopper (PR #91564, PyTorch 2.0) and later architectures (current main:
    // compute capability 9, 10, 11, 12).
    cublasBytes = 4096 * kKiB * 8;
    cublasFormula = "4096 KiB × 8";
  } else {
    // ":4096:2:16:8" — cuBLAS' own default pool.
    cublasBytes = 4096 * kKiB * 2 + 16 * kKiB * 8;
    cublasFormula = "4096 KiB × 2 + 16 KiB × 8";
  }

  // --- cuBLASLt workspace (CUBLASLT_WORKSPACE_SIZE KiB, default 1024 KiB since PR #73439).
  // Before PR #156495 (PyTorch 2.8) it was allocated per matmul call and freed after; since,
  // kept per (handle, stream); with TORCH_CUBLASLT_UNIFIED_WORKSPACE the cuBLAS workspace
  // serves both and nothing more is allocated.
  const std::int64_t ltBytes = o.cublasLtUnifiedWorkspace || amd ? 0
                               : (o.cublasLtWorkspaceKiB >= 0 ? o.cublasLtWorkspaceKiB : 1024) * kKiB;
  const int handles = o.cublasHandles;
  r.workspace.bytes = static_cast<std::int64_t>(handles) * (cublasBytes + ltBytes);
  r.workspace.formula = Str(handles) + " handles × (cuBLAS " + cublasFormula +
                        (ltBytes > 0 ? " + cuBLASLt " + Str(ltBytes / kKiB) + " KiB" : std::string()) + ")";
  r.workspace.source =
      "aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize / parseCUDABlasLtWorkspaceSize; one handle "
      "for forward (Python thread) and one for backward (autograd device thread)";
  for (int h = 0; h < handles; ++h) {
    if (cublasBytes > 0) r.workspaceAllocations.push_back(cublasBytes);
    if (ltBytes > 0) r.workspaceAllocations.push_back(ltBytes);
  }

  // --- NCCL: nothing on one GPU. With several, every communicator the rank belongs to
  // connects its ring: on each channel one receive connection from the previous rank, whose
  // buffers (one per protocol: Simple, LL, LL128) are cudaMalloc'd on the receiving GPU (nccl
  // src/transport/p2p.cc p2pRecvSetup / ncclConnInfo.buffs "Local for recv"; src/init.cc
  // computeBuffSizes). They are outside PyTorch's caching allocator: nvidia-smi sees them,
  // torch.cuda.memory_reserved does not. An estimate: the channel count depends on the topology
  // NCCL finds (NVLink systems use 16–32, PCIe a few; NCCL_MIN/MAX_NCHANNELS), tree, NVLS and
  // CollNet connections, the p2p transport's own channels and the proxy's host buffers are not
  // counted, and NCCL ≥ 2.22 connects lazily (NCCL_RUNTIME_CONNECT), so a protocol never used
  // allocates nothing. runtime.ncclBuffersMiB replaces it with a measured figure.
  if (o.ncclBuffersMiB >= 0) {
    r.communication.bytes = static_cast<std::int64_t>(std::llround(o.ncclBuffersMiB * static_cast<double>(kMiB)));
    r.communication.formula = "given: " + std::to_string(o.ncclBuffersMiB) + " MiB";
    r.communication.source = "runtime.ncclBuffersMiB";
  } else if (o.worldSize == 1) {
    r.communication.formula = "0 (one GPU: no NCCL communicator)";
    r.communication.source = "no process group";
  } else {
    const int communicators = o.ncclCommunicators < 0 ? 1 : o.ncclCommunicators;
    const std::int64_t perChannel = kNcclSimpleBufferBytes + kNcclLl128BufferBytes + kNcclLlBufferBytes;
    r.communication.bytes = std::int64_t{communicators} * o.ncclChannels * perChannel;
    r.communication.formula = Str(communicators) + " communicator" + (communicators == 1 ? "" : "s") + " × " +
                              Str(o.ncclChannels) + " channels × (Simple 4,194,304 + LL128 4,915,200 + LL 524,288 B)";
    r.communication.source =
        "nccl src/init.cc DEFAULT_BUFFSIZE, DEFAULT_LL_BUFFSIZE, DEFAULT_LL128_BUFFSIZE (NCCL_BUFFSIZE, "
        "NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE); one ring receive connection per channel; the channel count is "
        "an estimate (topology); give runtime.ncclBuffersMiB for a measured figure";
  }
  return r;
}

int NcclCommunicatorsOf(const ParallelDef& p) {
  // A process group per parallel dimension of more than one rank (Megatron's
  // parallel_state.initialize_model_parallel creates data, tensor, context, expert and pipeline
  // groups; DDP / DeepSpeed / FSDP one data-parallel group). Each gets its own NCCL communicator
  // at its first collective (torch ProcessGroupNCCL::getNCCLComm).
  int n = 0;
  for (std::int64_t size : {p.dataParallel, p.tensorParallel, p.contextParallel, p.expertParallel, p.pipelineParallel}) {
    if (size > 1) ++n;
  }
  // HYBRID_SHARD: a shard group within the node and a replicate group across
  // (torch/distributed/fsdp/_init_utils.py _init_intra_and_inter_node_groups).
  if (p.fsdp == FsdpMode::HybridShard && p.dataParallel > p.fsdpShardGroupSize) ++n;
  return n;
}

}  // namespace gpumem
