// A minimal, data-only unpickler for the files torch.cuda.memory._dump_snapshot() writes: that
// function calls Python's pickle.dump(snapshot_dict, f) (torch/cuda/memory.py), so the file is
// an ordinary pickle of protocol 2–5 made of dicts, lists, tuples, str, int, float, bool, None.
//
// Opcodes follow CPython's Lib/pickletools.py and Lib/pickle.py. Only opcodes that build plain
// values are accepted; everything that would name or call Python code (GLOBAL, STACK_GLOBAL,
// REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT*) is an error naming the
// opcode — nothing is ever looked up or executed. Protocol-0/1 text opcodes are refused too:
// Python 3 writes protocol 4 (5 from 3.14) by default.
//
// Bounded: at most kMaxPickleBytes of input, kMaxPickleNodes values, kMaxPickleDepth open
// MARKs; one pass over the input, so time is linear in its size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpumem::pickle {

// 64 MiB: reading takes about 13 bytes of memory per input byte (measured: a 7.5 MB trace of
// 200,000 entries, 99 MB peak RSS, 0.17 s natively), which keeps the page under 1 GB of wasm
// memory. Larger snapshots: record fewer entries (max_entries) or without stacks (stacks=None).
inline constexpr std::size_t kMaxPickleBytes = 64u << 20;
inline constexpr std::size_t kMaxPickleNodes = 32u << 20;   // values, at most one per input byte anyway
inline constexpr std::size_t kMaxPickleDepth = 256;         // nested MARKs (lists of lists of …)

enum class Kind : std::uint8_t { None, Bool, Int, BigInt, Float, String, Bytes, List, Tuple, Dict };

// One value. Containers hold the ids of their items (a dict: key, value, key, value, …); ids
// index Document::nodes. A memo reference (BINGET) shares the id, as Python shares the object,
// so a document is a graph: walk it along known paths, never recursively over everything.
struct Node {
  Kind kind = Kind::None;
  union {
    std::int64_t integer = 0;   // Int; Bool (0/1)
    double real;                // Float
    std::uint64_t byteSize;     // Bytes: only the size is kept; BigInt: its byte length
  };
  std::string_view text;        // String (UTF-8 as pickled): a view into the input bytes
  std::vector<std::uint32_t> items;
};

struct Document {
  std::vector<Node> nodes;
  std::uint32_t root = 0;

  const Node& at(std::uint32_t id) const { return nodes[id]; }
  // A dict's value for a string key; nullptr when `dict` is not a dict or has no such key.
  const Node* Get(const Node& dict, std::string_view key) const;
};

// The document's strings are views into `bytes`: keep the input alive while reading it.
struct Result {
  Document document;
  std::string error;  // empty on success; otherwise one sentence, with the byte offset
  bool ok() const { return error.empty(); }
};

Result Unpickle(std::string_view bytes);

const char* KindName(Kind kind);

}  // namespace gpumem::pickle
