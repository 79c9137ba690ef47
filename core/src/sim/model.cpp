// Parameter lookup by module path, and module paths built without allocation.
#include "sim/model.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "gpumem/finetune.hpp"

namespace gpumem {

namespace {
// Names share long prefixes, so every byte counts: eight at a time (an FNV-style multiply per
// word, then a final mix of the high bits into the low ones the table's mask keeps). Byte by
// byte FNV-1a was 1.2 % of a Mixtral estimate (the table is built once per estimate, ~45 B a
// name); a word at a time costs about a sixth of it.
std::uint64_t HashName(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, s.data() + i, 8);
    h = (h ^ word) * 1099511628211ull;
    h ^= h >> 29;
  }
  std::uint64_t tail = 0;
  if (i < s.size()) std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 32);
}
}  // namespace

Parameters::Parameters(const Inventory& inventory, const std::vector<Text>& names, DType weights, DType quantCompute)
    : inventory_(inventory), names_(names), weights_(weights), quantCompute_(quantCompute),
      values_(inventory.parameters.size(), kNoValue) {
  std::size_t size = 16;
  while (size < 2 * inventory.parameters.size()) size *= 2;
  slots_.assign(size, -1);
  for (std::size_t i = 0; i < inventory.parameters.size(); ++i) {
    std::size_t slot = HashName(inventory.parameters[i].name) & (size - 1);
    while (slots_[slot] >= 0) {
      // A repeated name (none in a well-formed inventory) is found by the table as its first
      // entry: then the guess of IndexOf could differ, so it is not used.
      if (inventory.parameters[static_cast<std::size_t>(slots_[slot])].name == inventory.parameters[i].name) {
        uniqueNames_ = false;
      }
      slot = (slot + 1) & (size - 1);
    }
    slots_[slot] = static_cast<std::int32_t>(i);
    anyBias_ = anyBias_ || inventory.parameters[i].name.ends_with(".bias");
  }
}

std::int64_t Parameters::IndexOf(std::string_view name) const {
  // Names are unique in an inventory, so a direct hit is the index the table would give.
  const std::vector<Tensor>& parameters = inventory_.parameters;
  for (const std::size_t guess : {last_ + 1, last_}) {
    if (uniqueNames_ && guess < parameters.size() && parameters[guess].name == name) {
      last_ = guess;
      return static_cast<std::int64_t>(guess);
    }
  }
  const std::int64_t i = HashedIndexOf(name);
  if (i >= 0) last_ = static_cast<std::size_t>(i);
  return i;
}

std::int64_t Parameters::HashedIndexOf(std::string_view name) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t slot = HashName(name) & mask;; slot = (slot + 1) & mask) {
    const std::int32_t i = slots_[slot];
    if (i < 0) return -1;
    if (inventory_.parameters[static_cast<std::size_t>(i)].name == name) return i;
  }
}

ValueId Parameters::Leaf(Tape& t, std::size_t index) {
  if (values_[index] == kNoValue) {
    const Tensor& p = inventory_.parameters[index];
    values_[index] = t.Parameter(index, Shape(p.shape), ParameterType(p, weights_, quantCompute_), names_[index],
                                 p.trainable);
  }
  return values_[index];
}

ValueId Parameters::Find(Tape& t, const Module& module, std::string_view tensor) {
  if (!anyBias_ && tensor == "bias") return kNoValue;
  char full[Module::kMaxPath + 16];
  if (module.length + 1 + tensor.size() > sizeof full) return kNoValue;
  std::memcpy(full, module.path, module.length);
  full[module.length] = '.';
  std::memcpy(full + module.length + 1, tensor.data(), tensor.size());
  const std::int64_t i = IndexOf(std::string_view(full, module.length + 1 + tensor.size()));
  return i < 0 ? kNoValue : Leaf(t, static_cast<std::size_t>(i));
}

const Tensor* Parameters::TensorOf(const Module& module, std::string_view tensor) const {
  char full[Module::kMaxPath + 16];
  if (module.length + 1 + tensor.size() > sizeof full) return nullptr;
  std::memcpy(full, module.path, module.length);
  full[module.length] = '.';
  std::memcpy(full + module.length + 1, tensor.data(), tensor.size());
  const std::int64_t i = IndexOf(std::string_view(full, module.length + 1 + tensor.size()));
  return i < 0 ? nullptr : &inventory_.parameters[static_cast<std::size_t>(i)];
}

ValueId Parameters::Get(Tape& t, const Module& module, std::string_view tensor) {
  const ValueId v = Find(t, module, tensor);
  if (v == kNoValue) std::abort();  // the inventory and the forward disagree: a programming error
  return v;
}

ValueId Parameters::ByName(Tape& t, std::string_view fullName) {
  const std::int64_t i = IndexOf(fullName);
  if (i < 0) std::abort();
  return Leaf(t, static_cast<std::size_t>(i));
}

Module Model::Child(const Module& parent, std::string_view name) {
  Module m;
  m.length = std::min(parent.length + name.size(), Module::kMaxPath);
  std::memcpy(m.path, parent.path, parent.length);
  std::memcpy(m.path + parent.length, name.data(), m.length - parent.length);
  m.text = t.T({parent.text, TextPart::View(name)});
  return m;
}

Module Model::BlockRoot(const char* prefix, int i) {
  Module m;
  const int n = std::snprintf(m.path, Module::kMaxPath, "%s%d.", prefix, i);
  m.length = static_cast<std::size_t>(std::max(0, n));
  m.text = t.T({TextPart::View(prefix), TextPart::Int(i), "."});
  return m;
}

Module Model::Indexed(const Module& parent, std::string_view name, std::int64_t i) {
  Module m = Child(parent, name);
  const int n = std::snprintf(m.path + m.length, Module::kMaxPath - m.length, "%lld.", static_cast<long long>(i));
  m.length = std::min(m.length + static_cast<std::size_t>(std::max(0, n)), Module::kMaxPath - 1);
  m.text = t.T({m.text, TextPart::Int(i), "."});
  return m;
}

void Model::Scope(int layer, const char* what) {
  if (layer >= 0) t.SetScope(t.T({"layers.", TextPart::Int(layer), " ", TextPart::View(what)}), layer);
  else t.SetScope(t.T({TextPart::View(what)}), layer);
}

}  // namespace gpumem
