// gpumem — Inventory: every parameter tensor the model owns, with its shape.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/setup.hpp"

namespace gpumem {

struct Tensor {
  std::string name;                // "layers[0].weight", "matrix[1]", "other parameters"
  std::vector<std::int64_t> shape; // elements per dimension, PyTorch order ([out, in] for Linear)
  bool trainable = true;
  int layer = -1;                  // layer-list index or transformer block; -1 when neither
  // How the tensor is stored (fine-tuning, finetune.hpp): the precision's weight dtype, a float
  // dtype of its own (fp32 adapters, prepare_model_for_kbit_training's upcasts), or a
  // bitsandbytes layout (always frozen).
  // TorchaoNF4: torchao's NF4Tensor (finetune.hpp TorchaoNf4Bytes), in the regime's dtype.
  enum class Storage : std::uint8_t { Regime, FP32, BF16, FP16, NF4, NF4Double, Int8, TorchaoNF4 } storage = Storage::Regime;
  bool adapter = false;            // a LoRA / DoRA tensor PEFT adds
  // NF4 / FP4: bytes of the element type the packed codes are stored in (bnb_4bit_quant_storage:
  // 1 for uint8, bitsandbytes' default; 2 for bf16 / fp16, 4 for fp32, as FSDP / ZeRO-3 QLoRA use).
  // TorchaoNF4: bytes of the NF4Tensor's dtype (its quantization_factor, scaler_mean and table).
  std::uint8_t quantStorageBytes = 1;

  std::int64_t Elements() const;
};

// A mixture of experts under a Llama-family block, named as Mixtral's modules are:
// block_sparse_moe.gate, and per expert block_sparse_moe.experts.<e>.w1 (gate), w2 (down) and
// w3 (up). The inventory, the simulated block (blocks/moe.cpp), expert parallelism and the
// fine-tuning budget (which experts a LoRA target reaches) read the names here.
inline constexpr const char* kExpertsModule = "block_sparse_moe.experts.";
inline constexpr std::array<const char*, 3> kExpertProjections = {"w1", "w2", "w3"};

struct Inventory {
  std::vector<Tensor> parameters;

  std::int64_t ParameterCount() const;        // Σ elements of all parameters
  std::int64_t TrainableCount() const;        // Σ elements of trainable parameters
  std::int64_t IndexOf(const std::string& name) const;  // -1 when absent
};

// Builds the inventory of a validated setup. Quick mode lists the given largest matrices and
// one 1-D tensor "other parameters" holding the rest of N (so Adafactor treats the rest as
// unfactored, an upper bound). Layer lists give each Linear a weight [out, in] and a bias
// [out], each Embedding a weight [numEmbeddings, embeddingDim]. Transformers list every tensor
// under its Hugging Face name; a tied output head is the token embedding (listed once).
Inventory BuildInventory(const Setup& setup);

// The inventory's indices in the order a forward first uses each tensor. The inventory lists
// tensors as the modules register them (named_parameters(): what the optimizer, DDP's buckets and
// ZeRO's and FSDP's flat buffers walk), and a Hugging Face decoder layer registers its norms after
// its MLP: LlamaDecoderLayer (Mistral's, Qwen's, Gemma's, Mixtral's, Phi-3's, …) runs
// input_layernorm first and post_attention_layernorm (with Gemma 2's pre_feedforward_layernorm)
// between attention and the MLP; GPTNeoXLayer registers both norms first. Within each block,
// tensors keep their registration order inside these stages (norm, attention, norm, MLP, norm).
std::vector<std::size_t> ForwardOrder(const Inventory& inventory);

// BuildInventory's result for a transformer, shared with the calls that ask for the same one:
// validation, the solver's bounds and the estimate read the inventory of one setup in turn (a
// solve on Mixtral 8x22B built it 12 times, 40 M of its 284 M instructions). The last eight per
// thread (beyond the newest, 100,000 tensors in all), keyed on what BuildInventory reads (the
// architecture, the finetune section, the precision, parallel.expertParallel); other model
// kinds are built each time.
std::shared_ptr<const Inventory> SharedInventory(const Setup& setup);

// Σ elements of what BuildInventory would list, without making names (for validation, which
// bounds sizes before anything is built), split by where they are. In double, so absurd
// architectures cannot overflow.
struct ParameterCounts {
  double total = 0;
  double outside = 0;  // embeddings, final norm, head
  double blocks = 0;   // in transformer blocks / layers
  double experts = 0;  // of which in routed experts
};
ParameterCounts CountParameters(const Setup& setup);

}  // namespace gpumem
