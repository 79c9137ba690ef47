// Inventory: every parameter tensor, from the model description.
#include "gpumem/inventory.hpp"

#include "gpumem/finetune.hpp"
#include "gpumem/recycle.hpp"
#include "parallel/expert_split.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>
#include <string_view>

namespace gpumem {

std::int64_t Tensor::Elements() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t Inventory::ParameterCount() const {
  std::int64_t n = 0;
  for (const Tensor& t : parameters) n += t.Elements();
  return n;
}

std::int64_t Inventory::TrainableCount() const {
  std::int64_t n = 0;
  for (const Tensor& t : parameters) if (t.trainable) n += t.Elements();
  return n;
}

namespace {

// Hugging Face's parameter names and shapes ([out, in] for nn.Linear; GPT-2's Conv1D stores
// [in, out], kept here so names and shapes read as in a checkpoint).
//
// One enumeration serves both BuildInventory and CountParameters: `add(prefix, name, shape,
// block)` receives each tensor as a prefix (the block's or expert's path, built only when
// `named`) and the rest of its name.
template <class Add>
void ForEachTransformerTensor(const ArchitectureDef& a, bool named, Add&& add0) {
  auto add = [&](const std::string& prefix, const char* name, std::initializer_list<std::int64_t> shape,
                 int block = -1, bool expert = false) { add0(prefix, name, shape, block, expert); };
  const std::string none;
  const std::int64_t h = a.hiddenSize, V = a.vocabSize, inter = IntermediateSize(a);
  const std::int64_t d = HeadDim(a), heads = a.numHeads, kv = KeyValueHeads(a);
  const std::int64_t attn = heads * d;  // GPT-2 / BERT attention width: h, or h/t on a tensor-parallel rank
  switch (a.family) {
    case Family::GPT2: {
      add(none, "transformer.wte.weight", {V, h});
      add(none, "transformer.wpe.weight", {a.maxPositionEmbeddings, h});
      for (std::int64_t i = 0; i < a.numLayers; ++i) {
        const std::string b = named ? "transformer.h." + std::to_string(i) + "." : none;
        const int L = static_cast<int>(i);
        add(b, "ln_1.weight", {h}, L);
        add(b, "ln_1.bias", {h}, L);
        // The attention width is heads · head_dim (= h on one GPU): under tensor parallelism the
        // rank's slimmer architecture (parallel/sharding.cpp TensorSlices) holds heads/t of it
        // (ColumnParallelLinear c_attn) while c_proj's output and bias stay h wide
        // (RowParallelLinear adds its whole bias after the all-reduce).
        // Grouped-query attention (Megatron's GPT, --num-query-groups g): c_attn is Megatron's
        // linear_qkv, query_projection_size + 2 · kv_projection_size = heads·d + 2·g·d wide
        // (megatron/core/transformer/attention.py SelfAttention linear_qkv_out_dim); 3h without.
        add(b, "attn.c_attn.weight", {h, attn + 2 * kv * d}, L);
        add(b, "attn.c_attn.bias", {attn + 2 * kv * d}, L);
        add(b, "attn.c_proj.weight", {attn, h}, L);
        add(b, "attn.c_proj.bias", {h}, L);
        add(b, "ln_2.weight", {h}, L);
        add(b, "ln_2.bias", {h}, L);
        add(b, "mlp.c_fc.weight", {h, inter}, L);
        add(b, "mlp.c_fc.bias", {inter}, L);
        add(b, "mlp.c_proj.weight", {inter, h}, L);
        add(b, "mlp.c_proj.bias", {h}, L);
      }
      add(none, "transformer.ln_f.weight", {h});
      add(none, "transformer.ln_f.bias", {h});
      if (!a.tieWordEmbeddings) add(none, "lm_head.weight", {V, h});
      break;
    }
    case Family::Llama: {
      add(none, "model.embed_tokens.weight", {V, h});
      const std::int64_t ei = ExpertIntermediateSize(a);
      for (std::int64_t i = 0; i < a.numLayers; ++i) {
        const std::string b = named ? "model.layers." + std::to_string(i) + "." : none;
        const int L = static_cast<int>(i);
        // q, k, v and o with their biases (Qwen2's on q, k, v; attention_bias of Llama, Gemma,
        // Qwen3 or OLMo 2 on o_proj too).
        auto projections = [&] {
          add(b, "self_attn.q_proj.weight", {heads * d, h}, L);
          if (a.attentionBias) add(b, "self_attn.q_proj.bias", {heads * d}, L);
          add(b, "self_attn.k_proj.weight", {kv * d, h}, L);
          if (a.attentionBias) add(b, "self_attn.k_proj.bias", {kv * d}, L);
          add(b, "self_attn.v_proj.weight", {kv * d, h}, L);
          if (a.attentionBias) add(b, "self_attn.v_proj.bias", {kv * d}, L);
          add(b, "self_attn.o_proj.weight", {h, heads * d}, L);
          if (a.outputBias) add(b, "self_attn.o_proj.bias", {h}, L);
        };
        auto denseMlp = [&] {
          add(b, "mlp.gate_proj.weight", {inter, h}, L);
          if (a.mlpBias) add(b, "mlp.gate_proj.bias", {inter}, L);
          add(b, "mlp.up_proj.weight", {inter, h}, L);
          if (a.mlpBias) add(b, "mlp.up_proj.bias", {inter}, L);
          add(b, "mlp.down_proj.weight", {h, inter}, L);
          if (a.mlpBias) add(b, "mlp.down_proj.bias", {h}, L);
        };
        if (a.olmo2Layout) {
          // Olmo2DecoderLayer registers self_attn (q, k, v, o, then q_norm and k_norm over the
          // whole projections), mlp, post_attention_layernorm, post_feedforward_layernorm.
          projections();
          add(b, "self_attn.q_norm.weight", {heads * d}, L);
          add(b, "self_attn.k_norm.weight", {kv * d}, L);
          denseMlp();
          add(b, "post_attention_layernorm.weight", {h}, L);
          add(b, "post_feedforward_layernorm.weight", {h}, L);
          continue;
        }
        // LlamaDecoderLayer (and Mistral's, Qwen2's, Qwen3's, Mixtral's, Gemma's, Granite's,
        // SmolLM3's, Phi3's) registers self_attn, then the MLP (mlp or block_sparse_moe), then its
        // norms: named_parameters() — what the optimizer, DDP's buckets and ZeRO's and FSDP's flat
        // buffers walk — lists them after the MLP, not where they run.
        auto norms = [&] {
          add(b, "input_layernorm.weight", {h}, L);
          add(b, "post_attention_layernorm.weight", {h}, L);
          // Gemma2DecoderLayer: its post_attention_layernorm normalises the attention's output;
          // the MLP's own norms come before and after it.
          if (a.sandwichNorms) {
            add(b, "pre_feedforward_layernorm.weight", {h}, L);
            add(b, "post_feedforward_layernorm.weight", {h}, L);
          }
        };
        if (a.fusedProjections) {  // Phi3Attention: o_proj, then one [(heads + 2·kv)·d, h] qkv_proj
          add(b, "self_attn.o_proj.weight", {h, heads * d}, L);
          add(b, "self_attn.qkv_proj.weight", {(heads + 2 * kv) * d, h}, L);
          add(b, "mlp.gate_up_proj.weight", {2 * inter, h}, L);
          add(b, "mlp.down_proj.weight", {h, inter}, L);
          norms();
          continue;
        }
        projections();
        if (a.queryKeyNorm) {  // Qwen3Attention registers them after o_proj
          add(b, "self_attn.q_norm.weight", {d}, L);
          add(b, "self_attn.k_norm.weight", {d}, L);
        }
        if (a.numExperts == 0) {
          denseMlp();
          norms();
          continue;
        }
        add(b, "block_sparse_moe.gate.weight", {a.numExperts, h}, L);
        for (std::int64_t e = 0; e < a.numExperts; ++e) {
          const std::string x = named ? b + kExpertsModule + std::to_string(e) + "." : none;  // w1, w2, w3: kExpertProjections
          add(x, "w1.weight", {ei, h}, L, true);
          add(x, "w2.weight", {h, ei}, L, true);
          add(x, "w3.weight", {ei, h}, L, true);
        }
        if (a.sharedExpertIntermediateSize > 0) {
          const std::int64_t si = a.sharedExpertIntermediateSize;
          add(b, "mlp.shared_expert.gate_proj.weight", {si, h}, L);
          add(b, "mlp.shared_expert.up_proj.weight", {si, h}, L);
          add(b, "mlp.shared_expert.down_proj.weight", {h, si}, L);
          if (a.sharedExpertGate) add(b, "mlp.shared_expert_gate.weight", {1, h}, L);
        }
        norms();
      }
      add(none, "model.norm.weight", {h});
      if (!a.tieWordEmbeddings) add(none, "lm_head.weight", {V, h});
      break;
    }
    case Family::GPTNeoX: {
      // GPTNeoXForCausalLM: GPTNeoXLayer registers its two norms, then attention (one
      // query_key_value of 3·h, each head's q, k, v side by side), then the MLP.
      add(none, "gpt_neox.embed_in.weight", {V, h});
      for (std::int64_t i = 0; i < a.numLayers; ++i) {
        const std::string b = named ? "gpt_neox.layers." + std::to_string(i) + "." : none;
        const int L = static_cast<int>(i);
        add(b, "input_layernorm.weight", {h}, L);
        add(b, "input_layernorm.bias", {h}, L);
        add(b, "post_attention_layernorm.weight", {h}, L);
        add(b, "post_attention_layernorm.bias", {h}, L);
        add(b, "attention.query_key_value.weight", {3 * attn, h}, L);
        if (a.attentionBias) add(b, "attention.query_key_value.bias", {3 * attn}, L);
        add(b, "attention.dense.weight", {h, attn}, L);
        if (a.attentionBias) add(b, "attention.dense.bias", {h}, L);
        add(b, "mlp.dense_h_to_4h.weight", {inter, h}, L);
        add(b, "mlp.dense_h_to_4h.bias", {inter}, L);
        add(b, "mlp.dense_4h_to_h.weight", {h, inter}, L);
        add(b, "mlp.dense_4h_to_h.bias", {h}, L);
      }
      add(none, "gpt_neox.final_layer_norm.weight", {h});
      add(none, "gpt_neox.final_layer_norm.bias", {h});
      if (!a.tieWordEmbeddings) add(none, "embed_out.weight", {V, h});
      break;
    }
    case Family::BERT: {
      add(none, "bert.embeddings.word_embeddings.weight", {V, h});
      add(none, "bert.embeddings.position_embeddings.weight", {a.maxPositionEmbeddings, h});
      add(none, "bert.embeddings.token_type_embeddings.weight", {a.typeVocabSize, h});
      add(none, "bert.embeddings.LayerNorm.weight", {h});
      add(none, "bert.embeddings.LayerNorm.bias", {h});
      for (std::int64_t i = 0; i < a.numLayers; ++i) {
        const std::string b = named ? "bert.encoder.layer." + std::to_string(i) + "." : none;
        const int L = static_cast<int>(i);
        for (const char* m : {"query", "key", "value"}) {
          const bool q = m[0] == 'q', k = m[0] == 'k';
          add(b, q ? "attention.self.query.weight" : k ? "attention.self.key.weight" : "attention.self.value.weight", {attn, h}, L);
          add(b, q ? "attention.self.query.bias" : k ? "attention.self.key.bias" : "attention.self.value.bias", {attn}, L);
        }
        add(b, "attention.output.dense.weight", {h, attn}, L);  // its bias is whole (row-parallel)
        add(b, "attention.output.dense.bias", {h}, L);
        add(b, "attention.output.LayerNorm.weight", {h}, L);
        add(b, "attention.output.LayerNorm.bias", {h}, L);
        add(b, "intermediate.dense.weight", {inter, h}, L);
        add(b, "intermediate.dense.bias", {inter}, L);
        add(b, "output.dense.weight", {h, inter}, L);
        add(b, "output.dense.bias", {h}, L);
        add(b, "output.LayerNorm.weight", {h}, L);
        add(b, "output.LayerNorm.bias", {h}, L);
      }
      if (a.encoderHead == EncoderHead::Classification) {
        add(none, "bert.pooler.dense.weight", {h, h});
        add(none, "bert.pooler.dense.bias", {h});
        add(none, "classifier.weight", {a.numLabels, h});
        add(none, "classifier.bias", {a.numLabels});
      } else {
        add(none, "cls.predictions.transform.dense.weight", {h, h});
        add(none, "cls.predictions.transform.dense.bias", {h});
        add(none, "cls.predictions.transform.LayerNorm.weight", {h});
        add(none, "cls.predictions.transform.LayerNorm.bias", {h});
        add(none, "cls.predictions.bias", {V});  // the decoder's weight is the word embedding
      }
      break;
    }
  }
}

}  // namespace

std::int64_t Inventory::IndexOf(const std::string& name) const {
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i].name == name) return static_cast<std::int64_t>(i);
  }
  return -1;
}

namespace {

// Where a block's tensor runs in its forward (ForwardOrder): its name after the block's index.
int ForwardStage(const Tensor& t) {
  std::string key = ".";
  key += std::to_string(t.layer);
  key += '.';
  const std::size_t at = t.name.find(key);
  if (at == std::string::npos) return 1;
  const std::string_view rest = std::string_view(t.name).substr(at + key.size());
  auto starts = [&](std::string_view prefix) { return rest.substr(0, prefix.size()) == prefix; };
  if (starts("input_layernorm.")) return 0;
  if (starts("post_attention_layernorm.") || starts("pre_feedforward_layernorm.")) return 2;
  if (starts("mlp.") || starts("block_sparse_moe.")) return 3;
  if (starts("post_feedforward_layernorm.")) return 4;
  return 1;  // attention, and what registers in forward order (GPT-2's, BERT's blocks)
}

}  // namespace

std::vector<std::size_t> ForwardOrder(const Inventory& inventory) {
  const std::vector<Tensor>& params = inventory.parameters;
  std::vector<std::size_t> order(params.size());
  std::vector<int> stage(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
    stage[i] = params[i].layer >= 0 ? ForwardStage(params[i]) : 0;
  }
  for (std::size_t begin = 0; begin < params.size();) {
    std::size_t end = begin + 1;
    while (end < params.size() && params[end].layer == params[begin].layer) ++end;
    if (params[begin].layer >= 0) {
      std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(begin), order.begin() + static_cast<std::ptrdiff_t>(end),
                       [&](std::size_t x, std::size_t y) { return stage[x] < stage[y]; });
    }
    begin = end;
  }
  return order;
}

ParameterCounts CountParameters(const Setup& setup) {
  ParameterCounts n;
  auto count = [&n](double elements, int block, bool expert) {
    n.total += elements;
    (block < 0 ? n.outside : n.blocks) += elements;
    if (expert) n.experts += elements;
  };
  if (setup.model.kind != ModelKind::Transformer) {
    for (const Tensor& t : BuildInventory(setup).parameters) count(double(t.Elements()), t.layer, false);
    return n;
  }
  ForEachTransformerTensor(setup.model.architecture, false,
                           [&](const std::string&, const char*, std::initializer_list<std::int64_t> shape, int block,
                               bool expert) {
                             double elements = 1;
                             for (std::int64_t d : shape) elements *= static_cast<double>(d);
                             count(elements, block, expert);
                           });
  return n;
}

Inventory BuildInventory(const Setup& setup) {
  Inventory inv;
  const ModelDef& model = setup.model;
  if (model.kind == ModelKind::Transformer) {
    ForEachTransformerTensor(model.architecture, true,
                             [&](const std::string& prefix, const char* name, std::initializer_list<std::int64_t> shape,
                                 int block, bool) {
                               inv.parameters.push_back({prefix + name, std::vector<std::int64_t>(shape), true, block});
                             });
    ApplyFinetune(setup, inv);  // frozen parameters, adapters, quantized storage (finetune.hpp)
    expert_split::KeepLocalExperts(setup, inv);  // expert parallelism: the rank's E/e experts
    return inv;
  }
  if (model.kind == ModelKind::ParameterCount) {
    std::int64_t listed = 0;
    for (std::size_t i = 0; i < model.largestMatrices.size(); ++i) {
      const MatrixShape& m = model.largestMatrices[i];
      inv.parameters.push_back({"matrix[" + std::to_string(i) + "]", {m.rows, m.cols}, true, -1});
      listed += m.rows * m.cols;
    }
    if (model.parameterCount > listed) {
      inv.parameters.push_back({"other parameters", {model.parameterCount - listed}, true, -1});
    }
    return inv;
  }
  for (std::size_t i = 0; i < model.layers.size(); ++i) {
    const LayerDef& layer = model.layers[i];
    const std::string prefix = "layers[" + std::to_string(i) + "]";
    const int index = static_cast<int>(i);
    if (layer.kind == LayerKind::Linear) {
      inv.parameters.push_back({prefix + ".weight", {layer.outFeatures, layer.inFeatures}, true, index});
      if (layer.bias) inv.parameters.push_back({prefix + ".bias", {layer.outFeatures}, true, index});
    } else if (layer.kind == LayerKind::Embedding) {
      inv.parameters.push_back({prefix + ".weight", {layer.numEmbeddings, layer.embeddingDim}, true, index});
    }
  }
  return inv;
}

std::shared_ptr<const Inventory> SharedInventory(const Setup& setup) {
  if (setup.model.kind != ModelKind::Transformer) return std::make_shared<const Inventory>(BuildInventory(setup));
  struct Entry {
    ArchitectureDef architecture;
    FinetuneDef finetune;
    Precision precision = Precision::FP32;
    std::int64_t expertParallel = 1;
    std::shared_ptr<const Inventory> inventory;
  };
  // The last few, most recent first: a solve moves between a handful of setups (its own, the
  // fine-tuning changes, the one- and two-block models of ForwardEndFloor), and with one entry
  // each move rebuilt an inventory: 14 of a Mixtral 8x22B solve's 180 M instructions, a third of
  // them destroying the one it replaced (callgrind). Eight, so that the next solve of the same
  // model (the page solves again as a training field changes) finds them all: the 8x22B solve
  // at 8k tokens reads five (its own, LoRA's, QLoRA's, QLoRA's one- and two-block models), and
  // with four kept each solve after the first rebuilt four of them, 7 M of its 154 M
  // instructions. An inventory takes about 200 B a tensor natively (its name, its shape; Mixtral
  // 8x22B's 1,739 tensors 341 KB), Qwen3 30B-A3B's 18,432 expert weights about 4 MB, and
  // validation's event budget admits models of a few hundred thousand tensors: so past the most
  // recent one the kept inventories hold at most kKeptTensors tensors in all (about 20 MB).
  constexpr std::size_t kKept = 8;
  constexpr std::size_t kKeptTensors = 100'000;
  GPUMEM_THREAD_LOCAL std::array<Entry, kKept> kept;
  const auto same = [&](const Entry& e) {
    return e.inventory && e.architecture == setup.model.architecture && e.finetune == setup.finetune &&
           e.precision == setup.training.precision && e.expertParallel == setup.parallel.expertParallel;
  };
  const auto hit = std::find_if(kept.begin(), kept.end(), same);
  // The found one (or the oldest, replaced) moves to the front.
  const auto moved = hit != kept.end() ? hit : kept.end() - 1;
  std::rotate(kept.begin(), moved, moved + 1);
  Entry& e = kept.front();
  if (hit == kept.end()) {
    e.inventory = std::make_shared<const Inventory>(BuildInventory(setup));
    e.architecture = setup.model.architecture;
    e.finetune = setup.finetune;
    e.precision = setup.training.precision;
    e.expertParallel = setup.parallel.expertParallel;
    std::size_t tensors = e.inventory->parameters.size();
    for (std::size_t i = 1; i < kKept; ++i) {
      if (!kept[i].inventory) continue;
      tensors += kept[i].inventory->parameters.size();
      if (tensors > kKeptTensors) kept[i].inventory.reset();  // `same` needs an inventory
    }
  }
  return e.inventory;
}

}  // namespace gpumem
