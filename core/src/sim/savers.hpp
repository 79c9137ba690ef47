// The memory savers and fine-tuning optimizers: what the estimate says about them in words
// (the simulation itself lives in optimizer.cpp, loss.cpp, step.cpp and the tape).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/setup.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

// Bytes of optimizer states a bitsandbytes paged optimizer allocates with F.get_paged
// (cudaMallocManaged): evictable to host memory by the driver. 0 for other optimizers.
std::int64_t PagedOptimizerStateBytes(const Setup& setup, const Inventory& inventory);

// Liger's token chunks for the fused linear + cross-entropy
// (liger_kernel/ops/fused_linear_cross_entropy.py, fused_linear_cross_entropy_forward, with
// chunk_mem_const = 1): inc_factor = cdiv(V, H); chunk_size = min(next_power_of_2(cdiv(BT,
// inc_factor)), BT); num_chunks = cdiv(BT, chunk_size). So one chunk's logits, chunk_size × V,
// are about BT × H elements whatever the vocabulary.
struct LigerChunking {
  std::int64_t chunkSize = 0;  // tokens per chunk
  std::int64_t chunks = 0;
};
LigerChunking LigerChunks(std::int64_t tokens, std::int64_t vocab, std::int64_t hidden);

// Notes for the estimate: paged states, 8-bit layouts, the savers in use and what they change.
void AddSaverNotes(const Setup& setup, const Inventory& inventory, std::vector<std::string>& notes);

// Activation offloading as torchtune runs it (torchtune/training/_activation_offloading.py,
// OffloadActivations with use_streams=True, its default on torch ≥ 2.5; max_fwd_stash_size=5,
// min_offload_size=1024): a saved_tensors_hooks pair the tape calls where autograd packs a saved
// tensor (forward) and unpacks it (backward). What stays on the GPU:
//   - pack_tensor numbers every tensor packed under the context. One of at least 1,024 B that is
//     not a parameter gets a pinned host copy (host memory, not counted), and its GPU tensor is
//     kept in fwd_stash until the pack of id + 5 (the copy stream must finish first): the saved
//     reference is gone, but the tensor lives on while anything else (a Python variable, the
//     stash) holds it. Smaller ones and parameters stay saved on the GPU.
//   - unpack_tensor_with_streams, when a backward op runs: a tensor still in fwd_stash is used as
//     it is; any other is brought back as a new GPU tensor held in bwd_tensor_stash. The op's
//     post-hook then drops the whole fwd_stash and the tensors brought back for the previous op
//     that brought any back (so two ops' worth overlap); a callback queued at the first unpack
//     drops what is left when backward ends.
// The parameter test follows TRL's port (trl/models/activation_offloading.py: a tensor whose
// storage is a parameter's); torchtune's isinstance(activation, nn.Parameter) would also offload
// views of weights (a linear's saved weight.t()), not simulated.
// Host side: each offloaded tensor's copy is torch.empty_like(activation, pin_memory=True,
// device="cpu") (use_pin_memory=True by default), kept in self.tracker from pack_tensor until its
// unpack (`del self.tracker[unpack_tensor_id]`); the builder counts these pinned bytes
// (TraceBuilder::HostActivationBytes) and the trace keeps their peak. The view case of the post-hook
// (an op output sharing the unpacked tensor's storage: record_stream) does not arise here.
class ActivationOffload {
 public:
  static constexpr int kMaxForwardStash = 5;            // max_fwd_stash_size
  static constexpr std::int64_t kMinOffloadBytes = 1024;  // min_offload_size

  explicit ActivationOffload(TraceBuilder& builder) : b_(builder) {}
  // Whether pack hooks run: the recipe's `with activations_handling_ctx:` around the model's
  // forward, paused by the NoOpManager hooks around the output head; off in backward.
  void SetActive(bool on) { active_ = on; }
  bool active() const { return active_; }
  // pack_tensor for a tensor a node has just retained (`held`, `bytes`). Returns the packed id
  // when it is offloaded (the reference then belongs to fwd_stash), or -1 when the node keeps it.
  int Pack(TensorHandle held, std::int64_t bytes, bool parameter, Text label);
  // A backward op starts unpacking: what was brought back before belongs to the previous op.
  void BeginOp();
  // unpack of packed id `id`: the tensor on the GPU (fwd_stash's, or a new copy brought back,
  // held by bwd_tensor_stash), not retained for the caller.
  TensorHandle Unpack(int id, Text label, int layer);
  // The post-hook of an op that unpacked offloaded tensors.
  void AfterOp(Text label);
  // The callback at the end of backward: everything brought back is released.
  void EndBackward(Text label);

  // Block templates (sim/tape_templates.cpp): a checkpointed block's backward span copied
  // instead of simulated. What the span's op did here, Unpack of each of ids[0, count) and then
  // AfterOp, is done without its events (the copy brings those): each id's host copy is let
  // go, and bwd_tensor_stash becomes `stash`, the tensors the copy brought back. Only where
  // simulating would have done just that: the forward stash empty, and each id offloaded and
  // on the host only (so brought back by an allocation); false, and nothing changed, otherwise.
  using Stash = std::vector<std::pair<int, TensorHandle>>;
  const Stash& backwardStash() const { return backwardStash_; }
  Text PackedName(int id) const { return packed_[static_cast<std::size_t>(id - 1)].name; }
  bool CopiedUnpack(const int* ids, std::size_t count, const Stash& stash);

 private:
  struct Packed {
    std::int64_t bytes = 0;
    TensorHandle onGpu = kNoTensor;  // while in fwd_stash
    bool onHost = false;             // its pinned host copy is still in the tracker
    Text name;
  };
  void ReleaseFreeing(TensorHandle h, Text label);
  TraceBuilder& b_;
  bool active_ = false;
  int nextId_ = 0;
  std::vector<Packed> packed_;          // by id − 1 (offloaded ones only hold bytes)
  std::deque<int> forwardStash_;        // fwd_stash ids, oldest first
  Stash backwardStash_;                 // bwd_tensor_stash
  std::size_t previousOp_ = 0;          // backwardStash_ entries before this are the previous op's
};

}  // namespace gpumem
