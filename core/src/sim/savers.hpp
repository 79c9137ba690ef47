// The memory savers and fine-tuning optimizers: what the estimate says about them in words
// (the simulation itself lives in optimizer.cpp, loss.cpp, step.cpp and the tape).
#pragma once

#include <string>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"

namespace gpumem {

// Bytes of optimizer states a bitsandbytes paged optimizer allocates with F.get_paged
// (cudaMallocManaged): evictable to host memory by the driver. 0 for other optimizers.
std::int64_t PagedOptimizerStateBytes(const Setup& setup, const Inventory& inventory);

// Notes for the estimate: paged states, 8-bit layouts, the savers in use and what they change.
void AddSaverNotes(const Setup& setup, const Inventory& inventory, std::vector<std::string>& notes);

}  // namespace gpumem
