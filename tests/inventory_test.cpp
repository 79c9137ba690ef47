// The inventory's order (core/src/model/inventory.cpp): tensors as the modules register them,
// which named_parameters() — the optimizer, DDP's buckets, ZeRO's and FSDP's flats — walks, and
// ForwardOrder, the order a forward first uses them (ZeRO-3's reuse distance).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "gpumem/inventory.hpp"
#include "gpumem/json.hpp"

using namespace gpumem;

namespace {

Setup SetupOf(const std::string& json) {
  const SetupParseResult parsed = ParseSetupJson(json);
  REQUIRE(parsed.ok());
  return parsed.setup;
}

Inventory InventoryOf(const char* json) { return BuildInventory(SetupOf(json)); }

// The names of block 0's tensors (after "…layers.0."), in `order` (all indices when empty).
std::vector<std::string> BlockZero(const Inventory& inv, const std::vector<std::size_t>& order, const std::string& prefix) {
  std::vector<std::string> names;
  for (std::size_t k = 0; k < inv.parameters.size(); ++k) {
    const Tensor& t = inv.parameters[order.empty() ? k : order[k]];
    if (t.layer == 0) names.push_back(t.name.substr(prefix.size()));
  }
  return names;
}

}  // namespace

TEST_CASE("a Llama block registers attention, the MLP, then its norms; its forward runs the norms first", "[inventory]") {
  // transformers LlamaDecoderLayer.__init__: self_attn, mlp, input_layernorm, post_attention_layernorm.
  const Inventory inv = InventoryOf(R"({"model":{"preset":"llama-3.2-1b"}})");
  const std::string prefix = "model.layers.0.";
  CHECK(BlockZero(inv, {}, prefix) ==
        std::vector<std::string>{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                 "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"});
  CHECK(BlockZero(inv, ForwardOrder(inv), prefix) ==
        std::vector<std::string>{"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                 "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"});
  // Outside the blocks nothing moves: the embedding first, the final norm and the head last.
  const std::vector<std::size_t> forward = ForwardOrder(inv);
  CHECK(forward.front() == 0);
  CHECK(forward.back() == inv.parameters.size() - 1);
}

TEST_CASE("Phi-3 registers o_proj before qkv_proj, Gemma 2 four norms after the MLP", "[inventory]") {
  const Inventory phi = InventoryOf(R"({"model":{"kind":"transformer","architecture":{"family":"llama",
      "vocabSize":1000,"hiddenSize":64,"numLayers":2,"numHeads":4,"intermediateSize":128,"fusedProjections":true}}})");
  CHECK(BlockZero(phi, {}, "model.layers.0.") ==
        std::vector<std::string>{"self_attn.o_proj.weight", "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight",
                                 "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"});
  // Gemma2DecoderLayer.forward: input_layernorm, attention, post_attention_layernorm on its
  // output, pre_feedforward_layernorm, the MLP, post_feedforward_layernorm.
  const Inventory gemma = InventoryOf(R"({"model":{"preset":"gemma-2-2b"}})");
  CHECK(BlockZero(gemma, ForwardOrder(gemma), "model.layers.0.") ==
        std::vector<std::string>{"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                 "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                 "pre_feedforward_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                 "mlp.down_proj.weight", "post_feedforward_layernorm.weight"});
}

TEST_CASE("GPT-NeoX registers its norms first and GPT-2 in the order it runs: forward order puts each norm before its sub-layer", "[inventory]") {
  const Inventory neox = InventoryOf(R"({"model":{"preset":"pythia-160m"}})");
  const std::vector<std::string> forward = BlockZero(neox, ForwardOrder(neox), "gpt_neox.layers.0.");
  REQUIRE(forward.size() == 12);
  CHECK(forward[0] == "input_layernorm.weight");
  CHECK(forward[2] == "attention.query_key_value.weight");
  CHECK(forward[6] == "post_attention_layernorm.weight");
  CHECK(forward[8] == "mlp.dense_h_to_4h.weight");
  const Inventory gpt2 = InventoryOf(R"({"model":{"preset":"gpt2"}})");
  CHECK(BlockZero(gpt2, ForwardOrder(gpt2), "transformer.h.0.") == BlockZero(gpt2, {}, "transformer.h.0."));
}

namespace {

// GPT-2 with `layers` blocks: a distinct architecture, hence a distinct inventory, for each.
Setup Gpt2With(int layers) {
  return SetupOf(R"({"model":{"preset":"gpt2","architecture":{"numLayers":)" + std::to_string(layers) + "}}}");
}

}  // namespace

TEST_CASE("SharedInventory keeps the last eight transformer inventories, and few tensors beyond the newest", "[inventory]") {
  // A solve reads about five (core/src/model/inventory.cpp): the same model solved again finds
  // them all. Held only by the cache, an inventory lives while it is kept.
  std::weak_ptr<const Inventory> first = SharedInventory(Gpt2With(1));
  for (int layers = 2; layers <= 8; ++layers) SharedInventory(Gpt2With(layers));
  CHECK_FALSE(first.expired());
  CHECK(SharedInventory(Gpt2With(1)) == first.lock());  // found, not rebuilt
  // Eight others since its last use: the ninth is no longer kept.
  for (int layers = 9; layers <= 16; ++layers) SharedInventory(Gpt2With(layers));
  CHECK(first.expired());

  // Past the newest inventory the kept ones hold at most 100,000 tensors: a mixture of 1,100
  // experts in 32 blocks (105,600 expert weights) leaves none of the others kept.
  std::weak_ptr<const Inventory> small = SharedInventory(Gpt2With(2));
  const Setup huge = SetupOf(R"({"model":{"preset":"mixtral-8x7b","architecture":{"numExperts":1100}}})");
  const std::shared_ptr<const Inventory> large = SharedInventory(huge);
  REQUIRE(large->parameters.size() > 100'000);
  CHECK(small.expired());
  CHECK(SharedInventory(huge) == large);  // the newest stays, whatever its size
  // The next one drops it (with it the kept ones would pass the limit): only the caller's
  // pointer holds it then.
  SharedInventory(Gpt2With(3));
  CHECK(large.use_count() == 1);
}
