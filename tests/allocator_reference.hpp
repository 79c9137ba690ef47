// The pre-rewrite caching allocator model, an oracle for tests/allocator_identity_test.cpp.
#pragma once

#include <span>

#include "gpumem/device.hpp"

namespace gpumem::reference {

// SimulateCachingAllocator as it was at commit fd1e34e (std::set based): same contract.
AllocatorResult ReferenceSimulateCachingAllocator(std::span<const AllocatorEvent> events,
                                                  const AllocatorOptions& options, std::int64_t capacityBytes,
                                                  const AllocatorRecording& recording = {});

}  // namespace gpumem::reference
