// gpumem — the device stage: the same alloc/free events through a model of PyTorch's CUDA
// caching allocator (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x), and what the process
// holds on the GPU besides tensors (CUDA context, cuBLAS workspaces, communication buffers).
//
// Why: the estimate of the replay is the peak of live tensor bytes. What decides an OOM and
// what nvidia-smi shows is the allocator's *reserved* memory (segments obtained by cudaMalloc,
// rounded, split and cached) plus the context. docs/device.md explains every rule with its
// source; the function names quoted in comments are PyTorch's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/error.hpp"

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// Allocator options: PYTORCH_CUDA_ALLOC_CONF, with PyTorch's defaults (c10/core/AllocatorConfig
// .cpp, AllocatorConfig::AllocatorConfig and parseArgs). Start from DefaultAllocatorOptions().

// roundup_power2_divisions holds one division count per power-of-two size interval, 16 of
// them: interval i covers requests of [2^i, 2^(i+1)) MiB; interval 0 also takes everything
// under 2 MiB and interval 15 everything from 32 GiB up (AllocatorConfig::
// roundup_power2_divisions(size): index = floor(log2(size)) − 20, clamped to [0, 15]).
constexpr int kRoundupPower2Intervals = 16;

struct AllocatorOptions {
  bool expandableSegments = false;        // expandable_segments:True
  std::int64_t maxSplitSizeMiB = 0;       // max_split_size_mb; 0 = unlimited (PyTorch: SIZE_MAX); else ≥ 20
  std::int64_t maxNonSplitRoundingMiB = 20;  // max_non_split_rounding_mb; default kLargeBuffer = 20 MiB; ≥ 20
  // Divisions per interval (see above); 0 or 1 = plain 512-byte rounding; else a power of two.
  std::array<std::int32_t, kRoundupPower2Intervals> roundupPower2Divisions{};
  double garbageCollectionThreshold = 0;  // garbage_collection_threshold, fraction in (0, 1); 0 = off
  // torch.cuda.set_per_process_memory_fraction(f): a cap of f × capacity on reserved bytes.
  // 0 = not set. PyTorch runs the garbage collection only when a fraction is set
  // (DeviceCachingAllocator::malloc: `set_fraction && garbage_collection_threshold() > 0`).
  double perProcessMemoryFraction = 0;
};

AllocatorOptions DefaultAllocatorOptions();
std::vector<FieldError> ValidateAllocatorOptions(const AllocatorOptions& options);

// Reads a PYTORCH_CUDA_ALLOC_CONF string ("expandable_segments:True,max_split_size_mb:128",
// "roundup_power2_divisions:[256:1,512:2,>:4]") as AllocatorConfig::parseArgs does. Options the
// model has no use for (release_lock_on_cudamalloc, pinned_*) are accepted and ignored;
// backend:cudaMallocAsync is refused (a different allocator, not modelled).
struct AllocatorConfParse {
  AllocatorOptions options;
  std::vector<FieldError> errors;  // empty when the text was read
};
AllocatorConfParse ParseAllocatorConf(std::string_view text);

// The size a request becomes (DeviceCachingAllocator::round_size), bytes.
std::int64_t RoundAllocationSize(std::int64_t requestedBytes, const AllocatorOptions& options);
// The cudaMalloc size for a rounded request that found no cached block
// (DeviceCachingAllocator::get_allocation_size), bytes.
std::int64_t SegmentAllocationSize(std::int64_t roundedBytes);

// ---------------------------------------------------------------------------------------------
// The simulation.

// EmptyCache: torch.cuda.empty_cache() (DeviceCachingAllocator::emptyCache →
// release_cached_blocks): every cached block that is a whole segment goes back to CUDA; its
// tensorId and bytes are ignored.
enum class AllocatorEventKind : std::uint8_t { Alloc, Free, EmptyCache };

struct AllocatorEvent {
  AllocatorEventKind kind = AllocatorEventKind::Alloc;
  int tensorId = 0;        // pairs an Alloc with its Free
  std::int64_t bytes = 0;  // requested bytes (for a Free: ignored; the Alloc's size is used)
  // The CUDA stream current at the allocation (0: the default stream; 1..kMaxAllocatorStreams−1
  // side streams, e.g. FSDP2's all-gather copy-in stream). The block's segment belongs to that
  // stream for good; a Free returns the block to its segment's stream whatever stream frees it
  // (c10/cuda/CUDACachingAllocator.cpp: Block::stream, set in alloc_block; free_block).
  std::uint8_t stream = 0;
};
// Streams the allocator model keeps pools for (a stream at or above it counts as the last).
constexpr int kMaxAllocatorStreams = 8;

// What to keep besides the peaks. Solvers that only need the peak switch both off.
struct AllocatorRecording {
  bool timeline = true;        // reserved and allocated bytes after every event
  bool segmentsAtPeak = true;  // the memory_viz picture at the reserved peak (a second pass)
  bool segmentsAtOom = true;   // the picture at an OOM (AllocatorOom::segments)
};

struct AllocatorBlockInfo {
  std::int64_t bytes = 0;           // block size, bytes
  std::int64_t requestedBytes = 0;  // the tensor's requested bytes; 0 for a free block
  bool allocated = false;
  int tensorId = -1;  // -1 for a free block
};

struct AllocatorSegmentInfo {
  std::uint64_t address = 0;  // a simulated virtual address (orders segments; not PyTorch's)
  std::int64_t totalBytes = 0;
  std::int64_t allocatedBytes = 0;
  bool smallPool = false;   // segment of the small pool (requests ≤ 1 MiB)
  bool expandable = false;  // a mapped range of an expandable segment
  int stream = 0;           // the stream that allocated it (PyTorch's snapshot "stream")
  std::vector<AllocatorBlockInfo> blocks;  // address order
};

// The first allocation that failed even after releasing every cached segment it could.
struct AllocatorOom {
  bool happened = false;
  int eventIndex = -1;
  int tensorId = -1;
  std::int64_t requestedBytes = 0;   // as asked
  std::int64_t roundedBytes = 0;     // after round_size
  std::int64_t allocationBytes = 0;  // get_allocation_size: what PyTorch's message says it "tried to allocate"
  std::int64_t limitBytes = 0;       // capacity, or the memory fraction's cap when set
  std::int64_t reservedBytes = 0;    // at the failure (after releasing cached segments)
  std::int64_t allocatedBytes = 0;
  std::int64_t unreservedBytes = 0;  // limit − reserved: what cudaMalloc could still hand out
  std::int64_t cachedFreeBytes = 0;  // reserved − allocated: free blocks inside segments
  std::int64_t cachedFreeBlocks = 0;
  std::int64_t largestCachedFreeBlockBytes = 0;
  std::int64_t freeBytes = 0;         // unreserved + cached free
  std::int64_t freeFragments = 0;     // cached free blocks, plus the unreserved rest when > 0
  std::int64_t largestFreeBlockBytes = 0;  // max(largest cached free block, unreserved)
  std::vector<AllocatorSegmentInfo> segments;  // the picture at the failure (when recording.segmentsAtOom)
};

struct AllocatorResult {
  int eventsSimulated = 0;  // all events, or those before the OOM
  std::int64_t peakAllocatedBytes = 0;  // torch.cuda.max_memory_allocated (rounded block sizes)
  int peakAllocatedEvent = -1;
  std::int64_t peakReservedBytes = 0;   // torch.cuda.max_memory_reserved
  int peakReservedEvent = -1;
  std::int64_t peakRequestedBytes = 0;  // peak of the unrounded requests (the replay's peak)
  // Fragmentation at the reserved peak (state after peakReservedEvent):
  std::int64_t allocatedAtPeakReservedBytes = 0;
  std::int64_t unallocatedAtPeakReservedBytes = 0;  // reserved − allocated
  std::int64_t inactiveSplitAtPeakReservedBytes = 0;  // stats inactive_split_bytes (not expandable)
  std::int64_t numAllocRetries = 0;  // stats num_alloc_retries
  std::int64_t numDeviceAllocs = 0;  // cudaMalloc calls and expandable map calls
  std::int64_t numDeviceFrees = 0;   // cudaFree calls and unmap calls
  std::int64_t finalReservedBytes = 0;
  std::int64_t finalAllocatedBytes = 0;
  int unmatchedFrees = 0;    // Free of a tensor that is not live: ignored
  int duplicateAllocs = 0;   // Alloc of a tensor already live: ignored
  int invalidEvents = 0;     // negative sizes: ignored
  std::vector<std::int64_t> reservedBytesAfterEvent;   // when recording.timeline
  std::vector<std::int64_t> allocatedBytesAfterEvent;  // when recording.timeline
  std::vector<AllocatorSegmentInfo> segmentsAtPeakReserved;  // when recording.segmentsAtPeak
  AllocatorOom oom;
};

// Replays events through the caching allocator of one device, one stream, at capacityBytes
// (the memory cudaMalloc can hand out: the GPU's memory less the context and anything outside
// PyTorch). Stops at the first allocation that cannot be satisfied. O(log n) per event.
AllocatorResult SimulateCachingAllocator(std::span<const AllocatorEvent> events,
                                         const AllocatorOptions& options,
                                         std::int64_t capacityBytes,
                                         const AllocatorRecording& recording = {});

// The capacity the device stage gives a run "without a limit": no cudaMalloc is ever refused.
constexpr std::int64_t kUnlimitedDeviceBytes = std::int64_t{1} << 62;

// What the device stage asks: the run at capacity and, when it ends in an OOM, the same events
// without a limit (what the step would reserve on a GPU large enough).
struct AllocatorCapacityRun {
  AllocatorResult atCapacity;  // = SimulateCachingAllocator(events, options, capacityBytes, recording)
  // When atCapacity.oom.happened: = SimulateCachingAllocator(events, options,
  // kUnlimitedDeviceBytes, recording); else empty.
  AllocatorResult unlimited;
  // Events both runs shared before the capacity first refused a cudaMalloc (the unlimited run
  // went on from there); 0 when it ran from the start (expandable segments, garbage
  // collection) or was not needed.
  int sharedEvents = 0;
  // Whether the capacity may have shaped atCapacity: it refused a cudaMalloc (from there the
  // allocator released its cache and retried, which a run without a limit never does), or it
  // could not be watched (expandable segments, garbage collection). False: atCapacity is the
  // run without a limit, event for event.
  bool capacityReached = false;
};
// Equal, field by field, to the one or two SimulateCachingAllocator calls it stands for
// (tests/allocator_identity_test.cpp), in about one pass.
AllocatorCapacityRun SimulateCachingAllocatorAtCapacity(std::span<const AllocatorEvent> events,
                                                        const AllocatorOptions& options,
                                                        std::int64_t capacityBytes,
                                                        const AllocatorRecording& recording = {});

// ---------------------------------------------------------------------------------------------
// Device overheads: what the process holds besides the tensors of the step.

struct RuntimeOptions {
  int pytorchMajor = 2;
  int pytorchMinor = 5;
  int cudaMajor = 12;
  int cudaMinor = 4;
  bool lazyModuleLoading = true;   // CUDA_MODULE_LOADING=LAZY (PyTorch's default since 1.13)
  double cudaContextMiB = -1;      // an override of the context estimate; < 0 = estimate
  std::string cublasWorkspaceConfig;  // CUBLAS_WORKSPACE_CONFIG (":4096:8"); empty = default
  std::int64_t cublasLtWorkspaceKiB = -1;  // CUBLASLT_WORKSPACE_SIZE, KiB; < 0 = default 1024
  bool cublasLtUnifiedWorkspace = false;   // TORCH_CUBLASLT_UNIFIED_WORKSPACE=1
  // cuBLAS handles that run matmuls: workspaces are cached per (handle, stream); forward runs
  // on the Python thread and backward on autograd's device thread, each with its own handle.
  int cublasHandles = 2;
  int worldSize = 1;                 // GPUs in the job
  double ncclBuffersMiB = -1;        // an override of the NCCL buffers; < 0 = estimate
  // NCCL communicators this rank takes part in (data-, tensor-, context-, expert-parallel groups
  // and the pipeline's p2p neighbours: NcclCommunicatorsOf); < 0 = one when worldSize > 1.
  int ncclCommunicators = -1;
  int ncclChannels = 16;             // ring channels per communicator (topology-dependent: an estimate)
};

// NCCL's per-connection buffers, one per protocol (nccl src/init.cc computeBuffSizes, the
// defaults of NCCL_BUFFSIZE / NCCL_LL_BUFFSIZE / NCCL_LL128_BUFFSIZE; src/include/device.h):
// Simple 1 << 22; LL NCCL_LL_LINES_PER_THREAD 8 × NCCL_LL_MAX_NTHREADS 512 × NCCL_STEPS 8 ×
// sizeof(ncclLLFifoLine) 16; LL128 NCCL_LL128_ELEMS_PER_THREAD 120 × NCCL_LL128_MAX_NTHREADS
// 640 × NCCL_STEPS 8 × sizeof(uint64_t) 8.
constexpr std::int64_t kNcclSimpleBufferBytes = std::int64_t{1} << 22;       // 4 MiB
constexpr std::int64_t kNcclLlBufferBytes = 8 * 512 * 8 * 16;                // 524,288 B
constexpr std::int64_t kNcclLl128BufferBytes = 120 * 640 * 8 * 8;            // 4,915,200 B
struct ParallelDef;
// The communicators of the simulated rank: one per parallel group of more than one rank
// (data, tensor, context, expert) and one for the pipeline's p2p sends (docs/device.md).
int NcclCommunicatorsOf(const ParallelDef& parallel);

RuntimeOptions DefaultRuntimeOptions();

struct ComputeCapability {
  int major = 0;  // 9 for Hopper, 8 for Ampere/Ada, 0 when not an NVIDIA GPU or unknown
  int minor = 0;
  const char* architecture = "";  // "Hopper", "gfx942"
};
// Keyed by the ids of Gpus(); unknown ids give {0, 0, ""}.
ComputeCapability GpuComputeCapability(std::string_view gpuId);

// What cudaGetDeviceProperties says of the GPU's parallelism. Some kernels size their scratch by
// it: a CUDA reduction split across blocks (sim/reduction.hpp). A custom or unknown GPU reads as
// the H100 SXM, the default GPU.
struct GpuParallelism {
  int multiprocessors = 132;               // multiProcessorCount
  int maxThreadsPerMultiprocessor = 2048;  // maxThreadsPerMultiProcessor
  int warpSize = 32;                       // warpSize (64 on AMD's CDNA)
};
GpuParallelism GpuParallelismOf(std::string_view gpuId);

struct OverheadPart {
  std::int64_t bytes = 0;
  std::string formula;  // "2 handles × (4096 KiB × 2 + 16 KiB × 8)"
  std::string source;   // where the default comes from
};

struct DeviceOverheadsResult {
  ComputeCapability computeCapability;
  OverheadPart context;        // outside the caching allocator: add to reserved for nvidia-smi
  OverheadPart workspace;      // cuBLAS / cuBLASLt workspaces: allocated *through* the allocator
  OverheadPart communication;  // NCCL buffers: outside the allocator
  // The workspace as allocations to put in front of the step's events (each one a tensor the
  // allocator sees): sizes in bytes.
  std::vector<std::int64_t> workspaceAllocations;
  std::vector<FieldError> errors;  // a bad CUBLAS_WORKSPACE_CONFIG, an out-of-range option
};

DeviceOverheadsResult DeviceOverheads(std::string_view gpuId, const RuntimeOptions& options);

// ---------------------------------------------------------------------------------------------
// The device figure of an estimate: the step's events (with the cuBLAS workspaces where PyTorch
// allocates them) through the caching allocator at the GPU's capacity less the context.
// core/src/device/device_stage.cpp; EstimateMemory fills Estimate::device.

struct Setup;
struct Trace;

// What ComputeDeviceEstimate hands the allocator for a setup's trace: the trace's events with
// the cuBLAS workspaces where PyTorch allocates them, the setup's allocator options, and the
// limit (capacity − context − communication). For tests that compare runs of it.
struct DeviceAllocatorInput {
  std::vector<AllocatorEvent> events;
  AllocatorOptions options;
  std::int64_t limitBytes = 0;
};
DeviceAllocatorInput DeviceAllocatorInputOf(const Setup& setup, const Trace& trace, std::int64_t capacityBytes);

// The allocation that failed at capacity.
struct DeviceOom {
  bool happened = false;
  std::size_t eventIndex = 0;          // index into the trace (a workspace: the event it precedes)
  std::string label;                   // the event's label, or the workspace's
  std::int64_t requestedBytes = 0;     // as asked
  std::int64_t freeBytes = 0;          // limit − reserved + cached free blocks, at the failure
  std::int64_t largestFreeBlockBytes = 0;
  std::int64_t freeFragments = 0;      // cached free blocks (+ the unreserved rest when > 0)
  std::string explanation;             // "a 1.5 GiB request found no free block of that size; …"
};

// The caching allocator's segments at the device peak (the reserved peak), as PyTorch's
// memory_viz draws a snapshot's segments (torch/cuda/_memory_viz.py, segment_plot; the data is
// torch.cuda.memory._snapshot()["segments"], DeviceCachingAllocator::snapshot): one bar per
// segment in address order, its blocks allocated or free. Only for an estimate with a labelled
// timeline (EstimateOptions::Timeline::Labelled, what the page's result panel asks for).
// Bounded for huge models: the kMaxPictureSegments largest segments, each with at most
// kMaxPictureBlocksPerSegment blocks; what is left out is counted, not lost.
constexpr std::size_t kMaxPictureSegments = 200;
constexpr std::size_t kMaxPictureBlocksPerSegment = 16;

struct DeviceSegmentBlock {
  std::int64_t bytes = 0;           // block size, bytes (a multiple of 512)
  std::int64_t requestedBytes = 0;  // the tensor's requested bytes; 0 for a free block
  bool allocated = false;
  std::string label;                // the tensor ("layers.3.mlp.fc1 output"); empty for a free block
};

struct DeviceSegment {
  std::uint64_t address = 0;        // simulated address: orders the segments, not PyTorch's
  std::int64_t totalBytes = 0;      // the segment's size, bytes
  std::int64_t allocatedBytes = 0;  // its allocated blocks, bytes
  bool smallPool = false;           // a 2 MiB segment of the small pool (requests ≤ 1 MiB)
  bool expandable = false;          // a mapped range of an expandable segment
  int stream = 0;                   // the stream that allocated it (0: the default stream)
  // Address order. When a segment has more blocks than the cap, its largest ones are kept (in
  // address order) and the others are counted below.
  std::vector<DeviceSegmentBlock> blocks;
  std::int64_t omittedBlocks = 0;
  std::int64_t omittedBlockBytes = 0;          // their sizes, bytes
  std::int64_t omittedAllocatedBlockBytes = 0;  // of which allocated, bytes
};

struct DeviceSegments {
  bool recorded = false;          // asked for (a labelled timeline) and simulated
  std::size_t eventIndex = 0;     // the trace event after which reserved peaked
  std::int64_t reservedBytes = 0;   // sum of every segment, = DeviceEstimate::peakReservedBytes
  std::int64_t allocatedBytes = 0;  // sum of their allocated blocks at that moment
  std::int64_t segmentCount = 0;    // every segment, shown or not
  std::vector<DeviceSegment> segments;  // the largest kMaxPictureSegments, address order
  std::int64_t omittedSegments = 0;     // segmentCount − segments.size()
  std::int64_t omittedBytes = 0;        // their total size, bytes
};

struct DeviceEstimate {
  // torch.cuda.max_memory_allocated: block sizes (rounded to 512 B, workspaces included).
  std::int64_t peakAllocatedBytes = 0;
  // torch.cuda.max_memory_reserved: segments obtained by cudaMalloc.
  std::int64_t peakReservedBytes = 0;
  std::int64_t fragmentationBytes = 0;  // peak reserved − peak allocated: the allocator's overhead
  std::int64_t contextBytes = 0;        // CUDA context and kernel images (outside the allocator)
  std::int64_t workspaceBytes = 0;      // cuBLAS/cuBLASLt workspaces (inside reserved)
  std::int64_t communicationBytes = 0;  // NCCL buffers (outside the allocator)
  // CUDA unified memory outside the allocator (Trace::unifiedBytes: bitsandbytes' paged
  // optimizer states): the part resident on the GPU at the peak, up to what reserved, context
  // and communication leave of the capacity, and the part the driver keeps on the host. It
  // never decides `fits`: a cudaMalloc that needs its pages has the driver evict them.
  std::int64_t unifiedBytes = 0;
  std::int64_t unifiedEvictedBytes = 0;
  std::int64_t peakDeviceBytes = 0;     // reserved + context + communication + unified: what nvidia-smi shows
  std::int64_t capacityBytes = 0;       // the GPU's memory
  // Decided by the allocator simulation at capacity − context − communication, not by a
  // subtraction: fits ⇔ no allocation failed. When it does not fit, the figures above come
  // from a second simulation without a limit (what the step would need).
  bool fits = false;
  bool tight = false;                   // fits, with headroom under max(5 % of capacity, 1 GiB)
  std::int64_t headroomBytes = 0;       // capacity − peakDeviceBytes
  std::string verdict;                  // "fits", "tight" or "doesNotFit"
  std::string why;                      // one line for the verdict
  std::string fragmentationExplanation; // one sentence on the allocator cache
  // Formulas of the figures (empty without EstimateOptions::explain).
  std::string peakAllocatedFormula, peakReservedFormula, fragmentationFormula, contextFormula,
      workspaceFormula, communicationFormula, unifiedFormula, peakDeviceFormula, headroomFormula;
  // The capacity refused a cudaMalloc in the run at capacity, or could not be watched
  // (AllocatorCapacityRun::capacityReached). False: the figures are also those without a limit.
  bool capacityReached = false;
  std::int64_t numAllocRetries = 0;     // cudaMalloc failures the cache release recovered from
  DeviceOom oom;
  DeviceSegments segments;  // the picture at the reserved peak (with a labelled timeline)
};

}  // namespace gpumem
