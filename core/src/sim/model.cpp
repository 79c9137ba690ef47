// Parameter lookup by module path, and module paths built without allocation.
#include "sim/model.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>

namespace gpumem {

Parameters::Parameters(const Inventory& inventory, const std::vector<Text>& names, DType weights)
    : inventory_(inventory), names_(names), weights_(weights), values_(inventory.parameters.size(), kNoValue) {
  index_.reserve(inventory.parameters.size());
  for (std::size_t i = 0; i < inventory.parameters.size(); ++i) index_.emplace(inventory.parameters[i].name, i);
}

ValueId Parameters::Leaf(Tape& t, std::size_t index) {
  if (values_[index] == kNoValue) {
    values_[index] = t.Parameter(index, Shape(inventory_.parameters[index].shape), weights_, names_[index]);
  }
  return values_[index];
}

ValueId Parameters::Find(Tape& t, const Module& module, std::string_view tensor) {
  char full[Module::kMaxPath + 16];
  if (module.length + 1 + tensor.size() > sizeof full) return kNoValue;
  std::memcpy(full, module.path, module.length);
  full[module.length] = '.';
  std::memcpy(full + module.length + 1, tensor.data(), tensor.size());
  const auto it = index_.find(std::string_view(full, module.length + 1 + tensor.size()));
  return it == index_.end() ? kNoValue : Leaf(t, it->second);
}

ValueId Parameters::Get(Tape& t, const Module& module, std::string_view tensor) {
  const ValueId v = Find(t, module, tensor);
  if (v == kNoValue) std::abort();  // the inventory and the forward disagree: a programming error
  return v;
}

ValueId Parameters::ByName(Tape& t, std::string_view fullName) {
  const auto it = index_.find(fullName);
  if (it == index_.end()) std::abort();
  return Leaf(t, it->second);
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
